#!/usr/bin/env bash
# A long context on one machine: `ringlm run` fills a --ctx N context (a prompt of N - gen - 8 tokens, then
# --gen decode steps) and its peak RSS is set against what `ringlm inspect` predicts for holding that context
# (weights + state + compute buffer, at the defaults: flash attention over an f16 cache, prefill chunks of
# 512 tokens). The issue's check: a 128k-token context runs on a small model with the memory inspect predicts.
#
#   bench/bench_context.sh [--model FILE] [--ctx N] [--gen N] [--threads N] [--out NAME]
#
# Defaults: bench/models/tiny.gguf (synthesized once: the `tiny` preset, f32), --ctx 131072, --gen 16,
# 2 threads. Writes bench/results/NAME.json and NAME.md (NAME: context).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
model=bench/models/tiny.gguf ctx=131072 gen=16 threads=2 out=context
argv=; [ $# -gt 0 ] && argv=$(printf ' %q' "$@")
while [ $# -gt 0 ]; do
    case $1 in
        --model) model=$2; shift 2 ;;
        --ctx) ctx=$2; shift 2 ;;
        --gen) gen=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        *) echo "bench_context: unknown option $1" >&2; exit 2 ;;
    esac
done
[ -x ./ringlm ] || make ringlm >/dev/null || die "cannot build ringlm"
mkdir -p build/bench bench/results
if [ ! -f "$model" ]; then
    [ "$model" = bench/models/tiny.gguf ] || die "no model file $model"
    mkdir -p bench/models
    ./ringlm synth --config tiny -o "$model.tmp" >/dev/null && mv "$model.tmp" "$model"
fi
n_prompt=$((ctx - gen - 8))
V=$(./ringlm inspect --kv "$model" | awk '$1 == "n_vocab" { print $2 }')
seeded_ids "$n_prompt" 11 >build/bench/context.ids
# inspect's prediction for one sequence of ctx tokens, in bytes (its --kv lines).
kv=$(./ringlm inspect --kv "$model" --seqs 1 --ctx "$ctx")
pred() { echo "$kv" | awk -v k="$1" '$1 == k { print $2 }'; }
p_weights=$(pred range_weight_bytes) p_state=$(pred range_state_bytes) p_compute=$(pred range_compute_bytes)
p_total=$(pred range_total_bytes)
[ -n "$p_total" ] || die "ringlm inspect --kv printed no range_total_bytes"
cat "$model" >/dev/null
t0=$(date +%s)
# RINGLM_BACKEND_DIR empty: no GPU backend modules, as a CPU-only build. Device discovery otherwise maps
# them and the drivers they open (here Mesa's lavapipe, with libLLVM: about 52 MiB resident), code that
# is the same at any context and that inspect does not count.
RINGLM_BACKEND_DIR= ./ringlm run -m "$model" --tokens @build/bench/context.ids -n "$gen" --temp 0 --ignore-eos --ids --threads "$threads" \
    --ctx "$ctx" --chunk 512 --metrics-json build/bench/context.json >/dev/null 2>build/bench/context.err ||
    { tail -5 build/bench/context.err >&2; die "ringlm run failed"; }
wall=$(($(date +%s) - t0))
m() { sed -n "s/.*\"$1\":[[:space:]]*\([0-9.e+-]*\).*/\1/p" build/bench/context.json; }
rss=$(m peak_rss_bytes) pre=$(m prefill_tok_s) dec=$(m decode_tok_s) gen_n=$(m generated_tokens)
ratio=$(awk -v a="$rss" -v b="$p_total" 'BEGIN { printf "%.3f", a / b }')
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
cat >"bench/results/$out.json" <<JSON
{
  "benchmark": "one machine, a full long context: peak RSS against inspect's prediction",
  "command": "bench/bench_context.sh$argv",
  "date": "$(date -u +%Y-%m-%dT%H:%M:%SZ)",
  "machine": {"cpu": "$cpu", "threads": $threads},
  "model": "$model", "ctx": $ctx, "prompt_tokens": $n_prompt, "generated_tokens": $gen_n,
  "settings": "ringlm defaults: flash attention, f16 cache, prefill chunks of 512",
  "predicted": {"weight_bytes": $p_weights, "state_bytes": $p_state, "compute_bytes": $p_compute, "total_bytes": $p_total},
  "peak_rss_bytes": $rss, "rss_over_predicted": $ratio,
  "prefill_tok_s": $pre, "decode_tok_s": $dec, "wall_s": $wall
}
JSON
cat >"bench/results/$out.md" <<MD
# A long context on one machine: memory against inspect's prediction

\`bench/bench_context.sh$argv\`, $(date -u +%Y-%m-%d), $cpu, $threads threads. Model \`$model\`; context of
$ctx tokens: a $n_prompt-token prompt (prefill in chunks of 512), then $gen_n decode steps; ringlm at its defaults
(flash attention over an f16 cache), with no GPU backend modules loaded (\`RINGLM_BACKEND_DIR=\`, as a CPU-only
build): a default run on this machine also maps the Vulkan module and Mesa's software driver it opens while
looking for GPUs (libLLVM and libggml-vulkan, about 52 MiB resident), whatever the context.

| | bytes |
|---|---|
| inspect: weights | $(mib "$p_weights") |
| inspect: state (1 sequence x $ctx tokens, f16 cache) | $(mib "$p_state") |
| inspect: compute buffer (a 512-token chunk at the full context) | $(mib "$p_compute") |
| **inspect: total** | **$(mib "$p_total")** |
| **ringlm run: peak RSS** | **$(mib "$rss")** ($ratio of the prediction) |

Prefill $(printf '%.1f' "$pre") tok/s over the whole prompt, decode $(printf '%.2f' "$dec") tok/s at the end of the
context; $wall s in all. Peak RSS also holds the process's code and libraries, and the tokenizer.
MD
cat "bench/results/$out.md"
