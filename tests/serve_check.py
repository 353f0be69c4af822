# serve_check.py FILE EXPR - the serve tests' JSON/SSE checker: evaluates the Python expression EXPR over
# d (FILE's JSON, or None) and raw (its bytes); exits 1 with both shown when it is false. serve_lib.sh
# copies it into the work folder, whose NAME.exp files load() reads.
import json, os, sys
W = os.path.dirname(os.path.abspath(__file__))
def load(name):
    """A JSON file in the work folder (expected texts are kept as JSON strings in NAME.exp)."""
    return json.load(open(os.path.join(W, name), encoding="utf-8"))
def sse(raw):
    """Parses an SSE body: returns the decoded chunks; asserts the framing and the final [DONE]."""
    text = raw.decode()
    assert text.endswith("data: [DONE]\n\n"), "stream does not end with data: [DONE]"
    events = text.split("\n\n")[:-1]
    assert all(e.startswith("data: ") for e in events), "an event without data:"
    return [json.loads(e[6:]) for e in events[:-1]]
def content(chunks, chat=True):
    """The streamed text; for chat the reasoning deltas too (before the content: what `ringlm run --chat`
    prints, framing names aside)."""
    out = ""
    for c in chunks:
        for ch in c["choices"]:
            out += (ch["delta"].get("reasoning_content") or "") + (ch["delta"].get("content") or "") if chat else ch["text"]
    return out
def reply(d, i=0):
    """A chat response's whole reply: reasoning_content, then content."""
    m = d["choices"][i]["message"]
    return (m.get("reasoning_content") or "") + (m["content"] or "")
def text(chunks):
    """The text of completion chunks."""
    return "".join(ch["text"] for c in chunks for ch in c.get("choices", []))
def node(d, addr):
    """A /health node by its address."""
    return [n for n in d["nodes"] if n["addr"] == addr][0]
def is_error(d):
    e = d["error"]
    return set(e) == {"message", "type", "param", "code"} and isinstance(e["message"], str) and e["message"] \
        and isinstance(e["type"], str)
def usage(u):
    """A usage object without prompt_tokens_details (the prompt cache's count, checked on its own), after checking
    the details are there with a count."""
    assert isinstance(u.get('prompt_tokens_details', {}).get('cached_tokens'), int), u
    return {k: v for k, v in u.items() if k != 'prompt_tokens_details'}


def ref_logprobs(name, n_prompt):
    """Log-softmax rows of a `ringlm logits` file in the work folder, for the positions after the prompt:
    [(token id generated there, {id: logprob})], from the file's tokens (prompt, then the generated ones)."""
    import math, struct
    b = open(os.path.join(W, name), "rb").read()
    head, _, data = b.partition(b"end\n")
    kv = dict(l.split(" ", 1) for l in head.decode().splitlines()[1:])
    V, R = int(kv["n_vocab"]), int(kv["n_rows"])
    toks = [int(t) for t in kv["tokens"].split(",")]
    out = []
    for r in range(n_prompt - 1, R - 1):
        row = struct.unpack_from("<%df" % V, data, r * V * 4)
        m = max(row)
        lse = m + math.log(sum(math.exp(x - m) for x in row))
        out.append((toks[r + 1], {i: x - lse for i, x in enumerate(row)}))
    return out
def lp_match(d, want, top, tol=1e-3):
    """d: a completion's choices[0].logprobs (the legacy form); want: ref_logprobs. Each token's logprob,
    and its alternatives' (a dict by text: alternatives whose texts collide keep the likelier, so it may be
    shorter than top), agree within tol with the reference's top ones, the best first."""
    got = list(zip(d["token_logprobs"], d["top_logprobs"]))
    if len(got) != len(want):
        print("logprobs for", len(got), "tokens, the reference has", len(want))
        return False
    for (lp, alts), (tok, row) in zip(got, want):
        best = sorted(row.values(), reverse=True)[:top]
        vals = sorted(alts.values(), reverse=True)
        if abs(lp - row[tok]) > tol or not vals or len(vals) > top or abs(vals[0] - best[0]) > tol or \
                any(min(abs(v - b) for b in best) > tol for v in vals):
            print("logprob mismatch:", lp, row[tok], vals, best)
            return False
    return True
raw = open(sys.argv[1], "rb").read()
try:
    d = json.loads(raw)
except ValueError:
    d = None
ok = eval(sys.argv[2])
if not ok:
    print("check failed:", sys.argv[2], "\n  on:", raw[:800])
    sys.exit(1)
