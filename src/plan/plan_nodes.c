/* plan_nodes.c - planning a ring from nodes.conf (plan_nodes.h). */
#include "plan_nodes.h"

#include <math.h>
#include <string.h>

#include <cJSON.h>

#include "../model/k3_memory.h"
#include "plan_model.h"
#include "ring_order.h"

static double plan_nodes_delay(const void *user, int a, int b) { return nodes_conf_delay_s(user, a, b); }

/* One plan and its prediction, with the rollback copies of blocks of spec_block tokens counted (0: none). */
static int plan_nodes_plan_once(const mf_model *m, const k3_hparams *hp, const nodes_conf_file *c, uint32_t n_ctx, const predict_opts *po,
                        uint32_t spec_block, plan_nodes_result *r, rl_err *err) {
    memset(r, 0, sizeof *r);
    if (nodes_conf_check_delays(c, err) != 0) return -1;
    if (order_best_order(c->n, plan_nodes_delay, c, r->order, &r->cycle_s, &r->exact, err) != 0) return -1;
    for (int i = 0; i < c->n; i++) {
        const nodes_conf_node *nd = &c->nodes[r->order[i]];
        plan_node *pn = &r->pnodes[i];
        snprintf(pn->name, sizeof pn->name, "%s", nd->name);
        pn->mem_bytes = (uint64_t)(nd->mem_gb * 1073741824.0);
        pn->speed = nd->bw_gbs * 1e9 * nd->eff;
        pn->disk_bps = nd->disk_gbs * 1e9;
        if (nd->ram_gb > 0) { /* partial offload: the devices first, the host's RAM after */
            pn->ram_bytes = (uint64_t)(nd->ram_gb * 1073741824.0);
            pn->ram_speed = nd->ram_bw_gbs * 1e9 * nd->eff;
            snprintf(pn->device, sizeof pn->device, "%s", nd->device);
        }
    }
    plan_model pm;
    plan_model_read(&pm, m, hp, po->parallel ? po->parallel : 1, n_ctx, 2, spec_block,
                    po->draft_depth > 1 ? po->draft_depth : 1, 0);
    r->spec_block = spec_block;
    for (uint32_t il = 0; il < pm.n_layer; il++) r->rollback_bytes += (uint64_t)pm.n_seq * pm.layer_host[il];
    if (plan_make(&pm, r->pnodes, c->n, 0.10, &r->plan, err) != 0) return -1;
    r->ckpt_bytes = k3_range_kda_state_bytes(hp, 0, hp->n_layer);
    r->token_bytes = k3_range_mla_bytes_per_token(hp, 0, hp->n_layer, 2);
    for (int s = 0; s < r->plan.n_stages; s++) {
        const plan_stage *ps = &r->plan.stages[s];
        const plan_node *pn = &r->pnodes[ps->node];
        const uint64_t have = pn->mem_bytes + pn->ram_bytes;
        if (have > ps->mem_bytes) r->spare_bytes += have - ps->mem_bytes;
    }
    /* The hops of the stages the plan uses (a node it leaves out is not on the way). */
    predict_node pr[PLAN_MAX_NODES];
    int prev = -1;
    for (int s = 0; s < r->plan.n_stages; s++) {
        int node = r->order[r->plan.stages[s].node];
        const nodes_conf_node *nd = &c->nodes[node];
        pr[s] = (predict_node){.speed = nd->bw_gbs * 1e9 * nd->eff, .flops = nd->tflops * 1e12 * nd->eff,
                          .net = nd->net_mbit * 1e6 / 8, .disk = nd->disk_gbs * 1e9, .col_reads = nd->col_reads,
                          .two_tier = nd->ram_gb > 0,
                          .ram_speed = nd->ram_bw_gbs * 1e9 * nd->eff, .ram_flops = nd->ram_tflops * 1e12 * nd->eff,
                          .host = nd->host, .host_slots = nodes_conf_host_slots(c, nd->host)};
        r->hop_s[s] = nodes_conf_delay_s(c, prev, node);
        prev = node;
    }
    r->hop_s[r->plan.n_stages] = nodes_conf_delay_s(c, prev, -1);
    predict_opts o = *po;
    o.draft.node = (predict_node){.speed = c->coord.bw_gbs * 1e9 * c->coord.eff, .flops = c->coord.tflops * 1e12 * c->coord.eff,
                             .net = c->coord.net_mbit * 1e6 / 8, .col_reads = c->coord.col_reads};
    return predict_predict(m, hp, &r->plan, pr, r->hop_s, &o, &r->pred, err);
}

/* Speculating, every stage keeps each sequence's blocks in flight for rollback: a copy of the KDA state per
 * token of each (k3_range_rollback_bytes), which the plan must hold. Their size depends on the drafts a block
 * carries, which the prediction chooses when --draft-n is not given: so the plan is made once without them
 * to choose it, then again with that many counted and the prediction held to it (with fewer drafts, down to
 * one, when those copies do not fit). */
