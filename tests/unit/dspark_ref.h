/* dspark_ref.h - a plain-C reference of one DSpark draft block (spec §10.1.3, docs/dspark.md), the oracle
 * that tests/unit/test_dspark.c holds src/spec/dspark.c against.
 *
 * Written from the written spec only, one function per step, loops over dequantized f32 weights with double
 * accumulators; no ggml graph (ggml is used only to dequantize rows: the type traits' to_float). Slow on
 * purpose: it recomputes the context every call, which is fine for the synthesized tiny draft.
 *
 *   g_i      = RMSNorm(fc . f_i (x fc.scale); enc.output_norm)                      context rows, pos i
 *   K_i, V_i = RoPE_neox(RMSNorm_head(Wk g_i) * attn_k_norm, i), Wv g_i              per draft layer
 *   x        = E_tgt[anchor, MASK, ..., MASK]                                       block, pos n_ctx + j
 *   per layer: x += Wo . attn(q, [K_ctx ; K_blk], [V_ctx ; V_blk])   (pre-norm, per-head q/k norm, RoPE)
 *              x += down(silu(gate . xn) * up . xn)
 *   hid      = RMSNorm(x; output_norm), base = LM_tgt . hid
 *   Markov   : logits_i = base_i + markov_w2 . markov_w1[prev] (x scale), prev = argmax, from the anchor
 *   conf_i   = sigmoid(conf_proj . [hid_i ; markov_w1[prev_i]] + conf_proj.bias)
 *
 * Decisions where the spec leaves room:
 *   - slots before the first drafting slot (slot 0 when dflash.sample_from_anchor is false) keep the base
 *     logits, take the argmax as their token, and get conf = 1 (llama.cpp pads that unread column with
 *     sigmoid(logit 0); the test does not compare it). The first drafting slot is conditioned on the
 *     anchor either way (spec §10.1.3 step 5: prev starts as the anchor; slot 0's argmax does not feed it);
 *   - dflash.block_size absent = 16 (the driver's assumption, §10.1.1); n_block above it is an error;
 *   - a draft that carries its own token_embd / output / d2t / attn_sinks is refused (the contract binds the
 *     target's embedding and LM head and has no sinks);
 *   - dflash.rope.dimension_count, when present, may be smaller than head_dim (NeoX over the first n_rot
 *     dims, the rest untouched); absent = head_dim. */
#ifndef RINGLM_DSPARK_REF_H
#define RINGLM_DSPARK_REF_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "ggml.h"
#include "gguf.h"
#include "gguf/model_file.h"

#define DSR_MAX_TAPS 16
#define DSR_MAX_LAYERS 64

typedef struct dsr_hparams {
    uint32_t d, n_layer, n_head, n_head_kv, hd, n_rot, n_ff, V, R, block_size, n_taps;
    int32_t taps[DSR_MAX_TAPS];
    float eps, rope_base;
    int32_t mask_id;
    bool from_anchor, causal, has_markov, has_conf;
} dsr_hparams;

typedef struct dsr_layer {
    float *attn_norm, *wq, *wk, *wv, *wo, *q_norm, *k_norm, *ffn_norm, *gate, *up, *down;
} dsr_layer;

typedef struct dsr_weights {
    float *fc, fc_scale, *enc_norm, *out_norm;
    dsr_layer l[DSR_MAX_LAYERS];
    float *tok_embd, *lm_head;                 /* the target's: {d, V} each */
    float *w1, *w2, w2_scale, *conf_w, conf_b; /* Markov and confidence heads (NULL when absent) */
} dsr_weights;

/* ---- tensors ------------------------------------------------------------------------------------- */

/* Dequantizes tensor `name` of `m` to a malloc'd f32 array of ne0 * ne1 floats (row r = ne0 floats), after
 * checking its shape is exactly {ne0, ne1} (ne1 = 1: a vector {ne0} or a one-row {ne0, 1}). NULL and err set
 * when absent (unless optional, then NULL with err untouched) or misshapen. */
