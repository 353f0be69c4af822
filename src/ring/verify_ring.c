#include "verify_ring.h"

#include <stdlib.h>
#include <string.h>

/* Appends n rows of taps (token-major, as ring_collect returns them) to r->feat. */
static int ring_keep_taps(spec_ring *r, const float *rows, uint32_t n, rl_err *err) {
    size_t row = (size_t)r->rc->o.n_taps * r->rc->hp.n_embd;
    float *at = spec_feat_grow(&r->feat, &r->n_feat, &r->cap_feat, row, n, err);
    if (!at) return -1;
    memcpy(at, rows, (size_t)n * row * sizeof *rows);
    return 0;
}

static int ring_begin(void *ctx, const int32_t *prompt, size_t n, const smp_params *sp, int32_t *first, rl_err *err) {
    spec_ring *r = ctx;
    r->seq = r->rc->next_seq++;
    r->smp = ring_sampling(sp);
    uint32_t chunk = r->chunk ? r->chunk : (uint32_t)n;
    /* Pipelined prefill: submit every chunk, then collect in order (at most 32 in flight). */
    ring_seq_req rq[32];
    uint64_t steps[32];
    size_t sent = 0, got = 0, i_next = 0;
    uint32_t pos = 0;
    r->n_feat = 0;
    while (i_next < n || got < sent) {
        while (i_next < n && sent - got < 32) {
            uint32_t c = (uint32_t)(n - i_next < chunk ? n - i_next : chunk);
            bool lastc = i_next + c == n;
            ring_seq_req *q = &rq[sent % 32];
            memset(q, 0, sizeof *q);
            bool first = i_next == 0, bias = first && sp->n_bias > 0;
            *q = (ring_seq_req){.seq_id = r->seq, .pos = pos, .n = c, .tokens = prompt + i_next, .smp = r->smp,
                                .flags = (first ? RF_SEQ_NEW : 0) | (bias ? RF_SEQ_HAS_BIAS : 0) |
                                         (lastc ? 0 : RF_SEQ_NO_SAMPLE) | (r->taps ? RF_SEQ_TAPS : 0),
                                .bias = bias ? sp->bias : NULL, .n_bias = bias ? (uint32_t)sp->n_bias : 0};
            if (ring_submit(r->rc, q, 1, &steps[sent % 32], err) != 0) return -1;
            pos += c;
            i_next += c;
            sent++;
        }
        ring_seq_req *q = &rq[got % 32];
        int rc = ring_collect(r->rc, steps[got % 32], q, 1, err);
        if (rc == 0 && r->taps) rc = ring_keep_taps(r, q->taps, q->n, err);
        free(q->taps);
        if (rc != 0) return -1;
        *first = q->token;
        got++;
    }
    return 0;
}

static int ring_submit_block(void *ctx, uint32_t pos, const int32_t *tokens, int n, const spec_q *qs, rl_err *err) {
    spec_ring *r = ctx;
    if (r->n_fl == SPEC_MAX_DEPTH) return rl_errf(err, "%d blocks already in flight", r->n_fl);
    /* Drafts' distributions, packed as the last stage expects them: per draft, n then (id, p) pairs. */
    uint8_t qbuf[SPEC_MAX_DRAFT * (4 + 64 * 8)];
    size_t ql = 0;
    for (int d = 0; qs && d < n - 1; d++) {
        uint32_t cnt = (uint32_t)qs[d].n;
        memcpy(qbuf + ql, &cnt, 4);
        ql += 4;
        for (uint32_t c = 0; c < cnt; c++) {
            memcpy(qbuf + ql, &qs[d].id[c], 4);
            memcpy(qbuf + ql + 4, &qs[d].p[c], 4);
            ql += 8;
        }
    }
    struct spec_ring_flight *f = &r->fl[r->n_fl];
    memset(f, 0, sizeof *f);
    ring_seq_req *rq = &f->rq;
    rq->seq_id = r->seq;
    rq->pos = pos;
    rq->n = (uint32_t)n;
    rq->tokens = tokens; /* copied by ring_submit */
    rq->smp = r->smp;
    rq->flags = RF_SEQ_VERIFY | (qs ? RF_SEQ_HAS_Q : 0) | (r->taps ? RF_SEQ_TAPS : 0);
    rq->q = qbuf;
    rq->q_len = ql;
    if (ring_submit(r->rc, rq, 1, &f->step, err) != 0) return -1;
    rq->tokens = NULL;
    rq->q = NULL;
    r->n_fl++;
    return 0;
}

static int ring_collect_block(void *ctx, int32_t *out, int *n_out, rl_err *err) {
    spec_ring *r = ctx;
    if (r->n_fl == 0) return rl_errf(err, "no block in flight");
    struct spec_ring_flight f = r->fl[0];
    memmove(r->fl, r->fl + 1, (size_t)(--r->n_fl) * sizeof *r->fl);
    ring_seq_req *rq = &f.rq;
    int rc = ring_collect(r->rc, f.step, rq, 1, err);
    if (rc == 0 && (rq->token < 0 || rq->token > (int)rq->n)) {
        rc = rl_errf(err, "the last stage committed %d tokens of a %u-token block", rq->token, rq->n);
    }
    r->n_feat = 0; /* only the committed positions' rows are the sequence's */
    if (rc == 0 && r->taps && rq->token > 0) rc = ring_keep_taps(r, rq->taps, (uint32_t)rq->token, err);
    free(rq->taps);
    if (rc != 0) return -1;
    memcpy(out, rq->committed, (size_t)rq->token * sizeof *out);
    *n_out = rq->token;
    return 0;
}

static int ring_verify(void *ctx, uint32_t pos, const int32_t *tokens, int n, const spec_q *qs, int32_t *out,
                       int *n_out, rl_err *err) {
    spec_ring *r = ctx;
    if (r->n_fl != 0) return rl_errf(err, "verify with blocks in flight");
    if (ring_submit_block(ctx, pos, tokens, n, qs, err) != 0 || ring_collect_block(ctx, out, n_out, err) != 0) return -1;
    if (*n_out < 1) return rl_errf(err, "the last stage found a block stale with none before it");
    return 0;
}

static int ring_set_taps(void *ctx, const uint32_t *layers, int n, rl_err *err) {
    spec_ring *r = ctx;
    if (ring_opts_check_taps(&r->rc->o, layers, n, err) != 0) return -1;
    r->taps = n > 0;
    return 0;
}

static const float *ring_features(void *ctx, uint32_t *n_rows) {
    spec_ring *r = ctx;
    *n_rows = r->n_feat;
    return r->feat;
}

static void ring_end(void *ctx) {
    spec_ring *r = ctx;
    rl_err e;
    while (r->n_fl > 0) { /* after a failure: what is still in flight is dropped */
        int32_t junk[SPEC_MAX_DRAFT + 1];
        int nj;
        if (ring_collect_block(ctx, junk, &nj, &e) != 0) break;
    }
    r->n_fl = 0;
    ring_free_seqs(r->rc, &r->seq, 1, &e);
    free(r->feat);
    r->feat = NULL;
    r->n_feat = r->cap_feat = 0;
}

spec_verifier spec_verifier_ring(spec_ring *r) {
    return (spec_verifier){.ctx = r, .begin = ring_begin, .verify = ring_verify, .end = ring_end,
                           .set_taps = ring_set_taps, .features = ring_features, .submit = ring_submit_block,
                           .collect = ring_collect_block};
}
