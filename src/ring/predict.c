/* predict.c - a planned ring's figures from its parts (predict.h). */
#include "predict.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "../model/k3_memory.h"

/* A stage's weights: bytes read once per traversal (dense), bytes of routed experts, and the weights one
 * token multiplies (elements; routed experts at k/E, the embedding not at all: it is a lookup). */
typedef struct pr_stage_w {
    double dense, exps, elems;
    double miss; /* share of the routed experts a token reads from disk (plan_stage.cached: 1 - it) */
    double r_dense, r_exps, r_elems; /* on a two-tier node, the parts in RAM (the above: on the device) */
} pr_stage_w;

static double pr_elems(const mf_tensor *t) {
    return (double)t->ne[0] * (double)t->ne[1] * (double)t->ne[2] * (double)t->ne[3];
}

/* s: the stage, whose dev_layers / cpu_moe split it between a device and RAM when split is set (plan.h). */
static pr_stage_w pr_weights(const mf_model *m, const k3_hparams *hp, uint32_t a, uint32_t b, const plan_stage *s,
                             bool split) {
    pr_stage_w w = {0};
    for (int i = 0; i < m->n_tensor; i++) {
        const mf_tensor *t = &m->tensors[i];
        unsigned il;
        double ne = pr_elems(t);
        const bool exps = strstr(t->name, "_exps.") && hp->n_expert;
        bool ram = false;
        if (sscanf(t->name, "blk.%u.", &il) == 1) {
            if (il < a || il >= b) continue;
            ram = split && (il >= a + s->dev_layers || (exps && il < a + s->cpu_moe));
        } else if (strcmp(t->name, "token_embd.weight") == 0) {
            if (a == 0) *(split ? &w.r_dense : &w.dense) += (double)t->nbytes / (double)(t->ne[1] ? t->ne[1] : 1);
            continue;
        } else if (b < hp->n_layer) {
            continue;
        } else {
            ram = split && s->dev_layers < b - a;
        }
        if (exps) {
            *(ram ? &w.r_exps : &w.exps) += (double)t->nbytes;
            *(ram ? &w.r_elems : &w.elems) += ne * hp->n_expert_used / hp->n_expert;
        } else {
            *(ram ? &w.r_dense : &w.dense) += (double)t->nbytes;
            *(ram ? &w.r_elems : &w.elems) += ne;
        }
    }
    return w;
}

/* Seconds a stage needs for a traversal of `tokens` tokens. The sum, not the larger, of reading and
 * multiplying: on a CPU node a small batch pays both (bench_plan fits 1- to 256-token batches this way
 * within ~10%, where the larger of the two is 2x off at 5 tokens). */
/* Share of a layer's routed experts that `tokens` tokens touch, choosing independently. */
static double pr_touched(const k3_hparams *hp, double tokens) {
    return hp->n_expert ? 1.0 - pow(1.0 - (double)hp->n_expert_used / hp->n_expert, tokens) : 1.0;
}

/* Of a stage's time, the experts its cache misses, read from disk (a hit rate equal to the cached share). */
static double pr_stage_disk(const k3_hparams *hp, const pr_stage_w *w, const pr_node *nd, double tokens) {
    return w->miss > 0 && nd->disk > 0 ? w->exps * pr_touched(hp, tokens) * w->miss / nd->disk : 0;
}

static double pr_stage_time(const k3_hparams *hp, const pr_stage_w *w, const pr_node *nd, double tokens) {
    double bytes = w->dense + w->exps * pr_touched(hp, tokens);
    double t = bytes / nd->speed + 2.0 * tokens * w->elems / nd->flops + pr_stage_disk(hp, w, nd, tokens);
    if (w->r_dense + w->r_exps > 0) {
        t += (w->r_dense + w->r_exps * pr_touched(hp, tokens)) / nd->ram_speed + 2.0 * tokens * w->r_elems / nd->ram_flops;
    }
    return t;
}