int plan_nodes_plan(const mf_model *m, const k3_hparams *hp, const nodes_conf_file *c, uint32_t n_ctx, const predict_opts *po,
            plan_nodes_result *r, rl_err *err) {
    if (po->acceptance <= 0) return plan_nodes_plan_once(m, hp, c, n_ctx, po, 0, r, err);
    predict_opts o = *po;
    if (o.draft_k <= 0) {
        if (plan_nodes_plan_once(m, hp, c, n_ctx, po, 0, r, err) != 0) return -1;
        o.draft_k = r->pred.draft_k > 0 ? r->pred.draft_k : 1;
    }
    for (;;) {
        if (plan_nodes_plan_once(m, hp, c, n_ctx, &o, (uint32_t)o.draft_k + 1, r, err) == 0) return 0;
        if (po->draft_k > 0 || o.draft_k == 1) break;
        o.draft_k--;
    }
    rl_err e2 = *err;
    return rl_errf(err, "%s (speculating, with the rollback copies of blocks of %d tokens, %d in flight and one more: "
                   "without --acceptance the plan is for greedy decoding)", e2.msg, o.draft_k + 1,
                   po->draft_depth > 1 ? po->draft_depth : 1);
}

void plan_nodes_print(const plan_nodes_result *r, const nodes_conf_file *c, const predict_opts *po, FILE *f) {
    fprintf(f, "ring order (round trip %.1f ms%s):", r->cycle_s * 1e3, r->exact ? ", the shortest" : ", 2-opt");
    for (int i = 0; i < c->n; i++) fprintf(f, " %s", c->nodes[r->order[i]].name);
    fprintf(f, "\n");
    for (int k = 1; k <= c->n_hosts; k++) { /* host= */
        fprintf(f, "one machine, %s (%d cores; %d of its nodes compute at once):", c->hosts[k - 1], c->host_cores[k - 1],
                nodes_conf_host_slots(c, k));
        for (int i = 0; i < c->n; i++) {
            if (c->nodes[i].host == k) fprintf(f, " %s", c->nodes[i].name);
        }
        fprintf(f, "\n");
    }
    fprintf(f, "\n");
    plan_print(&r->plan, r->pnodes, f);
    const predict_result *p = &r->pred;
    fprintf(f, "\nprediction (assumptions: docs/plan.md):\n");
    fprintf(f, "  decode, greedy          %8.2f tok/s   one traversal %.1f ms = hops %.1f + compute %.1f + transfers %.1f",
            p->greedy_tok_s, 1e3 / p->greedy_tok_s, p->hops_s * 1e3, p->compute_s * 1e3, p->xfer_s * 1e3);
    if (p->disk_s > 0) fprintf(f, " + disk %.1f", p->disk_s * 1e3);
    fprintf(f, " (dominant: %s)\n", p->dominant);
    if (po->acceptance > 0) {
        fprintf(f, "  decode, speculative     %8.2f tok/s   at acceptance %.2f: %d drafted, %.2f tokens per block, %s",
                p->spec_tok_s, po->acceptance, p->draft_k, p->g,
                p->interval_s > 0 ? "pipelined" : po->draft_depth > 1 ? "not pipelined (a block rarely stands whole)"
                                                                      : "one block in flight");
        if (po->draft.bytes > 0) {
            fprintf(f, ", drafting %.1f ms on the coordinator (%s's figures)\n", p->draft_s * 1e3,
                    c->coord_figures_from < 0 ? "its own" : c->nodes[c->coord_figures_from].name);
        } else {
            fprintf(f, " (drafting not counted: no --draft)\n");
        }
        fprintf(f, "  rollback copies         %8.1f MiB    blocks of %u tokens, %d in flight and one more, %u stream%s: in the "
                "stages' memory above\n", (double)r->rollback_bytes / 1048576.0, r->spec_block,
                po->draft_depth > 1 ? po->draft_depth : 1, po->parallel ? po->parallel : 1, po->parallel > 1 ? "s" : "");
    }
    fprintf(f, "  time to first token     %8.2f s       a %u-token prompt in %u-token chunks (%.0f tok/s)\n", p->ttft_s,
            po->prompt ? po->prompt : 1, po->chunk ? po->chunk : 256, p->prefill_tok_s);
    fprintf(f, "  aggregate, %3u streams  %8.2f tok/s\n", po->parallel ? po->parallel : 1, p->parallel_tok_s);
    fprintf(f, "  network floor           %8.2f tok/s   (hops alone%s", p->floor_tok_s, po->acceptance > 0 ? "; " : ")\n");
    if (po->acceptance > 0) fprintf(f, "%.2f with speculation)\n", p->spec_floor_tok_s);
    /* What cached conversations cost (docs/serve.md, "Prompt cache"): each slot's checkpoints, and a cached
     * prefix's MLA rows; what the plan leaves free would hold this much. */
    const double gib = 1073741824.0, conv = 8.0 * (double)r->ckpt_bytes + 32768.0 * (double)r->token_bytes;
    fprintf(f, "prompt cache: a checkpoint %.1f MiB (KDA state), a cached token %.1f KiB (MLA rows, f16); the %.1f GiB the "
            "plan leaves free hold %.0f checkpoints, or %.1f cached 32k-token conversations of 8 checkpoints (%.2f GiB each)\n",
            (double)r->ckpt_bytes / 1048576.0, (double)r->token_bytes / 1024.0, (double)r->spare_bytes / gib,
            r->ckpt_bytes ? (double)r->spare_bytes / (double)r->ckpt_bytes : 0.0, conv > 0 ? (double)r->spare_bytes / conv : 0.0,
            conv / gib);
}

