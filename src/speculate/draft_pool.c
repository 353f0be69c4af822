#include "draft_pool.h"

#include "drafter.h"

#include <stdlib.h>
#include <string.h>

/* Prompt catch-ups run in chunks of at most this many tokens per sequence, so that a long prompt does not
 * ask the draft engine for one huge compute buffer. */
#define SPEC_POOL_CHUNK 256

int spec_pool_open(spec_pool *p, const char *path, uint32_t target_vocab, int n_slots, uint32_t n_ctx, int threads,
                   rl_err *err) {
    memset(p, 0, sizeof *p);
    if (n_slots < 1) return rl_errf(err, "draft pool: no slots");
    if (spec_model_open(&p->m, &p->hp, &p->e, path, target_vocab, threads, err) != 0) return -1;
    p->n_slots = n_slots;
    p->n_ctx = n_ctx;
    if (k3_state_pool_init(&p->pool, &p->e.hp, 0, p->hp.n_layer, n_ctx, n_slots, err) != 0) { /* its cache type */
        k3_engine_free(&p->e);
        mf_close(&p->m);
        return rl_err_prefix(err, "draft model states");
    }
    p->st = calloc((size_t)n_slots, sizeof *p->st);
    p->snap = calloc((size_t)n_slots, sizeof *p->snap);
    p->seen = calloc((size_t)n_slots, sizeof *p->seen);
    p->bseq = calloc((size_t)n_slots, sizeof *p->bseq);
    p->bn = calloc((size_t)n_slots, sizeof *p->bn);
    p->brow = calloc((size_t)n_slots, sizeof *p->brow);
    p->want = calloc((size_t)n_slots, sizeof *p->want);
    p->first = calloc((size_t)n_slots, sizeof *p->first);
    if (!p->st || !p->snap || !p->seen || !p->bseq || !p->bn || !p->brow || !p->want || !p->first) {
        spec_pool_close(p);
        return rl_errf(err, "out of memory for the draft pool");
    }
    for (int i = 0; i < n_slots; i++) {
        if (k3_state_init_pooled(&p->st[i], &p->pool, i, err) != 0) {
            spec_pool_close(p);
            return rl_err_prefix(err, "draft model states");
        }
    }
    return 0;
}

void spec_pool_close(spec_pool *p) {
    for (int i = 0; p->st && i < p->n_slots; i++) k3_state_free(&p->st[i]);
    for (int i = 0; p->snap && i < p->n_slots; i++) k3_snapshot_free(&p->snap[i]);
    if (p->pool.n_slots) k3_state_pool_free(&p->pool);
    free(p->st);
    free(p->snap);
    free(p->seen);
    free(p->bseq);
    free(p->bn);
    free(p->btok);
    free(p->brow);
    free(p->want);
    free(p->first);
    if (p->n_slots) {
        k3_engine_free(&p->e);
        mf_close(&p->m);
    }
    memset(p, 0, sizeof *p);
}

void spec_pool_reset(spec_pool *p, int slot) {
    if (slot < 0 || slot >= p->n_slots) return;
    k3_state_reset(&p->st[slot]);
    p->seen[slot] = 0;
}

static int32_t spec_argmax(const float *row, uint32_t n) {
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++) {
        if (row[i] > row[best]) best = i;
    }
    return (int32_t)best;
}

/* Runs the batch gathered in p->bseq/bn/btok (nb sequences), logits of rows p->brow when want. */
static int spec_pool_run(spec_pool *p, int nb, bool want, bool steps, float **logits, rl_err *err) {
    k3_batch b = {.n_seqs = nb, .seqs = p->bseq, .n_tokens = p->bn, .tokens = p->btok, .step_kernels = steps,
                  .n_logits = want ? nb : 0, .logit_rows = p->brow};
    k3_output o;
    if (k3_forward(&p->e, &b, &o, err) != 0) return rl_err_prefix(err, "draft model");
    *logits = o.logits;
    o.logits = NULL;
    k3_output_free(&o);
    return 0;
}

static int spec_pool_tokens(spec_pool *p, size_t n, rl_err *err) {
    if (n <= p->cap_tok) return 0;
    int32_t *t = realloc(p->btok, n * sizeof *t);
    if (!t) return rl_errf(err, "out of memory for draft tokens");
    p->btok = t;
    p->cap_tok = n;
    return 0;
}