static inline float *dsr_tensor(const mf_model *m, const char *name, int64_t ne0, int64_t ne1, bool optional,
                                rl_err *err) {
    const mf_tensor *t = mf_find(m, name);
    if (!t) {
        if (!optional) rl_errf(err, "dspark_ref: tensor '%s' missing", name);
        return NULL;
    }
    if (t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] != 1 || t->ne[3] != 1) {
        rl_errf(err, "dspark_ref: tensor '%s' has ne {%lld, %lld, %lld, %lld}, expected {%lld, %lld}", name,
                (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3], (long long)ne0,
                (long long)ne1);
        return NULL;
    }
    const enum ggml_type type = (enum ggml_type)t->type;
    const size_t row_bytes = ggml_row_size(type, ne0);
    if (row_bytes * (size_t)ne1 > t->nbytes) {
        rl_errf(err, "dspark_ref: tensor '%s' is shorter than its shape", name);
        return NULL;
    }
    const struct ggml_type_traits *tr = ggml_get_type_traits(type);
    if (type != GGML_TYPE_F32 && (!tr || !tr->to_float)) {
        rl_errf(err, "dspark_ref: tensor '%s' has type %s, which has no to_float", name, ggml_type_name(type));
        return NULL;
    }
    float *out = malloc((size_t)(ne0 * ne1) * sizeof(float));
    if (!out) {
        rl_errf(err, "dspark_ref: out of memory for '%s'", name);
        return NULL;
    }
    for (int64_t r = 0; r < ne1; r++) {
        const char *row = (const char *)t->data + (size_t)r * row_bytes;
        if (type == GGML_TYPE_F32) {
            memcpy(out + r * ne0, row, (size_t)ne0 * sizeof(float));
        } else {
            tr->to_float(row, out + r * ne0, ne0);
        }
    }
    return out;
}

/* A scalar tensor {1} (fc.scale, markov_w2.scale, conf_proj.bias): its value, or `dflt` when absent. */
static inline int dsr_scalar(const mf_model *m, const char *name, float dflt, float *out, rl_err *err) {
    *out = dflt;
    if (!mf_find(m, name)) return 0;
    float *v = dsr_tensor(m, name, 1, 1, false, err);
    if (!v) return -1;
    *out = v[0];
    free(v);
    return 0;
}

/* ---- hyperparameters ----------------------------------------------------------------------------- */

static inline int dsr_read_taps(const mf_model *draft, dsr_hparams *hp, rl_err *err) {
    const int64_t id = gguf_find_key(draft->meta, "dflash.target_layers");
    if (id < 0) return rl_errf(err, "dspark_ref: dflash.target_layers missing");
    if (gguf_get_kv_type(draft->meta, id) != GGUF_TYPE_ARRAY) {
        return rl_errf(err, "dspark_ref: dflash.target_layers is not an array");
    }
    const enum gguf_type at = gguf_get_arr_type(draft->meta, id);
    const size_t n = gguf_get_arr_n(draft->meta, id);
    if (at != GGUF_TYPE_INT32 && at != GGUF_TYPE_UINT32) {
        return rl_errf(err, "dspark_ref: dflash.target_layers is not i32/u32");
    }
    if (n < 1 || n > DSR_MAX_TAPS) return rl_errf(err, "dspark_ref: %zu target layers", n);
    const int32_t *v = gguf_get_arr_data(draft->meta, id); /* i32 and u32 share the width */
    hp->n_taps = (uint32_t)n;
    for (size_t k = 0; k < n; k++) hp->taps[k] = v[k];
    return 0;
}

