#!/usr/bin/env bash
# The ring on loopback: rings of 1-4 nodes give the same logits (f32 wire) and greedy tokens as one
# machine; nodes refuse unknown keys; a killed node is reported within bounded time and the others keep
# serving; garbage sent to a node's port does not hurt it.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ring_lib.sh"

mkdir -p "$RING/models"
for c in "full-f32 k3-full f32" "small-f32 small f32" "lean-q8_0 k3-lean q8_0"; do
    read -r name config type <<<"$c"
    ln -sf "$(model "$name" "$config" "$type")" "$RING/models/$name.gguf"
done
ring_keys 4
for i in 1 2 3 4; do ring_start $i "$RING/models" || exit 1; done
K=(--key "$RING/coord.key")


for name in full-f32 small-f32 lean-q8_0; do
    m=$RING/models/$name.gguf
    V=$("$RINGLM" inspect --kv "$m" | awk '$1 == "n_vocab" { print $2 }')
    t=$(toks 11 $((V - 256)) 40)
    p=$(toks 5 $((V - 256)) 12)
    "$RINGLM" logits -m "$m" --tokens "$t" --prefill 24 -o "$WORK/local.bin"
    "$RINGLM" run -m "$m" --tokens "$p" -n 24 --temp 0 --ignore-eos --ids >"$WORK/local.ids" 2>/dev/null
    for n in 1 2 3 4; do
        ring_conf "$WORK/ring$n.conf" $(seq $n)
        "$RINGLM" logits -m "$m" --tokens "$t" --prefill 24 --ring "$WORK/ring$n.conf" "${K[@]}" -o "$WORK/ring.bin"
        check "$name, $n-node ring: logits equal one machine bit for bit" \
            "$RINGLM" compare "$WORK/local.bin" "$WORK/ring.bin" --tol 0
        "$RINGLM" run -m "$m" --tokens "$p" -n 24 --temp 0 --ignore-eos --ids --ring "$WORK/ring$n.conf" "${K[@]}" \
            >"$WORK/ring.ids" 2>"$WORK/ring.err"
        check_same "$name, $n-node ring: same greedy tokens" "$WORK/local.ids" "$WORK/ring.ids"
    done
done
for n in 1 3; do
    check "two sequences at once in shared frames, $n-node ring" "$TOOLS/ring_pair" -m "$RING/models/small-f32.gguf" \
        --ring "$WORK/ring$n.conf" "${K[@]}"
done
check "the run prints the plan and per-stage timings" grep -q "traversal:" "$WORK/ring.err"
m=$RING/models/full-f32.gguf
"$RINGLM" run -m "$m" -p "hello" -n 4 --temp 0 --ring "$WORK/ring4.conf" "${K[@]}" --metrics-json "$WORK/m.json" \
    >/dev/null 2>&1
check "metrics JSON carries per-stage figures" grep -q '"compute_ms"' "$WORK/m.json"
"$RINGLM" logits -m "$m" --tokens "$(toks 3 700 16)" --ring "$WORK/ring3.conf" "${K[@]}" --wire f16 -o "$WORK/f16.bin"
"$RINGLM" logits -m "$m" --tokens "$(toks 3 700 16)" -o "$WORK/l16.bin"
check "f16 wire: logits within 1e-2 of f32 (rounding of the boundary state)" \
    "$RINGLM" compare "$WORK/l16.bin" "$WORK/f16.bin" --tol 1e-2

# Receipts: every stage signs every traversal, the coordinator checks each as it returns, and the log
# verifies offline against the model file and ring.conf.
"$RINGLM" run -m "$m" --tokens "$(toks 9 700 12)" -n 10 --temp 0 --ignore-eos --ids --ring "$WORK/ring3.conf" "${K[@]}" \
    --receipts "$WORK/receipts.jsonl" >"$WORK/rc.ids" 2>"$WORK/rc.err" || cat "$WORK/rc.err"
