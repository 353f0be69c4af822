/* k3_forward.c - running a batch through an engine (k3_forward.h): check it, build its graph (the sequences'
 * views and groups, the graph's memory, the inputs that depend on positions; the layers themselves are
 * k3_layers.c's), give the graph memory, write the inputs, compute, read the outputs. A decode step may run
 * the graph the step before it built (e->kept). */
#include "k3_forward_int.h"

#include <math.h>
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

/* ---- checking a batch -------------------------------------------------------------------------- */

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

/* ---- building its graph ------------------------------------------------------------------------ */

/* Attention reads the cache padded to a multiple of 256 rows (at least 256, at most the capacity), the
 * masked rows contributing exact zeros. llama.cpp pads its cache view the same way, so both run matmuls of
 * the same shapes and round the same: on quantized models, where activations are requantized to 8 bits
 * before every matmul, a one-ulp difference from another tiling can otherwise cross a rounding boundary
 * and flip an expert choice (docs/numerics.md). Rows past n_past + n hold zeros or stale finite values. */
static uint32_t k3_n_kv(const k3_state *st, uint32_t n) {
    uint32_t used = st->n_past + n, pad = (used + 255u) / 256u * 256u;
    return pad < st->n_ctx ? pad : st->n_ctx;
}

/* Whether sequence sv joins the group whose first sequence is pv: it runs the same shapes on slots of the
 * same pool, and neither keeps rollback copies. */
