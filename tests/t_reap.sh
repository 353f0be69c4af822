#!/usr/bin/env bash
# ringlm reap (issue: REAP expert pruning). Known answers first: in the k3-dead models some experts can
# never be chosen (selection bias -1000), so REAP must put them last, and pruning exactly them must leave
# every logit unchanged, bit for bit. Then: llama.cpp (the oracle) loads the pruned files, split and
# unsplit, with logits equal to ours; kept experts' quantized blocks are the input's bytes; the choice
# follows the scores file (mean, and sums with --frequency; --protect); a scores file prunes again to the
# same bytes; the report's figures come from real forward passes (agreement 1 and KL 0 at 0%, falling as
# more is pruned); a DSpark draft still drafts for a pruned target; every bad request is refused first.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ring_lib.sh"
export PYTHONPATH=$ROOT/tests/tools
cat "$ROOT"/data/corpus/en_prose.txt "$ROOT"/data/corpus/code_c.txt >"$WORK/calib.txt"
head -c 4000 "$ROOT"/data/corpus/gen_en_notes.txt >"$WORK/heldout.txt"
toks=$(seq -s, 100 163)
# Usage errors exit 2 (as every subcommand's do) and say what is wrong: usage_fails PATTERN CMD...
usage_fails() {
    local pat=$1 rc=0; shift
    "$@" 2>"$WORK/uerr" || rc=$?
    cat "$WORK/uerr"
    [ $rc = 2 ] && grep -Eq -- "$pat" "$WORK/uerr"
}

# ---- known answer: never-chosen experts -----------------------------------------------------------------
for c in "k3-dead f32 4 1" "k3-lean-dead q4_K 8 2"; do
    read -r config type keep seed <<<"$c"
    f=$(model "$config-$type" "$config" "$type" "$seed")
    p=$WORK/$config.gguf
    check "$config $type: reap scores and prunes to $keep experts" \
        "$RINGLM" reap -m "$f" --calib "$WORK/calib.txt" --tokens 3000 --keep "$keep" -o "$p" --scores "$WORK/$config.json" --threads 2
    check "$config: the never-chosen experts have count 0 and the lowest scores, and are the ones pruned" python3 - "$WORK/$config.json" "$p" "$keep" <<'PY'
import json, sys
from gguf_read import Gguf
d = json.load(open(sys.argv[1])); keep = int(sys.argv[3]); E = d['n_expert']
kept = Gguf(sys.argv[2]).kv['ringlm.reap.kept_experts']
assert d['tokens'] == 3000, d['tokens']
for i, l in enumerate(d['layers']):
    s, n = l['saliency'], l['count']
    assert all(n[j] == 0 and s[j] == 0 for j in range(keep, E)), (l['layer'], s, n)
    assert min(s[:keep]) > 0 and sum(n) == 3000 * d['n_expert_used'], (l['layer'], s, n)
    assert kept[i * keep:(i + 1) * keep] == list(range(keep)), kept
PY
    "$RINGLM" logits -m "$f" --tokens "$toks" --prefill 32 -o "$WORK/full.bin" --threads 2
    "$RINGLM" logits -m "$p" --tokens "$toks" --prefill 32 -o "$WORK/pruned.bin" --threads 2
    check "$config $type: pruning the never-chosen experts leaves every logit unchanged (prefill + steps, bit for bit)" \
        "$RINGLM" compare "$WORK/full.bin" "$WORK/pruned.bin" --tol 0
    "$ORACLE" logits -m "$p" --tokens "$toks" --prefill 32 -o "$WORK/oracle.bin"
    check "$config $type: llama.cpp on the pruned file gives our logits" "$RINGLM" compare "$WORK/oracle.bin" "$WORK/pruned.bin" --tol 0
    check "$config $type: kept experts' blocks, router rows and biases are the input's bytes; the rest unchanged" python3 - "$f" "$p" "$keep" <<'PY'
