/* backend_local.c - the scheduler's backend on this machine (backend_local.h). */
#include "backend_local.h"
#include "../base/clock.h"

#include "../speculate/accept.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct sch_local {
    k3_engine *e;
    int n_slots;
    k3_state_pool pool;  /* the slots' states side by side: a decode step runs them as one batch (k3_forward) */
    k3_state *st;        /* [n_slots], slot i of the pool */
    smp_sampler *smp;    /* [n_slots] */
    bool *has_smp;       /* [n_slots] */
    uint32_t *valid;     /* [n_slots]: positions committed; past them, a speculative entry's rejected drafts */
    uint8_t *keep;       /* [n_slots] batch scratch: keep rollback copies (speculative entries) */
    /* batch scratch */
    k3_state **seqs;     /* [n_slots] */
    uint32_t *ntok;      /* [n_slots] */
    int32_t *rows;       /* [n_slots] */
    int32_t *tokens;
    size_t tokens_cap;
    /* DSpark taps (set_taps): the layers, and the step's features, token-major per entry */
    int n_taps;
    uint32_t taps[16];
    float *feat;
    size_t feat_cap;         /* floats */
    sch_node_stat node;
} sch_local;

static int sch_local_step(void *impl, sch_step *steps, int n, rl_err *err) {
    sch_local *L = impl;
    const int32_t n_vocab = (int32_t)L->e->hp.n_vocab;
    size_t total = 0;
    for (int i = 0; i < n; i++) total += steps[i].n_tokens;
    if (total > L->tokens_cap) {
        int32_t *t = realloc(L->tokens, total * sizeof *t), *rw = t ? realloc(L->rows, total * sizeof *rw) : NULL;
        if (t) L->tokens = t;
        if (rw) L->rows = rw;
        if (!t || !rw) return rl_errf(err, "out of memory for a batch of %zu tokens", total);
        L->tokens_cap = total;
    }
    int n_rows = 0;
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        sch_step *sp = &steps[i];
        if (sp->slot < 0 || sp->slot >= L->n_slots) return rl_errf(err, "slot %d out of range", sp->slot);
        if (sp->begin) {
            k3_state_reset(&L->st[sp->slot]);
            if (L->has_smp[sp->slot]) smp_free(&L->smp[sp->slot]);
            L->has_smp[sp->slot] = false;
            if (smp_init(&L->smp[sp->slot], sp->smp, n_vocab, err) != 0) return -1;
            L->has_smp[sp->slot] = true;
        } else if (!L->has_smp[sp->slot]) {
            return rl_errf(err, "slot %d continues a sequence that never began", sp->slot);
        } else if (L->st[sp->slot].n_past > L->valid[sp->slot] &&
                   k3_state_rollback(&L->st[sp->slot], L->valid[sp->slot], err) != 0) {
            return -1; /* drop the last speculative entry's rejected drafts */
        }
        if (sp->n_draft < 0 || sp->n_draft > SCH_MAX_DRAFT || (sp->n_draft > 0 && (!sp->sample || sp->n_tokens != (uint32_t)sp->n_draft + 1))) {
            return rl_errf(err, "slot %d: a speculative entry of %u tokens with %d drafts", sp->slot, sp->n_tokens, sp->n_draft);
        }
        L->seqs[i] = &L->st[sp->slot];
        L->ntok[i] = sp->n_tokens;
        L->keep[i] = sp->n_draft > 0;
        memcpy(L->tokens + off, sp->tokens, sp->n_tokens * sizeof(int32_t));
        off += sp->n_tokens;
        int t0 = sp->n_draft > 0 || sp->prompt_lp ? 0 : (int)sp->n_tokens - 1;
        for (int t = t0; (sp->sample || sp->prompt_lp) && t < (int)sp->n_tokens; t++) {
            if (!sp->sample && t == (int)sp->n_tokens - 1) break; /* (prompt_lp alone: the last row has no token) */
            L->rows[n_rows++] = (int32_t)(off - sp->n_tokens + (uint32_t)t);
        }
    }
    bool want_taps = false;
    for (int i = 0; i < n; i++) want_taps = want_taps || (L->n_taps > 0 && steps[i].taps);
    k3_batch b = {.n_seqs = n, .seqs = L->seqs, .n_tokens = L->ntok, .tokens = L->tokens, .keep_rollback = L->keep,
                  .n_logits = n_rows, .logit_rows = L->rows, .n_taps = want_taps ? L->n_taps : 0, .tap_layers = L->taps};
    k3_output o;
    double t0 = rl_clock_now();
    if (k3_forward(L->e, &b, &o, err) != 0) return -1;
    L->node.compute_s += rl_clock_now() - t0;
    L->node.steps++;
    if (want_taps) { /* the engine gives [tap][token][n_embd] over the batch; entries get [token][tap][n_embd] */
        const size_t d = L->e->hp.n_embd, row = (size_t)L->n_taps * d;
        if (total * row > L->feat_cap) {
            float *f = realloc(L->feat, total * row * sizeof *f);
            if (!f) {
                k3_output_free(&o);
                return rl_errf(err, "out of memory for the DSpark features of %zu tokens", total);
            }
            L->feat = f;
            L->feat_cap = total * row;
        }
        size_t at = 0;
        for (int i = 0; i < n; i++) {
            steps[i].feat = steps[i].taps ? L->feat + at * row : NULL;
            if (steps[i].taps) k3_tap_rows(o.taps, L->n_taps, (uint32_t)d, total, at, steps[i].n_tokens, L->feat + at * row);
            at += steps[i].n_tokens;
        }
    } else {
        for (int i = 0; i < n; i++) steps[i].feat = NULL;
    }
    int r = 0;
    for (int i = 0; i < n; i++) {
        sch_step *sp = &steps[i];
        smp_sampler *smp = &L->smp[sp->slot];
        L->valid[sp->slot] = L->st[sp->slot].n_past;
        if (sp->n_draft > 0) { /* spec_accept takes the inputs into the penalty history as it judges them */
            sp->n_out = spec_accept(smp, o.logits + (size_t)r * (size_t)n_vocab, n_vocab, sp->tokens, sp->n_draft, NULL,
                                    sp->out);
            r += (int)sp->n_tokens;
            L->valid[sp->slot] -= (uint32_t)(sp->n_tokens - (uint32_t)sp->n_out);
            sp->token = sp->out[sp->n_out - 1];
            for (int t = 0; sp->logprobs && t < sp->n_out; t++) {
                smp_logprobs(o.logits + (size_t)(r - (int)sp->n_tokens + t) * (size_t)n_vocab, n_vocab, sp->out[t], &sp->lp[t]);
            }
            continue;
        }
        /* The penalty history sees every token of the sequence, prompt included, as gen_run's does. */
        for (uint32_t t = 0; t < sp->n_tokens; t++) smp_accept(smp, sp->tokens[t]);
        if (sp->prompt_lp) { /* rows 0 .. n-2 score the entry's own next tokens; the last one samples */
            for (uint32_t t = 0; t + 1 < sp->n_tokens; t++) {
                smp_logprobs(o.logits + (size_t)r++ * (size_t)n_vocab, n_vocab, sp->tokens[t + 1], &sp->plp[t]);
            }
        }
        if (sp->sample) {
            const float *row = o.logits + (size_t)r++ * (size_t)n_vocab;
            sp->token = smp_sample(smp, row);
            if (sp->logprobs) smp_logprobs(row, n_vocab, sp->token, &sp->lp[0]);
        }
    }
    k3_output_free(&o);
    return 0;
}

