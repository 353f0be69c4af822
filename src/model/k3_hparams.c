#include "k3_hparams.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml.h"
#include "gguf.h"

#define KEY(s) K3_ARCH "." s

int k3_hparams_read(k3_hparams *hp, const mf_model *m, rl_err *err) {
    memset(hp, 0, sizeof *hp);
    const char *arch = NULL;
    if (mf_get_str(m, "general.architecture", &arch, true, err) != 0) return -1;
    if (strcmp(arch, K3_ARCH) != 0) {
        return rl_errf(err, "unsupported architecture '%s' (ringlm runs '%s')", arch, K3_ARCH);
    }
    int rc = 0;
    /* rc accumulates: each getter returns 0 (found), 1 (absent, optional) or -1 (error, err set). */
#define REQ_U32(k, f) if (rc >= 0 && mf_get_u32(m, KEY(k), &hp->f, true, err) < 0) rc = -1
#define OPT_U32(k, f) if (rc >= 0 && mf_get_u32(m, KEY(k), &hp->f, false, err) < 0) rc = -1
#define REQ_F32(k, f) if (rc >= 0 && mf_get_f32(m, KEY(k), &hp->f, true, err) < 0) rc = -1
    REQ_U32("context_length", n_ctx_train);
    REQ_U32("embedding_length", n_embd);
    REQ_U32("block_count", n_layer);
    if (rc < 0) return -1;
    if (hp->n_layer == 0 || hp->n_layer > K3_MAX_LAYERS) {
        return rl_errf(err, "block_count %u out of range (1..%d)", hp->n_layer, K3_MAX_LAYERS);
    }
    /* Generic keys that may be per-layer arrays; K3 uses one value for all layers. */
    uint32_t arr[K3_MAX_LAYERS];
    if (mf_get_u32_or_arr(m, KEY("attention.head_count"), arr, hp->n_layer, true, err) != 0) return -1;
    hp->n_head = arr[0];
    for (uint32_t i = 1; i < hp->n_layer; i++) {
        if (arr[i] != arr[0]) return rl_errf(err, "attention.head_count differs between layers (K3 has one value)");
    }
    if (mf_get_u32_or_arr(m, KEY("attention.head_count_kv"), arr, hp->n_layer, true, err) != 0) return -1;
    for (uint32_t i = 0; i < hp->n_layer; i++) {
        if (arr[i] > 1) return rl_errf(err, "attention.head_count_kv[%u] = %u (K3 uses 0 = KDA, 1 = MLA)", i, arr[i]);
        hp->is_mla[i] = arr[i] == 1;
    }
    if (mf_get_u32_or_arr(m, KEY("feed_forward_length"), arr, hp->n_layer, true, err) != 0) return -1;
    hp->n_ff = arr[0];
    if (mf_get_u32_or_arr(m, KEY("expert_feed_forward_length"), arr, hp->n_layer, true, err) != 0) return -1;
    hp->n_ff_exp = arr[0]; /* llama.cpp uses element 0 for every MoE layer */
    if (mf_get_u32_or_arr(m, KEY("expert_used_count"), arr, hp->n_layer, true, err) != 0) return -1;
    hp->n_expert_used = arr[0];

    uint32_t key_length = 0, vocab_size = 0;
    REQ_F32("attention.layer_norm_rms_epsilon", rms_eps);
    REQ_U32("attention.key_length_mla", mla_k_dim);
    REQ_U32("attention.value_length_mla", mla_v_dim);
    OPT_U32("attention.q_lora_rank", q_lora_rank);
    REQ_U32("attention.kv_lora_rank", kv_lora_rank);
    REQ_U32("rope.dimension_count", rope_dim);
    REQ_U32("ssm.conv_kernel", conv_kernel);
    REQ_U32("kda.head_dim", kda_head_dim);
    REQ_U32("expert_count", n_expert);
    REQ_U32("expert_shared_count", n_expert_shared);
    OPT_U32("leading_dense_block_count", n_dense_lead);
    REQ_U32("expert_gating_func", gating_func);
    OPT_U32("expert_latent_length", n_expert_latent);
    REQ_U32("attn_res.block_size", attn_res_block);
    REQ_F32("activation.situ_beta", situ_beta);
    REQ_F32("activation.situ_linear_beta", situ_linear_beta);
    if (rc < 0) return -1;
    if (mf_get_u32(m, KEY("attention.key_length"), &key_length, true, err) != 0) return -1;
    if (key_length != hp->kv_lora_rank + hp->rope_dim) {
        return rl_errf(err, "attention.key_length is %u, expected kv_lora_rank + rope dims = %u", key_length,
                       hp->kv_lora_rank + hp->rope_dim);
    }
    hp->kda_gate_lb = -INFINITY;
    if (mf_get_f32(m, KEY("kda.gate_lower_bound"), &hp->kda_gate_lb, false, err) < 0) return -1;
    hp->expert_weights_scale = 0.0f;
    if (mf_get_f32(m, KEY("expert_weights_scale"), &hp->expert_weights_scale, false, err) < 0) return -1;
    hp->expert_weights_norm = false;
    if (mf_get_bool(m, KEY("expert_weights_norm"), &hp->expert_weights_norm, false, err) < 0) return -1;
    if (mf_get_u32(m, KEY("vocab_size"), &vocab_size, false, err) < 0) return -1;
    uint32_t groups = 1;
    if (mf_get_u32(m, KEY("expert_group_count"), &groups, false, err) < 0) return -1;
    if (groups > 1) return rl_errf(err, "expert_group_count %u: group-limited routing is not supported", groups);
#undef REQ_U32
#undef OPT_U32
#undef REQ_F32

    /* The vocabulary size is the token list's length (vocab_size is not read with a gpt2 tokenizer). */
    int64_t tid = gguf_find_key(m->meta, "tokenizer.ggml.tokens");
    if (tid < 0) return rl_errf(err, "missing metadata key tokenizer.ggml.tokens");
    if (gguf_get_kv_type(m->meta, tid) != GGUF_TYPE_ARRAY || gguf_get_arr_type(m->meta, tid) != GGUF_TYPE_STRING) {
        return rl_errf(err, "metadata key tokenizer.ggml.tokens is not an array of strings");
    }
    size_t nv = gguf_get_arr_n(m->meta, tid);
    if (nv == 0 || nv > (1u << 24)) return rl_errf(err, "tokenizer.ggml.tokens has %zu entries", nv);
    hp->n_vocab = (uint32_t)nv;
    return k3_hparams_validate(hp, err);
}

