#!/usr/bin/env bash
# Builds the pinned ggml's CUDA backend ahead of any GPU, here where nvcc is, and prints the directory that
# holds it as a ringlm backend module (RINGLM_BACKEND_DIR=that ringlm devices).
#
# Why ahead: ggml-cuda is ~150 nvcc compilations per GPU architecture; on the few minutes a GPU machine is
# lent for, building it there left no time to run anything (bench/device/gpu_check.sh). Built once here,
# the module travels (bench/device/gpu_check.sh --prepare) and the GPU check only runs.
#
# One CMake tree of the pinned llama.cpp source (scripts/ggml.sh's LLAMA_SRC) with backends as dynamic
# modules (GGML_BACKEND_DL) gives both sides of the comparison from the same kernels:
#   modules/  libggml-cuda.so, and the empty libggml-base.so stand-in (as scripts/ggml-backends.sh does for
#             Vulkan: the module's ggml symbols resolve to the one copy the ringlm binary exports);
#   oracle/   llama.cpp's own CUDA build: libllama.so, libggml*.so (its CPU backend for portable AVX2
#             x86-64; on aarch64, this CPU's variant), the same libggml-cuda.so, and llama-bench, the speed peer.
# On aarch64 with CUDA (GB10, Grace Hopper, Jetson) run it there: nvcc here targets x86-64 hosts only.
# It needs the CUDA toolkit (nvcc, cudart, cuBLAS) to build and the NVIDIA driver (libcuda.so.1) only to
# run: without one `ringlm devices` says so.
#
# RINGLM_CUDA_ARCHS: CMake CUDA architectures, default 90-real (H100, H200) plus 120a-real and 121a-real
# (RTX 5090 / PRO 6000, GB10) when nvcc knows them. Real architectures only: PTX would be compiled by the
# driver at the first start, for minutes. The cache, ${XDG_CACHE_HOME:-$HOME/.cache}/ringlm/cuda-<version>-
# <commit>-<archs>, is reused when finished and resumed when a build was cut off. Progress to stderr.
#
#   scripts/ggml-cuda.sh           build (or find) it, print the cache directory
#   scripts/ggml-cuda.sh --where   print it only if built already (exit 3 if not): never builds
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/pins.env"
nvcc=${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
if [ -z "${RINGLM_CUDA_ARCHS:-}" ]; then
    RINGLM_CUDA_ARCHS=90-real
    known=$("$nvcc" --list-gpu-code 2>/dev/null || echo "sm_120 sm_121")
    for a in 120 121; do grep -qw "sm_$a" <<<"$known" && RINGLM_CUDA_ARCHS+=";${a}a-real"; done
fi
src=$(GGML_PREFIX='' "$here/ggml.sh" | sed -n 's/^LLAMA_SRC := //p')
[ -f "$src/ggml/src/ggml-cuda/CMakeLists.txt" ] || { echo "ggml-cuda.sh: no pinned llama.cpp source at '$src'" >&2; exit 1; }
# The oracle tree's CPU backend: on x86-64 the portable AVX2 set (ggml's haswell variant: the tree travels to
# the GPU machine), on aarch64 (GB10, Grace, Jetson: build it there) this machine's variant.
if [ "$(uname -m)" = x86_64 ]; then
    cpu_flags=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON)
else
    . "$here/ggml-variant.sh"
    cpu_flags=("${cmake_cpu[@]}")
fi
tag=$(tr ';' '_' <<<"$RINGLM_CUDA_ARCHS")
cache="${XDG_CACHE_HOME:-$HOME/.cache}/ringlm/cuda-$NLC_VERSION-$LLAMA_COMMIT-$tag"
if [ "${1:-}" = --where ]; then
    [ -f "$cache/.done" ] || exit 3
    echo "$cache"
    exit 0
fi
[ -x "$nvcc" ] || { echo "ggml-cuda.sh: no nvcc (install the CUDA toolkit, or set CUDACXX)" >&2; exit 1; }
if [ ! -f "$cache/.done" ]; then
    echo "ggml-cuda.sh: building the pinned ggml-cuda for $RINGLM_CUDA_ARCHS into $cache (once; hours on 2 cores)" >&2
    mkdir -p "$cache"
    if [ ! -f "$cache/build/CMakeCache.txt" ]; then
        cmake -S "$src" -B "$cache/build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$nvcc" \
            -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$RINGLM_CUDA_ARCHS" \
            -DGGML_BACKEND_DL=ON -DBUILD_SHARED_LIBS=ON \
            "${cpu_flags[@]}" \
            -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF \
            -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TOOLS=ON >"$cache/cmake.log" 2>&1 \
            || { echo "ggml-cuda.sh: cmake configure failed, see $cache/cmake.log" >&2; exit 1; }
    fi
    cmake --build "$cache/build" -j"${RINGLM_CUDA_JOBS:-$(nproc)}" --target ggml-cuda ggml-cpu llama llama-bench \
        >>"$cache/cmake.log" 2>&1 || { echo "ggml-cuda.sh: build failed, see $cache/cmake.log" >&2; exit 1; }
    rm -rf "$cache/modules" "$cache/oracle" && mkdir -p "$cache/modules" "$cache/oracle"
    bin="$cache/build/bin"
    cp "$bin/libggml-cuda.so" "$cache/modules/"
    printf '/* empty: ggml-base symbols come from the ringlm binary */\n' >"$cache/stub.c"
    ${CC:-cc} -shared -fPIC -o "$cache/modules/libggml-base.so" -Wl,-soname,libggml-base.so "$cache/stub.c"
    cp -P "$bin"/lib*.so* "$bin/llama-bench" "$cache/oracle/"
    touch "$cache/.done"
fi
echo "$cache"