cJSON *plan_nodes_json(const plan_nodes_result *r, const nodes_conf_file *c, const predict_opts *po) {
    cJSON *j = cJSON_CreateObject();
    if (!j) return NULL;
    cJSON *ord = cJSON_AddArrayToObject(j, "order");
    for (int i = 0; i < c->n; i++) cJSON_AddItemToArray(ord, cJSON_CreateString(c->nodes[r->order[i]].name));
    cJSON_AddNumberToObject(j, "round_trip_s", r->cycle_s);
    cJSON_AddBoolToObject(j, "order_exact", r->exact);
    cJSON *st = cJSON_AddArrayToObject(j, "stages");
    for (int s = 0; s < r->plan.n_stages; s++) {
        const plan_stage *ps = &r->plan.stages[s];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "node", c->nodes[r->order[ps->node]].name);
        cJSON_AddNumberToObject(o, "a", ps->a);
        cJSON_AddNumberToObject(o, "b", ps->b);
        cJSON_AddNumberToObject(o, "mem_bytes", (double)ps->mem_bytes);
        if (r->pnodes[ps->node].ram_bytes > 0) { /* partial offload: what sits on the devices, and in RAM */
            cJSON_AddNumberToObject(o, "device_bytes", (double)ps->dev_bytes);
            cJSON_AddNumberToObject(o, "ram_bytes", (double)(ps->mem_bytes - ps->dev_bytes));
            cJSON_AddNumberToObject(o, "gpu_layers", ps->dev_layers);
            cJSON_AddNumberToObject(o, "cpu_moe_layers", ps->cpu_moe);
        }
        cJSON_AddNumberToObject(o, "compute_s", r->pred.stage_s[s]);
        cJSON_AddNumberToObject(o, "experts_in_memory", ps->cached);
        cJSON_AddNumberToObject(o, "hop_in_s", r->hop_s[s]);
        cJSON_AddItemToArray(st, o);
    }
    const predict_result *p = &r->pred;
    cJSON *pj = cJSON_AddObjectToObject(j, "predict");
    cJSON_AddNumberToObject(pj, "greedy_tok_s", p->greedy_tok_s);
    cJSON_AddNumberToObject(pj, "hops_s", p->hops_s);
    cJSON_AddNumberToObject(pj, "compute_s", p->compute_s);
    cJSON_AddNumberToObject(pj, "disk_s", p->disk_s);
    cJSON_AddNumberToObject(pj, "transfer_s", p->xfer_s);
    cJSON_AddStringToObject(pj, "dominant", p->dominant);
    if (po->acceptance > 0) {
        cJSON_AddNumberToObject(pj, "acceptance", po->acceptance);
        cJSON_AddNumberToObject(pj, "draft_k", p->draft_k);
        cJSON_AddNumberToObject(pj, "tokens_per_traversal", p->g);
        cJSON_AddNumberToObject(pj, "draft_s", p->draft_s);
        cJSON_AddNumberToObject(pj, "draft_depth", po->draft_depth > 1 ? po->draft_depth : 1);
        cJSON_AddNumberToObject(pj, "block_s", p->block_s);
        cJSON_AddNumberToObject(pj, "interval_s", p->interval_s);
        cJSON_AddNumberToObject(pj, "spec_tok_s", p->spec_tok_s);
        cJSON_AddNumberToObject(pj, "spec_floor_tok_s", p->spec_floor_tok_s);
        cJSON_AddNumberToObject(pj, "rollback_block", r->spec_block);
        cJSON_AddNumberToObject(pj, "rollback_bytes", (double)r->rollback_bytes);
    }
    cJSON_AddNumberToObject(pj, "prompt", po->prompt ? po->prompt : 1);
    cJSON_AddNumberToObject(pj, "ttft_s", p->ttft_s);
    cJSON_AddNumberToObject(pj, "parallel", po->parallel ? po->parallel : 1);
    cJSON_AddNumberToObject(pj, "parallel_tok_s", p->parallel_tok_s);
    cJSON_AddNumberToObject(pj, "floor_tok_s", isinf(p->floor_tok_s) ? -1 : p->floor_tok_s);
    return j;
}
