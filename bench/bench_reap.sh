#!/usr/bin/env bash
# REAP (issue #19): scoring speed on one machine and through a ring, and what pruning buys at decode.
#
#   bench/bench_reap.sh [--model bench/models/medium.gguf] [--tokens 2048] [--threads 2] [--nodes 2]
#                       [--prune 0.5] [--gen 64] [--reps 3] [--out reap]
#
# Scoring: `ringlm reap` over --tokens of calibration text (data/corpus), once on this machine with
# --threads, once through a ring of --nodes `ringlm node`s on loopback (no relay: this measures the
# machinery, not a network), threads split between them, so both use the same cores. The two scores files
# must be equal. Then the model is pruned at --prune and `ringlm run` decodes --gen tokens from a 64-token
# prompt on the unpruned and the pruned file, alternating, --reps pairs: tok/s (median of per-pair ratios)
# and peak RSS. Every run is ringlm at its defaults; there is no llama.cpp peer (llama.cpp has no expert
# pruning). Results: bench/results/OUT.md and .json.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
model=bench/models/medium.gguf tokens=2048 threads=2 nodes=2 prune=0.5 gen=64 reps=3 out=reap
while [ $# -gt 0 ]; do
    case $1 in
        --model) model=$2 ;; --tokens) tokens=$2 ;; --threads) threads=$2 ;; --nodes) nodes=$2 ;;
        --prune) prune=$2 ;; --gen) gen=$2 ;; --reps) reps=$2 ;; --out) out=$2 ;;
        *) echo "bench_reap: unknown option $1" >&2; exit 2 ;;
    esac
    shift 2
done
make -s ringlm
mkdir -p bench/models bench/results build/bench
if [ ! -f "$model" ]; then
    echo "bench_reap: synthesizing $model (medium preset, once)" >&2
    ./ringlm synth --config medium --seed 1 -o "$model.tmp" --progress && mv "$model.tmp" "$model"
fi
work=$(mktemp -d "$PWD/build/bench/reap.XXXXXX") RINGLM=./ringlm
pids=()
trap 'stop_pids "${pids[@]}"; rm -rf "$work"' EXIT
cat data/corpus/*.txt >"$work/calib.txt"
cat "$model" >/dev/null # paged in once: neither run pays for the first read

# ---- scoring on this machine and through the ring ------------------------------------------------------
./ringlm reap -m "$model" --calib "$work/calib.txt" --tokens "$tokens" --scores "$work/local.json" --threads "$threads" \
    --no-progress >"$work/local.out"
local_tps=$(sed -n 's/.* \([0-9.]*\) tokens\/s$/\1/p' "$work/local.out")
per=$((threads / nodes)); [ $per -ge 1 ] || per=1
mkdir -p "$work/models"; ln -sf "$PWD/$model" "$work/models/"
start_nodes "$nodes" "$per" 30
./ringlm reap -m "$model" --calib "$work/calib.txt" --tokens "$tokens" --scores "$work/ring.json" --ring "$work/ring.conf" \
    --key "$work/coord.key" --no-progress >"$work/ring.out" 2>&1
ring_tps=$(sed -n 's/.* \([0-9.]*\) tokens\/s$/\1/p' "$work/ring.out")
same=$(python3 - "$work/local.json" "$work/ring.json" <<'PY'
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
print('yes' if a['layers'] == b['layers'] and a['tokens'] == b['tokens'] else 'NO')
PY
)
stop_pids "${pids[@]}"
pids=()

# ---- pruned against unpruned at decode ---------------------------------------------------------------
./ringlm reap -m "$model" --scores "$work/local.json" --prune "$prune" -o "$work/pruned.gguf" >"$work/prune.out"
cat "$work/pruned.gguf" >/dev/null
prompt=$(seq -s, 100 163)
dec=() rss=() pdec=() prss=()
field() { sed -n "s/.*\"$1\":[[:space:]]*\([0-9.e+-]*\).*/\1/p" "$2"; }
for r in $(seq "$reps"); do
    ./ringlm run -m "$model" --tokens "$prompt" -n "$gen" --temp 0 --ignore-eos --ids --threads "$threads" \
        --metrics-json "$work/u.json" >/dev/null 2>&1
    ./ringlm run -m "$work/pruned.gguf" --tokens "$prompt" -n "$gen" --temp 0 --ignore-eos --ids --threads "$threads" \
        --metrics-json "$work/p.json" >/dev/null 2>&1
    dec+=("$(field decode_tok_s "$work/u.json")") rss+=("$(field peak_rss_bytes "$work/u.json")")
    pdec+=("$(field decode_tok_s "$work/p.json")") prss+=("$(field peak_rss_bytes "$work/p.json")")
