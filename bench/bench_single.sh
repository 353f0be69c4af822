#!/usr/bin/env bash
# One machine: ringlm run against llama.cpp as its users run it, `llama-bench` at its defaults (repacked CPU
# weights, flash attention auto, f16 cache), built from the same pinned source with the same CPU kernels
# (scripts/llama-tools.sh). Same file, same thread count, pairs of runs in alternating order, medians of
# per-pair ratios. Both sides are timed warm: llama-bench runs the test once untimed first (its default
# warm-up run) and ringlm run does the same (--warmup: the prompt and a step, then a clean state), so
# neither side's figure holds the first touch of its compute memory.
#
#   bench/bench_single.sh [--threads N] [--prompt N] [--gen N] [--reps N] [--model FILE] [--depth N]
#                         [--out NAME] [--ringlm-args "ARGS"]
#
# Short context (default): prefill of a --prompt-token prompt and --gen decode steps after it, on the `medium`
# synthesized model (> 1 GiB, Q4_K experts; --model build/bench/medium-iq2_xxs.gguf: the same with IQ2_XXS
# experts, from bench/configs/medium-iq2_xxs.json). Long context (--depth N): the same with an N-token
# prompt. llama-bench runs pp N, then tg at depth N (-d N), the same work as ringlm's decode.
# Writes bench/results/NAME.json and NAME.md (NAME: single, or single-long with --depth). Also reports
# decode against the memory-bandwidth ceiling: read bandwidth / active weight bytes per token.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
threads=2 prompt=512 gen=64 reps=3 model=bench/models/medium.gguf depth=0 out= rargs=
while [ $# -gt 0 ]; do
    case $1 in
        --threads) threads=$2; shift 2 ;;
        --prompt) prompt=$2; shift 2 ;;
        --gen) gen=$2; shift 2 ;;
        --reps) reps=$2; shift 2 ;;
        --model) model=$2; shift 2 ;;
        --depth) depth=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --ringlm-args) rargs=$2; shift 2 ;;
        *) echo "bench_single: unknown option $1" >&2; exit 2 ;;
    esac
done
[ -n "$out" ] || { [ "$depth" -gt 0 ] && out=single-long || out=single; }
make -s ringlm
B=$(scripts/llama-tools.sh)
mkdir -p bench/models bench/results build/bench
if [ ! -f "$model" ]; then
    # A model named after a bench/configs/NAME.json (e.g. build/bench/medium-iq2_xxs.gguf) is synthesized
    # from that config, one named after a synth preset (bench/models/tiny.gguf) from the preset; any other
    # missing file from the medium preset.
    name=$(basename "$model" .gguf)
    cfg=bench/configs/$name.json
    case $name in tiny | small | medium) [ -f "$cfg" ] || cfg=$name ;; esac
    [ -f "$cfg" ] || cfg=medium
    echo "bench_single: synthesizing $model ($cfg, once)" >&2
    ./ringlm synth --config "$cfg" --seed 1 -o "$model.tmp" --progress && mv "$model.tmp" "$model"
fi
cc -O3 -march=native -fopenmp -o build/bench/membw bench/tools/membw.c
bw=$(build/bench/membw "$threads" 1024 5 | sed 's/.*"read_gb_s": \([0-9.]*\).*/\1/')
kv=$(./ringlm inspect --kv "$model")
V=$(echo "$kv" | awk '$1 == "n_vocab" { print $2 }')
active=$(echo "$kv" | awk '$1 == "active_bytes_per_token" { print $2 }')
weights=$(echo "$kv" | awk '$1 == "weight_bytes" { print $2 }')
repacked=$(./ringlm inspect "$model" | awk '/are repacked on this CPU/ { print $4, $5 }')
n_prompt=$prompt
[ "$depth" -gt 0 ] && n_prompt=$depth
toks=$(seeded_ids "$n_prompt")
echo "$toks" >build/bench/prompt.ids
# Page the model in once so neither engine pays for the first read from disk.
cat "$model" >/dev/null

