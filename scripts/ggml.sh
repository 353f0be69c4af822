#!/usr/bin/env bash
# Prints make variables (GGML_INC, GGML_LIBS, LLAMA_SRC) for the pinned ggml.
#
# With GGML_PREFIX set, uses that installed ggml (PREFIX/include/ggml.h, PREFIX/lib/libggml*).
# Otherwise fetches node-llama-cpp from npm, checks the tarball's sha256, clones the llama.cpp git bundle
# it ships and builds only ggml (CPU backend) into ${XDG_CACHE_HOME:-$HOME/.cache}/ringlm/ggml-<version>.
# A finished cache is reused, so a second run takes no time. Progress goes to stderr.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/pins.env"

if [ -n "${GGML_PREFIX:-}" ]; then
    [ -f "$GGML_PREFIX/include/ggml.h" ] || { echo "ggml.sh: GGML_PREFIX=$GGML_PREFIX has no include/ggml.h" >&2; exit 1; }
    [ -f "$GGML_PREFIX/include/gguf.h" ] || { echo "ggml.sh: GGML_PREFIX=$GGML_PREFIX has no include/gguf.h" >&2; exit 1; }
    ls "$GGML_PREFIX"/lib/libggml-base.* >/dev/null 2>&1 || { echo "ggml.sh: no libggml-base in $GGML_PREFIX/lib" >&2; exit 1; }
    echo "GGML_INC := $GGML_PREFIX/include"
    echo "GGML_LIBS := -L$GGML_PREFIX/lib -Wl,-rpath,$GGML_PREFIX/lib -lggml -lggml-cpu -lggml-base"
    echo "LLAMA_SRC :="
    exit 0
fi

# Which CPU kernels to build. llama.cpp's prebuilt library (our oracle) ships one CPU backend per x86
# "variant" and loads the best-scoring one this CPU supports. We build ggml with the flags of that same
# variant, so our kernels are the oracle's kernels: on quantized models, where activations are requantized
# to 8 bits before every matmul, even a different SIMD path (say AVX-VNNI vs AVX512-VNNI) rounds a tie
# differently now and then, and a random-weight MoE amplifies that into visible differences. With the
# same variant our logits match llama.cpp's bit for bit on every quant type we test (docs/numerics.md).
# RINGLM_GGML_NATIVE=1 builds with -march=native instead.
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
        "alderlake SSE42 AVX F16C FMA AVX2 BMI2 AVX_VNNI"
        "sapphirerapids SSE42 AVX F16C FMA AVX2 BMI2 AVX512 AVX512_VBMI AVX512_VNNI AVX512_BF16 AMX_TILE AMX_INT8")
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
        if [ $ok = 1 ] && [ $score -gt $best_score ]; then best=$v; best_score=$score; fi
    done
    echo "$best"
}
cmake_cpu=(-DGGML_NATIVE=ON)
variant=native
if [ "${RINGLM_GGML_NATIVE:-0}" != 1 ] && [ "$(uname -m)" = x86_64 ] && [ -r /proc/cpuinfo ]; then
    set -- $(ggml_variant)
    variant=$1; shift
    cmake_cpu=(-DGGML_NATIVE=OFF)
    for f in "$@"; do cmake_cpu+=("-DGGML_$f=ON"); done
fi
cache="${XDG_CACHE_HOME:-$HOME/.cache}/ringlm/ggml-$NLC_VERSION-$LLAMA_COMMIT-$variant"
if [ ! -f "$cache/.done" ]; then
    echo "ggml.sh: building pinned ggml ($variant CPU kernels) into $cache (once; about 2 minutes)" >&2
    rm -rf "$cache" && mkdir -p "$cache"
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    (cd "$work" && npm pack --silent "node-llama-cpp@$NLC_VERSION" >/dev/null)
    tgz="$work/node-llama-cpp-$NLC_VERSION.tgz"
    got=$(sha256sum "$tgz" | cut -d' ' -f1)
    if [ "$got" != "$NLC_SHA256" ]; then
        echo "ggml.sh: sha256 of node-llama-cpp-$NLC_VERSION.tgz is $got, expected $NLC_SHA256; refusing it" >&2
        exit 1
    fi
    tar xzf "$tgz" -C "$work" package/llama/gitRelease.bundle
    git clone -q "$work/package/llama/gitRelease.bundle" "$cache/llama.cpp" 2>/dev/null
    head=$(git -C "$cache/llama.cpp" rev-parse --short=7 HEAD)
    [ "$head" = "$LLAMA_COMMIT" ] || { echo "ggml.sh: bundle is at $head, expected $LLAMA_COMMIT" >&2; exit 1; }
    cmake -S "$cache/llama.cpp" -B "$cache/build" -DCMAKE_BUILD_TYPE=Release \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
        -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF "${cmake_cpu[@]}" >"$cache/cmake.log" 2>&1 \
        || { echo "ggml.sh: cmake configure failed, see $cache/cmake.log" >&2; exit 1; }
    cmake --build "$cache/build" --target ggml -j"$(nproc)" >>"$cache/cmake.log" 2>&1 \
        || { echo "ggml.sh: ggml build failed, see $cache/cmake.log" >&2; exit 1; }
    mkdir -p "$cache/include" "$cache/lib"
    cp "$cache"/llama.cpp/ggml/include/*.h "$cache/include/"
    cp "$cache"/build/ggml/src/libggml*.a "$cache/lib/"
    touch "$cache/.done"
fi
echo "GGML_INC := $cache/include"
echo "GGML_LIBS := $cache/lib/libggml.a $cache/lib/libggml-cpu.a $cache/lib/libggml-base.a -lstdc++ -fopenmp"
echo "LLAMA_SRC := $cache/llama.cpp"
