#include "manifest.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sodium.h>

#include "gguf.h"

bool manifest_tensor_in_range(const char *name, uint32_t a, uint32_t b, uint32_t n_layer) {
    unsigned il;
    if (sscanf(name, "blk.%u.", &il) == 1) return il >= a && il < b;
    if (strcmp(name, "token_embd.weight") == 0) return a == 0;
    return b == n_layer;
}

/* ---- canonical serialization into a running hash ---- */

static void h_bytes(crypto_generichash_state *h, const void *p, size_t n) { crypto_generichash_update(h, p, n); }
static void h_le(crypto_generichash_state *h, uint64_t v, int width) {
    uint8_t b[8];
    for (int i = 0; i < width; i++) b[i] = (uint8_t)(v >> (8 * i));
    crypto_generichash_update(h, b, (size_t)width);
}
static void h_u32(crypto_generichash_state *h, uint32_t v) { h_le(h, v, 4); }
static void h_u64(crypto_generichash_state *h, uint64_t v) { h_le(h, v, 8); }
static void h_str(crypto_generichash_state *h, const char *s, int len_width) {
    size_t n = strlen(s);
    h_le(h, n, len_width);
    h_bytes(h, s, n);
}

static int scalar_width(enum gguf_type t) {
    switch (t) {
    case GGUF_TYPE_UINT8:
    case GGUF_TYPE_INT8:
    case GGUF_TYPE_BOOL: return 1;
    case GGUF_TYPE_UINT16:
    case GGUF_TYPE_INT16: return 2;
    case GGUF_TYPE_UINT32:
    case GGUF_TYPE_INT32:
    case GGUF_TYPE_FLOAT32: return 4;
    case GGUF_TYPE_UINT64:
    case GGUF_TYPE_INT64:
    case GGUF_TYPE_FLOAT64: return 8;
    default: return 0;
    }
}

/* One scalar from host memory, little-endian. Values are read through memcpy of their own width, so the
 * bits hashed are the stored bits (floats included) on any host; bools are normalized to 0 or 1. */
static void h_scalar(crypto_generichash_state *h, enum gguf_type t, const void *p) {
    int w = scalar_width(t);
    uint64_t v = 0;
    if (w == 1) {
        uint8_t x;
        memcpy(&x, p, 1);
        v = t == GGUF_TYPE_BOOL ? (x != 0) : x;
    } else if (w == 2) {
        uint16_t x;
        memcpy(&x, p, 2);
        v = x;
    } else if (w == 4) {
        uint32_t x;
        memcpy(&x, p, 4);
        v = x;
    } else {
        memcpy(&v, p, 8);
    }
    h_le(h, v, w);
}

static bool key_excluded(const char *k) { return strncmp(k, "split.", 6) == 0 || strncmp(k, "ringlm.", 7) == 0; }

typedef struct key_ref {
    const char *key;
    int64_t id;
} key_ref;

static int key_cmp(const void *a, const void *b) {
    return strcmp(((const key_ref *)a)->key, ((const key_ref *)b)->key);
}

static int hash_meta(crypto_generichash_state *h, const struct gguf_context *g, rl_err *err) {
    int64_t n_kv = gguf_get_n_kv(g);
    key_ref *keys = calloc((size_t)n_kv + 1, sizeof *keys);
    if (!keys) return rl_errf(err, "out of memory");
    size_t n = 0;
    for (int64_t i = 0; i < n_kv; i++) {
        const char *k = gguf_get_key(g, i);
        if (!key_excluded(k)) keys[n++] = (key_ref){k, i};
    }
    qsort(keys, n, sizeof *keys, key_cmp);
    int rc = 0;
    h_u64(h, n);
    for (size_t i = 0; i < n && rc == 0; i++) {
        int64_t id = keys[i].id;
        enum gguf_type t = gguf_get_kv_type(g, id);
        h_str(h, keys[i].key, 4);
        h_u32(h, (uint32_t)t);
        if (t == GGUF_TYPE_STRING) {
            h_str(h, gguf_get_val_str(g, id), 8);
        } else if (t == GGUF_TYPE_ARRAY) {
            enum gguf_type at = gguf_get_arr_type(g, id);
            size_t an = gguf_get_arr_n(g, id);
            h_u32(h, (uint32_t)at);
            h_u64(h, an);
            if (at == GGUF_TYPE_STRING) {
                for (size_t j = 0; j < an; j++) h_str(h, gguf_get_arr_str(g, id, j), 8);
            } else if (scalar_width(at)) {
                const uint8_t *d = gguf_get_arr_data(g, id);
                int w = scalar_width(at);
                for (size_t j = 0; j < an; j++) h_scalar(h, at, d + j * (size_t)w);
            } else {
                rc = rl_errf(err, "metadata key %s: an array of %s cannot be hashed", keys[i].key, gguf_type_name(at));
            }
        } else if (scalar_width(t)) {
            h_scalar(h, t, gguf_get_val_data(g, id));
        } else {
            rc = rl_errf(err, "metadata key %s has unknown type %d", keys[i].key, (int)t);
        }
    }
    free(keys);
    return rc;
}

