#!/usr/bin/env bash
# `ringlm plan`'s predictions against measured rings (issue #21, "Validation"). Loopback rings of 2-6 nodes
# (1 thread each) over the `medium` model, every link through `ringlm relay` at a one-way delay D (the
# topology of bench_ring.sh: N + 1 relayed hops per traversal), measured with `ringlm run --ring`:
#   decode   greedy tok/s (a 1-token prompt, --gen tokens, --ignore-eos)
#   ttft     time to first token of a --prompt-token prompt read in one chunk
#   spec     decode tok/s with 4 tokens drafted every pass (--draft-fixed --draft-n 4) by a small K3 draft
#            sharing the vocabulary (synth --draft k3: random, so nearly nothing is accepted, but every pass
#            verifies 5 tokens: this checks the cost of a verification traversal)
#   twin     the same with the target itself as the draft on the coordinator (everything accepted: this
#            checks tokens per traversal and the price of drafting, here 4 steps of the whole model)
# and compared with `ringlm plan --nodes` for the same ring described in a nodes.conf: each node `custom`
# with the bandwidth and compute one node measures alone (decode and prefill of `ringlm run -m` on this
# machine, solved together for bw and tflops, measured in each ring's own minutes: a one-node run before
# every ring run, since this VM's speed moves by 10-30% between minutes), the coordinator at the same figures,
# every pair D apart, and for spec and twin the draft file (`plan --draft`) and the acceptance the run
# measured. Goal: every decode and TTFT prediction within 25% (speculative ones included).
#
# A second part ("sweep") takes prompt lengths and concurrent streams, on rings of --sweep-nodes at one
# delay: the time to first token of prompts of --sweep-prompts tokens read in chunks of 256 (several chunks
# pipelined through the ring), and the aggregate decode tok/s of S streams at once through `ringlm serve
# --ring` (each step one frame carrying every stream's token): S requests of G1 and then of G2 tokens sent
# together, S * (G2 - G1) / (T2 - T1), so prompts and start-up cancel; predicted by `plan --parallel S`.
#
#   bench/bench_plan.sh [--nodes "2 3 4 6"] [--delays "0 10 30"] [--prompt N] [--gen N] [--spec-gen N]
#                       [--out PREFIX]
#                       [--parts "main sweep"] [--sweep-nodes "2 4"] [--sweep-delay MS]
#                       [--sweep-prompts "64 300 1000"] [--sweep-streams "1 4 8"]
#
# Defaults: nodes 2 3 4 6, delays 0 10 30 ms, a 256-token prompt, 26 generated tokens greedy and 51 with
# speculation (the first from the prompt, then ten whole blocks of 5 for the twin: the planner predicts a
# steady rate, and a speculative sequence's first two blocks are the first to touch its rollback copies and
# its verification's compute memory on every process, ~100 MB on `medium`, at ~1 ms a MB on this VM, whose
# host backs guest memory when first touched; with five blocks that was a fifth of the twin's run, with
# ten a tenth; docs/plan.md), PREFIX bench/results/plan (.json, .md). Each figure is
# the median of 3 runs. Speculation runs one block in flight (--draft-depth 1, and plan --draft-depth 1): with
# two, the coordinator drafts while the nodes compute, on the same cores here, which the planner's pipelining
# term (separate machines) does not model (docs/plan.md).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
argv=; [ $# -eq 0 ] || argv=$(printf ' %q' "$@")
nodes="2 3 4 6" delays="0 10 30" prompt=256 gen=26 spec_gen=51 out=bench/results/plan
parts="main sweep" sweep_nodes="2 4" sweep_delay=10 sweep_prompts="64 300 1000" sweep_streams="1 4 8"
while [ $# -gt 0 ]; do
    case $1 in
        --parts) parts=$2; shift 2 ;;
        --sweep-nodes) sweep_nodes=$2; shift 2 ;;
        --sweep-delay) sweep_delay=$2; shift 2 ;;
        --sweep-prompts) sweep_prompts=$2; shift 2 ;;
        --sweep-streams) sweep_streams=$2; shift 2 ;;
        --nodes) nodes=$2; shift 2 ;;
        --delays) delays=$2; shift 2 ;;
        --prompt) prompt=$2; shift 2 ;;
        --gen) gen=$2; shift 2 ;;
        --spec-gen) spec_gen=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "bench_plan: unknown option $1 (--help lists them)" >&2; exit 2 ;;
    esac
