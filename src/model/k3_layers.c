/* k3_layers.c - the K3 graph for a layer range, read top to bottom like docs/k3-spec.md §5.1. k3_graph_forward is the
 * pass: the stream in (token embeddings, or the boundary state of the stage before), each layer's mixer half
 * (KDA or MLA) and FFN half (dense or MoE), AttnRes mixing over the bank where the model has it, and the
 * stream out (the output head's logits, or the boundary state for the next stage). The rest of the file is
 * its pieces: the ops every layer uses, then AttnRes, KDA, MLA, the FFNs.
 *
 * The op sequence mirrors llama.cpp's kimi-k3 graph (same ggml ops in the same order), so the two agree to
 * rounding. Projections, routing and experts run batched over every token of every sequence; the causal
 * parts (KDA short conv and delta rule, MLA attention) run per sequence on views of the batch, each on its
 * own state, except that neighbouring sequences of equal length whose states share a pool (a server's
 * decode step) run them once over all of them, the sequences stacked on the outermost axis (k3_group). */
#include "k3_forward_int.h"

#include <math.h>
#include <string.h>

#include "ggml-backend.h"
#include "ggml.h"

#include "expert_cache.h"

static struct ggml_tensor *k3_input(k3_graph *g, const k3_batch *bt);
static void k3_tap(k3_graph *g, const k3_batch *bt, uint32_t il, struct ggml_tensor *h);
static struct ggml_tensor *k3_layer(k3_graph *g, uint32_t il, struct ggml_tensor *h);
static void k3_head(k3_graph *g, const k3_batch *bt, struct ggml_tensor *h);
static struct ggml_tensor *k3_norm(k3_graph *g, struct ggml_tensor *x, struct ggml_tensor *w);
static struct ggml_tensor *k3_res_mix(k3_graph *g, struct ggml_tensor *cur, struct ggml_tensor *score_w);
static void k3_res_push(k3_graph *g, struct ggml_tensor *h);
static struct ggml_tensor *k3_kda(k3_graph *g, const k3_layer_w *L, int il_rel, struct ggml_tensor *xn);
static struct ggml_tensor *k3_mla(k3_graph *g, const k3_layer_w *L, int il_rel, struct ggml_tensor *xn);
static struct ggml_tensor *k3_ffn(k3_graph *g, const k3_layer_w *L, struct ggml_tensor *xn);
static struct ggml_tensor *k3_moe(k3_graph *g, const k3_layer_w *L, struct ggml_tensor *xn);

/* The pass over the range; k3_build calls it once the graph's sequences, groups and their inputs are made. */
void k3_graph_forward(k3_graph *g, const k3_batch *bt) {
    struct ggml_tensor *h = k3_input(g, bt);
    for (uint32_t il = g->a; il < g->b; il++) {
        k3_tap(g, bt, il, h);
        h = k3_layer(g, il, h);
    }
    k3_tap(g, bt, g->b, h);
    k3_head(g, bt, h);
}

/* One layer: two residual halves, the mixer and the FFN, each reading the stream (with AttnRes, its mix over
 * the bank) through a norm. */
static struct ggml_tensor *k3_layer(k3_graph *g, uint32_t il, struct ggml_tensor *h) {
    struct ggml_context *c = g->ctx;
    const k3_hparams *hp = g->hp;
    const int rel = (int)(il - g->a);
    const k3_layer_w *L = &g->w->layers[rel];
    g->rel = rel;
    /* Mixer half: mix over the bank, bank the RAW stream at checkpoint layers, restart from the output. */
    struct ggml_tensor *x = hp->attn_res_block ? k3_res_mix(g, h, L->attn_res_score) : h;
    bool banked = hp->attn_res_block && il % hp->attn_res_block == 0;
    if (banked) k3_res_push(g, h);
    struct ggml_tensor *xn = k3_norm(g, x, L->attn_norm);
    ggml_build_forward_expand(g->gf, xn);
    struct ggml_tensor *a = hp->is_mla[il] ? k3_mla(g, L, rel, xn) : k3_kda(g, L, rel, xn);
    h = banked ? a : ggml_add(c, h, a);
    /* FFN half. */
    struct ggml_tensor *y = hp->attn_res_block ? k3_res_mix(g, h, L->ffn_res_score) : h;
    struct ggml_tensor *yn = k3_norm(g, y, L->ffn_norm);
    struct ggml_tensor *f = k3_is_moe(hp, il) ? k3_moe(g, L, yn) : k3_ffn(g, L, yn);
    return ggml_add(c, h, f);
}

/* ---- the stream in and out --------------------------------------------------------------------- */

/* Input: embeddings, or the boundary state from the previous stage. */
static struct ggml_tensor *k3_input(k3_graph *g, const k3_batch *bt) {
    struct ggml_context *c = g->ctx;
    const int64_t d = g->hp->n_embd, T = g->T;
    if (g->a == 0) {
        g->inp_tok = ggml_new_tensor_1d(c, GGML_TYPE_I32, T);
        ggml_set_input(g->inp_tok);
        return ggml_get_rows(c, g->w->tok_embd, g->inp_tok);
    }
    g->inp_h = ggml_new_tensor_2d(c, GGML_TYPE_F32, d, T);
    ggml_set_input(g->inp_h);
    if (bt->in->n_ckpt) {
        g->inp_stack = ggml_new_tensor_3d(c, GGML_TYPE_F32, d, bt->in->n_ckpt, T);
        ggml_set_input(g->inp_stack);
        g->stack = g->inp_stack;
    }
    return g->inp_h;
}

/* Taps: the stream entering layer il is h before its mixer half (il == b: after the last layer). */
static void k3_tap(k3_graph *g, const k3_batch *bt, uint32_t il, struct ggml_tensor *h) {
    struct ggml_context *c = g->ctx;
    for (int k = 0; k < bt->n_taps; k++) {
        if (bt->tap_layers[k] != il) continue;
        g->tap_layers[k] = il;
        g->tap_t[k] = h->view_src || !ggml_is_contiguous(h) ? ggml_cont(c, h) : h; /* read back: no view */
        ggml_set_output(g->tap_t[k]);
        ggml_build_forward_expand(g->gf, g->tap_t[k]);
    }
}

