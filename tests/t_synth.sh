#!/usr/bin/env bash
# `ringlm synth` and `ringlm inspect`: determinism, split sets, presets, config errors, the numbers inspect prints.
. "$(dirname "$0")/lib.sh"
S() { "$RINGLM" synth --no-progress "$@"; }

check "same seed, same bytes" bash -c "$(printf '%q ' "$RINGLM") synth --no-progress -o $WORK/a.gguf --seed 5 &&
    $(printf '%q ' "$RINGLM") synth --no-progress -o $WORK/b.gguf --seed 5 && same_files $WORK/a.gguf $WORK/b.gguf"
S -o "$WORK/c.gguf" --seed 6
check_differ "other seed, other bytes" "$WORK/a.gguf" "$WORK/c.gguf"
S -o "$WORK/a1.gguf" --seed 5 --threads 1
check_same "thread count does not change the bytes" "$WORK/a.gguf" "$WORK/a1.gguf"

# A split set is the same model as one file: same tensors, same parameters, same metadata.
S -o "$WORK/sp.gguf" --seed 5 --split 4
check "split set of 4 files written" test -f "$WORK/sp-00004-of-00004.gguf"
"$RINGLM" inspect --kv "$WORK/a.gguf" | grep -v '^n_kv' >"$WORK/one.kv"
"$RINGLM" inspect --kv "$WORK/sp-00001-of-00004.gguf" | grep -v '^n_kv' >"$WORK/split.kv"
check_same "split set inspects like the single file" "$WORK/one.kv" "$WORK/split.kv"
check "llama.cpp loads the split set" "$ORACLE" info -m "$WORK/sp-00001-of-00004.gguf"
check_eq "llama.cpp: split set has the single file's tensor count" \
    "$(grep '^n_params' "$WORK/out")" "$(grep '^n_params' "$WORK/one.kv")"

# Presets and sizes.
S --dry-run --config medium >"$WORK/medium.txt"
check "medium preset is at least 1 GiB" awk 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "bytes") b = $(i-1) } END { exit !(b >= 1073741824) }' "$WORK/medium.txt"
check "medium experts are q4_K (69 tensors: 3 x 23 MoE layers)" grep -Eq "^ +q4_K +69 tensors" "$WORK/medium.txt"
S -o "$WORK/draft.gguf" --config tiny --draft k3
"$RINGLM" inspect --kv "$WORK/draft.gguf" >"$WORK/draft.kv"
check_eq "k3 draft shares the target vocabulary" "$(grep '^n_vocab' "$WORK/draft.kv")" "$(grep '^n_vocab' "$WORK/one.kv")"
check "k3 draft is much smaller" test "$(stat -c %s "$WORK/draft.gguf")" -lt "$(( $(stat -c %s "$WORK/a.gguf") / 4 ))"
check "llama.cpp loads the k3 draft" "$ORACLE" info -m "$WORK/draft.gguf"

