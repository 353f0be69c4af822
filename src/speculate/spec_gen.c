#include "spec_gen.h"
#include "../base/clock.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../gen/emit.h"

/* Hands the drafter the target's features of the `want` positions just committed. */
static int spec_push_features(spec_verifier *v, spec_drafter *d, int n_taps, uint32_t want, rl_err *err) {
    if (n_taps == 0) return 0;
    uint32_t n = 0;
    const float *rows = v->features(v->ctx, &n);
    if (n != want) return rl_errf(err, "the verifier returned features of %u positions, %u were committed", n, want);
    return spec_drafter_features(d, rows, n, err);
}

/* Blocks sent ahead (pipelining) pay only while the chain they assume is likely: a block is run on what every
 * block in flight before it drafted, their bonus-token guesses included, so it is useful with the probability
 * that all of those are wholly accepted: alpha^(drafts + 1) per block. Another block is sent behind while that
 * chance stays at least SPEC_AHEAD_MIN (a stale block still costs every stage but the last its compute), up to
 * the depth the stages keep rollback copies for. With a slow link and a draft that agrees the chain runs deep
 * (up to SPEC_MAX_DEPTH); with a draft that rarely agrees no block goes ahead at all. */
#define SPEC_AHEAD_MIN 0.25

static double spec_chain(double alpha, int n_drafts) { return pow(alpha, n_drafts + 1); }

/* The draft length with the most committed tokens per second: a block of k drafts, each accepted with
 * probability alpha once the ones before it were, commits (1 - alpha^(k+1)) / (1 - alpha) tokens on average;
 * it costs a traversal plus k draft steps, or with blocks in flight (deff on average), whichever of a
 * traversal's share and the drafting is longer (drafting then overlaps the traversals).
 *
 * The traversal's cost depends on the block: t_step (a plain step's traversal, measured) plus t_tok per draft
 * it carries (measured: on a CPU every verified token is another token's compute, on a GPU almost nothing).
 * Where t_step is known, k = 0 (a plain step, 1 token per t_step) competes too: the result 0 says drafting
 * does not pay here now. Where it is not (no plain step measured yet), the traversal is priced at t_trav,
 * whatever the block, and k >= 1. */
int spec_len_pick(double alpha, double t_trav, double t_step, double t_tok, double t_draft, double deff, int k_max) {
    if (alpha > 0.999) alpha = 0.999;
    const bool priced = t_step > 0;
    int best = priced ? 0 : 1;
    double best_rate = priced ? 1 / t_step : -1;
    for (int k = 1; k <= k_max; k++) {
        double gain = (1 - pow(alpha, k + 1)) / (1 - alpha);
        double trav = priced ? t_step + k * t_tok : t_trav;
        double cost = deff > 1 && spec_chain(alpha, k) >= SPEC_AHEAD_MIN ? fmax(trav / deff, k * t_draft) : trav + k * t_draft;
        double rate = gain / (cost > 1e-9 ? cost : 1e-9);
        if (rate > best_rate * 1.0001) best_rate = rate, best = k;
    }
    return best;
}

