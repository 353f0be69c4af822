#!/usr/bin/env python3
"""A multi-turn conversation against `ringlm serve` for tests/t_serve_cache.sh (Python stdlib only).

Turn 1 is a seeded prompt of --size token ids; each later turn is the previous prompt, the token ids the
server generated for it (return_token_ids), and --new seeded ids. Every turn after the first is sent twice:
with the prompt cache (the default) and with "cache_prompt": false (a fresh read), so the caller can
compare the two. Writes one JSON object to stdout:

  {"turns": [{"prompt": n, "cached": R, "fresh": R}, ...]}   (turn 1 has no "fresh")
  R = {"ids": [...], "logprobs": [...], "cached_tokens": n, "text": "..."}   (per choice: "choices": [R, ...])
With --evict an unrelated prompt goes before each later turn (on a one-slot server the turn then finds its
prefix in the host-RAM cache, not in the slot).
With --branches, not a conversation: turn 1 is the prompt P, then requests that branch off P (one system
prompt, many questions): P + a, P + b, P + c (two tokens each), P + a + --new tokens (its prefix P + a comes
back from the host cache), then P + d and P + e (--new tokens each), back to back; their fresh copies are sent
after all of them, so that none disturbs the slot between the branches.
"""
import argparse
import json
import random
import sys
import time
import urllib.request


def post(url, body, stream):
    req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        if not stream:
            return json.loads(r.read())
        # SSE: gather every choice's text and token ids, and the usage chunk
        choices, usage = {}, None
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            j = json.loads(line[6:])
            if j.get("usage"):
                usage = j["usage"]
            for c in j.get("choices", []):
                d = choices.setdefault(c["index"], {"text": "", "token_ids": [], "logprobs": None})
                d["text"] += c.get("text") or ""
                d["token_ids"] += c.get("token_ids") or []
        return {"choices": [choices[k] for k in sorted(choices)], "usage": usage}


def result(j):
    cs = []
    for c in j["choices"]:
        lp = c.get("logprobs")
        cs.append({"ids": c.get("token_ids"), "text": c.get("text"),
                   "logprobs": lp.get("token_logprobs") if isinstance(lp, dict) else None})
    u = j.get("usage") or {}
    cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens")
    r = dict(cs[0])
    r["cached_tokens"] = cached
    r["choices"] = cs
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--size", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--reply", type=int, default=16)
    ap.add_argument("--new", type=int, default=24)
    ap.add_argument("--vocab", type=int, default=1000, help="ids are drawn from [3, vocab)")
    ap.add_argument("--think", type=float, default=0.0, help="seconds between turns")
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--no-fresh", action="store_true", help="do not send the cache_prompt:false copy")
    ap.add_argument("--extra", default="{}", help="JSON merged into every request body")
    ap.add_argument("--evict", action="store_true",
                    help="before each later turn, an unrelated prompt (on a one-slot server it takes the slot)")
    ap.add_argument("--evict-size", type=int, default=0, help="tokens of that prompt (default --size)")
    ap.add_argument("--regenerate", action="store_true",
                    help="after the last turn (and --think), its prompt once more, as a client's regenerate")
    ap.add_argument("--branches", action="store_true", help="requests that branch off one prompt (above)")
    a = ap.parse_args()
    rnd = random.Random(a.seed)
    extra = json.loads(a.extra)
    prompt = [rnd.randrange(3, a.vocab) for _ in range(a.size)]
    turns = []
    if a.branches:
        ids = lambda n: [rnd.randrange(3, a.vocab) for _ in range(n)]
        sa, sb, sc = ids(2), ids(2), ids(2)
        bodies = [dict({"prompt": prompt + x, "max_tokens": a.reply, "temperature": 0, "ignore_eos": True,
                        "return_token_ids": True, "logprobs": 1}, **extra)
                  for x in ([], sa, sb, sc, sa + ids(a.new), ids(a.new), ids(a.new))]
        turns = [{"prompt": len(b["prompt"]), "cached": result(post(a.url, b, False))} for b in bodies]
        for t, b in zip(turns[1:], bodies[1:]):
            t["fresh"] = result(post(a.url, dict(b, cache_prompt=False), False))
        json.dump({"turns": turns}, sys.stdout)
        return
    for t in range(a.turns):
        if t > 0 and a.evict:
            other = [rnd.randrange(3, a.vocab) for _ in range(a.evict_size or a.size)]
            post(a.url, {"prompt": other, "max_tokens": 2, "temperature": 0, "ignore_eos": True}, False)
        body = {"prompt": prompt, "max_tokens": a.reply, "temperature": 0, "ignore_eos": True,
                "return_token_ids": True, "stream": a.stream}
        if a.stream:
            body["stream_options"] = {"include_usage": True}
        else:
            body["logprobs"] = 1
        body.update(extra)
        turn = {"prompt": len(prompt), "cached": result(post(a.url, body, a.stream))}
        if t > 0 and not a.no_fresh:
            turn["fresh"] = result(post(a.url, dict(body, cache_prompt=False), a.stream))
        turns.append(turn)
        last = prompt
        prompt = prompt + (turn["cached"]["ids"] or []) + [rnd.randrange(3, a.vocab) for _ in range(a.new)]
        if a.think > 0:
            time.sleep(a.think)
    if a.regenerate:
        body = dict(body, prompt=last)
        turn = {"prompt": len(last), "regenerate": True, "cached": result(post(a.url, body, a.stream))}
        turn["fresh"] = result(post(a.url, dict(body, cache_prompt=False), a.stream))
        turns.append(turn)
    json.dump({"turns": turns}, sys.stdout)


if __name__ == "__main__":
    main()
