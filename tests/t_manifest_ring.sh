#!/usr/bin/env bash
# A manifest ring (issue: no machine holds the whole model): a 5-file split set; the coordinator holds only
# the manifest, node A files 1-2, node B files 3-5, node C nothing. Memory caps make the plan use C, which
# pulls its layers from A and B; a cut that matches what A and B hold is preferred. Greedy text and logits
# equal one machine with the whole set (a float model and a quantized one), receipts verify against the
# manifest, serve works from the manifest. Restarted nodes remember what they verified (no second hash
# pass) and C maps what it pulled from its store. A damaged tensor in a node's split file is refused by
# file and tensor, also one a holder streams; a split file no node holds is named; audits and DSpark (which
# need the target's weights on the coordinator) are refused, saying why.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ring_lib.sh"
. "$(dirname "$0")/serve_lib.sh"
export PYTHONPATH=$ROOT/tests/tools
trap 'serve_stop_all; ring_stop; [ -n "${KEEP_WORK:-}" ] || rm -rf "$WORK"' EXIT
ring_keys 3
K=(--key "$RING/coord.key")
addr() { echo "127.0.0.1:${RING_PORT[$1]}"; }

# ring_conf with memory caps: A and B offer a third of the weights each, C what it has.
capped_conf() {
    local gb
    gb=$(python3 -c "import sys; print('%.6f' % (sum(int(x) for x in sys.argv[1:]) / 3 / 2**30))" \
        $(stat -c %s "$1"/sp-0000?-of-00005.gguf))
    printf '%s %s mem=%s\n%s %s mem=%s\n%s %s\n' "$(addr 1)" "$(cat "$RING/n1.pub")" "$gb" \
        "$(addr 2)" "$(cat "$RING/n2.pub")" "$gb" "$(addr 3)" "$(cat "$RING/n3.pub")" >"$WORK/ring.conf"
}
# (re)starts A, B, C over the folders of model set $1; extra args go to every node
start_abc() {
    local d=$1; shift
    ring_stop
    ring_start 1 "$d/A" "$@" && ring_start 2 "$d/B" "$@" && ring_start 3 "$d/C" "$@"
}

for c in "f32 tiny f32" "q8 k3-lean q8_0"; do
    read -r name config type <<<"$c"
    d=$WORK/$name
    mkdir -p "$d/A" "$d/B" "$d/C" "$d/coord"
    cfg=$config
    [ -f "$ROOT/tests/configs/$config.json" ] && cfg=$ROOT/tests/configs/$config.json
    "$RINGLM_SYNTH" synth --no-progress --config "$cfg" --type "$type" --seed 7 --split 5 -o "$d/sp.gguf" >/dev/null
    "$RINGLM" manifest --no-progress "$d/sp-00001-of-00005.gguf" -o "$d/coord/sp.manifest" >/dev/null
    cp "$d"/sp-0000[12]-of-00005.gguf "$d/A/"
    cp "$d"/sp-0000[345]-of-00005.gguf "$d/B/"
    M=$d/coord/sp.manifest
    start_abc "$d" || exit 1
    capped_conf "$d"
    V=$("$RINGLM" inspect --kv "$d/sp-00001-of-00005.gguf" | awk '$1 == "n_vocab" { print $2 }')
    t=$(toks 11 $((V - 256)) 40)
    p=$(toks 5 $((V - 256)) 12)
    "$RINGLM" logits -m "$d/sp-00001-of-00005.gguf" --tokens "$t" --prefill 24 -o "$WORK/local.bin"
    "$RINGLM" run -m "$d/sp-00001-of-00005.gguf" --tokens "$p" -n 24 --temp 0 --ignore-eos --ids --ctx 256 \
        >"$WORK/local.ids" 2>/dev/null
    "$RINGLM" run --manifest "$M" --tokens "$p" -n 24 --temp 0 --ignore-eos --ids --ctx 256 --ring "$WORK/ring.conf" \
        "${K[@]}" --receipts "$WORK/rc.jsonl" >"$WORK/ring.ids" 2>"$WORK/ring.err" || cat "$WORK/ring.err"
    check_same "$name: the coordinator holds only the manifest; same greedy tokens as one machine with the set" \
        "$WORK/local.ids" "$WORK/ring.ids"
    check "$name: the plan uses all three nodes, C streams what it lacks, and says which split files each stage needs" \
        sh -c 'grep -q "^    2  $1 .*streams .* it lacks" "$2" && grep -q "^stage 2 needs .*($1 holds 0 of" "$2" &&
               grep -q "^stage 0 needs sp-00001-of-00005.gguf.*holds" "$2"' _ "$(addr 3)" "$WORK/ring.err"
    check "$name: A and B map their own split files, C pulls every tensor of its range from them" \
        sh -c 'grep -q "from parts .* 0 (0.0 MiB) pulled" "$1" && grep -Eq "from parts .* [1-9][0-9]* \([0-9.]+ MiB\) pulled" "$2" &&
               grep -q "from parts .*: 0 tensors (0.0 MiB) from its split files" "$2"' _ "$RING/n1.log" "$RING/n3.log"
    check "$name: receipts verify against the manifest" \
        "$RINGLM" receipts verify "$WORK/rc.jsonl" --manifest "$M" --ring "$WORK/ring.conf"
    "$RINGLM" logits --manifest "$M" --tokens "$t" --prefill 24 --ring "$WORK/ring.conf" "${K[@]}" -o "$WORK/ring.bin"
    check "$name: logits through the manifest ring equal one machine bit for bit" \
        "$RINGLM" compare "$WORK/local.bin" "$WORK/ring.bin" --tol 0