/* Output: the head's logits for the asked-for rows where the range ends the model, else the boundary state
 * (the stream and the bank) for the next stage. */
static void k3_head(k3_graph *g, const k3_batch *bt, struct ggml_tensor *h) {
    struct ggml_context *c = g->ctx;
    const k3_hparams *hp = g->hp;
    if (g->b == hp->n_layer) {
        struct ggml_tensor *z = hp->attn_res_block ? k3_res_mix(g, h, g->w->output_res_score) : h;
        if (bt->n_logits > 0) {
            if (bt->n_logits < g->T) {
                g->inp_rows = ggml_new_tensor_1d(c, GGML_TYPE_I32, bt->n_logits);
                ggml_set_input(g->inp_rows);
                z = ggml_get_rows(c, z, g->inp_rows);
            }
            g->logits = k3_mm(g, g->w->output, k3_norm(g, z, g->w->output_norm));
            ggml_set_output(g->logits);
            ggml_build_forward_expand(g->gf, g->logits);
        } else {
            ggml_build_forward_expand(g->gf, h); /* states still advance */
        }
    } else {
        g->out_h = ggml_cont(c, h);
        ggml_set_output(g->out_h);
        ggml_build_forward_expand(g->gf, g->out_h);
        if (g->stack) {
            g->out_stack = ggml_cont(c, g->stack);
            ggml_set_output(g->out_stack);
            ggml_build_forward_expand(g->gf, g->out_stack);
        }
    }
}

/* ---- ops every layer kind uses ----------------------------------------------------------------- */

/* Every matmul of the graph goes through here. ggml's CPU backend computes a matmul of two or more
 * columns with llamafile's tiled GEMM (where it knows the weight type: f32, f16, bf16, q8_0, q4_0 ...)
 * and a single column with its per-row dot kernels, and the two round differently in the last bit. On a
 * MoE that is enough to swap a near-tied expert, so a verified block would not reproduce greedy decoding.
 * With g->step_kernels the columns move to the third axis: ggml then offers the GEMM one column at a
 * time, it declines (n < 2), and every column goes through the dot kernel a single step uses; the
 * result is the same bits as running the tokens one by one. The index arithmetic holds for per-head
 * weights too: column i1 of head i2 becomes i1 + i2*n1, and ggml maps it back to weight i2 (see
 * docs/numerics.md). */
static struct ggml_tensor *k3_mm_prec(k3_graph *g, struct ggml_tensor *w, struct ggml_tensor *x, bool f32_prec) {
    struct ggml_context *c = g->ctx;
    if (!g->step_kernels || x->ne[1] == 1) {
        struct ggml_tensor *y = ggml_mul_mat(c, w, x);
        if (f32_prec) ggml_mul_mat_set_prec(y, GGML_PREC_F32);
        return y;
    }
    const int64_t n1 = x->ne[1], n2 = x->ne[2], n3 = x->ne[3];
    if (!ggml_is_contiguous(x)) x = ggml_cont(c, x);
    struct ggml_tensor *y = ggml_mul_mat(c, w, ggml_reshape_4d(c, x, x->ne[0], 1, n1 * n2, n3));
    if (f32_prec) ggml_mul_mat_set_prec(y, GGML_PREC_F32);
    return ggml_reshape_4d(c, y, y->ne[0], n1, n2, n3);
}

struct ggml_tensor *k3_mm(k3_graph *g, struct ggml_tensor *w, struct ggml_tensor *x) {
    return k3_mm_prec(g, w, x, false);
}

static struct ggml_tensor *k3_norm(k3_graph *g, struct ggml_tensor *x, struct ggml_tensor *w) {
    return ggml_mul(g->ctx, ggml_rms_norm(g->ctx, x, g->hp->rms_eps), w);
}

/* SiTU(gate, up) = beta*tanh(gate/beta)*sigmoid(gate) * lb*tanh(up/lb)   (lb <= 0: up unchanged) */
struct ggml_tensor *k3_situ(k3_graph *g, struct ggml_tensor *gate, struct ggml_tensor *up) {
    const float beta = g->hp->situ_beta, lb = g->hp->situ_linear_beta;
    struct ggml_context *c = g->ctx;
    struct ggml_tensor *a = ggml_scale(c, ggml_tanh(c, ggml_scale(c, gate, 1.0f / beta)), beta);
    a = ggml_mul(c, a, ggml_sigmoid(c, gate));
    if (lb > 0.0f) up = ggml_scale(c, ggml_tanh(c, ggml_scale(c, up, 1.0f / lb)), lb);
    return ggml_mul(c, a, up);
}

/* Reads t's bytes [offset, offset+size) into dst after the compute (rollback copies). */
static void k3_readback_add(k3_graph *g, struct ggml_tensor *t, size_t offset, size_t size, void *dst) {
    GGML_ASSERT(g->n_rb < g->cap_rb); /* sized by k3_build */
    ggml_set_output(t); /* the allocator must not reuse its memory before we read it */
    g->rb[g->n_rb++] = (k3_readback){t, offset, size, dst};
}

/* Columns [off, off+n) of a 2-D [X, T] tensor. */
static struct ggml_tensor *k3_cols(k3_graph *g, struct ggml_tensor *x, uint32_t off, uint32_t n) {
    return ggml_view_2d(g->ctx, x, x->ne[0], n, x->nb[1], off * x->nb[1]);
}

/* Concatenates per-group results [X, m*n] along tokens into [X, T]. */
static struct ggml_tensor *k3_join(k3_graph *g, struct ggml_tensor **parts) {
    struct ggml_tensor *r = parts[0];
    for (int s = 1; s < g->n_groups; s++) r = ggml_concat(g->ctx, r, parts[s], 1);
    return r;
}

/* The group's slots of a pool tensor seen as rows: t_rows is [R, n_slots] (R floats per slot, any slot
 * stride). Returns [R, m]: a view when the slots are consecutive, else a gathered copy. */