/* ---- tensor data hashes, in parallel ---- */

typedef struct item {
    const mf_tensor *t;
    int idx; /* where its hash goes in the caller's order */
    uint8_t hash[32];
} item;

typedef struct work {
    item *items; /* sorted by size, largest first (balances the threads) */
    int n;
    atomic_int next;
    const char *progress;     /* a bar on stderr with this label, or NULL */
    atomic_ullong done;       /* bytes hashed so far */
    unsigned long long total;
    pthread_mutex_t print;    /* whoever finishes a tensor redraws the bar, one at a time */
    int last_pct;             /* the bar's percentage, redrawn only when it changes (under print) */
} work;

static void hash_bar(work *w) {
    if (!w->progress || pthread_mutex_trylock(&w->print) != 0) return;
    unsigned long long d = atomic_load(&w->done);
    int pct = w->total ? (int)(100.0 * (double)d / (double)w->total) : 100, fill = pct * 40 / 100;
    if (pct == w->last_pct) {
        pthread_mutex_unlock(&w->print);
        return;
    }
    w->last_pct = pct;
    fprintf(stderr, "\r%s [", w->progress);
    for (int i = 0; i < 40; i++) fputc(i < fill ? '#' : ' ', stderr);
    fprintf(stderr, "] %3d%% %9.1f MiB", pct, (double)d / 1048576.0);
    fflush(stderr);
    pthread_mutex_unlock(&w->print);
}

static void *hash_worker(void *arg) {
    work *w = arg;
    for (int i; (i = atomic_fetch_add(&w->next, 1)) < w->n;) {
        crypto_generichash(w->items[i].hash, 32, w->items[i].t->data, w->items[i].t->nbytes, NULL, 0);
        atomic_fetch_add(&w->done, (unsigned long long)w->items[i].t->nbytes);
        hash_bar(w);
    }
    return NULL;
}

static int by_size_desc(const void *a, const void *b) {
    size_t x = ((const item *)a)->t->nbytes, y = ((const item *)b)->t->nbytes;
    return x > y ? -1 : x < y;
}

static int desc_by_name(const void *a, const void *b) {
    return strcmp(((const manifest_tensor *)a)->name, ((const manifest_tensor *)b)->name);
}

/* [a, b) inside the model, and a tensor of each of its layers among d[0..n). */
static int descs_check(const manifest_tensor *d, int n, uint32_t L, uint32_t a, uint32_t b, rl_err *err) {
    if (a >= b || b > L) return rl_errf(err, "layer range [%u, %u) is not inside the model's %u layers", a, b, L);
    bool *seen = calloc(b - a, 1);
    if (!seen) return rl_errf(err, "out of memory");
    for (int i = 0; i < n; i++) {
        unsigned il;
        if (sscanf(d[i].name, "blk.%u.", &il) == 1 && il >= a && il < b) seen[il - a] = true;
    }
    int rc = 0;
    for (uint32_t il = a; il < b && rc == 0; il++) {
        if (!seen[il - a]) rc = rl_errf(err, "the model holds no tensor of layer %u (needed for layers [%u, %u))", il, a, b);
    }
    free(seen);
    return rc;
}