int spec_run(spec_verifier *v, spec_drafter *d, const tok_tokenizer *tok, const int32_t *prompt, size_t n_prompt,
             const gen_params *p, const spec_params *sp, gen_token_cb cb, void *user, gen_metrics *m,
             spec_metrics *sm, rl_err *err) {
    memset(m, 0, sizeof *m);
    memset(sm, 0, sizeof *sm);
    sm->draft_digest = 0xcbf29ce484222325ULL;
    m->prompt_tokens = (int)n_prompt;
    m->stop_reason = "length";
    if (n_prompt == 0) return rl_errf(err, "empty prompt");
    if (n_prompt >= p->n_ctx) return rl_errf(err, "prompt of %zu tokens does not fit the context of %u", n_prompt, p->n_ctx);
    /* hist also holds, past the committed tokens, what the blocks in flight assume (below) */
    size_t cap = n_prompt + (p->n_predict > 0 ? (size_t)p->n_predict : p->n_ctx) + SPEC_MAX_DRAFT + 2 +
                 (size_t)SPEC_MAX_DEPTH * (SPEC_MAX_DRAFT + 2);
    int32_t *hist = malloc(cap * sizeof *hist);
    if (!hist) return rl_errf(err, "out of memory");
    memcpy(hist, prompt, n_prompt * sizeof *hist);
    size_t n_hist = n_prompt;
    gen_out emit;
    gen_out_begin(&emit, tok, p, cb, user, m);
    int rc = 0, k = sp->k_max > SPEC_MAX_DRAFT ? SPEC_MAX_DRAFT : sp->k_max;
    if (k < 1) k = 1;
    /* Adaptive: the first block is short (SPEC_FIRST_K) until the acceptance says more: a draft that never
     * agrees costs every stage k tokens' compute in it (on a CPU ring as much as k plain steps), one that
     * agrees reaches k_max after one wholly accepted block. */
    if (sp->adaptive && k > SPEC_FIRST_K) k = SPEC_FIRST_K;
    int32_t last;
    const uint32_t *taps;
    int n_taps = spec_drafter_taps(d, &taps);
    if (n_taps > 0 && (!v->set_taps || !v->features)) {
        rc = rl_errf(err, "this verifier cannot hand a DSpark draft the target's hidden states");
        goto done;
    }
    if ((n_taps > 0 && v->set_taps(v->ctx, taps, n_taps, err) != 0) ||
        v->begin(v->ctx, prompt, n_prompt, &p->smp, &last, err) != 0 || spec_drafter_begin(d, prompt, n_prompt, p->smp.seed, err) != 0 ||
        spec_push_features(v, d, n_taps, (uint32_t)n_prompt, err) != 0 || spec_drafter_commit(d, &last, 1, err) != 0) {
        rc = -1;
        goto done;
    }
    m->prefill_s = rl_clock_now() - emit.t0;
    /* The committed history is hist[0..n_hist); its last token sits at position n_hist - 1, not yet run by
     * the target. With pipelining, hist[n_hist..n_z) holds what the blocks in flight assume: their drafts,
     * each followed by the drafter's guess of the block's bonus token, which starts the next block (a block
     * is in flight at [pos, pos + n)). Committing a block that held writes the same tokens over them; one
     * that did not overwrites them, and n_z falls back to what is committed. */
    const int depth = v->submit && v->collect && sp->depth > 1 ? (sp->depth > SPEC_MAX_DEPTH ? SPEC_MAX_DEPTH : sp->depth) : 1;
    struct spec_flight {
        uint32_t pos;
        int n;     /* tokens of the block: the first, then n - 1 drafts */
        bool stale;/* an earlier block was not wholly accepted: its result is discarded */
        double t_sent;
        bool alone; /* sent with nothing else in flight: its time measures its own cost (t_step, t_tok) */
    } fl[SPEC_MAX_DEPTH];
    int n_fl = 0;
    int32_t *const z = hist;
    size_t n_z = n_hist;
    int32_t out[SPEC_MAX_DRAFT + 1];
    int n_out = 1;
    out[0] = last;
    bool stop = false, more = true; /* more: the next block's first token is known (z can grow) */
    double acc_s = 1, acc_f = 1, t_trav = 0, t_draft = 0; /* what the draft length adapts to */
    double deff = depth;                       /* blocks in flight when one is sent, a decaying mean */
    long win_d = 0, win_a = 0;                 /* the fallback's window: drafted, kept (SPEC_FALLBACK_*) */
    int pause = 0, pause_next = SPEC_FALLBACK_PAUSE; /* plain steps left, and the next pause */
    /* What a block costs (adaptive, fallback on): a plain step's traversal and each draft's share, measured
     * on blocks sent alone; 0 = not measured yet. A drafted block's time waits in pend_* until a plain step
     * has been timed. `measure`: the next step is plain, to time one (it costs nothing against plain decoding). */
    const bool priced = sp->adaptive && !sp->no_fallback;
    double t_step = 0, t_tok = -1, pend_t = 0;
    int pend_n = 0;
    bool measure = false;
    while (!stop) {
        /* Emit what was just committed. */
        for (int i = 0; i < n_out && !stop; i++) {
            int32_t id = out[i];
            hist[n_hist++] = id;
            int r = gen_out_token(&emit, id, err);
            if (r < 0) {
                rc = -1;
                goto done;
            }
            stop = r > 0;
            if (p->n_predict >= 0 && m->generated_tokens >= p->n_predict) stop = true;
        }
        if (!stop && gen_sigint_pending()) {
            m->stop_reason = "interrupted";
            stop = true;
        }
        if (stop) break;
        if (n_hist > p->n_ctx) {
            m->stop_reason = "context";
            break;
        }
        if (n_fl == 0) { /* nothing in flight: speculation restarts from what is committed */
            n_z = n_hist;
            more = true;
        }
        /* Fill the pipeline: draft and send blocks while fewer than `depth` are in flight. */
        while (n_fl < depth && more) {
            const uint32_t bpos = (uint32_t)(n_z - 1); /* the block's first token: z's last */
            /* Bounded by what is left to generate (counting what the blocks in flight assume) and the context. */
            int kk = k;
            int64_t left = p->n_predict >= 0 ? (int64_t)p->n_predict - m->generated_tokens - (int64_t)(n_z - n_hist) - 1 : kk;
            if (left < kk) kk = (int)left;
            if ((int64_t)p->n_ctx - (int64_t)bpos - 1 < kk) kk = (int)((int64_t)p->n_ctx - (int64_t)bpos - 1);
            /* drafts not paying, or a plain step to time: a block of no drafts */
            const bool paused = kk > 0 && (pause > 0 || (measure && n_fl == 0));
            if (paused) kk = 0;
            if (kk < 0 || (kk == 0 && n_fl > 0)) break;
            if (paused) {
                if (pause > 0) pause--;
                else measure = false;
                sm->paused_steps++;
            }
            /* A block sent ahead pays only if the ones in flight before it are likely wholly accepted, their
             * guesses too (SPEC_AHEAD_MIN): stale blocks still cost every stage but the last their compute. */
            const double alpha = acc_s / (acc_s + acc_f);
            double chain = 1;
            for (int i = 0; i < n_fl; i++) chain *= spec_chain(alpha, fl[i].n - 1);
            if (n_fl > 0 && sp->adaptive && chain < SPEC_AHEAD_MIN) break;
            int32_t block[SPEC_MAX_DRAFT + 2];
            int n_draft = 0;
            const spec_q *qs = NULL;
            /* One more, the guess that starts the next block, if one will follow it. */
            /* (its own chance only: whether a block is then sent behind it is judged when it would be sent,
             * over the blocks in flight at that time) */
            const bool ahead = kk > 0 && depth > 1 && (!sp->adaptive || spec_chain(alpha, kk) >= SPEC_AHEAD_MIN);
            const int want = ahead ? kk + 1 : kk;
            double td = rl_clock_now();
            if (want > 0 && spec_drafter_propose(d, z, n_z, n_hist, want, block + 1, &n_draft, &qs, err) != 0) {
                rc = -1;
                goto drain;
            }
            sm->draft_s += rl_clock_now() - td;
            if (want > 0) t_draft = 0.8 * t_draft + 0.2 * (rl_clock_now() - td) / want;
            /* A block the drafter found nothing for is one token, and a one-token VERIFY block keeps no
             * rollback copies on the stages (it commits its token; frame.h): never behind another, which may
             * yet make it stale. Nothing is sent; the block goes when the ones in flight are back. */
            if (n_draft == 0 && n_fl > 0) break;
            const bool guess = ahead && n_draft == want;
            if (n_draft > kk) n_draft = kk;
            for (int i = 0; i < n_draft; i++) {
                for (int b = 0; b < 4; b++) sm->draft_digest = (sm->draft_digest ^ (uint8_t)((uint32_t)block[1 + i] >> (8 * b))) * 0x100000001b3ULL;
            }
            block[0] = z[n_z - 1];
            double tv = rl_clock_now();
            if (depth > 1) {
                if (v->submit(v->ctx, bpos, block, n_draft + 1, qs, err) != 0) {
                    rc = -1;
                    goto drain;
                }
            } else if (v->verify(v->ctx, bpos, block, n_draft + 1, qs, out, &n_out, err) != 0) {
                rc = -1;
                goto drain;
            }
            sm->verify_s += rl_clock_now() - tv;
            if (depth == 1) t_trav = t_trav > 0 ? 0.8 * t_trav + 0.2 * (rl_clock_now() - tv) : rl_clock_now() - tv;
            fl[n_fl] = (struct spec_flight){.pos = bpos, .n = n_draft + 1, .t_sent = tv, .alone = n_fl == 0};
            n_fl++;
            sm->drafted += n_draft;
            sm->blocks++;
            sm->sent_drafts += n_draft;
            sm->depth_sum += n_fl; /* blocks in flight with it */
            if (n_fl > sm->depth_max) sm->depth_max = n_fl;
            deff = 0.9 * deff + 0.1 * n_fl;
            memcpy(z + n_z, block + 1, (size_t)(n_draft + (guess ? 1 : 0)) * sizeof *z);
            n_z += (size_t)n_draft + (guess ? 1 : 0);
            more = guess;
        }
        if (n_fl == 0) break; /* nothing could be sent (no room left to generate) */
        /* The oldest block's result (already there without pipelining). */
        struct spec_flight b0 = fl[0];
        const double b0_sent = b0.t_sent;
        memmove(fl, fl + 1, (size_t)(--n_fl) * sizeof *fl);
        if (depth > 1) {
            double tv = rl_clock_now();
            if (v->collect(v->ctx, out, &n_out, err) != 0) {
                rc = -1;
                goto drain;
            }
            sm->verify_s += rl_clock_now() - tv;
            t_trav = t_trav > 0 ? 0.8 * t_trav + 0.2 * (rl_clock_now() - b0_sent) : rl_clock_now() - b0_sent;
        }
        sm->traversals++;
        if (b0.stale) { /* drafted assuming more than was accepted: nothing of it counts */
            sm->drafted -= b0.n - 1;
            sm->cancelled++;
            n_out = 0;
            continue;
        }
        if (n_out < 1 || n_out > b0.n) {
            rc = rl_errf(err, "the verifier committed %d tokens of a %d-token block", n_out, b0.n);
            goto drain;
        }
        sm->accepted += n_out - 1;
        sm->committed += n_out;
        if (spec_push_features(v, d, n_taps, (uint32_t)n_out, err) != 0 || spec_drafter_commit(d, out, n_out, err) != 0) {
            rc = -1;
            goto drain;
        }
        /* The blocks behind it hold only if it was wholly accepted and its bonus token is the guess. */
        if (n_fl > 0 && !(n_out == b0.n && out[n_out - 1] == z[b0.pos + (uint32_t)b0.n])) {
            for (int i = 0; i < n_fl; i++) fl[i].stale = true;
            /* Speculation restarts from what is committed (`out` goes into hist at the top of the loop, over
             * the stale assumptions); its next block follows the stale ones at once, and every stage rolls
             * back past them when it arrives. */
            n_z = n_hist + (size_t)n_out;
            more = true;
        }
        bool priced_now = false; /* this block completed what t_tok needs */
        if (priced && b0.alone) { /* what this block cost: a plain step's time, or each draft's share */
            const double dt = rl_clock_now() - b0.t_sent;
            if (b0.n == 1) {
                t_step = t_step > 0 ? 0.7 * t_step + 0.3 * dt : dt;
            } else {
                pend_t = dt;
                pend_n = b0.n - 1;
            }
            if (t_step > 0 && pend_n > 0) {
                const double x = fmax(0, (pend_t - t_step) / pend_n);
                t_tok = t_tok >= 0 ? 0.7 * t_tok + 0.3 * x : x;
                pend_n = 0;
                priced_now = true;
            }
        }
        if (sp->adaptive && b0.n > 1) {
            /* Per-draft acceptance as successes / trials over a decaying window: a block of n drafts with a
             * accepted shows a successes and, if a < n, one failure. */
            acc_s = 0.9 * acc_s + (n_out - 1);
            acc_f = 0.9 * acc_f + (n_out < b0.n);
        }
        const double alpha = acc_s / (acc_s + acc_f);
        const double dpipe = depth > 1 ? fmax(deff, 2) : 1;
        /* Does drafting pay? Two judges; either pauses it. A window of SPEC_FALLBACK_WINDOW drafts with fewer
         * than one in SPEC_FALLBACK_MIN_KEPT kept (counts only: the same on every machine). And, adaptive, the
         * cost model live: once a plain step and a drafted block have been timed, drafting pays while some
         * draft length commits more tokens a second than plain steps do (spec_len_pick; on a CPU ring each
         * verified draft costs every stage a token's compute, so a draft needs a high acceptance there). A
         * drafted block not wholly accepted before any plain step was timed makes the next step a plain one. */
        bool judged = false, unpaid = false;
        if (b0.n > 1 && !sp->no_fallback) {
            win_d += b0.n - 1;
            win_a += n_out - 1;
            if (win_d >= SPEC_FALLBACK_WINDOW) {
                judged = true;
                unpaid = win_a * SPEC_FALLBACK_MIN_KEPT < win_d;
                win_d = win_a = 0;
            }
            if (priced && n_out < b0.n && t_step <= 0) measure = true;
        }
        if (priced && pause == 0 && !unpaid && t_step > 0 && t_tok >= 0 && (b0.n > 1 || priced_now)) {
            judged = true;
            unpaid = spec_len_pick(alpha, t_trav, t_step, t_tok, t_draft, dpipe, sp->k_max) == 0;
        }
        if (unpaid) {
            pause = pause_next;
            pause_next = pause_next * 2 < SPEC_FALLBACK_PAUSE_MAX ? pause_next * 2 : SPEC_FALLBACK_PAUSE_MAX;
            sm->fallbacks++;
            win_d = win_a = 0;
        } else if (judged) {
            pause_next = SPEC_FALLBACK_PAUSE; /* it paid: a later fallback pauses briefly again */
        }
        if (sp->adaptive && b0.n > 1) {
            const bool cost_known = priced && t_step > 0 && t_tok >= 0;
            const int kb = spec_len_pick(alpha, t_trav, cost_known ? t_step : 0, t_tok, t_draft, dpipe, sp->k_max);
            k = kb > 0 ? kb : 1;
        }
        if (unpaid && sp->adaptive) k = 1; /* the probe after the pause: one draft says whether it agrees now */
    }
drain: /* results of blocks still in flight (stale, or past the end) are collected and dropped */
    while (depth > 1 && n_fl > 0) {
        rl_err e2;
        int32_t junk[SPEC_MAX_DRAFT + 1];
        int nj;
        n_fl--;
        if (v->collect(v->ctx, junk, &nj, &e2) != 0) break;
    }
    sm->acceptance_rate = sm->drafted ? (double)sm->accepted / (double)sm->drafted : 0;
    sm->tokens_per_traversal = sm->traversals ? (double)sm->committed / (double)sm->traversals : 0;
done:
    gen_out_end(&emit, rc == 0, n_prompt);
    if (v->end) v->end(v->ctx);
    free(hist);
    return rc;
}

