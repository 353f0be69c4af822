#!/usr/bin/env bash
# The cost of receipts: a ring of local nodes decoding with and without --receipts, in alternating pairs
# (adjacent runs share machine conditions); reports the median per-pair slowdown of decode tok/s. Then the
# cost of audits: runs with --audit-rate 1 (one stage of the sequence recomputed on the coordinator after
# it ends), the audit's time against the sequence's decode time.
#
#   bench/bench_receipts.sh [--model FILE] [--nodes N] [--pairs N] [--gen N]
# Writes bench/results/receipts.json and .md. The issue's goal: at most 1% of decode time.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
model=bench/models/medium.gguf nodes=4 pairs=7 gen=33
while [ $# -gt 0 ]; do
    case $1 in
        --model) model=$2; shift 2 ;; --nodes) nodes=$2; shift 2 ;; --pairs) pairs=$2; shift 2 ;;
        --gen) gen=$2; shift 2 ;; *) echo "bench_receipts: unknown option $1" >&2; exit 2 ;;
    esac
done
make -s ringlm
[ -f "$model" ] || { echo "bench_receipts: $model is missing (bench/bench_single.sh synthesizes it)" >&2; exit 1; }
work=$(mktemp -d) RINGLM=./ringlm
pids=()
trap 'stop_pids "${pids[@]}"; rm -rf "$work"' EXIT
mkdir -p "$work/models" bench/results
ln -s "$(realpath "$model")" "$work/models/m.gguf"
start_nodes "$nodes" 1 10 --speed 10
run() { # run MODE -> decode tok/s
    local extra=()
    [ "$1" = receipts ] && extra=(--receipts "$work/r.jsonl")
    [ "$1" = audit ] && extra=(--audit-rate 1 --audit-seed "$2")
    timeout 300 ./ringlm run -m "$model" --tokens 5 -n "$gen" --temp 0 --ignore-eos --ids --ring "$work/ring.conf" \
        --key "$work/coord.key" --metrics-json "$work/m.json" "${extra[@]}" >/dev/null 2>"$work/e.log"
    sed -n 's/.*"decode_tok_s":[[:space:]]*\([0-9.e+-]*\).*/\1/p' "$work/m.json"
}
# One warm-up run of each (nodes load their ranges and hash their manifests, the page cache fills); not counted.
run plain >/dev/null
run receipts >/dev/null
plain=() rec=() slow=()
for p in $(seq "$pairs"); do
    # ABBA order: which mode runs first alternates, so a drift within a pair cancels out over pairs.
    if [ $((p % 2)) = 1 ]; then a=$(run plain); b=$(run receipts); else b=$(run receipts); a=$(run plain); fi
    plain+=("$a"); rec+=("$b")
    slow+=("$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.4f", 100 * (a - b) / a }')")
    echo "pair $p: plain $a tok/s, receipts $b tok/s, slowdown ${slow[-1]}%" >&2
done
# Audits: one per run, at the stage the seed draws; audit ms vs the run's decode ms.
aud=() aud_pct=()
for p in $(seq "$pairs"); do
    t=$(run audit "$p")
    a_ms=$(sed -n 's/^audits: .* recomputed in \([0-9.]*\) ms.*/\1/p' "$work/e.log")
    [ -n "$a_ms" ] || { echo "bench_receipts: no audit line in run $p" >&2; cat "$work/e.log" >&2; exit 1; }
    aud+=("$a_ms")
    aud_pct+=("$(awk -v a="$a_ms" -v t="$t" -v g="$gen" 'BEGIN { printf "%.2f", 100 * a / (1000 * g / t) }')")
    echo "audit run $p: decode $t tok/s, audit of one stage $a_ms ms = ${aud_pct[-1]}% of the decode time" >&2
done
ms=$(median "${slow[@]}")
n_rcpt=$(wc -l <"$work/r.jsonl")
cat >bench/results/receipts.json <<JSON
{"benchmark": "receipts cost", "command": "bench/bench_receipts.sh --nodes $nodes --pairs $pairs --gen $gen",
 "date": "$(date -u +%Y-%m-%dT%H:%M:%SZ)", "model": "$model", "nodes": $nodes,
 "plain_decode_tok_s": [$(IFS=,; echo "${plain[*]}")], "receipts_decode_tok_s": [$(IFS=,; echo "${rec[*]}")],
 "slowdown_percent_per_pair": [$(IFS=,; echo "${slow[*]}")], "median_slowdown_percent": $ms,
 "receipts_in_last_run": $n_rcpt, "goal_percent": 1.0,
 "audit_ms_per_sequence": [$(IFS=,; echo "${aud[*]}")], "audit_percent_of_decode_time": [$(IFS=,; echo "${aud_pct[*]}")],
 "median_audit_percent_at_rate_1": $(median "${aud_pct[@]}")}
JSON
cat >bench/results/receipts.md <<MD
# Receipts cost

\`bench/bench_receipts.sh --nodes $nodes --pairs $pairs --gen $gen\`, $(date -u +%Y-%m-%d), model \`$model\`, $nodes local
nodes (1 thread each), greedy decode of $gen tokens, runs without and with \`--receipts\` in ABBA order (every
stage hashes its input and output and signs; the coordinator checks every traversal: $n_rcpt receipts in
the last run).

Per-pair slowdown of decode tok/s (%): ${slow[*]}. **Median: ${ms}%** (goal: at most 1%).

Audits (\`--audit-rate 1\`: every sequence audited at one stage drawn from the seed, recomputed on the
coordinator with one thread after the sequence ends): audit time per sequence (ms): ${aud[*]}; as a share of
the sequence's decode time (%): ${aud_pct[*]}. **Median: $(median "${aud_pct[@]}")% at rate 1**; the cost
scales with the rate (rate 0.05 audits one sequence in 20). It falls on the coordinator, after the
sequence, not on the nodes' decode.
MD
cat bench/results/receipts.md
