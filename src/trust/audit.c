#include "audit.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../model/k3_boundary.h"
#include "../exec/stage.h"

/* Where sequence seq_id is in a frame: its index, its first token's offset, the frame's token count. */
static int audit_find(const rf_header *h, uint64_t seq_id, uint32_t *off, uint64_t *total) {
    int idx = -1;
    uint64_t t = 0;
    for (uint32_t i = 0; i < h->n_seqs; i++) {
        if (h->seqs[i].seq_id == seq_id && idx < 0) idx = (int)i, *off = (uint32_t)t;
        t += h->seqs[i].n_tokens;
    }
    *total = t;
    return idx;
}

/* The wire dtype of an encoded boundary state (its header's last field). */
static int audit_dtype(const uint8_t *buf, size_t len) {
    uint32_t dt = 0;
    if (len >= 24) memcpy(&dt, buf + 20, 4);
    return (int)dt;
}

/* Rows [off, off + n) of a boundary state, as a new one (h and the checkpoints of those tokens). */
static int audit_rows(const k3_boundary *b, uint32_t off, uint32_t n, k3_boundary *o, rl_err *err) {
    if (off + n > b->n_tokens) return rl_errf(err, "boundary state of %u tokens has no rows [%u, %u)", b->n_tokens, off, off + n);
    if (k3_boundary_alloc(o, n, b->n_embd, b->n_ckpt, err) != 0) return -1;
    memcpy(o->h, b->h + (size_t)off * b->n_embd, (size_t)n * b->n_embd * sizeof *o->h);
    if (b->n_ckpt) {
        size_t per = (size_t)b->n_ckpt * b->n_embd;
        memcpy(o->ckpt, b->ckpt + off * per, n * per * sizeof *o->ckpt);
    }
    return 0;
}

/* The share of the drafts' distributions part that belongs to sequence idx (frame.h: per VERIFY sequence
 * with RF_SEQ_HAS_Q, per draft, u32 n then n x (i32, f32)). */
static int audit_q_share(const rf_header *h, int idx, const uint8_t *q, size_t q_len, const uint8_t **s, size_t *sl) {
    const uint8_t *p = q, *end = q ? q + q_len : NULL;
    *s = NULL;
    *sl = 0;
    for (int i = 0; i <= idx; i++) {
        const rf_seq *sq = &h->seqs[i];
        if (!(sq->flags & RF_SEQ_VERIFY) || !(sq->flags & RF_SEQ_HAS_Q)) continue;
        const uint8_t *start = p;
        for (uint32_t d = 0; d + 1 < sq->n_tokens; d++) {
            uint32_t cnt;
            if (!p || end - p < 4) return -1;
            memcpy(&cnt, p, 4);
            if (cnt > 64 || (size_t)(end - p - 4) < (size_t)cnt * 8) return -1;
            p += 4 + (size_t)cnt * 8;
        }
        if (i == idx) *s = start, *sl = (size_t)(p - start);
    }
    return 0;
}

/* Largest difference between two vectors relative to the reference's largest magnitude. */
static double audit_rel(const float *x, const float *ref, size_t n) {
    double mx = 0, d = 0;
    for (size_t i = 0; i < n; i++) {
        mx = fmax(mx, fabs(ref[i]));
        double e = fabs((double)x[i] - ref[i]);
        if (!(e <= d)) d = e; /* NaN counts as a difference */
    }
    return isnan(d) ? INFINITY : d / (mx > 1e-30 ? mx : 1e-30);
}

/* A frame's RESULT share for sequence idx: its int32, its logits (RF_SEQ_ALL_LOGITS), its committed
 * tokens (RF_SEQ_VERIFY). */
typedef struct audit_result {
    int32_t tok;
    const float *logits;
    size_t n_logits;
    const int32_t *comm;
    int n_comm;
} audit_result;

static int audit_result_share(const rf_header *h, int idx, uint32_t n_vocab, const uint8_t *buf, size_t len,
                              audit_result *r) {
    size_t head = (size_t)h->n_seqs * 4;
    if (len < head) return -1;
    size_t lo = head, co;
    for (uint32_t i = 0; i < h->n_seqs; i++) {
        if (!(h->seqs[i].flags & RF_SEQ_ALL_LOGITS)) continue;
        size_t nl = (size_t)h->seqs[i].n_tokens * n_vocab;
        if ((int)i == idx) r->logits = (const float *)(buf + lo), r->n_logits = nl;
        lo += nl * 4;
    }
    co = lo;
    if (lo > len) return -1;
    memcpy(&r->tok, buf + (size_t)idx * 4, 4);
    for (uint32_t i = 0; i < h->n_seqs; i++) {
        if (!(h->seqs[i].flags & RF_SEQ_VERIFY)) continue;
        int32_t c;
        memcpy(&c, buf + i * 4, 4);
        if (c < 0 || c > STAGE_BLOCK_MAX || co + (size_t)c * 4 > len) return -1;
        if ((int)i == idx) r->comm = (const int32_t *)(buf + co), r->n_comm = c;
        co += (size_t)c * 4;
    }
    return 0;
}