check "receipts: the run checked them" grep -q "receipts: 3[0-9] checked" "$WORK/rc.err"
check "receipts: one per stage per traversal" test "$(wc -l <"$WORK/receipts.jsonl")" -ge 30
check "receipts: the log verifies offline" "$RINGLM" receipts verify "$WORK/receipts.jsonl" --model "$m" --ring "$WORK/ring3.conf"
"$RINGLM" run -m "$m" --tokens "$(toks 9 700 12)" -n 10 --temp 0 --ignore-eos --ids >"$WORK/rc-local.ids" 2>/dev/null
check_same "receipts: same tokens as without them" "$WORK/rc-local.ids" "$WORK/rc.ids"
# Logit biases ride to the last stage with the sequence's first frame (frame.h, 4th part); audits replay
# that frame with them, so an honest ring stays honest.
ids=$(cut -d, -f1,2 "$WORK/rc-local.ids")
lb=(--logit-bias "${ids%%,*}-inf" --logit-bias "${ids##*,}+2.5")
"$RINGLM" run -m "$m" --tokens "$(toks 9 700 12)" -n 10 --temp 0 --ignore-eos --ids "${lb[@]}" >"$WORK/lb-local.ids" 2>/dev/null
"$RINGLM" run -m "$m" --tokens "$(toks 9 700 12)" -n 10 --temp 0 --ignore-eos --ids "${lb[@]}" --ring "$WORK/ring3.conf" \
    "${K[@]}" --audit-rate 1 >"$WORK/lb-ring.ids" 2>"$WORK/lb-ring.err" || cat "$WORK/lb-ring.err"
check_same "run --ring --logit-bias: the tokens of one machine with the same biases" "$WORK/lb-local.ids" "$WORK/lb-ring.ids"
check_differ "run --ring --logit-bias: the biases changed the tokens" "$WORK/lb-local.ids" "$WORK/rc-local.ids"
check "run --ring --logit-bias --audit-rate 1: every audit found the ring honest" \
    bash -c "grep -q 'audits: [1-9][0-9]* sequence(s) audited' '$WORK/lb-ring.err' && ! grep -qi 'faulty\|differs' '$WORK/lb-ring.err'"
sed '2s/"in":"[0-9a-f]\{8\}/"in":"00000000/' "$WORK/receipts.jsonl" >"$WORK/tampered.jsonl"
check_fails "receipts: a tampered log is caught offline" "signature|chain|in hash|does not verify" \
    "$RINGLM" receipts verify "$WORK/tampered.jsonl" --model "$m" --ring "$WORK/ring3.conf"

# An unknown coordinator key is refused, by name, and the node logs the refusal.
"$RINGLM" keygen -o "$WORK/stranger.key" >"$WORK/stranger.pub"
# (Both messages named the wrong cause before: "its connection closed (the process died ...)".)
check_fails "unknown coordinator key refused, saying so and naming the key to allow" \
    "refused our key.*--allow $(cat "$WORK/stranger.pub")" \
    "$RINGLM" run -m "$m" -p hi -n 2 --ring "$WORK/ring1.conf" --key "$WORK/stranger.key"
check "the node logged the refusal, naming the key as keygen printed it" \
    grep -q "refused a connection from 127.0.0.1: its key .*$(cat "$WORK/stranger.pub" | cut -c1-62)" "$RING/n1.log"
check "the refusal is logged once, not at every reconnect" test "$(grep -c "refused a connection" "$RING/n1.log")" -le 2
# A ring.conf whose key does not match the node: the handshake fails, named.
sed "s/ [0-9a-f]*$/ $(cat "$RING/n2.pub")/" "$WORK/ring1.conf" >"$WORK/wrongkey.conf"
check_fails "wrong node key in ring.conf: the handshake fails, named" "encrypted link failed|during the encrypted handshake" \
    "$RINGLM" run -m "$m" -p hi -n 2 --ring "$WORK/wrongkey.conf" "${K[@]}"
check_fails "unreachable node" "did not answer within" \
    "$RINGLM" run -m "$m" -p hi -n 2 --ring <(echo "127.0.0.1:$(ring_free_port) $(cat "$RING/n1.pub")") "${K[@]}"

# Garbage and truncated frames at a node's port: it keeps serving.
python3 - "${RING_PORT[1]}" <<'PY'
import os, socket, sys
port = int(sys.argv[1])
for n in (1, 7, 64, 1000, 100000):
    s = socket.create_connection(("127.0.0.1", port)); s.sendall(os.urandom(n)); s.close()
s = socket.create_connection(("127.0.0.1", port)); s.sendall(b"\xff" + b"\x00" * 8 + b"\x7f"); s.close()  # a ZMTP greeting, cut
PY
check "node 1 still alive after garbage" kill -0 "${RING_PID[1]}"
"$RINGLM" run -m "$m" --tokens "$(toks 5 700 12)" -n 8 --temp 0 --ignore-eos --ids --ring "$WORK/ring1.conf" "${K[@]}" \
    >"$WORK/after.ids" 2>/dev/null
"$RINGLM" run -m "$m" --tokens "$(toks 5 700 12)" -n 8 --temp 0 --ignore-eos --ids >"$WORK/after-local.ids" 2>/dev/null
check_same "node 1 still serves correctly after garbage" "$WORK/after-local.ids" "$WORK/after.ids"

