/* expert_cache.h - routed experts kept outside memory: a fixed set of slots filled from the file on demand.
 *
 * A K3 token touches k of E routed experts per layer, so under a memory budget (--mem) the dense part of a
 * layer range stays resident and the routed experts live here: per kind of expert (the types and shapes of
 * its three projections; a mixed quant has several) one tensor [ne0, ne1, n_slots] per projection, in the
 * buffer type the file's expert tensor would have had (repacked like it, so the same kernels run). The
 * forward pass stops after each MoE layer's router (k3_expert_run.c), asks here for the experts it chose, gets
 * the slots they are in, and runs ggml_mul_mat_id on the slot tensors with slot ids in place of expert ids:
 * every expert's rows go to one slot in the same order as to the expert in the file, so the kernels compute
 * the same numbers, bit for bit.
 *
 * When a batch's layer chooses more experts than the slots hold, the layer runs in passes, each over a group
 * of experts that fits: a pass gathers the rows of its experts as one-expert rows (ggml_mul_mat_id with one
 * id per row, so no slot gets more rows than the op has room for) and the passes' outputs are merged back
 * in place. Every row still meets the same weights and the same quantized input, one dot product per
 * output element on the CPU either way, so the numbers are the same.
 *
 * Misses are read with pread by a few I/O threads at once. A look-ahead (the next MoE layer's router run on
 * this layer's input, in the same graph) names the experts the next layer will likely choose, and they are
 * read while this layer computes; a layer's own reads go ahead of guesses, and guesses still queued when the
 * layer's choice is known, and wrong, are dropped. Replacement is least-frequently-used with ageing, least recent among equals:
 * the slots are shared by the range's layers, which are visited in a cycle, where pure recency evicts exactly
 * what the next token needs first. Pages read are dropped from the page cache, so the budget is the memory
 * the weights take, not a figure the kernel's cache quietly exceeds. */
#ifndef RINGLM_EXPERT_CACHE_H
#define RINGLM_EXPERT_CACHE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/err.h"
#include "../gguf/model_file.h"
#include "expert_copy.h"
#include "k3_hparams.h"
#include "weight_place.h"

struct ggml_context;
struct ggml_tensor;
struct ggml_backend_buffer;

#define XC_MAX_POOLS 8
#define XC_IO_THREADS 4

typedef struct xc_stats {
    uint64_t tokens;        /* tokens the engine ran through its layers */
    uint64_t needed;        /* (layer, expert) pairs a batch's routers chose (distinct per layer and batch) */
    uint64_t hits;          /* of them, resident when asked (read ahead included) */
    uint64_t loads;         /* experts read on demand */
    uint64_t prefetched;    /* experts read ahead by the look-ahead */
    uint64_t prefetch_used; /* of those, chosen by their layer before being evicted */
    uint64_t bytes_read;    /* from the file, on demand and ahead */
    uint64_t bytes_used;    /* bytes of the experts the batches chose (what a cache-less engine reads) */
    uint64_t passes;        /* layer passes run (> MoE layers run when groups did not fit) */
    double wait_s;          /* time the compute waited for reads */
    uint64_t from_copy;     /* of loads and prefetched, read from the repacked copy (--expert-copy) */
    uint64_t copied;        /* experts written to the copy */
} xc_stats;

/* One kind of expert: its projections' types and shapes, and the slots holding experts of that kind. */
typedef struct xc_pool {
    int type[3];
    int64_t ne[3][2];
    size_t bytes[3];           /* one expert's bytes per projection (gate, up, down) */
    size_t expert_bytes;       /* their sum */
    int buft_k[3];             /* per projection: index into the placement list, -1: plain host memory */
    int n_slots;
    struct ggml_tensor *t[3];  /* [ne0, ne1, n_slots] */
    struct ggml_backend_buffer *buf[3];
    int32_t *slot_layer, *slot_expert; /* what each slot holds (-1: nothing) */
    uint32_t *freq;
    uint64_t *last;
    uint8_t *pin;              /* used by the pass about to run: not evicted */
    uint8_t *ahead;            /* read by the look-ahead and not yet chosen */
    uint8_t *loading;          /* queued or being filled (set here, cleared by the I/O thread, under mu) */
} xc_pool;

typedef struct xc_layer {
    int pool;                  /* -1: not a MoE layer */
    const mf_tensor *src[3];   /* ffn_gate_exps, ffn_up_exps, ffn_down_exps in the file */
    int32_t *slot_of;          /* [n_expert]: the slot holding each expert, -1 */
} xc_layer;