static inline int dsr_read_hparams(const mf_model *draft, const mf_model *target, dsr_hparams *hp, rl_err *err) {
    memset(hp, 0, sizeof *hp);
    const char *arch = NULL;
    if (mf_get_str(draft, "general.architecture", &arch, true, err) != 0) return -1;
    if (strcmp(arch, "dflash") != 0) return rl_errf(err, "dspark_ref: architecture '%s', not dflash", arch);
    uint32_t vlen = 0, mask = 0;
    if (mf_get_u32(draft, "dflash.embedding_length", &hp->d, true, err) != 0 ||
        mf_get_u32(draft, "dflash.block_count", &hp->n_layer, true, err) != 0 ||
        mf_get_u32(draft, "dflash.attention.head_count", &hp->n_head, true, err) != 0 ||
        mf_get_u32(draft, "dflash.attention.head_count_kv", &hp->n_head_kv, true, err) != 0 ||
        mf_get_u32(draft, "dflash.attention.key_length", &hp->hd, true, err) != 0 ||
        mf_get_u32(draft, "dflash.attention.value_length", &vlen, true, err) != 0 ||
        mf_get_u32(draft, "dflash.feed_forward_length", &hp->n_ff, true, err) != 0 ||
        mf_get_f32(draft, "dflash.attention.layer_norm_rms_epsilon", &hp->eps, true, err) != 0 ||
        mf_get_f32(draft, "dflash.rope.freq_base", &hp->rope_base, true, err) != 0 ||
        mf_get_u32(draft, "tokenizer.ggml.mask_token_id", &mask, true, err) != 0) {
        return -1;
    }
    hp->n_rot = hp->hd;
    hp->block_size = 16; /* the driver's assumption when the key is absent (spec §10.1.1) */
    hp->from_anchor = true;
    hp->causal = false;
    if (mf_get_u32(draft, "dflash.rope.dimension_count", &hp->n_rot, false, err) < 0 ||
        mf_get_u32(draft, "dflash.block_size", &hp->block_size, false, err) < 0 ||
        mf_get_bool(draft, "dflash.sample_from_anchor", &hp->from_anchor, false, err) < 0 ||
        mf_get_bool(draft, "dflash.attention.causal", &hp->causal, false, err) < 0) {
        return -1;
    }
    if (dsr_read_taps(draft, hp, err) != 0) return -1;
    if (vlen != hp->hd) return rl_errf(err, "dspark_ref: value_length %u != key_length %u", vlen, hp->hd);
    if (hp->n_layer < 1 || hp->n_layer > DSR_MAX_LAYERS) return rl_errf(err, "dspark_ref: %u layers", hp->n_layer);
    if (hp->n_head == 0 || hp->n_head_kv == 0 || hp->n_head % hp->n_head_kv != 0) {
        return rl_errf(err, "dspark_ref: %u heads over %u kv heads", hp->n_head, hp->n_head_kv);
    }
    if (hp->n_rot == 0 || hp->n_rot > hp->hd || hp->n_rot % 2 != 0) {
        return rl_errf(err, "dspark_ref: rope dimension %u for head size %u", hp->n_rot, hp->hd);
    }
    /* The vocabulary is the target's: its embedding gives d and V. */
    const mf_tensor *te = mf_find(target, "token_embd.weight");
    if (!te) return rl_errf(err, "dspark_ref: target has no token_embd.weight");
    if (te->ne[0] != (int64_t)hp->d) {
        return rl_errf(err, "dspark_ref: target n_embd %lld != draft %u", (long long)te->ne[0], hp->d);
    }
    hp->V = (uint32_t)te->ne[1];
    if (mask >= hp->V) return rl_errf(err, "dspark_ref: mask token %u outside the vocabulary %u", mask, hp->V);
    hp->mask_id = (int32_t)mask;
    for (const char *const *n = (const char *const[]){"token_embd.weight", "output.weight", "d2t", NULL}; *n; n++) {
        if (mf_find(draft, *n)) return rl_errf(err, "dspark_ref: draft carries '%s' (not modelled)", *n);
    }
    const mf_tensor *w1 = mf_find(draft, "markov_w1.weight");
    hp->has_markov = w1 != NULL;
    hp->R = w1 ? (uint32_t)w1->ne[0] : 0;
    hp->has_conf = hp->has_markov && mf_find(draft, "conf_proj.weight") != NULL;
    return 0;
}

/* ---- weights ------------------------------------------------------------------------------------- */

