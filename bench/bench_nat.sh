#!/usr/bin/env bash
# What a relayed edge costs (issue #53): greedy decode tok/s and time to first token of a 4-node ring whose
# every hop crosses a `ringlm relay` adding D ms one way, with every node reached directly, against the same
# ring with node 3 behind a NAT: dialled out to node 4's relay (`ringlm node --dial`, `--relay-listen`), so
# the hop into node 3 crosses that relay too (two delayed legs: 2 x D). A traversal is then 6 one-way
# delays instead of 5: decode should be ~5/6 of direct once D dominates the stages' compute.
#
#   bench/bench_nat.sh [--model FILE] [--delays "10 30"] [--reps N] [--gen N] [--timeout S] [--out PREFIX]
#                      [--keep] [--no-build]
#
# Per delay: the four nodes on loopback (1 thread each), a delay relay in front of each, one in front of node
# 4's tunnel port for the ring's clients and one for node 3's dial-out; `ringlm run --ring --keep-order`
# alternates direct and relayed, --reps pairs (default 3), --gen tokens (default 32) after a short prompt;
# the two must print the same text. Reported: medians, and the median of each pair's relayed/direct ratio.
# Defaults: the `small` test model at seed 1 (synthesized once into build/bench), delays 10 and 30 ms. Writes
# PREFIX.json and PREFIX.md (default bench/results/nat).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
argv=; [ $# -eq 0 ] || argv=$(printf ' %q' "$@")
model=build/bench/small-s1.gguf delays="10 30" reps=3 gen=32 timeout_s=300 out=bench/results/nat keep=0 build=1
while [ $# -gt 0 ]; do
    case $1 in
        --model) model=$2; shift 2 ;;
        --delays) delays=$2; shift 2 ;;
        --reps) reps=$2; shift 2 ;;
        --gen) gen=$2; shift 2 ;;
        --timeout) timeout_s=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --keep) keep=1; shift ;;
        --no-build) build=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "bench_nat: unknown option $1 (--help lists them)" >&2; exit 2 ;;
    esac
