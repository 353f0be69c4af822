#include "accept.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

static float spec_q_of(const spec_q *q, int32_t id) {
    if (!q) return 0.0f;
    for (int i = 0; i < q->n; i++) {
        if (q->id[i] == id) return q->p[i];
    }
    return 0.0f;
}

/* Draws from max(0, p - q) renormalized over the target's candidates; q NULL means one-hot on `drafted`. */
static int32_t spec_residual(smp_sampler *s, size_t n, const spec_q *q, int32_t drafted) {
    double total = 0;
    for (size_t i = 0; i < n; i++) {
        float qv = q ? spec_q_of(q, s->cand[i].id) : (s->cand[i].id == drafted ? 1.0f : 0.0f);
        s->cand[i].logit = fmaxf(0.0f, s->cand[i].p - qv); /* reuse .logit for the residual mass */
        total += s->cand[i].logit;
    }
    if (total <= 0) { /* p <= q everywhere (rounding): fall back to p itself */
        for (size_t i = 0; i < n; i++) s->cand[i].logit = s->cand[i].p;
        total = 1;
    }
    double u = smp_uniform(s) * total, acc = 0;
    for (size_t i = 0; i < n; i++) {
        acc += s->cand[i].logit;
        if (u < acc) return s->cand[i].id;
    }
    return s->cand[n - 1].id;
}

int spec_accept(smp_sampler *s, const float *logits, int32_t n_vocab, const int32_t *block, int k, const spec_q *qs,
                int32_t *out) {
    int n_out = 0;
    const bool greedy = s->p.temperature <= 0.0f;
    for (int i = 0; i <= k; i++) {
        const float *row = logits + (size_t)i * (size_t)n_vocab;
        smp_accept(s, block[i]); /* the input at position i */
        if (i == k) { /* every draft kept: the target's own next token */
            out[n_out++] = smp_sample(s, row);
            break;
        }
        int32_t d = block[i + 1];
        if (greedy) {
            int32_t t = smp_sample(s, row);
            out[n_out++] = t;
            if (t != d) break;
            continue;
        }
        size_t n = smp_dist(s, row); /* what plain sampling draws from, the grammar's masking included */
        float p = 0.0f;
        for (size_t j = 0; j < n; j++) {
            if (s->cand[j].id == d) p = s->cand[j].p;
        }
        const spec_q *q = qs ? &qs[i] : NULL;
        float qd = q ? spec_q_of(q, d) : 1.0f;
        if (qd > 0.0f && p > 0.0f && smp_uniform(s) < fminf(1.0f, p / qd)) {
            smp_take(s, d);
            out[n_out++] = d;
            continue;
        }
        out[n_out] = spec_residual(s, n, q, d);
        smp_take(s, out[n_out++]);
        break;
    }
    return n_out;
}