static inline void dsr_free_weights(dsr_weights *w) {
    free(w->fc), free(w->enc_norm), free(w->out_norm), free(w->tok_embd), free(w->lm_head);
    free(w->w1), free(w->w2), free(w->conf_w);
    for (int il = 0; il < DSR_MAX_LAYERS; il++) {
        dsr_layer *l = &w->l[il];
        free(l->attn_norm), free(l->wq), free(l->wk), free(l->wv), free(l->wo), free(l->q_norm), free(l->k_norm);
        free(l->ffn_norm), free(l->gate), free(l->up), free(l->down);
    }
    memset(w, 0, sizeof *w);
}

static inline int dsr_load_weights(const mf_model *draft, const mf_model *target, const dsr_hparams *hp, dsr_weights *w,
                            rl_err *err) {
    memset(w, 0, sizeof *w);
    const int64_t d = hp->d, V = hp->V, q = (int64_t)hp->n_head * hp->hd, kv = (int64_t)hp->n_head_kv * hp->hd;
    const int64_t F = hp->n_ff, R = hp->R, n_enc = (int64_t)hp->n_taps * d;
    char name[96];
#define DSR_LOAD(dst, m, ne0, ne1, ...)                                                                                \
    do {                                                                                                           \
        snprintf(name, sizeof name, __VA_ARGS__);                                                                  \
        if (!((dst) = dsr_tensor((m), name, (ne0), (ne1), false, err))) goto fail;                                 \
    } while (0)
    DSR_LOAD(w->fc, draft, n_enc, d, "fc.weight");
    DSR_LOAD(w->enc_norm, draft, d, 1, "enc.output_norm.weight");
    DSR_LOAD(w->out_norm, draft, d, 1, "output_norm.weight");
    if (dsr_scalar(draft, "fc.scale", 1.0f, &w->fc_scale, err) != 0) goto fail;
    for (uint32_t il = 0; il < hp->n_layer; il++) {
        dsr_layer *l = &w->l[il];
        snprintf(name, sizeof name, "blk.%u.attn_sinks.weight", il);
        if (mf_find(draft, name)) {
            rl_errf(err, "dspark_ref: '%s' (attention sinks) not modelled", name);
            goto fail;
        }
        DSR_LOAD(l->attn_norm, draft, d, 1, "blk.%u.attn_norm.weight", il);
        DSR_LOAD(l->wq, draft, d, q, "blk.%u.attn_q.weight", il);
        DSR_LOAD(l->wk, draft, d, kv, "blk.%u.attn_k.weight", il);
        DSR_LOAD(l->wv, draft, d, kv, "blk.%u.attn_v.weight", il);
        DSR_LOAD(l->wo, draft, q, d, "blk.%u.attn_output.weight", il);
        DSR_LOAD(l->q_norm, draft, hp->hd, 1, "blk.%u.attn_q_norm.weight", il);
        DSR_LOAD(l->k_norm, draft, hp->hd, 1, "blk.%u.attn_k_norm.weight", il);
        DSR_LOAD(l->ffn_norm, draft, d, 1, "blk.%u.ffn_norm.weight", il);
        DSR_LOAD(l->gate, draft, d, F, "blk.%u.ffn_gate.weight", il);
        DSR_LOAD(l->up, draft, d, F, "blk.%u.ffn_up.weight", il);
        DSR_LOAD(l->down, draft, F, d, "blk.%u.ffn_down.weight", il);
    }
    DSR_LOAD(w->tok_embd, target, d, V, "token_embd.weight");
    DSR_LOAD(w->lm_head, target, d, V, "output.weight");
    if (hp->has_markov) {
        DSR_LOAD(w->w1, draft, R, V, "markov_w1.weight");
        DSR_LOAD(w->w2, draft, R, V, "markov_w2.weight");
        if (dsr_scalar(draft, "markov_w2.scale", 1.0f, &w->w2_scale, err) != 0) goto fail;
        if (hp->has_conf) {
            DSR_LOAD(w->conf_w, draft, d + R, 1, "conf_proj.weight");
            if (dsr_scalar(draft, "conf_proj.bias", 0.0f, &w->conf_b, err) != 0) goto fail;
        }
    }
#undef DSR_LOAD
    return 0;
fail:
    dsr_free_weights(w);
    return -1;
}

