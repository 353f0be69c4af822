/* draft_pool.h - a draft model drafting for many sequences at once (the server's `--draft MODEL.gguf`).
 *
 * One engine on the draft GGUF and one pooled state per server slot. Each call drafts for every listed
 * sequence together: one batch catches each draft state up with what its sequence committed since the
 * last call (the whole prompt, the first time), then one batch per drafted token runs every sequence that
 * still drafts, so the draft model reads its weights once per token for all of them. Drafts are the draft
 * model's greedy chain: a deterministic proposal, which speculative sampling verifies like an n-gram draft
 * (q = 1 on the drafted token), so one draft serves requests at any temperature.
 *
 * A state is snapshotted after the catch-up and restored after drafting: the next call feeds only
 * committed tokens. Decode-time batches use step kernels (k3_forward.h), as the target's verification
 * does, so a draft that is the target itself agrees with it bit for bit. */
#ifndef RINGLM_DRAFT_POOL_H
#define RINGLM_DRAFT_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "../base/err.h"
#include "../gguf/model_file.h"
#include "../model/k3_forward.h"

typedef struct spec_pool {
    mf_model m;
    k3_hparams hp;
    k3_engine e;
    k3_state_pool pool;
    k3_state *st;       /* [n_slots], bound to the pool's slots */
    k3_snapshot *snap;  /* [n_slots] */
    size_t *seen;       /* [n_slots]: leading tokens of the slot's sequence its draft state holds */
    int32_t *first;     /* [n_slots]: the draft after them (valid once seen > 0) */
    int n_slots;
    uint32_t n_ctx;
    /* scratch for one call */
    k3_state **bseq;
    uint32_t *bn;
    int32_t *btok, *brow;
    int *want;          /* [n_slots]: drafts wanted by each sequence of the call */
    size_t cap_tok;
} spec_pool;

/* Opens the draft model at path for n_slots sequences of n_ctx tokens. The draft must be a K3 model with
 * the target's vocabulary (target_vocab). */
int spec_pool_open(spec_pool *p, const char *path, uint32_t target_vocab, int n_slots, uint32_t n_ctx, int threads,
                   rl_err *err);
void spec_pool_close(spec_pool *p);

/* Slot `slot` starts another sequence: its draft state is emptied. */
void spec_pool_reset(spec_pool *p, int slot);

/* Drafts for n sequences: sequence i is in slot slots[i], its tokens so far are hist[i][0 .. n_hist[i])
 * (prompt and committed tokens; the last one is the one the target runs first), and it wants up to k[i]
 * drafts (0: none). Writes drafts[i * stride .. + n_out[i]). On error n_out is all 0 and every draft
 * state is one the next call can continue from. */
int spec_pool_propose(spec_pool *p, int n, const int *slots, const int32_t *const *hist, const size_t *n_hist,
                      const int *k, int32_t *drafts, int stride, int *n_out, rl_err *err);

#endif
