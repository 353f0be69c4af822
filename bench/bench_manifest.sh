#!/usr/bin/env bash
# Time to first token of a fresh ring (issue #24): the coordinator streams every stage its layers (today's
# way, -m) against nodes that hold their own split files under a coordinator that holds only the manifest
# (--manifest). A loopback ring of 3 nodes over the `medium` model as a 6-file split set (synth --split 6,
# the same weights as bench/models/medium.gguf). Each timed run starts the nodes afresh and runs
# `ringlm run -n 1`; the figure is its wall time, from the coordinator's start (INFO, plan, every range
# loaded) to the first token.
#
#   stream   -m the set; nodes start with empty --models and empty caches: each range is streamed to its node
#   splits   --manifest; each node holds the split files of its range (hard links), caches empty: it checks
#            every tensor it maps against the manifest (one BLAKE2b pass over its range)
#   verified --manifest; the same nodes restarted with their caches: what they checked is remembered
#   pull     --manifest; the last node holds nothing and an empty cache: it pulls its range from the others
#
# Also the coordinator's peak RSS and what it keeps on disk (manifest vs model). The page cache is warm (the
# files were just written; dropping it needs privileges the benchmark does not assume), so disk speed is
# not measured, only the work each way does. Runs alternate; medians over --reps, ratios are paired.
#
#   bench/bench_manifest.sh [--reps N] [--out PREFIX]     (default 3, bench/results/manifest)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
argv=; [ $# -eq 0 ] || argv=$(printf ' %q' "$@")
reps=3 out=bench/results/manifest
while [ $# -gt 0 ]; do
    case $1 in
        --reps) reps=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "bench_manifest: unknown option $1 (--help lists them)" >&2; exit 2 ;;
    esac
done
[[ $reps =~ ^[1-9][0-9]*$ ]] || { echo "bench_manifest: --reps must be a positive number" >&2; exit 2; }
make -s ringlm || { echo "bench_manifest: building ringlm failed" >&2; exit 1; }
mkdir -p build/bench/medium-split "$(dirname "$out")"
set1=build/bench/medium-split/medium-00001-of-00006.gguf
if [ ! -f build/bench/medium-split/medium-00006-of-00006.gguf ]; then
    echo "bench_manifest: synthesizing the medium model as 6 split files (once)" >&2
    ./ringlm synth --config medium --seed 1 --split 6 -o build/bench/medium-split/medium.gguf --progress
fi
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
python3 - "$PWD/ringlm" "$PWD/$set1" "$work" "$reps" "$out" "$argv" <<'PY'
import json, os, re, shutil, socket, statistics, subprocess, sys, time
ringlm, set1, work, reps, out, argv = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6]
setdir = os.path.dirname(set1)
files = sorted(f for f in os.listdir(setdir) if re.match(r'medium-\d{5}-of-00006\.gguf$', f))
model_bytes = sum(os.path.getsize(os.path.join(setdir, f)) for f in files)
def key(name):
    return subprocess.run([ringlm, 'keygen', '-o', '%s/%s.key' % (work, name)], capture_output=True, text=True, check=True).stdout.strip()
coord = key('coord'); pubs = [key('n%d' % i) for i in range(3)]
def free_port():
    s = socket.socket(); s.bind(('127.0.0.1', 0)); p = s.getsockname()[1]; s.close(); return p
ports = [free_port() for _ in range(3)]
with open(work + '/ring.conf', 'w') as f:
    for i in range(3): f.write('127.0.0.1:%d %s\n' % (ports[i], pubs[i]))
t0 = time.time()
manifest = work + '/medium.manifest'
subprocess.run([ringlm, 'manifest', '--no-progress', set1, '-o', manifest], check=True, capture_output=True)
manifest_s = time.time() - t0
procs = [None] * 3
def stop():
    for p in procs:
        if p: p.terminate()
    for p in procs:
        if p: p.wait()
def start(models, caches):
    stop()
    for i in range(3):
        log = open('%s/n%d.log' % (work, i), 'w')
        procs[i] = subprocess.Popen([ringlm, 'node', '--listen', '127.0.0.1:%d' % ports[i], '--key', '%s/n%d.key' % (work, i),
                                     '--allow', coord, '--models', models[i], '--threads', '1', '--speed', '10',
                                     '--cache', caches[i]], stdout=log, stderr=log)
    for i in range(3):
        for _ in range(400):
            if 'ready:' in open('%s/n%d.log' % (work, i)).read(): break
            time.sleep(0.05)
        else: raise SystemExit('node %d did not start:\n%s' % (i, open('%s/n%d.log' % (work, i)).read()))
def dirs(prefix):
    ds = ['%s/%s%d' % (work, prefix, i) for i in range(3)]
    for d in ds:
        shutil.rmtree(d, ignore_errors=True); os.makedirs(d)
    return ds
def timed(args, conf='ring.conf'):
    t = time.time()
    r = subprocess.run([ringlm, 'run', *args, '-p', 'The ring starts', '-n', '1', '--temp', '0', '--ring', work + '/' + conf,
                        '--key', work + '/coord.key'], capture_output=True, text=True)
    s = time.time() - t
    if r.returncode != 0: raise SystemExit('run failed:\n' + r.stderr)
    rss = float(re.search(r'peak rss ([0-9.]+) MiB', r.stderr).group(1))
    return s, rss, r.stderr