static bool k3_joins(const k3_seq_view *pv, const k3_seq_view *sv) {
    return sv->st->pool && pv->st->pool == sv->st->pool && !sv->keep_rb && !pv->keep_rb && pv->n == sv->n &&
           pv->n_kv == sv->n_kv;
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

/* The batch's sequences as views of it (token range, cache rows read), in order, in groups: a sequence joins
 * the group before it where k3_joins says so. A sequence keeping rollback copies gets their room here. */
static int k3_seqs_group(k3_graph *g, const k3_batch *bt, rl_err *err) {
    uint32_t off = 0;
    for (int s = 0; s < bt->n_seqs; s++) {
        k3_seq_view *sv = &g->seqs[s];
        sv->st = bt->seqs[s];
        sv->id = sv->st->id;
        sv->keep_rb = bt->keep_rollback && bt->keep_rollback[s];
        g->step_kernels |= sv->keep_rb; /* a verified block must give what single steps give */
        if (sv->keep_rb && k3_state_rb_reserve(sv->st, bt->n_tokens[s], err) != 0) return -1;
        sv->off = off;
        sv->n = bt->n_tokens[s];
        off += sv->n;
        sv->n_kv = k3_n_kv(sv->st, sv->n);
        const bool piece = g->split_invariant && sv->n >= 2; /* a prompt piece on the split-invariant path */
        sv->n_q = piece && g->flash_attn && sv->n < K3_FA_TILE_Q ? K3_FA_TILE_Q : sv->n;
        k3_group *gr = g->n_groups ? &g->groups[g->n_groups - 1] : NULL;
        if (gr && !piece && k3_joins(&g->seqs[gr->first], sv)) {
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
    return 0;
}

/* The graph's inputs that say where each sequence is (k3_inputs_set writes them): with an MLA layer in the
 * range, a sequence alone gets its causal mask and the cache rows of its new keys, a group its mask and key
 * rows; a group whose slots are not consecutive gets their list. */
static void k3_seq_inputs_new(k3_graph *g, enum ggml_type mask_type) {
    struct ggml_context *c = g->ctx;
    for (int gi = 0; gi < g->n_groups; gi++) {
        k3_group *gr = &g->groups[gi];
        if (gr->m == 1) {
            if (g->any_mla) {
                k3_seq_view *sv = &g->seqs[gr->first];
                sv->mask = ggml_new_tensor_2d(c, mask_type, sv->n_kv, sv->n_q);
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
        if (g->any_mla) {
            gr->krows = ggml_new_tensor_1d(c, GGML_TYPE_I32, (int64_t)gr->m * gr->n);
            ggml_set_input(gr->krows);
            gr->mask = ggml_new_tensor_4d(c, mask_type, gr->n_kv, gr->n, 1, gr->m);
            ggml_set_input(gr->mask);
        }
    }
}

/* Builds the batch's graph into g (its nodes in e->graph_buf). On error g is freed; no state has moved. */
static int k3_build(k3_engine *e, const k3_batch *bt, int64_t T, k3_graph *g, rl_err *err) {
    const k3_hparams *hp = &e->hp;

    bool any_mla = false;
    int n_kda = 0, n_keep = 0;
    for (uint32_t il = e->a; il < e->b; il++) {
        any_mla |= hp->is_mla[il];
        n_kda += !hp->is_mla[il];
    }
    for (int s = 0; bt->keep_rollback && s < bt->n_seqs; s++) n_keep += bt->keep_rollback[s] != 0;
    *g = (k3_graph){.hp = hp, .n_seqs = bt->n_seqs, .T = T, .step_kernels = bt->step_kernels, .flash_attn = e->flash_attn,
                    .split_invariant = bt->split_invariant,
                    .a = e->a, .b = e->b, .w = &e->w, .xc = e->xc, .any_mla = any_mla, .n_taps = bt->n_taps};
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
    if (k3_seqs_group(g, bt, err) != 0) goto fail;

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
    g->gf = ggml_new_graph_custom(g->ctx, n_nodes, false);
    k3_seq_inputs_new(g, e->flash_attn ? GGML_TYPE_F16 : GGML_TYPE_F32); /* FA takes an f16 mask */
    k3_graph_forward(g, bt);
    if (g->xc && k3_stops_locate(g, err) != 0) goto fail;
    return 0;
fail:
    k3_graph_free(g);
    return -1;
}

/* ---- giving the graph memory ------------------------------------------------------------------- */

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

/* ---- inputs, compute, outputs ------------------------------------------------------------------ */

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
            /* A padded piece's extra rows (k3_seq_view.n_q) see finite rows; their outputs are dropped. */
            const uint32_t rows = gr->m == 1 ? g->seqs[gr->first].n_q : gr->n;
            k3_mask_rows(mk + (size_t)i * gr->n * n_kv * el, mt->type, n_kv, (size_t)st->n_past + 1, rows);
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

/* ---- the kept graph of a decode step ----------------------------------------------------------- */

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

/* Whether the kept graph runs this batch: the batch's sequences, grouped as k3_seqs_group would group them,
 * fall into the kept graph's groups one for one (same first, size, cache rows read, pool and consecutive
 * slots). */
static bool k3_kept_fits(const k3_engine *e, const k3_batch *bt) {
    const k3_graph *g = e->kept;
    if (!g || g->n_seqs != bt->n_seqs || !k3_keepable(e, bt)) return false;
    const int n_logits = e->b == e->hp.n_layer ? bt->n_logits : 0;
    if ((g->logits ? (int)g->logits->ne[1] : 0) != n_logits || bt->step_kernels != g->step_kernels ||
        bt->split_invariant != g->split_invariant ||
        bt->n_taps != g->n_taps) {
        return false;
    }
    if (bt->n_taps > 0 && memcmp(bt->tap_layers, g->tap_layers, (size_t)bt->n_taps * sizeof *bt->tap_layers) != 0) return false;
    for (int gi = 0; gi < g->n_groups; gi++) {
        const k3_group *gr = &g->groups[gi];
        int slot0 = bt->seqs[gr->first]->slot; /* as k3_seqs_group derives it: -1 once not consecutive */
        for (int i = 0; i < gr->m; i++) {
            const int s = gr->first + i;
            const k3_state *st = bt->seqs[s];
            const k3_seq_view sv = {.st = bt->seqs[s], .n = 1, .n_kv = k3_n_kv(st, 1)};
            if (sv.n_kv != gr->n_kv) return false;
            if (gr->m == 1 && (st != g->seqs[s].st || st->id != g->seqs[s].id)) return false;
            if (gr->m > 1 && (st->pool != gr->pool || st->pool->id != gr->pool_id)) return false;
            if (slot0 >= 0 && st->slot != slot0 + i) slot0 = -1;
            /* The group ends where k3_seqs_group would end it. */
            if (s + 1 < bt->n_seqs) {
                const k3_seq_view nx = {.st = bt->seqs[s + 1], .n = 1, .n_kv = k3_n_kv(bt->seqs[s + 1], 1)};
                if (k3_joins(&sv, &nx) != (i + 1 < gr->m)) return false;
            }
        }
        if (gr->m > 1 && slot0 != gr->slot0) return false; /* views at the same slots, or gathered both times */
    }
    return true;
}

/* ---- running a batch --------------------------------------------------------------------------- */

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
