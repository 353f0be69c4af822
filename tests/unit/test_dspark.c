/* test_dspark - the DSpark draft graph (src/spec/dspark.c) against an independent plain-C reference
 * (dspark_ref.h, written from spec §10.1.3 and docs/dspark.md only, not from the graph).
 *
 * In process, into a temp dir: `tiny` K3 targets and their synthesized DSpark drafts: seeds 1 and 2, the
 * draft stored as f32, q8_0 and q4_K, plus a q8_0 target; and four variants of a synthesized draft (keys and
 * optional tensors the synthesizer never writes): causal + fc.scale + markov_w2.scale, sample_from_anchor =
 * false (a bonus-anchor block: slot 0 unbiased, drafting from slot 1), no block_size key (16 applies), and
 * no Markov or confidence head (a plain DFlash file).
 * Seeded random features; the context grows 1 -> 5 -> 37 rows, pushed in pieces with a block after each
 * stage, so the injection is incremental. Each configuration runs in a child process: a graph that aborts
 * is one failed check. Checked:
 *   1. logits: max |ours - ref| / max |ref| <= 1e-4 with f32 weights (measured ~2.6e-7); <= 2e-2 with a
 *      quantized draft or target (measured <= 9.1e-3: ggml quantizes the activations to 8 bits in its
 *      matmuls, the reference does not); confidences (f32 <= 1e-3, quantized <= 1e-2); each slot's token
 *      is the argmax of its own logits, and equals the reference's wherever the reference's top two are
 *      further apart than twice that slot's max logit difference. The reference follows the graph's own
 *      chain of tokens (dspark_ref_block_ex's `chain`), so a near-tie does not make later slots incomparable;
 *   2. every n_block from 1 to block_size, against the reference;
 *   3. the Markov chain: slot i's bias is markov_w2 . markov_w1[tokens[i-1]] (the anchor's for the first
 *      drafting slot), and not another token's;
 *   4. determinism (the same call twice), dspark_reset + the same pushes (identical), all rows in one push or
 *      in pieces without blocks between == pieces with blocks between (<= 1e-5 relative: only the matmul
 *      batch shapes differ);
 *   5. refusals with a message and no crash: a block longer than block_size or DSPARK_MAX_BLOCK, a row past
 *      the n_ctx given at open, an anchor outside the vocabulary, a draft opened against a target of another
 *      vocabulary or another width, a kimi-k3 file opened as a draft;
 *   6. the reference's own primitives (RoPE, RMSNorm, the matrix convention, attention) on hand-computed
 *      values, and that each variant's change alone moves the reference's logits (so no variant passes
 *      vacuously). */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "model/k3_hparams.h"
#include "speculate/dspark.h"
#include "tools/synth.h"
#include "tools/synth_config.h"
#include "tools/synth_dspark.h"

#include "check.h"
#include "dspark_ref.h"

#define N_CTX_MAX 37
#define N_THREADS 2

/* ---- helpers ------------------------------------------------------------------------------------- */

static uint64_t rng_next(uint64_t *s) {
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    uint64_t x = *s;
    x ^= x >> 33, x *= 0xff51afd7ed558ccdULL, x ^= x >> 33;
    return x;
}
static double rng_unit(uint64_t *s) { return ((double)(rng_next(s) >> 11) + 0.5) / 9007199254740992.0; }
static double rng_normal(uint64_t *s) { return sqrt(-2.0 * log(rng_unit(s))) * cos(6.283185307179586 * rng_unit(s)); }

static int synth_target(const char *cfg, const char *path, uint64_t seed, const char *type, rl_err *err) {
    synth_config c;
    if (synth_config_load(&c, cfg, err) != 0) return -1;
    c.type = synth_type_parse(type);
    c.n_over = 0;
    synth_opts o = {.out = path, .seed = seed, .n_split = 1, .n_threads = N_THREADS};
    return synth_write(&c, &o, err);
}

/* The DSpark draft for target config cfg, its matrices stored as `type` (as `ringlm synth --draft dspark`). */
static int synth_draft(const char *cfg, const char *type, const char *path, uint64_t seed, rl_err *err) {
    synth_config c;
    if (synth_config_load(&c, cfg, err) != 0) return -1;
    c.type = synth_type_parse(type);
    c.n_over = 0;
    synth_opts o = {.out = path, .seed = seed, .n_split = 1, .n_threads = N_THREADS};
    return synth_dspark_write(&c, &o, err);
}

static float max_abs(const float *a, size_t n) {
    float m = 0;
    for (size_t i = 0; i < n; i++) m = fmaxf(m, fabsf(a[i]));
    return m;
}
static float max_abs_diff(const float *a, const float *b, size_t n) {
    float m = 0;
    for (size_t i = 0; i < n; i++) {
        float dd = fabsf(a[i] - b[i]);
        if (!(dd <= m)) m = dd; /* NaN wins */
    }
    return m;
}
static bool all_finite(const float *a, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i])) return false;
    }
    return true;
}
/* The gap between the largest and the second largest value. */
static float top2_margin(const float *v, uint32_t n) {
    float a = -INFINITY, b = -INFINITY;
    for (uint32_t i = 0; i < n; i++) {
        if (v[i] > a) b = a, a = v[i];
        else if (v[i] > b) b = v[i];
    }
    return a - b;
}

