#!/usr/bin/env bash
# The test suite: unit programs (build/<variant>/unit/*) and end-to-end scripts (tests/t_*.sh).
#
#   RINGLM_BUILD=build/release tests/run.sh [NAME_SUBSTRING | =NAME ...]
#
# Each test runs with a time limit; its output goes to build/<variant>/test-logs/NAME.log and is shown
# only when it fails. The last line is "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/.."
export ROOT=$PWD
export RINGLM_BUILD=${RINGLM_BUILD:-build/release}
export RINGLM=$ROOT/$RINGLM_BUILD/ringlm
export ORACLE=$ROOT/tests/oracle/oracle
# Synthesized fixtures are made by the release binary and shared by both variants; the folder is keyed by
# a hash of everything that decides their bytes, so a change to synth makes fresh ones.
export RINGLM_SYNTH=$ROOT/build/release/ringlm
synth_hash=$(cat src/tools/synth*.c src/tools/synth*.h src/model/k3_hparams.c data/corpus/* tests/configs/* 2>/dev/null |
             sha1sum | cut -c1-12)
export MODELS=${RINGLM_TEST_MODELS:-$ROOT/build/test-models/$synth_hash}
export UNIT=$ROOT/$RINGLM_BUILD/unit
export TOOLS=$ROOT/$RINGLM_BUILD/tools
logs=$ROOT/$RINGLM_BUILD/test-logs
mkdir -p "$logs" "$MODELS"
limit=${RINGLM_TEST_TIMEOUT:-900}

[ -x "$RINGLM" ] || { echo "run.sh: $RINGLM not built"; echo "0 passed, 1 failed"; exit 1; }

tests=()
for f in "$UNIT"/*; do [ -x "$f" ] && tests+=("$f"); done
for f in tests/t_*.sh; do tests+=("$ROOT/$f"); done

pass=0; fail=0; failed=()
for t in "${tests[@]}"; do
    name=$(basename "$t" .sh)
    if [ $# -gt 0 ]; then
        # a pattern matches names holding it; =NAME matches that name only
        want=0; for p in "$@"; do
            if [[ $p == =* ]]; then [[ $name == "${p#=}" ]] && want=1; else [[ $name == *"$p"* ]] && want=1; fi
        done
        [ $want = 1 ] || continue
    fi
    start=$(date +%s.%N)
    timeout --kill-after=10 "$limit" "$t" >"$logs/$name.log" 2>&1
    rc=$?
    secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    if [ $rc = 0 ]; then
        pass=$((pass + 1)); printf 'ok    %-28s %6ss\n' "$name" "$secs"
    else
        fail=$((fail + 1)); failed+=("$name")
        [ $rc = 124 ] && why="timed out after ${limit}s" || why="exit $rc"
        printf 'FAIL  %-28s %6ss (%s)\n' "$name" "$secs" "$why"
        sed 's/^/      | /' "$logs/$name.log" | tail -40
    fi
done
[ $fail = 0 ] || echo "failed: ${failed[*]}"
echo "$pass passed, $fail failed"
[ $fail = 0 ]
