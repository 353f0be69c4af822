#include "expert_cache.h"
#include "../base/clock.h"

#include "../base/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

static const char *const xc_proj[3] = {"ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"};

/* Layer il's three routed expert tensors (gate, up, down) in the file; -1 if one is missing. */
static int xc_layer_src(const mf_model *m, uint32_t il, const mf_tensor *src[3], char *name, size_t name_len) {
    for (int k = 0; k < 3; k++) {
        snprintf(name, name_len, "blk.%u.%s", il, xc_proj[k]);
        if (!(src[k] = mf_find(m, name))) return -1;
    }
    return 0;
}

/* ---- reads --------------------------------------------------------------------------------------- */

typedef struct xc_worker {
    xc_cache *c;
    uint8_t *bounce; /* a repacked projection is read here, then re-laid into its slot by set_tensor */
} xc_worker;

/* Fills one slot with one expert's three projections. Runs on an I/O thread: touches only the slot's
 * memory and the file, never the slot tables (the main thread's). */
static int xc_fill(xc_worker *w, const xc_job *j, int *from_copy, int *copied, char *msg, size_t msg_len) {
    xc_cache *c = w->c;
    const xc_pool *p = &c->pools[j->pool];
    const xc_layer *L = &c->layers[j->il - c->a];
    const uint32_t l = j->il - c->a;
    void *parts[3];
    for (int k = 0; k < 3; k++) parts[k] = (uint8_t *)p->t[k]->data + (size_t)j->slot * p->t[k]->nb[2];
    *from_copy = *copied = 0;
    if (c->copy_layer && c->copy_layer[l] && xcp_has(&c->copy, l, j->expert)) {
        /* Its slot bytes were kept: read as they are, no re-layout. A failed read falls back to the file. */
        if (xcp_read(&c->copy, l, j->expert, 3, parts, p->bytes) == 0) return *from_copy = 1, 0;
    }
    for (int k = 0; k < 3; k++) {
        const mf_tensor *src = L->src[k];
        const size_t n = p->bytes[k], off = src->offset + (size_t)j->expert * n;
        struct ggml_tensor *t = p->t[k];
        uint8_t *slot = (uint8_t *)t->data + (size_t)j->slot * t->nb[2];
        const bool direct = p->buft_k[k] < 0; /* plain host memory: read straight into the slot */
        int e = rl_pread_all(c->fds[src->split], direct ? slot : w->bounce, n, off);
        if (e != 0) {
            snprintf(msg, msg_len, "reading expert %u of layer %u (%s) from %s: %s", j->expert, j->il, xc_proj[k],
                     c->m->splits[src->split].path, e == EIO ? "file ends early" : strerror(e));
            return -1;
        }
        /* Advice only: the bytes are in the slot now, and pages left in the page cache would hold memory
         * the budget does not count. */
        (void)posix_fadvise(c->fds[src->split], (off_t)off, (off_t)n, POSIX_FADV_DONTNEED);
        if (!direct) {
            /* A one-expert descriptor over the slot: the repacking buffer re-lays whole tensors only, and
             * its layout keeps each expert's rows to themselves (interleaved groups never cross ne1). */
            struct ggml_tensor d = *t;
            d.ne[2] = 1;
            d.buffer = NULL;
            d.data = NULL;
            d.view_src = NULL;
            d.extra = NULL;
            if (ggml_backend_tensor_alloc(t->buffer, &d, slot) != GGML_STATUS_SUCCESS) {
                snprintf(msg, msg_len, "cannot place expert %u of layer %u in its slot", j->expert, j->il);
                return -1;
            }
            ggml_backend_tensor_set(&d, w->bounce, 0, n);
        }
    }
    /* Written before the slot is marked filled: once it is, it may be refilled under us. A failed write
     * leaves the expert absent from the copy, read from the file again next time. */
    if (c->copy_layer && c->copy_layer[l]) *copied = xcp_write(&c->copy, l, j->expert, 3, (const void *const *)parts, p->bytes) == 0;
    return 0;
}

