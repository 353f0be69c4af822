#!/usr/bin/env bash
# The libzmq abort of issue #23, as reported: `serve --ring --receipts` over 3 nodes, idle for longer than
# the node timeout (66 s: the 60 s default), then a request and, at once, `ringlm run --ring` with the same
# coordinator key; three rounds. Before the fix every node died in the first round (libzmq 4.3.4:
# "Assertion failed: !_io_error (src/stream_engine_base.cpp:331)"; two coordinators took one routing id in
# turns through ZMQ_ROUTER_HANDOVER). Bounded: about 4 minutes.
#
#   bench/repro/repro_zmq_abort.sh [--bin RINGLM] [--model FILE] [--idle S] [--rounds N]
# Prints one line per round and the nodes' assertion lines, if any; exits 1 if a node died.
set -euo pipefail
cd "$(dirname "$0")/../.."
. bench/lib.sh
bin=./ringlm model="" idle=66 rounds=3
while [ $# -gt 0 ]; do
    case $1 in
        --bin) bin=$2; shift 2 ;; --model) model=$2; shift 2 ;; --idle) idle=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;; *) echo "repro_zmq_abort: unknown option $1" >&2; exit 2 ;;
    esac
done
[ "$bin" = ./ringlm ] && make -s ringlm
work=$(mktemp -d) RINGLM=$bin
pids=()
trap 'stop_pids "${pids[@]}"; rm -rf "$work"' EXIT
mkdir -p "$work/models"
if [ -z "$model" ]; then model=$work/tiny.gguf; "$bin" synth --no-progress -o "$model" --config tiny --seed 1 >/dev/null 2>&1; fi
ln -s "$(realpath "$model")" "$work/models/m.gguf"
start_nodes 3 1 10 --speed 10 # node_pids: the three nodes
"$bin" serve -m "$model" --ring "$work/ring.conf" --key "$work/coord.key" --receipts "$work/r.jsonl" --port 0 2>"$work/srv.log" &
pids+=($!)
for _ in $(seq 300); do url=$(grep -so 'http://127\.0\.0\.1:[0-9]*' "$work/srv.log" | head -1 || true); [ -n "$url" ] && break; sleep 0.1; done
req() { curl -s --max-time 60 -o /dev/null -w '%{http_code}' -H 'Content-Type: application/json' \
            --data-binary "{\"prompt\":\"hello there\",\"max_tokens\":$1,\"temperature\":0}" "$url/v1/completions" || true; }
echo "first request: $(req 8)"
dead=0
for r in $(seq "$rounds"); do
    sleep "$idle"
    req 32 >"$work/req.code" &
    cp=$!
    rc=0
    timeout 30 "$bin" run -m "$model" --ring "$work/ring.conf" --key "$work/coord.key" -p hi -n 32 --temp 0 >/dev/null 2>"$work/run.err" || rc=$?
    wait $cp || true
    after=$(req 8)
    dead=0
    for p in "${node_pids[@]}"; do kill -0 "$p" 2>/dev/null || dead=$((dead + 1)); done
    echo "round $r: request during the second coordinator $(cat "$work/req.code"), request after $after, second coordinator exit $rc ($(tail -1 "$work/run.err" | cut -c1-160)), dead nodes $dead"
    [ $dead -gt 0 ] && break
done
grep -h "Assert" "$work"/node*.log || true
[ $dead = 0 ]
