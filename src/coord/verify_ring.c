#include "verify_ring.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../gen/emit.h"
#include "coord_int.h"

/* Appends n rows of taps (token-major, as ring_collect returns them) to r->feat. */
static int ring_keep_taps(spec_ring *r, const float *rows, uint32_t n, rl_err *err) {
    size_t row = (size_t)r->rc->o.n_taps * r->rc->hp.n_embd;
    float *at = spec_feat_grow(&r->feat, &r->n_feat, &r->cap_feat, row, n, err);
    if (!at) return -1;
    memcpy(at, rows, (size_t)n * row * sizeof *rows);
    return 0;
}

static int ring_hist_push(spec_ring *r, const int32_t *t, size_t n, rl_err *err) {
    if (r->n_hist + n > r->cap_hist) {
        size_t cap = (r->n_hist + n) * 2 + 64;
        int32_t *nh = realloc(r->hist, cap * sizeof *nh);
        if (!nh) return rl_errf(err, "out of memory for the sequence's tokens");
        r->hist = nh;
        r->cap_hist = cap;
    }
    memcpy(r->hist + r->n_hist, t, n * sizeof *t);
    r->n_hist += n;
    return 0;
}

static int ring_prefill(spec_ring *r, const int32_t *prompt, size_t n, const smp_params *sp, int32_t *first,
                        rl_err *err);

static int ring_begin(void *ctx, const int32_t *prompt, size_t n, const smp_params *sp, int32_t *first, rl_err *err) {
    spec_ring *r = ctx;
    r->sp = sp;
    r->n_hist = 0;
    r->n_prompt = n;
    if (ring_hist_push(r, prompt, n, err) != 0) return -1;
    int rc = ring_prefill(r, prompt, n, sp, first, err);
    /* Nothing generated yet: on a lost node, the prompt again from the start on a re-formed ring. */
    while (rc != 0 && !gen_sigint_pending() && r->recoveries < 4 && ring_reform(r->rc, r->ex, err) == 0) {
        r->recoveries++;
        r->gen++;
        rc = ring_prefill(r, prompt, n, sp, first, err);
    }
    if (rc == 0) rc = ring_hist_push(r, first, 1, err);
    return rc;
}

