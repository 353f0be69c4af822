#!/usr/bin/env python3
"""Bounded streaming load against an OpenAI-compatible /v1/completions (stdlib only).

load_serve.py --port P --concurrency C --requests R --max-tokens N --prompt-ids 1,2,3 --timeout S [--model ID]
C client threads each send R streamed requests one after another (temperature 0, ignore_eos).
Prints one JSON object: aggregate tok/s (completion tokens / wall time of the batch), p50/p99 TTFT and
inter-token latency (ms), failed requests with the reason of each."""
import argparse, http.client, json, os, socket, sys, threading, time

def pct(xs, p):
    if not xs: return None
    xs = sorted(xs); k = (len(xs) - 1) * p / 100.0; f = int(k); c = min(f + 1, len(xs) - 1)
    return xs[f] + (xs[c] - xs[f]) * (k - f)

def one(a, body, deadline):
    r = {"ok": False, "tokens": 0, "ttft": None, "itl": [], "error": None}
    t0 = time.monotonic()
    try:
        left = deadline - t0
        if left <= 0: raise TimeoutError("benchmark deadline passed before the request")
        conn = http.client.HTTPConnection("127.0.0.1", a.port, timeout=max(1.0, left))
        conn.request("POST", "/completion" if a.api == "llama" else "/v1/completions", body,
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            r["error"] = "HTTP %d: %s" % (resp.status, resp.read(300).decode("utf-8", "replace"))
            return r
        last = None; done = False; usage = None; chunks = 0
        while True:
            if time.monotonic() > deadline: raise TimeoutError("benchmark deadline passed mid-stream")
            line = resp.readline()
            if not line: break
            line = line.strip()
            if not line.startswith(b"data:"): continue
            data = line[5:].strip()
            if data == b"[DONE]": done = True; break
            ev = json.loads(data)
            if a.api == "llama": # llama-server's native /completion: one event per token, last has stop: true
                if "error" in ev:
                    r["error"] = "error event: " + json.dumps(ev["error"])[:300]; return r
                if ev.get("tokens"):
                    now = time.monotonic()
                    if last is None: r["ttft"] = now - t0
                    else: r["itl"].append(now - last)
                    last = now; chunks += 1
                if ev.get("stop"):
                    usage = {"completion_tokens": ev.get("tokens_predicted", chunks)}; done = True; break
                continue
            if "error" in ev:
                r["error"] = "error event: " + json.dumps(ev["error"])[:300]; return r
            if ev.get("usage"): usage = ev["usage"]
            ch = ev.get("choices") or []
            if ch and (ch[0].get("text") or ch[0].get("content")):
                now = time.monotonic()
                if last is None: r["ttft"] = now - t0
                else: r["itl"].append(now - last)
                last = now; chunks += 1
        conn.close()
        if not done: r["error"] = "stream ended without [DONE] (or stop: true)"; return r
        r["tokens"] = usage["completion_tokens"] if usage and "completion_tokens" in usage else chunks
        r["chunks"] = chunks
        r["ok"] = True
    except Exception as e:
        r["error"] = "%s: %s" % (type(e).__name__, e)
    return r

def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--concurrency", type=int, required=True)
    p.add_argument("--requests", type=int, required=True, help="per client")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prompt-ids", required=True)
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--model")
    p.add_argument("--n-vocab", type=int, default=0)
    p.add_argument("--extra", default="", help="JSON object merged into each request (e.g. a response_format)")
    p.add_argument("--api", choices=["openai", "llama"], default="openai",
                   help="openai: POST /v1/completions, ends with [DONE]; llama: llama-server's /completion")
    a = p.parse_args()
    ids = [int(x) for x in a.prompt_ids.split(",")]
    # Every request sends the same prompt: both servers are told not to reuse it (cache_prompt false, as
    # llama-server gets below), so the load is continuous batching, not the prompt cache (bench_cache.sh's).
    req = {"prompt": ids, "max_tokens": a.max_tokens, "temperature": 0, "stream": True, "ignore_eos": True,
           "stream_options": {"include_usage": True}, "cache_prompt": False}
    if a.model: req["model"] = a.model
    if a.extra: req.update(json.loads(a.extra))
    if a.api == "llama":
        # llama-server (3.21.1 bundle) ends a stream with a 500 "does not match the expected Content-only
        # format" once a random-weight model emits a lone byte token (text not valid UTF-8); ringlm holds such
        # bytes back or writes U+FFFD. So llama-server gets every token whose text alone is not valid UTF-8
        # banned via logit_bias (found with its /detokenize): same token count, different tokens.
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from load_turns import find_bans  # (one copy of the ban search, shared with bench_cache.sh's client)
        bad = find_bans(a.port, a.n_vocab)
        req = {"prompt": ids, "n_predict": a.max_tokens, "temperature": 0, "stream": True, "ignore_eos": True,
               "cache_prompt": False, "logit_bias": [[t, False] for t in bad]}
    body = json.dumps(req)
    results = []; lock = threading.Lock()
    t0 = time.monotonic(); deadline = t0 + a.timeout
    def client():
        for _ in range(a.requests):
            r = one(a, body, deadline)
            with lock: results.append(r)
    th = [threading.Thread(target=client, daemon=True) for _ in range(a.concurrency)]
    for t in th: t.start()
    for t in th: t.join(a.timeout + 30)
    wall = time.monotonic() - t0
    ok = [r for r in results if r["ok"]]
    toks = sum(r["tokens"] for r in ok)
    ttft = [r["ttft"] * 1000 for r in ok if r["ttft"] is not None]
    itl = [x * 1000 for r in ok for x in r["itl"]]
    errs = [r["error"] for r in results if not r["ok"]]
    sent = a.concurrency * a.requests
    out = {"concurrency": a.concurrency, "requests": sent, "completed": len(ok),
           "failed": sent - len(ok), "errors": errs[:20], "wall_s": round(wall, 3),
           "completion_tokens": toks, "agg_tok_s": round(toks / wall, 2) if wall > 0 else None,
           "ttft_p50_ms": pct(ttft, 50), "ttft_p99_ms": pct(ttft, 99),
           "itl_p50_ms": pct(itl, 50), "itl_p99_ms": pct(itl, 99),
           "tokens_per_request": sorted(set(r["tokens"] for r in ok))}
    for k in ("ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms"):
        if out[k] is not None: out[k] = round(out[k], 2)
    print(json.dumps(out))

if __name__ == "__main__":
    main()
