#!/usr/bin/env bash
# Speculative decoding through a ring over emulated internet links: greedy tok/s against speculative tok/s
# for each drafter, on one ring of N nodes with every link through `ringlm relay` (docs/relay.md,
# docs/spec.md). The "machines" are local processes; this kernel has no netem.
#
#   bench/bench_spec.sh [--model FILE] [--nodes N] [--threads N] [--delay D] [--gen N] [--reps N]
#                       [--drafters "ngram self twin dspark"] [--depths "1 2"] [--draft-n K] [--self-type TYPE]
#                       [--passage N] [--repeat R] [--config NAME --seed S] [--draft-dir DIR]
#                       [--timeout S] [--out PREFIX] [--keep] [--no-build]
#                       [--trained DIR|auto [--heldout-from K]]
#
# Defaults: bench/models/medium.gguf (synthesized once if absent, medium preset, seed 1, as bench_ring.sh),
# 4 nodes, 1 thread per node and for the coordinator's drafter (the machine has 2 cores), one-way delay
# 30 ms, 64 generated tokens, 3 repetitions, drafts of up to 7 tokens (--draft-n, ringlm's default, adaptive),
# --timeout 600 s per run. Writes PREFIX.json and PREFIX.md (default bench/results/spec). --keep keeps the
# work folder (logs, per-run metrics and token ids) under build/bench/; it is kept anyway when the run fails.
# --no-build skips `make ringlm` (which also only runs when ./ringlm is missing).
#
# The ring is bench_ring.sh's: N `ringlm node`s, each behind its own relay; ring.conf lists the relays, so
# the coordinator's link to stage 0, every stage i -> i+1 link and the last stage's result back each cross
# one relay: N + 1 delays per traversal.
#
# The task: a prompt of --passage seeded token ids repeated --repeat times (default 32 x 4 = 128 tokens), then
# --gen tokens, every run greedy (`--temp 0 --ignore-eos --ids`). Real models quote and edit, so their output
# repeats the prompt and prompt lookup pays; these weights are random and do not copy, so whatever n-gram
# acceptance there is comes from repetition in the greedy output itself. The report says how much there
# was (how often prompt lookup's first guess would have been right on the greedy output).
#
# Drafters (--drafters, any of; default all four):
#   ngram   `--draft ngram` (prompt lookup)
#   self    `--draft FILE`: the target itself at fewer bits: the same synth config and seed with every matrix
#           at --self-type (default q4_K; same seed = same weights at any type, docs/synth.md), written once
#           to DIR/CONFIG-sSEED-TYPE.gguf (--draft-dir, default bench/models). Run on the coordinator.
#           On these random weights quantization changes the logits wholesale (medium against its q4_K
#           copy: the same top token at 1 of 16 positions), so it agrees rarely.
#   twin    `--draft MODEL`: the target file itself as its own draft (bit-identical weights): the upper bound
#           of a draft model that agrees, at the cost of a full model pass per drafted token on the
#           coordinator. The drafter that reaches 4+ tokens per traversal, so the goal below is tested.
#   dspark  `--draft dspark:FILE`: `ringlm synth --config CONFIG --seed SEED --draft dspark`, written once to
#           DIR/CONFIG-sSEED-dspark.gguf. Its weights are random: expect acceptance near zero.
# CONFIG and SEED are read from the model's general.description ("ringlm synth --config C --seed S");
# --config/--seed override it (needed for a model written from a JSON config, or not by synth).
#
# --trained DIR (auto: the pair tools/train/build.sh built on this machine, its --where): the trained small
# K3 (DIR/target.gguf) and its trained DSpark draft (DIR/draft.gguf) instead of synthesized ones, on
# held-out questions: repetition R asks the R-th question of the held-out chat exchanges (DIR/corpus/
# heldout.txt, from the K-th document on: --heldout-from K, default 1) with `--chat -p`, and the model answers
# until its end of message or --gen tokens. So the repetitions are prompts: each speculative run is compared
# with its own repetition's greedy run, and the medians are over prompts. (A continuation with --ignore-eos
# is no measure here: a small model's greedy text soon loops, whatever the prompt, and a loop is easy to
# draft.) The drafters default to "ngram twin dspark" (self needs a synthesized target). Issue #22's
# acceptance figures come from here (docs/trained.md).
# Depths (--depths): values of `ringlm run --draft-depth N` (speculative blocks in flight; 1 = one block,
# verified before the next is drafted). Used only if `ringlm run --help` mentions --draft-depth: the
# default is then "1 2", otherwise "1" (and the option is not passed).
#
# Each repetition runs the greedy baseline (no draft), then every drafter at every depth. Speculative greedy
# output must be the greedy output: the token ids of every run are compared with the first greedy run's.
# A drafter/depth whose run fails or whose ids differ is recorded and the benchmark goes on (a failing one is
# skipped in later repetitions); the script then exits 1 after writing the report. Goal (issue #5), judged
# at ringlm's default depth (read from `ringlm run --help`; the other depths are shown for comparison):
# speculative tok/s >= 2.5x greedy whenever the mean committed tokens per traversal is >= 4.
# With --trained it is judged on the trained DSpark draft alone (issue #22; twin is the upper bound beside it).
#
# Every process started here is stopped on exit (trap), every foreground run is bounded by --timeout, and
# the background ones carry a hard lifetime too, in case this script itself is killed with SIGKILL.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
argv=; [ $# -eq 0 ] || argv=$(printf ' %q' "$@")
model=bench/models/medium.gguf nodes=4 threads=1 delay=30 gen=64 reps=3 timeout_s=600 out=bench/results/spec
keep=0 build=1 drafters="ngram self twin dspark" depths= draft_n=7 self_type=q4_K passage=32 repeat=4
config= seed= draft_dir=bench/models trained= heldout_from=1
while [ $# -gt 0 ]; do
    case $1 in
        --model) model=$2; shift 2 ;;
        --nodes) nodes=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        --delay) delay=$2; shift 2 ;;
        --gen) gen=$2; shift 2 ;;
        --reps) reps=$2; shift 2 ;;
        --drafters) drafters=$2; shift 2 ;;
        --depths) depths=$2; shift 2 ;;
        --draft-n) draft_n=$2; shift 2 ;;
        --self-type) self_type=$2; shift 2 ;;
        --passage) passage=$2; shift 2 ;;
        --repeat) repeat=$2; shift 2 ;;
        --config) config=$2; shift 2 ;;
        --seed) seed=$2; shift 2 ;;
        --draft-dir) draft_dir=$2; shift 2 ;;
        --trained) trained=$2; shift 2 ;;
        --heldout-from) heldout_from=$2; shift 2 ;;
        --timeout) timeout_s=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --keep) keep=1; shift ;;
        --no-build) build=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "bench_spec: unknown option $1 (--help lists them)" >&2; exit 2 ;;
    esac