int k3_hparams_validate(const k3_hparams *hp, rl_err *err) {
    if (hp->n_layer == 0 || hp->n_layer > K3_MAX_LAYERS) return rl_errf(err, "n_layer %u out of range", hp->n_layer);
    if (!hp->n_embd || !hp->n_head || !hp->kda_head_dim || !hp->kv_lora_rank || !hp->mla_v_dim || !hp->n_vocab) {
        return rl_errf(err, "zero size among embedding_length, head_count, kda.head_dim, kv_lora_rank, "
                            "value_length_mla, vocabulary");
    }
    if (hp->mla_k_dim <= hp->rope_dim) {
        return rl_errf(err, "key_length_mla %u must exceed rope.dimension_count %u", hp->mla_k_dim, hp->rope_dim);
    }
    if (hp->conv_kernel < 1 || hp->conv_kernel > 16) return rl_errf(err, "ssm.conv_kernel %u out of range", hp->conv_kernel);
    if (hp->n_dense_lead > hp->n_layer) return rl_errf(err, "leading_dense_block_count %u > block_count", hp->n_dense_lead);
    if (hp->n_dense_lead > 0 && hp->n_ff == 0) return rl_errf(err, "dense layers need feed_forward_length > 0");
    if (hp->n_dense_lead < hp->n_layer) {
        if (!hp->n_expert || !hp->n_ff_exp) return rl_errf(err, "MoE layers need expert_count and expert_feed_forward_length");
        if (hp->n_expert_used == 0 || hp->n_expert_used > hp->n_expert) {
            return rl_errf(err, "expert_used_count %u must be in 1..expert_count (%u)", hp->n_expert_used, hp->n_expert);
        }
        if (hp->gating_func != 2) {
            return rl_errf(err, "expert_gating_func %u: K3 routes with sigmoid (2)", hp->gating_func);
        }
    }
    if (!(hp->rms_eps > 0.0f && hp->rms_eps < 1.0f)) return rl_errf(err, "rms epsilon %g out of range", hp->rms_eps);
    if (!(hp->situ_beta > 0.0f)) return rl_errf(err, "activation.situ_beta must be > 0");
    int n_kda = 0, n_mla = 0;
    for (uint32_t i = 0; i < hp->n_layer; i++) hp->is_mla[i] ? n_mla++ : n_kda++;
    /* Not a limitation of K3 itself, but llama.cpp (our oracle) refuses a file without both. */
    if (n_kda == 0 || n_mla == 0) {
        return rl_errf(err, "a K3 file needs at least one KDA and one MLA layer (has %d KDA, %d MLA)", n_kda, n_mla);
    }
    return 0;
}

