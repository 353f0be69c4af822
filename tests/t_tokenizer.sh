#!/usr/bin/env bash
# `ringlm tokenize` gives llama.cpp's token ids: the corpus in tests/data/tokenizer_strings.txt and a sweep of
# every Unicode code point in several contexts, on the tiny vocabulary (1024) and a 32768-token one, with and
# without parse_special. Plus the CLI's own behaviour (single text, --decode round trip, errors).
# Round trips and the chat/sampler checks are in tests/unit/test_text.c.
. "$(dirname "$0")/lib.sh"

corpus=$ROOT/tests/data/tokenizer_strings.txt
echo '{"base": "tiny", "n_vocab": 32768}' >"$WORK/vocab32k.json"
tiny=$(model tiny tiny -)
v32k=$(model tiny-v32k "$WORK/vocab32k.json" q8_0)

# Every code point but the surrogates (llama.cpp cannot take those as input either way), 12 per line, each in
# one of 8 contexts (inside a word, after a space, doubled, between digits, after an apostrophe, between
# punctuation, after a Han character, after a tab); `shift` rotates which context a code point gets.
sweep() {
    awk -v shift="$1" '
    function hx(b) { return sprintf("\\x%02x", b) }
    function enc(c) {
        if (c < 128) return hx(c)
        if (c < 2048) return hx(192 + int(c / 64)) hx(128 + c % 64)
        if (c < 65536) return hx(224 + int(c / 4096)) hx(128 + int(c / 64) % 64) hx(128 + c % 64)
        return hx(240 + int(c / 262144)) hx(128 + int(c / 4096) % 64) hx(128 + int(c / 64) % 64) hx(128 + c % 64)
    }
    BEGIN {
        ctx[0] = "a%sb"; ctx[1] = " %sx"; ctx[2] = "%s%s"; ctx[3] = "1%s2"; ctx[4] = "\047%ss"; ctx[5] = "!%s?"
        ctx[6] = "\\xe4\\xb8\\xad%sa"; ctx[7] = "\\t%s"
        line = ""; i = 0
        for (c = 0; c < 1114112; c++) {
            if (c >= 55296 && c <= 57343) continue
            e = enc(c)
            line = line sprintf(ctx[(i + shift) % 8], e, e)
            if (++i % 12 == 0) { print line; line = "" }
        }
        if (line != "") print line
    }'
}
sweep 0 >"$WORK/sweep0.txt"
sweep 3 >"$WORK/sweep3.txt"

# agree NAME MODEL FILE [--special]: the two outputs must be identical, line for line
agree() {
    local name=$1 m=$2 f=$3; shift 3
    "$ORACLE" tokenize -m "$m" --file "$f" "$@" >"$WORK/oracle.txt"
    "$RINGLM" tokenize -m "$m" --file "$f" "$@" >"$WORK/ours.txt"
    local total same
    total=$(wc -l <"$WORK/oracle.txt")
    same=$(paste -d '\n' "$WORK/oracle.txt" "$WORK/ours.txt" | paste - - | awk -F '\t' '$1 == $2' | wc -l)
    check_same "$name: $same/$total strings tokenize as llama.cpp does" "$WORK/oracle.txt" "$WORK/ours.txt"
}

for v in "tiny:$tiny" "v32k:$v32k"; do
    name=${v%%:*}; m=${v#*:}
    agree "$name corpus" "$m" "$corpus"
    agree "$name corpus --special" "$m" "$corpus" --special
done
agree "tiny every code point" "$tiny" "$WORK/sweep0.txt"
agree "v32k every code point (other contexts)" "$v32k" "$WORK/sweep3.txt" --special

# The CLI: one text on the command line, the --decode round trip, errors.
check_eq "a text argument gives the same ids as the first corpus line" \
    "$("$RINGLM" tokenize -m "$tiny" "Hello world")" "$("$ORACLE" tokenize -m "$tiny" --file "$corpus" | head -1)"
grep -v '\\' "$corpus" | grep -v '^$' >"$WORK/plain.txt" || true # lines that need no escapes read back as they are
"$RINGLM" tokenize -m "$v32k" --special --file "$WORK/plain.txt" >"$WORK/plain.ids"
"$RINGLM" tokenize -m "$v32k" --special --decode --file "$WORK/plain.ids" >"$WORK/plain.back"
check_same "--decode gives back the $(wc -l <"$WORK/plain.txt") strings that need no escapes" "$WORK/plain.txt" "$WORK/plain.back"
check_fails "missing model file" "cannot open|No such file" "$RINGLM" tokenize -m "$WORK/none.gguf" hi
echo '1,2,999999' >"$WORK/bad.ids"
check_fails "--decode of an id outside the vocabulary" "outside the vocabulary" \
    "$RINGLM" tokenize -m "$tiny" --decode --file "$WORK/bad.ids"
printf 'bad \\q escape\n' >"$WORK/bad.txt"
check_fails "a bad escape in --file" "unknown escape" "$RINGLM" tokenize -m "$tiny" --file "$WORK/bad.txt"
finish
