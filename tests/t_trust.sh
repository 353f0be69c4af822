#!/usr/bin/env bash
# Trust: audits and receipts against nodes that lie. A test-only build (make adversary: build/adv/ringlm,
# `ringlm node --misbehave MODE`) makes one node of a 3-node ring misbehave; each way of lying is caught,
# by the live receipt checks or by an audit, and the run fails naming that node. An honest ring audited on
# every request raises no false alarm.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ring_lib.sh"
. "$(dirname "$0")/serve_lib.sh"
trap 'serve_stop_all; ring_stop; rm -rf "$WORK"' EXIT
ADV=$ROOT/build/adv/ringlm
[ -x "$ADV" ] || { echo "not ok - $ADV missing (make adversary)"; exit 1; }

mkdir -p "$RING/models"
for c in "small-f32 small f32" "lean-q8_0 k3-lean q8_0" "lean-q4_0 k3-lean q4_0"; do
    read -r name config type <<<"$c"
    ln -sf "$(model "$name" "$config" "$type")" "$RING/models/$name.gguf"
done
ring_keys 4
for i in 1 2 3; do ring_start $i "$RING/models" || exit 1; done
K=(--key "$RING/coord.key")
ring_conf "$WORK/honest.conf" 1 2 3
small=$RING/models/small-f32.gguf
# only_errors CMD...: runs CMD, keeping only its error lines on stderr (not the plan), and its exit code.
only_errors() {
    local rc=0
    "$@" 2>"$WORK/oe.err" || rc=$?
    grep -E "^ringlm [a-z]+: " "$WORK/oe.err" >&2 || true
    return $rc
}


# --- An honest ring, every sequence audited: no false alarm, greedy and sampled, with and without drafts.
honest_runs() {
    local m=$1 n_ok=0 n_runs=0 extra=("${@:2}")
    for r in $(seq 1 10); do
        local args=(--temp 0)
        [ $((r % 2)) = 0 ] && args=(--temp 0.8 --seed "$r")
        [ $((r % 3)) = 0 ] && args+=(--draft ngram)
        n_runs=$((n_runs + 1))
        if "$RINGLM" run -m "$m" --tokens "$(toks "$r" 900 $((8 + r)))" -n 20 --ignore-eos "${args[@]}" \
            --ring "$WORK/honest.conf" "${K[@]}" --audit-rate 1 --audit-seed "$r" --receipts "$WORK/h.jsonl" "${extra[@]}" \
            >/dev/null 2>"$WORK/h.err" && grep -q "audits: 1 sequence(s) audited, .* none failed" "$WORK/h.err"; then
            n_ok=$((n_ok + 1))
        else
            echo "    run $r (${args[*]}):"; tail -3 "$WORK/h.err" | sed 's/^/    /'
        fi
    done
    echo "    $n_ok of $n_runs audited runs passed"
    [ $n_ok = $n_runs ]
}
check "honest ring, f32: 10 runs each audited at a random stage, no false alarm" honest_runs "$small"
check "honest ring, q8_0: 10 runs each audited at a random stage, no false alarm" honest_runs "$RING/models/lean-q8_0.gguf"
# A node with --no-repack computes its q4_0 matmuls with the plain kernels, the others with the repacked
# ones (docs/numerics.md): its INFO says so, and an audit of its stage must bind the weights the same way.
# The audit recomputes with the node's kernels, so it is exact: --audit-tol 1e-9 (the default 1e-2 would hide
# a kernel mix-up on this model).
ring_stop
for i in 1 3; do ring_start $i "$RING/models" || exit 1; done
ring_start 2 "$RING/models" --no-repack || exit 1
check "honest ring, q4_0, one node --no-repack: 10 audited runs, no false alarm, exact" honest_runs \
    "$RING/models/lean-q4_0.gguf" --audit-tol 1e-9
