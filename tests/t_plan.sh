#!/usr/bin/env bash
# ringlm plan --nodes: a ring planned from machines described in nodes.conf. The order is the shortest round
# trip (checked against every permutation in Python); the predictions are the documented sums of their
# parts (docs/plan.md); a ring too small names the shortfall; every nodes.conf error names its line; --devices
# lists the catalog. (Predictions against measured rings: bench/bench_plan.sh.)
. "$(dirname "$0")/lib.sh"
f=$(model tiny-f32 tiny f32 1)
P=("$RINGLM" plan -m "$f")
cat >"$WORK/nodes.conf" <<'END'
# five machines in three cities, the coordinator in paris
node a device=cpu-ddr5 mem=0.05 loc=paris
node b device=cpu-ddr5 mem=0.05 loc=berlin
node c device=custom mem=0.05 bw=40 tflops=0.5 loc=paris   # a slower one
node d device=cpu-ddr5 mem=0.05 loc=madrid
node e device=cpu-ddr5 mem=0.05 loc=berlin net=100
delay paris berlin 15
delay paris madrid 12
delay berlin madrid 25
coordinator loc=paris
END
check "a plan and its predictions" "${P[@]}" --nodes "$WORK/nodes.conf" --acceptance 0.6 --parallel 4 --prompt 300 --ctx 512
"${P[@]}" --nodes "$WORK/nodes.conf" --acceptance 0.6 --parallel 4 --prompt 300 --ctx 512 --json >"$WORK/p.json"
check "the order is the shortest round trip (every permutation tried), and the predictions add up" python3 - "$WORK/p.json" <<'PY'
import itertools, json, math, sys
j = json.load(open(sys.argv[1]))
loc = {'a': 'paris', 'b': 'berlin', 'c': 'paris', 'd': 'madrid', 'e': 'berlin', None: 'paris'}
ms = {frozenset(['paris', 'berlin']): 15, frozenset(['paris', 'madrid']): 12, frozenset(['berlin', 'madrid']): 25}
def d(x, y):
    return 0.1 if loc[x] == loc[y] else ms[frozenset([loc[x], loc[y]])]
def cyc(o):
    return d(None, o[0]) + sum(d(o[i], o[i + 1]) for i in range(len(o) - 1)) + d(o[-1], None)
best = min(cyc(p) for p in itertools.permutations('abcde'))
assert abs(cyc(j['order']) - best) < 1e-9 and abs(j['round_trip_s'] * 1e3 - best) < 1e-6, (j['order'], best)
p = j['predict']
hops = sum(s['hop_in_s'] for s in j['stages'])
assert hops <= j['round_trip_s'] + 1e-12
assert abs(1 / p['greedy_tok_s'] - (p['hops_s'] + p['compute_s'] + p['transfer_s'])) < 1e-9
assert abs(p['floor_tok_s'] - 1 / p['hops_s']) < 1e-6
a, k = p['acceptance'], p['draft_k']
assert abs(p['tokens_per_traversal'] - (1 - a ** (k + 1)) / (1 - a)) < 1e-9 and 1 <= k <= 16
assert p['spec_tok_s'] > p['greedy_tok_s'] and p['parallel_tok_s'] > p['greedy_tok_s'] and p['ttft_s'] > 0
assert sum(s['b'] - s['a'] for s in j['stages']) == 6 and j['stages'][0]['a'] == 0
print(j['order'], round(best, 1), 'ms', p['dominant'])
PY
# Speculating, each stage keeps every sequence's blocks in flight for rollback: a copy of the KDA state per
# token (k3_range_rollback_bytes). The plan counts them: from inspect's shapes, (depth + 1) slots of k + 1
# tokens per KDA layer and stream, and the stages' memory is that much more (and its headroom) than without.
"${P[@]}" --nodes "$WORK/nodes.conf" --parallel 4 --prompt 300 --ctx 512 --json >"$WORK/p0.json"
"${P[@]}" --nodes "$WORK/nodes.conf" --acceptance 0.6 --draft-n 3 --draft-depth 1 --parallel 4 --prompt 300 --ctx 512 \
    --json >"$WORK/p1.json"
"$RINGLM" inspect "$f" --kv >"$WORK/kv.txt"
check "the plan holds the rollback copies of speculative blocks (inspect's shapes; with and without)" \
    python3 - "$WORK/p.json" "$WORK/p0.json" "$WORK/p1.json" "$WORK/kv.txt" <<'PY'
