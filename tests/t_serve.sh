#!/usr/bin/env bash
# ringlm serve end to end, over 127.0.0.1 with curl: response shapes and token counts, greedy output equal
# to `ringlm run`, streaming (SSE), seeds, stop strings, continuous batching (concurrent streams equal their
# sequential results), a client hanging up frees its slot, queue full -> 429, every error case, /metrics,
# /health, the chat page, and SIGTERM (drains, exits 0).
. "$(dirname "$0")/lib.sh"
f=$(model full-f32 k3-full f32)
MODEL_ID=$(basename "$f")
CT=(--max-time 60 -s)   # every curl is bounded
. "$(dirname "$0")/serve_lib.sh"
trap 'serve_stop_all; [ -n "${KEEP_WORK:-}" ] || rm -rf "$WORK"' EXIT
start() { local name=$1; shift; serve_start "$name" -m "$f" --threads 1 "$@"; } # start NAME [serve options]

# A small JSON/SSE checker: py FILE 'python expression over d (the JSON) or raw (the bytes)'.
# post NAME PATH JSON [curl args]: body to $WORK/NAME.json, status to $WORK/NAME.code
post() {
    local name=$1 path=$2 body=$3; shift 3
    curl "${CT[@]}" -o "$WORK/$name.json" -w '%{http_code}' -H 'Content-Type: application/json' \
        --data-binary "$body" "$@" "$URL$path" >"$WORK/$name.code" || true
}
code_is() { test "$(cat "$WORK/$1.code")" = "$2"; }
# run_text NAME ARGS: the text `ringlm run` prints, as the API shows it (invalid UTF-8 replaced the
# WHATWG/Python way), as a JSON string in $WORK/NAME.exp.
run_text() { local name=$1; shift
             "$RINGLM" run -m "$f" --temp 0 --ignore-eos --threads 1 "$@" 2>/dev/null |
             python3 -c 'import sys, json; json.dump(sys.stdin.buffer.read().decode("utf-8", "replace"), sys.stdout)' >"$WORK/$name.exp"; }
metric() { curl "${CT[@]}" "$URL/metrics" | awk -v k="$1" '$1 == k { print $2 }'; }

start main
URL=${SRV_URL[main]}

# ---- shapes, usage, and equality with ringlm run ---------------------------------------------------------
P="The quick brown fox"
post cmpl /v1/completions "{\"model\":\"$MODEL_ID\",\"prompt\":\"$P\",\"max_tokens\":24,\"temperature\":0,\"ignore_eos\":true}"
check "completion: 200" code_is cmpl 200
n_prompt=$("$RINGLM" tokenize -m "$f" "$P" | tr ',' '\n' | grep -c .)
check "completion: shape" py "$WORK/cmpl.json" "d['object'] == 'text_completion' and d['id'].startswith('cmpl-') and \
    isinstance(d['created'], int) and d['model'] == '$MODEL_ID' and len(d['choices']) == 1 and \
    d['choices'][0]['index'] == 0 and isinstance(d['choices'][0]['text'], str) and d['choices'][0]['finish_reason'] == 'length'"
check "completion: usage = real token counts ($n_prompt + 24)" py "$WORK/cmpl.json" \
    "usage(d['usage']) == {'prompt_tokens': $n_prompt, 'completion_tokens': 24, 'total_tokens': $n_prompt + 24}"
run_text want -p "$P" -n 24
want="load('want.exp')"
check "completion: temperature 0 text = ringlm run's" py "$WORK/cmpl.json" "d['choices'][0]['text'] == $want"

