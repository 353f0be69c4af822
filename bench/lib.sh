# bench/lib.sh - the process harness the bench scripts share: one copy of each helper that starts, waits for
# and stops the processes of a benchmark (nodes, servers, relays), and of the small helpers every script used
# to write again. Sourced, not run: a script does `cd` to the repository root, then `. bench/lib.sh`.
#
#   usage                      print the script's header comment (its --help)
#   die MSG...                 "NAME: MSG" on stderr, exit 1 (NAME: the script's file name without .sh)
#   median X...                the median of the numbers
#   seeded_ids N [SEED]        N comma-separated token ids below $V - 256 (SEED 7): the scripts' prompts
#   positive_ints VAR:OPTION...   die unless each VAR is a positive integer (named --OPTION in the message)
#   need_tools CMD...          die unless each command is on PATH
#   need_subcommands SUB...    die unless $RINGLM has each subcommand
#   free_port                  a free TCP port on 127.0.0.1
#   sig_group SIG PID          SIG to PID's process group if PID leads one (a command under `timeout`), else PID
#   stop_pids PID...           TERM, wait up to $STOP_WAIT_S seconds (default 5), then KILL; reaps them
#   harness_traps              EXIT/INT/TERM traps: stop $fg_pid and $pids, keep $work on failure or --keep
#   attempt OUT ERR CMD...     CMD under `timeout $timeout_s`, in the background, waited for; its status
#   bounded WHAT OUT ERR CMD...   attempt, and die naming WHAT on failure
#   wait_log FILE PATTERN PID SECONDS   until FILE has PATTERN; fails if PID exits first or time runs out
#   wait_health PORT PID SECONDS        until GET http://127.0.0.1:PORT/health answers 200; likewise
#   start_nodes N THREADS SECONDS [ARGS...]   coord.key and N `ringlm node`s on loopback, ring.conf; ready
#   nodes_idle                 wait (up to 60 s) until the nodes' CPU time stops growing
#   nodes_alive                every node process still runs
#   start_relay NAME TARGET DELAY   a `ringlm relay` in front of TARGET; sets RELAY_ADDR and RELAY_PID
#
# Globals a script sets before using them: work (its work folder), RINGLM (the binary), pids (an array: every
# background process to stop on exit), fg_pid (the run in the foreground, empty when none), life (the hard
# lifetime, in seconds, of background processes, should the script die without its trap; unset or empty:
# none), timeout_s (attempt's limit per run), keep (1: keep $work), V (the model's vocabulary size).
# start_nodes sets node_pids and node_addr (node i at index i - 1); nodes_idle and nodes_alive read node_pids.

BENCH_NAME=$(basename "$0" .sh)

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

die() { echo "$BENCH_NAME: $*" >&2; exit 1; }

median() { printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

# seeded_ids N [SEED]: a linear congruential generator's ids, the same on every machine; no trailing newline.
seeded_ids() {
    awk -v n="$1" -v v="$((V - 256))" -v s="${2:-7}" 'BEGIN { x = s; for (i = 0; i < n; i++) {
        x = (x * 1103515245 + 12345) % 2147483648; printf "%s%d", (i ? "," : ""), int(x / 65536) % v } }'
}