import json, sys
p, p0, p1 = (json.load(open(x)) for x in sys.argv[1:4])
kv = dict(l.split(' ', 1) for l in open(sys.argv[4]).read().splitlines())
L, H, dk, kc = (int(kv[k]) for k in ('n_layer', 'n_head', 'kda_head_dim', 'conv_kernel'))
kda = L - len(kv['mla_layers'].split())
def want(block, depth, streams):  # per KDA layer and slot: the delta state per token and the conv windows
    return streams * (depth + 1) * kda * (block * H * dk * dk * 4 + 3 * (kc - 1 + block) * H * dk * 4)
k = p['predict']['draft_k']
assert p['predict']['rollback_block'] == k + 1 and p['predict']['rollback_bytes'] == want(k + 1, 2, 4), p['predict']
assert p1['predict']['rollback_block'] == 4 and p1['predict']['rollback_bytes'] == want(4, 1, 4), p1['predict']
assert 'rollback_bytes' not in p0['predict']
cut = lambda j: [(s['a'], s['b']) for s in j['stages']]
mem = lambda j: sum(s['mem_bytes'] for s in j['stages'])
assert cut(p1) == cut(p0), (cut(p0), cut(p1))
assert abs(mem(p1) - mem(p0) - 1.10 * want(4, 1, 4)) <= 8, (mem(p1) - mem(p0), want(4, 1, 4))  # with the plan's 10% headroom
print('rollback', want(k + 1, 2, 4), 'bytes at k', k, 'depth 2;', want(4, 1, 4), 'at k 3 depth 1')
PY
# A shape-only manifest (synth --shape-only: no weights) plans exactly as the model itself, and runs nothing.
"$RINGLM_SYNTH" synth --no-progress --config tiny --seed 1 --shape-only -o "$WORK/shapes.manifest" >/dev/null
"$RINGLM" plan --manifest "$WORK/shapes.manifest" --nodes "$WORK/nodes.conf" --acceptance 0.6 --parallel 4 --prompt 300 \
    --ctx 512 --json >"$WORK/s.json"
check "a shape-only manifest plans and predicts as the model does" \
    python3 -c 'import json, sys; a, b = (json.load(open(f)) for f in sys.argv[1:]); assert a == b, (a, b)' "$WORK/p.json" "$WORK/s.json"
check "a shape-only manifest is small (no weights)" test "$(stat -c %s "$WORK/shapes.manifest")" -lt 200000
check_fails "a shape-only manifest gives no range hashes" "shape-only manifest .* has no tensor hashes" \
    "$RINGLM" manifest --range-hash 0:2 "$WORK/shapes.manifest"
printf '127.0.0.1:1 %s\n' "$("$RINGLM" keygen -o "$WORK/n.key")" >"$WORK/ring.conf"
"$RINGLM" keygen -o "$WORK/c.key" >/dev/null
check_fails "a shape-only manifest cannot run a ring" "shape-only manifest .* cannot run one" \
    "$RINGLM" run --manifest "$WORK/shapes.manifest" --ring "$WORK/ring.conf" --key "$WORK/c.key" -p hi -n 1
check "hops dominate a ring across Europe" python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))["predict"]["dominant"] == "hops"' "$WORK/p.json"
printf 'node a device=cpu-ddr5 mem=0.005\nnode b device=cpu-ddr5 mem=0.005\ndelay a b 1\n' >"$WORK/small.conf"
check_fails "a ring too small names the shortfall" "ring too small: the model needs .* but the 2 nodes offer" \
    "${P[@]}" --nodes "$WORK/small.conf"
# Greedy fits one node, speculation's rollback copies do not: the error says speculation is why.
printf 'node a device=cpu-ddr5 mem=0.045\ncoordinator at=a\n' >"$WORK/one.conf"
check "greedy decoding fits a node of 45 MB" "${P[@]}" --nodes "$WORK/one.conf" --parallel 8 --ctx 512
check_fails "... speculating there does not, and the error says why" \
    "ring too small: .*\\(speculating, with the rollback copies of blocks of 2 tokens, 2 in flight and one more" \
    "${P[@]}" --nodes "$WORK/one.conf" --parallel 8 --ctx 512 --acceptance 0.6
