#!/usr/bin/env bash
# run --ring orders its ring by delays the nodes measure (issue #21): three nodes, each behind a relay that
# delays every message to it by D (0, 25, 25 ms). A message into node i costs D_i, and the result comes back
# from the last node through its relay too, so a traversal costs D_first + D_second + 2 D_last: ring.conf's
# order (the 0 ms node first) takes 75 ms, the best (it last) 50 ms. The coordinator must measure that,
# reorder, say so, predict decode from the measured hops, and produce the same tokens as ring.conf's order
# and one machine; --keep-order keeps ring.conf's. The nodes answer probes only from peers the coordinator
# named (PEERS); a node that cannot be probed leaves ring.conf's order, saying why; malformed timed frames in
# a READY are dropped, not predicted from.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ring_lib.sh"

mkdir -p "$RING/models"
m=$(model small-f32 small f32)
ln -sf "$m" "$RING/models/small.gguf"
ring_keys 3
for i in 1 2 3; do ring_start $i "$RING/models" || exit 1; done
K=(--key "$RING/coord.key")
RPID=()
relay() { # relay I MS: node I behind a relay; sets RP
    local log=$WORK/relay$1.log
    "$RINGLM" relay --listen 127.0.0.1:0 --to "127.0.0.1:${RING_PORT[$1]}" --delay-ms "$2" 2>"$log" &
    RPID+=($!)
    for _ in $(seq 100); do grep -q '^relay: listening on' "$log" && break; sleep 0.05; done
    RP=$(sed -n 's/^relay: listening on 127\.0\.0\.1:\([0-9]*\) -> .*/\1/p' "$log")
}
: >"$WORK/ring.conf"
for c in "1 0" "2 25" "3 25"; do
    read -r i ms <<<"$c"
    relay "$i" "$ms"
    echo "127.0.0.1:$RP $(cat "$RING/n$i.pub")" >>"$WORK/ring.conf"
    ADDR[$i]=127.0.0.1:$RP
done
trap 'kill "${RPID[@]}" 2>/dev/null; ring_stop; rm -rf "$WORK"' EXIT

A23="${ADDR[2]} ${ADDR[3]}|${ADDR[3]} ${ADDR[2]}" # (the two 25 ms nodes tie: either may go first)
p=5,17,99,123,7,300,41,8
"$RINGLM" run -m "$m" --tokens "$p" -n 12 --temp 0 --ignore-eos --ids >"$WORK/local.ids" 2>/dev/null
run_ring() { "$RINGLM" run -m "$m" --tokens "$p" -n 12 --temp 0 --ignore-eos --ids --ring "$WORK/ring.conf" "${K[@]}" "$@"; }
rc=0; run_ring --metrics-json "$WORK/m.json" >"$WORK/ring.ids" 2>"$WORK/ring.err" || rc=$?
check "a ring in a poor order runs" test $rc = 0
check "... reordered: the 0 ms node last, the measured round trip and ring.conf's said" grep -Eq \
    "^ring order \(delays measured; round trip [0-9.]+ ms\): ($A23) ${ADDR[1]}$" "$WORK/ring.err"
check "... saying what ring.conf's order costs, and how to keep it" grep -Eq \
    "reordered: ring.conf's order takes [0-9.]+ ms; --keep-order keeps it" "$WORK/ring.err"
check "... the plan's stage 0 is the first node of the new order" grep -Eq "^ +0 +(${ADDR[2]}|${ADDR[3]}) " "$WORK/ring.err"
check "... and the plan uses every node" sh -c '! grep -q "^not used" "$1"' _ "$WORK/ring.err"
check_same "... the same greedy tokens as one machine" "$WORK/local.ids" "$WORK/ring.ids"
check "... the prediction printed at start" grep -Eq "^predicted \(ringlm plan's model, docs/plan.md\): decode [0-9.]+ tok/s greedy = 1 / \(hops [0-9.]+ ms measured" "$WORK/ring.err"
check "... and next to what ran: decode" grep -Eq "^decode: [0-9.]+ tok/s greedy; the plan predicted [0-9.]+ \([-+][0-9]+%\)$" "$WORK/ring.err"
check "... and time to first token" grep -Eq "^time to first token: [0-9.]+ s; the plan predicted [0-9.]+ \([-+][0-9]+%\)$" "$WORK/ring.err"
check "... the nodes measured their FLOPs at start" grep -Eq "ready: .* [0-9.]+ TFLOPS matrix-matrix" "$RING/n1.log"
check "... each node timed its stage at ASSIGN (one-token frames and a chunk)" grep -Eq \
    "stage timed: a 1-token frame [0-9.]+ / [0-9.]+ ms, [0-9]+ tokens [0-9.]+ ms" "$RING/n1.log"