# One node with the softmax path over an f32 cache (--flash-attn off --cache-type f32), the others at the
# defaults (flash attention, f16 cache): its INFO says so and its audits follow (exact again); and a ring
# whose nodes all run the softmax path gives the text one machine gives in the same setting.
ring_stop
for i in 1 3; do ring_start $i "$RING/models" || exit 1; done
ring_start 2 "$RING/models" --flash-attn off --cache-type f32 || exit 1
check "honest ring, one node without flash attention, f32 cache: 10 audited runs, no false alarm, exact" \
    honest_runs "$RING/models/small-f32.gguf" --audit-tol 1e-9
ring_stop
for i in 1 2 3; do ring_start $i "$RING/models" --flash-attn off --cache-type f32 || exit 1; done
fa_prompt=$(toks 5 900 40)
"$RINGLM" run -m "$small" --tokens "$fa_prompt" -n 24 --temp 0 --ignore-eos --ids --threads 1 \
    --flash-attn off --cache-type f32 >"$WORK/fa_local.ids" 2>/dev/null
"$RINGLM" run -m "$small" --tokens "$fa_prompt" -n 24 --temp 0 --ignore-eos --ids \
    --ring "$WORK/honest.conf" "${K[@]}" >"$WORK/fa_ring.ids" 2>/dev/null
check_same "a ring of softmax-path nodes gives one machine's greedy tokens in the same setting" \
    "$WORK/fa_local.ids" "$WORK/fa_ring.ids"
# The audit log (what a stage keeps) is bounded: a tiny budget keeps nothing, and the audit says so.
ring_stop
for i in 1 3; do ring_start $i "$RING/models" || exit 1; done
ring_start 2 "$RING/models" --audit-keep 0.001 || exit 1
check_fails "a node that kept nothing of a step it signed is faulty (audited stage named)" \
    "audit: node 127.0.0.1:${RING_PORT[2]} \(stage 1, .*kept nothing of step" \
    bash -c "for s in 1 2 3 4 5 6 7 8; do \"$RINGLM\" run -m $small -p hi -n 4 --temp 0 --ring $WORK/honest.conf \
        --key $RING/coord.key --audit-rate 1 --audit-seed \$s >/dev/null 2>$WORK/k.err || { grep 'audit:' $WORK/k.err >&2; exit 1; }; done"
kill "${RING_PID[2]}"; wait "${RING_PID[2]}" 2>/dev/null || true

# --- A lying node (node 4, the adversarial build) at stage POS of a 3-node ring.
# liar MODE POS: (re)start node 4 misbehaving; writes $WORK/liar.conf with it at stage POS (0-based).
liar() {
    local mode=$1 pos=$2
    [ -n "${RING_PID[4]:-}" ] && { kill "${RING_PID[4]}"; wait "${RING_PID[4]}" 2>/dev/null || true; }
    RING_BIN=$ADV ring_start 4 "$RING/models" --misbehave "$mode" || return 1
    case $pos in 0) ring_conf "$WORK/liar.conf" 4 1 3 ;; 1) ring_conf "$WORK/liar.conf" 1 4 3 ;; 2) ring_conf "$WORK/liar.conf" 1 3 4 ;; esac
}
# caught_by_audit: audited runs (seeds 1..12, one stage each) until one fails; it must fail with exit 1
# naming node 4 at its stage, and no earlier run may have passed an audit of that stage.
caught_by_audit() {
    local pos=$1 pat=$2
    for s in $(seq 1 12); do
        local rc=0
        "$RINGLM" run -m "$small" --tokens "$(toks "$s" 900 10)" -n 12 --temp 0 --ignore-eos --ring "$WORK/liar.conf" \
            "${K[@]}" --audit-rate 1 --audit-seed "$s" >/dev/null 2>"$WORK/a.err" || rc=$?
        if [ $rc != 0 ]; then
            echo "    seed $s: $(grep 'audit:' "$WORK/a.err" | head -1)"
            [ $rc = 1 ] && grep -Eq "audit: node 127.0.0.1:${RING_PORT[4]} \(stage $pos, layers \[[0-9]+, [0-9]+\)\) is faulty: .*$pat" "$WORK/a.err"
            return
        fi
    done
    echo "    never caught in 12 audited runs"; return 1
}
ring_start 2 "$RING/models" || exit 1

