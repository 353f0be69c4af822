#!/usr/bin/env python3
"""Multi-turn conversations against one server, time to first token per turn (stdlib only).

load_turns.py bans --port P --n-vocab V
    the token ids whose text alone is not valid UTF-8, found with llama-server's /detokenize (as
    load_serve.py does), printed as a JSON list: ban them with logit_bias on both servers.

load_turns.py conv --api openai|llama --port P --prompt-file F --new-files F2,F3 [--reply R]
                   [--ban-file B] [--uncached] [--timeout S]
    one conversation on one server: turn 1 sends the ids of F (comma-separated); the server generates R
    tokens greedily (temperature 0, ignore_eos, streamed, cache_prompt true); turn k+1 sends turn k's prompt,
    the exact ids it generated, and the ids of the k-th new file. With --uncached, turns 2.. are then sent
    once more with cache_prompt false (the same prompts). Prints one JSON object: per turn the time to the
    first streamed chunk that carries tokens (TTFT) and to the end of the stream, the prompt length, the
    tokens the server says it read (llama-server: timings.prompt_n; ringlm:
    usage.prompt_tokens - usage.prompt_tokens_details.cached_tokens) and the generated ids.

APIs: openai = ringlm serve's POST /v1/completions (token-id prompt, max_tokens, return_token_ids: every
chunk's choices[0].token_ids, stream_options.include_usage); llama = llama-server's native POST /completion
(token-id prompt, n_predict, return_tokens: every event's tokens, final event's timings).
Exit status 0 when every turn completed; 1 with {"error": ...} printed otherwise; 3 when the server gives no
token ids (a ringlm serve without return_token_ids, issue #51)."""
import argparse, http.client, json, sys, time

class NoTokenIds(Exception):
    pass

def find_bans(port, n_vocab):
    # llama-server (3.21.1 bundle) ends a stream with a 500 once a random-weight model emits a lone byte token
    # whose text is not valid UTF-8; ringlm holds such bytes back. Both get them banned, so that both generate
    # from the same candidates (see load_serve.py).
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    bad = []
    for t in range(n_vocab):
        c.request("POST", "/detokenize", json.dumps({"tokens": [t]}), {"Content-Type": "application/json"})
        if "\ufffd" in json.loads(c.getresponse().read())["content"]: bad.append(t)
    c.close()
    return bad

