/* dspark.c - the DSpark draft graph on ggml (contract and math: dspark.h, docs/k3-spec.md §10.1.3).
 *
 * One graph per block: it first injects the features pushed since the last block (their K and V, per
 * layer, are outputs read back into the host-side cache), then runs the block over the cache plus itself.
 * The cache lives on the host as plain f32 rows and enters each graph as an input: a draft's context is
 * short next to the target's, and copying it keeps the graph free of in-place writes. */
#include "dspark.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "gguf.h"

/* ---- opening --------------------------------------------------------------------------------------- */

/* Binds a file tensor (NULL if absent) after checking its shape against {ne0, ne1} (ne1 0: 1-D). */
static struct ggml_tensor *ds_bind(dspark *ds, const mf_model *m, int buf0, const char *name, int64_t ne0, int64_t ne1,
                                   bool required, rl_err *err, int *bad) {
    const mf_tensor *t = mf_find(m, name);
    if (!t) {
        if (required && !*bad) {
            rl_errf(err, "DSpark draft lacks tensor %s", name);
            *bad = 1;
        }
        return NULL;
    }
    if (t->ne[0] != ne0 || (ne1 ? t->ne[1] != ne1 : t->ne[1] != 1) || t->ne[2] != 1 || t->ne[3] != 1) {
        if (!*bad) {
            rl_errf(err, "tensor %s is {%lld, %lld, %lld}, expected {%lld, %lld}", name, (long long)t->ne[0],
                    (long long)t->ne[1], (long long)t->ne[2], (long long)ne0, (long long)(ne1 ? ne1 : 1));
            *bad = 1;
        }
        return NULL;
    }
    struct ggml_tensor *g = ggml_new_tensor(ds->wctx, (enum ggml_type)t->type, 4, t->ne);
    ggml_set_name(g, name);
    ggml_backend_tensor_alloc(ds->bufs[buf0 + t->split], g, (void *)t->data);
    return g;
}

