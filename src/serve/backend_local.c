/* backend_local.c - the scheduler's backend on this machine (backend_local.h). */
#include "backend_local.h"
#include "../base/clock.h"

#include "../speculate/accept.h"
#include "prompt_cache.h"
#include "../model/k3_ckpt.h"

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
    float *feat_held;        /* a split step's first pass's features (sch_local_step) */
    sch_node_stat node;
    /* The prompt cache (sch_local_cache_on; off: cache false and the rest unused). */
    bool cache, exact;
    uint32_t n_ctx;
    k3_ckpts *ck;        /* [n_slots]: each slot's checkpoints (its KDA state; the MLA rows before them stay in the slot) */
    int32_t *held;       /* [n_slots * n_ctx]: the token at each position a slot's state has read (valid[] of them) */
    pc_cache host;       /* --cache-ram: prefixes kept after their slot moved on */
    uint32_t *reread;    /* [n_slots]: where an idle re-read of generated tokens ends (0: none; sch_local_idle) */
    double *ended;       /* [n_slots]: when the slot's last sequence ended (rl_clock_now) */
    uint32_t chunk;      /* tokens per idle re-read piece */
} sch_local;

static int32_t *bl_held(sch_local *L, int slot) { return L->held + (size_t)slot * L->n_ctx; }

static uint32_t bl_common(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    size_t i = 0;
    while (i < na && i < nb && a[i] == b[i]) i++;
    return (uint32_t)i;
}

/* The most a resume may restore of an n-token prompt: what follows must be a piece of two or more tokens. */
static uint32_t bl_limit(size_t n) { return n >= 3 ? (uint32_t)(n - 2) : 0; }

static uint32_t sch_local_match(void *impl, int slot, const int32_t *tokens, size_t n) {
    sch_local *L = impl;
    if (!L->cache) return 0;
    uint32_t lcp = bl_common(bl_held(L, slot), L->valid[slot], tokens, n), lim = bl_limit(n);
    int k = k3_ckpts_best(&L->ck[slot], lcp < lim ? lcp : lim);
    return k < 0 ? 0 : L->ck[slot].c[k].pos;
}

/* A prefix to keep in the host cache: its tokens and its state (the format sch_local_resume restores). */
typedef struct bl_kept {
    int32_t *tokens;
    uint32_t n;
    uint8_t *blob;
    size_t len;
} bl_kept;

/* Copies slot's latest checkpoint out (its KDA state and the MLA rows before it), unless the host cache has
 * it already; false when there is nothing to keep (or no memory: the entry is only lost). */
static bool bl_keep_copy(sch_local *L, int slot, bl_kept *k) {
    memset(k, 0, sizeof *k);
    if (L->host.budget == 0 || L->ck[slot].n == 0) return false;
    const k3_ckpt *c = &L->ck[slot].c[L->ck[slot].n - 1];
    const int32_t *toks = bl_held(L, slot);
    if (c->pos > L->valid[slot] || pc_has(&L->host, toks, c->pos)) return false;
    k->len = c->snap.n_bytes + k3_state_rows_bytes(&L->st[slot], c->pos);
    k->n = c->pos;
    k->blob = malloc(k->len ? k->len : 1);
    k->tokens = malloc((c->pos ? c->pos : 1) * sizeof *k->tokens);
    rl_err e;
    if (!k->blob || !k->tokens || k3_state_rows_get(&L->st[slot], c->pos, k->blob + c->snap.n_bytes, &e) != 0) {
        free(k->blob), free(k->tokens);
        memset(k, 0, sizeof *k);
        return false;
    }
    memcpy(k->blob, c->snap.kda, c->snap.n_bytes);
    memcpy(k->tokens, toks, (size_t)c->pos * sizeof *toks);
    return true;
}

/* Stores what bl_keep_copy copied (the cache takes the blob; a failure only loses the entry). */
static void bl_keep_put(sch_local *L, bl_kept *k) {
    rl_err e;
    if (k->blob && pc_put(&L->host, k->tokens, k->n, k->blob, k->len, &e) != 0) {
        fprintf(stderr, "ringlm serve: a prompt prefix was not kept: %s\n", e.msg);
    }
    free(k->tokens);
    memset(k, 0, sizeof *k);
}

