#!/usr/bin/env bash
# The prompt cache of `ringlm serve --ring` (docs/serve.md, "Prompt cache"; serve/backend_ring.h): a
# conversation's next turn continues its slot's ring sequence from a checkpoint every stage keeps
# (FRAME_SEQ_CKPT, FRAME_SEQ_RESTORE) and sends only the tokens after it. Through a 2-node loopback ring:
# every resumed turn's greedy ids and log-probabilities equal the same request with "cache_prompt": false,
# bit for bit (flash attention over an f16 cache, and softmax over f32), and the one-machine server's; after
# an idle pause the reply was re-read on the ring, so a turn reads only its new tokens; a grammar, n-gram
# drafts and n = 2 on a cached prefix; a node restarted between turns (its checkpoints gone) costs the cached prefix,
# never the request; audits of sequences that resumed pass (the auditor restores the same checkpoints) and
# their receipts verify offline;
# /metrics counts it; --ctx-checkpoints 0 turns it off.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ring_lib.sh"
. "$(dirname "$0")/serve_lib.sh"
f=$(model full-f32 k3-full f32)
mkdir -p "$RING/models"
ln -sf "$f" "$RING/models/full-f32.gguf"
trap 'serve_stop_all; ring_stop; [ -n "${KEEP_WORK:-}" ] || rm -rf "$WORK"' EXIT
V=$("$RINGLM" inspect --kv "$f" | awk '$1 == "n_vocab" { print $2 }')
conv() { python3 "$ROOT/tests/serve_conv.py" --vocab "$V" "$@"; }
equal() {
    py "$1" "all(t['cached']['choices'] == t['fresh']['choices'] and t['cached']['ids'] for t in d['turns'][1:]) and all(t['fresh']['cached_tokens'] == 0 for t in d['turns'][1:]) and len(d['turns']) >= 2"
}
resumed() {
    py "$1" "all(d['turns'][i]['cached']['cached_tokens'] >= d['turns'][i - 1]['prompt'] for i in range(1, len(d['turns'])))"
}
same_ids() { # FILE-A FILE-B: the same ids and log-probabilities turn by turn (the cached requests)
    py "$1" "[t['cached']['choices'] for t in d['turns']] == [t['cached']['choices'] for t in __import__('json').load(open('$2'))['turns']] and d['turns'][0]['cached']['ids']"
}
metric() { curl -s --max-time 10 "$1/metrics" | awk -v k="$2" '$1 == k { print $2 }'; }

ring_keys 2
for i in 1 2; do ring_start $i "$RING/models" || exit 1; done
ring_conf "$WORK/ring.conf" 1 2
R=(--ring "$WORK/ring.conf" --key "$RING/coord.key")

# ---- flash attention over an f16 cache (the defaults) --------------------------------------------------------
# --chunk 512: both choices of an n = 2 turn read their prompts in one step, cached or not, so their decode
# steps share a batch alike both times (a decode row next to a prompt piece takes the tiled attention path and
# rounds otherwise: docs/serve.md; sch_submit_all admits the choices together).
serve_start fa -m "$f" "${R[@]}" --parallel 2 --ctx 1024 --chunk 512
U=${SRV_URL[fa]}
check "start-up line: checkpoints on every stage, exact on this f32 model" \
    grep -q "prompt cache: 8 checkpoints per slot on every stage.*gives the bits of a fresh read" "$WORK/fa.log"
check "the nodes were told to keep them" grep -q "up to 8 prompt-cache checkpoints per sequence" "$RING/n1.log"
conv --url "$U" --size 200 --seed 1 --turns 3 --think 1.5 >"$WORK/c1.json"
check "FA/f16: turns 2 and 3 from the ring's cache equal cache_prompt:false (ids and logprobs)" equal "$WORK/c1.json"
check "FA/f16: each turn restored at least the previous prompt" resumed "$WORK/c1.json"
check "after an idle pause the reply was re-read on the ring: cached = previous prompt + reply - 1" \
    py "$WORK/c1.json" "all(d['turns'][i]['cached']['cached_tokens'] == d['turns'][i - 1]['prompt'] + 16 - 1 for i in (1, 2))"
conv --url "$U" --size 150 --seed 5 --turns 3 >"$WORK/c5.json"
check "FA/f16, turns sent back to back: equal to fresh reads" equal "$WORK/c5.json"
check "... and resumed" resumed "$WORK/c5.json"
conv --url "$U" --size 120 --seed 9 --turns 3 --reply 24 --extra '{"ignore_eos": false, "response_format": {"type": "json_object"}}' >"$WORK/c9.json"
check "json_object (a grammar) on a cached prefix: equal to fresh reads" equal "$WORK/c9.json"
check "json_object: every turn's text is a JSON object" py "$WORK/c9.json" "all(isinstance(__import__('json').loads(t['cached']['text']), dict) for t in d['turns'])"
conv --url "$U" --size 120 --seed 6 --turns 2 --extra '{"draft": "ngram"}' >"$WORK/c6.json"
check "n-gram drafts (VERIFY blocks) on a cached prefix: equal to fresh reads" equal "$WORK/c6.json"
conv --url "$U" --size 110 --seed 8 --turns 2 --extra '{"n": 2}' >"$WORK/c8.json"
check "n = 2 (each choice a sequence of its own on the ring): equal to fresh reads" equal "$WORK/c8.json"
check "n = 2: both choices there" py "$WORK/c8.json" "all(len(t['cached']['choices']) == 2 for t in d['turns'])"
hits=$(metric "$U" ringlm_prompt_cache_hits_total)
cached=$(metric "$U" ringlm_prompt_tokens_cached_total)
check "/metrics counts hits (at least 2 + 2 + 2 + 1 resumed turns)" test "${hits:-0}" -ge 7
check "/metrics counts cached tokens" test "${cached:-0}" -ge 1000
check_eq "/metrics says the cache is exact" "$(metric "$U" ringlm_prompt_cache_exact)" 1
check "/metrics counts the checkpoints the stages hold" test "$(metric "$U" ringlm_prompt_cache_checkpoints)" -ge 1

