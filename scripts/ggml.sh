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
. "$here/npm-fetch.sh"

if [ -n "${GGML_PREFIX:-}" ]; then
    [ -f "$GGML_PREFIX/include/ggml.h" ] || { echo "ggml.sh: GGML_PREFIX=$GGML_PREFIX has no include/ggml.h" >&2; exit 1; }
    [ -f "$GGML_PREFIX/include/gguf.h" ] || { echo "ggml.sh: GGML_PREFIX=$GGML_PREFIX has no include/gguf.h" >&2; exit 1; }
    ls "$GGML_PREFIX"/lib/libggml-base.* >/dev/null 2>&1 || { echo "ggml.sh: no libggml-base in $GGML_PREFIX/lib" >&2; exit 1; }
    echo "GGML_INC := $GGML_PREFIX/include"
    echo "GGML_LIBS := -L$GGML_PREFIX/lib -Wl,-rpath,$GGML_PREFIX/lib -lggml -lggml-cpu -lggml-base -lstdc++ -fopenmp"
    echo "LLAMA_SRC :="
    # GPU backends: linked into that libggml, or modules beside it (ggml_backend_load).
    echo "GGML_BACKEND_DIR := $GGML_PREFIX/lib"
    exit 0
fi

# Which CPU kernels to build: sets `variant` and `cmake_cpu` (see the comment there).
. "$here/ggml-variant.sh"
# Which compiler: the oracle's prebuilt CPU backends were built by GCC 11 (Ubuntu 22.04's 11.4), and the
# same kernel source compiled by another GCC contracts other a*b+c expressions into FMAs: in the one-query
# flash-attention kernel GCC 12 fuses a few more scalar multiply-adds than GCC 11, so decode logits differed
# from llama.cpp's by ~1e-5 (and, through routing, by percents on quantized models) while with GCC 11 they
# are bit for bit equal. So ggml is built with gcc-11/g++-11 where installed (Debian: g++-11), else with
# the default compiler (noted in the cache name). RINGLM_GGML_CC / RINGLM_GGML_CXX choose another pair.
# On aarch64 the oracle (llama.cpp's linux-arm64 build) was compiled by clang (21; its .comment says so),
# which contracts a*b+c into an FMA only within one expression where GCC contracts across statements: with
# GCC 12 our aarch64 logits differed from llama.cpp's by ~1e-5 relative, with Debian's clang (14) they are
# bit for bit equal. So aarch64 builds take clang where installed (clang++ for ggml's C++). RINGLM_CROSS=
# aarch64 builds for aarch64 from here (Debian: clang, crossbuild-essential-arm64 for the sysroot).
ggml_cc=${RINGLM_GGML_CC:-} ggml_cxx=${RINGLM_GGML_CXX:-}
cc_tag=""
cc_args=()
if [ -n "${RINGLM_CROSS:-}" ]; then
    [ "$RINGLM_CROSS" = aarch64 ] || { echo "ggml.sh: RINGLM_CROSS=$RINGLM_CROSS: the only cross target is aarch64" >&2; exit 1; }
    ggml_cc=${ggml_cc:-clang} ggml_cxx=${ggml_cxx:-clang++}
    command -v "$ggml_cc" >/dev/null || { echo "ggml.sh: no $ggml_cc (Debian: apt-get install clang)" >&2; exit 1; }
    [ -d /usr/aarch64-linux-gnu ] || { echo "ggml.sh: no aarch64 sysroot (Debian: apt-get install crossbuild-essential-arm64)" >&2; exit 1; }
    cc_args=(-DCMAKE_SYSTEM_NAME=Linux -DCMAKE_SYSTEM_PROCESSOR=aarch64
             -DCMAKE_C_COMPILER_TARGET=aarch64-linux-gnu -DCMAKE_CXX_COMPILER_TARGET=aarch64-linux-gnu)
elif [ -z "$ggml_cc" ] && [ "$target_arch" = x86_64 ] && command -v gcc-11 >/dev/null && command -v g++-11 >/dev/null; then
    ggml_cc=gcc-11 ggml_cxx=g++-11
elif [ -z "$ggml_cc" ] && [ "$target_arch" = aarch64 ] && command -v clang >/dev/null && command -v clang++ >/dev/null; then
    ggml_cc=clang ggml_cxx=clang++
fi
if [ -n "$ggml_cc" ]; then
    cc_tag="-$(basename "$ggml_cc")"
    cc_args+=(-DCMAKE_C_COMPILER="$ggml_cc" -DCMAKE_CXX_COMPILER="${ggml_cxx:-$ggml_cc}")
fi
cache="${XDG_CACHE_HOME:-$HOME/.cache}/ringlm/ggml-$NLC_VERSION-$LLAMA_COMMIT-$variant$cc_tag"
if [ ! -f "$cache/.done" ]; then
    echo "ggml.sh: building pinned ggml ($variant CPU kernels) into $cache (once; about 2 minutes)" >&2
    rm -rf "$cache" && mkdir -p "$cache"
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    tgz=$(npm_fetch ggml.sh "node-llama-cpp@$NLC_VERSION" NLC_SHA256 "$work")
    tar xzf "$tgz" -C "$work" package/llama/gitRelease.bundle
    git clone -q "$work/package/llama/gitRelease.bundle" "$cache/llama.cpp" 2>/dev/null
    head=$(git -C "$cache/llama.cpp" rev-parse --short=7 HEAD)
    [ "$head" = "$LLAMA_COMMIT" ] || { echo "ggml.sh: bundle is at $head, expected $LLAMA_COMMIT" >&2; exit 1; }
    cmake -S "$cache/llama.cpp" -B "$cache/build" -DCMAKE_BUILD_TYPE=Release \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
        -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF "${cmake_cpu[@]}" "${cc_args[@]+"${cc_args[@]}"}" >"$cache/cmake.log" 2>&1 \
        || { echo "ggml.sh: cmake configure failed, see $cache/cmake.log" >&2; exit 1; }
    cmake --build "$cache/build" --target ggml -j"$(nproc)" >>"$cache/cmake.log" 2>&1 \
        || { echo "ggml.sh: ggml build failed, see $cache/cmake.log" >&2; exit 1; }
    mkdir -p "$cache/include" "$cache/lib"
    cp "$cache"/llama.cpp/ggml/include/*.h "$cache/include/"
    cp "$cache"/build/ggml/src/libggml*.a "$cache/lib/"
    touch "$cache/.done"
fi
echo "GGML_INC := $cache/include"
# The whole of ggml-base, exported from the binary (-rdynamic in the Makefile): the GPU backend modules
# (scripts/ggml-backends.sh) call into it.
echo "GGML_LIBS := $cache/lib/libggml.a $cache/lib/libggml-cpu.a -Wl,--whole-archive $cache/lib/libggml-base.a -Wl,--no-whole-archive -lstdc++ -fopenmp -ldl"
echo "LLAMA_SRC := $cache/llama.cpp"
# GPU backend modules: x86-64 only so far (the prebuilt Vulkan one; scripts/ggml-cuda.sh's CUDA one).
if [ -z "${RINGLM_CROSS:-}" ]; then echo "GGML_BACKEND_DIR := $("$here/ggml-backends.sh")"; else echo "GGML_BACKEND_DIR :="; fi
