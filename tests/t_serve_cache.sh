#!/usr/bin/env bash
# The prompt cache of `ringlm serve` on one machine (docs/serve.md, "Prompt cache"): multi-turn conversations
# (each turn the previous prompt, the ids the server generated and new tokens) resume from the slot's
# checkpoints or the host-RAM cache, and every resumed turn's greedy ids and log-probabilities equal the same
# request with "cache_prompt": false, bit for bit (flash attention over an f16 cache, and softmax over f32);
# the reply is re-read while the server is idle, so the next turn reads only its new tokens, and a checkpoint is
# made two tokens before the prompt's end, so the same prompt resent (regenerate) reads two; prefixes evicted
# from a one-slot server come back from the host cache; a budget that evicts still serves exact state; n > 1,
# speculative drafts, a grammar (json_object) and streaming work on cached prefixes; usage.prompt_tokens_details.cached_tokens and
# /metrics count it; a model whose kernels are not split-invariant says so; bad options and a budget too
# small for one prefix are refused by name.
. "$(dirname "$0")/lib.sh"
f=$(model full-f32 k3-full f32)
. "$(dirname "$0")/serve_lib.sh"
trap 'serve_stop_all; [ -n "${KEEP_WORK:-}" ] || rm -rf "$WORK"' EXIT
V=$("$RINGLM" inspect --kv "$f" | awk '$1 == "n_vocab" { print $2 }')
conv() { python3 "$ROOT/tests/serve_conv.py" --vocab "$V" "$@"; } # conv --url URL [options] > FILE

# equal FILE: every later turn's cached request gave the ids and log-probabilities of its fresh copy, and the
# fresh copy restored nothing (a check that could not fail if both were empty: the ids must be there)
equal() {
    py "$1" "all(t['cached']['choices'] == t['fresh']['choices'] and t['cached']['ids'] for t in d['turns'][1:]) and all(t['fresh']['cached_tokens'] == 0 for t in d['turns'][1:]) and len(d['turns']) >= 2"
}
# resumed FILE: each later turn restored at least the previous turn's prompt
resumed() {
    py "$1" "all(d['turns'][i]['cached']['cached_tokens'] >= d['turns'][i - 1]['prompt'] for i in range(1, len(d['turns'])))"
}
metric() { curl -s --max-time 10 "$1/metrics" | awk -v k="$2" '$1 == k { print $2 }'; }

# ---- flash attention over an f16 cache (the defaults) --------------------------------------------------------
serve_start fa -m "$f" --threads 1 --parallel 2 --ctx 1024
U=${SRV_URL[fa]}
check "start-up line says the cache is exact on this f32 model" grep -q "prompt cache: 8 checkpoints per slot.*gives the bits of a fresh read" "$WORK/fa.log"
conv --url "$U" --size 200 --seed 1 --turns 3 --think 1.5 >"$WORK/c1.json"
check "FA/f16: turns 2 and 3 from the cache equal cache_prompt:false (ids and logprobs)" equal "$WORK/c1.json"
check "FA/f16: each turn restored at least the previous prompt" resumed "$WORK/c1.json"
# After an idle pause the reply was read again as prompt pieces: the next turn reads only its own tokens
# (the last generated token was never fed, so it is read too).
check "after an idle pause only the new tokens are read (cached = previous prompt + reply - 1)" \
    py "$WORK/c1.json" "all(d['turns'][i]['cached']['cached_tokens'] == d['turns'][i - 1]['prompt'] + 16 - 1 for i in (1, 2))"