liar skip 1
"$RINGLM" run -m "$small" --tokens "$(toks 3 900 10)" -n 12 --temp 0 --ignore-eos --ids >"$WORK/local.ids" 2>/dev/null
"$RINGLM" run -m "$small" --tokens "$(toks 3 900 10)" -n 12 --temp 0 --ignore-eos --ids --ring "$WORK/liar.conf" "${K[@]}" \
    --receipts "$WORK/skip.jsonl" >"$WORK/skip.ids" 2>"$WORK/skip.err"
check "skipped layers pass every receipt check (each stage signs what it sent)..." grep -q "receipts: .* checked" "$WORK/skip.err"
check "... and the offline verifier" "$RINGLM" receipts verify "$WORK/skip.jsonl" --model "$small" --ring "$WORK/liar.conf"
check_differ "... yet the output is wrong" "$WORK/local.ids" "$WORK/skip.ids"
check "a node that skips its layers is caught by an audit" caught_by_audit 1 "boundary state it sent differs"
liar perturb 1
check "a node that perturbs its output is caught by an audit" caught_by_audit 1 "boundary state it sent differs"
liar perturb@5 1
check "... also when it starts lying mid-sequence" caught_by_audit 1 "boundary state it sent differs"
liar perturb 2
check "a last stage that returns other tokens is caught by an audit" caught_by_audit 2 "it returned token"
liar skip 0
check "a first stage that skips its layers is caught by an audit" caught_by_audit 0 "differs"

# Lies in the receipt itself are caught by the live checks, naming the node and what is wrong.
receipt_lie() {
    local mode=$1 desc=$2 pat=$3
    liar "$mode" 1 || return 1
    check_fails "$desc" "receipts: node 127.0.0.1:${RING_PORT[4]} \(stage 1\): .*$pat" \
        only_errors "$RINGLM" run -m "$small" -p hello -n 8 --temp 0 --ring "$WORK/liar.conf" "${K[@]}" --receipts "$WORK/l.jsonl"
}
receipt_lie replay@2 "a node that replays an old receipt is caught" "nonce|request"
receipt_lie wrongkey "a node that signs with another key is caught" "signer|signed by"
receipt_lie claim "a node that claims a layer range it was not given is caught" "layers"
liar auditlie 1
check "a node that hands the auditor other bytes than it signed is caught" caught_by_audit 1 "is not what its receipt signed"
check "--audit-rate or --receipts without a ring: exit 2, saying they need one" bash -c \
    "for o in '--audit-rate 0.5' '--receipts $WORK/x.jsonl'; do \"$RINGLM\" run -m $small -p hi \$o 2>$WORK/nr.err;
         [ \$? = 2 ] && grep -q 'for a ring' $WORK/nr.err || exit 1; done"
check "--audit-tol and --audit-tol-arch not above 0: exit 2, naming the option and what it wants" bash -c \
    "for o in --audit-tol --audit-tol-arch; do for v in 0 -1 x; do \"$RINGLM\" run -m $small -p hi \$o \$v 2>$WORK/tol.err;
         [ \$? = 2 ] && grep -q \"bad value '\$v' for \$o: want a relative tolerance above 0\" $WORK/tol.err || exit 1; done; done"