static void *xc_thread(void *arg) {
    xc_worker *w = arg;
    xc_cache *c = w->c;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->stop && c->q_n == 0) pthread_cond_wait(&c->cv_job, &c->mu);
        if (c->q_n == 0 && c->stop) break;
        xc_job j = c->q[c->q_head];
        c->q_head = (c->q_head + 1) % c->q_cap;
        c->q_n--;
        c->busy++;
        pthread_mutex_unlock(&c->mu);
        char msg[256];
        int from_copy = 0, copied = 0;
        int rc = xc_fill(w, &j, &from_copy, &copied, msg, sizeof msg);
        pthread_mutex_lock(&c->mu);
        c->st.from_copy += (uint64_t)from_copy;
        c->st.copied += (uint64_t)copied;
        if (rc != 0 && !c->io_err[0]) snprintf(c->io_err, sizeof c->io_err, "%s", msg);
        __atomic_store_n(&c->pools[j.pool].loading[j.slot], 0, __ATOMIC_RELEASE);
        c->busy--;
        pthread_cond_broadcast(&c->cv_idle); /* waiters check for their slots, or for an idle queue */
    }
    pthread_mutex_unlock(&c->mu);
    free(w->bounce);
    free(w);
    return NULL;
}

/* Queues a slot fill: a read on demand goes first (the compute waits for it), a read ahead last. The queue
 * holds every slot at most once: a slot being filled is never a victim (xc_victim). */
static void xc_enqueue(xc_cache *c, int pool, int slot, uint32_t il, uint32_t expert, bool urgent) {
    pthread_mutex_lock(&c->mu);
    int at = urgent ? (c->q_head = (c->q_head + c->q_cap - 1) % c->q_cap) : (c->q_head + c->q_n) % c->q_cap;
    c->q[at] = (xc_job){.pool = pool, .slot = slot, .il = il, .expert = expert};
    c->q_n++;
    __atomic_store_n(&c->pools[pool].loading[slot], 1, __ATOMIC_RELEASE);
    pthread_cond_signal(&c->cv_job);
    pthread_mutex_unlock(&c->mu);
}

/* Takes the first read error, if any (the mutex held). The slot it was for holds garbage, and which slot
 * that was is the I/O thread's to know: the next layer planned starts from an empty cache (xc_flush). */
static int xc_take_err(xc_cache *c, rl_err *err) {
    if (!c->io_err[0]) return 0;
    rl_errf(err, "%s", c->io_err);
    c->io_err[0] = 0;
    c->flush = true;
    return -1;
}

int xc_wait(xc_cache *c, rl_err *err) {
    double t0 = rl_clock_now();
    pthread_mutex_lock(&c->mu);
    while (c->q_n > 0 || c->busy > 0) pthread_cond_wait(&c->cv_idle, &c->mu);
    int rc = xc_take_err(c, err);
    pthread_mutex_unlock(&c->mu);
    c->st.wait_s += rl_clock_now() - t0;
    return rc;
}

/* Blocks until none of the pool's pinned slots is being filled (the pass about to run reads them). */
static int xc_wait_pinned(xc_cache *c, const xc_pool *P, rl_err *err) {
    double t0 = rl_clock_now();
    pthread_mutex_lock(&c->mu);
    for (;;) {
        bool busy = false;
        for (int s = 0; s < P->n_slots && !busy; s++) busy = P->pin[s] && P->loading[s];
        if (!busy) break;
        pthread_cond_wait(&c->cv_idle, &c->mu);
    }
    int rc = xc_take_err(c, err);
    pthread_mutex_unlock(&c->mu);
    c->st.wait_s += rl_clock_now() - t0;
    return rc;
}

/* Blocks until some fill finishes (a victim may be free then). */
static void xc_wait_any(xc_cache *c, const xc_pool *P) {
    double t0 = rl_clock_now();
    pthread_mutex_lock(&c->mu);
    bool any = false;
    for (int s = 0; s < P->n_slots && !any; s++) any = P->loading[s] && !P->pin[s];
    if (any) pthread_cond_wait(&c->cv_idle, &c->mu);
    pthread_mutex_unlock(&c->mu);
    c->st.wait_s += rl_clock_now() - t0;
}

/* ---- setup --------------------------------------------------------------------------------------- */