import sys
from gguf_read import Gguf
a, b, keep = Gguf(sys.argv[1]), Gguf(sys.argv[2]), int(sys.argv[3])
E = a.kv['kimi-k3.expert_count']
assert b.kv['kimi-k3.expert_count'] == keep and b.kv['ringlm.reap.expert_count_original'] == E
assert set(a.tensors) == set(b.tensors)
sliced = 0
for n in a.tensors:
    da, db = a.data(n), b.data(n)
    if n.endswith(('_exps.weight', 'ffn_gate_inp.weight', 'exp_probs_b.bias')):
        slab = len(da) // E
        assert len(db) == slab * keep and db == da[:slab * keep], n
        sliced += 1
    else:
        assert da == db and a.tensors[n][1] == b.tensors[n][1], n
for k in a.kv:
    if k != 'kimi-k3.expert_count':
        assert a.kv[k] == b.kv[k], k
print(sliced, 'tensors sliced')
PY
done

# Where the pruned router has a row count the f32 GEMM tiles differently (16 -> 10 here), a batched
# prefill's router logits may round differently in the last bit, in llama.cpp as in ringlm (the oracle
# still equals us); one-token steps run the dot kernels and stay bit for bit. docs/reap.md says so.
f=$(model k3-lean-dead-f32 k3-lean-dead f32 2)
"$RINGLM" reap -m "$f" --scores "$WORK/k3-lean-dead.json" --keep 10 -o "$WORK/ld10.gguf" >/dev/null
"$RINGLM" logits -m "$f" --tokens "$toks" --mode step -o "$WORK/s16.bin" --threads 2
"$RINGLM" logits -m "$WORK/ld10.gguf" --tokens "$toks" --mode step -o "$WORK/s10.bin" --threads 2
check "16 -> 10 experts (every pruned one never chosen): one-token steps bit for bit" "$RINGLM" compare "$WORK/s16.bin" "$WORK/s10.bin" --tol 0
"$ORACLE" logits -m "$WORK/ld10.gguf" --tokens "$toks" --prefill 32 -o "$WORK/o10.bin"
"$RINGLM" logits -m "$WORK/ld10.gguf" --tokens "$toks" --prefill 32 -o "$WORK/r10.bin" --threads 2
check "16 -> 10 experts: llama.cpp on the pruned file gives our logits" "$RINGLM" compare "$WORK/o10.bin" "$WORK/r10.bin" --tol 0

# ---- split output, scores file round trip, choice rules --------------------------------------------------
f=$(model k3-dead-f32 k3-dead f32 1)
check "a split pruned set of 3 files" "$RINGLM" reap -m "$f" --scores "$WORK/k3-dead.json" --keep 4 -o "$WORK/sp.gguf" --split 3
"$ORACLE" logits -m "$WORK/sp-00001-of-00003.gguf" --tokens "$toks" --prefill 32 -o "$WORK/osp.bin"
"$RINGLM" logits -m "$WORK/sp-00002-of-00003.gguf" --tokens "$toks" --prefill 32 -o "$WORK/rsp.bin" --threads 2
"$RINGLM" logits -m "$f" --tokens "$toks" --prefill 32 -o "$WORK/full.bin" --threads 2
check "llama.cpp on the split pruned set equals the unpruned model" "$RINGLM" compare "$WORK/osp.bin" "$WORK/full.bin" --tol 0
check "ringlm on the split pruned set equals the unpruned model" "$RINGLM" compare "$WORK/rsp.bin" "$WORK/full.bin" --tol 0
check "pruning from the scores file writes the same bytes as calibrating" \
    "$RINGLM" reap -m "$f" --scores "$WORK/k3-dead.json" --keep 4 -o "$WORK/again.gguf"
check_same "  (cmp)" "$WORK/again.gguf" "$WORK/k3-dead.gguf"

g=$(model tiny-f32 tiny f32 1)
"$RINGLM" reap -m "$g" --calib "$WORK/calib.txt" --tokens 2000 --scores "$WORK/tiny.json" --threads 2 >/dev/null
"$RINGLM" reap -m "$g" --scores "$WORK/tiny.json" --keep 5 -o "$WORK/mean.gguf" >/dev/null
"$RINGLM" reap -m "$g" --scores "$WORK/tiny.json" --keep 5 --frequency -o "$WORK/freq.gguf" >/dev/null
"$RINGLM" reap -m "$g" --scores "$WORK/tiny.json" --prune 0.4 --protect 1:0,7 -o "$WORK/prot.gguf" >/dev/null
check "kept experts: the 5 highest means, the 5 highest sums with --frequency, protected ones always" python3 - "$WORK" <<'PY'
import json, sys
from gguf_read import Gguf
w = sys.argv[1]
d = json.load(open(w + '/tiny.json')); E = d['n_expert']
def best(score, n, prot=()):
    order = sorted(range(E), key=lambda j: (j not in prot, -score[j], -cnt[j], j))
    return sorted(order[:n])