# --- serve, honest: 3 nodes, every request audited, 8 at a time (batched in shared frames), greedy and
# sampled, long enough that prompts and decode steps share frames. An audit replays each frame whole, the
# other sequences on stand-ins (exec/stage.h: stage_replay), because ggml's kernels round by the batch's
# shape and on this random MoE a last-bit difference swaps experts: recomputed alone, an honest node was
# found faulty now and then by 0.17. So the audit is exact, and --audit-tol 1e-9 says so (any kernel
# difference from the node's batch, ~1e-7 on f32, would fail it). Then again with n-gram drafts: VERIFY
# blocks give their whole frame step kernels, and prompts that repeat get drafts.
honest_serve() {
    local name=$1 pre=$2; shift 2
    serve_start "$name" -m "$small" --ring "$WORK/honest.conf" --key "$RING/coord.key" --parallel 4 --chunk 16 --quiet \
        --audit-rate 1 --audit-seed 3 --audit-tol 1e-9 "$@"
    local cpids=() r t
    for r in $(seq 1 8); do
        t=0; [ $((r % 2)) = 0 ] && t=0.9
        curl --max-time 60 -s -o "$WORK/$name$r.json" -H 'Content-Type: application/json' --data-binary \
            "{\"prompt\":\"$pre$(toks "$r" 900 $((20 + r)) | tr , ' ')\",\"max_tokens\":24,\"temperature\":$t,\"seed\":$r,\"ignore_eos\":true${EXTRA:-}}" \
            "${SRV_URL[$name]}/v1/completions" &
        cpids+=($!)
    done
    wait "${cpids[@]}"
    sleep 1 # the audits run once the server is idle
    curl --max-time 60 -s "${SRV_URL[$name]}/health" >"$WORK/$name.health"
    curl --max-time 60 -s "${SRV_URL[$name]}/metrics" >"$WORK/$name.metrics"
    kill "${SRV_PID[$name]}"; wait "${SRV_PID[$name]}" 2>/dev/null || true
}
honest_serve hs ""
check "serve, honest ring: 8 concurrent requests all answered" bash -c \
    "for r in 1 2 3 4 5 6 7 8; do python3 $WORK/check.py $WORK/hs\$r.json \"d['usage']['completion_tokens'] == 24\" || exit 1; done"
check "serve, honest ring: every request audited, exactly, no node faulty" bash -c \
    "python3 $WORK/check.py $WORK/hs.health \"all(n['status'] == 'up' for n in d['nodes'])\" &&
     awk '/^ringlm_audits_total/ { s += \$2 } END { exit !(s == 8) }' $WORK/hs.metrics"
honest_serve hd "7 8 9 7 8 9 7 8 9 7 8 9 7 8 9 7 8 9 " --draft ngram
check "serve, honest ring, n-gram drafts: drafts verified, every request audited exactly, no node faulty" bash -c \
    "for r in 1 2 3 4 5 6 7 8; do python3 $WORK/check.py $WORK/hd\$r.json \"d['usage']['completion_tokens'] == 24\" || exit 1; done &&
     python3 $WORK/check.py $WORK/hd.health \"all(n['status'] == 'up' for n in d['nodes'])\" &&
     awk '/^ringlm_audits_total/ { s += \$2 } /^ringlm_spec_drafted_tokens_total/ { d = \$2 }
          END { exit !(s == 8 && d > 0) }' $WORK/hd.metrics"

# ... and constrained output (a JSON schema; the grammar rides to the last stage, whose audits replay it),
# with n-gram drafts: every output valid, every request audited exactly, the last stage among them.
EXTRA=',"response_format":{"type":"json_schema","json_schema":{"name":"s","schema":{"type":"object","properties":{"a":{"type":"array","items":{"type":"integer"},"maxItems":3},"b":{"type":"string","maxLength":6}},"required":["a","b"],"additionalProperties":false}}}' \
    honest_serve hj "" --draft ngram
check "serve, honest ring, json_schema: 8 valid objects, every request audited exactly (the last stage too), no node faulty" bash -c \
    "for r in 1 2 3 4 5 6 7 8; do python3 $WORK/check.py $WORK/hj\$r.json \"sorted(json.loads(d['choices'][0]['text'])) == ['a', 'b']\" || exit 1; done &&
     python3 $WORK/check.py $WORK/hj.health \"all(n['status'] == 'up' for n in d['nodes']) and d['nodes'][-1].get('audits', 0) > 0\" &&
     awk '/^ringlm_audits_total/ { s += \$2 } END { exit !(s == 8) }' $WORK/hj.metrics"

# --- serve: an audited ring of 4 nodes, one of which (node 4, stage 1) perturbs what it sends. Requests go
# on until an audit catches it; from then on it is out of the ring (/health, /metrics), and the 3 honest
# nodes serve the same text as one machine. Honest nodes are never marked.
liar perturb 1
ring_conf "$WORK/serve.conf" 1 4 2 3
serve_start srv -m "$small" --ring "$WORK/serve.conf" --key "$RING/coord.key" --parallel 2 --quiet \
    --audit-rate 1 --audit-seed 7 --receipts "$WORK/serve.jsonl"
