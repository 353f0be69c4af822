#include "drafter.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int spec_model_open(mf_model *m, k3_hparams *hp, k3_engine *e, const char *path, uint32_t target_vocab, int threads,
                    rl_err *err) {
    if (k3_open(m, hp, path, err) != 0) return rl_err_prefix(err, "draft model (a DSpark draft is given as dspark:PATH)");
    if (hp->n_vocab != target_vocab) {
        mf_close(m);
        return rl_errf(err, "draft model %s has a vocabulary of %u tokens, the target %u: they must share one", path,
                       hp->n_vocab, target_vocab);
    }
    const k3_engine_opts eo = {.n_threads = threads};
    if (k3_engine_init(e, m, hp, 0, hp->n_layer, &eo, err) != 0) {
        mf_close(m);
        return rl_err_prefix(err, "draft model");
    }
    /* Every drafted token runs the whole draft: read its mapped weights in now, as the target's are, and
     * not page by page in the first drafting steps (where they cost the first block ~0.1 s on `medium`). */
    k3_weights_prefault(&e->w, false);
    return 0;
}

int spec_drafter_open(spec_drafter *d, const char *spec, const mf_model *target, const k3_hparams *thp, uint32_t n_ctx,
                      int threads, const smp_params *sp, rl_err *err) {
    memset(d, 0, sizeof *d);
    d->pending = -1;
    const uint32_t target_vocab = thp->n_vocab;
    if (!spec || strcmp(spec, "none") == 0) return 0;
    if (strcmp(spec, "ngram") == 0) {
        d->kind = SPEC_NGRAM;
        return 0;
    }
    if (strncmp(spec, "dspark:", 7) == 0) {
        if (dspark_open(&d->ds, spec + 7, target, thp, n_ctx, threads, err) != 0) return rl_err_prefix(err, "DSpark draft");
        d->kind = SPEC_DSPARK;
        return 0;
    }
    if (spec_model_open(&d->m, &d->hp, &d->e, spec, target_vocab, threads, err) != 0) return -1;
    if (k3_state_init(&d->st, &d->e.hp, 0, d->hp.n_layer, n_ctx, err) != 0 || /* the engine's cache type */
        k3_state_keep_blocks(&d->st, SPEC_MAX_FED, err) != 0 || smp_init(&d->smp, sp, (int32_t)d->hp.n_vocab, err) != 0) {
        k3_state_free(&d->st);
        k3_engine_free(&d->e);
        mf_close(&d->m);
        return rl_err_prefix(err, "draft model");
    }
    d->kind = SPEC_MODEL;
    return 0;
}

void spec_drafter_close(spec_drafter *d) {
    if (d->kind == SPEC_DSPARK) dspark_close(&d->ds);
    if (d->kind == SPEC_MODEL) {
        free(d->row0);
        k3_snapshot_free(&d->snap);
        smp_free(&d->smp);
        k3_state_free(&d->st);
        k3_engine_free(&d->e);
        mf_close(&d->m);
    }
    memset(d, 0, sizeof *d);
}

/* Feeds tokens to the draft model; returns the last row's logits in *row (malloc'ed) if asked. Past the
 * prompt the tokens go through with step kernels, as the target verifies them, so that a draft that is
 * the target itself (bench's "twin") agrees with it bit for bit; speculative ones are kept for rollback. */
static int spec_feed(spec_drafter *d, const int32_t *t, uint32_t n, bool steps, bool keep, float **row, rl_err *err) {
    if (d->st.n_past + n > d->st.n_ctx) return rl_errf(err, "draft model context of %u is full", d->st.n_ctx);
    k3_state *sp = &d->st;
    int32_t last = (int32_t)n - 1;
    uint8_t kp = keep;
    k3_batch b = {.n_seqs = 1, .seqs = &sp, .n_tokens = &n, .tokens = t, .n_logits = row ? 1 : 0, .logit_rows = &last,
                  .step_kernels = steps, .keep_rollback = keep ? &kp : NULL};
    k3_output o;
    if (k3_forward(&d->e, &b, &o, err) != 0) return -1;
    if (row) {
        *row = o.logits;
        o.logits = NULL;
    }
    k3_output_free(&o);
    return 0;
}

