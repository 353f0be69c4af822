/* synth_dspark.h - writes a seeded-random DSpark draft model for a K3 target (`ringlm synth --draft dspark`).
 *
 * The file uses llama.cpp's generic DFlash/DSpark layout (docs/k3-spec.md §10.1): general.architecture "dflash", a
 * Qwen3-style GQA backbone, fc + enc.output_norm over the concatenated target taps, the rank-R Markov head
 * and the confidence head. It carries no token embedding and no LM head: a draft shares the target's.
 * The real K3 DSpark has an MLA backbone that llama.cpp cannot load (docs/k3-spec.md §10.2.3); this layout is the one
 * llama.cpp's loader validates. docs/dspark.md lists every key and tensor. */
#ifndef RINGLM_SYNTH_DSPARK_H
#define RINGLM_SYNTH_DSPARK_H

#include <stdint.h>

#include "synth.h"
#include "synth_config.h"

#define DSPARK_BLOCK_SIZE 7 /* K3's DSpark block: anchor + 6 masks, vLLM num_speculative_tokens = 7 */
#define DSPARK_N_LAYER 2
#define DSPARK_SYNTH_TAPS 3

/* The draft's shape, derived from the target config (exposed so tests and the future draft graph agree
 * with the writer on one set of numbers). */
typedef struct dspark_shape {
    uint32_t n_embd;      /* = target n_embd: the driver packs taps of the target's width into fc */
    uint32_t n_vocab;     /* = target n_vocab */
    uint32_t n_layer;
    uint32_t n_head, n_head_kv, head_dim;
    uint32_t n_ff;
    uint32_t markov_rank; /* R */
    uint32_t n_ctx_train;
    float rms_eps;
    float rope_freq_base;
    int n_taps;
    int32_t taps[DSPARK_SYNTH_TAPS]; /* target layer ids, "input of layer i" convention, ascending, < n_layer */
} dspark_shape;

/* Fills s from the target config; fails if the target's width has no usable head size. */
int dspark_shape_for(const synth_config *target, dspark_shape *s, rl_err *err);

/* Writes the DSpark draft for target config `target` (same vocabulary, hidden size = target's n_embd).
 * Storage types follow the target config (its `type` and glob overrides, so --type applies too); norms,
 * biases and the one-row confidence projection stay f32. Honors o->n_split, o->dry_run, o->progress. */
int synth_dspark_write(const synth_config *target, const synth_opts *o, rl_err *err);

#endif