static void sch_local_end(void *impl, int slot) {
    (void)impl;
    (void)slot; /* states are reused: the next begin resets them */
}

static int sch_local_nodes(void *impl, sch_node_stat *out, int max) {
    sch_local *L = impl;
    if (max < 1) return 0;
    out[0] = L->node;
    return 1;
}

static void sch_local_free(void *impl) {
    sch_local *L = impl;
    if (!L) return;
    for (int i = 0; i < L->n_slots; i++) {
        if (L->st && L->st[i].ctx) k3_state_free(&L->st[i]);
        if (L->has_smp && L->has_smp[i]) smp_free(&L->smp[i]);
    }
    k3_state_pool_free(&L->pool);
    free(L->st);
    free(L->smp);
    free(L->has_smp);
    free(L->valid);
    free(L->keep);
    free(L->seqs);
    free(L->ntok);
    free(L->rows);
    free(L->tokens);
    free(L->feat);
    free(L);
}

static int sch_local_fork(void *impl, int src, int dst, const smp_params *smp, rl_err *err) {
    sch_local *L = impl;
    if (src < 0 || src >= L->n_slots || dst < 0 || dst >= L->n_slots || src == dst || !L->has_smp[src]) {
        return rl_errf(err, "cannot fork slot %d into slot %d", src, dst);
    }
    if (L->st[src].n_past > L->valid[src] && k3_state_rollback(&L->st[src], L->valid[src], err) != 0) return -1;
    if (L->has_smp[dst]) smp_free(&L->smp[dst]);
    L->has_smp[dst] = false;
    if (k3_state_copy(&L->st[dst], &L->st[src], err) != 0) return -1;
    if (smp_init(&L->smp[dst], smp, (int32_t)L->e->hp.n_vocab, err) != 0) return -1;
    smp_accept_history(&L->smp[dst], &L->smp[src]);
    L->has_smp[dst] = true;
    L->valid[dst] = L->st[dst].n_past;
    return 0;
}