static int ds_keys(dspark *ds, const k3_hparams *thp, uint32_t target_layers, rl_err *err) {
    const mf_model *m = &ds->m;
    const char *arch = NULL;
    if (mf_get_str(m, "general.architecture", &arch, true, err) < 0) return -1;
    if (strcmp(arch, DSPARK_ARCH) != 0) {
        return rl_errf(err, "architecture is '%s', a DSpark/DFlash draft is 'dflash'", arch);
    }
    uint32_t key_len = 0, val_len = 0, mask = 0;
    bool b;
    if (mf_get_u32(m, "dflash.embedding_length", &ds->n_embd, true, err) < 0 ||
        mf_get_u32(m, "dflash.block_count", &ds->n_layer, true, err) < 0 ||
        mf_get_u32(m, "dflash.attention.head_count", &ds->n_head, true, err) < 0 ||
        mf_get_u32(m, "dflash.feed_forward_length", &ds->n_ff, true, err) < 0 ||
        mf_get_f32(m, "dflash.attention.layer_norm_rms_epsilon", &ds->rms_eps, true, err) < 0 ||
        mf_get_u32(m, "tokenizer.ggml.mask_token_id", &mask, true, err) < 0) {
        return -1;
    }
    ds->n_head_kv = ds->n_head;
    ds->rope_base = 10000.0f;
    ds->block_size = 16; /* llama.cpp's driver assumes 16 when the key is absent */
    ds->from_anchor = true;
    if (mf_get_u32(m, "dflash.attention.head_count_kv", &ds->n_head_kv, false, err) < 0 ||
        mf_get_u32(m, "dflash.attention.key_length", &key_len, false, err) < 0 ||
        mf_get_u32(m, "dflash.attention.value_length", &val_len, false, err) < 0 ||
        mf_get_f32(m, "dflash.rope.freq_base", &ds->rope_base, false, err) < 0 ||
        mf_get_u32(m, "dflash.block_size", &ds->block_size, false, err) < 0) {
        return -1;
    }
    int r = mf_get_bool(m, "dflash.sample_from_anchor", &b, false, err);
    if (r < 0) return -1;
    if (r == 0) ds->from_anchor = b;
    r = mf_get_bool(m, "dflash.attention.causal", &b, false, err);
    if (r < 0) return -1;
    if (r == 0) ds->causal = b;
    if (ds->n_embd != thp->n_embd) {
        return rl_errf(err, "draft hidden size %u differs from the target's %u (the taps are target-sized)", ds->n_embd,
                       thp->n_embd);
    }
    if (ds->n_head == 0 || ds->n_head_kv == 0 || ds->n_head % ds->n_head_kv != 0) {
        return rl_errf(err, "draft has %u query heads and %u KV heads", ds->n_head, ds->n_head_kv);
    }
    ds->head_dim = key_len ? key_len : ds->n_embd / ds->n_head;
    if (val_len && val_len != ds->head_dim) return rl_errf(err, "draft key length %u and value length %u differ", key_len, val_len);
    if (ds->head_dim < 2 || ds->head_dim % 2) return rl_errf(err, "draft head size %u is not even", ds->head_dim);
    if (ds->n_layer == 0 || ds->n_layer > DSPARK_MAX_LAYERS) {
        return rl_errf(err, "draft has %u layers (1 to %d supported)", ds->n_layer, DSPARK_MAX_LAYERS);
    }
    if (ds->block_size < 1) return rl_errf(err, "draft block size is 0");
    /* Vocabulary: llama.cpp sizes every vocabulary tensor by the token list, not vocab_size. */
    int64_t kt = gguf_find_key(m->meta, "tokenizer.ggml.tokens");
    if (kt < 0 || gguf_get_kv_type(m->meta, kt) != GGUF_TYPE_ARRAY) return rl_errf(err, "draft has no token list");
    ds->n_vocab = (uint32_t)gguf_get_arr_n(m->meta, kt);
    if (ds->n_vocab != thp->n_vocab) {
        return rl_errf(err, "draft vocabulary of %u tokens differs from the target's %u", ds->n_vocab, thp->n_vocab);
    }
    if (mask >= ds->n_vocab) return rl_errf(err, "mask token %u is outside the vocabulary", mask);
    ds->mask_id = (int32_t)mask;
    /* Taps: "input of layer i" ids, 1 .. n_layer (n_layer: the stream after the last layer). */
    int64_t kl = gguf_find_key(m->meta, "dflash.target_layers");
    if (kl < 0) return rl_errf(err, "DSpark draft requires 'dflash.target_layers'");
    enum gguf_type at = gguf_get_kv_type(m->meta, kl) == GGUF_TYPE_ARRAY ? gguf_get_arr_type(m->meta, kl) : GGUF_TYPE_COUNT;
    if (at != GGUF_TYPE_INT32 && at != GGUF_TYPE_UINT32) return rl_errf(err, "dflash.target_layers is not an int32 array");
    size_t n = gguf_get_arr_n(m->meta, kl);
    if (n == 0 || n > DSPARK_MAX_TAPS) return rl_errf(err, "draft taps %zu target layers (1 to %d supported)", n, DSPARK_MAX_TAPS);
    const int32_t *ids = gguf_get_arr_data(m->meta, kl);
    ds->n_taps = (uint32_t)n;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 1 || (uint32_t)ids[i] > target_layers) {
            return rl_errf(err, "draft tap %d is not a target layer input (1 .. %u)", ids[i], target_layers);
        }
        ds->taps[i] = (uint32_t)ids[i];
    }
    return 0;
}

