#!/usr/bin/env bash
# build.sh - builds the trained small K3 and its DSpark draft once per machine, and prints their folder.
#
#   tools/train/build.sh [--smoke] [--target-only] [--ringlm PATH] [--where]
#
# Stages, each skipped when its output is there: the corpus (corpus.py, from Debian's wordnet-base,
# fortunes and bible-kjv-text), the vocabulary and the starting weights (`ringlm synth --corpus --type f32`), token ids
# (`ringlm tokenize`), the target (k3_train.py), the draft (`ringlm synth --draft dspark`, then
# dspark_train.py against the trained target's taps). The folder is
#   ${RINGLM_TRAINED_CACHE:-~/.cache/ringlm/trained}/<config>-<key>      target.gguf, target.json, ...
#   .../<config>-<key>/draft-<key2>                                     draft.gguf, draft.json
# where key hashes everything the target depends on: its scripts, the config, the ringlm sources that write
# the vocabulary and the starting weights, and the Debian versions of the corpus packages and torch; key2
# adds the draft's trainer. draft.gguf and draft.json beside target.gguf link to the current draft.
# So a model is trained once per machine and retrained when any of that changes. --smoke: CI's minute-long
# version (k3-smoke.json, few steps). --where builds nothing: it prints the folder when the pair is built
# there and exits 1 when it is not (what `make demo` asks). Needs python3-torch (Debian's, /usr/bin/python3) and OpenBLAS
# (libopenblas0-pthread: without it torch's matrix products run ~30x slower); scripts/install-deps.sh.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
ringlm=$root/ringlm
smoke=0
target_only=0
where=0
while [ $# -gt 0 ]; do
    case "$1" in
        --smoke) smoke=1 ;;
        --target-only) target_only=1 ;;
        --ringlm) ringlm=$2; shift ;;
        --where) where=1 ;;
        *) echo "usage: build.sh [--smoke] [--target-only] [--ringlm PATH] [--where]" >&2; exit 2 ;;
    esac
    shift
done
PY=/usr/bin/python3
if [ $smoke = 1 ]; then
    config=$here/k3-smoke.json
    target_opts="--steps 120 --batch 8 --ctx 64 --lr 1e-2 --eval-windows 32"
    draft_opts="--steps 120 --batch 8 --ctx 64 --lr 3e-3"
else
    config=$here/k3-small.json
    target_opts="--steps 2400 --batch 8 --ctx 128 --lr 3e-3"
    draft_opts="--steps 600 --batch 16 --ctx 128 --lr 2e-3"
fi
seed=1
name=$(basename "$config" .json)
# The target's key: what the target depends on. The draft's folder inside it adds the draft's trainer.
key=$( {
    cat "$here/corpus.py" "$here/gguf_io.py" "$here/k3_model.py" "$here/k3_train.py" "$here/train_util.py" "$config"
    echo "$target_opts | seed $seed"
    cat "$root"/src/tools/synth*.c "$root"/src/tools/synth*.h "$root"/src/text/tokenizer.c
    dpkg-query -W -f='${Package} ${Version}\n' wordnet-base fortunes bible-kjv-text bible-kjv python3-torch 2>/dev/null || true
} | sha256sum | cut -c1-16)
dkey=$( { cat "$here/dspark_model.py" "$here/dspark_train.py" 2>/dev/null; echo "$draft_opts"; } | sha256sum | cut -c1-16)
dir=${RINGLM_TRAINED_CACHE:-$HOME/.cache/ringlm/trained}/$name-$key
ddir=$dir/draft-$dkey
if [ $where = 1 ]; then
    [ -f "$dir/target.gguf" ] && { [ $target_only = 1 ] || [ -f "$ddir/draft.gguf" ]; } && echo "$dir" && exit 0
    exit 1
fi
$PY -c 'import torch' 2>/dev/null || { echo "build.sh: python3-torch is not installed (scripts/install-deps.sh)" >&2; exit 1; }
[ -x "$ringlm" ] || { echo "build.sh: no ringlm binary at $ringlm (make ringlm)" >&2; exit 1; }
mkdir -p "$dir"
log() { echo "build.sh: $*" >&2; }

if [ ! -f "$dir/corpus/train.txt" ]; then
    log "corpus (wordnet-base, fortunes, bible-kjv-text)"
    $PY "$here/corpus.py" "$dir/corpus.tmp" >&2 && rm -rf "$dir/corpus" && mv "$dir/corpus.tmp" "$dir/corpus"
fi
if [ ! -f "$dir/init.gguf" ]; then
    log "vocabulary and starting weights (ringlm synth --corpus)"
    "$ringlm" synth --config "$config" --corpus "$dir/corpus/vocab.txt" --type f32 --seed $seed \
        -o "$dir/init.gguf.tmp" --no-progress >&2 && mv "$dir/init.gguf.tmp" "$dir/init.gguf"
fi
for part in train heldout; do
    if [ ! -f "$dir/$part.ids" ]; then
        "$ringlm" tokenize -m "$dir/init.gguf" --special --file "$dir/corpus/$part.txt" >"$dir/$part.ids.tmp"
        mv "$dir/$part.ids.tmp" "$dir/$part.ids"
    fi
done
if [ ! -f "$dir/target.gguf" ]; then
    log "training the target ($target_opts)"
    # shellcheck disable=SC2086
    $PY "$here/k3_train.py" "$dir/init.gguf" "$dir/train.ids" "$dir/heldout.ids" "$dir/target.gguf.tmp" \
        "$dir/target.json" $target_opts --seed $seed >&2
    mv "$dir/target.gguf.tmp" "$dir/target.gguf"
fi
if [ $target_only = 0 ] && [ ! -f "$ddir/draft.gguf" ]; then
    mkdir -p "$ddir"
    if [ ! -f "$ddir/draft-init.gguf" ]; then
        "$ringlm" synth --config "$config" --draft dspark --corpus "$dir/corpus/vocab.txt" --type f32 --seed $seed \
            -o "$ddir/draft-init.gguf.tmp" --no-progress >&2 && mv "$ddir/draft-init.gguf.tmp" "$ddir/draft-init.gguf"
    fi
    log "training the DSpark draft ($draft_opts)"
    # shellcheck disable=SC2086
    $PY "$here/dspark_train.py" "$dir/target.gguf" "$ddir/draft-init.gguf" "$dir/train.ids" "$dir/heldout.ids" \
        "$ddir/draft.gguf.tmp" "$ddir/draft.json" $draft_opts --seed $seed >&2
    mv "$ddir/draft.gguf.tmp" "$ddir/draft.gguf"
fi
# The pair under fixed names (target.gguf is there already): what the demo, the tests and bench use.
if [ $target_only = 0 ]; then
    ln -sfn "draft-$dkey/draft.gguf" "$dir/draft.gguf"
    ln -sfn "draft-$dkey/draft.json" "$dir/draft.json"
fi
echo "$dir"
