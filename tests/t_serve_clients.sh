#!/usr/bin/env bash
# ringlm serve with real clients, over 127.0.0.1:
#   - the official `openai` npm package (v4) on Node: models, chat and completions, streamed and not, an
#     error mapped to its exception type; results equal what curl gets;
#   - the chat page in headless chromium, driven over the DevTools protocol (--remote-debugging-pipe, no
#     extra packages): /?prompt=...&autosend=1 sends a message, the streamed reply must appear in the page
#     chunk by chunk and equal the API's answer to the same request; a screenshot is taken.
# The openai package is installed into build/npm-openai once (npm registry); chromium comes from
# scripts/install-deps.sh. Either missing and not installable: the part is reported as skipped.
. "$(dirname "$0")/lib.sh"
f=$(model full-f32 k3-full f32)
MODEL_ID=$(basename "$f")
. "$(dirname "$0")/serve_lib.sh"
trap 'serve_stop_all; rm -rf "$WORK"' EXIT
start() { local name=$1; shift; serve_start "$name" -m "$f" --threads 1 "$@"; } # start NAME [serve options]
# api NAME URL JSON [curl args]: the response body's JSON
api() { curl -s --max-time 60 -H 'Content-Type: application/json' --data-binary "$3" "${@:4}" "$2" >"$WORK/$1.json"; }
py_file() { python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); sys.exit(0 if eval(sys.argv[2]) else 1)' "$WORK/$1.json" "$2"; }
jget() { python3 -c "import json, sys; d = json.load(open(sys.argv[1])); print(json.dumps(eval(sys.argv[2])))" "$WORK/$1.json" "$2"; }

# ---- the openai npm package ---------------------------------------------------------------------------
NPM_DIR=$ROOT/build/npm-openai
have_openai=1
if [ ! -f "$NPM_DIR/node_modules/openai/package.json" ]; then
    mkdir -p "$NPM_DIR"
    ( flock 9; cd "$NPM_DIR" && [ -f node_modules/openai/package.json ] ||
        timeout 300 npm install --no-audit --no-fund --no-save --loglevel=error openai@4 >"$WORK/npm.log" 2>&1 ) 9>"$NPM_DIR/.lock" ||
        have_openai=0
fi
if [ $have_openai = 0 ]; then
    skip "the openai SDK checks: the openai npm package cannot be installed here"; sed 's/^/    /' "$WORK/npm.log" | tail -5
else
    start key --api-key sekrit
    URL=${SRV_URL[key]}
    cat >"$WORK/sdk.js" <<'EOF'
// Uses the official client the way an application would; prints what it got as JSON.
const OpenAI = require('openai');
const [url, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL: url + '/v1', apiKey: 'sekrit', maxRetries: 0, timeout: 60000 });
// thinking off: the reply is content, not reasoning_content (the SDK's chat types know only content)
const chatReq = { model, messages: [{ role: 'user', content: 'What is two plus two?' }], max_tokens: 16,
                  temperature: 0, ignore_eos: true, chat_template_kwargs: { thinking: false } };
