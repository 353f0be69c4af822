/* predict.c - a planned ring's figures from its parts (predict.h). */
#include "predict.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../model/k3_memory.h"

/* A stage's weights: bytes read once per traversal (dense), bytes of routed experts, and the weights one
 * token multiplies (elements; routed experts at k/E, the embedding not at all: it is a lookup). */
typedef struct predict_stage_w {
    double dense, exps, elems;
    double miss; /* share of the routed experts a token reads from disk (plan_stage.cached: 1 - it) */
    double r_dense, r_exps, r_elems; /* on a two-tier node, the parts in RAM (the above: on the device) */
} predict_stage_w;

static double predict_elems(const mf_tensor *t) {
    return (double)t->ne[0] * (double)t->ne[1] * (double)t->ne[2] * (double)t->ne[3];
}

/* s: the stage, whose dev_layers / cpu_moe split it between a device and RAM when split is set (plan.h). */
static predict_stage_w predict_weights(const mf_model *m, const k3_hparams *hp, uint32_t a, uint32_t b, const plan_stage *s,
                             bool split) {
    predict_stage_w w = {0};
    for (int i = 0; i < m->n_tensor; i++) {
        const mf_tensor *t = &m->tensors[i];
        unsigned il;
        double ne = predict_elems(t);
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

/* Share of a layer's routed experts that `tokens` tokens touch, choosing independently. */
static double predict_touched(const k3_hparams *hp, double tokens) {
    return hp->n_expert ? 1.0 - pow(1.0 - (double)hp->n_expert_used / hp->n_expert, tokens) : 1.0;
}

/* Of a stage's time, the experts its cache misses, read from disk (a hit rate equal to the cached share). */
static double predict_stage_disk(const k3_hparams *hp, const predict_stage_w *w, const predict_node *nd, double tokens) {
    return w->miss > 0 && nd->disk > 0 ? w->exps * predict_touched(hp, tokens) * w->miss / nd->disk : 0;
}

/* Bytes a traversal of `tokens` tokens reads from weights of `dense` and `exps` bytes: each product of c
 * columns reads its matrix min(c, col_reads) times (predict.h); an expert's columns are the tokens routed
 * to it, tokens * k / the experts they touch, on average. */
static double predict_read_bytes(const k3_hparams *hp, double dense, double exps, double tokens, double col_reads) {
    const double r = col_reads > 1 ? col_reads : 1, touched = predict_touched(hp, tokens);
    const double exp_cols = hp->n_expert && touched > 0 ? tokens * hp->n_expert_used / (hp->n_expert * touched) : tokens;
    return dense * (tokens < r ? tokens : r) + exps * touched * (exp_cols < r ? exp_cols : r);
}

/* A stage's reading and multiplying for a traversal of `tokens` tokens, seconds (its disk reads apart). A
 * verified block (verify) computes every column as a one-token step does, for the same bits (k3_layers.c,
 * k3_mm_prec): on a CPU each column then reads the weights again. */
static void predict_stage_parts(const k3_hparams *hp, const predict_stage_w *w, const predict_node *nd, double tokens, bool verify,
                           double *read_s, double *mul_s) {
    const double cr = verify && nd->col_reads > 1 ? INFINITY : nd->col_reads;
    *read_s = predict_read_bytes(hp, w->dense, w->exps, tokens, cr) / nd->speed;
    *mul_s = 2.0 * tokens * w->elems / nd->flops;
    if (w->r_dense + w->r_exps > 0) {
        *read_s += predict_read_bytes(hp, w->r_dense, w->r_exps, tokens, verify ? INFINITY : PREDICT_CPU_COL_READS) / nd->ram_speed;
        *mul_s += 2.0 * tokens * w->r_elems / nd->ram_flops;
    }
}

/* Seconds a stage needs for a traversal of `tokens` tokens. The sum, not the larger, of reading and
 * multiplying: on a CPU node a small batch pays both (where the larger of the two is 2x off at 5 tokens). */
static double predict_stage_time(const k3_hparams *hp, const predict_stage_w *w, const predict_node *nd, double tokens, bool verify) {
    double r, m;
    predict_stage_parts(hp, w, nd, tokens, verify, &r, &m);
    return r + m + predict_stage_disk(hp, w, nd, tokens);
}

int predict_stage_calibrate(const mf_model *m, const k3_hparams *hp, const plan_stage *st, predict_node *nd, const double *tokens,
                       const double *sec, int n) {
    if (n < 1 || st->cached < 1.0) return -1; /* a stage reading experts from disk: its steps time the disk too */
    /* Figures a node did not report (0 or infinite) start at a placeholder the fit then scales. */
    if (!(nd->speed > 0 && isfinite(nd->speed))) nd->speed = 1e10;
    if (!(nd->flops > 0 && isfinite(nd->flops))) nd->flops = 1e12;
    if (nd->two_tier && !(nd->ram_speed > 0 && isfinite(nd->ram_speed))) nd->ram_speed = nd->speed;
    if (nd->two_tier && !(nd->ram_flops > 0 && isfinite(nd->ram_flops))) nd->ram_flops = nd->flops;
    const predict_stage_w w = predict_weights(m, hp, st->a, st->b, st, nd->two_tier);
    double R[8], M[8];
    for (int i = 0; i < n && i < 8; i++) predict_stage_parts(hp, &w, nd, tokens[i], false, &R[i], &M[i]);
    /* sec = alpha R + beta M: reading alpha times slower than the figures say, multiplying beta times;
     * least squares over the frames, relative to each (the smallest frame counts as much as the largest). */
    double srr = 0, srm = 0, smm = 0, srs = 0, sms = 0;
    for (int i = 0; i < n && i < 8; i++) {
        if (!(sec[i] > 0)) return -1;
        const double r = R[i] / sec[i], mm = M[i] / sec[i];
        srr += r * r, srm += r * mm, smm += mm * mm, srs += r, sms += mm;
    }
    const double det = srr * smm - srm * srm;
    const bool apart = det > 1e-9 * srr * smm; /* frames of one shape only: reading and multiplying in one ratio */
    double alpha = apart ? (srs * smm - sms * srm) / det : -1, beta = apart ? (srr * sms - srm * srs) / det : -1;
    if (!(alpha > 0 && beta > 0)) { /* the frames cannot tell the two apart: one factor for both */
        const double g = (srs + sms) > 0 ? (srs + sms) / (srr + 2 * srm + smm) : -1;
        if (!(g > 0)) return -1;
        alpha = beta = g;
    }
    nd->speed /= alpha, nd->flops /= beta;
    if (nd->two_tier) nd->ram_speed /= alpha, nd->ram_flops /= beta;
    return 0;
}

int predict_draft_read(predict_draft *d, const mf_model *draft, const mf_model *target, rl_err *err) {
    memset(d, 0, sizeof *d);
    const char *arch = NULL;
    if (mf_get_str(draft, "general.architecture", &arch, true, err) != 0) return -1;
    if (strcmp(arch, DSPARK_ARCH) == 0) {
        /* Every tensor is read once per pass; the embedding is a lookup of the block's tokens. */
        for (int i = 0; i < draft->n_tensor; i++) {
            const mf_tensor *t = &draft->tensors[i];
            if (strcmp(t->name, "token_embd.weight") == 0) continue;
            d->bytes += (double)t->nbytes;
            d->elems += predict_elems(t);
        }
        const mf_tensor *head = mf_find(draft, "output.weight") ? NULL : target ? mf_find(target, "output.weight") : NULL;
        if (head) {
            d->bytes += (double)head->nbytes;
            d->elems += predict_elems(head);
        }
        d->block = true;
        return 0;
    }
    k3_hparams hp;
    if (strcmp(arch, K3_ARCH) != 0) return rl_errf(err, "draft: architecture '%s' (a K3 draft, " K3_ARCH ", or a DSpark/DFlash draft, " DSPARK_ARCH ")", arch);
    if (k3_hparams_read(&hp, draft, err) != 0) return rl_err_prefix(err, "draft");
    predict_stage_w w = predict_weights(draft, &hp, 0, hp.n_layer, NULL, false);
    d->bytes = w.dense + w.exps * (hp.n_expert ? (double)hp.n_expert_used / hp.n_expert : 1.0);
    d->elems = w.elems;
    return 0;
}

double predict_draft_time(const predict_draft *d, int k, double a) {
    if (!(d->bytes > 0) || k < 1) return 0;
    const double cols = d->block ? k : 1, r = d->node.col_reads > 1 ? d->node.col_reads : 1;
    double step = d->bytes * (cols < r ? cols : r) / d->node.speed + 2.0 * cols * d->elems / d->node.flops;
    return d->block ? step : (k + pow(a, k)) * step;
}

/* Seconds to send the boundary state of `tokens` tokens from stage s to stage s + 1 (f32 on the wire, over
 * the slower of the two nodes' links). */
static double predict_link_time(const k3_hparams *hp, const plan_result *plan, const predict_node *nodes, int s, double tokens) {
    const double net = nodes[s].net < nodes[s + 1].net ? nodes[s].net : nodes[s + 1].net;
    return tokens * 4.0 * (double)k3_boundary_floats(hp, plan->stages[s + 1].a) / net;
}

/* One traversal at `tokens` tokens (a verified block: verify): hops + stages + transfers, each part returned. */
static double predict_traversal(const k3_hparams *hp, const plan_result *plan, const predict_stage_w *w, const predict_node *nodes,
                           const double *hop_s, double tokens, bool verify, double *hops, double *comp, double *xfer,
                           double *disk, double *slowest) {
    *hops = *comp = *xfer = *disk = *slowest = 0;
    for (int s = 0; s <= plan->n_stages; s++) *hops += hop_s[s];
    for (int s = 0; s < plan->n_stages; s++) {
        double c = predict_stage_time(hp, &w[s], &nodes[s], tokens, verify);
        double x = 0;
        if (s + 1 < plan->n_stages) x = predict_link_time(hp, plan, nodes, s, tokens);
        const double d = predict_stage_disk(hp, &w[s], &nodes[s], tokens);
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
 * chunk is priced at its own size (the last is what is left of the prompt). One chunk: a traversal.
 * Stages whose nodes share a machine (predict_node.host > 0) also wait for one of its host_slots: the chunks are then
 * scheduled as they become ready, the earliest first, each on its host's first free slot (a machine's
 * scheduler serves runnable threads, not stages in ring order). Without shared hosts both give the same
 * times, since nothing then depends on the order. */
static double predict_prefill(const k3_hparams *hp, const plan_result *plan, const predict_stage_w *w, const predict_node *nodes,
                         const double *hop_s, uint32_t prompt, uint32_t chunk) {
    const int S = plan->n_stages;
    bool shared = false;
    for (int s = 0; s < S; s++) shared |= nodes[s].host > 0;
    double stage_free[PLAN_MAX_NODES] = {0}, link_free[PLAN_MAX_NODES] = {0}, at = 0;
    const uint32_t n_chunks = (prompt + chunk - 1) / chunk;
    /* arr[s * n_chunks + c]: when chunk c's input has reached stage s (shared hosts only) */
    double *arr = shared ? malloc((size_t)S * n_chunks * sizeof *arr) : NULL;
    if (!arr) { /* no shared host: the pipeline's formula, O(chunks x stages) with no memory (or no memory
                 * for the schedule: then as if none) */
        for (uint32_t done = 0; done < prompt; done += chunk) {
            const double c = prompt - done < chunk ? (double)(prompt - done) : (double)chunk;
            at = hop_s[0];
            for (int s = 0; s < S; s++) {
                stage_free[s] = (at > stage_free[s] ? at : stage_free[s]) + predict_stage_time(hp, &w[s], &nodes[s], c, false);
                at = stage_free[s];
                if (s + 1 < S) {
                    link_free[s] = (at > link_free[s] ? at : link_free[s]) + predict_link_time(hp, plan, nodes, s, c);
                    at = link_free[s];
                }
                at += hop_s[s + 1];
            }
        }
        return at;
    }
    double slot_free[PLAN_MAX_NODES][PLAN_MAX_NODES] = {{0}}; /* [host][slot] */
    uint32_t next[PLAN_MAX_NODES] = {0};                      /* each stage's next chunk */
    for (uint32_t c = 0; c < n_chunks; c++) arr[c] = hop_s[0];
    for (;;) {
        /* The ready chunk that can start earliest: stage s's next, once stage s - 1 has passed it on. */
        int best = -1;
        double best_t = 0;
        for (int s = 0; s < S; s++) {
            if (next[s] >= n_chunks || (s > 0 && next[s - 1] <= next[s])) continue;
            const double a = arr[(size_t)s * n_chunks + next[s]], t = a > stage_free[s] ? a : stage_free[s];
            if (best < 0 || t < best_t) best = s, best_t = t;
        }
        if (best < 0) break;
        const int s = best;
        const uint32_t ci = next[s]++;
        const double c = ci + 1 == n_chunks ? (double)(prompt - ci * chunk) : (double)chunk;
        double start = best_t;
        int slot = -1;
        if (nodes[s].host > 0 && nodes[s].host <= PLAN_MAX_NODES) {
            const int h = nodes[s].host - 1;
            const int k = nodes[s].host_slots < 1 ? 1 : nodes[s].host_slots > PLAN_MAX_NODES ? PLAN_MAX_NODES : nodes[s].host_slots;
            slot = 0;
            for (int j = 1; j < k; j++) slot = slot_free[h][j] < slot_free[h][slot] ? j : slot;
            if (slot_free[h][slot] > start) start = slot_free[h][slot];
        }
        stage_free[s] = start + predict_stage_time(hp, &w[s], &nodes[s], c, false);
        if (slot >= 0) slot_free[nodes[s].host - 1][slot] = stage_free[s];
        double out = stage_free[s];
        if (s + 1 < S) {
            link_free[s] = (out > link_free[s] ? out : link_free[s]) + predict_link_time(hp, plan, nodes, s, c);
            arr[(size_t)(s + 1) * n_chunks + ci] = link_free[s] + hop_s[s + 1];
        } else {
            at = out + hop_s[S]; /* chunks come back in order: the last one's is the answer */
        }
    }
    free(arr);
    return at;
}

int predict_predict(const mf_model *m, const k3_hparams *hp, const plan_result *plan, const predict_node *nodes,
               const double *hop_s, const predict_opts *o, predict_result *r, rl_err *err) {
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
    predict_stage_w w[PLAN_MAX_NODES];
    for (int s = 0; s < plan->n_stages; s++) {
        w[s] = predict_weights(m, hp, plan->stages[s].a, plan->stages[s].b, &plan->stages[s], nodes[s].two_tier);
        w[s].miss = plan->stages[s].cached < 1.0 ? 1.0 - plan->stages[s].cached : 0;
    }
    double slowest;
    double t1 = predict_traversal(hp, plan, w, nodes, hop_s, 1, false, &r->hops_s, &r->compute_s, &r->xfer_s, &r->disk_s, &slowest);
    for (int s = 0; s < plan->n_stages; s++) r->stage_s[s] = predict_stage_time(hp, &w[s], &nodes[s], 1, false);
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
            double ds = o->draft_block_s > 0 ? o->draft_block_s : predict_draft_time(&o->draft, k, a);
            double tk = predict_traversal(hp, plan, w, nodes, hop_s, k + 1, true, &h, &c, &x, &dk, &slowest) + ds;
            double q = pow(a, k + 1), iv = 0, rate = g / tk;
            if (o->draft_depth > 1 && q >= 0.25) {
                /* The next block left while this one travelled: it stands with probability q (this one whole,
                 * its bonus guessed), and then costs only the interval. The pipeline is as fast as its slowest
                 * part: a stage, the drafting of a block (and its bonus guess), or D blocks per traversal. */
                double dn = o->draft_block_s > 0 ? o->draft_block_s : predict_draft_time(&o->draft, k + 1, 0);
                int deff = 1; /* run's adaptive depth: n blocks in flight only while q^n >= 0.25 */
                while (deff < o->draft_depth && pow(q, deff) >= 0.25) deff++;
                iv = tk / deff;
                if (slowest > iv) iv = slowest;
                if (dn > iv) iv = dn;
                rate = g / ((1 - q) * tk + q * iv);
            }
            if (o->gen > 0) { /* a reply of gen tokens: the first block pays its whole traversal */
                double nb = o->gen / g, per = g / rate;
                rate = o->gen / (tk + (nb > 1 ? (nb - 1) * per : 0));
            }
            if (rate > r->spec_tok_s) {
                r->spec_tok_s = rate, r->draft_k = k, r->g = g, r->draft_s = ds, r->block_s = tk, r->interval_s = iv;
            }
        }
        r->spec_floor_tok_s = r->hops_s > 0 ? r->g / r->hops_s : INFINITY;
    }
    const uint32_t chunk = o->chunk ? o->chunk : 256, prompt = o->prompt ? o->prompt : 1;
    r->ttft_s = predict_prefill(hp, plan, w, nodes, hop_s, prompt, chunk);
    r->prefill_tok_s = prompt / r->ttft_s;
    const uint32_t np = o->parallel ? o->parallel : 1;
    r->parallel_tok_s = np / predict_traversal(hp, plan, w, nodes, hop_s, np, false, &h, &c, &x, &dk, &slowest);
    return 0;
}