# logit_bias: added to the logits before sampling, greedy included, as `ringlm run --logit-bias` (and
# llama.cpp) add it. The ids: the unbiased text's first two tokens - one banned (false), one pushed down.
ids=$("$RINGLM" run -m "$f" -p "$P" -n 2 --temp 0 --ignore-eos --ids --threads 1 2>/dev/null)
b1=${ids%%,*} b2=${ids##*,}
run_text want_lb -p "$P" -n 24 --logit-bias "$b1-inf" --logit-bias "$b2-3.5"
post lb /v1/completions "{\"prompt\":\"$P\",\"max_tokens\":24,\"temperature\":0,\"ignore_eos\":true,\"logit_bias\":{\"$b1\":false,\"$b2\":-3.5}}"
check "logit_bias: 200, text = ringlm run --logit-bias's, not the unbiased text" py "$WORK/lb.json" \
    "d['choices'][0]['text'] == load('want_lb.exp') and d['choices'][0]['text'] != $want"
post lb_arr /v1/completions "{\"prompt\":\"$P\",\"max_tokens\":24,\"temperature\":0,\"ignore_eos\":true,\"logit_bias\":[[$b1,false],[$b2,-3.5]]}"
check "logit_bias as llama-server's [id, bias] pairs: the same text" py "$WORK/lb_arr.json" "d['choices'][0]['text'] == load('want_lb.exp')"
post lb_up /v1/completions "{\"prompt\":\"$P\",\"max_tokens\":6,\"temperature\":0.9,\"seed\":3,\"ignore_eos\":true,\"logit_bias\":{\"$b2\":100}}"
run_text want_up -p "$P" -n 6 --logit-bias "$b2+100"
check "logit_bias +100 on one token: sampled at temperature 0.9, every token is that one (= run's greedy text)" \
    py "$WORK/lb_up.json" "d['choices'][0]['text'] == load('want_up.exp') and d['usage']['completion_tokens'] == 6"

# logprobs: the model's log-softmax (before bias and sampling) of each generated token and its top
# alternatives, against the logits `ringlm logits` computes for the prompt and the generated tokens.
"$RINGLM" run -m "$f" -p "$P" -n 8 --temp 0 --ignore-eos --ids --threads 1 >"$WORK/lp.ids" 2>/dev/null
pids=$("$RINGLM" tokenize -m "$f" "$P")
"$RINGLM" logits -m "$f" --tokens "$pids,$(cat "$WORK/lp.ids")" --prefill "$n_prompt" --threads 1 -o "$WORK/lp_ref.bin"
post lp /v1/completions "{\"prompt\":\"$P\",\"max_tokens\":8,\"temperature\":0,\"ignore_eos\":true,\"logprobs\":3}"
check "completions logprobs: 8 tokens, each token's logprob and its 3 alternatives = the logits' log-softmax" \
    py "$WORK/lp.json" "lp_match(d['choices'][0]['logprobs'], ref_logprobs('lp_ref.bin', $n_prompt), 3)"
check "completions logprobs: text offsets start at 0 and grow within the text" py "$WORK/lp.json" \
    "(lambda l: l['text_offset'][0] == 0 and all(b >= a for a, b in zip(l['text_offset'], l['text_offset'][1:])) and l['text_offset'][-1] < len(d['choices'][0]['text'].encode()) + 4)(d['choices'][0]['logprobs'])"
post lp_sse /v1/completions "{\"prompt\":\"$P\",\"max_tokens\":8,\"temperature\":0,\"ignore_eos\":true,\"logprobs\":3,\"stream\":true}" -N
check "completions logprobs streamed: the same entries, spread over the chunks" py "$WORK/lp_sse.json" \
    "sum([c['choices'][0]['logprobs']['token_logprobs'] for c in sse(raw) if c['choices'][0]['logprobs']], []) == load('lp.json')['choices'][0]['logprobs']['token_logprobs']"
post lpc /v1/chat/completions "{\"messages\":[{\"role\":\"user\",\"content\":\"$P\"}],\"max_tokens\":12,\"temperature\":0.8,\"seed\":5,\"ignore_eos\":true,\"logprobs\":true,\"top_logprobs\":2}"
check "chat logprobs: one entry per token, logprob <= 0, 2 alternatives sorted, the chosen one's bytes make the reply" \
    py "$WORK/lpc.json" "(lambda c, txt: len(c) == d['usage']['completion_tokens'] and all(e['logprob'] <= 0 and len(e['top_logprobs']) == 2 and e['top_logprobs'][0]['logprob'] >= e['top_logprobs'][1]['logprob'] for e in c) and bytes(sum([e['bytes'] for e in c], [])).decode('utf-8', 'replace') == txt)(d['choices'][0]['logprobs']['content'], reply(d))"
post lpc_sse /v1/chat/completions "{\"messages\":[{\"role\":\"user\",\"content\":\"$P\"}],\"max_tokens\":12,\"temperature\":0.8,\"seed\":5,\"ignore_eos\":true,\"logprobs\":true,\"top_logprobs\":2,\"stream\":true}" -N
check "chat logprobs streamed: the same entries as not streamed" py "$WORK/lpc_sse.json" \
    "sum([c['choices'][0]['logprobs']['content'] for c in sse(raw) if c['choices'] and c['choices'][0].get('logprobs')], []) == load('lpc.json')['choices'][0]['logprobs']['content']"
# echo: the prompt comes back first; with logprobs its tokens' (the first null, as nothing predicts it), and
# max_tokens 0 scores the prompt alone - what evaluation harnesses send for log-likelihoods.
# (--split-invariant: serve reads every prompt piece so, docs/numerics.md "Split invariance")
"$RINGLM" logits -m "$f" --tokens "$pids" --threads 1 --split-invariant -o "$WORK/lpp_ref.bin"
post echo0 /v1/completions "{\"prompt\":\"$P\",\"max_tokens\":0,\"echo\":true,\"logprobs\":2}"
check "echo, max_tokens 0, logprobs 2: the prompt's text, one entry per prompt token, the first null, the rest = the logits' log-softmax" \
    py "$WORK/echo0.json" "(lambda c, l: c['text'] == '$P' and len(l['tokens']) == $n_prompt and l['token_logprobs'][0] is None and l['top_logprobs'][0] is None and lp_match({'token_logprobs': l['token_logprobs'][1:], 'top_logprobs': l['top_logprobs'][1:]}, ref_logprobs('lpp_ref.bin', 1), 2) and d['usage']['completion_tokens'] == 0)(d['choices'][0], d['choices'][0]['logprobs'])"
post echo8 /v1/completions "{\"prompt\":\"$P\",\"max_tokens\":8,\"temperature\":0,\"ignore_eos\":true,\"echo\":true,\"logprobs\":3}"
check "echo with 8 tokens: the prompt's text then the completion's, the prompt's entries then the completion's (within 1e-4: all rows in one matmul round differently)" py "$WORK/echo8.json" \
    "(lambda a, b, c: d['choices'][0]['text'] == '$P' + load('lp.json')['choices'][0]['text'] and len(a) == $n_prompt + 8 and all(abs(x - y) < 1e-4 for x, y in zip(a[$n_prompt:], b)) and all(abs(x - y) < 1e-4 for x, y in zip(a[1:$n_prompt], c[1:])))(d['choices'][0]['logprobs']['token_logprobs'], load('lp.json')['choices'][0]['logprobs']['token_logprobs'], load('echo0.json')['choices'][0]['logprobs']['token_logprobs'])"
post echo8_sse /v1/completions "{\"prompt\":\"$P\",\"max_tokens\":8,\"temperature\":0,\"ignore_eos\":true,\"echo\":true,\"logprobs\":3,\"stream\":true}" -N
check "echo streamed: the same text and entries" py "$WORK/echo8_sse.json" \
    "text(sse(raw)) == load('echo8.json')['choices'][0]['text'] and sum([c['choices'][0]['logprobs']['token_logprobs'] for c in sse(raw) if c['choices'][0]['logprobs']], []) == load('echo8.json')['choices'][0]['logprobs']['token_logprobs']"
post nolp /v1/completions "{\"prompt\":\"$P\",\"max_tokens\":2}"
check "no logprobs asked: \"logprobs\": null" py "$WORK/nolp.json" "d['choices'][0]['logprobs'] is None"

# n choices and prompt arrays: one choice per prompt and n per prompt, in order; choice j of a prompt
# samples with seed + j (so it equals a single request with that seed); the prompt counted once.
P2="Once upon a time"
run_text want_p2 -p "$P2" -n 10
post arr /v1/completions "{\"prompt\":[\"$P\",\"$P2\"],\"max_tokens\":10,\"temperature\":0,\"ignore_eos\":true}"
check "prompt array: one choice per prompt, in order, each = ringlm run's text for its prompt" py "$WORK/arr.json" \
    "[c['index'] for c in d['choices']] == [0, 1] and d['choices'][0]['text'] == load('want.exp')[:len(d['choices'][0]['text'])] and d['choices'][1]['text'] == load('want_p2.exp')"
p2ids=$("$RINGLM" tokenize -m "$f" "$P2")
post arr_ids /v1/completions "{\"prompt\":[[$pids],[$p2ids]],\"max_tokens\":10,\"temperature\":0,\"ignore_eos\":true}"
check "prompt array of token-id arrays: the same choices" py "$WORK/arr_ids.json" \
    "[c['text'] for c in d['choices']] == [c['text'] for c in load('arr.json')['choices']]"
for sd in 11 12; do
    post "seed$sd" /v1/completions "{\"prompt\":\"$P2\",\"max_tokens\":12,\"temperature\":1,\"seed\":$sd,\"ignore_eos\":true}"
done
post n2 /v1/completions "{\"prompt\":\"$P2\",\"n\":2,\"max_tokens\":12,\"temperature\":1,\"seed\":11,\"ignore_eos\":true}"
check "n=2: choice 0 = the request with seed 11, choice 1 = with seed 12; the prompt counted once" py "$WORK/n2.json" \
    "[c['text'] for c in d['choices']] == [load('seed11.json')['choices'][0]['text'], load('seed12.json')['choices'][0]['text']] and d['usage']['prompt_tokens'] == load('seed11.json')['usage']['prompt_tokens'] and d['usage']['completion_tokens'] == 24"
# n = 4 over a longer prompt: the prompt is read once (the other choices are forked from the first after all
# but its last token) and each choice is still exactly the request with its seed.
P4="$P2 $P2 $P2 $P2"
for sd in 21 22 23 24; do
    post "seed$sd" /v1/completions "{\"prompt\":\"$P4\",\"max_tokens\":10,\"temperature\":1,\"seed\":$sd,\"ignore_eos\":true}"
done
p0=$(metric ringlm_prompt_tokens_total); s0=$(metric ringlm_prompt_tokens_shared_total)
# (cache_prompt false: the seeded requests above left this prompt in the prompt cache, which would read less)
post n4 /v1/completions "{\"prompt\":\"$P4\",\"n\":4,\"max_tokens\":10,\"temperature\":1,\"seed\":21,\"ignore_eos\":true,\"cache_prompt\":false}"
p1=$(metric ringlm_prompt_tokens_total); s1=$(metric ringlm_prompt_tokens_shared_total)
n4p=$(python3 -c "import json; print(json.load(open('$WORK/seed21.json'))['usage']['prompt_tokens'])")
check "n=4: choice j = the request with seed 21 + j" py "$WORK/n4.json" \
    "[c['text'] for c in d['choices']] == [load('seed%d.json' % s)['choices'][0]['text'] for s in (21, 22, 23, 24)]"
check "... the $n4p-token prompt read once: $((p1 - p0)) prompt tokens computed (= $n4p + 3), $((s1 - s0)) shared (= 3 x $((n4p - 1)))" \
    test "$((p1 - p0))" = "$((n4p + 3))" -a "$((s1 - s0))" = "$((3 * (n4p - 1)))"
post n2_sse /v1/completions "{\"prompt\":\"$P2\",\"n\":2,\"max_tokens\":12,\"temperature\":1,\"seed\":11,\"ignore_eos\":true,\"stream\":true}" -N
check "n=2 streamed: each index's text = its non-streamed choice, each ends with a finish_reason" py "$WORK/n2_sse.json" \
    "all(''.join(ch['text'] for c in sse(raw) for ch in c['choices'] if ch['index'] == i) == load('n2.json')['choices'][i]['text'] and [ch['finish_reason'] for c in sse(raw) for ch in c['choices'] if ch['index'] == i][-1] == 'length' for i in (0, 1))"
post n3chat /v1/chat/completions "{\"messages\":[{\"role\":\"user\",\"content\":\"$P2\"}],\"n\":3,\"max_tokens\":6,\"temperature\":0,\"ignore_eos\":true,\"stream\":true}" -N
check "chat n=3 streamed at temperature 0: three choices, each opened with its role, the same text" py "$WORK/n3chat.json" \
    "sorted(ch['index'] for c in sse(raw) for ch in c['choices'] if ch['delta'].get('role')) == [0, 1, 2] and len(set(''.join(ch['delta'].get('content') or '' for c in sse(raw) for ch in c['choices'] if ch['index'] == i) for i in range(3))) == 1"

# response_format json_object: constrained decoding makes random weights write a JSON object every time,
# whole within max_tokens (the sampler writes the shortest completion when the budget runs out).
json_ok=0 json_stop=0
for i in $(seq 50); do
    mt=$((4 + i % 23)); temp=$(( i % 5 == 0 ? 0 : 1 ))
    if [ $((i % 2)) = 0 ]; then
        post "js$i" /v1/chat/completions "{\"messages\":[{\"role\":\"user\",\"content\":\"Give me JSON $i\"}],\"max_tokens\":$mt,\"temperature\":$temp,\"seed\":$i,\"response_format\":{\"type\":\"json_object\"},\"chat_template_kwargs\":{\"thinking\":false}}"
        field="d['choices'][0]['message']['content']"
    else
        post "js$i" /v1/completions "{\"prompt\":\"JSON $i:\",\"max_tokens\":$mt,\"temperature\":$temp,\"seed\":$i,\"response_format\":{\"type\":\"json_object\"}}"
        field="d['choices'][0]['text']"
    fi
    if py "$WORK/js$i.json" "isinstance(json.loads($field), dict) and d['usage']['completion_tokens'] <= $mt" >/dev/null; then
        json_ok=$((json_ok + 1))
    else
        echo "info: json_object request $i ($mt tokens, temperature $temp) gave: $(head -c 400 "$WORK/js$i.json")"
    fi
    py "$WORK/js$i.json" "d['choices'][0]['finish_reason'] == 'stop'" >/dev/null && json_stop=$((json_stop + 1))
done
check "json_object: 50 seeded requests (chat and completions, 4 to 26 tokens, greedy and sampled): all parse as JSON objects within max_tokens ($json_stop ended by the model)" \
    test "$json_ok" = 50
post js_sse /v1/completions "{\"prompt\":\"JSON:\",\"max_tokens\":20,\"temperature\":1,\"seed\":4,\"response_format\":{\"type\":\"json_object\"},\"stream\":true}" -N
post js_ns /v1/completions "{\"prompt\":\"JSON:\",\"max_tokens\":20,\"temperature\":1,\"seed\":4,\"response_format\":{\"type\":\"json_object\"}}"
check "json_object streamed: the same object" py "$WORK/js_sse.json" "text(sse(raw)) == load('js_ns.json')['choices'][0]['text'] and isinstance(json.loads(text(sse(raw))), dict)"
post js_free /v1/completions "{\"prompt\":\"JSON:\",\"max_tokens\":20,\"temperature\":1,\"seed\":4}"
check "... and without response_format the same seed writes no JSON object (the constraint did the work)" \
    py "$WORK/js_free.json" "(lambda t: not t.lstrip().startswith('{'))(d['choices'][0]['text'])"

# response_format json_schema: 52 seeded requests over 4 schemas (nested objects, required and optional
# properties, enums, arrays with bounds, a recursive $ref, anyOf, a uuid), chat and completions, greedy and
# sampled: every output parses and validates (Python's jsonschema, formats checked).
cat >"$WORK/schemas.json" <<'JSON'
[{"type":"object","properties":{"name":{"type":"string","maxLength":12},"age":{"type":"integer"},"id":{"type":"string","format":"uuid"},"tags":{"type":"array","items":{"enum":["a","b","c"]},"maxItems":3}},"required":["name","age"],"additionalProperties":false},
 {"type":"array","items":{"type":"object","properties":{"id":{"type":"integer"},"ok":{"type":"boolean"},"note":{"type":["string","null"]}},"required":["id","ok"],"additionalProperties":false},"minItems":1,"maxItems":3},
 {"$defs":{"node":{"type":"object","properties":{"v":{"type":"number"},"kids":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":2}},"required":["v"],"additionalProperties":false}},"$ref":"#/$defs/node"},
 {"type":"object","properties":{"when":{"anyOf":[{"type":"null"},{"type":"number"},{"type":"string","maxLength":8}]},"kind":{"enum":["x","y",7]},"extra":{"type":"object","properties":{"deep":{"type":"object","properties":{"k":{"const":true}},"required":["k"],"additionalProperties":false}},"required":["deep"],"additionalProperties":false}},"required":["when","kind"],"additionalProperties":false}]
JSON
for i in $(seq 52); do
    k=$((i % 4)); mt=$((40 + i % 21)); temp=$(( i % 5 == 0 ? 0 : 1 ))
    sch=$(python3 -c "import json; print(json.dumps(json.load(open('$WORK/schemas.json'))[$k]))")
    rf="\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"s$k\",\"strict\":true,\"schema\":$sch}}"
    if [ $((i % 2)) = 0 ]; then
        post "jss$i" /v1/chat/completions "{\"messages\":[{\"role\":\"user\",\"content\":\"Schema $i\"}],\"max_tokens\":$mt,\"temperature\":$temp,\"seed\":$i,$rf,\"chat_template_kwargs\":{\"thinking\":false}}"
    else
        post "jss$i" /v1/completions "{\"prompt\":\"Schema $i:\",\"max_tokens\":$mt,\"temperature\":$temp,\"seed\":$i,$rf}"
    fi
done
# schema_check NAME N: NAME1 .. NAMEN all validate against their schema, within their max_tokens.
schema_check() {
    local pyi
    for pyi in python3 /usr/bin/python3; do "$pyi" -c 'import jsonschema' 2>/dev/null && break; done
    "$pyi" - "$WORK" "$1" "$2" <<'PY'
import json, sys, jsonschema
w, name, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
schemas = json.load(open(w + '/schemas.json'))
ok = 0
for i in range(1, n + 1):
    d = json.load(open('%s/%s%d.json' % (w, name, i)))
    c = d['choices'][0]
    text = c['message']['content'] if 'message' in c else c['text']
    try:
        jsonschema.validate(json.loads(text), schemas[i % 4], format_checker=jsonschema.FormatChecker())
        ok += d['usage']['completion_tokens'] <= 40 + i % 21
    except Exception as e:
        print('info: schema request %d: %r: %s' % (i, text, str(e).splitlines()[0]))
print('info: %d of %d valid' % (ok, n))
sys.exit(0 if ok == n else 1)
PY
}
check "json_schema: 52 seeded requests over 4 schemas (chat and completions, greedy and sampled): every output parses and validates within max_tokens" schema_check jss 52
# ... with n-gram drafts (the prompt holds JSON to look up): drafts the grammar refuses are cut before they
# are verified, the rest judged against the constrained distribution; greedy ones write exactly the text
# they write undrafted.
d0=$(metric ringlm_spec_drafted_tokens_total); r0=$(metric ringlm_spec_grammar_refused_tokens_total)
for i in $(seq 20); do
    k=$((i % 4)); mt=$((40 + i % 21)); temp=$(( i % 5 == 0 ? 0 : 1 ))
    sch=$(python3 -c "import json; print(json.dumps(json.load(open('$WORK/schemas.json'))[$k]))")
    rf="\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"s$k\",\"strict\":true,\"schema\":$sch}}"
    post "jsd$i" /v1/completions "{\"prompt\":\"Schema $i:\",\"max_tokens\":$mt,\"temperature\":$temp,\"seed\":$i,$rf,\"draft\":\"ngram\"}"
    # the same prompt as jss$i for odd i; for even i (chat there) the undrafted twin is made here
    [ $((i % 2)) = 1 ] || post "jsn$i" /v1/completions "{\"prompt\":\"Schema $i:\",\"max_tokens\":$mt,\"temperature\":$temp,\"seed\":$i,$rf}"
done
d1=$(metric ringlm_spec_drafted_tokens_total); r1=$(metric ringlm_spec_grammar_refused_tokens_total)
check "json_schema with n-gram drafts: 20 seeded requests all validate within max_tokens" schema_check jsd 20
greedy_same() {
    local i t
    for i in 5 10 15 20; do
        t=jss$i; [ $((i % 2)) = 1 ] || t=jsn$i
        py "$WORK/jsd$i.json" "d['choices'][0]['text'] == load('$t.json')['choices'][0]['text']" || return 1
    done
}
check "... the 4 greedy ones write exactly their undrafted text" greedy_same
check "... drafts were verified ($((d1 - d0))) and drafts the grammar refused were cut before verification ($((r1 - r0)))" \
    test "$((d1 - d0))" -gt 0 -a "$((r1 - r0))" -gt 0
post jss_sse /v1/completions "{\"prompt\":\"Schema 1:\",\"max_tokens\":41,\"temperature\":1,\"seed\":1,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"s1\",\"schema\":$(python3 -c "import json; print(json.dumps(json.load(open('$WORK/schemas.json'))[1]))")}},\"stream\":true}" -N
check "json_schema streamed: the same text as not streamed" py "$WORK/jss_sse.json" "text(sse(raw)) == load('jss1.json')['choices'][0]['text']"
post jss_any /v1/completions '{"prompt":"Any JSON:","max_tokens":30,"temperature":1,"seed":2,"response_format":{"type":"json_schema","json_schema":{"name":"any"}}}'
check "json_schema without a schema: any JSON value" py "$WORK/jss_any.json" "(json.loads(d['choices'][0]['text']), True)[1]"
post jss_free /v1/completions "{\"prompt\":\"Schema 1:\",\"max_tokens\":41,\"temperature\":1,\"seed\":1}"
check "... and without the schema the same seed writes no JSON array (the constraint did the work)" \
    py "$WORK/jss_free.json" "(lambda t: not t.lstrip().startswith('['))(d['choices'][0]['text'])"

# Structured output with thinking on (the K3 template's default): the reasoning is free and the JSON is
# the answer, so it lands in `content` (an OpenAI client reads nothing else), never in reasoning_content -
# before, 4 of 5 seeds put it in the reasoning and left content "". A 3-property strict object at
# temperature 1, seeds 1-6; then json_object, streamed: the content deltas join to the object.
P3='{"type":"object","properties":{"name":{"type":"string","maxLength":10},"age":{"type":"integer"},"ok":{"type":"boolean"}},"required":["name","age","ok"],"additionalProperties":false}'
for i in $(seq 6); do
    post "jst$i" /v1/chat/completions "{\"messages\":[{\"role\":\"user\",\"content\":\"A person, please $i\"}],\"max_tokens\":160,\"temperature\":1,\"seed\":$i,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"p\",\"strict\":true,\"schema\":$P3}}}"
done
think_json() {
    local pyi
    for pyi in python3 /usr/bin/python3; do "$pyi" -c 'import jsonschema' 2>/dev/null && break; done
    "$pyi" - "$WORK" "$P3" <<'PY'
import json, sys, jsonschema
w, schema = sys.argv[1], json.loads(sys.argv[2])
for i in range(1, 7):
    m = json.load(open('%s/jst%d.json' % (w, i)))['choices'][0]['message']
    try:
        jsonschema.validate(json.loads(m['content']), schema)
    except Exception as e:
        sys.exit('jst%d: content %r, reasoning %r: %s' % (i, m.get('content'), (m.get('reasoning_content') or '')[-80:], e))
PY
}
check "json_schema with thinking on: 6 sampled replies, each content a valid object" think_json
reasoned() { local i; for i in $(seq 6); do py "$WORK/jst$i.json" "d['choices'][0]['message'].get('reasoning_content')" || return 1; done; }
check "... and the reasoning section was written (not skipped) in them" reasoned
post jot_sse /v1/chat/completions '{"messages":[{"role":"user","content":"An object"}],"max_tokens":120,"temperature":1,"seed":3,"response_format":{"type":"json_object"},"stream":true}' -N
check "json_object with thinking on, streamed: the content deltas join to a JSON object, reasoning deltas apart" py "$WORK/jot_sse.json" \
    "(isinstance(json.loads(''.join(ch['delta'].get('content') or '' for c in sse(raw) for ch in c['choices'])), dict) and
      any(ch['delta'].get('reasoning_content') for c in sse(raw) for ch in c['choices']))"

# Tools: declared in the prompt; tool_choice "required" / named makes random weights call one (the grammar
# forces a tools section whose calls name declared tools and whose arguments match their schemas), parsed
# into message.tool_calls, streamed as delta.tool_calls; "none" and "auto" leave the reply as text.
TOOLS='[{"type":"function","function":{"name":"get_weather","description":"Weather now","parameters":{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"},"unit":{"enum":["c","f"]}},"required":["city"],"additionalProperties":false}}},{"type":"function","function":{"name":"ping","parameters":{"type":"object","properties":{}}}}]'
printf '%s' "$TOOLS" >"$WORK/tools.json"
TMSG='"messages":[{"role":"user","content":"Weather in Paris?"}]'
for i in $(seq 10); do
    nothink=""; [ $((i % 2)) = 0 ] && nothink=',"chat_template_kwargs":{"thinking":false}'
    post "tc$i" /v1/chat/completions "{$TMSG,\"tools\":$TOOLS,\"tool_choice\":\"required\",\"max_tokens\":$((150 + i * 5)),\"temperature\":$(( i % 3 == 0 ? 0 : 1 )),\"seed\":$i$nothink}"
done
tools_check() {
    python3 - "$WORK" <<'PY'
import json, sys
w, ok = sys.argv[1], 0
for i in range(1, 11):
    d = json.load(open('%s/tc%d.json' % (w, i)))
    c = d['choices'][0]
    try:
        assert c['finish_reason'] == 'tool_calls', c['finish_reason']
        calls = c['message']['tool_calls']
        assert len(calls) >= 1
        for k, t in enumerate(calls):
            assert t['type'] == 'function' and t['index'] == k and t['id'].startswith('call_')
            a = json.loads(t['function']['arguments'])
            if t['function']['name'] == 'get_weather':
                assert isinstance(a['city'], str) and set(a) <= {'city', 'days', 'unit'}
                assert 'days' not in a or isinstance(a['days'], int)
                assert 'unit' not in a or a['unit'] in ('c', 'f')
            else:
                assert t['function']['name'] == 'ping' and isinstance(a, dict), t
        assert len(set(t['id'] for t in calls)) == len(calls)
        ok += 1
    except Exception as e:
        print('info: tool request %d: %r %s' % (i, e, json.dumps(c)[:400]))
print('info: %d of 10' % ok)
sys.exit(0 if ok == 10 else 1)
PY
}
check "tool_choice required: 10 seeded requests (thinking on and off) all end in tool_calls naming a declared tool, arguments valid JSON for its schema" tools_check
post tc_named /v1/chat/completions "{$TMSG,\"tools\":$TOOLS,\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"ping\"}},\"max_tokens\":150,\"seed\":3}"
check "tool_choice naming 'ping': every call is to ping" py "$WORK/tc_named.json" \
    "d['choices'][0]['finish_reason'] == 'tool_calls' and all(t['function']['name'] == 'ping' for t in d['choices'][0]['message']['tool_calls'])"
post tc_sse /v1/chat/completions "{$TMSG,\"tools\":$TOOLS,\"tool_choice\":\"required\",\"max_tokens\":155,\"temperature\":1,\"seed\":1,\"stream\":true}" -N
check "tool calls streamed: delta.tool_calls carry the same calls (names, arguments), the same reasoning, then finish_reason tool_calls" py "$WORK/tc_sse.json" \
    "[(t['index'], t['function']) for c in sse(raw) for ch in c['choices'] for t in ch['delta'].get('tool_calls') or []] == [(t['index'], t['function']) for t in load('tc1.json')['choices'][0]['message']['tool_calls']] and [ch['finish_reason'] for c in sse(raw) for ch in c['choices'] if ch['finish_reason']] == ['tool_calls'] and ''.join(ch['delta'].get('reasoning_content') or '' for c in sse(raw) for ch in c['choices']) == load('tc1.json')['choices'][0]['message'].get('reasoning_content', '')"
post tc_none /v1/chat/completions "{$TMSG,\"tools\":$TOOLS,\"tool_choice\":\"none\",\"max_tokens\":8,\"temperature\":0,\"ignore_eos\":true}"
post tc_auto /v1/chat/completions "{$TMSG,\"tools\":$TOOLS,\"max_tokens\":8,\"temperature\":0,\"ignore_eos\":true}"
post tc_plain /v1/chat/completions "{$TMSG,\"max_tokens\":8,\"temperature\":0,\"ignore_eos\":true}"
check "tool_choice none and auto: 200, no calls from random weights, the declarations in the prompt (more prompt tokens than without tools)" \
    py "$WORK/tc_none.json" "d['choices'][0]['finish_reason'] == 'length' and 'tool_calls' not in d['choices'][0]['message'] and load('tc_auto.json')['choices'][0]['finish_reason'] == 'length' and d['usage']['prompt_tokens'] == load('tc_auto.json')['usage']['prompt_tokens'] > load('tc_plain.json')['usage']['prompt_tokens'] + 40"
# tool_choice auto: free text, but a call the model writes is well formed with arguments for its schema
# (the grammar constrains the tools section once it opens). Random weights are pushed to close sections
# and open one (logit_bias on the control tokens): with auto the calls parse and validate; with none (no
# grammar) the same push writes no parseable call.
o_id=$("$RINGLM" tokenize -m "$f" --special "<|open|>"); c_id=$("$RINGLM" tokenize -m "$f" --special "<|close|>")
LB="\"logit_bias\":{\"$o_id\":14,\"$c_id\":6}"
# (Tools without free strings, which random weights never end: the calls stay short.)
AT='[{"type":"function","function":{"name":"ping","parameters":{"type":"object","properties":{}}}},{"type":"function","function":{"name":"set","strict":true,"parameters":{"type":"object","properties":{"n":{"type":"integer"},"on":{"type":"boolean"}},"required":["n"],"additionalProperties":false}}}]'
for i in 1 2 3; do
    post "ta$i" /v1/chat/completions "{$TMSG,\"tools\":$AT,\"max_tokens\":900,\"temperature\":1,\"seed\":$i,$LB}"
done
post ta_none /v1/chat/completions "{$TMSG,\"tools\":$AT,\"tool_choice\":\"none\",\"max_tokens\":300,\"temperature\":1,\"seed\":1,$LB}"
auto_check() { # every reply ends either without calls or in valid ones, never malformed; some call
    python3 - "$WORK" <<'PY' || return 1
import json, sys
w, calls = sys.argv[1], 0
for i in (1, 2, 3):
    c = json.load(open('%s/ta%d.json' % (w, i)))['choices'][0]
    if c['finish_reason'] != 'tool_calls':
        assert c['finish_reason'] in ('stop', 'length') and 'tool_calls' not in c['message'] and '<|open|>call' not in c['message']['content'], c
        continue
    for t in c['message']['tool_calls']:
        a = json.loads(t['function']['arguments'])
        assert (t['function']['name'] == 'ping' and isinstance(a, dict)) or (t['function']['name'] == 'set' and type(a['n']) is int and set(a) <= {'n', 'on'}), t
    calls += 1
print('info: %d of 3 replies called' % calls)
sys.exit(0 if calls >= 1 else 1)
PY
    py "$WORK/ta_none.json" "d['choices'][0]['finish_reason'] != 'tool_calls' and 'tool_calls' not in d['choices'][0]['message']"
}
check "tool_choice auto, sections pushed open: 3 sampled replies end without calls or in well-formed calls of declared tools (some do), never malformed; with none, the same push writes none" auto_check
post frame_lenient /v1/completions '{"prompt":"S:","max_tokens":30,"temperature":1,"seed":3,"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object","properties":{"n":{"type":"integer","minimum":0},"s":{"type":"string","pattern":"^a"}},"required":["n","s"],"additionalProperties":false}}}}'
check "response_format json_schema not strict, with keywords it cannot enforce: 200, valid JSON following the rest (required, types)" \
    py "$WORK/frame_lenient.json" "(lambda v: sorted(v) == ['n', 's'] and isinstance(v['n'], int) and isinstance(v['s'], str))(json.loads(d['choices'][0]['text']))"
post tc_lenient /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"n":{"type":"integer","minimum":0}},"required":["n"]}}}],"tool_choice":"required","max_tokens":150,"seed":2}'
check "a required call of a tool, not strict, with such a keyword: 200, a call with an integer n" \
    py "$WORK/tc_lenient.json" "d['choices'][0]['finish_reason'] == 'tool_calls' and isinstance(json.loads(d['choices'][0]['message']['tool_calls'][0]['function']['arguments'])['n'], int)"
