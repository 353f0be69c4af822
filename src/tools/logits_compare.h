/* logits_compare.h - compares two logits files (ours vs the oracle's): the one check every numeric test uses. */
#ifndef RINGLM_LOGITS_COMPARE_H
#define RINGLM_LOGITS_COMPARE_H

#include "../base/err.h"

typedef struct lc_result {
    int n_rows, n_vocab;
    double max_abs_diff;  /* max over all entries of |a - b| */
    double max_abs_logit; /* max |a| (the reference scale) */
    double rel;           /* max_abs_diff / max_abs_logit */
    int worst_row;
    int argmax_agree;     /* rows whose argmax is the same */
    int nonfinite;        /* NaN/Inf entries in either file */
} lc_result;

/* Fails if the files disagree on shape or input tokens. */
int lc_compare_files(const char *a, const char *b, lc_result *r, rl_err *err);

#endif