static int xc_pool_of(xc_cache *c, const mf_tensor *const src[3], rl_err *err) {
    for (int p = 0; p < c->n_pools; p++) {
        bool same = true;
        for (int k = 0; k < 3; k++) {
            same &= c->pools[p].type[k] == src[k]->type && c->pools[p].ne[k][0] == src[k]->ne[0] &&
                    c->pools[p].ne[k][1] == src[k]->ne[1];
        }
        if (same) return p;
    }
    if (c->n_pools == XC_MAX_POOLS) return rl_errf(err, "more than %d kinds of routed expert in one range", XC_MAX_POOLS);
    xc_pool *p = &c->pools[c->n_pools];
    for (int k = 0; k < 3; k++) {
        p->type[k] = src[k]->type;
        p->ne[k][0] = src[k]->ne[0];
        p->ne[k][1] = src[k]->ne[1];
        p->bytes[k] = ggml_row_size((enum ggml_type)src[k]->type, src[k]->ne[0]) * (size_t)src[k]->ne[1];
        p->expert_bytes += p->bytes[k];
    }
    return c->n_pools++;
}

size_t xc_min_expert_bytes(const mf_model *m, const k3_hparams *hp, uint32_t a, uint32_t b) {
    xc_cache c = {0};
    rl_err err = {{0}};
    size_t n = 0;
    for (uint32_t il = a; il < b && il < hp->n_layer; il++) {
        if (!k3_is_moe(hp, il) || !k3_experts_on_cpu(hp, il)) continue;
        const mf_tensor *src[3];
        char name[96];
        if (xc_layer_src(m, il, src, name, sizeof name) != 0) return n; /* xc_open names what is missing */
        int before = c.n_pools, p = xc_pool_of(&c, src, &err);
        if (p < 0) return n;
        if (c.n_pools > before) n += 2 * c.pools[p].expert_bytes;
    }
    return n;
}

/* Tables and slot tensors of a pool whose n_slots is set. Each projection's tensor goes into the buffer type
 * the file's tensor would take (weight_place.h), so the same kernels run on the same layout. */