/* ---- one configuration --------------------------------------------------------------------------- */

typedef struct worst {
    float logit_rel, conf_abs, chain_rel;
    int blocks, slots, slots_tied, tok_bad, argmax_bad, errors;
} worst;

typedef struct cfg {
    const char *name;
    const mf_model *draft, *target;
    dsr_hparams hp;
    float tol_logit, tol_conf;
    const float *feats;
    dspark *ds;
    worst w;
} cfg;

/* Runs a block on the graph into (logits, out) and returns its rc. */
static int run_block(cfg *c, int32_t anchor, int n_block, float *logits, dspark_out *out) {
    rl_err err = {{0}};
    memset(out, 0, sizeof *out);
    out->logits = logits;
    int rc = dspark_block(c->ds, anchor, n_block, out, &err);
    if (rc != 0) printf("# dspark_block(%d, n_block %d): %s\n", anchor, n_block, err.msg);
    if (rc == 0 && out->n_block != n_block) {
        printf("# dspark_block returned n_block %d for %d\n", out->n_block, n_block);
        rc = -1;
    }
    return rc;
}

/* Compares one graph block at context n_ctx against the reference (following the graph's token chain);
 * accumulates into c->w. Returns the relative logit difference (INFINITY on failure). */
static float compare_block(cfg *c, uint32_t n_ctx, int32_t anchor, int n_block, const float *logits,
                           const dspark_out *out) {
    const uint32_t V = c->hp.V;
    const size_t nl = (size_t)n_block * V;
    float *rl = malloc(nl * sizeof(float));
    int32_t rt[DSPARK_MAX_BLOCK];
    float rc_[DSPARK_MAX_BLOCK];
    rl_err err = {{0}};
    float rel = INFINITY;
    if (dspark_ref_block_ex(c->draft, c->target, c->feats, n_ctx, anchor, n_block, out->tokens, rl, NULL, rt, rc_,
                            &err) != 0) {
        printf("# reference: %s\n", err.msg);
        c->w.errors++;
        free(rl);
        return rel;
    }
    if (!all_finite(rl, nl) || !all_finite(logits, nl)) {
        printf("# %s: non-finite logits (n_ctx %u, n_block %d)\n", c->name, n_ctx, n_block);
        c->w.errors++;
    }
    const float scale = max_abs(rl, nl);
    rel = max_abs_diff(logits, rl, nl) / scale;
    if (!(rel <= c->w.logit_rel)) c->w.logit_rel = rel;
    for (int i = 0; i < n_block; i++) {
        const float *li = logits + (size_t)i * V, *ri = rl + (size_t)i * V;
        if (i >= (c->hp.from_anchor ? 0 : 1)) { /* slot 0 of a bonus-anchor block has no confidence */
            float dc = fabsf(out->conf[i] - rc_[i]);
            if (!(dc <= c->w.conf_abs)) c->w.conf_abs = dc;
        }
        if (out->tokens[i] != dsr_argmax(li, V)) c->w.argmax_bad++;
        c->w.slots++;
        /* |ours - ref| <= delta on every logit: the argmax can move only if the reference's top two are
         * within 2 delta of each other */
        if (top2_margin(ri, V) > 2 * max_abs_diff(li, ri, V)) {
            if (out->tokens[i] != rt[i]) {
                c->w.tok_bad++;
                printf("# %s: slot %d token %d, reference %d (margin %.4g)\n", c->name, i, out->tokens[i], rt[i],
                       top2_margin(ri, V));
            }
        } else {
            c->w.slots_tied++;
        }
    }
    c->w.blocks++;
    free(rl);
    return rel;
}

/* Check 3: slot i's logits minus the reference's base logits is the Markov bias of the token that should
 * condition it (the anchor, then the graph's own previous token), not of another token. */
static void check_chain(cfg *c, uint32_t n_ctx, int32_t anchor, int n_block, const float *logits,
                        const dspark_out *out) {
    const uint32_t V = c->hp.V;
    float *base = malloc((size_t)n_block * V * sizeof(float)), *rl = malloc((size_t)n_block * V * sizeof(float));
    float *bias = malloc(V * sizeof(float)), *obs = malloc(V * sizeof(float));
    int32_t rt[DSPARK_MAX_BLOCK];
    float rc_[DSPARK_MAX_BLOCK];
    rl_err err = {{0}};
    dsr_weights w;
    int ok_true = 0, ok_alt = 0, n = 0;
    float worst_true = 0, best_alt = INFINITY;
    if (dspark_ref_block_ex(c->draft, c->target, c->feats, n_ctx, anchor, n_block, out->tokens, rl, base, rt, rc_,
                            &err) != 0 ||
        dsr_load_weights(c->draft, c->target, &c->hp, &w, &err) != 0) {
        printf("# reference: %s\n", err.msg);
        goto done;
    }
    const float scale = max_abs(base, (size_t)n_block * V);
    for (int i = c->hp.from_anchor ? 0 : 1; i < n_block; i++) {
        const int32_t prev = i == (c->hp.from_anchor ? 0 : 1) ? anchor : out->tokens[i - 1];
        for (uint32_t t = 0; t < V; t++) obs[t] = logits[(size_t)i * V + t] - base[(size_t)i * V + t];
        dsr_markov_bias(&c->hp, &w, prev, bias);
        float e_true = max_abs_diff(obs, bias, V) / scale;
        dsr_markov_bias(&c->hp, &w, (int32_t)((prev + 1 + (uint32_t)i * 7) % V), bias);
        float e_alt = max_abs_diff(obs, bias, V) / scale;
        worst_true = fmaxf(worst_true, e_true), best_alt = fminf(best_alt, e_alt);
        ok_true += e_true <= c->tol_logit;
        ok_alt += e_alt > 3 * e_true && e_alt > 3 * c->tol_logit;
        n++;
    }
    dsr_free_weights(&w);
    if (worst_true > c->w.chain_rel) c->w.chain_rel = worst_true;
done:
    CHECK(n > 0 && ok_true == n && ok_alt == n,
          "%s: Markov chain, slot i biased by tokens[i-1] (the anchor for the first drafting slot): %d/%d slots within tolerance "
          "(worst %.2e), another token's bias off by >= %.2e",
          c->name, ok_true, n, worst_true, best_alt);
    free(base), free(rl), free(bias), free(obs);
}

