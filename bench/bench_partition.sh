#!/usr/bin/env bash
# A silent partition's detection time (issue #53): how long after a node's network vanishes without a reset
# (a cable pulled, a router that drops) the coordinator calls its link down, median of N cuts, at each
# --link-timeout. The goal: within max(0.5 s, 3 round trips) (here the round trips are a veth pair's, well
# under a millisecond, so the bound is the --link-timeout: 0.5 s by default).
#
#   bench/bench_partition.sh [--model FILE] [--cuts N] [--link-timeouts "0.5 1"] [--timeout S] [--out PREFIX]
#                            [--keep] [--no-build]
#
# A 3-node ring: node 1 on loopback, node 2 in a network namespace of its own joined by a veth pair, node 3 on
# this side of the pair (tests/t_partition.sh's set-up). Each cut: a fresh node 2, `ringlm run --ring
# --keep-order` generating greedily without end; once it has printed some text, a `blackhole` qdisc on both
# ends of the pair drops every packet (nothing answers: no RST, no ICMP; this kernel has no netem and no
# iptables here), and the time from the cut to the run's line naming node 2 ("lost node", time-stamped as it
# reaches this script) is the detection time. ring.conf caps every node (mem=) at half the model, so
# node 2 always holds a stage. Then the qdiscs go and node 2 is started again.
# Defaults: the `small` test model at seed 1 (synthesized once into build/bench), 10 cuts per timeout, link
# timeouts 0.5 (the default) and 1 s. Needs root and `ip netns`. Writes PREFIX.json and PREFIX.md (default
# bench/results/partition).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
argv=; [ $# -eq 0 ] || argv=$(printf ' %q' "$@")
model=build/bench/small-s1.gguf cuts=10 lts="0.5 1" timeout_s=120 out=bench/results/partition keep=0 build=1
while [ $# -gt 0 ]; do
    case $1 in
        --model) model=$2; shift 2 ;;
        --cuts) cuts=$2; shift 2 ;;
        --link-timeouts) lts=$2; shift 2 ;;
        --timeout) timeout_s=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --keep) keep=1; shift ;;
        --no-build) build=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "bench_partition: unknown option $1 (--help lists them)" >&2; exit 2 ;;
    esac