static int sch_local_resume(void *impl, int slot, const int32_t *tokens, size_t n, bool reuse, uint32_t *n_cached,
                            rl_err *err) {
    sch_local *L = impl;
    *n_cached = 0;
    if (slot < 0 || slot >= L->n_slots) return rl_errf(err, "slot %d out of range", slot);
    if (!L->cache) return 0;
    L->reread[slot] = 0; /* what an idle re-read reached is checkpointed; the rest is not needed now */
    k3_state *st = &L->st[slot];
    if (st->n_past > L->valid[slot] && k3_state_rollback(st, L->valid[slot], err) != 0) {
        k3_ckpts_drop(&L->ck[slot], 0); /* the state is in doubt: nothing of it is used */
        L->valid[slot] = 0;
        return -1;
    }
    const uint32_t lim = reuse ? bl_limit(n) : 0;
    const uint32_t lcp = bl_common(bl_held(L, slot), L->valid[slot], tokens, n);
    const int k = k3_ckpts_best(&L->ck[slot], lcp < lim ? lcp : lim);
    const uint32_t own = k < 0 ? 0 : L->ck[slot].c[k].pos;
    /* What the slot holds past its own usable checkpoint is about to be overwritten: its latest prefix is
     * copied out now and stored once the host entry found below has been restored (storing may evict it). */
    bl_kept kept;
    if (!(L->ck[slot].n > 0 && L->ck[slot].c[L->ck[slot].n - 1].pos > own && bl_keep_copy(L, slot, &kept))) {
        memset(&kept, 0, sizeof kept);
    }
    const int h = lim > own && L->host.budget > 0 ? pc_find(&L->host, tokens, n, lim) : -1;
    const uint32_t q = h >= 0 && L->host.e[h].n > own ? L->host.e[h].n : own;
    if (q == 0) {
        k3_ckpts_drop(&L->ck[slot], 0);
        L->valid[slot] = 0;
        bl_keep_put(L, &kept);
        return 0; /* the begin entry resets the state */
    }
    if (q == own) {
        if (k3_state_restore(st, &L->ck[slot].c[k].snap, err) != 0) goto fail;
        k3_ckpts_drop(&L->ck[slot], k + 1);
    } else {
        const pc_entry *e = &L->host.e[h];
        const size_t kda = k3_state_kda_bytes(st);
        if (e->len != kda + k3_state_rows_bytes(st, e->n)) {
            rl_errf(err, "a cached prefix of %u tokens has %zu bytes, this state takes %zu", e->n, e->len,
                    kda + k3_state_rows_bytes(st, e->n));
            goto fail;
        }
        const k3_snapshot snap = {.n_past = e->n, .n_bytes = kda, .kda = e->blob};
        if (k3_state_rows_set(st, e->n, e->blob + kda, err) != 0 || k3_state_restore(st, &snap, err) != 0) goto fail;
        /* The slot's own checkpoints up to `own` are prefixes of these tokens too (own <= the common prefix):
         * they stay, so that a later request branching off before e->n still finds one (a system prompt, then
         * questions). Those past it held other tokens. */
        k3_ckpts_drop(&L->ck[slot], k + 1);
        memcpy(bl_held(L, slot), tokens, (size_t)e->n * sizeof *tokens);
        if (k3_ckpts_take(&L->ck[slot], &L->st[slot], err) != 0) goto fail; /* so the next turn finds it in the slot */
    }
    L->valid[slot] = q;
    *n_cached = q;
    bl_keep_put(L, &kept);
    return 0;
fail:
    k3_ckpts_drop(&L->ck[slot], 0);
    L->valid[slot] = 0;
    k3_state_reset(st);
    bl_keep_put(L, &kept);
    return -1;
}

/* A client that sends its next turn at once (an agent's loop, a benchmark) comes within this many seconds
 * of the end of its last; an idle re-read waits that long first, so that such a turn reads the reply with its
 * new tokens in one piece instead of waiting for a re-read piece and then reading its own. */
#define BL_REREAD_GRACE_S 0.1

/* Idle work's one piece: the slot reads n of the tokens it holds, from where its state stands, as a prompt
 * piece (split-invariant), and keeps a checkpoint after them. On failure no state moved (k3_forward) and the
 * checkpoints stand; what is logged says which job (`what`) it was. */
static bool bl_read_piece(sch_local *L, int slot, uint32_t n, const char *what) {
    k3_state *sp = &L->st[slot];
    k3_batch b = {.n_seqs = 1, .seqs = &sp, .n_tokens = &n, .tokens = bl_held(L, slot) + sp->n_past,
                  .split_invariant = true};
    k3_output o;
    rl_err e;
    if (k3_forward(L->e, &b, &o, &e) != 0) {
        fprintf(stderr, "ringlm serve: %s failed: %s\n", what, e.msg);
        return false;
    }
    k3_output_free(&o);
    if (k3_ckpts_take(&L->ck[slot], &L->st[slot], &e) != 0) fprintf(stderr, "ringlm serve: no prompt checkpoint kept: %s\n", e.msg);
    return true;
}