check "... and the prediction from those frames printed once loaded" grep -Eq \
    "^predicted from the stages' own timed frames: decode [0-9.]+ tok/s greedy = 1 / \(hops [0-9.]+ ms \+ compute [0-9.]+ ms\)$" "$WORK/ring.err"
# The relays impose 50 ms a traversal in the best order (loopback adds little): the measured hops say so.
check "... the measured hops are the relays' (50 ms, plus loopback)" python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))["ring"]
assert r["delays_measured"] is True, r
h = r["predicted"]["hops_ms"]
assert 49 <= h <= 80, h
print(h)' "$WORK/m.json"
rc=0; run_ring --keep-order >"$WORK/keep.ids" 2>"$WORK/keep.err" || rc=$?
check "--keep-order keeps ring.conf's order" test $rc = 0
check "... no delays measured, no reorder" sh -c '! grep -q "^ring order" "$1" && grep -Eq "^ +0 +$2 " "$1"' _ "$WORK/keep.err" "${ADDR[1]}"
check_same "... the same tokens" "$WORK/local.ids" "$WORK/keep.ids"
"$RINGLM" plan -m "$m" --ring "$WORK/ring.conf" "${K[@]}" 2>"$WORK/plan.err" >/dev/null
check "plan --ring shows the order run would take" grep -Eq "^ring order \(delays measured; .*\): ($A23) ${ADDR[1]}$" "$WORK/plan.err"
# Equal delays: nothing to gain, ring.conf's order kept (noise must not shuffle a ring).
ring_conf "$WORK/flat.conf" 3 1 2
check "a ring whose orders are equal keeps ring.conf's" sh -c '"$@" 2>"$0.err" >/dev/null && grep -Eq "^ring order \(delays measured; round trip [0-9.]+ ms, ring.conf.s\):" "$0.err" && grep -Eq "^ +0 +127.0.0.1:'"${RING_PORT[3]}"' " "$0.err"' \
    "$WORK/flat" "$RINGLM" run -m "$m" --tokens "$p" -n 2 --temp 0 --ring "$WORK/flat.conf" "${K[@]}"
# A node that cannot be probed (one that knows no PEERS: the test build's "noprobe"): ring.conf's order,
# saying why, and the ring still runs.
ADV=$ROOT/build/adv/ringlm
[ -x "$ADV" ] || { echo "not ok - $ADV missing (make adversary)"; exit 1; }
kill "${RING_PID[3]}"; wait "${RING_PID[3]}" 2>/dev/null
RING_BIN=$ADV ring_start 3 "$RING/models" --misbehave noprobe || exit 1
rc=0; run_ring >"$WORK/np.ids" 2>"$WORK/np.err" || rc=$?
check "a node that cannot be probed: the ring runs in ring.conf's order" test $rc = 0
check "... saying why" grep -Eq "^ring order: ring.conf's \(the delays could not be measured: node 127.0.0.1:[0-9]+: unexpected PEERS frame\)" "$WORK/np.err"
check_same "... the same tokens" "$WORK/local.ids" "$WORK/np.ids"
# Nodes whose READY times a frame at -1 s (the test build's "badsteps"): the coordinator drops a node's timed
# frames, all of them, when one is malformed (a prediction from half a list could mislead), and with no
# stage's frames left predicts nothing from them (the honest rings above did); the ring runs.
for i in 2 3; do
    kill "${RING_PID[$i]}"; wait "${RING_PID[$i]}" 2>/dev/null
    RING_BIN=$ADV ring_start $i "$RING/models" --misbehave badsteps || exit 1
done
ring_conf "$WORK/bad.conf" 2 3
rc=0; "$RINGLM" run -m "$m" --tokens "$p" -n 12 --temp 0 --ignore-eos --ids --ring "$WORK/bad.conf" "${K[@]}" \
    >"$WORK/bs.ids" 2>"$WORK/bs.err" || rc=$?
check "nodes whose READY has a malformed timed frame: the ring runs" test $rc = 0
check "... they did time their stages" sh -c 'grep -q "stage timed: a 1-token frame" "$1" && grep -q "stage timed: a 1-token frame" "$2"' \
    _ "$RING/n2.log" "$RING/n3.log"
check "... the coordinator measured the delays" grep -Eq "^ring order \(delays measured" "$WORK/bs.err"
check "... but no prediction comes from their frames" sh -c '! grep -q "^predicted from the stages" "$1"' _ "$WORK/bs.err"
check_same "... the same tokens" "$WORK/local.ids" "$WORK/bs.ids"
# (Malformed PEERS and PROBE, a PROBE_PING from a key not named, an absent peer: tests/tools/ring_bad_frames.c.)
finish
