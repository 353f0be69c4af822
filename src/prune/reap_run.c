#include "reap_run.h"
#include "../base/clock.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void reap_bar(const char *label, size_t done, size_t total, double t0, double *last) {
    double now = rl_clock_now();
    if (done < total && now - *last < 0.25) return;
    *last = now;
    double el = now - t0, rate = el > 0 ? (double)done / el : 0, eta = rate > 0 ? (double)(total - done) / rate : 0;
    int w = 30, fill = total ? (int)((double)done * w / (double)total) : w;
    fprintf(stderr, "\r%s [", label);
    for (int i = 0; i < w; i++) fputc(i < fill ? '#' : ' ', stderr);
    fprintf(stderr, "] %zu/%zu tokens %8.1f tok/s ETA %5.0f s", done, total, rate, eta);
    if (done >= total) fputc('\n', stderr);
    fflush(stderr);
}

static uint32_t reap_max_len(const calib_set *c) {
    uint32_t m = 1;
    for (int i = 0; i < c->n_seq; i++) m = c->len[i] > m ? c->len[i] : m;
    return (m + 255u) / 256u * 256u;
}

int reap_score_local(k3_engine *e, const calib_set *c, uint32_t chunk, reap_stats *s, bool progress, rl_err *err) {
    if (e->a != 0) return rl_errf(err, "scoring runs from the model's first layer (the engine starts at %u)", e->a);
    if (chunk < 1) chunk = 512;
    k3_state st;
    if (k3_state_init(&st, &e->hp, e->a, e->b, reap_max_len(c), err) != 0) return -1;
    const double t0 = rl_clock_now();
    double last = 0;
    size_t done = 0;
    int rc = 0;
    for (int q = 0; q < c->n_seq && rc == 0; q++) {
        k3_state_reset(&st);
        for (uint32_t o = 0; o < c->len[q] && rc == 0; o += chunk) {
            uint32_t nt = c->len[q] - o < chunk ? c->len[q] - o : chunk;
            k3_state *sp = &st;
            k3_batch b = {.n_seqs = 1, .seqs = &sp, .n_tokens = &nt, .tokens = c->ids + c->start[q] + o, .routes = true};
            k3_output out;
            rc = k3_forward(e, &b, &out, err);
            if (rc == 0) rc = reap_stats_add(s, &out.routes, err);
            if (rc == 0) k3_output_free(&out);
            done += nt;
            if (progress) reap_bar("reap score", done, c->n_ids, t0, &last);
        }
    }
    k3_state_free(&st);
    return rc;
}

/* log-softmax of a row into lp; returns the argmax. */
static int32_t reap_logsoftmax(const float *z, uint32_t n, double *lp) {
    int32_t am = 0;
    double mx = z[0];
    for (uint32_t i = 1; i < n; i++) {
        if (z[i] > mx) mx = z[i], am = (int32_t)i;
    }
    double sum = 0;
    for (uint32_t i = 0; i < n; i++) sum += exp((double)z[i] - mx);
    const double lse = mx + log(sum);
    for (uint32_t i = 0; i < n; i++) lp[i] = (double)z[i] - lse;
    return am;
}

/* One chunk of one sequence through an engine, with logits for every row. */
static int reap_chunk_logits(k3_engine *e, k3_state *st, const int32_t *toks, uint32_t nt, int32_t *rows,
                             k3_output *out, rl_err *err) {
    for (uint32_t r = 0; r < nt; r++) rows[r] = (int32_t)r;
    k3_state *sp = st;
    k3_batch b = {.n_seqs = 1, .seqs = &sp, .n_tokens = &nt, .tokens = toks, .n_logits = (int)nt, .logit_rows = rows};
    return k3_forward(e, &b, out, err);
}