/* ---- elementary operations ------------------------------------------------------------------------ */

/* y = W . x for W {in, out}: y[j] = sum_k W[j * in + k] x[k] (GGUF convention: row j = output j). */
static inline void dsr_matvec(const float *W, int64_t in, int64_t out, const float *x, float *y) {
    for (int64_t j = 0; j < out; j++) {
        const float *row = W + j * in;
        double s = 0;
        for (int64_t k = 0; k < in; k++) s += (double)row[k] * x[k];
        y[j] = (float)s;
    }
}

/* y = x / sqrt(mean(x^2) + eps) * w (w may be NULL: no weight). y may alias x. */
static inline void dsr_rmsnorm(const float *x, int64_t n, const float *w, float eps, float *y) {
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    const double inv = 1.0 / sqrt(ss / (double)n + (double)eps);
    for (int64_t i = 0; i < n; i++) y[i] = (float)(x[i] * inv * (w ? w[i] : 1.0));
}

/* NeoX RoPE of one head vector v[hd] at position pos: pairs (i, i + n_rot/2) for i < n_rot/2 rotate by
 * theta_i = pos * base^(-2i/n_rot); dims >= n_rot are untouched. */
static inline void dsr_rope_neox(float *v, uint32_t n_rot, float base, int64_t pos) {
    const uint32_t half = n_rot / 2;
    for (uint32_t i = 0; i < half; i++) {
        const double theta = (double)pos * pow((double)base, -2.0 * (double)i / (double)n_rot);
        const double c = cos(theta), s = sin(theta);
        const double x0 = v[i], x1 = v[i + half];
        v[i] = (float)(x0 * c - x1 * s);
        v[i + half] = (float)(x0 * s + x1 * c);
    }
}

/* Per-head RMSNorm (weight w[hd]) then RoPE, in place, of n_heads heads laid out head-major. */
static inline void dsr_norm_rope_heads(float *v, uint32_t n_heads, const dsr_hparams *hp, const float *w, int64_t pos) {
    for (uint32_t h = 0; h < n_heads; h++) {
        float *vh = v + (size_t)h * hp->hd;
        dsr_rmsnorm(vh, hp->hd, w, hp->eps, vh);
        dsr_rope_neox(vh, hp->n_rot, hp->rope_base, pos);
    }
}

static inline double dsr_silu(double x) { return x / (1.0 + exp(-x)); }

/* Index of the largest value, the lowest index on ties. */
static inline int32_t dsr_argmax(const float *v, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++) {
        if (v[i] > v[best]) best = i;
    }
    return (int32_t)best;
}

/* ---- steps --------------------------------------------------------------------------------------- */

/* Step 1, the encoder: g[i] = RMSNorm(fc . f_i * fc.scale) * enc.output_norm for each context row. */
static inline void dsr_encode(const dsr_hparams *hp, const dsr_weights *w, const float *feats, uint32_t n_ctx, float *g) {
    const int64_t d = hp->d, n_enc = (int64_t)hp->n_taps * d;
    for (uint32_t i = 0; i < n_ctx; i++) {
        float *gi = g + (size_t)i * d;
        dsr_matvec(w->fc, n_enc, d, feats + (size_t)i * n_enc, gi);
        for (int64_t k = 0; k < d; k++) gi[k] *= w->fc_scale;
        dsr_rmsnorm(gi, d, w->enc_norm, hp->eps, gi);
    }
}

/* Step 2, KV injection for one layer: K_i = RoPE(RMSNorm_head(Wk g_i) * k_norm, i), V_i = Wv g_i. No
 * attn_norm on g. */
