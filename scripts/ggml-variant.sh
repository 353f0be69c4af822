# shellcheck shell=bash disable=SC2034
# Sourced by scripts/ggml.sh and scripts/llama-tools.sh (not run): sets `variant` (the CPU variant's name,
# part of both cache paths) and `cmake_cpu` (the ggml CMake flags for it), so that ggml and llama.cpp's
# own tools (our benchmark peers) are built with the same CPU kernels.
#
# Which CPU kernels to build. llama.cpp's prebuilt library (our oracle) ships one CPU backend per x86
# "variant" and loads the best-scoring one this CPU supports. We build ggml with the flags of that same
# variant, so our kernels are the oracle's kernels: on quantized models, where activations are requantized
# to 8 bits before every matmul, even a different SIMD path (say AVX-VNNI vs AVX512-VNNI) rounds a tie
# differently now and then, and a random-weight MoE amplifies that into visible differences. With the
# same variant our logits match llama.cpp's bit for bit on every quant type we test (docs/numerics.md).
# RINGLM_GGML_NATIVE=1 builds with -march=native instead.
#
# Not sapphirerapids (AMX): in this release llama.cpp's AMX buffer type takes the Q4_0/Q8_0/Q4_K... matmul
# weights and its kernel then segfaults (llama.cpp issue 20824, unfixed; here every quantized synth model
# crashed both llama.cpp and us). An AMX CPU gets zen4's variant instead: the same AVX-512 kernels, no AMX,
# and the oracle loads that variant too (tests/oracle/oracle.c, init_backend).
ggml_variant() {
    local flags
    flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
    has() { [[ $flags == *" $1 "* ]]; }
    # name, then features (ggml CMake names); scores as ggml-cpu/arch/x86/cpu-feats.cpp weighs them
    local variants=(
        "x64" "sse42 SSE42" "sandybridge SSE42 AVX" "ivybridge SSE42 AVX F16C" "piledriver SSE42 AVX F16C FMA"
        "haswell SSE42 AVX F16C FMA AVX2 BMI2" "skylakex SSE42 AVX F16C FMA AVX2 BMI2 AVX512"
        "cannonlake SSE42 AVX F16C FMA AVX2 BMI2 AVX512 AVX512_VBMI"
        "cascadelake SSE42 AVX F16C FMA AVX2 BMI2 AVX512 AVX512_VNNI"
        "icelake SSE42 AVX F16C FMA AVX2 BMI2 AVX512 AVX512_VBMI AVX512_VNNI"
        "cooperlake SSE42 AVX F16C FMA AVX2 BMI2 AVX512 AVX512_VNNI AVX512_BF16"
        "zen4 SSE42 AVX F16C FMA AVX2 BMI2 AVX512 AVX512_VBMI AVX512_VNNI AVX512_BF16"
        "alderlake SSE42 AVX F16C FMA AVX2 BMI2 AVX_VNNI")
    local best="" best_score=-1 v f score ok
    for v in "${variants[@]}"; do
        set -- $v
        local name=$1; shift
        score=1; ok=1
        for f in "$@"; do
            case $f in
                FMA) has fma && score=$((score + 1)) || ok=0 ;;
                F16C) has f16c && score=$((score + 2)) || ok=0 ;;
                SSE42) has sse4_2 && score=$((score + 4)) || ok=0 ;;
                BMI2) has bmi2 && score=$((score + 8)) || ok=0 ;;
                AVX) has avx && score=$((score + 16)) || ok=0 ;;
                AVX2) has avx2 && score=$((score + 32)) || ok=0 ;;
                AVX_VNNI) has avx_vnni && score=$((score + 64)) || ok=0 ;;
                AVX512) { has avx512f && has avx512cd && has avx512vl && has avx512dq && has avx512bw; } &&
                        score=$((score + 128)) || ok=0 ;;
                AVX512_VBMI) has avx512vbmi && score=$((score + 256)) || ok=0 ;;
                AVX512_BF16) has avx512_bf16 && score=$((score + 512)) || ok=0 ;;
                AVX512_VNNI) has avx512_vnni && score=$((score + 1024)) || ok=0 ;;
                AMX_TILE) has amx_tile || ok=0 ;;
                AMX_INT8) has amx_int8 && score=$((score + 2048)) || ok=0 ;;
            esac
        done
        # RINGLM_X86_VARIANT=NAME: that variant, whatever this CPU has (a build for another machine, such as
        # bench/device/gpu_check.sh's portable haswell one).
        if [ -n "${RINGLM_X86_VARIANT:-}" ]; then [ "$name" = "$RINGLM_X86_VARIANT" ] && best=$v; continue; fi
        if [ $ok = 1 ] && [ $score -gt $best_score ]; then best=$v; best_score=$score; fi
    done
    echo "$best"
}
# aarch64: llama.cpp's linux-arm64 build (the oracle there) ships one CPU backend per "armv*" variant and
# loads the best this CPU has (ggml-cpu/arch/arm/cpu-feats.cpp scores them); as on x86 we build the same
# variant's -march (ggml/src/ggml-cpu/CMakeLists.txt writes it from the features), read from the Features
# line of /proc/cpuinfo, or for a cross build (RINGLM_CROSS=aarch64) named by RINGLM_ARM_VARIANT (default
# armv8.6_2: GB10's Cortex-X925/A725 and Graviton 3/4 have it; tests/t_arm64.sh gives qemu that CPU).
ggml_arm_variant() {
    local feats
    feats=" $(grep -m1 '^Features' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
    has() { [[ $feats == *" $1 "* ]]; }
    local v=armv8.0_1
    if has asimddp; then
        v=armv8.2_1
        if has asimdhp; then
            v=armv8.2_2
            if has sve; then
                v=armv8.2_3
                if has i8mm; then v=armv8.6_1; has sve2 && v=armv8.6_2; has sme && { has sve2 && v=armv9.2_2 || v=armv9.2_1; }; fi
            fi
        fi
    fi
    echo "$v"
}
# ggml_arm_march VARIANT: the -march ggml's CMake gives that variant (its feature list, in its order).
ggml_arm_march() {
    case $1 in
        armv8.0_1) echo armv8-a ;;
        armv8.2_1) echo armv8.2-a+dotprod ;;
        armv8.2_2) echo armv8.2-a+dotprod+fp16 ;;
        armv8.2_3) echo armv8.2-a+dotprod+fp16+sve ;;
        armv8.6_1) echo armv8.6-a+dotprod+fp16+sve+i8mm ;;
        armv8.6_2) echo armv8.6-a+dotprod+fp16+sve+i8mm+sve2 ;;
        armv9.2_1) echo armv9.2-a+dotprod+fp16+sve+i8mm+sme ;;
        armv9.2_2) echo armv9.2-a+dotprod+fp16+sve+i8mm+sve2+sme ;;
        *) return 1 ;;
    esac
}
# The target: this machine, or RINGLM_CROSS (aarch64, the only cross target so far).
target_arch=${RINGLM_CROSS:-$(uname -m)}
cmake_cpu=(-DGGML_NATIVE=ON)
variant=native
if [ "${RINGLM_GGML_NATIVE:-0}" != 1 ] && [ "$target_arch" = x86_64 ] && [ -r /proc/cpuinfo ]; then
    read -ra _ggml_feats <<<"$(ggml_variant)"
    [ ${#_ggml_feats[@]} -gt 0 ] || { echo "ggml-variant.sh: no x86 variant named '${RINGLM_X86_VARIANT:-}'" >&2; exit 1; }
    variant=${_ggml_feats[0]}
    cmake_cpu=(-DGGML_NATIVE=OFF)
    for f in "${_ggml_feats[@]:1}"; do cmake_cpu+=("-DGGML_$f=ON"); done
    unset _ggml_feats f
elif [ "$target_arch" = aarch64 ] && { [ -n "${RINGLM_CROSS:-}" ] || [ "${RINGLM_GGML_NATIVE:-0}" != 1 ]; }; then
    if [ -n "${RINGLM_CROSS:-}" ]; then variant=${RINGLM_ARM_VARIANT:-armv8.6_2}; else variant=${RINGLM_ARM_VARIANT:-$(ggml_arm_variant)}; fi
    _march=$(ggml_arm_march "$variant") || { echo "ggml-variant.sh: unknown aarch64 variant '$variant' (armv8.0_1 .. armv9.2_2)" >&2; exit 1; }
    cmake_cpu=(-DGGML_NATIVE=OFF -DGGML_CPU_ARM_ARCH="$_march")
    variant=arm64-$variant
    unset _march
fi