# llama-bench prints one JSON object per test; avg_ts is tokens/s. Its defaults are left alone: only the
# model, the sizes and the thread count are given (and -r 1: this script does the repetitions, alternating).
lb_ts() { python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); print(d[int(sys.argv[2])]["avg_ts"])' "$@"; }
ours_p=() ours_d=() ref_p=() ref_d=() rss=()
run_ours() {
    # shellcheck disable=SC2086
    ./ringlm run -m "$model" --tokens @build/bench/prompt.ids -n "$gen" --temp 0 --ignore-eos --ids --threads "$threads" \
        --ctx $((n_prompt + gen + 8)) --chunk 512 --warmup --metrics-json build/bench/ours.json $rargs >/dev/null 2>&1
    ours_p+=("$(sed -n 's/.*"prefill_tok_s":[[:space:]]*\([0-9.e+-]*\).*/\1/p' build/bench/ours.json)")
    ours_d+=("$(sed -n 's/.*"decode_tok_s":[[:space:]]*\([0-9.e+-]*\).*/\1/p' build/bench/ours.json)")
    rss+=("$(sed -n 's/.*"peak_rss_bytes":[[:space:]]*\([0-9.e+-]*\).*/\1/p' build/bench/ours.json)")
}
# llama-bench times decoding at the depth it is given, 0 by default (`-p 512 -n 64` runs tg64 on an empty
# cache), while ringlm decodes after its prompt; so decode is timed at the prompt's depth on both sides (-d),
# the same attention work. Without it, llama-bench's figure is of a cache 512 rows shorter.
run_ref() {
    "$B/llama-bench" -m "$model" -t "$threads" -r 1 -o json -p "$n_prompt" -n 0 >build/bench/ref_p.json 2>/dev/null
    "$B/llama-bench" -m "$model" -t "$threads" -r 1 -o json -p 0 -n "$gen" -d "$n_prompt" >build/bench/ref_d.json 2>/dev/null
    ref_p+=("$(lb_ts build/bench/ref_p.json 0)")
    ref_d+=("$(lb_ts build/bench/ref_d.json 0)")
}
# Pairs in alternating order (ringlm first, then llama-bench first, ...): whichever runs second in a pair
# meets a machine the first one just warmed or tired, and a fixed order would hand that to one side.
for r in $(seq "$reps"); do
    if [ $((r % 2)) = 1 ]; then run_ours; run_ref; else run_ref; run_ours; fi
    echo "run $r: ringlm prefill ${ours_p[-1]} decode ${ours_d[-1]} | llama-bench prefill ${ref_p[-1]} decode ${ref_d[-1]} tok/s" >&2
done
op=$(median "${ours_p[@]}") od=$(median "${ours_d[@]}") rp=$(median "${ref_p[@]}") rd=$(median "${ref_d[@]}")
# Ratios per pair of adjacent runs (same machine conditions), then their median: the machine's speed
# drifts during a run, which skews a ratio of separate medians.
pr=() dr=()
for i in "${!ours_p[@]}"; do
    pr+=("$(awk -v a="${ours_p[$i]}" -v b="${ref_p[$i]}" 'BEGIN { printf "%.4f", a / b }')")
    dr+=("$(awk -v a="${ours_d[$i]}" -v b="${ref_d[$i]}" 'BEGIN { printf "%.4f", a / b }')")