done
if [ -n "$trained" ]; then
    if [ "$trained" = auto ]; then
        trained=$(tools/train/build.sh --where) \
            || die "--trained auto: no trained pair on this machine (tools/train/build.sh builds it)"
    fi
    [ -f "$trained/target.gguf" ] && [ -f "$trained/draft.gguf" ] && [ -f "$trained/heldout.ids" ] \
        || die "--trained $trained: not a trained pair's folder (target.gguf, draft.gguf, heldout.ids)"
    model=$trained/target.gguf
    [[ " $argv " == *" --drafters "* ]] || drafters="ngram twin dspark"
    [[ " $drafters " == *" self "* ]] && die "--trained: the self drafter needs a synthesized target"
fi
positive_ints nodes:nodes threads:threads gen:gen reps:reps timeout_s:timeout draft_n:draft-n passage:passage repeat:repeat \
              heldout_from:heldout-from
[[ $delay =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "--delay: '$delay' is not a delay in ms"
[ -z "$seed" ] || [[ $seed =~ ^[0-9]+$ ]] || die "--seed must be a non-negative integer, got '$seed'"
[[ $self_type =~ ^[A-Za-z0-9_]+$ ]] || die "--self-type: '$self_type' is not a type name"
[ -n "${drafters// }" ] || die "--drafters needs at least one of: ngram self twin dspark"
seen=" "
for d in $drafters; do
    case $d in ngram|self|twin|dspark) ;; *) die "--drafters: unknown drafter '$d' (ngram self twin dspark)" ;; esac
    [[ $seen == *" $d "* ]] && die "--drafters: '$d' given twice"
    seen+="$d "
done

# ---- tools -------------------------------------------------------------------------------------------
need_tools python3 timeout awk
if [ $build = 1 ] && [ ! -x ./ringlm ]; then
    need_tools make
    make -s ringlm || die "building ringlm failed"
