/* k3_forward.c - the K3 graph for a layer range, read top to bottom like spec §5.1.
 *
 * The op sequence mirrors llama.cpp's kimi-k3 graph (same ggml ops in the same order), so the two agree to
 * rounding. Projections, routing and experts run batched over every token of every sequence; the causal
 * parts (KDA short conv and delta rule, MLA attention) run per sequence on views of the batch, each on its
 * own state, except that neighbouring sequences of equal length whose states share a pool (a server's
 * decode step) run them once over all of them, the sequences stacked on the outermost axis (k3_group). */
#include "k3_forward_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

#include "../base/heap.h"
#include "expert_cache.h"

void k3_tap_rows(const float *taps, int n_taps, uint32_t n_embd, size_t total, size_t t0, uint32_t n, float *dst) {
    const size_t d = n_embd, row = (size_t)n_taps * d;
    for (uint32_t t = 0; t < n; t++) {
        for (int k = 0; k < n_taps; k++) memcpy(dst + t * row + (size_t)k * d, taps + ((size_t)k * total + t0 + t) * d, d * sizeof(float));
    }
}

void k3_output_free(k3_output *o) {
    k3_boundary_free(&o->out);
    free(o->logits);
    free(o->taps);
    free(o->routes.ids);
    free(o->routes.weight);
    free(o->routes.norm);
    memset(o, 0, sizeof *o);
}

/* ---- graph building ---------------------------------------------------------------------------- */

/* Attention reads the cache padded to a multiple of 256 rows (at least 256, at most the capacity), the
 * masked rows contributing exact zeros. llama.cpp pads its cache view the same way, so both run matmuls of
 * the same shapes and round the same: on quantized models, where activations are requantized to 8 bits
 * before every matmul, a one-ulp difference from another tiling can otherwise cross a rounding boundary
 * and flip an expert choice (docs/numerics.md). Rows past n_past + n hold zeros or stale finite values. */
static uint32_t k3_n_kv(const k3_state *st, uint32_t n) {
    uint32_t used = st->n_past + n, pad = (used + 255u) / 256u * 256u;
    return pad < st->n_ctx ? pad : st->n_ctx;
}

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

/* Each KDA layer of a sequence keeping rollback copies reads back its three conv windows and its states. */
enum { K3_READBACKS_PER_LAYER = 4 };

