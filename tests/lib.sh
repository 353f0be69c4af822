# tests/lib.sh - helpers for end-to-end test scripts. Source it; it sets `set -euo pipefail`.
#
#   check DESC CMD...        run CMD; count a pass if it exits 0, else a failure (the script goes on)
#   check_fails DESC PATTERN CMD...   CMD must exit 1 (not crash) and print PATTERN (grep -E) on stderr
#   check_eq DESC A B        A = B, and neither is empty (check_ne: A != B, neither empty)
#   check_same DESC FILE_A FILE_B     the files hold the same bytes, and neither is missing or empty
#   check_differ DESC FILE_A FILE_B   the files differ, and neither is missing or empty
#   same_files A B / differ_files A B the same as commands (exit 1, why on stderr): for loops that count
#                            and for `bash -c "..."` strings (exported)
#   skip DESC                a check this machine cannot make: counted apart, never as a pass
#   model NAME CONFIG TYPE [SEED]     path of a synthesized fixture, made once and cached in $MODELS
#   toks SEED VOCAB N        N comma-separated token ids below VOCAB from a seeded LCG (no $RANDOM)
#   finish                   prints the counts and exits non-zero if anything failed
set -euo pipefail
: "${RINGLM:?run through tests/run.sh}"
# The CPU unless a test names a device: the suite compares against llama.cpp's CPU build bit for bit, and a
# machine with a GPU would otherwise compute on it by default (docs/devices.md). tests/t_gpu.sh names its own.
export RINGLM_DEVICE=${RINGLM_TEST_DEVICE:-CPU}
T_PASS=0
T_FAIL=0
T_SKIP=0
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

# check_eq DESC A B: A and B are usually two commands' captured outputs, and a command that failed captures
# "": two failures would agree ("" = "") and pass, and with check_ne one failure would differ from the other's
# output and pass. So an empty value fails, named; only two values that are both there are compared.
check_eq() { check_cmp = "$@"; }
check_ne() { check_cmp != "$@"; }
check_cmp() {
    local op=$1 desc=$2 a=$3 b=$4 why=""
    if [ -z "$a" ] && [ -z "$b" ]; then why="both values are empty"
    elif [ -z "$a" ]; then why="the first value is empty"
    elif [ -z "$b" ]; then why="the second value is empty"
    elif ! [ "$a" "$op" "$b" ]; then [ "$op" = = ] && why="the values differ" || why="the values are equal"
    fi
    if [ -z "$why" ]; then
        T_PASS=$((T_PASS + 1)); echo "ok - $desc"
    else
        T_FAIL=$((T_FAIL + 1)); echo "not ok - $desc ($why)"
        [ -z "$a" ] || { echo "    first:"; printf '%s\n' "${a:0:300}" | sed 's/^/        /'; }
        [ -z "$b" ] || { echo "    second:"; printf '%s\n' "${b:0:300}" | sed 's/^/        /'; }
    fi
}

# check_same DESC FILE_A FILE_B: the files are usually two runs' outputs (`cmd >file`), and a run that failed
# leaves an empty file (or none, or an -o it never wrote): two failures would compare equal and pass, and with
# check_differ one failure would differ from the other's output and pass. So a missing or empty file fails,
# named; only two files that both hold something are compared (cmp), and the first differing lines are shown.
check_same() { check_files same_files "$@"; }
check_differ() { check_files differ_files "$@"; }
check_files() {
    local pred=$1 desc=$2; shift 2
    if "$pred" "$@" >"$WORK/out" 2>&1; then
        T_PASS=$((T_PASS + 1)); echo "ok - $desc"
    else
        T_FAIL=$((T_FAIL + 1)); echo "not ok - $desc ($(head -1 "$WORK/out"))"
        tail -n +2 "$WORK/out" | head -20 | sed 's/^/    /'
    fi
}
# same_files A B / differ_files A B: exit 0 when both files hold something and they are the same (differ);
# else exit 1 with the reason on stderr's first line (and, for files that differ, their first differing lines).
same_files() { files_cmp same "$@"; }
differ_files() { files_cmp differ "$@"; }
files_cmp() {
    local want=$1 a=$2 b=$3 sa="" sb=""
    [ -e "$a" ] || sa=missing; [ -n "$sa" ] || [ -s "$a" ] || sa=empty
    [ -e "$b" ] || sb=missing; [ -n "$sb" ] || [ -s "$b" ] || sb=empty
    if [ -n "$sa" ] && [ "$sa" = "$sb" ]; then echo "both files are $sa: $a, $b" >&2; return 1
    elif [ -n "$sa" ] && [ -n "$sb" ]; then echo "the first file is $sa, the second $sb: $a, $b" >&2; return 1
    elif [ -n "$sa" ]; then echo "the first file is $sa: $a" >&2; return 1
    elif [ -n "$sb" ]; then echo "the second file is $sb: $b" >&2; return 1
    fi
    if cmp -s -- "$a" "$b"; then
        [ "$want" = same ] && return 0
        echo "the files are the same ($(wc -c <"$a") bytes): $a, $b" >&2; return 1
    fi
    [ "$want" = differ ] && return 0
    { echo "the files differ: $(cmp -- "$a" "$b" 2>&1 | head -1)"; diff -- "$a" "$b" | head -12; } >&2
    return 1
}
export -f same_files differ_files files_cmp

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

# skip DESC: TAP's "ok - # SKIP DESC", counted in ", N skipped" (what was not tested is said, not passed).
skip() {
    T_SKIP=$((T_SKIP + 1)); echo "ok - # SKIP $1"
}

toks() { awk -v s="$1" -v v="$2" -v n="$3" 'BEGIN { x = s; for (i = 0; i < n; i++) {
             x = (x * 1103515245 + 12345) % 2147483648; printf "%s%d", (i ? "," : ""), int(x / 65536) % v } }'; }

finish() {
    if [ "$T_SKIP" -gt 0 ]; then echo "$T_PASS passed, $T_FAIL failed, $T_SKIP skipped"
    else echo "$T_PASS passed, $T_FAIL failed"; fi
    [ $T_FAIL = 0 ]
}