const cmplReq = { model, prompt: 'The quick brown fox', max_tokens: 16, temperature: 0, ignore_eos: true };
(async () => {
  const pkg = require('path').join(require('path').dirname(require.resolve('openai')), 'package.json');
  const out = { version: JSON.parse(require('fs').readFileSync(pkg, 'utf8')).version };
  out.models = (await client.models.list()).data.map((m) => m.id);
  const chat = await client.chat.completions.create(chatReq);
  out.chat = chat.choices[0].message.content;
  out.chat_finish = chat.choices[0].finish_reason;
  out.chat_usage = chat.usage;
  const stream = await client.chat.completions.create({ ...chatReq, stream: true, stream_options: { include_usage: true } });
  out.chat_stream = '';
  out.chat_stream_chunks = 0;
  for await (const chunk of stream) {
    if (chunk.usage) out.chat_stream_usage = chunk.usage;
    const c = chunk.choices[0];
    if (c && c.delta.content) { out.chat_stream += c.delta.content; out.chat_stream_chunks++; }
    if (c && c.finish_reason) out.chat_stream_finish = c.finish_reason;
  }
  // logprobs, n = 2, logit_bias and thinking, as the SDK sends them
  const lp = await client.chat.completions.create({ ...chatReq, logprobs: true, top_logprobs: 3 });
  out.lp = lp.choices[0].logprobs.content.map((e) => [e.logprob, e.top_logprobs.length]);
  out.lp_text = lp.choices[0].logprobs.content.map((e) => Buffer.from(e.bytes).toString('utf8')).join('');
  out.lp_content = lp.choices[0].message.content;
  const n2 = await client.chat.completions.create({ ...chatReq, n: 2, temperature: 1, seed: 9 });
  out.n2 = n2.choices.map((c) => [c.index, c.message.content.length > 0]);
  const lb = await client.chat.completions.create({ ...chatReq, max_tokens: 4,
                                                    logit_bias: { 7: 100 } });
  out.lb = lb.choices[0].message.content;
  const think = await client.chat.completions.create({ ...chatReq, chat_template_kwargs: undefined, max_tokens: 4 });
  out.think = [think.choices[0].message.content, think.choices[0].message.reasoning_content];
  // a tool round trip: a required call, the result sent back, the answer; streamed calls = not streamed
  const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather now',
                   parameters: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } },
                                 required: ['city'], additionalProperties: false } } }];
  const toolReq = { model, messages: [{ role: 'user', content: 'Weather in Paris?' }], tools, tool_choice: 'required',
                    max_tokens: 170, seed: 5 };
  const tc = await client.chat.completions.create(toolReq);
  const msg = tc.choices[0].message;
  out.tool = { finish: tc.choices[0].finish_reason, calls: msg.tool_calls.map((t) => [t.type, t.function.name, JSON.parse(t.function.arguments)]) };
  const back = await client.chat.completions.create({ ...toolReq, tool_choice: 'none', max_tokens: 6, ignore_eos: true,
    messages: [...toolReq.messages, msg, ...msg.tool_calls.map((t) => ({ role: 'tool', tool_call_id: t.id, content: '{"temp": 21}' }))] });
  out.tool_answer = [back.choices[0].finish_reason, typeof back.choices[0].message.content, back.usage.prompt_tokens > tc.usage.prompt_tokens];
  const ts = await client.chat.completions.create({ ...toolReq, stream: true });
  const acc = [];
  let tsFinish = null;
  for await (const chunk of ts) {
    const c = chunk.choices[0];
    if (!c) continue;
    for (const d of c.delta.tool_calls || []) {
      acc[d.index] = acc[d.index] || { name: '', args: '' };
      if (d.function && d.function.name) acc[d.index].name += d.function.name;
      if (d.function && d.function.arguments) acc[d.index].args += d.function.arguments;
    }
    if (c.finish_reason) tsFinish = c.finish_reason;
  }
  out.tool_stream = { finish: tsFinish, calls: acc.map((t) => ['function', t.name, JSON.parse(t.args)]) };
  // structured output through the SDK's parse helper: message.parsed
  const schema = { type: 'object', properties: { answer: { type: 'integer' }, why: { type: 'string', maxLength: 20 } },
                   required: ['answer', 'why'], additionalProperties: false };
  const parsed = await client.beta.chat.completions.parse({ ...chatReq, ignore_eos: false, max_tokens: 60, temperature: 1, seed: 3,
    response_format: { type: 'json_schema', json_schema: { name: 'answer', strict: true, schema } } });
  out.parsed = parsed.choices[0].message.parsed;
  const cmpl = await client.completions.create(cmplReq);
  out.cmpl = cmpl.choices[0].text;
  out.cmpl_usage = cmpl.usage;
  const cstream = await client.completions.create({ ...cmplReq, stream: true });
  out.cmpl_stream = '';
  for await (const chunk of cstream) out.cmpl_stream += chunk.choices[0].text;
  try {
    await client.completions.create({ ...cmplReq, model: 'no-such-model' });
  } catch (e) {
    out.bad_model = { cls: e.constructor.name, status: e.status, code: e.code, param: e.param };
  }
  try {
    await new OpenAI({ baseURL: url + '/v1', apiKey: 'wrong', maxRetries: 0 }).models.list();
  } catch (e) {
    out.bad_key = { cls: e.constructor.name, status: e.status };
  }
  console.log(JSON.stringify(out));
})().catch((e) => { console.error(e); process.exit(1); });
EOF
    check "openai SDK: runs against the server" env NODE_PATH="$NPM_DIR/node_modules" timeout 120 node "$WORK/sdk.js" "$URL" "$MODEL_ID"
    cp "$WORK/out" "$WORK/sdk.json"
    api chat "$URL/v1/chat/completions" '{"messages":[{"role":"user","content":"What is two plus two?"}],"max_tokens":16,"temperature":0,"ignore_eos":true,"chat_template_kwargs":{"thinking":false}}' -H 'Authorization: Bearer sekrit'
    api cmpl "$URL/v1/completions" '{"prompt":"The quick brown fox","max_tokens":16,"temperature":0,"ignore_eos":true}' -H 'Authorization: Bearer sekrit'
    sdk() { jget sdk "$1"; }
    py_sdk() { python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); sys.exit(0 if eval(sys.argv[2]) else 1)' "$WORK/sdk.json" "$1"; }
    # the logit_bias check's answer: the same request by curl
    api tok7p "$URL/v1/chat/completions" '{"messages":[{"role":"user","content":"What is two plus two?"}],"max_tokens":4,"temperature":0,"ignore_eos":true,"chat_template_kwargs":{"thinking":false},"logit_bias":{"7":100}}' -H 'Authorization: Bearer sekrit'
    python3 -c 'import json, sys; json.dump(json.load(open(sys.argv[1]))["choices"][0]["message"]["content"], open(sys.argv[2], "w"))' "$WORK/tok7p.json" "$WORK/tok7.json"
    echo "    (openai $(sdk "d['version']"))"
    check "openai SDK: models.list" test "$(sdk "d['models']")" = "[\"$MODEL_ID\"]"
    check_eq "openai SDK: chat = curl's" "$(sdk "d['chat']")" "$(jget chat "d['choices'][0]['message']['content']")"
    check_eq "openai SDK: chat usage = curl's" "$(sdk "d['chat_usage']")" "$(jget chat "d['usage']")"
    check_eq "openai SDK: streamed chat = non-streamed" "$(sdk "d['chat_stream']")" "$(sdk "d['chat']")"
    check "openai SDK: streamed chat came in several chunks" test "$(sdk "d['chat_stream_chunks']")" -gt 1
    check_eq "openai SDK: streamed chat finish_reason and usage" \
        "$(sdk "[d['chat_stream_finish'], d['chat_stream_usage']]")" "$(sdk "['length', d['chat_usage']]")"
    check "openai SDK: chat logprobs, 3 alternatives per token, one per token (16), the tokens' bytes = the content" \
        py_sdk "len(d['lp']) == 16 and all(a <= 0 and n == 3 for a, n in d['lp']) and d['lp_text'] == d['lp_content']"
    check "openai SDK: n = 2 gives choices 0 and 1" py_sdk "d['n2'] == [[0, True], [1, True]]"
    check "openai SDK: logit_bias {7: 100} as the SDK sends it = curl's, and not the unbiased text" \
        py_sdk "d['lb'] == $(python3 -c 'import json, sys; print(repr(json.load(open(sys.argv[1]))))' "$WORK/tok7.json") and d['lb'] != d['chat'][:len(d['lb'])]"
    check "openai SDK: thinking on (the template's default): the reply comes as reasoning_content" \
        py_sdk "d['think'][0] == '' and d['think'][1]"
    check "openai SDK: a tool round trip - tool_choice required gives tool_calls to get_weather with a string city, the result goes back, the answer is text" \
        py_sdk "d['tool']['finish'] == 'tool_calls' and all(c[0] == 'function' and c[1] == 'get_weather' and isinstance(c[2]['city'], str) for c in d['tool']['calls']) and d['tool_answer'] == ['length', 'string', True]"
    check "openai SDK: the same calls streamed (delta.tool_calls accumulated), finish_reason tool_calls" \
        py_sdk "d['tool_stream'] == d['tool']"
    check "openai SDK: chat.completions.parse with a JSON schema gives message.parsed matching it" \
        py_sdk "isinstance(d['parsed'], dict) and set(d['parsed']) == {'answer', 'why'} and isinstance(d['parsed']['answer'], int) and isinstance(d['parsed']['why'], str) and len(d['parsed']['why']) <= 20"
    check_eq "openai SDK: completion = curl's" "$(sdk "d['cmpl']")" "$(jget cmpl "d['choices'][0]['text']")"
    check_eq "openai SDK: streamed completion = non-streamed" "$(sdk "d['cmpl_stream']")" "$(sdk "d['cmpl']")"
    check "openai SDK: unknown model -> NotFoundError 404 model_not_found" \
        test "$(sdk "d['bad_model']")" = '{"cls": "NotFoundError", "status": 404, "code": "model_not_found", "param": "model"}'
    check "openai SDK: wrong key -> AuthenticationError 401" \
        test "$(sdk "d['bad_key']")" = '{"cls": "AuthenticationError", "status": 401}'