/* Brings the draft model back to position base + m (m <= n_fed): by rollback into the blocks it kept, or,
 * should they not reach (they always do the way spec_run drafts), by running the history again from the
 * start. hist: the committed history and what follows it (at least base + m tokens), or NULL. */
static int spec_seek(spec_drafter *d, int m, const int32_t *hist, rl_err *err) {
    const uint32_t pos = d->base + (uint32_t)m;
    rl_err e2 = {"nothing kept"};
    if (pos == d->st.n_past || (m > 0 && k3_state_rollback(&d->st, pos, &e2) == 0) ||
        (d->have_snap && pos == d->snap.n_past && k3_state_restore(&d->st, &d->snap, &e2) == 0)) {
        d->n_fed = m;
        return 0;
    }
    if (!hist) return rl_errf(err, "draft model cannot return to position %u: %s", pos, e2.msg);
    /* The same kernels as the first time (the prompt batched, the rest step by step): the same state. */
    k3_state_reset(&d->st);
    d->n_fed = 0;
    d->reruns++;
    const uint32_t np = pos < d->n_prompt ? pos : d->n_prompt;
    if ((np > 0 && spec_feed(d, hist, np, false, false, NULL, err) != 0) ||
        (pos > np && spec_feed(d, hist + np, pos - np, true, false, NULL, err) != 0)) {
        d->pending = -1; /* the state matches nothing now: no drafts until the next begin */
        return -1;
    }
    d->n_fed = m;
    return 0;
}

int spec_drafter_taps(const spec_drafter *d, const uint32_t **layers) {
    *layers = d->ds.taps;
    return d->kind == SPEC_DSPARK ? (int)d->ds.n_taps : 0;
}

int spec_drafter_features(spec_drafter *d, const float *rows, uint32_t n, rl_err *err) {
    if (d->kind != SPEC_DSPARK || n == 0) return 0;
    return dspark_push(&d->ds, rows, n, err);
}

int spec_drafter_begin(spec_drafter *d, const int32_t *prompt, size_t n, uint64_t seed, rl_err *err) {
    if (d->kind == SPEC_DSPARK) dspark_reset(&d->ds);
    if (d->kind != SPEC_MODEL) return 0;
    k3_state_reset(&d->st);
    d->smp.p.seed = seed ^ 0x9e3779b97f4a7c15ULL; /* a stream of its own, fixed by the request's seed */
    smp_reset(&d->smp);
    for (size_t i = 0; i < n; i++) smp_accept(&d->smp, prompt[i]);
    d->pending = n ? prompt[n - 1] : -1;
    d->base = n ? (uint32_t)(n - 1) : 0;
    d->n_prompt = 0;
    d->n_fed = 0;
    free(d->row0);
    d->row0 = NULL;
    d->have_snap = false;
    if (n < 2) return 0;
    /* The whole prompt in one batch, as the target reads it: its last token then rounds as the target's did
     * (a prompt of 64 or more tokens takes flash attention's tiled path for every row; read as 63 and a step,
     * the twin disagreed with itself from the first draft on). Its last row gives the first draft; a snapshot
     * at its end is where a first block rejected whole returns. */
    if (spec_feed(d, prompt, (uint32_t)n, false, false, &d->row0, err) != 0 || k3_state_snapshot(&d->st, &d->snap, err) != 0) {
        d->pending = -1;
        return -1;
    }
    d->have_snap = true;
    d->n_prompt = (uint32_t)n;
    d->fed[0] = prompt[n - 1];
    d->n_fed = 1;
    return 0;
}

