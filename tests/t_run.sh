#!/usr/bin/env bash
# ringlm run end to end: text, chat, metrics JSON, sampling determinism, Ctrl-C, and bad input.
. "$(dirname "$0")/lib.sh"
f=$(model full-f32 k3-full f32)

# stdout alone: $WORK/out would hold stderr too, whose metrics line is there even when no text is.
check "run streams text" bash -c "'$RINGLM' run -m '$f' -p 'The quick brown fox' -n 16 --temp 0 --ignore-eos >'$WORK/text.out'"
check "text reached stdout" test -s "$WORK/text.out"
"$RINGLM" run -m "$f" -p "Hello" -n 8 --temp 0 --ignore-eos --metrics-json "$WORK/m.json" >/dev/null 2>"$WORK/err"
for k in prompt_tokens generated_tokens prefill_tok_s ttft_s decode_tok_s peak_rss_bytes; do
    check "metrics JSON has $k" grep -q "\"$k\"" "$WORK/m.json"
done
check "metrics line on stderr" grep -q "prefill .* tok/s, ttft .* decode .* tok/s, peak rss" "$WORK/err"
check "generated_tokens is 8" grep -Eq '"generated_tokens":[[:space:]]*8,' "$WORK/m.json"
check "chat prompt renders and runs" "$RINGLM" run -m "$f" -p "What is 2+2?" --chat --system "Be brief." -n 8 --temp 0

# Sampling: same seed, same tokens; another seed, other tokens.
s() { "$RINGLM" run -m "$f" -p "Once upon a time" -n 24 --temp 1.0 --top-k 0 --top-p 1 --min-p 0 --ignore-eos --ids --seed "$1" 2>/dev/null; }
check_eq "same seed, same tokens" "$(s 7)" "$(s 7)"
check_ne "other seed, other tokens" "$(s 7)" "$(s 8)"

# Ctrl-C stops cleanly between steps: exit 0, stop reason "interrupted".
"$RINGLM" run -m "$f" -p "x" -n -1 --ctx 100000 --temp 0 --ignore-eos --metrics-json "$WORK/int.json" >/dev/null 2>&1 &
pid=$!
sleep 1
kill -INT $pid
rc=0; wait $pid || rc=$?
check "Ctrl-C: exit 0" test $rc = 0
check "Ctrl-C: stop reason interrupted" grep -q '"stop_reason":[[:space:]]*"interrupted"' "$WORK/int.json"

# Bad input.
check_fails "missing model" "cannot open" "$RINGLM" run -m "$WORK/none.gguf" -p hi
check_fails "prompt longer than the context" "does not fit the context" "$RINGLM" run -m "$f" -p "$(printf 'word %.0s' $(seq 200))" --ctx 16
check_fails "token id out of range" "out of range" "$RINGLM" run -m "$f" --tokens 1,2,99999
rc=0; "$RINGLM" run -m "$f" -p hi --bogus >/dev/null 2>&1 || rc=$?
check "unknown option: usage error (exit 2)" test $rc = 2

# --tokens @FILE: a prompt too long for a command line (one argument holds 128 KiB) comes from a file.
printf '1,2,3,4,5,6,7\n' >"$WORK/ids.txt"
check_eq "--tokens @FILE gives what the same ids inline give" \
    "$("$RINGLM" run -m "$f" --tokens @"$WORK/ids.txt" -n 6 --temp 0 --ignore-eos --ids 2>/dev/null)" \
    "$("$RINGLM" run -m "$f" --tokens 1,2,3,4,5,6,7 -n 6 --temp 0 --ignore-eos --ids 2>/dev/null)"
awk 'BEGIN { for (i = 0; i < 40000; i++) printf "%s%d", (i ? "," : ""), 300 + i % 500 }' >"$WORK/long.ids"
check "--tokens @FILE of 40,000 ids (~160 KiB, more than one argument may hold) is read whole" bash -c \
    "'$RINGLM' run -m '$f' --tokens @'$WORK/long.ids' --ctx 100 -n 1 2>&1 | grep -q '40000 tokens.*does not fit the context'"