int reap_eval(k3_engine *ref, k3_engine **cand, int n, const calib_set *h, uint32_t chunk, reap_quality *q,
              reap_quality *ref_q, bool progress, rl_err *err) {
    const uint32_t V = ref->hp.n_vocab;
    if (ref->a != 0 || ref->b != ref->hp.n_layer) return rl_errf(err, "evaluation needs the whole reference model");
    for (int i = 0; i < n; i++) {
        if (cand[i]->hp.n_vocab != V || cand[i]->a != 0 || cand[i]->b != cand[i]->hp.n_layer) {
            return rl_errf(err, "evaluation needs whole models with the reference's vocabulary");
        }
    }
    if (chunk < 1) chunk = 128;
    const uint32_t n_ctx = reap_max_len(h);
    k3_state *st = calloc((size_t)n + 1, sizeof *st);
    double *lr = malloc((size_t)V * sizeof *lr), *lc = malloc((size_t)V * sizeof *lc);
    int32_t *rows = malloc(chunk * sizeof *rows);
    /* Sums: [i] agreement count, KL, NLL; the reference's NLL last. */
    double *sum = calloc((size_t)n * 3 + 1, sizeof *sum);
    k3_output *outs = calloc((size_t)n + 1, sizeof *outs);
    int rc = 0, n_init = 0;
    if (!st || !lr || !lc || !rows || !sum || !outs) rc = rl_errf(err, "out of memory for the evaluation");
    for (int i = 0; i <= n && rc == 0; i++, n_init++) {
        k3_engine *e = i < n ? cand[i] : ref;
        rc = k3_state_init(&st[i], &e->hp, 0, e->hp.n_layer, n_ctx, err);
        if (rc != 0) break;
    }
    uint64_t n_pred = 0;
    size_t done = 0;
    const double t0 = rl_clock_now();
    double last = 0;
    for (int s = 0; s < h->n_seq && rc == 0; s++) {
        for (int i = 0; i <= n; i++) k3_state_reset(&st[i]);
        const int32_t *toks = h->ids + h->start[s];
        for (uint32_t o = 0; o < h->len[s] && rc == 0; o += chunk) {
            uint32_t nt = h->len[s] - o < chunk ? h->len[s] - o : chunk;
            for (int i = 0; i <= n && rc == 0; i++) {
                rc = reap_chunk_logits(i < n ? cand[i] : ref, &st[i], toks + o, nt, rows, &outs[i], err);
            }
            for (uint32_t r = 0; r < nt && rc == 0; r++) {
                if (o + r + 1 >= h->len[s]) break; /* the last token predicts nothing we hold */
                const int32_t next = toks[o + r + 1];
                const int32_t am_r = reap_logsoftmax(outs[n].logits + (size_t)r * V, V, lr);
                sum[(size_t)n * 3] -= lr[next];
                for (int i = 0; i < n; i++) {
                    const int32_t am = reap_logsoftmax(outs[i].logits + (size_t)r * V, V, lc);
                    double kl = 0;
                    for (uint32_t v = 0; v < V; v++) kl += exp(lr[v]) * (lr[v] - lc[v]);
                    sum[(size_t)i * 3 + 0] += am == am_r;
                    sum[(size_t)i * 3 + 1] += kl > 0 ? kl : 0; /* rounding can make an equal pair -1e-17 */
                    sum[(size_t)i * 3 + 2] -= lc[next];
                }
                n_pred++;
            }
            for (int i = 0; i <= n; i++) k3_output_free(&outs[i]);
            done += nt;
            if (progress) reap_bar("reap eval", done, h->n_ids, t0, &last);
        }
    }
    if (rc == 0 && n_pred == 0) rc = rl_errf(err, "held-out text too short: no position to predict");
    if (rc == 0) {
        for (int i = 0; i < n; i++) {
            q[i] = (reap_quality){.n = n_pred, .agree = sum[i * 3] / (double)n_pred, .kl = sum[i * 3 + 1] / (double)n_pred,
                                  .ppl = exp(sum[i * 3 + 2] / (double)n_pred)};
        }
        *ref_q = (reap_quality){.n = n_pred, .agree = 1.0, .kl = 0.0, .ppl = exp(sum[(size_t)n * 3] / (double)n_pred)};
    }
    for (int i = 0; outs && i <= n; i++) k3_output_free(&outs[i]);
    for (int i = 0; i < n_init; i++) k3_state_free(&st[i]);
    free(st);
    free(lr);
    free(lc);
    free(rows);
    free(sum);
    free(outs);
    return rc;
}
