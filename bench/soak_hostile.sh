#!/usr/bin/env bash
# Soak under hostility (issue #23): a 3-node loopback ring and `serve --ring --receipts`, for a bounded number
# of rounds. Each round sends good requests (greedy, checked against the first answer for the same prompt)
# while hostile traffic runs beside them: malformed JSON, bad Transfer-Encoding, invalid UTF-8 and NUL in
# fields, log injection, slowloris connections, raw garbage into every node's port, and a second
# coordinator with the same key (which must be refused). Then an idle gap longer than every timeout
# (--node-timeout, --header-timeout) and another good request. Every other round the coordinator is
# killed (SIGKILL) and restarted, and must get its nodes back.
#
#   bench/soak_hostile.sh [--rounds N] [--good N] [--model FILE]
# Writes bench/results/soak.json and soak.md. Goal: every good request answered 200 with the expected
# text, no node death, no server crash; the second coordinator refused every time.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
rounds=8 good=12 model=""
while [ $# -gt 0 ]; do
    case $1 in
        --rounds) rounds=$2; shift 2 ;; --good) good=$2; shift 2 ;; --model) model=$2; shift 2 ;;
        *) echo "soak_hostile: unknown option $1" >&2; exit 2 ;;
    esac
done
make -s ringlm
work=$(mktemp -d) RINGLM=./ringlm
node_pids=()
trap 'for p in "${node_pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; wait 2>/dev/null; rm -rf "$work"' EXIT
mkdir -p "$work/models" bench/results
if [ -z "$model" ]; then model=$work/tiny.gguf; ./ringlm synth --no-progress -o "$model" --config tiny --seed 1 >/dev/null 2>&1; fi
ln -s "$(realpath "$model")" "$work/models/m.gguf"
start_nodes 3 1 10 --speed 10
ports=("${node_addr[@]##*:}")

NODE_TIMEOUT=3 HEADER_TIMEOUT=2
python3 - "$work" "$rounds" "$good" "${ports[*]}" "$NODE_TIMEOUT" "$HEADER_TIMEOUT" <<'PY' >"$work/soak.json"
import json, os, random, signal, socket, subprocess, sys, threading, time
w, rounds, good, ports = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), [int(p) for p in sys.argv[4].split()]
node_timeout, header_timeout = float(sys.argv[5]), float(sys.argv[6])
rng = random.Random(23)
prompts = ["The capital of France is", "Once upon a time", "In the beginning", "Hello world", "A ring of nodes"]
expect = {}
c = dict(good_sent=0, good_ok=0, good_wrong_text=0, good_failed=0, hostile_sent=0, hostile_5xx=0,
         hostile_no_answer=0, slowloris_conns=0, garbage_to_nodes=0, second_coord=0, second_coord_refused=0,
         idle_gaps=0, coord_restarts=0, node_deaths=0, server_crashes=0)
failures = []
srv, srv_url, srv_log = None, None, open(os.path.join(w, "srv.log"), "ab")
def start_srv():
    global srv, srv_url
    srv = subprocess.Popen(["./ringlm", "serve", "-m", os.path.join(w, "models/m.gguf"), "--ring", os.path.join(w, "ring.conf"),
                            "--key", os.path.join(w, "coord.key"), "--receipts", os.path.join(w, "r.jsonl"), "--port", "0",
                            "--node-timeout", str(int(node_timeout)), "--header-timeout", str(int(header_timeout)),
                            "--parallel", "4"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    for line in srv.stderr:
        srv_log.write(line)
        if b"listening on http://" in line:
            srv_url = line.split(b"listening on ")[1].split()[0].decode()
            break
    threading.Thread(target=lambda: [srv_log.write(l) for l in srv.stderr], daemon=True).start()
    if srv_url is None or srv.poll() is not None:
        raise SystemExit("soak: the server did not start (see its log)")
def url():
    return srv_url
def hostport():
    h, p = url().split("//")[1].split(":")
    return h, int(p)
# Good clients at 127.0.0.1, hostile requests from 127.0.0.2, slow connections from 127.0.0.3: an attacker is
# another address (one address's connections are capped, --max-conn-per-ip).
def raw(data, t=10.0, src="127.0.0.1"):
    s = socket.socket()
    s.bind((src, 0))
    s.settimeout(t)
    try:
        s.connect(hostport())
        s.sendall(data)
        out = b""
        while True:
            b = s.recv(65536)
            if not b:
                break
            out += b
        return out
    except OSError:
        return b""
    finally:
        s.close()
def status(r):
    try:
        return int(r.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return -1
def post(body, extra=b"", src="127.0.0.1"):
    return raw(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n" +
               extra + b"Content-Length: %d\r\n\r\n" % len(body) + body, t=60, src=src)
def good_request():
    p = rng.choice(prompts)
    r = post(json.dumps({"prompt": p, "max_tokens": 16, "temperature": 0, "ignore_eos": True}).encode())
    c["good_sent"] += 1
    if status(r) != 200:
        c["good_failed"] += 1
        failures.append("good request: %d %s" % (status(r), r[-200:].decode("utf-8", "replace")))
        return
    text = json.loads(r.split(b"\r\n\r\n", 1)[1])["choices"][0]["text"]
    if expect.setdefault(p, text) != text:
        c["good_wrong_text"] += 1
        failures.append("good request: other text for %r" % p)
    else:
        c["good_ok"] += 1
hostile = [
    b'{"prompt": "x", "max_tokens": ',
    b'{"prompt":"a\\u0000bbbb","max_tokens":2}',
    b'{"model":"\xff\\n\\u001b[31mringlm serve: FORGED","prompt":"hi"}',
    b'{"messages":[{"role":"\xff","content":"hi"}]}',
    b'[1,2,3]',
    b'{"prompt":"hi","max_tokens":-5}',
    b'{"prompt":"hi","temperature":"hot"}',
]
def hostile_request():
    k = rng.randrange(4)
    if k == 0:
        r = post(rng.choice(hostile), src="127.0.0.2")
    elif k == 1:
        r = post(b'{"prompt":"hi","max_tokens":2}', b"Transfer-Encoding: " + rng.choice([b"gzip", b"identity", b"chunked, gzip"]) + b"\r\n",
                 src="127.0.0.2")
    elif k == 2:
        r = raw(b"GET /v1/models/%ff%0a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", src="127.0.0.2")
    else:
        r = raw(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 400))) + b"\r\n\r\n", t=header_timeout + 5,
                src="127.0.0.2")
        c["hostile_sent"] += 1
        return  # garbage gets whatever the HTTP library says, or a close
    c["hostile_sent"] += 1
    if status(r) == -1:
        c["hostile_no_answer"] += 1
        failures.append("hostile request without an answer")
    elif status(r) >= 500:
        c["hostile_5xx"] += 1
        failures.append("hostile request answered %d" % status(r))
