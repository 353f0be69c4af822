/* test_forward - the forward pass's own invariants, on synthesized models (no oracle needed):
 *   chunked prefill == one batch; several sequences in one batch == each alone; snapshot/restore ==
 *   a fresh run of the kept tokens; [0,k) then [k,n) through a serialized boundary == [0,n) bit for bit;
 *   bad batches are refused with a message. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "model/k3_forward.h"
#include "model/k3_memory.h"
#include "tools/synth.h"
#include "tools/synth_config.h"

#include "check.h"

typedef struct fx {
    mf_model m;
    k3_hparams hp;
    k3_engine e;
} fx;

static uint64_t rs = 12345;
static int32_t rnd_tok(uint32_t v) {
    rs = rs * 6364136223846793005ULL + 1442695040888963407ULL;
    return (int32_t)((rs >> 33) % (v - 256)); /* stay below the special-token region */
}

/* Runs the batch into o; exits with the engine's message when it fails. */
static void forward_ok(k3_engine *e, const k3_batch *b, k3_output *o) {
    rl_err err;
    if (k3_forward(e, b, o, &err) != 0) {
        fprintf(stderr, "forward failed: %s\n", err.msg);
        exit(1);
    }
}

/* How a batch runs: plainly, with step kernels, or keeping rollback copies (which implies step kernels). */
enum { RUN_PLAIN, RUN_STEP_KERNELS, RUN_KEEP };

/* One batch of nt tokens of one sequence; the logits of every position into dst. */
static void run_batch(k3_engine *e, k3_state *st, const int32_t *tok, uint32_t nt, int how, float *dst) {
    int32_t rows[4096];
    for (uint32_t r = 0; r < nt; r++) rows[r] = (int32_t)r;
    uint8_t keep = 1;
    k3_batch b = {.n_seqs = 1, .seqs = &st, .n_tokens = &nt, .tokens = tok, .n_logits = (int)nt, .logit_rows = rows,
                  .step_kernels = how == RUN_STEP_KERNELS, .keep_rollback = how == RUN_KEEP ? &keep : NULL};
    k3_output o;
    forward_ok(e, &b, &o);
    memcpy(dst, o.logits, (size_t)nt * e->hp.n_vocab * sizeof(float));
    k3_output_free(&o);
}

/* Runs n tokens of one sequence in chunks (chunk <= 0: one batch); returns logits of every position. */
static float *run_chunks(k3_engine *e, k3_state *st, const int32_t *tok, int n, int chunk) {
    const uint32_t V = e->hp.n_vocab;
    float *all = malloc((size_t)n * V * sizeof(float));
    if (chunk <= 0) chunk = n;
    for (int i = 0; i < n; i += chunk) {
        run_batch(e, st, tok + i, (uint32_t)(i + chunk > n ? n - i : chunk), RUN_PLAIN, all + (size_t)i * V);
    }
    return all;
}

static double rel_diff(const float *a, const float *b, size_t n) {
    double md = 0, ma = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d > md || isnan(d)) md = isnan(d) ? INFINITY : d;
        if (fabs(a[i]) > ma) ma = fabs(a[i]);
    }
    return ma > 0 ? md / ma : md;
}

