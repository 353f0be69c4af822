#include "k3_state.h"

#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

#include "../base/heap.h"

/* Allocates and zeroes the tensors of a host context and of each device's context (any may be empty). */
static int k3_alloc_all(struct ggml_context *ctx, struct ggml_context **dctx, const k3_hparams *hp,
                        struct ggml_backend_buffer **buf, struct ggml_backend_buffer **dbuf) {
    if (ggml_get_first_tensor(ctx)) {
        *buf = ggml_backend_alloc_ctx_tensors_from_buft(ctx, ggml_backend_cpu_buffer_type());
        if (!*buf) return -1;
        /* cleared whole now: huge pages make that one fault per 2 MiB (base/heap.h) */
        rl_heap_advise_huge(ggml_backend_buffer_get_base(*buf), ggml_backend_buffer_get_size(*buf));
        ggml_backend_buffer_clear(*buf, 0);
    }
    for (int d = 0; d < hp->n_dev; d++) {
        if (!dctx[d] || !ggml_get_first_tensor(dctx[d])) continue;
        dbuf[d] = ggml_backend_alloc_ctx_tensors_from_buft(dctx[d], hp->dev_buft[d]);
        if (!dbuf[d]) return -1;
        ggml_backend_buffer_clear(dbuf[d], 0);
    }
    return 0;
}

/* One context per device, as for the host (ip: the same size); false when out of memory. */
static bool k3_dev_ctx_init(const k3_hparams *hp, struct ggml_init_params ip, struct ggml_context **dctx) {
    for (int d = 0; d < hp->n_dev; d++) {
        if (!(dctx[d] = ggml_init(ip))) return false;
    }
    return true;
}

static void k3_dev_free(struct ggml_context **dctx, struct ggml_backend_buffer **dbuf) {
    for (int d = 0; d < K3_MAX_DEV; d++) {
        if (dbuf[d]) ggml_backend_buffer_free(dbuf[d]);
        if (dctx[d]) ggml_free(dctx[d]);
    }
}

/* The context a layer's state tensor is made in: its device's for a layer computing there. */
static struct ggml_context *k3_ctx_of(const k3_hparams *hp, uint32_t il, struct ggml_context *ctx,
                                      struct ggml_context **dctx) {
    const int d = k3_dev_of(hp, il);
    return d >= 0 ? dctx[d] : ctx;
}

/* Memory of device state, for an error that names it. */
static const char *k3_where(const k3_hparams *hp, uint32_t a, uint32_t b) {
    for (uint32_t il = a; il < b; il++) {
        const int d = k3_dev_of(hp, il);
        if (d >= 0) return ggml_backend_buft_name(hp->dev_buft[d]);
    }
    return "host";
}

/* A new sequence's or pool's id (k3_state.id, k3_state_pool.id): drawn at random rather than counted, so that
 * no counter is shared by every engine and thread of the process. 0 when the kernel gives no bytes: such a
 * state or pool gets no kept graph. */
static uint64_t k3_state_id_draw(void) {
    uint64_t id = 0;
    if (getrandom(&id, sizeof id, 0) != (ssize_t)sizeof id) id = 0;
    return id;
}