fi
RINGLM=$PWD/ringlm
[ -x "$RINGLM" ] || die "no ./ringlm (build it with make ringlm, or drop --no-build)"
need_subcommands relay node keygen synth inspect
run_help=$("$RINGLM" run --help 2>&1 || true)
grep -q -- '--draft ' <<<"$run_help" || die "this ringlm's run has no --draft option"
grep -q -- '--metrics-json' <<<"$run_help" || die "this ringlm's run has no --metrics-json option"
depth_ok=0 default_depth=1
grep -q -- '--draft-depth' <<<"$run_help" && depth_ok=1
if [ $depth_ok = 1 ]; then # ringlm's own default, from its help ("... (default D; at most 3)")
    # (the first "(default N" after the option's description: a greedy match took --node-timeout's 60)
    default_depth=$(tr '\n' ' ' <<<"$run_help" | grep -o -- '--draft-depth D ([^)]*)[^(]*(default [0-9]*' | grep -o '[0-9]*$' || true)
    [[ $default_depth =~ ^[1-9]$ ]] || default_depth=1
fi
if [ -z "$depths" ]; then
    if [ $depth_ok = 1 ]; then depths="1 2"; else depths=1; fi
fi
for k in $depths; do [[ $k =~ ^[1-9][0-9]*$ ]] || die "--depths: '$k' is not a depth"; done
depths=$(for k in $depths; do echo "$k"; done | sort -nu | tr '\n' ' ')
depths=${depths% }
[ -n "$depths" ] || die "--depths needs at least one value"
if [ $depth_ok = 0 ] && [ "$depths" != 1 ]; then
    die "--depths '$depths': this ringlm's run has no --draft-depth option (only depth 1, today's behaviour, can be measured)"
fi

mkdir -p bench/models "$(dirname "$out")" build/bench "$draft_dir"
if [ ! -f "$model" ]; then
    [ "$model" = bench/models/medium.gguf ] || die "no model file $model"
    echo "bench_spec: synthesizing $model (medium preset, seed 1, once)" >&2
    "$RINGLM" synth --config medium --seed 1 -o "$model.tmp" --progress && mv "$model.tmp" "$model"
fi
model=$(cd "$(dirname "$model")" && pwd)/$(basename "$model")
draft_dir=$(cd "$draft_dir" && pwd)
kv=$("$RINGLM" inspect --kv "$model") || die "ringlm inspect could not read $model"
V=$(echo "$kv" | awk '$1 == "n_vocab" { print $2 }')
n_layer=$(echo "$kv" | awk '$1 == "n_layer" { print $2 }')
weights=$(echo "$kv" | awk '$1 == "weight_bytes" { print $2 }')
[ -n "$V" ] && [ -n "$n_layer" ] || die "ringlm inspect could not read $model"
# how the model was synthesized: general.description (written by ringlm synth) names config and seed
desc=$(head -c 1048576 "$model" | grep -a -o 'ringlm synth --config [^[:cntrl:] ]* --seed [0-9]*' | head -1 || true)
[ -n "$config" ] || config=$(sed -n 's/^ringlm synth --config \([^ ]*\) --seed [0-9]*$/\1/p' <<<"$desc")
[ -n "$seed" ] || seed=$(sed -n 's/^ringlm synth --config [^ ]* --seed \([0-9]*\)$/\1/p' <<<"$desc")
need_synth=0
for d in $drafters; do case $d in self|dspark) [ -n "$trained" ] || need_synth=1 ;; esac; done
if [ $need_synth = 1 ]; then
    [ -n "$config" ] && [ -n "$seed" ] \
        || die "cannot tell how $model was synthesized (no 'ringlm synth --config C --seed S' in its metadata): give --config and --seed"
    case $config in
        tiny|small|medium|draft) ;;
        *) [ -f "$config" ] || die "synth config '$config' (from $model) is neither a preset nor a file here: give --config" ;;
    esac
fi
cname=$(basename "$config" .json)