done
make -s ringlm || { echo "bench_plan: building ringlm failed" >&2; exit 1; }
model=bench/models/medium.gguf
[ -f "$model" ] || ./ringlm synth --config medium --seed 1 -o "$model" --progress
mkdir -p build/bench
draft=build/bench/medium-draft-k3.gguf
[ -f "$draft" ] || ./ringlm synth --no-progress --config medium --draft k3 --seed 2 -o "$draft"
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; pkill -f "ringlm relay --listen 127.0.0.1" 2>/dev/null || true; rm -rf "$work"' EXIT
cp build/release/ringlm "$work/ringlm"   # the binary measured, whatever is rebuilt meanwhile
BP_PARTS=$parts BP_SWEEP_NODES=$sweep_nodes BP_SWEEP_DELAY=$sweep_delay BP_SWEEP_PROMPTS=$sweep_prompts \
BP_SWEEP_STREAMS=$sweep_streams \
python3 - "$work/ringlm" "$PWD/$model" "$PWD/$draft" "$work" "$nodes" "$delays" "$prompt" "$gen" "$spec_gen" "$out" "$argv" <<'PY'
import json, os, re, socket, statistics, subprocess, sys, threading, time, urllib.request
ringlm, model, draft, work, nodes_arg, delays_arg, prompt, gen, spec_gen, out, argv = sys.argv[1:]
prompt, gen, spec_gen = int(prompt), int(gen), int(spec_gen)
E = os.environ
parts = E['BP_PARTS'].split()
node_counts = [int(x) for x in nodes_arg.split()] if 'main' in parts else []
delays = [float(x) for x in delays_arg.split()] if 'main' in parts else []
sweep_nodes = [int(x) for x in E['BP_SWEEP_NODES'].split()] if 'sweep' in parts else []
sweep_delay = float(E['BP_SWEEP_DELAY'])
sweep_prompts = [int(x) for x in E['BP_SWEEP_PROMPTS'].split()]
sweep_streams = [int(x) for x in E['BP_SWEEP_STREAMS'].split()]
N = max(node_counts + sweep_nodes)
def sh(args, **kw):
    r = subprocess.run(args, capture_output=True, text=True, errors='replace', timeout=900, **kw)
    if r.returncode != 0: raise SystemExit('failed: %s\n%s' % (' '.join(args), r.stderr[-3000:]))
    return r
def key(name): return sh([ringlm, 'keygen', '-o', '%s/%s.key' % (work, name)]).stdout.strip()
coord = key('coord'); pubs = [key('n%d' % i) for i in range(N)]
def free_port():
    s = socket.socket(); s.bind(('127.0.0.1', 0)); p = s.getsockname()[1]; s.close(); return p
nport = [free_port() for _ in range(N)]; rport = [free_port() for _ in range(N)]
os.makedirs(work + '/models'); os.symlink(model, work + '/models/m.gguf')
procs = []
for i in range(N):
    log = open('%s/n%d.log' % (work, i), 'w')
    procs.append(subprocess.Popen([ringlm, 'node', '--listen', '127.0.0.1:%d' % nport[i], '--key', '%s/n%d.key' % (work, i),
                                   '--allow', coord, '--models', work + '/models', '--threads', '1', '--speed', '10',
                                   '--cache', '%s/cache%d' % (work, i)], stdout=log, stderr=log))
