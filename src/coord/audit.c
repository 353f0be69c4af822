#include "audit.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../model/k3_boundary.h"
#include "../exec/stage.h"

/* Where sequence seq_id is in a frame: its index, its first token's offset, the frame's token count. */
static int audit_find(const frame_header *h, uint64_t seq_id, uint32_t *off, uint64_t *total) {
    int idx = -1;
    uint64_t t = 0;
    for (uint32_t i = 0; i < h->n_seqs; i++) {
        if (h->seqs[i].seq_id == seq_id && idx < 0) idx = (int)i, *off = (uint32_t)t;
        t += h->seqs[i].n_tokens;
    }
    *total = t;
    return idx;
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

/* A frame's RESULT share for sequence idx: its int32, its logits (FRAME_SEQ_ALL_LOGITS), its committed
 * tokens (FRAME_SEQ_VERIFY). */
typedef struct audit_result {
    int32_t tok;
    const float *logits;
    size_t n_logits;
    const int32_t *comm;
    int n_comm;
} audit_result;

static int audit_result_share(const frame_header *h, int idx, uint32_t n_vocab, const uint8_t *buf, size_t len,
                              audit_result *r) {
    size_t head = (size_t)h->n_seqs * 4;
    if (len < head) return -1;
    size_t lo = head, co;
    for (uint32_t i = 0; i < h->n_seqs; i++) {
        if (!(h->seqs[i].flags & FRAME_SEQ_ALL_LOGITS)) continue;
        size_t nl = (size_t)h->seqs[i].n_tokens * n_vocab;
        if ((int)i == idx) r->logits = (const float *)(buf + lo), r->n_logits = nl;
        lo += nl * 4;
    }
    co = lo;
    if (lo > len) return -1;
    memcpy(&r->tok, buf + (size_t)idx * 4, 4);
    for (uint32_t i = 0; i < h->n_seqs; i++) {
        if (!(h->seqs[i].flags & FRAME_SEQ_VERIFY)) continue;
        int32_t c;
        memcpy(&c, buf + i * 4, 4);
        if (c < 0 || c > STAGE_BLOCK_MAX || co + (size_t)c * 4 > len) return -1;
        if ((int)i == idx) r->comm = (const int32_t *)(buf + co), r->n_comm = c;
        co += (size_t)c * 4;
    }
    return 0;
}

/* Compares sequence idx's share of the node's output for frame f with the same share of ours (the replay
 * has the frame's layout: the same sequences, tokens and rows). */
static int audit_compare(const k3_engine *e, const audit_frame *f, int idx, uint32_t off, uint64_t total,
                         const uint8_t *ours, size_t ours_len, double tol, audit_report *rep, rl_err *err) {
    const frame_seq *sq = &f->h->seqs[idx];
    bool last = e->b == e->hp.n_layer;
    if (!last) {
        if (f->out_len < total * 4 || ours_len < total * 4 ||
            memcmp(f->out + (size_t)off * 4, ours + (size_t)off * 4, (size_t)sq->n_tokens * 4) != 0) {
            return snprintf(rep->what, sizeof rep->what, "the token ids it passed on differ"), 1;
        }
        k3_boundary theirs = {0}, mine = {0};
        if (k3_boundary_decode(&theirs, f->out + total * 4, f->out_len - total * 4, (uint32_t)total, e->hp.n_embd,
                               err) != 0) {
            return snprintf(rep->what, sizeof rep->what, "the boundary state it sent is malformed: %s", err->msg), 1;
        }
        int r = 0;
        if (k3_boundary_decode(&mine, ours + total * 4, ours_len - total * 4, (uint32_t)total, e->hp.n_embd, err) != 0) {
            r = -1;
        } else if (theirs.n_ckpt != mine.n_ckpt) {
            snprintf(rep->what, sizeof rep->what, "its boundary state banks %u checkpoints, the layers bank %u",
                     theirs.n_ckpt, mine.n_ckpt);
            r = 1;
        } else {
            for (uint32_t t = off; t < off + sq->n_tokens; t++) {
                size_t nc = (size_t)mine.n_ckpt * mine.n_embd;
                double dh = audit_rel(theirs.h + (size_t)t * mine.n_embd, mine.h + (size_t)t * mine.n_embd, mine.n_embd);
                double dc = nc ? audit_rel(theirs.ckpt + t * nc, mine.ckpt + t * nc, nc) : 0;
                double d = fmax(dh, dc);
                rep->max_diff = fmax(rep->max_diff, d);
                if (d > tol && !r) {
                    snprintf(rep->what, sizeof rep->what,
                             "position %u: the boundary state it sent differs from the recomputed one by %.3g "
                             "(relative; tolerance %.3g)", sq->pos + (t - off), d, tol);
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
    if (audit_result_share(f->h, idx, e->hp.n_vocab, ours, ours_len, &mi) != 0) return rl_errf(err, "audit: bad own result");
    if (th.n_logits != mi.n_logits) return snprintf(rep->what, sizeof rep->what, "it returned other logits rows"), 1;
    if (th.n_logits) {
        float *tl = malloc(th.n_logits * sizeof *tl), *ml = malloc(mi.n_logits * sizeof *ml); /* the payloads' bytes need not be aligned */
        if (!tl || !ml) return free(tl), free(ml), rl_errf(err, "out of memory");
        memcpy(tl, th.logits, th.n_logits * sizeof *tl);
        memcpy(ml, mi.logits, mi.n_logits * sizeof *ml);
        double d = audit_rel(tl, ml, mi.n_logits);
        free(tl), free(ml);
        rep->max_diff = fmax(rep->max_diff, d);
        if (d > tol) {
            return snprintf(rep->what, sizeof rep->what,
                            "position %u: the logits it returned differ from the recomputed ones by %.3g (relative; "
                            "tolerance %.3g)", sq->pos, d, tol), 1;
        }
    }
    if (th.tok != mi.tok) {
        return snprintf(rep->what, sizeof rep->what, "position %u: it returned %s %d, the model gives %d",
                        sq->pos + sq->n_tokens - 1, (sq->flags & FRAME_SEQ_VERIFY) ? "a committed count of" : "token",
                        th.tok, mi.tok), 1;
    }
    if (th.n_comm != mi.n_comm || (mi.n_comm && memcmp(th.comm, mi.comm, (size_t)mi.n_comm * 4) != 0)) {
        return snprintf(rep->what, sizeof rep->what, "position %u: the drafted tokens it accepted differ", sq->pos), 1;
    }
    return 0;
}

int audit_replay_seq(k3_engine *e, uint32_t n_ctx, int wire, int n_ckpt, const struct smp_vocab *vocab, uint64_t seq_id,
                     const audit_frame *frames, int n, double tol, audit_report *rep, rl_err *err) {
    memset(rep, 0, sizeof *rep);
    rep->match = true;
    rep->bad_frame = -1;
    ring_stage *st = calloc(1, sizeof *st);
    if (!st) return rl_errf(err, "out of memory");
    stage_init(st, e, n_ctx, 0, wire); /* (states of their own: a group computes what each sequence alone does) */
    st->vocab = vocab;
    st->max_ck = n_ckpt; /* the node's, so that its checkpoints land where they did there (k3_ckpt.h) */
    int rc = 0;
    bool started = false;
    for (int fi = 0; fi < n && rep->match && rc == 0; fi++) {
        const audit_frame *f = &frames[fi];
        uint32_t off = 0;
        uint64_t total = 0;
        int idx = audit_find(f->h, seq_id, &off, &total);
        if (idx < 0) continue;
        const frame_seq *sq = &f->h->seqs[idx];
        if (!started && !(sq->flags & FRAME_SEQ_NEW)) {
            rc = rl_errf(err, "audit of sequence %" PRIu64 ": its first kept frame (step %" PRIu64 ") does not start it",
                         seq_id, f->h->step_id);
            break;
        }
        started = true;
        if (f->in_len < total * 4 || f->in_len != f->h->payload_bytes) {
            rc = rl_errf(err, "audit: step %" PRIu64 "'s kept input is %zu bytes, not its frame's", f->h->step_id, f->in_len);
            break;
        }
        /* The last stage skips a stale VERIFY block (stage.h); which of the other sequences' blocks the
         * node found stale its result says (0 committed): the stand-ins have no history to tell. */
        uint8_t stale[FRAME_MAX_SEQS] = {0};
        bool last = e->b == e->hp.n_layer;
        for (uint32_t k = 0; last && k < f->h->n_seqs; k++) {
            int32_t c = 1;
            if ((f->h->seqs[k].flags & FRAME_SEQ_VERIFY) && f->out_len >= (size_t)(k + 1) * 4) memcpy(&c, f->out + k * 4, 4);
            stale[k] = c == 0;
        }
        /* The kept bytes sit at any offset of the node's answer; a stage reads its tokens as int32. */
        uint8_t *in = malloc(f->in_len + 1);
        if (!in) {
            rc = rl_errf(err, "out of memory");
            break;
        }
        memcpy(in, f->in, f->in_len);
        uint8_t *ours = NULL;
        size_t ours_len = 0;
        int sr = stage_replay(st, f->h, in, f->in_len, f->q, f->q_len, seq_id, last ? stale : NULL, &ours, &ours_len, err);
        free(in);
        if (sr != 0) {
            rc = rl_errf(err, "audit: step %" PRIu64 " cannot be recomputed: %s", f->h->step_id, err->msg);
            break;
        }
        int c = audit_compare(e, f, idx, off, total, ours, ours_len, tol, rep, err);
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