int k3_state_init(k3_state *s, const k3_hparams *hp, uint32_t a, uint32_t b, uint32_t n_ctx, rl_err *err) {
    memset(s, 0, sizeof *s);
    s->id = k3_state_id_draw();
    s->a = a;
    s->b = b;
    s->n_ctx = n_ctx;
    uint32_t n = b - a;
    s->conv = calloc(n, sizeof *s->conv);
    s->delta = calloc(n, sizeof *s->delta);
    s->kcache = calloc(n, sizeof *s->kcache);
    struct ggml_init_params ip = {.mem_size = (size_t)(3 * n + 4) * ggml_tensor_overhead(), .mem_buffer = NULL,
                                  .no_alloc = true};
    s->ctx = ggml_init(ip);
    const bool dev_ok = k3_dev_ctx_init(hp, ip, s->dctx);
    if (!s->conv || !s->delta || !s->kcache || !s->ctx || !dev_ok) {
        k3_state_free(s);
        return rl_errf(err, "out of memory for sequence state");
    }
    const int64_t di = k3_d_inner(hp), dk = hp->kda_head_dim;
    for (uint32_t il = a; il < b; il++) {
        struct ggml_context *c = k3_ctx_of(hp, il, s->ctx, s->dctx);
        if (!hp->is_mla[il]) {
            s->conv[il - a] = ggml_new_tensor_3d(c, GGML_TYPE_F32, hp->conv_kernel - 1, di, 3);
            s->delta[il - a] = ggml_new_tensor_3d(c, GGML_TYPE_F32, dk, dk, hp->n_head);
        } else {
            s->kcache[il - a] = ggml_new_tensor_2d(c, (enum ggml_type)hp->kv_type, hp->kv_lora_rank + hp->rope_dim, n_ctx);
        }
    }
    if (k3_alloc_all(s->ctx, s->dctx, hp, &s->buf, s->dbuf) != 0) {
        k3_state_free(s);
        return rl_errf(err, "cannot allocate sequence state for layers [%u, %u) and %u tokens (%s memory)", a, b, n_ctx,
                       k3_where(hp, a, b));
    }
    return 0;
}

int k3_state_pool_init(k3_state_pool *p, const k3_hparams *hp, uint32_t a, uint32_t b, uint32_t n_ctx, int n_slots,
                       rl_err *err) {
    memset(p, 0, sizeof *p);
    if (n_slots < 1) return rl_errf(err, "a state pool needs at least one slot");
    p->id = k3_state_id_draw();
    p->a = a;
    p->b = b;
    p->n_ctx = n_ctx;
    p->n_slots = n_slots;
    uint32_t n = b - a;
    p->conv = calloc(n, sizeof *p->conv);
    p->delta = calloc(n, sizeof *p->delta);
    p->kcache = calloc(n, sizeof *p->kcache);
    struct ggml_init_params ip = {.mem_size = (size_t)(3 * n + 4) * ggml_tensor_overhead(), .mem_buffer = NULL,
                                  .no_alloc = true};
    p->ctx = ggml_init(ip);
    const bool dev_ok = k3_dev_ctx_init(hp, ip, p->dctx);
    if (!p->conv || !p->delta || !p->kcache || !p->ctx || !dev_ok) {
        k3_state_pool_free(p);
        return rl_errf(err, "out of memory for a state pool");
    }
    const int64_t di = k3_d_inner(hp), dk = hp->kda_head_dim;
    for (uint32_t il = a; il < b; il++) {
        struct ggml_context *c = k3_ctx_of(hp, il, p->ctx, p->dctx);
        if (!hp->is_mla[il]) {
            p->conv[il - a] = ggml_new_tensor_4d(c, GGML_TYPE_F32, hp->conv_kernel - 1, di, 3, n_slots);
            p->delta[il - a] = ggml_new_tensor_4d(c, GGML_TYPE_F32, dk, dk, hp->n_head, n_slots);
        } else {
            p->kcache[il - a] =
                ggml_new_tensor_3d(c, (enum ggml_type)hp->kv_type, hp->kv_lora_rank + hp->rope_dim, n_ctx, n_slots);
        }
    }
    if (k3_alloc_all(p->ctx, p->dctx, hp, &p->buf, p->dbuf) != 0) {
        k3_state_pool_free(p);
        return rl_errf(err, "cannot allocate the state of %d sequences for layers [%u, %u) and %u tokens (%s memory)",
                       n_slots, a, b, n_ctx, k3_where(hp, a, b));
    }
    return 0;
}

