/* k3_hparams.h - Kimi K3 hyperparameters and the tensor list they imply (docs/k3-spec.md §1-§3).
 *
 * One source of truth for both directions: `ringlm synth` writes a file from a k3_hparams, and every
 * loader reads one back and checks the file's tensors against k3_manifest() - names, shapes, and the
 * types llama.cpp's kernels require - before any graph is built. */
#ifndef RINGLM_K3_HPARAMS_H
#define RINGLM_K3_HPARAMS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/err.h"
#include "../gguf/model_file.h"

#define K3_ARCH "kimi-k3"
#define DSPARK_ARCH "dflash" /* llama.cpp's name for DFlash and DSpark drafts alike (speculate/dspark.h) */
#define K3_MAX_LAYERS 256

struct gguf_context;

#define K3_MAX_DEV 8 /* devices one engine computes on */

typedef struct k3_hparams {
    uint32_t n_layer;
    uint32_t n_embd;      /* d */
    uint32_t n_vocab;     /* length of tokenizer.ggml.tokens */
    uint32_t n_ctx_train;
    uint32_t n_head;      /* H, shared by KDA and MLA */
    float rms_eps;

    /* KDA */
    uint32_t kda_head_dim; /* Dk; Di = H*Dk */
    uint32_t conv_kernel;  /* Kc */
    float kda_gate_lb;     /* -INFINITY when the key is absent (softplus gate) */

    /* MLA */
    uint32_t q_lora_rank;  /* 0: full attn_q instead of q_a/q_b */
    uint32_t kv_lora_rank; /* rkv */
    uint32_t mla_k_dim;    /* dq = dn + dr */
    uint32_t mla_v_dim;    /* dv */
    uint32_t rope_dim;     /* dr (never rotated in K3) */

    /* FFN */
    uint32_t n_ff;           /* dense width F */
    uint32_t n_ff_exp;       /* Fe */
    uint32_t n_expert;       /* E */
    uint32_t n_expert_used;  /* k */
    uint32_t n_expert_shared;
    uint32_t n_dense_lead;
    uint32_t n_expert_latent; /* dl; 0 = experts at full width */
    uint32_t gating_func;     /* 2 = sigmoid */
    bool expert_weights_norm;
    float expert_weights_scale;
    float situ_beta, situ_linear_beta;

    uint32_t attn_res_block; /* B; 0 = no residual attention */

    bool is_mla[K3_MAX_LAYERS]; /* from attention.head_count_kv: 1 = MLA, 0 = KDA */

    /* Optional tensors, detected from the file by k3_check_tensors (synth sets them). */
    bool has_mla_gate;    /* blk.N.attn_gate */
    bool has_shexp;       /* blk.N.ffn_{gate,up,down}_shexp */
    bool has_routed_norm; /* blk.N.ffn_routed_norm */

    /* Runtime, not from the file: the element type of the MLA latent cache (an enum ggml_type; 0 is
     * GGML_TYPE_F32). k3_engine_init sets it in the engine's copy, so states made from &engine->hp get the
     * engine's cache; k3_forward refuses a state whose cache is of another type. */
    int kv_type;
    /* Runtime too: the layers [dev_a, dev_b) compute on devices other than the CPU (k3_engine_opts.device),
     * split between n_dev of them in order, device d holding [d ? dev_end[d - 1] : dev_a, dev_end[d]) with
     * its weights and per-sequence state in dev_buft[d]; the output head on the last with dev_output. Set by
     * k3_engine_init in its copy, like kv_type, so states made from &engine->hp are placed alike. n_dev 0:
     * everything on the CPU. */
    int n_dev;
    struct ggml_backend_buffer_type *dev_buft[K3_MAX_DEV];
    uint32_t dev_end[K3_MAX_DEV];
    uint32_t dev_a, dev_b;
    bool dev_output;
    uint32_t dev_cpu_moe; /* the routed experts of layers below this stay on the CPU (--n-cpu-moe) */
} k3_hparams;

/* Whether layer il computes on one of the engine's devices. */
static inline bool k3_on_dev(const struct k3_hparams *hp, uint32_t il) {
    return hp->n_dev > 0 && il >= hp->dev_a && il < hp->dev_b;
}

