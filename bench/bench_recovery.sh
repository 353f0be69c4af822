#!/usr/bin/env bash
# Soak: nodes killed and restarted at random moments under load (issue #17). A loopback ring of 3 nodes and
# a standby serves 8 streams that never stop (greedy requests, 64 tokens each, one after another per
# stream) while a killer, at random intervals, takes a random node that holds a stage: kill -9 (3 times in
# 4) or SIGSTOP (1 in 4, for ZeroMQ's heartbeats to notice), then restarts (or continues) it after a
# random delay. Counts requests sent, completed and lost (an error event, or no [DONE]: the goal is 0),
# and per kill the recovery pause: the longest gap, over the streams running when it struck, between their
# last token before it and their first after.
#
#   bench/bench_recovery.sh [--kills N] [--max-seconds S] [--seed S] [--out PREFIX]
#
# Defaults: 50 kills, at most 900 s, seed 1, PREFIX bench/results/recovery (.json and .md).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
argv=; [ $# -eq 0 ] || argv=$(printf ' %q' "$@")
kills=50 max_s=900 seed=1 out=bench/results/recovery
while [ $# -gt 0 ]; do
    case $1 in
        --kills) kills=$2; shift 2 ;;
        --max-seconds) max_s=$2; shift 2 ;;
        --seed) seed=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "bench_recovery: unknown option $1 (--help lists them)" >&2; exit 2 ;;
    esac
done
for v in kills max_s seed; do [[ ${!v} =~ ^[0-9]+$ ]] || { echo "bench_recovery: --$v must be a number" >&2; exit 2; }; done
make -s ringlm || { echo "bench_recovery: building ringlm failed" >&2; exit 1; }
mkdir -p build/bench "$(dirname "$out")"
model=build/bench/full-f32.gguf
[ -f "$model" ] || ./ringlm synth --no-progress --config tests/configs/k3-full.json --type f32 --seed 1 -o "$model"
work=$(mktemp -d)
trap 'pkill -CONT -f "ringlm node --listen 127.0.0.1" 2>/dev/null || true; kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
python3 - "$PWD/ringlm" "$model" "$work" "$kills" "$max_s" "$seed" "$out" "$argv" <<'PY'
import http.client, json, os, random, signal, socket, statistics, subprocess, sys, threading, time
ringlm, model, work, kills, max_s, seed, out, argv = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6]), sys.argv[7], sys.argv[8]
rng = random.Random(seed)
os.makedirs(work + '/models'); os.symlink(os.path.abspath(model), work + '/models/m.gguf')
def key(name):
    return subprocess.run([ringlm, 'keygen', '-o', '%s/%s.key' % (work, name)], capture_output=True, text=True, check=True).stdout.strip()
coord = key('coord'); pubs = [key('n%d' % i) for i in range(4)]
def free_port():
    s = socket.socket(); s.bind(('127.0.0.1', 0)); p = s.getsockname()[1]; s.close(); return p
ports = [free_port() for _ in range(4)]
procs = [None] * 4
def start(i):
    log = open('%s/n%d.log' % (work, i), 'a')
    procs[i] = subprocess.Popen([ringlm, 'node', '--listen', '127.0.0.1:%d' % ports[i], '--key', '%s/n%d.key' % (work, i),
                                 '--allow', coord, '--models', work + '/models', '--threads', '1', '--speed', '10',
                                 '--cache', '%s/cache%d' % (work, i)], stdout=log, stderr=log)
    for _ in range(200):
        if 'ready:' in open('%s/n%d.log' % (work, i)).read(): return
        time.sleep(0.05)
    raise SystemExit('node %d did not start' % i)
for i in range(4): start(i)
with open(work + '/ring.conf', 'w') as f:
    for i in range(4): f.write('127.0.0.1:%d %s%s\n' % (ports[i], pubs[i], ' standby' if i == 3 else ''))
slog = open(work + '/serve.log', 'w')
srv = subprocess.Popen([ringlm, 'serve', '-m', model, '--ring', work + '/ring.conf', '--key', work + '/coord.key',
                        '--parallel', '8', '--threads', '1', '--port', '0'], stderr=slog, stdout=slog)
port = None
for _ in range(600):
    t = open(work + '/serve.log').read()
    if 'http://127.0.0.1:' in t: port = int(t.split('http://127.0.0.1:')[1].split('/')[0].split()[0]); break
    time.sleep(0.1)
if not port: raise SystemExit('serve did not start:\n' + open(work + '/serve.log').read())
stop = threading.Event()
lock = threading.Lock()
stats = {'sent': 0, 'completed': 0, 'lost': 0}
chunks = []   # (stream, time) of every chunk received
lost_why = []
def stream(sid):
    r = random.Random(seed * 100 + sid)
    while not stop.is_set():
        body = json.dumps({'prompt': 'Stream %d request %d: one two three' % (sid, r.randrange(10**6)), 'max_tokens': 64,
                           'temperature': 0, 'ignore_eos': True, 'stream': True})
        with lock: stats['sent'] += 1
        ok = False
        try:
            c = http.client.HTTPConnection('127.0.0.1', port, timeout=300)
            c.request('POST', '/v1/completions', body, {'Content-Type': 'application/json'})
            resp = c.getresponse()
            buf = b''
            while True:
                line = resp.readline()
                if not line: break
                if line.startswith(b'data: {'):
                    with lock: chunks.append((sid, time.time()))
                    if b'"error"' in line: buf = line; break
                if line.startswith(b'data: [DONE]'): ok = not buf; break
            if not ok and buf: lost_why.append(buf[:300].decode('utf-8', 'replace'))
        except Exception as e:
            lost_why.append(repr(e))
        with lock: stats['completed' if ok else 'lost'] += 1
