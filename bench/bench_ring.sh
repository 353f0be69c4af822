#!/usr/bin/env bash
# A ring of machines over emulated internet links: ringlm's ring against llama.cpp's RPC backend, same
# model file, same number of machines, same threads per machine, every link through `ringlm relay`
# (one-way delay D, docs/relay.md). The "machines" are local processes; this kernel has no netem.
#
#   bench/bench_ring.sh [--model FILE] [--nodes N] [--threads N] [--delays "0 10 30"] [--prompt N]
#                       [--gen N] [--chunks "512 64"] [--reps N] [--timeout S]
#                       [--out PREFIX] [--keep] [--no-build]
#
# Defaults: bench/models/medium.gguf (synthesized once if absent), 4 nodes, 1 thread per node (the
# machine has 2 cores: more would make the nodes' threads fight for them; llama_peers.md), one-way delays
# 0, 10 and 30 ms, a 512-token prompt, 32 generated tokens, prefill chunks of the whole prompt, 1/4 and 1/8
# of it (512, 128 and 64), 3 repetitions. Writes PREFIX.json and PREFIX.md
# (default bench/results/ring). --keep keeps the work folder (logs, per-run metrics) under build/bench/;
# it is kept anyway when the run fails. --no-build skips `make ringlm`.
#
# ringlm: N `ringlm node`s, each behind its own relay; ring.conf lists the relays, so the coordinator's
# link to stage 0, every stage i -> i+1 link (a node dials the next one at its ring.conf address) and the
# last stage's result back to the coordinator each cross exactly one relay: N + 1 delays per traversal.
#   decode: a 1-token prompt, then N_gen greedy steps (--ignore-eos), decode tok/s as ringlm reports it
#           (steps after the first token / time), so every traversal is a single token and the per-stage
#           compute_ms it reports is pure decode compute;
#   TTFT:   the N_prompt-token prompt (seeded ids) with each --chunks size (whole prompt = no pipelining,
#           smaller chunks pipeline the stages), -n 1; the best chunk is reported. A chunk size whose run
#           fails is recorded as failed (with ringlm's message) and skipped for the other repetitions at
#           that delay; the benchmark goes on.
# llama.cpp: N `ggml-rpc-server -t T`, each behind its own relay with the same delay,
#   `llama-bench --rpc R1,..,RN -ngl 99 -p N_prompt -n N_gen -t T -r 1`, otherwise at its defaults (flash
#   attention auto, f16 cache, a warm-up before each test; the RPC servers repack as a CPU backend does)
#   (tg from an empty context, like our 1-token-prompt decode); TTFT = N_prompt / pp t/s.
# Pairs: each repetition runs ringlm's decode and prefill runs and one llama-bench, alternating which goes
# first; a ratio is the median of the per-pair ratios (this VM's speed drifts between minutes).
# Network floor for greedy decode: 1 / ((stages + 1) x D + sum of per-stage decode compute_ms).
#
# Every process started here is stopped on exit (trap), every foreground run is bounded by --timeout, and
# the background ones carry a hard lifetime too, in case this script itself is killed with SIGKILL.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
argv=; [ $# -eq 0 ] || argv=$(printf ' %q' "$@")
model=bench/models/medium.gguf nodes=4 threads=1 delays="0 10 30" prompt=512 gen=32 chunks=
reps=3 timeout_s=1200 out=bench/results/ring keep=0 build=1
while [ $# -gt 0 ]; do
    case $1 in
        --model) model=$2; shift 2 ;;
        --nodes) nodes=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        --delays) delays=$2; shift 2 ;;
        --prompt) prompt=$2; shift 2 ;;
        --gen) gen=$2; shift 2 ;;
        --chunks) chunks=$2; shift 2 ;;
        --reps) reps=$2; shift 2 ;;
        --timeout) timeout_s=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --keep) keep=1; shift ;;
        --no-build) build=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "bench_ring: unknown option $1 (--help lists them)" >&2; exit 2 ;;
    esac