static int push(cfg *c, uint32_t from, uint32_t n) {
    rl_err err = {{0}};
    const size_t row = (size_t)c->hp.n_taps * c->hp.d;
    int rc = dspark_push(c->ds, c->feats + from * row, n, &err);
    if (rc != 0) printf("# dspark_push(%u rows at %u): %s\n", n, from, err.msg);
    return rc;
}

static void run_config(cfg *c, const char *draft_path, const mf_model *tm, const k3_hparams *thp, uint64_t seed) {
    const uint32_t V = c->hp.V, B = c->hp.block_size;
    dspark ds;
    rl_err err = {{0}};
    int rc = dspark_open(&ds, draft_path, tm, thp, 64, 1, &err);
    CHECK(rc == 0, "%s: dspark_open%s%s", c->name, rc ? ": " : "", rc ? err.msg : "");
    if (rc != 0) return;
    c->ds = &ds;
    CHECK(ds.n_embd == c->hp.d && ds.n_vocab == V && ds.n_taps == c->hp.n_taps && ds.block_size == B &&
              ds.mask_id == c->hp.mask_id && ds.from_anchor == c->hp.from_anchor && ds.causal == c->hp.causal &&
              ds.n_layer == c->hp.n_layer && ds.n_head == c->hp.n_head && ds.n_head_kv == c->hp.n_head_kv,
          "%s: hyperparameters as the file says (d %u, V %u, %u taps, block %u, mask %d, anchor-first %d, %u "
          "layers, %u/%u heads)",
          c->name, ds.n_embd, ds.n_vocab, ds.n_taps, ds.block_size, ds.mask_id, ds.from_anchor, ds.n_layer,
          ds.n_head, ds.n_head_kv);

    const size_t nl = (size_t)B * V;
    float *l1 = malloc(nl * sizeof(float)), *l2 = malloc(nl * sizeof(float)), *l37 = malloc(nl * sizeof(float));
    dspark_out o1, o2, o37;
    uint64_t rs = seed * 977 + 13;
    int32_t anchors[3];
    for (int k = 0; k < 3; k++) anchors[k] = (int32_t)(rng_next(&rs) % V);

    /* 1. the context grows 1 -> 5 -> 37, pushed in pieces, with a block after each stage */
    const uint32_t stages[3] = {1, 5, N_CTX_MAX};
    float rel_stage[3] = {INFINITY, INFINITY, INFINITY};
    int ok = push(c, 0, 1) == 0 && run_block(c, anchors[0], (int)B, l1, &o1) == 0;
    if (ok) rel_stage[0] = compare_block(c, 1, anchors[0], (int)B, l1, &o1);
    ok = ok && push(c, 1, 1) == 0 && push(c, 2, 3) == 0 && run_block(c, anchors[1], (int)B, l1, &o1) == 0;
    if (ok) rel_stage[1] = compare_block(c, 5, anchors[1], (int)B, l1, &o1);
    ok = ok && push(c, 5, 10) == 0 && push(c, 15, 22) == 0 && run_block(c, anchors[2], (int)B, l37, &o37) == 0;
    if (ok) rel_stage[2] = compare_block(c, N_CTX_MAX, anchors[2], (int)B, l37, &o37);
    for (int k = 0; k < 3; k++) {
        CHECK(rel_stage[k] <= c->tol_logit, "%s: n_ctx %u, block %u: logits rel diff %.3e (tol %.0e)", c->name,
              stages[k], B, rel_stage[k], c->tol_logit);
    }

    /* 3. the Markov chain, on the 37-row block; without a head, every confidence is 1 */
    if (ok && c->hp.has_markov) check_chain(c, N_CTX_MAX, anchors[2], (int)B, l37, &o37);
    if (ok && !c->hp.has_markov) {
        int ones = 0;
        for (uint32_t i = 0; i < B; i++) ones += o37.conf[i] == 1.0f;
        CHECK(ones == (int)B, "%s: no confidence head: every confidence is 1 (%d/%u)", c->name, ones, B);
    }

    /* 4a. the same call twice */
    int same = ok && run_block(c, anchors[2], (int)B, l2, &o2) == 0 && memcmp(l2, l37, nl * sizeof(float)) == 0 &&
               memcmp(o2.tokens, o37.tokens, sizeof o2.tokens) == 0 && memcmp(o2.conf, o37.conf, sizeof o2.conf) == 0;
    CHECK(same, "%s: the same block twice gives identical logits, tokens and confidences", c->name);

    /* 2. every block length, at n_ctx 37 */
    int n_ok = 0;
    float worst_nb = 0;
    for (int nb = 1; ok && nb <= (int)B; nb++) {
        int32_t a = (int32_t)(rng_next(&rs) % V);
        if (run_block(c, a, nb, l2, &o2) != 0) break;
        float r = compare_block(c, N_CTX_MAX, a, nb, l2, &o2);
        worst_nb = fmaxf(worst_nb, r);
        n_ok += r <= c->tol_logit;
    }
    CHECK(n_ok == (int)B, "%s: n_block 1..%u all match the reference (%d/%u, worst rel %.3e)", c->name, B, n_ok, B,
          worst_nb);

    /* 5a. a block longer than block_size (and than DSPARK_MAX_BLOCK) is refused */
    const int too_long[2] = {(int)B + 1, DSPARK_MAX_BLOCK + 1};
    for (int k = 0; k < 2; k++) {
        const int nb = too_long[k];
        if (k == 1 && nb == too_long[0]) break;
        float *big = malloc((size_t)(nb + 1) * V * sizeof(float));
        dspark_out ob = {.logits = big};
        rl_err e2 = {{0}};
        int r = dspark_block(&ds, anchors[0], nb, &ob, &e2);
        CHECK(r != 0 && e2.msg[0], "%s: a block of %d (block_size %u) is refused: %s", c->name, nb, B, e2.msg);
        free(big);
    }
    /* ... and the draft still works after the refusals */
    same = ok && run_block(c, anchors[2], (int)B, l2, &o2) == 0 && memcmp(l2, l37, nl * sizeof(float)) == 0;
    CHECK(same, "%s: after refused blocks, the same block still gives identical results", c->name);

    /* 4b. reset, the same pushes and blocks again: identical */
    dspark_reset(&ds);
    ok = push(c, 0, 1) == 0 && run_block(c, anchors[0], (int)B, l2, &o2) == 0 && push(c, 1, 1) == 0 &&
         push(c, 2, 3) == 0 && run_block(c, anchors[1], (int)B, l2, &o2) == 0 && push(c, 5, 10) == 0 &&
         push(c, 15, 22) == 0 && run_block(c, anchors[2], (int)B, l2, &o2) == 0;
    CHECK(ok && memcmp(l2, l37, nl * sizeof(float)) == 0 && memcmp(o2.tokens, o37.tokens, sizeof o2.tokens) == 0,
          "%s: dspark_reset then the same pushes give identical results", c->name);

    /* 4c. all 37 rows in one push; and in pieces with no block between them */
    dspark_reset(&ds);
    ok = push(c, 0, N_CTX_MAX) == 0 && run_block(c, anchors[2], (int)B, l2, &o2) == 0;
    float r_all = ok ? max_abs_diff(l2, l37, nl) / max_abs(l37, nl) : INFINITY;
    CHECK(r_all <= 1e-5f && memcmp(o2.tokens, o37.tokens, sizeof o2.tokens) == 0,
          "%s: one push of 37 rows == pushes of 1+1+3+10+22 with blocks between (rel %.2e)", c->name, r_all);
    dspark_reset(&ds);
    ok = push(c, 0, 4) == 0 && push(c, 4, 30) == 0 && push(c, 34, 3) == 0 &&
         run_block(c, anchors[2], (int)B, l2, &o2) == 0;
    float r_pieces = ok ? max_abs_diff(l2, l37, nl) / max_abs(l37, nl) : INFINITY;
    CHECK(r_pieces <= 1e-5f && memcmp(o2.tokens, o37.tokens, sizeof o2.tokens) == 0,
          "%s: pushes of 4+30+3 rows then one block == the same rows pushed with blocks between (rel %.2e)", c->name,
          r_pieces);

    /* 5c. beyond the context capacity given at open (64 rows): refused at the push or at the next block, with a
     * message, no crash; after a reset the draft works again */
    dspark_reset(&ds);
    ok = push(c, 0, N_CTX_MAX) == 0 && push(c, 0, 64 - N_CTX_MAX) == 0; /* exactly full */
    CHECK(ok && run_block(c, anchors[0], (int)B, l2, &o2) == 0, "%s: a context of exactly n_ctx (64) rows works",
          c->name);
    {
        rl_err e2 = {{0}};
        int r = dspark_push(&ds, c->feats, 1, &e2);
        if (r == 0) {
            dspark_out ob = {.logits = l2};
            r = dspark_block(&ds, anchors[0], (int)B, &ob, &e2);
        }
        CHECK(r != 0 && e2.msg[0], "%s: row 65 of a 64-row context is refused (at push or block): %s", c->name, e2.msg);
    }
    /* an anchor outside the vocabulary is refused, not looked up */
    for (int k = 0; k < 2; k++) {
        rl_err e2 = {{0}};
        dspark_out ob = {.logits = l2};
        const int32_t bad = k == 0 ? -1 : (int32_t)V;
        int r = dspark_block(&ds, bad, (int)B, &ob, &e2);
        CHECK(r != 0 && e2.msg[0], "%s: anchor %d (V = %u) is refused: %s", c->name, bad, V, e2.msg);
    }
    dspark_reset(&ds);
    ok = push(c, 0, N_CTX_MAX) == 0 && run_block(c, anchors[2], (int)B, l2, &o2) == 0;
    CHECK(ok && max_abs_diff(l2, l37, nl) / max_abs(l37, nl) <= 1e-5f,
          "%s: after those refusals and a reset, the 37-row block is as before", c->name);

    /* the totals of check 1 over every block compared in this configuration */
    CHECK(c->w.errors == 0 && c->w.logit_rel <= c->tol_logit,
          "%s: worst logits rel diff over %d blocks %.3e (tol %.0e)", c->name, c->w.blocks, c->w.logit_rel,
          c->tol_logit);
    CHECK(c->w.conf_abs <= c->tol_conf, "%s: worst confidence abs diff %.3e (tol %.0e)", c->name, c->w.conf_abs,
          c->tol_conf);
    CHECK(c->w.argmax_bad == 0, "%s: every slot's token is the argmax of its own logits (%d of %d are not)", c->name,
          c->w.argmax_bad, c->w.slots);
    CHECK(c->w.tok_bad == 0, "%s: tokens equal the reference's wherever its top-2 margin exceeds twice the slot's max logit "
          "difference (%d differ; %d of %d slots that close to a tie, not compared)", c->name, c->w.tok_bad, c->w.slots_tied, c->w.slots);
    dspark_close(&ds);
    free(l1), free(l2), free(l37);
}