# A draft model's cost on the coordinator (plan --draft): spec_tok_s = g / (traversal at k + 1 + drafting),
# a K3 draft k + a^k one-token steps at the coordinator's figures (twice as fast a coordinator: half the
# time), a DSpark draft one pass for the block.
"$RINGLM_SYNTH" synth --no-progress --config tiny --draft k3 --seed 3 -o "$WORK/dk3.gguf" >/dev/null
"$RINGLM_SYNTH" synth --no-progress --config tiny --draft dspark --seed 3 -o "$WORK/dds.gguf" >/dev/null
sed 's/^coordinator loc=paris$/coordinator loc=paris device=custom mem=8 bw=50 tflops=0.5/' "$WORK/nodes.conf" >"$WORK/c1.conf"
sed 's/^coordinator loc=paris$/coordinator loc=paris device=custom mem=8 bw=100 tflops=1/' "$WORK/nodes.conf" >"$WORK/c2.conf"
for k in 2 4; do
    "${P[@]}" --nodes "$WORK/nodes.conf" --acceptance 0.6 --draft-n $k --draft-depth 1 --json >"$WORK/nd$k.json"
    for c in c1 c2; do
        for d in dk3 dds; do "${P[@]}" --nodes "$WORK/$c.conf" --acceptance 0.6 --draft-n $k --draft-depth 1 --draft "$WORK/$d.gguf" --json >"$WORK/$c-$d-$k.json"; done
    done
done
check "drafting is priced on the coordinator: k + a^k steps of a K3 draft, one pass of a DSpark draft" python3 - "$WORK" <<'PY'
import json, sys
w = sys.argv[1]
L = lambda n: json.load(open('%s/%s.json' % (w, n)))['predict']
for k in (2, 4):
    free = L('nd%d' % k)
    assert 'draft_s' in free and free['draft_s'] == 0, free
    for c in ('c1', 'c2'):
        for d in ('dk3', 'dds'):
            p = L('%s-%s-%d' % (c, d, k))
            g = p['tokens_per_traversal']
            assert p['draft_k'] == k and p['draft_s'] > 0
            # the same traversal plus the drafting
            assert abs(g / p['spec_tok_s'] - g / free['spec_tok_s'] - p['draft_s']) < 1e-9, (p, free)
            # a coordinator with twice the bandwidth and compute drafts in half the time
            assert c == 'c1' or abs(L('c1-%s-%d' % (d, k))['draft_s'] / p['draft_s'] - 2) < 1e-9
for c in ('c1', 'c2'):
    step = lambda k: L('%s-dk3-%d' % (c, k))['draft_s'] / (k + 0.6 ** k)
    assert abs(step(2) / step(4) - 1) < 1e-9, (step(2), step(4))   # one K3 step costs the same at every k
    ds2, ds4 = L('%s-dds-2' % c)['draft_s'], L('%s-dds-4' % c)['draft_s']
    assert ds2 < ds4 < 2 * ds2, (ds2, ds4)                            # one DSpark pass: reads once
print('ok')
PY
# Blocks in flight (--draft-depth, default 2 as run --ring's): a block likely to stand whole (a^(k+1) >= 0.25)
# has the next one behind it, g / ((1 - q) T + q I); one that is not, and depth 1, g / T.
for d in 1 2 3 8; do
    for a in 0.3 0.9; do
        "${P[@]}" --nodes "$WORK/c1.conf" --acceptance $a --draft-n 2 --draft-depth $d --draft "$WORK/dk3.gguf" --json >"$WORK/dd$d-$a.json"
    done
done
check "pipelined blocks: g / ((1 - q) T + q I) once a block likely stands, g / T otherwise; D' in flight as adaptive depth keeps" python3 - "$WORK" <<'PY'
import json, sys
L = lambda n: json.load(open('%s/%s.json' % (sys.argv[1], n)))['predict']
for d in (1, 2, 3, 8):
    for a in (0.3, 0.9):
        p = L('dd%d-%s' % (d, a))
        g, T, I, q = p['tokens_per_traversal'], p['block_s'], p['interval_s'], a ** 3
        assert p['draft_depth'] == d and p['draft_k'] == 2
        deff = 1                      # one more in flight only while all n in flight likely stand: q^n >= 0.25
        while deff < d and q ** deff >= 0.25:
            deff += 1
        if d == 1 or q < 0.25:
            assert I == 0 and abs(p['spec_tok_s'] - g / T) < 1e-9, p
        else:
            assert I >= T / deff - 1e-12 and I < T and abs(p['spec_tok_s'] - g / ((1 - q) * T + q * I)) < 1e-9, p