/* Idle work (nothing runs): a slot whose sequence ends in tokens it generated holds state no fresh prompt
 * read reproduces (a one-token step rounds differently from a prompt piece), so a next turn could resume only
 * from the checkpoint before them and read them again. While the server is idle they are read again here, as
 * prompt pieces from that checkpoint, a checkpoint after each: the next turn then reads only its new tokens.
 * One piece per call, so a request that arrives waits for one piece at most. Returns 1 when it did one, 0
 * when there is none to do, -ms when one will be due after the grace above. */
static int sch_local_idle(void *impl) {
    sch_local *L = impl;
    double due = -1;
    for (int i = 0; L->cache && i < L->n_slots; i++) {
        k3_state *st = &L->st[i];
        if (L->reread[i] == 0) { /* a sequence that ends past its last checkpoint: re-read from there */
            const int k = L->ck[i].n - 1;
            if (k < 0 || L->valid[i] < L->ck[i].c[k].pos + 2) continue;
            const double wait = L->ended[i] + BL_REREAD_GRACE_S - rl_clock_now();
            if (wait > 0) {
                if (due < 0 || wait < due) due = wait;
                continue;
            }
            rl_err e;
            if (k3_state_restore(st, &L->ck[i].c[k].snap, &e) != 0) continue;
            L->reread[i] = L->valid[i];
            L->valid[i] = st->n_past;
        }
        const uint32_t end = L->reread[i], at = st->n_past;
        uint32_t n = end - at < L->chunk ? end - at : L->chunk;
        if (end - at - n == 1) n--; /* never leave one token (scheduler.c, sch_piece) */
        bl_read_piece(L, i, n, "re-reading a finished sequence");
        L->valid[i] = st->n_past; /* what it read so far (all of the piece, or, failing, none) */
        if (st->n_past == at || st->n_past >= end) L->reread[i] = 0;
        return 1;
    }
    /* Then a prompt resent as it was (a client's "regenerate", retries) must resume at most two tokens
     * before its end, where no checkpoint is: one is made there from the checkpoint before it when that is
     * one piece away (a later turn's prompt: its new tokens; a first turn's long prompt is not read again).
     * Not while a re-read waits out its grace: a turn sent at once must not wait for this either. */
    for (int i = 0; L->cache && due < 0 && i < L->n_slots; i++) {
        if (L->ended[i] + BL_REREAD_GRACE_S > rl_clock_now()) {
            due = L->ended[i] + BL_REREAD_GRACE_S - rl_clock_now();
            break;
        }
        const k3_ckpt *c = L->ck[i].c;
        int e = L->ck[i].n - 1;
        while (e >= 0 && !c[e].end) e--;
        if (e < 0 || c[e].pos < 3 || L->reread[i] != 0) continue;
        const uint32_t target = c[e].pos - 2;
        int b = e - 1;
        while (b >= 0 && c[b].pos > target) b--;
        const uint32_t from = b >= 0 ? c[b].pos : 0;
        if (from == target || target - from < 2 || target - from > L->chunk || L->valid[i] < target) continue;
        rl_err err;
        if (b >= 0 ? k3_state_restore(&L->st[i], &c[b].snap, &err) != 0 : (k3_state_reset(&L->st[i]), 0)) continue;
        /* (failing, the prompt's end stops asking for it: idle work is never retried in a loop) */
        if (!bl_read_piece(L, i, target - from, "making a checkpoint before a prompt's end")) L->ck[i].c[e].end = false;
        return 1;
    }
    return due < 0 ? 0 : -(int)(due * 1000.0 + 1.0);
}

static void sch_local_cache_stats(void *impl, sch_cache_stat *out) {
    sch_local *L = impl;
    memset(out, 0, sizeof *out);
    for (int i = 0; L->cache && i < L->n_slots; i++) {
        for (int k = 0; k < L->ck[i].n; k++) out->ckpt_bytes += L->ck[i].c[k].snap.n_bytes;
        out->ckpts += (uint64_t)L->ck[i].n;
    }
    out->entries = (uint64_t)L->host.n;
    out->host_bytes = L->host.bytes;
    out->host_budget = L->host.budget;
    out->stored = L->host.stored;
    out->evicted = L->host.evicted;
    out->corrupt = L->host.corrupt;
    out->exact = L->exact;
}