/* ---- refusals at open ----------------------------------------------------------------------------- */

static void check_open_refused(const char *what, const char *draft_path, const char *target_path) {
    mf_model m;
    k3_hparams hp;
    rl_err err = {{0}};
    if (k3_open(&m, &hp, target_path, &err) != 0) {
        CHECK(0, "open refusal (%s): cannot open its target: %s", what, err.msg);
        return;
    }
    dspark ds;
    err.msg[0] = 0;
    int rc = dspark_open(&ds, draft_path, &m, &hp, 64, 1, &err);
    CHECK(rc != 0 && err.msg[0], "dspark_open refuses %s: %s", what, rc ? err.msg : "(accepted)");
    if (rc == 0) dspark_close(&ds);
    mf_close(&m);
}

static int write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fputs(text, f);
    return fclose(f);
}

/* Removes the temp dir's files (flat) and the dir. */
static void rm_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    char p[600];
    for (struct dirent *e; (e = readdir(d));) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

/* 5b. refusals at open: another vocabulary, another width, a target file as the draft */
static void check_open_refusals(const char *dir, const char *first_draft, const char *first_target) {
    rl_err err = {{0}};
    char cfgpath[512], other[512];
    snprintf(cfgpath, sizeof cfgpath, "%s/vocab2048.json", dir);
    snprintf(other, sizeof other, "%s/tv.gguf", dir);
    if (write_text(cfgpath, "{\"base\": \"tiny\", \"n_vocab\": 2048}\n") != 0 || synth_target(cfgpath, other, 5, "f32", &err) != 0) {
        CHECK(0, "synth a tiny target with 2048 tokens: %s", err.msg);
    } else if (first_draft[0]) {
        check_open_refused("a target of another vocabulary (2048, the draft has 1024)", first_draft, other);
    }
    snprintf(cfgpath, sizeof cfgpath, "%s/embd128.json", dir);
    snprintf(other, sizeof other, "%s/te.gguf", dir);
    if (write_text(cfgpath, "{\"base\": \"tiny\", \"n_embd\": 128}\n") != 0 || synth_target(cfgpath, other, 6, "f32", &err) != 0) {
        CHECK(0, "synth a tiny target of width 128: %s", err.msg);
    } else if (first_draft[0]) {
        check_open_refused("a target of another width (128, the draft has 256)", first_draft, other);
    }
    if (first_target[0]) check_open_refused("a kimi-k3 file as the draft", first_target, first_target);
}

