#!/usr/bin/env bash
# Synthesized models of many configurations and types load in llama.cpp (the oracle), give finite logits,
# and `ringlm inspect` agrees with llama.cpp on hyperparameters and tensor count.
. "$(dirname "$0")/lib.sh"

# name config type: every toggle of the config switches, f32 and seven other storage types.
cases=(
    "full-f32    k3-full f32"
    "full-q8_0   k3-full q8_0"
    "lean-f16    k3-lean f16"
    "res1-bf16   k3-res1 bf16"
    "resn-q4_0   k3-resn q4_0"
    "small-q4_K  small   q4_K"
    "full-q2_K   k3-full q2_K"
    "full-iq4_xs k3-full iq4_xs"
    "ud-mix      k3-ud   -"
)
tokens=5,17,300,2,999,64,128,700,1,33,512,257,258,800,42,7
for c in "${cases[@]}"; do
    read -r name config type <<<"$c"
    f=$(model "$name" "$config" "$type")
    check "$name: llama.cpp loads it" "$ORACLE" info -m "$f"
    cp "$WORK/out" "$WORK/oracle-$name.txt"
    "$RINGLM" inspect --kv "$f" >"$WORK/ours-$name.txt"
    for k in n_layer n_embd n_head n_vocab n_ctx_train n_params n_tensors n_kv; do
        check_eq "$name: $k agrees" "$(grep "^$k " "$WORK/oracle-$name.txt")" "$(grep "^$k " "$WORK/ours-$name.txt")"
    done
    # Hyperparameters llama.cpp only exposes as metadata strings.
    for pair in expert_count:n_expert expert_used_count:n_expert_used expert_shared_count:n_expert_shared \
                attn_res.block_size:attn_res_block leading_dense_block_count:n_dense_lead; do
        key=${pair%%:*}; ours=${pair##*:}
        check_eq "$name: $key agrees" "$(awk -v k="kimi-k3.$key" '$1=="kv" && $2==k {print $3}' "$WORK/oracle-$name.txt")" \
            "$(awk -v k="$ours" '$1==k {print $2}' "$WORK/ours-$name.txt")"
    done
    check "$name: oracle logits (batch)" "$ORACLE" logits -m "$f" --tokens $tokens --mode batch -o "$WORK/$name-b.bin"
    check "$name: logits are finite" "$RINGLM" compare "$WORK/$name-b.bin" "$WORK/$name-b.bin"
    check "$name: oracle logits (step)" "$ORACLE" logits -m "$f" --tokens $tokens --mode step -o "$WORK/$name-s.bin"
    check "$name: step logits are finite" "$RINGLM" compare "$WORK/$name-s.bin" "$WORK/$name-s.bin"
done
finish