void k3_state_pool_free(k3_state_pool *p) {
    if (p->buf) ggml_backend_buffer_free(p->buf);
    if (p->ctx) ggml_free(p->ctx);
    k3_dev_free(p->dctx, p->dbuf);
    free(p->conv);
    free(p->delta);
    free(p->kcache);
    memset(p, 0, sizeof *p);
}

int k3_state_init_pooled(k3_state *s, const k3_state_pool *p, int slot, rl_err *err) {
    memset(s, 0, sizeof *s);
    s->id = k3_state_id_draw();
    if (slot < 0 || slot >= p->n_slots) return rl_errf(err, "slot %d outside a pool of %d", slot, p->n_slots);
    s->a = p->a;
    s->b = p->b;
    s->n_ctx = p->n_ctx;
    s->pool = p;
    s->slot = slot;
    uint32_t n = p->b - p->a;
    s->conv = calloc(n, sizeof *s->conv);
    s->delta = calloc(n, sizeof *s->delta);
    s->kcache = calloc(n, sizeof *s->kcache);
    struct ggml_init_params ip = {.mem_size = (size_t)(3 * n + 4) * ggml_tensor_overhead(), .mem_buffer = NULL,
                                  .no_alloc = true};
    s->ctx = ggml_init(ip);
    if (!s->conv || !s->delta || !s->kcache || !s->ctx) {
        k3_state_free(s);
        return rl_errf(err, "out of memory for sequence state");
    }
    /* Views of the slot, bound to the pool's buffer so that they are used like tensors of their own. */
    for (uint32_t i = 0; i < n; i++) {
        struct ggml_tensor *t;
        if ((t = p->conv[i])) {
            s->conv[i] = ggml_view_3d(s->ctx, t, t->ne[0], t->ne[1], t->ne[2], t->nb[1], t->nb[2],
                                      (size_t)slot * t->nb[3]);
            s->delta[i] = ggml_view_3d(s->ctx, p->delta[i], p->delta[i]->ne[0], p->delta[i]->ne[1], p->delta[i]->ne[2],
                                       p->delta[i]->nb[1], p->delta[i]->nb[2], (size_t)slot * p->delta[i]->nb[3]);
            if (ggml_backend_view_init(s->conv[i]) != GGML_STATUS_SUCCESS ||
                ggml_backend_view_init(s->delta[i]) != GGML_STATUS_SUCCESS) {
                k3_state_free(s);
                return rl_errf(err, "cannot bind slot %d of a state pool", slot);
            }
            ggml_backend_tensor_memset(s->conv[i], 0, 0, ggml_nbytes(s->conv[i]));
            ggml_backend_tensor_memset(s->delta[i], 0, 0, ggml_nbytes(s->delta[i]));
        } else if ((t = p->kcache[i])) {
            s->kcache[i] = ggml_view_2d(s->ctx, t, t->ne[0], t->ne[1], t->nb[1], (size_t)slot * t->nb[2]);
            if (ggml_backend_view_init(s->kcache[i]) != GGML_STATUS_SUCCESS) {
                k3_state_free(s);
                return rl_errf(err, "cannot bind slot %d of a state pool", slot);
            }
        }
    }
    return 0;
}

#define K3_ROUND_UP(x, a) (((x) + (a) - 1) / (a) * (a))

/* A rollback block's copies for layer i (a KDA layer) at n tokens: the delta states, and the conv inputs
 * (the window before, then the block). */
static size_t k3_rb_delta_bytes(const k3_state *s, uint32_t i, uint32_t n) { return (size_t)n * ggml_nbytes(s->delta[i]); }
static size_t k3_rb_conv_bytes(const k3_state *s, uint32_t i, uint32_t n) {
    return 3 * (size_t)(s->conv[i]->ne[0] + n) * (size_t)s->conv[i]->ne[1] * sizeof(float);
}

