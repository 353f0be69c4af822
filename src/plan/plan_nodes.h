/* plan_nodes.h - a ring planned before it exists (`ringlm plan --nodes`): from machines described in a
 * nodes.conf (nodes_conf.h), the ring order with the shortest round trip (ring_order.h), the layer cut under
 * every node's memory (plan.h), and what it will do (predict.h). */
#ifndef RINGLM_PLAN_NODES_H
#define RINGLM_PLAN_NODES_H

#include <stdio.h>

#include "../base/err.h"
#include "../gguf/model_file.h"
#include "../model/k3_hparams.h"
#include "nodes_conf.h"
#include "plan.h"
#include "predict.h"

typedef struct plan_nodes_result {
    int order[PLAN_MAX_NODES];  /* node indices of nodes.conf in ring order */
    double cycle_s;             /* the round trip through every node */
    bool exact;                 /* the order is optimal (else 2-opt's local optimum) */
    plan_node pnodes[PLAN_MAX_NODES]; /* in ring order */
    plan_result plan;           /* stage.node indexes order[] */
    double hop_s[PLAN_MAX_NODES + 1];
    predict_result pred;
    /* Speculating (--acceptance): the block size whose rollback copies the plan holds (drafts + 1; 0: none)
     * and those copies for every sequence over the whole model (k3_range_rollback_bytes), in the stages'
     * memory already. */
    uint32_t spec_block;
    uint64_t rollback_bytes;
    /* The prompt cache (docs/serve.md): a checkpoint (the KDA state of every layer), a cached token (its MLA
     * rows, f16), and the memory the plan leaves free on the stages' nodes, which cached prefixes could use. */
    uint64_t ckpt_bytes, token_bytes, spare_bytes;
} plan_nodes_result;

int plan_nodes_plan(const mf_model *m, const k3_hparams *hp, const nodes_conf_file *c, uint32_t n_ctx, const predict_opts *po,
            plan_nodes_result *r, rl_err *err);
/* The plan and the predictions as a table on f, and as JSON (cJSON *; NULL: out of memory). */
void plan_nodes_print(const plan_nodes_result *r, const nodes_conf_file *c, const predict_opts *po, FILE *f);
struct cJSON;
struct cJSON *plan_nodes_json(const plan_nodes_result *r, const nodes_conf_file *c, const predict_opts *po);

#endif
