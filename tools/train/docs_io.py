#!/usr/bin/env python3
"""docs_io.py - reads corpus.py's documents back, for the benchmarks that use the trained model's text.

  docs_io.py questions FILE [--from K] [-n N]   the user's question of each chat exchange in FILE from its
                                                K-th document on (default 1), one a line, at most N
  docs_io.py jsonl FILE [-n N] -o OUT.jsonl     FILE's first N documents as `ringlm reap` text: a chat
                                                exchange as {"messages": [user, assistant]} (rendered again
                                                with the model's chat template), other text as {"text"}

FILE is corpus.py's train.txt or heldout.txt: one C-escaped document a line. The chat framing is corpus.py's
own (its chat() and markers), so the two cannot drift apart.
"""
import argparse
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from corpus import CLOSE, END, EOS, OPEN, SEP  # noqa: E402

E = re.escape
CHAT = re.compile(E(OPEN + 'message role="user"' + SEP) + r"(.*?)" + E(CLOSE + "message" + SEP + END)
                  + E(OPEN + 'message role="assistant"' + SEP)
                  + r"(?:" + E(OPEN + "think" + SEP) + r".*?" + E(CLOSE + "think" + SEP) + r")?"
                  + E(OPEN + "response" + SEP) + r"(.*?)" + E(CLOSE + "response"), re.S)


def unescape(line):
    """corpus.escape's inverse."""
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t"}.get(m.group(1), m.group(1)), line.rstrip("\n"))


def docs(path, start, n):
    with open(path) as f:
        for i, line in enumerate(f):
            if i + 1 < start:
                continue
            if n is not None and i + 1 >= start + n:
                break
            yield unescape(line)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=("questions", "jsonl"))
    ap.add_argument("file")
    ap.add_argument("--from", dest="start", type=int, default=1)
    ap.add_argument("-n", type=int)
    ap.add_argument("-o", dest="out")
    o = ap.parse_args()
    if o.what == "questions":
        got = 0
        for d in docs(o.file, o.start, None):
            m = CHAT.match(d)
            if m:
                print(m.group(1))
                got += 1
                if o.n is not None and got == o.n:
                    break
        return
    if not o.out:
        sys.exit("docs_io.py jsonl: -o OUT.jsonl is required")
    with open(o.out, "w") as out:
        for d in docs(o.file, 1, o.n):
            m = CHAT.match(d)
            if m:
                out.write(json.dumps({"messages": [{"role": "user", "content": m.group(1)},
                                                   {"role": "assistant", "content": m.group(2)}]}) + "\n")
            else:
                out.write(json.dumps({"text": d.replace(EOS, "")}) + "\n")


if __name__ == "__main__":
    main()
