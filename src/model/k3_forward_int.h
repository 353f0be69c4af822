/* k3_forward_int.h - what the files behind k3_forward.h share, and nothing outside them includes:
 *   k3_engine.c      the engine's life, and the memory it keeps from one batch to the next
 *   k3_forward.c     running a batch: check, build, allocate, inputs, compute, outputs; the kept graph
 *   k3_layers.c      the layers, read top to bottom: the pass over the range that k3_forward.c builds
 *   k3_expert_run.c  routed experts through the expert cache (--mem): their passes and the stops before them
 * and the graph of a batch (k3_graph), which all of them build or read.
 */
#ifndef RINGLM_K3_FORWARD_INT_H
#define RINGLM_K3_FORWARD_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/err.h"
#include "expert_cache.h"
#include "k3_forward.h"

/* ---- the graph of a batch ---------------------------------------------------------------------- */

typedef struct k3_seq_view {
    k3_state *st;
    uint64_t id;     /* st->id when built: a kept graph (e->kept) knows the sequence by it */
    bool keep_rb;    /* keep rollback copies of this block */
    uint32_t off, n; /* token range in the batch */
    uint32_t n_kv;   /* cache rows attention reads: n_past + n, padded (k3_n_kv) */
    uint32_t n_q;    /* query rows of its flash attention: n, or K3_FA_TILE_Q when a split-invariant batch pads
                      * a short piece (k3_batch.split_invariant); the mask has as many rows */
    struct ggml_tensor *mask; /* [n_kv, n_q] f32, 0 or -inf (MLA causal mask) */
    struct ggml_tensor *kpos; /* [n] I64: the cache rows this batch's keys go to, n_past .. n_past+n-1 (an
                               * input, as llama.cpp's k_idxs, not a view at n_past: the graph of the next
                               * step is then this one's, and is kept; e->kept) */
} k3_seq_view;

/* Consecutive sequences of the batch that run their causal parts as one op each: m > 1 of them, all slots
 * of one state pool, the same token count n and cache read length n_kv, none keeping rollback copies. The
 * typical group is every decoding sequence of a server step. Built once over the group, the KDA recurrence
 * and MLA attention cost a fixed number of graph nodes instead of a few per sequence; every op computes
 * each sequence exactly as the per-sequence graph does (same kernels, same per-slice shapes), so the
 * results are the same bits. A group of one (m == 1) takes the per-sequence graph. */
typedef struct k3_group {
    int first, m;         /* g->seqs[first .. first+m) */
    uint32_t off, n, n_kv;/* tokens start at off, n per sequence */
    uint32_t n_used;      /* cache rows written by the longest sequence after this batch: n_past + n, at most */
    int slot0;            /* >= 0: the slots are slot0 .. slot0+m-1, so plain views reach them; else gathered */
    const k3_state_pool *pool;
    uint64_t pool_id;     /* pool->id when built (e->kept: a pool made at a freed one's address is another) */
    struct ggml_tensor *slots; /* [m] I32: the pool slots, for get_rows / set_rows */
    struct ggml_tensor *krows; /* [m*n] I32: cache rows (slot * n_ctx + position) the new keys go to */
    struct ggml_tensor *mask;  /* [n_kv, n, 1, m] f32 */
} k3_group;

/* Each KDA layer of a sequence keeping rollback copies reads back its three conv windows and its states. */
enum { K3_READBACKS_PER_LAYER = 4 };

/* A tensor region to copy to host memory after the compute (rollback copies). */
typedef struct k3_readback {
    struct ggml_tensor *t;
    size_t offset, size;
    void *dst;
} k3_readback;

