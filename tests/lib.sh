# tests/lib.sh - helpers for end-to-end test scripts. Source it; it sets `set -euo pipefail`.
#
#   check DESC CMD...        run CMD; count a pass if it exits 0, else a failure (the script goes on)
#   check_fails DESC PATTERN CMD...   CMD must exit 1 (not crash) and print PATTERN (grep -E) on stderr
#   model NAME CONFIG TYPE [SEED]     path of a synthesized fixture, made once and cached in $MODELS
#   finish                   prints the counts and exits non-zero if anything failed
set -euo pipefail
: "${RINGLM:?run through tests/run.sh}"
# The CPU unless a test names a device: the suite compares against llama.cpp's CPU build bit for bit, and a
# machine with a GPU would otherwise compute on it by default (docs/devices.md). tests/t_gpu.sh names its own.
export RINGLM_DEVICE=${RINGLM_TEST_DEVICE:-CPU}
T_PASS=0
T_FAIL=0
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

check() {
    local desc=$1; shift
    if "$@" >"$WORK/out" 2>&1; then
        T_PASS=$((T_PASS + 1)); echo "ok - $desc"
    else
        T_FAIL=$((T_FAIL + 1)); echo "not ok - $desc"; sed 's/^/    /' "$WORK/out" | tail -20
    fi
}

check_fails() {
    local desc=$1 pattern=$2; shift 2
    local rc=0
    "$@" >"$WORK/out" 2>"$WORK/err" || rc=$?
    if [ $rc = 1 ] && grep -Eq -- "$pattern" "$WORK/err"; then
        T_PASS=$((T_PASS + 1)); echo "ok - $desc: $(head -c 300 "$WORK/err")"
    else
        T_FAIL=$((T_FAIL + 1)); echo "not ok - $desc (exit $rc, want 1 and /$pattern/)"; sed 's/^/    /' "$WORK/err" | tail -20
    fi
}

# model NAME CONFIG TYPE [SEED]: synthesize once per (name, seed) with the release binary; later calls and
# the sanitizer run reuse the file ($MODELS is keyed by a hash of the synth sources, see run.sh). TYPE "-"
# keeps the config's own per-tensor types. A lock keeps parallel runs from writing one fixture twice.
model() {
    local name=$1 config=$2 type=$3 seed=${4:-1}
    local f="$MODELS/$name-s$seed.gguf" targs=()
    case $config in */*|*.json) ;; *) [ -f "$ROOT/tests/configs/$config.json" ] && config=$ROOT/tests/configs/$config.json ;; esac
    [ "$type" = - ] || targs=(--type "$type")
    (
        flock 9
        if [ ! -f "$f" ]; then
            "$RINGLM_SYNTH" synth --no-progress -o "$f.tmp" --config "$config" "${targs[@]}" --seed "$seed" >&2 &&
                mv "$f.tmp" "$f"
        fi
    ) 9>"$MODELS/.lock"
    echo "$f"
}

finish() {
    echo "$T_PASS passed, $T_FAIL failed"
    [ $T_FAIL = 0 ]
}