int pr_draft_read(pr_draft *d, const mf_model *draft, const mf_model *target, rl_err *err) {
    memset(d, 0, sizeof *d);
    const char *arch = NULL;
    if (mf_get_str(draft, "general.architecture", &arch, true, err) != 0) return -1;
    if (strcmp(arch, DSPARK_ARCH) == 0) {
        /* Every tensor is read once per pass; the embedding is a lookup of the block's tokens. */
        for (int i = 0; i < draft->n_tensor; i++) {
            const mf_tensor *t = &draft->tensors[i];
            if (strcmp(t->name, "token_embd.weight") == 0) continue;
            d->bytes += (double)t->nbytes;
            d->elems += pr_elems(t);
        }
        const mf_tensor *head = mf_find(draft, "output.weight") ? NULL : target ? mf_find(target, "output.weight") : NULL;
        if (head) {
            d->bytes += (double)head->nbytes;
            d->elems += pr_elems(head);
        }
        d->block = true;
        return 0;
    }
    k3_hparams hp;
    if (strcmp(arch, K3_ARCH) != 0) return rl_errf(err, "draft: architecture '%s' (a K3 draft, " K3_ARCH ", or a DSpark/DFlash draft, " DSPARK_ARCH ")", arch);
    if (k3_hparams_read(&hp, draft, err) != 0) return rl_err_prefix(err, "draft");
    pr_stage_w w = pr_weights(draft, &hp, 0, hp.n_layer, NULL, false);
    d->bytes = w.dense + w.exps * (hp.n_expert ? (double)hp.n_expert_used / hp.n_expert : 1.0);
    d->elems = w.elems;
    return 0;
}

double pr_draft_time(const pr_draft *d, int k, double a) {
    if (!(d->bytes > 0) || k < 1) return 0;
    double step = d->bytes / d->node.speed + 2.0 * (d->block ? k : 1) * d->elems / d->node.flops;
    return d->block ? step : (k + pow(a, k)) * step;
}

/* One traversal at `tokens` tokens: hops + stages + transfers, each part returned. */
static double pr_traversal(const k3_hparams *hp, const plan_result *plan, const pr_stage_w *w, const pr_node *nodes,
                           const double *hop_s, double tokens, double *hops, double *comp, double *xfer,
                           double *disk, double *slowest) {
    *hops = *comp = *xfer = *disk = *slowest = 0;
    for (int s = 0; s <= plan->n_stages; s++) *hops += hop_s[s];
    for (int s = 0; s < plan->n_stages; s++) {
        double c = pr_stage_time(hp, &w[s], &nodes[s], tokens);
        double x = 0;
        if (s + 1 < plan->n_stages) { /* the boundary state, f32 on the wire */
            double net = nodes[s].net < nodes[s + 1].net ? nodes[s].net : nodes[s + 1].net;
            x = tokens * 4.0 * (double)k3_boundary_floats(hp, plan->stages[s + 1].a) / net;
        }
        const double d = pr_stage_disk(hp, &w[s], &nodes[s], tokens);
        *comp += c - d;
        *disk += d;
        *xfer += x;
        if (c + x > *slowest) *slowest = c + x;
    }
    return *hops + *comp + *xfer + *disk;
}

/* Time to the first token of a prompt read in chunks. The coordinator sends every chunk at once
 * (ring_generate.c): each stage computes the chunks in order, as soon as one has arrived and the one before
 * is done, and each link carries them in order; the first token comes when the last chunk is back. Each
 * chunk is priced at its own size (the last is what is left of the prompt). One chunk: a traversal. */
static double pr_prefill(const k3_hparams *hp, const plan_result *plan, const pr_stage_w *w, const pr_node *nodes,
                         const double *hop_s, uint32_t prompt, uint32_t chunk) {
    double stage_free[PLAN_MAX_NODES] = {0}, link_free[PLAN_MAX_NODES] = {0}, at = 0;
    for (uint32_t done = 0; done < prompt; done += chunk) {
        const double c = prompt - done < chunk ? (double)(prompt - done) : (double)chunk;
        at = hop_s[0];
        for (int s = 0; s < plan->n_stages; s++) {
            stage_free[s] = (at > stage_free[s] ? at : stage_free[s]) + pr_stage_time(hp, &w[s], &nodes[s], c);
            at = stage_free[s];
            if (s + 1 < plan->n_stages) { /* the boundary state, f32 on the wire */
                const double net = nodes[s].net < nodes[s + 1].net ? nodes[s].net : nodes[s + 1].net;
                const double x = c * 4.0 * (double)k3_boundary_floats(hp, plan->stages[s + 1].a) / net;
                link_free[s] = (at > link_free[s] ? at : link_free[s]) + x;
                at = link_free[s];
            }
            at += hop_s[s + 1];
        }
    }
    return at;
}