conv --url "$U" --size 180 --seed 11 --turns 2 --think 1.5 --regenerate >"$WORK/c11.json"
check "regenerate (the last prompt resent) after a pause: equal to a fresh read" equal "$WORK/c11.json"
check "... reading only the prompt's last two tokens" py "$WORK/c11.json" "d['turns'][-1]['regenerate'] and d['turns'][-1]['cached']['cached_tokens'] == d['turns'][-1]['prompt'] - 2"
conv --url "$U" --size 150 --seed 5 --turns 3 >"$WORK/c5.json"
check "FA/f16, turns sent back to back: equal to fresh reads" equal "$WORK/c5.json"
check "turn 1 restored nothing" py "$WORK/c5.json" "d['turns'][0]['cached']['cached_tokens'] == 0"
conv --url "$U" --size 150 --seed 5 --turns 3 --stream --no-fresh >"$WORK/c5s.json"
check "streamed: token_ids over the chunks equal the non-streamed ids" \
    py "$WORK/c5s.json" "[t['cached']['ids'] for t in d['turns']] == [t['cached']['ids'] for t in __import__('json').load(open('$WORK/c5.json'))['turns']]"
check "streamed: the usage chunk counts the cached tokens" \
    py "$WORK/c5s.json" "all(t['cached']['cached_tokens'] >= 150 for t in d['turns'][1:])"
# A token whose text is empty (a control token, forced here by its logit bias) still sends its id at once: a client
# resending the ids (and a benchmark timing the first one) must not wait for the next token with text.
E=$("$RINGLM" tokenize -m "$f" --decode --file <(seq 0 $((V - 1))) 2>/dev/null | awk 'length($0) == 0 { print NR - 1; exit }')
curl -sN --max-time 30 "$U/v1/completions" -H 'Content-Type: application/json' -d "{\"prompt\":[5,6,7,8],\"max_tokens\":3,\"temperature\":0,\"ignore_eos\":true,\"stream\":true,\"return_token_ids\":true,\"logit_bias\":{\"$E\":100}}" >"$WORK/empty.sse"
check "tokens with empty text (id $E): a chunk per token, each with its id" \
    py "$WORK/empty.sse" "[c['choices'][0].get('token_ids') for c in [__import__('json').loads(l[6:]) for l in raw.decode().splitlines() if l.startswith('data: {')] if c['choices'] and c['choices'][0].get('token_ids')] == [[$E]] * 3"
conv --url "$U" --size 120 --seed 6 --turns 2 --extra '{"n": 2, "draft": "ngram"}' >"$WORK/c6.json"
check "n = 2 with n-gram drafts on a cached prefix: equal to fresh reads" equal "$WORK/c6.json"
check "n = 2: both choices there" py "$WORK/c6.json" "all(len(t['cached']['choices']) == 2 for t in d['turns'])"
conv --url "$U" --size 120 --seed 9 --turns 3 --reply 24 --extra '{"ignore_eos": false, "response_format": {"type": "json_object"}}' >"$WORK/c9.json"
check "json_object (a grammar) on a cached prefix: equal to fresh reads" equal "$WORK/c9.json"
check "json_object: every turn's text is a JSON object" py "$WORK/c9.json" "all(isinstance(__import__('json').loads(t['cached']['text']), dict) for t in d['turns'])"
hits=$(metric "$U" ringlm_prompt_cache_hits_total)
cached=$(metric "$U" ringlm_prompt_tokens_cached_total)
check "/metrics counts hits (at least the 2 + 2 + 1 resumed turns)" test "${hits:-0}" -ge 5
check "/metrics counts cached tokens" test "${cached:-0}" -ge 1000
check_eq "/metrics says the cache is exact" "$(metric "$U" ringlm_prompt_cache_exact)" 1
check "/metrics holds checkpoints" test "$(metric "$U" ringlm_prompt_cache_checkpoints)" -ge 1

# ---- softmax over an f32 cache ------------------------------------------------------------------------------
serve_start sm -m "$f" --threads 1 --parallel 2 --ctx 1024 --flash-attn off --cache-type f32
conv --url "${SRV_URL[sm]}" --size 200 --seed 2 --turns 3 >"$WORK/c2.json"
check "softmax/f32: turns 2 and 3 from the cache equal cache_prompt:false" equal "$WORK/c2.json"
check "softmax/f32: each turn restored at least the previous prompt" resumed "$WORK/c2.json"
kill -9 "${SRV_PID[sm]}" "${SRV_PID[fa]}"; unset 'SRV_PID[sm]' 'SRV_PID[fa]'