static int xc_pool_alloc(xc_cache *c, xc_pool *p, struct ggml_context *ctx, const mf_tensor *const src[3], rl_err *err) {
    const int S = p->n_slots;
    p->slot_layer = malloc((size_t)S * sizeof *p->slot_layer);
    p->slot_expert = malloc((size_t)S * sizeof *p->slot_expert);
    p->freq = calloc((size_t)S, sizeof *p->freq);
    p->last = calloc((size_t)S, sizeof *p->last);
    p->pin = calloc((size_t)S, 1);
    p->ahead = calloc((size_t)S, 1);
    p->loading = calloc((size_t)S, 1);
    if (!p->slot_layer || !p->slot_expert || !p->freq || !p->last || !p->pin || !p->ahead || !p->loading) {
        return rl_errf(err, "out of memory for the expert cache's tables");
    }
    for (int s = 0; s < S; s++) p->slot_layer[s] = p->slot_expert[s] = -1;
    for (int k = 0; k < 3; k++) {
        int bt = wp_choose(c->place, src[k]->type, src[k]->ne, WP_USE_MUL_MAT_ID, (int)c->k);
        p->buft_k[k] = bt;
        ggml_backend_buffer_type_t buft = bt >= 0 ? c->place->buft[bt] : ggml_backend_cpu_buffer_type();
        struct ggml_tensor *t = ggml_new_tensor_3d(ctx, (enum ggml_type)src[k]->type, p->ne[k][0], p->ne[k][1], S);
        size_t need = ggml_backend_buft_get_alloc_size(buft, t);
        p->buf[k] = ggml_backend_buft_alloc_buffer(buft, need);
        if (!p->buf[k]) {
            return rl_errf(err, "cannot allocate %.1f MiB for %d expert slots (%s)", (double)need / 1048576.0, S,
                           ggml_backend_buft_name(buft));
        }
        ggml_backend_buffer_set_usage(p->buf[k], GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
        if (ggml_backend_tensor_alloc(p->buf[k], t, ggml_backend_buffer_get_base(p->buf[k])) != GGML_STATUS_SUCCESS) {
            return rl_errf(err, "cannot place the expert slots");
        }
        /* Padding rows of a pass read slot 0 before anything is loaded into it: zeros keep them finite. */
        ggml_backend_buffer_clear(p->buf[k], 0);
        p->t[k] = t;
    }
    return 0;
}

int xc_open(xc_cache *c, const mf_model *m, const k3_hparams *hp, uint32_t a, uint32_t b, size_t cache_bytes,
            const wp_list *place, rl_err *err) {
    memset(c, 0, sizeof *c);
    c->a = a, c->b = b, c->n_expert = hp->n_expert, c->k = hp->n_expert_used, c->m = m, c->place = place;
    c->layers = calloc(b - a, sizeof *c->layers);
    c->fds = malloc((size_t)m->n_split * sizeof *c->fds);
    c->rank = malloc(hp->n_expert * sizeof *c->rank);
    if (!c->layers || !c->fds || !c->rank) {
        free(c->layers), free(c->fds), free(c->rank);
        memset(c, 0, sizeof *c);
        return rl_errf(err, "out of memory for the expert cache");
    }
    for (int s = 0; s < m->n_split; s++) c->fds[s] = -1;
    c->n_fds_open = m->n_split;
    /* Mutex and conditions first: xc_close takes them on every path from here. */
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv_job, NULL);
    pthread_cond_init(&c->cv_idle, NULL);
    c->sync_ok = true;

    const mf_tensor *first[XC_MAX_POOLS][3] = {{0}};
    int n_layers[XC_MAX_POOLS] = {0};
    for (uint32_t il = a; il < b; il++) {
        xc_layer *L = &c->layers[il - a];
        L->pool = -1;
        if (!k3_is_moe(hp, il) || !k3_experts_on_cpu(hp, il)) continue; /* a device layer's experts stay there */
        char name[96];
        if (xc_layer_src(m, il, L->src, name, sizeof name) != 0) {
            xc_close(c);
            return rl_errf(err, "layer %u: %s is missing", il, name);
        }
        for (int k = 0; k < 3; k++) {
            if (L->src[k]->ne[2] != (int64_t)hp->n_expert) {
                xc_close(c);
                return rl_errf(err, "layer %u: blk.%u.%s does not hold every expert", il, il, xc_proj[k]);
            }
            int s = L->src[k]->split;
            if (c->fds[s] < 0) {
                if ((c->fds[s] = open(m->splits[s].path, O_RDONLY | O_CLOEXEC)) < 0) {
                    int e = errno;
                    xc_close(c);
                    return rl_errf(err, "cannot open %s to read experts: %s", m->splits[s].path, strerror(e));
                }
                /* No kernel read-ahead: an expert is one read of its own, and the pages after it are another
                 * expert's, which a read-ahead would fetch for nothing (measured: ~10% faster decode). */
                (void)posix_fadvise(c->fds[s], 0, 0, POSIX_FADV_RANDOM);
            }
        }
        L->slot_of = malloc(hp->n_expert * sizeof *L->slot_of);
        if (!L->slot_of) {
            xc_close(c);
            return rl_errf(err, "out of memory for the expert cache");
        }
        for (uint32_t e = 0; e < hp->n_expert; e++) L->slot_of[e] = -1;
        if ((L->pool = xc_pool_of(c, L->src, err)) < 0) {
            xc_close(c);
            return -1;
        }
        if (!n_layers[L->pool]++) memcpy(first[L->pool], L->src, sizeof first[0]);
    }
    if (c->n_pools == 0) {
        xc_close(c);
        return rl_errf(err, "layers [%u, %u) have no routed experts to cache", a, b);
    }
    /* Two slots per kind first (a slot tensor of one would be 2-D, and the repacked kernels take only 3-D
     * expert tensors), the rest in proportion to the bytes each kind has in the range; a kind never gets
     * more slots than it has experts. */
    size_t min = 0, total = 0;
    for (int p = 0; p < c->n_pools; p++) {
        min += 2 * c->pools[p].expert_bytes;
        total += (size_t)n_layers[p] * hp->n_expert * c->pools[p].expert_bytes;
    }
    if (cache_bytes < min) {
        xc_close(c);
        return rl_errf(err, "%.1f MiB left for routed experts, below the %.1f MiB two of each kind need", (double)cache_bytes / 1048576.0,
                       (double)min / 1048576.0);
    }
    struct ggml_init_params ip = {.mem_size = (size_t)(3 * XC_MAX_POOLS + 4) * ggml_tensor_overhead(), .mem_buffer = NULL,
                                  .no_alloc = true};
    c->ctx = ggml_init(ip);
    if (!c->ctx) {
        xc_close(c);
        return rl_errf(err, "out of memory for the expert cache");
    }
    size_t rest = cache_bytes - min, bounce = 0;
    for (int p = 0; p < c->n_pools; p++) {
        xc_pool *P = &c->pools[p];
        const size_t all = (size_t)n_layers[p] * hp->n_expert, mine = all * P->expert_bytes;
        size_t extra = (size_t)((double)rest * ((double)mine / (double)total)) / P->expert_bytes;
        size_t n = 2 + extra;
        if (n > all) n = all;
        if (n > (1u << 30)) n = 1u << 30;
        P->n_slots = (int)n;
        if (xc_pool_alloc(c, P, c->ctx, first[p], err) != 0) {
            xc_close(c);
            return -1;
        }
        c->cache_bytes += n * P->expert_bytes;
        for (int k = 0; k < 3; k++) {
            if (P->buft_k[k] >= 0 && P->bytes[k] > bounce) bounce = P->bytes[k];
        }
    }
    int S = 0;
    for (int p = 0; p < c->n_pools; p++) S += c->pools[p].n_slots;
    c->q_cap = S + 1;
    c->q = malloc((size_t)c->q_cap * sizeof *c->q);
    if (!c->q) {
        xc_close(c);
        return rl_errf(err, "out of memory for the expert cache");
    }
    for (int i = 0; i < XC_IO_THREADS; i++) {
        xc_worker *w = calloc(1, sizeof *w);
        if (w) w->c = c;
        if (w && bounce) w->bounce = malloc(bounce);
        if (!w || (bounce && !w->bounce) || pthread_create(&c->th[c->n_th], NULL, xc_thread, w) != 0) {
            if (w) free(w->bounce);
            free(w);
            xc_close(c);
            return rl_errf(err, "cannot start the expert cache's reader threads");
        }
        c->n_th++;
    }
    return 0;
}