/* ---- the reference's own primitives (so a wrong oracle cannot agree with a wrong graph by accident) ------ */

static void check_reference_primitives(void) {
    /* NeoX RoPE: position 0 is the identity; pairs are (i, i + hd/2); a rotation keeps the norm */
    float v[8] = {1, 2, 3, 4, 5, 6, 7, 8}, u[8];
    memcpy(u, v, sizeof v);
    dsr_rope_neox(u, 8, 10000.0f, 0);
    bool id0 = memcmp(u, v, sizeof v) == 0;
    memcpy(u, v, sizeof v);
    dsr_rope_neox(u, 8, 10000.0f, 3);
    /* pair 0: (v0, v4) rotated by 3 rad; pair 1: (v1, v5) by 3 * 10000^(-1/4) = 0.3 rad */
    bool pair0 = fabs(u[0] - (1 * cos(3.0) - 5 * sin(3.0))) < 1e-5 && fabs(u[4] - (1 * sin(3.0) + 5 * cos(3.0))) < 1e-5;
    bool pair1 = fabs(u[1] - (2 * cos(0.3) - 6 * sin(0.3))) < 1e-5 && fabs(u[5] - (2 * sin(0.3) + 6 * cos(0.3))) < 1e-5;
    double n0 = 0, n1 = 0;
    for (int i = 0; i < 8; i++) n0 += (double)v[i] * v[i], n1 += (double)u[i] * u[i];
    CHECK(id0 && pair0 && pair1 && fabs(n0 - n1) < 1e-3, "reference: NeoX RoPE (identity at 0, pairs (i, i+hd/2), "
          "theta = pos base^(-2i/hd), norm kept)");

    /* RMSNorm: x / sqrt(mean(x^2) + eps) * w */
    float x[4] = {1, -2, 3, -4}, w[4] = {1, 2, 1, 0.5f}, y[4];
    dsr_rmsnorm(x, 4, w, 1e-6f, y);
    const double r = 1.0 / sqrt(30.0 / 4 + 1e-6);
    CHECK(fabs(y[0] - r) < 1e-6 && fabs(y[1] + 4 * r) < 1e-6 && fabs(y[3] + 2 * r) < 1e-6, "reference: RMSNorm");

    /* matvec convention: W {in 3, out 2}, row j = output j */
    const float W[6] = {1, 2, 3, 4, 5, 6}, xv[3] = {1, 0, -1};
    float yv[2];
    dsr_matvec(W, 3, 2, xv, yv);
    CHECK(yv[0] == -2 && yv[1] == -2, "reference: W {in, out} . x, row j = output j");

    /* attention: 2 heads over 1 kv head (GQA), 1 context key + 2 block keys, causal and not */
    dsr_hparams hp = {.n_head = 2, .n_head_kv = 1, .hd = 2};
    const float q[2 * 4] = {1, 0, 0, 1, /* slot 1 */ 1, 0, 0, 1};
    const float K[3 * 2] = {0, 0, 0, 0, 0, 0}; /* all scores 0: uniform weights */
    const float Vv[3 * 2] = {3, 0, 0, 3, 6, 6};
    float o[2 * 4];
    dsr_attention(&hp, q, K, Vv, 1, 2, o);
    bool nc = fabsf(o[0] - 3) < 1e-6f && fabsf(o[1] - 3) < 1e-6f && fabsf(o[2] - 3) < 1e-6f && fabsf(o[4] - 3) < 1e-6f;
    hp.causal = true;
    dsr_attention(&hp, q, K, Vv, 1, 2, o);
    bool ca = fabsf(o[0] - 1.5f) < 1e-6f && fabsf(o[1] - 1.5f) < 1e-6f && fabsf(o[4] - 3) < 1e-6f; /* slot 0: ctx + itself */
    const float K2[3 * 2] = {1, 0, 0, 0, 0, 0};
    hp.causal = false;
    dsr_attention(&hp, q, K2, Vv, 1, 2, o);
    const double e = exp(1.0 / sqrt(2.0)), p0 = e / (e + 2);
    bool sc = fabs(o[0] - (p0 * 3 + (1 - p0) / 2 * 6)) < 1e-5 && fabsf(o[2] - 3) < 1e-6f; /* head 1: q.k = 0 */
    CHECK(nc && ca && sc, "reference: attention (uniform, causal slot 0 sees ctx + itself, scale 1/sqrt(hd), GQA)");
}