# The plan every way gives (no caps, equal speeds): the split files each stage needs, from a first run with
# every node holding the whole set. It also caches the model's content hash beside the files (what -m's
# coordinator checks nodes against), as any user of -m has it after a first run: not part of the figures.
alld = dirs('all')
for d in alld:
    for f in files: os.link(os.path.join(setdir, f), os.path.join(d, f))
start(alld, dirs('cache'))
_, _, err = timed(['-m', set1])
plan = re.findall(r'^\s+\d+\s+\S+\s+(\d+)-(\d+) \(\d+\)\s+([0-9.]+) (MiB|GiB)', err, re.M)
stages = [(int(a), int(b)) for a, b, _, _ in plan]
if len(stages) != 3: raise SystemExit('expected a 3-stage plan:\n' + err)
# For `pull`: ring.conf caps the first two nodes at their stage's memory (+2%), so the plan still gives the
# third its range though it holds nothing (a plan that streams fewer bytes would leave it out).
with open(work + '/capped.conf', 'w') as f:
    for i in range(3):
        gb = float(plan[i][2]) / (1024.0 if plan[i][3] == 'MiB' else 1.0) * 1.02
        f.write('127.0.0.1:%d %s%s\n' % (ports[i], pubs[i], ' mem=%.4f' % gb if i < 2 else ''))
need = []
for a, b in stages:
    r = subprocess.run([ringlm, 'manifest', '--range-files', '%d:%d' % (a, b + 1), manifest], capture_output=True, text=True, check=True)
    need.append([l.split()[0] for l in r.stdout.splitlines()])
def holding(prefix, empty_last=False):
    ds = dirs(prefix)
    for i, d in enumerate(ds):
        if empty_last and i == 2: continue
        mine = need[i] + (need[2] if empty_last and i == 1 else [])
        for f in sorted(set(mine)): os.link(os.path.join(setdir, f), os.path.join(d, f))
    return ds
runs = {k: [] for k in ('stream', 'splits', 'verified', 'pull')}
rss = {k: [] for k in runs}
for rep in range(reps):
    start(dirs('empty'), dirs('cache'))
    s, m, _ = timed(['-m', set1]); runs['stream'].append(s); rss['stream'].append(m)
    hold, caches = holding('hold'), dirs('cache')
    start(hold, caches)
    s, m, _ = timed(['--manifest', manifest]); runs['splits'].append(s); rss['splits'].append(m)
    start(hold, caches)
    s, m, _ = timed(['--manifest', manifest]); runs['verified'].append(s); rss['verified'].append(m)
    start(holding('hold', empty_last=True), dirs('cache'))
    s, m, e = timed(['--manifest', manifest], 'capped.conf'); runs['pull'].append(s); rss['pull'].append(m)
    if rep == 0: pull_plan = e.split('\n\n')[0]
stop()
med = {k: statistics.median(v) for k, v in runs.items()}
ratio = {k: statistics.median([runs['stream'][i] / runs[k][i] for i in range(reps)]) for k in ('splits', 'verified', 'pull')}
res = {'argv': argv, 'model_bytes': model_bytes, 'manifest_bytes': os.path.getsize(manifest), 'manifest_build_s': manifest_s,
       'stages': stages, 'files_per_stage': need, 'reps': reps, 'seconds': runs, 'median_s': med,
       'stream_over': ratio, 'coordinator_peak_rss_mib': rss, 'cpu': open('/proc/cpuinfo').read().split('model name')[1].split('\n')[0].strip(': \t')}
json.dump(res, open(out + '.json', 'w'), indent=1)
MiB = 1048576.0
with open(out + '.md', 'w') as f:
    f.write('# Time to first token of a fresh ring: streamed by the coordinator vs split files on the nodes\n\n')
    f.write('`bench/bench_manifest.sh%s` (%s). Loopback ring of 3 nodes (1 thread each) over the `medium` model as 6 split '
            'files (%.0f MiB); plan %s; each node needs %s. Wall time of `ringlm run -n 1` from the coordinator\'s start '
            'to the first token, nodes started afresh each time; medians of %d alternating runs. Page cache warm (see the '
            'script): this measures the work each way does, not disk speed.\n\n' % (argv, res['cpu'], model_bytes / MiB,
            ', '.join('[%d, %d)' % (a, b + 1) for a, b in stages), '; '.join('%d file(s)' % len(n) for n in need), reps))
    f.write('| ring start | median s | stream / this (paired) | coordinator peak RSS MiB |\n|---|---|---|---|\n')
    label = {'stream': 'coordinator streams every range (`-m`, nodes hold nothing)',
             'splits': 'nodes hold their split files, first start (`--manifest`; each checks its range)',
             'verified': 'the same, restarted (what they checked is remembered)',
             'pull': 'the last node holds nothing and pulls its range from the others (caps: below)'}
    for k in ('stream', 'splits', 'verified', 'pull'):
        f.write('| %s | %.2f | %s | %.1f |\n' % (label[k], med[k], '%.2fx' % ratio[k] if k != 'stream' else '', statistics.median(rss[k])))
    f.write('\nThe coordinator keeps on disk: the manifest, %.1f KiB (%.3f%% of the model; built in %.1f s, one read of the '
            'set), instead of the %.0f MiB model.\n' % (res['manifest_bytes'] / 1024.0, 100.0 * res['manifest_bytes'] / model_bytes,
            manifest_s, model_bytes / MiB))
    f.write('\n`pull` caps the first two nodes at their stage\'s memory (+2%) so that the third keeps its range; its plan:\n\n')
    f.write(''.join('    ' + l + '\n' for l in pull_plan.splitlines()))
print(open(out + '.md').read())
PY