typedef struct xc_job {
    int pool, slot;
    uint32_t il, expert;
} xc_job;

typedef struct xc_cache {
    uint32_t a, b, n_expert, k;
    xc_layer *layers;          /* [b - a] */
    xc_pool pools[XC_MAX_POOLS];
    int n_pools;
    const wp_list *place;
    int *fds;                  /* per split of the model, -1 where no tensor of ours lives */
    int n_fds_open;
    struct ggml_context *ctx;  /* the slot tensors' descriptors */
    int *rank;                 /* [n_expert] scratch of xc_plan_layer (the main thread's) */
    const mf_model *m;
    size_t dense_bytes, cache_bytes;
    uint64_t tick;
    xc_stats st;
    /* I/O threads: a queue of slot fills; the main thread waits for the queue to drain. */
    pthread_t th[XC_IO_THREADS];
    int n_th;
    pthread_mutex_t mu;
    pthread_cond_t cv_job, cv_idle;
    bool sync_ok;
    xc_job *q;
    int q_cap, q_head, q_n, busy;
    bool stop;
    xcp_file copy;             /* the repacked copy (expert_copy.h); copy.fd -1: none */
    bool *copy_layer;          /* [b - a]: the layer's experts go through the copy (a repacked slot layout) */
    char io_err[256];          /* the first failed read, until reported */
    bool flush;                /* a read failed: forget every slot before the next layer */
} xc_cache;

/* Counters of a phase: b - a, field by field (a taken before b). */
xc_stats xc_stats_sub(const xc_stats *b, const xc_stats *a);

/* Bytes of the least cache [a, b) runs with: two experts of each kind in RAM (k3_experts_on_cpu). */
size_t xc_min_expert_bytes(const mf_model *m, const k3_hparams *hp, uint32_t a, uint32_t b);

/* Sets up slots for [a, b)'s routed experts in RAM (k3_experts_on_cpu under hp's device layout: a device
 * layer's own experts are not the cache's, and xc_max_passes is 0 for its layer) in cache_bytes (the budget
 * left after the dense part; at least two experts of each kind), over the file m (which must outlive the
 * cache). place: the buffer types weights may take (the engine's; the cache follows the file tensors' choice). */
int xc_open(xc_cache *c, const mf_model *m, const k3_hparams *hp, uint32_t a, uint32_t b, size_t cache_bytes,
            const wp_list *place, rl_err *err);
/* Keeps a copy of the experts as the slots hold them in copy_dir (expert_copy.h), for the layers whose slots
 * are re-laid (repacked); none such: nothing to do. After xc_open, before any use. */
int xc_copy_open(xc_cache *c, const char *copy_dir, rl_err *err);
void xc_close(xc_cache *c);

/* The slot tensor standing for layer il's projection j (0 gate, 1 up, 2 down). */
struct ggml_tensor *xc_tensor(const xc_cache *c, uint32_t il, int j);
/* Passes a layer may need for n rows of (token, chosen expert): 1 when the slots hold any such batch's
 * distinct experts. The graph is built for this many; unneeded ones are not computed. */
int xc_max_passes(const xc_cache *c, uint32_t il, int64_t n);

/* What one layer of one batch runs: its distinct experts in groups, one group per pass. */
typedef struct xc_plan {
    int n_rows;
    int32_t *expert;  /* [n_rows] the router's choices, as read from the graph */
    int n_distinct;
    int32_t *order;   /* [n_distinct] distinct experts, resident ones first */
    int *group_of;    /* [n_rows] the pass computing each row */
    int n_groups, per_group;
} xc_plan;

/* Plans layer il for the rows' chosen experts (the router's output, k-major per token); reads ahead for
 * it that are still queued and were not chosen are dropped. */
int xc_plan_layer(xc_cache *c, uint32_t il, const int32_t *ids, int n_rows, xc_plan *p, rl_err *err);
/* Makes pass g's experts resident (reading the misses, several at once, ahead of any read ahead) and writes
 * each row's slot id (-1 for rows of other passes). Returns once the group's slots are filled. */
int xc_load_pass(xc_cache *c, uint32_t il, const xc_plan *p, int g, int32_t *slot_ids, rl_err *err);
/* Starts reading, without waiting, the experts (rows of ids, k-major) the look-ahead says layer il will
 * choose, into slots the pass now running does not use. */
void xc_prefetch(xc_cache *c, uint32_t il, const int32_t *ids, int n_rows);
void xc_plan_free(xc_plan *p);
/* Blocks until no read is in flight; returns -1 with the first read error, if any. */
int xc_wait(xc_cache *c, rl_err *err);

#endif
