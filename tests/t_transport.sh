#!/usr/bin/env bash
# The transport under attack: thousands of mutated frames from an authenticated peer, mutated ZeroMQ/CURVE
# handshakes from anyone, and frames tampered with on the wire between coordinator and node. A node never
# crashes or stops answering (under ASan in CI's second pass); tampered frames are rejected by CURVE's
# authentication, so a run through a tampering link fails naming the node, never with wrong output.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ring_lib.sh"
mkdir -p "$RING/models"
ln -sf "$(model small-f32 small f32)" "$RING/models/small-f32.gguf"
m=$RING/models/small-f32.gguf
ring_keys 3
for i in 1 2 3; do ring_start $i "$RING/models" --cache "$WORK/cache$i" || exit 1; done
K=(--key "$RING/coord.key")
ring_conf "$WORK/ring.conf" 1 2
"$RINGLM" run -m "$m" -p "once upon a time" -n 12 --temp 0 --ignore-eos --ids >"$WORK/local.ids" 2>/dev/null
ring_ok() { # the ring still gives one machine's tokens
    "$RINGLM" run -m "$m" -p "once upon a time" -n 12 --temp 0 --ignore-eos --ids --ring "$WORK/ring.conf" "${K[@]}" \
        >"$WORK/ring.ids" 2>"$WORK/ring.err" && same_files "$WORK/local.ids" "$WORK/ring.ids"
}
check "the ring works before" ring_ok

# --- Mutated frames from an authenticated coordinator (tests/tools/ring_bad_frames.c --fuzz), to node 3,
# which nothing was assigned yet (the tool's fixed checks start with FORWARD before ASSIGN).
# A fixed seed by default, so that CI judges every commit on the same frames (a clock seed found a crash in
# CI that no run here had met: the seed below, now a regression check). To explore, run with
# RINGLM_FUZZ_SEED=random, many times, under the sanitizer build:
#   for i in $(seq 20); do RINGLM_FUZZ_SEED=random RINGLM_BUILD=build/asan tests/run.sh =t_transport || break; done
SEED=${RINGLM_FUZZ_SEED:-1796450711}
[ "$SEED" = random ] && SEED=$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')
echo "# fuzz seed $SEED (RINGLM_FUZZ_SEED=$SEED reproduces it)"
check "3000 mutated frames of every type: the node answers every liveness check" \
    "$TOOLS/ring_bad_frames" --node "127.0.0.1:${RING_PORT[3]}" --node-key "$(cat "$RING/n3.pub")" --key "$RING/coord.key" \
    --model "$m" --fuzz 3000 --seed "$SEED"
grep -E "fuzz:" "$WORK/out" | sed 's/^/    /'
check "node 3 is still running" kill -0 "${RING_PID[3]}"

# --- Mutated handshakes from anyone: ZMTP greetings and CURVE HELLOs with bytes flipped, cut or grown.
python3 - "${RING_PORT[1]}" "$SEED" >"$WORK/hs.out" <<'PY'
import random, socket, sys
port, seed = int(sys.argv[1]), int(sys.argv[2])
rng = random.Random(seed)
greeting = bytearray(b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x00" + b"CURVE".ljust(20, b"\x00") + b"\x00" + b"\x00" * 31)
hello = bytearray(b"\x04\xc8\x05HELLO\x01\x00" + b"\x00" * 72 + bytes(rng.randrange(256) for _ in range(32 + 8 + 80)))
n = 0
for i in range(400):
    msg = bytearray(greeting + hello)
    for _ in range(rng.randint(1, 6)):
        r = rng.random()
        if r < 0.5:
            if msg: k = rng.randrange(len(msg)); msg[k] ^= rng.randrange(1, 256)
        elif r < 0.7:
            msg = msg[: rng.randrange(len(msg) + 1)]
        elif r < 0.85:
            msg += bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300)))
        elif len(msg) > 64:
            msg[10 + rng.randrange(54)] = rng.randrange(256)
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=2)
        s.sendall(msg)
        if rng.random() < 0.3:
            s.settimeout(0.05)
            try: s.recv(4096)
            except OSError: pass
        s.close(); n += 1
    except OSError:
        pass