fi

# ---- the chat page in headless chromium ------------------------------------------------------------------
if ! command -v chromium >/dev/null; then
    skip "the chat page checks: chromium is not installed (scripts/install-deps.sh installs it)"
else
    start page
    URL=${SRV_URL[page]}
    [ -n "${SRV_URL[key]:-}" ] || start key --api-key sekrit
    KEY_URL=${SRV_URL[key]}
    cat >"$WORK/page.js" <<'EOF'
// Drives headless chromium over the DevTools protocol on a pipe (fd 3 in, fd 4 out, NUL-separated JSON):
// opens the page, waits for <body data-state="done">, reads the reply, saves a screenshot.
const { spawn } = require('child_process');
const fs = require('fs');
const [url, shot, profile] = process.argv.slice(2);
const chrome = spawn('chromium', ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking',
  '--disable-component-update', '--disable-sync', '--no-first-run', '--user-data-dir=' + profile,
  '--remote-debugging-pipe', '--window-size=1000,700', 'about:blank'], { stdio: ['ignore', 'ignore', 'ignore', 'pipe', 'pipe'] });
const pending = new Map();
let nextId = 1, buf = '';
chrome.stdio[4].on('data', (d) => {
  buf += d.toString();
  let i;
  while ((i = buf.indexOf('\0')) >= 0) {
    const msg = JSON.parse(buf.slice(0, i));
    buf = buf.slice(i + 1);
    const p = pending.get(msg.id);
    if (p) { pending.delete(msg.id); msg.error ? p.reject(new Error(JSON.stringify(msg.error))) : p.resolve(msg.result); }
  }
});
function send(method, params = {}, sessionId) {
  const id = nextId++;
  chrome.stdio[3].write(JSON.stringify({ id, method, params, sessionId }) + '\0');
  return new Promise((resolve, reject) => pending.set(id, { resolve, reject }));
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const deadline = setTimeout(() => { console.error('timed out'); chrome.kill('SIGKILL'); process.exit(1); }, 60000);
(async () => {
  const { targetId } = await send('Target.createTarget', { url });
  const { sessionId } = await send('Target.attachToTarget', { targetId, flatten: true });
  const probe = `JSON.stringify({ state: document.body ? document.body.dataset.state : null,
      reply: document.getElementById('reply-1') ? document.getElementById('reply-1').dataset.raw : null,
      chunks: document.getElementById('reply-1') ? document.getElementById('reply-1').dataset.chunks : null,
      msgs: document.querySelectorAll('#log .msg').length,
      last: document.querySelector('#log .msg:last-child .text') ? document.querySelector('#log .msg:last-child .text').dataset.raw : null,
      settings: document.getElementById('settings') ? document.getElementById('settings').open : null,
      calls: document.querySelector('#log .msg:last-child .calls') ? document.querySelector('#log .msg:last-child .calls').dataset.calls : null,
      status: document.getElementById('status') ? document.getElementById('status').textContent : null })`;
  const settle = async () => {
    for (;;) {
      const r = await send('Runtime.evaluate', { expression: probe, returnByValue: true }, sessionId);
      const p = JSON.parse(r.result.value);
      if (p.state === 'done' || p.state === 'error' || (p.state === 'idle' && p.msgs > 0)) return p;
      await sleep(50);
    }
  };
  let page = await settle();
  if (process.argv[5] === 'reload') { /* the conversation must come back from localStorage */
    const url2 = url.replace(/[?].*$/, '');
    await send('Page.navigate', { url: url2 }, sessionId);
    await sleep(300);
    page = { first: page, again: await settle() };
  }
  const { data } = await send('Page.captureScreenshot', { format: 'png' }, sessionId);
  fs.writeFileSync(shot, Buffer.from(data, 'base64'));
  console.log(JSON.stringify(page));
  await send('Browser.close').catch(() => {});
  clearTimeout(deadline);
  process.exit(0);
})().catch((e) => { console.error(e); chrome.kill('SIGKILL'); process.exit(1); });
EOF
    q='Tell me a story about a fox'
    enc=$(python3 -c 'import sys, urllib.parse; print(urllib.parse.quote(sys.argv[1]))' "$q")
    check "chromium: the page loads, sends, and finishes" \
        timeout 90 node "$WORK/page.js" "$URL/?new=1&prompt=$enc&autosend=1&temperature=0&max_tokens=24&thinking=0" "$WORK/page.png" "$WORK/profile"
    cp "$WORK/out" "$WORK/page.json"
    # The request the page sends (stream: true) answered without streaming: the reply must be the same text.
    api want "$URL/v1/chat/completions" "{\"messages\":[{\"role\":\"user\",\"content\":\"$q\"}],\"temperature\":0,\"max_tokens\":24,\"chat_template_kwargs\":{\"thinking\":false}}"
    check "chromium: state done" test "$(jget page "d['state']")" = '"done"'
    check_eq "chromium: the streamed reply shows the API's answer" \
        "$(jget page "d['reply']")" "$(jget want "d['choices'][0]['message']['content']")"
    check "chromium: the reply grew chunk by chunk" test "$(jget page "int(d['chunks'] or 0)")" -gt 1
    check "chromium: usage shown" grep -q "prompt + .* generated tokens" "$WORK/page.json"
    check "chromium: the reply is not empty (thinking off: content)" test "$(jget page "len(d['reply'])")" -gt 0
    # A reload brings the conversation back (localStorage, same profile); thinking on, the reasoning is folded.
    check "chromium: a second page load (thinking on) finishes" \
        timeout 90 node "$WORK/page.js" "$URL/?prompt=$enc&autosend=1&temperature=0&max_tokens=8" "$WORK/page2.png" "$WORK/profile" reload
    cp "$WORK/out" "$WORK/page2.json"
    check "chromium: after a reload the 4 messages of both turns are back, the last reply's text with them" \
        py_file page2 "d['first']['state'] == 'done' and d['again']['msgs'] == 4 and d['again']['last'] == d['first']['last']"
    # Tools from the page: tool_choice required, the streamed calls shown below the reply.
    tenc=$(python3 -c 'import urllib.parse; print(urllib.parse.quote("""[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]"""))')
    check "chromium: a request with tools and tool_choice required finishes" \
        timeout 90 node "$WORK/page.js" "$URL/?new=1&prompt=Weather%3F&autosend=1&temperature=1&seed=5&max_tokens=170&tools=$tenc&tool_choice=required" "$WORK/page4.png" "$WORK/profile4"
    cp "$WORK/out" "$WORK/page4.json"
    check "chromium: the tool calls are shown, each get_weather with a string city" \
        py_file page4 "d['state'] == 'done' and len(json.loads(d['calls'])) >= 1 and all(n == 'get_weather' and isinstance(json.loads(a)['city'], str) for n, a in json.loads(d['calls']))"
    # Against the server with --api-key and no key set: the error says where the key goes, Settings open.
    check "chromium: a 401 finishes as an error" \
        timeout 90 node "$WORK/page.js" "$KEY_URL/?new=1&prompt=hi&autosend=1" "$WORK/page3.png" "$WORK/profile3"
    cp "$WORK/out" "$WORK/page3.json"
    check "chromium: the 401 points to the API key setting and opens Settings" \
        py_file page3 "d['state'] == 'error' and 'API key under Settings' in d['last'] and d['settings'] is True"
    check "chromium: screenshot is a PNG" python3 -c "
import sys; b = open('$WORK/page.png', 'rb').read(); sys.exit(not (b[:8] == b'\x89PNG\r\n\x1a\n' and len(b) > 5000))"
    [ -z "${SERVE_SHOT:-}" ] || cp "$WORK/page.png" "$SERVE_SHOT"   # SERVE_SHOT=path keeps it for a look
fi

for k in "${!SRV_PID[@]}"; do
    kill -TERM "${SRV_PID[$k]}"; rc=0; wait "${SRV_PID[$k]}" || rc=$?; unset "SRV_PID[$k]"
    check "server $k: SIGTERM, exit 0" test $rc = 0
done
finish