want = {'mean': [], 'freq': [], 'prot': []}
for l in d['layers']:
    cnt = l['count']
    want['mean'] += best(l['saliency'], 5)
    want['freq'] += best(l['sum_gate_norm'], 5)
    want['prot'] += best(l['saliency'], 5, {7} | ({0} if l['layer'] == 1 else set()))
for k in want:
    got = Gguf(w + '/' + k + '.gguf').kv['ringlm.reap.kept_experts']
    assert got == want[k], (k, got, want[k])
print('mean', want['mean'][:5], 'freq', want['freq'][:5])
PY

# ---- the report ------------------------------------------------------------------------------------------
check "reap --report on held-out text" "$RINGLM" reap -m "$g" --scores "$WORK/tiny.json" --keep 4 -o "$WORK/r.gguf" \
    --report "$WORK/report.md" --eval "$WORK/heldout.txt" --threads 2
check "report: agreement 1 and KL 0 at 0%, agreement falling and KL rising as more is pruned" python3 - "$WORK/report.md" <<'PY'
import sys
rows = [l.split('|')[1:-1] for l in open(sys.argv[1]) if l.startswith('| ') and '%' in l.split('|')[1]]
rows = [(float(r[0].split('%')[0]), float(r[2]), float(r[3]), float(r[4])) for r in rows]
print(rows)
assert [r[0] for r in rows] == [0.0, 25.0, 50.0, 75.0], rows
assert rows[0][1] == 1.0 and rows[0][2] == 0.0
for a, b in zip(rows, rows[1:]):
    assert b[1] <= a[1] and b[2] >= a[2], (a, b)
assert rows[-1][1] < 1.0 and rows[-1][2] > 0
PY
check "report: unpruned perplexity stated, chosen row marked" grep -q "50.0% (chosen)" "$WORK/report.md"

# ---- JSONL chat calibration, DSpark on a pruned target -------------------------------------------------
printf '%s\n' '{"messages": [{"role": "user", "content": "What is a ring?"}, {"role": "assistant", "content": "A loop of machines."}]}' \
    '' '{"text": "Plain text on a line of its own."}' >"$WORK/chat.jsonl"
check "JSONL calibration (chat messages rendered with the template, and text)" \
    "$RINGLM" reap -m "$g" --calib "$WORK/chat.jsonl" --scores "$WORK/chat.json" --threads 2
check "  counts every token of both lines" python3 -c "
import json; d = json.load(open('$WORK/chat.json')); assert 20 < d['tokens'] < 200, d['tokens']; print(d['tokens'])"
"$RINGLM" synth --no-progress --config tiny --draft dspark -o "$WORK/ds.gguf" --seed 4
"$RINGLM" run -m "$WORK/r.gguf" --tokens 5,6,7,8 -n 24 --temp 0 --ignore-eos --ids --threads 2 >"$WORK/plain.ids" 2>/dev/null
check "a DSpark draft drafts for the pruned target, greedy text unchanged" \
    bash -c '"$1" run -m "$2" --tokens 5,6,7,8 -n 24 --temp 0 --ignore-eos --ids --threads 2 --draft "dspark:$3" >"$4" 2>"$5" &&
             same_files "$4" "$6" && grep -q "draft" "$5"' _ "$RINGLM" "$WORK/r.gguf" "$WORK/ds.gguf" "$WORK/ds.ids" "$WORK/ds.err" "$WORK/plain.ids"

# ---- over a ring: each stage scores its own layers -------------------------------------------------------
mkdir -p "$RING/models"
ln -sf "$g" "$RING/models/tiny.gguf"
ring_keys 4
trap 'ring_stop || true; rm -rf "$WORK"' EXIT
for i in 1 2 3; do ring_start $i "$RING/models" || exit 1; done
ring_conf "$RING/ring.conf" 1 2 3
check "reap --ring: scoring through a 3-node ring" sh -c '"$@" >"$0" 2>&1' "$WORK/ring.out" \
    "$RINGLM" reap -m "$g" --calib "$WORK/calib.txt" --tokens 2000 --scores "$WORK/ring.json" --ring "$RING/ring.conf" --key "$RING/coord.key" --progress
