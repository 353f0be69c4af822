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
    out = ""
    for c in chunks:
        for ch in c["choices"]:
            out += (ch["delta"].get("content") or "") if chat else ch["text"]
    return out
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
raw = open(sys.argv[1], "rb").read()
try:
    d = json.loads(raw)
except ValueError:
    d = None
ok = eval(sys.argv[2])
if not ok:
    print("check failed:", sys.argv[2], "\n  on:", raw[:800])
    sys.exit(1)