/* ---- the local verifier ------------------------------------------------------------------------ */

float *spec_feat_grow(float **buf, uint32_t *n, uint32_t *cap, size_t row, uint32_t n_new, rl_err *err) {
    if (*n + n_new > *cap) {
        uint32_t c = *cap ? *cap : 64;
        while (c < *n + n_new) c *= 2;
        float *p = realloc(*buf, (size_t)c * row * sizeof *p);
        if (!p) return rl_errf(err, "out of memory for DSpark features"), NULL;
        *buf = p;
        *cap = c;
    }
    float *at = *buf + (size_t)*n * row;
    *n += n_new;
    return at;
}

/* Appends the taps of a batch of n tokens to l->feat as rows (token-major: [token][tap][n_embd]; the
 * engine gives them tap-major). */
static int local_keep_taps(spec_local *l, const float *taps, uint32_t n, rl_err *err) {
    float *at = spec_feat_grow(&l->feat, &l->n_feat, &l->cap_feat, (size_t)l->n_taps * l->e->hp.n_embd, n, err);
    if (!at) return -1;
    k3_tap_rows(taps, l->n_taps, l->e->hp.n_embd, n, 0, n, at);
    return 0;
}

static int local_forward(spec_local *l, const int32_t *t, uint32_t n, bool keep, int n_logits, float **logits,
                         rl_err *err) {
    k3_state *sp = &l->st;
    int32_t rows[SPEC_MAX_DRAFT + 1];
    for (int i = 0; i < n_logits; i++) rows[i] = (int32_t)n - n_logits + i;
    uint8_t kp = keep;
    k3_batch b = {.n_seqs = 1, .seqs = &sp, .n_tokens = &n, .tokens = t, .keep_rollback = &kp, .n_logits = n_logits,
                  .logit_rows = rows, .n_taps = l->n_taps, .tap_layers = l->taps};
    k3_output o;
    if (k3_forward(l->e, &b, &o, err) != 0) return -1;
    if (l->n_taps > 0 && local_keep_taps(l, o.taps, n, err) != 0) {
        k3_output_free(&o);
        return -1;
    }
    if (logits) {
        *logits = o.logits;
        o.logits = NULL;
    }
    k3_output_free(&o);
    return 0;
}

