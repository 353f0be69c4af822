#!/usr/bin/env bash
# Installs the system packages ringlm builds and tests with (Debian). Run as root; safe to re-run.
set -euo pipefail
pkgs=(
    build-essential cmake git pkg-config ca-certificates curl   # toolchain; cmake builds the pinned ggml
    g++-11             # builds the pinned ggml with the GCC that built the oracle's kernels (scripts/ggml.sh)
    nodejs npm                                                  # npm fetches the pinned llama.cpp source and oracle
    libsodium-dev      # node keys, Ed25519 receipts, BLAKE2b hashes
    libzmq3-dev        # ring links: framing, reconnection, heartbeats, CURVE encryption
    libmicrohttpd-dev  # the OpenAI-compatible HTTP server
    libcjson-dev       # JSON: configs, API bodies, metrics
    libpcre2-dev       # tokenizer pre-split
    python3            # test helpers
    iproute2 iptables  # tests/t_partition.sh, tests/t_nat.sh: network namespaces, veth pairs, MASQUERADE home routers
    python3-jsonschema # tests/t_serve.sh: structured output validated against its JSON schema
    chromium           # tests/t_serve_clients.sh: loads the `ringlm serve` chat page headless and checks the streamed reply
    libvulkan1 mesa-vulkan-drivers # the Vulkan loader for the Vulkan backend module, and Mesa's software Vulkan device (tests/t_gpu.sh)
)
# The trained small K3 (tools/train, tests/t_trained.sh), installed without their recommends (libtorch-dev
# and a compiler stack torch does not need to train on the CPU):
train_pkgs=(
    python3-torch      # trains the small K3 and its DSpark draft (Debian's torch 1.13, CPU)
    libopenblas0-pthread # torch's matrix products through OpenBLAS: with the reference BLAS training is ~30x slower
    wordnet-base       # training text: WordNet's glosses and example sentences
    fortunes           # training text: fortune cookies (the non-offensive set)
    bible-kjv-text bible-kjv # training text: the King James Bible, 820,000 words of regular prose (bible-kjv's reader decodes it)
)
# not_installed PKG...: those of PKG... dpkg does not have installed, one a line
not_installed() {
    local p
    for p in "$@"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"; done
}
# The aarch64 build, cross-compiled here and run under qemu-user (make arm64, tests/t_arm64.sh), on an x86-64
# machine: Debian's arm64 packages of the same libraries (multiarch), installed beside the native ones.
arm_pkgs=(
    clang                        # compiles ggml for aarch64: llama.cpp's arm64 build is clang's, and GCC rounds otherwise (scripts/ggml.sh)
    crossbuild-essential-arm64   # the aarch64 GCC for our code, its sysroot for clang
    qemu-user-static             # runs the aarch64 binaries here
    libsodium-dev:arm64 libzmq3-dev:arm64 libmicrohttpd-dev:arm64 libcjson-dev:arm64 libpcre2-dev:arm64
    libgomp1:arm64               # OpenMP's runtime, which the aarch64 link names
)
# On an aarch64 machine itself: clang, which compiles ggml there as llama.cpp's arm64 build was (scripts/ggml.sh).
[ "$(dpkg --print-architecture)" = arm64 ] && pkgs+=(clang)
if [ "$(dpkg --print-architecture)" = amd64 ] && [ "${RINGLM_NO_ARM64:-0}" != 1 ]; then
    dpkg --print-foreign-architectures | grep -qx arm64 || { dpkg --add-architecture arm64 && echo "install-deps: added the arm64 architecture" >&2; }
    pkgs+=("${arm_pkgs[@]}")
fi
mapfile -t missing < <(not_installed "${pkgs[@]}")
# node/npm may come from elsewhere (nvm, nodesource): accept working binaries.
if command -v node >/dev/null && command -v npm >/dev/null; then
    tmp=(); for p in "${missing[@]}"; do [[ $p == nodejs || $p == npm ]] || tmp+=("$p"); done; missing=("${tmp[@]+"${tmp[@]}"}")
fi
mapfile -t train_missing < <(not_installed "${train_pkgs[@]}")
if [ $((${#missing[@]} + ${#train_missing[@]})) -gt 0 ]; then
    echo "install-deps: installing ${missing[*]} ${train_missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    [ ${#missing[@]} = 0 ] || apt-get install -y -qq "${missing[@]}" >/dev/null
    [ ${#train_missing[@]} = 0 ] || apt-get install -y -qq --no-install-recommends "${train_missing[@]}" >/dev/null
fi
echo "install-deps: all packages present" >&2
