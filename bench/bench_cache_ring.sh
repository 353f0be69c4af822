#!/usr/bin/env bash
# The prompt cache through a ring (issue #51): multi-turn conversations against `ringlm serve --ring` over N
# loopback nodes, every link through `ringlm relay` with a one-way delay D (docs/relay.md; this kernel has no
# netem), time to first token (TTFT) of turns 2 and 3 with the cache, the same turns with `cache_prompt:
# false`, and the floor a cached turn cannot beat.
#
#   bench/bench_cache_ring.sh [--model FILE] [--nodes N] [--delays "0 30"] [--sizes "1024 4096 16384"]
#                             [--convs N] [--turns N] [--reply N] [--new N] [--think S] [--ctx N]
#                             [--timeout S] [--out PREFIX] [--keep] [--no-build]
#
# Defaults: build/bench/small-32k.gguf (bench_cache.sh's model: the `small` preset at seed 1 with a trained
# context of 32768, synthesized once), 4 nodes of 1 thread each (this machine has 2 cores), one-way delays 0
# and 30 ms, conversations of 1024, 4096 and 16384 tokens, 2 per size, 3 turns, replies of 32 greedy tokens
# (streamed, ignore_eos), 32 new seeded ids per later turn, a pause of 1 s between turns (a person reading the
# reply: the server re-reads the reply on the ring meanwhile, so a turn reads only its new tokens; --think 0
# sends turns back to back, and a turn then reads the reply with them). One sequence slot (--parallel 1),
# context = the largest conversation rounded up to 256. Writes PREFIX.json and PREFIX.md (default
# bench/results/cache-ring).
#
# Every link crosses one relay: the coordinator to stage 0, stage i to i+1 (a node dials the next at its
# ring.conf address), the last stage's result back: N + 1 delays per traversal of the ring. A cached turn
# needs at least one traversal (its new tokens go around once), so its floor at delay D is
#     (N + 1) x D + C,   C = the same turn's cached TTFT at delay 0 (the new tokens' compute on the stages,
#                            and the loopback hops)
# and the goal is a cached TTFT at D within 1.5x of that floor (the median over conversations). The client is
# bench/tools/load_turns.py (--uncached: each later turn sent again at once with cache_prompt false).
#
# Byte tokens whose text alone is not valid UTF-8 are banned (logit_bias; found with llama-server's
# /detokenize, as bench_cache.sh does): a stream holds such a token's text back until the next token completes
# it, so a reply starting with one would show its first chunk a decode step later - on a ring, one more
# traversal, which is not what this measures.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
argv=; [ $# -eq 0 ] || argv=$(printf ' %q' "$@")
model=build/bench/small-32k.gguf nodes=4 delays="0 30" sizes="1024 4096 16384" convs=2 turns=3 reply=32 new=32
think=1 ctx=0 timeout_s=600 out=bench/results/cache-ring keep=0 build=1
while [ $# -gt 0 ]; do
    case $1 in
        --model) model=$2; shift 2 ;;
        --nodes) nodes=$2; shift 2 ;;
        --delays) delays=$2; shift 2 ;;
        --sizes) sizes=$2; shift 2 ;;
        --convs) convs=$2; shift 2 ;;
        --turns) turns=$2; shift 2 ;;
        --reply) reply=$2; shift 2 ;;
        --new) new=$2; shift 2 ;;
        --think) think=$2; shift 2 ;;
        --ctx) ctx=$2; shift 2 ;;
        --timeout) timeout_s=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --keep) keep=1; shift ;;
        --no-build) build=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "bench_cache_ring: unknown option $1 (--help lists them)" >&2; exit 2 ;;
    esac
