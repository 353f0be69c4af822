/* plan_model.c - a model as the planner sees it (plan_model.h). */
#include "plan_model.h"

#include <string.h>

#include "../model/expert_cache.h"
#include "../model/k3_memory.h"

void plan_model_read(plan_model *pm, const mf_model *m, const k3_hparams *hp, uint32_t n_seq, uint32_t n_ctx,
                     size_t cache_elem, uint32_t spec_block, int spec_depth, int n_ckpt) {
    memset(pm, 0, sizeof *pm);
    pm->n_layer = hp->n_layer;
    pm->n_seq = n_seq;
    for (uint32_t il = 0; il < hp->n_layer; il++) {
        pm->layer_bytes[il] = k3_layer_weight_bytes(m, il);
        pm->layer_active[il] = k3_range_active_bytes(m, hp, il, il + 1) - (il == 0 ? k3_range_active_bytes(m, hp, 0, 0) : 0);
        pm->layer_host[il] = k3_range_rollback_bytes(hp, il, il + 1, spec_block, spec_depth);
        pm->layer_state[il] = k3_range_state_bytes(hp, il, il + 1, 1, n_ctx, cache_elem) + pm->layer_host[il] +
                              (uint64_t)(n_ckpt > 0 ? n_ckpt : 0) * k3_range_kda_state_bytes(hp, il, il + 1);
        /* The routed experts' part of both (k3_range_active_bytes counts them at k/E). */
        pm->layer_exps[il] = k3_range_expert_bytes(m, hp, il, il + 1);
        pm->layer_exps_active[il] = hp->n_expert ? (uint64_t)((double)pm->layer_exps[il] * hp->n_expert_used / hp->n_expert) : 0;
        /* per-tensor rounding there, one product here: never more than the total (plan_make checks) */
        if (pm->layer_exps_active[il] > pm->layer_active[il]) pm->layer_exps_active[il] = pm->layer_active[il];
    }
    /* The least cache of any stage: the engine's, for the whole model (every kind of expert), so that no
     * stage the planner streams is one the node's engine refuses. */
    pm->expert_min = xc_min_expert_bytes(m, hp, 0, hp->n_layer);
    pm->first_bytes = k3_range_weight_bytes(m, hp, 0, 0);
    pm->last_bytes = k3_range_weight_bytes(m, hp, hp->n_layer, hp->n_layer);
    pm->last_active = pm->last_bytes;
}
