#!/usr/bin/env bash
# Load test of the OpenAI-compatible server on loopback: `ringlm serve` on one machine, `ringlm serve --ring`
# over a 3-node loopback ring, and llama.cpp's `llama-server` (from scripts/llama-tools.sh), same model file,
# same per-sequence context, one server at a time (the machine has 2 cores).
#
#   bench/bench_serve.sh [--model FILE] [--concurrency "1 4 16"] [--requests N] [--max-tokens N]
#                        [--prompt N] [--parallel N] [--ctx N] [--threads N] [--node-threads N]
#                        [--nodes N] [--timeout S] [--reps N] [--out PREFIX] [--keep] [--no-build]
#
# Defaults: build/bench/small.gguf (the `small` preset, synthesized once), concurrency 1, 4 and 16, 128
# requests per configuration (C clients each sending 128/C, at least 2, one after another), 64 generated
# tokens per request (temperature 0, ignore_eos), a 32-token seeded prompt, --parallel / -np 16, 256 tokens
# of context per sequence (llama-server gets -c 16 x 256, which it splits over its slots), 2 threads for the
# one-machine servers and 1 per ring node, 3 nodes, 300 s per configuration. Writes PREFIX.json and
# PREFIX.md (default bench/results/serve). --keep keeps the work folder (logs) under build/bench/; it is
# kept anyway when the run fails.
#
# The goal (16 streams: ringlm serve on one machine at least llama-server's aggregate tok/s) is judged head to
# head: after the table's runs, both servers run side by side (one idle while the other is loaded) and the
# highest concurrency is measured --reps times (default 3), alternating which goes first; the goal is the
# median of the per-pair ratios. A 2-core VM's speed drifts by 10-20% over minutes, which a single pair of
# runs minutes apart cannot tell from a difference between the servers.
#
# The load generator is bench/tools/load_serve.py (Python stdlib): streamed requests, per request the time
# to the first content chunk (TTFT) and between content chunks (inter-token latency); aggregate tok/s =
# completion tokens of the batch / its wall time; failed = not 200, an error event, no end of stream, or a
# timeout. ringlm gets POST /v1/completions; llama-server gets its native POST /completion (its
# /v1/completions and /completion both fail on this random-weight model's byte tokens unless those are
# banned, see load_serve.py), one event per token.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
argv=; [ $# -eq 0 ] || argv=$(printf ' %q' "$@")
model=build/bench/small.gguf concs="1 4 16" requests=128 max_tokens=64 prompt=32 parallel=16 ctx=256
threads=2 node_threads=1 nodes=3 timeout_s=300 out=bench/results/serve keep=0 build=1 reps=3
while [ $# -gt 0 ]; do
    case $1 in
        --model) model=$2; shift 2 ;;
        --concurrency) concs=$2; shift 2 ;;
        --requests) requests=$2; shift 2 ;;
        --max-tokens) max_tokens=$2; shift 2 ;;
        --prompt) prompt=$2; shift 2 ;;
        --parallel) parallel=$2; shift 2 ;;
        --ctx) ctx=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        --node-threads) node_threads=$2; shift 2 ;;
        --nodes) nodes=$2; shift 2 ;;
        --timeout) timeout_s=$2; shift 2 ;;
        --reps) reps=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --keep) keep=1; shift ;;
        --no-build) build=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "bench_serve: unknown option $1 (--help lists them)" >&2; exit 2 ;;
    esac
done
positive_ints requests:requests max_tokens:max-tokens prompt:prompt parallel:parallel ctx:ctx threads:threads \
              node_threads:node-threads nodes:nodes timeout_s:timeout
for c in $concs; do [[ $c =~ ^[1-9][0-9]*$ ]] || die "--concurrency: '$c' is not a count"; done
[[ $reps =~ ^[0-9]+$ ]] || die "--reps must be a count, got '$reps'"
[ $((prompt + max_tokens)) -le "$ctx" ] || die "--prompt + --max-tokens must fit in --ctx"

# ---- tools -------------------------------------------------------------------------------------------
need_tools python3 timeout make curl
if [ $build = 1 ]; then make -s ringlm || die "building ringlm failed (--no-build uses ./ringlm as it is)"; fi
RINGLM=$PWD/ringlm
[ -x "$RINGLM" ] || die "no ./ringlm after make"
need_subcommands serve node keygen
B=$(scripts/llama-tools.sh) || die "scripts/llama-tools.sh could not build llama.cpp's tools"
[ -x "$B/llama-server" ] || die "missing $B/llama-server (scripts/llama-tools.sh)"