/* Writes the tiny preset, in storage type `type` (NULL: its own), with `seed` to path; exits on failure. */
static void synth_tiny(const char *path, const char *type, uint64_t seed) {
    synth_config c;
    rl_err err;
    if (synth_config_load(&c, "tiny", &err) != 0) exit(1);
    if (type) c.type = synth_type_parse(type);
    synth_opts so = {.out = path, .seed = seed, .n_split = 1, .n_threads = 2};
    if (synth_write(&c, &so, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
}

/* Flash attention and an f16 cache for every engine and state of a fixture (test_model's fa). */
static int open_fx_opts(fx *f, const char *path, const k3_engine_opts *eo) {
    rl_err err;
    if (k3_open(&f->m, &f->hp, path, &err) != 0 || k3_engine_init(&f->e, &f->m, &f->hp, 0, f->hp.n_layer, eo, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    f->hp.kv_type = f->e.hp.kv_type; /* states made from f->hp get the engine's cache type */
    return 0;
}


/* One step of a schedule: sequences (indices), tokens each, and which keep rollback copies. */
typedef struct sched_step {
    int n;
    int seq[6];
    uint32_t nt[6];
    uint8_t keep[6];
} sched_step;

/* Runs the schedule on the given states; returns the logits of every token of every step, concatenated. */
static float *run_sched(k3_engine *e, k3_state **st, const sched_step *steps, int n_steps, const int32_t *tok,
                        size_t *n_out) {
    const size_t V = e->hp.n_vocab;
    size_t total = 0;
    for (int i = 0; i < n_steps; i++)
        for (int k = 0; k < steps[i].n; k++) total += steps[i].nt[k];
    float *all = malloc(total * V * sizeof(float));
    size_t done = 0;
    for (int i = 0; i < n_steps; i++) {
        const sched_step *sp = &steps[i];
        k3_state *seqs[6];
        int32_t in[64], rows[64];
        int T = 0;
        for (int k = 0; k < sp->n; k++) {
            seqs[k] = st[sp->seq[k]];
            for (uint32_t t = 0; t < sp->nt[k]; t++, T++) in[T] = tok[(seqs[k]->n_past + t + 17u * (uint32_t)sp->seq[k]) % 40];
        }
        for (int r = 0; r < T; r++) rows[r] = r;
        k3_batch b = {.n_seqs = sp->n, .seqs = seqs, .n_tokens = sp->nt, .tokens = in, .keep_rollback = sp->keep,
                      .n_logits = T, .logit_rows = rows};
        k3_output o;
        forward_ok(e, &b, &o);
        memcpy(all + done * V, o.logits, (size_t)T * V * sizeof(float));
        done += (size_t)T;
        k3_output_free(&o);
    }
    *n_out = total * V;
    return all;
}

/* Pooled states (k3_state_pool), whose equal-length neighbours in a batch run as one group, give the same
 * bits as separate states on the same schedule: consecutive slots (views) and scattered ones (gathers),
 * decode groups next to a prefill chunk, groups of 2-token steps, a rollback-keeping sequence splitting a
 * group, sequences whose attention reads a different cache length (a group boundary), then a rollback. */
static void test_pooled(fx *f, const char *cfg_name, const char *type, const int32_t *tok) {
    const k3_hparams *hp = &f->hp;
    rl_err err;
    static const sched_step steps[] = {
        {1, {0}, {9}, {0}},                                   /* prefills, one sequence each */
        {1, {1}, {4}, {0}},
        {2, {2, 3}, {6, 6}, {0, 0}},                          /* a group of 6-token steps */
        {4, {0, 1, 2, 3}, {1, 1, 1, 1}, {0}},                 /* decode: one group */
        {5, {0, 1, 2, 3, 4}, {1, 1, 1, 1, 3}, {0}},           /* decode group, then a prefill chunk */
        {5, {4, 0, 1, 2, 3}, {2, 1, 1, 1, 1}, {0}},           /* a chunk first, then the group */
        {5, {0, 1, 2, 3, 4}, {2, 2, 2, 2, 2}, {0}},           /* one group of 2-token steps */
        {5, {3, 1, 0, 4, 2}, {1, 1, 1, 1, 1}, {0}},           /* batch order unlike slot order */
        {5, {0, 1, 2, 3, 4}, {1, 1, 3, 1, 1}, {0, 0, 1, 0, 0}}, /* a rollback-keeping sequence splits it */
    };
    const int n_steps = (int)(sizeof steps / sizeof steps[0]);
    const uint32_t n_ctx = 300;
    k3_state sep[5], *ps[5];
    for (int i = 0; i < 5; i++) {
        k3_state_init(&sep[i], hp, 0, hp->n_layer, n_ctx, &err);
        ps[i] = &sep[i];
    }
    /* Sequence 4 starts deep in its context, so that its attention reads 300 rows, the others 256. */
    float *long_ref, *long_got;
    {
        int32_t big[250];
        for (int i = 0; i < 250; i++) big[i] = tok[i % 40];
        uint32_t nb = 250;
        int32_t row = 249;
        k3_batch b = {.n_seqs = 1, .seqs = &ps[4], .n_tokens = &nb, .tokens = big, .n_logits = 1, .logit_rows = &row};
        k3_output o;
        k3_forward(&f->e, &b, &o, &err);
        long_ref = o.logits;
        o.logits = NULL;
        k3_output_free(&o);
    }
    size_t n_ref, n_got;
    float *ref = run_sched(&f->e, ps, steps, n_steps, tok, &n_ref);
    CHECK(k3_state_rollback(&sep[2], sep[2].n_past - 2, &err) == 0, "%s/%s: rollback inside the last block", cfg_name, type);
    float *ref2 = run_sched(&f->e, ps, steps + 3, 1, tok, &n_ref);
    static const int maps[2][5] = {{0, 1, 2, 3, 4}, {6, 2, 3, 0, 5}};
    for (int mi = 0; mi < 2; mi++) {
        k3_state_pool pool;
        k3_state pst[5];
        int ok = k3_state_pool_init(&pool, hp, 0, hp->n_layer, n_ctx, 7, &err) == 0;
        for (int i = 0; i < 5 && ok; i++) {
            ok = k3_state_init_pooled(&pst[i], &pool, maps[mi][i], &err) == 0;
            ps[i] = &pst[i];
        }
        CHECK(ok, "%s/%s: state pool of 7 slots: %s", cfg_name, type, ok ? "ok" : err.msg);
        if (!ok) break;
        {
            int32_t big[250];
            for (int i = 0; i < 250; i++) big[i] = tok[i % 40];
            uint32_t nb = 250;
            int32_t row = 249;
            k3_batch b = {.n_seqs = 1, .seqs = &ps[4], .n_tokens = &nb, .tokens = big, .n_logits = 1, .logit_rows = &row};
            k3_output o;
            k3_forward(&f->e, &b, &o, &err);
            long_got = o.logits;
            o.logits = NULL;
            k3_output_free(&o);
        }
        float *got = run_sched(&f->e, ps, steps, n_steps, tok, &n_got);
        int same = memcmp(long_ref, long_got, hp->n_vocab * sizeof(float)) == 0;
        size_t n_all = 0;
        for (int i = 0; i < n_steps; i++)
            for (int k = 0; k < steps[i].n; k++) n_all += steps[i].nt[k];
        same = same && memcmp(ref, got, n_all * hp->n_vocab * sizeof(float)) == 0;
        /* Rolling back a pooled sequence restores its slot. */
        int rb = k3_state_rollback(&pst[2], pst[2].n_past - 2, &err) == 0;
        float *got2 = run_sched(&f->e, ps, steps + 3, 1, tok, &n_got);
        same = same && rb && memcmp(ref2, got2, n_got * sizeof(float)) == 0;
        CHECK(same, "%s/%s: pooled states in groups (%s slots) == separate states, bit for bit", cfg_name, type,
              mi ? "scattered" : "consecutive");
        CHECK(k3_state_bytes(&pst[0]) == k3_state_bytes(&sep[0]), "%s/%s: a pooled state counts its slot's bytes (%zu)",
              cfg_name, type, k3_state_bytes(&pst[0]));
        free(got);
        free(got2);
        free(long_got);
        for (int i = 0; i < 5; i++) k3_state_free(&pst[i]);
        k3_state_pool_free(&pool);
    }
    free(ref);
    free(ref2);
    free(long_ref);
    for (int i = 0; i < 5; i++) k3_state_free(&sep[i]);
}

/* Runs batches of the given sizes on one sequence, each as `how` says; returns the logits of every token. */
static float *run_sizes(k3_engine *e, k3_state *st, const int32_t *tok, const uint32_t *sizes, int n_batches, int how) {
    const uint32_t V = e->hp.n_vocab;
    uint32_t total = 0;
    for (int i = 0; i < n_batches; i++) total += sizes[i];
    float *all = malloc((size_t)total * V * sizeof(float));
    for (uint32_t i = 0, done = 0; i < (uint32_t)n_batches; done += sizes[i++]) {
        run_batch(e, st, tok + done, sizes[i], how, all + (size_t)done * V);
    }
    return all;
}

/* Split invariance (docs/numerics.md, "Split invariance"): with k3_batch.split_invariant a 300-token prompt read
 * in one batch, in pieces of 150, 64, 37, 5 and 2 tokens gives the same logits bit for bit, whenever
 * k3_range_split_invariant says the model's weights allow it (so the measured list of types in k3_weights.c
 * cannot claim a type whose kernels are not). The prompt crosses the 256-row padding of the cache it reads.
 * Control: with flash attention and an f32 model, pieces of 37 without the flag differ from one batch (ggml's
 * row-by-row kernel under 64 queries), so the check can fail. */
static float *run_split(k3_engine *e, const k3_hparams *hp, const int32_t *tok, int n, int piece, bool inv) {
    rl_err err;
    k3_state st;
    if (k3_state_init(&st, hp, 0, hp->n_layer, 512, &err) != 0) return NULL;
    const uint32_t V = hp->n_vocab;
    float *all = malloc((size_t)n * V * sizeof(float));
    int32_t *rows = malloc((size_t)n * sizeof *rows);
    for (int i = 0; i < n; i++) rows[i] = i;
    k3_state *sp = &st;
    for (int i = 0; i < n; i += piece) {
        uint32_t nt = (uint32_t)(i + piece > n ? n - i : piece);
        k3_batch b = {.n_seqs = 1, .seqs = &sp, .n_tokens = &nt, .tokens = tok + i, .n_logits = (int)nt, .logit_rows = rows,
                      .split_invariant = inv};
        k3_output o;
        forward_ok(e, &b, &o);
        memcpy(all + (size_t)i * V, o.logits, (size_t)nt * V * sizeof(float));
        k3_output_free(&o);
    }
    free(rows);
    k3_state_free(&st);
    return all;
}

static void test_split_invariant(fx *f, const char *cfg_name, const char *type, bool fa) {
    const k3_hparams *hp = &f->hp;
    enum { N = 300 };
    int32_t tok[N];
    for (int i = 0; i < N; i++) tok[i] = (int32_t)(((uint64_t)i * 7919u + 13u) % hp->n_vocab); /* not rnd_tok: the tests after keep their inputs */
    char why[256];
    const bool exact = k3_range_split_invariant(&f->m, hp, 0, hp->n_layer, false, why, sizeof why);
    float *ref = run_split(&f->e, hp, tok, N, N, true);
    static const int pieces[] = {150, 64, 37, 5, 2};
    for (size_t k = 0; k < sizeof pieces / sizeof *pieces; k++) {
        float *got = run_split(&f->e, hp, tok, N, pieces[k], true);
        const bool same = memcmp(ref, got, (size_t)N * hp->n_vocab * sizeof(float)) == 0;
        if (exact) {
            CHECK(same, "%s/%s: split-invariant pieces of %d == one batch of %d, bit for bit", cfg_name, type, pieces[k], N);
        } else {
            printf("  %s/%s: not split-invariant (%s): pieces of %d %s one batch\n", cfg_name, type, why, pieces[k],
                   same ? "equal" : "differ from");
        }
        free(got);
    }
    if (fa && strcmp(type, "f32+fa") == 0) {
        float *plain = run_split(&f->e, hp, tok, N, 37, false);
        CHECK(memcmp(ref, plain, (size_t)N * hp->n_vocab * sizeof(float)) != 0,
              "%s/%s: the control: pieces of 37 without split invariance differ from one batch", cfg_name, type);
        free(plain);
    }
    free(ref);
}

/* Step kernels (docs/numerics.md): after a 20-token prefill, 12 tokens as one batch, as batches of 5+4+3, and
 * as a rollback-keeping block (a speculative verification) give the bits of 12 single steps, for every
 * weight type; so do two pooled sequences verified together as one group (the 4-D attention matmuls, per-head
 * weights included) and a decode group of two. Without step kernels a batch takes ggml's batched GEMM and,
 * with f32 weights at least, rounds differently: that control shows the check can fail. */
static void test_step_kernels(fx *f, const char *cfg_name, const char *type, const int32_t *tok, const int32_t *tok2) {
    const k3_hparams *hp = &f->hp;
    const size_t V = hp->n_vocab;
    rl_err err;
    k3_state st;
    k3_state_init(&st, hp, 0, hp->n_layer, 64, &err);
    free(run_chunks(&f->e, &st, tok, 20, 0));
    k3_snapshot snap = {0};
    k3_state_snapshot(&st, &snap, &err);
    float *ref = run_chunks(&f->e, &st, tok + 20, 12, 1);
    static const uint32_t one[] = {12}, three[] = {5, 4, 3};
    struct { const uint32_t *sz; int n, how; const char *what; } cases[] = {
        {one, 1, RUN_STEP_KERNELS, "one batch of 12"}, {three, 3, RUN_STEP_KERNELS, "batches of 5, 4, 3"},
        {one, 1, RUN_KEEP, "a kept block of 12"}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        k3_state_restore(&st, &snap, &err);
        float *got = run_sizes(&f->e, &st, tok + 20, cases[c].sz, cases[c].n, cases[c].how);
        CHECK(memcmp(ref, got, 12 * V * sizeof(float)) == 0, "%s/%s: step kernels, %s == 12 single steps, bit for bit",
              cfg_name, type, cases[c].what);
        free(got);
    }
    k3_state_restore(&st, &snap, &err);
    float *plain = run_sizes(&f->e, &st, tok + 20, one, 1, RUN_PLAIN);
    size_t differ = 0;
    for (size_t i = 0; i < 12 * V; i++) differ += memcmp(&plain[i], &ref[i], sizeof(float)) != 0;
    printf("  %s/%s: without step kernels, %zu of %zu logits of a 12-token batch differ from single steps\n", cfg_name,
           type, differ, 12 * V);
    if (strcmp(type, "f32") == 0) {
        CHECK(differ > 0, "%s/%s: the control (a plain batch) does take another kernel (%zu logits differ)", cfg_name, type,
              differ);
    }
    free(plain);
    free(ref);
    k3_snapshot_free(&snap);
    k3_state_free(&st);

    /* Two pooled sequences: 20 + 20 prefill apart, then a 4-token verification of both in one group, then a
     * decode group of one token each, against each alone in single steps. */
    k3_state_pool pool;
    k3_state ps[2], sep;
    int ok = k3_state_pool_init(&pool, hp, 0, hp->n_layer, 64, 2, &err) == 0 &&
             k3_state_init_pooled(&ps[0], &pool, 0, &err) == 0 && k3_state_init_pooled(&ps[1], &pool, 1, &err) == 0;
    CHECK(ok, "%s/%s: pool of 2: %s", cfg_name, type, ok ? "ok" : err.msg);
    if (!ok) return;
    const int32_t *src[2] = {tok, tok2};
    float *want[2];
    for (int q = 0; q < 2; q++) {
        free(run_chunks(&f->e, &ps[q], src[q], 20, 0));
        k3_state_init(&sep, hp, 0, hp->n_layer, 64, &err);
        free(run_chunks(&f->e, &sep, src[q], 20, 0));
        want[q] = run_chunks(&f->e, &sep, src[q] + 20, 5, 1);
        k3_state_free(&sep);
    }
    k3_state *seqs[2] = {&ps[0], &ps[1]};
    uint32_t n4[2] = {4, 4}, n1[2] = {1, 1};
    int32_t in[8], rows[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    for (int q = 0; q < 2; q++) memcpy(in + 4 * q, src[q] + 20, 4 * sizeof *in);
    k3_batch b = {.n_seqs = 2, .seqs = seqs, .n_tokens = n4, .tokens = in, .step_kernels = true,
                  .n_logits = 8, .logit_rows = rows};
    k3_output o, o2;
    ok = k3_forward(&f->e, &b, &o, &err) == 0;
    int32_t in2[2] = {tok[24], tok2[24]};
    k3_batch d = {.n_seqs = 2, .seqs = seqs, .n_tokens = n1, .tokens = in2, .step_kernels = true, .n_logits = 2,
                  .logit_rows = rows};
    ok = ok && k3_forward(&f->e, &d, &o2, &err) == 0;
    int same = ok;
    for (int q = 0; q < 2 && same; q++) {
        same = memcmp(o.logits + (size_t)4 * q * V, want[q], 4 * V * sizeof(float)) == 0 &&
               memcmp(o2.logits + (size_t)q * V, want[q] + 4 * V, V * sizeof(float)) == 0;
    }
    CHECK(same, "%s/%s: step kernels, a group of two 4-token blocks and a decode group == each alone in steps%s%s",
          cfg_name, type, ok ? "" : ": ", ok ? "" : err.msg);
    if (ok) {
        k3_output_free(&o);
        k3_output_free(&o2);
    }
    free(want[0]);
    free(want[1]);
    k3_state_free(&ps[0]);
    k3_state_free(&ps[1]);
    k3_state_pool_free(&pool);
}

/* strict: check the chunked / multi-sequence / snapshot invariants to 1e-4. They hold for f32 weights. With
 * quantized weights (every k-quant; q8_0 too, whose batches of 2+ tokens go through llamafile's GEMM and
 * single tokens through the dot kernel: a prefill token by token and one batch of 40 part after about 32
 * tokens; test_step_kernels pins that down), activations are requantized to q8_K before every matmul, so a
 * one-ulp difference from a different attention tiling (a 7-token chunk vs a 40-token batch) can cross a
 * rounding boundary and then flip an expert choice: the random-weight model diverges from that token on.
 * llama.cpp's own batch and step modes show the same effect on such files (docs/numerics.md). For those
 * types only the range-cutting invariant, which keeps every batch shape, is checked bit for bit. */
static void test_model_opts(const char *cfg_name, const char *type_arg, const char *dir, int strict, bool fa) {
    char type[32]; /* in messages: the storage type, and +fa when flash attention and an f16 cache run */
    snprintf(type, sizeof type, "%s%s", type_arg, fa ? "+fa" : "");
    char path[256];
    snprintf(path, sizeof path, "%s/%s-%s.gguf", dir, cfg_name, type_arg);
    synth_config c;
    rl_err err;
    if (synth_config_load(&c, cfg_name, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    c.type = synth_type_parse(type_arg);
    c.n_over = 0;
    synth_opts so = {.out = path, .seed = 3, .n_split = 1, .n_threads = 2};
    if (synth_write(&c, &so, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    fx f;
    const k3_engine_opts eo = {.n_threads = 2, .no_flash_attn = !fa, .cache_f32 = !fa};
    if (open_fx_opts(&f, path, &eo) != 0) exit(1);
    const k3_hparams *hp = &f.hp;
    const uint32_t V = hp->n_vocab, L = hp->n_layer;
    enum { N = 40 };
    int32_t tok[N], tok2[N];
    for (int i = 0; i < N; i++) tok[i] = rnd_tok(V), tok2[i] = rnd_tok(V);

    k3_state st;
    k3_state_init(&st, hp, 0, L, 64, &err);
    float *plain = run_chunks(&f.e, &st, tok, N, 0);

    /* Exact for every type: the grouped graph runs the same kernels on the same per-sequence shapes. */
    test_pooled(&f, cfg_name, type, tok);
    test_step_kernels(&f, cfg_name, type, tok, tok2);
    test_split_invariant(&f, cfg_name, type, fa);

    /* Chunked prefill, several chunk sizes, and token by token. */
    int chunks[] = {1, 3, 7, 16};
    if (!strict) goto cut;
    for (size_t i = 0; i < sizeof chunks / sizeof chunks[0]; i++) {
        k3_state_reset(&st);
        float *ch = run_chunks(&f.e, &st, tok, N, chunks[i]);
        double r = rel_diff(plain, ch, (size_t)N * V);
        CHECK(r <= 1e-4, "%s/%s: prefill in chunks of %d == one batch (rel %.2g)", cfg_name, type, chunks[i], r);
        free(ch);
    }

    /* Two sequences in one batch (25 + 13 tokens), then five decode steps of both per batch, against each
     * sequence run alone on the same schedule (a 25- or 13-token prefill, then single steps). The same
     * schedule matters: a prefill of another length tiles the attention matmuls differently, and on a
     * near-tie in routing that alone can change a token's experts (see the k-quant note above). */
    {
        float *ref[2];
        const int32_t *src[2] = {tok, tok2};
        const int pre[2] = {25, 13};
        for (int q = 0; q < 2; q++) {
            k3_state s1;
            k3_state_init(&s1, hp, 0, L, 64, &err);
            ref[q] = malloc((size_t)(pre[q] + 5) * V * sizeof(float));
            float *p = run_chunks(&f.e, &s1, src[q], pre[q], 0);
            memcpy(ref[q], p, (size_t)pre[q] * V * sizeof(float));
            free(p);
            for (int s = 0; s < 5; s++) {
                p = run_chunks(&f.e, &s1, src[q] + pre[q] + s, 1, 0);
                memcpy(ref[q] + (size_t)(pre[q] + s) * V, p, (size_t)V * sizeof(float));
                free(p);
            }
            k3_state_free(&s1);
        }
        k3_state sa, sb;
        k3_state_init(&sa, hp, 0, L, 64, &err);
        k3_state_init(&sb, hp, 0, L, 64, &err);
        k3_state *seqs[2] = {&sa, &sb};
        uint32_t nts[2] = {25, 13};
        int32_t in[38], rows[38];
        memcpy(in, tok, 25 * sizeof *in);
        memcpy(in + 25, tok2, 13 * sizeof *in);
        for (int r = 0; r < 38; r++) rows[r] = r;
        k3_batch b = {.n_seqs = 2, .seqs = seqs, .n_tokens = nts, .tokens = in, .n_logits = 38, .logit_rows = rows};
        k3_output o;
        int rc = k3_forward(&f.e, &b, &o, &err);
        double ra = rc ? 1 : rel_diff(ref[0], o.logits, (size_t)25 * V);
        double rb = rc ? 1 : rel_diff(ref[1], o.logits + (size_t)25 * V, (size_t)13 * V);
        CHECK(rc == 0 && ra <= 1e-4 && rb <= 1e-4, "%s/%s: two sequences (25 + 13 tokens) in one batch == alone (rel %.2g, %.2g)",
              cfg_name, type, ra, rb);
        if (rc == 0) k3_output_free(&o);
        double worst = 0;
        for (int s = 0; s < 5; s++) {
            uint32_t one[2] = {1, 1};
            int32_t t2[2] = {tok[25 + s], tok2[13 + s]}, r2[2] = {0, 1};
            k3_batch d = {.n_seqs = 2, .seqs = seqs, .n_tokens = one, .tokens = t2, .n_logits = 2, .logit_rows = r2};
            if (k3_forward(&f.e, &d, &o, &err) != 0) {
                worst = INFINITY;
                break;
            }
            worst = fmax(worst, rel_diff(ref[0] + (size_t)(25 + s) * V, o.logits, V));
            worst = fmax(worst, rel_diff(ref[1] + (size_t)(13 + s) * V, o.logits + V, V));
            k3_output_free(&o);
        }
        CHECK(worst <= 1e-4, "%s/%s: batched decode of two sequences == alone (rel %.2g)", cfg_name, type, worst);
        free(ref[0]);
        free(ref[1]);
        k3_state_free(&sa);
        k3_state_free(&sb);
    }

    /* Snapshot at 20, run 8 other tokens, restore, run the real continuation: equals the plain run. */
    {
        k3_state_reset(&st);
        float *p = run_chunks(&f.e, &st, tok, 20, 0);
        free(p);
        k3_snapshot snap = {0};
        k3_state_snapshot(&st, &snap, &err);
        p = run_chunks(&f.e, &st, tok2, 8, 3);
        free(p);
        k3_state_restore(&st, &snap, &err);
        CHECK(st.n_past == 20, "%s/%s: restore returns to position 20", cfg_name, type);
        float *rest = run_chunks(&f.e, &st, tok + 20, N - 20, 0);
        /* Compare with the plain run's rows 20..39: chunked at 20, so use the chunk tolerance. */
        double r = rel_diff(plain + (size_t)20 * V, rest, (size_t)(N - 20) * V);
        CHECK(r <= 1e-4, "%s/%s: snapshot, diverge, restore, continue == never diverged (rel %.2g)", cfg_name, type, r);
        /* Restoring twice works (speculation may reject twice from the same point). */
        k3_state_restore(&st, &snap, &err);
        float *again = run_chunks(&f.e, &st, tok + 20, N - 20, 0);
        CHECK(memcmp(rest, again, (size_t)(N - 20) * V * sizeof(float)) == 0, "%s/%s: a second restore gives the same bits",
              cfg_name, type);
        free(rest);
        free(again);
        k3_snapshot_free(&snap);
    }

    /* Speculative rollback: a 6-token block kept for rollback, then back to 20 + j, then 6 more tokens,
     * equals a run that never saw the rejected tokens (prefill 20, then j, then the 6). */
    for (uint32_t j = 1; j <= 6; j++) {
        k3_state_reset(&st);
        float *p = run_chunks(&f.e, &st, tok, 20, 0);
        free(p);
        uint32_t nb = 6;
        uint8_t keep = 1;
        int32_t rows[6] = {0, 1, 2, 3, 4, 5};
        int32_t block[6];
        memcpy(block, tok + 20, j * sizeof *block);                 /* accepted part */
        memcpy(block + j, tok2, (6 - j) * sizeof *block);          /* rejected drafts */
        k3_state *sp = &st;
        k3_batch b = {.n_seqs = 1, .seqs = &sp, .n_tokens = &nb, .tokens = block, .keep_rollback = &keep, .n_logits = 6,
                      .logit_rows = rows};
        k3_output o;
        int ok = k3_forward(&f.e, &b, &o, &err) == 0;
        if (ok) k3_output_free(&o);
        ok = ok && k3_state_rollback(&st, 20 + j, &err) == 0 && st.n_past == 20 + j;
        float *after = ok ? run_chunks(&f.e, &st, tok + 20 + j, 6, 0) : NULL;
        k3_state ref;
        k3_state_init(&ref, hp, 0, L, 64, &err);
        p = run_chunks(&f.e, &ref, tok, 20, 0);
        free(p);
        p = run_chunks(&f.e, &ref, tok + 20, (int)j, 0);
        free(p);
        float *want = run_chunks(&f.e, &ref, tok + 20 + j, 6, 0);
        double r = after ? rel_diff(want, after, (size_t)6 * V) : 1;
        CHECK(ok && r <= 1e-4, "%s/%s: keep 6, roll back to +%u, continue == never saw the rest (rel %.2g)%s", cfg_name,
              type, j, r, ok ? "" : err.msg);
        free(after);
        free(want);
        k3_state_free(&ref);
    }
    {
        uint32_t before = st.n_past;
        CHECK(k3_state_rollback(&st, before - 3, &err) != 0, "rollback outside the kept block refused: %s", err.msg);
    }
    /* Pipelined speculation: three consecutive 4-token blocks kept (positions 20..31), then back to a
     * position inside the first, second or third == a run of only the accepted tokens; a fifth consecutive
     * block drops the first, so a rollback into it is refused. */
    for (int back = 0; back < 3; back++) {
        const uint32_t keep_to = 20 + 4 * (uint32_t)back + 2; /* keeps 2 tokens of block `back` */
        k3_state_reset(&st);
        free(run_chunks(&f.e, &st, tok, 20, 0));
        int ok = 1;
        uint8_t keep = 1;
        uint32_t nb = 4;
        k3_state *sp = &st;
        for (int blk = 0; blk < 3 && ok; blk++) {
            int32_t block[4];
            for (int t = 0; t < 4; t++) { /* accepted tokens up to keep_to, the rest are drafts to reject */
                uint32_t p = 20 + 4 * (uint32_t)blk + (uint32_t)t;
                block[t] = p < keep_to ? tok[p] : tok2[t];
            }
            k3_batch b = {.n_seqs = 1, .seqs = &sp, .n_tokens = &nb, .tokens = block, .keep_rollback = &keep};
            k3_output o;
            ok = k3_forward(&f.e, &b, &o, &err) == 0;
            if (ok) k3_output_free(&o);
        }
        ok = ok && st.rb_count == 3 && k3_state_rollback(&st, keep_to, &err) == 0 && st.n_past == keep_to;
        float *after = ok ? run_chunks(&f.e, &st, tok + keep_to, 6, 0) : NULL;
        k3_state ref;
        k3_state_init(&ref, hp, 0, L, 64, &err);
        free(run_chunks(&f.e, &ref, tok, (int)keep_to, 0));
        float *want = run_chunks(&f.e, &ref, tok + keep_to, 6, 0);
        double r = after ? rel_diff(want, after, (size_t)6 * V) : 1;
        CHECK(ok && r <= 1e-4, "%s/%s: 3 blocks kept, back into block %d (+%u), continue == only the accepted tokens (rel %.2g)%s",
              cfg_name, type, back + 1, keep_to - 20, r, ok ? "" : err.msg);
        free(after);
        free(want);
        k3_state_free(&ref);
    }
    {
        k3_state_reset(&st);
        free(run_chunks(&f.e, &st, tok, 20, 0));
        uint8_t keep = 1;
        uint32_t nb = 4;
        k3_state *sp = &st;
        int ok = k3_state_keep_blocks(&st, K3_RB_BLOCKS, &err) == 0; /* buffers sized for 4-token blocks only */
        for (int blk = 0; blk < K3_RB_BLOCKS + 1 && ok; blk++) {
            k3_batch b = {.n_seqs = 1, .seqs = &sp, .n_tokens = &nb, .tokens = tok + 20 + 4 * blk, .keep_rollback = &keep};
            k3_output o;
            ok = k3_forward(&f.e, &b, &o, &err) == 0;
            if (ok) k3_output_free(&o);
        }
        CHECK(ok && st.rb_count == K3_RB_BLOCKS && k3_state_rollback(&st, 22, &err) != 0,
              "%s/%s: %d consecutive blocks keep the last %d; a rollback into the dropped first is refused: %s", cfg_name, type,
              K3_RB_BLOCKS + 1, K3_RB_BLOCKS, err.msg);
        CHECK(k3_state_rollback(&st, 20 + 4 + 1, &err) == 0 && st.n_past == 25, "%s/%s: ... and one into the second still works",
              cfg_name, type);
        /* What the planner counts for them (k3_memory.h) is what they took: every slot, 4 tokens each. */
        CHECK(k3_state_rb_bytes(&st) == k3_range_rollback_bytes(hp, 0, L, 4, K3_RB_BLOCKS) && k3_state_rb_bytes(&st) > 0,
              "%s/%s: the kept blocks hold %zu bytes, k3_range_rollback_bytes says %zu", cfg_name, type, k3_state_rb_bytes(&st),
              k3_range_rollback_bytes(hp, 0, L, 4, K3_RB_BLOCKS));
        /* A ring node keeps only the blocks its coordinator has in flight (ASSIGN's rollback_blocks). */
        ok = k3_state_keep_blocks(&st, 2, &err) == 0;
        k3_state_reset(&st);
        free(run_chunks(&f.e, &st, tok, 20, 0));
        for (int blk = 0; blk < 4 && ok; blk++) {
            k3_batch b = {.n_seqs = 1, .seqs = &sp, .n_tokens = &nb, .tokens = tok + 20 + 4 * blk, .keep_rollback = &keep};
            k3_output o;
            ok = k3_forward(&f.e, &b, &o, &err) == 0;
            if (ok) k3_output_free(&o);
        }
        CHECK(ok && st.rb_count == 2 && k3_state_rb_bytes(&st) == k3_range_rollback_bytes(hp, 0, L, 4, 2) &&
                  k3_state_rollback(&st, 20 + 4 + 1, &err) != 0 && k3_state_rollback(&st, 20 + 8 + 1, &err) == 0,
              "%s/%s: keeping 2 blocks: 3 slots of memory (%zu bytes), a rollback into the third block back refused, "
              "into the second back done",
              cfg_name, type, k3_state_rb_bytes(&st));
        /* A draft model forgets the blocks behind what is committed after each pass (k3_state_rb_forget):
         * however many passes, it holds the buffers of the blocks it can return into and one more. */
        ok = k3_state_keep_blocks(&st, 8, &err) == 0;
        k3_state_reset(&st);
        free(run_chunks(&f.e, &st, tok, 20, 0));
        for (int blk = 0; blk < 5 && ok; blk++) { /* tokens 20 .. 39 of N = 40 */
            k3_batch b = {.n_seqs = 1, .seqs = &sp, .n_tokens = &nb, .tokens = tok + 20 + 4 * blk, .keep_rollback = &keep};
            k3_output o;
            ok = k3_forward(&f.e, &b, &o, &err) == 0;
            if (ok) k3_output_free(&o);
            k3_state_rb_forget(&st, 20 + 4 * (uint32_t)blk + 2); /* committed: halfway into the block just run */
        }
        CHECK(ok && st.rb_count == 1 && k3_state_rb_bytes(&st) == k3_range_rollback_bytes(hp, 0, L, 4, 1) &&
                  k3_state_rollback(&st, 20 + 12 + 2, &err) != 0 && k3_state_rollback(&st, 20 + 16 + 3, &err) == 0 &&
                  st.n_past == 39,
              "%s/%s: 5 blocks, each forgotten once committed past: 1 kept, 2 slots of memory (%zu bytes, %zu expected), "
              "a rollback into the one before refused, into the kept one done",
              cfg_name, type, k3_state_rb_bytes(&st), k3_range_rollback_bytes(hp, 0, L, 4, 1));
        k3_state_keep_blocks(&st, K3_RB_BLOCKS, &err);
    }
    /* One-token blocks kept for rollback (a draft model keeps one per drafted token) right after plain
     * one-token steps: the same graph shapes, so the compute plan must still keep the kept states apart.
     * Back to the end of the first == a run of only it, bit for bit. */
    {
        k3_state_reset(&st);
        free(run_chunks(&f.e, &st, tok, 20, 0));
        float *junk = malloc((size_t)V * sizeof(float));
        int ok = 1;
        for (int i = 0; i < 3; i++) run_batch(&f.e, &st, tok + 20 + i, 1, RUN_STEP_KERNELS, junk); /* plain steps */
        for (int i = 0; i < 3; i++) run_batch(&f.e, &st, i == 0 ? tok + 23 : tok2 + i, 1, RUN_KEEP, junk);
        ok = st.rb_count == 3 && k3_state_rollback(&st, 24, &err) == 0 && st.n_past == 24;
        float *after = malloc((size_t)V * sizeof(float)), *want = malloc((size_t)V * sizeof(float));
        if (ok) run_batch(&f.e, &st, tok + 24, 1, RUN_STEP_KERNELS, after);
        k3_state ref;
        k3_state_init(&ref, hp, 0, L, 64, &err);
        free(run_chunks(&f.e, &ref, tok, 20, 0));
        for (int i = 0; i < 5; i++) run_batch(&f.e, &ref, tok + 20 + i, 1, RUN_STEP_KERNELS, want);
        CHECK(ok && memcmp(after, want, (size_t)V * sizeof(float)) == 0,
              "%s/%s: one-token blocks kept after plain one-token steps, back into the first == only it, bit for bit%s", cfg_name,
              type, ok ? "" : err.msg);
        free(junk);
        free(after);
        free(want);
        k3_state_free(&ref);
    }

cut:
    /* Cutting the range: [0,k) then [k,n) through a serialized f32 boundary == [0,n), bit for bit. */
    for (uint32_t k = 1; k < L; k++) {
        k3_engine e1, e2;
        k3_state s1, s2, s0;
        k3_engine_init(&e1, &f.m, hp, 0, k, &eo, &err);
        k3_engine_init(&e2, &f.m, hp, k, L, &eo, &err);
        k3_state_init(&s1, hp, 0, k, 64, &err);
        k3_state_init(&s2, hp, k, L, 64, &err);
        k3_state_init(&s0, hp, 0, L, 64, &err);
        float *ref = run_chunks(&f.e, &s0, tok, N, 0);
        uint32_t nt = N;
        int32_t rows[N];
        for (int r = 0; r < N; r++) rows[r] = r;
        k3_state *p1 = &s1, *p2 = &s2;
        k3_batch b1 = {.n_seqs = 1, .seqs = &p1, .n_tokens = &nt, .tokens = tok};
        k3_output o1, o2;
        int ok = k3_forward(&e1, &b1, &o1, &err) == 0;
        size_t wire = k3_boundary_wire_size(&o1.out, K3_WIRE_F32);
        uint8_t *buf = malloc(wire);
        k3_boundary_encode(&o1.out, K3_WIRE_F32, buf);
        k3_boundary in;
        ok = ok && k3_boundary_decode(&in, buf, wire, 4096, hp->n_embd, &err) == 0;
        ok = ok && in.n_ckpt == k3_n_banked_before(hp, k);
        k3_batch b2 = {.n_seqs = 1, .seqs = &p2, .n_tokens = &nt, .in = &in, .n_logits = N, .logit_rows = rows};
        ok = ok && k3_forward(&e2, &b2, &o2, &err) == 0;
        CHECK(ok && memcmp(ref, o2.logits, (size_t)N * V * sizeof(float)) == 0,
              "%s/%s: [0,%u) + [%u,%u) through the wire == [0,%u) bit for bit (%u checkpoints cross)", cfg_name, type, k,
              k, L, L, k3_n_banked_before(hp, k));
        /* DSpark taps: the whole model's stream entering layer k == the boundary's h at the cut k; a tap at
         * a stage's own start is its input, and one outside the range is refused. */
        {
            k3_state s3;
            k3_state_init(&s3, hp, 0, L, 64, &err);
            k3_state *p3 = &s3;
            uint32_t tl[3] = {k, 0, L};
            k3_batch b3 = {.n_seqs = 1, .seqs = &p3, .n_tokens = &nt, .tokens = tok, .n_taps = 3, .tap_layers = tl};
            k3_output o3;
            int tok3 = k3_forward(&f.e, &b3, &o3, &err) == 0;
            size_t rowb = (size_t)N * hp->n_embd * sizeof(float);
            CHECK(tok3 && memcmp(o3.taps, o1.out.h, rowb) == 0, "%s/%s: tap at layer %u == the boundary h at cut %u, bit for bit",
                  cfg_name, type, k, k);
            if (k == 1) {
                k3_state s4;
                k3_state_init(&s4, hp, k, L, 64, &err);
                k3_state *p4 = &s4;
                uint32_t t4[1] = {k};
                k3_batch b4 = {.n_seqs = 1, .seqs = &p4, .n_tokens = &nt, .in = &in, .n_taps = 1, .tap_layers = t4};
                k3_output o4;
                int ok4 = k3_forward(&e2, &b4, &o4, &err) == 0;
                CHECK(ok4 && memcmp(o4.taps, in.h, rowb) == 0, "%s/%s: a tap at a stage's first layer is its input h", cfg_name, type);
                if (ok4) k3_output_free(&o4);
                k3_state s5;
                k3_state_init(&s5, hp, 0, k, 64, &err);
                k3_state *p5 = &s5;
                t4[0] = L;
                CHECK(k3_forward(&e1, &(k3_batch){.n_seqs = 1, .seqs = &p5, .n_tokens = &nt, .tokens = tok, .n_taps = 1,
                                                   .tap_layers = t4}, &o4, &err) != 0 && strstr(err.msg, "outside"),
                      "a tap outside the stage's range is refused: %s", err.msg);
                k3_state_free(&s4);
                k3_state_free(&s5);
            }
            if (tok3) k3_output_free(&o3);
            k3_state_free(&s3);
        }
        /* Bad boundary input is refused. */
        if (k == 1) {
            k3_boundary bad;
            CHECK(k3_boundary_decode(&bad, buf, wire - 1, 4096, hp->n_embd, &err) != 0, "%s/%s: short boundary refused: %s",
                  cfg_name, type, err.msg);
            buf[0] = 'X';
            CHECK(k3_boundary_decode(&bad, buf, wire, 4096, hp->n_embd, &err) != 0, "%s/%s: bad boundary magic refused",
                  cfg_name, type);
        }
        free(buf);
        free(ref);
        k3_boundary_free(&in);
        k3_output_free(&o1);
        k3_output_free(&o2);
        k3_state_free(&s0);
        k3_state_free(&s1);
        k3_state_free(&s2);
        k3_engine_free(&e1);
        k3_engine_free(&e2);
    }

    /* Bad batches. */
    {
        k3_state_reset(&st);
        uint32_t nt = 65;
        int32_t big[65] = {0};
        k3_state *sp = &st;
        k3_batch b = {.n_seqs = 1, .seqs = &sp, .n_tokens = &nt, .tokens = big};
        k3_output o;
        CHECK(k3_forward(&f.e, &b, &o, &err) != 0 && strstr(err.msg, "exceed its context"), "context overflow refused: %s", err.msg);
        nt = 1;
        big[0] = (int32_t)V;
        CHECK(k3_forward(&f.e, &b, &o, &err) != 0 && strstr(err.msg, "out of range"), "token id out of range refused: %s",
              err.msg);
        k3_state *twice[2] = {&st, &st};
        uint32_t n2[2] = {1, 1};
        int32_t t2[2] = {1, 2};
        k3_batch d = {.n_seqs = 2, .seqs = twice, .n_tokens = n2, .tokens = t2};
        CHECK(k3_forward(&f.e, &d, &o, &err) != 0 && strstr(err.msg, "twice"), "same sequence twice refused: %s", err.msg);
        CHECK(st.n_past == 0, "refused batches do not advance the state");
    }
    free(plain);
    k3_state_free(&st);
    k3_engine_free(&f.e);
    mf_close(&f.m);
    unlink(path);
}

static void test_model(const char *cfg_name, const char *type, const char *dir, int strict) {
    test_model_opts(cfg_name, type, dir, strict, false);
}

/* Weight placement (weight_place.h): by default the CPU's repacked layouts take the quantized matmul
 * weights llama.cpp would give them, the rest stays mapped; --no-repack keeps everything mapped. The
 * repacked kernels round differently, so the two must give different logits (else this test could not
 * tell whether repacking happened at all), and the count k3_range_repack_bytes predicts (inspect, plans)
 * must be what a bound range really copies. */
static void test_placement(const char *dir) {
    char path[256];
    snprintf(path, sizeof path, "%s/place-q4_0.gguf", dir);
    synth_tiny(path, "q4_0", 5);
    rl_err err;
    mf_model m;
    k3_hparams hp;
    if (k3_open(&m, &hp, path, &err) != 0) exit(1);
    wp_list l;
    wp_list_cpu(&l, true);
    const uint32_t V = hp.n_vocab, L = hp.n_layer;
    int32_t tok[24];
    for (int i = 0; i < 24; i++) tok[i] = rnd_tok(V);
    float *lg[2] = {NULL, NULL};
    for (int no = 0; no < 2; no++) {
        k3_engine e;
        CHECK(k3_engine_init(&e, &m, &hp, 0, L, &(k3_engine_opts){.n_threads = 2, .no_repack = no}, &err) == 0,
              "engine %s repacking", no ? "without" : "with");
        size_t got = k3_weights_copied_bytes(&e.w), want = no ? 0 : k3_range_repack_bytes(&m, &hp, 0, L);
        CHECK(got == want, "q4_0 %s: %zu bytes copied out of the mapping, predicted %zu", no ? "--no-repack" : "default", got, want);
        if (!no && l.n > 0) CHECK(got > 0, "this CPU offers %d extra buffer type(s) and q4_0 matmul weights go there", l.n);
        k3_state st;
        k3_state_init(&st, &e.hp, 0, L, 64, &err);
        lg[no] = run_chunks(&e, &st, tok, 24, 0);
        k3_state_free(&st);
        k3_engine_free(&e);
    }
    if (l.n > 0 && k3_range_repack_bytes(&m, &hp, 0, L) > 0) {
        CHECK(memcmp(lg[0], lg[1], (size_t)24 * V * sizeof(float)) != 0, "repacked and mapped kernels give different bits");
    }
    /* A state made for another cache type (here the file's hparams: f32) is refused by an engine at the
     * defaults (f16), naming both, before anything runs. */
    k3_engine e;
    if (k3_engine_init(&e, &m, &hp, 0, L, &(k3_engine_opts){.n_threads = 1}, &err) == 0) {
        k3_state st, *sp = &st;
        uint32_t one = 1;
        k3_output o;
        CHECK(k3_state_init(&st, &hp, 0, L, 64, &err) == 0 &&
                  k3_forward(&e, &(k3_batch){.n_seqs = 1, .seqs = &sp, .n_tokens = &one, .tokens = tok}, &o, &err) != 0 &&
                  strstr(err.msg, "its cache is f32 but this engine computes with an f16 cache") && st.n_past == 0,
              "a state of another cache type is refused: %s", err.msg);
        k3_state_free(&st);
        k3_engine_free(&e);
    }
    /* A stage's range copies only its own layers' share. */
    if (k3_engine_init(&e, &m, &hp, 1, L, &(k3_engine_opts){.n_threads = 1}, &err) == 0) {
        CHECK(k3_weights_copied_bytes(&e.w) == k3_range_repack_bytes(&m, &hp, 1, L), "range [1, %u) copies what it predicts", L);
        k3_engine_free(&e);
    }
    CHECK(k3_weight_use("blk.3.ffn_up_exps.weight") == WP_USE_MUL_MAT_ID && k3_weight_use("blk.0.attn_norm.weight") == WP_USE_OTHER &&
              k3_weight_use("token_embd.weight") == WP_USE_OTHER && k3_weight_use("output.weight") == WP_USE_MUL_MAT &&
              k3_weight_use("blk.12.attn_kv_a_mqa.weight") == WP_USE_MUL_MAT,
          "weights are classed by the op they feed");
    free(lg[0]);
    free(lg[1]);
    mf_close(&m);
    unlink(path);
}

/* The engine maps the MLA masks' memory itself (k3_masks_place); when the mapping fails the batch is
 * refused with a message that says so, the sequence is where it was, and once memory is back the same batch
 * runs. The address space is capped just above what the process holds, so the masks of a 2048-token chunk
 * (about 8 MiB) cannot be mapped. Not under ASan, whose allocator aborts rather than fail. */
#if !defined(__SANITIZE_ADDRESS__)
static size_t vm_size_kb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    size_t kb = 0;
    while (f && fgets(line, sizeof line, f)) {
        if (sscanf(line, "VmSize: %zu kB", &kb) == 1) break;
    }
    if (f) fclose(f);
    return kb;
}
#endif

static void test_mask_oom(const char *dir) {
#if defined(__SANITIZE_ADDRESS__)
    (void)dir;
#else
    char path[256];
    snprintf(path, sizeof path, "%s/mask-oom.gguf", dir);
    synth_tiny(path, NULL, 9);
    rl_err err;
    mf_model m;
    k3_hparams hp;
    k3_engine e;
    k3_state st, *sp = &st;
    if (k3_open(&m, &hp, path, &err) != 0 || k3_engine_init(&e, &m, &hp, 0, hp.n_layer, &(k3_engine_opts){.n_threads = 2}, &err) != 0 ||
        k3_state_init(&st, &e.hp, 0, hp.n_layer, 4096, &err) != 0) {
        fprintf(stderr, "mask_oom setup: %s\n", err.msg);
        exit(1);
    }
    enum { N = 2048 };
    static int32_t tok[8 + N];
    for (int i = 0; i < 8 + N; i++) tok[i] = rnd_tok(hp.n_vocab);
    free(run_chunks(&e, &st, tok, 8, 0));
    uint32_t n = N;
    k3_batch b = {.n_seqs = 1, .seqs = &sp, .n_tokens = &n, .tokens = tok + 8};
    k3_output o;
    struct rlimit old;
    getrlimit(RLIMIT_AS, &old);
    struct rlimit cap = {(rlim_t)(vm_size_kb() + 512) * 1024, old.rlim_max};
    int rc = setrlimit(RLIMIT_AS, &cap) == 0 ? k3_forward(&e, &b, &o, &err) : 0;
    setrlimit(RLIMIT_AS, &old);
    CHECK(rc != 0 && strstr(err.msg, "out of memory for attention masks") && st.n_past == 8,
          "masks that cannot be mapped: the batch refused, the sequence still at 8 (%u): %s", st.n_past,
          rc ? err.msg : "(ran)");
    CHECK(k3_forward(&e, &b, &o, &err) == 0 && st.n_past == 8 + N, "with the cap lifted the same batch runs");
    k3_output_free(&o);
    k3_state_free(&st);
    k3_engine_free(&e);
    mf_close(&m);
    unlink(path);
#endif
}

/* One one-token step with a DSpark-style tap at layer `tap` (none when tap < 0): its logits and tapped row.
 * False when the output's taps are not what was asked (present without a tap, missing with one). */
static bool run_tap_step(k3_engine *e, k3_state *st, int32_t tok, int tap, float *logits, float *taps) {
    uint32_t nt = 1, tl = tap < 0 ? 0 : (uint32_t)tap;
    int32_t row = 0;
    k3_batch b = {.n_seqs = 1, .seqs = &st, .n_tokens = &nt, .tokens = &tok, .n_logits = 1, .logit_rows = &row,
                  .n_taps = tap >= 0, .tap_layers = &tl};
    k3_output o;
    forward_ok(e, &b, &o);
    memcpy(logits, o.logits, (size_t)e->hp.n_vocab * sizeof(float));
    const bool ok = (o.taps != NULL) == (tap >= 0);
    if (ok && tap >= 0) memcpy(taps, o.taps, (size_t)e->hp.n_embd * sizeof(float));
    k3_output_free(&o);
    return ok;
}

/* The kept graph (k3_forward.c, k3_engine.kept): a sequence decoded step after step runs its last step's graph
 * again, with new inputs; every step must give the bits of a graph built for it. The reference builds every
 * step's graph (another sequence's step between two of them drops the kept one). Past 256 positions the
 * cache rows attention reads grow, which takes a new graph; a state freed and made again at the same
 * address is another sequence (k3_state.id), whose step must not run the old tensors' graph; a step asking
 * for other taps than the kept graph has (none, or another layer) gets a graph of its own. Over an f32 cache
 * without flash attention the graph holds the count of rows written, and is never kept. */
static void test_kept_graph(const char *dir) {
    char path[256];
    snprintf(path, sizeof path, "%s/kept.gguf", dir);
    synth_tiny(path, NULL, 5);
    rl_err err;
    const struct {
        bool no_fa, f32;
        const char *name;
    } cfgs[] = {{false, false, "flash attention, f16 cache"}, {true, false, "softmax, f16 cache"},
                {true, true, "softmax, f32 cache"}};
    for (size_t ci = 0; ci < sizeof cfgs / sizeof cfgs[0]; ci++) {
        fx f;
        const k3_engine_opts eo = {.n_threads = 2, .no_flash_attn = cfgs[ci].no_fa, .cache_f32 = cfgs[ci].f32};
        if (open_fx_opts(&f, path, &eo) != 0) exit(1);
        const uint32_t V = f.hp.n_vocab, L = f.hp.n_layer;
        const bool kept = !cfgs[ci].f32;
        enum { N = 300 };
        int32_t tok[N];
        for (int i = 0; i < N; i++) tok[i] = rnd_tok(V);
        k3_state a, b;
        if (k3_state_init(&a, &f.hp, 0, L, 512, &err) != 0 || k3_state_init(&b, &f.hp, 0, L, 512, &err) != 0) exit(1);
        float *ref = malloc((size_t)N * V * sizeof(float)), *got = malloc((size_t)N * V * sizeof(float));
        float *other = malloc((size_t)V * sizeof(float));
        for (int i = 0; i < N; i++) {
            run_batch(&f.e, &a, tok + i, 1, RUN_PLAIN, ref + (size_t)i * V);
            run_batch(&f.e, &b, tok + N - 1 - i, 1, RUN_PLAIN, other);
        }
        CHECK(f.e.n_reused == 0, "%s: two sequences stepping in turn never run a kept graph (%llu did)", cfgs[ci].name,
              (unsigned long long)f.e.n_reused);
        k3_state_reset(&a);
        for (int i = 0; i < N; i++) run_batch(&f.e, &a, tok + i, 1, RUN_PLAIN, got + (size_t)i * V);
        CHECK(memcmp(ref, got, (size_t)N * V * sizeof(float)) == 0,
              "%s: %d steps of one sequence, graphs kept == graphs built, bit for bit", cfgs[ci].name, N);
        /* Built at positions 0 and 256 (the rows read grow from 256 to 512), run again at the other 298. */
        CHECK(f.e.n_reused == (kept ? N - 2 : 0), "%s: %llu steps ran the kept graph, expected %d", cfgs[ci].name,
              (unsigned long long)f.e.n_reused, kept ? N - 2 : 0);
        k3_state_reset(&a);
        run_batch(&f.e, &a, tok, 1, RUN_PLAIN, got); /* kept: a at position 0 */
        const uint64_t before = f.e.n_reused;
        k3_state_free(&a);
        if (k3_state_init(&a, &f.hp, 0, L, 512, &err) != 0) exit(1);
        run_batch(&f.e, &a, tok, 1, RUN_PLAIN, got);
        CHECK(f.e.n_reused == before && memcmp(ref, got, (size_t)V * sizeof(float)) == 0,
              "%s: a new state at the freed one's address gets a graph of its own, and the same logits", cfgs[ci].name);
        /* Taps changing between steps: none, none, layer 1, layer 1, layer 2, none. Kept only where a step asks
         * what the one before asked (steps 1 and 3); the reference steps b before each step of a. */
        enum { NT = 6 };
        const int taps[NT] = {-1, -1, 1, 1, 2, -1};
        const size_t d = f.hp.n_embd;
        float *tref = calloc(NT * d, sizeof(float)), *tgot = calloc(NT * d, sizeof(float));
        bool ok = true;
        k3_state_reset(&a);
        for (int i = 0; i < NT; i++) {
            run_batch(&f.e, &b, tok + i, 1, RUN_PLAIN, other);
            ok &= run_tap_step(&f.e, &a, tok[i], taps[i], ref + (size_t)i * V, tref + (size_t)i * d);
        }
        k3_state_reset(&a);
        run_batch(&f.e, &b, tok, 1, RUN_PLAIN, other);
        const uint64_t t0 = f.e.n_reused;
        for (int i = 0; i < NT; i++) ok &= run_tap_step(&f.e, &a, tok[i], taps[i], got + (size_t)i * V, tgot + (size_t)i * d);
        CHECK(ok && memcmp(ref, got, (size_t)NT * V * sizeof(float)) == 0 && memcmp(tref, tgot, NT * d * sizeof(float)) == 0,
              "%s: steps whose taps change: the taps asked for, logits and taps as built graphs give them", cfgs[ci].name);
        CHECK(f.e.n_reused - t0 == (kept ? 2 : 0), "%s: %llu of those steps ran the kept graph, expected %d", cfgs[ci].name,
              (unsigned long long)(f.e.n_reused - t0), kept ? 2 : 0);
        free(tref);
        free(tgot);
        free(ref);
        free(got);
        free(other);
        k3_state_free(&a);
        k3_state_free(&b);
        k3_engine_free(&f.e);
        mf_close(&f.m);
    }
    unlink(path);
}

/* One decode step of several sequences, a token each (from the sequence's index and position); the logits
 * of every row into dst. */
static void run_multi(k3_engine *e, k3_state **all, const int *idx, int n, float *dst) {
    k3_state *seqs[8];
    uint32_t nt[8];
    int32_t tok[8], rows[8];
    for (int i = 0; i < n; i++) {
        seqs[i] = all[idx[i]];
        nt[i] = 1;
        tok[i] = (int32_t)((seqs[i]->n_past * 7919u + (uint32_t)idx[i] * 104729u) % (e->hp.n_vocab - 256));
        rows[i] = i;
    }
    k3_batch b = {.n_seqs = n, .seqs = seqs, .n_tokens = nt, .tokens = tok, .n_logits = n, .logit_rows = rows};
    k3_output o;
    forward_ok(e, &b, &o);
    memcpy(dst, o.logits, (size_t)n * e->hp.n_vocab * sizeof(float));
    k3_output_free(&o);
}

/* The kept graph of a server's decode steps: several sequences, a token each, grouped (k3_group). A step runs
 * the kept graph when its sequences fall into the same groups: the same sequence where it is alone in its
 * group, any sequences of the same pool in a group of gathered slots, the same slots in a group of
 * consecutive ones. Every step must give the bits of a graph built for it; the reference steps an unrelated
 * sequence between two steps (which drops the kept graph). Sequences 0-5 hold pool slots 0, 1, 2, 3, 5, 7
 * (so {0,1,2,3} and {2,3} are consecutive, {0,2,4} and {1,3,5} gathered); 6 is a state of its own. */
static void test_kept_groups(const char *dir) {
    char path[256];
    snprintf(path, sizeof path, "%s/kept-groups.gguf", dir);
    synth_tiny(path, NULL, 9);
    rl_err err;
    static const struct {
        int n, idx[6];
        bool reuse; /* runs the graph of the step before */
    } steps[] = {
        {4, {0, 1, 2, 3}, false}, {4, {0, 1, 2, 3}, true},  /* consecutive slots 0-3 */
        {4, {1, 2, 3, 4}, false},                            /* slots 1, 2, 3, 5: gathered */
        {3, {0, 2, 4}, false},    {3, {1, 3, 5}, true},      /* gathered: other sequences, same graph */
        {3, {5, 3, 1}, true},     {3, {0, 1, 2}, false},     /* order changed; then consecutive again */
        {3, {1, 2, 3}, false},                               /* consecutive, but from slot 1 */
        {3, {6, 0, 1}, false},    {3, {6, 0, 1}, true},      /* a sequence alone in its group, then a group */
        {3, {6, 2, 3}, false},    {3, {6, 4, 5}, false},     /* slots 2-3 consecutive; 5 and 7 are not */
        {3, {6, 5, 4}, true},     {2, {6, 0}, false},        /* gathered again; two groups of one */
        {2, {6, 0}, true},        {2, {6, 1}, false},        /* a group of one is its sequence */
    };
    const int n_steps = (int)(sizeof steps / sizeof steps[0]);
    static const int slot_of[6] = {0, 1, 2, 3, 5, 7};
    const struct {
        bool no_fa;
        const char *name;
    } cfgs[] = {{false, "flash attention, f16 cache"}, {true, "softmax, f16 cache"}};
    for (size_t ci = 0; ci < sizeof cfgs / sizeof cfgs[0]; ci++) {
        fx f;
        const k3_engine_opts eo = {.n_threads = 2, .no_flash_attn = cfgs[ci].no_fa};
        if (open_fx_opts(&f, path, &eo) != 0) exit(1);
        const uint32_t V = f.hp.n_vocab, L = f.hp.n_layer;
        size_t rows = 0;
        for (int i = 0; i < n_steps; i++) rows += (size_t)steps[i].n;
        float *res[2] = {malloc(rows * V * sizeof(float)), malloc(rows * V * sizeof(float))};
        float *other = malloc((size_t)V * sizeof(float));
        bool reuse_ok = true;
        for (int pass = 0; pass < 2; pass++) { /* 0: every step built; 1: kept graphs where they fit */
            k3_state_pool pool;
            k3_state st[7], x, *all[7];
            if (k3_state_pool_init(&pool, &f.hp, 0, L, 64, 8, &err) != 0 || k3_state_init(&st[6], &f.hp, 0, L, 64, &err) != 0 ||
                k3_state_init(&x, &f.hp, 0, L, 64, &err) != 0) {
                fprintf(stderr, "%s\n", err.msg);
                exit(1);
            }
            for (int i = 0; i < 6; i++) {
                if (k3_state_init_pooled(&st[i], &pool, slot_of[i], &err) != 0) exit(1);
            }
            for (int i = 0; i < 7; i++) {
                all[i] = &st[i];
                int32_t pre[16];
                for (int t = 0; t < 3 + i; t++) pre[t] = (int32_t)((100 + 37 * i + t) % (V - 256));
                float *lg = malloc((size_t)(3 + i) * V * sizeof(float));
                run_batch(&f.e, &st[i], pre, (uint32_t)(3 + i), RUN_PLAIN, lg); /* prompts of 3 to 9 tokens */
                free(lg);
            }
            size_t at = 0;
            for (int i = 0; i < n_steps; i++) {
                if (pass == 0) run_batch(&f.e, &x, (const int32_t[]){(int32_t)(500 + i)}, 1, RUN_PLAIN, other);
                const uint64_t before = f.e.n_reused;
                run_multi(&f.e, all, steps[i].idx, steps[i].n, res[pass] + at * V);
                at += (size_t)steps[i].n;
                const bool reused = f.e.n_reused != before;
                if (reused != (pass == 1 && steps[i].reuse)) {
                    fprintf(stderr, "  %s: step %d %s the kept graph\n", cfgs[ci].name, i, reused ? "ran" : "did not run");
                    reuse_ok = false;
                }
            }
            for (int i = 0; i < 7; i++) k3_state_free(&st[i]);
            k3_state_free(&x);
            k3_state_pool_free(&pool);
        }
        CHECK(memcmp(res[0], res[1], rows * V * sizeof(float)) == 0,
              "%s: %d decode steps of grouped sequences, graphs kept where they fit == graphs built, bit for bit",
              cfgs[ci].name, n_steps);
        CHECK(reuse_ok, "%s: the kept graph ran exactly for the steps whose groups match the step before", cfgs[ci].name);
        /* A pool freed and made again (here at the same address) is another pool: a group of its slots gets a
         * graph of its own (the kept one's tensors are the freed pool's), and the logits of a built graph. */
        float *pl[4] = {malloc(2 * V * sizeof(float)), malloc(2 * V * sizeof(float)), malloc(2 * V * sizeof(float)),
                        malloc(2 * V * sizeof(float))};
        bool pool_ok = true;
        for (int round = 0; round < 3; round++) { /* 0: keeps a group's graph; 1: a new pool; 2: the reference */
            k3_state_pool pool;
            k3_state st[2], x, *all[2] = {&st[0], &st[1]};
            if (k3_state_pool_init(&pool, &f.hp, 0, L, 64, 4, &err) != 0 || k3_state_init_pooled(&st[0], &pool, 0, &err) != 0 ||
                k3_state_init_pooled(&st[1], &pool, 2, &err) != 0 || k3_state_init(&x, &f.hp, 0, L, 64, &err) != 0) {
                fprintf(stderr, "%s\n", err.msg);
                exit(1);
            }
            if (round == 2) run_batch(&f.e, &x, (const int32_t[]){7}, 1, RUN_PLAIN, other);
            const uint64_t before = f.e.n_reused;
            run_multi(&f.e, all, (const int[]){0, 1}, 2, pl[round]);
            pool_ok &= f.e.n_reused == before; /* never the graph of the pool before */
            if (round == 0) run_multi(&f.e, all, (const int[]){0, 1}, 2, pl[3]); /* its graph is kept now */
            k3_state_free(&st[0]);
            k3_state_free(&st[1]);
            k3_state_free(&x);
            k3_state_pool_free(&pool);
        }
        CHECK(pool_ok && memcmp(pl[1], pl[2], 2 * V * sizeof(float)) == 0 && memcmp(pl[0], pl[2], 2 * V * sizeof(float)) == 0,
              "%s: a group of a pool made again at a freed pool's address gets a graph of its own, and its logits",
              cfgs[ci].name);
        for (int i = 0; i < 4; i++) free(pl[i]);
        free(res[0]);
        free(res[1]);
        free(other);
        k3_engine_free(&f.e);
        mf_close(&f.m);
    }
    unlink(path);
}

int main(void) {
    char dir[] = "/tmp/ringlm-fwd-XXXXXX";
    if (!mkdtemp(dir)) return 1;
    /* RINGLM_TEST_QUICK (set by `make check` for the sanitizer build): the tiny configs only. The small
     * ones run the same code on larger shapes; the release build runs them all, and under ASan they took
     * most of this program's minutes, in a CI run that must stay under 30. */
    const bool quick = getenv("RINGLM_TEST_QUICK") != NULL;
    test_model("tiny", "f32", dir, 1);
    test_model("tiny", "q8_0", dir, 0);
    if (!quick) test_model("small", "f32", dir, 1);
    if (!quick) test_model("small", "q4_K", dir, 0);
    test_model("tiny", "q4_0", dir, 0); /* repacked on AVX2 and later: step kernels and cuts still exact */
    /* Flash attention over an f16 cache: verified blocks (one FA op per token), pooled groups and cuts keep
     * their bits; chunked prefill to 1e-4 like the plain path. */
    test_model_opts("tiny", "f32", dir, 1, true);
    test_model_opts(quick ? "tiny" : "small", "q8_0", dir, 0, true);
    test_placement(dir);
    test_mask_oom(dir);
    test_kept_graph(dir);
    test_kept_groups(dir);
    rmdir(dir);
    return check_done();
}