static int sch_local_pass(sch_local *L, sch_step *steps, int n, rl_err *err);

/* One step. A speculative entry keeps rollback copies, which puts the whole forward pass on step kernels
 * (k3_batch.keep_rollback): a prompt piece in the same pass would be read token by token and round as no other
 * split of its prompt does (docs/numerics.md), so its text would depend on what else ran. Such a step runs as
 * two passes: the speculative entries (with the decode tokens), then the prompt pieces. */
static int sch_local_step(void *impl, sch_step *steps, int n, rl_err *err) {
    sch_local *L = impl;
    int n_spec = 0, n_piece = 0;
    for (int i = 0; i < n; i++) {
        n_spec += steps[i].n_draft > 0;
        n_piece += steps[i].n_draft == 0 && steps[i].n_tokens >= 2;
    }
    if (n_spec == 0 || n_piece == 0) return sch_local_pass(L, steps, n, err);
    sch_step *sub = malloc((size_t)n * sizeof *sub);
    int *at = malloc((size_t)n * sizeof *at);
    float *held = NULL;
    int rc = -1;
    if (!sub || !at) {
        rl_errf(err, "out of memory splitting a step");
        goto out;
    }
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (!(steps[i].n_draft == 0 && steps[i].n_tokens >= 2)) at[k] = i, sub[k++] = steps[i];
    }
    const int n1 = k;
    if (sch_local_pass(L, sub, n1, err) != 0) goto out;
    /* The first pass's features live in L->feat, which the second pass reuses: keep a copy. */
    size_t n_feat = 0;
    const size_t row = (size_t)L->n_taps * L->e->hp.n_embd;
    for (int j = 0; j < n1; j++) n_feat += sub[j].feat ? sub[j].n_tokens * row : 0;
    if (n_feat && !(held = malloc(n_feat * sizeof *held))) {
        rl_errf(err, "out of memory splitting a step");
        goto out;
    }
    for (int j = 0, off = 0; j < n1; j++) {
        if (!sub[j].feat) continue;
        memcpy(held + off, sub[j].feat, sub[j].n_tokens * row * sizeof *held);
        sub[j].feat = held + off;
        off += (int)(sub[j].n_tokens * row);
    }
    for (int i = 0; i < n; i++) {
        if (steps[i].n_draft == 0 && steps[i].n_tokens >= 2) at[k] = i, sub[k++] = steps[i];
    }
    if (sch_local_pass(L, sub + n1, k - n1, err) != 0) goto out;
    for (int j = 0; j < k; j++) steps[at[j]] = sub[j];
    free(L->feat_held);
    L->feat_held = held; /* valid until the next step, as L->feat is */
    held = NULL;
    rc = 0;
out:
    free(held);
    free(sub);
    free(at);
    return rc;
}