void k3_hparams_write(const k3_hparams *hp, struct gguf_context *g) {
    gguf_set_val_str(g, "general.architecture", K3_ARCH);
    gguf_set_val_u32(g, KEY("context_length"), hp->n_ctx_train);
    gguf_set_val_u32(g, KEY("embedding_length"), hp->n_embd);
    gguf_set_val_u32(g, KEY("block_count"), hp->n_layer);
    gguf_set_val_u32(g, KEY("feed_forward_length"), hp->n_ff);
    gguf_set_val_u32(g, KEY("attention.head_count"), hp->n_head);
    uint32_t kv[K3_MAX_LAYERS];
    for (uint32_t i = 0; i < hp->n_layer; i++) kv[i] = hp->is_mla[i] ? 1 : 0;
    gguf_set_arr_data(g, KEY("attention.head_count_kv"), GGUF_TYPE_UINT32, kv, hp->n_layer);
    gguf_set_val_u32(g, KEY("attention.key_length"), hp->kv_lora_rank + hp->rope_dim);
    gguf_set_val_u32(g, KEY("attention.value_length"), hp->kv_lora_rank);
    gguf_set_val_f32(g, KEY("attention.layer_norm_rms_epsilon"), hp->rms_eps);
    gguf_set_val_u32(g, KEY("attention.key_length_mla"), hp->mla_k_dim);
    gguf_set_val_u32(g, KEY("attention.value_length_mla"), hp->mla_v_dim);
    if (hp->q_lora_rank) gguf_set_val_u32(g, KEY("attention.q_lora_rank"), hp->q_lora_rank);
    gguf_set_val_u32(g, KEY("attention.kv_lora_rank"), hp->kv_lora_rank);
    gguf_set_val_u32(g, KEY("rope.dimension_count"), hp->rope_dim);
    gguf_set_val_u32(g, KEY("ssm.conv_kernel"), hp->conv_kernel);
    gguf_set_val_u32(g, KEY("kda.head_dim"), hp->kda_head_dim);
    if (isfinite(hp->kda_gate_lb)) gguf_set_val_f32(g, KEY("kda.gate_lower_bound"), hp->kda_gate_lb);
    gguf_set_val_u32(g, KEY("expert_count"), hp->n_expert);
    gguf_set_val_u32(g, KEY("expert_used_count"), hp->n_expert_used);
    gguf_set_val_u32(g, KEY("expert_feed_forward_length"), hp->n_ff_exp);
    gguf_set_val_u32(g, KEY("expert_shared_count"), hp->n_expert_shared);
    gguf_set_val_u32(g, KEY("leading_dense_block_count"), hp->n_dense_lead);
    gguf_set_val_f32(g, KEY("expert_weights_scale"), hp->expert_weights_scale);
    gguf_set_val_bool(g, KEY("expert_weights_norm"), hp->expert_weights_norm);
    gguf_set_val_u32(g, KEY("expert_gating_func"), hp->gating_func);
    if (hp->n_expert_latent) gguf_set_val_u32(g, KEY("expert_latent_length"), hp->n_expert_latent);
    gguf_set_val_u32(g, KEY("attn_res.block_size"), hp->attn_res_block);
    gguf_set_val_f32(g, KEY("activation.situ_beta"), hp->situ_beta);
    gguf_set_val_f32(g, KEY("activation.situ_linear_beta"), hp->situ_linear_beta);
    gguf_set_val_u32(g, KEY("vocab_size"), hp->n_vocab);
}