done
positive_ints nodes:nodes convs:convs turns:turns reply:reply new:new timeout_s:timeout
[[ $think =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "--think wants seconds, got '$think'"
[[ $ctx =~ ^[0-9]+$ ]] || die "--ctx must be a count, got '$ctx'"
[ "$turns" -ge 2 ] || die "--turns must be at least 2 (turn 1 is never cached)"
[ -n "$delays" ] && [ -n "$sizes" ] || die "--delays and --sizes need at least one value each"
for d in $delays; do [[ $d =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "--delays: '$d' is not a delay in ms"; done
smax=0
for s in $sizes; do [[ $s =~ ^[1-9][0-9]*$ ]] || die "--sizes: '$s' is not a count"; [ "$s" -gt $smax ] && smax=$s; done
need=$((smax + turns * (reply + new)))
[ "$ctx" -gt 0 ] || ctx=$(( (need + 255) / 256 * 256 ))
[ "$ctx" -ge "$need" ] || die "--ctx $ctx cannot hold the largest conversation ($need tokens)"

need_tools python3 timeout make curl
if [ $build = 1 ]; then make -s ringlm || die "building ringlm failed (--no-build uses ./ringlm as it is)"; fi
RINGLM=$PWD/ringlm
[ -x "$RINGLM" ] || die "no ./ringlm after make"
need_subcommands serve node relay keygen inspect
B=$(scripts/llama-tools.sh) || die "scripts/llama-tools.sh could not build llama.cpp's tools"
[ -x "$B/llama-server" ] || die "missing $B/llama-server (scripts/llama-tools.sh)"
mkdir -p "$(dirname "$out")" build/bench
if [ ! -f "$model" ]; then
    [ "$model" = build/bench/small-32k.gguf ] || die "no model file $model"
    echo "bench_cache_ring: synthesizing $model (small preset, seed 1, trained context 32768; once)" >&2
    echo '{"base": "small", "n_ctx_train": 32768}' >build/bench/small-32k.json
    "$RINGLM" synth --config build/bench/small-32k.json --seed 1 -o "$model.tmp" && mv "$model.tmp" "$model"
fi
model=$(cd "$(dirname "$model")" && pwd)/$(basename "$model")
kv=$("$RINGLM" inspect --kv "$model")
weights=$(echo "$kv" | awk '$1 == "weight_bytes" { print $2 }')
V=$(echo "$kv" | awk '$1 == "n_vocab" { print $2 }') # (seeded_ids draws below it)
[ -n "$weights" ] && [ -n "$V" ] || die "ringlm inspect could not read $model"

work=$(mktemp -d "$PWD/build/bench/cache-ring.XXXXXX")
cp "$RINGLM" "$work/ringlm" && RINGLM=$work/ringlm
life=$((3 * 3600))
pids=()
STOP_WAIT_S=10
harness_traps
mkdir -p "$work/models"
ln -s "$model" "$work/models/$(basename "$model")"
cat "$model" >/dev/null
# the byte tokens to ban (llama-server's /detokenize, then it stops)
lport=$(free_port)
timeout -k 5 600 "$B/llama-server" -m "$model" --host 127.0.0.1 --port "$lport" -np 1 -c 512 -t 2 >"$work/llama-server.log" 2>&1 &
lpid=$!; pids+=("$lpid")
wait_health "$lport" "$lpid" 300 || { tail -20 "$work/llama-server.log" >&2; die "llama-server did not start"; }
timeout -k 5 120 python3 bench/tools/load_turns.py bans --port "$lport" --n-vocab "$V" >"$work/bans.json" \
    || die "finding the byte tokens with llama-server's /detokenize failed"
stop_pids "$lpid"; pids=()
start_nodes "$nodes" 1 300
echo "bench_cache_ring: $nodes nodes up; work dir $work" >&2

# conv NAME SIZE I: one conversation (cached turns, then turns 2.. again uncached) into $work/NAME.json
conv() {
    local f=$work/$1 rc=0
    timeout -k 5 $((timeout_s + 30)) python3 bench/tools/load_turns.py conv --api openai --port "$rport" \
        --prompt-file "$work/ids-s$2-c$3-t1" --new-files "$newfiles" --reply "$reply" --think "$think" --uncached --ban-file "$work/bans.json" \
        --timeout "$timeout_s" >"$f.json" 2>"$f.err" || rc=$?
    [ $rc = 0 ] || { cat "$f.err" >&2; die "$1 failed (exit $rc): $(head -c 400 "$f.json")"; }
    echo "bench_cache_ring: $1: $(python3 -c 'import json, sys; d = json.load(open(sys.argv[1]))
print(", ".join("turn %d %.0f ms (read %s)" % (t["turn"], t["ttft_ms"], t["read"]) for t in d["turns"])
      + "".join("; uncached %d %.0f ms" % (t["turn"], t["ttft_ms"]) for t in d["uncached"]))' "$f.json")" >&2
}

for d in $delays; do
    relays=() conf=()
    for i in $(seq "$nodes"); do
        start_relay "n$i-d$d" "${node_addr[$((i - 1))]}" "$d"
        relays+=("$RELAY_PID")
        conf+=("$RELAY_ADDR $(cat "$work/n$i.pub")")
    done
    printf '%s\n' "${conf[@]}" >"$work/ring-d$d.conf"
    rport=$(free_port)
    timeout -k 5 $life "$RINGLM" serve -m "$model" --ring "$work/ring-d$d.conf" --key "$work/coord.key" --port "$rport" \
        --parallel 1 --ctx "$ctx" --keep-order >"$work/serve-d$d.log" 2>&1 &
    spid=$!; pids+=("$spid")
    wait_health "$rport" "$spid" 600 || { tail -20 "$work/serve-d$d.log" >&2; die "ringlm serve --ring did not start (delay $d)"; }
    seeded_ids 64 99991 >"$work/ids-warm"; seeded_ids "$new" 99992 >"$work/ids-warm-t2"
    newfiles=$work/ids-warm-t2
    timeout -k 5 300 python3 bench/tools/load_turns.py conv --api openai --port "$rport" --prompt-file "$work/ids-warm" \
        --new-files "$newfiles" --reply "$reply" --ban-file "$work/bans.json" --timeout 240 >"$work/warm-d$d.json" 2>&1 || die "warm-up failed (delay $d)"
    g=0
    for s in $sizes; do
        for i in $(seq "$convs"); do
            base=$((1000 + 100 * g)) # the same seeds at every delay
            seeded_ids "$s" "$base" >"$work/ids-s$s-c$i-t1"
            newfiles=
            for k in $(seq 2 "$turns"); do
                seeded_ids "$new" $((base + k)) >"$work/ids-s$s-c$i-t$k"
                newfiles=$newfiles${newfiles:+,}$work/ids-s$s-c$i-t$k
            done
            conv "d$d-s$s-c$i" "$s" "$i"
            g=$((g + 1))
        done
    done
    curl -s --max-time 10 "http://127.0.0.1:$rport/metrics" | grep '^ringlm_prompt' >"$work/metrics-d$d.txt" || true
    stop_pids "$spid" "${relays[@]}"
    left=(); for p in "${pids[@]}"; do [[ " $spid ${relays[*]} " == *" $p "* ]] || left+=("$p"); done; pids=("${left[@]}")
done

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
SB_WORK=$work SB_OUT=$out SB_MODEL=$model SB_WEIGHTS=$weights SB_NODES=$nodes SB_DELAYS=$delays SB_SIZES=$sizes \
SB_CONVS=$convs SB_TURNS=$turns SB_REPLY=$reply SB_NEW=$new SB_THINK=$think SB_CTX=$ctx SB_COMMAND="bench/bench_cache_ring.sh$argv" \
SB_CPU=$cpu SB_CORES=$(nproc) python3 - <<'PY'
import json, os, time
e = os.environ; w = e["SB_WORK"]
N = int(e["SB_NODES"]); delays = e["SB_DELAYS"].split(); sizes = [int(s) for s in e["SB_SIZES"].split()]
convs = int(e["SB_CONVS"]); turns = int(e["SB_TURNS"])
med = lambda xs: None if not xs else (sorted(xs)[len(xs) // 2] + sorted(xs)[(len(xs) - 1) // 2]) / 2
res = {d: {s: [json.load(open("%s/d%s-s%d-c%d.json" % (w, d, s, i))) for i in range(1, convs + 1)] for s in sizes} for d in delays}
rows, goal_rows = [], []
summary = {}
for d in delays:
    for s in sizes:
        for k in range(1, turns + 1):
            c = [x["turns"][k - 1] for x in res[d][s]]
            u = [t for x in res[d][s] for t in x.get("uncached", []) if t["turn"] == k]
            same = [t.get("same_reply_as_cached") for t in u]
            S = summary.setdefault(d, {}).setdefault(str(s), {})[str(k)] = {
                "cached_ttft_ms": [t["ttft_ms"] for t in c], "read": [t.get("read") for t in c],
                "prompt_tokens": c[0].get("prompt_tokens"), "uncached_ttft_ms": [t["ttft_ms"] for t in u],
                "uncached_same_reply": same}
            S["cached_median"] = med(S["cached_ttft_ms"]); S["uncached_median"] = med(S["uncached_ttft_ms"])
goal = None
if "0" in delays or "0.0" in delays:
    z = "0" if "0" in delays else "0.0"
    met = True
    for d in delays:
        if d == z: continue
        for s in sizes:
            for k in range(2, turns + 1):
                S = summary[d][str(s)][str(k)]
                floor = (N + 1) * float(d) + summary[z][str(s)][str(k)]["cached_median"]
                S["floor_ms"] = floor; S["over_floor"] = S["cached_median"] / floor
                met = met and S["over_floor"] <= 1.5
                goal_rows.append((d, s, k, S))
    goal = {"statement": "cached TTFT of turns 2..%d at each delay D within 1.5x of the floor (N + 1) x D + the "
                         "same turn's cached TTFT at delay 0 (median over conversations)" % turns, "met": met}
doc = {"benchmark": "prompt cache through a ring: multi-turn TTFT, cached vs cache_prompt false",
       "command": e["SB_COMMAND"], "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
       "machine": {"cpu": e["SB_CPU"], "cores": int(e["SB_CORES"])}, "nodes": N, "delays_ms": delays,
       "settings": {"sizes": sizes, "convs": convs, "turns": turns, "reply": int(e["SB_REPLY"]), "new": int(e["SB_NEW"]),
                    "think_s": float(e["SB_THINK"]), "ctx": int(e["SB_CTX"])},
       "model": {"file": e["SB_MODEL"], "weight_bytes": int(e["SB_WEIGHTS"])}, "summary": summary, "goal": goal,
       "metrics": {d: open("%s/metrics-d%s.txt" % (w, d)).read().splitlines() for d in delays}, "results": res}
json.dump(doc, open(e["SB_OUT"] + ".json", "w"), indent=1)
f = lambda v, p=0: "-" if v is None else "%.*f" % (p, v)
fl = lambda xs: " / ".join(f(x) for x in xs) if xs else "-"
L = ["# Prompt cache through a ring: multi-turn time to first token", "",
     "`%s`, %s, %s (%s cores)." % (e["SB_COMMAND"], doc["date"], e["SB_CPU"], e["SB_CORES"]), "",
     "`ringlm serve --ring` over %d loopback nodes (1 thread each), every link through `ringlm relay` at the one-way "
     "delay D: %d delays per traversal. Model `%s` (%.0f MiB, random weights). %d conversations per size, %d turns: "
     "turn 1 is SIZE seeded ids, the server generates %s tokens greedily (streamed), turn k+1 = turn k's prompt + "
     "the ids generated + %s new ids, after a pause of %s s. One slot (`--parallel 1`), context %s, the server at its "
     "defaults otherwise (8 checkpoints per slot on every stage). Each later turn is sent again at once with "
     "`cache_prompt: false` (uncached)." % (N, N + 1, os.path.basename(e["SB_MODEL"]), int(e["SB_WEIGHTS"]) / 1048576,
     convs, turns, e["SB_REPLY"], e["SB_NEW"], e["SB_THINK"], e["SB_CTX"]), "",
     "TTFT in ms per conversation; *read* = prompt tokens the server read (prompt_tokens - cached_tokens).", "",
     "| D ms | size | turn | prompt | cached TTFT | median | read | uncached TTFT | median | saved | replies equal |",
     "|---|---|---|---|---|---|---|---|---|---|---|"]
for d in delays:
    for s in sizes:
        for k in range(1, turns + 1):
            S = summary[d][str(s)][str(k)]
            sv = "%.1fx" % (S["uncached_median"] / S["cached_median"]) if S["uncached_median"] and S["cached_median"] else "-"
            eq = "-" if not S["uncached_same_reply"] else "%d/%d" % (sum(bool(x) for x in S["uncached_same_reply"]), len(S["uncached_same_reply"]))
            L.append("| %s | %d | %d | %s | %s | %s | %s | %s | %s | %s | %s |" % (d, s, k, f(S["prompt_tokens"]),
                     fl(S["cached_ttft_ms"]), f(S["cached_median"]), fl(S["read"]), fl(S["uncached_ttft_ms"]),
                     f(S["uncached_median"]), sv, eq))
if goal:
    L += ["", "**Goal** (%s): %s." % (goal["statement"], "met" if goal["met"] else "NOT met"), "",
          "| D ms | size | turn | floor ms = %d x D + C | cached TTFT median | over the floor |" % (N + 1), "|---|---|---|---|---|---|"]
    for d, s, k, S in goal_rows:
        L.append("| %s | %d | %d | %s | %s | %.2fx |" % (d, s, k, f(S["floor_ms"]), f(S["cached_median"]), S["over_floor"]))
L += ["", "`/metrics` prompt-cache lines at the end of each delay's run:", ""]
for d in delays: L += ["    D = %s ms:" % d] + ["    " + l for l in doc["metrics"][d]]
L += ["", "Notes:", "",
      "- The floor: a cached turn's new tokens must go around the ring once (N + 1 relay crossings) and be computed "
      "by every stage; C (the delay-0 cached TTFT) is that compute plus the loopback hops and the server's own work.",
      "- Uncached turns read their whole prompt: at delay D its pieces (256 tokens a step) each take a traversal.",
      "- A cached turn's reply equal to the uncached one's shows the resumed state is a fresh read's (this f32 "
      "model's kernels are split-invariant).", ""]
open(e["SB_OUT"] + ".md", "w").write("\n".join(L))
PY
cat "$out.md"
