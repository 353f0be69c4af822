/* k3_weights.h - the K3 tensors of one layer range, bound to the mapped file (no copy).
 *
 * A stage running layers [a, b) binds only blk.a..blk.(b-1), plus token_embd when a == 0 and the output
 * tensors when b == n_layer: pages of other layers are never touched. */
#ifndef RINGLM_K3_WEIGHTS_H
#define RINGLM_K3_WEIGHTS_H

#include <stdbool.h>
#include <stddef.h>

#include "../base/err.h"
#include "../gguf/model_file.h"
#include "k3_hparams.h"

struct ggml_context;
struct ggml_tensor;
struct ggml_backend_buffer;

typedef struct k3_layer_w {
    struct ggml_tensor *attn_norm, *ffn_norm, *attn_res_score, *ffn_res_score;
    /* KDA */
    struct ggml_tensor *wq, *wk, *wv, *conv_q, *conv_k, *conv_v, *f_a, *f_b, *dt_b, *ssm_a, *beta, *ssm_g, *ssm_norm;
    /* MLA */
    struct ggml_tensor *q_a, *q_a_norm, *q_b, *q, *kv_a, *kv_a_norm, *k_b, *v_b, *gate;
    struct ggml_tensor *wo; /* both */
    /* FFN */
    struct ggml_tensor *ffn_gate, *ffn_up, *ffn_down;
    struct ggml_tensor *gate_inp, *probs_b, *routed_down, *routed_up, *routed_norm;
    struct ggml_tensor *gate_exps, *up_exps, *down_exps, *gate_sh, *up_sh, *down_sh;
} k3_layer_w;

typedef struct k3_weights {
    uint32_t a, b;
    k3_layer_w *layers; /* layers[il - a] */
    struct ggml_tensor *tok_embd, *output, *output_norm, *output_res_score;
    struct ggml_context *ctx;             /* tensor descriptors */
    struct ggml_backend_buffer **bufs;    /* one host buffer per split, wrapping its mapping */
    int n_bufs;
} k3_weights;

int k3_weights_bind(k3_weights *w, const mf_model *m, const k3_hparams *hp, uint32_t a, uint32_t b, rl_err *err);
void k3_weights_free(k3_weights *w);

/* Reads every page of the bound tensors once, so the first forward pass does not stall on page faults
 * (and timings measure compute). With progress, draws a bar on stderr. Returns the bytes touched. */
size_t k3_weights_prefault(const k3_weights *w, bool progress);

#endif