done
positive_ints reps:reps gen:gen timeout_s:timeout
for d in $delays; do [[ $d =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "--delays: '$d' is not milliseconds"; done
need_tools python3 timeout make
if [ $build = 1 ]; then make -s ringlm || die "building ringlm failed (--no-build uses ./ringlm as it is)"; fi
RINGLM=$PWD/ringlm
[ -x "$RINGLM" ] || die "no ./ringlm after make"
need_subcommands run node keygen synth relay
"$RINGLM" node --help | grep -q -- '--dial' || die "this ringlm's node has no --dial"
mkdir -p "$(dirname "$out")" build/bench
if [ ! -f "$model" ]; then
    [ "$model" = build/bench/small-s1.gguf ] || die "no model file $model"
    "$RINGLM" synth --no-progress --config small --seed 1 -o "$model.tmp" && mv "$model.tmp" "$model"
fi
model=$(cd "$(dirname "$model")" && pwd)/$(basename "$model")

work=$(mktemp -d "$PWD/build/bench/nat.XXXXXX")
cp "$RINGLM" "$work/ringlm" && RINGLM=$work/ringlm
pids=() fg_pid= life=$((timeout_s * 4 * reps + 600))
harness_traps
mkdir -p "$work/models"
ln -s "$model" "$work/models/$(basename "$model")"
"$RINGLM" keygen -o "$work/coord.key" >"$work/coord.pub"
declare -A port
for i in 1 2 3 4; do "$RINGLM" keygen -o "$work/n$i.key" >"$work/n$i.pub"; port[$i]=$(free_port); done
tport=$(free_port) # node 4's relay for nodes behind NATs

# node I ARGS...: node I on its port, with ARGS; waits until ready
node() {
    local i=$1; shift
    timeout -k 5 "$life" "$RINGLM" node --listen "127.0.0.1:${port[$i]}" --key "$work/n$i.key" \
        --allow "$(cat "$work/coord.pub")" --models "$work/models" --threads 1 --speed 10 --cache "$work/cache$i" \
        "$@" >"$work/n$i.log" 2>&1 &
    pids+=($!)
    NODE_PID=$!
    wait_log "$work/n$i.log" "ready:" "$NODE_PID" 60 || die "node $i did not start: $(tail -3 "$work/n$i.log")"
}

results=()
for d in $delays; do
    start=${#pids[@]}
    declare -A via=()
    for i in 1 2 3 4; do start_relay "n$i-$d" "127.0.0.1:${port[$i]}" "$d"; via[$i]=$RELAY_ADDR; done
    start_relay "tunnel-clients-$d" "127.0.0.1:$tport" "$d"; xr=$RELAY_ADDR
    start_relay "tunnel-dial-$d" "127.0.0.1:$tport" "$d"; yr=$RELAY_ADDR
    node 4 --relay-listen "127.0.0.1:$tport"
    node 1
    node 2
    node 3 --dial "$yr" # listens too: the direct ring reaches it there
    wait_log "$work/n3.log" "reachable through it" "$NODE_PID" 30 || die "node 3 did not reach node 4's relay: $(tail -3 "$work/n3.log")"
    {
        for i in 1 2 3 4; do echo "${via[$i]} $(cat "$work/n$i.pub")"; done
    } >"$work/direct.conf"
    {
        for i in 1 2; do echo "${via[$i]} $(cat "$work/n$i.pub")"; done
        echo "relay:$xr $(cat "$work/n3.pub")"
        echo "${via[4]} $(cat "$work/n4.pub")"
    } >"$work/nat.conf"
    for r in $(seq "$reps"); do
        for kind in direct nat; do
            f=$work/$kind-$d-$r
            bounded "$kind run at $d ms (rep $r)" "$f.txt" "$f.err" "$RINGLM" run -m "$model" -p "the relayed edge" -n "$gen" \
                --temp 0 --ignore-eos --threads 1 --ring "$work/$kind.conf" --key "$work/coord.key" --keep-order \
                --metrics-json "$f.json"
        done
        cmp -s "$work/direct-$d-$r.txt" "$work/nat-$d-$r.txt" || die "at $d ms (rep $r) the relayed ring printed other text than the direct one"
        grep -q "^reach: stage 2 (relay:" "$work/nat-$d-$r.err" || die "the relayed run's plan has no reach line for stage 2"
        echo "bench_nat: $d ms rep $r: direct $(python3 -c "import json; print(json.load(open('$work/direct-$d-$r.json'))['decode_tok_s'])") tok/s, relayed $(python3 -c "import json; print(json.load(open('$work/nat-$d-$r.json'))['decode_tok_s'])") tok/s" >&2
    done
    results+=("$d")
    stop_pids "${pids[@]:$start}"
    pids=("${pids[@]:0:$start}")
done

python3 - "$out" "$argv" "$work" "$reps" "$gen" "${results[@]}" <<'EOF'
import json, statistics, sys, subprocess, datetime
out, argv, work, reps, gen, delays = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6:]
res = []
for d in delays:
    m = {k: [json.load(open(f"{work}/{k}-{d}-{r}.json")) for r in range(1, reps + 1)] for k in ("direct", "nat")}
    row = {"delay_ms": float(d)}
    for key in ("decode_tok_s", "ttft_s"):
        a = [x[key] for x in m["direct"]]
        b = [x[key] for x in m["nat"]]
        row[key] = {"direct": a, "relayed": b, "direct_median": statistics.median(a), "relayed_median": statistics.median(b),
                    "ratio_median": statistics.median([y / x for x, y in zip(a, b)])}
    res.append(row)
m0 = json.load(open(f"{work}/direct-{delays[0]}-1.json"))
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
doc = {"bench": "bench_nat.sh" + argv, "commit": commit, "date": datetime.date.today().isoformat(), "reps": reps,
       "gen": gen, "results": res}
json.dump(doc, open(out + ".json", "w"), indent=1)
with open(out + ".md", "w") as f:
    f.write("# What a relayed edge costs (issue #53)\n\n")
    f.write(f"`bench/bench_nat.sh{argv}` at {commit}, {doc['date']}. A 4-node ring on loopback (1 thread per node, the "
            "`small` test model), every hop behind a `ringlm relay` adding the delay one way; **direct**: every node "
            "listens where the ring reaches it; **relayed**: node 3 dialled out to node 4's relay (`--dial`, "
            "`--relay-listen`), so the hop into it crosses that relay (two delayed legs). `ringlm run --ring --keep-order`, "
            f"greedy, {gen} tokens after a {m0['prompt_tokens']}-token prompt, {reps} alternating pairs; both print the same text. Ratios: the "
            "median of each pair's relayed / direct. A traversal is 5 one-way delays direct and 6 relayed, so decode "
            "tends to 5/6 = 0.83 of direct as the delay grows past the stages' compute. No peer: llama.cpp's RPC has no "
            "relay (a node behind a NAT cannot join it at all).\n\n")
    f.write("| delay (one way) | decode direct | decode relayed | relayed / direct | TTFT direct | TTFT relayed | relayed / direct |\n")
    f.write("|---|---|---|---|---|---|---|\n")
    for r in res:
        dd, tt = r["decode_tok_s"], r["ttft_s"]
        f.write(f"| {r['delay_ms']:g} ms | {dd['direct_median']:.2f} tok/s | {dd['relayed_median']:.2f} tok/s | {dd['ratio_median']:.3f} | "
                f"{tt['direct_median']*1e3:.0f} ms | {tt['relayed_median']*1e3:.0f} ms | {tt['ratio_median']:.3f} |\n")
print(open(out + ".md").read())
EOF