static void k3_readback_add(k3_graph *g, struct ggml_tensor *t, size_t offset, size_t size, void *dst) {
    GGML_ASSERT(g->n_rb < g->cap_rb); /* sized by k3_build */
    ggml_set_output(t); /* the allocator must not reuse its memory before we read it */
    g->rb[g->n_rb++] = (k3_readback){t, offset, size, dst};
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

/* ResMix (spec §5.2): softmax over the scores of [checkpoints..., cur] mixes the raw candidates. */
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

/* Columns [off, off+n) of a 2-D [X, T] tensor. */
static struct ggml_tensor *k3_cols(k3_graph *g, struct ggml_tensor *x, uint32_t off, uint32_t n) {
    return ggml_view_2d(g->ctx, x, x->ne[0], n, x->nb[1], off * x->nb[1]);
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

    /* Decay gate: lb * sigmoid(-(f * A)) with the bound, softplus(f) * A without (spec §5.3). */
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
    const int64_t H = hp->n_head, dv = hp->mla_v_dim;
    if (k->type == GGML_TYPE_F32) k = ggml_cast(c, k, GGML_TYPE_F16);
    if (v->type == GGML_TYPE_F32) v = ggml_cast(c, v, GGML_TYPE_F16);
    struct ggml_tensor *o = ggml_flash_attn_ext(c, q, k, v, mask, 1.0f / sqrtf((float)hp->mla_k_dim), 0.0f, 0.0f);
    ggml_flash_attn_ext_set_prec(o, GGML_PREC_F32);
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

static struct ggml_tensor *k3_moe(k3_graph *g, const k3_layer_w *L, struct ggml_tensor *xn) {
    struct ggml_context *c = g->ctx;
    const k3_hparams *hp = g->hp;
    const int64_t E = hp->n_expert, K = hp->n_expert_used, T = g->T;

    /* Routing on the full-width input: sigmoid probabilities; the bias only chooses (spec §5.5). */
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

/* ---- running a batch --------------------------------------------------------------------------- */

static int k3_check_batch(const k3_engine *e, const k3_batch *bt, int64_t *T, rl_err *err) {
    if (bt->n_seqs < 1) return rl_errf(err, "empty batch");
    *T = 0;
    for (int s = 0; s < bt->n_seqs; s++) {
        const k3_state *st = bt->seqs[s];
        if (!st || st->a != e->a || st->b != e->b) return rl_errf(err, "sequence %d: state is for another layer range", s);
        if (bt->n_tokens[s] < 1) return rl_errf(err, "sequence %d: no tokens", s);
        for (uint32_t i = 0; i < st->b - st->a; i++) {
            if (st->kcache[i] && (int)st->kcache[i]->type != e->hp.kv_type) {
                return rl_errf(err, "sequence %d: its cache is %s but this engine computes with an %s cache", s,
                               ggml_type_name(st->kcache[i]->type), ggml_type_name((enum ggml_type)e->hp.kv_type));
            }
            const struct ggml_tensor *t = st->kcache[i] ? st->kcache[i] : st->delta[i];
            if (t && ggml_backend_buffer_is_host(t->buffer) == k3_on_dev(&e->hp, st->a + i)) {
                return rl_errf(err, "sequence %d: its state of layer %u is in %s memory but the layer computes on %s (make "
                                    "states from the engine's hparams)", s, st->a + i,
                               ggml_backend_buffer_is_host(t->buffer) ? "host" : "device",
                               k3_on_dev(&e->hp, st->a + i) ? "the device" : "the CPU");
            }
        }
        if ((uint64_t)st->n_past + bt->n_tokens[s] > st->n_ctx) {
            return rl_errf(err, "sequence %d: %u + %u tokens exceed its context of %u", s, st->n_past,
                           bt->n_tokens[s], st->n_ctx);
        }
        for (int t = 0; t < s; t++) {
            if (bt->seqs[t] == st) return rl_errf(err, "sequence %d appears twice in one batch", s);
        }
        *T += bt->n_tokens[s];
    }
    if (*T > (1 << 20)) return rl_errf(err, "batch of %lld tokens is too large", (long long)*T);
    if (e->a == 0) {
        if (!bt->tokens) return rl_errf(err, "the first stage needs token ids");
        for (int64_t i = 0; i < *T; i++) {
            if (bt->tokens[i] < 0 || (uint32_t)bt->tokens[i] >= e->hp.n_vocab) {
                return rl_errf(err, "token id %d out of range (vocabulary %u)", bt->tokens[i], e->hp.n_vocab);
            }
        }
    } else {
        if (!bt->in) return rl_errf(err, "a middle stage needs the boundary state");
        if (bt->in->n_tokens != *T || bt->in->n_embd != e->hp.n_embd ||
            bt->in->n_ckpt != k3_n_banked_before(&e->hp, e->a)) {
            return rl_errf(err, "boundary state is %u tokens x %u checkpoints, expected %lld x %u", bt->in->n_tokens,
                           bt->in->n_ckpt, (long long)*T, k3_n_banked_before(&e->hp, e->a));
        }
    }
    if (bt->n_taps < 0 || bt->n_taps > 16) return rl_errf(err, "%d taps (at most 16)", bt->n_taps);
    for (int k = 0; k < bt->n_taps; k++) {
        if (bt->tap_layers[k] < e->a || bt->tap_layers[k] > e->b) {
            return rl_errf(err, "tap at layer %u is outside this range [%u, %u]", bt->tap_layers[k], e->a, e->b);
        }
    }
    if (e->b == e->hp.n_layer) {
        if (bt->n_logits < 0 || bt->n_logits > *T) return rl_errf(err, "%d logit rows for %lld tokens", bt->n_logits, (long long)*T);
        for (int i = 0; i < bt->n_logits; i++) {
            if (bt->logit_rows[i] < 0 || bt->logit_rows[i] >= *T) return rl_errf(err, "logit row %d out of range", bt->logit_rows[i]);
        }
    }
    return 0;
}

/* Rows of a causal mask: row t has n columns, the first seen0 + t (<= n: k3_n_kv pads past every position)
 * 0, the rest -inf, in f32 or f16 (FA's type). Both zeros are all-zero bytes; each row's -inf tail is a
 * copy of the row above's (one column shorter), so only the first row is written element by element: at
 * long context the masks are the graph's largest input (n_kv x chunk), written once per chunk. */
static void k3_mask_rows(uint8_t *dst, enum ggml_type type, size_t n, size_t seen0, uint32_t rows) {
    const size_t el = type == GGML_TYPE_F16 ? sizeof(uint16_t) : sizeof(float);
    for (uint32_t t = 0; t < rows; t++) {
        uint8_t *r = dst + (size_t)t * n * el;
        const size_t seen = seen0 + t < n ? seen0 + t : n;
        memset(r, 0, seen * el);
        if (t > 0) {
            memcpy(r + seen * el, r - n * el + seen * el, (n - seen) * el);
        } else if (type == GGML_TYPE_F16) {
            uint16_t *h = (uint16_t *)r;
            for (size_t j = seen; j < n; j++) h[j] = 0xfc00; /* binary16 -inf */
        } else {
            float *f = (float *)r;
            for (size_t j = seen; j < n; j++) f[j] = -INFINITY;
        }
    }
}

/* A group's causal mask: its own with several sequences, else its one sequence's (NULL: no MLA layer). */
static struct ggml_tensor *k3_group_mask(const k3_graph *g, const k3_group *gr) {
    return gr->m > 1 ? gr->mask : g->seqs[gr->first].mask;
}

/* Gives the graph's masks their memory in e->mask_buf (engine header: why not the compute buffer), grown to
 * at least what they need now and, by doubling, toward what the same sequences need at full context. */
static int k3_masks_place(k3_engine *e, k3_graph *g, rl_err *err) {
    const size_t align = ggml_backend_buft_get_alignment(ggml_backend_cpu_buffer_type());
    size_t need = 0, full = 0;
    for (int gi = 0; gi < g->n_groups; gi++) {
        const k3_group *gr = &g->groups[gi];
        const struct ggml_tensor *mt = k3_group_mask(g, gr);
        if (!mt) continue;
        need += GGML_PAD(ggml_nbytes(mt), align);
        full += GGML_PAD((size_t)g->seqs[gr->first].st->n_ctx * (ggml_nbytes(mt) / (size_t)mt->ne[0]), align);
    }
    if (need == 0) return 0;
    if (k3_engine_mask_mem(e, need, full, err) != 0) return -1;
    uint8_t *at = ggml_backend_buffer_get_base(e->mask_buf);
    for (int gi = 0; gi < g->n_groups; gi++) {
        const k3_group *gr = &g->groups[gi];
        struct ggml_tensor *mt = k3_group_mask(g, gr);
        if (!mt) continue;
        if (ggml_backend_tensor_alloc(e->mask_buf, mt, at) != GGML_STATUS_SUCCESS) {
            return rl_errf(err, "cannot place an attention mask");
        }
        at += GGML_PAD(ggml_nbytes(mt), align);
    }
    return 0;
}

/* Reads the routing outputs of every MoE layer of the range into r (k3_routes). */
static int k3_routes_get(const k3_engine *e, const k3_graph *g, k3_routes *r, rl_err *err) {
    const k3_hparams *hp = &e->hp;
    uint32_t first = e->a > hp->n_dense_lead ? e->a : hp->n_dense_lead;
    r->layer0 = first;
    r->n_layers = e->b > first ? e->b - first : 0;
    r->n_tokens = (uint32_t)g->T;
    r->k = hp->n_expert_used;
    const size_t per = (size_t)g->T * r->k, n = per * r->n_layers;
    if (n == 0) return 0;
    r->ids = malloc(n * sizeof *r->ids);
    r->weight = malloc(n * sizeof *r->weight);
    r->norm = malloc(n * sizeof *r->norm);
    if (!r->ids || !r->weight || !r->norm) return rl_errf(err, "out of memory for routing statistics");
    for (uint32_t l = 0; l < r->n_layers; l++) {
        struct ggml_tensor *const *t = g->route[first + l - e->a];
        ggml_backend_tensor_get(t[0], r->ids + l * per, 0, per * sizeof(int32_t));
        ggml_backend_tensor_get(t[1], r->weight + l * per, 0, per * sizeof(float));
        ggml_backend_tensor_get(t[2], r->norm + l * per, 0, per * sizeof(float));
    }
    return 0;
}

/* Plans the scheduler's memory for this graph (its outputs kept apart from what later nodes write). Over
 * two backends ggml's scheduler rewrites the graph's sources to the copies it makes between them when it
 * splits the graph; the sources are put back, so that the same graph can then be allocated and split
 * again (else the second split finds nothing to copy, and a device reads memory nobody wrote). */
static int k3_sched_reserve(struct ggml_backend_sched *sched, struct ggml_cgraph *gf) {
    const int n = ggml_graph_n_nodes(gf);
    struct ggml_tensor **src = malloc((size_t)n * GGML_MAX_SRC * sizeof *src);
    if (!src) return -1;
    for (int i = 0; i < n; i++) memcpy(src + (size_t)i * GGML_MAX_SRC, ggml_graph_node(gf, i)->src, sizeof(struct ggml_tensor *) * GGML_MAX_SRC);
    const bool ok = ggml_backend_sched_reserve(sched, gf);
    for (int i = 0; i < n; i++) memcpy(ggml_graph_node(gf, i)->src, src + (size_t)i * GGML_MAX_SRC, sizeof(struct ggml_tensor *) * GGML_MAX_SRC);
    free(src);
    ggml_backend_sched_reset(sched);
    return ok ? 0 : -1;
}

/* Runs the graph: on the CPU backend at once, or over cached experts through the scheduler, which stops
 * where k3_xc_eval asks (k3_xc_compute). */
static int k3_compute(k3_engine *e, k3_graph *g, rl_err *err) {
    if (!g->xc) {
        enum ggml_status st = e->sched ? ggml_backend_sched_graph_compute(e->sched, g->gf)
                                       : ggml_backend_graph_compute(e->backend, g->gf);
        if (st != GGML_STATUS_SUCCESS) return rl_errf(err, "ggml graph compute failed (status %d)", (int)st);
        return 0;
    }
    return k3_xc_compute(e, g, err);
}

static void k3_graph_free(k3_graph *g) {
    if (g->ctx) ggml_free(g->ctx);
    free(g->seqs);
    free(g->groups);
    free(g->outs);
    free(g->rb);
    free(g->route);
    free(g->stops);
    memset(g, 0, sizeof *g);
}

/* Whether sequence sv joins the group whose first sequence is pv: it runs the same shapes on slots of the
 * same pool, and neither keeps rollback copies. */
static bool k3_joins(const k3_seq_view *pv, const k3_seq_view *sv) {
    return sv->st->pool && pv->st->pool == sv->st->pool && !sv->keep_rb && !pv->keep_rb && pv->n == sv->n &&
           pv->n_kv == sv->n_kv;
}

/* Builds the batch's graph into g (its nodes in e->graph_buf). On error g is freed; no state has moved. */
static int k3_build(k3_engine *e, const k3_batch *bt, int64_t T, k3_graph *g, rl_err *err) {
    const k3_hparams *hp = &e->hp;
    const bool last = e->b == hp->n_layer;
    const int64_t d = hp->n_embd;

    bool any_mla = false;
    int n_kda = 0, n_keep = 0;
    for (uint32_t il = e->a; il < e->b; il++) {
        any_mla |= hp->is_mla[il];
        n_kda += !hp->is_mla[il];
    }
    for (int s = 0; bt->keep_rollback && s < bt->n_seqs; s++) n_keep += bt->keep_rollback[s] != 0;
    *g = (k3_graph){.hp = hp, .n_seqs = bt->n_seqs, .T = T, .step_kernels = bt->step_kernels, .flash_attn = e->flash_attn,
                    .a = e->a, .b = e->b, .w = &e->w, .xc = e->xc, .any_mla = any_mla, .n_taps = bt->n_taps};
    const enum ggml_type mask_type = e->flash_attn ? GGML_TYPE_F16 : GGML_TYPE_F32; /* FA takes an f16 mask */
    g->seqs = calloc((size_t)bt->n_seqs, sizeof *g->seqs);
    g->groups = calloc((size_t)bt->n_seqs, sizeof *g->groups);
    g->outs = calloc((size_t)bt->n_seqs, sizeof *g->outs);
    if (bt->routes) g->route = calloc(e->b - e->a, sizeof *g->route);
    g->cap_rb = n_keep * n_kda * K3_READBACKS_PER_LAYER;
    if (g->cap_rb) g->rb = calloc((size_t)g->cap_rb, sizeof *g->rb);
    const size_t xc_nodes = g->xc ? k3_xc_stops_new(g) : 0;
    if (!g->seqs || !g->groups || !g->outs || (bt->routes && !g->route) || (g->xc && !g->stops) || (g->cap_rb && !g->rb)) {
        rl_errf(err, "out of memory building the graph");
        goto fail;
    }
    uint32_t off = 0;
    for (int s = 0; s < bt->n_seqs; s++) {
        k3_seq_view *sv = &g->seqs[s];
        sv->st = bt->seqs[s];
        sv->id = sv->st->id;
        sv->keep_rb = bt->keep_rollback && bt->keep_rollback[s];
        g->step_kernels |= sv->keep_rb; /* a verified block must give what single steps give */
        if (sv->keep_rb && k3_state_rb_reserve(sv->st, bt->n_tokens[s], err) != 0) goto fail;
        sv->off = off;
        sv->n = bt->n_tokens[s];
        off += sv->n;
        sv->n_kv = k3_n_kv(sv->st, sv->n);
        k3_group *gr = g->n_groups ? &g->groups[g->n_groups - 1] : NULL;
        if (gr && k3_joins(&g->seqs[gr->first], sv)) {
            if (gr->slot0 >= 0 && sv->st->slot != gr->slot0 + gr->m) gr->slot0 = -1;
            gr->m++;
            if (sv->st->n_past + sv->n > gr->n_used) gr->n_used = sv->st->n_past + sv->n;
        } else {
            g->groups[g->n_groups++] = (k3_group){.first = s, .m = 1, .off = sv->off, .n = sv->n, .n_kv = sv->n_kv,
                                                  .n_used = sv->st->n_past + sv->n,
                                                  .slot0 = sv->st->slot, .pool = sv->st->pool,
                                                  .pool_id = sv->st->pool ? sv->st->pool->id : 0};
        }
    }

    size_t n_nodes = 2048 + (size_t)(e->b - e->a) * (256 + 96 * (size_t)g->n_groups) + xc_nodes;
    /* Step kernels give MLA attention a few ops per token (k3_fa_seq): a rebuilt sequence's replay runs
     * hundreds of tokens so. */
    if (g->step_kernels) n_nodes += (size_t)(e->b - e->a) * (size_t)T * 24;
    size_t need = n_nodes * ggml_tensor_overhead() + ggml_graph_overhead_custom(n_nodes, false);
    if (k3_engine_graph_mem(e, need, err) != 0) goto fail;
    struct ggml_init_params ip = {.mem_size = need, .mem_buffer = e->graph_buf, .no_alloc = true};
    g->ctx = ggml_init(ip);
    if (!g->ctx) {
        rl_errf(err, "out of memory building the graph");
        goto fail;
    }
    struct ggml_context *c = g->ctx;
    g->gf = ggml_new_graph_custom(c, n_nodes, false);
    for (int gi = 0; gi < g->n_groups; gi++) {
        k3_group *gr = &g->groups[gi];
        if (gr->m == 1) {
            if (any_mla) {
                k3_seq_view *sv = &g->seqs[gr->first];
                sv->mask = ggml_new_tensor_2d(c, mask_type, sv->n_kv, sv->n);
                ggml_set_input(sv->mask);
                sv->kpos = ggml_new_tensor_1d(c, GGML_TYPE_I64, sv->n);
                ggml_set_input(sv->kpos);
            }
            continue;
        }
        if (gr->slot0 < 0) {
            gr->slots = ggml_new_tensor_1d(c, GGML_TYPE_I32, gr->m);
            ggml_set_input(gr->slots);
        }
        if (any_mla) {
            gr->krows = ggml_new_tensor_1d(c, GGML_TYPE_I32, (int64_t)gr->m * gr->n);
            ggml_set_input(gr->krows);
            gr->mask = ggml_new_tensor_4d(c, mask_type, gr->n_kv, gr->n, 1, gr->m);
            ggml_set_input(gr->mask);
        }
    }

    /* Input: embeddings, or the boundary state from the previous stage. */
    struct ggml_tensor *h;
    if (e->a == 0) {
        g->inp_tok = ggml_new_tensor_1d(c, GGML_TYPE_I32, T);
        ggml_set_input(g->inp_tok);
        h = ggml_get_rows(c, e->w.tok_embd, g->inp_tok);
    } else {
        g->inp_h = ggml_new_tensor_2d(c, GGML_TYPE_F32, d, T);
        ggml_set_input(g->inp_h);
        h = g->inp_h;
        if (bt->in->n_ckpt) {
            g->inp_stack = ggml_new_tensor_3d(c, GGML_TYPE_F32, d, bt->in->n_ckpt, T);
            ggml_set_input(g->inp_stack);
            g->stack = g->inp_stack;
        }
    }

    /* Taps: the stream entering a layer is h at the top of its iteration (or after the last one). */
    for (uint32_t il = e->a; il <= e->b; il++) {
        for (int k = 0; k < bt->n_taps; k++) {
            if (bt->tap_layers[k] != il) continue;
            g->tap_layers[k] = il;
            g->tap_t[k] = h->view_src || !ggml_is_contiguous(h) ? ggml_cont(c, h) : h; /* read back: no view */
            ggml_set_output(g->tap_t[k]);
            ggml_build_forward_expand(g->gf, g->tap_t[k]);
        }
        if (il == e->b) break;
        const k3_layer_w *L = &e->w.layers[il - e->a];
        const int rel = (int)(il - e->a);
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
        struct ggml_tensor *f;
        if (!k3_is_moe(hp, il)) {
            f = k3_mm(g, L->ffn_down, k3_situ(g, k3_mm(g, L->ffn_gate, yn), k3_mm(g, L->ffn_up, yn)));
        } else {
            g->rel = rel;
            f = k3_moe(g, L, yn);
        }
        h = ggml_add(c, h, f);
    }

    if (last) {
        struct ggml_tensor *z = hp->attn_res_block ? k3_res_mix(g, h, e->w.output_res_score) : h;
        if (bt->n_logits > 0) {
            if (bt->n_logits < T) {
                g->inp_rows = ggml_new_tensor_1d(c, GGML_TYPE_I32, bt->n_logits);
                ggml_set_input(g->inp_rows);
                z = ggml_get_rows(c, z, g->inp_rows);
            }
            g->logits = k3_mm(g, e->w.output, k3_norm(g, z, e->w.output_norm));
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
    if (g->xc && k3_stops_locate(g, err) != 0) goto fail;
    return 0;
fail:
    k3_graph_free(g);
    return -1;
}

/* Gives the graph its memory: the masks in e->mask_buf, the rest from galloc's buffer or the scheduler's. */
static int k3_alloc(k3_engine *e, k3_graph *g, rl_err *err) {
    const int64_t T = g->T;
    /* ggml_gallocr_alloc_graph reuses the last plan when the nodes have the same count and fit in it, without
     * looking at which are outputs: a one-token step kept for rollback has the very shapes of a plain one,
     * and under the plain plan the tensors read back after compute (kept states, taps) share memory with
     * later nodes. A different set of outputs gets a plan of its own. */
    if (g->any_mla && k3_masks_place(e, g, err) != 0) return -1;
    uint64_t key = 0xcbf29ce484222325ULL;
    for (int i = 0; i < ggml_graph_n_nodes(g->gf); i++) {
        if (ggml_graph_node(g->gf, i)->flags & GGML_TENSOR_FLAG_OUTPUT) key = (key ^ (uint64_t)i) * 0x100000001b3ULL;
    }
    if (g->xc || e->hp.n_dev > 0) {
        /* Over a device and the CPU, or over cached experts, the scheduler runs the graph (splitting it by
         * where weights and states live; stopping where the host must load experts). */
        const size_t size = (size_t)ggml_graph_n_nodes(g->gf) + (size_t)ggml_graph_size(g->gf);
        if (k3_engine_sched(e, size, err) != 0) return -1;
        ggml_backend_sched_reset(e->sched);
        k3_sched_pin_stops(e, g);
        if (key != e->plan_outputs && k3_sched_reserve(e->sched, g->gf) != 0) {
            return rl_errf(err, "cannot allocate compute memory for %lld tokens", (long long)T);
        }
        k3_sched_pin_stops(e, g); /* the reserve's reset forgot them */
        if (!ggml_backend_sched_alloc_graph(e->sched, g->gf)) {
            return rl_errf(err, "cannot allocate compute memory for %lld tokens", (long long)T);
        }
        e->plan_outputs = key;
        return 0;
    }
    if (key != e->plan_outputs && !ggml_gallocr_reserve(e->galloc, g->gf)) {
        return rl_errf(err, "cannot allocate compute memory for %lld tokens", (long long)T);
    }
    e->plan_outputs = key;
    if (!ggml_gallocr_alloc_graph(e->galloc, g->gf)) {
        return rl_errf(err, "cannot allocate compute memory for %lld tokens", (long long)T);
    }
    /* A new compute buffer (galloc grew it) is touched page by page by the steps that first reach each
     * part of it: ask for huge pages once per buffer (base/heap.h). The last node is an output, which
     * galloc places in its buffer. */
    ggml_backend_buffer_t cb = ggml_graph_node(g->gf, -1)->buffer;
    if (cb && ggml_backend_buffer_is_host(cb) && ggml_backend_buffer_get_base(cb) != e->compute_base) {
        e->compute_base = ggml_backend_buffer_get_base(cb);
        rl_heap_advise_huge(e->compute_base, ggml_backend_buffer_get_size(cb));
    }
    return 0;
}

/* Writes the batch's inputs into the allocated graph: tokens or boundary state, logit rows, slot indices,
 * the causal masks and the cache rows the new keys go to (all that depends on the sequences' positions). */
static int k3_inputs_set(const k3_batch *bt, const k3_graph *g, rl_err *err) {
    if (g->inp_tok) ggml_backend_tensor_set(g->inp_tok, bt->tokens, 0, (size_t)g->T * sizeof(int32_t));
    if (g->inp_h) ggml_backend_tensor_set(g->inp_h, bt->in->h, 0, ggml_nbytes(g->inp_h));
    if (g->inp_stack) ggml_backend_tensor_set(g->inp_stack, bt->in->ckpt, 0, ggml_nbytes(g->inp_stack));
    if (g->inp_rows) ggml_backend_tensor_set(g->inp_rows, bt->logit_rows, 0, (size_t)bt->n_logits * sizeof(int32_t));
    for (int gi = 0; gi < g->n_groups; gi++) {
        const k3_group *gr = &g->groups[gi];
        if (gr->slots) {
            int32_t *ix = malloc((size_t)gr->m * sizeof *ix);
            if (!ix) return rl_errf(err, "out of memory for slot indices");
            for (int i = 0; i < gr->m; i++) ix[i] = g->seqs[gr->first + i].st->slot;
            ggml_backend_tensor_set(gr->slots, ix, 0, (size_t)gr->m * sizeof *ix);
            free(ix);
        }
        if (!g->any_mla) continue;
        /* Causal mask: the token at position p sees cached positions 0..p of its own sequence. Written in
         * place in e->mask_buf (host memory, k3_masks_place): at long context it is the largest input of the
         * graph (n_kv x chunk, 128 MiB for 512 tokens at 128k), and a staging copy, let alone an f32 one
         * converted to f16, would double or triple that. */
        struct ggml_tensor *mt = k3_group_mask(g, gr);
        GGML_ASSERT(ggml_backend_buffer_is_host(mt->buffer));
        const size_t n_kv = gr->n_kv, el = ggml_element_size(mt);
        uint8_t *mk = mt->data;
        for (int i = 0; i < gr->m; i++) {
            const k3_state *st = g->seqs[gr->first + i].st;
            k3_mask_rows(mk + (size_t)i * gr->n * n_kv * el, mt->type, n_kv, (size_t)st->n_past + 1, gr->n);
        }
        if (gr->m == 1) {
            const k3_seq_view *sv = &g->seqs[gr->first];
            int64_t *kp = malloc((size_t)sv->n * sizeof *kp);
            if (!kp) return rl_errf(err, "out of memory for cache row indices");
            for (uint32_t t = 0; t < sv->n; t++) kp[t] = (int64_t)sv->st->n_past + t;
            ggml_backend_tensor_set(sv->kpos, kp, 0, (size_t)sv->n * sizeof *kp);
            free(kp);
            continue;
        }
        /* Key rows: the pool's cache tensor seen as n_slots * n_ctx rows. */
        int32_t *kr = malloc((size_t)gr->m * gr->n * sizeof *kr);
        if (!kr) return rl_errf(err, "out of memory for cache row indices");
        for (int i = 0; i < gr->m; i++) {
            const k3_state *st = g->seqs[gr->first + i].st;
            for (uint32_t t = 0; t < gr->n; t++) {
                kr[(size_t)i * gr->n + t] = (int32_t)((uint32_t)st->slot * gr->pool->n_ctx + st->n_past + t);
            }
        }
        ggml_backend_tensor_set(gr->krows, kr, 0, (size_t)gr->m * gr->n * sizeof *kr);
        free(kr);
    }
    return 0;
}

/* Copies what the batch asked for out of the computed graph into out. */
static int k3_outputs_get(const k3_engine *e, const k3_batch *bt, const k3_graph *g, k3_output *out, rl_err *err) {
    if (g->logits) {
        out->n_logits = bt->n_logits;
        out->logits = malloc(ggml_nbytes(g->logits));
        if (!out->logits) return rl_errf(err, "out of memory for logits");
        ggml_backend_tensor_get(g->logits, out->logits, 0, ggml_nbytes(g->logits));
    }
    if (g->n_taps > 0) {
        size_t row = (size_t)g->T * (size_t)e->hp.n_embd;
        out->taps = malloc((size_t)g->n_taps * row * sizeof(float));
        if (!out->taps) return rl_errf(err, "out of memory for taps");
        for (int k = 0; k < g->n_taps; k++) ggml_backend_tensor_get(g->tap_t[k], out->taps + k * row, 0, row * sizeof(float));
    }
    if (g->route && k3_routes_get(e, g, &out->routes, err) != 0) return -1;
    if (g->out_h) {
        uint32_t n_ckpt = g->out_stack ? (uint32_t)g->out_stack->ne[1] : 0;
        if (k3_boundary_alloc(&out->out, (uint32_t)g->T, (uint32_t)e->hp.n_embd, n_ckpt, err) != 0) return -1;
        ggml_backend_tensor_get(g->out_h, out->out.h, 0, ggml_nbytes(g->out_h));
        if (g->out_stack) ggml_backend_tensor_get(g->out_stack, out->out.ckpt, 0, ggml_nbytes(g->out_stack));
    }
    return 0;
}

/* e->kept: the graph of the last decode step, kept (allocated, in e->graph_buf and galloc's buffer) for the next one:
 * decoding runs the same graph token after token, with only its inputs changed (the tokens, the masks, the
 * cache rows of the new keys, the pool slots of a group), so it is built and allocated once per 256
 * positions (the padding of the cache rows attention reads, k3_n_kv) instead of once per token. llama.cpp
 * reuses its graphs the same way. A step of one token per sequence fits the kept graph when it has the same
 * layout: the same number of sequences, grouped the same way (k3_group: a server's decoding sequences are
 * one group), each reading as many cache rows, the same outputs and taps. A sequence alone in its group
 * (views of its own state tensors are in the graph) must be the same sequence; the sequences of a group may
 * be others of the same pool, since the graph reaches their slots through an input (gathered) or at the
 * same slots (consecutive, slot0). Building and allocating a graph cost 0.3-0.5 ms here, a tenth of a
 * one-token step of a small model. Over a device the scheduler keeps the splits and copies it made for the
 * graph (ggml_backend_sched_graph_compute runs them again while the graph stays allocated, as in llama.cpp);
 * not with an expert cache, whose passes stop the compute at inputs the host writes per step. Any other
 * graph drops it first (the nodes share graph_buf, and the next plan moves every tensor). */
void k3_kept_drop(k3_engine *e) {
    if (!e->kept) return;
    k3_graph_free(e->kept);
    free(e->kept);
    e->kept = NULL;
}

/* Whether a graph for this batch may be kept for the next (see e->kept above): one token per sequence, no
 * rollback copies, routes or expert cache. The values attention reads from an f32 cache without flash
 * attention are a copy of the rows the sequences have written (k3_v_t), whose count is in the graph; that
 * path rebuilds every step. */
static bool k3_keepable(const k3_engine *e, const k3_batch *bt) {
    if (bt->routes || e->xc || !(e->flash_attn || e->hp.kv_type != GGML_TYPE_F32)) return false;
    for (int s = 0; s < bt->n_seqs; s++) {
        const k3_state *st = bt->seqs[s];
        if (bt->n_tokens[s] != 1 || (bt->keep_rollback && bt->keep_rollback[s]) || st->id == 0 || (st->pool && st->pool->id == 0)) {
            return false;
        }
    }
    return true;
}

/* Whether the kept graph runs this batch: the batch's sequences, grouped as k3_build would group them, fall
 * into the kept graph's groups one for one (same first, size, cache rows read, pool and consecutive slots). */
static bool k3_kept_fits(const k3_engine *e, const k3_batch *bt) {
    const k3_graph *g = e->kept;
    if (!g || g->n_seqs != bt->n_seqs || !k3_keepable(e, bt)) return false;
    const int n_logits = e->b == e->hp.n_layer ? bt->n_logits : 0;
    if ((g->logits ? (int)g->logits->ne[1] : 0) != n_logits || bt->step_kernels != g->step_kernels ||
        bt->n_taps != g->n_taps) {
        return false;
    }
    if (bt->n_taps > 0 && memcmp(bt->tap_layers, g->tap_layers, (size_t)bt->n_taps * sizeof *bt->tap_layers) != 0) return false;
    for (int gi = 0; gi < g->n_groups; gi++) {
        const k3_group *gr = &g->groups[gi];
        int slot0 = bt->seqs[gr->first]->slot; /* as k3_build derives it: -1 once the slots stop being consecutive */
        for (int i = 0; i < gr->m; i++) {
            const int s = gr->first + i;
            const k3_state *st = bt->seqs[s];
            const k3_seq_view sv = {.st = bt->seqs[s], .n = 1, .n_kv = k3_n_kv(st, 1)};
            if (sv.n_kv != gr->n_kv) return false;
            if (gr->m == 1 && (st != g->seqs[s].st || st->id != g->seqs[s].id)) return false;
            if (gr->m > 1 && (st->pool != gr->pool || st->pool->id != gr->pool_id)) return false;
            if (slot0 >= 0 && st->slot != slot0 + i) slot0 = -1;
            /* The group ends where k3_build would end it. */
            if (s + 1 < bt->n_seqs) {
                const k3_seq_view nx = {.st = bt->seqs[s + 1], .n = 1, .n_kv = k3_n_kv(bt->seqs[s + 1], 1)};
                if (k3_joins(&sv, &nx) != (i + 1 < gr->m)) return false;
            }
        }
        if (gr->m > 1 && slot0 != gr->slot0) return false; /* views at the same slots, or gathered both times */
    }
    return true;
}

int k3_forward(k3_engine *e, const k3_batch *bt, k3_output *out, rl_err *err) {
    memset(out, 0, sizeof *out);
    int64_t T = 0;
    if (k3_check_batch(e, bt, &T, err) != 0) return -1;
    k3_graph built, *g = &built;
    const bool reuse = k3_kept_fits(e, bt);
    if (reuse) {
        g = e->kept;
        for (int s = 0; s < bt->n_seqs; s++) { /* the same sequences, or (in groups) others of the same slots' pool */
            g->seqs[s].st = bt->seqs[s];
            g->seqs[s].id = bt->seqs[s]->id;
        }
        e->n_reused++;
    } else {
        k3_kept_drop(e);
        if (k3_build(e, bt, T, g, err) != 0) return -1;
        if (k3_alloc(e, g, err) != 0) {
            k3_graph_free(g);
            return -1;
        }
    }
    int rc = 0;
    if ((rc = k3_inputs_set(bt, g, err)) != 0) goto done; /* nothing has run and no state has moved */
    if ((rc = k3_compute(e, g, err)) != 0) goto done;
    if (g->xc) g->xc->st.tokens += (uint64_t)T;
    for (int i = 0; i < g->n_rb; i++) ggml_backend_tensor_get(g->rb[i].t, g->rb[i].dst, g->rb[i].offset, g->rb[i].size);
    for (int s = 0; s < bt->n_seqs; s++) {
        k3_state *st = bt->seqs[s];
        k3_state_rb_commit(st, g->seqs[s].keep_rb, st->n_past, bt->n_tokens[s]);
        st->n_past += bt->n_tokens[s];
    }
    rc = k3_outputs_get(e, bt, g, out, err);
done:
    if (rc != 0) k3_output_free(out);
    if (reuse) {
        if (rc != 0) k3_kept_drop(e);
    } else if (rc == 0 && k3_keepable(e, bt) && (e->kept = malloc(sizeof *e->kept)) != NULL) {
        *e->kept = built; /* its sequences, seqs[i].st and .id, are this step's */
    } else {
        k3_graph_free(g);
    }
    return rc;
}