assert L('dd8-0.9')['interval_s'] >= L('dd8-0.9')['block_s'] / 5 - 1e-12   # a^3 = 0.729: 5 in flight, not 8
assert L('dd2-0.9')['spec_tok_s'] > L('dd1-0.9')['spec_tok_s']                  # pipelining pays when blocks stand
assert L('dd2-0.3')['spec_tok_s'] == L('dd1-0.3')['spec_tok_s']                  # and is not used when they do not
print('ok')
PY
check_fails "--draft names a file that is not a GGUF" "nodes.conf: bad magic \(not a GGUF file\)" \
    "${P[@]}" --nodes "$WORK/nodes.conf" --acceptance 0.5 --draft "$WORK/nodes.conf"
"$TOOLS/gguf_edit" "$WORK/dk3.gguf" "$WORK/llama.gguf" --set-str general.architecture llama
check_fails "--draft of another architecture names it" "llama.gguf: draft: architecture 'llama' \(a K3 draft" \
    "${P[@]}" --nodes "$WORK/nodes.conf" --acceptance 0.5 --draft "$WORK/llama.gguf"
rc=0
"${P[@]}" --nodes "$WORK/nodes.conf" --draft "$WORK/dk3.gguf" 2>"$WORK/err" || rc=$?
check "--draft without --acceptance is a usage error" test "$rc" = 2
check "... that says why" grep -q "needs --nodes and --acceptance" "$WORK/err"
bad() { # bad DESCRIPTION PATTERN LINES...
    local desc=$1 pat=$2; shift 2
    printf '%s\n' "$@" >"$WORK/bad.conf"
    check_fails "nodes.conf: $desc" "$pat" "${P[@]}" --nodes "$WORK/bad.conf"
}
bad "an unknown device, by line" "bad.conf:2: unknown device 'rtx9090'" "node a device=cpu-ddr5" "node b device=rtx9090"
bad "a bad value, by line" "bad.conf:1: bad mem=lots" "node a device=cpu-ddr5 mem=lots"
bad "custom without figures" "bad.conf:1: device=custom needs mem= and bw=" "node a device=custom mem=8"
bad "a node named twice" "bad.conf:2: node a named twice \(line 1\)" "node a device=cpu-ddr5" "node a device=h100"
bad "an unknown statement" "bad.conf:3: unknown statement 'nod'" "node a device=cpu-ddr5" "" "nod b device=h100"
bad "a malformed delay" "bad.conf:2: 'delay A B MS'" "node a device=cpu-ddr5" "delay a 5"
bad "no delay between two places" "no delay between the coordinator and b \(add 'delay a b MS'" "node a device=h100" "node b device=h100"
bad "no nodes" "bad.conf: no nodes" "# nothing"
bad "a coordinator at no node" "bad.conf:2: coordinator at=zz: no such node" "node a device=h100" "coordinator at=zz"
bad "a coordinator nowhere" "bad.conf:2: 'coordinator at=NODE' or 'coordinator loc=PLACE'" "node a device=h100" "coordinator device=h100"
bad "a coordinator's unknown device, by line" "bad.conf:3: unknown device 'h900'" "node a device=h100" "" "coordinator loc=x device=h900"
bad "a coordinator's bad figure, by line" "bad.conf:2: bad mem=0 .*at, loc" "node a device=h100" "coordinator at=a mem=0"
# Partial offload (ram=): a GPU's memory first, then RAM at its own speed (plan.h). With 20 MB of device memory
# the tiny model's first layers sit there whole and the rest in RAM; with 30 MB every layer's dense part
# does and the routed experts of the first layers stay in RAM. Either way the tiers add up, each within its
# size, and the prediction lies between all on the device and all in RAM.
for v in 0.02 0.03; do
    printf 'node g device=custom mem=%s bw=1000 tflops=50 ram=1 ram_bw=50 ram_tflops=1\n' "$v" >"$WORK/po.conf"
    printf 'node g device=custom mem=1 bw=1000 tflops=50\n' >"$WORK/pd.conf"
    printf 'node g device=custom mem=1 bw=50 tflops=1\n' >"$WORK/pr.conf"
    for c in po pd pr; do "${P[@]}" --nodes "$WORK/$c.conf" --json >"$WORK/$c.json"; done
    check "ram= with mem=$v GB of device: tiers that add up, and a prediction between all-device and all-RAM" \
        python3 - "$WORK" "$v" <<'PY'
