/* Folder src/speculate/: speculative decoding: drafters (n-gram, draft model, the DSpark graph), the draft
 * model pool serve uses, acceptance, the speculative loop with pipelining, the local verifier. May include:
 * base, gguf, model, text, gen. (README "Layout"; tests/t_layout.sh checks both.)
 */
/* spec_gen.h - speculative decoding: draft k tokens, verify them in one target pass, keep what matches.
 *
 * The target side is a verifier: on one machine (spec_verifier_local) or through the ring (the last stage
 * accepts, every stage rolls back what was rejected). Over a network a target pass costs one trip around
 * the ring, so every extra token accepted per pass is nearly free. Greedy output equals plain greedy
 * decoding; sampled output has the target's distribution (accept.h). The draft length adapts: it grows
 * after a fully accepted block and shrinks when less than half is kept.
 *
 * Pipelining (depth > 1, verifiers with submit/collect): while a block travels, the next is drafted as if
 * it were wholly accepted, after a guess of its bonus token, and sent behind it; up to `depth` blocks are
 * in flight. When a block is not wholly accepted (or its bonus is not the guess) the blocks behind it are
 * stale: the last stage answers them without running them, every stage rolls back past them when the next
 * valid block arrives, and drafting restarts from what was committed. */
#ifndef RINGLM_SPEC_GEN_H
#define RINGLM_SPEC_GEN_H

#include <stdbool.h>

#include "../gen/generate.h"
#include "drafter.h"

typedef struct spec_verifier {
    void *ctx;
    /* Prefills the prompt; returns the first sampled token (the next block's first input). */
    int (*begin)(void *ctx, const int32_t *prompt, size_t n, const smp_params *sp, int32_t *first, rl_err *err);
    /* Runs tokens[0..n) at position pos (tokens[0] is the last committed token, the rest are drafts) and
     * returns the committed tokens (accepted drafts, then the correction or bonus token). The sequence is
     * valid up to pos + *n_out afterwards; the verifier rolls back the rest before its next call. */
    int (*verify)(void *ctx, uint32_t pos, const int32_t *tokens, int n, const spec_q *qs, int32_t *out, int *n_out,
                  rl_err *err);
    void (*end)(void *ctx);
    /* Taps for a DSpark drafter (NULL where the verifier has none). set_taps, before begin: from now on
     * record the stream entering these target layers. features, after begin: the prompt's rows; after
     * verify: the rows of the committed positions (pos .. pos + n_out - 1); rows of n * n_embd floats. */
    int (*set_taps)(void *ctx, const uint32_t *layers, int n, rl_err *err);
    const float *(*features)(void *ctx, uint32_t *n_rows);
    /* Pipelining (NULL where absent): submit sends a block like verify without waiting for its result;
     * collect waits for the oldest submitted block's. *n_out == 0: the block was stale (the last stage saw
     * that an earlier block was not wholly accepted) and was not run. features() refers to the collected. */
    int (*submit)(void *ctx, uint32_t pos, const int32_t *tokens, int n, const spec_q *qs, rl_err *err);
    int (*collect)(void *ctx, int32_t *out, int *n_out, rl_err *err);
} spec_verifier;

#define SPEC_MAX_DEPTH 8 /* blocks in flight; the stages keep rollback copies for that many (ASSIGN rollback_blocks) */

/* Speculation that does not pay falls back to plain decoding (`run`, and per request in `serve`): every
 * SPEC_FALLBACK_WINDOW drafted tokens, if fewer than one in SPEC_FALLBACK_MIN_KEPT was kept, SPEC_FALLBACK_PAUSE
 * steps run without drafts, then drafts are tried again (a probe); each probe that fails again doubles the
 * pause, up to SPEC_FALLBACK_PAUSE_MAX, and one that pays resets it. A verified block costs more than a plain
 * step (its drafts run, with step kernels and rollback copies; a draft model's steps), and under one kept draft
 * in ten it commits barely more than one token. Adaptive drafting in `run` (not --draft-fixed) also pauses
 * when its cost model, fed live, says plain steps commit more tokens a second: a plain step's traversal and
 * each verified draft's extra time are measured (spec_len_pick), so a draft that agrees half the time
 * pays over a slow network and not on a CPU ring whose stages spend a token's compute on every draft. Serve
 * judges by the count alone (its verified drafts share frames with other requests' steps). Greedy output is
 * unchanged: a plain step is a block of no drafts. */
