#!/usr/bin/env python3
"""copy_probe.py - does the trained K3 read its question? Teacher-forced top-1 accuracy on the asked word.

  copy_probe.py MODEL.gguf HELDOUT.txt HELDOUT.ids [--n N] [--cue TEXT --end TEXT]... [--swap]

HELDOUT.txt and .ids are build.sh's corpus/heldout.txt and heldout.ids (a document a line, the same order).
For the first N held-out documents holding every cue, each (cue, end) pair marks a span: the text after the
cue up to the end marker. The model reads the whole document; a span's token counts as right when the
model's top-1 at the position before it is that token. Default spans: the word in the reasoning line ("The
user asks about the word "W".") and the quoted word heading the answer ("W": gloss): a model that reads its
question gets both right; one that does not is at chance on them, whatever its perplexity.

--swap, the control: in each document the first span's text, quoted, is replaced at its first occurrence
(the question) by the next probed document's, and the spans are scored against the document's own words as
before. A model that reads the question now predicts the other word, and its score falls; one that guesses
the word from elsewhere (what is frequent, the first letters) keeps its score.

Prints, per span: tokens right / tokens, and whole spans right / spans. Spans whose text does not tokenize
as a prefix of the document (a BPE merge across the cut) are skipped and counted.
"""
import argparse, os, subprocess, sys, tempfile

os.environ.setdefault("OPENBLAS_NUM_THREADS", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

import gguf_io  # noqa: E402
import k3_model  # noqa: E402

# The answer's span starts at its opening quote: after <|sep|>, '"' and the word's first letters can be one
# token, so a cut between them does not tokenize as the document does.
DEFAULT = [('The user asks about the word "', '".<|close|>think'), ('<|open|>response<|sep|>', '":')]


def bounds(doc, cue, end):
    """The span's [start, end) in doc: after the first cue, up to the end marker that follows it."""
    a = doc.index(cue) + len(cue)
    return a, doc.index(end, a)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model"); ap.add_argument("text"); ap.add_argument("ids")
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--cue", action="append"); ap.add_argument("--end", action="append")
    ap.add_argument("--swap", action="store_true")
    ap.add_argument("--ringlm", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../ringlm"))
    o = ap.parse_args()
    if len(o.cue or []) != len(o.end or []):
        sys.exit("copy_probe: give an --end for every --cue")
    spans = list(zip(o.cue, o.end)) if o.cue else DEFAULT
    docs = [l.rstrip("\n") for l in open(o.text)]
    ids = [l.strip() for l in open(o.ids)]
    if len(docs) != len(ids):
        sys.exit(f"copy_probe: {o.text} has {len(docs)} documents, {o.ids} {len(ids)}")
    sel = [i for i, d in enumerate(docs) if all(c in d for c, _ in spans)][:o.n]
    if not sel:
        sys.exit("copy_probe: no held-out document holds every cue")
    texts = [docs[i] for i in sel]
    if o.swap:  # the first span's text, quoted, swapped at its first occurrence for the next document's
        words = [d[slice(*bounds(d, *spans[0]))] for d in texts]
        for d, w in zip(texts, words):
            # The swap must hit the question, before the span: swapping the span itself would score nothing.
            if not 0 <= d.find(f'"{w}"') < d.index(spans[0][0]):
                sys.exit(f"copy_probe --swap: the first span's text, quoted (\"{w}\"), is not before its cue in the "
                         f"document {d[:60]!r}...: nothing to swap")
        texts = [d.replace(f'"{w}"', f'"{words[(j + 1) % len(words)]}"', 1) for j, (d, w) in enumerate(zip(texts, words))]
    cuts = []  # per document and span: the text before the span, and through it (and, swapped, the whole)
    for d in texts:
        for span in spans:
            a, b = bounds(d, *span)
            cuts += [d[:a], d[:b]]
        if o.swap:
            cuts.append(d)
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as f:
        f.write("\n".join(cuts) + "\n")
        f.flush()
        out = subprocess.run([o.ringlm, "tokenize", "-m", o.model, "--special", "--file", f.name],
                             capture_output=True, text=True, check=True).stdout
    toks = [[int(x) for x in l.split(",")] for l in out.split("\n") if l.strip()]
    per = 2 * len(spans) + (1 if o.swap else 0)  # cuts per document
    torch.set_num_threads(1)
    model = k3_model.K3(gguf_io.Gguf(o.model))
    model.eval()
    res = [[0, 0, 0, 0, 0] for _ in spans]  # tokens right, tokens, spans right, spans, skipped
    with torch.no_grad():
        for j, i in enumerate(sel):
            full = toks[j * per + per - 1] if o.swap else [int(x) for x in ids[i].split(",")]
            pred = model(torch.tensor([full]))[0].argmax(-1).tolist()
            for s in range(len(spans)):
                A, B = toks[j * per + 2 * s], toks[j * per + 2 * s + 1]
                r = res[s]
                if full[:len(B)] != B or B[:len(A)] != A or len(B) == len(A):
                    r[4] += 1
                    continue
                ok = [pred[p - 1] == full[p] for p in range(len(A), len(B))]
                r[0] += sum(ok); r[1] += len(ok); r[2] += all(ok); r[3] += 1
    for (cue, end), r in zip(spans, res):
        print(f"after {cue!r}: tokens {r[0]}/{r[1]} = {r[0] / max(1, r[1]):.3f}, "
              f"whole spans {r[2]}/{r[3]} = {r[2] / max(1, r[3]):.3f} ({r[4]} skipped)")


if __name__ == "__main__":
    main()
