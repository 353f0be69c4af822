#!/usr/bin/env python3
"""dspark_train.py - trains a DSpark draft against a trained K3 target and writes it as a GGUF.

  dspark_train.py TARGET.gguf DRAFT_INIT.gguf TRAIN.ids HELDOUT.ids OUT.gguf REPORT.json
                  [--steps N] [--batch B] [--ctx T] [--anchors A] [--lr X] [--seed S]

DRAFT_INIT.gguf is `ringlm synth --draft dspark --type f32` output for the target's config (same
vocabulary, taps, block size). Each step runs the frozen target over B windows of T tokens (k3_model, with
the draft's taps), picks A anchor positions per window and trains the draft's blocks there to match the
target's next-token distribution at every slot (distillation: what the verifier will accept is the
target's choice, not the text's), plus the confidence head on whether each slot's top-1 is the target's.

REPORT.json: per slot, on held-out windows, how often the draft's top-1 is the target's (teacher-forced
chain) and the mean accepted prefix of a block that implies (the offline estimate of acceptance; the
measured one comes from `ringlm run --draft`, bench/bench_spec.sh).
"""
import argparse, os, sys, time

os.environ["OPENBLAS_NUM_THREADS"] = "2"  # fixed, as k3_train.py: one torch thread, two for OpenBLAS
os.environ["OMP_NUM_THREADS"] = "1"

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dspark_model  # noqa: E402
import gguf_io  # noqa: E402
import k3_model  # noqa: E402
from train_util import Windows, lr_at, optimizer_step, read_ids, write_report  # noqa: E402


def target_pass(target, draft, x):
    with torch.no_grad():
        logits, taps = target(x, taps=draft.taps)
    return logits, torch.cat(taps, -1)


def losses(draft, logits_t, feats, x, anchors):
    S = draft.block
    logits, conf = draft(feats, x, anchors)  # [B, A, S, V]
    idx = anchors.unsqueeze(-1) + torch.arange(S)  # target's prediction for slot i sits at n + i
    ref = logits_t[:, idx]  # [B, A, S, V]
    p_ref = torch.softmax(ref, -1)
    kl = -(p_ref * torch.log_softmax(logits, -1)).sum(-1).mean()
    hit = (logits.argmax(-1) == ref.argmax(-1))
    bce = F.binary_cross_entropy(conf.squeeze(-1).clamp(1e-6, 1 - 1e-6), hit.float())
    return kl, bce, hit


def main():
    ap = argparse.ArgumentParser()
    for a in ("target", "init", "train", "heldout", "out", "report"):
        ap.add_argument(a)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--anchors", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--eval-windows", type=int, default=32)
    o = ap.parse_args()
    torch.set_num_threads(1)  # torch's intra-op threads are nondeterministic (k3_train.py)
    torch.manual_seed(o.seed)
    rng = np.random.RandomState(o.seed)
    t0 = time.time()
    target = k3_model.K3(gguf_io.Gguf(o.target))
    for p in target.parameters():
        p.requires_grad_(False)
    g = gguf_io.Gguf(o.init)
    draft = dspark_model.DSpark(g, target.w("token_embd.weight"), target.w("output.weight"))
    S = draft.block
    if o.ctx < S + 2:
        sys.exit(f"dspark_train: --ctx {o.ctx} is shorter than a block of {S} plus two")
    train, held = Windows(read_ids(o.train), o.ctx - 1), Windows(read_ids(o.heldout), o.ctx - 1)
    opt = torch.optim.AdamW(draft.parameters(), lr=o.lr, betas=(0.9, 0.95), weight_decay=0.01)
    curve = []
    for step in range(o.steps):
        lr = lr_at(step, o.steps, o.lr)
        x = train.batch(rng.randint(0, len(train.starts), o.batch))
        logits_t, feats = target_pass(target, draft, x)
        anchors = torch.from_numpy(np.sort(rng.choice(np.arange(1, o.ctx - S + 1), o.anchors, replace=False)))
        kl, bce, hit = losses(draft, logits_t, feats, x, anchors)
        loss = kl + 0.1 * bce
        optimizer_step(opt, loss, draft.parameters(), lr)
        if step % 25 == 0 or step == o.steps - 1:
            curve.append([step, round(kl.item(), 4), round(hit.float().mean().item(), 4)])
            print(f"dspark_train: step {step}/{o.steps} distill {kl.item():.3f} top-1 agreement "
                  f"{hit.float().mean().item():.3f} {time.time() - t0:.0f} s", flush=True)
    # Held-out: per-slot agreement with the target, and the accepted prefix it implies.
    hits = []
    with torch.no_grad():
        for i in range(0, min(o.eval_windows, len(held.starts)), o.batch):
            x = held.batch(np.arange(i, min(i + o.batch, o.eval_windows, len(held.starts))))
            logits_t, feats = target_pass(target, draft, x)
            anchors = torch.arange(1, o.ctx - S + 1, 3)
            hits.append(losses(draft, logits_t, feats, x, anchors)[2].reshape(-1, S))
    hits = torch.cat(hits).float()
    accepted = torch.cumprod(hits, -1).sum(-1).mean().item()
    g.write(o.out, draft.tensors(), {
        "general.name": "ringlm trained DSpark draft",
        "general.description": f"trained by tools/train/dspark_train.py against {os.path.basename(o.target)}: "
                               f"{o.steps} steps x {o.batch} windows x {o.anchors} blocks, seed {o.seed}"})
    report = {"steps": o.steps, "batch": o.batch, "ctx": o.ctx, "anchors": o.anchors, "lr": o.lr, "seed": o.seed,
              "block": S, "taps": draft.taps, "params": sum(p.numel() for p in draft.parameters()),
              "heldout_blocks": hits.shape[0], "heldout_slot_agreement": [round(v, 4) for v in hits.mean(0).tolist()],
              "heldout_accepted_per_block": round(accepted, 3), "curve": curve, "seconds": round(time.time() - t0, 1)}
    write_report(o.report, report)
    print(f"dspark_train: held-out slot agreement {report['heldout_slot_agreement']}, "
          f"{accepted:.2f} of {S} drafted tokens accepted per block (offline), {report['seconds']:.0f} s, wrote {o.out}")


if __name__ == "__main__":
    main()