# ---- the same conversation on one machine gives the same ids ------------------------------------------------
serve_start one -m "$f" --threads 1 --parallel 2 --ctx 1024
conv --url "${SRV_URL[one]}" --size 200 --seed 1 --turns 3 --think 1.5 --no-fresh >"$WORK/c1one.json"
check "the ring's cached turns give the one-machine server's ids and log-probabilities" same_ids "$WORK/c1.json" "$WORK/c1one.json"
kill -9 "${SRV_PID[one]}"; unset 'SRV_PID[one]'

# ---- a node restarted between turns: its checkpoints are gone; the turn still comes back right ---------------
conv --url "$U" --size 160 --seed 13 --turns 1 --no-fresh >"$WORK/c13a.json"
kill -9 "${RING_PID[2]}"; wait "${RING_PID[2]}" 2>/dev/null || true
ring_start 2 "$RING/models" || exit 1
conv --url "$U" --size 160 --seed 13 --turns 2 --no-fresh >"$WORK/c13.json"
conv --url "$U" --size 160 --seed 13 --turns 2 --extra '{"cache_prompt": false}' --no-fresh >"$WORK/c13f.json"
check "after a node restart: the conversation's turns give the fresh reads' ids" same_ids "$WORK/c13.json" "$WORK/c13f.json"
kill -9 "${SRV_PID[fa]}"; unset 'SRV_PID[fa]'

# ---- softmax over an f32 cache ------------------------------------------------------------------------------
ring_stop
for i in 1 2; do ring_start $i "$RING/models" --flash-attn off --cache-type f32 || exit 1; done
serve_start sm -m "$f" "${R[@]}" --parallel 2 --ctx 1024
conv --url "${SRV_URL[sm]}" --size 200 --seed 2 --turns 3 >"$WORK/c2.json"
check "softmax/f32: turns 2 and 3 from the ring's cache equal cache_prompt:false" equal "$WORK/c2.json"
check "softmax/f32: each turn restored at least the previous prompt" resumed "$WORK/c2.json"
kill -9 "${SRV_PID[sm]}"; unset 'SRV_PID[sm]'

# ---- audits replay what resumed sequences ran, checkpoints and all ----------------------------------------------
# One slot: a conversation's turns continue one ring sequence (restoring its checkpoints); the next
# conversation frees it, and then it is audited (every freed sequence is, at --audit-rate 1).
serve_start au -m "$f" "${R[@]}" --parallel 1 --ctx 1024 --audit-rate 1 --audit-seed 3 --receipts "$WORK/rcpt.jsonl"
conv --url "${SRV_URL[au]}" --size 120 --seed 21 --turns 3 --no-fresh >"$WORK/a21.json"
conv --url "${SRV_URL[au]}" --size 130 --seed 22 --turns 2 --think 1 --no-fresh >"$WORK/a22.json"
curl -s --max-time 10 "${SRV_URL[au]}/v1/completions" -H 'Content-Type: application/json' \
    --data-binary '{"prompt":"x","max_tokens":2}' >/dev/null # frees the last conversation's sequence
sleep 2
check "both conversations resumed their turns" bash -c "python3 '$WORK/check.py' '$WORK/a21.json' \"all(t['cached']['cached_tokens'] > 0 for t in d['turns'][1:])\" && python3 '$WORK/check.py' '$WORK/a22.json' \"d['turns'][1]['cached']['cached_tokens'] > 0\""
audits=$(curl -s --max-time 10 "${SRV_URL[au]}/metrics" | awk '$1 ~ /^ringlm_audits_total/ { s += $2 } END { print s + 0 }')
check "audits ran on the sequences that resumed" test "$audits" -ge 2
check "... every one recomputed and matched: no audit error, no node faulty, the ring never broke" \
    bash -c "! grep -Eq 'audit:|is faulty|ring is broken' '$WORK/au.log'"
kill -9 "${SRV_PID[au]}"; unset 'SRV_PID[au]'
check "the receipts of every traversal, the resumed ones too, verify offline" \
    "$RINGLM" receipts verify "$WORK/rcpt.jsonl" --model "$f" --ring "$WORK/ring.conf" --key "$RING/coord.pub"

# ---- off ----------------------------------------------------------------------------------------------------
serve_start off -m "$f" "${R[@]}" --parallel 1 --ctx 512 --ctx-checkpoints 0
conv --url "${SRV_URL[off]}" --size 100 --seed 7 --turns 2 --no-fresh >"$WORK/c7.json"
check "--ctx-checkpoints 0: nothing restored" py "$WORK/c7.json" "all(t['cached']['cached_tokens'] == 0 for t in d['turns'])"
check "--ctx-checkpoints 0: no cache metrics" bash -c "! curl -s '${SRV_URL[off]}/metrics' | grep -q ringlm_prompt_cache_hits_total"
finish