# ---- the drafts: synthesized once, next to each other in --draft-dir --------------------------------------
self_file= dspark_file=
synth_once() { # FILE ARGS...: ringlm synth ARGS -o FILE unless FILE exists
    local f=$1; shift
    [ -f "$f" ] && return 0
    echo "bench_spec: synthesizing $f (ringlm synth --config $config --seed $seed $*, once)" >&2
    "$RINGLM" synth --config "$config" --seed "$seed" "$@" -o "$f.tmp" --progress && mv "$f.tmp" "$f" \
        || { rm -f "$f.tmp"; die "ringlm synth $* failed"; }
}
for d in $drafters; do
    case $d in
        self) self_file=$draft_dir/$cname-s$seed-$self_type.gguf; synth_once "$self_file" --type "$self_type" ;;
        dspark) if [ -n "$trained" ]; then dspark_file=$(readlink -f "$trained/draft.gguf")
                else dspark_file=$draft_dir/$cname-s$seed-dspark.gguf; synth_once "$dspark_file" --draft dspark; fi ;;
    esac
done
draft_arg() { # NAME: the value of --draft
    case $1 in
        ngram) echo ngram ;;
        self) echo "$self_file" ;;
        twin) echo "$model" ;;
        dspark) echo "dspark:$dspark_file" ;;
    esac
}