void xc_close(xc_cache *c) {
    if (c->sync_ok) {
        pthread_mutex_lock(&c->mu);
        c->stop = true;
        pthread_cond_broadcast(&c->cv_job);
        pthread_mutex_unlock(&c->mu);
        for (int i = 0; i < c->n_th; i++) pthread_join(c->th[i], NULL);
        pthread_mutex_destroy(&c->mu);
        pthread_cond_destroy(&c->cv_job);
        pthread_cond_destroy(&c->cv_idle);
    }
    for (int p = 0; p < c->n_pools; p++) {
        xc_pool *P = &c->pools[p];
        for (int k = 0; k < 3; k++) {
            if (P->buf[k]) ggml_backend_buffer_free(P->buf[k]);
        }
        free(P->slot_layer), free(P->slot_expert), free(P->freq), free(P->last), free(P->pin), free(P->ahead), free(P->loading);
    }
    if (c->layers) {
        for (uint32_t i = 0; i < c->b - c->a; i++) free(c->layers[i].slot_of);
    }
    if (c->copy_layer) xcp_close(&c->copy); /* (after the reader threads: the map is final) */
    free(c->copy_layer);
    for (int s = 0; c->fds && s < c->n_fds_open; s++) {
        if (c->fds[s] >= 0) close(c->fds[s]);
    }
    if (c->ctx) ggml_free(c->ctx);
    free(c->fds);
    free(c->layers);
    free(c->rank);
    free(c->q);
    memset(c, 0, sizeof *c);
}

