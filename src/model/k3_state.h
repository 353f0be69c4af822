/* k3_state.h - what one sequence keeps between forward calls, for the layers of one range (docs/k3-spec.md §6).
 *
 * KDA layers: the short-conv windows (3 x (Kc-1) x Di f32) and the delta-rule matrices (H x Dk x Dk f32),
 * constant in length. MLA layers: the latent cache, (kv_lora + rope) f32 per token, up to n_ctx tokens.
 * A snapshot holds the KDA state and the position; restoring it rolls the sequence back (the MLA cache
 * needs no copy: rows past the restored position are simply overwritten later).
 * A layer that computes on a device (k3_on_dev) keeps its state in the device's memory; the functions
 * below reach it through ggml's tensor get/set, so callers never read state memory directly. */
#ifndef RINGLM_K3_STATE_H
#define RINGLM_K3_STATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/err.h"
#include "k3_hparams.h"

struct ggml_context;
struct ggml_tensor;
struct ggml_backend_buffer;
struct k3_state_pool;

/* One verified block kept for rollback: for every KDA layer, the delta state after each of its tokens and
 * the short-conv inputs of the block, so the sequence can return to any position inside it. */
typedef struct k3_rb_block {
    uint32_t start, n, cap; /* the block's first position, its length, the tokens the buffers hold */
    float **delta;          /* [il - a]: n slots of Dk*Dk*H, slot s = the state after n - s tokens */
    float **conv;           /* [il - a]: 3 x (Kc-1+n) x Di: the conv inputs (the window before, then the block) */
    void *mem;              /* one mapping holding every layer's delta and conv copies (rl_heap_map) */
    size_t mem_bytes;
} k3_rb_block;

/* Consecutive verified blocks a sequence can roll back into, by default: pipelined speculation has several
 * blocks in flight, and a rejection in the oldest invalidates the ones run after it. A draft model, which
 * runs one kept block per drafted token, asks for more (k3_state_keep_blocks). */
#define K3_RB_BLOCKS 4
/* The most a sequence may be asked to keep (speculate/spec_gen.h SPEC_MAX_DEPTH blocks in flight, with room). */
#define K3_RB_MAX 16

typedef struct k3_state {
    uint32_t a, b;    /* layer range */
    uint32_t n_ctx;   /* cache capacity in tokens */
    uint32_t n_past;  /* tokens processed so far */
    uint64_t id;      /* drawn when the state is made: an engine keeps the graph of a sequence's last step for its
                       * next one (k3_forward.c, k3_engine.kept) and knows the sequence by this, not by its address,
                       * which a later state may reuse */
    struct ggml_tensor **conv;   /* [il - a]: {(Kc-1), Di, 3} f32 (q, k, v windows), NULL on MLA layers */
    struct ggml_tensor **delta;  /* [il - a]: {Dk, Dk, H} f32, NULL on MLA layers */
    struct ggml_tensor **kcache; /* [il - a]: {kv_lora + rope, n_ctx} of hp->kv_type (f32 or f16), NULL on KDA layers */
    struct ggml_context *ctx, *dctx[K3_MAX_DEV]; /* host tensors (and a pooled state's views); those on each device */
    struct ggml_backend_buffer *buf, *dbuf[K3_MAX_DEV]; /* their memory: host, and each device's (hp->dev_buft) */
    /* Rollback (speculative verification): the blocks run with keep_rollback since the last other step,
     * consecutive, rb[0 .. rb_count) oldest first (at most K3_RB_BLOCKS; the oldest is dropped beyond);
     * rb[rb_next] is the one a forward pass is writing (k3_state_rb_reserve). rb has rb_max + 1 entries
     * (one spare), allocated with the first kept block. */
    k3_rb_block *rb;
    int rb_count, rb_next, rb_max;
    /* Set when the tensors above are views of one slot of a pool (k3_state_pool): the forward pass then runs
     * the KDA recurrence and MLA attention of several pooled sequences as one op each. NULL: own buffer. */
    const struct k3_state_pool *pool;
    int slot;
} k3_state;

/* The states of n_slots sequences, one tensor per layer holding every slot side by side (slot is the
 * outermost axis): conv {Kc-1, Di, 3, n_slots}, delta {Dk, Dk, H, n_slots}, kcache {kv_lora + rope, n_ctx,
 * n_slots}. A server allocates its slots this way so that a batch of equal-length steps can read and write
 * all their states with one gather and one scatter per tensor instead of a few graph nodes per sequence. */
typedef struct k3_state_pool {
    uint64_t id; /* drawn when the pool is made: a kept graph of a group of its slots (k3_forward.c, k3_engine.kept)
                  * knows the pool by this, not by its address, which a later pool may reuse */
    uint32_t a, b, n_ctx;
    int n_slots;
    struct ggml_tensor **conv, **delta, **kcache; /* [il - a], NULL where the layer has no such state */
    struct ggml_context *ctx, *dctx[K3_MAX_DEV]; /* as in k3_state: host, devices */
    struct ggml_backend_buffer *buf, *dbuf[K3_MAX_DEV];
} k3_state_pool;

