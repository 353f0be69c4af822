# tests/ring_lib.sh - start and stop local rings for tests. Source after lib.sh.
#
#   ring_keys N            coord.key + n1..nN.key in $WORK/ring (public keys in *.pub)
#   ring_start I MODELDIR [extra args]   start node I on a free port; waits until it is ready
#   ring_conf FILE I...    write a ring.conf listing nodes I...
#   ring_stop              stop every node started here
RING=$WORK/ring
mkdir -p "$RING"
declare -A RING_PID RING_PORT

ring_free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

ring_keys() {
    "$RINGLM" keygen -o "$RING/coord.key" >"$RING/coord.pub"
    for i in $(seq "$1"); do "$RINGLM" keygen -o "$RING/n$i.key" >"$RING/n$i.pub"; done
}

ring_start() {
    local i=$1 dir=$2; shift 2
    local port=${RING_PORT[$i]:-}
    [ -n "$port" ] || port=$(ring_free_port) # a restarted node keeps its address
    RING_PORT[$i]=$port
    # A cache of its own inside $WORK (a --cache in "$@" comes later and wins): no test leaves a
    # ~/.cache/ringlm/node-* folder behind.
    "${RING_BIN:-$RINGLM}" node --listen "127.0.0.1:$port" --key "$RING/n$i.key" --allow "$(cat "$RING/coord.pub")" \
        --models "$dir" --threads 1 --speed 10 --cache "$RING/node-cache$i" "$@" >"$RING/n$i.log" 2>&1 &   # fixed speed: stable plans
    RING_PID[$i]=$!
    for _ in $(seq 100); do
        grep -qs "ready:" "$RING/n$i.log" && return 0
        kill -0 "${RING_PID[$i]}" 2>/dev/null || break
        sleep 0.1
    done
    echo "node $i did not start:"; cat "$RING/n$i.log"
    return 1
}

ring_conf() {
    local f=$1; shift
    : >"$f"
    for i in "$@"; do echo "127.0.0.1:${RING_PORT[$i]} $(cat "$RING/n$i.pub")" >>"$f"; done
}

ring_stop() {
    # TERM, then KILL whoever still runs after 10 s: a node that does not stop must not hang the suite (a CI run
    # of t_recovery passed every check, then waited here until its time limit); such a node is named.
    local i
    # (|| true: under set -e a node already gone would end the loop, leaving the others running)
    for i in "${!RING_PID[@]}"; do kill "${RING_PID[$i]}" 2>/dev/null || true; done
    for _ in $(seq 100); do
        local left=0
        for i in "${!RING_PID[@]}"; do kill -0 "${RING_PID[$i]}" 2>/dev/null && left=1; done
        [ $left = 0 ] && break
        sleep 0.1
    done
    for i in "${!RING_PID[@]}"; do
        if kill -0 "${RING_PID[$i]}" 2>/dev/null; then
            echo "ring_stop: node $i (pid ${RING_PID[$i]}) did not stop on TERM in 10 s: killed" >&2
            kill -9 "${RING_PID[$i]}" 2>/dev/null || true
        fi
    done
    for i in "${!RING_PID[@]}"; do wait "${RING_PID[$i]}" 2>/dev/null || true; done
    RING_PID=()
}
trap 'ring_stop; rm -rf "$WORK"' EXIT