# Malformed frames from an authenticated peer: each refused with a message, the node keeps answering.
"$RINGLM" keygen -o "$RING/n6.key" >"$RING/n6.pub"
ring_start 6 "$RING/models" || exit 1 # a fresh node: nothing assigned yet
check "malformed authenticated frames are refused, the node stays up" "$TOOLS/ring_bad_frames" \
    --node "127.0.0.1:${RING_PORT[6]}" --node-key "$(cat "$RING/n6.pub")" --key "$RING/coord.key" --model "$m"
cat "$WORK/out"

# A node killed mid-generation: the run re-forms the ring over the nodes left (a closed connection is
# noticed at once) and finishes; its tokens are one machine's (docs/serve.md, "When a node fails").
"$RINGLM" run -m "$m" --tokens "$(toks 5 700 12)" -n 1500 --temp 0 --ignore-eos --ids >"$WORK/kill-local.ids" 2>/dev/null
"$RINGLM" run -m "$m" --tokens "$(toks 5 700 12)" -n 1500 --temp 0 --ignore-eos --ids --ring "$WORK/ring3.conf" "${K[@]}" \
    >"$WORK/kill.ids" 2>"$WORK/kill.err" &
run_pid=$!
for _ in $(seq 200); do grep -q "stage" "$WORK/kill.err" 2>/dev/null && break; sleep 0.05; done
sleep 0.5
kill -9 "${RING_PID[2]}"
rc=0; wait $run_pid || rc=$?
check "killed node: the run re-forms the ring and finishes (exit $rc), its tokens = one machine's" bash -c \
    "test $rc = 0 && same_files '$WORK/kill-local.ids' '$WORK/kill.ids'"
check "killed node: the log names it and the re-forming" bash -c \
    "grep -q '127.0.0.1:${RING_PORT[2]}' '$WORK/kill.err' && grep -q 're-forming it over the 2 node' '$WORK/kill.err'"
check "the surviving nodes keep running" bash -c "kill -0 ${RING_PID[1]} && kill -0 ${RING_PID[3]}"
check "the killed node restarts" ring_start 2 "$RING/models" # in this shell: it sets RING_PID[2]
"$RINGLM" run -m "$m" --tokens "$(toks 5 700 12)" -n 8 --temp 0 --ignore-eos --ids --ring "$WORK/ring3.conf" "${K[@]}" \
    >"$WORK/again.ids" 2>"$WORK/again.err" || cat "$WORK/again.err"
check_same "once the ring is whole again it serves the next request" "$WORK/after-local.ids" "$WORK/again.ids"

# A node without the model: the coordinator streams it its layers, it keeps them by content hash, and
# the next run (even after a restart) uses the kept copy.
mkdir -p "$RING/empty"
ring_keys_extra() { "$RINGLM" keygen -o "$RING/n5.key" >"$RING/n5.pub"; }
ring_keys_extra
ring_start 5 "$RING/empty" --cache "$RING/cache5" || exit 1
ring_conf "$WORK/fetch.conf" 1 5
m=$RING/models/small-f32.gguf
t=$(toks 21 1700 24)
"$RINGLM" logits -m "$m" --tokens "$t" --prefill 16 -o "$WORK/fl.bin"
"$RINGLM" logits -m "$m" --tokens "$t" --prefill 16 --ring "$WORK/fetch.conf" "${K[@]}" -o "$WORK/fr.bin" 2>"$WORK/fetch.err"
check "layers were streamed to the node without the model" grep -q "streaming layers" "$WORK/fetch.err"
check "streamed layers give the same logits" "$RINGLM" compare "$WORK/fl.bin" "$WORK/fr.bin" --tol 0
check "the node kept them by content hash" bash -c "ls $RING/cache5/*-*-*.gguf"
kill "${RING_PID[5]}"; wait "${RING_PID[5]}" 2>/dev/null || true
ring_start 5 "$RING/empty" --cache "$RING/cache5" || exit 1
"$RINGLM" logits -m "$m" --tokens "$t" --prefill 16 --ring "$WORK/fetch.conf" "${K[@]}" -o "$WORK/fr2.bin" 2>"$WORK/fetch2.err"
check "after a restart the kept copy is used (nothing streamed)" bash -c "! grep -q 'streaming layers' $WORK/fetch2.err"
check "and gives the same logits" "$RINGLM" compare "$WORK/fl.bin" "$WORK/fr2.bin" --tol 0
finish