static struct ggml_tensor *k3_gather(k3_graph *g, const k3_group *gr, struct ggml_tensor *t_rows) {
    if (gr->slot0 >= 0) {
        return ggml_view_2d(g->ctx, t_rows, t_rows->ne[0], gr->m, t_rows->nb[1], (size_t)gr->slot0 * t_rows->nb[1]);
    }
    return ggml_get_rows(g->ctx, t_rows, gr->slots);
}

/* Writes src [R, m] (contiguous rows) back to the group's slots of t_rows [R, n_slots]. */
static void k3_scatter(k3_graph *g, const k3_group *gr, struct ggml_tensor *t_rows, struct ggml_tensor *src) {
    struct ggml_tensor *w;
    if (gr->slot0 >= 0) {
        w = ggml_cpy(g->ctx, src, ggml_view_2d(g->ctx, t_rows, t_rows->ne[0], gr->m, t_rows->nb[1],
                                               (size_t)gr->slot0 * t_rows->nb[1]));
    } else {
        w = ggml_set_rows(g->ctx, t_rows, src, gr->slots);
    }
    ggml_build_forward_expand(g->gf, w);
}

/* ---- AttnRes: the bank of checkpoints ---------------------------------------------------------- */

/* ResMix (docs/k3-spec.md §5.2): softmax over the scores of [checkpoints..., cur] mixes the raw candidates. */
static struct ggml_tensor *k3_res_mix(k3_graph *g, struct ggml_tensor *cur, struct ggml_tensor *score_w) {
    if (!g->stack) return cur;
    struct ggml_context *c = g->ctx;
    const int64_t n_ckpt = g->stack->ne[1], T = g->T;
    const float eps = g->hp->rms_eps;
    struct ggml_tensor *sc_src = ggml_sum_rows(c, ggml_mul(c, ggml_rms_norm(c, g->stack, eps), score_w));
    sc_src = ggml_reshape_2d(c, sc_src, n_ckpt, T);
    struct ggml_tensor *sc_cur = ggml_sum_rows(c, ggml_mul(c, ggml_rms_norm(c, cur, eps), score_w)); /* [1, T] */
    struct ggml_tensor *probs = ggml_soft_max(c, ggml_concat(c, sc_src, sc_cur, 0));                 /* [n+1, T] */
    struct ggml_tensor *p_src = ggml_cont(c, ggml_view_2d(c, probs, n_ckpt, T, probs->nb[1], 0));
    struct ggml_tensor *p_cur = ggml_cont(c, ggml_view_2d(c, probs, 1, T, probs->nb[1], probs->nb[0] * n_ckpt));
    struct ggml_tensor *mixed = ggml_dsv4_hc_pre(c, g->stack, p_src); /* [n_embd, T]: the bank weighted by p_src */
    /* A device without a kernel for it (Vulkan at the pinned commit) would send it to the CPU: two graph splits
     * and two copies per ResMix, four a layer. The same sum in plain ops stays on the device instead: the bank
     * times the weights (broadcast over the embedding), the checkpoints brought to the rows and summed. Not
     * the op's bits (its sum runs in another order), which a device's kernels do not give anyway. */
    const int d = k3_dev_of(g->hp, g->a + (uint32_t)g->rel);
    if (d >= 0 && !ggml_backend_dev_supports_op(ggml_backend_buft_get_device(g->hp->dev_buft[d]), mixed)) {
        struct ggml_tensor *prod = ggml_mul(c, g->stack, ggml_reshape_3d(c, p_src, 1, n_ckpt, T));
        struct ggml_tensor *rows = ggml_sum_rows(c, ggml_cont(c, ggml_permute(c, prod, 1, 0, 2, 3))); /* [1, n_embd, T] */
        mixed = ggml_reshape_2d(c, rows, g->stack->ne[0], T);
    }
    return ggml_add(c, mixed, ggml_mul(c, cur, p_cur));
}

static void k3_res_push(k3_graph *g, struct ggml_tensor *h) {
    struct ggml_tensor *ck = ggml_reshape_3d(g->ctx, h, h->ne[0], 1, g->T);
    g->stack = g->stack ? ggml_concat(g->ctx, g->stack, ck, 1) : ck;
}

/* ---- KDA: short conv and gated delta rule ------------------------------------------------------ */

/* KDA short conv of one of q/k/v over a group: the windows of all its sequences at once, like k3_conv. */
static struct ggml_tensor *k3_conv_group(k3_graph *g, const k3_group *gr, int il_rel, int which,
                                         struct ggml_tensor *proj, struct ggml_tensor *conv_w) {
    struct ggml_context *c = g->ctx;
    struct ggml_tensor *pool = gr->pool->conv[il_rel]; /* {Kc-1, Di, 3, n_slots} */
    const int64_t kc1 = pool->ne[0], di = pool->ne[1], n = gr->n, m = gr->m;
    /* This window (q, k or v) of every slot as a row of (Kc-1)*Di floats. */
    struct ggml_tensor *rows = ggml_view_2d(c, pool, kc1 * di, pool->ne[3], pool->nb[3], (size_t)which * pool->nb[2]);
    struct ggml_tensor *wr = k3_gather(g, gr, rows);
    struct ggml_tensor *win = ggml_view_3d(c, wr, kc1, di, m, pool->nb[1], wr->nb[1], 0);          /* [Kc-1, Di, m] */
    struct ggml_tensor *x = ggml_view_3d(c, proj, di, n, m, proj->nb[1], proj->nb[1] * n, proj->nb[1] * gr->off);
    struct ggml_tensor *cx = ggml_concat(c, win, ggml_permute(c, x, 1, 0, 2, 3), 0);        /* [Kc-1+n, Di, m] */
    /* The new windows are the last Kc-1 inputs of each sequence. */
    struct ggml_tensor *nw = ggml_cont(c, ggml_view_3d(c, cx, kc1, di, m, cx->nb[1], cx->nb[2], n * cx->nb[0]));
    k3_scatter(g, gr, rows, ggml_reshape_2d(c, nw, kc1 * di, m));
    struct ggml_tensor *y = ggml_ssm_conv(c, cx, ggml_reshape_2d(c, conv_w, kc1 + 1, di)); /* [Di, n, m] */
    return ggml_silu(c, ggml_reshape_2d(c, y, di, n * m));
}