# the round trip: the calls go back in the history with their results, and the model answers
python3 - "$WORK" >"$WORK/rt.body" <<'PY'
import json, sys
w = sys.argv[1]
c = json.load(open(w + '/tc1.json'))['choices'][0]['message']
calls = [{'id': t['id'], 'type': 'function', 'function': t['function']} for t in c['tool_calls']]
msgs = [{'role': 'user', 'content': 'Weather in Paris?'}, {'role': 'assistant', 'content': c['content'], 'tool_calls': calls}] + \
       [{'role': 'tool', 'tool_call_id': t['id'], 'content': '{"temp": 21}'} for t in calls]
print(json.dumps({'messages': msgs, 'tools': json.load(open(w + '/tools.json')), 'max_tokens': 6, 'temperature': 0, 'ignore_eos': True}))
PY
post tc_rt /v1/chat/completions "$(cat "$WORK/rt.body")"
check "the round trip: the assistant's tool_calls and the tool results rendered back, an answer as text" \
    py "$WORK/tc_rt.json" "d['choices'][0]['finish_reason'] == 'length' and isinstance(d['choices'][0]['message']['content'], str) and d['usage']['prompt_tokens'] > load('tc_auto.json')['usage']['prompt_tokens']"

Q="What is two plus two?"
post chat /v1/chat/completions "{\"messages\":[{\"role\":\"user\",\"content\":\"$Q\"}],\"max_completion_tokens\":20,\"temperature\":0,\"ignore_eos\":true}"
"$RINGLM" run -m "$f" -p "$Q" --chat -n 20 --temp 0 --ignore-eos --threads 1 --metrics-json "$WORK/chat_run.json" >/dev/null 2>&1
chat_prompt=$(python3 -c "import json; print(json.load(open('$WORK/chat_run.json'))['prompt_tokens'])")
check "chat: 200" code_is chat 200
check "chat: shape" py "$WORK/chat.json" "d['object'] == 'chat.completion' and d['id'].startswith('chatcmpl-') and \
    d['model'] == '$MODEL_ID' and d['choices'][0]['message']['role'] == 'assistant' and \
    isinstance(d['choices'][0]['message']['content'], str) and d['choices'][0]['finish_reason'] == 'length'"
