/* drafter.h - proposing the next k tokens cheaply, to be verified by the target in one pass.
 *
 *   NGRAM  prompt lookup: find the most recent earlier occurrence of the context's last n tokens
 *          (n = 4 down to 1) and propose what followed it. No model; shines when the output repeats the
 *          input (editing code, quoting a document).
 *   MODEL  a small model with the same vocabulary, run here: greedy at temperature 0, else sampled from
 *          its own (filtered) distribution, which is returned for speculative sampling. What it runs while
 *          drafting stays in its state, kept for rollback: a committed draft is never run twice, and a
 *          rejection rolls the state back to the last accepted token.
 *   DSPARK a DSpark draft (dspark.h): the whole block in one pass, from the target's stream at the tap
 *          layers, which the verifier hands over (spec_drafter_features) for every committed position.
 *          Its drafts are the greedy chain, so speculative sampling treats them like n-gram drafts (q = 1);
 *          with min_conf > 0 the block stops at the first slot the confidence head rates below it. */
#ifndef RINGLM_DRAFTER_H
#define RINGLM_DRAFTER_H

#include <stddef.h>
#include <stdint.h>

#include "../base/err.h"
#include "../gguf/model_file.h"
#include "../model/k3_forward.h"
#include "../text/sampler.h"
#include "accept.h"
#include "dspark.h"

#define SPEC_MAX_DRAFT 16
/* Tokens a draft model may run past what is committed: the blocks in flight (drafts and guesses) and the
 * block being drafted. Each is a block its state keeps for rollback. */
#define SPEC_MAX_FED 64

typedef enum spec_kind { SPEC_NONE, SPEC_NGRAM, SPEC_MODEL, SPEC_DSPARK } spec_kind;

typedef struct spec_drafter {
    spec_kind kind;
    /* MODEL */
    mf_model m;
    k3_hparams hp;
    k3_engine e;
    k3_state st;
    smp_sampler smp;
    int32_t pending;     /* the last committed token (-1: none), at position base */
    uint32_t base;       /* committed tokens before pending: the state is at base + n_fed */
    uint32_t n_prompt;   /* the prompt's tokens read in one batch at begin, as the target reads them (all of them:
                          * a draft that is the target then holds its very bits; a 1-token prompt: none) */
    float *row0;         /* the logits after the prompt's last token, for the first draft (NULL once used) */
    k3_snapshot snap;    /* the state at the prompt's end: a rollback there, which no kept block reaches */
    bool have_snap;
    int n_fed;           /* tokens run past base (pending first, then drafts and guesses of blocks in flight) */
    int32_t fed[SPEC_MAX_FED];
    unsigned reruns;     /* times the state had to be rebuilt from the history (not in spec_run's use) */
    /* the drafted distribution of the last draft, for speculative sampling */
    int32_t q_id[SPEC_MAX_DRAFT][64];
    float q_p[SPEC_MAX_DRAFT][64];
    spec_q q[SPEC_MAX_DRAFT];
    /* DSPARK */
    dspark ds;
    float min_conf;      /* stop drafting at a slot whose confidence is below this (0: never) */
} spec_drafter;

/* "ngram", "none", "dspark:PATH" (a DSpark draft for this target), or a GGUF path (a K3-architecture draft
 * model sharing the target's vocabulary). A DSpark draft borrows the target's embedding and LM head, so
 * the target's file must stay open while the drafter is. */
int spec_drafter_open(spec_drafter *d, const char *spec, const mf_model *target, const k3_hparams *thp, uint32_t n_ctx,
                      int threads, const smp_params *sp, rl_err *err);

/* A draft model file (a K3 sharing the target's vocabulary of target_vocab tokens), with an engine for all its
 * layers; on failure nothing is left open. Used by MODEL drafters and by the server's draft pool. */
int spec_model_open(mf_model *m, k3_hparams *hp, k3_engine *e, const char *path, uint32_t target_vocab, int threads,
                    rl_err *err);

/* The target layers whose input stream the drafter needs (DSPARK), or 0. */
int spec_drafter_taps(const spec_drafter *d, const uint32_t **layers);

/* DSPARK: the target's features (rows of n_taps * n_embd floats, spec_drafter_taps order) of the next n
 * committed positions. Every position the target committed must be handed over, in order. */
int spec_drafter_features(spec_drafter *d, const float *rows, uint32_t n, rl_err *err);
void spec_drafter_close(spec_drafter *d);

/* Starts a sequence: the model drafter prefills the prompt except its last token and reseeds its sampler
 * from the request's seed (same seed, same drafts; speculative sampling needs each draft to be a fresh
 * draw from the drafter's distribution). */
int spec_drafter_begin(spec_drafter *d, const int32_t *prompt, size_t n, uint64_t seed, rl_err *err);

/* Proposes up to k tokens following history[0..n) (history = prompt + everything committed, then, with
 * pipelining, the drafts and guesses of blocks still in flight: only history[0..n_conf) is committed; the
 * last committed token is the one the target runs first). *n_draft may be 0. *qs is set to the drafted
 * distributions (MODEL with sampling) or NULL. */
int spec_drafter_propose(spec_drafter *d, const int32_t *history, size_t n, size_t n_conf, int k, int32_t *draft,
                         int *n_draft, const spec_q **qs, rl_err *err);

/* Prompt lookup alone (NGRAM's proposal): up to k tokens that followed the most recent earlier occurrence
 * of the last 4, 3, 2 or 1 tokens of h[0..n). Returns how many. */
int spec_ngram(const int32_t *h, size_t n, int k, int32_t *draft);

/* Tells the drafter which tokens were committed after the last proposal (accepted drafts + correction). */
int spec_drafter_commit(spec_drafter *d, const int32_t *committed, int n, rl_err *err);

#endif