typedef struct k3_graph {
    k3_readback *rb;
    int n_rb, cap_rb;
    struct ggml_context *ctx;
    struct ggml_cgraph *gf;
    const k3_hparams *hp;
    k3_seq_view *seqs;
    int n_seqs;
    k3_group *groups; /* the batch's sequences, in order, in groups (m == 1: one sequence) */
    int n_groups;
    struct ggml_tensor **outs; /* [n_groups] scratch: a layer's per-group attention outputs */
    int64_t T; /* tokens in the batch */
    struct ggml_tensor *stack; /* banked checkpoints [d, n_ckpt, T], NULL while empty */
    bool step_kernels; /* every matmul column computed as a one-token step computes it (k3_mm) */
    bool flash_attn;   /* MLA attention as one ggml_flash_attn_ext per sequence or group (k3_fa) */
    bool split_invariant; /* k3_batch.split_invariant: pieces of 2 or more tokens never grouped, short ones
                           * padded to K3_FA_TILE_Q query rows */
    struct ggml_tensor *(*route)[3]; /* k3_batch.routes: per layer of the range, ids / weights / norms */
    int rel;                         /* the layer being built, relative to the range */
    uint32_t a, b;                   /* the range */
    const k3_weights *w;
    xc_cache *xc;                    /* routed experts through a cache: the compute stops at each pass */
    struct k3_xstop *stops;
    int n_stops, cap_stops;
    bool any_mla;                    /* the range has an MLA layer: masks and key rows are inputs */
    /* Inputs and outputs, NULL where the batch has none. */
    struct ggml_tensor *inp_tok, *inp_h, *inp_stack, *inp_rows;
    struct ggml_tensor *tap_t[16];   /* the streams at k3_batch.tap_layers, n_taps of them */
    uint32_t tap_layers[16];
    int n_taps;
    struct ggml_tensor *logits, *out_h, *out_stack;
} k3_graph;

/* ---- k3_engine.c: memory an engine keeps between batches --------------------------------------- */

/* At least need bytes for a graph's tensor and node structs in e->graph_buf (k3_engine.graph_buf: why kept). */
int k3_engine_graph_mem(k3_engine *e, size_t need, rl_err *err);
/* At least need bytes of mask memory in e->mask_buf (k3_engine.mask_buf: why not the compute buffer): twice
 * what it had, up to full (what the same sequences' masks need at full context), or need if that is more. */
int k3_engine_mask_mem(k3_engine *e, size_t need, size_t full, rl_err *err);
/* e->sched, made anew when there is none or its hash set is smaller than size (a graph's nodes and leafs). */
int k3_engine_sched(k3_engine *e, size_t size, rl_err *err);

/* ---- k3_forward.c ------------------------------------------------------------------------------ */

/* Frees e->kept, the last decode step's graph, if there is one. */
void k3_kept_drop(k3_engine *e);

/* ---- k3_layers.c: the layers ------------------------------------------------------------------- */

/* Builds the pass over the range into g, whose sequences, groups and their inputs are made: the stream in,
 * every layer, the stream out (logits or boundary state) and the taps. */
void k3_graph_forward(k3_graph *g, const k3_batch *bt);
/* Every matmul of the graph (k3_mm_prec: why), and the SiTU activation of the experts and the dense FFN. */
struct ggml_tensor *k3_mm(k3_graph *g, struct ggml_tensor *w, struct ggml_tensor *x);
struct ggml_tensor *k3_situ(k3_graph *g, struct ggml_tensor *gate, struct ggml_tensor *up);

/* ---- k3_expert_run.c: routed experts through the expert cache ---------------------------------- */

/* Room in g->stops for the passes the batch may need (NULL: out of memory); returns the graph nodes they add. */
size_t k3_xc_stops_new(k3_graph *g);
/* The routed experts of layer g->rel over the cache's slots: sel the router's choice [K, T], xl the experts'
 * input [dl, 1, T], xn the layer's input (the look-ahead's). Returns [dl, K, T], as ggml_mul_mat_id would. */
struct ggml_tensor *k3_moe_cached(k3_graph *g, struct ggml_tensor *xn, struct ggml_tensor *sel, struct ggml_tensor *xl);
/* Finds where each pass begins in the finished graph (the compute stops there). */
int k3_stops_locate(k3_graph *g, rl_err *err);
/* Puts on the CPU the ops reading what the host writes at the stops; again after each scheduler reset. */
void k3_sched_pin_stops(k3_engine *e, const k3_graph *g);
/* Computes g, stopping before each pass to make its experts resident. */
int k3_xc_compute(k3_engine *e, k3_graph *g, rl_err *err);

#endif