mkdir -p "$(dirname "$out")" build/bench
if [ ! -f "$model" ]; then
    [ "$model" = build/bench/small.gguf ] || die "no model file $model"
    echo "bench_serve: synthesizing $model (small preset, once)" >&2
    "$RINGLM" synth --config small --seed 1 -o "$model.tmp" && mv "$model.tmp" "$model"
fi
model=$(cd "$(dirname "$model")" && pwd)/$(basename "$model")
kv=$("$RINGLM" inspect --kv "$model")
V=$(echo "$kv" | awk '$1 == "n_vocab" { print $2 }')
weights=$(echo "$kv" | awk '$1 == "weight_bytes" { print $2 }')
[ -n "$V" ] || die "ringlm inspect could not read $model"
toks=$(seeded_ids "$prompt")

# ---- processes: every one is recorded, and stopped on exit ---------------------------------------------
work=$(mktemp -d "$PWD/build/bench/serve.XXXXXX")
cp "$RINGLM" "$work/ringlm" && RINGLM=$work/ringlm
life=$((2 * 3600))
pids=()
STOP_WAIT_S=10 # stop_pids: a server gets 10 s after TERM before KILL
harness_traps # (bench/lib.sh) every process is stopped on exit; the work folder is kept on failure or --keep
cat "$model" >/dev/null # page the model in once

# start_local PORT LOG / start_llama PORT LOG: a server in the background (its pid in $spid and in pids), up
# once /health answers.
start_local() {
    timeout -k 5 $life "$RINGLM" serve -m "$model" --port "$1" --parallel "$parallel" --ctx "$ctx" --threads "$threads" \
        >"$2" 2>&1 &
    spid=$!; pids+=("$spid")
    wait_health "$1" "$spid" 120 || { cat "$2" >&2; die "ringlm serve did not start"; }
}
start_llama() {
    timeout -k 5 $life "$B/llama-server" -m "$model" --host 127.0.0.1 --port "$1" -np "$parallel" -c $((parallel * ctx)) \
        -t "$threads" >"$2" 2>&1 &
    spid=$!; pids+=("$spid")
    wait_health "$1" "$spid" 300 || { tail -20 "$2" >&2; die "llama-server did not start"; }
}
# warm NAME API PORT: one 8-token request before any batch
warm() {
    timeout -k 5 "$timeout_s" python3 bench/tools/load_serve.py --api "$2" --port "$3" --n-vocab "$V" \
        --concurrency 1 --requests 1 --max-tokens 8 --prompt-ids "$toks" --timeout "$timeout_s" >"$work/$1-warmup.json" \
        || die "$1: warm-up request failed ($(cat "$work/$1-warmup.json"))"
}
# batch NAME API PORT SERVER_PID C OUT: C clients, each sending max(2, requests/C) requests, into OUT.json
batch() {
    local name=$1 api=$2 port=$3 spid=$4 c=$5 out=$6 r rc=0
    r=$(( requests / c )); [ $r -ge 2 ] || r=2
    timeout -k 5 $((timeout_s + 60)) python3 bench/tools/load_serve.py --api "$api" --port "$port" --n-vocab "$V" \
        --concurrency "$c" --requests "$r" --max-tokens "$max_tokens" --prompt-ids "$toks" \
        --timeout "$timeout_s" >"$out.json" 2>"$out.err" || rc=$?
    [ $rc = 0 ] || echo "{\"concurrency\": $c, \"requests\": $((c * r)), \"completed\": 0, \"failed\": $((c * r)), \"errors\": [\"load generator exit $rc\"]}" >"$out.json"
    kill -0 "$spid" 2>/dev/null || echo "bench_serve: $name server died during concurrency $c" >&2
    echo "bench_serve: $(basename "$out"): $(python3 -c 'import json, sys; d = json.load(open(sys.argv[1]))
print("%s tok/s, ttft p50/p99 %s/%s ms, itl p50/p99 %s/%s ms, failed %d/%d" % (d.get("agg_tok_s"), d.get("ttft_p50_ms"),
      d.get("ttft_p99_ms"), d.get("itl_p50_ms"), d.get("itl_p99_ms"), d["failed"], d["requests"]))' "$out.json")" >&2
}
# load NAME API PORT SERVER_PID: warm-up, then one batch per concurrency into $work/NAME-cC.json
load() {
    local c
    warm "$1" "$2" "$3"
    for c in $concs; do batch "$1" "$2" "$3" "$4" "$c" "$work/$1-c$c"; done
}

