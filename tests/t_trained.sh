#!/usr/bin/env bash
# The trained small K3 and its DSpark draft (issue #22), at CI's smoke size: tools/train/build.sh --smoke
# builds the corpus from Debian's wordnet-base, fortunes and bible-kjv-text, learns the vocabulary, trains a 4-layer K3 with
# every layer type (KDA, MLA, a dense block, the latent MoE with shared experts and the sigmoid router,
# AttnRes banks) for 120 steps and a DSpark draft against its taps for 120, in about half a minute. The models are
# cached under build/trained by content (the release and sanitizer passes share them).
#
# What must hold (each can fail):
# - training works: the loss curve falls, held-out perplexity ends far below the vocabulary size and below
#   the untrained model's; every MoE layer reports its experts' load on held-out text, summing to 1;
# - training is deterministic: a second build in another folder writes the same bytes (target and draft);
# - the files are what ringlm and llama.cpp run: llama.cpp loads both, ringlm's logits equal llama.cpp's
#   bit for bit at the defaults (flash attention, f16 cache) and on the softmax path over an f32 cache, in
#   a prefill and in decode steps, and 32 greedy tokens are the same;
# - the function the trainer optimizes is the one ringlm runs: tools/train/forward.py (torch, the KDA
#   recurrence in chunks and token by token) within 1e-5 x max|logit| of `ringlm logits`;
# - the draft learned: on held-out prompts its measured acceptance in `ringlm run` is well above the
#   untrained draft's (the same file before training), and speculative greedy text equals plain greedy text;
# - errors: synth --corpus with a missing or empty file, build.sh with an unknown option.
# Where this machine has built the full-size pair, its target equals llama.cpp bit for bit too.
. "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3
$PY -c 'import torch' || { echo "t_trained: python3-torch is missing (scripts/install-deps.sh installs it)"; exit 1; }

build() { # CACHE: builds (or finds) the smoke pair there, prints its folder
    RINGLM_TRAINED_CACHE=$1 "$ROOT/tools/train/build.sh" --smoke --ringlm "$RINGLM_SYNTH"
}
dir=$(build "$ROOT/build/trained" 2>"$WORK/build.log") || { cat "$WORK/build.log"; exit 1; }
echo "smoke pair in $dir"
T=$dir/target.gguf D=$dir/draft.gguf
check "the target was written" test -s "$T"
check "the draft was written" test -s "$D"

# ---- training worked --------------------------------------------------------------------------------------
j() { $PY -c 'import json, sys; r = json.load(open(sys.argv[1])); print(eval(sys.argv[2], {}, r))' "$@"; }
first=$(j "$dir/target.json" 'loss_curve[0][1]') last=$(j "$dir/target.json" 'loss_curve[-1][1]')
# The first loss is about ln(vocabulary) (k3_train scales the output head down to near-uniform logits): a
# model that learned anything is nats below it.
check "the training loss falls by 2 nats or more ($first -> $last)" awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 2) }'
ppl0=$(j "$dir/target.json" heldout_ppl_init) ppl=$(j "$dir/target.json" heldout_ppl) V=$(j "$dir/target.json" n_vocab)
echo "held-out perplexity: $ppl0 untrained -> $ppl trained (vocabulary $V)"
check "held-out perplexity ($ppl) is far below the vocabulary size ($V)" awk -v p="$ppl" -v v="$V" 'BEGIN { exit !(p < v / 20) }'
check "held-out perplexity falls with training ($ppl0 -> $ppl)" awk -v a="$ppl0" -v b="$ppl" 'BEGIN { exit !(b < a / 10) }'
check "every MoE layer's expert load on held-out text sums to 1" \
    j "$dir/target.json" 'len(expert_load) == 3 and all(abs(sum(v) - 1) < 1e-5 for v in expert_load.values()) or exit(1)'

# ---- deterministic -------------------------------------------------------------------------------------------
# The training itself is Python on torch and does not depend on the ringlm variant: once, in the release pass.
if [ "$RINGLM_BUILD" = build/release ]; then
    dir2=$(build "$WORK/again" 2>"$WORK/build2.log") || { cat "$WORK/build2.log"; exit 1; }
    check_same "a second build (another folder) writes the same target bytes" "$T" "$dir2/target.gguf"
    check_same "... and the same draft bytes" "$D" "$dir2/draft.gguf"
    check_eq "... and the same held-out perplexity" "$(j "$dir2/target.json" heldout_ppl)" "$ppl"
    rm -rf "$WORK/again"
fi

# ---- the files are what ringlm and llama.cpp run ---------------------------------------------------------
check "llama.cpp loads the trained target" "$ORACLE" info -m "$T"
check "llama.cpp loads the trained draft" "$ORACLE" info -m "$D"
# a held-out document's first 80 ids: real text, chat framing included
prompt=$(head -3 "$dir/heldout.ids" | tail -1 | cut -d, -f1-80)
for s in "::" "nofa:--flash-attn off --cache-type f32:--fa off --cache-type f32"; do
    IFS=: read -r set rargs oargs <<<"$s"
    # shellcheck disable=SC2086
    "$ORACLE" logits -m "$T" --tokens "$prompt" --prefill 48 -o "$WORK/o$set.bin" $oargs
    # shellcheck disable=SC2086
    "$RINGLM" logits -m "$T" --tokens "$prompt" --prefill 48 -o "$WORK/r$set.bin" --threads 2 $rargs
    check "ringlm equals llama.cpp bit for bit${rargs:+ ($rargs)}: 48-token prefill + 32 decode steps" \
        "$RINGLM" compare "$WORK/o$set.bin" "$WORK/r$set.bin" --tol 0