static int ring_prefill(spec_ring *r, const int32_t *prompt, size_t n, const smp_params *sp, int32_t *first,
                        rl_err *err) {
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
                                .flags = (first ? FRAME_SEQ_NEW : 0) | (bias ? FRAME_SEQ_HAS_BIAS : 0) |
                                         (lastc ? 0 : FRAME_SEQ_NO_SAMPLE) | (r->taps ? FRAME_SEQ_TAPS : 0),
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

/* Sends flight f (its tokens and q kept in it) on the current ring. */
static int ring_send_flight(spec_ring *r, struct spec_ring_flight *f, rl_err *err) {
    ring_seq_req *rq = &f->rq;
    rq->seq_id = r->seq;
    rq->smp = r->smp;
    rq->tokens = f->tokens; /* copied by ring_submit */
    rq->q = f->q;
    rq->q_len = f->q_len;
    rq->taps = NULL;
    f->gen = r->gen;
    f->failed = false;
    int rc = ring_submit(r->rc, rq, 1, &f->step, err);
    rq->tokens = NULL;
    rq->q = NULL;
    return rc;
}

static int ring_submit_block(void *ctx, uint32_t pos, const int32_t *tokens, int n, const spec_q *qs, rl_err *err) {
    spec_ring *r = ctx;
    if (r->n_fl == SPEC_MAX_DEPTH) return rl_errf(err, "%d blocks already in flight", r->n_fl);
    if (n < 1 || n > SPEC_MAX_DRAFT + 1) return rl_errf(err, "a block of %d tokens", n);
    struct spec_ring_flight *f = &r->fl[r->n_fl];
    memset(f, 0, sizeof *f);
    /* Drafts' distributions, packed as the last stage expects them: per draft, n then (id, p) pairs. */
    size_t ql = 0;
    for (int d = 0; qs && d < n - 1; d++) {
        uint32_t cnt = (uint32_t)qs[d].n;
        if (ql + 4 + (size_t)cnt * 8 > sizeof f->q) return rl_errf(err, "draft distributions too large");
        memcpy(f->q + ql, &cnt, 4);
        ql += 4;
        for (uint32_t c = 0; c < cnt; c++) {
            memcpy(f->q + ql, &qs[d].id[c], 4);
            memcpy(f->q + ql + 4, &qs[d].p[c], 4);
            ql += 8;
        }
    }
    f->q_len = ql;
    memcpy(f->tokens, tokens, (size_t)n * sizeof *tokens);
    ring_seq_req *rq = &f->rq;
    rq->pos = pos;
    rq->n = (uint32_t)n;
    rq->flags = FRAME_SEQ_VERIFY | (qs ? FRAME_SEQ_HAS_Q : 0) | (r->taps ? FRAME_SEQ_TAPS : 0);
    r->n_fl++;
    /* A failed send is kept as a failed flight: its collect re-forms the ring (a block is never lost). */
    rl_err e2;
    if (r->broken || ring_send_flight(r, f, &e2) != 0) {
        f->failed = true;
        snprintf(f->msg, sizeof f->msg, "%s", r->broken ? r->broken_msg : e2.msg);
    }
    return 0;
}

/* The ring failed (err) under the block the sequence needs next (it starts at its last committed output,
 * hist[n_hist - 1]): re-form the ring over the nodes the failure did not name and
 * rebuild the sequence - the prompt as a prefill, then every output up to that one with step kernels, the
 * last stage's sampler taking them as its output again (FRAME_SEQ_RESUME) and sampling the next one, which
 * is this block's only committed token (its drafts are dropped). */
static int ring_recover(spec_ring *r, int32_t *out, int *n_out, rl_err *err) {
    const size_t pos = r->n_hist - 1;
    while (!gen_sigint_pending() && r->recoveries < 4 && ring_reform(r->rc, r->ex, err) == 0) {
        r->recoveries++;
        r->gen++;
        r->broken = false;
        r->seq = r->rc->next_seq++;
        const smp_params *sp = r->sp;
        bool bias = sp->n_bias > 0;
        ring_seq_req r0 = {.seq_id = r->seq, .pos = 0, .n = (uint32_t)r->n_prompt, .tokens = r->hist, .smp = r->smp,
                           .flags = FRAME_SEQ_NEW | FRAME_SEQ_NO_SAMPLE | (bias ? FRAME_SEQ_HAS_BIAS : 0),
                           .bias = bias ? sp->bias : NULL, .n_bias = bias ? (uint32_t)sp->n_bias : 0};
        const uint32_t n_gen = (uint32_t)(pos + 1 - r->n_prompt);
        ring_seq_req rq = {.seq_id = r->seq, .pos = (uint32_t)r->n_prompt, .n = n_gen, .tokens = r->hist + r->n_prompt,
                           .smp = r->smp, .flags = FRAME_SEQ_RESUME | FRAME_SEQ_STEP | (r->taps ? FRAME_SEQ_TAPS : 0),
                           .gen_start = 0};
        uint64_t s0, s1;
        int rc = ring_submit(r->rc, &r0, 1, &s0, err);
        if (rc == 0) rc = ring_submit(r->rc, &rq, 1, &s1, err);
        if (rc == 0) rc = ring_collect(r->rc, s0, &r0, 1, err);
        if (rc == 0) rc = ring_collect(r->rc, s1, &rq, 1, err);
        free(r0.taps);
        r->n_feat = 0;
        /* DSpark: the committed position's row, the last of the replay (as a verified block's, step kernels) */
        if (rc == 0 && r->taps) {
            const size_t row = (size_t)r->rc->o.n_taps * r->rc->hp.n_embd;
            rc = ring_keep_taps(r, rq.taps + (size_t)(n_gen - 1) * row, 1, err);
        }
        free(rq.taps);
        if (rc != 0) continue; /* err names what failed: the next re-form leaves it out */
        out[0] = rq.token;
        *n_out = 1;
        return 0;
    }
    return -1;
}

static int ring_collect_block(void *ctx, int32_t *out, int *n_out, rl_err *err) {
    spec_ring *r = ctx;
    if (r->n_fl == 0) return rl_errf(err, "no block in flight");
    struct spec_ring_flight f = r->fl[0];
    memmove(r->fl, r->fl + 1, (size_t)(--r->n_fl) * sizeof *r->fl);
    ring_seq_req *rq = &f.rq;
    /* The block the sequence needs next: it starts at the last committed output. Any other was drafted
     * assuming more than was accepted (the speculative loop discards its result). */
    const bool needed = r->n_hist > 0 && rq->pos == r->n_hist - 1 && f.tokens[0] == r->hist[r->n_hist - 1];
    if (needed && !f.failed && !r->broken && f.gen != r->gen) {
        /* Sent on a ring since re-formed: it is not there; send it again on this one. */
        rl_err e2;
        if (ring_send_flight(r, &f, &e2) != 0) {
            f.failed = true;
            snprintf(f.msg, sizeof f.msg, "%s", e2.msg);
        }
    }
    if (!needed && (f.failed || r->broken || f.gen != r->gen)) {
        *n_out = 0; /* stale, and not on this ring: nothing to collect */
        return 0;
    }
    if (r->dead) return rl_errf(err, "%s", r->broken_msg); /* recovery gave up: the ring is closed */
    int rc = 0;
    if (f.failed || r->broken) {
        rc = rl_errf(err, "%s", f.failed ? f.msg : r->broken_msg);
    } else {
        rc = ring_collect(r->rc, f.step, rq, 1, err);
        if (rc == 0 && (rq->token < 0 || rq->token > (int)rq->n)) {
            rc = rl_errf(err, "the last stage committed %d tokens of a %u-token block", rq->token, rq->n);
        }
    }
    r->n_feat = 0; /* only the committed positions' rows are the sequence's */
    if (rc == 0 && r->taps && rq->token > 0) rc = ring_keep_taps(r, rq->taps, (uint32_t)rq->token, err);
    free(rq->taps);
    rq->taps = NULL;
    if (rc != 0 && r->rc->zctx && ring_aborted(r->rc)) return -1;
    if (rc != 0) {
        if (!needed) { /* the ring failed under a stale block: re-form it when the needed one comes */
            r->broken = true;
            snprintf(r->broken_msg, sizeof r->broken_msg, "%s", err->msg);
            *n_out = 0;
            return 0;
        }
        if (ring_recover(r, out, n_out, err) != 0) {
            r->dead = true; /* no ring to collect anything from: what is still in flight is dropped */
            snprintf(r->broken_msg, sizeof r->broken_msg, "%s", err->msg);
            return -1;
        }
    } else {
        memcpy(out, rq->committed, (size_t)rq->token * sizeof *out);
        *n_out = rq->token;
    }
    if (needed && *n_out > 0 && ring_hist_push(r, out, (size_t)*n_out, err) != 0) return -1;
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
    /* After a failure: what is still in flight is collected and dropped where the ring still has it. */
    for (int i = 0; i < r->n_fl; i++) {
        struct spec_ring_flight *f = &r->fl[i];
        if (r->dead || r->broken || f->failed || f->gen != r->gen || !r->rc->zctx) continue;
        if (ring_collect(r->rc, f->step, &f->rq, 1, &e) != 0) r->broken = true;
        free(f->rq.taps);
        f->rq.taps = NULL;
    }
    r->n_fl = 0;
    if (r->rc->zctx) ring_free_seqs(r->rc, &r->seq, 1, &e);
    free(r->feat);
    r->feat = NULL;
    r->n_feat = r->cap_feat = 0;
    free(r->hist);
    r->hist = NULL;
    r->n_hist = r->cap_hist = 0;
}

spec_verifier spec_verifier_ring(spec_ring *r) {
    return (spec_verifier){.ctx = r, .begin = ring_begin, .verify = ring_verify, .end = ring_end,
                           .set_taps = ring_set_taps, .features = ring_features, .submit = ring_submit_block,
                           .collect = ring_collect_block};
}
