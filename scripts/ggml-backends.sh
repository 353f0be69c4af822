#!/usr/bin/env bash
# Prints the directory holding the ggml backend modules ringlm loads at run time (src/device/devices.c).
#
# ringlm links the pinned ggml statically (CPU backend included, built here so its kernels match the
# oracle's); GPU backends come as ggml's dynamic modules (libggml-<name>.so exporting ggml_backend_init),
# loaded with ggml_backend_load. Vulkan (any GPU vendor, and Mesa's software device lavapipe): the prebuilt
# libggml-vulkan.so of llama.cpp's Vulkan build from the same release (@node-llama-cpp/linux-x64-vulkan,
# sha256 in scripts/pins.env), since Debian bookworm's Vulkan headers are too old to build it from this
# source. A module names libggml-base.so as a dependency: the directory holds an empty stand-in of that
# name, so every ggml symbol the module uses resolves to the one copy the ringlm binary exports (linked
# with --export-dynamic): one ggml, not two with separate state. The cache is
# ${XDG_CACHE_HOME:-$HOME/.cache}/ringlm/backends-<version>; a finished one is reused. Progress to stderr.
# RINGLM_BACKENDS=none prints nothing (a CPU-only build). VULKAN_TGZ=/path uses a downloaded tarball.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/pins.env"
. "$here/npm-fetch.sh"
[ "${RINGLM_BACKENDS:-vulkan}" = none ] && exit 0
case "$(uname -s)-$(uname -m)" in
    Linux-x86_64) ;;
    *) echo "ggml-backends.sh: the prebuilt Vulkan module is for Linux x86-64 only; building without it" >&2; exit 0 ;;
esac
pkg="@node-llama-cpp/linux-x64-vulkan@$NLC_VERSION"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/ringlm/backends-$NLC_VERSION"
if [ ! -f "$cache/.done" ]; then
    echo "ggml-backends.sh: fetching $pkg into $cache (once)" >&2
    rm -rf "$cache" && mkdir -p "$cache/oracle"
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    tgz=$(npm_fetch ggml-backends.sh "$pkg" NLC_LINUX_X64_VULKAN_SHA256 "$work" "${VULKAN_TGZ:-}")
    tar xzf "$tgz" -C "$work" package/bins/linux-x64-vulkan
    bins="$work/package/bins/linux-x64-vulkan"
    [ -f "$bins/libggml-vulkan.so" ] || { echo "ggml-backends.sh: $pkg has no libggml-vulkan.so" >&2; exit 1; }
    cp "$bins/libggml-vulkan.so" "$cache/"
    # The stand-in: a shared library named libggml-base.so with nothing in it.
    printf '/* empty: ggml-base symbols come from the ringlm binary */\n' > "$work/stub.c"
    ${CC:-cc} -shared -fPIC -o "$cache/libggml-base.so" -Wl,-soname,libggml-base.so "$work/stub.c"
    # The whole Vulkan build, for the oracle of the Vulkan path (tests/oracle with ORACLE_LIB=this).
    cp "$bins"/lib*.so "$cache/oracle/"
    touch "$cache/.done"
fi
echo "$cache"