def slowloris(n, hold):
    socks = []
    for _ in range(n):
        try:
            s = socket.socket()
            s.bind(("127.0.0.3", 0))
            s.settimeout(2)
            s.connect(hostport())
            s.sendall(b"GET /health HTTP/1.1\r\n")
            socks.append(s)
        except OSError:
            pass
    c["slowloris_conns"] += len(socks)
    time.sleep(hold)
    for s in socks:
        s.close()
def garbage_nodes():
    for p in ports:
        for n in (1, 64, 4096):
            try:
                s = socket.create_connection(("127.0.0.1", p), timeout=2)
                s.sendall(bytes(rng.randrange(256) for _ in range(n)))
                s.close()
                c["garbage_to_nodes"] += 1
            except OSError:
                pass
def second_coordinator():
    c["second_coord"] += 1
    r = subprocess.run(["./ringlm", "run", "-m", os.path.join(w, "models/m.gguf"), "--ring", os.path.join(w, "ring.conf"),
                        "--key", os.path.join(w, "coord.key"), "-p", "hi", "-n", "4", "--temp", "0"],
                       capture_output=True, text=True, timeout=60)
    if r.returncode == 1 and "in use by another coordinator" in r.stderr:
        c["second_coord_refused"] += 1
    else:
        failures.append("second coordinator: exit %d: %s" % (r.returncode, r.stderr[-200:]))
def nodes_alive():
    out = subprocess.run(["pgrep", "-f", "ringlm node --listen 127.0.0.1:(%s)" % "|".join(map(str, ports))],
                         capture_output=True, text=True).stdout.split()
    return len(out)
start_srv()
t_start = time.time()
for r in range(rounds):
    threads = [threading.Thread(target=slowloris, args=(40, header_timeout + 1)), threading.Thread(target=garbage_nodes)]
    threads += [threading.Thread(target=hostile_request) for _ in range(12)]
    threads.append(threading.Thread(target=second_coordinator))
    for t in threads:
        t.start()
    goods = [threading.Thread(target=good_request) for _ in range(good)]
    for t in goods:
        t.start()
    for t in goods + threads:
        t.join()
    time.sleep(max(node_timeout, header_timeout) + 2)  # idle longer than every timeout
    c["idle_gaps"] += 1
    good_request()
    alive = nodes_alive()
    if alive < len(ports):
        c["node_deaths"] += len(ports) - alive
        failures.append("round %d: %d node(s) died" % (r, len(ports) - alive))
        break
    if srv.poll() is not None:
        c["server_crashes"] += 1
        failures.append("round %d: the server exited (%d)" % (r, srv.returncode))
        break
    if r % 2 == 1 and r + 1 < rounds:  # the coordinator is killed and restarted: its nodes must come back to it
        c["coord_restarts"] += 1
        srv.kill()
        srv.wait()
        srv_url = None
        start_srv()
        good_request()
c["seconds"] = round(time.time() - t_start, 1)
srv.terminate()
try:
    srv.wait(timeout=30)
except subprocess.TimeoutExpired:
    failures.append("the server did not exit within 30 s of SIGTERM")
    srv.kill()
json.dump({"counts": c, "failures": failures[:20]}, sys.stdout, indent=1)
PY
cp "$work/soak.json" bench/results/soak.json
python3 - bench/results/soak.json "$rounds" "$good" <<'PY' >bench/results/soak.md
import json, sys
d = json.load(open(sys.argv[1]))
c = d["counts"]
print("# Soak under hostility (`bench/soak_hostile.sh --rounds %s --good %s`)\n" % (sys.argv[2], sys.argv[3]))
print("A 3-node loopback ring, `serve --ring --receipts --node-timeout 3 --header-timeout 2`, tiny model, %s s.\n" % c["seconds"])
print("| what | count |\n|---|---|")
for k, v in c.items():
    if k != "seconds":
        print("| %s | %s |" % (k.replace("_", " "), v))
ok = (c["good_ok"] == c["good_sent"] and c["node_deaths"] == 0 and c["server_crashes"] == 0
      and c["second_coord_refused"] == c["second_coord"] and not d["failures"])
print("\nGoal (every good request 200 with its text, no node death, no crash, every second coordinator refused): %s"
      % ("**met**" if ok else "**not met**"))
if d["failures"]:
    print("\nFailures:\n")
    for f in d["failures"]:
        print("- " + f.replace("\n", " "))
PY
cat bench/results/soak.md