/* KDA short conv and delta rule of a group; returns the attention output [Dk*H, m*n]. */
static struct ggml_tensor *k3_kda_group(k3_graph *g, const k3_layer_w *L, int il_rel, const k3_group *gr,
                                        struct ggml_tensor *pq, struct ggml_tensor *pk, struct ggml_tensor *pv,
                                        struct ggml_tensor *gt, struct ggml_tensor *beta) {
    struct ggml_context *c = g->ctx;
    const k3_hparams *hp = g->hp;
    const int64_t H = hp->n_head, Dk = hp->kda_head_dim, n = gr->n, m = gr->m;
    struct ggml_tensor *q = k3_conv_group(g, gr, il_rel, 0, pq, L->conv_q);
    struct ggml_tensor *k = k3_conv_group(g, gr, il_rel, 1, pk, L->conv_k);
    struct ggml_tensor *v = k3_conv_group(g, gr, il_rel, 2, pv, L->conv_v);
    q = ggml_l2_norm(c, ggml_reshape_4d(c, q, Dk, H, n, m), hp->rms_eps);
    k = ggml_l2_norm(c, ggml_reshape_4d(c, k, Dk, H, n, m), hp->rms_eps);
    v = ggml_reshape_4d(c, v, Dk, H, n, m);
    struct ggml_tensor *gs = ggml_view_4d(c, gt, Dk, H, n, m, gt->nb[1], gt->nb[2], gt->nb[2] * n, gt->nb[2] * gr->off);
    struct ggml_tensor *bs = ggml_view_4d(c, beta, 1, H, n, m, beta->nb[1], beta->nb[2], beta->nb[2] * n,
                                          beta->nb[2] * gr->off);
    struct ggml_tensor *pool = gr->pool->delta[il_rel]; /* {Dk, Dk, H, n_slots} */
    struct ggml_tensor *rows = ggml_view_2d(c, pool, Dk * Dk * H, pool->ne[3], pool->nb[3], 0);
    struct ggml_tensor *s0 = k3_gather(g, gr, rows);          /* contiguous either way: slots are whole rows */
    struct ggml_tensor *o = ggml_gated_delta_net(c, q, k, v, gs, bs, ggml_reshape_4d(c, s0, Dk, Dk, H, m), 1);
    /* Packed output: m*n rows of attention [Dk*H] (sequence after sequence), then the m final states. */
    k3_scatter(g, gr, rows,
               ggml_view_2d(c, o, Dk * Dk * H, m, (size_t)(Dk * Dk * H) * sizeof(float), o->nb[1] * (size_t)(n * m)));
    return ggml_view_2d(c, o, Dk * H, n * m, o->nb[1], 0);
}

/* KDA short conv for one of q/k/v (which = 0/1/2) of one sequence; updates that window of its state. */
static struct ggml_tensor *k3_conv(k3_graph *g, const k3_seq_view *sv, int il_rel, int which,
                                   struct ggml_tensor *proj, struct ggml_tensor *conv_w) {
    struct ggml_context *c = g->ctx;
    struct ggml_tensor *st = sv->st->conv[il_rel]; /* {Kc-1, Di, 3} */
    const int64_t kc1 = st->ne[0], di = st->ne[1], n = sv->n;
    struct ggml_tensor *win = ggml_view_2d(c, st, kc1, di, st->nb[1], (size_t)which * st->nb[2]);
    struct ggml_tensor *x = k3_cols(g, proj, sv->off, sv->n);                 /* [Di, n] */
    struct ggml_tensor *cx = ggml_concat(c, win, ggml_transpose(c, x), 0);   /* [Kc-1+n, Di] */
    if (sv->keep_rb) {
        k3_readback_add(g, cx, 0, ggml_nbytes(cx),
                        (char *)sv->st->rb[sv->st->rb_next].conv[il_rel] + (size_t)which * ggml_nbytes(cx));
    }
    /* The new window is the last Kc-1 inputs. */
    ggml_build_forward_expand(g->gf, ggml_cpy(c, ggml_view_2d(c, cx, kc1, di, cx->nb[1], n * cx->nb[0]), win));
    struct ggml_tensor *y = ggml_ssm_conv(c, ggml_reshape_3d(c, cx, kc1 + n, di, 1),
                                          ggml_reshape_2d(c, conv_w, kc1 + 1, di)); /* [Di, n, 1] */
    return ggml_silu(c, ggml_reshape_2d(c, y, di, n));
}

static struct ggml_tensor *k3_kda(k3_graph *g, const k3_layer_w *L, int il_rel, struct ggml_tensor *xn) {
    struct ggml_context *c = g->ctx;
    const k3_hparams *hp = g->hp;
    const int64_t H = hp->n_head, Dk = hp->kda_head_dim, T = g->T;
    struct ggml_tensor *pq = k3_mm(g, L->wq, xn), *pk = k3_mm(g, L->wk, xn),
                       *pv = k3_mm(g, L->wv, xn);

    /* Decay gate: lb * sigmoid(-(f * A)) with the bound, softplus(f) * A without (docs/k3-spec.md §5.3). */
    struct ggml_tensor *gt = ggml_add(c, k3_mm(g, L->f_b, k3_mm(g, L->f_a, xn)), L->dt_b);
    struct ggml_tensor *A = ggml_reshape_3d(c, L->ssm_a, 1, H, 1);
    if (isfinite(hp->kda_gate_lb)) {
        gt = ggml_mul(c, ggml_reshape_3d(c, gt, Dk, H, T), A);
        gt = ggml_scale(c, ggml_sigmoid(c, ggml_scale(c, gt, -1.0f)), hp->kda_gate_lb);
    } else {
        gt = ggml_mul(c, ggml_reshape_3d(c, ggml_softplus(c, gt), Dk, H, T), A);
    }
    struct ggml_tensor *beta = ggml_sigmoid(c, ggml_reshape_3d(c, k3_mm(g, L->beta, xn), 1, H, T));