static void k3_rb_free(k3_state *s) {
    for (int r = 0; s->rb && r <= s->rb_max; r++) {
        k3_rb_block *rb = &s->rb[r];
        rl_heap_unmap(rb->mem, rb->mem_bytes);
        free(rb->delta);
        free(rb->conv);
    }
    free(s->rb);
    s->rb = NULL;
    s->rb_count = 0;
}

int k3_state_keep_blocks(k3_state *s, int n_blocks, rl_err *err) {
    if (n_blocks < 1) return rl_errf(err, "a sequence keeps at least one block for rollback, not %d", n_blocks);
    k3_rb_free(s);
    s->rb_max = n_blocks;
    return 0;
}

void k3_state_free(k3_state *s) {
    k3_rb_free(s);
    if (s->buf) ggml_backend_buffer_free(s->buf);
    if (s->ctx) ggml_free(s->ctx);
    k3_dev_free(s->dctx, s->dbuf);
    free(s->conv);
    free(s->delta);
    free(s->kcache);
    memset(s, 0, sizeof *s);
}

void k3_state_reset(k3_state *s) {
    /* Only the recurrent parts need zeros; the MLA cache is addressed by position. */
    for (uint32_t i = 0; i < s->b - s->a; i++) {
        if (s->conv[i]) ggml_backend_tensor_memset(s->conv[i], 0, 0, ggml_nbytes(s->conv[i]));
        if (s->delta[i]) ggml_backend_tensor_memset(s->delta[i], 0, 0, ggml_nbytes(s->delta[i]));
    }
    s->n_past = 0;
    s->rb_count = 0;
}

size_t k3_state_bytes(const k3_state *s) {
    if (!s->pool) {
        size_t n = s->buf ? ggml_backend_buffer_get_size(s->buf) : 0;
        for (int d = 0; d < K3_MAX_DEV; d++) n += s->dbuf[d] ? ggml_backend_buffer_get_size(s->dbuf[d]) : 0;
        return n;
    }
    size_t n = 0; /* a pooled state owns no buffer: count its slot */
    for (uint32_t i = 0; i < s->b - s->a; i++) {
        if (s->conv[i]) n += ggml_nbytes(s->conv[i]) + ggml_nbytes(s->delta[i]);
        if (s->kcache[i]) n += ggml_nbytes(s->kcache[i]);
    }
    return n;
}

size_t k3_state_rb_bytes(const k3_state *s) {
    size_t n = 0;
    for (int r = 0; s->rb && r <= s->rb_max; r++) {
        const k3_rb_block *rb = &s->rb[r];
        for (uint32_t i = 0; rb->delta && rb->cap && i < s->b - s->a; i++) {
            if (!s->conv[i]) continue;
            n += k3_rb_delta_bytes(s, i, rb->cap) + k3_rb_conv_bytes(s, i, rb->cap);
        }
    }
    return n;
}

static size_t k3_kda_bytes(const k3_state *s) {
    size_t n = 0;
    for (uint32_t i = 0; i < s->b - s->a; i++) {
        if (s->conv[i]) n += ggml_nbytes(s->conv[i]) + ggml_nbytes(s->delta[i]);
    }
    return n;
}

/* Copies the first n bytes of src into dst, wherever each lives: host memory directly, device memory
 * through its backend (with a host bounce between two device tensors). */
static int k3_tcopy(struct ggml_tensor *dst, const struct ggml_tensor *src, size_t n, rl_err *err) {
    const bool dh = ggml_backend_buffer_is_host(dst->buffer), sh = ggml_backend_buffer_is_host(src->buffer);
    if (dh && sh) {
        memcpy(dst->data, src->data, n);
    } else if (sh) {
        ggml_backend_tensor_set(dst, src->data, 0, n);
    } else if (dh) {
        ggml_backend_tensor_get(src, dst->data, 0, n);
    } else {
        void *tmp = malloc(n ? n : 1);
        if (!tmp) return rl_errf(err, "out of memory copying %zu bytes of state", n);
        ggml_backend_tensor_get(src, tmp, 0, n);
        ggml_backend_tensor_set(dst, tmp, 0, n);
        free(tmp);
    }
    return 0;
}