/* A variant of a draft file: the same tensors and keys, with `dflash.attention.causal` = true or
 * `dflash.sample_from_anchor` = false, `dflash.block_size` removed (the default, 16, applies), the
 * optional scalar tensors fc.scale / markov_w2.scale added when their value is nonzero, or the Markov and
 * confidence heads dropped (a plain DFlash file). The synthesizer writes none of these. */
static int write_variant(const char *src, const char *dst, bool causal, bool bonus_anchor, bool drop_block_size,
                         float fc_scale, float w2_scale, bool drop_heads, rl_err *err) {
    struct ggml_context *data = NULL;
    struct gguf_init_params ip = {.no_alloc = false, .ctx = &data};
    struct gguf_context *in = gguf_init_from_file(src, ip);
    if (!in) return rl_errf(err, "variant: cannot read %s", src);
    /* a fresh context: the keys copied, the tensors taken from the loaded data context (which holds them) */
    struct gguf_context *g = gguf_init_empty();
    gguf_set_kv(g, in);
    for (int64_t i = 0; i < gguf_get_n_tensors(in); i++) {
        const char *tn = gguf_get_tensor_name(in, i);
        if (drop_heads && (strncmp(tn, "markov_", 7) == 0 || strncmp(tn, "conf_proj.", 10) == 0)) continue;
        gguf_add_tensor(g, ggml_get_tensor(data, tn));
    }
    if (causal) gguf_set_val_bool(g, "dflash.attention.causal", true);
    if (bonus_anchor) gguf_set_val_bool(g, "dflash.sample_from_anchor", false);
    if (drop_block_size) gguf_remove_key(g, "dflash.block_size");
    struct ggml_init_params cp = {.mem_size = 4 * ggml_tensor_overhead() + 1024, .mem_buffer = NULL, .no_alloc = false};
    struct ggml_context *extra = ggml_init(cp);
    const char *names[2] = {"fc.scale", "markov_w2.scale"};
    const float vals[2] = {fc_scale, w2_scale};
    for (int k = 0; k < 2; k++) {
        if (vals[k] == 0) continue;
        struct ggml_tensor *t = ggml_new_tensor_1d(extra, GGML_TYPE_F32, 1);
        ggml_set_name(t, names[k]);
        *(float *)t->data = vals[k];
        gguf_add_tensor(g, t);
    }
    bool ok = gguf_write_to_file(g, dst, false);
    gguf_free(g);
    gguf_free(in);
    ggml_free(data);
    ggml_free(extra);
    return ok ? 0 : rl_errf(err, "variant: cannot write %s", dst);
}

