/* reap_job.h - `ringlm reap` end to end: calibrate (or read a scores file), choose, write, report.
 *
 * Every check of the request (the keep count against the router's k and the expert count, the fraction,
 * the model's expert tensors, the calibration and held-out files, the output path) runs before the first
 * forward pass, so a bad request costs nothing. */
#ifndef RINGLM_REAP_JOB_H
#define RINGLM_REAP_JOB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/err.h"
#include "../model/k3_forward.h"
#include "calib.h"
#include "reap.h"

/* Scores calibration text somewhere else (a ring), adding to s: the same chunking as reap_score_local. */
typedef int (*reap_score_fn)(void *ctx, const calib_set *c, uint32_t chunk, reap_stats *s, rl_err *err);

typedef struct reap_job {
    const char *model;
    const char *const *calib; /* calibration files; none: scores_in */
    int n_calib;
    const char *scores_in;    /* prune from a scores file instead of calibrating */
    const char *scores_out;   /* write the scores (JSON) */
    uint32_t keep;            /* experts kept per layer, or 0 with prune */
    double prune;             /* fraction pruned, in (0, 1) */
    const char *out;          /* pruned model; NULL: score only */
    int n_split;              /* 0: like the input */
    size_t max_tokens;        /* calibration tokens, 0: all */
    uint32_t ctx, chunk;      /* sequence length and tokens per forward pass */
    const char *protect;      /* --protect LIST, or NULL */
    bool freq;                /* frequency-weighted saliency (sums) */
    const char *report;       /* Markdown report, with eval */
    const char *const *eval;  /* held-out files */
    int n_eval;
    k3_engine_opts eng;
    bool progress;
    reap_score_fn score;      /* NULL: on this machine */
    void *score_ctx;
    const char *where;        /* where scoring ran, for the summary ("this machine", "a ring of 3 nodes") */
} reap_job;

int reap_job_run(const reap_job *j, rl_err *err);

#endif