import json, sys
w, v = sys.argv[1], float(sys.argv[2])
po, pd, pr = (json.load(open('%s/%s.json' % (w, c))) for c in ('po', 'pd', 'pr'))
s = po['stages'][0]
print(s)
assert s['device_bytes'] + s['ram_bytes'] == s['mem_bytes'] and s['device_bytes'] <= v * 2**30 and s['ram_bytes'] <= 2**30
if v == 0.02:
    assert 0 < s['gpu_layers'] < 6 and s['cpu_moe_layers'] == 0, 'first layers whole on the device'
else:
    assert s['gpu_layers'] == 6 and s['cpu_moe_layers'] > 0, 'every layer on the device, some experts in RAM'
g = [p['predict']['greedy_tok_s'] for p in (pd, po, pr)]
assert g[0] > g[1] > g[2], g
PY
done
# Small batches (col_reads=N, predict.h): a product of c columns reads its weights min(c, N) times - ggml's CPU
# kernels multiply fewer than 4 columns one at a time. One node at 1 GB/s and compute for free: col_reads=1
# gives the dense (D) and expert (X) bytes from a step of 1 token (D + X k/E) and of 64 (D + X, all touched);
# col_reads=4 must then price a step of t tokens at D min(t, 4) + X U min(t k / (E U), 4), U = 1 - (1 - k/E)^t,
# and the catalog's CPUs default to 4, its GPUs and custom to 1.
for n in 1 4; do
    printf 'node a device=custom mem=1 bw=1 tflops=1000000 eff=1 net=1000000 col_reads=%s\n' $n >"$WORK/cr$n.conf"
    for t in 1 2 3 4 6 8 16 64; do "${P[@]}" --nodes "$WORK/cr$n.conf" --parallel $t --json >"$WORK/cr$n-$t.json"; done
done
printf 'node a device=cpu-ddr5 mem=1\n' >"$WORK/crc.conf"
printf 'node a device=cpu-ddr5 mem=1 col_reads=%s\n' 4 >"$WORK/crc4.conf"
printf 'node a device=cpu-ddr5 mem=1 col_reads=%s\n' 1 >"$WORK/crc1.conf"
printf 'node a device=rtx5090\n' >"$WORK/crg.conf"
printf 'node a device=rtx5090 col_reads=1\n' >"$WORK/crg1.conf"
for c in crc crc4 crc1 crg crg1; do "${P[@]}" --nodes "$WORK/$c.conf" --parallel 4 --json >"$WORK/$c.json"; done
check "col_reads: a step of t tokens reads each matrix min(t's columns, N) times; CPUs default to 4" python3 - "$WORK" <<'PY'
import json, sys
w = sys.argv[1]
L = lambda n: json.load(open('%s/%s.json' % (w, n)))['predict']
step = lambda n, t: t / L('cr%d-%d' % (n, t))['parallel_tok_s'] - L('cr%d-%d' % (n, t))['hops_s']
E, k = 8, 2   # the tiny model: 8 experts, top-2
q = k / E
U = lambda t: 1 - (1 - q) ** t
r1, r64 = step(1, 1) * 1e9, step(1, 64) * 1e9
X = (r64 - r1) / (U(64) - q)
D = r1 - X * q
assert D > 0 and X > 0, (D, X)
for t in (1, 2, 3, 4, 6, 8, 16, 64):
    assert abs(step(1, t) * 1e9 - (D + X * U(t))) < 1e-6 * r64, ('col_reads=1', t)
    want = D * min(t, 4) + X * U(t) * min(t * q / U(t), 4)
    assert abs(step(4, t) * 1e9 - want) < 1e-6 * want, ('col_reads=4', t, step(4, t) * 1e9, want)