int spec_pool_propose(spec_pool *p, int n, const int *slots, const int32_t *const *hist, const size_t *n_hist,
                      const int *k, int32_t *drafts, int stride, int *n_out, rl_err *err) {
    const uint32_t V = p->hp.n_vocab;
    if (n > p->n_slots) return rl_errf(err, "draft pool: %d sequences for %d slots", n, p->n_slots);
    int kmax = 0;
    for (int i = 0; i < n; i++) {
        n_out[i] = 0;
        int s = slots[i];
        if (s < 0 || s >= p->n_slots) return rl_errf(err, "draft pool: slot %d of %d", s, p->n_slots);
        if (n_hist[i] == 0 || n_hist[i] < p->seen[s] || n_hist[i] > p->n_ctx) {
            return rl_errf(err, "draft pool: slot %d has %zu tokens, its draft state %zu of %u", s, n_hist[i], p->seen[s],
                           p->n_ctx);
        }
        /* The draft state will hold the sequence and all drafts but the last. */
        int want = k[i] < stride ? k[i] : stride;
        if ((int64_t)want > (int64_t)p->n_ctx - (int64_t)n_hist[i] + 1) want = (int)(p->n_ctx - n_hist[i]) + 1;
        p->want[i] = want > 0 ? want : 0;
        if (p->want[i] > kmax) kmax = p->want[i];
    }
    if (kmax == 0) return 0;

    /* 1. Catch up with what each sequence committed since the last call (the prompt, the first time): long
     * stretches in chunks without logits, then one batch ending at each sequence's last token. A sequence
     * with nothing new kept its first draft and the snapshot after it from the last call. */
    float *lg = NULL;
    for (;;) {
        int nb = 0;
        size_t nt = 0;
        for (int i = 0; i < n; i++) {
            if (p->want[i] > 0 && n_hist[i] - p->seen[slots[i]] > SPEC_POOL_CHUNK) nt += SPEC_POOL_CHUNK;
        }
        if (nt == 0) break;
        if (spec_pool_tokens(p, nt, err) != 0) return -1;
        nt = 0;
        for (int i = 0; i < n; i++) {
            int s = slots[i];
            if (p->want[i] == 0 || n_hist[i] - p->seen[s] <= SPEC_POOL_CHUNK) continue;
            memcpy(p->btok + nt, hist[i] + p->seen[s], SPEC_POOL_CHUNK * sizeof *p->btok);
            nt += SPEC_POOL_CHUNK;
            p->bseq[nb] = &p->st[s];
            p->bn[nb++] = SPEC_POOL_CHUNK;
        }
        if (spec_pool_run(p, nb, false, false, &lg, err) != 0) return -1;
        for (int i = 0; i < n; i++) {
            if (p->want[i] > 0 && n_hist[i] - p->seen[slots[i]] > SPEC_POOL_CHUNK) p->seen[slots[i]] += SPEC_POOL_CHUNK;
        }
    }
    int nb = 0;
    size_t nt = 0;
    bool all_decode = true; /* no prompt in this batch: step kernels, as the target's verification */
    for (int i = 0; i < n; i++) {
        if (p->want[i] > 0) nt += n_hist[i] - p->seen[slots[i]];
    }
    if (spec_pool_tokens(p, nt > (size_t)n ? nt : (size_t)n, err) != 0) return -1;
    nt = 0;
    for (int i = 0; i < n; i++) {
        int s = slots[i];
        if (p->want[i] == 0 || p->seen[s] == n_hist[i]) continue;
        uint32_t m = (uint32_t)(n_hist[i] - p->seen[s]);
        all_decode &= p->seen[s] > 0;
        memcpy(p->btok + nt, hist[i] + p->seen[s], m * sizeof *p->btok);
        nt += m;
        p->brow[nb] = (int32_t)nt - 1;
        p->bseq[nb] = &p->st[s];
        p->bn[nb++] = m;
    }
    if (nb > 0) {
        if (spec_pool_run(p, nb, true, all_decode, &lg, err) != 0) return -1;
        int j = 0;
        for (int i = 0; i < n; i++) {
            int s = slots[i];
            if (p->want[i] == 0 || p->seen[s] == n_hist[i]) continue;
            p->first[s] = spec_argmax(lg + (size_t)j++ * V, V);
            p->seen[s] = n_hist[i];
            if (k3_state_snapshot(&p->st[s], &p->snap[s], err) != 0) {
                p->seen[s] = 0; /* unknown now: start this slot over next time */
                k3_state_reset(&p->st[s]);
                free(lg);
                return -1;
            }
        }
        free(lg);
    }
    for (int i = 0; i < n; i++) {
        if (p->want[i] == 0) continue;
        drafts[(size_t)i * (size_t)stride] = p->first[slots[i]];
        n_out[i] = 1;
    }

    /* 2. Draft: one batch per token over every sequence that wants more. */
    int rc = 0;
    for (int t = 1; t < kmax && rc == 0; t++) {
        int mb = 0;
        for (int i = 0; i < n; i++) {
            if (p->want[i] <= t) continue;
            p->bseq[mb] = &p->st[slots[i]];
            p->bn[mb] = 1;
            p->btok[mb] = drafts[(size_t)i * (size_t)stride + t - 1];
            p->brow[mb] = mb;
            mb++;
        }
        if (spec_pool_run(p, mb, true, true, &lg, err) != 0) {
            rc = -1;
            break;
        }
        for (int i = 0, j = 0; i < n; i++) {
            if (p->want[i] <= t) continue;
            drafts[(size_t)i * (size_t)stride + t] = spec_argmax(lg + (size_t)j++ * V, V);
            n_out[i] = t + 1;
        }
        free(lg);
    }

    /* 3. Back to the committed tokens. */
    for (int i = 0; i < n; i++) {
        int s = slots[i];
        if (p->want[i] == 0) continue;
        rl_err e2;
        if (k3_state_restore(&p->st[s], &p->snap[s], &e2) != 0) { /* cannot happen: same state, same sizes */
            k3_state_reset(&p->st[s]);
            p->seen[s] = 0;
        }
    }
    if (rc != 0) {
        for (int i = 0; i < n; i++) n_out[i] = 0;
    }
    return rc;
}
