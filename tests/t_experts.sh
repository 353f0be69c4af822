#!/usr/bin/env bash
# Routed experts under a memory budget (--mem, src/model/expert_cache.h): logits and greedy text equal the
# unconstrained run bit for bit, on repacked and plain expert layouts, mixed expert types, a roomy cache, a
# small one and the least that runs (one usable slot, fewer than one token's experts: every layer in
# passes); the budget error names the minimum; the counters reach the summary line and the metrics JSON.
. "$(dirname "$0")/lib.sh"
q8=$(model xc-q8 small q8_0 3)
q4=$(model xc-q4 small q4_0 4)     # Q4_0 experts take the CPU's repacked layout
mixed=$(model xc-mixed k3-mixed-exps - 2) # two kinds of expert in one range: two pools
ud=$(model xc-ud k3-ud - 5)
toks=$(seq -s, 5 64)

# The least budget that runs, as the error states it.
least() {
    local rc=0
    "$RINGLM" logits -m "$1" --tokens 1,2 -o "$WORK/none.bin" --mem 0.0001 2>"$WORK/least.err" >/dev/null || rc=$?
    [ $rc = 1 ] || { echo "want exit 1 below the minimum, got $rc" >&2; return 1; }
    sed -n 's/.*the least that runs is --mem \([0-9.]*\).*/\1/p' "$WORK/least.err"
}

same_logits() { # model mem mode... : logits with --mem equal those without
    local f=$1 mem=$2; shift 2
    "$RINGLM" logits -m "$f" --tokens "$toks" "$@" -o "$WORK/ref.bin" 2>/dev/null
    "$RINGLM" logits -m "$f" --tokens "$toks" "$@" --mem "$mem" -o "$WORK/got.bin" 2>"$WORK/got.err" || { cat "$WORK/got.err"; return 1; }
    cmp "$WORK/ref.bin" "$WORK/got.bin"
}

for f in "$q8" "$q4" "$mixed" "$ud"; do
    name=$(basename "$f" .gguf)
    min=$(least "$f")
    check "$name: the budget error names a minimum ($min)" test -n "$min"
    small=$(awk -v m="$min" 'BEGIN { printf "%.4f", m + 0.008 }')
    for mem in "$min" "$small"; do
        check "$name --mem $mem: batch logits = unconstrained" same_logits "$f" "$mem" --mode batch
        check "$name --mem $mem: prefill 16 then steps = unconstrained" same_logits "$f" "$mem" --prefill 16
        check "$name --mem $mem: chunks of 7 = unconstrained" same_logits "$f" "$mem" --chunk 7
    done
done
check "plain (--no-repack) slots: logits = unconstrained" same_logits "$q4" "$(least "$q4")" --prefill 16 --no-repack
check "f32 cache, softmax attention: logits = unconstrained" same_logits "$q8" 0.02 --prefill 16 --flash-attn off --cache-type f32

# Greedy text, and the counters.
gen() { "$RINGLM" run -m "$q8" -p "The expert cache reads" -n 40 --temp 0 --ignore-eos --ids "$@" 2>"$WORK/run.err"; }
ref=$(gen)
got=$(gen --mem "$(least "$q8")" --metrics-json "$WORK/m.json")
check "greedy text at the least budget = unconstrained" test "$got" = "$ref"
check "greedy text with a roomy cache = unconstrained" test "$(gen --mem 0.03)" = "$ref"
check "summary line: hit rate and reads per token" grep -Eq 'experts \(decode\): hit rate [0-9.]+%, read [0-9.]+ MiB/token' "$WORK/run.err"
check "metrics JSON: expert_cache with its counters" python3 -c "
import json, sys
x = json.load(open('$WORK/m.json'))['expert_cache']
d = x['decode']
assert 0 <= x['hit_rate'] <= 1 and d['tokens'] >= 39, x
assert x['bytes_read'] > 0 and d['bytes_used_per_token'] > 0 and 0 <= d['prefetch_accuracy'] <= 1, x
assert x['passes'] > 0, x
"
check "a budget the model fits uses no cache" bash -c "'$RINGLM' run -m '$q8' -p hi -n 4 --temp 0 --mem 1 2>&1 | grep -vq 'expert cache'"
check "a budget the model fits: text = unconstrained" test "$(gen --mem 1)" = "$ref"

# Bad budgets.
check_fails "below the minimum: the error names it" "too small for layers \[0, 14\).*the least that runs is --mem [0-9.]+" \
    "$RINGLM" run -m "$q8" -p hi -n 2 --mem 0.001
rc=0; "$RINGLM" run -m "$q8" -p hi --mem -3 >/dev/null 2>"$WORK/err" || rc=$?
check "--mem -3: usage error naming the option" bash -c "test $rc = 2 && grep -q 'bad value .-3. for --mem' '$WORK/err'"
rc=0; "$RINGLM" run -m "$q8" -p hi --mem lots >/dev/null 2>&1 || rc=$?
check "--mem lots: usage error" test $rc = 2

finish