check "  the ring had 3 stages" grep -q "total  3 nodes" "$WORK/ring.out"
check "scores over the 3-node ring equal one machine's, every sum bit for bit" python3 - "$WORK/tiny.json" "$WORK/ring.json" <<'PY'
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert a['tokens'] == b['tokens'] == 2000 and len(a['layers']) == len(b['layers'])
for la, lb in zip(a['layers'], b['layers']):
    for k in ('count', 'sum_gate_norm', 'sum_gate', 'sum_norm', 'saliency'):
        assert la[k] == lb[k], (la['layer'], k, la[k], lb[k])
PY
check "pruning from the ring's scores writes the same file" bash -c '"$1" reap -m "$2" --scores "$3" --keep 5 -o "$4" && same_files "$4" "$5"' \
    _ "$RINGLM" "$g" "$WORK/ring.json" "$WORK/ringmean.gguf" "$WORK/mean.gguf"
check "reap --ring without --key is a usage error" usage_fails "needs --key" "$RINGLM" reap -m "$g" --calib "$WORK/calib.txt" --scores "$WORK/x.json" --ring "$RING/ring.conf"
# A node that sends malformed or duplicated routing fails the scoring, named (scores are data, not hints).
for mode in badroutes duproutes; do
    RING_BIN=$ROOT/build/adv/ringlm ring_start 4 "$RING/models" --misbehave "$mode" || exit 1
    ring_conf "$RING/liar.conf" 1 4 3
    check_fails "a node sending $mode fails the scoring, named" \
        "node 127.0.0.1:${RING_PORT[4]} sent (malformed routing statistics|a second set of routing statistics)" \
        "$RINGLM" reap -m "$g" --calib "$WORK/calib.txt" --tokens 600 --scores "$WORK/bad.json" --ring "$RING/liar.conf" --key "$RING/coord.key"
    kill "${RING_PID[4]}"; wait "${RING_PID[4]}" 2>/dev/null || true; unset 'RING_PID[4]'
done
check "  and no scores file was written" test ! -e "$WORK/bad.json"
ring_stop

# ---- bad requests: refused before any work ---------------------------------------------------------------
: >"$WORK/empty.txt"
check_fails "keeping fewer experts than the router uses" "fewer than the 2 the router uses" \
    "$RINGLM" reap -m "$g" --calib "$WORK/calib.txt" --keep 1 -o "$WORK/x.gguf"
check_fails "keeping more experts than there are" "the model has 8" \
    "$RINGLM" reap -m "$g" --calib "$WORK/calib.txt" --keep 9 -o "$WORK/x.gguf"