int xc_copy_open(xc_cache *c, const char *copy_dir, rl_err *err) {
    const uint32_t n = c->b - c->a;
    uint64_t *stride = calloc(n, sizeof *stride);
    c->copy_layer = calloc(n, sizeof *c->copy_layer);
    if (!stride || !c->copy_layer) {
        free(stride);
        return rl_errf(err, "out of memory for the expert copy");
    }
    /* The key: whatever decides the bytes kept - the files, each copied layer's tensors, the slots' layouts
     * (the buffer type, and the CPU's features, by which the repacking picks its interleaving: a copy on a
     * shared disk must not serve a machine that lays the experts out otherwise). */
    uint64_t key = XCP_HASH_INIT;
    const int feat[] = {ggml_cpu_has_avx(), ggml_cpu_has_avx2(), ggml_cpu_has_avx512(), ggml_cpu_has_avx512_vnni(),
                        ggml_cpu_has_avx512_bf16(), ggml_cpu_has_avx512_vbmi(), ggml_cpu_has_avx_vnni(), ggml_cpu_has_fma(),
                        ggml_cpu_has_f16c(), ggml_cpu_has_amx_int8(), ggml_cpu_has_neon(), ggml_cpu_has_dotprod(),
                        ggml_cpu_has_matmul_int8(), ggml_cpu_has_sve(), ggml_cpu_has_sme(), ggml_cpu_has_riscv_v()};
    key = xcp_hash(key, feat, sizeof feat);
    bool any = false;
    for (int s = 0; s < c->m->n_split; s++) {
        struct stat st;
        const char *path = c->m->splits[s].path;
        if (!path || stat(path, &st) != 0) continue;
        key = xcp_hash(key, path, strlen(path) + 1);
        key = xcp_hash(key, &st.st_size, sizeof st.st_size);
        key = xcp_hash(key, &st.st_mtim, sizeof st.st_mtim);
    }
    for (uint32_t l = 0; l < n; l++) {
        const xc_layer *L = &c->layers[l];
        if (L->pool < 0) continue;
        const xc_pool *P = &c->pools[L->pool];
        bool repacked = false;
        for (int k = 0; k < 3; k++) repacked |= P->buft_k[k] >= 0;
        if (!repacked) continue; /* the file holds these as the slots do: read straight from it */
        c->copy_layer[l] = any = true;
        stride[l] = P->expert_bytes;
        const uint32_t il = c->a + l;
        key = xcp_hash(key, &il, sizeof il);
        for (int k = 0; k < 3; k++) {
            const char *bt = ggml_backend_buft_name(c->place->buft[P->buft_k[k] >= 0 ? P->buft_k[k] : 0]);
            key = xcp_hash(key, &L->src[k]->offset, sizeof L->src[k]->offset);
            key = xcp_hash(key, &L->src[k]->type, sizeof L->src[k]->type);
            key = xcp_hash(key, L->src[k]->ne, sizeof L->src[k]->ne);
            key = xcp_hash(key, &P->buft_k[k], sizeof P->buft_k[k]);
            if (P->buft_k[k] >= 0) key = xcp_hash(key, bt, strlen(bt));
        }
    }
    int rc = 0;
    if (any) rc = xcp_open(&c->copy, copy_dir, key, n, c->n_expert, stride, err);
    free(stride);
    if (!any || rc != 0) {
        free(c->copy_layer);
        c->copy_layer = NULL;
    }
    return rc;
}

/* ---- use ----------------------------------------------------------------------------------------- */

struct ggml_tensor *xc_tensor(const xc_cache *c, uint32_t il, int j) {
    const xc_layer *L = &c->layers[il - c->a];
    return L->pool < 0 ? NULL : c->pools[L->pool].t[j];
}

int xc_max_passes(const xc_cache *c, uint32_t il, int64_t n) {
    const xc_layer *L = &c->layers[il - c->a];
    if (L->pool < 0) return 0;
    int64_t distinct = n < (int64_t)c->n_expert ? n : (int64_t)c->n_expert, usable = c->pools[L->pool].n_slots;
    return (int)((distinct + usable - 1) / usable);
}

xc_stats xc_stats_sub(const xc_stats *b, const xc_stats *a) {
    return (xc_stats){.tokens = b->tokens - a->tokens, .needed = b->needed - a->needed, .hits = b->hits - a->hits,
                      .loads = b->loads - a->loads, .prefetched = b->prefetched - a->prefetched,
                      .prefetch_used = b->prefetch_used - a->prefetch_used, .bytes_read = b->bytes_read - a->bytes_read,
                      .bytes_used = b->bytes_used - a->bytes_used, .passes = b->passes - a->passes,
                      .wait_s = b->wait_s - a->wait_s, .from_copy = b->from_copy - a->from_copy,
                      .copied = b->copied - a->copied};
}

