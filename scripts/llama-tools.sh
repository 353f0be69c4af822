#!/usr/bin/env bash
# Builds llama.cpp's own tools, the comparison peers of our benchmarks (bench/llama_peers.md), and prints
# their bin directory on stdout:
#   ggml-rpc-server   (tools/rpc; older llama.cpp called it rpc-server)
#   llama-bench       (tools/llama-bench)
#   llama-cli         (tools/cli: the chat CLI, built on the server code)
#   llama-completion  (tools/completion: the old non-interactive `main`)
#   llama-server      (tools/server)
#
# Same pinned llama.cpp source as scripts/ggml.sh (it is asked for it, and builds it if need be), same CPU
# variant flags (scripts/ggml-variant.sh), GGML_RPC=ON, static, no curl/openssl, no web UI download.
# Built once into ${XDG_CACHE_HOME:-$HOME/.cache}/ringlm/llama-tools-<version>-<commit>-<variant>; a
# finished cache is reused, so a second run takes no time. About 10 minutes on 2 cores. Progress to stderr.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/pins.env"
. "$here/ggml-variant.sh"

# The compiler ggml.sh builds our ggml with (gcc-11 where installed, RINGLM_GGML_CC/CXX to choose): the
# peer's kernels then come out of the same code generation as ours, and a comparison is of engines, not of
# compilers (GCC 12 schedules the same tinyBLAS loops differently; the prebuilt llama.cpp libraries are
# GCC 11's).
cc=${RINGLM_GGML_CC:-} cxx=${RINGLM_GGML_CXX:-}
if [ -z "$cc" ] && command -v gcc-11 >/dev/null && command -v g++-11 >/dev/null; then cc=gcc-11 cxx=g++-11; fi
cc_args=() suffix=
if [ -n "$cc" ]; then
    cc_args=(-DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="${cxx:-$cc}")
    suffix=-$(basename "$cc")
fi
cache="${XDG_CACHE_HOME:-$HOME/.cache}/ringlm/llama-tools-$NLC_VERSION-$LLAMA_COMMIT-$variant$suffix"
tools=(ggml-rpc-server llama-bench llama-cli llama-completion llama-server)
if [ ! -f "$cache/.done" ]; then
    # the pinned source: ggml.sh fetches, checks and clones it (GGML_PREFIX would skip that, so drop it)
    src=$(env -u GGML_PREFIX "$here/ggml.sh" | sed -n 's/^LLAMA_SRC := //p')
    [ -n "$src" ] && [ -f "$src/CMakeLists.txt" ] || { echo "llama-tools.sh: ggml.sh gave no llama.cpp source" >&2; exit 1; }
    head=$(git -C "$src" rev-parse --short=7 HEAD)
    [ "$head" = "$LLAMA_COMMIT" ] || { echo "llama-tools.sh: $src is at $head, expected $LLAMA_COMMIT" >&2; exit 1; }
    echo "llama-tools.sh: building llama.cpp tools ($variant CPU kernels) into $cache (once; about 10 minutes)" >&2
    rm -rf "$cache" && mkdir -p "$cache"
    cmake -S "$src" -B "$cache/build" -DCMAKE_BUILD_TYPE=Release \
        -DBUILD_SHARED_LIBS=OFF -DGGML_RPC=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
        -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
        "${cmake_cpu[@]}" "${cc_args[@]+"${cc_args[@]}"}" >"$cache/cmake.log" 2>&1 \
        || { echo "llama-tools.sh: cmake configure failed, see $cache/cmake.log" >&2; exit 1; }
    cmake --build "$cache/build" --target "${tools[@]}" -j"$(nproc)" >>"$cache/cmake.log" 2>&1 \
        || { echo "llama-tools.sh: build failed, see $cache/cmake.log" >&2; exit 1; }
    mkdir -p "$cache/bin"
    for t in "${tools[@]}"; do cp "$cache/build/bin/$t" "$cache/bin/"; done
    touch "$cache/.done"
fi
echo "$cache/bin"
