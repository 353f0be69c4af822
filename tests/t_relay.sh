#!/usr/bin/env bash
# `ringlm relay`: bytes intact and in order, the added delay and the rate cap as measured, concurrent
# connections, an unreachable target, half-close, no CPU while idle, SIGTERM. python3 (standard library
# only) plays the servers and the clients on 127.0.0.1; every port is picked by the kernel (bind to port 0).
. "$(dirname "$0")/lib.sh"
PY=$WORK/relay_peer.py
cat >"$PY" <<'PYEOF'
# Echo/sink/generator servers and clients for tests/t_relay.sh (standard library only).
import hashlib, os, socket, sys, threading, time

def recv_all(s):
    parts = []
    while True:
        b = s.recv(1 << 16)
        if not b:
            return b"".join(parts)
        parts.append(b)

def recv_exact(s, n):
    buf = b""
    while len(buf) < n:
        b = s.recv(n - len(buf))
        if not b:
            raise SystemExit("EOF after %d of %d bytes" % (len(buf), n))
        buf += b
    return buf

def pattern(n):
    return hashlib.sha256(b"relay").digest() * (n // 32 + 1)

def echo_conn(c):
    with c:
        while True:
            b = c.recv(1 << 16)
            if not b:
                break
            c.sendall(b)
        c.shutdown(socket.SHUT_WR)      # pass the half-close on, then let the client close
        recv_all(c)

def sink_conn(c):
    with c:
        h, n = hashlib.sha256(), 0
        while True:
            b = c.recv(1 << 16)
            if not b:
                break
            h.update(b); n += len(b)
        c.sendall(b"got %d %s\n" % (n, h.hexdigest().encode()))

def gen_conn(c):
    with c:
        line = b""
        while not line.endswith(b"\n"):
            b = c.recv(64)
            if not b:
                return
            line += b
        n = int(line)
        c.sendall(pattern(n)[:n])

def serve_on(ls, fn):
    while True:
        c, _ = ls.accept()
        threading.Thread(target=fn, args=(c,), daemon=True).start()

def listener(port=0):
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", port))
    ls.listen(128)
    return ls

def connect(port):
    return socket.create_connection(("127.0.0.1", port), timeout=10)

def bulk(port, n):
    data = os.urandom(n)
    s = connect(port)
    def send():
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
    t = threading.Thread(target=send); t.start()
    got = recv_all(s); t.join(); s.close()
    if got != data:
        raise SystemExit("echoed %d bytes, sent %d; equal prefix %d" % (len(got), n,
                         next((i for i in range(min(n, len(got))) if got[i] != data[i]), min(n, len(got)))))

def main():
    mode, a = sys.argv[1], sys.argv[2:]
    if mode == "serve":
        ls = [listener() for _ in range(3)]
        for l, fn in zip(ls, (echo_conn, sink_conn, gen_conn)):
            threading.Thread(target=serve_on, args=(l, fn), daemon=True).start()
        with open(a[0] + ".tmp", "w") as f:
            f.write(" ".join(str(l.getsockname()[1]) for l in ls) + "\n")
        os.rename(a[0] + ".tmp", a[0])
        while True:
            time.sleep(3600)
    elif mode == "freeport":
        l = listener(); print(l.getsockname()[1]); l.close()
    elif mode == "bulk":                  # PORT NBYTES: random bytes through an echo server, compared
        t0 = time.perf_counter(); bulk(int(a[0]), int(a[1]))
        print("%d bytes echoed intact in %.3f s" % (int(a[1]), time.perf_counter() - t0))
    elif mode == "rtt":                   # PORT ROUNDS LO_MS HI_MS
        s = connect(int(a[0])); s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        lo, hi, ts = float(a[2]), float(a[3]), []
        for i in range(int(a[1])):
            msg = b"ping %10d\n" % i
            t0 = time.perf_counter(); s.sendall(msg)
            if recv_exact(s, len(msg)) != msg:
                raise SystemExit("echo differs")
            ts.append((time.perf_counter() - t0) * 1e3)
        s.close()
        print("rtt ms: " + " ".join("%.2f" % t for t in ts))
        if not all(lo <= t < hi for t in ts):
            raise SystemExit("want %g <= rtt < %g ms" % (lo, hi))
    elif mode in ("upload", "download"):  # PORT NBYTES LO_S HI_S (upload: sink server, download: gen server)
        port, n, lo, hi = int(a[0]), int(a[1]), float(a[2]), float(a[3])
        s = connect(port); t0 = time.perf_counter()
        if mode == "upload":
            s.sendall(os.urandom(n)); s.shutdown(socket.SHUT_WR)
            reply = recv_all(s)
            ok = reply.split()[:2] == [b"got", str(n).encode()]
        else:
            s.sendall(b"%d\n" % n)
            ok = recv_all(s) == pattern(n)[:n]
        dt = time.perf_counter() - t0; s.close()
        print("%s of %d bytes: %.3f s = %.2f Mbit/s" % (mode, n, dt, n * 8 / dt / 1e6))
        if not ok:
            raise SystemExit("wrong bytes")
        if not lo <= dt <= hi:
            raise SystemExit("want %g..%g s" % (lo, hi))
    elif mode == "concurrent":            # PORT N NBYTES
        errs = []
        def one():
            try:
                bulk(int(a[0]), int(a[2]))
            except BaseException as e:
                errs.append(repr(e))
        ts = [threading.Thread(target=one) for _ in range(int(a[1]))]
        t0 = time.perf_counter()
        for t in ts: t.start()
        for t in ts: t.join()
        print("%d connections in %.3f s, %d failed %s" % (len(ts), time.perf_counter() - t0, len(errs), errs[:3]))
        if errs:
            raise SystemExit(1)
    elif mode == "eof":                   # PORT MAX_S: the relay's target is down: clean EOF, soon
        s = connect(int(a[0])); s.settimeout(float(a[1])); t0 = time.perf_counter()
        try:
            b = s.recv(100)
        except socket.timeout:
            raise SystemExit("no EOF within %s s" % a[1])
        print("got %r after %.3f s" % (b, time.perf_counter() - t0))
        if b:
            raise SystemExit("want EOF")
    elif mode == "serve-then-echo":       # TARGET_PORT RELAY_PORT: the target comes up; the relay now works
        l = listener(int(a[0]))
        threading.Thread(target=serve_on, args=(l, echo_conn), daemon=True).start()
        bulk(int(a[1]), 1000)
        print("served")
    elif mode == "halfclose":             # PORT (a sink server): shut down writing, the reply still comes
        s = connect(int(a[0])); s.sendall(b"hello"); s.shutdown(socket.SHUT_WR)
        reply = recv_all(s); s.close()
        print("reply %r" % reply)
        if reply != b"got 5 %s\n" % hashlib.sha256(b"hello").hexdigest().encode():
            raise SystemExit("wrong reply")
    elif mode == "hold":                  # PORT SECONDS: an idle open connection
        s = connect(int(a[0])); s.sendall(b"x"); recv_exact(s, 1); time.sleep(float(a[1]))
    else:
        raise SystemExit("unknown mode " + mode)

main()
PYEOF

pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$WORK"' EXIT

python3 "$PY" serve "$WORK/ports" & pids+=($!)
for _ in $(seq 100); do [ -f "$WORK/ports" ] && break; sleep 0.05; done
read -r ECHO SINK GEN <"$WORK/ports"

# start_relay NAME ARGS...: a relay on a free port, waited for through its ready line; sets R_PORT, R_PID.
start_relay() {
    local log=$WORK/relay-$1.log; shift
    "$RINGLM" relay --listen 127.0.0.1:0 "$@" 2>"$log" &
    R_PID=$!; pids+=($R_PID)
    for _ in $(seq 100); do grep -q '^relay: listening on' "$log" && break; sleep 0.05; done
    R_PORT=$(sed -n 's/^relay: listening on 127\.0\.0\.1:\([0-9]*\) -> .*/\1/p' "$log")
    [ -n "$R_PORT" ] || { echo "relay did not start:"; cat "$log"; exit 1; }
}
# cpu_ticks PID: user + system time used so far, in clock ticks
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
# stops_on_term PID: SIGTERM, then the process must exit 0 within 1 s. (Polled, not watched from a
# background subshell: under set -e such a subshell can run the EXIT trap and delete $WORK.)
stops_on_term() {
    local pid=$1 rc=0
    kill -TERM "$pid"
    for _ in $(seq 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
    if kill -0 "$pid" 2>/dev/null; then echo "still running 1 s after SIGTERM"; kill -KILL "$pid"; return 1; fi
    wait "$pid" || rc=$?
    echo "exit $rc"; [ $rc = 0 ]
}

start_relay d30 --to "127.0.0.1:$ECHO" --delay-ms 30; D30=$R_PORT; D30_PID=$R_PID
start_relay sink --to "127.0.0.1:$SINK" --delay-ms 30; SINK30=$R_PORT
start_relay up8 --to "127.0.0.1:$SINK" --rate-mbit 8; UP8=$R_PORT; UP8_PID=$R_PID
start_relay down8 --to "127.0.0.1:$GEN" --rate-mbit 8; DOWN8=$R_PORT

check "5 MB of random bytes echo through intact and in order" python3 "$PY" bulk "$D30" 5000000
check "round trip through --delay-ms 30 is 60..90 ms" python3 "$PY" rtt "$D30" 10 60 90
check "2 MB up through --rate-mbit 8 takes about 2 s" python3 "$PY" upload "$UP8" 2000000 1.6 3
check "2 MB down through --rate-mbit 8 takes about 2 s" python3 "$PY" download "$DOWN8" 2000000 1.6 3
check "the rate-capped relay used little CPU (< 0.5 s)" test "$(cpu_ticks "$UP8_PID")" -lt 50
check "20 concurrent connections all echo intact" python3 "$PY" concurrent "$D30" 20 300000
check "half-close: the server sees EOF, its reply still arrives" python3 "$PY" halfclose "$SINK30"

# A target nobody listens on: each client gets a clean EOF at once; once the target is up, it works.
DOWN_PORT=$(python3 "$PY" freeport)
start_relay none --to "127.0.0.1:$DOWN_PORT"; NONE=$R_PORT; NONE_PID=$R_PID
check "unreachable target: the client sees EOF within 1 s" python3 "$PY" eof "$NONE" 1
check "unreachable target: again (the relay keeps running)" python3 "$PY" eof "$NONE" 1
check "the failure is logged" grep -q "cannot connect to 127.0.0.1:$DOWN_PORT: Connection refused" "$WORK/relay-none.log"
check "the target comes up: the same relay now forwards" python3 "$PY" serve-then-echo "$DOWN_PORT" "$NONE"

# An idle open connection must not cost CPU (no busy loop), and SIGTERM still stops the relay at once.
python3 "$PY" hold "$D30" 10 & HOLD=$!; pids+=($HOLD)
sleep 0.3
t0=$(cpu_ticks "$D30_PID"); sleep 1; t1=$(cpu_ticks "$D30_PID")
check "idle relay with an open connection uses no CPU ($((t1 - t0)) ticks in 1 s)" test $((t1 - t0)) -le 2
check "SIGTERM with a connection open: exit 0 within 1 s" stops_on_term "$D30_PID"
check "SIGTERM: exit 0 within 1 s" stops_on_term "$NONE_PID"
check_fails "bad --to" "want HOST:PORT" "$RINGLM" relay --listen 127.0.0.1:0 --to nocolon
check_fails "port in use" "cannot listen on 127.0.0.1:$UP8" "$RINGLM" relay --listen "127.0.0.1:$UP8" --to "127.0.0.1:$SINK"
finish