int dspark_open(dspark *ds, const char *path, const mf_model *target, const k3_hparams *thp, uint32_t n_ctx,
                int n_threads, rl_err *err) {
    memset(ds, 0, sizeof *ds);
    if (mf_open(&ds->m, path, err) != 0) return -1;
    if (ds_keys(ds, thp, thp->n_layer, err) != 0) goto fail;
    if (ds->m.n_split + target->n_split > (int)(sizeof ds->bufs / sizeof ds->bufs[0])) {
        rl_errf(err, "too many split files");
        goto fail;
    }
    struct ggml_init_params ip = {.mem_size = (size_t)(ds->m.n_tensor + 8) * ggml_tensor_overhead(), .no_alloc = true};
    ds->wctx = ggml_init(ip);
    if (!ds->wctx) {
        rl_errf(err, "out of memory");
        goto fail;
    }
    const mf_tensor *te = mf_find(target, "token_embd.weight"), *th = mf_find(target, "output.weight");
    if ((te && !te->data) || (th && !th->data)) { /* a manifest's view of the target (mf_compose) */
        rl_errf(err, "it borrows the target's token embedding and output head, and this machine holds only the "
                     "target's manifest: give the coordinator the model (-m), or draft with ngram or a draft model");
        goto fail;
    }
    const mf_model *ms[2] = {&ds->m, target};
    for (int f = 0; f < 2; f++) {
        for (int s = 0; s < ms[f]->n_split; s++) {
            ds->bufs[ds->n_bufs] = ggml_backend_cpu_buffer_from_ptr(ms[f]->splits[s].map, ms[f]->splits[s].size);
            if (!ds->bufs[ds->n_bufs]) {
                rl_errf(err, "cannot wrap the mapping of %s", ms[f]->splits[s].path);
                goto fail;
            }
            ds->n_bufs++;
        }
    }
    const int64_t d = ds->n_embd, hd = ds->head_dim, H = ds->n_head, Hkv = ds->n_head_kv, F = ds->n_ff, V = ds->n_vocab;
    const int tb = ds->m.n_split; /* the target's buffers start here */
    int bad = 0;
    char n[96];
    ds->fc = ds_bind(ds, &ds->m, 0, "fc.weight", ds->n_taps * d, d, true, err, &bad);
    ds->fc_scale = ds_bind(ds, &ds->m, 0, "fc.scale", 1, 0, false, err, &bad);
    ds->enc_norm = ds_bind(ds, &ds->m, 0, "enc.output_norm.weight", d, 0, true, err, &bad);
    ds->out_norm = ds_bind(ds, &ds->m, 0, "output_norm.weight", d, 0, true, err, &bad);
    for (uint32_t il = 0; il < ds->n_layer; il++) {
        dspark_layer *L = &ds->layers[il];
#define B(field, name, a0, a1) (snprintf(n, sizeof n, "blk.%u." name, il), L->field = ds_bind(ds, &ds->m, 0, n, a0, a1, true, err, &bad))
        B(attn_norm, "attn_norm.weight", d, 0);
        B(wq, "attn_q.weight", d, H * hd);
        B(wk, "attn_k.weight", d, Hkv * hd);
        B(wv, "attn_v.weight", d, Hkv * hd);
        B(wo, "attn_output.weight", H * hd, d);
        B(q_norm, "attn_q_norm.weight", hd, 0);
        B(k_norm, "attn_k_norm.weight", hd, 0);
        B(ffn_norm, "ffn_norm.weight", d, 0);
        B(gate, "ffn_gate.weight", d, F);
        B(up, "ffn_up.weight", d, F);
        B(down, "ffn_down.weight", F, d);
#undef B
    }
    const mf_tensor *w1 = mf_find(&ds->m, "markov_w1.weight");
    if (w1) {
        ds->rank = (uint32_t)w1->ne[0];
        ds->markov_w1 = ds_bind(ds, &ds->m, 0, "markov_w1.weight", ds->rank, V, true, err, &bad);
        ds->markov_w2 = ds_bind(ds, &ds->m, 0, "markov_w2.weight", ds->rank, V, true, err, &bad);
        ds->markov_scale = ds_bind(ds, &ds->m, 0, "markov_w2.scale", 1, 0, false, err, &bad);
        if (mf_find(&ds->m, "conf_proj.weight")) {
            ds->conf_w = ds_bind(ds, &ds->m, 0, "conf_proj.weight", d + ds->rank, 1, true, err, &bad);
            ds->conf_b = ds_bind(ds, &ds->m, 0, "conf_proj.bias", 1, 0, true, err, &bad);
        }
    }
    if (mf_find(&ds->m, "token_embd.weight") || mf_find(&ds->m, "output.weight") || mf_find(&ds->m, "d2t")) {
        if (!bad) rl_errf(err, "drafts with their own embedding, LM head or reduced vocabulary are not supported");
        bad = 1;
    }
    ds->tok_embd = ds_bind(ds, target, tb, "token_embd.weight", d, V, true, err, &bad);
    ds->lm_head = ds_bind(ds, target, tb, "output.weight", d, V, true, err, &bad);
    if (bad) goto fail;
    ds->backend = ggml_backend_cpu_init();
    ds->galloc = ds->backend ? ggml_gallocr_new(ggml_backend_cpu_buffer_type()) : NULL;
    if (!ds->galloc) {
        rl_errf(err, "cannot start the ggml CPU backend");
        goto fail;
    }
    ggml_backend_cpu_set_n_threads(ds->backend, n_threads > 0 ? n_threads : 1);
    ds->n_ctx = n_ctx;
    size_t row = (size_t)Hkv * (size_t)hd;
    for (uint32_t il = 0; il < ds->n_layer; il++) {
        ds->kc[il] = malloc((size_t)n_ctx * row * sizeof(float));
        ds->vc[il] = malloc((size_t)n_ctx * row * sizeof(float));
        if (!ds->kc[il] || !ds->vc[il]) {
            rl_errf(err, "out of memory for a draft cache of %u positions", n_ctx);
            goto fail;
        }
    }
    return 0;
fail:
    rl_err_prefix(err, "%s", path);
    dspark_close(ds);
    return -1;
}