for i in range(N):
    for _ in range(600):
        if 'ready:' in open('%s/n%d.log' % (work, i)).read(): break
        time.sleep(0.05)
relays = []
def start_relays(d):
    for r in relays: r.terminate()
    for r in relays: r.wait()
    relays.clear()
    for i in range(N):
        relays.append(subprocess.Popen([ringlm, 'relay', '--listen', '127.0.0.1:%d' % rport[i], '--to', '127.0.0.1:%d' % nport[i],
                                        '--delay-ms', str(d)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    time.sleep(0.3)
ids_prompt = ','.join(str(100 + (i * 7919) % 30000) for i in range(prompt))
def parse(err):
    m = re.search(r'prefill ([0-9.]+) tok/s, ttft ([0-9.]+) s, generated (\d+) tokens, decode ([0-9.]+) tok/s', err)
    a = re.search(r'acceptance ([0-9.]+)%, ([0-9.]+) tokens per target pass', err)
    # what the ring printed it had predicted, from the stages' own timed frames (docs/plan.md, "A running ring")
    ld = re.search(r'^decode: [0-9.]+ tok/s greedy; the plan predicted ([0-9.]+)', err, re.M)
    lt = re.search(r'^time to first token: [0-9.]+ s; the plan predicted ([0-9.]+)', err, re.M)
    return {'ttft': float(m.group(2)), 'decode': float(m.group(4)), 'acc': float(a.group(1)) / 100 if a else None,
            'tpp': float(a.group(2)) if a else None, 'live_decode': float(ld.group(1)) if ld else None,
            'live_ttft': float(lt.group(1)) if lt else None}
def run(extra, ring=None, ctx=1024):
    args = [ringlm, 'run', '-m', model, '--temp', '0', '--ignore-eos', '--ctx', str(ctx)] + extra
    if ring: args += ['--ring', ring, '--key', work + '/coord.key']
    else: args += ['--threads', '1']
    return parse(sh(args).stderr)
decode_args = ['--tokens', '1', '-n', str(gen)]
ttft_args = ['--tokens', ids_prompt, '-n', '1', '--chunk', str(prompt)]
spec_args = lambda dr: ['--tokens', '1', '-n', str(spec_gen), '--draft', dr, '--draft-fixed', '--draft-n', '4', '--draft-depth', '1']
med = lambda xs: statistics.median(xs)
# Calibration: one node alone. The planner prices a traversal as bytes / bw + flops / tflops (predict.h), so
# its one-node predictions at (bw, tflops) = (1, huge) and (huge, 1) give each term's coefficient for a
# decode step and for the prompt; the two measured times then fix this machine's bw and tflops.
local_dec = med([run(decode_args)['decode'] for _ in range(3)])
local_ttft = med([run(ttft_args)['ttft'] for _ in range(3)])
def plan(conf_text, extra):
    open(work + '/nodes.conf', 'w').write(conf_text)
    r = sh([ringlm, 'plan', '-m', model, '--nodes', work + '/nodes.conf', '--ctx', '1024', '--json'] + extra)
    return json.loads(r.stdout)
one = 'node a device=custom mem=100 bw=%g tflops=%g col_reads=4 eff=1 net=100000\ndelay a a 0\n'
big = 1e9
dec_b = 1 / plan(one % (1, big), ['--prompt', '1'])['predict']['greedy_tok_s']       # s at 1 GB/s
dec_f = 1 / plan(one % (big, 1), ['--prompt', '1'])['predict']['greedy_tok_s']       # s at 1 TFLOPS
ttft_args_plan = ['--prompt', str(prompt), '--chunk', str(prompt)]
tt_b = plan(one % (1, big), ttft_args_plan)['predict']['ttft_s']
tt_f = plan(one % (big, 1), ttft_args_plan)['predict']['ttft_s']
# dec_b * x + dec_f * y = 1 / local_dec, tt_b * x + tt_f * y = local_ttft (x = 1 / bw, y = 1 / tflops)
def figures_from(local_dec, local_ttft):
    det = dec_b * tt_f - dec_f * tt_b
    x = (tt_f / local_dec - dec_f * local_ttft) / det
    y = (dec_b * local_ttft - tt_b / local_dec) / det
    if not (x > 0 and y > 0): raise SystemExit('bench_plan: calibration failed (x %g, y %g)' % (x, y))
    return 'device=custom mem=100 bw=%.4f tflops=%.6f col_reads=4 eff=1 net=100000' % (1 / x, 1 / y), 1 / x, 1 / y
figures, bw, tflops = figures_from(local_dec, local_ttft)  # the sweep's; each main row measures its own
# Every node runs here, on this machine's cores, one thread each (`host`: the planner then lets only that many
# stages compute at once, which only a pipelined prompt asks for).
cores = os.cpu_count()
def conf(n, d, fig=None):
    fig = fig or figures
    t = ''.join('node n%d %s loc=p%d host=here threads=1\n' % (i, fig, i) for i in range(n)) + 'host here cores=%d\n' % cores
    places = ['p%d' % i for i in range(n)] + ['c']
    for i in range(len(places)):
        for j in range(i + 1, len(places)): t += 'delay %s %s %g\n' % (places[i], places[j], d)
    return t + 'coordinator loc=c %s\n' % fig
rows = []
kinds = ('decode', 'ttft', 'spec', 'twin')
for d in delays:
    start_relays(d)
    for n in node_counts:
        with open(work + '/ring.conf', 'w') as f:
            for i in range(n): f.write('127.0.0.1:%d %s\n' % (rport[i], pubs[i]))
        rc = work + '/ring.conf'
        # This VM's speed moves by 10-30% between minutes: the row's nodes are described at figures measured
        # in its own minutes, a one-node run before each ring run (the prediction is for the machine as it
        # ran, not as it was when the bench started).
        loc_d, loc_t, dres, tres, sps = [], [], [], [], {}
        for _ in range(3):
            loc_d.append(run(decode_args)['decode']); dres.append(run(decode_args, rc))
        for _ in range(3):
            loc_t.append(run(ttft_args)['ttft']); tres.append(run(ttft_args, rc))
        for name, dr in (('spec', draft), ('twin', model)):
            sps[name] = []
            for _ in range(3):
                loc_d.append(run(decode_args)['decode']); sps[name].append(run(spec_args(dr), rc))
        fig, row_bw, row_tflops = figures_from(med(loc_d), med(loc_t))
        dec, tt = [x['decode'] for x in dres], [x['ttft'] for x in tres]
        row = {'nodes': n, 'delay_ms': d, 'local_decode': med(loc_d), 'local_ttft': med(loc_t), 'bw': row_bw, 'tflops': row_tflops}
        for name, dr in (('spec', draft), ('twin', model)):
            sp = sps[name]
            acc = med([s['acc'] for s in sp])
            pd = plan(conf(n, d, fig), ['--acceptance', '%.4f' % max(min(acc, 0.999), 0.001), '--draft-n', '4', '--draft', dr, '--draft-depth', '1'])
            p = pd['predict']
            row.update({name: med([s['decode'] for s in sp]), name + '_pred': p['spec_tok_s'], name + '_acceptance': acc,
                        name + '_tpp': med([s['tpp'] for s in sp]), name + '_tpp_pred': p['tokens_per_traversal']})
        pd = plan(conf(n, d, fig), ['--prompt', str(prompt), '--chunk', str(prompt)])
        p = pd['predict']
        live = lambda xs, k: med([x[k] for x in xs]) if all(x[k] for x in xs) else None
        row.update({'decode_live': live(dres, 'live_decode'), 'ttft_live': live(tres, 'live_ttft')})
        row.update({'decode': med(dec), 'decode_pred': p['greedy_tok_s'], 'ttft': med(tt), 'ttft_pred': p['ttft_s'],
                    'dominant': p['dominant'], 'stages': [[s['a'], s['b']] for s in pd['stages']]})
        for k in kinds: row[k + '_err'] = row[k + '_pred'] / row[k] - 1
        for k in ('decode', 'ttft'): row[k + '_live_err'] = row[k + '_live'] / row[k] - 1 if row[k + '_live'] else None
        rows.append(row)
        print('%d nodes, %g ms: decode %.2f (pred %.2f), ttft %.3f (pred %.3f), spec %.2f (pred %.2f, acceptance %.2f), '
              'twin %.2f (pred %.2f, acceptance %.2f)' % (n, d, row['decode'], row['decode_pred'], row['ttft'], row['ttft_pred'],
              row['spec'], row['spec_pred'], row['spec_acceptance'], row['twin'], row['twin_pred'], row['twin_acceptance']),
              file=sys.stderr)
# The sweep: prompt lengths (TTFT, chunks of 256) and concurrent streams (aggregate decode through serve).
def write_ring(n):
    with open(work + '/ring.conf', 'w') as f:
        for i in range(n): f.write('127.0.0.1:%d %s\n' % (rport[i], pubs[i]))
    return work + '/ring.conf'
def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={'Content-Type': 'application/json'})
    with urllib.request.urlopen(req, timeout=600) as r: return json.loads(r.read())
def streams_at_once(url, s, g):
    """s completions of g tokens sent together; seconds until the last one is back"""
    res, t0 = [None] * s, time.time()
    def one(i):
        res[i] = post(url + '/v1/completions', {'prompt': [1 + i], 'max_tokens': g, 'temperature': 0, 'ignore_eos': True})
    th = [threading.Thread(target=one, args=(i,)) for i in range(s)]
    for t in th: t.start()
    for t in th: t.join()
    dt = time.time() - t0
    got = [r['usage']['completion_tokens'] if r else 0 for r in res]
    if got != [g] * s: raise SystemExit('bench_plan: %d streams of %d tokens came back with %s' % (s, g, got))
    return dt
sweep = []
chunk, g1, g2 = 256, 8, 40
if sweep_nodes: start_relays(sweep_delay)
for n in sweep_nodes:
    rc = write_ring(n)
    sctx = max(sweep_prompts) + 16
    for pl in sweep_prompts:
        ids = ','.join(str(100 + (i * 7919) % 30000) for i in range(pl))
        tt = med([run(['--tokens', ids, '-n', '1', '--chunk', str(chunk)], rc, sctx)['ttft'] for _ in range(3)])
        p = plan(conf(n, sweep_delay), ['--prompt', str(pl), '--chunk', str(chunk), '--ctx', str(sctx)])['predict']
        sweep.append({'nodes': n, 'delay_ms': sweep_delay, 'kind': 'ttft', 'x': pl, 'measured': tt, 'pred': p['ttft_s'],
                      'err': p['ttft_s'] / tt - 1})
        print('sweep %d nodes: %d-token prompt ttft %.3f s (pred %.3f)' % (n, pl, tt, p['ttft_s']), file=sys.stderr)
    port = free_port()
    slog = open('%s/serve%d.log' % (work, n), 'w')
    srv = subprocess.Popen([ringlm, 'serve', '-m', model, '--port', str(port), '--parallel', str(max(sweep_streams)),
                            '--ctx', '128', '--ring', rc, '--key', work + '/coord.key', '--quiet'], stdout=slog, stderr=slog)
    url = 'http://127.0.0.1:%d' % port
    for _ in range(1200):
        try:
            urllib.request.urlopen(url + '/health', timeout=2).read(); break
        except Exception: time.sleep(0.1)
    streams_at_once(url, 1, 2) # warm-up: the nodes load their ranges
    for s in sweep_streams:
        t1 = med([streams_at_once(url, s, g1) for _ in range(3)])
        t2 = med([streams_at_once(url, s, g2) for _ in range(3)])
        agg = s * (g2 - g1) / (t2 - t1)
        p = plan(conf(n, sweep_delay), ['--parallel', str(s), '--ctx', '128'])['predict']
        sweep.append({'nodes': n, 'delay_ms': sweep_delay, 'kind': 'streams', 'x': s, 'measured': agg,
                      'pred': p['parallel_tok_s'], 'err': p['parallel_tok_s'] / agg - 1})
        print('sweep %d nodes: %d streams %.2f tok/s aggregate (pred %.2f)' % (n, s, agg, p['parallel_tok_s']), file=sys.stderr)
    srv.terminate(); srv.wait()
for p in procs: p.terminate()
for r in relays: r.terminate()
within = lambda k: sum(abs(r[k + '_err']) <= 0.25 for r in rows)
sweep_within = lambda k: [sum(abs(r['err']) <= 0.25 for r in sweep if r['kind'] == k), sum(r['kind'] == k for r in sweep)]
res = {'argv': argv, 'calibration': {'local_decode_tok_s': local_dec, 'local_ttft_s': local_ttft, 'bw_gbs': bw, 'tflops': tflops},
       'prompt': prompt, 'gen': gen, 'spec_gen': spec_gen, 'rows': rows, 'sweep': sweep,
       'within_25pct': dict({k: [within(k), len(rows)] for k in kinds}, sweep_ttft=sweep_within('ttft'),
                            sweep_streams=sweep_within('streams')),
       'cpu': open('/proc/cpuinfo').read().split('model name')[1].split('\n')[0].strip(': \t')}
json.dump(res, open(out + '.json', 'w'), indent=1)
with open(out + '.md', 'w') as f:
    f.write('# `ringlm plan` predictions against measured rings\n\n')
    f.write('`bench/bench_plan.sh%s` (%s). Loopback rings of N nodes (1 thread each) over the `medium` model, every link '
            'through `ringlm relay` at one-way delay D (N + 1 relayed hops per traversal). Measured: `ringlm run --ring`, '
            'median of 3. Predicted: `ringlm plan --nodes` for the same ring, each node `custom` at the figures one node '
            'measures alone on this machine in the row\'s own minutes (a one-node run before every ring run, medians: the '
            '"1 node" column; this VM\'s speed moves by 10-30%% between minutes; at the start: decode %.2f tok/s and a %d-token prompt in %.3f s -> bw %.2f GB/s and '
            '%.4f TFLOPS, solved together since the planner adds reading and multiplying; eff 1; col_reads 4, a CPU: below 4 columns ggml\'s kernels read the weights once per column), every pair D apart, the '
            'coordinator (which drafts) at the same figures; spec: a small random K3 draft, twin: the target itself '
            'as its draft, 4 tokens drafted every pass, one block in flight (`--draft-depth 1`), priced by `plan --draft` at the acceptance the run measured; '
            'greedy runs generate %d tokens, speculative ones %d (a steady rate is what the planner predicts: a speculative '
            'sequence\'s first two blocks touch fresh rollback and verification memory, slow on this VM; docs/plan.md). '
            'Error = predicted / measured - 1. Goal: every prediction within 25%%. Every run is ringlm at its defaults '
            '(repacked weights, flash attention, f16 cache) but for the flags named here; the peer is ringlm\'s own '
            'planner, not llama.cpp, which has none.\n\n' % (argv, res['cpu'], local_dec,
            prompt, local_ttft, bw, tflops, gen, spec_gen))
    if rows: f.write('| nodes | D ms | 1 node: decode tok/s, TTFT s | decode tok/s | predicted | err | TTFT s | predicted | err | spec tok/s (acceptance) | predicted | err '
            '| twin tok/s (acceptance) | predicted | err | dominant |\n')
    if rows: f.write('|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n')
    for r in rows:
        f.write('| %d | %g | %.2f, %.3f | %.2f | %.2f | %+.0f%% | %.3f | %.3f | %+.0f%% | %.2f (%.2f) | %.2f | %+.0f%% | %.2f (%.2f) | %.2f | %+.0f%% '
                '| %s |\n' % (r['nodes'], r['delay_ms'], r['local_decode'], r['local_ttft'], r['decode'], r['decode_pred'], 100 * r['decode_err'], r['ttft'],
                r['ttft_pred'], 100 * r['ttft_err'], r['spec'], r['spec_acceptance'], r['spec_pred'], 100 * r['spec_err'],
                r['twin'], r['twin_acceptance'], r['twin_pred'], 100 * r['twin_err'], r['dominant']))
    if rows: f.write('\nWithin 25%%: decode %d of %d, TTFT %d of %d, speculative (random draft) %d of %d, speculative (twin) %d of %d.\n' % (
        within('decode'), len(rows), within('ttft'), len(rows), within('spec'), len(rows), within('twin'), len(rows)))
    if rows and all(r['decode_live'] and r['ttft_live'] for r in rows):
        lw = lambda k: sum(abs(r[k + '_live_err']) <= 0.25 for r in rows)
        f.write('\n## What a running ring predicts for itself\n\n'
                'The same runs: what `run --ring` printed next to what ran (`decode: ... the plan predicted`, `time to first '
                'token: ... the plan predicted`), its own prediction from the measured delays and each stage\'s figures fitted '
                'to the frames the node timed at ASSIGN (two one-token frames and a 64-token chunk; predict.h, '
                'predict_stage_calibrate), with no calibration by this script.\n\n'
                '| nodes | D ms | decode tok/s | ring predicted | err | TTFT s | ring predicted | err |\n|---|---|---|---|---|---|---|---|\n')
        for r in rows:
            f.write('| %d | %g | %.2f | %.2f | %+.0f%% | %.3f | %.3f | %+.0f%% |\n' % (r['nodes'], r['delay_ms'], r['decode'],
                    r['decode_live'], 100 * r['decode_live_err'], r['ttft'], r['ttft_live'], 100 * r['ttft_live_err']))
        f.write('\nWithin 25%%: decode %d of %d, TTFT %d of %d.\n' % (lw('decode'), len(rows), lw('ttft'), len(rows)))
    if sweep:
        f.write('\n## Prompt lengths and concurrent streams\n\n'
                'Rings of %s nodes at D = %g ms, the nodes at the calibration made at the start. TTFT: `run --ring` of a P-token prompt in chunks of %d (the '
                'chunks pipelined through the ring), median of 3, against `plan --prompt P --chunk %d`. Streams: `ringlm serve --ring '
                '--parallel %d` (one frame per step carries every running stream), S completions of %d and then of %d tokens '
                '(1-token prompts, temperature 0, ignore_eos) sent at once, median of 3 each: aggregate decode = S x (%d - %d) / '
                '(T%d - T%d), against `plan --parallel S`. The nodes.conf says the nodes share this machine\'s %d cores '
                '(`host here cores=%d`, one thread a node): a prompt\'s chunks pipelined through 4 nodes find only %d '
                'cores.\n\n' % (' and '.join(map(str, sweep_nodes)), sweep_delay, chunk, chunk,
                max(sweep_streams), g1, g2, g2, g1, g2, g1, cores, cores, cores))
        f.write('| nodes | what | measured | predicted | err |\n|---|---|---|---|---|\n')
        for r in sweep:
            what = ('TTFT of a %d-token prompt, s' % r['x']) if r['kind'] == 'ttft' else ('%d streams, aggregate tok/s' % r['x'])
            f.write('| %d | %s | %.3f | %.3f | %+.0f%% |\n' % (r['nodes'], what, r['measured'], r['pred'], 100 * r['err']))
        a, b = sweep_within('ttft'), sweep_within('streams')
        f.write('\nWithin 25%%: TTFT %d of %d, streams %d of %d.\n' % (a[0], a[1], b[0], b[1]))
print(open(out + '.md').read())
PY
