/* Folder src/tools/: synth (configs, vocabulary, weights, writer), inspect, logits comparison, the latency
 * relay. May include: base, gguf, model, net. (README "Layout"; tests/t_layout.sh checks both.)
 */
/* synth.h - writes a kimi-k3 GGUF with seeded random weights (`ringlm synth`).
 *
 * Every weight is a pure function of (seed, tensor name, element index), so the same seed gives the same
 * model whatever the storage types or split count: a q4_K file and an f32 file of one seed are the same
 * model at two precisions (useful as a draft/target pair). */
#ifndef RINGLM_SYNTH_H
#define RINGLM_SYNTH_H

#include <stdbool.h>
#include <stdint.h>

#include "../base/err.h"
#include "synth_config.h"

typedef struct synth_opts {
    const char *out;  /* NAME.gguf; with n_split > 1, NAME-0000i-of-0000n.gguf */
    uint64_t seed;
    int n_split;      /* 1 = one file */
    int n_threads;
    bool progress;    /* progress bar on stderr */
    bool dry_run;     /* print the tensor count and size, write nothing */
    const char *corpus; /* not NULL: the BPE vocabulary is learned from this text file instead of the corpus
                         * embedded in the binary (a trained model's own text, tools/train) */
    struct mf_model *shapes; /* not NULL: the model without weights (gguf/model_file.h mf_compose: metadata and
                              * the tensor table, data NULL) goes here instead of a file (--shape-only) */
} synth_opts;

/* The vocabulary a model of n_vocab ids gets: learned from o->corpus when set, else from the embedded corpus. */
struct sv_vocab;
int synth_vocab_build(struct sv_vocab *v, int32_t n_vocab, const synth_opts *o, rl_err *err);

/* Writes a K3 model for config c. */
int synth_write(const synth_config *c, const synth_opts *o, rl_err *err);

/* How a tensor's values are drawn. Every value is a pure function of (seed, name, index). */
enum synth_init {
    SYNTH_INIT_MATRIX,  /* uniform with std = scale (callers use gain/sqrt(fan-in)) */
    SYNTH_INIT_UNIFORM, /* the same draw, for non-matrix tensors */
    SYNTH_INIT_NORM,    /* 1 +- 0.1 */
    SYNTH_INIT_SSM_A,   /* KDA A = -exp(A_log), in (-16, -1) */
    SYNTH_INIT_DT_BIAS, /* KDA gate bias, in (-2, 0) */
    SYNTH_INIT_ZERO,
    SYNTH_INIT_PROBS_B, /* UNIFORM, except elements from dead_from on: -1000 (never-chosen experts) */
};

typedef struct synth_tensor {
    char name[64];
    int n_dims;
    int64_t ne[4];
    int type; /* enum ggml_type */
    enum synth_init init;
    float scale;
    int64_t dead_from; /* SYNTH_INIT_PROBS_B */
} synth_tensor;

/* The writer under every model kind: copies meta's key/values into the (first) file, then writes the
 * tensors in order, generating and quantizing their data in chunks (memory stays small for large models).
 * Honors o->n_split, o->dry_run and o->progress. */
struct gguf_context;
int synth_emit(struct gguf_context *meta, const synth_tensor *tensors, int n_tensors, const synth_opts *o,
               rl_err *err);

#endif