check "chat: usage = real token counts ($chat_prompt + 20)" py "$WORK/chat.json" \
    "usage(d['usage']) == {'prompt_tokens': $chat_prompt, 'completion_tokens': 20, 'total_tokens': $chat_prompt + 20}"
run_text want_chat -p "$Q" --chat -n 20
want_chat="load('want_chat.exp')"
check "chat: temperature 0 reply (reasoning, then content) = ringlm run --chat's text" py "$WORK/chat.json" "reply(d) == $want_chat"
post chat_parts /v1/chat/completions "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"What is two \"},{\"type\":\"text\",\"text\":\"plus two?\"}]}],\"max_tokens\":20,\"temperature\":0,\"ignore_eos\":true}"
check "chat: content as text parts = the same text" py "$WORK/chat_parts.json" "reply(d) == $want_chat"

# Thinking (the K3 template's switch; on by default): the generation prompt opens the think section, so
# the reply is reasoning_content until the model closes it; off, it opens the response section: content.
check "chat, thinking on (default): the reply is reasoning_content, framed by no section names" py "$WORK/chat.json" \
    "d['choices'][0]['message'].get('reasoning_content') and 'think' not in d['choices'][0]['message']['content']"
post nothink /v1/chat/completions "{\"messages\":[{\"role\":\"user\",\"content\":\"$Q\"}],\"max_tokens\":20,\"temperature\":0,\"ignore_eos\":true,\"chat_template_kwargs\":{\"thinking\":false}}"
check "chat_template_kwargs thinking false: content, no reasoning_content, another prompt (no think section)" py "$WORK/nothink.json" \
    "d['choices'][0]['message']['content'] and 'reasoning_content' not in d['choices'][0]['message'] and d['usage']['prompt_tokens'] != $chat_prompt"