/* Compares the node's output share of frame f with ours (the output of the one-sequence frame). */
static int audit_compare(const k3_engine *e, const audit_frame *f, int idx, uint32_t off, uint64_t total,
                         const rf_header *sub, const uint8_t *ours, size_t ours_len, double tol, audit_report *rep,
                         rl_err *err) {
    const rf_seq *sq = &f->h->seqs[idx];
    bool last = e->b == e->hp.n_layer;
    if (!last) {
        if (f->out_len < total * 4 || memcmp(f->out + (size_t)off * 4, ours, (size_t)sq->n_tokens * 4) != 0) {
            return snprintf(rep->what, sizeof rep->what, "the token ids it passed on differ"), 1;
        }
        k3_boundary theirs = {0}, mine = {0};
        if (k3_boundary_decode(&theirs, f->out + total * 4, f->out_len - total * 4, (uint32_t)total, e->hp.n_embd,
                               err) != 0) {
            return snprintf(rep->what, sizeof rep->what, "the boundary state it sent is malformed: %s", err->msg), 1;
        }
        int r = 0;
        if (k3_boundary_decode(&mine, ours + (size_t)sq->n_tokens * 4, ours_len - (size_t)sq->n_tokens * 4,
                               sq->n_tokens, e->hp.n_embd, err) != 0) {
            r = -1;
        } else if (theirs.n_ckpt != mine.n_ckpt) {
            snprintf(rep->what, sizeof rep->what, "its boundary state banks %u checkpoints, the layers bank %u",
                     theirs.n_ckpt, mine.n_ckpt);
            r = 1;
        } else {
            for (uint32_t t = 0; t < sq->n_tokens; t++) {
                size_t nc = (size_t)mine.n_ckpt * mine.n_embd;
                double dh = audit_rel(theirs.h + (size_t)(off + t) * mine.n_embd, mine.h + (size_t)t * mine.n_embd,
                                      mine.n_embd);
                double dc = nc ? audit_rel(theirs.ckpt + (off + t) * nc, mine.ckpt + t * nc, nc) : 0;
                double d = fmax(dh, dc);
                rep->max_diff = fmax(rep->max_diff, d);
                if (d > tol && !r) {
                    snprintf(rep->what, sizeof rep->what,
                             "position %u: the boundary state it sent differs from the recomputed one by %.3g "
                             "(relative; tolerance %.3g)", sq->pos + t, d, tol);
                    r = 1;
                }
            }
        }
        k3_boundary_free(&theirs);
        k3_boundary_free(&mine);
        return r;
    }
    audit_result th = {0}, mi = {0};
    if (audit_result_share(f->h, idx, e->hp.n_vocab, f->out, f->out_len, &th) != 0) {
        return snprintf(rep->what, sizeof rep->what, "the result it returned is malformed"), 1;
    }
    if (audit_result_share(sub, 0, e->hp.n_vocab, ours, ours_len, &mi) != 0) return rl_errf(err, "audit: bad own result");
    if (th.n_logits != mi.n_logits) return snprintf(rep->what, sizeof rep->what, "it returned other logits rows"), 1;
    if (th.n_logits) {
        float *tl = malloc(th.n_logits * sizeof *tl); /* the frame's bytes need not be aligned */
        if (!tl) return rl_errf(err, "out of memory");
        memcpy(tl, th.logits, th.n_logits * sizeof *tl);
        double d = audit_rel(tl, mi.logits, mi.n_logits);
        free(tl);
        rep->max_diff = fmax(rep->max_diff, d);
        if (d > tol) {
            return snprintf(rep->what, sizeof rep->what,
                            "position %u: the logits it returned differ from the recomputed ones by %.3g (relative; "
                            "tolerance %.3g)", sq->pos, d, tol), 1;
        }
    }
    if (th.tok != mi.tok) {
        return snprintf(rep->what, sizeof rep->what, "position %u: it returned %s %d, the model gives %d",
                        sq->pos + sq->n_tokens - 1, (sq->flags & RF_SEQ_VERIFY) ? "a committed count of" : "token",
                        th.tok, mi.tok), 1;
    }
    if (th.n_comm != mi.n_comm || (mi.n_comm && memcmp(th.comm, mi.comm, (size_t)mi.n_comm * 4) != 0)) {
        return snprintf(rep->what, sizeof rep->what, "position %u: the drafted tokens it accepted differ", sq->pos), 1;
    }
    return 0;
}