void dspark_close(dspark *ds) {
    if (ds->galloc) ggml_gallocr_free(ds->galloc);
    if (ds->backend) ggml_backend_free(ds->backend);
    if (ds->wctx) ggml_free(ds->wctx);
    for (int i = 0; i < ds->n_bufs; i++) ggml_backend_buffer_free(ds->bufs[i]);
    for (int il = 0; il < DSPARK_MAX_LAYERS; il++) {
        free(ds->kc[il]);
        free(ds->vc[il]);
    }
    free(ds->pend);
    free(ds->graph_buf);
    mf_close(&ds->m);
    memset(ds, 0, sizeof *ds);
}

void dspark_reset(dspark *ds) {
    ds->n_cached = 0;
    ds->n_pend = 0;
}

int dspark_push(dspark *ds, const float *feats, uint32_t n, rl_err *err) {
    if ((uint64_t)ds->n_cached + ds->n_pend + n > ds->n_ctx) {
        return rl_errf(err, "draft context of %u positions is full", ds->n_ctx);
    }
    size_t row = (size_t)ds->n_taps * ds->n_embd;
    if (ds->n_pend + n > ds->cap_pend) {
        uint32_t cap = ds->cap_pend ? ds->cap_pend : 64;
        while (cap < ds->n_pend + n) cap *= 2;
        float *p = realloc(ds->pend, (size_t)cap * row * sizeof(float));
        if (!p) return rl_errf(err, "out of memory for draft features");
        ds->pend = p;
        ds->cap_pend = cap;
    }
    memcpy(ds->pend + (size_t)ds->n_pend * row, feats, (size_t)n * row * sizeof(float));
    ds->n_pend += n;
    return 0;
}

/* ---- the block graph --------------------------------------------------------------------------------- */

typedef struct ds_graph {
    struct ggml_context *c;
    const dspark *ds;
} ds_graph;

static struct ggml_tensor *ds_norm(ds_graph *g, struct ggml_tensor *x, struct ggml_tensor *w) {
    return ggml_mul(g->c, ggml_rms_norm(g->c, x, g->ds->rms_eps), w);
}

/* Per-head RMSNorm with a head-sized weight, then NeoX RoPE: x is [hd * heads, n] -> [hd, heads, n]. */
static struct ggml_tensor *ds_qk(ds_graph *g, struct ggml_tensor *x, int64_t heads, struct ggml_tensor *w,
                                 struct ggml_tensor *pos) {
    const dspark *ds = g->ds;
    x = ggml_reshape_3d(g->c, x, ds->head_dim, heads, x->ne[1]);
    x = ds_norm(g, x, w);
    return ggml_rope_ext(g->c, x, pos, NULL, (int)ds->head_dim, GGML_ROPE_TYPE_NEOX, 0, ds->rope_base, 1.0f, 0.0f,
                         1.0f, 0.0f, 0.0f);
}