    struct ggml_tensor **outs = g->outs;
    for (int gi = 0; gi < g->n_groups; gi++) {
        const k3_group *gr = &g->groups[gi];
        if (gr->m > 1) {
            outs[gi] = k3_kda_group(g, L, il_rel, gr, pq, pk, pv, gt, beta);
            continue;
        }
        const k3_seq_view *sv = &g->seqs[gr->first];
        const int64_t n = sv->n;
        struct ggml_tensor *q = k3_conv(g, sv, il_rel, 0, pq, L->conv_q);
        struct ggml_tensor *k = k3_conv(g, sv, il_rel, 1, pk, L->conv_k);
        struct ggml_tensor *v = k3_conv(g, sv, il_rel, 2, pv, L->conv_v);
        q = ggml_l2_norm(c, ggml_reshape_4d(c, q, Dk, H, n, 1), hp->rms_eps);
        k = ggml_l2_norm(c, ggml_reshape_4d(c, k, Dk, H, n, 1), hp->rms_eps);
        v = ggml_reshape_4d(c, v, Dk, H, n, 1);
        struct ggml_tensor *gs = ggml_view_4d(c, gt, Dk, H, n, 1, gt->nb[1], gt->nb[2], gt->nb[2] * n,
                                              gt->nb[2] * sv->off);
        struct ggml_tensor *bs = ggml_view_4d(c, beta, 1, H, n, 1, beta->nb[1], beta->nb[2], beta->nb[2] * n,
                                              beta->nb[2] * sv->off);
        struct ggml_tensor *state = sv->st->delta[il_rel]; /* {Dk, Dk, H} */
        struct ggml_tensor *s4 = ggml_reshape_4d(c, state, Dk, Dk, H, 1);
        /* With rollback, the op also writes the state after each of the n tokens (slot s = s tokens back). */
        struct ggml_tensor *o = ggml_gated_delta_net(c, q, k, v, gs, bs, s4, sv->keep_rb ? n : 1);
        if (sv->keep_rb) {
            k3_readback_add(g, o, o->nb[1] * (size_t)n, (size_t)n * (size_t)(Dk * Dk * H) * sizeof(float),
                            sv->st->rb[sv->st->rb_next].delta[il_rel]);
        }
        /* Packed output: n rows of attention [Dk*H], then the final state [Dk*Dk*H]. */
        ggml_build_forward_expand(g->gf, ggml_cpy(c, ggml_view_1d(c, o, Dk * Dk * H, o->nb[1] * n),
                                                  ggml_view_1d(c, state, Dk * Dk * H, 0)));
        outs[gi] = ggml_view_2d(c, o, Dk * H, n, o->nb[1], 0);
    }
    struct ggml_tensor *o = g->n_groups == 1 ? ggml_cont(c, outs[0]) : k3_join(g, outs);

    /* Per-head output norm, full-rank sigmoid gate, output projection. */
    struct ggml_tensor *gate = ggml_reshape_3d(c, k3_mm(g, L->ssm_g, xn), Dk, H, T);
    struct ggml_tensor *normed = k3_norm(g, ggml_reshape_3d(c, o, Dk, H, T), L->ssm_norm);
    struct ggml_tensor *gated = ggml_mul(c, normed, ggml_sigmoid(c, gate));
    return k3_mm(g, L->wo, ggml_cont_2d(c, gated, Dk * H, T));
}

/* ---- MLA: attention over the latent cache ------------------------------------------------------ */

/* The attention values of a sequence (or group): the latent part of the cache rows it has written, vr
 * [rkv, used, m], transposed to [n_kv, rkv, m] for the kq-weighted sum. Rows from used to n_kv are masked
 * (their kq weights are exact zeros), so they are zero-filled rather than copied: the transposing copy is
 * the costliest op of decode attention, and a sequence has usually written far fewer rows than the
 * 256-row padding it reads. Every product the sum sees is the same (0 * stale = 0 * 0), so are the bits. */
static void k3_v_t_op(struct ggml_tensor *dst, int ith, int nth, void *userdata) {
    (void)userdata;
    const struct ggml_tensor *src = dst->src[0];
    const int64_t rkv = src->ne[0], used = src->ne[1], n_kv = dst->ne[0], m = dst->ne[2];
    enum { RB = 16 }; /* dst rows per block: one 64-byte line of each src row, RB dst lines kept hot */
    const int64_t n_blocks = (rkv + RB - 1) / RB;
    float *d = dst->data;
    for (int64_t job = ith; job < m * n_blocks; job += nth) {
        const int64_t sq = job / n_blocks, r0 = (job % n_blocks) * RB, r1 = r0 + RB < rkv ? r0 + RB : rkv;
        float *out = d + (size_t)(sq * rkv) * (size_t)n_kv;
        for (int64_t t = 0; t < used; t++) {
            const float *in = (const float *)((const char *)src->data + t * src->nb[1] + sq * src->nb[2]);
            for (int64_t r = r0; r < r1; r++) out[r * n_kv + t] = in[r];
        }
        for (int64_t r = r0; r < r1; r++) memset(out + r * n_kv + used, 0, (size_t)(n_kv - used) * sizeof(float));
    }
}

static struct ggml_tensor *k3_v_t(k3_graph *g, struct ggml_tensor *vr, int64_t n_kv) {
    /* ggml_pad of the transposed view did this element by element with four index checks each, a tenth of
     * a 16-stream serve step; this op copies it in blocks (same values, so the same bits). */
    struct ggml_tensor *args[1] = {vr};
    return ggml_custom_4d(g->ctx, GGML_TYPE_F32, n_kv, vr->ne[0], vr->ne[2], 1, args, 1, k3_v_t_op, GGML_N_TASKS_MAX,
                          NULL);
}