void xc_plan_free(xc_plan *p) {
    free(p->expert), free(p->order), free(p->group_of);
    memset(p, 0, sizeof *p);
}

/* Drops the reads ahead for layer il that have not started and that its router did not choose (rank[e] < 0):
 * a wrong guess then costs nothing, and the reads the layer needs do not queue behind it. */
static void xc_cancel_ahead(xc_cache *c, uint32_t il, const int *rank) {
    pthread_mutex_lock(&c->mu);
    int kept = 0;
    for (int i = 0; i < c->q_n; i++) {
        xc_job j = c->q[(c->q_head + i) % c->q_cap];
        xc_pool *P = &c->pools[j.pool];
        if (j.il != il || rank[j.expert] >= 0 || !P->ahead[j.slot]) {
            c->q[(c->q_head + kept++) % c->q_cap] = j;
            continue;
        }
        c->layers[il - c->a].slot_of[j.expert] = -1;
        P->slot_layer[j.slot] = P->slot_expert[j.slot] = -1;
        __atomic_store_n(&P->loading[j.slot], 0, __ATOMIC_RELEASE);
        P->ahead[j.slot] = 0;
        c->st.bytes_read -= P->expert_bytes;
        c->st.prefetched--;
    }
    c->q_n = kept;
    pthread_mutex_unlock(&c->mu);
}

/* Forgets every slot's expert (after a failed read), once no read is in flight. */
static void xc_flush(xc_cache *c) {
    rl_err ignored;
    (void)xc_wait(c, &ignored);
    for (int p = 0; p < c->n_pools; p++) {
        xc_pool *P = &c->pools[p];
        for (int s = 0; s < P->n_slots; s++) P->slot_layer[s] = P->slot_expert[s] = -1, P->ahead[s] = P->freq[s] = 0;
    }
    for (uint32_t i = 0; i < c->b - c->a; i++) {
        for (uint32_t e = 0; c->layers[i].slot_of && e < c->n_expert; e++) c->layers[i].slot_of[e] = -1;
    }
    c->flush = false;
}

int xc_plan_layer(xc_cache *c, uint32_t il, const int32_t *ids, int n_rows, xc_plan *p, rl_err *err) {
    memset(p, 0, sizeof *p);
    if (c->flush) xc_flush(c);
    const xc_layer *L = &c->layers[il - c->a];
    const xc_pool *P = &c->pools[L->pool];
    p->n_rows = n_rows;
    p->expert = malloc((size_t)n_rows * sizeof *p->expert);
    p->order = malloc((size_t)n_rows * sizeof *p->order);
    p->group_of = malloc((size_t)n_rows * sizeof *p->group_of);
    int *rank = c->rank; /* each expert's place among the distinct ones, -1: not chosen */
    if (!p->expert || !p->order || !p->group_of) {
        xc_plan_free(p);
        return rl_errf(err, "out of memory planning a layer's experts");
    }
    for (uint32_t e = 0; e < c->n_expert; e++) rank[e] = -1;
    /* Distinct experts in order of first use, the resident ones first (a group of them needs no reads). */
    for (int pass = 0; pass < 2; pass++) {
        for (int r = 0; r < n_rows; r++) {
            int32_t e = ids[r];
            if (e < 0 || (uint32_t)e >= c->n_expert) {
                xc_plan_free(p);
                return rl_errf(err, "layer %u: the router chose expert %d of %u", il, e, c->n_expert);
            }
            p->expert[r] = e;
            if (rank[e] >= 0 || (L->slot_of[e] >= 0) != (pass == 0)) continue;
            rank[e] = p->n_distinct;
            p->order[p->n_distinct++] = e;
        }
    }
    xc_cancel_ahead(c, il, rank);
    p->per_group = P->n_slots;
    p->n_groups = (p->n_distinct + p->per_group - 1) / p->per_group;
    for (int r = 0; r < n_rows; r++) p->group_of[r] = rank[p->expert[r]] / p->per_group;
    c->st.needed += (uint64_t)p->n_distinct;
    c->st.bytes_used += (uint64_t)p->n_distinct * P->expert_bytes;
    return 0;
}

