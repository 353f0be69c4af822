/* plan_model.h - what the planner knows of a model (plan.h's plan_model), read from its file: the ring's
 * coordinator plans with it (ring_open) and so does `ringlm plan --nodes` (plan_nodes.c), so both cut the
 * same model the same way. */
#ifndef RINGLM_PLAN_MODEL_H
#define RINGLM_PLAN_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "../gguf/model_file.h"
#include "../model/k3_hparams.h"
#include "plan.h"

/* Per-layer weights, bytes a token reads, state of n_seq sequences at n_ctx with cache elements of cache_elem
 * bytes (and, when they speculate in blocks of up to spec_block tokens, spec_depth in flight, the copies they
 * keep for rollback; with n_ckpt > 0, that many prompt-cache checkpoints of their KDA state each), embedding
 * and head. */
void plan_model_read(plan_model *pm, const mf_model *m, const k3_hparams *hp, uint32_t n_seq, uint32_t n_ctx,
                     size_t cache_elem, uint32_t spec_block, int spec_depth, int n_ckpt);

#endif