/* Flash attention over the latent cache, as llama.cpp builds it for MLA with -fa on (build_attn_mha): K is
 * the cache rows [dk, n_kv, 1, m] (f16; an f32 K is cast, as llama.cpp casts it), V the first rkv columns
 * of the same rows, the mask f16. The result [rkv, H, n, m] goes back from the latent per head through
 * attn_v_b with n in dimension 1, then to [dv*H, n*m]. */
static struct ggml_tensor *k3_fa(k3_graph *g, const k3_layer_w *L, struct ggml_tensor *q, struct ggml_tensor *k,
                                 struct ggml_tensor *v, struct ggml_tensor *mask, int64_t n_out) {
    struct ggml_context *c = g->ctx;
    const k3_hparams *hp = g->hp;
    const int64_t H = hp->n_head, dv = hp->mla_v_dim, n = q->ne[1];
    if (k->type == GGML_TYPE_F32) k = ggml_cast(c, k, GGML_TYPE_F16);
    if (v->type == GGML_TYPE_F32) v = ggml_cast(c, v, GGML_TYPE_F16);
    /* A split-invariant piece shorter than ggml's query tile gets zero query rows up to it (the mask has as
     * many rows), so that ggml takes the tiled kernel a longer piece takes: the real rows come out as they
     * would in any longer piece, the padding rows are dropped. */
    if (mask && mask->ne[1] > n && q->ne[3] == 1) q = ggml_pad(c, q, 0, (int)(mask->ne[1] - n), 0, 0);
    struct ggml_tensor *o = ggml_flash_attn_ext(c, q, k, v, mask, 1.0f / sqrtf((float)hp->mla_k_dim), 0.0f, 0.0f);
    ggml_flash_attn_ext_set_prec(o, GGML_PREC_F32);
    if (o->ne[2] > n) o = ggml_view_3d(c, o, o->ne[0], o->ne[1], n, o->nb[1], o->nb[2], 0); /* [rkv, H, n] */
    o = k3_mm(g, L->v_b, ggml_permute(c, o, 0, 2, 1, 3)); /* [dv, n, H, m] */
    return ggml_reshape_2d(c, ggml_cont(c, ggml_permute(c, o, 0, 2, 1, 3)), dv * H, n_out);
}

/* The values for the kq-weighted sum, [n_kv, rkv, m]: from an f32 cache by k3_v_t; from an f16 one, as
 * llama.cpp takes them, a transposing copy of the n_kv rows it reads (stale rows are finite and weighted
 * by exact zeros). */
static struct ggml_tensor *k3_values(k3_graph *g, struct ggml_tensor *base, size_t nb1, size_t nb2, int64_t m,
                                     int64_t used, int64_t n_kv) {
    struct ggml_context *c = g->ctx;
    const int64_t rkv = g->hp->kv_lora_rank;
    /* k3_v_t is a CPU op: a layer on a device takes the transposing copy (same values, stale rows weighted
     * by exact zeros), which every backend runs. */
    if (base->type == GGML_TYPE_F32 && !k3_on_dev(g->hp, g->a + (uint32_t)g->rel)) {
        return k3_v_t(g, ggml_view_3d(c, base, rkv, used, m, nb1, nb2, 0), n_kv);
    }
    return ggml_cont(c, ggml_transpose(c, ggml_view_3d(c, base, rkv, n_kv, m, nb1, nb2, 0)));
}

/* Flash attention of one sequence's n tokens. With step kernels each token gets its own op over the cache
 * rows a single step at its position reads (n_kv of position + 1, padded) and its own row of the mask:
 * ggml's CPU kernel takes another path for one query than for several (and for one query over 512 or
 * more rows splits the rows by thread), so only this gives a verified block the bits of single steps. */
static struct ggml_tensor *k3_fa_seq(k3_graph *g, const k3_layer_w *L, const k3_seq_view *sv, struct ggml_tensor *cache,
                                     struct ggml_tensor *q) {
    struct ggml_context *c = g->ctx;
    const int64_t rkv = g->hp->kv_lora_rank, dk = rkv + g->hp->rope_dim, n = sv->n;
    if (!g->step_kernels || n == 1) {
        struct ggml_tensor *k = ggml_view_2d(c, cache, dk, sv->n_kv, cache->nb[1], 0);
        struct ggml_tensor *v = ggml_view_2d(c, cache, rkv, sv->n_kv, cache->nb[1], 0);
        return k3_fa(g, L, q, k, v, sv->mask, n);
    }
    struct ggml_tensor *r = NULL;
    for (int64_t t = 0; t < n; t++) {
        uint32_t used = sv->st->n_past + (uint32_t)t + 1, pad = (used + 255u) / 256u * 256u;
        const int64_t n_kv = pad < sv->st->n_ctx ? pad : sv->st->n_ctx;
        struct ggml_tensor *k = ggml_view_2d(c, cache, dk, n_kv, cache->nb[1], 0);
        struct ggml_tensor *v = ggml_view_2d(c, cache, rkv, n_kv, cache->nb[1], 0);
        struct ggml_tensor *mt = ggml_view_2d(c, sv->mask, n_kv, 1, sv->mask->nb[1], (size_t)t * sv->mask->nb[1]);
        struct ggml_tensor *qt = ggml_view_3d(c, q, q->ne[0], 1, q->ne[2], q->nb[1], q->nb[2], (size_t)t * q->nb[1]);
        struct ggml_tensor *o = k3_fa(g, L, qt, k, v, mt, 1);
        r = r ? ggml_concat(c, r, o, 1) : o;
    }
    return r;
}

/* MLA attention of a group, like the per-sequence graph in k3_mla but with the sequences as the 4th axis.
 * knew: this batch's keys [dk, T]; Q: absorbed queries [dk, H, T]. Returns [dv*H, m*n]. */