done
positive_ints nodes:nodes threads:threads prompt:prompt gen:gen reps:reps timeout_s:timeout
for d in $delays; do [[ $d =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "--delays: '$d' is not a delay in ms"; done
[ -n "$chunks" ] || chunks="$prompt $((prompt / 4)) $((prompt / 8))" # 512 128 64 at the default prompt
[ -n "$delays" ] || die "--delays needs at least one value"
for c in $chunks; do [[ $c =~ ^[1-9][0-9]*$ ]] || die "--chunks: '$c' is not a chunk size"; done
# a chunk of the whole prompt or more is the same run: keep each size once, largest first
chunks=$(for c in $chunks; do echo $((c < prompt ? c : prompt)); done | sort -nru | tr '\n' ' ')
chunks=${chunks% }

# ---- tools -------------------------------------------------------------------------------------------
need_tools python3 timeout make
if [ $build = 1 ]; then make -s ringlm || die "building ringlm failed (--no-build uses ./ringlm as it is)"; fi
RINGLM=$PWD/ringlm
[ -x "$RINGLM" ] || die "no ./ringlm after make"
need_subcommands relay node keygen
B=$(scripts/llama-tools.sh) || die "scripts/llama-tools.sh could not build llama.cpp's tools"
for t in ggml-rpc-server llama-bench; do [ -x "$B/$t" ] || die "missing $B/$t (scripts/llama-tools.sh)"; done

mkdir -p bench/models "$(dirname "$out")" build/bench
if [ ! -f "$model" ]; then
    [ "$model" = bench/models/medium.gguf ] || die "no model file $model"
    echo "bench_ring: synthesizing $model (medium preset, once)" >&2
    "$RINGLM" synth --config medium --seed 1 -o "$model.tmp" --progress && mv "$model.tmp" "$model"
fi
model=$(cd "$(dirname "$model")" && pwd)/$(basename "$model")
kv=$("$RINGLM" inspect --kv "$model")
V=$(echo "$kv" | awk '$1 == "n_vocab" { print $2 }')
n_layer=$(echo "$kv" | awk '$1 == "n_layer" { print $2 }')
weights=$(echo "$kv" | awk '$1 == "weight_bytes" { print $2 }')
[ -n "$V" ] && [ -n "$n_layer" ] || die "ringlm inspect could not read $model"
toks=$(seeded_ids "$prompt")
tok1=$(seeded_ids 1)

# ---- processes: every one is recorded, and stopped on exit ---------------------------------------------
work=$(mktemp -d "$PWD/build/bench/ring.XXXXXX")
cp "$RINGLM" "$work/ringlm" && RINGLM=$work/ringlm # one binary for the whole run, whatever `make` does meanwhile
life=$((4 * 3600)) # hard lifetime of background processes, should this script die without its trap
pids=() fg_pid=
harness_traps # (bench/lib.sh) every process is stopped on exit; the work folder is kept on failure or --keep

# ---- the ringlm nodes and the llama.cpp RPC servers, started once ------------------------------------------
mkdir -p "$work/models"
ln -s "$model" "$work/models/$(basename "$model")"
start_nodes "$nodes" "$threads" 300 # node_addr: their own addresses; ring.conf is rewritten below to list the relays
rpc_addr=()
for i in $(seq "$nodes"); do
    port=$(free_port)
    timeout -k 5 $life "$B/ggml-rpc-server" -H 127.0.0.1 -p "$port" -t "$threads" >"$work/rpc$i.log" 2>&1 &
    pid=$!
    pids+=("$pid")
    rpc_addr+=("127.0.0.1:$port")
    up=0
    for _ in $(seq 200); do # until it accepts connections (10 s)
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && { up=1; break; }
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.05
    done
    [ $up = 1 ] || { cat "$work/rpc$i.log" >&2; die "ggml-rpc-server $i did not start on port $port"; }
done
echo "bench_ring: $nodes ringlm nodes and $nodes ggml-rpc-servers up, $threads thread(s) each; work dir $work" >&2
cat "$model" >/dev/null # page the model in once so neither engine pays for the first read from disk

K=(--ring "$work/ring.conf" --key "$work/coord.key" -m "$model" --temp 0 --ignore-eos --ids --threads "$threads"
   --ctx $((prompt + gen + 8)))
metric() { python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$@"; }

# llama_rep DELAY REP: one llama-bench run (pp and tg, each after its own warm-up, as llama-bench does) over
# the RPC servers behind this delay's relays ($rpc), paired with ringlm's runs of the same repetition.
llama_rep() {
    local f=$work/llama-d$1-r$2
    bounded "llama-bench (delay $1 ms, rep $2)" "$f.json" "$f.err" "$B/llama-bench" -m "$model" --rpc "$rpc" -ngl 99 \
        -p "$prompt" -n "$gen" -t "$threads" -r 1 -o json
    echo "bench_ring: delay $1 ms, rep $2: llama.cpp RPC $(python3 -c 'import json, sys
print(", ".join("%s %.2f t/s" % ("pp" if t["n_prompt"] else "tg", t["avg_ts"]) for t in json.load(open(sys.argv[1]))))' "$f.json")" >&2
}

first=1
for d in $delays; do
    relays=()
    conf=()
    for i in $(seq "$nodes"); do
        start_relay "ring$i-$d" "${node_addr[$((i - 1))]}" "$d"
        relays+=("$RELAY_PID")
        conf+=("$RELAY_ADDR $(cat "$work/n$i.pub")")
    done
    printf '%s\n' "${conf[@]}" >"$work/ring.conf"
    rpc=""
    for i in $(seq "$nodes"); do
        start_relay "rpc$i-$d" "${rpc_addr[$((i - 1))]}" "$d"
        relays+=("$RELAY_PID")
        rpc+="${rpc:+,}$RELAY_ADDR"
    done
    if [ $first = 1 ]; then # the nodes load their layer ranges on the first request: keep that out of the figures
        bounded "ringlm warm-up run" /dev/null "$work/warmup.err" "$RINGLM" run "${K[@]}" --tokens "$tok1" -n 2
        first=0
    fi
    for r in $(seq "$reps"); do
        [ $((r % 2)) = 1 ] || llama_rep "$d" "$r" # pairs alternate which engine goes first
        f=$work/ringlm-d$d-decode-r$r
        bounded "ringlm decode run (delay $d ms)" "$f.ids" "$f.err" \
            "$RINGLM" run "${K[@]}" --tokens "$tok1" -n $((gen + 1)) --metrics-json "$f.json"
        line="delay $d ms, rep $r: ringlm decode $(metric "$f.json" decode_tok_s) tok/s"
        for c in $chunks; do
            f=$work/ringlm-d$d-ttft-c$c-r$r
            if [ -f "$work/ringlm-d$d-ttft-c$c.failed" ]; then line+=", chunk $c skipped (failed before)"; continue; fi
            rc=0
            attempt "$f.ids" "$f.err" "$RINGLM" run "${K[@]}" --tokens "$toks" -n 1 --chunk "$c" --metrics-json "$f.json" \
                || rc=$?
            if [ $rc = 0 ]; then
                line+=", ttft(chunk $c) $(metric "$f.json" ttft_s) s"
            else # one chunk size failing is a finding, not the end of the benchmark: record it and go on
                why=$(grep '^ringlm' "$f.err" | tail -1 || true)
                [ -n "$why" ] || why=$(grep -v '^ *$' "$f.err" | tail -1 || true)
                [ $rc = 124 ] || [ $rc = 137 ] && why="took longer than --timeout $timeout_s s"
                echo "exit $rc: $why" >"$work/ringlm-d$d-ttft-c$c.failed"
                line+=", chunk $c FAILED ($why)"
                nodes_idle
            fi
        done
        echo "bench_ring: $line" >&2
        [ $((r % 2)) = 0 ] || llama_rep "$d" "$r"
    done
    stop_pids "${relays[@]}"
    keep_pids=() # forget them: a reaped process's id may be reused by someone else's
    for p in "${pids[@]}"; do [[ " ${relays[*]} " == *" $p "* ]] || keep_pids+=("$p"); done
    pids=("${keep_pids[@]}")
done

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
RB_WORK=$work RB_OUT=$out RB_MODEL=$model RB_NODES=$nodes RB_THREADS=$threads RB_DELAYS=$delays RB_PROMPT=$prompt \
RB_GEN=$gen RB_CHUNKS=$chunks RB_REPS=$reps RB_WEIGHTS=$weights RB_NLAYER=$n_layer \
RB_COMMAND="bench/bench_ring.sh$argv" RB_CPU=$cpu RB_CORES=$(nproc) RB_LOAD=$(cut -d' ' -f1 /proc/loadavg) \
RB_LLAMA_BIN=$B python3 bench/tools/ring_report.py
cat "$out.md"
