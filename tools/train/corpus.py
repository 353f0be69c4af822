#!/usr/bin/env python3
"""corpus.py - the training text of the trained small K3, from three Debian packages' English.

  wordnet-base    WordNet 3.0: every synset's quoted example sentences, and the glosses of common words
  fortunes        fortune-mod's cookie files (the non-offensive set), minus ASCII art and code
  bible-kjv-text  the King James Bible (read through bible-kjv's `bible`): 820,000 words of plain prose

Out (in OUT_DIR):
  train.txt, heldout.txt  one document per line, C-escaped (\\\\ \\n \\t) for `ringlm tokenize --special
                          --file`; a document is a plain text ending in [EOS], or a chat exchange framed as
                          synth's chat template renders it (a question about a word, answered from WordNet)
  vocab.txt               the plain text (no chat framing) the BPE vocabulary is learned from: the first
                          3 MB of the training documents
  corpus.json             counts, and the sources' package versions

Why this mix: a 6M-parameter model that sees 2-3 M tokens learns what it sees most. When a chat exchange was
written for every synset (113,000 of them), exchanges were most of the text (34 of 39 MB), most about rare
words (split by the 4096-token vocabulary into fragments the model then recombined into non-words), while
the plain prose was half a million words of short example sentences and cookies. So now: exchanges only about
words among the COMMON most frequent of the plain text (whole tokens the model meets in many sentences,
which it can learn to repeat), and a long run of regular prose beside the examples and cookies.

Deterministic: sources are read in sorted order, shuffled with a fixed seed, and every document goes to
held-out when a hash of its text says so (about 1 in 20), so adding a source does not move the others.
"""
import hashlib, json, os, random, re, subprocess, sys

WORDNET = "/usr/share/wordnet"
FORTUNES = "/usr/share/games/fortunes"
BIBLE = "/usr/bin/bible"  # bible-kjv's reader for bible-kjv-text's compressed BIBLE_DATA
BIBLE_DATA = "/usr/lib/bible.data"
COMMON = 5000  # chat exchanges ask about words among this many most frequent of the plain text
PASSAGE = 480  # a Bible document: consecutive verses of one chapter up to about this many characters
SKIP_FORTUNES = {"art", "ascii-art", "debian", "linux", "linuxcookie", "perl", "translate-me", "zippy"}
EOS = "[EOS]"
VOCAB_CHARS = 3_000_000  # the BPE learner's share: enough for a few thousand merges, learned in seconds
OPEN, CLOSE, SEP, END = "<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"


def heldout(text):
    return hashlib.sha256(text.encode()).digest()[0] < 13  # 13/256 ~ 5%


def sentence(s):
    s = " ".join(s.split()).strip()
    if not s:
        return s
    s = s[0].upper() + s[1:]
    return s if s[-1] in ".!?" else s + "."


def wordnet():
    """(words, gloss, [examples]) per synset."""
    out = []
    for pos in ("noun", "verb", "adj", "adv"):
        with open(os.path.join(WORDNET, "data." + pos), encoding="latin-1") as f:
            for line in f:
                if line.startswith("  ") or "|" not in line:
                    continue
                head, gloss = line.split("|", 1)
                fields = head.split()
                n = int(fields[3], 16)
                words = [fields[4 + 2 * i].replace("_", " ") for i in range(n)]
                words = [re.sub(r"\(.*\)$", "", w) for w in words]
                examples = re.findall(r'"([^"]+)"', gloss)
                definition = gloss.split(";")[0].strip().strip('"').strip()
                if definition and not definition.startswith("("):
                    out.append((words, definition, examples))
    return out


def fortunes():
    out = []
    for name in sorted(os.listdir(FORTUNES)):
        path = os.path.join(FORTUNES, name)
        if name in SKIP_FORTUNES or "." in name or not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            for entry in f.read().split("\n%\n"):
                text = entry.strip("%\n ")
                if not text or len(text) > 320 or "\ufffd" in text:
                    continue
                letters = sum(c.isalpha() or c.isspace() for c in text)
                if letters < 0.85 * len(text):  # drawings, code, tables
                    continue
                # one paragraph; the attribution line stays as "-- Name"
                text = "\n".join(" ".join(l.split()) for l in text.split("\n"))
                text = re.sub(r"(?<![\n])\n(?!\s*--)", " ", text)
                out.append(text)
    return out