/* ---- manifest ---------------------------------------------------------------------------------- */

typedef struct k3_list {
    k3_tensor_spec *v;
    int n, cap;
    int oom;
} k3_list;

static void k3_add(k3_list *l, int layer, enum k3_tensor_kind kind, int n_dims, int64_t ne0, int64_t ne1,
                   int64_t ne2, const char *fmt, ...) __attribute__((format(printf, 8, 9)));

#include <stdarg.h>
static void k3_add(k3_list *l, int layer, enum k3_tensor_kind kind, int n_dims, int64_t ne0, int64_t ne1,
                   int64_t ne2, const char *fmt, ...) {
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 64;
        k3_tensor_spec *v = realloc(l->v, (size_t)cap * sizeof *v);
        if (!v) {
            l->oom = 1;
            return;
        }
        l->v = v;
        l->cap = cap;
    }
    k3_tensor_spec *t = &l->v[l->n++];
    memset(t, 0, sizeof *t);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
    t->layer = layer;
    t->kind = kind;
    t->n_dims = n_dims;
    t->ne[0] = ne0;
    t->ne[1] = ne1;
    t->ne[2] = ne2;
    t->ne[3] = 1;
}

int k3_manifest(const k3_hparams *hp, k3_tensor_spec **out, int *n_out, rl_err *err) {
    k3_list l = {0};
    const int64_t d = hp->n_embd, V = hp->n_vocab, H = hp->n_head, Dk = hp->kda_head_dim, Di = H * Dk;
    const int64_t dlat = k3_latent(hp), Fe = hp->n_ff_exp, E = hp->n_expert, Fs = k3_ff_shexp(hp);
    const int64_t rkv = hp->kv_lora_rank, dr = hp->rope_dim, dq = hp->mla_k_dim, dn = dq - dr, dv = hp->mla_v_dim;
    const bool res = hp->attn_res_block > 0;

    k3_add(&l, -1, K3_KIND_EMBD, 2, d, V, 1, "token_embd.weight");
    for (int il = 0; il < (int)hp->n_layer; il++) {
        k3_add(&l, il, K3_KIND_F32, 1, d, 1, 1, "blk.%d.attn_norm.weight", il);
        k3_add(&l, il, K3_KIND_F32, 1, d, 1, 1, "blk.%d.ffn_norm.weight", il);
        if (res) {
            k3_add(&l, il, K3_KIND_F32, 1, d, 1, 1, "blk.%d.attn_res_score.weight", il);
            k3_add(&l, il, K3_KIND_F32, 1, d, 1, 1, "blk.%d.ffn_res_score.weight", il);
        }
        if (!hp->is_mla[il]) {
            k3_add(&l, il, K3_KIND_ATTN, 2, d, Di, 1, "blk.%d.attn_q.weight", il);
            k3_add(&l, il, K3_KIND_ATTN, 2, d, Di, 1, "blk.%d.attn_k.weight", il);
            k3_add(&l, il, K3_KIND_ATTN, 2, d, Di, 1, "blk.%d.attn_v.weight", il);
            static const char *conv[3] = {"q", "k", "v"};
            for (int c = 0; c < 3; c++) {
                k3_add(&l, il, K3_KIND_F32, 3, hp->conv_kernel, 1, Di, "blk.%d.ssm_conv1d_%s.weight", il, conv[c]);
                l.v[l.n - 1].alt_3d = true;
            }
            k3_add(&l, il, K3_KIND_ATTN, 2, d, Dk, 1, "blk.%d.ssm_f_a.weight", il);
            k3_add(&l, il, K3_KIND_ATTN, 2, Dk, Di, 1, "blk.%d.ssm_f_b.weight", il);
            k3_add(&l, il, K3_KIND_F32, 1, Di, 1, 1, "blk.%d.ssm_dt.bias", il);
            k3_add(&l, il, K3_KIND_F32, 1, H, 1, 1, "blk.%d.ssm_a", il);
            k3_add(&l, il, K3_KIND_ATTN, 2, d, H, 1, "blk.%d.ssm_beta.weight", il);
            k3_add(&l, il, K3_KIND_ATTN, 2, d, Di, 1, "blk.%d.ssm_g.weight", il);
            k3_add(&l, il, K3_KIND_F32, 1, Dk, 1, 1, "blk.%d.ssm_norm.weight", il);
            k3_add(&l, il, K3_KIND_ATTN, 2, Di, d, 1, "blk.%d.attn_output.weight", il);
        } else {
            if (hp->q_lora_rank) {
                k3_add(&l, il, K3_KIND_ATTN, 2, d, hp->q_lora_rank, 1, "blk.%d.attn_q_a.weight", il);
                k3_add(&l, il, K3_KIND_F32, 1, hp->q_lora_rank, 1, 1, "blk.%d.attn_q_a_norm.weight", il);
                k3_add(&l, il, K3_KIND_ATTN, 2, hp->q_lora_rank, H * dq, 1, "blk.%d.attn_q_b.weight", il);
            } else {
                k3_add(&l, il, K3_KIND_ATTN, 2, d, H * dq, 1, "blk.%d.attn_q.weight", il);
            }
            k3_add(&l, il, K3_KIND_ATTN, 2, d, rkv + dr, 1, "blk.%d.attn_kv_a_mqa.weight", il);
            k3_add(&l, il, K3_KIND_F32, 1, rkv, 1, 1, "blk.%d.attn_kv_a_norm.weight", il);
            k3_add(&l, il, K3_KIND_ATTN_KB, 3, dn, rkv, H, "blk.%d.attn_k_b.weight", il);
            k3_add(&l, il, K3_KIND_ATTN, 3, rkv, dv, H, "blk.%d.attn_v_b.weight", il);
            if (hp->has_mla_gate) k3_add(&l, il, K3_KIND_ATTN, 2, d, H * dv, 1, "blk.%d.attn_gate.weight", il);
            k3_add(&l, il, K3_KIND_ATTN, 2, H * dv, d, 1, "blk.%d.attn_output.weight", il);
        }
        if (!k3_is_moe(hp, (uint32_t)il)) {
            k3_add(&l, il, K3_KIND_FFN, 2, d, hp->n_ff, 1, "blk.%d.ffn_gate.weight", il);
            k3_add(&l, il, K3_KIND_FFN, 2, d, hp->n_ff, 1, "blk.%d.ffn_up.weight", il);
            k3_add(&l, il, K3_KIND_FFN, 2, hp->n_ff, d, 1, "blk.%d.ffn_down.weight", il);
        } else {
            k3_add(&l, il, K3_KIND_F32, 2, d, E, 1, "blk.%d.ffn_gate_inp.weight", il);
            k3_add(&l, il, K3_KIND_F32, 1, E, 1, 1, "blk.%d.exp_probs_b.bias", il);
            if (hp->n_expert_latent) {
                k3_add(&l, il, K3_KIND_FFN, 2, d, dlat, 1, "blk.%d.ffn_routed_down.weight", il);
                k3_add(&l, il, K3_KIND_FFN, 2, dlat, d, 1, "blk.%d.ffn_routed_up.weight", il);
                if (hp->has_routed_norm) k3_add(&l, il, K3_KIND_F32, 1, dlat, 1, 1, "blk.%d.ffn_routed_norm.weight", il);
            }
            k3_add(&l, il, K3_KIND_EXPS, 3, dlat, Fe, E, "blk.%d.ffn_gate_exps.weight", il);
            k3_add(&l, il, K3_KIND_EXPS, 3, dlat, Fe, E, "blk.%d.ffn_up_exps.weight", il);
            k3_add(&l, il, K3_KIND_EXPS, 3, Fe, dlat, E, "blk.%d.ffn_down_exps.weight", il);
            if (hp->has_shexp) {
                k3_add(&l, il, K3_KIND_FFN, 2, d, Fs, 1, "blk.%d.ffn_gate_shexp.weight", il);
                k3_add(&l, il, K3_KIND_FFN, 2, d, Fs, 1, "blk.%d.ffn_up_shexp.weight", il);
                k3_add(&l, il, K3_KIND_FFN, 2, Fs, d, 1, "blk.%d.ffn_down_shexp.weight", il);
            }
        }
    }
    if (res) k3_add(&l, -1, K3_KIND_F32, 1, d, 1, 1, "output_res_score.weight");
    k3_add(&l, -1, K3_KIND_F32, 1, d, 1, 1, "output_norm.weight");
    k3_add(&l, -1, K3_KIND_OUTPUT, 2, d, V, 1, "output.weight");
    if (l.oom) {
        free(l.v);
        return rl_errf(err, "out of memory building the tensor list");
    }
    *out = l.v;
    *n_out = l.n;
    return 0;
}

