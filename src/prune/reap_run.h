/* reap_run.h - REAP's forward passes on one machine: scoring calibration text, and measuring what a pruned
 * model loses against the unpruned one on held-out text.
 *
 * Both cut each sequence into chunks of `chunk` tokens, fed in order from an empty state; the same chunking
 * gives the same numbers (scoring through a ring chunks alike). */
#ifndef RINGLM_REAP_RUN_H
#define RINGLM_REAP_RUN_H

#include <stdbool.h>
#include <stdint.h>

#include "../base/err.h"
#include "../model/k3_forward.h"
#include "calib.h"
#include "reap.h"

/* The scoring runs' progress bar: done of total tokens since t0 (rl_clock_now), with
 * tokens/s and the time left, redrawn at most 4 times a second (*last: when it last was) and at the end. */
void reap_bar(const char *label, size_t done, size_t total, double t0, double *last);

/* Runs every sequence of c through e (the whole model or a layer range starting at 0) with routing
 * statistics on, adding them to s. progress: a bar on stderr with tokens/s and ETA. */
int reap_score_local(k3_engine *e, const calib_set *c, uint32_t chunk, reap_stats *s, bool progress, rl_err *err);

/* What a model does on held-out text, measured against a reference model's next-token distributions. */
typedef struct reap_quality {
    uint64_t n;         /* predicted positions (each sequence's tokens but its last) */
    double agree;       /* fraction whose argmax equals the reference's */
    double kl;          /* mean KL(reference || this), nats */
    double ppl;         /* perplexity of the held-out next tokens */
} reap_quality;

/* Runs h through ref and every engine of cand[0..n) (whole models, same vocabulary) and fills q[i] for
 * each candidate and *ref_q for the reference itself (agreement 1, KL 0). */
int reap_eval(k3_engine *ref, k3_engine **cand, int n, const calib_set *h, uint32_t chunk, reap_quality *q,
              reap_quality *ref_q, bool progress, rl_err *err);

#endif