/* The slot to (re)fill: an empty one, else the least frequently used, least recent among equals, of those
 * neither pinned nor being filled. -1 when there is none now. (loading is read without the mutex: only
 * this thread sets it, and an I/O thread clearing it early at worst makes a slot look busy for a moment.) */
static int xc_victim(const xc_pool *P) {
    int best = -1;
    for (int s = 0; s < P->n_slots; s++) {
        if (P->pin[s] || __atomic_load_n(&P->loading[s], __ATOMIC_ACQUIRE)) continue;
        if (P->slot_layer[s] < 0) return s;
        if (best < 0 || P->freq[s] < P->freq[best] || (P->freq[s] == P->freq[best] && P->last[s] < P->last[best])) best = s;
    }
    return best;
}

static void xc_assign(xc_cache *c, xc_pool *P, int pool, int s, uint32_t il, int32_t e) {
    if (P->slot_layer[s] >= 0) c->layers[(uint32_t)P->slot_layer[s] - c->a].slot_of[P->slot_expert[s]] = -1;
    P->slot_layer[s] = (int32_t)il;
    P->slot_expert[s] = e;
    c->layers[il - c->a].slot_of[e] = s;
    c->st.bytes_read += P->expert_bytes;
    xc_enqueue(c, pool, s, il, (uint32_t)e, !P->ahead[s]);
}

int xc_load_pass(xc_cache *c, uint32_t il, const xc_plan *p, int g, int32_t *slot_ids, rl_err *err) {
    xc_layer *L = &c->layers[il - c->a];
    const int pool = L->pool;
    xc_pool *P = &c->pools[pool];
    memset(P->pin, 0, (size_t)P->n_slots);
    const int lo = g * p->per_group, hi = lo + p->per_group < p->n_distinct ? lo + p->per_group : p->n_distinct;
    c->tick++;
    for (int i = lo; i < hi; i++) { /* residents first: pinned before any victim is chosen */
        int s = L->slot_of[p->order[i]];
        if (s < 0) continue;
        P->pin[s] = 1;
        P->freq[s]++;
        P->last[s] = c->tick;
        c->st.hits++;
        if (P->ahead[s]) c->st.prefetch_used++, P->ahead[s] = 0;
    }
    for (int i = lo; i < hi; i++) {
        int32_t e = p->order[i];
        if (L->slot_of[e] >= 0) continue;
        /* The group is at most the slots, so unpinned ones remain; some may be filling (reads ahead that
         * are not chosen now), and free up when done. */
        int s;
        while ((s = xc_victim(P)) < 0) xc_wait_any(c, P);
        P->ahead[s] = 0;
        xc_assign(c, P, pool, s, il, e);
        P->pin[s] = 1;
        P->freq[s] = 1;
        P->last[s] = c->tick;
        c->st.loads++;
    }
    if (xc_wait_pinned(c, P, err) != 0) return -1;
    for (int r = 0; r < p->n_rows; r++) slot_ids[r] = p->group_of[r] == g ? L->slot_of[p->expert[r]] : -1;
    c->st.passes++;
    /* Ageing: halve every count each time the range's layers have run about 16 times, so experts that were
     * hot long ago give way. */
    if (c->tick % (16u * (c->b - c->a)) == 0) {
        for (int s = 0; s < P->n_slots; s++) P->freq[s] >>= 1;
    }
    return 0;
}

void xc_prefetch(xc_cache *c, uint32_t il, const int32_t *ids, int n_rows) {
    xc_layer *L = &c->layers[il - c->a];
    if (L->pool < 0) return;
    xc_pool *P = &c->pools[L->pool];
    for (int r = 0; r < n_rows; r++) {
        int32_t e = ids[r];
        if (e < 0 || (uint32_t)e >= c->n_expert || L->slot_of[e] >= 0) continue;
        int s = xc_victim(P);
        /* A guess never evicts an expert in use lately: only empty slots and cold ones (counted at most
         * once since the last ageing) are taken. */
        if (s < 0 || (P->slot_layer[s] >= 0 && P->freq[s] > 1)) break;
        P->ahead[s] = 1;
        xc_assign(c, P, L->pool, s, il, e);
        P->pin[s] = 1; /* not evicted again by the rest of this guess */
        P->freq[s] = 0;
        P->last[s] = c->tick;
        c->st.prefetched++;
    }
}
