/* backend_local.h - the scheduler's backend on this machine (`ringlm serve` without --ring): every slot a
 * sequence state of one k3_engine that holds the whole model, its sampler beside it.
 *
 * A step is ONE k3_forward over every entry of the batch (the slots' states sit side by side in a state
 * pool, so a decode step of many sequences is one batched pass); sampling, speculative acceptance
 * (spec_accept) and log-probabilities happen here, on the logits, as a ring's last stage does them. A
 * speculative entry keeps rollback copies; its rejected drafts are dropped before the slot's next entry
 * (or a fork). The mirror of backend_ring.h: the scheduler sees only the sch_backend contract. */
#ifndef RINGLM_BACKEND_LOCAL_H
#define RINGLM_BACKEND_LOCAL_H

#include "../model/k3_forward.h"
#include "scheduler.h"

/* n_slots states of n_ctx tokens each on a k3_engine for the whole model (allocated here, so an impossible
 * --parallel x --ctx fails at start, not under load). The engine stays the caller's and must outlive the
 * backend. */
int sch_backend_local(sch_backend *be, k3_engine *e, int n_slots, uint32_t n_ctx, rl_err *err);

/* The prompt cache (docs/serve.md, "Prompt cache"): every slot keeps up to ctx_checkpoints checkpoints of its
 * sequence (at each prompt's end, and every sch_config.ckpt_every tokens), and prefixes a slot is about to
 * overwrite go to a host-RAM cache of ram_bytes (0: none), least recently used out first. A budget that
 * cannot hold one prefix at full context is refused, with the size it needs. exact: the model is split
 * invariant (k3_range_split_invariant), so a resumed prompt gives the bits of a fresh read; reported only. */
typedef struct sch_local_cache_opts {
    size_t ram_bytes;
    int ctx_checkpoints;
    bool exact;
    uint32_t reread_chunk; /* tokens per piece when idle slots re-read what they generated (0: 256) */
} sch_local_cache_opts;
int sch_local_cache_on(sch_backend *be, const sch_local_cache_opts *o, rl_err *err);
/* Bytes of one checkpoint (the KDA state of the whole model; MLA rows stay in the slot). */
size_t sch_local_ckpt_bytes(const sch_backend *be);

#endif