print(f"{n} mutated handshakes sent")
PY
check "400 mutated handshakes: sent ($(cat "$WORK/hs.out"))" grep -q "handshakes sent" "$WORK/hs.out"
check "node 1 is still running after them" kill -0 "${RING_PID[1]}"
check "and the ring still gives one machine's tokens" ring_ok

# --- Tampering on the wire: a relay that flips one byte of the stream after the handshake.
# tamper DIR: a proxy in front of node 1 that flips a byte the coordinator sends (up) or receives (down)
# once N bytes have passed on each connection; a ring.conf that reaches node 1 through it.
tamper() {
    local dir=$1 after=$2
    local port; port=$(ring_free_port)
    python3 - "$port" "${RING_PORT[1]}" "$dir" "$after" >"$WORK/proxy.log" 2>&1 <<'PY' &
import select, socket, sys
lport, nport, direction, after = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); ls.bind(("127.0.0.1", lport)); ls.listen(8)
print("listening", flush=True)
conns, seen, flipped = [], {}, set()  # flipped: the connections tampered with (each once: the
# coordinator opens its link again once it knows the round trip, and the new one must be tampered with too)
while True:
    rs, _, _ = select.select([ls] + [c for pair in conns for c in pair], [], [], 1)
    for s in rs:
        if s is ls:
            a, _ = ls.accept(); b = socket.create_connection(("127.0.0.1", nport)); conns.append((a, b)); seen[a] = 0; continue
        pair = next((p for p in conns if s in p), None)
        if pair is None: continue  # its pair was closed earlier in this same round
        other = pair[1] if s is pair[0] else pair[0]
        try: data = bytearray(s.recv(65536))
        except OSError: data = b""
        if not data:
            for c in pair: c.close()
            conns.remove(pair); continue
        up = s is pair[0]
        if (direction == "up") == up and id(pair) not in flipped:
            start = seen.get(s, 0); seen[s] = start + len(data)
            if start + len(data) > after:
                k = max(0, after - start); data[k] ^= 0x20; flipped.add(id(pair))
                print("flipped a byte", flush=True)
        try: other.sendall(data)
        except OSError: pass
PY
    TAMPER_PID=$!
    for _ in $(seq 50); do grep -q listening "$WORK/proxy.log" 2>/dev/null && break; sleep 0.1; done
    { echo "127.0.0.1:$port $(cat "$RING/n1.pub")"; echo "127.0.0.1:${RING_PORT[2]} $(cat "$RING/n2.pub")"; } >"$WORK/tamper.conf"
    TAMPER_ADDR=127.0.0.1:$port
}
for t in "up 2000" "down 700"; do
    read -r dir after <<<"$t"
    tamper "$dir" "$after"
    rc=0
    "$RINGLM" run -m "$m" -p "once upon a time" -n 12 --temp 0 --ignore-eos --ids --ring "$WORK/tamper.conf" "${K[@]}" \
        >"$WORK/t.ids" 2>"$WORK/t.err" || rc=$?
    check "tampered stream ($dir): the proxy flipped a byte" grep -q "flipped a byte" "$WORK/proxy.log"
    check "tampered stream ($dir): the run fails (exit 1) naming the node, or gives the right tokens" bash -c \
        "{ [ $rc = 1 ] && grep -q '$TAMPER_ADDR' '$WORK/t.err'; } || { [ $rc = 0 ] && same_files '$WORK/local.ids' '$WORK/t.ids'; }"
    check "tampered stream ($dir): never wrong tokens" bash -c "[ $rc != 0 ] || same_files '$WORK/local.ids' '$WORK/t.ids'"
    { grep -E "ringlm run:" "$WORK/t.err" || true; } | head -2 | sed 's/^/    /' # (none when the run passed)
    kill "$TAMPER_PID" 2>/dev/null || true; wait "$TAMPER_PID" 2>/dev/null || true
done
check "node 1 is still running after the tampering" kill -0 "${RING_PID[1]}"
check "and the ring still gives one machine's tokens" ring_ok

finish
