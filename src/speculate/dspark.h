/* dspark.h - the DSpark draft model (DFlash plus a Markov head): a whole block of draft tokens in one
 * forward pass, conditioned on hidden states tapped from the target (docs/k3-spec.md §10.1, docs/dspark.md).
 *
 * The draft file is llama.cpp's generic `dflash` layout (what `ringlm synth --draft dspark` writes): a few
 * Qwen3-style blocks, no embedding and no LM head of its own (it borrows the target's `token_embd` and
 * `output`). Per target position i the target hands over f_i = the stream h entering each tap layer,
 * concatenated in `target_layers` order; g_i = RMSNorm(fc . f_i; enc.output_norm) becomes, in every draft
 * layer, the K and V of position i in the draft's own cache (no attn_norm on g). A block [anchor, MASK...]
 * at the next positions attends to that context and to itself (non-causal inside the block unless the file
 * says `dflash.attention.causal`). Then output_norm, the target's LM head, and on DSpark files the Markov
 * bias chained greedily slot by slot: logits_i += markov_w2 . markov_w1[prev], prev = argmax(logits_i),
 * starting from the anchor. The confidence head gives sigmoid(conf_proj . [hid_i ; markov_w1[prev_i]] + b).
 *
 * Anchor-first files (`dflash.sample_from_anchor`, the default) draft from slot 0; others from slot 1.
 * The cache never needs a rollback: the caller pushes features only for positions the target committed,
 * and each block is computed afresh after them. */
#ifndef RINGLM_DSPARK_H
#define RINGLM_DSPARK_H

#include <stdbool.h>
#include <stdint.h>

#include "../base/err.h"
#include "../gguf/model_file.h"
#include "../model/k3_hparams.h"

#define DSPARK_MAX_TAPS 8
#define DSPARK_MAX_LAYERS 16
#define DSPARK_MAX_BLOCK 16

struct ggml_tensor;
struct ggml_context;
struct ggml_backend;
struct ggml_backend_buffer;
struct ggml_gallocr;

typedef struct dspark_layer {
    struct ggml_tensor *attn_norm, *wq, *wk, *wv, *wo, *q_norm, *k_norm, *ffn_norm, *gate, *up, *down;
} dspark_layer;

typedef struct dspark {
    mf_model m; /* the draft file */
    /* hyperparameters */
    uint32_t n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_vocab, block_size, rank;
    float rms_eps, rope_base;
    uint32_t n_taps, taps[DSPARK_MAX_TAPS]; /* target layers whose input stream is tapped, in fc order */
    int32_t mask_id;
    bool from_anchor, causal;
    /* weights: the draft's, plus the target's embedding and LM head (bound to the target's mapping) */
    dspark_layer layers[DSPARK_MAX_LAYERS];
    struct ggml_tensor *fc, *fc_scale, *enc_norm, *out_norm, *markov_w1, *markov_w2, *markov_scale, *conf_w, *conf_b;
    struct ggml_tensor *tok_embd, *lm_head;
    struct ggml_context *wctx;
    struct ggml_backend_buffer *bufs[2 * 64]; /* host buffers wrapping the draft's and the target's mappings */
    int n_bufs;
    /* compute */
    struct ggml_backend *backend;
    struct ggml_gallocr *galloc;
    void *graph_buf;
    size_t graph_cap;
    /* the context cache: K and V of every injected position, per layer, f32 [n_ctx][n_head_kv * head_dim] */
    uint32_t n_ctx, n_cached;
    float *kc[DSPARK_MAX_LAYERS], *vc[DSPARK_MAX_LAYERS];
    /* features pushed but not yet injected (injected by the next block's graph) */
    float *pend;
    uint32_t n_pend, cap_pend;
} dspark;

/* Opens a draft for this target: checks the architecture, that hidden size and vocabulary equal the
 * target's, the tap ids (1 .. target n_layer), head shapes, block size, and that every tensor is there. */
int dspark_open(dspark *ds, const char *path, const mf_model *target, const k3_hparams *thp, uint32_t n_ctx,
                int n_threads, rl_err *err);
void dspark_close(dspark *ds);
/* Forgets the context (a new sequence). */
void dspark_reset(dspark *ds);

/* Appends the target's features of the next n positions: n rows of n_taps * n_embd floats, tap k at
 * [k * n_embd, (k+1) * n_embd) (the order of ds->taps). */
int dspark_push(dspark *ds, const float *feats, uint32_t n, rl_err *err);

typedef struct dspark_out {
    int n_block;                       /* slots computed */
    int32_t tokens[DSPARK_MAX_BLOCK];  /* argmax of each slot's (Markov-biased) logits */
    float conf[DSPARK_MAX_BLOCK];      /* the confidence head's value per slot (1 without a head) */
    float *logits;                     /* in: NULL, or a buffer of n_block * n_vocab floats to fill */
} dspark_out;

/* Runs the block [anchor, MASK x (n_block-1)] at positions n_cached .. (after injecting pushed features).
 * Slot i's token is the draft for position n_cached + i + 1 (anchor-first) or n_cached + i (otherwise).
 * n_block is at most block_size (and DSPARK_MAX_BLOCK): longer blocks are refused. */
int dspark_block(dspark *ds, int32_t anchor, int n_block, dspark_out *out, rl_err *err);

#endif