post effnone /v1/chat/completions "{\"messages\":[{\"role\":\"user\",\"content\":\"$Q\"}],\"max_tokens\":20,\"temperature\":0,\"ignore_eos\":true,\"reasoning_effort\":\"none\"}"
check "reasoning_effort none = thinking off: the same reply" py "$WORK/effnone.json" \
    "d['choices'][0]['message'] == load('nothink.json')['choices'][0]['message']"

# ---- streaming -------------------------------------------------------------------------------------------
post chat_sse /v1/chat/completions "{\"messages\":[{\"role\":\"user\",\"content\":\"$Q\"}],\"max_tokens\":20,\"temperature\":0,\"ignore_eos\":true,\"stream\":true,\"stream_options\":{\"include_usage\":true}}" -N
check "chat stream: 200" code_is chat_sse 200
check "chat stream: SSE chunks, ends with [DONE]" py "$WORK/chat_sse.json" "len(sse(raw)) >= 3"
check "chat stream: first delta has the role, chunks are chat.completion.chunk" py "$WORK/chat_sse.json" \
    "sse(raw)[0]['choices'][0]['delta']['role'] == 'assistant' and all(c['object'] == 'chat.completion.chunk' for c in sse(raw))"
check "chat stream: text = the non-streamed text" py "$WORK/chat_sse.json" "content(sse(raw)) == $want_chat"
check "chat stream: finish_reason, then a usage chunk" py "$WORK/chat_sse.json" \
    "sse(raw)[-2]['choices'][0]['finish_reason'] == 'length' and sse(raw)[-1]['choices'] == [] and \
     usage(sse(raw)[-1]['usage']) == {'prompt_tokens': $chat_prompt, 'completion_tokens': 20, 'total_tokens': $chat_prompt + 20}"
post cmpl_sse /v1/completions "{\"prompt\":\"$P\",\"max_tokens\":24,\"temperature\":0,\"ignore_eos\":true,\"stream\":true}" -N
check "completion stream: text = ringlm run's, no usage chunk unless asked" py "$WORK/cmpl_sse.json" \
    "content(sse(raw), False) == $want and sse(raw)[-1]['choices'][0]['finish_reason'] == 'length' and \
     all('usage' not in c for c in sse(raw))"

# A token that decodes to a NUL byte (this prompt's first, on this model): the text goes on past it, the NUL
# sent as \u0000, streamed or not.
Z="Hello world, this is a longer prompt"
run_text want_nul -p "$Z" -n 12
check "(the reference text has a NUL byte, then more)" python3 -c "import json, sys; t = json.load(open('$WORK/want_nul.exp')); sys.exit(not ('\0' in t and len(t) > t.index('\0') + 1))"
post nul /v1/completions "{\"prompt\":\"$Z\",\"max_tokens\":12,\"temperature\":0,\"ignore_eos\":true}"
post nul_sse /v1/completions "{\"prompt\":\"$Z\",\"max_tokens\":12,\"temperature\":0,\"ignore_eos\":true,\"stream\":true}" -N
check "a NUL byte in the text: all of it = ringlm run's, streamed and not" bash -c \
    "python3 '$WORK/check.py' '$WORK/nul.json' \"d['choices'][0]['text'] == load('want_nul.exp')\" &&
     python3 '$WORK/check.py' '$WORK/nul_sse.json' \"content(sse(raw), False) == load('want_nul.exp')\""

# ---- sampling --------------------------------------------------------------------------------------------
seeded() { post "seed$1_$2" /v1/completions "{\"prompt\":\"Once upon a time\",\"max_tokens\":24,\"temperature\":1,\"seed\":$1,\"ignore_eos\":true}"
           python3 -c "import json; print(json.dumps(json.load(open('$WORK/seed$1_$2.json'))['choices'][0]['text']))"; }
a=$(seeded 7 a); b=$(seeded 7 b); c=$(seeded 8 c)
check_eq "seed: same seed at temperature 1, same text" "$a" "$b"
check_ne "seed: another seed, another text" "$a" "$c"

# ---- stop strings ----------------------------------------------------------------------------------------
# A stop string taken from inside the greedy text: the reply is the text before its first occurrence.
stop=$(python3 -c "
import json, re; t = json.load(open('$WORK/want.exp'))
m = [x for x in re.finditer(r'[A-Za-z]{2,}', t) if x.start() > 0]
print(m[len(m) // 2].group(0) if m else '')")
if [ -n "$stop" ]; then
    python3 -c "import json; t = json.load(open('$WORK/want.exp')); json.dump(t[:t.find('$stop')], open('$WORK/stop.exp', 'w'))"
    exp="load('stop.exp')"
    post stop1 /v1/completions "{\"prompt\":\"$P\",\"max_tokens\":24,\"temperature\":0,\"stop\":\"$stop\"}"
    check "stop string '$stop': text before it, finish_reason stop" py "$WORK/stop1.json" \
        "d['choices'][0]['text'] == $exp and d['choices'][0]['finish_reason'] == 'stop'"
    post stop2 /v1/completions "{\"prompt\":\"$P\",\"max_tokens\":24,\"temperature\":0,\"stop\":[\"zzzzqq\",\"$stop\"],\"stream\":true}" -N
    check "stop strings (array, streamed): the same" py "$WORK/stop2.json" \
        "content(sse(raw), False) == $exp and sse(raw)[-1]['choices'][0]['finish_reason'] == 'stop'"
else
    check "greedy text has a word to stop at" false
fi
post stop3 /v1/completions "{\"prompt\":\"$P\",\"max_tokens\":24,\"temperature\":0,\"ignore_eos\":true,\"stop\":[\"never in this text\"]}"
check "stop string that never occurs: full text" py "$WORK/stop3.json" "d['choices'][0]['text'] == $want"

# ---- continuous batching: 4 concurrent streams each equal their sequential result -------------------------
prompts=("The quick brown fox" "Once upon a time" "In the beginning" "Hello world, this is a longer prompt for the test")
for i in 0 1 2 3; do
    post "seq$i" /v1/completions "{\"prompt\":\"${prompts[$i]}\",\"max_tokens\":32,\"temperature\":0,\"ignore_eos\":true}"
done
steps0=$(metric ringlm_steps_total); gen0=$(metric ringlm_generated_tokens_total)
pids=()
for i in 0 1 2 3; do
    post "par$i" /v1/completions "{\"prompt\":\"${prompts[$i]}\",\"max_tokens\":32,\"temperature\":0,\"ignore_eos\":true,\"stream\":true}" -N &
    pids+=($!)
done
wait "${pids[@]}"
for i in 0 1 2 3; do
    check "concurrent stream $i = its sequential result" py "$WORK/par$i.json" \
        "content(sse(raw), False) == load('seq$i.json')['choices'][0]['text']"
done
steps1=$(metric ringlm_steps_total); gen1=$(metric ringlm_generated_tokens_total)
check "the 4 streams shared steps ($((steps1 - steps0)) steps for $((gen1 - gen0)) tokens)" \
    test $((steps1 - steps0)) -lt $((gen1 - gen0))

# ---- the softmax path over an f32 cache (not the default): concurrent streams and n-gram drafts = ringlm run --
FA=(--flash-attn off --cache-type f32)
start fa "${FA[@]}" --parallel 4
U0=$URL; URL=${SRV_URL[fa]}
pids=()
for i in 0 1 2 3; do
    extra=""; [ $i = 0 ] || extra=',"draft":"ngram"'
    post "fa$i" /v1/completions "{\"prompt\":\"${prompts[$i]}\",\"max_tokens\":32,\"temperature\":0,\"ignore_eos\":true$extra}" &
    pids+=($!)
done
wait "${pids[@]}"
for i in 0 1 2 3; do
    run_text "fa_want$i" -p "${prompts[$i]}" -n 32 "${FA[@]}"
    check "--flash-attn off --cache-type f32: concurrent request $i$([ $i = 0 ] || echo ', n-gram drafts') = ringlm run's text" \
        py "$WORK/fa$i.json" "d['choices'][0]['text'] == load('fa_want$i.exp')"
done
URL=$U0

# ---- speculation (n-gram drafts, per request): the same text, in fewer steps when drafts are kept -----------
# tripled I EXTRA: greedy request body for prompt I said three times, 32 tokens, EXTRA fields appended.
tripled() { echo "{\"prompt\":\"${prompts[$1]} ${prompts[$1]} ${prompts[$1]}\",\"max_tokens\":32,\"temperature\":0,\"ignore_eos\":true${2:-}}"; }
# same_as_nospec NAME: how many of NAME0..NAME3 have the text of nospec0..3 and 32 completion tokens.
same_as_nospec() {
    local i n=0
    for i in 0 1 2 3; do
        py "$WORK/$1$i.json" "d['choices'][0]['text'] == load('nospec$i.json')['choices'][0]['text'] and d['usage']['completion_tokens'] == 32" &&
            n=$((n + 1))
    done
    echo $n
}
d0=$(metric ringlm_spec_drafted_tokens_total)
pids=()
for i in 0 1 2 3; do
    post "spec$i" /v1/completions "$(tripled $i ',"draft":"ngram"')" &
    pids+=($!)
    post "nospec$i" /v1/completions "$(tripled $i)"
done
wait "${pids[@]}"
same=$(same_as_nospec spec)
d1=$(metric ringlm_spec_drafted_tokens_total); a1=$(metric ringlm_spec_accepted_tokens_total)
check "4 concurrent requests with n-gram drafts = the same requests without ($same/4; $((d1 - d0)) drafts, $a1 kept in all)" \
    test $same = 4
check "... drafts were verified (ringlm_spec_drafted_tokens_total grew by $((d1 - d0)))" test "$((d1 - d0))" -gt 0
post specs /v1/completions "{\"prompt\":\"a b a b a b\",\"max_tokens\":16,\"temperature\":1,\"seed\":5,\"draft\":\"ngram\"}"
check "a sampled request with drafts: 200" code_is specs 200
post specbad /v1/completions '{"prompt":"hi","draft":"model.gguf"}'
check "draft other than ngram/model/none: 400 naming the field" py "$WORK/specbad.json" "d['error']['param'] == 'draft'"
post specnomodel /v1/completions '{"prompt":"hi","draft":"model"}'
check "\"draft\": \"model\" on a server without a draft model: 400 saying so" py "$WORK/specnomodel.json" \
    "d['error']['param'] == 'draft' and '--draft' in d['error']['message']"

# ---- a draft model (--draft FILE): one state per sequence, drafted for all requests in one batch per token ---
# The draft is the target itself: it proposes exactly what the target will choose, so every draft must be
# kept; a draft state that lost track of its sequence (catch-up, snapshot, slot reuse) would show at once.
start drafted --parallel 4 --draft "$f"
URL=${SRV_URL[drafted]}
pids=()
for i in 0 1 2 3; do # the server's default is its draft model; one request says so, one turns it off
    case $i in 0) extra=',"draft":"model"' ;; 3) extra=',"draft":"none"' ;; *) extra= ;; esac
    post "dm$i" /v1/completions "$(tripled $i "$extra")" &
    pids+=($!)