/* The device (index into dev_buft) layer il computes on, or -1: the CPU. */
static inline int k3_dev_of(const struct k3_hparams *hp, uint32_t il) {
    if (!k3_on_dev(hp, il)) return -1;
    int d = 0;
    while (d + 1 < hp->n_dev && il >= hp->dev_end[d]) d++;
    return d;
}

/* Whether layer il's routed experts live in RAM and run on the CPU: a CPU layer's, and a device layer's
 * under --n-cpu-moe. Under --mem these are the experts the expert cache holds (VRAM -> RAM -> disk). */
static inline bool k3_experts_on_cpu(const struct k3_hparams *hp, uint32_t il) {
    return !k3_on_dev(hp, il) || il < hp->dev_cpu_moe;
}

/* Derived sizes. */
static inline uint32_t k3_d_inner(const k3_hparams *hp) { return hp->n_head * hp->kda_head_dim; }
static inline uint32_t k3_latent(const k3_hparams *hp) { return hp->n_expert_latent ? hp->n_expert_latent : hp->n_embd; }
static inline uint32_t k3_ff_shexp(const k3_hparams *hp) {
    return hp->n_ff_exp * (hp->n_expert_shared ? hp->n_expert_shared : 1);
}
static inline bool k3_is_moe(const k3_hparams *hp, uint32_t il) { return il >= hp->n_dense_lead; }
/* Number of banked residual checkpoints entering layer il (layers 0, B, 2B, ... below il bank). */
static inline uint32_t k3_n_banked_before(const k3_hparams *hp, uint32_t il) {
    return hp->attn_res_block ? (il + hp->attn_res_block - 1) / hp->attn_res_block : 0;
}

/* Reads and validates every key of docs/k3-spec.md §2 (strict types). Also requires general.architecture == kimi-k3. */
int k3_hparams_read(k3_hparams *hp, const mf_model *m, rl_err *err);

/* Writes the keys k3_hparams_read reads (plus generic ones llama.cpp needs). */
void k3_hparams_write(const k3_hparams *hp, struct gguf_context *g);

/* Sanity of the numbers themselves (nonzero sizes, k <= E, at least one KDA and one MLA layer, ...). */
int k3_hparams_validate(const k3_hparams *hp, rl_err *err);

/* What a tensor is, for choosing its stored type. */
enum k3_tensor_kind {
    K3_KIND_F32,    /* norms, biases, router, conv taps, ssm_a, res scores: always F32 */
    K3_KIND_EMBD,   /* token_embd */
    K3_KIND_OUTPUT, /* output (LM head) */
    K3_KIND_ATTN,   /* mixer projections */
    K3_KIND_ATTN_KB,/* attn_k_b: F32 by default (llama.cpp's CPU backend aborts on some f16 files) */
    K3_KIND_FFN,    /* dense and shared-expert FFN, latent projections */
    K3_KIND_EXPS,   /* routed experts */
};

typedef struct k3_tensor_spec {
    char name[64];
    int n_dims;
    int64_t ne[4];
    int layer; /* -1 for globals */
    enum k3_tensor_kind kind;
    bool alt_3d; /* conv1d: {Kc,1,Di,1} may also be stored as {Kc,1,Di} (same elements) */
} k3_tensor_spec;

/* The tensors a file with these hparams holds, in the order synth writes them. *out is malloc'ed. */
int k3_manifest(const k3_hparams *hp, k3_tensor_spec **out, int *n_out, rl_err *err);

/* Detects the optional tensors, then checks that every manifest tensor exists with the right shape and
 * an allowed type, and that the file has no unexpected tensors. */
int k3_check_tensors(k3_hparams *hp, const mf_model *m, rl_err *err);

/* The same for the tensors a stage running layers [a, b) needs: blk.a .. blk.(b-1), token_embd when
 * a == 0, the output tensors when b == n_layer. A file may hold more (a whole model) or exactly these (a
 * range file a node was streamed). Optional tensors are detected from layers inside the range. */
int k3_check_tensors_range(k3_hparams *hp, const mf_model *m, uint32_t a, uint32_t b, bool allow_extra, rl_err *err);

/* Opens a K3 file and runs all of the above: the one call every command uses. */
int k3_open(mf_model *m, k3_hparams *hp, const char *path, rl_err *err);
/* Opens a file that must hold at least layers [a, b) (a whole model or a range file). */
int k3_open_range(mf_model *m, k3_hparams *hp, const char *path, uint32_t a, uint32_t b, rl_err *err);

#endif