static int local_begin(void *ctx, const int32_t *prompt, size_t n, const smp_params *sp, int32_t *first, rl_err *err) {
    spec_local *l = ctx;
    if (k3_state_init(&l->st, &l->e->hp, 0, l->e->hp.n_layer, l->n_ctx, err) != 0) return -1;
    l->have_st = true;
    /* One block is all this verifier returns into (a verification rolls back only inside itself, and no
     * block is ever in flight behind it); the default K3_RB_BLOCKS would keep five blocks' copies, each
     * touched page by page the first time it is used (docs/spec.md). */
    if (k3_state_keep_blocks(&l->st, 1, err) != 0) return -1;
    if (smp_init(&l->smp, sp, (int32_t)l->e->hp.n_vocab, err) != 0) return -1;
    l->have_smp = true;
    l->n_feat = 0;
    for (size_t i = 0; i < n; i++) smp_accept(&l->smp, prompt[i]);
    uint32_t chunk = l->chunk ? l->chunk : (uint32_t)n;
    float *row = NULL;
    for (size_t i = 0; i < n; i += chunk) {
        uint32_t c = (uint32_t)(n - i < chunk ? n - i : chunk);
        bool lastc = i + c == n;
        if (local_forward(l, prompt + i, c, false, lastc ? 1 : 0, lastc ? &row : NULL, err) != 0) return -1;
    }
    *first = smp_sample(&l->smp, row); /* accepted when it is run, as the next block's first input */
    free(row);
    return 0;
}

