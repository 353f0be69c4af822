#!/usr/bin/env python3
"""k3_train.py - trains a small K3 on token ids and writes it as a GGUF.

  k3_train.py INIT.gguf TRAIN.ids HELDOUT.ids OUT.gguf REPORT.json [--steps N] [--batch B] [--ctx T]
              [--lr X] [--seed S] [--head-std X]

INIT.gguf is `ringlm synth --type f32 --corpus ...` output: the shapes, the tokenizer and the starting
values (synth's seeded draw). *.ids are `ringlm tokenize --special --file` output, one document per line.
A training window starts at a document start and runs on through the following documents for T+1 tokens,
as a prompt does. AdamW, linear warm-up then cosine decay, gradient clipping at 1; the experts' selection
bias is balanced after each step (k3_model.K3.balance). Threads, fixed: torch's own ops on one, the matrix
products in OpenBLAS on two. torch's intra-op threads make CPU training nondeterministic in the last bit
(two runs of 3 steps differed in every tensor; with one torch thread they are equal), and its own ops are
a small share of the time (one thread is even faster here: 1.5 s a step against 2.4 s). So the result is
a function of (INIT, data, options) on a given machine, and a rerun writes the same bytes.

REPORT.json: the loss curve, held-out cross-entropy and perplexity (the first 64 held-out windows), the
routed experts' load on held-out text per layer, and the time taken.
"""
import argparse, math, os, sys, time

os.environ["OPENBLAS_NUM_THREADS"] = "2"  # fixed, not inherited: the bytes written depend on it (see above)
os.environ["OMP_NUM_THREADS"] = "1"

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_io  # noqa: E402
import k3_model  # noqa: E402
from train_util import Windows, lr_at, optimizer_step, read_ids, write_report  # noqa: E402


def loss_of(model, x, loads=None):
    logits = model(x[:, :-1], loads=loads)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))


def evaluate(model, windows, n, bs):
    model.eval()
    loads, total, count = {}, 0.0, 0
    with torch.no_grad():
        for i in range(0, min(n, len(windows.starts)), bs):
            idx = np.arange(i, min(i + bs, n, len(windows.starts)))
            x = windows.batch(idx)
            step = {}
            total += loss_of(model, x, step).item() * len(idx)
            count += len(idx)
            for il, c in step.items():
                loads[il] = loads.get(il, 0) + c
    model.train()
    return total / count, {il: (c.float() / c.sum()).tolist() for il, c in sorted(loads.items())}


def main():
    ap = argparse.ArgumentParser()
    for a in ("init", "train", "heldout", "out", "report"):
        ap.add_argument(a)
    ap.add_argument("--steps", type=int, default=900)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--balance-rate", type=float, default=1e-3)
    ap.add_argument("--eval-windows", type=int, default=64)
    ap.add_argument("--head-std", type=float, default=0.02)
    o = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(o.seed)
    rng = np.random.RandomState(o.seed)
    t0 = time.time()
    g = gguf_io.Gguf(o.init)
    model = k3_model.K3(g)
    # synth draws output.weight for random-weight tests (std ~0.36: logits of std ~5, a first loss of 19 nats
    # where chance is ln 4096 = 8.3); a trained start wants near-uniform logits, so the head is scaled down.
    with torch.no_grad():
        head = model.w("output.weight")
        head.mul_(o.head_std / head.std())
    n_params = sum(p.numel() for p in model.parameters())
    train, held = Windows(read_ids(o.train), o.ctx), Windows(read_ids(o.heldout), o.ctx)
    decay = [p for n, p in model.p.items() if p.dim() >= 2]
    other = [p for n, p in model.p.items() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": other, "weight_decay": 0.0}],
                            lr=o.lr, betas=(0.9, 0.95))
    init_ce, _ = evaluate(model, held, o.eval_windows, o.batch)
    curve = []
    for step in range(o.steps):
        lr = lr_at(step, o.steps, o.lr)
        x = train.batch(rng.randint(0, len(train.starts), o.batch))
        loads = {}
        loss = loss_of(model, x, loads)
        if not torch.isfinite(loss):
            sys.exit(f"k3_train: the loss is {loss.item()} at step {step}")
        optimizer_step(opt, loss, model.parameters(), lr)
        model.balance(loads, o.balance_rate)
        if step % 25 == 0 or step == o.steps - 1:
            curve.append([step, round(loss.item(), 4)])
            print(f"k3_train: step {step}/{o.steps} loss {loss.item():.3f} lr {lr:.2e} "
                  f"{time.time() - t0:.0f} s", flush=True)
    ce, loads = evaluate(model, held, o.eval_windows, o.batch)
    desc = (f"trained by tools/train/k3_train.py from {os.path.basename(o.init)}: {o.steps} steps x {o.batch} x "
            f"{o.ctx} tokens, lr {o.lr}, seed {o.seed}")
    g.write(o.out, model.tensors(), {"general.name": "ringlm trained small K3", "general.description": desc})
    n_vocab = len(g.kv["tokenizer.ggml.tokens"])
    report = {
        "params": n_params, "n_vocab": n_vocab, "steps": o.steps, "batch": o.batch, "ctx": o.ctx,
        "tokens_seen": o.steps * o.batch * o.ctx, "lr": o.lr, "seed": o.seed,
        "train_documents": len(train.starts), "heldout_windows": min(o.eval_windows, len(held.starts)),
        "heldout_ce_init": init_ce, "heldout_ppl_init": math.exp(init_ce),
        "heldout_ce": ce, "heldout_ppl": math.exp(ce), "loss_curve": curve,
        "expert_load": {str(k): v for k, v in loads.items()}, "seconds": round(time.time() - t0, 1),
    }
    write_report(o.report, report)
    print(f"k3_train: held-out perplexity {math.exp(init_ce):.1f} -> {math.exp(ce):.2f} (vocabulary {n_vocab}), "
          f"{report['seconds']:.0f} s, wrote {o.out}")


if __name__ == "__main__":
    main()