int manifest_hash_descs(const struct gguf_context *meta, uint32_t n_layer, uint32_t a, uint32_t b, manifest_tensor *d, int n,
                    uint8_t out[32], rl_err *err) {
    if (descs_check(d, n, n_layer, a, b, err) != 0) return -1;
    qsort(d, (size_t)n, sizeof *d, desc_by_name);
    crypto_generichash_state h;
    crypto_generichash_init(&h, NULL, 0, 32);
    h_bytes(&h, "RLMF", 4);
    h_u32(&h, MANIFEST_VERSION);
    h_u32(&h, a);
    h_u32(&h, b);
    h_u32(&h, n_layer);
    if (hash_meta(&h, meta, err) != 0) return -1;
    h_u64(&h, (uint64_t)n);
    for (int k = 0; k < n; k++) {
        h_str(&h, d[k].name, 4);
        h_u32(&h, (uint32_t)d[k].type);
        for (int x = 0; x < 4; x++) h_u64(&h, (uint64_t)(x < d[k].n_dims ? d[k].ne[x] : 1));
        h_u64(&h, d[k].nbytes);
        h_bytes(&h, d[k].hash, 32);
    }
    crypto_generichash_final(&h, out, 32);
    return 0;
}

int manifest_hash_tensors(const mf_tensor *const *ts, int n, int n_threads, const char *progress, uint8_t (*out)[32]) {
    item *items = calloc((size_t)n + 1, sizeof *items);
    if (!items) return -1;
    unsigned long long total = 0;
    for (int i = 0; i < n; i++) items[i].t = ts[i], items[i].idx = i, total += ts[i]->nbytes;
    qsort(items, (size_t)n, sizeof *items, by_size_desc); /* largest first: balances the threads */
    work w = {.items = items, .n = n, .progress = progress, .total = total, .last_pct = -1};
    atomic_init(&w.next, 0);
    atomic_init(&w.done, 0);
    pthread_mutex_init(&w.print, NULL);
    if (n_threads <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = c < 1 ? 1 : c > 8 ? 8 : (int)c;
    }
    if (n_threads > 64) n_threads = 64;
    if (n_threads > n) n_threads = n;
    pthread_t th[64];
    int started = 0;
    for (int i = 1; i < n_threads; i++) {
        if (pthread_create(&th[started], NULL, hash_worker, &w) == 0) started++;
    }
    hash_worker(&w);
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    if (progress) {
        w.last_pct = -1; /* every worker has joined: draw the 100% a busy lock may have skipped */
        hash_bar(&w);
        fputc('\n', stderr);
    }
    pthread_mutex_destroy(&w.print);
    for (int i = 0; i < n; i++) memcpy(out[items[i].idx], items[i].hash, 32);
    free(items);
    return 0;
}

int manifest_range_hash_threads(const mf_model *m, const k3_hparams *hp, uint32_t a, uint32_t b, int n_threads,
                            uint8_t out[32], rl_err *err) {
    if (sodium_init() < 0) return rl_errf(err, "libsodium failed to initialise");
    const uint32_t L = hp->n_layer;
    const mf_tensor **ts = calloc((size_t)m->n_tensor + 1, sizeof *ts);
    manifest_tensor *d = calloc((size_t)m->n_tensor + 1, sizeof *d);
    uint8_t(*hs)[32] = calloc((size_t)m->n_tensor + 1, sizeof *hs);
    int n = 0, rc = -1;
    if (!ts || !d || !hs) {
        rl_errf(err, "out of memory");
        goto done;
    }
    for (int i = 0; i < m->n_tensor; i++) {
        const mf_tensor *t = &m->tensors[i];
        if (!manifest_tensor_in_range(t->name, a, b, L)) continue;
        ts[n] = t;
        d[n] = (manifest_tensor){.name = t->name, .type = t->type, .n_dims = t->n_dims, .nbytes = t->nbytes};
        memcpy(d[n].ne, t->ne, sizeof d[n].ne);
        n++;
    }
    /* The range is checked before the weights are hashed (the cost). */
    if (descs_check(d, n, L, a, b, err) != 0) goto done;
    if (manifest_hash_tensors(ts, n, n_threads, NULL, hs) != 0) {
        rl_errf(err, "out of memory");
        goto done;
    }
    for (int k = 0; k < n; k++) memcpy(d[k].hash, hs[k], 32);
    rc = manifest_hash_descs(m->meta, L, a, b, d, n, out, err);
done:
    free(ts);
    free(d);
    free(hs);
    return rc;
}

int manifest_range_hash(const mf_model *m, const k3_hparams *hp, uint32_t a, uint32_t b, uint8_t out[32], rl_err *err) {
    return manifest_range_hash_threads(m, hp, a, b, 0, out, err);
}
