#!/usr/bin/env bash
# aarch64 under emulation: the build `make arm64` cross-compiles here (ggml with clang, the compiler of
# llama.cpp's arm64 build; our code with Debian's aarch64 GCC), run by qemu-user on a GB10-like CPU
# (armv8.6-a with SVE2 and i8mm, 128-bit vectors, no SME: ggml's armv8.6_2 variant, the one llama.cpp's
# arm64 build loads on it).
#   1. the unit programs, but for two that take over 10 minutes emulated (test_spec, and test_forward even
#      with RINGLM_TEST_QUICK's tiny configs: its numerics are part 2's, against llama.cpp);
#   2. logits of several storage types, flash attention over an f16 cache and softmax over f32, bit for bit
#      against llama.cpp's prebuilt linux-arm64 build of the pinned release (tests/oracle/oracle-arm64),
#      and its greedy tokens; how far aarch64's logits are from x86's (reported; within 1e-2 for float
#      weights);
#   3. a mixed ring, one x86 node and one aarch64 node: greedy tokens of one machine, receipts checked live
#      and every sequence audited (the x86 coordinator recomputes the aarch64 stage: audits compare with a
#      tolerance, docs/numerics.md says what it is across architectures).
# On an aarch64 machine this is moot (the whole suite runs natively there) and is skipped.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ring_lib.sh"

if [ "$(uname -m)" != x86_64 ]; then
    skip "aarch64 under qemu: this is a $(uname -m) machine (the suite runs natively)"
    finish
fi
ARM=$ROOT/build/arm64/release
ORA=$ROOT/tests/oracle/oracle-arm64
qemu=$(command -v qemu-aarch64-static || command -v qemu-aarch64 || true)
need=""
[ -n "$qemu" ] || need="qemu-user-static (scripts/install-deps.sh)"
[ -x "$ARM/ringlm" ] && [ -x "$ORA" ] || need="${need:+$need, }the aarch64 build (make arm64)"
if [ -n "$need" ]; then
    check "aarch64 under qemu: needs $need" false
    finish
fi
export QEMU_CPU=${RINGLM_QEMU_CPU:-max,sme=off,sve-default-vector-length=16}
export RINGLM_EMULATED="qemu-user ($QEMU_CPU)"
mkdir -p "$WORK/arm"
printf '#!/bin/sh\nexec %s %s "$@"\n' "$qemu" "$ARM/ringlm" >"$WORK/arm/ringlm"
printf '#!/bin/sh\nexec %s %s "$@"\n' "$qemu" "$ORA" >"$WORK/arm/oracle"
chmod +x "$WORK/arm/ringlm" "$WORK/arm/oracle"
AR=$WORK/arm/ringlm AO=$WORK/arm/oracle
check "the aarch64 binary is one" bash -c "file '$ARM/ringlm' | grep -q 'ARM aarch64'"
check "qemu gives the CPU ggml's armv8.6_2 variant (llama.cpp's arm64 build loads it)" bash -c \
    "'$AO' info -m '$(model full-f32 k3-full f32)' --verbose 2>&1 | grep -q 'libggml-cpu-armv8.6_2.so'"