static inline void dsr_context_kv(const dsr_hparams *hp, const dsr_layer *l, const float *g, uint32_t n_ctx, float *K,
                           float *Vv) {
    const int64_t d = hp->d, kv = (int64_t)hp->n_head_kv * hp->hd;
    for (uint32_t i = 0; i < n_ctx; i++) {
        float *ki = K + (size_t)i * kv;
        dsr_matvec(l->wk, d, kv, g + (size_t)i * d, ki);
        dsr_norm_rope_heads(ki, hp->n_head_kv, hp, l->k_norm, (int64_t)i);
        dsr_matvec(l->wv, d, kv, g + (size_t)i * d, Vv + (size_t)i * kv);
    }
}

/* Attention of the n_block queries q [n_block][H*hd] over the keys K [n_keys][Hkv*hd] (context rows first,
 * then the block's rows), written to o [n_block][H*hd]. Block slot j sees every context key and every block
 * key, or (causal) only block keys <= j. Scale 1/sqrt(hd), GQA: q head h reads kv head h / (H / Hkv). */
static inline void dsr_attention(const dsr_hparams *hp, const float *q, const float *K, const float *Vv, uint32_t n_ctx,
                          int n_block, float *o) {
    const uint32_t hd = hp->hd, H = hp->n_head, group = hp->n_head / hp->n_head_kv;
    const int64_t qw = (int64_t)H * hd, kvw = (int64_t)hp->n_head_kv * hd;
    const uint32_t n_keys = n_ctx + (uint32_t)n_block;
    const double scale = 1.0 / sqrt((double)hd);
    double *p = malloc(n_keys * sizeof(double));
    for (int j = 0; j < n_block; j++) {
        const uint32_t n_seen = hp->causal ? n_ctx + (uint32_t)j + 1 : n_keys;
        for (uint32_t h = 0; h < H; h++) {
            const float *qh = q + j * qw + (int64_t)h * hd;
            const uint32_t hk = h / group;
            double mx = -INFINITY;
            for (uint32_t t = 0; t < n_seen; t++) {
                const float *kt = K + t * kvw + (int64_t)hk * hd;
                double s = 0;
                for (uint32_t e = 0; e < hd; e++) s += (double)qh[e] * kt[e];
                p[t] = s * scale;
                if (p[t] > mx) mx = p[t];
            }
            double sum = 0;
            for (uint32_t t = 0; t < n_seen; t++) sum += p[t] = exp(p[t] - mx);
            float *oh = o + j * qw + (int64_t)h * hd;
            for (uint32_t e = 0; e < hd; e++) {
                double acc = 0;
                for (uint32_t t = 0; t < n_seen; t++) acc += p[t] * Vv[t * kvw + (int64_t)hk * hd + e];
                oh[e] = (float)(acc / sum);
            }
        }
    }
    free(p);
}

/* Step 4, one decoder layer over the block x [n_block][d], in place. Kc/Vc: this layer's context keys and
 * values (n_ctx rows); the block's own K/V rows are appended after them. */