done

# The plan's preference: with no caps, A and B hold the whole model between them, so the cut follows their
# files: C (which would make a faster plan) is left out, and only the layer whose tensors straddle files 2
# and 3 streams what its stage lacks (less than that layer).
d=$WORK/f32
M=$d/coord/sp.manifest
start_abc "$d" || exit 1
capped_conf "$d"
ring_conf "$WORK/open.conf" 1 2 3
"$RINGLM" run --manifest "$M" --tokens "$p" -n 4 --temp 0 --ring "$WORK/open.conf" "${K[@]}" >/dev/null 2>"$WORK/open.err" ||
    cat "$WORK/open.err"
check "uncapped: the cut follows what A and B hold (C left out, one stage streams under a MiB)" \
    sh -c 'grep -q "^total  2 nodes" "$1" && grep -q "^not used: $2" "$1" && [ "$(grep -c "streams" "$1")" = 1 ] &&
           grep -q "streams [0-9.]* KiB it lacks" "$1"' _ "$WORK/open.err" "$(addr 3)"

# Restarted nodes: what they verified is remembered (nothing hashed again), and C's pulls are in its store.
start_abc "$d" || exit 1
p=$(toks 5 700 12)
"$RINGLM" run -m "$d/sp-00001-of-00005.gguf" --tokens "$p" -n 16 --temp 0 --ignore-eos --ids --ctx 256 >"$WORK/local2.ids" 2>/dev/null
"$RINGLM" run --manifest "$M" --tokens "$p" -n 16 --temp 0 --ignore-eos --ids --ctx 256 --ring "$WORK/ring.conf" "${K[@]}" \
    >"$WORK/ring2.ids" 2>"$WORK/ring2.err" || cat "$WORK/ring2.err"
check_same "restarted nodes: same greedy tokens" "$WORK/local2.ids" "$WORK/ring2.ids"
check "restarted nodes: local tensors were verified before (0 checked now), C maps its store and pulls nothing" \
    sh -c 'grep -Eq "split files \(0 checked now, [1-9][0-9]* checked before\)" "$1" &&
           grep -Eq "[1-9][0-9]* from its store, 0 \(0.0 MiB\) pulled" "$2"' _ "$RING/n2.log" "$RING/n3.log"

# ringlm plan: the same plan, nothing loaded; it names the split files C lacks (what to download there).
loads=$(cat "$RING"/n?.log | grep -c "stage [0-9] of" || true)
"$RINGLM" plan --manifest "$M" --ring "$WORK/ring.conf" "${K[@]}" --ctx 256 >"$WORK/plan.out" 2>&1 || cat "$WORK/plan.out"
check "ringlm plan prints the plan and the split files the node without files lacks, and loads nothing" \
    sh -c 'grep -q "^stage 2 needs .*($1 holds 0 of [0-9]*; it lacks sp-0000[0-9]-of-00005.gguf" "$2" &&
           [ "$(cat "$3"/n?.log | grep -c "stage [0-9] of")" = "$4" ]' _ "$(addr 3)" "$WORK/plan.out" "$RING" "$loads"

# serve from the manifest: the same text as serve with the model.
ring_stop
start_abc "$d" || exit 1
serve_start man --manifest "$M" --ring "$WORK/ring.conf" "${K[@]}" --ctx 256 --parallel 2
serve_start loc -m "$d/sp-00001-of-00005.gguf" --ctx 256 --parallel 2 --threads 1
body='{"prompt": "the manifest ring", "max_tokens": 16, "temperature": 0}'
curl --max-time 60 -s "${SRV_URL[man]}/v1/completions" -d "$body" -o "$WORK/man.json"
curl --max-time 60 -s "${SRV_URL[loc]}/v1/completions" -d "$body" -o "$WORK/loc.json"
check "serve --manifest: a completion equals serve -m's" \
    python3 -c 'import json, sys; a, b = (json.load(open(f))["choices"][0]["text"] for f in sys.argv[1:]); assert a == b and a, (a, b)' \
    "$WORK/man.json" "$WORK/loc.json"