done
wait "${pids[@]}"
same=$(same_as_nospec dm)
dd=$(metric ringlm_spec_drafted_tokens_total); da=$(metric ringlm_spec_accepted_tokens_total)
ds=$(metric ringlm_spec_draft_seconds_total)
check "4 concurrent requests, 3 drafted by a draft model = the same requests without ($same/4; $dd drafts, $da kept, ${ds}s drafting)" \
    test $same = 4
check "... the target drafting for itself: (nearly) every draft kept" awk -v d="$dd" -v a="$da" -v s="$ds" \
    'BEGIN { exit !(d > 20 && a * 10 >= d * 9 && s > 0) }'
post dms /v1/chat/completions '{"messages":[{"role":"user","content":"hello"}],"max_tokens":12,"temperature":0.9,"seed":3,"stream":true}'
check "a sampled, streamed chat request with the draft model: 200, ends with [DONE]" \
    bash -c "test \"\$(cat '$WORK/dms.code')\" = 200 && grep -q 'data: \[DONE\]' '$WORK/dms.json'"
post lp_dm /v1/completions "{\"prompt\":\"$P\",\"max_tokens\":8,\"temperature\":0,\"ignore_eos\":true,\"logprobs\":3,\"draft\":\"model\"}"
check "logprobs of the tokens the draft model's VERIFY blocks commit = the logits' log-softmax, drafts kept" \
    py "$WORK/lp_dm.json" "lp_match(d['choices'][0]['logprobs'], ref_logprobs('lp_ref.bin', $n_prompt), 3) and d['usage']['completion_tokens_details']['accepted_prediction_tokens'] >= 4"
# Constrained output with the draft model: it drafts what the free model would write, which the grammar
# often refuses; those drafts are cut, and greedy output is the undrafted text.
for i in 5 15; do
    k=$((i % 4)); mt=$((40 + i % 21))
    sch=$(python3 -c "import json; print(json.dumps(json.load(open('$WORK/schemas.json'))[$k]))")
    post "jsm$i" /v1/completions "{\"prompt\":\"Schema $i:\",\"max_tokens\":$mt,\"temperature\":0,\"seed\":$i,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"s$k\",\"strict\":true,\"schema\":$sch}},\"draft\":\"model\"}"
done
dr=$(metric ringlm_spec_grammar_refused_tokens_total); da2=$(metric ringlm_spec_accepted_tokens_total)
jsm_same() {
    py "$WORK/jsm5.json" "d['choices'][0]['text'] == load('jss5.json')['choices'][0]['text']" &&
        py "$WORK/jsm15.json" "d['choices'][0]['text'] == load('jss15.json')['choices'][0]['text']" && test "$dr" -gt 0
}
check "json_schema with the draft model: greedy text = undrafted ($((da2 - da)) drafts kept, $dr cut by the grammar)" jsm_same
kill "${SRV_PID[drafted]}" 2>/dev/null; wait "${SRV_PID[drafted]}" 2>/dev/null || true; unset "SRV_PID[drafted]"
URL=${SRV_URL[main]}
"$RINGLM" synth --no-progress --config '{"base":"tiny","n_vocab":2048}' -o "$WORK/other.gguf" 2>/dev/null ||
    "$RINGLM" synth --no-progress --config small -o "$WORK/other.gguf"
rc=0; "$RINGLM" serve -m "$f" --port 0 --draft "$WORK/other.gguf" 2>"$WORK/draft.err" || rc=$?
check "a draft model with another vocabulary is refused at start ($(tail -1 "$WORK/draft.err"))" \
    bash -c "test $rc != 0 && grep -q vocabulary '$WORK/draft.err'"
rc=0; "$RINGLM" serve -m "$f" --port 0 --draft "$WORK/none.gguf" 2>"$WORK/draft.err" || rc=$?
check "a missing draft model is refused at start, naming it" bash -c "test $rc != 0 && grep -q 'draft model' '$WORK/draft.err'"

# ---- a client that hangs up frees its slot ---------------------------------------------------------------
start small --parallel 2 --queue 0
URL=${SRV_URL[small]}
long='{"prompt":"x","max_tokens":100000,"temperature":0,"ignore_eos":true,"stream":true}'
# until_metric NAME VALUE: waits (10 s at most) for a gauge to read VALUE.
until_metric() { for _ in $(seq 200); do [ "$(metric "$1")" = "$2" ] && return 0; sleep 0.05; done; return 1; }
pids=()
for i in 1 2; do
    curl -s -N --max-time 60 -o /dev/null -H 'Content-Type: application/json' --data-binary "$long" "$URL/v1/completions" &
    pids+=($!)
    if [ $i = 1 ]; then # one slot free: the 2 choices of one request get both slots or none (sch_submit_all)
        until_metric ringlm_sequences_active 1 || true
        post n2busy /v1/completions '{"prompt":"x","max_tokens":4,"n":2}'
        check "n = 2 with one slot free: 429 for the whole request, no choice started" bash -c \
            "grep -qx 429 '$WORK/n2busy.code' && test \"\$(curl -s --max-time 10 '$URL/metrics' | awk '/^ringlm_requests_finished_total/ { s += \$2 } END { print s + 0 }')\" = 0"
    fi
done
check "two long streams hold both slots" until_metric ringlm_sequences_active 2
post busy /v1/completions '{"prompt":"x","max_tokens":4}'
check "a third request meanwhile: 429 (no queue)" code_is busy 429
kill "${pids[@]}"   # the clients hang up mid-stream
wait "${pids[@]}" || true
freed=0
for _ in $(seq 100); do [ "$(metric ringlm_sequences_active)" = 0 ] && { freed=1; break; }; sleep 0.1; done
check "clients hung up: slots freed" test $freed = 1
check "hung-up requests counted as cancelled" test "$(curl "${CT[@]}" "$URL/metrics" | awk '/^ringlm_requests_finished_total\{reason="cancelled"\}/ { print $2 }')" = 2
pids=()
for i in 1 2; do post "after$i" /v1/completions '{"prompt":"x","max_tokens":8,"ignore_eos":true}' & pids+=($!); done
wait "${pids[@]}"
check "then 2 (--parallel) requests run" bash -c "grep -qx 200 '$WORK/after1.code' && grep -qx 200 '$WORK/after2.code'"
check "... and complete" py "$WORK/after2.json" "d['usage']['completion_tokens'] == 8"

# ---- queue full: --parallel 1 --queue 1 ------------------------------------------------------------------
start q1 --parallel 1 --queue 1
URL=${SRV_URL[q1]}
pids=()
for i in 1 2; do
    curl -s -N --max-time 60 -o /dev/null -H 'Content-Type: application/json' --data-binary "$long" "$URL/v1/completions" &
    pids+=($!)
    until_metric ringlm_sequences_queued $((i - 1)) && until_metric ringlm_sequences_active 1 || true
done
check "queue: 1 running, 1 waiting" test "$(metric ringlm_sequences_active) $(metric ringlm_sequences_queued)" = "1 1"
post full /v1/completions '{"prompt":"x","max_tokens":4}'
check "queue full: 429" code_is full 429
check "queue full: OpenAI error body" py "$WORK/full.json" "is_error(d) and d['error']['code'] == 'queue_full'"
kill "${pids[@]}"
wait "${pids[@]}" || true
check "queue: the waiting request was dropped when its client left" until_metric ringlm_sequences_queued 0