# the prompt: a passage of seeded ids, repeated
passage_ids=$(seeded_ids "$passage")
toks=$passage_ids
for _ in $(seq 2 "$repeat"); do toks+=",$passage_ids"; done
n_prompt=$((passage * repeat))
questions=()
if [ -n "$trained" ]; then # the user's question of each held-out chat exchange from the K-th document on
    mapfile -t questions < <(python3 tools/train/docs_io.py questions "$trained/corpus/heldout.txt" \
                                 --from "$heldout_from" -n "$reps")
    [ ${#questions[@]} = "$reps" ] || die "$trained/corpus/heldout.txt has fewer than $reps chat exchanges from document $heldout_from on"
    toks=
fi

# ---- processes: every one is recorded, and stopped on exit ---------------------------------------------
work=$(mktemp -d "$PWD/build/bench/spec.XXXXXX")
cp "$RINGLM" "$work/ringlm" && RINGLM=$work/ringlm # one binary for the whole run, whatever `make` does meanwhile
echo "$toks" >"$work/prompt.ids"
[ -z "$trained" ] || printf '%s\n' "${questions[@]}" >"$work/questions.txt"
life=$((4 * 3600)) # hard lifetime of background processes, should this script die without its trap
pids=() fg_pid=
harness_traps # (bench/lib.sh) every process is stopped on exit; the work folder is kept on failure or --keep

# ---- the ring: N nodes, each behind its own relay ------------------------------------------------------------
mkdir -p "$work/models"
ln -s "$model" "$work/models/$(basename "$model")"
start_nodes "$nodes" "$threads" 300 # node_addr: their own addresses; ring.conf is rewritten below to list the relays
conf=()
for i in $(seq "$nodes"); do
    start_relay "ring$i" "${node_addr[$((i - 1))]}" "$delay"
    conf+=("$RELAY_ADDR $(cat "$work/n$i.pub")")
done
printf '%s\n' "${conf[@]}" >"$work/ring.conf"
echo "bench_spec: $nodes ringlm nodes up behind relays of $delay ms, $threads thread(s) each; work dir $work" >&2
# page the model and the drafts in once, so that no run pays for the first read from disk
cat "$model" ${self_file:+"$self_file"} ${dspark_file:+"$dspark_file"} >/dev/null

K=(--ring "$work/ring.conf" --key "$work/coord.key" -m "$model" --temp 0 --ids --threads "$threads"
   --ctx $((n_prompt + gen + draft_n + 64)))
prompt_args() { # R: the prompt of repetition R
    if [ -n "$trained" ]; then P=(--chat -p "${questions[$(($1 - 1))]}"); else P=(--ignore-eos --tokens "$toks"); fi
}
metric() { python3 -c 'import json, sys; print("%.4g" % json.load(open(sys.argv[1]))[sys.argv[2]])' "$@"; }

# the nodes load their layer ranges on the first request: keep that out of the figures
prompt_args 1
bounded "ringlm warm-up run" /dev/null "$work/warmup.err" "$RINGLM" run "${K[@]}" "${P[@]}" -n 2

bad=0 greedy_differs=
for r in $(seq "$reps"); do
    f=$work/greedy-r$r
    prompt_args "$r"
    bounded "greedy run (rep $r)" "$f.ids" "$f.err" "$RINGLM" run "${K[@]}" "${P[@]}" -n "$gen" --metrics-json "$f.json"
    [ -s "$f.ids" ] || die "the greedy run (rep $r) printed no token ids (logs in $work)"
    if [ -z "$trained" ] && [ "$r" -gt 1 ] && ! cmp -s "$f.ids" "$work/greedy-r1.ids"; then
        echo "bench_spec: greedy rep $r gave other tokens than rep 1" >&2
        greedy_differs+="$r "
        bad=1
    fi
    line="rep $r: greedy $(metric "$f.json" decode_tok_s) tok/s"
    for d in $drafters; do
        for k in $depths; do
            tag=$d-k$k
            f=$work/spec-$tag-r$r
            if [ -f "$work/spec-$tag.failed" ]; then line+=", $tag skipped (failed before)"; continue; fi
            extra=(--draft "$(draft_arg "$d")" --draft-n "$draft_n")
            [ $depth_ok = 1 ] && extra+=(--draft-depth "$k")
            rc=0
            attempt "$f.ids" "$f.err" "$RINGLM" run "${K[@]}" "${P[@]}" -n "$gen" "${extra[@]}" --metrics-json "$f.json" || rc=$?
            if [ $rc = 0 ] && [ -s "$f.json" ]; then
                same=same
                cmp -s "$f.ids" "$work/greedy-r$r.ids" || { same="OTHER TOKENS than greedy"; bad=1; }
                line+=", $tag $(metric "$f.json" decode_tok_s) tok/s (accept $(metric "$f.json" acceptance_rate),"
                line+=" $(metric "$f.json" tokens_per_traversal) tok/trav, $same)"
            else # one drafter failing is a finding, not the end of the benchmark: record it and go on
                why=$(grep '^ringlm' "$f.err" | tail -1 || true)
                [ -n "$why" ] || why=$(grep -v '^ *$' "$f.err" | tail -1 || true)
                [ $rc = 0 ] && why="wrote no metrics file"
                { [ $rc = 124 ] || [ $rc = 137 ]; } && why="took longer than --timeout $timeout_s s"
                echo "exit $rc: $why" >"$work/spec-$tag.failed"
                rm -f "$f.json" # the report reads the runs that have one
                line+=", $tag FAILED ($why)"
                bad=1
                nodes_idle
                nodes_alive || die "a ringlm node died during the $tag run (logs in $work)"
            fi
        done
    done
    echo "bench_spec: $line" >&2
done

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
SB_WORK=$work SB_OUT=$out SB_MODEL=$model SB_NODES=$nodes SB_THREADS=$threads SB_DELAY=$delay SB_GEN=$gen \
SB_REPS=$reps SB_DRAFTERS=$drafters SB_DEPTHS=$depths SB_DEPTH_OK=$depth_ok SB_DEFAULT_DEPTH=$default_depth SB_DRAFT_N=$draft_n \
SB_SELF_TYPE=$self_type SB_SELF_FILE=$self_file SB_DSPARK_FILE=$dspark_file SB_CONFIG=$config SB_SEED=$seed \
SB_PASSAGE=$passage SB_REPEAT=$repeat SB_WEIGHTS=$weights SB_NLAYER=$n_layer SB_VOCAB=$V \
SB_COMMAND="bench/bench_spec.sh$argv" SB_TRAINED=$trained SB_HELDOUT_FROM=$heldout_from SB_CPU=$cpu SB_CORES=$(nproc) SB_LOAD=$(cut -d' ' -f1 /proc/loadavg) \
    python3 bench/tools/spec_report.py || die "bench/tools/spec_report.py failed (logs in $work)"
cat "$out.md"
if [ $bad = 1 ]; then
    failed=$(cd "$work" && ls spec-*.failed 2>/dev/null | sed 's/^spec-//; s/\.failed$//' | tr '\n' ' ' || true)
    differ=$(for f in "$work"/spec-*-r*.ids; do
                 [ -f "${f%.ids}.json" ] && ! cmp -s "$f" "$work/greedy-r${f##*-r}" && basename "$f" .ids | sed 's/^spec-//'
             done | tr '\n' ' ' || true)
    msg="bench_spec: FAILED:"
    [ -n "$failed" ] && msg+=" runs that failed: ${failed% };"
    [ -n "$differ" ] && msg+=" speculative output differs from greedy: ${differ% };"
    [ -n "$greedy_differs" ] && msg+=" greedy output differs from the first greedy run in rep(s) ${greedy_differs% };"
    echo "${msg%;} (results written to $out.json/.md anyway; logs in $work)" >&2
    exit 1
fi