/* Allocates the pool, zeroed. Its slots are bound to states with k3_state_init_pooled. */
int k3_state_pool_init(k3_state_pool *p, const k3_hparams *hp, uint32_t a, uint32_t b, uint32_t n_ctx, int n_slots,
                       rl_err *err);
/* Frees the pool; free the states bound to it first. */
void k3_state_pool_free(k3_state_pool *p);
/* A fresh (zeroed) sequence whose tensors are slot `slot` of the pool. One state per slot at a time. */
int k3_state_init_pooled(k3_state *s, const k3_state_pool *p, int slot, rl_err *err);

/* Allocates zeroed state (a fresh sequence). */
int k3_state_init(k3_state *s, const k3_hparams *hp, uint32_t a, uint32_t b, uint32_t n_ctx, rl_err *err);
void k3_state_free(k3_state *s);
/* Forgets everything: the sequence starts again at position 0. */
void k3_state_reset(k3_state *s);
size_t k3_state_bytes(const k3_state *s);
/* What its blocks kept for rollback hold now (allocated as they are first used; k3_memory.h,
 * k3_range_rollback_bytes, says how much they come to). Not in k3_state_bytes. */
size_t k3_state_rb_bytes(const k3_state *s);
/* dst becomes a copy of src's sequence (same layer range, room for its tokens): its position, KDA state and
 * the MLA cache rows written so far; dst's blocks kept for rollback are forgotten. So n sequences that read
 * the same prompt read it once (serve's n > 1). */
int k3_state_copy(k3_state *dst, const k3_state *src, rl_err *err);

typedef struct k3_snapshot {
    uint32_t n_past;
    size_t n_bytes;
    uint8_t *kda; /* conv and delta tensors of every KDA layer, concatenated */
} k3_snapshot;

int k3_state_snapshot(const k3_state *s, k3_snapshot *snap, rl_err *err); /* (re)uses snap->kda */

/* Returns the sequence to position `pos` inside one of the blocks kept for rollback (start < pos <= start
 * + n): KDA state and conv windows from the kept copies, the MLA cache by truncation. Cheap. Fails if pos
 * is in none of them. Afterwards the blocks that end by pos stay kept (a draft model rolls back into them
 * again); the one pos falls inside is dropped unless pos is its end. */
int k3_state_rollback(k3_state *s, uint32_t pos, rl_err *err);
/* How many consecutive blocks the sequence keeps for rollback (default K3_RB_BLOCKS); each kept block holds
 * a copy of the KDA state per token, allocated as it is first used. Forgets what is kept. */
int k3_state_keep_blocks(k3_state *s, int n_blocks, rl_err *err);
/* Forgets the kept blocks that end at or before `pos` (nothing will return into them: a draft model's
 * committed tokens), moving their buffers right behind the kept ones, where the next blocks reuse them. A draft model
 * keeps one block per drafted token and never rolls back past what is committed; without this its kept
 * chain grew by a block per token up to its limit, each a fresh copy of every KDA state touched page by page. */
void k3_state_rb_forget(k3_state *s, uint32_t pos);
/* Rolls back to the snapshot's position. The snapshot stays valid (it can be restored again). */
int k3_state_restore(k3_state *s, const k3_snapshot *snap, rl_err *err);
void k3_snapshot_free(k3_snapshot *snap);

/* The MLA cache rows [0, n) of every MLA layer of the range, concatenated layer after layer: what a cached
 * prompt prefix keeps besides the KDA snapshot at n (serve's prompt cache). k3_state_rows_bytes says how many
 * bytes n rows take; get copies them out of the state, set into it (n <= n_ctx; set does not move n_past:
 * restore the snapshot too). */
size_t k3_state_rows_bytes(const k3_state *s, uint32_t n);
int k3_state_rows_get(const k3_state *s, uint32_t n, uint8_t *dst, rl_err *err);
int k3_state_rows_set(k3_state *s, uint32_t n, const uint8_t *src, rl_err *err);
/* Bytes of a snapshot of this state (k3_snapshot.n_bytes): its KDA layers' conv and delta tensors. */
size_t k3_state_kda_bytes(const k3_state *s);

/* For the forward pass: picks the block slot a block of n tokens at n_past will be kept in (after the kept
 * ones when it continues them, else the first) and grows its buffers; k3_state_rb_commit records it once
 * the pass has run (keep false: a step without rollback, which forgets every kept block). */
int k3_state_rb_reserve(k3_state *s, uint32_t n, rl_err *err);
void k3_state_rb_commit(k3_state *s, bool keep, uint32_t start, uint32_t n);

#endif