# ---- 1. ringlm serve, one machine --------------------------------------------------------------------
port=$(free_port)
start_local "$port" "$work/ringlm-local.log"
load ringlm-local openai "$port" "$spid"
stop_pids "$spid"; pids=()

# ---- 2. ringlm serve --ring over N loopback nodes ----------------------------------------------------
mkdir -p "$work/models"
ln -s "$model" "$work/models/$(basename "$model")"
start_nodes "$nodes" "$node_threads" 120
port=$(free_port)
timeout -k 5 $life "$RINGLM" serve -m "$model" --port "$port" --parallel "$parallel" --ctx "$ctx" \
    --ring "$work/ring.conf" --key "$work/coord.key" >"$work/ringlm-ring.log" 2>&1 &
spid=$!; pids+=("$spid")
wait_health "$port" "$spid" 300 || { cat "$work/ringlm-ring.log" >&2; die "ringlm serve --ring did not start"; }
load ringlm-ring openai "$port" "$spid"
stop_pids "${pids[@]}"; pids=()

# ---- 3. llama-server ---------------------------------------------------------------------------------
port=$(free_port)
start_llama "$port" "$work/llama-server.log"
load llama-server llama "$port" "$spid"
stop_pids "$spid"; pids=()

# ---- 4. head to head at the highest concurrency: both servers up, alternating, --reps times ------------
cmax=0; for c in $concs; do [ "$c" -gt $cmax ] && cmax=$c; done
if [ "$reps" -gt 0 ]; then
    lport=$(free_port); start_local "$lport" "$work/h2h-ringlm.log"; lpid=$spid
    sport=$(free_port); start_llama "$sport" "$work/h2h-llama.log"
    warm h2h-ringlm-local openai "$lport"
    warm h2h-llama-server llama "$sport"
    for rp in $(seq "$reps"); do
        if [ $((rp % 2)) = 1 ]; then batch ringlm-local openai "$lport" "$lpid" "$cmax" "$work/h2h-ringlm-local-$rp"
                                     batch llama-server llama "$sport" "$spid" "$cmax" "$work/h2h-llama-server-$rp"
        else batch llama-server llama "$sport" "$spid" "$cmax" "$work/h2h-llama-server-$rp"
             batch ringlm-local openai "$lport" "$lpid" "$cmax" "$work/h2h-ringlm-local-$rp"; fi
    done
    stop_pids "${pids[@]}"; pids=()
fi

# ---- report ------------------------------------------------------------------------------------------
grep -aiE 'error|fail|abort|panic' "$work"/ringlm-*.log "$work"/node*.log >"$work/ringlm-errors.txt" 2>/dev/null || true
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
SB_WORK=$work SB_OUT=$out SB_MODEL=$model SB_WEIGHTS=$weights SB_CONCS=$concs SB_REQUESTS=$requests \
SB_MAX_TOKENS=$max_tokens SB_PROMPT=$prompt SB_PARALLEL=$parallel SB_CTX=$ctx SB_THREADS=$threads \
SB_NODE_THREADS=$node_threads SB_NODES=$nodes SB_COMMAND="bench/bench_serve.sh$argv" SB_CPU=$cpu SB_CORES=$(nproc) \
SB_LOAD=$(cut -d' ' -f1 /proc/loadavg) SB_LLAMA_BIN=$B SB_REPS=$reps python3 - <<'PY'
import json, os
e = os.environ; w = e["SB_WORK"]; concs = [int(c) for c in e["SB_CONCS"].split()]
servers = [("ringlm-local", "ringlm serve, one machine (%s threads)" % e["SB_THREADS"]),
           ("ringlm-ring", "ringlm serve --ring, %s loopback nodes (%s thread each)" % (e["SB_NODES"], e["SB_NODE_THREADS"])),
           ("llama-server", "llama-server (%s threads)" % e["SB_THREADS"])]
res = {}
for k, _ in servers:
    res[k] = {}
    for c in concs:
        try: res[k][str(c)] = json.load(open("%s/%s-c%d.json" % (w, k, c)))
        except Exception as x: res[k][str(c)] = {"failed": None, "errors": ["no result: %s" % x]}
