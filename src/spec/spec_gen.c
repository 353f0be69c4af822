#include "spec_gen.h"

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
    size_t cap = n_prompt + (p->n_predict > 0 ? (size_t)p->n_predict : p->n_ctx) + SPEC_MAX_DRAFT + 2;
    int32_t *hist = malloc(cap * sizeof *hist);
    if (!hist) return rl_errf(err, "out of memory");
    memcpy(hist, prompt, n_prompt * sizeof *hist);
    size_t n_hist = n_prompt;
    gen_out emit;
    gen_out_begin(&emit, tok, p, cb, user, m);
    int rc = 0, k = sp->k_max > SPEC_MAX_DRAFT ? SPEC_MAX_DRAFT : sp->k_max;
    if (k < 1) k = 1;
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
    m->prefill_s = gen_mono() - emit.t0;
    uint32_t pos = (uint32_t)n_prompt; /* where `last` goes */
    int32_t out[SPEC_MAX_DRAFT + 1];
    int n_out = 1;
    out[0] = last;
    bool stop = false;
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
        /* Draft, bounded by what is left to generate and the context. */
        int kk = k;
        if (p->n_predict >= 0 && p->n_predict - m->generated_tokens - 1 < kk) kk = p->n_predict - m->generated_tokens - 1;
        if ((int64_t)p->n_ctx - (int64_t)pos - 1 < kk) kk = (int)((int64_t)p->n_ctx - (int64_t)pos - 1);
        if (pos + 1 > p->n_ctx) {
            m->stop_reason = "context";
            break;
        }
        int32_t block[SPEC_MAX_DRAFT + 1];
        int n_draft = 0;
        const spec_q *qs = NULL;
        double td = gen_mono();
        if (kk > 0 && spec_drafter_propose(d, hist, n_hist, kk, block + 1, &n_draft, &qs, err) != 0) {
            rc = -1;
            break;
        }
        sm->draft_s += gen_mono() - td;
        for (int i = 0; i < n_draft; i++) {
            for (int b = 0; b < 4; b++) sm->draft_digest = (sm->draft_digest ^ (uint8_t)((uint32_t)block[1 + i] >> (8 * b))) * 0x100000001b3ULL;
        }
        block[0] = hist[n_hist - 1];
        double tv = gen_mono();
        if (v->verify(v->ctx, pos, block, n_draft + 1, qs, out, &n_out, err) != 0) {
            rc = -1;
            break;
        }
        sm->verify_s += gen_mono() - tv;
        sm->traversals++;
        sm->drafted += n_draft;
        sm->accepted += n_out - 1;
        sm->committed += n_out;
        pos += (uint32_t)n_out;
        if (spec_push_features(v, d, n_taps, (uint32_t)n_out, err) != 0 || spec_drafter_commit(d, out, n_out, err) != 0) {
            rc = -1;
            break;
        }
        if (sp->adaptive && n_draft > 0) {
            if (n_out - 1 == n_draft && k < sp->k_max) k++;
            else if (2 * (n_out - 1) < n_draft && k > 1) k--;
        }
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

/* Appends the taps of a batch of n tokens to l->feat as rows (token-major: [token][tap][n_embd]). */
static int local_keep_taps(spec_local *l, const float *taps, uint32_t n, rl_err *err) {
    const size_t d = l->e->hp.n_embd, row = (size_t)l->n_taps * d;
    if (l->n_feat + n > l->cap_feat) {
        uint32_t cap = l->cap_feat ? l->cap_feat : 64;
        while (cap < l->n_feat + n) cap *= 2;
        float *p = realloc(l->feat, (size_t)cap * row * sizeof *p);
        if (!p) return rl_errf(err, "out of memory for DSpark features");
        l->feat = p;
        l->cap_feat = cap;
    }
    for (uint32_t t = 0; t < n; t++) {
        for (int k = 0; k < l->n_taps; k++) {
            memcpy(l->feat + (size_t)(l->n_feat + t) * row + (size_t)k * d, taps + ((size_t)k * n + t) * d, d * sizeof(float));
        }
    }
    l->n_feat += n;
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