check "a fraction outside (0, 1) is a usage error" usage_fails "want a fraction in \(0, 1\)" "$RINGLM" reap -m "$g" --calib "$WORK/calib.txt" --prune 1.5 -o "$WORK/x.gguf"
check "a fraction of 0 is a usage error" usage_fails "want a fraction in \(0, 1\)" "$RINGLM" reap -m "$g" --calib "$WORK/calib.txt" --prune 0 -o "$WORK/x.gguf"
check_fails "both --keep and --prune" "one of --keep N and --prune" "$RINGLM" reap -m "$g" --calib "$WORK/calib.txt" --prune 0.5 --keep 4 -o "$WORK/x.gguf"
check_fails "an empty calibration file" "empty.txt has no text" "$RINGLM" reap -m "$g" --calib "$WORK/empty.txt" --keep 4 -o "$WORK/x.gguf"
check_fails "a missing calibration file" "cannot open calibration file .*nope.txt" "$RINGLM" reap -m "$g" --calib "$WORK/nope.txt" --keep 4 -o "$WORK/x.gguf"
printf '%s\n' '{"text": "fine"}' '{"messages": [{"role": "pilot", "content": "x"}]}' >"$WORK/bad.jsonl"
check_fails "a malformed JSONL line is named" "bad.jsonl line 2: message 0 needs a role" "$RINGLM" reap -m "$g" --calib "$WORK/bad.jsonl" --keep 4 -o "$WORK/x.gguf"
printf '%s\n' '{"text": "fine"}' '[1, 2]' >"$WORK/arr.jsonl"
check_fails "a JSONL line that is not an object" "arr.jsonl line 2: not a JSON object" "$RINGLM" reap -m "$g" --calib "$WORK/arr.jsonl" --keep 4 -o "$WORK/x.gguf"
printf '%s\n' '{"prompt": "fine"}' >"$WORK/nokey.jsonl"
check_fails "a JSONL object with neither text nor messages" 'nokey.jsonl line 1: needs "text"' "$RINGLM" reap -m "$g" --calib "$WORK/nokey.jsonl" --keep 4 -o "$WORK/x.gguf"
check_fails "no calibration and no scores" "give calibration text" "$RINGLM" reap -m "$g" --keep 4 -o "$WORK/x.gguf"
check_fails "--report without held-out text" "needs held-out text" "$RINGLM" reap -m "$g" --calib "$WORK/calib.txt" --keep 4 --report "$WORK/x.md"
check_fails "the output is the input" "is the input model" "$RINGLM" reap -m "$g" --calib "$WORK/calib.txt" --keep 4 -o "$g"
check_fails "a scores file of another model" "do not fit" "$RINGLM" reap -m "$WORK/r.gguf" --scores "$WORK/tiny.json" --keep 3 -o "$WORK/x.gguf"
check_fails "a file that is not a scores file" "not a ringlm reap scores file" "$RINGLM" reap -m "$g" --scores "$WORK/calib.txt" --keep 4 -o "$WORK/x.gguf"
check_fails "a protected expert out of range" "--protect: expert 8" "$RINGLM" reap -m "$g" --scores "$WORK/tiny.json" --keep 4 --protect 8 -o "$WORK/x.gguf"
check_fails "more protected than kept" "3 experts protected, more than the 2 kept" "$RINGLM" reap -m "$g" --scores "$WORK/tiny.json" --keep 2 --protect 1,2,3 -o "$WORK/x.gguf"
"$TOOLS/gguf_edit" "$g" "$WORK/sliced.gguf" --reshape blk.2.ffn_up_exps.weight 128,128,6
check_fails "an inconsistently sliced file is refused by tensor name" "ffn_up_exps" "$RINGLM" reap -m "$WORK/sliced.gguf" --calib "$WORK/calib.txt" --keep 4 -o "$WORK/x.gguf"
check_fails "a missing held-out file, before any scoring" "cannot open held-out file .*gone.txt" \
    "$RINGLM" reap -m "$g" --calib "$WORK/calib.txt" --keep 4 --report "$WORK/x.md" --eval "$WORK/gone.txt"
echo '{"base": "tiny", "name": "dense", "n_dense_lead": 6}' >"$WORK/dense.json"
check_fails "a model without MoE layers" "has no MoE layer \\(6 dense layers of 6\\)" \
    "$RINGLM" reap -m "$(model dense "$WORK/dense.json" f32)" --calib "$WORK/calib.txt" --keep 4 -o "$WORK/x.gguf"
check_fails "an output folder that does not exist, before any scoring" "cannot write .*/no/such/out.gguf" \
    "$RINGLM" reap -m "$g" --calib "$WORK/calib.txt" --keep 4 -o "$WORK/no/such/out.gguf"
"$TOOLS/gguf_edit" "$g" "$WORK/notmpl.gguf" --set-str tokenizer.chat_template "{{ messages }}"
check "a model whose chat template ringlm does not render is still calibrated on plain text" \
    "$RINGLM" reap -m "$WORK/notmpl.gguf" --calib "$WORK/calib.txt" --tokens 300 --scores "$WORK/nt.json" --threads 2
check_fails "... but its JSONL chat lines are refused, named" "chat.jsonl line 1: chat messages, but the model's chat template" \
    "$RINGLM" reap -m "$WORK/notmpl.gguf" --calib "$WORK/chat.jsonl" --scores "$WORK/nt.json" --threads 2
check "no output was left behind by a refused request" test ! -e "$WORK/x.gguf"
finish