/* Each file change a variant makes must move the reference's own logits (else a graph that ignored it would
 * pass vacuously): the change alone, against the file as synthesized, at 5 context rows. */
static void check_variant_effects(const char *dir, const char *base_path, const mf_model *tm, const float *feats) {
    static const char *const what[4] = {"dflash.attention.causal = true", "fc.scale = 0.003",
                                        "markov_w2.scale = 1.7", "dflash.sample_from_anchor = false"};
    mf_model bm;
    rl_err err = {{0}};
    if (mf_open(&bm, base_path, &err) != 0) {
        CHECK(0, "variant effects: %s", err.msg);
        return;
    }
    enum { NB = 7 };
    const uint32_t V = (uint32_t)mf_find(tm, "token_embd.weight")->ne[1];
    float *l0 = malloc((size_t)NB * V * sizeof(float)), *l1 = malloc((size_t)NB * V * sizeof(float));
    int32_t t0[NB], t1[NB];
    float c0[NB], c1[NB];
    int rc = dspark_ref_block(&bm, tm, feats, 5, 17, NB, l0, t0, c0, &err);
    for (int k = 0; k < 4 && rc == 0; k++) {
        char path[600];
        snprintf(path, sizeof path, "%s/effect%d.gguf", dir, k);
        mf_model vm;
        float rel = 0;
        if (write_variant(base_path, path, k == 0, k == 3, false, k == 1 ? 0.003f : 0, k == 2 ? 1.7f : 0, false,
                          &err) != 0 ||
            mf_open(&vm, path, &err) != 0) {
            CHECK(0, "variant effects (%s): %s", what[k], err.msg);
            continue;
        }
        if (dspark_ref_block(&vm, tm, feats, 5, 17, NB, l1, t1, c1, &err) == 0) {
            rel = max_abs_diff(l0, l1, (size_t)NB * V) / max_abs(l0, (size_t)NB * V);
        } else {
            printf("# reference: %s\n", err.msg);
        }
        CHECK(rel > 1e-3f, "variant effect: %s alone moves the reference's logits by %.2e (relative)", what[k], rel);
        mf_close(&vm);
        unlink(path);
    }
    if (rc != 0) CHECK(0, "variant effects: reference: %s", err.msg);
    free(l0), free(l1);
    mf_close(&bm);
}

/* Runs one configuration in a child process, so that a graph that aborts (a GGML_ASSERT) is one failed check
 * and the other configurations still run. The child's tally and summary line come back through a pipe. */
static void run_config_isolated(cfg *c, const char *draft_path, const mf_model *tm, const k3_hparams *thp,
                                uint64_t seed, char *summary, size_t summary_len) {
    int fds[2];
    snprintf(summary, summary_len, "%s: (no result)", c->name);
    if (pipe(fds) != 0) {
        CHECK(0, "%s: pipe", c->name);
        return;
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
        CHECK(0, "%s: fork", c->name);
        close(fds[0]), close(fds[1]);
        return;
    }
    if (pid == 0) {
        close(fds[0]);
        n_pass = n_fail = 0;
        run_config(c, draft_path, tm, thp, seed);
        char line[256];
        snprintf(line, sizeof line,
                 "%s: logits rel %.3e  conf abs %.3e  chain rel %.3e  (%d blocks; %d/%d slots near a tie)", c->name,
                 c->w.logit_rel, c->w.conf_abs, c->w.chain_rel, c->w.blocks, c->w.slots_tied, c->w.slots);
        int counts[2] = {n_pass, n_fail};
        fflush(stdout);
        if (write(fds[1], counts, sizeof counts) != (ssize_t)sizeof counts ||
            write(fds[1], line, sizeof line) != (ssize_t)sizeof line) {
            _exit(2);
        }
        _exit(0);
    }
    close(fds[1]);
    int counts[2] = {0, 0};
    char line[256] = "";
    bool got = read(fds[0], counts, sizeof counts) == (ssize_t)sizeof counts &&
               read(fds[0], line, sizeof line) == (ssize_t)sizeof line;
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (got) {
        n_pass += counts[0], n_fail += counts[1];
        snprintf(summary, summary_len, "%s", line);
    }
    CHECK(got && WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s: ran to the end (%s)", c->name,
          WIFSIGNALED(status) ? "killed by a signal: the graph crashed, see above" : "exit status");
    if (WIFSIGNALED(status)) snprintf(summary, summary_len, "%s: CRASHED (signal %d)", c->name, WTERMSIG(status));
}

