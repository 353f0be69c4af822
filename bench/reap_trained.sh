#!/usr/bin/env bash
# REAP's quality report on a model that has learned something (issue #22): the trained small K3
# (tools/train) pruned by REAP saliency, by frequency-weighted saliency, and - for contrast - its untrained
# starting point (the same shapes with synth's random weights) pruned by REAP, each reported by
# `ringlm reap --report`: top-1 agreement with the unpruned model, mean KL and perplexity on held-out text
# at 0/25/50/75% of the experts pruned.
#
#   bench/reap_trained.sh [--trained DIR|auto] [--tokens N] [--eval-docs N] [--threads N] [--out PREFIX]
#
# Text: calibration from the training documents, held-out text from the held-out documents
# (corpus/train.txt and corpus/heldout.txt of the trained pair's folder), as JSONL: a chat exchange as
# {"messages": [user, assistant]} (rendered with the model's chat template, as it was trained), other text
# as {"text"}. Defaults: auto, 16384 calibration tokens, 400 held-out documents, 2 threads, PREFIX
# bench/results/reap-trained (PREFIX.md: the three reports and the command). Every run is ringlm at its
# defaults; there is no llama.cpp peer (llama.cpp has no expert pruning).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
trained=auto tokens=16384 eval_docs=400 threads=2 out=bench/results/reap-trained
argv=; [ $# -eq 0 ] || argv=$(printf ' %q' "$@")
while [ $# -gt 0 ]; do
    case $1 in
        --trained) trained=$2 ;; --tokens) tokens=$2 ;; --eval-docs) eval_docs=$2 ;; --threads) threads=$2 ;;
        --out) out=$2 ;;
        *) echo "reap_trained: unknown option $1" >&2; exit 2 ;;
    esac
    shift 2
done
if [ "$trained" = auto ]; then
    trained=$(tools/train/build.sh --where --target-only) || die "no trained model on this machine (tools/train/build.sh builds it)"
fi
[ -f "$trained/target.gguf" ] && [ -f "$trained/init.gguf" ] && [ -f "$trained/corpus/heldout.txt" ] \
    || die "$trained is not a trained model's folder (target.gguf, init.gguf, corpus/)"
[ -x ./ringlm ] || make -s ringlm
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
# the documents as JSONL (tools/train/docs_io.py: chat exchanges rendered again with the chat template)
python3 tools/train/docs_io.py jsonl "$trained/corpus/train.txt" -n 6000 -o "$W/calib.jsonl"
python3 tools/train/docs_io.py jsonl "$trained/corpus/heldout.txt" -n "$eval_docs" -o "$W/eval.jsonl"
run() { # NAME MODEL EXTRA...: the report of one pruning
    local name=$1 m=$2; shift 2
    ./ringlm reap -m "$m" --calib "$W/calib.jsonl" --tokens "$tokens" --prune 0.5 -o "$W/$name.gguf" \
        --report "$W/$name.md" --eval "$W/eval.jsonl" --threads "$threads" --no-progress "$@" >"$W/$name.log" 2>&1 \
        || { cat "$W/$name.log" >&2; die "ringlm reap ($name) failed"; }
}
run reap "$trained/target.gguf"
run frequency "$trained/target.gguf" --frequency
run untrained "$trained/init.gguf"
{
    echo "# REAP on the trained small K3"
    echo
    echo "\`bench/reap_trained.sh$argv\`, $(date -u +%Y-%m-%d), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')."
    echo "Model: \`$trained/target.gguf\` (tools/train/build.sh). Calibration: $tokens tokens of training documents;"
    echo "held-out: the first $eval_docs held-out documents"
    echo "(chat exchanges rendered with the chat template, other text as it is). Every run is ringlm at its defaults;"
    echo "there is no llama.cpp peer (llama.cpp has no expert pruning)."
    echo
    echo "## Trained, REAP saliency"
    sed '1d' "$W/reap.md"
    echo
    echo "## Trained, frequency-weighted REAP (--frequency)"
    sed '1d' "$W/frequency.md"
    echo
    echo "## For contrast: the untrained starting point (same shapes, synth's random weights), REAP"
    sed '1d' "$W/untrained.md"
} >"$out.md"
cat "$out.md"