static inline void dsr_block_layer(const dsr_hparams *hp, const dsr_layer *l, const float *Kc, const float *Vc,
                            uint32_t n_ctx, int n_block, float *x) {
    const int64_t d = hp->d, F = hp->n_ff, qw = (int64_t)hp->n_head * hp->hd, kvw = (int64_t)hp->n_head_kv * hp->hd;
    const uint32_t n_keys = n_ctx + (uint32_t)n_block;
    float *xn = malloc((size_t)d * sizeof(float));
    float *q = malloc((size_t)(n_block * qw) * sizeof(float));
    float *o = malloc((size_t)(n_block * qw) * sizeof(float));
    float *K = malloc((size_t)(n_keys * kvw) * sizeof(float));
    float *Vv = malloc((size_t)(n_keys * kvw) * sizeof(float));
    float *tmp = malloc((size_t)d * sizeof(float));
    float *gt = malloc((size_t)F * sizeof(float)), *up = malloc((size_t)F * sizeof(float));
    memcpy(K, Kc, (size_t)n_ctx * kvw * sizeof(float));
    memcpy(Vv, Vc, (size_t)n_ctx * kvw * sizeof(float));

    /* attention: pre-norm, q/k/v, per-head norms, RoPE at the block positions */
    for (int j = 0; j < n_block; j++) {
        const int64_t pos = (int64_t)n_ctx + j;
        dsr_rmsnorm(x + j * d, d, l->attn_norm, hp->eps, xn);
        float *qj = q + j * qw, *kj = K + (n_ctx + (uint32_t)j) * kvw, *vj = Vv + (n_ctx + (uint32_t)j) * kvw;
        dsr_matvec(l->wq, d, qw, xn, qj);
        dsr_matvec(l->wk, d, kvw, xn, kj);
        dsr_matvec(l->wv, d, kvw, xn, vj);
        dsr_norm_rope_heads(qj, hp->n_head, hp, l->q_norm, pos);
        dsr_norm_rope_heads(kj, hp->n_head_kv, hp, l->k_norm, pos);
    }
    dsr_attention(hp, q, K, Vv, n_ctx, n_block, o);
    for (int j = 0; j < n_block; j++) {
        dsr_matvec(l->wo, qw, d, o + j * qw, tmp);
        for (int64_t k = 0; k < d; k++) x[j * d + k] += tmp[k];
    }

    /* SwiGLU FFN */
    for (int j = 0; j < n_block; j++) {
        dsr_rmsnorm(x + j * d, d, l->ffn_norm, hp->eps, xn);
        dsr_matvec(l->gate, d, F, xn, gt);
        dsr_matvec(l->up, d, F, xn, up);
        for (int64_t f = 0; f < F; f++) gt[f] = (float)(dsr_silu(gt[f]) * up[f]);
        dsr_matvec(l->down, F, d, gt, tmp);
        for (int64_t k = 0; k < d; k++) x[j * d + k] += tmp[k];
    }
    free(xn), free(q), free(o), free(K), free(Vv), free(tmp), free(gt), free(up);
}

/* The Markov bias of previous token prev: markov_w2 . markov_w1[prev] * scale, V floats. */
static inline void dsr_markov_bias(const dsr_hparams *hp, const dsr_weights *w, int32_t prev, float *bias) {
    dsr_matvec(w->w2, hp->R, hp->V, w->w1 + (size_t)prev * hp->R, bias);
    for (uint32_t t = 0; t < hp->V; t++) bias[t] = (float)((double)bias[t] * w->w2_scale);
}

/* sigmoid(conf_proj . [hid ; markov_w1[prev]] + b) */
static inline float dsr_confidence(const dsr_hparams *hp, const dsr_weights *w, const float *hid, int32_t prev) {
    double s = w->conf_b;
    for (uint32_t k = 0; k < hp->d; k++) s += (double)w->conf_w[k] * hid[k];
    const float *e = w->w1 + (size_t)prev * hp->R;
    for (uint32_t k = 0; k < hp->R; k++) s += (double)w->conf_w[hp->d + k] * e[k];
    return (float)(1.0 / (1.0 + exp(-s)));
}

/* Steps 5 and 6 on the base logits (in place): the greedy Markov chain from the anchor and the confidences.
 * chain: NULL = greedy (prev = argmax of the biased slot); otherwise slot i (i > i0) is conditioned on
 * chain[i-1] instead, so that a caller can follow another implementation's choices through near-ties. */
static inline void dsr_heads(const dsr_hparams *hp, const dsr_weights *w, const float *hid, int32_t anchor, int n_block,
                      const int32_t *chain, float *logits, int32_t *tokens, float *conf) {
    const int i0 = hp->from_anchor ? 0 : 1;
    float *bias = malloc(hp->V * sizeof(float));
    int32_t prev = anchor;
    for (int i = 0; i < n_block; i++) {
        float *li = logits + (size_t)i * hp->V;
        conf[i] = 1.0f;
        if (!hp->has_markov || i < i0) {
            tokens[i] = dsr_argmax(li, hp->V);
            continue;
        }
        if (chain && i > i0) prev = chain[i - 1];
        dsr_markov_bias(hp, w, prev, bias);
        for (uint32_t t = 0; t < hp->V; t++) li[t] += bias[t];
        if (hp->has_conf) conf[i] = dsr_confidence(hp, w, hid + (size_t)i * hp->d, prev);
        tokens[i] = dsr_argmax(li, hp->V);
        prev = tokens[i];
    }
    free(bias);
}