static struct ggml_tensor *k3_mla_group(k3_graph *g, const k3_layer_w *L, int il_rel, const k3_group *gr,
                                        struct ggml_tensor *knew, struct ggml_tensor *Q) {
    struct ggml_context *c = g->ctx;
    const k3_hparams *hp = g->hp;
    const int64_t H = hp->n_head, rkv = hp->kv_lora_rank, dk = rkv + hp->rope_dim, dv = hp->mla_v_dim;
    const int64_t n = gr->n, m = gr->m, n_kv = gr->n_kv;
    const float kq_scale = 1.0f / sqrtf((float)hp->mla_k_dim);
    struct ggml_tensor *pool = gr->pool->kcache[il_rel]; /* {dk, n_ctx, n_slots} */
    /* Store the group's keys first (one row per token, at slot * n_ctx + position); reads come later. */
    struct ggml_tensor *all_rows = ggml_reshape_2d(c, pool, dk, pool->ne[1] * pool->ne[2]);
    struct ggml_tensor *kn = k3_cols(g, knew, gr->off, (uint32_t)(m * n));
    ggml_build_forward_expand(g->gf, ggml_set_rows(c, all_rows, kn, gr->krows));
    /* Each slot's first n_kv cache rows as one row of the pool. Gathered rows come out of get_rows as f32;
     * an f16 cache's are cast back (exactly), so that the group computes what each sequence alone does. */
    struct ggml_tensor *kg = k3_gather(g, gr, ggml_view_2d(c, pool, dk * n_kv, pool->ne[2], pool->nb[2], 0));
    if (kg->type != pool->type) kg = ggml_cast(c, kg, pool->type);
    const size_t row = ggml_row_size(kg->type, dk);
    struct ggml_tensor *k = ggml_view_4d(c, kg, dk, n_kv, 1, m, row, kg->nb[1], kg->nb[1], 0); /* [dk,n_kv,1,m] */
    struct ggml_tensor *qg = ggml_view_4d(c, Q, dk, H, n, m, Q->nb[1], Q->nb[2], Q->nb[2] * n, Q->nb[2] * gr->off);
    struct ggml_tensor *q = ggml_permute(c, qg, 0, 2, 1, 3);                                     /* [dk, n, H, m] */
    if (g->flash_attn) {
        struct ggml_tensor *vf = ggml_view_4d(c, kg, rkv, n_kv, 1, m, row, kg->nb[1], kg->nb[1], 0);
        return k3_fa(g, L, q, k, vf, gr->mask, n * m);
    }
    struct ggml_tensor *kq = k3_mm_prec(g, k, q, true);                                          /* [n_kv, n, H, m] */
    kq = ggml_soft_max_ext(c, kq, gr->mask, kq_scale, 0.0f);
    struct ggml_tensor *v = ggml_reshape_4d(c, k3_values(g, kg, row, kg->nb[1], m, gr->n_used, n_kv), n_kv, rkv, 1, m);
    struct ggml_tensor *kqv = k3_mm(g, v, kq);                                            /* [rkv, n, H, m] */
    kqv = k3_mm(g, L->v_b, kqv);                                                          /* [dv, n, H, m] */
    return ggml_cont_2d(c, ggml_permute(c, kqv, 0, 2, 1, 3), dv * H, n * m);
}

static struct ggml_tensor *k3_mla(k3_graph *g, const k3_layer_w *L, int il_rel, struct ggml_tensor *xn) {
    struct ggml_context *c = g->ctx;
    const k3_hparams *hp = g->hp;
    const int64_t H = hp->n_head, T = g->T, rkv = hp->kv_lora_rank, dr = hp->rope_dim, dq = hp->mla_k_dim,
                  dn = dq - dr, dv = hp->mla_v_dim, dk = rkv + dr;
    const float kq_scale = 1.0f / sqrtf((float)dq);

    struct ggml_tensor *qf = L->q_a ? k3_mm(g, L->q_b, k3_norm(g, k3_mm(g, L->q_a, xn), L->q_a_norm))
                                    : k3_mm(g, L->q, xn); /* [H*dq, T] */
    struct ggml_tensor *kv = k3_mm(g, L->kv_a, xn);       /* [rkv+dr, T] */
    struct ggml_tensor *ckv = k3_norm(g, ggml_view_2d(c, kv, rkv, T, kv->nb[1], 0), L->kv_a_norm);
    struct ggml_tensor *k_pe = ggml_view_2d(c, kv, dr, T, kv->nb[1], (size_t)rkv * kv->nb[0]); /* raw, unrotated */
    struct ggml_tensor *knew = ggml_concat(c, ckv, k_pe, 0);                                    /* [rkv+dr, T] */

    /* Absorbed query: q_nope through attn_k_b into the latent space, then [latent | pe]. */
    struct ggml_tensor *q_nope = ggml_view_3d(c, qf, dn, H, T, qf->nb[0] * dq, qf->nb[0] * dq * H, 0);
    struct ggml_tensor *q_pe = ggml_view_3d(c, qf, dr, H, T, qf->nb[0] * dq, qf->nb[0] * dq * H, qf->nb[0] * dn);
    struct ggml_tensor *qa = k3_mm(g, L->k_b, ggml_permute(c, q_nope, 0, 2, 1, 3)); /* [rkv, T, H] */
    struct ggml_tensor *Q = ggml_concat(c, ggml_permute(c, qa, 0, 2, 1, 3), q_pe, 0);      /* [dk, H, T] */

