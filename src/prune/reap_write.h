/* reap_write.h - writes a pruned model: the experts a reap_plan keeps, their quantized blocks copied as
 * they are (no requantization), the router rows and selection biases of the same experts, expert_count
 * updated; every other tensor and key unchanged.
 *
 * Expert e of a {.., E} tensor is the e-th contiguous slab of its outermost axis (docs/k3-spec.md §3), so slicing is
 * copying whole slabs out of the mapping, in the kept order (ascending ids: the surviving experts keep
 * their relative order, and the router still ranks them the same). */
#ifndef RINGLM_REAP_WRITE_H
#define RINGLM_REAP_WRITE_H

#include <stdbool.h>

#include "../base/err.h"
#include "../gguf/model_file.h"
#include "../model/k3_hparams.h"
#include "reap.h"

typedef struct reap_write_opts {
    const char *out;      /* OUT.gguf; with n_split > 1, OUT-0000i-of-0000n.gguf */
    int n_split;          /* 0: as many files as the input has; 1: one file */
    bool progress;
    bool check_only;      /* validate the model's expert tensors against the plan, write nothing */
} reap_write_opts;

/* Checks every MoE layer's expert tensors against the model's expert count before writing anything (a
 * file whose tensors disagree with expert_count, an already-sliced inconsistency, is refused by name). */
int reap_write(const mf_model *m, const k3_hparams *hp, const reap_plan *p, const reap_write_opts *o, rl_err *err);

#endif