URL=${SRV_URL[srv]}
CT=(--max-time 60 -s)
complete() { # complete NAME PROMPT: a greedy completion of 8 tokens; body to $WORK/NAME.json, code printed
    curl "${CT[@]}" -o "$WORK/$1.json" -w '%{http_code}' -H 'Content-Type: application/json' \
        --data-binary "{\"prompt\":\"$2\",\"max_tokens\":8,\"temperature\":0,\"ignore_eos\":true}" "$URL/v1/completions"
}
health() { curl "${CT[@]}" "$URL/health" >"$WORK/$1.json"; }
liar_faulty="[n for n in d['nodes'] if n['addr'] == '127.0.0.1:${RING_PORT[4]}'][0]['status'] == 'faulty'"
caught=0
for r in $(seq 1 12); do
    complete "s$r" "request $r" >/dev/null
    for _ in 1 2 3 4 5 6 7 8 9 10; do # the audit runs once the server is idle
        health h
        if py "$WORK/h.json" "$liar_faulty" 2>/dev/null; then caught=$r; break 2; fi
        sleep 0.1
    done
done
echo "    caught after $caught request(s)"
check "serve: the lying node is caught by an audit within 12 requests" test "$caught" -gt 0
check "serve: /health shows it faulty, with what was caught, and the others up" py "$WORK/h.json" \
    "$liar_faulty and 'differs' in [n for n in d['nodes'] if n['status'] == 'faulty'][0]['fault'] \
     and sum(n['status'] == 'up' for n in d['nodes']) == 3"
curl "${CT[@]}" "$URL/metrics" >"$WORK/metrics.txt"
check "serve: /metrics ringlm_node_faulty is 1 for it, 0 for the others" bash -c \
    "grep -q 'ringlm_node_faulty{node=\"n2\",addr=\"127.0.0.1:${RING_PORT[4]}\"} 1' $WORK/metrics.txt &&
     test \$(grep -c '^ringlm_node_faulty{.*} 0\$' $WORK/metrics.txt) = 3"
check "serve: /metrics counts the audits" bash -c "awk '/^ringlm_audits_total/ { s += \$2 } END { exit !(s >= 1) }' $WORK/metrics.txt"
code=$(complete after "The capital of France is")
"$RINGLM" run -m "$small" -p "The capital of France is" -n 8 --temp 0 --ignore-eos --threads 1 2>/dev/null |
    python3 -c 'import sys, json; json.dump(sys.stdin.buffer.read().decode("utf-8", "replace"), sys.stdout)' >"$WORK/want.exp"
check "serve: the next request runs on the 3 honest nodes: 200, the text of one machine" \
    bash -c "test $code = 200 && python3 $WORK/check.py $WORK/after.json \"d['choices'][0]['text'] == load('want.exp')\""
check "serve: the server logged the fault" grep -q "is faulty" "$WORK/srv.log"
health h2
check "serve: still only that node faulty after more audited requests" py "$WORK/h2.json" \
    "sum(n['status'] == 'faulty' for n in d['nodes']) == 1 and $liar_faulty"
# Receipts returned with a response ("receipts": true), streamed and not; they verify offline.
curl "${CT[@]}" -o "$WORK/rc.json" -H 'Content-Type: application/json' \
    --data-binary '{"prompt":"receipts please","max_tokens":6,"temperature":0,"ignore_eos":true,"receipts":true}' "$URL/v1/completions"
check "serve: \"receipts\": true returns 3 stages x (prefill + 5 decode steps) receipts, layers 0..n" py "$WORK/rc.json" \
    "len(d['receipts']) == 18 and sorted({(r['layer_start'], r['layer_end']) for r in d['receipts']})[0][0] == 0 \
     and len({r['request_id'] for r in d['receipts']}) == 6"
python3 -c 'import json, sys; [print(json.dumps(r)) for r in json.load(open(sys.argv[1]))["receipts"]]' "$WORK/rc.json" >"$WORK/rc.jsonl"
check "serve: the returned receipts verify offline" "$RINGLM" receipts verify "$WORK/rc.jsonl" --model "$small" --ring "$WORK/serve.conf"
curl "${CT[@]}" -N -H 'Content-Type: application/json' \
    --data-binary '{"prompt":"receipts please","max_tokens":4,"temperature":0,"stream":true,"receipts":true}' \
    "$URL/v1/completions" >"$WORK/rcs.sse"