/* Prompt lookup: the most recent earlier match of the last g tokens, longest g first. */
int spec_ngram(const int32_t *h, size_t n, int k, int32_t *draft) {
    for (int g = 4; g >= 1; g--) {
        if ((size_t)g >= n) continue;
        const int32_t *key = h + n - g;
        for (size_t start = n - g; start-- > 0;) { /* candidate match at [start, start+g) */
            if (memcmp(h + start, key, (size_t)g * sizeof *h) != 0) continue;
            int m = 0;
            for (size_t j = start + g; j < n && m < k; j++) draft[m++] = h[j];
            if (m > 0) return m;
        }
    }
    return 0;
}

int spec_drafter_propose(spec_drafter *d, const int32_t *history, size_t n, size_t n_conf, int k, int32_t *draft,
                         int *n_draft, const spec_q **qs, rl_err *err) {
    *n_draft = 0;
    *qs = NULL;
    if (k > SPEC_MAX_DRAFT) k = SPEC_MAX_DRAFT;
    if (d->kind == SPEC_NONE || k <= 0) return 0;
    if (d->kind == SPEC_NGRAM) {
        *n_draft = spec_ngram(history, n, k, draft);
        return 0;
    }
    if (d->kind == SPEC_DSPARK) {
        /* The anchor is the last committed token, not yet run by the target: the context is everything before
         * it. Past a speculative suffix (pipelining) the block must reach beyond it, and its own chain must
         * be that suffix (it is, when DSpark drafted it): then the slots after it are the draft. */
        dspark *ds = &d->ds;
        if (n_conf == 0 || ds->n_cached + ds->n_pend != n_conf - 1) {
            return rl_errf(err, "DSpark draft has features of %u positions, the target committed %zu", ds->n_cached + ds->n_pend,
                           n_conf ? n_conf - 1 : 0);
        }
        const int sfx = (int)(n - n_conf), i0 = ds->from_anchor ? 0 : 1;
        int nb = sfx + k + i0;
        if (nb > (int)ds->block_size) nb = (int)ds->block_size;
        if (nb > DSPARK_MAX_BLOCK) nb = DSPARK_MAX_BLOCK;
        if (nb <= i0 + sfx) return 0;
        dspark_out o = {0};
        if (dspark_block(ds, history[n_conf - 1], nb, &o, err) != 0) return -1;
        for (int i = 0; i < sfx; i++) {
            if (o.tokens[i0 + i] != history[n_conf + (size_t)i]) return 0; /* the suffix is not its own chain */
        }
        for (int i = i0 + sfx; i < nb && o.conf[i] >= d->min_conf; i++) draft[(*n_draft)++] = o.tokens[i];
        return 0;
    }
    /* MODEL: run what the context needs past the committed tokens (the pending token, then the blocks in
     * flight), reusing what the state already ran, then draft one token at a time. Everything stays in the
     * state, kept for rollback, until spec_drafter_commit says what held. */
    if (d->pending < 0 || n_conf == 0 || n < n_conf) return 0;
    if (d->base != n_conf - 1) {
        return rl_errf(err, "draft model has seen %u committed tokens, the target committed %zu", d->base, n_conf - 1);
    }
    const int32_t *need = history + d->base;
    const size_t L = n - d->base; /* >= 1: need[L - 1] is the token the first draft follows */
    if (L + (size_t)k > SPEC_MAX_FED) k = L < SPEC_MAX_FED ? (int)(SPEC_MAX_FED - L) : 0;
    if (k <= 0) return 0;
    int j = 0;
    while (j < d->n_fed && (size_t)j < L && d->fed[j] == need[j]) j++;
    float *row = NULL;
    if (d->row0 && L == 1 && j == 1 && d->st.n_past == d->n_prompt) {
        row = d->row0; /* right after begin: the prompt batch's last row */
        d->row0 = NULL;
    } else {
        free(d->row0);
        d->row0 = NULL;
        /* need[L - 1] runs again even when it ran already: its logits are what the first draft comes from. */
        const int from = (size_t)j < L ? j : (int)L - 1;
        if (spec_seek(d, from, history, err) != 0 ||
            spec_feed(d, need + from, (uint32_t)(L - (size_t)from), true, true, &row, err) != 0) {
            return -1;
        }
        memcpy(d->fed + from, need + from, (L - (size_t)from) * sizeof *need);
    }
    d->n_fed = (int)L;
    int32_t t = need[L - 1];
    const bool sampling = d->smp.p.temperature > 0.0f;
    for (int i = 0; i < k; i++) {
        if (i > 0) {
            if (spec_feed(d, &t, 1, true, true, &row, err) != 0) return -1;
            d->fed[d->n_fed++] = t;
        }
        if (sampling) {
            /* Draw from the drafter's filtered distribution and keep it (top 64) for the acceptance test. */
            size_t nc = 0;
            smp_filter(&d->smp, row, &nc);
            float mx = -INFINITY;
            for (size_t c = 0; c < nc; c++) mx = fmaxf(mx, d->smp.cand[c].logit);
            double sum = 0;
            for (size_t c = 0; c < nc; c++) sum += (d->smp.cand[c].p = expf(d->smp.cand[c].logit - mx));
            int keep = nc < 64 ? (int)nc : 64;
            double u = smp_uniform(&d->smp), acc = 0;
            size_t chosen = 0;
            for (size_t c = 0; c < nc; c++) {
                acc += d->smp.cand[c].p / sum;
                if (u < acc) {
                    chosen = c;
                    break;
                }
            }
            t = d->smp.cand[chosen].id;
            for (int c = 0; c < keep; c++) {
                d->q_id[i][c] = d->smp.cand[c].id;
                d->q_p[i][c] = (float)(d->smp.cand[c].p / sum);
            }
            if (chosen >= (size_t)keep) { /* a rare tail draw: make sure its q is known */
                d->q_id[i][keep - 1] = t;
                d->q_p[i][keep - 1] = (float)(d->smp.cand[chosen].p / sum);
            }
            d->q[i] = (spec_q){.n = keep, .id = d->q_id[i], .p = d->q_p[i]};
        } else {
            t = smp_sample(&d->smp, row);
        }
        free(row);
        row = NULL;
        draft[(*n_draft)++] = t;
    }
    if (sampling) *qs = d->q;
    return 0;
}