# 1. Unit programs.
for u in "$ARM"/unit/*; do
    name=$(basename "$u")
    case $name in
        test_spec | test_forward) continue ;;
        *) check "aarch64: $name" "$qemu" "$u" ;;
    esac
done

# 2. Against llama.cpp's arm64 build.
worst_x86=0
for c in "full-f32 k3-full f32" "lean-f16 k3-lean f16" "full-q8_0 k3-full q8_0" "lean-q4_0 k3-lean q4_0" \
         "small-q4_K small q4_K" "full-iq4_nl k3-full iq4_nl"; do
    read -r name config type <<<"$c"
    f=$(model "$name" "$config" "$type")
    V=$("$RINGLM" inspect --kv "$f" | awk '$1 == "n_vocab" { print $2 }')
    t=$(toks 3 $((V - 256)) 32)
    settings=("::")
    [ "$type" = f32 ] && settings+=("nofa:--flash-attn off --cache-type f32:--fa off --cache-type f32")
    for s in "${settings[@]}"; do
        IFS=: read -r set rargs oargs <<<"$s"
        # shellcheck disable=SC2086
        "$AO" logits -m "$f" --tokens "$t" --prefill 24 -o "$WORK/o$set.bin" $oargs
        # shellcheck disable=SC2086
        "$AR" logits -m "$f" --tokens "$t" --prefill 24 -o "$WORK/a$set.bin" --threads 2 $rargs
        check "aarch64 $name${rargs:+ $rargs}: 24-token prefill + 8 steps equal llama.cpp's arm64 build bit for bit" \
            "$RINGLM" compare "$WORK/o$set.bin" "$WORK/a$set.bin" --tol 0
        # Against x86: other kernels, other rounding. Float weights stay close; quantized ones requantize
        # activations to 8 bits before every matmul, where a last-bit difference now and then crosses a
        # rounding boundary and, on a random-weight MoE, flips a routing choice (docs/numerics.md): those
        # are reported, as llama.cpp's own x86 and arm64 builds differ by exactly as much (both are ours).
        # shellcheck disable=SC2086
        "$RINGLM" logits -m "$f" --tokens "$t" --prefill 24 -o "$WORK/x$set.bin" --threads 2 $rargs
        "$RINGLM" compare "$WORK/x$set.bin" "$WORK/a$set.bin" --tol 1e9 >"$WORK/xa" 2>&1 || true
        rel=$(grep -o 'rel [^ ]*' "$WORK/xa" | cut -d' ' -f2)
        echo "# $name${rargs:+ $rargs}: aarch64 vs x86 relative difference ${rel:-?}"
        case $type in
            f32 | f16) check "aarch64 $name${rargs:+ $rargs}: within 1e-2 of x86's logits" \
                           "$RINGLM" compare "$WORK/x$set.bin" "$WORK/a$set.bin" --tol 1e-2
                       worst_x86=$(awk -v a="$worst_x86" -v b="${rel:-1}" 'BEGIN { print (b + 0 > a + 0) ? b : a }') ;;
        esac
    done
    p=$(toks 9 $((V - 256)) 8)
    "$AO" generate -m "$f" --tokens "$p" -n 12 >"$WORK/o.ids"
    "$AR" run -m "$f" --tokens "$p" -n 12 --temp 0 --ignore-eos --ids --threads 2 >"$WORK/a.ids" 2>/dev/null
    check_same "aarch64 $name: 12 greedy tokens equal llama.cpp's arm64 build" "$WORK/o.ids" "$WORK/a.ids"
done
echo "# worst aarch64 vs x86 relative logit difference, float weights: $worst_x86"

# 3. A mixed ring: node 2 is the aarch64 build under qemu and comes first (--keep-order), node 1 runs on this
# x86 CPU. Audits with seed 2 draw stage 1, the aarch64 one: the x86 coordinator recomputes it.
mkdir -p "$RING/models"
ln -sf "$(model full-f32 k3-full f32)" "$RING/models/full-f32.gguf"
ln -sf "$(model full-q8_0 k3-full q8_0)" "$RING/models/full-q8_0.gguf"
ring_keys 2
ring_start 1 "$RING/models" || exit 1
RING_BIN=$AR ring_start 2 "$RING/models" || exit 1
ring_conf "$WORK/mixed.conf" 2 1
K=(--key "$RING/coord.key" --keep-order)
check "the aarch64 node says what it runs on" grep -q "ready: .*, aarch64" "$RING/n2.log"
for name in full-f32 full-q8_0; do
    m=$RING/models/$name.gguf
    V=$("$RINGLM" inspect --kv "$m" | awk '$1 == "n_vocab" { print $2 }')
    p=$(toks 5 $((V - 256)) 12)
    "$RINGLM" run -m "$m" --tokens "$p" -n 16 --temp 0 --ignore-eos --ids >"$WORK/local.ids" 2>/dev/null
    "$AR" run -m "$m" --tokens "$p" -n 16 --temp 0 --ignore-eos --ids --threads 2 >"$WORK/arm.ids" 2>/dev/null
    "$RINGLM" run -m "$m" --tokens "$p" -n 16 --temp 0 --ignore-eos --ids --ring "$WORK/mixed.conf" "${K[@]}" \
        --receipts "$WORK/r-$name.jsonl" --audit-rate 1 --audit-seed 2 >"$WORK/ring.ids" 2>"$WORK/ring.err"
    # Float weights: the same tokens on either architecture and on the mixed ring. Quantized ones on this
    # random-weight model: aarch64 alone leaves x86's tokens after two (a flipped routing choice, as llama.cpp's
    # two builds do), so there only the ring's audit is checked.
    if [ "$name" = full-f32 ]; then
        check_same "$name, one aarch64 machine: the greedy tokens of one x86 machine" "$WORK/local.ids" "$WORK/arm.ids"
        check_same "$name, mixed ring (aarch64 + x86): the greedy tokens of one machine" "$WORK/local.ids" "$WORK/ring.ids"
    else
        echo "# $name greedy: x86 $(cat "$WORK/local.ids"); aarch64 $(cat "$WORK/arm.ids"); mixed ring $(cat "$WORK/ring.ids")"
    fi
    check "$name, mixed ring: the aarch64 stage audited on x86 within --audit-tol-arch, receipts checked live" bash -c \
        "grep -q 'audits: 1 sequence(s) audited' '$WORK/ring.err' && grep -q 'none failed' '$WORK/ring.err' &&
         grep -q 'stage 1 recomputed on the CPU (the node.s is aarch64, this one x86_64' '$WORK/ring.err'"
    grep -h "audits:" "$WORK/ring.err" | sed "s/^/# $name: /"
    check "$name, mixed ring: the plan names each stage's architecture" bash -c \
        "grep -q 'stage 1 (127.0.0.1:${RING_PORT[2]}, aarch64) computes on CPU' '$WORK/ring.err' &&
         grep -q 'stage 2 (127.0.0.1:${RING_PORT[1]}, x86_64) computes on CPU' '$WORK/ring.err'"
    check "$name, mixed ring: the receipts verify offline" "$RINGLM" receipts verify "$WORK/r-$name.jsonl" --model "$m" \
        --ring "$WORK/mixed.conf" --key "$RING/coord.pub"
done
# The tolerance is what passes it: at 1e-4 the honest aarch64 stage of the q8_0 file is named faulty.
check_fails "q8_0 mixed ring, --audit-tol-arch 1e-4: the aarch64 node named (the tolerance decides)" \
    "audit: node 127.0.0.1:${RING_PORT[2]} \(stage 0.*is faulty: .*differs from the recomputed one" \
    "$RINGLM" run -m "$RING/models/full-q8_0.gguf" --tokens "$p" -n 16 --temp 0 --ignore-eos --ids \
    --ring "$WORK/mixed.conf" "${K[@]}" --audit-rate 1 --audit-seed 2 --audit-tol-arch 1e-4
m=$RING/models/full-f32.gguf
V=$("$RINGLM" inspect --kv "$m" | awk '$1 == "n_vocab" { print $2 }')
t=$(toks 11 $((V - 256)) 40)
"$RINGLM" logits -m "$m" --tokens "$t" --prefill 24 -o "$WORK/local.bin"
"$RINGLM" logits -m "$m" --tokens "$t" --prefill 24 --ring "$WORK/mixed.conf" --key "$RING/coord.key" -o "$WORK/ring.bin"
check "full-f32, mixed ring: logits within 1e-2 of one x86 machine" "$RINGLM" compare "$WORK/local.bin" "$WORK/ring.bin" --tol 1e-2
grep -o 'rel [^ ]*' "$WORK/out" | sed 's/^/# full-f32 mixed ring vs x86: /'
finish