typedef struct run_spec {
    uint64_t seed;
    const char *target_type, *draft_type;
    float tol_logit, tol_conf;
    int variant; /* 0: as synthesized; 1: causal, fc.scale, markov_w2.scale; 2: bonus anchor; 3: no block_size;
                  * 4: no Markov/confidence head */
} run_spec;

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0); /* a graph that aborts still leaves every line before it */
    char dir[] = "/tmp/ringlm-dspark-XXXXXX";
    if (!mkdtemp(dir)) return 1;
    rl_err err = {{0}};
    /* f32 everywhere: only summation order differs; quantized: 8-bit activations in ggml's matmuls */
    const run_spec runs[] = {
        {1, "f32", "f32", 1e-4f, 1e-3f, 0},  {1, "f32", "q8_0", 2e-2f, 1e-2f, 0}, {1, "f32", "q4_K", 2e-2f, 1e-2f, 0},
        {2, "f32", "f32", 1e-4f, 1e-3f, 0},  {2, "f32", "q8_0", 2e-2f, 1e-2f, 0}, {2, "f32", "q4_K", 2e-2f, 1e-2f, 0},
        {1, "q8_0", "f32", 2e-2f, 1e-2f, 0}, /* a quantized target: its embedding and LM head are q8_0 */
        {1, "f32", "f32", 1e-4f, 1e-3f, 1}, {2, "f32", "q8_0", 2e-2f, 1e-2f, 3}, {2, "f32", "f32", 1e-4f, 1e-3f, 2},
        {1, "f32", "f32", 1e-4f, 1e-3f, 4},
    };
    static const char *const variant_name[5] = {"", " (causal, fc.scale, markov_w2.scale)", " (bonus anchor)",
                                                 " (no block_size: 16)", " (no Markov or confidence head: DFlash)"};
    const int n_runs = (int)(sizeof runs / sizeof runs[0]);
    char first_draft[512] = "", first_target[512] = "";
    char summary[16][256];
    int n_summary = 0;

    check_reference_primitives();
    for (int ri = 0; ri < n_runs; ri++) {
        const run_spec *rs_ = &runs[ri];
        char tpath[512], base_path[512], path[600], name[128];
        snprintf(tpath, sizeof tpath, "%s/t%llu-%s.gguf", dir, (unsigned long long)rs_->seed, rs_->target_type);
        snprintf(base_path, sizeof base_path, "%s/d%llu-%s.gguf", dir, (unsigned long long)rs_->seed, rs_->draft_type);
        snprintf(name, sizeof name, "seed %llu, %s target, %s draft%s", (unsigned long long)rs_->seed,
                 rs_->target_type, rs_->draft_type, variant_name[rs_->variant]);
        if (access(tpath, F_OK) != 0 && synth_target("tiny", tpath, rs_->seed, rs_->target_type, &err) != 0) {
            CHECK(0, "%s: synth the target: %s", name, err.msg);
            continue;
        }
        if (access(base_path, F_OK) != 0 && synth_draft("tiny", rs_->draft_type, base_path, rs_->seed + 100, &err) != 0) {
            CHECK(0, "%s: synth the draft: %s", name, err.msg);
            continue;
        }
        snprintf(path, sizeof path, "%s", base_path);
        if (rs_->variant) {
            snprintf(path, sizeof path, "%s.v%d.gguf", base_path, rs_->variant);
            const int v = rs_->variant;
            int rc = v == 1 ? write_variant(base_path, path, true, false, false, 0.003f, 1.7f, false, &err)
                            : write_variant(base_path, path, false, v == 2, v == 3, 0, 0, v == 4, &err);
            if (rc != 0) {
                CHECK(0, "%s: %s", name, err.msg);
                continue;
            }
        }
        mf_model tm, dm;
        k3_hparams thp;
        if (k3_open(&tm, &thp, tpath, &err) != 0) {
            CHECK(0, "%s: open the target: %s", name, err.msg);
            continue;
        }
        if (mf_open(&dm, path, &err) != 0) {
            CHECK(0, "%s: mf_open the draft: %s", name, err.msg);
            mf_close(&tm);
            continue;
        }
        if (!first_target[0]) snprintf(first_target, sizeof first_target, "%s", tpath);
        if (!first_draft[0]) snprintf(first_draft, sizeof first_draft, "%s", path);
        cfg c = {.name = name, .draft = &dm, .target = &tm, .tol_logit = rs_->tol_logit, .tol_conf = rs_->tol_conf};
        if (dsr_read_hparams(&dm, &tm, &c.hp, &err) != 0) {
            CHECK(0, "%s: the reference cannot read the draft: %s", name, err.msg);
            mf_close(&dm), mf_close(&tm);
            continue;
        }
        const size_t row = (size_t)c.hp.n_taps * c.hp.d;
        float *feats = malloc(N_CTX_MAX * row * sizeof(float));
        uint64_t rs = rs_->seed * 7919 + (uint64_t)ri;
        for (uint32_t i = 0; i < N_CTX_MAX; i++) {
            const double s = 0.5 + 2.5 * rng_unit(&rs); /* rows of different scales, as hidden states */
            for (size_t k = 0; k < row; k++) feats[i * row + k] = (float)(s * rng_normal(&rs));
        }
        c.feats = feats;
        if (n_summary < 16) {
            run_config_isolated(&c, path, &tm, &thp, rs_->seed * 31 + (uint64_t)ri, summary[n_summary++],
                                sizeof summary[0]);
        }
        if (ri == 0) {
            check_variant_effects(dir, base_path, &tm, feats);
            check_open_refusals(dir, first_draft, first_target);
        }
        free(feats);
        mf_close(&dm);
        mf_close(&tm);
    }

    printf("# worst differences against the reference:\n");
    for (int i = 0; i < n_summary; i++) printf("#   %s\n", summary[i]);
    rm_dir(dir);
    return check_done();
}