# positive_ints VAR:OPTION...: dies unless every variable VAR holds a positive integer (the message names --OPTION).
positive_ints() {
    local v_ n_
    for v_ in "$@"; do
        n_=${v_%:*}
        [[ ${!n_} =~ ^[1-9][0-9]*$ ]] || die "--${v_#*:} must be a positive integer, got '${!n_}'"
    done
}
# need_tools CMD...: dies unless every command is on PATH; need_subcommands SUB...: unless $RINGLM has each.
need_tools() { local t; for t in "$@"; do command -v "$t" >/dev/null || die "needs $t (scripts/install-deps.sh)"; done; }
need_subcommands() {
    local s
    for s in "$@"; do "$RINGLM" "$s" --help >/dev/null 2>&1 || die "this ringlm has no '$s' command"; done
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# Each background command runs under `timeout`, which makes itself the leader of its own process group;
# signals go to that group, so the command under it gets them too (also SIGKILL, which timeout cannot pass on).
sig_group() { # SIG PID
    if [ "$(ps -o pgid= -p "$2" 2>/dev/null | tr -d ' ')" = "$2" ]; then kill "-$1" -- "-$2" 2>/dev/null || true
    else kill "-$1" "$2" 2>/dev/null || true; fi
}
stop_pids() { # PID... : TERM, wait up to $STOP_WAIT_S s (default 5), then KILL
    local p left
    for p in "$@"; do sig_group TERM "$p"; done
    for _ in $(seq $((${STOP_WAIT_S:-5} * 10))); do
        left=0
        for p in "$@"; do kill -0 "$p" 2>/dev/null && left=1; done
        [ $left = 0 ] && break
        sleep 0.1
    done
    for p in "$@"; do kill -0 "$p" 2>/dev/null && sig_group KILL "$p"; done
    for p in "$@"; do wait "$p" 2>/dev/null || true; done
}

# harness_traps: on exit every process started here is stopped; $work is removed, unless the script fails
# or $keep is 1 (then its path is printed). INT and TERM exit 130 and 143 through the same trap.
harness_cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    [ -n "${fg_pid:-}" ] && stop_pids "$fg_pid"
    [ ${#pids[@]} -gt 0 ] && stop_pids "${pids[@]}"
    if [ $rc != 0 ] || [ "${keep:-0}" = 1 ]; then
        echo "$BENCH_NAME: logs kept in $work" >&2
    else
        rm -rf "$work"
    fi
    exit $rc
}
harness_traps() {
    trap harness_cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
}

# attempt OUT ERR CMD...: runs CMD (stdout to OUT, stderr to ERR) with the per-run timeout and returns its
# status (124/137: timed out). CMD runs in the background and is waited for, so that a signal to this
# script is handled at once (bash runs traps only between foreground commands) and the trap stops CMD too.
attempt() {
    local o=$1 e=$2 rc=0; shift 2
    timeout -k 10 "$timeout_s" "$@" >"$o" 2>"$e" &
    fg_pid=$!
    wait "$fg_pid" || rc=$?
    fg_pid=
    return $rc
}
# bounded WHAT OUT ERR CMD...: attempt, and end the script on failure with a message naming WHAT.
bounded() {
    local what=$1 rc=0; shift
    attempt "$@" || rc=$?
    [ $rc = 0 ] && return 0
    tail -20 "$2" >&2
    if [ $rc = 124 ] || [ $rc = 137 ]; then die "$what took longer than --timeout $timeout_s s (logs in $work)"; fi
    die "$what failed (exit $rc; logs in $work)"
}

# wait_log FILE PATTERN PID SECONDS: until FILE has PATTERN; fails if PID exits first.
wait_log() {
    local i
    for i in $(seq $(($4 * 20))); do
        grep -aq "$2" "$1" 2>/dev/null && return 0
        kill -0 "$3" 2>/dev/null || return 1
        sleep 0.05
    done
    return 1
}
# wait_health PORT PID SECONDS: until GET /health answers 200; fails if PID exits first.
wait_health() {
    local i
    for i in $(seq $(($3 * 10))); do
        curl -sf "http://127.0.0.1:$1/health" >/dev/null 2>&1 && return 0
        kill -0 "$2" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}

# start_nodes N THREADS SECONDS [ARGS...]: the coordinator's key ($work/coord.key, .pub) and N `ringlm node`s
# on free loopback ports, node i with key $work/ni.key, log $work/nodei.log and cache $work/cachei, allowing
# the coordinator, serving the models in $work/models, with THREADS threads and ARGS; each under
# `timeout -k 5 $life` when $life is set. Their pids are added to pids and set in node_pids, their addresses
# in node_addr, and $work/ring.conf lists them in order. Returns when every node is ready; dies (printing
# the node's log) if one exits first or is not ready within SECONDS.
start_nodes() {
    local n=$1 t=$2 secs=$3 i port wrap=(); shift 3
    [ -z "${life:-}" ] || wrap=(timeout -k 5 "$life")
    "$RINGLM" keygen -o "$work/coord.key" >"$work/coord.pub"
    node_pids=() node_addr=()
    : >"$work/ring.conf"
    for i in $(seq "$n"); do
        "$RINGLM" keygen -o "$work/n$i.key" >"$work/n$i.pub"
        port=$(free_port)
        "${wrap[@]}" "$RINGLM" node --listen "127.0.0.1:$port" --key "$work/n$i.key" --allow "$(cat "$work/coord.pub")" \
            --models "$work/models" --threads "$t" --cache "$work/cache$i" "$@" >"$work/node$i.log" 2>&1 &
        pids+=($!) node_pids+=($!)
        node_addr+=("127.0.0.1:$port")
        echo "127.0.0.1:$port $(cat "$work/n$i.pub")" >>"$work/ring.conf"
    done
    for i in $(seq "$n"); do
        wait_log "$work/node$i.log" "ready:" "${node_pids[$((i - 1))]}" "$secs" \
            || { cat "$work/node$i.log" >&2; die "ringlm node $i did not start"; }
    done
}
# nodes_idle: after a failed run the nodes may still be working through frames the coordinator left
# behind; wait (up to 60 s) until their CPU time stops growing.
nodes_idle() {
    local kids prev cur p
    kids=$(for p in "${node_pids[@]}"; do pgrep -P "$p" || true; done)
    prev=-1
    for _ in $(seq 120); do
        cur=$(for k in $kids; do awk '{ print $14 + $15 }' "/proc/$k/stat" 2>/dev/null; done | awk '{ s += $1 } END { print s + 0 }')
        [ "$cur" = "$prev" ] && return 0
        prev=$cur
        sleep 0.5
    done
}
# nodes_alive: every node process still runs (a failed run must not hide a dead node)
nodes_alive() {
    local p
    for p in "${node_pids[@]}"; do kill -0 "$p" 2>/dev/null || return 1; done
}
# start_relay NAME TARGET DELAY: a relay in front of TARGET (its log $work/relay-NAME.log), added to pids;
# sets RELAY_ADDR and RELAY_PID.
start_relay() {
    local log=$work/relay-$1.log
    timeout -k 5 $life "$RINGLM" relay --listen 127.0.0.1:0 --to "$2" --delay-ms "$3" 2>"$log" &
    RELAY_PID=$!
    pids+=("$RELAY_PID")
    wait_log "$log" "^relay: listening on" "$RELAY_PID" 10 || { cat "$log" >&2; die "relay $1 did not start"; }
    RELAY_ADDR=$(sed -n 's/^relay: listening on \([^ ]*\) .*/\1/p' "$log" | head -1)
}
