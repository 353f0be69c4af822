"""logits_io.py - writes the logits file of `ringlm logits` and the oracle (src/model/logits_file.h), so the
trainer's own forward pass can be held against both with `ringlm compare` (forward.py)."""
import numpy as np


def write(path, tokens, logits, source="torch", mode="batch"):
    """logits [R, V] for the R input ids in tokens."""
    logits = np.ascontiguousarray(logits, dtype="<f4")
    r, v = logits.shape
    if len(tokens) != r:
        raise ValueError(f"{len(tokens)} tokens for {r} rows of logits")
    head = (f"RINGLM-LOGITS 1\nsource {source}\nmode {mode}\nn_vocab {v}\nn_rows {r}\n"
            f"tokens {','.join(str(int(t)) for t in tokens)}\nend\n")
    with open(path, "wb") as f:
        f.write(head.encode())
        f.write(logits.tobytes())