done
short=$(echo "$prompt" | cut -d, -f1-24)
"$ORACLE" generate -m "$T" --tokens "$short" -n 32 >"$WORK/o.ids"
"$RINGLM" run -m "$T" --tokens "$short" -n 32 --temp 0 --ignore-eos --ids --threads 2 >"$WORK/r.ids" 2>/dev/null
check_same "32 greedy tokens identical to llama.cpp's" "$WORK/o.ids" "$WORK/r.ids"

# ---- the trainer's function is ringlm's ------------------------------------------------------------------
"$RINGLM" logits -m "$T" --tokens "$prompt" -o "$WORK/r32.bin" --threads 2 --flash-attn off --cache-type f32
for mode in "" --loop; do
    $PY "$ROOT/tools/train/forward.py" "$T" --tokens "$prompt" -o "$WORK/torch.bin" $mode
    check "the trainer's forward pass${mode:+ ($mode)} is ringlm's within 1e-5" \
        "$RINGLM" compare "$WORK/r32.bin" "$WORK/torch.bin" --tol 1e-5
done
$PY "$ROOT/tools/train/forward.py" "$dir/init.gguf" --tokens "$prompt" -o "$WORK/torch0.bin"
check "a changed weight shows (the trained file's logits are not the untrained one's)" \
    sh -c '! "$@"' _ "$RINGLM" compare "$WORK/r32.bin" "$WORK/torch0.bin" --tol 1e-2

# ---- the draft learned -------------------------------------------------------------------------------------
# 6 held-out documents, each cut to its first 20 ids as a prompt; 32 greedy tokens with each draft.
acc() { # DRAFT: mean acceptance over the prompts; every speculative run must give plain greedy's ids
    local d=$1 i sum=0 p
    for i in 4 5 6 7 8 9; do
        p=$(sed -n "${i}p" "$dir/heldout.ids" | cut -d, -f1-20)
        "$RINGLM" run -m "$T" --tokens "$p" -n 32 --temp 0 --ignore-eos --ids --threads 2 >"$WORK/g$i.ids" 2>/dev/null
        "$RINGLM" run -m "$T" --tokens "$p" -n 32 --temp 0 --ignore-eos --ids --threads 2 --draft "dspark:$d" \
            --draft-fixed --draft-fallback off --metrics-json "$WORK/m.json" >"$WORK/s$i.ids" 2>/dev/null
        same_files "$WORK/g$i.ids" "$WORK/s$i.ids" || { echo "prompt $i: speculative ids differ (or are missing)" >&2; return 1; }
        sum=$(awk -v s="$sum" -v a="$(j "$WORK/m.json" acceptance_rate)" 'BEGIN { print s + a }')
    done
    awk -v s="$sum" 'BEGIN { printf "%.4f\n", s / 6 }'
}
check "speculation with the trained draft gives plain greedy's ids" acc "$D"
a_trained=$(cat "$WORK/out")
check "speculation with the untrained draft gives plain greedy's ids" acc "$(dirname "$(readlink -f "$D")")/draft-init.gguf"
a_init=$(cat "$WORK/out")
echo "DSpark acceptance on held-out prompts: untrained $a_init, trained $a_trained"
check "the trained draft's acceptance ($a_trained) is at least twice the untrained one's ($a_init) and above 0.1" \
    awk -v t="$a_trained" -v u="$a_init" 'BEGIN { exit !(t >= 2 * u && t > 0.1) }'

# ---- copy_probe (docs/trained.md: does the model repeat the asked word?) reads this corpus's exchanges -----
# Its default cues are corpus.py's reasoning line and answer head: all 20 exchanges found, none skipped (a
# cue that no longer matches the format, or a cut that tokenizes apart from the document, shows here).
$PY "$ROOT/tools/train/copy_probe.py" "$T" "$dir/corpus/heldout.txt" "$dir/heldout.ids" --n 20 \
    --ringlm "$RINGLM" >"$WORK/probe.out" 2>&1
check "copy_probe: both spans found in 20 held-out exchanges, none skipped" \
    test "$(grep -Ec 'whole spans [0-9]+/20 = [0-9.]+ \(0 skipped\)' "$WORK/probe.out")" = 2
$PY "$ROOT/tools/train/copy_probe.py" "$T" "$dir/corpus/heldout.txt" "$dir/heldout.ids" --n 20 --swap \
    --ringlm "$RINGLM" >"$WORK/probe-swap.out" 2>&1