static int local_verify(void *ctx, uint32_t pos, const int32_t *tokens, int n, const spec_q *qs, int32_t *out,
                        int *n_out, rl_err *err) {
    spec_local *l = ctx;
    if (l->st.n_past != pos && k3_state_rollback(&l->st, pos, err) != 0) return -1;
    float *logits = NULL;
    l->n_feat = 0;
    if (local_forward(l, tokens, (uint32_t)n, n > 1, n, &logits, err) != 0) return -1;
    *n_out = spec_accept(&l->smp, logits, (int32_t)l->e->hp.n_vocab, tokens, n - 1, qs, out);
    free(logits);
    l->n_feat = (uint32_t)*n_out; /* rows of the rejected drafts are not the sequence's */
    return 0;
}

static int local_set_taps(void *ctx, const uint32_t *layers, int n, rl_err *err) {
    spec_local *l = ctx;
    if (n > DSPARK_MAX_TAPS) return rl_errf(err, "%d taps (at most %d)", n, DSPARK_MAX_TAPS);
    memcpy(l->taps, layers, (size_t)n * sizeof *layers);
    l->n_taps = n;
    return 0;
}

static const float *local_features(void *ctx, uint32_t *n_rows) {
    spec_local *l = ctx;
    *n_rows = l->n_feat;
    return l->feat;
}

static void local_end(void *ctx) {
    spec_local *l = ctx;
    if (l->have_st) k3_state_free(&l->st);
    if (l->have_smp) smp_free(&l->smp);
    l->have_st = l->have_smp = false;
    free(l->feat);
    l->feat = NULL;
    l->n_feat = l->cap_feat = 0;
}

spec_verifier spec_verifier_local(spec_local *l) {
    return (spec_verifier){.ctx = l, .begin = local_begin, .verify = local_verify, .end = local_end,
                           .set_taps = local_set_taps, .features = local_features};
}
