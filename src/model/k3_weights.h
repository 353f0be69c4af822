/* k3_weights.h - the K3 tensors of one layer range: bound to the mapped file, or copied out of it into the
 * buffer type llama.cpp would choose for them (weight_place.h: repacked CPU layouts by default).
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
#include "weight_place.h"

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

#define K3_W_DEV WP_MAX_BUFT                /* the xctx/xbuf slot of device 0's weights */
#define K3_W_SLOTS (WP_MAX_BUFT + K3_MAX_DEV) /* ... and of every device's */

typedef struct k3_weights {
    uint32_t a, b;
    k3_layer_w *layers; /* layers[il - a] */
    struct ggml_tensor *tok_embd, *output, *output_norm, *output_res_score;
    struct ggml_context *ctx;             /* descriptors of the tensors left in the mapping */
    struct ggml_backend_buffer **bufs;    /* one host buffer per split, wrapping its mapping */
    int n_bufs;
    wp_list place;                        /* the buffer types offered, in llama.cpp's order */
    /* Descriptors of the tensors copied into place.buft[i], and at K3_W_DEV + d those of the layers that
     * compute on device d (hp->dev_buft[d]: every tensor of theirs, copied into device memory). */
    struct ggml_context *xctx[K3_W_SLOTS];
    struct ggml_backend_buffer *xbuf[K3_W_SLOTS];/* their memory (NULL: none went there) */
    size_t x_bytes[K3_W_SLOTS];           /* bytes each holds */
} k3_weights;

/* experts_outside: the routed expert tensors that would be in RAM (k3_experts_on_cpu: a CPU layer's, a device
 * layer's under --n-cpu-moe) are not bound (their layer's *_exps stay NULL): an expert cache reads them from
 * the file (expert_cache.h), and none of their pages is touched here. A device layer's others go to it.
 * no_repack: every tensor stays in the mapping (llama.cpp's --no-repack, use_extra_bufts = false). By
 * default quantized matmul weights go where llama.cpp puts them (weight_place.h): copied, and re-laid, into
 * the CPU's extra buffer types, which costs their size in RAM while the file pages they came from are
 * released. */
/* Layers on a device (k3_dev_of) have every tensor copied into that device's hp->dev_buft, and the output head
 * into the last device's with hp->dev_output; token_embd stays in the mapping (its get_rows runs on the CPU, as in llama.cpp). progress:
 * a bar on stderr while they are copied. */
int k3_weights_bind(k3_weights *w, const mf_model *m, const k3_hparams *hp, uint32_t a, uint32_t b, bool no_repack,
                    bool experts_outside, bool progress, rl_err *err);

/* The op a K3 weight (by tensor name) is used in, which decides where it may live. */
wp_use k3_weight_use(const char *name);

/* Bytes of [a, b)'s weights this CPU would copy out of the mapping into repacked layouts (the default;
 * none with --no-repack). Resident RAM, not evictable file pages. */
size_t k3_range_repack_bytes(const mf_model *m, const k3_hparams *hp, uint32_t a, uint32_t b);

/* Whether [a, b)'s matmuls give every token of a prompt piece of 2 or more tokens the same bits for any split
 * of the prompt into such pieces (k3_batch.split_invariant; docs/numerics.md, "Split invariance"): true
 * when every matmul weight is of a type whose CPU kernels were measured so (f32, f16, bf16, q8_0, q4_0, q2_K,
 * q4_K, iq4_nl) and none but q4_0 is repacked (the repacked GEMM rounds a batch's last rows apart from the
 * rest). Else false, with the first offending weight named in why. Layers on a device: not measured, false. */
bool k3_range_split_invariant(const mf_model *m, const k3_hparams *hp, uint32_t a, uint32_t b, bool no_repack,
                              char *why, size_t why_len);

/* Bytes copied out of the mapping (repacked, or into a device), over every buffer type. */
size_t k3_weights_copied_bytes(const k3_weights *w);
void k3_weights_free(k3_weights *w);

/* Reads every page of the tensors left in the mapping once, so the first forward pass does not stall on
 * page faults (and timings measure compute). With progress, draws a bar on stderr. Returns the bytes the
 * range holds, mapped and copied. */
size_t k3_weights_prefault(const k3_weights *w, bool progress);

#endif