/* ---- the block ----------------------------------------------------------------------------------- */

/* The whole computation; chain as in dsr_heads; base (optional, n_block * V) receives the logits before
 * the Markov bias. */
static inline int dspark_ref_block_ex(const mf_model *draft, const mf_model *target, const float *feats, uint32_t n_ctx,
                               int32_t anchor, int n_block, const int32_t *chain, float *logits, float *base,
                               int32_t *tokens, float *conf, rl_err *err) {
    dsr_hparams hp;
    dsr_weights w;
    if (dsr_read_hparams(draft, target, &hp, err) != 0) return -1;
    if (n_block < 1 || (uint32_t)n_block > hp.block_size) {
        return rl_errf(err, "dspark_ref: block of %d (block_size %u)", n_block, hp.block_size);
    }
    if (anchor < 0 || (uint32_t)anchor >= hp.V) return rl_errf(err, "dspark_ref: anchor %d outside the vocabulary", anchor);
    if (dsr_load_weights(draft, target, &hp, &w, err) != 0) return -1;
    const int64_t d = hp.d, kvw = (int64_t)hp.n_head_kv * hp.hd;
    float *g = malloc((size_t)(n_ctx ? n_ctx : 1) * d * sizeof(float));
    float *K = malloc((size_t)(n_ctx ? n_ctx : 1) * kvw * sizeof(float));
    float *Vv = malloc((size_t)(n_ctx ? n_ctx : 1) * kvw * sizeof(float));
    float *x = malloc((size_t)n_block * d * sizeof(float));
    float *hid = malloc((size_t)n_block * d * sizeof(float));

    dsr_encode(&hp, &w, feats, n_ctx, g); /* 1 */
    for (int j = 0; j < n_block; j++) {    /* 3: [anchor, MASK...], the target's embedding rows */
        const int32_t tok = j == 0 ? anchor : hp.mask_id;
        memcpy(x + j * d, w.tok_embd + (size_t)tok * d, (size_t)d * sizeof(float));
    }
    for (uint32_t il = 0; il < hp.n_layer; il++) { /* 2 and 4 */
        dsr_context_kv(&hp, &w.l[il], g, n_ctx, K, Vv);
        dsr_block_layer(&hp, &w.l[il], K, Vv, n_ctx, n_block, x);
    }
    for (int j = 0; j < n_block; j++) {
        dsr_rmsnorm(x + j * d, d, w.out_norm, hp.eps, hid + j * d);
        dsr_matvec(w.lm_head, d, hp.V, hid + j * d, logits + (size_t)j * hp.V);
    }
    if (base) memcpy(base, logits, (size_t)n_block * hp.V * sizeof(float));
    dsr_heads(&hp, &w, hid, anchor, n_block, chain, logits, tokens, conf); /* 5, 6 */

    free(g), free(K), free(Vv), free(x), free(hid);
    dsr_free_weights(&w);
    return 0;
}

/* One block [anchor, MASK x (n_block-1)] after the n_ctx context rows feats (n_ctx * n_taps * d floats, at
 * positions 0 .. n_ctx-1): logits (n_block * V), tokens and confidences (n_block each), greedy chain. */
static inline int dspark_ref_block(const mf_model *draft, const mf_model *target, const float *feats, uint32_t n_ctx,
                                   int32_t anchor, int n_block, float *logits, int32_t *tokens, float *conf,
                                   rl_err *err) {
    return dspark_ref_block_ex(draft, target, feats, n_ctx, anchor, n_block, NULL, logits, NULL, tokens, conf, err);
}

#endif