# Ctrl-C during --warmup's untimed prefill (40,000 tokens in chunks of 64: many seconds) stops it the same way.
"$RINGLM" run -m "$f" --tokens @"$WORK/long.ids" -n 4 --ctx 40100 --chunk 64 --warmup --temp 0 \
    --metrics-json "$WORK/wint.json" >/dev/null 2>&1 &
pid=$!
sleep 1
kill -INT $pid
rc=0; wait $pid || rc=$?
check "Ctrl-C in --warmup: exit 0, stop reason interrupted, no token generated" bash -c \
    "test $rc = 0 && grep -q '\"stop_reason\":[[:space:]]*\"interrupted\"' '$WORK/wint.json' &&
     grep -Eq '\"generated_tokens\":[[:space:]]*0,' '$WORK/wint.json'"
check_fails "--tokens @FILE that does not exist" "--tokens: cannot open .*nope.ids" "$RINGLM" run -m "$f" --tokens @"$WORK/nope.ids"
printf '1,x,3' >"$WORK/bad.ids"
check_fails "--tokens @FILE with a bad id" "bad --tokens file '.*bad.ids' \(comma-separated ids\)" "$RINGLM" run -m "$f" --tokens @"$WORK/bad.ids"

# --flash-attn auto is llama.cpp's default, which on a CPU is flash attention: the default's bits.
fa() { "$RINGLM" run -m "$f" -p "Once upon a time" -n 12 --temp 0 --ignore-eos --ids "$@" 2>/dev/null; }
check_eq "--flash-attn auto gives the default's tokens" "$(fa --flash-attn auto)" "$(fa)"
check_eq "--flash-attn auto: the same as on" "$(fa --flash-attn auto)" "$(fa --flash-attn on)"
# --warmup (llama-bench's warm-up run: the prompt and a step, untimed) leaves nothing behind: the KDA and
# conv states are cleared and the cache is overwritten, so the tokens are the cold run's, chunked or not.
wu() { "$RINGLM" run -m "$f" -p "Once upon a time there was a fox" -n 12 --ignore-eos --ids "$@" 2>/dev/null; }
check_eq "--warmup: the greedy tokens of a run without it" "$(wu --temp 0 --warmup)" "$(wu --temp 0)"
check_eq "--warmup with --chunk 3: the same tokens" "$(wu --temp 0 --chunk 3 --warmup)" "$(wu --temp 0 --chunk 3)"
check_eq "--warmup: the sampled tokens of the same seed without it" "$(wu --seed 5 --warmup)" "$(wu --seed 5)"
rc=0; "$RINGLM" run -m "$f" -p hi --warmup --draft ngram >/dev/null 2>"$WORK/wu.err" || rc=$?
check "--warmup with --draft: exit 2, saying it is for plain decoding" \
    bash -c "test $rc = 2 && grep -q 'warmup times plain decoding on one machine' '$WORK/wu.err'"
# Every command with the engine's options says what is wrong with a value, in one line, exit 2.
for c in "run -m $f -p hi" "logits -m $f --tokens 1,2 -o $WORK/x.bin" "node --listen 127.0.0.1:1"; do
    for o in "--flash-attn maybe:on, off or auto" "--cache-type q9:f32 or f16"; do
        opt=${o%%:*} want=${o#*:}
        rc=0; "$RINGLM" $c $opt >"$WORK/bo.out" 2>&1 || rc=$?
        check "${c%% *} $opt: exit 2, naming the value and what it wants" \
            bash -c "test $rc = 2 && test \$(wc -l <'$WORK/bo.out') = 1 && grep -q \"bad value '${opt#* }' for ${opt% *}: want $want\" '$WORK/bo.out'"
    done
done
finish