threads = [threading.Thread(target=stream, args=(i,), daemon=True) for i in range(8)]
for t in threads: t.start()
def health():
    c = http.client.HTTPConnection('127.0.0.1', port, timeout=30); c.request('GET', '/health'); return json.loads(c.getresponse().read())
events = []  # (time, node, how)
t_start = time.time()
time.sleep(3)
for k in range(kills):
    if time.time() - t_start > max_s: break
    time.sleep(rng.uniform(1.0, 3.0))
    try: h = health()
    except Exception: continue
    stage_addrs = [n['addr'] for n in h['nodes'] if n.get('role') == 'stage']
    if not stage_addrs: continue
    i = ports.index(int(rng.choice(stage_addrs).split(':')[1]))
    how = 'stop' if rng.random() < 0.25 else 'kill'
    events.append((time.time(), i, how))
    if how == 'kill':
        procs[i].kill(); procs[i].wait()
    else:
        procs[i].send_signal(signal.SIGSTOP)
    time.sleep(rng.uniform(0.5, 2.0))
    if how == 'kill': start(i)
    else: procs[i].send_signal(signal.SIGCONT)
time.sleep(5)
stop.set()
for t in threads: t.join(timeout=120)
srv.send_signal(signal.SIGTERM); srv.wait(timeout=60)
for p in procs: p.kill()
# recovery pause per event: over streams with chunks both before and after it, the gap around it
pauses = []
by_stream = {}
for sid, t in sorted(chunks, key=lambda x: x[1]): by_stream.setdefault(sid, []).append(t)
for (te, i, how) in events:
    worst = None
    for sid, ts in by_stream.items():
        before = [t for t in ts if t <= te]; after = [t for t in ts if t > te]
        if before and after and te - before[-1] < 1.0:
            g = after[0] - before[-1]
            worst = g if worst is None or g > worst else worst
    if worst is not None: pauses.append({'how': how, 'pause_s': worst})
def pct(v, q):
    v = sorted(v); return v[min(len(v) - 1, int(round(q * (len(v) - 1))))] if v else None
log = open(work + '/serve.log').read()
res = {'kills': sum(1 for e in events if e[2] == 'kill'), 'stops': sum(1 for e in events if e[2] == 'stop'),
       'requests_sent': stats['sent'], 'completed': stats['completed'], 'lost': stats['lost'], 'lost_examples': lost_why[:5],
       'recoveries_logged': log.count('ring: re-formed ('), 'taken_back': log.count('re-formed with the nodes that came back'),
       'pause_p50_s': pct([p['pause_s'] for p in pauses], 0.5), 'pause_p99_s': pct([p['pause_s'] for p in pauses], 0.99),
       'pause_kill_p50_s': pct([p['pause_s'] for p in pauses if p['how'] == 'kill'], 0.5),
       'pause_stop_p50_s': pct([p['pause_s'] for p in pauses if p['how'] == 'stop'], 0.5),
       'pauses': pauses, 'seconds': time.time() - t_start, 'command': 'bench/bench_recovery.sh' + argv}
json.dump(res, open(out + '.json', 'w'), indent=1)
f = lambda x: '-' if x is None else '%.2f s' % x
md = ['# Recovery soak (issue #17)', '',
      'Command: `%s` (loopback ring: 3 nodes + 1 standby, `k3-full` f32 fixture, 8 greedy streams of 64-token requests, one thread per node)' % res['command'], '',
      '| | |', '|---|---|',
      '| nodes killed (kill -9) / stopped (SIGSTOP) | %d / %d |' % (res['kills'], res['stops']),
      '| requests sent / completed / **lost** | %d / %d / **%d** |' % (res['requests_sent'], res['completed'], res['lost']),
      '| rings re-formed after a loss / nodes taken back while idle | %d / %d |' % (res['recoveries_logged'], res['taken_back']),
      '| recovery pause p50 / p99 (all) | %s / %s |' % (f(res['pause_p50_s']), f(res['pause_p99_s'])),
      '| recovery pause p50, kill -9 / SIGSTOP | %s / %s |' % (f(res['pause_kill_p50_s']), f(res['pause_stop_p50_s'])),
      '| wall time | %.0f s |' % res['seconds'], '',
      'Pause: per event, the longest gap, over the streams running when it struck, between their last token before it and their first after it. '
      'A kill closes the link at once; a SIGSTOP is noticed by ZeroMQ heartbeats within 5 s, which dominates its pause. '
      'The rest is the re-plan and re-assign (the nodes already hold the model file, so no range is streamed) and the replay of every running sequence.']
open(out + '.md', 'w').write('\n'.join(md) + '\n')
print('\n'.join(md))
PY