int k3_state_copy(k3_state *dst, const k3_state *src, rl_err *err) {
    if (dst == src) return 0;
    if (dst->a != src->a || dst->b != src->b || dst->n_ctx < src->n_past) {
        return rl_errf(err, "cannot copy a sequence of layers [%u, %u) at position %u into a state of layers [%u, %u) "
                       "holding %u tokens", src->a, src->b, src->n_past, dst->a, dst->b, dst->n_ctx);
    }
    for (uint32_t i = 0; i < src->b - src->a; i++) {
        if (src->conv[i] && (k3_tcopy(dst->conv[i], src->conv[i], ggml_nbytes(src->conv[i]), err) != 0 ||
                             k3_tcopy(dst->delta[i], src->delta[i], ggml_nbytes(src->delta[i]), err) != 0)) {
            return -1;
        }
        /* the cache rows written so far: rows are contiguous, position-major */
        if (src->kcache[i] && k3_tcopy(dst->kcache[i], src->kcache[i], (size_t)src->n_past * src->kcache[i]->nb[1], err) != 0) {
            return -1;
        }
    }
    dst->n_past = src->n_past;
    dst->rb_count = 0; /* its kept blocks belonged to its old history */
    return 0;
}

size_t k3_state_kda_bytes(const k3_state *s) { return k3_kda_bytes(s); }

size_t k3_state_rows_bytes(const k3_state *s, uint32_t n) {
    size_t b = 0;
    for (uint32_t i = 0; i < s->b - s->a; i++) {
        if (s->kcache[i]) b += (size_t)n * s->kcache[i]->nb[1];
    }
    return b;
}

int k3_state_rows_get(const k3_state *s, uint32_t n, uint8_t *dst, rl_err *err) {
    if (n > s->n_ctx) return rl_errf(err, "%u cache rows asked of a state holding %u", n, s->n_ctx);
    for (uint32_t i = 0; i < s->b - s->a; i++) {
        if (!s->kcache[i]) continue;
        const size_t len = (size_t)n * s->kcache[i]->nb[1]; /* rows are contiguous, position-major */
        ggml_backend_tensor_get(s->kcache[i], dst, 0, len);
        dst += len;
    }
    return 0;
}

int k3_state_rows_set(k3_state *s, uint32_t n, const uint8_t *src, rl_err *err) {
    if (n > s->n_ctx) return rl_errf(err, "%u cache rows given to a state holding %u", n, s->n_ctx);
    for (uint32_t i = 0; i < s->b - s->a; i++) {
        if (!s->kcache[i]) continue;
        const size_t len = (size_t)n * s->kcache[i]->nb[1];
        ggml_backend_tensor_set(s->kcache[i], src, 0, len);
        src += len;
    }
    return 0;
}

int k3_state_snapshot(const k3_state *s, k3_snapshot *snap, rl_err *err) {
    size_t need = k3_kda_bytes(s);
    if (snap->n_bytes != need) {
        uint8_t *p = realloc(snap->kda, need ? need : 1);
        if (!p) return rl_errf(err, "out of memory for a %zu-byte state snapshot", need);
        snap->kda = p;
        snap->n_bytes = need;
    }
    size_t off = 0;
    for (uint32_t i = 0; i < s->b - s->a; i++) {
        if (!s->conv[i]) continue;
        ggml_backend_tensor_get(s->conv[i], snap->kda + off, 0, ggml_nbytes(s->conv[i]));
        off += ggml_nbytes(s->conv[i]);
        ggml_backend_tensor_get(s->delta[i], snap->kda + off, 0, ggml_nbytes(s->delta[i]));
        off += ggml_nbytes(s->delta[i]);
    }
    snap->n_past = s->n_past;
    return 0;
}