done
ratios=() ; for i in $(seq 0 $((reps - 1))); do ratios+=("$(awk -v a="${pdec[$i]}" -v b="${dec[$i]}" 'BEGIN { printf "%.4f", a / b }')"); done
ud=$(printf '%.2f' "$(median "${dec[@]}")") pd=$(printf '%.2f' "$(median "${pdec[@]}")") ur=$(median "${rss[@]}") pr=$(median "${prss[@]}") rr=$(median "${ratios[@]}")
ubytes=$(stat -c %s "$model") pbytes=$(stat -c %s "$work/pruned.gguf")
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
cat >"bench/results/$out.json" <<JSON
{"date": "$(date -u +%F)", "cpu": "$cpu", "model": "$model", "calibration_tokens": $tokens, "threads": $threads,
 "score_local_tok_s": $local_tps, "score_ring_tok_s": $ring_tps, "ring_nodes": $nodes, "ring_scores_equal": "$same",
 "prune": $prune, "file_bytes": $ubytes, "pruned_file_bytes": $pbytes,
 "decode_tok_s": $ud, "pruned_decode_tok_s": $pd, "decode_ratio_median": $rr,
 "peak_rss_bytes": $ur, "pruned_peak_rss_bytes": $pr}
JSON
mib() { awk -v b="$1" 'BEGIN { printf "%.0f MiB", b / 1048576 }'; }
cat >"bench/results/$out.md" <<MD
# REAP: scoring speed, and the pruned model at decode

\`bench/bench_reap.sh --model $model --tokens $tokens --threads $threads --nodes $nodes --prune $prune --gen $gen --reps $reps --out $out\`,
$(date -u +%F), $cpu.

Settings: every run is ringlm at its defaults (weights repacked where llama.cpp repacks them, flash
attention, f16 cache), the ring nodes too. There is no llama.cpp peer: llama.cpp has no expert pruning to
compare with, so no figure here is judged against one; the pruned model is compared with the unpruned one.

## Scoring ($tokens calibration tokens, sequences of 512)

| where | tokens/s |
|---|---|
| this machine, $threads threads | $local_tps |
| a ring of $nodes nodes on loopback, $per thread(s) each (no relay) | $ring_tps |

Scores through the ring equal this machine's, every sum bit for bit: **$same**. Scoring is a forward pass
that also returns each MoE layer's choices, weights and output norms; the ring runs it one sequence at a
time (up to 8 chunks in flight), so on one box its figure is the pipeline's, not a network's.

## Pruned at $prune against unpruned (decode of $gen tokens after a 64-token prompt, $reps alternating pairs)

| model | file | decode tok/s (median) | peak RSS (median) |
|---|---|---|---|
| unpruned | $(mib "$ubytes") | $ud | $(mib "$ur") |
| pruned at $prune | $(mib "$pbytes") | $pd | $(mib "$pr") |

Median of per-pair decode ratios (pruned / unpruned): **${rr}x** (pairs: ${ratios[*]}). A token reads the
same number of experts either way (top-k is unchanged), so decode speed should barely move; what pruning
buys is memory: the file and the resident weights shrink with the expert tensors.
MD
cat "bench/results/$out.md"
