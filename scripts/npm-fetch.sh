# Sourced, not run: npm_fetch WHO PACKAGE@VERSION SHA_VAR WORKDIR [LOCAL_TGZ]
#
# Puts the npm tarball of PACKAGE@VERSION in WORKDIR (or takes LOCAL_TGZ, an already downloaded copy),
# checks its sha256 against the value of the variable named SHA_VAR (scripts/pins.env) and prints its
# path. Any failure says so on stderr, prefixed with WHO, and exits: a tarball that is not the pinned one
# is never unpacked. Used by ggml.sh (the llama.cpp source), oracle-lib.sh (the CPU oracle) and
# ggml-backends.sh (the Vulkan module).
npm_fetch() {
    local who=$1 pkg=$2 sha_var=$3 work=$4 local_tgz=${5:-} tgz got
    if [ -n "$local_tgz" ]; then
        [ -f "$local_tgz" ] || { echo "$who: $local_tgz does not exist" >&2; exit 1; }
        tgz=$local_tgz
    else
        (cd "$work" && npm pack --silent "$pkg" >/dev/null) || { echo "$who: npm pack $pkg failed" >&2; exit 1; }
        # npm names it after the package: @scope/name@v -> scope-name-v.tgz
        tgz=$(ls "$work"/*.tgz 2>/dev/null | head -1)
        [ -n "$tgz" ] || { echo "$who: npm pack $pkg produced no tarball" >&2; exit 1; }
    fi
    got=$(sha256sum "$tgz" | cut -d' ' -f1)
    if [ "$got" != "${!sha_var}" ]; then
        echo "$who: sha256 of $(basename "$tgz") is $got, expected ${!sha_var} ($sha_var in scripts/pins.env); refusing it" >&2
        exit 1
    fi
    echo "$tgz"
}