int spec_drafter_commit(spec_drafter *d, const int32_t *committed, int n, rl_err *err) {
    if (d->kind != SPEC_MODEL || n <= 0) return 0;
    if (d->pending < 0) return rl_errf(err, "draft model has no sequence to commit tokens to");
    /* The model must have run pending + all committed but the last. Drafting ran some of them already. */
    int j = 0;
    while (j < d->n_fed && j < n && d->fed[j] == (j == 0 ? d->pending : committed[j - 1])) j++;
    for (int i = 0; i < n; i++) smp_accept(&d->smp, committed[i]);
    if (j == n) {
        /* All run already. What ran after them (a block in flight, drafted assuming a bonus token) holds only
         * if the assumed token is the one committed last. */
        if (d->n_fed > n && d->fed[n] != committed[n - 1] && spec_seek(d, n, NULL, err) != 0) return -1;
        memmove(d->fed, d->fed + n, (size_t)(d->n_fed - n) * sizeof *d->fed);
        d->n_fed -= n;
    } else {
        if (j == 0 && d->n_fed > 0) return rl_errf(err, "draft model ran %d tokens that do not follow what is committed", d->n_fed);
        if (spec_seek(d, j, NULL, err) != 0) return -1;
        int32_t buf[SPEC_MAX_DRAFT + 2];
        int m = 0;
        for (int i = j; i < n; i++) buf[m++] = i == 0 ? d->pending : committed[i - 1];
        if (spec_feed(d, buf, (uint32_t)m, true, false, NULL, err) != 0) return -1;
        d->n_fed = 0;
    }
    free(d->row0);
    d->row0 = NULL;
    d->base += (uint32_t)n;
    d->pending = committed[n - 1];
    if (d->have_snap && d->base > d->snap.n_past) { /* nothing returns before base any more */
        k3_snapshot_free(&d->snap);
        d->have_snap = false;
    }
    k3_state_rb_forget(&d->st, d->base); /* spec_seek returns only past base */
    return 0;
}