# ---- one slot: prefixes come back from the host-RAM cache ------------------------------------------------------
serve_start one -m "$f" --threads 1 --parallel 1 --ctx 1024
conv --url "${SRV_URL[one]}" --size 200 --seed 3 --turns 3 --evict >"$WORK/c3.json"
check "one slot, another prompt between turns: equal to fresh reads" equal "$WORK/c3.json"
check "one slot: each turn restored its previous prompt from the host cache" resumed "$WORK/c3.json"
check "/metrics: prefixes were stored in the host cache" test "$(metric "${SRV_URL[one]}" ringlm_prompt_cache_stored_total)" -ge 2
# Requests that branch off one prompt P (a system prompt, then many questions): after P + a came back from the
# host cache (dropping the slot's own checkpoints past P), P + d and P + e must still start from P - the slot's
# checkpoint at P is kept, not dropped with the rest.
conv --url "${SRV_URL[one]}" --size 200 --seed 12 --branches >"$WORK/c12.json"
check "one slot, branches off one prompt: equal to fresh reads" equal "$WORK/c12.json"
check "... every branch restored at least the shared prompt (P + a: P + a, from the host cache)" \
    py "$WORK/c12.json" "all(t['cached']['cached_tokens'] >= 200 for t in d['turns'][1:]) and d['turns'][4]['cached']['cached_tokens'] >= 202"
kill -9 "${SRV_PID[one]}"; unset 'SRV_PID[one]'

# ---- a budget too small for one prefix is refused; one that holds two evicts and stays exact -----------------
rc=0; timeout 60 "$RINGLM" serve -m "$f" --port 0 --ctx 8192 --cache-ram 1 2>"$WORK/small.err" || rc=$?
check "--cache-ram 1 with --ctx 8192: refused at start" test $rc = 1
check "... naming what one prefix needs" grep -Eq "cannot hold one cached prefix at full context \(8192 tokens\): it needs [0-9.]+ MiB" "$WORK/small.err"
serve_start tight -m "$f" --threads 1 --parallel 1 --ctx 1024 --cache-ram 1
conv --url "${SRV_URL[tight]}" --size 300 --seed 4 --turns 3 --evict >"$WORK/c4.json"
check "a budget of 1 MiB: still equal to fresh reads" equal "$WORK/c4.json"
check "a budget of 1 MiB: entries were evicted for room" test "$(metric "${SRV_URL[tight]}" ringlm_prompt_cache_evicted_total)" -ge 1
# Prefixes of 700+ tokens: 1 MiB holds one. Before each turn a longer prompt takes the slot; the turn finds
# its prefix in the host cache, and keeping the slot's (longer) prefix then evicts that entry: it must be
# restored first, never be replaced under the lookup by the entry that takes its place.
conv --url "${SRV_URL[tight]}" --size 700 --evict-size 760 --seed 10 --turns 3 --evict >"$WORK/c10.json"
check "a budget of one prefix, which the slot's own keeping evicts: equal to fresh reads" equal "$WORK/c10.json"
check "... and each turn restored its previous prompt from the host cache first" resumed "$WORK/c10.json"
kill -9 "${SRV_PID[tight]}"; unset 'SRV_PID[tight]'

# ---- split invariance end to end: the same request under other --chunk budgets gives the same ids ------------
# (a 100-token prompt: one tiled flash-attention piece at --chunk 256, short padded ones below; pieces of 2 or 3
# tokens, never one out of a longer prompt: scheduler.c sch_piece; a budget of 1 still ends)
for ch in 256 2 1 7; do
    serve_start "ch$ch" -m "$f" --threads 1 --parallel 1 --ctx 512 --chunk "$ch"
    conv --url "${SRV_URL[ch$ch]}" --size 100 --seed 12 --turns 2 --no-fresh >"$WORK/ch$ch.json"
    kill -9 "${SRV_PID[ch$ch]}"; unset "SRV_PID[ch$ch]"
