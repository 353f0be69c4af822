#!/usr/bin/env bash
# `ringlm synth --draft dspark`: llama.cpp's dflash loader accepts the draft (names, shapes, keys) for two
# target configs and several storage types; the draft shares its target's vocabulary and hidden size, and
# carries the DSpark keys; the same seed writes the same bytes. See docs/dspark.md.
. "$(dirname "$0")/lib.sh"
S() { "$RINGLM" synth --no-progress "$@"; }
# val FILE KEY: the value on the "KEY value" line of an oracle info dump ("kv NAME" for metadata).
val() { awk -v k="$2" 'substr($0, 1, length(k) + 1) == k " " { print substr($0, length(k) + 2); exit }' "$1"; }

# config  expected taps ("input of layer i" ids, printed by llama.cpp's loader)  expected Markov rank
cases=(
    "tiny  1,3,5  32"
    "small 1,7,13 32"
)
printf '%s\n' 'Hello, world!' 'def f(x):\n    return x * 2' '<|open|>message role="user"<|sep|>hi<|close|>message<|sep|><|end_of_msg|>' \
    >"$WORK/strings.txt"
for c in "${cases[@]}"; do
    read -r cfg taps rank <<<"$c"
    tgt=$(model "tgt-$cfg" "$cfg" -)
    d=$WORK/$cfg-dspark.gguf
    S -o "$d" --config "$cfg" --draft dspark --seed 3
    check "$cfg: llama.cpp loads the dspark draft" "$ORACLE" info -m "$d"
    cp "$WORK/out" "$WORK/$cfg-d.info"
    check "$cfg: llama.cpp loads the target" "$ORACLE" info -m "$tgt"
    cp "$WORK/out" "$WORK/$cfg-t.info"
    D=$WORK/$cfg-d.info T=$WORK/$cfg-t.info

    check "$cfg: architecture is dflash" test "$(val "$D" arch)" = dflash
    check_eq "$cfg: n_vocab equals the target's ($(val "$T" n_vocab))" "$(val "$D" n_vocab)" "$(val "$T" n_vocab)"
    check_eq "$cfg: n_embd equals the target's ($(val "$T" n_embd))" "$(val "$D" n_embd)" "$(val "$T" n_embd)"
    check_eq "$cfg: embedding_length key equals the target's" \
        "$(val "$D" "kv dflash.embedding_length")" "$(val "$T" "kv kimi-k3.embedding_length")"
    check "$cfg: dflash.block_size is 7" test "$(val "$D" "kv dflash.block_size")" = 7
    check "$cfg: dflash.sample_from_anchor is true" test "$(val "$D" "kv dflash.sample_from_anchor")" = true
    check "$cfg: dflash.has_confidence_head is true" test "$(val "$D" "kv dflash.has_confidence_head")" = true
    # The mask is slot +253 of the target vocabulary's 256-id special region (synth_vocab.h): n_vocab - 3.
    n_vocab=$(val "$T" n_vocab)
    check "$cfg: mask token id is the target vocabulary's mask ($((n_vocab - 3)))" \
        test "$(val "$D" "kv tokenizer.ggml.mask_token_id")" = "$((n_vocab - 3))"
    check "$cfg: the target carries no mask token id" test -z "$(val "$T" "kv tokenizer.ggml.mask_token_id")"
    # Same tokenizer metadata as the target (the draft only adds the mask id) and the same tokenization.
    grep '^kv tokenizer\.' "$T" >"$WORK/$cfg-t.tok"
    grep '^kv tokenizer\.' "$D" | grep -v '^kv tokenizer\.ggml\.mask_token_id ' >"$WORK/$cfg-d.tok"
    check_same "$cfg: tokenizer metadata equals the target's" "$WORK/$cfg-t.tok" "$WORK/$cfg-d.tok"
    "$ORACLE" tokenize -m "$tgt" --file "$WORK/strings.txt" --special -o "$WORK/$cfg-t.ids"
    "$ORACLE" tokenize -m "$d" --file "$WORK/strings.txt" --special -o "$WORK/$cfg-d.ids"
    check_same "$cfg: draft and target tokenize alike" "$WORK/$cfg-t.ids" "$WORK/$cfg-d.ids"
    # llama.cpp logs the taps and the Markov rank it found; arrays are not in the info dump.
    "$ORACLE" info --verbose -m "$d" >/dev/null 2>"$WORK/$cfg-d.log"
    check "$cfg: taps are [${taps//,/, }]" grep -qF "extract_layers = [${taps//,/, }]" "$WORK/$cfg-d.log"
    check "$cfg: DSpark Markov head of rank $rank" grep -qF "DSpark markov head (rank = $rank)" "$WORK/$cfg-d.log"
done

# Storage types and split sets load too (the Markov tables fall back to q8_0 where R does not fill a block).
for t in q8_0 q4_K bf16; do
    S -o "$WORK/tiny-$t.gguf" --config tiny --draft dspark --type "$t"
    check "tiny --type $t: llama.cpp loads the draft" "$ORACLE" info -m "$WORK/tiny-$t.gguf"
done
S -o "$WORK/sp.gguf" --config tiny --draft dspark --split 3
check "split set of 3: llama.cpp loads the draft" "$ORACLE" info -m "$WORK/sp-00001-of-00003.gguf"

# Determinism.
S -o "$WORK/a.gguf" --config tiny --draft dspark --seed 5
S -o "$WORK/b.gguf" --config tiny --draft dspark --seed 5 --threads 1
check_same "same seed, same bytes (any thread count)" "$WORK/a.gguf" "$WORK/b.gguf"
S -o "$WORK/c.gguf" --config tiny --draft dspark --seed 6
check_differ "other seed, other bytes" "$WORK/a.gguf" "$WORK/c.gguf"

# The loader really checks what the file says (so "llama.cpp loads it" above means something).
"$TOOLS/gguf_edit" "$WORK/a.gguf" "$WORK/notaps.gguf" --del-key dflash.target_layers
check_fails "llama.cpp rejects a draft without taps" "requires 'target_layers'" "$ORACLE" info -m "$WORK/notaps.gguf"
"$TOOLS/gguf_edit" "$WORK/a.gguf" "$WORK/badfc.gguf" --reshape fc.weight 512,256,1
check_fails "llama.cpp rejects fc sized for 2 taps instead of 3" "fc.weight" "$ORACLE" info -m "$WORK/badfc.gguf"

# Errors.
echo '{"base": "tiny", "n_embd": 196}' >"$WORK/w196.json"
check_fails "target width without a head size" "n_embd 196 is not a multiple of 8" \
    "$RINGLM" synth --no-progress -o "$WORK/x.gguf" --config "$WORK/w196.json" --draft dspark
finish