done
ratio_p=$(median "${pr[@]}") ratio_d=$(median "${dr[@]}")
rs=$(median "${rss[@]}")
ceiling=$(awk -v bw="$bw" -v a="$active" 'BEGIN { printf "%.2f", bw * 1e9 / a }')
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
load=$(cut -d' ' -f1 /proc/loadavg)
what_p="prefill of a $n_prompt-token prompt" what_d="decode of $gen tokens after $n_prompt"
lb_cmd="llama-bench -m MODEL -t $threads -r 1 -p $n_prompt -n 0; llama-bench -m MODEL -t $threads -r 1 -p 0 -n $gen -d $n_prompt"
cmd="bench/bench_single.sh --threads $threads --prompt $prompt --gen $gen --reps $reps --model $model"
long=""
[ "$depth" -gt 0 ] && cmd="$cmd --depth $depth" long=" (long context)"
[ -n "$out" ] && cmd="$cmd --out $out"
[ -n "$rargs" ] && cmd="$cmd --ringlm-args \"$rargs\"" long="$long, ringlm with $rargs"
ours_set="defaults: repacked weights where llama.cpp repacks them, flash attention, f16 cache; --warmup (one untimed run first, as llama-bench)"
[ -n "$rargs" ] && ours_set="repacked weights where llama.cpp repacks them, $rargs; --warmup (one untimed run first, as llama-bench)"
# (not grep -m1 in a pipe: strings dies of SIGPIPE, pipefail fails the pipeline, and both lines printed)
peer_cc=$(strings "$B/llama-bench" | grep '^GCC: ' | head -n 1 || true)
[ -n "$peer_cc" ] || peer_cc='an unknown compiler'
cat >"bench/results/$out.json" <<JSON
{
  "benchmark": "single machine, ringlm vs llama-bench at its defaults",
  "command": "$(echo "$cmd" | sed 's/"/\\"/g')",
  "date": "$(date -u +%Y-%m-%dT%H:%M:%SZ)",
  "machine": {"cpu": "$cpu", "threads": $threads, "read_bandwidth_gb_s": $bw, "load_avg_at_end": $load},
  "model": {"file": "$model", "weight_bytes": $weights, "active_bytes_per_token": $active, "repacked": "$repacked"},
  "ringlm": {"settings": "$ours_set",
             "prefill_tok_s": $op, "decode_tok_s": $od, "peak_rss_bytes": $rs},
  "llama_cpp": {"settings": "llama-bench defaults: repacked weights, flash attention auto (on, CPU), f16 cache, one warm-up run",
                "command": "$lb_cmd", "prefill_tok_s": $rp, "decode_tok_s": $rd,
                "engine": "llama-bench built from llama.cpp 80fb11a (node-llama-cpp 3.21.1), scripts/llama-tools.sh"},
  "ratio": {"prefill": $ratio_p, "decode": $ratio_d, "how": "median of per-run-pair ratios"},
  "runs": {"ringlm_prefill": [$(IFS=,; echo "${ours_p[*]}")], "ringlm_decode": [$(IFS=,; echo "${ours_d[*]}")],
           "llama_prefill": [$(IFS=,; echo "${ref_p[*]}")], "llama_decode": [$(IFS=,; echo "${ref_d[*]}")]},
  "decode_bandwidth_ceiling_tok_s": $ceiling,
  "decode_fraction_of_ceiling": $(awk -v a="$od" -v c="$ceiling" 'BEGIN { printf "%.3f", a / c }')
}
JSON
cat >"bench/results/$out.md" <<MD
# Single machine: ringlm vs llama-bench at its defaults$long

\`$cmd\`, $(date -u +%Y-%m-%d), $cpu,
$threads threads, medians of $reps alternating runs. Model: \`$model\` ($(awk -v b="$weights" 'BEGIN { printf "%.2f GiB", b / 1073741824 }'),
$(awk -v b="$active" 'BEGIN { printf "%.0f MiB", b / 1048576 }') of weights read per token; $repacked of the weights repacked on this CPU). Measured read bandwidth $bw GB/s.

| engine | settings | $what_p, tok/s | $what_d, tok/s |
|---|---|---|---|
| ringlm | $ours_set | $(printf '%.1f' "$op") | $(printf '%.2f' "$od") |
| llama-bench (llama.cpp 80fb11a) | its defaults: repacked weights, flash attention auto (on), f16 cache, a warm-up run before timing | $(printf '%.1f' "$rp") | $(printf '%.2f' "$rd") |
| ratio (median of per-pair ratios) | | $(printf '%.2fx' "$ratio_p") | $(printf '%.2fx' "$ratio_d") |

Per-pair ratios, prefill: ${pr[*]}; decode: ${dr[*]}. llama-bench ran as \`$lb_cmd\`, built by
$peer_cc (scripts/llama-tools.sh: the compiler scripts/ggml.sh builds ringlm's ggml with). Decode is
timed after the prompt on both sides (llama-bench \`-d $n_prompt\`; at its default depth 0 it would decode on an
empty cache); its settings are its defaults.

Decode bandwidth ceiling (read bandwidth / active bytes per token): $ceiling tok/s; ringlm reaches
$(awk -v a="$od" -v c="$ceiling" 'BEGIN { printf "%.0f%%", 100 * a / c }') of it. ringlm peak RSS $(awk -v b="$rs" 'BEGIN { printf "%.0f MiB", b / 1048576 }').
MD
cat "bench/results/$out.md"