int k3_state_restore(k3_state *s, const k3_snapshot *snap, rl_err *err) {
    if (snap->n_bytes != k3_kda_bytes(s)) return rl_errf(err, "snapshot does not belong to this state");
    size_t off = 0;
    for (uint32_t i = 0; i < s->b - s->a; i++) {
        if (!s->conv[i]) continue;
        ggml_backend_tensor_set(s->conv[i], snap->kda + off, 0, ggml_nbytes(s->conv[i]));
        off += ggml_nbytes(s->conv[i]);
        ggml_backend_tensor_set(s->delta[i], snap->kda + off, 0, ggml_nbytes(s->delta[i]));
        off += ggml_nbytes(s->delta[i]);
    }
    s->n_past = snap->n_past;
    s->rb_count = 0; /* the kept blocks belong to another history now */
    return 0;
}

int k3_state_rollback(k3_state *s, uint32_t pos, rl_err *err) {
    if (pos == s->n_past) return 0;
    int bi = -1;
    for (int r = 0; r < s->rb_count; r++) {
        if (pos > s->rb[r].start && pos <= s->rb[r].start + s->rb[r].n) bi = r;
    }
    const k3_rb_block *last = s->rb_count ? &s->rb[s->rb_count - 1] : NULL;
    if (bi < 0 || s->n_past != last->start + last->n) {
        return rl_errf(err, "cannot roll back to position %u: the kept blocks cover (%u, %u], the sequence is at %u", pos,
                       s->rb_count ? s->rb[0].start : 0, last ? last->start + last->n : 0, s->n_past);
    }
    const k3_rb_block *rb = &s->rb[bi];
    const uint32_t j = pos - rb->start; /* tokens of the block to keep: 1 .. n */
    for (uint32_t i = 0; i < s->b - s->a; i++) {
        if (!s->conv[i]) continue;
        struct ggml_tensor *d = s->delta[i], *c = s->conv[i];
        const size_t dsz = ggml_nbytes(d);
        ggml_backend_tensor_set(d, (const char *)rb->delta[i] + (size_t)(rb->n - j) * dsz, 0, dsz);
        /* Conv window after j tokens: the Kc-1 inputs ending with token j-1, i.e. columns j .. j+Kc-2 of the
         * kept inputs [window before | block], per channel (time is the fastest axis). Written in place in
         * host memory, else gathered on the host and set. */
        const int64_t kc1 = c->ne[0], di = c->ne[1], w = kc1 + rb->n;
        const bool host = ggml_backend_buffer_is_host(c->buffer);
        float *dst = host ? c->data : malloc(ggml_nbytes(c));
        if (!dst) return rl_errf(err, "out of memory rolling back a sequence");
        for (int64_t q = 0; q < 3; q++) {
            const float *src = rb->conv[i] + (size_t)q * (size_t)(w * di);
            for (int64_t ch = 0; ch < di; ch++) {
                memcpy(dst + (q * di + ch) * kc1, src + ch * w + j, (size_t)kc1 * sizeof(float));
            }
        }
        if (!host) {
            ggml_backend_tensor_set(c, dst, 0, ggml_nbytes(c));
            free(dst);
        }
    }
    s->n_past = pos;
    s->rb_count = j == rb->n ? bi + 1 : bi; /* the blocks that end by pos stay kept */
    return 0;
}

static void k3_rb_reverse(k3_rb_block *b, int n) {
    for (int i = 0, j = n - 1; i < j; i++, j--) {
        k3_rb_block t = b[i];
        b[i] = b[j];
        b[j] = t;
    }
}

