#!/usr/bin/env bash
# Prints the directory holding the prebuilt llama.cpp libraries the oracle (tests/oracle) links with.
#
# Fetches @node-llama-cpp/linux-x64 from npm (the CPU build node-llama-cpp ships for x86-64 Linux),
# checks the tarball's sha256 against scripts/pins.env and unpacks its shared libraries into
# ${XDG_CACHE_HOME:-$HOME/.cache}/ringlm/oracle-<version>/lib. A finished cache is reused, so a second run
# takes no time and needs no network. ORACLE_TGZ=/path/to/node-llama-cpp-linux-x64-<version>.tgz uses an
# already downloaded tarball instead of npm (it is checked all the same). Progress goes to stderr.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/pins.env"
. "$here/npm-fetch.sh"

# ORACLE_ARCH=arm64 (default: this machine's) fetches @node-llama-cpp/linux-arm64 instead, for the aarch64
# build (tests/oracle's oracle-arm64, run under qemu-user by tests/t_arm64.sh, or natively on aarch64).
case "${ORACLE_ARCH:-$(uname -m)}" in
    x86_64|x64) arch=x64 sha=NLC_LINUX_X64_SHA256 suffix="" ;;
    aarch64|arm64) arch=arm64 sha=NLC_LINUX_ARM64_SHA256 suffix=-arm64 ;;
    *) echo "oracle-lib.sh: llama.cpp's prebuilt libllama is for Linux x86-64 and arm64, not $(uname -s)-${ORACLE_ARCH:-$(uname -m)}" >&2
       exit 1 ;;
esac
pkg="@node-llama-cpp/linux-$arch@$NLC_VERSION"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/ringlm/oracle-$NLC_VERSION$suffix"
if [ ! -f "$cache/.done" ]; then
    [ "$(uname -s)" = Linux ] || { echo "oracle-lib.sh: the prebuilt libllama is for Linux" >&2; exit 1; }
    echo "oracle-lib.sh: fetching $pkg into $cache (once)" >&2
    rm -rf "$cache" && mkdir -p "$cache"
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    tgz=$(npm_fetch oracle-lib.sh "$pkg" "$sha" "$work" "${ORACLE_TGZ:-}")
    tar xzf "$tgz" -C "$work" "package/bins/linux-$arch"
    # All the shared libraries, the libggml-cpu-<cpu>.so variants included: libggml loads the best one for
    # this CPU at run time from a directory the oracle names (ggml_backend_load_all_from_path).
    mkdir -p "$cache/lib"
    cp "$work"/package/bins/linux-$arch/lib*.so "$cache/lib/"
    for f in libllama.v0.4.0.so libggml.v0.4.0.so libggml-base.so; do
        [ -f "$cache/lib/$f" ] || { echo "oracle-lib.sh: $pkg has no bins/linux-$arch/$f" >&2; exit 1; }
    done
    ls "$cache"/lib/libggml-cpu-*.so >/dev/null 2>&1 \
        || { echo "oracle-lib.sh: $pkg has no libggml-cpu-*.so backend" >&2; exit 1; }
    touch "$cache/.done"
fi
echo "$cache/lib"