serve_stop_all
wait "${SRV_PID[@]}" 2>/dev/null || true

# Errors. A damaged tensor in B's own split file (inside the range B maps): refused by file and tensor,
# though B verified the file before (the rewrite changes its mtime).
cp -r "$d" "$WORK/bad"
rm -rf "$RING"/node-cache*
victim=$(python3 - "$M" "$WORK/bad/B/sp-00003-of-00005.gguf" <<'PY'
import sys
from gguf_read import Gguf
kv = Gguf(sys.argv[1]).kv
i = [k for k, fi in enumerate(kv['ringlm.manifest.file']) if fi == 2][2]
off = kv['ringlm.manifest.offset'][i] + kv['ringlm.manifest.nbytes'][i] // 2
with open(sys.argv[2], 'r+b') as f:
    f.seek(off); b = f.read(1); f.seek(off); f.write(bytes([b[0] ^ 0x10]))
print(kv['ringlm.manifest.names'][i])
PY
)
start_abc "$WORK/bad" || exit 1
check_fails "a damaged tensor in a node's split file is refused, naming the file and the tensor" \
    "sp-00003-of-00005.gguf: tensor $victim: its bytes do not hash as the manifest says" \
    "$RINGLM" run --manifest "$M" --tokens "$p" -n 4 --ring "$WORK/ring.conf" "${K[@]}" --ctx 256
# A damaged tensor B lends but does not map itself (the output head, file 5, on C's range): C refuses it.
cp "$d/B/sp-00003-of-00005.gguf" "$WORK/bad/B/"
python3 - "$M" "$WORK/bad/B/sp-00005-of-00005.gguf" <<'PY'
import sys
from gguf_read import Gguf
kv = Gguf(sys.argv[1]).kv
i = kv['ringlm.manifest.names'].index('output.weight')
off = kv['ringlm.manifest.offset'][i] + 100
with open(sys.argv[2], 'r+b') as f:
    f.seek(off); b = f.read(1); f.seek(off); f.write(bytes([b[0] ^ 0x01]))
PY
rm -rf "$RING"/node-cache*
start_abc "$WORK/bad" || exit 1
check_fails "a damaged tensor streamed from a holder is refused, naming the tensor and the holder" \
    "tensor output.weight streamed from node $(addr 2) \(its sp-00005-of-00005.gguf\) does not hash as the manifest says" \
    "$RINGLM" run --manifest "$M" --tokens "$p" -n 4 --ring "$WORK/ring.conf" "${K[@]}" --ctx 256
# A split file no node holds.
rm "$WORK/bad/B/sp-00004-of-00005.gguf"
start_abc "$WORK/bad" || exit 1
check_fails "a split file that no node holds is named" \
    "no node holds the split file sp-00004-of-00005.gguf \(needed for layers" \
    "$RINGLM" run --manifest "$M" --tokens "$p" -n 4 --ring "$WORK/ring.conf" "${K[@]}" --ctx 256
check "manifest --range-files names the split files a range needs" \
    sh -c '"$1" manifest --range-files 0:1 "$2" | grep -q "^sp-00001-of-00005.gguf [0-9]*$"' _ "$RINGLM" "$M"
start_abc "$d" || exit 1
check_fails "audits with only a manifest are refused, saying why" "with a manifest it holds none" \
    "$RINGLM" run --manifest "$M" --tokens "$p" -n 4 --ring "$WORK/ring.conf" "${K[@]}" --audit-rate 1
"$RINGLM_SYNTH" synth --no-progress --config tiny --draft dspark -o "$WORK/ds.gguf" --seed 5 >/dev/null
check_fails "DSpark with only a manifest is refused, saying why" "holds only the target's manifest" \
    "$RINGLM" run --manifest "$M" --tokens "$p" -n 4 --ring "$WORK/ring.conf" "${K[@]}" --draft "dspark:$WORK/ds.gguf"
rc=0
"$RINGLM" run --manifest "$M" --tokens "$p" -n 4 2>"$WORK/err" || rc=$?
check "--manifest without --ring is a usage error that says why" \
    sh -c '[ "$1" = 2 ] && grep -q -- "--manifest needs --ring" "$2"' _ "$rc" "$WORK/err"
finish