errlog = open(w + "/ringlm-errors.txt").read().strip().splitlines()
cmax = str(max(concs))
ours, ref = res["ringlm-local"][cmax], res["llama-server"][cmax]
fails = sum((res[k][str(c)].get("failed") or 0) if res[k][str(c)].get("failed") is not None else 1
            for k in ("ringlm-local", "ringlm-ring") for c in concs)
reps = int(e["SB_REPS"])
h2h = {k: [] for k in ("ringlm-local", "llama-server")}
for r in range(1, reps + 1):
    for k in h2h:
        try: d = json.load(open("%s/h2h-%s-%d.json" % (w, k, r)))
        except Exception as x: d = {"failed": None, "errors": ["no result: %s" % x]}
        h2h[k].append(d)
        if k == "ringlm-local": fails += d.get("failed") if d.get("failed") is not None else 1
med = lambda xs: None if not xs else (sorted(xs)[len(xs) // 2] + sorted(xs)[(len(xs) - 1) // 2]) / 2
# Judged on the median of the per-run ratios (each pair ran back to back), not on the ratio of the medians.
pair_ratios = []
if reps > 0:
    ours_tok = med([d.get("agg_tok_s") or 0 for d in h2h["ringlm-local"]])
    ref_tok = med([d.get("agg_tok_s") or 0 for d in h2h["llama-server"]])
    pair_ratios = [(a.get("agg_tok_s") or 0) / b["agg_tok_s"] if b.get("agg_tok_s") else 0
                   for a, b in zip(h2h["ringlm-local"], h2h["llama-server"])]
    ratio = med(pair_ratios)
else:
    ours_tok, ref_tok = ours.get("agg_tok_s"), ref.get("agg_tok_s")
    ratio = (ours_tok or 0) / ref_tok if ref_tok else 0
goal_tok = ratio >= 1.0
goal = {"concurrency": int(cmax), "judged_on": "the median of the per-run ratios of %d alternating head-to-head runs" % reps
        if reps else "the table's runs", "ratio": ratio, "pair_ratios": pair_ratios,
        "ringlm_tok_s": ours_tok, "llama_server_tok_s": ref_tok,
        "head_to_head": {k: [d.get("agg_tok_s") for d in v] for k, v in h2h.items()},
        "tok_s_at_least_llama_server": goal_tok, "ringlm_failed_requests": fails, "met": goal_tok and fails == 0}
doc = {"benchmark": "OpenAI-compatible server under load on loopback: ringlm serve (one machine, ring) vs llama-server",
       "command": e["SB_COMMAND"], "date": __import__("time").strftime("%Y-%m-%dT%H:%M:%SZ", __import__("time").gmtime()),
       "machine": {"cpu": e["SB_CPU"], "cores": int(e["SB_CORES"]), "load_avg_at_end": float(e["SB_LOAD"])},
       "model": {"file": e["SB_MODEL"], "weight_bytes": int(e["SB_WEIGHTS"])},
       "settings": {"concurrency": concs, "requests_per_config": int(e["SB_REQUESTS"]), "max_tokens": int(e["SB_MAX_TOKENS"]),
                    "prompt_tokens": int(e["SB_PROMPT"]), "parallel": int(e["SB_PARALLEL"]), "ctx_per_sequence": int(e["SB_CTX"]),
                    "threads": int(e["SB_THREADS"]), "ring_nodes": int(e["SB_NODES"]), "node_threads": int(e["SB_NODE_THREADS"]),
                    "llama_server": e["SB_LLAMA_BIN"] + "/llama-server"},
       "results": res, "head_to_head": h2h, "goal": goal, "ringlm_log_errors": errlog[:50]}
json.dump(doc, open(e["SB_OUT"] + ".json", "w"), indent=1)
f = lambda v, p=1: "-" if v is None else ("%.*f" % (p, v))
L = ["# `ringlm serve` under load vs llama-server", "",
     "`%s`, %s, %s (%s cores), load avg at end %s." % (e["SB_COMMAND"], doc["date"], e["SB_CPU"], e["SB_CORES"], e["SB_LOAD"]), "",
     "Model `%s` (%.0f MiB, `small` preset, random weights). Streamed completions on loopback: %s-token seeded prompt, "
     "%s generated tokens (temperature 0, ignore_eos), %s requests per configuration (C clients, each sending "
     "max(2, %s/C) one after another), --parallel/-np %s, %s tokens of context per sequence (llama-server -c %d). "
     "Servers run one at a time." % (os.path.basename(e["SB_MODEL"]), int(e["SB_WEIGHTS"]) / 1048576, e["SB_PROMPT"],
     e["SB_MAX_TOKENS"], e["SB_REQUESTS"], e["SB_REQUESTS"], e["SB_PARALLEL"], e["SB_CTX"],
     int(e["SB_PARALLEL"]) * int(e["SB_CTX"])), "",
     "Settings: ringlm at its defaults (repacked weights where llama.cpp repacks them, flash attention, f16 cache); "
     "llama-server as shipped (its defaults: repacked CPU weights, `-fa auto`, f16 cache, its own batch sizes), "
     "given only `-m`, `--host`, `--port`, `-np`, `-c`, `-t`.", "",
     "| server | streams | requests | failed | aggregate tok/s | TTFT p50 / p99 ms | inter-token p50 / p99 ms |",
     "|---|---|---|---|---|---|---|"]
for k, label in servers:
    for c in concs:
        d = res[k][str(c)]
        L.append("| %s | %d | %s | %s | %s | %s / %s | %s / %s |" % (label, c, d.get("requests", "-"), d.get("failed", "-"),
                 f(d.get("agg_tok_s")), f(d.get("ttft_p50_ms")), f(d.get("ttft_p99_ms")), f(d.get("itl_p50_ms")), f(d.get("itl_p99_ms"))))
if reps > 0:
    L += ["", "Head to head at %s streams, both servers up, alternating (aggregate tok/s per run):" % cmax, "",
          "| run | ringlm serve, one machine | llama-server | ratio |", "|---|---|---|---|"]
    for i in range(reps):
        a, b = h2h["ringlm-local"][i].get("agg_tok_s"), h2h["llama-server"][i].get("agg_tok_s")
        L.append("| %d%s | %s | %s | %s |" % (i + 1, "" if i % 2 == 0 else " (llama-server first)", f(a), f(b),
                 f(a / b, 2) + "x" if a and b else "-"))
    L.append("| median | %s | %s | %s (of the ratios) |" % (f(ours_tok), f(ref_tok), f(ratio, 2) + "x"))
L += ["", "**Goal** (aggregate tok/s at %s streams at least llama-server's, no failed requests; judged on %s): %s — %sx "
      "(ringlm %s tok/s, llama-server %s tok/s, medians); ringlm failed requests over all its configurations: %d." % (
      cmax, goal["judged_on"], "met" if goal["met"] else "NOT met", f(ratio, 2), f(goal["ringlm_tok_s"]),
      f(goal["llama_server_tok_s"]), fails), ""]
errs = [(k, c, x) for k, _ in servers for c in concs for x in res[k][str(c)].get("errors") or []]
if errs:
    L += ["Failed requests (first reasons):", ""] + ["- %s, %d streams: %s" % (k, c, x) for k, c, x in errs[:20]] + [""]
if errlog:
    L += ["Error lines in the ringlm logs:", ""] + ["    " + l for l in errlog[:20]] + [""]
L += ["Notes:", "",
      "- Aggregate tok/s = completion tokens of all requests in the batch / wall time of the batch (first request sent to last "
      "stream ended). TTFT = request sent to first content chunk; inter-token latency = between successive content chunks "
      "(ringlm holds back an incomplete UTF-8 character, so one chunk may carry two tokens).",
      "- ringlm is driven through `POST /v1/completions` (`stream`, `stream_options.include_usage`, token-id prompt, "
      "`cache_prompt: false`: every request sends the same prompt, and this measures batching, not the prompt cache). "
      "llama-server through its native `POST /completion` (token-id prompt, `n_predict`, `cache_prompt: false`): both its "
      "endpoints end every stream with a 500 \"The model produced output that does not match the expected Content-only "
      "format\" as soon as this random-weight model emits a byte token that is not valid UTF-8 by itself, so for llama-server "
      "those tokens (found with its `/detokenize`) are banned with `logit_bias`. Same token count per request, different tokens.",
      "- One warm-up request (8 tokens) per server before the batches; the ring's nodes load their layers on the first request.",
      "- The machine has %s cores; the 3 ring nodes (1 thread each) and the coordinator share them." % e["SB_CORES"], ""]
open(e["SB_OUT"] + ".md", "w").write("\n".join(L))
PY
cat "$out.md"