void k3_state_rb_forget(k3_state *s, uint32_t pos) {
    int d = 0;
    while (d < s->rb_count && s->rb[d].start + s->rb[d].n <= pos) d++;
    if (d == 0) return;
    /* rb[0 .. rb_count) rotated left by d (three reversals): the forgotten blocks' buffers come right after
     * the kept ones, where the next kept block is written, before any spare never allocated. */
    k3_rb_reverse(s->rb, d);
    k3_rb_reverse(s->rb + d, s->rb_count - d);
    k3_rb_reverse(s->rb, s->rb_count);
    s->rb_count -= d;
}

int k3_state_rb_reserve(k3_state *s, uint32_t n, rl_err *err) {
    if (!s->rb) {
        if (s->rb_max < 1) s->rb_max = K3_RB_BLOCKS;
        s->rb = calloc((size_t)s->rb_max + 1, sizeof *s->rb);
        if (!s->rb) return rl_errf(err, "out of memory for rollback buffers");
        s->rb_count = 0;
    }
    const k3_rb_block *last = s->rb_count ? &s->rb[s->rb_count - 1] : NULL;
    /* Continues the kept blocks, or starts afresh; when all rb_max are kept, the spare slot takes it
     * and the oldest is dropped only once the pass has run (k3_state_rb_commit). */
    s->rb_next = last && last->start + last->n == s->n_past ? s->rb_count : 0;
    k3_rb_block *rb = &s->rb[s->rb_next];
    if (!rb->delta) {
        rb->delta = calloc(s->b - s->a, sizeof *rb->delta);
        rb->conv = calloc(s->b - s->a, sizeof *rb->conv);
        if (!rb->delta || !rb->conv) return rl_errf(err, "out of memory for rollback buffers");
    }
    if (n <= rb->cap) return 0;
    /* What the slot held is not needed: the pass about to run writes it. One mapping for every layer, in
     * huge pages (a drafter's block of one token is 9.8 MiB on `medium`, a verifier's block of 5 tokens 47
     * MiB; touched page by page, each took ~0.2 s the first time on this project's VM, where a fault costs
     * 16 us: base/heap.h). */
    const size_t al = 64;
    size_t total = 0;
    for (uint32_t i = 0; i < s->b - s->a; i++) {
        if (!s->conv[i]) continue;
        total += K3_ROUND_UP(k3_rb_delta_bytes(s, i, n), al) + K3_ROUND_UP(k3_rb_conv_bytes(s, i, n), al);
    }
    rl_heap_unmap(rb->mem, rb->mem_bytes);
    rb->cap = 0;
    rb->mem_bytes = total;
    if (!(rb->mem = rl_heap_map(total))) {
        rb->mem_bytes = 0;
        return rl_errf(err, "out of memory for rollback buffers of %u tokens (%.1f MiB)", n, (double)total / 1048576.0);
    }
    char *at = rb->mem;
    for (uint32_t i = 0; i < s->b - s->a; i++) {
        if (!s->conv[i]) continue;
        rb->delta[i] = (float *)at;
        at += K3_ROUND_UP(k3_rb_delta_bytes(s, i, n), al);
        rb->conv[i] = (float *)at;
        at += K3_ROUND_UP(k3_rb_conv_bytes(s, i, n), al);
    }
    rb->cap = n;
    return 0;
}

void k3_state_rb_commit(k3_state *s, bool keep, uint32_t start, uint32_t n) {
    if (!keep) {
        s->rb_count = 0; /* any other step makes the kept blocks another history */
        return;
    }
    s->rb[s->rb_next].start = start;
    s->rb[s->rb_next].n = n;
    s->rb_count = s->rb_next + 1;
    if (s->rb_count > s->rb_max) { /* drop the oldest: rotate its buffers to the spare slot */
        k3_rb_block old = s->rb[0];
        memmove(&s->rb[0], &s->rb[1], (size_t)s->rb_max * sizeof s->rb[0]);
        s->rb[s->rb_max] = old;
        s->rb_count = s->rb_max;
    }
}

void k3_snapshot_free(k3_snapshot *snap) {
    free(snap->kda);
    memset(snap, 0, sizeof *snap);
}