def turn(a, ids, cache, bans, deadline):
    """One streamed request; returns a dict (raises on failure)."""
    if a.api == "llama":
        path = "/completion"
        req = {"prompt": ids, "n_predict": a.reply, "temperature": 0, "stream": True, "ignore_eos": True,
               "return_tokens": True, "cache_prompt": cache}
    else:
        path = "/v1/completions"
        req = {"prompt": ids, "max_tokens": a.reply, "temperature": 0, "stream": True, "ignore_eos": True,
               "stream_options": {"include_usage": True}, "return_token_ids": True, "cache_prompt": cache}
        if a.model: req["model"] = a.model
    if bans: req["logit_bias"] = [[t, False] for t in bans]
    body = json.dumps(req)
    r = {"prompt_tokens": len(ids), "cache_prompt": cache}
    left = deadline - time.monotonic()
    if left <= 0: raise TimeoutError("deadline passed before the request")
    conn = http.client.HTTPConnection("127.0.0.1", a.port, timeout=max(1.0, left))
    t0 = time.monotonic()
    conn.request("POST", path, body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError("HTTP %d: %s" % (resp.status, resp.read(300).decode("utf-8", "replace")))
    gen = []; ttft = None; done = False; final = None; usage = None; text_without_ids = False
    while True:
        if time.monotonic() > deadline: raise TimeoutError("deadline passed mid-stream")
        line = resp.readline()
        if not line: break
        line = line.strip()
        if not line.startswith(b"data:"): continue
        data = line[5:].strip()
        if data == b"[DONE]": done = True; break
        ev = json.loads(data)
        if "error" in ev: raise RuntimeError("error event: " + json.dumps(ev["error"])[:300])
        if a.api == "llama":
            toks = ev.get("tokens") or []
            if toks:
                if ttft is None: ttft = time.monotonic() - t0
                gen += toks
            if ev.get("stop"):
                final = ev; done = True; break
            continue
        if ev.get("usage"): usage = ev["usage"]
        ch = ev.get("choices") or []
        if not ch: continue
        toks = ch[0].get("token_ids")
        if toks is None:
            if ch[0].get("text"): text_without_ids = True
            continue
        if toks:
            if ttft is None: ttft = time.monotonic() - t0
            gen += toks
    total = time.monotonic() - t0
    conn.close()
    if text_without_ids and not gen:
        raise NoTokenIds("the server streamed text without choices[0].token_ids: this ringlm serve does not "
                         "support \"return_token_ids\" (issue #51), so turn 2 cannot resend the exact reply")
    if not done: raise RuntimeError("stream ended without [DONE] (or stop: true)")
    if ttft is None: raise RuntimeError("no streamed chunk carried tokens")
    if len(gen) != a.reply: raise RuntimeError("generated %d tokens, asked for %d" % (len(gen), a.reply))
    r.update(ttft_ms=round(ttft * 1000, 2), total_ms=round(total * 1000, 2), generated=gen)
    if a.api == "llama":
        tm = final.get("timings") or {}
        r["read"] = tm.get("prompt_n")
        r["cached"] = tm.get("cache_n", final.get("tokens_cached"))
        r["server_prompt_ms"] = tm.get("prompt_ms")
        r["server_timings"] = tm
    else:
        u = usage or {}
        det = u.get("prompt_tokens_details") or {}
        r["cached"] = det.get("cached_tokens")
        r["read"] = (u["prompt_tokens"] - det["cached_tokens"]) if "prompt_tokens" in u and det.get("cached_tokens") is not None else None
        r["usage"] = u
    return r

def load_ids(path):
    s = open(path).read().strip()
    return [int(x) for x in s.split(",")] if s else []

def conv(a):
    bans = json.load(open(a.ban_file)) if a.ban_file else []
    first = load_ids(a.prompt_file)
    news = [load_ids(f) for f in a.new_files.split(",")] if a.new_files else []
    deadline = time.monotonic() + a.timeout
    out = {"api": a.api, "reply": a.reply, "banned_tokens": len(bans), "turns": [], "uncached": []}
    prompts = []
    ids = first
    try:
        for k in range(len(news) + 1):
            prompts.append(ids)
            t = turn(a, ids, True, bans, deadline)
            t["turn"] = k + 1
            out["turns"].append(t)
            if k < len(news): ids = ids + t["generated"] + news[k]
            if k < len(news) and a.think > 0: time.sleep(a.think)  # a person reading, a tool running
        if a.uncached:
            for k in range(1, len(prompts)):
                t = turn(a, prompts[k], False, bans, deadline)
                t["turn"] = k + 1
                # the same prompt and greedy settings: the reply must be the cached turn's, bit for bit
                t["same_reply_as_cached"] = t["generated"] == out["turns"][k]["generated"]
                out["uncached"].append(t)
    except NoTokenIds as e:
        out["error"] = str(e); print(json.dumps(out)); return 3
    except Exception as e:
        out["error"] = "turn %d: %s: %s" % (len(out["turns"]) + len(out["uncached"]) + 1, type(e).__name__, e)
        print(json.dumps(out)); return 1
    print(json.dumps(out))
    return 0

def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("bans")
    b.add_argument("--port", type=int, required=True)
    b.add_argument("--n-vocab", type=int, required=True)
    c = sub.add_parser("conv")
    c.add_argument("--api", choices=["openai", "llama"], required=True)
    c.add_argument("--port", type=int, required=True)
    c.add_argument("--prompt-file", required=True)
    c.add_argument("--new-files", default="", help="comma-separated files of new ids, one per turn after the first")
    c.add_argument("--reply", type=int, default=32)
    c.add_argument("--ban-file")
    c.add_argument("--uncached", action="store_true")
    c.add_argument("--think", type=float, default=0.0, help="seconds between a turn's end and the next turn")
    c.add_argument("--timeout", type=float, default=600)
    c.add_argument("--model")
    a = p.parse_args()
    if a.cmd == "bans":
        print(json.dumps(find_bans(a.port, a.n_vocab))); return 0
    return conv(a)

if __name__ == "__main__":
    sys.exit(main())