# ---- errors: status and OpenAI's error shape --------------------------------------------------------------
start auth --api-key sekrit --ctx 64 --max-body 65536
URL=${SRV_URL[auth]}
K=(-H 'Authorization: Bearer sekrit')
err_case() { # DESC STATUS PARAM-or-"" NAME PATH BODY [curl args]
    local desc=$1 status=$2 param=$3 name=$4 path=$5 body=$6; shift 6
    post "$name" "$path" "$body" "$@"
    local pexpr="True"; [ -n "$param" ] && pexpr="d['error']['param'] == '$param'"
    check "$desc -> $status" bash -c "test \"\$(cat '$WORK/$name.code')\" = $status && python3 '$WORK/check.py' '$WORK/$name.json' \"is_error(d) and $pexpr\""
}
err_case "no API key" 401 "" e_nokey /v1/completions '{"prompt":"hi"}'
err_case "wrong API key" 401 "" e_badkey /v1/completions '{"prompt":"hi"}' -H 'Authorization: Bearer nope'
post e_goodkey /v1/completions '{"prompt":"hi","max_tokens":2}' "${K[@]}"
check "right API key -> 200" code_is e_goodkey 200
err_case "malformed JSON" 400 "" e_json /v1/completions '{"prompt": "hi",' "${K[@]}"
err_case "body not an object" 400 "" e_arr /v1/completions '[1,2]' "${K[@]}"
err_case "missing prompt" 400 prompt e_noprompt /v1/completions '{"max_tokens":2}' "${K[@]}"
err_case "missing messages" 400 messages e_nomsgs /v1/chat/completions '{"max_tokens":2}' "${K[@]}"
err_case "messages not an array" 400 messages e_msgtype /v1/chat/completions '{"messages":"hi"}' "${K[@]}"
err_case "message without role" 400 "messages[0].role" e_role /v1/chat/completions '{"messages":[{"content":"hi"}]}' "${K[@]}"
err_case "temperature mistyped" 400 temperature e_temp /v1/completions '{"prompt":"hi","temperature":"hot"}' "${K[@]}"
err_case "max_tokens mistyped" 400 max_tokens e_max /v1/completions '{"prompt":"hi","max_tokens":1.5}' "${K[@]}"
err_case "stream mistyped" 400 stream e_stream /v1/completions '{"prompt":"hi","stream":"yes"}' "${K[@]}"
err_case "stop mistyped" 400 stop e_stop /v1/completions '{"prompt":"hi","stop":[1]}' "${K[@]}"
err_case "top_p out of range" 400 top_p e_topp /v1/completions '{"prompt":"hi","top_p":3}' "${K[@]}"
err_case "logit_bias with a key that is no token id" 400 logit_bias e_lb1 /v1/completions '{"prompt":"hi","logit_bias":{"abc":5}}' "${K[@]}"
err_case "logit_bias with a token id outside the vocabulary" 400 logit_bias e_lb2 /v1/completions '{"prompt":"hi","logit_bias":{"99999999":1}}' "${K[@]}"
err_case "logit_bias with a bias that is no number" 400 logit_bias e_lb3 /v1/completions '{"prompt":"hi","logit_bias":{"5":"x"}}' "${K[@]}"
err_case "logit_bias neither object nor array" 400 logit_bias e_lb4 /v1/completions '{"prompt":"hi","logit_bias":7}' "${K[@]}"
err_case "logit_bias array entry not a pair" 400 logit_bias e_lb5 /v1/completions '{"prompt":"hi","logit_bias":[[5]]}' "${K[@]}"
check "logit_bias refusal names the bad key" py "$WORK/e_lb1.json" "'abc' in d['error']['message']"
err_case "top_logprobs without logprobs" 400 top_logprobs e_lp1 /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}],"top_logprobs":2}' "${K[@]}"
err_case "top_logprobs over 20" 400 top_logprobs e_lp2 /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}],"logprobs":true,"top_logprobs":21}' "${K[@]}"
err_case "chat logprobs not a bool" 400 logprobs e_lp3 /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}],"logprobs":3}' "${K[@]}"
err_case "completions logprobs not a count" 400 logprobs e_lp4 /v1/completions '{"prompt":"hi","logprobs":"x"}' "${K[@]}"
err_case "completions logprobs over 20" 400 logprobs e_lp5 /v1/completions '{"prompt":"hi","logprobs":21}' "${K[@]}"
err_case "n over 16" 400 n e_n1 /v1/completions '{"prompt":"hi","n":17}' "${K[@]}"
err_case "n of 0" 400 n e_n2 /v1/completions '{"prompt":"hi","n":0}' "${K[@]}"
err_case "3 prompts x n 6: over 16 choices" 400 prompt e_n3 /v1/completions '{"prompt":["a","b","c"],"n":6}' "${K[@]}"
err_case "a prompt array holding a number" 400 prompt e_n4 /v1/completions '{"prompt":["a",5]}' "${K[@]}"
err_case "response_format of an unknown type" 400 response_format e_rf1 /v1/completions '{"prompt":"hi","response_format":{"type":"bogus"}}' "${K[@]}"
err_case "response_format json_schema, strict, with a keyword it cannot enforce" 400 response_format e_rf2 /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_schema","json_schema":{"name":"x","strict":true,"schema":{"type":"string","pattern":"^a"}}}}' "${K[@]}"
check "... naming the keyword" py "$WORK/e_rf2.json" "'pattern' in d['error']['message']"
err_case "response_format json_schema without its json_schema object" 400 response_format e_rf4 /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_schema"}}' "${K[@]}"
err_case "response_format json_schema with a \$ref that does not resolve" 400 response_format e_rf5 /v1/completions '{"prompt":"hi","response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"$ref":"#/$defs/nope"}}}}' "${K[@]}"
err_case "tools not an array" 400 tools e_t1 /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}],"tools":{"type":"function"}}' "${K[@]}"
err_case "a tool without a name" 400 "tools[0]" e_t2 /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"parameters":{}}}]}' "${K[@]}"
err_case "a tool's parameters not a schema" 400 "tools[0]" e_t3 /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","parameters":7}}]}' "${K[@]}"
err_case "tool_choice required without tools" 400 tool_choice e_t4 /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}],"tool_choice":"required"}' "${K[@]}"
err_case "tool_choice of an unknown kind" 400 tool_choice e_t5 /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"always"}' "${K[@]}"
err_case "tool_choice naming an undeclared tool" 400 tool_choice e_t6 /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"g"}}}' "${K[@]}"
check "... naming it" py "$WORK/e_t6.json" "\"'g'\" in d['error']['message']"
err_case "a required call of a strict tool whose parameters use a keyword the grammar cannot enforce" 400 tool_choice e_t7 /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","strict":true,"parameters":{"type":"object","properties":{"n":{"type":"integer","minimum":0}}}}}],"tool_choice":"required"}' "${K[@]}"
err_case "tool_choice auto with such a strict tool" 400 tools e_t8 /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","strict":true,"parameters":{"type":"object","properties":{"n":{"type":"integer","minimum":0}}}}}]}' "${K[@]}"
err_case "tool_choice required with response_format json_object" 400 tool_choice e_t8 /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"required","response_format":{"type":"json_object"}}' "${K[@]}"
err_case "tools on /v1/completions" 400 tools e_t9 /v1/completions '{"prompt":"hi","tools":[{"type":"function","function":{"name":"f"}}]}' "${K[@]}"
err_case "response_format not an object" 400 response_format e_rf3 /v1/completions '{"prompt":"hi","response_format":"json"}' "${K[@]}"
post frame_text /v1/completions '{"prompt":"hi","max_tokens":2,"response_format":{"type":"text"}}' "${K[@]}"
check "response_format text -> 200" code_is frame_text 200
err_case "reasoning_effort unknown" 400 reasoning_effort e_re1 /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}],"reasoning_effort":"extreme"}' "${K[@]}"
err_case "chat_template_kwargs not an object" 400 chat_template_kwargs e_re2 /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":5}' "${K[@]}"
err_case "chat_template_kwargs thinking mistyped" 400 chat_template_kwargs.thinking e_re3 /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":{"thinking":"no"}}' "${K[@]}"
err_case "echo on chat" 400 echo e_echo1 /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}],"echo":true}' "${K[@]}"
err_case "max_tokens 0 without echo" 400 max_tokens e_echo2 /v1/completions '{"prompt":"hi","max_tokens":0}' "${K[@]}"
err_case "unknown model" 404 model e_model /v1/completions '{"prompt":"hi","model":"gpt-4"}' "${K[@]}"
check "unknown model: code model_not_found" py "$WORK/e_model.json" "d['error']['code'] == 'model_not_found'"
err_case "prompt longer than the context" 400 prompt e_ctx /v1/completions \
    "{\"prompt\":\"$(printf 'word %.0s' $(seq 100))\"}" "${K[@]}"
check "prompt too long: code context_length_exceeded" py "$WORK/e_ctx.json" "d['error']['code'] == 'context_length_exceeded'"
err_case "chat prompt longer than the context" 400 messages e_ctx2 /v1/chat/completions \
    "{\"messages\":[{\"role\":\"user\",\"content\":\"$(printf 'word %.0s' $(seq 100))\"}]}" "${K[@]}"
python3 -c "import json; print(json.dumps({'prompt': 'a' * 70000}))" >"$WORK/big.json"
err_case "body over the limit" 413 "" e_big /v1/completions "@$WORK/big.json" "${K[@]}"
err_case "unknown path" 404 "" e_404 /v1/nothing '{}' "${K[@]}"
curl "${CT[@]}" -o "$WORK/e_405.json" -w '%{http_code}' "${K[@]}" "$URL/v1/completions" >"$WORK/e_405.code" || true
check "GET on a POST endpoint -> 405" bash -c "test \"\$(cat '$WORK/e_405.code')\" = 405 && python3 '$WORK/check.py' '$WORK/e_405.json' 'is_error(d)'"
err_case "POST on /health" 405 "" e_405b /health '{}'
check "/health needs no key" curl "${CT[@]}" -f "$URL/health"
check "the completion length is bounded by the context" bash -c "
    curl -s --max-time 60 -H 'Authorization: Bearer sekrit' --data-binary '{\"prompt\":\"hi\",\"max_tokens\":1000,\"ignore_eos\":true}' '$URL/v1/completions' >'$WORK/ctxfull.json' &&
    python3 '$WORK/check.py' '$WORK/ctxfull.json' \"d['choices'][0]['finish_reason'] == 'length' and d['usage']['total_tokens'] == 64\""

# ---- health, models, metrics, page -----------------------------------------------------------------------
URL=${SRV_URL[main]}
curl "${CT[@]}" "$URL/health" >"$WORK/health.json"
check "/health: ok with one local node" py "$WORK/health.json" \
    "d['status'] == 'ok' and len(d['nodes']) == 1 and d['nodes'][0]['status'] == 'up'"
