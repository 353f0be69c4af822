#!/usr/bin/env bash
# The cost of structured output (issue #18): `ringlm serve` tokens/s with and without a response_format,
# at 1 and 16 concurrent streams, same server, same prompt, same token count.
#
#   bench/bench_structured.sh [--model FILE] [--concurrency "1 16"] [--max-tokens N] [--reps N]
#                             [--threads N] [--out PREFIX]
#
# Defaults: build/bench/small.gguf (synthesized once, as bench_serve.sh does), concurrency 1 and 16, 64
# tokens per request (temperature 0, ignore_eos, so every request generates exactly that many), 3 reps,
# 2 threads, PREFIX bench/results/structured (.json and .md). Per concurrency and rep the plain batch and
# each constrained one run back to back, the order alternating between reps; the table reports each
# format's median tok/s and the median of its per-rep ratios to the plain batch. Formats: json_object, and
# a json_schema (an object holding an array of strings and an integer) whose strings random weights fill
# with text, so most tokens are sampled inside the grammar rather than forced by its budget.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
argv=; [ $# -eq 0 ] || argv=$(printf ' %q' "$@")
model=build/bench/small.gguf concs="1 16" max_tokens=64 reps=3 threads=2 out=bench/results/structured
while [ $# -gt 0 ]; do
    case $1 in
        --model) model=$2; shift 2 ;;
        --concurrency) concs=$2; shift 2 ;;
        --max-tokens) max_tokens=$2; shift 2 ;;
        --reps) reps=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "bench_structured: unknown option $1 (--help lists them)" >&2; exit 2 ;;
    esac
done
for v in max_tokens reps threads; do [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "--${v//_/-} must be a positive integer"; done
for c in $concs; do [[ $c =~ ^[1-9][0-9]*$ ]] || die "--concurrency: '$c' is not a count"; done
make -s ringlm || die "building ringlm failed"
RINGLM=$PWD/ringlm
mkdir -p "$(dirname "$out")" build/bench
if [ ! -f "$model" ]; then
    [ "$model" = build/bench/small.gguf ] || die "no model file $model"
    "$RINGLM" synth --config small --seed 1 -o "$model.tmp" && mv "$model.tmp" "$model"
fi
V=$("$RINGLM" inspect --kv "$model" | awk '$1 == "n_vocab" { print $2 }')
toks=$(seeded_ids 32)
work=$(mktemp -d "$PWD/build/bench/structured.XXXXXX")
port=$(free_port)
"$RINGLM" serve -m "$model" --port "$port" --parallel 16 --ctx 256 --threads "$threads" >"$work/serve.log" 2>&1 &
spid=$!
trap 'kill $spid 2>/dev/null || true; wait $spid 2>/dev/null || true; rm -rf "$work"' EXIT
wait_health "$port" "$spid" 60 || { cat "$work/serve.log" >&2; die "ringlm serve did not start"; }

declare -A EXTRA=(
    [plain]=''
    [json_object]='{"response_format":{"type":"json_object"}}'
    [json_schema]='{"response_format":{"type":"json_schema","json_schema":{"name":"notes","strict":true,"schema":{"type":"object","properties":{"notes":{"type":"array","items":{"type":"string"}},"count":{"type":"integer"}},"required":["notes","count"],"additionalProperties":false}}}}'
)
formats="plain json_object json_schema"
run() { # FORMAT C REP
    local r=$(( 32 / $2 )); [ $r -ge 2 ] || r=2
    python3 bench/tools/load_serve.py --port "$port" --concurrency "$2" --requests "$r" --max-tokens "$max_tokens" \
        --prompt-ids "$toks" --timeout 600 ${EXTRA[$1]:+--extra "${EXTRA[$1]}"} >"$work/$1-c$2-r$3.json"
    python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert d["failed"] == 0, d["errors"]; print("bench_structured: %s c=%s rep %s: %s tok/s" % (sys.argv[2], sys.argv[3], sys.argv[4], d["agg_tok_s"]))' \
        "$work/$1-c$2-r$3.json" "$1" "$2" "$3" >&2
}
python3 bench/tools/load_serve.py --port "$port" --concurrency 1 --requests 1 --max-tokens 8 --prompt-ids "$toks" >/dev/null
for c in $concs; do
    for rep in $(seq "$reps"); do
        order=$formats; [ $((rep % 2)) = 0 ] && order=$(echo "$formats" | tr ' ' '\n' | tac | tr '\n' ' ')
        for f in $order; do run "$f" "$c" "$rep"; done
    done
done
python3 - "$work" "$out" "$concs" "$reps" "$formats" "$max_tokens" "bench/bench_structured.sh$argv" <<'PY'
import json, statistics, sys, time
work, out, concs, reps, formats, mt, cmd = sys.argv[1], sys.argv[2], sys.argv[3].split(), int(sys.argv[4]), sys.argv[5].split(), sys.argv[6], sys.argv[7]
res = {"command": cmd, "date": time.strftime("%Y-%m-%d"), "max_tokens": int(mt), "results": []}
rows = []
for c in concs:
    tps = {f: [json.load(open("%s/%s-c%s-r%d.json" % (work, f, c, r)))["agg_tok_s"] for r in range(1, reps + 1)] for f in formats}
    for f in formats:
        ratios = [a / b for a, b in zip(tps[f], tps["plain"])]
        row = {"concurrency": int(c), "format": f, "tok_s": tps[f], "median_tok_s": statistics.median(tps[f]),
               "median_ratio_to_plain": round(statistics.median(ratios), 3)}
        res["results"].append(row)
        rows.append("| %s | %s | %s | %.1f | %.3f |" % (c, f, " / ".join("%.1f" % x for x in tps[f]), row["median_tok_s"], row["median_ratio_to_plain"]))
json.dump(res, open(out + ".json", "w"), indent=1)
with open(out + ".md", "w") as f:
    f.write("# Structured output: tokens/s with and without a response_format\n\n")
    f.write("`%s` (%s). `ringlm serve --parallel 16 --ctx 256 --threads 2` on one machine, the `small` synthesized model, %s tokens per request\n" % (cmd, res["date"], mt))
    f.write("(temperature 0, ignore_eos: every request generates exactly that many), streamed /v1/completions; per\n")
    f.write("concurrency and rep the three batches run back to back, the order alternating. Ratio: median of the\n")
    f.write("per-rep ratios to the plain batch. No llama.cpp peer: the question is what the grammar costs ringlm itself\n")
    f.write("(issue #18); llama-server's own grammar cost is not measured here.\n\n")
    f.write("| streams | format | tok/s per rep | median tok/s | ratio to plain |\n|---|---|---|---|---|\n")
    f.write("\n".join(rows) + "\n")
print(open(out + ".md").read())
PY