done
positive_ints cuts:cuts timeout_s:timeout
for t in $lts; do [[ $t =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "--link-timeouts: '$t' is not seconds"; done
[ "$(id -u)" = 0 ] || die "needs root (network namespaces, qdiscs)"
need_tools python3 timeout make ip tc
if [ $build = 1 ]; then make -s ringlm || die "building ringlm failed (--no-build uses ./ringlm as it is)"; fi
RINGLM=$PWD/ringlm
[ -x "$RINGLM" ] || die "no ./ringlm after make"
need_subcommands run node keygen synth
mkdir -p "$(dirname "$out")" build/bench
if [ ! -f "$model" ]; then
    [ "$model" = build/bench/small-s1.gguf ] || die "no model file $model"
    "$RINGLM" synth --no-progress --config small --seed 1 -o "$model.tmp" && mv "$model.tmp" "$model"
fi
model=$(cd "$(dirname "$model")" && pwd)/$(basename "$model")

work=$(mktemp -d "$PWD/build/bench/partition.XXXXXX")
cp "$RINGLM" "$work/ringlm" && RINGLM=$work/ringlm
pids=()
NS=rlbp$$ HV=rlbh$$ PV=rlbn$$
net_down() { ip link del "$HV" 2>/dev/null || true; ip netns del "$NS" 2>/dev/null || true; }
harness_traps
trap 'net_down; harness_cleanup' EXIT
sub="10.$((100 + $$ % 100)).$(($$ / 100 % 250))"
ip netns add "$NS" && ip link add "$HV" type veth peer name "$PV" && ip link set "$PV" netns "$NS" &&
    ip addr add "$sub.1/24" dev "$HV" && ip link set "$HV" up &&
    ip -n "$NS" addr add "$sub.2/24" dev "$PV" && ip -n "$NS" link set "$PV" up && ip -n "$NS" link set lo up ||
    die "could not build the namespace and its veth pair"
mkdir -p "$work/models"
ln -s "$model" "$work/models/$(basename "$model")"
"$RINGLM" keygen -o "$work/coord.key" >"$work/coord.pub"
declare -A port npid
# node I HOST [NETNS]
node() {
    local i=$1 host=$2 ns=${3:-} pre=()
    [ -n "$ns" ] && pre=(ip netns exec "$ns")
    [ -f "$work/n$i.key" ] || "$RINGLM" keygen -o "$work/n$i.key" >"$work/n$i.pub"
    [ -n "${port[$i]:-}" ] || port[$i]=$(free_port)
    "${pre[@]}" "$RINGLM" node --listen "$host:${port[$i]}" --key "$work/n$i.key" --allow "$(cat "$work/coord.pub")" \
        --models "$work/models" --threads 1 --speed 10 --cache "$work/cache$i" >"$work/n$i.log" 2>&1 &
    npid[$i]=$!; pids+=("${npid[$i]}")
    wait_log "$work/n$i.log" "ready:" "${npid[$i]}" 60 || die "node $i did not start: $(tail -3 "$work/n$i.log")"
}
node 1 127.0.0.1
node 3 "$sub.1"
node 2 "$sub.2" "$NS"
# mem= (GB): no node holds more than half the model, so node 2 is always a stage
cap=$(python3 -c "import os; print(round(os.path.getsize('$model') * 0.5 / 1e9, 3))")
{
    echo "127.0.0.1:${port[1]} $(cat "$work/n1.pub") mem=$cap"
    echo "$sub.2:${port[2]} $(cat "$work/n2.pub") mem=$cap"
    echo "$sub.1:${port[3]} $(cat "$work/n3.pub") mem=$cap"
} >"$work/ring.conf"

results=()
for lt in $lts; do
    times=()
    for c in $(seq "$cuts"); do
        : >"$work/run.out"
        timeout -k 5 "$timeout_s" "$RINGLM" run -m "$model" -p "a partition" -n 100000 --temp 0 --ignore-eos --threads 1 \
            --ring "$work/ring.conf" --key "$work/coord.key" --keep-order --link-timeout "$lt" >"$work/run.out" \
            2> >(python3 -u -c 'import sys, time
for l in sys.stdin: print("%.4f %s" % (time.time(), l), end="", flush=True)' >"$work/run.err") &
        fg_pid=$!
        for _ in $(seq 600); do [ "$(stat -c %s "$work/run.out")" -ge 40 ] && break; sleep 0.05; done
        [ "$(stat -c %s "$work/run.out")" -ge 40 ] || die "cut $c: the run printed nothing in 30 s: $(tail -3 "$work/run.err")"
        t0=$(date +%s.%N)
        tc qdisc add dev "$HV" root blackhole && ip netns exec "$NS" tc qdisc add dev "$PV" root blackhole ||
            die "no blackhole qdisc on this kernel"
        rc=0; wait "$fg_pid" || rc=$?
        t1=$(date +%s.%N); fg_pid=
        tc qdisc del dev "$HV" root; ip netns exec "$NS" tc qdisc del dev "$PV" root
        grep -q "stop: context" "$work/run.err" && die "cut $c: the run never noticed the cut (it ran to the end of its context)"
        grep -q "$sub.2:${port[2]}" "$work/run.err" || die "cut $c: the run (exit $rc) did not name node 2: $(tail -3 "$work/run.err")"
        [ $rc != 124 ] && [ $rc != 137 ] || die "cut $c: the run never noticed (timed out after $timeout_s s)"
        sleep 0.2 # the time-stamper's last lines
        tl=$(grep -m1 "lost node" "$work/run.err" | cut -d' ' -f1)
        [ -n "$tl" ] || die "cut $c: no 'lost node' line: $(tail -3 "$work/run.err")"
        dt=$(python3 -c "print(f'{$tl - $t0:.3f}')")
        times+=("$dt")
        echo "bench_partition: --link-timeout $lt, cut $c: called down after $dt s ($(grep -o 'lost node[^;]*' "$work/run.err" | head -1))" >&2
        # a fresh node 2: the old one may hold the dead run's session until its own heartbeats give up (5 s)
        stop_pids "${npid[2]}"
        node 2 "$sub.2" "$NS"
    done
    results+=("$lt:$(IFS=,; echo "${times[*]}")")
done

python3 - "$out" "$argv" "${results[@]}" <<'EOF'
import json, statistics, sys, subprocess, datetime
out, argv, rows = sys.argv[1], sys.argv[2], sys.argv[3:]
res = []
for r in rows:
    lt, ts = r.split(":")
    t = [float(x) for x in ts.split(",")]
    bound = max(0.5, float(lt))  # the veth's round trips are well under 1 ms: 3 of them never set the bound
    res.append({"link_timeout_s": float(lt), "bound_s": bound, "times_s": t, "median_s": statistics.median(t),
                "min_s": min(t), "max_s": max(t), "met": statistics.median(t) <= bound})
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
doc = {"bench": "bench_partition.sh" + argv, "commit": commit, "date": datetime.date.today().isoformat(), "results": res}
json.dump(doc, open(out + ".json", "w"), indent=1)
with open(out + ".md", "w") as f:
    f.write("# A silent partition's detection time (issue #53)\n\n")
    f.write(f"`bench/bench_partition.sh{argv}` at {commit}, {doc['date']}. A 3-node ring, node 2 in a network namespace; "
            "each cut drops every packet on both ends of its veth pair (`blackhole` qdisc: no RST, no ICMP) while "
            "`ringlm run --ring` generates; the time from the cut to the run's line naming node 2 (\"lost node\"). The goal: within "
            "max(0.5 s, 3 round trips) - the veth's round trips are under a millisecond, so the bound is "
            "max(0.5 s, --link-timeout). No peer: llama.cpp's RPC has no silent-link detection to compare; ringlm runs at "
            "its defaults but for `--link-timeout` (the table's column) and `--keep-order`, nodes with 1 thread each "
            "and ring.conf `mem=` at half the model, so node 2 always holds a stage.\n\n")
    f.write("| --link-timeout | cuts | median | min | max | bound | goal |\n|---|---|---|---|---|---|---|\n")
    for r in res:
        f.write(f"| {r['link_timeout_s']:g} s | {len(r['times_s'])} | {r['median_s']:.3f} s | {r['min_s']:.3f} s | "
                f"{r['max_s']:.3f} s | {r['bound_s']:g} s | {'met' if r['met'] else 'missed'} |\n")
print(open(out + ".md").read())
EOF