curl "${CT[@]}" "$URL/v1/models" >"$WORK/models.json"
check "/v1/models lists the model" py "$WORK/models.json" "d['object'] == 'list' and [m['id'] for m in d['data']] == ['$MODEL_ID']"
curl "${CT[@]}" "$URL/metrics" >"$WORK/metrics.txt"
for fam in ringlm_http_requests_total ringlm_prompt_tokens_total ringlm_generated_tokens_total \
           ringlm_time_to_first_token_seconds ringlm_inter_token_latency_seconds ringlm_sequences_active \
           ringlm_sequences_queued ringlm_stage_compute_seconds_total ringlm_nodes_up ringlm_nodes_down; do
    check "/metrics has $fam" grep -q "^# TYPE $fam " "$WORK/metrics.txt"
done
check "/metrics: completions counted by status" grep -q '^ringlm_http_requests_total{endpoint="/v1/completions",status="200"} [1-9]' "$WORK/metrics.txt"
check "/metrics: histogram buckets end with +Inf" grep -q '^ringlm_time_to_first_token_seconds_bucket{le="+Inf"} [1-9]' "$WORK/metrics.txt"
check "/metrics: 1 node up" grep -qx 'ringlm_nodes_up 1' "$WORK/metrics.txt"
curl "${CT[@]}" "$URL/" >"$WORK/page.html"
check "GET / is the chat page" grep -q "/v1/chat/completions" "$WORK/page.html"

# ---- what agent clients send (issue #18): paths without /v1, aliases, CORS preflights, option values -----
post nov1 /chat/completions '{"messages":[{"role":"user","content":"hi"}],"max_tokens":3}'
check "POST /chat/completions (no /v1) -> 200, a chat completion" py "$WORK/nov1.json" \
    "d['object'] == 'chat.completion' and d['model'] == '$MODEL_ID'"
post nov1c /completions '{"prompt":"hi","max_tokens":3}'
check "POST /completions (no /v1) -> 200" code_is nov1c 200
curl "${CT[@]}" "$URL/models" >"$WORK/models2.json"
check "GET /models (no /v1) lists the model" py "$WORK/models2.json" "[m['id'] for m in d['data']] == ['$MODEL_ID']"
curl "${CT[@]}" -o /dev/null -w '%{http_code}' "$URL/models/$MODEL_ID" >"$WORK/m1.code"
check "GET /models/ID (no /v1) -> 200" code_is m1 200
curl "${CT[@]}" -o "$WORK/m404.json" -w '%{http_code}' "$URL/v1/models/gpt-4" >"$WORK/m404.code"
check "GET /v1/models/gpt-4 -> 404 model_not_found" bash -c "test \"\$(cat '$WORK/m404.code')\" = 404 &&
    python3 '$WORK/check.py' '$WORK/m404.json' \"d['error']['code'] == 'model_not_found'\""
curl "${CT[@]}" -X OPTIONS -D "$WORK/cors.h" -o /dev/null -H 'Origin: http://other.example' \
    -H 'Access-Control-Request-Method: POST' \
    -H 'Access-Control-Request-Headers: authorization, content-type, x-stainless-os, x-stainless-retry-count' \
    "$URL/v1/chat/completions"
check "CORS preflight: the requested headers are allowed (the openai SDK's x-stainless-* too)" \
    grep -qi '^access-control-allow-headers: authorization, content-type, x-stainless-os, x-stainless-retry-count' "$WORK/cors.h"
curl "${CT[@]}" -X OPTIONS -D "$WORK/cors2.h" -o /dev/null -H 'Access-Control-Request-Headers: x-a;x-b="c"' "$URL/v1/chat/completions" || true
check "CORS preflight: a header list with odd characters is not echoed" \
    grep -qi '^access-control-allow-headers: Authorization, Content-Type' "$WORK/cors2.h"
start alias --alias k3 --alias kimi-k3
U0=$URL; URL=${SRV_URL[alias]}
post al1 /v1/chat/completions '{"model":"kimi-k3","messages":[{"role":"user","content":"hi"}],"max_tokens":3}'
check "--alias: a request naming an alias -> 200, answered under that name" py "$WORK/al1.json" "d['model'] == 'kimi-k3'"
post al2 /v1/completions "{\"model\":\"$MODEL_ID\",\"prompt\":\"hi\",\"max_tokens\":3}"
check "--alias: the file's name still works" py "$WORK/al2.json" "d['model'] == '$MODEL_ID'"
post al3 /v1/completions '{"prompt":"hi","max_tokens":3}'
check "--alias: a request naming no model is answered as the first alias" py "$WORK/al3.json" "d['model'] == 'k3'"
curl "${CT[@]}" "$URL/v1/models" >"$WORK/models3.json"
check "--alias: /v1/models lists the aliases, then the file's name" py "$WORK/models3.json" \
    "[m['id'] for m in d['data']] == ['k3', 'kimi-k3', '$MODEL_ID']"
post al4 /v1/completions '{"model":"gpt-4","prompt":"hi","max_tokens":3}'
check "--alias: an unknown model -> 404 naming what is served" bash -c "test \"\$(cat '$WORK/al4.code')\" = 404 &&
    python3 '$WORK/check.py' '$WORK/al4.json' \"d['error']['code'] == 'model_not_found' and \\\"'k3', 'kimi-k3' or '$MODEL_ID'\\\" in d['error']['message']\""
check "/v1/models says what requests may ask: chat, reasoning, forced tool calls, response_format" py "$WORK/models3.json" \
    "all(m['capabilities'] == {'chat': True, 'reasoning': True, 'tool_choice_required': True, 'response_format': True} for m in d['data'])"
# A kimi-k3 file with no chat template and a vocabulary without K3's markers (respelled): it gets the K3
# format, but its replies have no sections, so a forced tool call could never be met. Refused by name at
# start (a warning line) and per request (a 400 naming the missing tokens), not answered with free text.
"$ROOT/$RINGLM_BUILD/tools/gguf_edit" "$f" "$WORK/plain.gguf" --del-key tokenizer.chat_template --rename-token '<|open|>' '<|reserved_open|>' \
    --rename-token '<|sep|>' '<|reserved_sep|>' --rename-token '<|close|>' '<|reserved_close|>'
serve_start plain -m "$WORK/plain.gguf" --threads 1
URL=${SRV_URL[plain]}
check "a vocabulary without K3's markers: the start-up line says forced tool calls are refused, naming the tokens" \
    grep -q 'warning: tool_choice required or named is refused (400): the vocabulary lacks the tokens <|open|> <|sep|> <|close|>' "$WORK/plain.log"
TL='"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"n":{"type":"integer"}}}}}]'
err_case "... tool_choice required" 400 tool_choice pl1 /v1/chat/completions "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],$TL,\"tool_choice\":\"required\",\"max_tokens\":20}"
check "... its code and message name what the vocabulary lacks" py "$WORK/pl1.json" \
    "d['error']['code'] == 'tool_calls_unsupported' and '<|open|> <|sep|> <|close|>' in d['error']['message']"
err_case "... tool_choice naming a function" 400 tool_choice pl2 /v1/chat/completions "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],$TL,\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}},\"max_tokens\":20}"
post pl3 /v1/chat/completions "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],$TL,\"max_tokens\":6,\"temperature\":0,\"ignore_eos\":true}"
check "... tool_choice auto: 200, free text, no calls" py "$WORK/pl3.json" \
    "d['choices'][0]['message']['content'] and 'tool_calls' not in d['choices'][0]['message']"
post pl4 /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}],"max_tokens":30,"temperature":1,"seed":2,"response_format":{"type":"json_object"}}'
check "... response_format json_object still holds: the content is an object" py "$WORK/pl4.json" \
    "isinstance(json.loads(d['choices'][0]['message']['content']), dict)"
curl "${CT[@]}" "$URL/v1/models" >"$WORK/models_plain.json"
check "... and /v1/models says so" py "$WORK/models_plain.json" \
    "d['data'][0]['capabilities'] == {'chat': True, 'reasoning': False, 'tool_choice_required': False, 'response_format': True}"
kill -INT "${SRV_PID[plain]}"; wait "${SRV_PID[plain]}" || true; unset 'SRV_PID[plain]'
URL=$U0
bad_opt() { # DESC WANT-REGEX ARGS...: exit 2 and one line saying what is wrong, without the usage text
    local desc=$1 want=$2; shift 2
    local rc=0
    "$RINGLM" serve -m "$f" "$@" >/dev/null 2>"$WORK/opt.err" || rc=$?
    check "$desc" bash -c "test $rc = 2 && test \$(wc -l <'$WORK/opt.err') = 1 && grep -Eq -- \"$want\" '$WORK/opt.err'"
}
bad_opt "--port abc: says the value is not a port" "bad value 'abc' for --port: want a port number" --port abc
bad_opt "--ctx 0: says the value is too small" "bad value '0' for --ctx: want .* at least 8" --ctx 0
bad_opt "an unknown option is named as one" "unknown option '--frobnicate'" --frobnicate 3
bad_opt "an option missing its value says so" "option --parallel needs a value" --parallel
bad_opt "--flash-attn maybe: says it wants on, off or auto" "bad value 'maybe' for --flash-attn: want on, off or auto" --flash-attn maybe
bad_opt "--cache-type q8: says it wants f32 or f16" "bad value 'q8' for --cache-type: want f32 or f16" --cache-type q8

# ---- SIGTERM: running requests finish, then exit 0 ---------------------------------------------------------
post drain /v1/completions '{"prompt":"x","max_tokens":200,"temperature":0,"ignore_eos":true,"stream":true}' -N &
cpid=$!
for _ in $(seq 100); do [ -s "$WORK/drain.json" ] && break; sleep 0.05; done   # in flight: its first chunk is here
kill -TERM "${SRV_PID[main]}"
rc=0; wait "${SRV_PID[main]}" || rc=$?
unset 'SRV_PID[main]'
wait $cpid || true
check "SIGTERM: exit 0" test $rc = 0
check "SIGTERM: the running stream finished first" py "$WORK/drain.json" \
    "sse(raw)[-1]['choices'][0]['finish_reason'] == 'length' and len(content(sse(raw), False)) > 0"
for k in small q1 auth; do
    kill -INT "${SRV_PID[$k]}"; rc=0; wait "${SRV_PID[$k]}" || rc=$?; unset "SRV_PID[$k]"
    check "SIGINT ($k): exit 0" test $rc = 0
done
finish