# inspect's numbers, checked against the spec's formulas for the tiny preset
# (d 256, H 4, Dk 64, Kc 4, 4 KDA + 2 MLA layers, kv_lora 128 + rope 32).
"$RINGLM" inspect "$WORK/a.gguf" >"$WORK/inspect.txt"
kda=$(( 4 * (3 * 3 * 256 * 4 + 4 * 64 * 64 * 4) ))
check "KDA state per sequence" grep -q "KDA conv + recurrent state: $(awk -v b=$kda 'BEGIN { printf "%.1f KiB", b / 1024 }')" "$WORK/inspect.txt"
check "MLA cache per token" grep -q "MLA latent cache: $(( 2 * 160 * 4 )) bytes per token (f32), $(( 2 * 160 * 2 ))" "$WORK/inspect.txt"
check "boundary grows with banks" grep -Eq "^ +5 MLA +MoE +[^ ]* +[0-9.]+ [KM]iB +$(( 256 * 4 ))$" "$WORK/inspect.txt"
"$RINGLM" inspect "$WORK/a.gguf" --range 2:4 --seqs 2 --ctx 100 >"$WORK/range.txt"
check "range sizing is printed" grep -q "layers \[2, 4): weights .* (2 seq x 100 tokens, f16 cache)" "$WORK/range.txt"
# The state of layers [4, 6) (layer 5 is MLA): 2 sequences x (KDA state + 100 tokens x 160 cache elements of
# 2 or 4 bytes), as KiB; the cache type is f16 by default, as run/serve/node compute.
range_state() { "$RINGLM" inspect "$WORK/a.gguf" --range 4:6 --seqs 2 --ctx 100 "$@" | grep -o "+ state [0-9.]* KiB" | grep -o "[0-9.]*"; }
mla_layers=$(grep -cE "^ +[45] MLA " "$WORK/inspect.txt")
kda_layers=$(grep -cE "^ +[45] KDA " "$WORK/inspect.txt")
for ct in f16 f32; do
    el=2; [ $ct = f32 ] && el=4
    want=$(awk -v k=$kda_layers -v m=$mla_layers -v e=$el 'BEGIN { printf "%.1f", 2 * (k * (3*3*256*4 + 4*64*64*4) + 100 * m * 160 * e) / 1024 }')
    args=(); [ $ct = f32 ] && args=(--cache-type f32)
    check "range state with a $ct cache: $want KiB" test "$(range_state "${args[@]}")" = "$want"
done
# The compute buffer of a --chunk-token chunk at the end of --ctx: the f16 mask (ctx x chunk x 2 bytes, the
# range holds MLA layers) and 14 f32 vectors of n_embd (256) per chunk token (k3_memory.h).
check "inspect --kv: the compute buffer of 100-token chunks at 1000 tokens" test \
    "$("$RINGLM" inspect --kv "$WORK/a.gguf" --ctx 1000 --chunk 100 | awk '$1 == "range_compute_bytes" { print $2 }')" = \
    "$(( 1000 * 100 * 2 + 100 * 14 * 256 * 4 ))"
check "inspect --chunk 0: exit 2, naming the value" bash -c \
    "rc=0; '$RINGLM' inspect '$WORK/a.gguf' --chunk 0 2>'$WORK/ch.err' || rc=\$?; test \$rc = 2 && grep -q \"bad value '0' for --chunk: want a number of tokens\" '$WORK/ch.err'"
check "inspect --cache-type q9: exit 2, naming the value" bash -c \
    "rc=0; '$RINGLM' inspect '$WORK/a.gguf' --cache-type q9 2>'$WORK/ct.err' || rc=\$?; test \$rc = 2 && grep -q \"bad value 'q9' for --cache-type\" '$WORK/ct.err'"
check_fails "range beyond the model" "beyond the model's 6 layers" "$RINGLM" inspect "$WORK/a.gguf" --range 2:9

# Config errors.
echo '{"base": "tiny", "n_layer": 4, "pattern": "KKKK"}' >"$WORK/nomla.json"
check_fails "config without MLA layer" "at least one KDA and one MLA" "$RINGLM" synth -o "$WORK/x.gguf" --config "$WORK/nomla.json"
echo '{"base": "tiny", "n_layers": 4}' >"$WORK/typo.json"
check_fails "config with unknown field" 'unknown field "n_layers"' "$RINGLM" synth -o "$WORK/x.gguf" --config "$WORK/typo.json"
echo '{"base": "tiny", ' >"$WORK/broken.json"
check_fails "config that is not JSON" "not a JSON object" "$RINGLM" synth -o "$WORK/x.gguf" --config "$WORK/broken.json"
check_fails "unknown preset" "unknown config 'huge'" "$RINGLM" synth -o "$WORK/x.gguf" --config huge
check_fails "unwritable output" "cannot create" "$RINGLM" synth -o /nonexistent/x.gguf
check "no partial file left behind" test ! -e /nonexistent/x.gguf
finish