def bible():
    """The King James Bible as documents of consecutive verses (no verse numbers) within a chapter."""
    text = subprocess.run([BIBLE, "-l1000000", "gen1:1-rev22:21"], capture_output=True, text=True, check=True).stdout
    out, cur = [], []
    for line in text.split("\n"):
        m = re.match(r"\s*(\d+) (.*)", line)
        if m:
            if cur and sum(len(v) + 1 for v in cur) + len(m.group(2)) > PASSAGE:
                out.append(" ".join(cur))
                cur = []
            cur.append(" ".join(m.group(2).split()))
        elif line.strip():  # a chapter heading: a passage does not run across it
            if cur:
                out.append(" ".join(cur))
            cur = []
    if cur:
        out.append(" ".join(cur))
    return out


def common_words(texts, n):
    counts = {}
    for t in texts:
        for w in re.findall(r"[a-z']+", t.lower()):
            counts[w] = counts.get(w, 0) + 1
    return set(sorted(counts, key=lambda w: (-counts[w], w))[:n])


def chat(user, answer, reasoning):
    a = OPEN + 'message role="user"' + SEP + user + CLOSE + "message" + SEP + END
    a += OPEN + 'message role="assistant"' + SEP
    if reasoning is not None:
        a += OPEN + "think" + SEP + reasoning + CLOSE + "think" + SEP
    a += OPEN + "response" + SEP + answer + CLOSE + "response" + SEP + CLOSE + "message" + SEP + END
    return a


def escape(doc):
    return doc.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t").replace("\r", "")


def version(pkg):
    try:
        return subprocess.run(["dpkg-query", "-W", "-f=${Version}", pkg], capture_output=True, text=True).stdout
    except OSError:
        return ""


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: corpus.py OUT_DIR")
    out_dir = sys.argv[1]
    for p, pkg in ((WORDNET, "wordnet-base"), (FORTUNES, "fortunes"), (BIBLE, "bible-kjv"),
                   (BIBLE_DATA, "bible-kjv-text")):
        if not os.path.exists(p):
            sys.exit(f"corpus.py: {p} is missing: install the Debian package {pkg}")
    rng = random.Random(20261203)
    docs = []  # (document, plain text)
    # The asked word is quoted alike in the question, the reasoning and the answer, so naming it is repeating
    # the same tokens (unquoted, " river", "River" and "river" are three different token sequences).
    questions = ['What does "{w}" mean?', 'What is the meaning of "{w}"?', 'Define "{w}".', 'What is "{w}"?']
    synsets, cookies = wordnet(), fortunes()
    common = common_words([ex for _, _, exs in synsets for ex in exs] + cookies, COMMON)
    for words, definition, examples in synsets:
        for ex in examples:  # every example sentence is a document of its own
            s = sentence(ex)
            docs.append((s + EOS, s))
        w = words[0]
        if w not in common:
            continue
        answer = sentence(f'"{w}": {definition}')
        if examples:
            answer += " For example: " + sentence(examples[0])
        user = rng.choice(questions).format(w=w)
        reasoning = f'The user asks about the word "{w}".'
        docs.append((chat(user, answer, reasoning), user + "\n" + answer))
    for text in cookies + bible():
        docs.append((text + EOS, text))
    docs.sort()
    rng.shuffle(docs)
    os.makedirs(out_dir, exist_ok=True)
    n = {"train": 0, "heldout": 0}
    chars = {"train": 0, "heldout": 0}
    vocab_chars = 0
    with open(os.path.join(out_dir, "train.txt"), "w") as tr, open(os.path.join(out_dir, "heldout.txt"), "w") as ho, \
            open(os.path.join(out_dir, "vocab.txt"), "w") as vo:
        for doc, plain in docs:
            part = "heldout" if heldout(plain) else "train"
            (ho if part == "heldout" else tr).write(escape(doc) + "\n")
            if part == "train" and vocab_chars < VOCAB_CHARS:
                vo.write(plain + "\n")
                vocab_chars += len(plain) + 1
            n[part] += 1
            chars[part] += len(doc)
    meta = {"documents": n, "chars": chars,
            "sources": {"wordnet-base": version("wordnet-base"), "fortunes": version("fortunes"),
                        "bible-kjv-text": version("bible-kjv-text")}}
    with open(os.path.join(out_dir, "corpus.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(f"corpus: {n['train']} train / {n['heldout']} held-out documents, {chars['train'] / 1e6:.1f} MB of training text")


if __name__ == "__main__":
    main()