assert L('cr1-1')['greedy_tok_s'] == L('cr4-1')['greedy_tok_s']          # one token: one read either way
assert L('crc')['parallel_tok_s'] == L('crc4')['parallel_tok_s'] < L('crc1')['parallel_tok_s']
assert L('crg')['parallel_tok_s'] == L('crg1')['parallel_tok_s']
print('D %.0f X %.0f bytes; 4 tokens: %.2f reads of D' % (D, X, step(4, 4) / step(1, 4)))
PY
bad "col_reads out of range, by line" "bad.conf:1: bad col_reads=0 .*col_reads 1..64" "node a device=cpu-ddr5 col_reads=0"
bad "ram_bw without ram" "bad.conf:1: ram_bw= and ram_tflops= describe the RAM that ram=GB offers" "node a device=h100 ram_bw=50"
# Nodes on one machine (host=): a pipelined prompt waits for its cores, nothing else changes.
for h in own c1 c2 c4 t2; do
    for i in 0 1 2 3; do
        case $h in own) x= ;; c*) x=" host=box" ;; t2) x=" host=box threads=2" ;; esac
        echo "node n$i device=cpu-ddr5 mem=1 loc=p$i$x"
    done >"$WORK/h-$h.conf"
    case $h in c1) echo "host box cores=1" ;; c2|t2) echo "host box cores=2" ;; c4) echo "host box cores=4" ;; esac >>"$WORK/h-$h.conf"
    printf 'delay p0 p1 1\ndelay p0 p2 1\ndelay p0 p3 1\ndelay p1 p2 1\ndelay p1 p3 1\ndelay p2 p3 1\n' >>"$WORK/h-$h.conf"
    "${P[@]}" --nodes "$WORK/h-$h.conf" --prompt 1024 --chunk 128 --json >"$WORK/h-$h.json"
    "${P[@]}" --nodes "$WORK/h-$h.conf" --prompt 1024 --chunk 128 >"$WORK/h-$h.txt"
done
check "stages on one machine: a pipelined prompt waits for its cores (1 < 2 < 4 = machines of their own), decode does not" \
    python3 - "$WORK" <<'PY'
import json, sys
w = sys.argv[1]
L = lambda n: json.load(open('%s/h-%s.json' % (w, n)))
own, c1, c2, c4, t2 = (L(n) for n in ('own', 'c1', 'c2', 'c4', 't2'))
assert len(own['stages']) == 4, own['stages']
T = lambda p: p['predict']['ttft_s']
assert T(c1) > T(c2) > T(c4) == T(own), (T(c1), T(c2), T(c4), T(own))
assert T(t2) == T(c1)                                       # 2 cores, 2 threads a node: one at a time
for p in (c1, c2, c4, t2):
    for k in ('greedy_tok_s', 'parallel_tok_s', 'hops_s'): assert p['predict'][k] == own['predict'][k], k
print('ttft own %.3f, 4 cores %.3f, 2 cores %.3f, 1 core %.3f' % (T(own), T(c4), T(c2), T(c1)))
PY
check "... and the plan says which nodes share it" grep -q "one machine, box (2 cores; 2 of its nodes compute at once): n0 n1 n2 n3" "$WORK/h-c2.txt"
bad "host= with no host line, by line" "bad.conf:2: node b: host=box, but no 'host box cores=N' line" \
    "node a device=cpu-ddr5" "node b device=cpu-ddr5 host=box" "delay a b 1"
bad "a malformed host line" "bad.conf:2: 'host MACHINE cores=N'" "node a device=cpu-ddr5 host=box" "host box cores=0"
bad "a host described twice" "bad.conf:3: host box described twice \(line 2\)" "node a device=cpu-ddr5 host=box" \
    "host box cores=4" "host box cores=8"
bad "a coordinator with a host" "bad.conf:2: bad host=box .*at, loc" "node a device=cpu-ddr5" "coordinator at=a host=box"
bad "threads out of range" "bad.conf:1: bad threads=0 .*threads 1..4096" "node a device=cpu-ddr5 host=box threads=0"
check "--devices lists the catalog" sh -c '"$1" plan --devices | grep -q "^rtx5090 .* 32 .* 1792"' _ "$RINGLM"
rc=0
"$RINGLM" plan -m "$f" --nodes "$WORK/nodes.conf" --ring x.conf --key k 2>"$WORK/err" || rc=$?
check "--nodes with --ring is a usage error" test "$rc" = 2
finish
