#!/usr/bin/env bash
# Our forward pass against llama.cpp (issue: K3 on one machine, equal to llama.cpp).
#
# For 15 configurations x 3 seeds (every config switch, f32 and ten other storage types, one model with
# 64 experts, top-8 and a residual block of 12): the logits of every position of a 64-token prompt run in
# one batch, then of 32 one-token decode steps, must agree with llama.cpp's within 1e-3 x max|logit|;
# and 64 greedy tokens from a 16-token prompt must be the same tokens.
#
# Both sides place weights as llama.cpp does by default (the CPU's repacked layouts for the quantized
# matmul weights it repacks: Q4_0, Q4_K, IQ4_NL on AVX2; Q2_K too on AVX-512). Where a file has such weights
# on this CPU, the logits are also compared with repacking off on both sides (`--no-repack`), and the two
# settings must differ from each other (else the test could not tell that repacking happened).
#
# The defaults on both sides are flash attention over an f16 cache (llama.cpp's -fa auto, on, on a CPU, and
# its f16 cache). The softmax path over an f32 cache (--flash-attn off --cache-type f32; the oracle's --fa
# off --cache-type f32) is compared on every case and seed too, and an f16 cache without flash attention
# on seed 1, each against llama.cpp in the same setting.
#
# Why one bound fits every type: scripts/ggml.sh builds ggml with the CPU-variant flags llama.cpp's own
# library runs on this machine, so both run the same kernels on the same shapes and in practice agree
# bit for bit (the measured worst case is printed). See docs/numerics.md for what happens otherwise.
. "$(dirname "$0")/lib.sh"

cases=(
    "full-f32    k3-full f32"    "lean-f32    k3-lean f32"   "res1-f32    k3-res1 f32"
    "resn-f32    k3-resn f32"    "small-f32   small   f32"   "full-q8_0   k3-full q8_0"
    "lean-f16    k3-lean f16"    "res1-bf16   k3-res1 bf16"  "small-q4_K  small   q4_K"
    "ud-mix      k3-ud   -"      "full-q2_K   k3-full q2_K"  "resn-iq4_xs k3-resn iq4_xs"
    "lean-q4_0   k3-lean q4_0"   "full-iq4_nl k3-full iq4_nl" "lean-iq2_xxs k3-lean iq2_xxs"
)
worst=0
for c in "${cases[@]}"; do
    read -r name config type <<<"$c"
    for seed in 1 2 3; do
        f=$(model "$name" "$config" "$type" "$seed")
        V=$("$RINGLM" inspect --kv "$f" | awk '$1 == "n_vocab" { print $2 }')
        # 96 ids below the special-token region, from a seeded LCG (no dependence on $RANDOM's generator).
        toks=$(awk -v s="$seed" -v v="$((V - 256))" 'BEGIN { x = s * 7919 + 13; for (i = 0; i < 96; i++) {
                   x = (x * 1103515245 + 12345) % 2147483648; printf "%s%d", (i ? "," : ""), int(x / 65536) % v } }')
        repacked=$("$RINGLM" inspect "$f" | awk '/are repacked on this CPU/ { print ($4 + 0 > 0) ? 1 : 0 }')
        # name:ringlm-args:oracle-args
        settings=("::" "nofa:--flash-attn off --cache-type f32:--fa off --cache-type f32")
        [ "$repacked" = 1 ] && settings+=("--no-repack:--no-repack:--no-repack")
        [ "$seed" = 1 ] && settings+=("f16:--flash-attn off --cache-type f16:--fa off --cache-type f16")
        for s in "${settings[@]}"; do
            IFS=: read -r set rargs oargs <<<"$s"
            # shellcheck disable=SC2086
            "$ORACLE" logits -m "$f" --tokens "$toks" --prefill 64 -o "$WORK/o$set.bin" $oargs
            # shellcheck disable=SC2086
            "$RINGLM" logits -m "$f" --tokens "$toks" --prefill 64 -o "$WORK/r$set.bin" --threads 2 $rargs
            check "$name seed $seed${rargs:+ $rargs}: 64-token prefill + 32 decode steps match llama.cpp" \
                "$RINGLM" compare "$WORK/o$set.bin" "$WORK/r$set.bin" --tol 1e-3
            rel=$(grep -o 'rel [^ ]*' "$WORK/out" | head -1 | cut -d' ' -f2)
            worst=$(awk -v a="$worst" -v b="${rel:-1}" 'BEGIN { print (b + 0 > a + 0) ? b : a }')
        done
        if [ "$repacked" = 1 ]; then
            check "$name seed $seed: repacked and mapped weights give different logits (repacking happened)" \
                sh -c '! "$@"' _ "$RINGLM" compare "$WORK/o.bin" "$WORK/o--no-repack.bin" --tol 0
        fi
        prompt=${toks%%,*}; prompt=$(echo "$toks" | cut -d, -f1-16)
        "$ORACLE" generate -m "$f" --tokens "$prompt" -n 64 >"$WORK/o.ids"
        "$RINGLM" run -m "$f" --tokens "$prompt" -n 64 --temp 0 --ignore-eos --ids --threads 2 >"$WORK/r.ids" 2>/dev/null
        check_same "$name seed $seed: 64 greedy tokens identical" "$WORK/o.ids" "$WORK/r.ids"
    done
done
echo "worst relative difference over all cases: $worst"
finish