int pr_predict(const mf_model *m, const k3_hparams *hp, const plan_result *plan, const pr_node *nodes,
               const double *hop_s, const pr_opts *o, pr_result *r, rl_err *err) {
    memset(r, 0, sizeof *r);
    if (plan->n_stages < 1) return rl_errf(err, "predict: an empty plan");
    for (int s = 0; s < plan->n_stages; s++) {
        if (!(nodes[s].speed > 0 && nodes[s].flops > 0 && nodes[s].net > 0)) {
            return rl_errf(err, "predict: stage %d's node has no speed, compute or link figure", s);
        }
        if (nodes[s].two_tier && !(nodes[s].ram_speed > 0 && nodes[s].ram_flops > 0)) {
            return rl_errf(err, "predict: stage %d's node has a device but no RAM speed or compute figure", s);
        }
    }
    if (o->draft.bytes > 0 && !(o->draft.node.speed > 0 && o->draft.node.flops > 0)) {
        return rl_errf(err, "predict: the coordinator has no speed or compute figure for the draft");
    }
    pr_stage_w w[PLAN_MAX_NODES];
    for (int s = 0; s < plan->n_stages; s++) {
        w[s] = pr_weights(m, hp, plan->stages[s].a, plan->stages[s].b, &plan->stages[s], nodes[s].two_tier);
        w[s].miss = plan->stages[s].cached < 1.0 ? 1.0 - plan->stages[s].cached : 0;
    }
    double slowest;
    double t1 = pr_traversal(hp, plan, w, nodes, hop_s, 1, &r->hops_s, &r->compute_s, &r->xfer_s, &r->disk_s, &slowest);
    for (int s = 0; s < plan->n_stages; s++) r->stage_s[s] = pr_stage_time(hp, &w[s], &nodes[s], 1);
    r->greedy_tok_s = 1.0 / t1;
    r->floor_tok_s = r->hops_s > 0 ? 1.0 / r->hops_s : INFINITY;
    r->dominant = r->disk_s > r->hops_s && r->disk_s > r->compute_s && r->disk_s > r->xfer_s ? "disk"
                  : r->hops_s >= r->compute_s && r->hops_s >= r->xfer_s                       ? "hops"
                  : r->compute_s >= r->xfer_s                                                 ? "compute"
                                                                                              : "bandwidth";
    double h, c, x, dk;
    if (o->acceptance > 0) {
        const double a = o->acceptance < 0.999999 ? o->acceptance : 0.999999;
        int k_lo = o->draft_k > 0 ? o->draft_k : 1, k_hi = o->draft_k > 0 ? o->draft_k : 16;
        for (int k = k_lo; k <= k_hi; k++) {
            double g = (1.0 - pow(a, k + 1)) / (1.0 - a);
            double ds = pr_draft_time(&o->draft, k, a);
            double tk = pr_traversal(hp, plan, w, nodes, hop_s, k + 1, &h, &c, &x, &dk, &slowest) + ds;
            double q = pow(a, k + 1), iv = 0, rate = g / tk;
            if (o->draft_depth > 1 && q >= 0.25) {
                /* The next block left while this one travelled: it stands with probability q (this one whole,
                 * its bonus guessed), and then costs only the interval. The pipeline is as fast as its slowest
                 * part: a stage, the drafting of a block (and its bonus guess), or D blocks per traversal. */
                double dn = pr_draft_time(&o->draft, k + 1, 0);
                iv = tk / o->draft_depth;
                if (slowest > iv) iv = slowest;
                if (dn > iv) iv = dn;
                rate = g / ((1 - q) * tk + q * iv);
            }
            if (rate > r->spec_tok_s) {
                r->spec_tok_s = rate, r->draft_k = k, r->g = g, r->draft_s = ds, r->block_s = tk, r->interval_s = iv;
            }
        }
        r->spec_floor_tok_s = r->hops_s > 0 ? r->g / r->hops_s : INFINITY;
    }
    const uint32_t chunk = o->chunk ? o->chunk : 256, prompt = o->prompt ? o->prompt : 1;
    r->ttft_s = pr_prefill(hp, plan, w, nodes, hop_s, prompt, chunk);
    r->prefill_tok_s = prompt / r->ttft_s;
    const uint32_t np = o->parallel ? o->parallel : 1;
    r->parallel_tok_s = np / pr_traversal(hp, plan, w, nodes, hop_s, np, &h, &c, &x, &dk, &slowest);
    return 0;
}