done
for ch in 2 1 7; do
    check "--chunk $ch: the same greedy ids and log-probabilities as --chunk 256 (a prompt read in other pieces)" \
        py "$WORK/ch$ch.json" "[t['cached']['choices'] for t in d['turns']] == [t['cached']['choices'] for t in __import__('json').load(open('$WORK/ch256.json'))['turns']] and d['turns'][0]['cached']['ids']"
done

# ---- no prompt cache at all --------------------------------------------------------------------------------
serve_start off -m "$f" --threads 1 --parallel 1 --ctx 512 --ctx-checkpoints 0
conv --url "${SRV_URL[off]}" --size 100 --seed 7 --turns 2 --no-fresh >"$WORK/c7.json"
check "--ctx-checkpoints 0: nothing restored" py "$WORK/c7.json" "all(t['cached']['cached_tokens'] == 0 for t in d['turns'])"
check "--ctx-checkpoints 0: no cache metrics" bash -c "! curl -s '${SRV_URL[off]}/metrics' | grep -q ringlm_prompt_cache_hits_total"
kill -9 "${SRV_PID[off]}"; unset 'SRV_PID[off]'

# ---- a model whose kernels are not split-invariant says so ---------------------------------------------------
q=$(model small-q4_K small q4_K)
if "$RINGLM" inspect "$q" 2>&1 | grep -Eq "of the weights, [1-9][0-9.]* [KMG]iB are repacked"; then
    serve_start q4 -m "$q" --threads 1 --parallel 1 --ctx 512
    check "repacked q4_K: the start-up line says a resumed prompt may differ" grep -q "may differ from a fresh read.*repacked" "$WORK/q4.log"
    check_eq "repacked q4_K: /metrics exact 0" "$(metric "${SRV_URL[q4]}" ringlm_prompt_cache_exact)" 0
    kill -9 "${SRV_PID[q4]}"; unset 'SRV_PID[q4]'
    serve_start q4n -m "$q" --threads 1 --parallel 1 --ctx 512 --no-repack
    check_eq "q4_K with --no-repack: /metrics exact 1" "$(metric "${SRV_URL[q4n]}" ringlm_prompt_cache_exact)" 1
    conv --url "${SRV_URL[q4n]}" --size 150 --seed 8 --turns 2 >"$WORK/c8.json"
    check "q4_K with --no-repack: equal to fresh reads" equal "$WORK/c8.json"
    kill -9 "${SRV_PID[q4n]}"; unset 'SRV_PID[q4n]'
else
    skip "this CPU repacks no q4_K weights: the not-exact report cannot be shown here"
fi

# ---- bad options ---------------------------------------------------------------------------------------------
bad_opt() { # DESC WANT-REGEX ARGS...: exit 2 and one line saying what is wrong
    local desc=$1 want=$2; shift 2
    local rc=0
    "$RINGLM" serve -m "$f" "$@" >/dev/null 2>"$WORK/opt.err" || rc=$?
    check "$desc" bash -c "test $rc = 2 && test \$(wc -l <'$WORK/opt.err') = 1 && grep -Eq -- \"$want\" '$WORK/opt.err'"
}
bad_opt "--cache-ram -5: says it wants MiB" "bad value '-5' for --cache-ram: want MiB, 0 or more" --cache-ram -5
bad_opt "--ctx-checkpoints x: says it wants a number" "bad value 'x' for --ctx-checkpoints: want a number, 0 to 1024" --ctx-checkpoints x
bad_opt "--checkpoint-every -1: says it wants tokens" "bad value '-1' for --checkpoint-every: want a number of tokens, 0 or more" --checkpoint-every -1
serve_start bad -m "$f" --threads 1 --parallel 1 --ctx 256
code=$(curl -s --max-time 10 -o "$WORK/bad.json" -w '%{http_code}' -H 'Content-Type: application/json' \
    --data-binary '{"prompt":"hi","max_tokens":2,"cache_prompt":"yes"}' "${SRV_URL[bad]}/v1/completions")
check_eq "cache_prompt must be a boolean: 400" "$code" 400
check "... naming the field" py "$WORK/bad.json" "d['error']['param'] == 'cache_prompt'"
finish