#define SPEC_FALLBACK_WINDOW 16
#define SPEC_FALLBACK_MIN_KEPT 10
#define SPEC_FALLBACK_PAUSE 32
#define SPEC_FALLBACK_PAUSE_MAX 1024
/* Adaptive drafting (`run`): the first block's draft length, before any acceptance is known (spec_gen.c). */
#define SPEC_FIRST_K 2

/* The draft length (0..k_max) that commits the most tokens a second, drafts accepted with probability alpha
 * each: a block costs t_step (a plain step's traversal, seconds) + t_tok per draft it carries + t_draft per
 * draft drafted, or with blocks in flight (deff on average, while the chain is likely) the larger of its share
 * of a traversal and its drafting. 0: plain steps commit more. t_step <= 0 (not measured): every block is
 * priced at t_trav and the answer is at least 1. */
int spec_len_pick(double alpha, double t_trav, double t_step, double t_tok, double t_draft, double deff, int k_max);

typedef struct spec_params {
    int k_max;     /* longest draft (<= SPEC_MAX_DRAFT) */
    bool adaptive; /* adapt the draft length to the acceptance */
    int depth;     /* the most blocks in flight (pipelining, where the verifier can): 1 = draft, verify, repeat;
                    * adaptive: fewer while the chain they assume is unlikely (spec_gen.c, SPEC_AHEAD_MIN) */
    bool no_fallback; /* draft every step, paying or not (SPEC_FALLBACK_*) */
} spec_params;

typedef struct spec_metrics {
    long drafted, accepted, traversals, committed;
    long cancelled;              /* blocks sent ahead and found stale (pipelining) */
    long fallbacks, paused_steps; /* drafting paused for not paying, and the steps decoded plainly meanwhile */
    long blocks, depth_sum;      /* blocks sent, and the blocks in flight counted at each send (itself too) */
    long sent_drafts;            /* drafts those blocks carried (stale ones too: drafted counts only the others) */
    int depth_max;               /* the most blocks ever in flight at once */
    double draft_s, verify_s;
    double acceptance_rate;      /* accepted / drafted */
    double tokens_per_traversal; /* committed / verifier passes (the prefill's pass not counted) */
    uint64_t draft_digest;       /* FNV-1a of every drafted token id, in order: equal digests, equal drafts */
} spec_metrics;

int spec_run(spec_verifier *v, spec_drafter *d, const tok_tokenizer *tok, const int32_t *prompt, size_t n_prompt,
             const gen_params *p, const spec_params *sp, gen_token_cb cb, void *user, gen_metrics *m,
             spec_metrics *sm, rl_err *err);

/* The verifier on one machine: a whole-model engine, one sequence. */
typedef struct spec_local {
    k3_engine *e;
    uint32_t n_ctx;
    uint32_t chunk;
    k3_state st;
    smp_sampler smp;
    bool have_st, have_smp;
    uint32_t taps[DSPARK_MAX_TAPS]; /* DSpark taps (set_taps) and the rows of the last call */
    int n_taps;
    float *feat;
    uint32_t n_feat, cap_feat;
} spec_local;

spec_verifier spec_verifier_local(spec_local *l);

/* For verifiers' features(): makes room for n_new more rows of `row` floats in *buf (which holds *n of
 * *cap) and returns where they go (NULL, err set, when out of memory). */
float *spec_feat_grow(float **buf, uint32_t *n, uint32_t *cap, size_t row, uint32_t n_new, rl_err *err);

#endif
