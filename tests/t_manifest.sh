#!/usr/bin/env bash
# ringlm manifest (issue: a manifest for a coordinator that holds no weights): a model's manifest gives
# every layer range's manifest hash (what receipts carry) without the weights, equal to the hash over the
# model itself, for a split set and one file alike; its file/offset/hash entries point at the tensors'
# bytes; metadata changes change it; damaged manifests are refused, naming what is wrong; --check verifies
# any subset of the split files against it, naming a damaged tensor's file and name and the files not given.
. "$(dirname "$0")/lib.sh"
export PYTHONPATH=$ROOT/tests/tools
f=$(model tiny-f32 tiny f32 1)
"$RINGLM" synth --no-progress --config tiny --seed 1 --split 3 -o "$WORK/sp.gguf"
check "a manifest of one file" "$RINGLM" manifest "$f" -o "$WORK/one.manifest"
check "a manifest of a split set of 3" "$RINGLM" manifest "$WORK/sp-00001-of-00003.gguf" -o "$WORK/sp.manifest"
check "  the manifest is small (under 1% of the weights)" \
    test "$(stat -c %s "$WORK/sp.manifest")" -lt "$(( $(stat -c %s "$f") / 100 ))"
L=$("$RINGLM" inspect --kv "$f" | awk '$1 == "n_layer" { print $2 }')
bad=0 n=0
for a in $(seq 0 $((L - 1))); do
    for b in $(seq $((a + 1)) "$L"); do
        h1=$("$RINGLM" manifest --range-hash "$a:$b" "$f")
        h2=$("$RINGLM" manifest --range-hash "$a:$b" "$WORK/sp-00002-of-00003.gguf")
        h3=$("$RINGLM" manifest --range-hash "$a:$b" "$WORK/one.manifest")
        h4=$("$RINGLM" manifest --range-hash "$a:$b" "$WORK/sp.manifest")
        n=$((n + 1))
        { [ -n "$h1" ] && [ "$h1" = "$h2" ] && [ "$h1" = "$h3" ] && [ "$h1" = "$h4" ]; } || { bad=$((bad + 1)); echo "  [$a, $b): $h1 $h2 $h3 $h4"; }
    done
done
check "every one of the $n ranges: the manifests' hashes equal the model's (one file and split set; $bad differ)" test $bad = 0
check "the split set's manifest names its files, and every tensor's file, offset and BLAKE2b are its bytes" python3 - "$WORK" <<'PY'
import hashlib, sys
from gguf_read import Gguf
w = sys.argv[1]
m = Gguf(w + '/sp.manifest')
kv = m.kv
files = kv['ringlm.manifest.files']
assert files == ['sp-%05d-of-00003.gguf' % i for i in (1, 2, 3)], files
names, fi, off, nb, hs = (kv['ringlm.manifest.' + k] for k in ('names', 'file', 'offset', 'nbytes', 'hash'))
data = [open(w + '/' + f, 'rb').read() for f in files]
for i, name in enumerate(names):
    b = data[fi[i]][off[i]:off[i] + nb[i]]
    assert hashlib.blake2b(b, digest_size=32).digest() == bytes(hs[32 * i:32 * i + 32]), name
assert 'split.count' not in kv and m.tensors == {}
print(len(names), 'tensors checked')
PY
# --check: the split files a node downloaded, against the manifest, tensor by tensor.
check "--check: two of the three split files match, and the third is named as not given" sh -c \
    '"$1" manifest --check "$2" "$3" "$4" >"$5" && grep -qx "ok: 2 files match the manifest" "$5" &&
     grep -q "to fetch for a whole set: sp-00001-of-00003.gguf" "$5"' _ "$RINGLM" "$WORK/sp.manifest" \
    "$WORK/sp-00002-of-00003.gguf" "$WORK/sp-00003-of-00003.gguf" "$WORK/chk.out"
mkdir -p "$WORK/bad" && cp "$WORK/sp-00002-of-00003.gguf" "$WORK/bad/"
victim=$(python3 - "$WORK/sp.manifest" "$WORK/bad/sp-00002-of-00003.gguf" <<'PY'
import sys
from gguf_read import Gguf
kv = Gguf(sys.argv[1]).kv
i = [k for k, fi in enumerate(kv['ringlm.manifest.file']) if fi == 1][3]
off = kv['ringlm.manifest.offset'][i] + kv['ringlm.manifest.nbytes'][i] // 2
with open(sys.argv[2], 'r+b') as f:
    f.seek(off); b = f.read(1); f.seek(off); f.write(bytes([b[0] ^ 0x40]))
print(kv['ringlm.manifest.names'][i])
PY
)
check_fails "--check: one flipped bit in a tensor is refused, naming the file and the tensor" \
    "bad/sp-00002-of-00003.gguf: tensor $victim: its bytes do not hash as the manifest says" \
    "$RINGLM" manifest --check "$WORK/sp.manifest" "$WORK/bad/sp-00002-of-00003.gguf"
check_fails "--check: a file of another set is named" "tiny-f32-s1.gguf: not a file of this model" \
    "$RINGLM" manifest --check "$WORK/sp.manifest" "$f"
"$TOOLS/gguf_edit" "$f" "$WORK/renamed.gguf" --set-str general.name other
"$RINGLM" manifest "$WORK/renamed.gguf" -o "$WORK/renamed.manifest" >/dev/null
check_ne "a metadata change changes the manifest's hashes" \
    "$("$RINGLM" manifest --range-hash 2:4 "$WORK/renamed.manifest")" "$("$RINGLM" manifest --range-hash 2:4 "$WORK/one.manifest")"
head -c 3000 "$WORK/one.manifest" >"$WORK/cut.manifest"
check_fails "a truncated manifest" "not a GGUF file .*or a damaged one|not a ringlm manifest" \
    "$RINGLM" manifest --range-hash 0:2 "$WORK/cut.manifest"
"$TOOLS/gguf_edit" "$WORK/one.manifest" "$WORK/nohash.manifest" --del-key ringlm.manifest.hash
check_fails "a manifest without its hashes, named" "ringlm.manifest.hash missing" \
    "$RINGLM" manifest --range-hash 0:2 "$WORK/nohash.manifest"
"$TOOLS/gguf_edit" "$WORK/one.manifest" "$WORK/v9.manifest" --set-u32 ringlm.manifest.version 9
check_fails "a manifest of another version" "not a ringlm manifest \(version 1\)" \
    "$RINGLM" manifest --range-hash 0:2 "$WORK/v9.manifest"
check_fails "a range outside the model" "not inside the model's $L layers" "$RINGLM" manifest --range-hash 3:99 "$WORK/one.manifest"
check_fails "a model that is not there" "nope.gguf" "$RINGLM" manifest "$WORK/nope.gguf" -o "$WORK/x.manifest"
check "  and no manifest was written" test ! -e "$WORK/x.manifest"
finish