    struct ggml_tensor **outs = g->outs;
    for (int gi = 0; gi < g->n_groups; gi++) {
        const k3_group *gr = &g->groups[gi];
        if (gr->m > 1) {
            outs[gi] = k3_mla_group(g, L, il_rel, gr, knew, Q);
            continue;
        }
        const k3_seq_view *sv = &g->seqs[gr->first];
        struct ggml_tensor *cache = sv->st->kcache[il_rel]; /* {dk, n_ctx} */
        const int64_t n = sv->n, n_kv = sv->n_kv;
        /* Store this batch's keys first; the reads below come later in graph order. */
        ggml_build_forward_expand(g->gf, ggml_set_rows(c, cache, k3_cols(g, knew, sv->off, sv->n), sv->kpos));
        struct ggml_tensor *q = ggml_permute(c, ggml_view_3d(c, Q, dk, H, n, Q->nb[1], Q->nb[2], Q->nb[2] * sv->off),
                                             0, 2, 1, 3);                                   /* [dk, n, H] */
        struct ggml_tensor *k = ggml_view_2d(c, cache, dk, n_kv, cache->nb[1], 0);         /* [dk, n_kv] */
        if (g->flash_attn) {
            outs[gi] = k3_fa_seq(g, L, sv, cache, q);
            continue;
        }
        struct ggml_tensor *kq = k3_mm_prec(g, k, q, true);                                 /* [n_kv, n, H] */
        kq = ggml_soft_max_ext(c, kq, sv->mask, kq_scale, 0.0f);
        struct ggml_tensor *v = k3_values(g, cache, cache->nb[1], ggml_nbytes(cache), 1, sv->st->n_past + n, n_kv);
        struct ggml_tensor *kqv = k3_mm(g, v, kq);   /* [rkv, n, H] */
        kqv = k3_mm(g, L->v_b, kqv);                 /* [dv, n, H]: back from the latent, per head */
        outs[gi] = ggml_cont_2d(c, ggml_permute(c, kqv, 0, 2, 1, 3), dv * H, n);
    }
    struct ggml_tensor *o = k3_join(g, outs);
    if (L->gate) o = ggml_mul(c, o, ggml_sigmoid(c, k3_mm(g, L->gate, xn)));
    return k3_mm(g, L->wo, o);
}

/* ---- FFN: dense and MoE ------------------------------------------------------------------------ */

/* Dense FFN (the leading layers): down(SiTU(gate x, up x)). */
static struct ggml_tensor *k3_ffn(k3_graph *g, const k3_layer_w *L, struct ggml_tensor *xn) {
    return k3_mm(g, L->ffn_down, k3_situ(g, k3_mm(g, L->ffn_gate, xn), k3_mm(g, L->ffn_up, xn)));
}

static struct ggml_tensor *k3_moe(k3_graph *g, const k3_layer_w *L, struct ggml_tensor *xn) {
    struct ggml_context *c = g->ctx;
    const k3_hparams *hp = g->hp;
    const int64_t E = hp->n_expert, K = hp->n_expert_used, T = g->T;

    /* Routing on the full-width input: sigmoid probabilities; the bias only chooses (docs/k3-spec.md §5.5). */
    struct ggml_tensor *probs = ggml_sigmoid(c, k3_mm(g, L->gate_inp, xn)); /* [E, T] */
    struct ggml_tensor *sel = ggml_argsort_top_k(c, ggml_add(c, probs, L->probs_b), (int)K); /* [K, T] */
    struct ggml_tensor *w = ggml_get_rows(c, ggml_reshape_3d(c, probs, 1, E, T), sel);      /* [1, K, T] */
    if (hp->expert_weights_norm) {
        struct ggml_tensor *w2 = ggml_reshape_2d(c, w, K, T);
        struct ggml_tensor *sum = ggml_clamp(c, ggml_sum_rows(c, w2), 6.103515625e-5f, INFINITY);
        w = ggml_reshape_3d(c, ggml_div(c, w2, sum), 1, K, T);
    }
    if (hp->expert_weights_scale != 0.0f && hp->expert_weights_scale != 1.0f) {
        w = ggml_scale(c, w, hp->expert_weights_scale);
    }
    ggml_build_forward_expand(g->gf, w);

    struct ggml_tensor *xl = L->routed_down ? k3_mm(g, L->routed_down, xn) : xn;
    const int64_t dl = xl->ne[0];
    xl = ggml_reshape_3d(c, xl, dl, 1, T);
    struct ggml_tensor *ex;
    if (g->xc && xc_max_passes(g->xc, g->a + (uint32_t)g->rel, 1) > 0) { /* experts in RAM, through the cache */
        ex = k3_moe_cached(g, xn, sel, xl);
    } else {
        struct ggml_tensor *up = ggml_mul_mat_id(c, L->up_exps, xl, sel);     /* [Fe, K, T] */
        struct ggml_tensor *gate = ggml_mul_mat_id(c, L->gate_exps, xl, sel); /* [Fe, K, T] */
        ex = ggml_mul_mat_id(c, L->down_exps, k3_situ(g, gate, up), sel);     /* [dl, K, T] */
    }
    if (g->route) {
        /* ||r_e|| per chosen expert: a sum of squares in ggml's double-accumulated row sum, then sqrt. The
         * outputs are read after the compute; nothing downstream changes, so the logits stay the same. */
        struct ggml_tensor *nrm = ggml_sqrt(c, ggml_sum_rows(c, ggml_sqr(c, ex))); /* [1, K, T] */
        struct ggml_tensor *outs[3] = {sel, w, nrm};
        for (int i = 0; i < 3; i++) {
            /* A view's memory is its source's: read back a copy (the top-k ids are a view of the argsort). */
            if (outs[i]->view_src) outs[i] = ggml_cont(c, outs[i]);
            ggml_set_output(outs[i]);
            ggml_build_forward_expand(g->gf, outs[i]);
            g->route[g->rel][i] = outs[i];
        }
    }
    ex = ggml_mul(c, ex, w);
    ggml_build_forward_expand(g->gf, ex);
    /* Sum in top-k order: ((e0 + e1) + e2) + ... as llama.cpp does. */
    struct ggml_tensor *m = ggml_view_2d(c, ex, dl, T, ex->nb[2], 0);
    for (int64_t i = 1; i < K; i++) m = ggml_add(c, m, ggml_view_2d(c, ex, dl, T, ex->nb[2], (size_t)i * ex->nb[1]));
    if (K == 1) m = ggml_cont(c, m);
    if (L->routed_norm) m = k3_norm(g, m, L->routed_norm);
    if (L->routed_up) m = k3_mm(g, L->routed_up, m);
    if (L->gate_sh) {
        struct ggml_tensor *sh = k3_situ(g, k3_mm(g, L->gate_sh, xn), k3_mm(g, L->up_sh, xn));
        m = ggml_add(c, m, k3_mm(g, L->down_sh, sh));
    }
    return m;
}