int audit_replay_seq(k3_engine *e, uint32_t n_ctx, int wire, uint64_t seq_id, const audit_frame *frames, int n,
                     double tol, audit_report *rep, rl_err *err) {
    memset(rep, 0, sizeof *rep);
    rep->match = true;
    rep->bad_frame = -1;
    ring_stage *st = calloc(1, sizeof *st);
    rf_header *sub = calloc(1, sizeof *sub);
    if (!st || !sub) {
        free(st), free(sub);
        return rl_errf(err, "out of memory");
    }
    stage_init(st, e, n_ctx, wire);
    int rc = 0;
    bool started = false;
    for (int fi = 0; fi < n && rep->match && rc == 0; fi++) {
        const audit_frame *f = &frames[fi];
        uint32_t off = 0;
        uint64_t total = 0;
        int idx = audit_find(f->h, seq_id, &off, &total);
        if (idx < 0) continue;
        const rf_seq *sq = &f->h->seqs[idx];
        if (!started && !(sq->flags & RF_SEQ_NEW)) {
            rc = rl_errf(err, "audit of sequence %" PRIu64 ": its first kept frame (step %" PRIu64 ") does not start it",
                         seq_id, f->h->step_id);
            break;
        }
        started = true;
        if (f->in_len < total * 4 || f->in_len != f->h->payload_bytes) {
            rc = rl_errf(err, "audit: step %" PRIu64 "'s kept input is %zu bytes, not its frame's", f->h->step_id, f->in_len);
            break;
        }
        /* The one-sequence frame: its tokens, then its rows of the boundary state (same dtype as received). */
        *sub = *f->h;
        sub->n_seqs = 1;
        sub->seqs[0] = *sq;
        k3_boundary whole = {0}, part = {0};
        size_t blen = 0;
        int dt = 0;
        if (e->a > 0) {
            dt = audit_dtype(f->in + total * 4, f->in_len - total * 4);
            if (k3_boundary_decode(&whole, f->in + total * 4, f->in_len - total * 4, (uint32_t)total, e->hp.n_embd,
                                   err) != 0 ||
                audit_rows(&whole, off, sq->n_tokens, &part, err) != 0) {
                k3_boundary_free(&whole);
                rc = -1;
                break;
            }
            blen = k3_boundary_wire_size(&part, (enum k3_wire_dtype)dt);
        }
        size_t in_len = (size_t)sq->n_tokens * 4 + blen;
        uint8_t *in = malloc(in_len + 1);
        if (!in) {
            k3_boundary_free(&whole), k3_boundary_free(&part);
            rc = rl_errf(err, "out of memory");
            break;
        }
        memcpy(in, f->in + (size_t)off * 4, (size_t)sq->n_tokens * 4);
        if (e->a > 0) k3_boundary_encode(&part, (enum k3_wire_dtype)dt, in + (size_t)sq->n_tokens * 4);
        k3_boundary_free(&whole);
        k3_boundary_free(&part);
        sub->payload_bytes = in_len;
        const uint8_t *qs = NULL;
        size_t ql = 0;
        if (audit_q_share(f->h, idx, f->q, f->q_len, &qs, &ql) != 0) {
            free(in);
            rc = rl_errf(err, "audit: step %" PRIu64 "'s drafts' distributions are malformed", f->h->step_id);
            break;
        }
        uint8_t *ours = NULL;
        size_t ours_len = 0;
        if (stage_run(st, sub, in, in_len, qs, ql, &ours, &ours_len, err) != 0) {
            free(in);
            rc = rl_errf(err, "audit: step %" PRIu64 " cannot be recomputed: %s", f->h->step_id, err->msg);
            break;
        }
        free(in);
        int c = audit_compare(e, f, idx, off, total, sub, ours, ours_len, tol, rep, err);
        free(ours);
        if (c < 0) {
            rc = -1;
        } else if (c > 0) {
            rep->match = false;
            rep->bad_frame = fi;
        }
        rep->frames++;
        rep->tokens += sq->n_tokens;
    }
    if (rc == 0 && !started) rc = rl_errf(err, "audit: no kept frame has sequence %" PRIu64, seq_id);
    stage_free(st);
    free(st);
    free(sub);
    return rc;
}

/* ---- which sequences, which stage ---------------------------------------------------------------- */

static double audit_draw(audit_draws *d) {
    uint64_t z = (d->rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) / 9007199254740992.0;
}

void audit_draws_init(audit_draws *d, uint64_t seed) {
    memset(d, 0, sizeof *d);
    d->rng = seed ^ 0x6a09e667f3bcc908ull;
}

int audit_draws_finished(audit_draws *d, double rate, const uint64_t *ids, int n) {
    int skipped = 0;
    for (int i = 0; rate > 0 && i < n; i++) {
        if (audit_draw(d) >= rate) continue;
        if (d->n < (int)(sizeof d->queue / sizeof d->queue[0])) d->queue[d->n++] = ids[i];
        else skipped++;
    }
    return skipped;
}

bool audit_draws_next(audit_draws *d, int n_stages, uint64_t *seq, int *stage) {
    if (d->n == 0) return false;
    *seq = d->queue[0];
    memmove(d->queue, d->queue + 1, (size_t)--d->n * sizeof d->queue[0]);
    *stage = (int)(audit_draw(d) * n_stages);
    if (*stage >= n_stages) *stage = n_stages - 1;
    return true;
}
