#!/usr/bin/env python3
"""forward.py - the trainer's own forward pass (k3_model) over a prompt, written as a logits file.

  forward.py MODEL.gguf --tokens 1,2,3 -o OUT.bin [--loop]

MODEL.gguf is an f32 K3 file (synth --type f32, or a trained one). `ringlm compare OUT.bin RINGLM.bin`
then says how far the function the trainer optimizes is from the one ringlm and llama.cpp run
(tests/t_trained.sh). --loop runs the KDA recurrence token by token instead of in chunks (the spec's form).
"""
import argparse, os, sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "2")

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_io  # noqa: E402
import k3_model  # noqa: E402
import logits_io  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--tokens", required=True)
    ap.add_argument("-o", dest="out", required=True)
    ap.add_argument("--loop", action="store_true")
    o = ap.parse_args()
    torch.set_num_threads(1)
    ids = [int(x) for x in o.tokens.split(",")]
    model = k3_model.K3(gguf_io.Gguf(o.model), chunked=not o.loop)
    with torch.no_grad():
        logits = model(torch.tensor([ids]))[0].numpy()
    logits_io.write(o.out, ids, logits)


if __name__ == "__main__":
    main()