int dspark_block(dspark *ds, int32_t anchor, int n_block, dspark_out *out, rl_err *err) {
    if (n_block < 1 || n_block > (int)ds->block_size || n_block > DSPARK_MAX_BLOCK) {
        return rl_errf(err, "a draft block of %d slots (this draft: 1 to %u)", n_block,
                       ds->block_size < DSPARK_MAX_BLOCK ? ds->block_size : DSPARK_MAX_BLOCK);
    }
    if (anchor < 0 || (uint32_t)anchor >= ds->n_vocab) return rl_errf(err, "anchor token %d out of range", anchor);
    const int64_t d = ds->n_embd, hd = ds->head_dim, H = ds->n_head, Hkv = ds->n_head_kv, V = ds->n_vocab;
    const int64_t P = ds->n_pend, C = ds->n_cached, B = n_block, N = C + P + B;
    const int i0 = ds->from_anchor ? 0 : 1;

    size_t n_nodes = 1024 + (size_t)ds->n_layer * 64 + (size_t)B * 24;
    size_t need = n_nodes * ggml_tensor_overhead() + ggml_graph_overhead_custom(n_nodes, false);
    if (need > ds->graph_cap) {
        void *gb = realloc(ds->graph_buf, need);
        if (!gb) return rl_errf(err, "out of memory for the draft graph");
        ds->graph_buf = gb;
        ds->graph_cap = need;
    }
    struct ggml_init_params ip = {.mem_size = need, .mem_buffer = ds->graph_buf, .no_alloc = true};
    struct ggml_context *c = ggml_init(ip);
    if (!c) return rl_errf(err, "out of memory for the draft graph");
    ds_graph g = {.c = c, .ds = ds};
    struct ggml_cgraph *gf = ggml_new_graph_custom(c, n_nodes, false);

    /* Inputs. */
    struct ggml_tensor *in_feat = NULL, *in_pctx = NULL, *in_kc[DSPARK_MAX_LAYERS] = {0}, *in_vc[DSPARK_MAX_LAYERS] = {0};
    struct ggml_tensor *gctx = NULL, *out_k[DSPARK_MAX_LAYERS] = {0}, *out_v[DSPARK_MAX_LAYERS] = {0};
    if (P > 0) {
        in_feat = ggml_new_tensor_2d(c, GGML_TYPE_F32, (int64_t)ds->n_taps * d, P);
        in_pctx = ggml_new_tensor_1d(c, GGML_TYPE_I32, P);
        ggml_set_input(in_feat);
        ggml_set_input(in_pctx);
        /* 1. Encoder: g = RMSNorm(fc . f (x fc.scale); enc.output_norm). */
        struct ggml_tensor *t = ggml_mul_mat(c, ds->fc, in_feat);
        if (ds->fc_scale) t = ggml_mul(c, t, ds->fc_scale);
        gctx = ds_norm(&g, t, ds->enc_norm);
    }
    struct ggml_tensor *in_tok = ggml_new_tensor_1d(c, GGML_TYPE_I32, B);
    struct ggml_tensor *in_pblk = ggml_new_tensor_1d(c, GGML_TYPE_I32, B);
    struct ggml_tensor *in_prev = ggml_new_tensor_1d(c, GGML_TYPE_I32, 1);
    struct ggml_tensor *in_mask = NULL;
    ggml_set_input(in_tok);
    ggml_set_input(in_pblk);
    ggml_set_input(in_prev);
    if (ds->causal && B > 1) {
        in_mask = ggml_new_tensor_2d(c, GGML_TYPE_F32, N, B);
        ggml_set_input(in_mask);
    }
    /* 4. Decoder over the block: the target's embedding of [anchor, MASK...]. */
    struct ggml_tensor *x = ggml_get_rows(c, ds->tok_embd, in_tok);
    for (uint32_t il = 0; il < ds->n_layer; il++) {
        const dspark_layer *L = &ds->layers[il];
        struct ggml_tensor *K = NULL, *Vv = NULL;
        if (C > 0) {
            in_kc[il] = ggml_new_tensor_3d(c, GGML_TYPE_F32, hd, Hkv, C);
            in_vc[il] = ggml_new_tensor_3d(c, GGML_TYPE_F32, hd, Hkv, C);
            ggml_set_input(in_kc[il]);
            ggml_set_input(in_vc[il]);
            K = in_kc[il];
            Vv = in_vc[il];
        }
        if (P > 0) {
            /* 2. KV injection of the new context positions (no attn_norm on g). */
            out_k[il] = ds_qk(&g, ggml_mul_mat(c, L->wk, gctx), Hkv, L->k_norm, in_pctx);
            out_v[il] = ggml_cont_3d(c, ggml_mul_mat(c, L->wv, gctx), hd, Hkv, P); /* not a view: read back */
            ggml_set_output(out_k[il]);
            ggml_set_output(out_v[il]);
            K = K ? ggml_concat(c, K, out_k[il], 2) : out_k[il];
            Vv = Vv ? ggml_concat(c, Vv, out_v[il], 2) : out_v[il];
        }
        struct ggml_tensor *xn = ds_norm(&g, x, L->attn_norm);
        struct ggml_tensor *q = ds_qk(&g, ggml_mul_mat(c, L->wq, xn), H, L->q_norm, in_pblk);
        struct ggml_tensor *kb = ds_qk(&g, ggml_mul_mat(c, L->wk, xn), Hkv, L->k_norm, in_pblk);
        struct ggml_tensor *vb = ggml_reshape_3d(c, ggml_mul_mat(c, L->wv, xn), hd, Hkv, B);
        K = K ? ggml_concat(c, K, kb, 2) : kb;     /* [hd, Hkv, N] */
        Vv = Vv ? ggml_concat(c, Vv, vb, 2) : vb;
        struct ggml_tensor *kp = ggml_cont(c, ggml_permute(c, K, 0, 2, 1, 3));  /* [hd, N, Hkv] */
        struct ggml_tensor *vt = ggml_cont(c, ggml_permute(c, Vv, 1, 2, 0, 3)); /* [N, hd, Hkv] */
        struct ggml_tensor *qp = ggml_permute(c, q, 0, 2, 1, 3);                 /* [hd, B, H] */
        struct ggml_tensor *kq = ggml_mul_mat(c, kp, qp);                        /* [N, B, H] */
        kq = ggml_soft_max_ext(c, kq, in_mask, 1.0f / sqrtf((float)hd), 0.0f);
        struct ggml_tensor *o = ggml_mul_mat(c, vt, kq);                         /* [hd, B, H] */
        o = ggml_cont_2d(c, ggml_permute(c, o, 0, 2, 1, 3), hd * H, B);
        x = ggml_add(c, x, ggml_mul_mat(c, L->wo, o));
        struct ggml_tensor *xf = ds_norm(&g, x, L->ffn_norm);
        struct ggml_tensor *f = ggml_mul(c, ggml_silu(c, ggml_mul_mat(c, L->gate, xf)), ggml_mul_mat(c, L->up, xf));
        x = ggml_add(c, x, ggml_mul_mat(c, L->down, f));
    }
    struct ggml_tensor *hid = ds_norm(&g, x, ds->out_norm);
    struct ggml_tensor *base = ggml_mul_mat(c, ds->lm_head, hid); /* [V, B] */
    /* 5-6. Markov head chained greedily from the anchor, and the confidence head. */
    struct ggml_tensor *lg[DSPARK_MAX_BLOCK], *am[DSPARK_MAX_BLOCK], *cf[DSPARK_MAX_BLOCK] = {0};
    struct ggml_tensor *prev = in_prev;
    for (int64_t i = 0; i < B; i++) {
        struct ggml_tensor *li = ggml_view_2d(c, base, V, 1, base->nb[1], (size_t)i * base->nb[1]);
        if (ds->markov_w1 && i >= i0) {
            struct ggml_tensor *e = ggml_get_rows(c, ds->markov_w1, prev); /* [R, 1] */
            struct ggml_tensor *bias = ggml_mul_mat(c, ds->markov_w2, e);
            if (ds->markov_scale) bias = ggml_mul(c, bias, ds->markov_scale);
            li = ggml_add(c, li, bias);
            if (ds->conf_w) {
                struct ggml_tensor *hi = ggml_view_2d(c, hid, d, 1, hid->nb[1], (size_t)i * hid->nb[1]);
                struct ggml_tensor *z = ggml_mul_mat(c, ds->conf_w, ggml_concat(c, hi, e, 0));
                cf[i] = ggml_sigmoid(c, ggml_add(c, z, ds->conf_b));
                ggml_set_output(cf[i]);
                ggml_build_forward_expand(gf, cf[i]);
            }
        } else {
            li = ggml_cont(c, li);
        }
        am[i] = ggml_argmax(c, li);
        if (i >= i0) prev = am[i]; /* a slot before the first drafting one does not condition the chain */
        lg[i] = li;
        ggml_set_output(lg[i]);
        ggml_set_output(am[i]);
        ggml_build_forward_expand(gf, am[i]);
    }
    for (uint32_t il = 0; il < ds->n_layer && P > 0; il++) {
        ggml_build_forward_expand(gf, out_k[il]);
        ggml_build_forward_expand(gf, out_v[il]);
    }

    int rc = 0;
    if (!ggml_gallocr_alloc_graph(ds->galloc, gf)) {
        rc = rl_errf(err, "cannot allocate compute memory for the draft block");
        goto done;
    }
    {
        int32_t tok[DSPARK_MAX_BLOCK], pb[DSPARK_MAX_BLOCK];
        for (int64_t i = 0; i < B; i++) {
            tok[i] = i == 0 ? anchor : ds->mask_id;
            pb[i] = (int32_t)(C + P + i);
        }
        ggml_backend_tensor_set(in_tok, tok, 0, (size_t)B * sizeof(int32_t));
        ggml_backend_tensor_set(in_pblk, pb, 0, (size_t)B * sizeof(int32_t));
        if (in_prev->buffer) ggml_backend_tensor_set(in_prev, &anchor, 0, sizeof anchor); /* unused without a chain */
    }
    if (P > 0) {
        ggml_backend_tensor_set(in_feat, ds->pend, 0, ggml_nbytes(in_feat));
        int32_t *pc = malloc((size_t)P * sizeof *pc);
        if (!pc) {
            rc = rl_errf(err, "out of memory");
            goto done;
        }
        for (int64_t i = 0; i < P; i++) pc[i] = (int32_t)(C + i);
        ggml_backend_tensor_set(in_pctx, pc, 0, (size_t)P * sizeof *pc);
        free(pc);
    }
    for (uint32_t il = 0; il < ds->n_layer && C > 0; il++) {
        ggml_backend_tensor_set(in_kc[il], ds->kc[il], 0, ggml_nbytes(in_kc[il]));
        ggml_backend_tensor_set(in_vc[il], ds->vc[il], 0, ggml_nbytes(in_vc[il]));
    }
    if (in_mask) {
        float *mk = malloc((size_t)N * (size_t)B * sizeof *mk);
        if (!mk) {
            rc = rl_errf(err, "out of memory");
            goto done;
        }
        for (int64_t i = 0; i < B; i++) {
            for (int64_t j = 0; j < N; j++) mk[i * N + j] = j <= C + P + i ? 0.0f : -INFINITY;
        }
        ggml_backend_tensor_set(in_mask, mk, 0, (size_t)N * (size_t)B * sizeof *mk);
        free(mk);
    }
    if (ggml_backend_graph_compute(ds->backend, gf) != GGML_STATUS_SUCCESS) {
        rc = rl_errf(err, "draft graph compute failed");
        goto done;
    }
    out->n_block = (int)B;
    for (int64_t i = 0; i < B; i++) {
        ggml_backend_tensor_get(am[i], &out->tokens[i], 0, sizeof(int32_t));
        out->conf[i] = 1.0f;
        if (cf[i]) ggml_backend_tensor_get(cf[i], &out->conf[i], 0, sizeof(float));
        if (out->logits) ggml_backend_tensor_get(lg[i], out->logits + i * V, 0, (size_t)V * sizeof(float));
    }
    /* The injected positions join the cache. */
    size_t row = (size_t)Hkv * (size_t)hd;
    for (uint32_t il = 0; il < ds->n_layer && P > 0; il++) {
        ggml_backend_tensor_get(out_k[il], ds->kc[il] + (size_t)C * row, 0, (size_t)P * row * sizeof(float));
        ggml_backend_tensor_get(out_v[il], ds->vc[il] + (size_t)C * row, 0, (size_t)P * row * sizeof(float));
    }
    ds->n_cached += (uint32_t)P;
    ds->n_pend = 0;
done:
    ggml_free(c);
    return rc;
}