static int sch_local_set_taps(void *impl, const uint32_t *layers, int n, rl_err *err) {
    sch_local *L = impl;
    if (n < 0 || n > 16) return rl_errf(err, "%d taps (at most 16)", n);
    for (int k = 0; k < n; k++) {
        if (layers[k] > L->e->hp.n_layer) return rl_errf(err, "a tap at layer %u of a %u-layer model", layers[k], L->e->hp.n_layer);
    }
    memcpy(L->taps, layers, (size_t)n * sizeof *layers);
    L->n_taps = n;
    return 0;
}

int sch_backend_local(sch_backend *be, k3_engine *e, int n_slots, uint32_t n_ctx, rl_err *err) {
    memset(be, 0, sizeof *be);
    if (n_slots < 1) return rl_errf(err, "need at least one sequence slot");
    if (e->a != 0 || e->b != e->hp.n_layer) return rl_errf(err, "the local backend needs an engine for the whole model");
    sch_local *L = calloc(1, sizeof *L);
    if (!L) return rl_errf(err, "out of memory");
    L->e = e;
    L->n_slots = n_slots;
    L->st = calloc((size_t)n_slots, sizeof *L->st);
    L->smp = calloc((size_t)n_slots, sizeof *L->smp);
    L->has_smp = calloc((size_t)n_slots, sizeof *L->has_smp);
    L->seqs = calloc((size_t)n_slots, sizeof *L->seqs);
    L->ntok = calloc((size_t)n_slots, sizeof *L->ntok);
    L->valid = calloc((size_t)n_slots, sizeof *L->valid);
    L->keep = calloc((size_t)n_slots, sizeof *L->keep);
    if (!L->st || !L->smp || !L->has_smp || !L->seqs || !L->ntok || !L->valid || !L->keep) {
        sch_local_free(L);
        return rl_errf(err, "out of memory");
    }
    if (k3_state_pool_init(&L->pool, &e->hp, 0, e->hp.n_layer, n_ctx, n_slots, err) != 0) {
        sch_local_free(L);
        return -1;
    }
    for (int i = 0; i < n_slots; i++) {
        /* A slot rolls back only into its last speculative entry (L->valid): one block kept, not
         * K3_RB_BLOCKS, each of which holds a copy of every KDA state per token once touched. */
        if (k3_state_init_pooled(&L->st[i], &L->pool, i, err) != 0 || k3_state_keep_blocks(&L->st[i], 1, err) != 0) {
            rl_err_prefix(err, "sequence state %d of %d (%u tokens each)", i + 1, n_slots, n_ctx);
            sch_local_free(L);
            return -1;
        }
    }
    snprintf(L->node.name, sizeof L->node.name, "local");
    snprintf(L->node.addr, sizeof L->node.addr, "local");
    L->node.layer_a = 0;
    L->node.layer_b = e->hp.n_layer;
    L->node.up = true;
    be->impl = L;
    be->n_slots = n_slots;
    be->n_ctx = n_ctx;
    be->n_vocab = e->hp.n_vocab;
    be->kind = "local";
    be->xc = k3_engine_cache_stats(e);
    be->step = sch_local_step;
    be->end = sch_local_end;
    be->nodes = sch_local_nodes;
    be->free = sch_local_free;
    be->set_taps = sch_local_set_taps;
    be->fork = sch_local_fork;
    return 0;
}