static int sch_local_pass(sch_local *L, sch_step *steps, int n, rl_err *err) {
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
            if (sp->n_cached == 0 || !L->cache || L->st[sp->slot].n_past != sp->n_cached) {
                if (sp->n_cached > 0) return rl_errf(err, "slot %d begins after %u cached tokens it does not hold", sp->slot, sp->n_cached);
                k3_state_reset(&L->st[sp->slot]);
                L->valid[sp->slot] = 0;
                if (L->cache) k3_ckpts_drop(&L->ck[sp->slot], 0);
            }
            if (L->has_smp[sp->slot]) smp_free(&L->smp[sp->slot]);
            L->has_smp[sp->slot] = false;
            if (smp_init(&L->smp[sp->slot], sp->smp, n_vocab, err) != 0) return -1;
            L->has_smp[sp->slot] = true;
            /* The cached prefix is part of the sequence: its tokens enter the penalty history first. */
            for (uint32_t t = 0; t < sp->n_cached; t++) smp_accept(&L->smp[sp->slot], bl_held(L, sp->slot)[t]);
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
        if (L->cache) { /* the tokens the slot's state reads, by position (what a later prompt is matched with) */
            const uint32_t p0 = L->st[sp->slot].n_past;
            for (uint32_t t = 0; t < sp->n_tokens && p0 + t < L->n_ctx; t++) bl_held(L, sp->slot)[p0 + t] = sp->tokens[t];
        }
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
    /* Prompt pieces take the split-invariant path: a prompt gives the same bits however the steps cut it, and
     * whether or not its start came from the prompt cache (docs/numerics.md). */
    k3_batch b = {.n_seqs = n, .seqs = L->seqs, .n_tokens = L->ntok, .tokens = L->tokens, .keep_rollback = L->keep,
                  .split_invariant = true,
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
        if (sp->ckpt && L->cache && sp->n_draft == 0 && sp->n_tokens >= 2) {
            rl_err e;
            if (k3_ckpts_take(&L->ck[sp->slot], &L->st[sp->slot], &e) != 0) {
                fprintf(stderr, "ringlm serve: no prompt checkpoint kept: %s\n", e.msg);
            } else if (sp->sample) { /* (it may have been too old to keep) */
                const int k = k3_ckpts_at(&L->ck[sp->slot], L->st[sp->slot].n_past);
                if (k >= 0) L->ck[sp->slot].c[k].end = true;
            }
        }
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
    sch_local *L = impl; /* states are reused: the next begin resets them */
    if (L->cache && slot >= 0 && slot < L->n_slots) L->ended[slot] = rl_clock_now();
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
    for (int i = 0; L->ck && i < L->n_slots; i++) k3_ckpts_free(&L->ck[i]);
    free(L->ck);
    free(L->held);
    free(L->reread);
    free(L->ended);
    pc_free(&L->host);
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
    free(L->feat_held);
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
    if (L->cache) {
        k3_ckpts_drop(&L->ck[dst], 0);
        L->valid[dst] = 0;
    }
    if (k3_state_copy(&L->st[dst], &L->st[src], err) != 0) return -1;
    if (L->cache) memcpy(bl_held(L, dst), bl_held(L, src), (size_t)L->st[src].n_past * sizeof(int32_t));
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
    snprintf(L->node.reach, sizeof L->node.reach, "local");
    L->node.layer_a = 0;
    L->node.layer_b = e->hp.n_layer;
    L->node.up = true;
    L->n_ctx = n_ctx;
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

int sch_local_cache_on(sch_backend *be, const sch_local_cache_opts *o, rl_err *err) {
    sch_local *L = be->impl;
    if (!L || be->step != sch_local_step) return rl_errf(err, "not a local backend");
    if (o->ctx_checkpoints < 1) return rl_errf(err, "--ctx-checkpoints must be at least 1 (got %d)", o->ctx_checkpoints);
    /* The host cache must hold one prefix at full context, else it could never keep a long conversation. */
    const size_t one = pc_entry_bytes(L->n_ctx, k3_state_kda_bytes(&L->st[0]) + k3_state_rows_bytes(&L->st[0], L->n_ctx));
    if (o->ram_bytes > 0 && o->ram_bytes < one) {
        return rl_errf(err, "--cache-ram %.1f MiB cannot hold one cached prefix at full context (%u tokens): it needs "
                       "%.1f MiB (or 0 to keep prefixes in the slots only)", (double)o->ram_bytes / 1048576.0, L->n_ctx,
                       (double)one / 1048576.0);
    }
    L->ck = calloc((size_t)L->n_slots, sizeof *L->ck);
    for (int i = 0; L->ck && i < L->n_slots; i++) {
        if (k3_ckpts_init(&L->ck[i], o->ctx_checkpoints, err) != 0) {
            for (int k = 0; k < i; k++) k3_ckpts_free(&L->ck[k]);
            free(L->ck);
            L->ck = NULL;
            return -1;
        }
    }
    L->held = malloc((size_t)L->n_slots * L->n_ctx * sizeof *L->held);
    L->reread = calloc((size_t)L->n_slots, sizeof *L->reread);
    L->ended = calloc((size_t)L->n_slots, sizeof *L->ended);
    if (!L->ck || !L->held || !L->reread || !L->ended) {
        for (int i = 0; L->ck && i < L->n_slots; i++) k3_ckpts_free(&L->ck[i]);
        free(L->ck), free(L->held), free(L->reread), free(L->ended);
        L->ck = NULL, L->held = NULL, L->reread = NULL, L->ended = NULL;
        return rl_errf(err, "out of memory for the prompt cache's index");
    }
    pc_init(&L->host, o->ram_bytes);
    L->exact = o->exact;
    L->chunk = o->reread_chunk >= 2 ? o->reread_chunk : 256;
    L->cache = true;
    be->idle = sch_local_idle;
    be->resume = sch_local_resume;
    be->match = sch_local_match;
    be->cache_stats = sch_local_cache_stats;
    return 0;
}

size_t sch_local_ckpt_bytes(const sch_backend *be) {
    const sch_local *L = be->impl;
    return k3_state_kda_bytes(&L->st[0]);
}
