#!/usr/bin/env bash
# One machine: ringlm run against llama.cpp (the oracle's prebuilt libllama, same file, same thread count,
# same prompt tokens), on the `medium` synthesized model (> 1 GiB, Q4_K experts).
#
#   bench/bench_single.sh [--threads N] [--prompt N] [--gen N] [--reps N] [--model FILE]
#
# Writes bench/results/single.json and bench/results/single.md. Runs alternate between the two engines
# so machine noise hits both alike; each figure is the median over --reps runs. Also reports decode
# against the memory-bandwidth ceiling: active weight bytes per token / measured read bandwidth.
set -euo pipefail
cd "$(dirname "$0")/.."
threads=2 prompt=512 gen=64 reps=3 model=bench/models/medium.gguf
while [ $# -gt 0 ]; do
    case $1 in
        --threads) threads=$2; shift 2 ;;
        --prompt) prompt=$2; shift 2 ;;
        --gen) gen=$2; shift 2 ;;
        --reps) reps=$2; shift 2 ;;
        --model) model=$2; shift 2 ;;
        *) echo "bench_single: unknown option $1" >&2; exit 2 ;;
    esac
done
make -s ringlm oracle
mkdir -p bench/models bench/results build/bench
if [ ! -f "$model" ]; then
    echo "bench_single: synthesizing $model (medium preset, once)" >&2
    ./ringlm synth --config medium --seed 1 -o "$model.tmp" --progress && mv "$model.tmp" "$model"
fi
cc -O3 -march=native -fopenmp -o build/bench/membw bench/tools/membw.c
bw=$(build/bench/membw "$threads" 1024 5 | sed 's/.*"read_gb_s": \([0-9.]*\).*/\1/')
kv=$(./ringlm inspect --kv "$model")
V=$(echo "$kv" | awk '$1 == "n_vocab" { print $2 }')
active=$(echo "$kv" | awk '$1 == "active_bytes_per_token" { print $2 }')
weights=$(echo "$kv" | awk '$1 == "weight_bytes" { print $2 }')
toks=$(awk -v n="$prompt" -v v="$((V - 256))" 'BEGIN { x = 7; for (i = 0; i < n; i++) {
           x = (x * 1103515245 + 12345) % 2147483648; printf "%s%d", (i ? "," : ""), int(x / 65536) % v } }')
# Page the model in once so neither engine pays for the first read from disk.
cat "$model" >/dev/null

ours_p=() ours_d=() ref_p=() ref_d=() rss=()
for r in $(seq "$reps"); do
    ./ringlm run -m "$model" --tokens "$toks" -n "$gen" --temp 0 --ignore-eos --ids --threads "$threads" \
        --ctx $((prompt + gen + 8)) --chunk "$prompt" --metrics-json build/bench/ours.json >/dev/null 2>&1
    ours_p+=("$(sed -n 's/.*"prefill_tok_s":[[:space:]]*\([0-9.e+-]*\).*/\1/p' build/bench/ours.json)")
    ours_d+=("$(sed -n 's/.*"decode_tok_s":[[:space:]]*\([0-9.e+-]*\).*/\1/p' build/bench/ours.json)")
    rss+=("$(sed -n 's/.*"peak_rss_bytes":[[:space:]]*\([0-9.e+-]*\).*/\1/p' build/bench/ours.json)")
    tests/oracle/oracle bench -m "$model" --tokens "$toks" -n "$gen" --threads "$threads" >build/bench/ref.json
    ref_p+=("$(sed 's/.*"prefill_tok_s": \([0-9.]*\).*/\1/' build/bench/ref.json)")
    ref_d+=("$(sed 's/.*"decode_tok_s": \([0-9.]*\).*/\1/' build/bench/ref.json)")
    echo "run $r: ringlm prefill ${ours_p[-1]} decode ${ours_d[-1]} | llama.cpp prefill ${ref_p[-1]} decode ${ref_d[-1]} tok/s" >&2
done
median() { printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
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
cat >bench/results/single.json <<JSON
{
  "benchmark": "single-machine decode and prefill, ringlm vs llama.cpp",
  "command": "bench/bench_single.sh --threads $threads --prompt $prompt --gen $gen --reps $reps",
  "date": "$(date -u +%Y-%m-%dT%H:%M:%SZ)",
  "machine": {"cpu": "$cpu", "threads": $threads, "read_bandwidth_gb_s": $bw, "load_avg_at_end": $load},
  "model": {"file": "$model", "weight_bytes": $weights, "active_bytes_per_token": $active},
  "ringlm": {"prefill_tok_s": $op, "decode_tok_s": $od, "peak_rss_bytes": $rs},
  "llama_cpp": {"prefill_tok_s": $rp, "decode_tok_s": $rd, "engine": "prebuilt libllama of @node-llama-cpp/linux-x64@3.21.1"},
  "ratio": {"prefill": $ratio_p, "decode": $ratio_d, "how": "median of per-run-pair ratios"},
  "runs": {"ringlm_prefill": [$(IFS=,; echo "${ours_p[*]}")], "ringlm_decode": [$(IFS=,; echo "${ours_d[*]}")],
           "llama_prefill": [$(IFS=,; echo "${ref_p[*]}")], "llama_decode": [$(IFS=,; echo "${ref_d[*]}")]},
  "decode_bandwidth_ceiling_tok_s": $ceiling,
  "decode_fraction_of_ceiling": $(awk -v a="$od" -v c="$ceiling" 'BEGIN { printf "%.3f", a / c }')
}
JSON
cat >bench/results/single.md <<MD
# Single machine: ringlm vs llama.cpp

\`bench/bench_single.sh --threads $threads --prompt $prompt --gen $gen --reps $reps\`, $(date -u +%Y-%m-%d), $cpu,
$threads threads, medians of $reps alternating runs. Model: \`$model\` ($(awk -v b="$weights" 'BEGIN { printf "%.2f GiB", b / 1073741824 }'),
$(awk -v b="$active" 'BEGIN { printf "%.0f MiB", b / 1048576 }') of weights read per token). Measured read bandwidth $bw GB/s.

| engine | prefill tok/s ($prompt-token prompt) | decode tok/s |
|---|---|---|
| ringlm | $(printf '%.1f' "$op") | $(printf '%.2f' "$od") |
| llama.cpp (prebuilt libllama 3.21.1) | $(printf '%.1f' "$rp") | $(printf '%.2f' "$rd") |
| ratio (median of per-pair ratios) | $(printf '%.2fx' "$ratio_p") | $(printf '%.2fx' "$ratio_d") |

Per-pair ratios, prefill: ${pr[*]}; decode: ${dr[*]}.

Decode bandwidth ceiling (read bandwidth / active bytes per token): $ceiling tok/s; ringlm reaches
$(awk -v a="$od" -v c="$ceiling" 'BEGIN { printf "%.0f%%", 100 * a / c }') of it. ringlm peak RSS $(awk -v b="$rs" 'BEGIN { printf "%.0f MiB", b / 1048576 }').
MD
cat bench/results/single.md