check "copy_probe --swap (the question's word swapped): both spans found in 20 exchanges, none skipped" \
    test "$(grep -Ec 'whole spans [0-9]+/20 = [0-9.]+ \(0 skipped\)' "$WORK/probe-swap.out")" = 2
check_fails "copy_probe: a --cue without its --end" "give an --end for every --cue" \
    $PY "$ROOT/tools/train/copy_probe.py" "$T" "$dir/corpus/heldout.txt" "$dir/heldout.ids" --cue x
# --swap with the answer's span first: its text ('"word', the opening quote included) is quoted nowhere
# before it, so there is no question to swap it in.
check_fails "copy_probe --swap: a first span not quoted before its cue" "nothing to swap" \
    $PY "$ROOT/tools/train/copy_probe.py" "$T" "$dir/corpus/heldout.txt" "$dir/heldout.ids" --n 5 --swap \
    --cue '<|open|>response<|sep|>' --end '":' --ringlm "$RINGLM"

# ---- run --chat prints the reply's channels, not the framing's section names -----------------------------
# A trained model closes its think section and opens the response (an untrained one rarely does): the text
# is then the reasoning, a blank line, the answer, without "think"/"response" between them. chat_split
# MODEL: checks that on the first prompt whose greedy reply opens a response section; 1 if none does.
chat_split() {
    local m=$1 q opener
    opener=$("$RINGLM" tokenize -m "$m" --special '<|close|>think<|sep|><|open|>response<|sep|>')
    for q in 'Define "happiness".' 'What is "cat"?' 'What does "harbor" mean?' 'What is "water"?' 'Define "run".'; do
        "$RINGLM" run -m "$m" --chat -p "$q" -n 60 --temp 0 --ids --threads 2 >"$WORK/chat.ids" 2>/dev/null
        if grep -q "\(^\|,\)$opener\(,\|$\)" "$WORK/chat.ids"; then
            "$RINGLM" run -m "$m" --chat -p "$q" -n 60 --temp 0 --threads 2 >"$WORK/chat.txt" 2>/dev/null
            check "run --chat '$q' on $(basename "$(dirname "$m")"): reasoning, a blank line, the answer; no section names" python3 -c '
import sys; t = open(sys.argv[1]).read()
assert t.count("\n\n") >= 1 and t.split("\n\n")[0] and t.split("\n\n", 1)[1], repr(t)
assert "thinkresponse" not in t and not t.endswith("response") and "<|" not in t, repr(t)' "$WORK/chat.txt"
            return 0
        fi
    done
    return 1
}
# The smoke model often garbles the section name (a 1024-token vocabulary spells "response" in 5 pieces);
# the full-size pair below, where built, must open it.
chat_split "$T" || echo "(the smoke model opened no response section on these prompts: checked on the full pair only)"

# ---- the full-size pair, where this machine has built it (tools/train/build.sh; not in a fresh CI) --------
if full=$("$ROOT/tools/train/build.sh" --where 2>/dev/null); then
    F=$full/target.gguf
    p=$(sed -n 2p "$full/heldout.ids" | cut -d, -f1-80)
    "$ORACLE" logits -m "$F" --tokens "$p" --prefill 48 -o "$WORK/of.bin"
    "$RINGLM" logits -m "$F" --tokens "$p" --prefill 48 -o "$WORK/rf.bin" --threads 2
    check "the full trained K3 ($full): ringlm equals llama.cpp bit for bit" \
        "$RINGLM" compare "$WORK/of.bin" "$WORK/rf.bin" --tol 0
    check "the full trained draft loads in llama.cpp" "$ORACLE" info -m "$full/draft.gguf"
    chat_split "$F" || check "the full trained K3 opens a response section on one of the chat prompts" false
else
    echo "(the full trained pair is not built on this machine: its checks are skipped)"
fi

# ---- errors ---------------------------------------------------------------------------------------------------
check_fails "synth --corpus names a missing file" "corpus file.*$WORK/none.txt" \
    "$RINGLM" synth --no-progress --config tiny --corpus "$WORK/none.txt" -o "$WORK/x.gguf"
: >"$WORK/empty.txt"
check_fails "synth --corpus refuses an empty file" "corpus file $WORK/empty.txt is empty" \
    "$RINGLM" synth --no-progress --config tiny --corpus "$WORK/empty.txt" -o "$WORK/x.gguf"
check "build.sh refuses an unknown option (exit 2)" sh -c '"$1" --bogus 2>/dev/null; [ $? = 2 ]' _ "$ROOT/tools/train/build.sh"
check "build.sh --where on an empty cache: exit 1, nothing printed, nothing built" sh -c \
    'out=$(RINGLM_TRAINED_CACHE="$1/empty" "$2" --where --smoke); [ $? = 1 ] && [ -z "$out" ] && [ ! -e "$1/empty" ]' _ "$WORK" "$ROOT/tools/train/build.sh"
check_fails "build.sh names a missing ringlm binary" "no ringlm binary at $WORK/none" \
    env RINGLM_TRAINED_CACHE="$WORK/c3" "$ROOT/tools/train/build.sh" --smoke --ringlm "$WORK/none"
finish
