"""train_util.py - what the two trainers (k3_train.py, dspark_train.py) share: token-id windows, a GGUF's
tensors as torch parameters, the learning-rate schedule and one optimizer step, the report file."""
import json
import math
import sys

import numpy as np
import torch


def read_ids(path):
    """`ringlm tokenize --file` output: one document's comma-separated ids a line."""
    docs = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                docs.append(np.array([int(x) for x in line.split(",")], dtype=np.int64))
    if not docs:
        sys.exit(f"train: {path} holds no token ids")
    return docs


class Windows:
    """T+1-token windows that start at document starts."""

    def __init__(self, docs, T):
        self.stream = np.concatenate(docs)
        self.starts = np.cumsum([0] + [len(d) for d in docs[:-1]])
        self.starts = self.starts[self.starts + T + 1 <= len(self.stream)]
        self.T = T
        if len(self.starts) == 0:
            sys.exit(f"train: the documents hold fewer than {T + 1} tokens")

    def batch(self, idx):
        return torch.from_numpy(np.stack([self.stream[s:s + self.T + 1] for s in self.starts[idx]]))


class GgufModule(torch.nn.Module):
    """A module whose weights are a GGUF file's f32 tensors under the file's names, in the file's order (the
    order fixes the gradient-norm sums, so it is part of what makes a run repeatable). Tensors for which
    is_buffer(name) holds are kept out of training in buffers_ (a plain dict, so parameters() skips them).
    tensors() hands every value back under its file name, for gguf_io.Gguf.write."""

    def load(self, gguf, is_buffer=lambda name: False):
        self.p = torch.nn.ParameterDict()
        self.buffers_ = {}
        for name in gguf.order:
            arr = torch.from_numpy(gguf.array(name))
            if is_buffer(name):
                self.buffers_[name] = arr.clone()
            else:
                self.p[name.replace(".", "__")] = torch.nn.Parameter(arr)

    def w(self, name):
        return self.p[name.replace(".", "__")]

    def has(self, name):
        return name.replace(".", "__") in self.p

    def tensors(self):
        out = {n.replace("__", "."): t.detach().numpy() for n, t in self.p.items()}
        out.update({n: t.numpy() for n, t in self.buffers_.items()})
        return out


def lr_at(step, steps, peak):
    """Linear warm-up over the first 5% of the steps, then cosine decay to 10% of the peak."""
    warm = max(1, steps // 20)
    if step < warm:
        return peak * (step + 1) / warm
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm))))


def optimizer_step(opt, loss, params, lr):
    """One AdamW step at rate lr, the gradients clipped to a norm of 1."""
    for grp in opt.param_groups:
        grp["lr"] = lr
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()


def write_report(path, report):
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
