/* inspect.h - `ringlm inspect`: what a planner and a human need to know about a K3 file. */
#ifndef RINGLM_INSPECT_H
#define RINGLM_INSPECT_H

#include <stdbool.h>
#include <stdio.h>

#include "../gguf/model_file.h"
#include "../model/k3_hparams.h"

typedef struct inspect_opts {
    int kv_format;        /* 1: machine-readable "key value" lines (same keys as tests/oracle info) */
    int range_a, range_b; /* layer range to size; range_b < 0 = none asked */
    unsigned n_seq, n_ctx;
    bool cache_f32;       /* size the MLA cache in f32 (--cache-type f32), not f16 (the default) */
    unsigned chunk;       /* prefill chunk the compute buffer is sized for (--chunk; 0: 512) */
} inspect_opts;

void inspect_print(FILE *out, const mf_model *m, const k3_hparams *hp, const inspect_opts *o);

#endif