static bool k3_shape_eq(const k3_tensor_spec *s, const mf_tensor *t) {
    for (int i = 0; i < 4; i++) {
        if (s->ne[i] != t->ne[i]) {
            /* {Kc,1,Di} and {Kc,1,Di,1} have the same ne; nothing else may differ. */
            return false;
        }
    }
    return true;
}

static void k3_shape_str(char *buf, size_t n, const int64_t *ne) {
    snprintf(buf, n, "{%lld, %lld, %lld, %lld}", (long long)ne[0], (long long)ne[1], (long long)ne[2],
             (long long)ne[3]);
}

/* Is manifest entry t needed by a stage running [a, b)? */
static bool k3_in_range(const k3_hparams *hp, const k3_tensor_spec *t, uint32_t a, uint32_t b) {
    if (t->layer >= 0) return (uint32_t)t->layer >= a && (uint32_t)t->layer < b;
    if (strcmp(t->name, "token_embd.weight") == 0) return a == 0;
    return b == hp->n_layer; /* output, output_norm, output_res_score */
}

int k3_check_tensors_range(k3_hparams *hp, const mf_model *m, uint32_t a, uint32_t b, bool allow_extra, rl_err *err) {
    if (a >= b || b > hp->n_layer) return rl_errf(err, "bad layer range [%u, %u) for %u layers", a, b, hp->n_layer);
    /* Optional tensors are layer-wide switches. Detect them from the first layer present in the file that
     * could hold them, scanning from the range's start and wrapping around: a range file holds only its
     * own layers, and a whole file opened for a range without MLA layers still has attn_gate elsewhere. */
    hp->has_mla_gate = hp->has_shexp = hp->has_routed_norm = false;
    bool found_mla = false, found_moe = false;
    char name[80];
    for (uint32_t k = 0; k < hp->n_layer && (!found_mla || !found_moe); k++) {
        uint32_t il = (a + k) % hp->n_layer;
        snprintf(name, sizeof name, "blk.%u.attn_norm.weight", il);
        if (!found_mla && hp->is_mla[il] && mf_find(m, name)) {
            snprintf(name, sizeof name, "blk.%u.attn_gate.weight", il);
            hp->has_mla_gate = mf_find(m, name) != NULL;
            found_mla = true;
        }
        snprintf(name, sizeof name, "blk.%u.ffn_gate_inp.weight", il);
        if (!found_moe && k3_is_moe(hp, il) && mf_find(m, name)) {
            snprintf(name, sizeof name, "blk.%u.ffn_gate_shexp.weight", il);
            hp->has_shexp = mf_find(m, name) != NULL;
            snprintf(name, sizeof name, "blk.%u.ffn_routed_norm.weight", il);
            hp->has_routed_norm = hp->n_expert_latent && mf_find(m, name) != NULL;
            found_moe = true;
        }
    }
    k3_tensor_spec *spec;
    int n;
    if (k3_manifest(hp, &spec, &n, err) != 0) return -1;
    int rc = 0;
    char want[96], got[96];
    for (int i = 0; i < n && rc == 0; i++) {
        if (!k3_in_range(hp, &spec[i], a, b)) continue;
        const mf_tensor *t = mf_find(m, spec[i].name);
        if (!t) {
            rc = rl_errf(err, "missing tensor '%s'", spec[i].name);
        } else if (!k3_shape_eq(&spec[i], t)) {
            k3_shape_str(want, sizeof want, spec[i].ne);
            k3_shape_str(got, sizeof got, t->ne);
            rc = rl_errf(err, "tensor '%s' has shape %s, expected %s", t->name, got, want);
        } else if (t->type < 0 || t->type >= GGML_TYPE_COUNT || ggml_type_size((enum ggml_type)t->type) == 0) {
            rc = rl_errf(err, "tensor '%s' has unknown type %d", t->name, t->type);
        } else if (spec[i].kind == K3_KIND_F32 && t->type != GGML_TYPE_F32 &&
                   (strstr(t->name, "conv1d") || strstr(t->name, "ssm_a") || strstr(t->name, "ssm_dt") ||
                    strstr(t->name, "exp_probs_b"))) {
            /* ggml_ssm_conv asserts f32 taps; the others are added to f32 activations element-wise. */
            rc = rl_errf(err, "tensor '%s' is %s, must be f32", t->name, ggml_type_name((enum ggml_type)t->type));
        }
    }
    /* Every tensor in the file must be one we know: a stray tensor means a different model layout. */
    for (int j = 0; j < m->n_tensor && rc == 0; j++) {
        bool known = false;
        for (int i = 0; i < n && !known; i++) {
            known = strcmp(spec[i].name, m->tensors[j].name) == 0 && (allow_extra || k3_in_range(hp, &spec[i], a, b));
        }
        if (!known) rc = rl_errf(err, "unexpected tensor '%s' for this K3 configuration", m->tensors[j].name);
    }
    free(spec);
    return rc;
}

int k3_check_tensors(k3_hparams *hp, const mf_model *m, rl_err *err) {
    return k3_check_tensors_range(hp, m, 0, hp->n_layer, false, err);
}

int k3_open_range(mf_model *m, k3_hparams *hp, const char *path, uint32_t a, uint32_t b, rl_err *err) {
    if (mf_open(m, path, err) != 0) return -1;
    if (k3_hparams_read(hp, m, err) != 0 || k3_check_tensors_range(hp, m, a, b, true, err) != 0) {
        rl_err_prefix(err, "%s", path);
        mf_close(m);
        return -1;
    }
    return 0;
}

int k3_open(mf_model *m, k3_hparams *hp, const char *path, rl_err *err) {
    if (mf_open(m, path, err) != 0) return -1;
    if (k3_hparams_read(hp, m, err) != 0 || k3_check_tensors(hp, m, err) != 0) {
        rl_err_prefix(err, "%s", path);
        mf_close(m);
        return -1;
    }
    return 0;
}