check "serve: streamed, the receipts come in a chunk before [DONE]" bash -c \
    "grep '^data: {' '$WORK/rcs.sse' | tail -1 | cut -c7- | python3 -c 'import json, sys; d = json.load(sys.stdin); assert len(d[\"receipts\"]) >= 3' &&
     tail -2 '$WORK/rcs.sse' | grep -q 'data: \[DONE\]'"
check "serve: the server's --receipts log verifies offline" "$RINGLM" receipts verify "$WORK/serve.jsonl" --model "$small" \
    --ring "$WORK/serve.conf"
kill "${SRV_PID[srv]}"; wait "${SRV_PID[srv]}" 2>/dev/null || true

# --- DSpark taps from a node that sends bad ones (taps steer drafts only, so they are not receipted): a
# malformed TAPS message is dropped without the step waiting for it, a second one from the same stage is
# ignored (it cannot overwrite the first or stand in for another stage's); the output stays greedy's, the
# coordinator names the node once and counts the drops (taps_dropped).
"$RINGLM" synth --no-progress --config small --draft dspark --seed 2 -o "$WORK/ds.gguf"
p=$(toks 5 900 24)
"$RINGLM" run -m "$small" --tokens "$p" -n 24 --temp 0 --ignore-eos --ids >"$WORK/g.ids" 2>/dev/null
dsrun() { # NAME CONF: a DSpark run through the ring, bounded well below the coordinator's step timeout
    timeout 40 "$RINGLM" run -m "$small" --tokens "$p" -n 24 --temp 0 --ignore-eos --ids --draft "dspark:$WORK/ds.gguf" \
        --draft-fixed --ring "$2" "${K[@]}" --metrics-json "$WORK/$1.json" >"$WORK/$1.ids" 2>"$WORK/$1.err"
}
digest() { grep -o '"draft_digest":[^,}]*' "$WORK/$1.json" 2>/dev/null; }
dsrun honest "$WORK/honest.conf"
for mode in badtaps duptaps; do
    ok=0 named=0 same_drafts=0
    for pos in 0 1 2; do
        liar $mode $pos
        dsrun "$mode$pos" "$WORK/liar.conf" && same_files "$WORK/g.ids" "$WORK/$mode$pos.ids" && ok=$((ok + 1))
        grep -q "node 127.0.0.1:${RING_PORT[4]} sent a \(malformed\|second\) TAPS" "$WORK/$mode$pos.err" &&
            grep -Eq '"taps_dropped":[[:space:]]*[1-9]' "$WORK/$mode$pos.json" && named=$((named + 1))
        [ -n "$(digest honest)" ] && [ "$(digest honest)" = "$(digest "$mode$pos")" ] && same_drafts=$((same_drafts + 1))
    done
    check "$mode at each of 3 stages: the run ends (no wait on the taps) with greedy's tokens ($ok/3)" test $ok = 3
    check "... the node that sent them is named and its messages counted (at $named of 3 stages: those holding taps)" \
        test $named -ge 1
    [ $mode = duptaps ] && check "... and the second message changed no draft (same drafts as the honest ring at $same_drafts/3 stages)" \
        test $same_drafts = 3
done
kill "${RING_PID[4]}"; wait "${RING_PID[4]}" 2>/dev/null || true; unset 'RING_PID[4]'

serve_start one -m "$small" --parallel 1 --quiet
code=$(curl "${CT[@]}" -o "$WORK/r1.json" -w '%{http_code}' -H 'Content-Type: application/json' \
    --data-binary '{"prompt":"x","max_tokens":2,"receipts":true}' "${SRV_URL[one]}/v1/completions")
check "serve on one machine: \"receipts\": true is a 400 naming the field" bash -c \
    "test $code = 400 && python3 $WORK/check.py $WORK/r1.json \"d['error']['param'] == 'receipts'\""

finish
