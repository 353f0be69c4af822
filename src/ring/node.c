#include "node.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cJSON.h>
#include <sodium.h>
#include <sys/stat.h>
#include <zmq.h>

#include "ggml-cpu.h"
#include "ggml.h"

#include "../gguf/file_hash.h"
#include "../model/k3_forward.h"
#include "../model/k3_memory.h"
#include "../spec/accept.h"
#include "../text/sampler.h"
#include "../trust/manifest.h"
#include "../trust/receipt.h"
#include "frame.h"
#include "zsock.h"

#define NODE_MAX_MODELS 32

typedef struct node_model {
    char path[1024];
    char hash[65];      /* content hash of the whole model this file holds (or holds a range of) */
    uint64_t bytes;
    bool range;         /* a streamed range file: layers [a, b) only */
    uint32_t a, b;
} node_model;

/* A range file being received (FETCH_BEGIN .. FETCH_END). */
typedef struct node_fetch {
    bool active;
    FILE *f;
    char tmp[1100], final[1100];
    char hash[65];
    uint32_t a, b;
    uint64_t expect, written;
    crypto_generichash_state h;
    int last_pct;
} node_fetch;

typedef struct node_seq {
    bool used;
    uint64_t id;
    k3_state st;
    smp_sampler smp;
    bool has_smp;
} node_seq;

typedef struct node {
    const node_opts *o;
    void *zctx;
    zs_auth auth;
    void *router, *next;
    char coord_id[256];
    size_t coord_id_len;
    uint64_t cur_ring; /* ring_id of the frame being handled; replies carry it, so a coordinator can tell an
                        * error about an earlier ring's frame (sent late) from one about its own */
    node_model models[NODE_MAX_MODELS];
    int n_models;
    char cache_dir[1024];
    node_fetch fetch;
    double speed; /* bytes of weights per second in a matrix-vector product */
    /* the assignment */
    bool loaded;
    char hash[65];
    mf_model m;
    k3_hparams hp;
    k3_engine e;
    uint32_t a, b, n_ctx;
    int stage, n_stages, wire;
    node_seq seqs[RF_MAX_SEQS];
    uint8_t manifest[32]; /* mfst_range_hash of the assigned range, computed at the first signed receipt */
    bool have_manifest;
} node;

static void node_log(const node *n, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void node_log(const node *n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "ringlm node %s: ", n->o->listen);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* ---- startup: models held, memory, a speed probe ------------------------------------------------ */

static void node_scan_models(node *n) {
    if (!n->o->models_dir) return;
    DIR *d = opendir(n->o->models_dir);
    if (!d) {
        node_log(n, "cannot read --models %s: %s", n->o->models_dir, strerror(errno));
        return;
    }
    struct dirent *de;
    while ((de = readdir(d)) && n->n_models < NODE_MAX_MODELS) {
        size_t len = strlen(de->d_name);
        if (len < 6 || strcmp(de->d_name + len - 5, ".gguf") != 0) continue;
        /* A split set is opened through any member; list it once, by its first. */
        const char *of = strstr(de->d_name, "-of-");
        if (of && len >= 20 && strncmp(of - 6, "-00001", 6) != 0) continue;
        node_model *nm = &n->models[n->n_models];
        snprintf(nm->path, sizeof nm->path, "%s/%s", n->o->models_dir, de->d_name);
        mf_model m;
        rl_err err;
        if (mf_open(&m, nm->path, &err) != 0) {
            node_log(n, "skipping %s: %s", nm->path, err.msg);
            continue;
        }
        int rc = fh_model_hash(&m, nm->hash, &err);
        nm->bytes = m.tensor_bytes;
        mf_close(&m);
        if (rc != 0) {
            node_log(n, "skipping %s: %s", nm->path, err.msg);
            continue;
        }
        n->n_models++;
    }
    closedir(d);
}

/* Range files from earlier runs: "<model hash>-<a>-<b>.gguf" in the cache folder. */
static void node_scan_cache(node *n) {
    DIR *d = opendir(n->cache_dir);
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d)) && n->n_models < NODE_MAX_MODELS) {
        char hash[65];
        unsigned a, b;
        char tail[8];
        if (strlen(de->d_name) < 70 || sscanf(de->d_name, "%64[0-9a-f]-%u-%u%7s", hash, &a, &b, tail) != 4 ||
            strcmp(tail, ".gguf") != 0 || b <= a) {
            continue;
        }
        node_model *nm = &n->models[n->n_models++];
        snprintf(nm->path, sizeof nm->path, "%s/%s", n->cache_dir, de->d_name);
        snprintf(nm->hash, sizeof nm->hash, "%s", hash);
        nm->range = true;
        nm->a = a;
        nm->b = b;
    }
    closedir(d);
}

static uint64_t node_mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    }
    fclose(f);
    return (uint64_t)kb * 1024;
}

/* Times a q8_0 matrix-vector product on 64 MiB of weights: the shape of decoding, where every weight
 * byte is read once per token. Result in bytes of weights per second. */
static double node_probe_speed(int threads) {
    const int64_t rows = 8192, cols = 7680; /* 7680 = 240 q8_0 blocks; 64 MiB at 34 bytes per block */
    struct ggml_init_params ip = {.mem_size = (size_t)rows * cols * 34 / 32 + (8 << 20), .mem_buffer = NULL,
                                  .no_alloc = false};
    struct ggml_context *c = ggml_init(ip);
    if (!c) return 1e9;
    struct ggml_tensor *w = ggml_new_tensor_2d(c, GGML_TYPE_Q8_0, cols, rows);
    struct ggml_tensor *x = ggml_new_tensor_2d(c, GGML_TYPE_F32, cols, 1);
    memset(w->data, 0, ggml_nbytes(w));
    memset(x->data, 0, ggml_nbytes(x));
    struct ggml_cgraph *g = ggml_new_graph(c);
    ggml_build_forward_expand(g, ggml_mul_mat(c, w, x));
    double best = 1e30;
    for (int r = 0; r < 4; r++) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        ggml_graph_compute_with_ctx(c, g, threads);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double dt = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
        if (dt < best) best = dt;
    }
    double bps = (double)ggml_nbytes(w) / best;
    ggml_free(c);
    return bps;
}

/* ---- replies ----------------------------------------------------------------------------------- */

static int node_reply(node *n, int type, uint64_t step, const void *payload, size_t len) {
    rf_header h = {.type = (uint16_t)type, .ring_id = n->cur_ring, .step_id = step, .payload_bytes = len};
    uint8_t hb[64];
    rf_header_encode(&h, hb);
    const void *parts[3] = {n->coord_id, hb, payload ? payload : ""};
    size_t lens[3] = {n->coord_id_len, rf_header_size(0), len};
    rl_err err;
    if (zs_send(n->router, parts, lens, 3, true, &err) != 0) {
        node_log(n, "cannot reach the coordinator: %s", err.msg);
        return -1;
    }
    return 0;
}

static void node_error(node *n, uint64_t step, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void node_error(node *n, uint64_t step, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    node_log(n, "error: %s", msg);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "msg", msg);
    cJSON_AddStringToObject(j, "node", n->o->listen);
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (s && n->coord_id_len) node_reply(n, RF_ERROR, step, s, strlen(s));
    free(s);
}

static void node_info(node *n) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "version", RF_VERSION);
    cJSON_AddStringToObject(j, "pubkey", n->o->id.pk_hex);
    uint64_t mem = n->o->mem_gb > 0 ? (uint64_t)(n->o->mem_gb * 1073741824.0) : node_mem_available();
    cJSON_AddNumberToObject(j, "mem_bytes", (double)mem);
    cJSON_AddNumberToObject(j, "threads", n->o->threads);
    cJSON_AddStringToObject(j, "backend", "cpu");
    cJSON_AddNumberToObject(j, "speed_bps", n->speed);
    cJSON *ms = cJSON_AddArrayToObject(j, "models");
    for (int i = 0; i < n->n_models; i++) {
        cJSON *m = cJSON_CreateObject();
        const char *base = strrchr(n->models[i].path, '/');
        cJSON_AddStringToObject(m, "name", base ? base + 1 : n->models[i].path);
        cJSON_AddStringToObject(m, "hash", n->models[i].hash);
        cJSON_AddNumberToObject(m, "bytes", (double)n->models[i].bytes);
        if (n->models[i].range) {
            cJSON_AddNumberToObject(m, "a", n->models[i].a);
            cJSON_AddNumberToObject(m, "b", n->models[i].b);
        }
        cJSON_AddItemToArray(ms, m);
    }
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (s) node_reply(n, RF_INFO, 0, s, strlen(s));
    free(s);
}

/* ---- assignment -------------------------------------------------------------------------------- */

static void node_drop_seqs(node *n) {
    for (int i = 0; i < RF_MAX_SEQS; i++) {
        node_seq *q = &n->seqs[i];
        if (!q->used) continue;
        k3_state_free(&q->st);
        if (q->has_smp) smp_free(&q->smp);
        memset(q, 0, sizeof *q);
    }
}

static void node_unload(node *n) {
    node_drop_seqs(n);
    if (n->loaded) {
        k3_engine_free(&n->e);
        mf_close(&n->m);
    }
    n->loaded = false;
}

static const char *jstr(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}
static double jnum(const cJSON *o, const char *k, double def) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : def;
}

static void node_assign(node *n, uint64_t step, const char *json, size_t len) {
    cJSON *j = cJSON_ParseWithLength(json, len);
    if (!j) {
        node_error(n, step, "ASSIGN is not valid JSON");
        return;
    }
    const char *hash = jstr(j, "model_hash");
    double a = jnum(j, "a", -1), b = jnum(j, "b", -1), n_ctx = jnum(j, "n_ctx", 4096);
    const cJSON *next = cJSON_GetObjectItemCaseSensitive(j, "next");
    const char *upstream = jstr(j, "upstream");
    if (!hash || a < 0 || b <= a || n_ctx < 1 || n_ctx > (1 << 24)) {
        node_error(n, step, "ASSIGN lacks model_hash or a valid layer range / n_ctx");
        goto done;
    }
    const char *path = NULL;
    bool range_file = false;
    for (int i = 0; i < n->n_models && !path; i++) {
        if (strcmp(n->models[i].hash, hash) == 0 && !n->models[i].range) path = n->models[i].path;
    }
    for (int i = 0; i < n->n_models && !path; i++) {
        const node_model *nm = &n->models[i];
        if (nm->range && strcmp(nm->hash, hash) == 0 && nm->a <= (uint32_t)a && nm->b >= (uint32_t)b) {
            path = nm->path;
            range_file = true;
        }
    }
    if (!path) {
        node_error(n, step, "model %.16s... is not among this node's models (--models %s)", hash,
                   n->o->models_dir ? n->o->models_dir : "not given");
        goto done;
    }
    rl_err err;
    bool same = n->loaded && strcmp(n->hash, hash) == 0 && n->a == (uint32_t)a && n->b == (uint32_t)b;
    node_drop_seqs(n);
    if (!same) {
        node_unload(n);
        if ((range_file ? k3_open_range(&n->m, &n->hp, path, (uint32_t)a, (uint32_t)b, &err)
                        : k3_open(&n->m, &n->hp, path, &err)) != 0) {
            node_error(n, step, "%s", err.msg);
            goto done;
        }
        if ((uint32_t)b > n->hp.n_layer) {
            node_error(n, step, "layer range [%g, %g) beyond the model's %u layers", a, b, n->hp.n_layer);
            mf_close(&n->m);
            goto done;
        }
        if (k3_engine_init(&n->e, &n->m, &n->hp, (uint32_t)a, (uint32_t)b, n->o->threads, &err) != 0) {
            node_error(n, step, "%s", err.msg);
            mf_close(&n->m);
            goto done;
        }
        k3_weights_prefault(&n->e.w, false);
        n->loaded = true;
        n->have_manifest = false;
        snprintf(n->hash, sizeof n->hash, "%s", hash);
        n->a = (uint32_t)a;
        n->b = (uint32_t)b;
    }
    n->n_ctx = (uint32_t)n_ctx;
    n->stage = (int)jnum(j, "stage", 0);
    n->n_stages = (int)jnum(j, "n_stages", 1);
    const char *wire = jstr(j, "wire");
    n->wire = wire && strcmp(wire, "f16") == 0 ? K3_WIRE_F16 : wire && strcmp(wire, "bf16") == 0 ? K3_WIRE_BF16 : K3_WIRE_F32;

    /* Neighbours: trust exactly the upstream key we were given; connect to the downstream one. */
    zs_auth_forget(&n->auth, "upstream");
    if (upstream) {
        rk_peer up;
        if (rk_peer_parse(&up, upstream, &err) != 0) {
            node_error(n, step, "upstream key: %s", err.msg);
            goto done;
        }
        zs_auth_allow(&n->auth, up.curve_pk, "upstream");
    }
    if (n->next) zmq_close(n->next);
    n->next = NULL;
    if (cJSON_IsObject(next)) {
        const char *addr = jstr(next, "addr"), *pk = jstr(next, "pubkey");
        rk_peer down;
        if (!addr || !pk || rk_peer_parse(&down, pk, &err) != 0) {
            node_error(n, step, "ASSIGN's next hop lacks addr or a valid pubkey");
            goto done;
        }
        char rid[80];
        snprintf(rid, sizeof rid, "node-%.16s", n->o->id.pk_hex);
        n->next = zs_client(n->zctx, addr, &n->o->id, down.curve_pk_z85, rid, &err);
        if (!n->next) {
            node_error(n, step, "next hop %s: %s", addr, err.msg);
            goto done;
        }
        /* Answer READY only once the encrypted link downstream is up: a broken ring shows now. */
        zs_monitor mon;
        bool have_mon = zs_monitor_start(&mon, n->zctx, n->next, "next", &err) == 0;
        bool up = zs_wait_writable(n->next, 10000);
        if (have_mon) {
            zs_monitor_poll(&mon);
            zmq_socket_monitor(n->next, NULL, 0);
            zs_monitor_stop(&mon);
        }
        if (!up) {
            node_error(n, step, "cannot connect to the next stage %s within 10 s%s%s", addr, have_mon && mon.last[0] ? ": " : "",
                       have_mon ? mon.last : "");
            zmq_close(n->next);
            n->next = NULL;
            goto done;
        }
    }
    node_log(n, "stage %d of %d: layers [%u, %u) of %.12s..., %s", n->stage + 1, n->n_stages, n->a, n->b, n->hash,
             n->next ? "forwarding downstream" : "last stage, returning to the coordinator");
    cJSON *r = cJSON_CreateObject();
    cJSON_AddNumberToObject(r, "a", n->a);
    cJSON_AddNumberToObject(r, "b", n->b);
    cJSON_AddNumberToObject(r, "weight_bytes", (double)k3_range_weight_bytes(&n->m, &n->hp, n->a, n->b));
    char *s = cJSON_PrintUnformatted(r);
    cJSON_Delete(r);
    if (s) node_reply(n, RF_READY, step, s, strlen(s));
    free(s);
done:
    cJSON_Delete(j);
}

/* ---- forward ----------------------------------------------------------------------------------- */

static node_seq *node_find_seq(node *n, uint64_t id, bool create) {
    node_seq *free_slot = NULL;
    for (int i = 0; i < RF_MAX_SEQS; i++) {
        if (n->seqs[i].used && n->seqs[i].id == id) return &n->seqs[i];
        if (!n->seqs[i].used && !free_slot) free_slot = &n->seqs[i];
    }
    if (!create || !free_slot) return NULL;
    free_slot->used = true;
    free_slot->id = id;
    return free_slot;
}

#define SPEC_BLOCK_MAX 32

/* Index of sequence i's first token in the frame's token list. */
static uint32_t node_seq_offset(const rf_header *h, uint32_t i) {
    uint32_t off = 0;
    for (uint32_t k = 0; k < i; k++) off += h->seqs[k].n_tokens;
    return off;
}

static void node_free_seq(node_seq *q) {
    k3_state_free(&q->st);
    if (q->has_smp) smp_free(&q->smp);
    memset(q, 0, sizeof *q);
}


/* Signs this stage's receipt for one traversal and sends it to the coordinator (out of band). */
static void node_send_receipt(node *n, const rf_header *h, const rf_receipts *rx, const void *in, size_t in_len,
                              const void *out_bytes, size_t out_len) {
    rl_err err;
    rcpt_receipt *r = calloc(1, sizeof *r);
    rcpt_seq sq[RF_MAX_SEQS];
    uint8_t packed[RCPT_MAX_PACKED];
    size_t packed_len = 0;
    for (uint32_t i = 0; i < h->n_seqs; i++) {
        sq[i] = (rcpt_seq){.seq_id = h->seqs[i].seq_id, .pos = h->seqs[i].pos, .n_tokens = h->seqs[i].n_tokens};
    }
    int ok = r != NULL;
    if (ok && !n->have_manifest) {
        ok = mfst_range_hash(&n->m, &n->hp, n->a, n->b, n->manifest, &err) == 0;
        n->have_manifest = ok;
    }
    if (ok) {
        r->ring_id = h->ring_id;
        r->request_id = h->step_id;
        memcpy(r->nonce, rx->nonce, 32);
        memcpy(r->manifest, n->manifest, 32);
        r->layer_start = n->a;
        r->layer_end = n->b;
        rcpt_hash(in, in_len, r->in_hash);
        rcpt_hash(out_bytes, out_len, r->out_hash);
        ok = rcpt_set_seqs(r, sq, h->n_seqs, &err) == 0 && rcpt_sign(r, &n->o->id, &err) == 0 &&
             rcpt_pack(r, packed, sizeof packed, &packed_len, &err) == 0;
    }
    free(r);
    if (!ok) {
        node_error(n, h->step_id, "cannot sign a receipt: %s", err.msg);
        return;
    }
    node_reply(n, RF_RECEIPT, h->step_id, packed, packed_len);
}

static void node_forward(node *n, const zs_parts *p, const rf_header *h) {
    rl_err err;
    double t_recv = rf_now();
    if (!n->loaded) {
        node_error(n, h->step_id, "FORWARD before ASSIGN");
        return;
    }
    if (p->n < 4) {
        node_error(n, h->step_id, "FORWARD with %d parts, expected 4", p->n - 1);
        return;
    }
    rf_stamp stamps[RF_MAX_STAMPS + 1];
    uint32_t n_stamps = 0;
    if (rf_stamps_decode(stamps, &n_stamps, p->data[3], p->len[3], &err) != 0 || n_stamps >= RF_MAX_STAMPS) {
        node_error(n, h->step_id, "FORWARD: %s", n_stamps >= RF_MAX_STAMPS ? "too many hops" : err.msg);
        return;
    }
    /* Receipts: when the coordinator asks (the extension with its nonce), this stage signs what it ran. */
    rf_receipts rx;
    int want_receipt = rf_receipts_decode(&rx, p->data[3], p->len[3], &err);
    if (want_receipt < 0 || (want_receipt == 0 && rx.n >= RF_MAX_RECEIPTS)) {
        node_error(n, h->step_id, "FORWARD: %s", want_receipt < 0 ? err.msg : "too many receipts");
        return;
    }
    want_receipt = want_receipt == 0;
    /* Payload: the tokens of every sequence (int32), then for later stages the boundary state. */
    uint64_t total = 0;
    for (uint32_t i = 0; i < h->n_seqs; i++) total += h->seqs[i].n_tokens;
    if (h->n_seqs == 0 || total == 0 || total > n->n_ctx * (uint64_t)h->n_seqs || p->len[2] < total * 4 ||
        p->len[2] != h->payload_bytes) {
        node_error(n, h->step_id, "FORWARD payload of %zu bytes does not fit %u sequences / %" PRIu64 " tokens",
                   p->len[2], h->n_seqs, total);
        return;
    }
    const int32_t *tokens = (const int32_t *)p->data[2];
    k3_boundary in = {0};
    if (n->a > 0) {
        if (k3_boundary_decode(&in, (const uint8_t *)p->data[2] + total * 4, p->len[2] - total * 4, (uint32_t)total,
                               n->hp.n_embd, &err) != 0) {
            node_error(n, h->step_id, "FORWARD: %s", err.msg);
            return;
        }
    }
    k3_state *states[RF_MAX_SEQS];
    uint32_t ntok[RF_MAX_SEQS];
    uint8_t keep[RF_MAX_SEQS] = {0};
    int32_t *rows = malloc((total + 1) * sizeof *rows);
    int n_rows = 0;
    bool last = n->b == n->hp.n_layer;
    uint32_t off = 0;
    for (uint32_t i = 0; i < h->n_seqs; i++) {
        const rf_seq *s = &h->seqs[i];
        node_seq *q = node_find_seq(n, s->seq_id, (s->flags & RF_SEQ_NEW) != 0);
        for (uint32_t k = 0; k < i && q; k++) {
            if (h->seqs[k].seq_id == s->seq_id) q = NULL; /* listed twice */
        }
        if (!q) {
            node_error(n, h->step_id, "sequence %" PRIu64 " is unknown here, listed twice, or no slot is free", s->seq_id);
            goto out;
        }
        if (s->flags & RF_SEQ_NEW) {
            if (s->pos != 0) {
                node_error(n, h->step_id, "new sequence %" PRIu64 " must start at position 0", s->seq_id);
                goto out;
            }
            if (q->st.ctx) k3_state_reset(&q->st);
            else if (k3_state_init(&q->st, &n->hp, n->a, n->b, n->n_ctx, &err) != 0) {
                node_free_seq(q);
                node_error(n, h->step_id, "%s", err.msg);
                goto out;
            }
            if (last) {
                if (q->has_smp) smp_free(&q->smp);
                smp_params sp = {.seed = s->smp.seed, .temperature = s->smp.temperature, .top_k = s->smp.top_k,
                                 .top_p = s->smp.top_p, .min_p = s->smp.min_p, .repeat_penalty = s->smp.repeat_penalty,
                                 .frequency_penalty = s->smp.frequency_penalty,
                                 .presence_penalty = s->smp.presence_penalty, .penalty_last_n = s->smp.penalty_last_n};
                q->has_smp = smp_init(&q->smp, &sp, (int32_t)n->hp.n_vocab, &err) == 0;
                if (!q->has_smp) {
                    node_error(n, h->step_id, "%s", err.msg);
                    goto out;
                }
            }
        } else if (s->pos < q->st.n_past) {
            /* Speculation: the last verified block was only partly accepted; drop the rest. */
            if (k3_state_rollback(&q->st, s->pos, &err) != 0) {
                node_error(n, h->step_id, "sequence %" PRIu64 ": %s", s->seq_id, err.msg);
                goto out;
            }
        } else if (s->pos != q->st.n_past) {
            node_error(n, h->step_id, "sequence %" PRIu64 " is at position %u here, the frame says %u", s->seq_id,
                       q->st.n_past, s->pos);
            goto out;
        }
        keep[i] = (s->flags & RF_SEQ_VERIFY) != 0;
        states[i] = &q->st;
        ntok[i] = s->n_tokens;
        if (last) {
            if (s->flags & (RF_SEQ_ALL_LOGITS | RF_SEQ_VERIFY)) {
                for (uint32_t t = 0; t < s->n_tokens; t++) rows[n_rows++] = (int32_t)(off + t);
            } else if (!(s->flags & RF_SEQ_NO_SAMPLE)) {
                rows[n_rows++] = (int32_t)(off + s->n_tokens - 1);
            }
            /* Penalty history follows the inputs; a VERIFY block's inputs are accepted as they are judged. */
            if (q->has_smp && !(s->flags & RF_SEQ_VERIFY)) {
                for (uint32_t t = 0; t < s->n_tokens; t++) smp_accept(&q->smp, tokens[off + t]);
            }
        }
        off += s->n_tokens;
    }
    double t_start = rf_now();
    k3_batch b = {.n_seqs = (int)h->n_seqs, .seqs = states, .n_tokens = ntok, .tokens = tokens, .in = n->a > 0 ? &in : NULL,
                  .keep_rollback = keep,
                  .n_logits = last ? n_rows : 0, .logit_rows = rows};
    k3_output o;
    if (k3_forward(&n->e, &b, &o, &err) != 0) {
        node_error(n, h->step_id, "%s", err.msg);
        goto out;
    }
    double t_end = rf_now();
    stamps[n_stamps++] = (rf_stamp){.stage = (uint32_t)n->stage, .n_tokens = (uint32_t)total, .t_recv = t_recv,
                                    .t_start = t_start, .t_end = t_end};
    rf_header oh = *h;
    uint8_t *payload = NULL;
    size_t plen = 0;
    if (!last) {
        plen = total * 4 + k3_boundary_wire_size(&o.out, (enum k3_wire_dtype)n->wire);
        payload = malloc(plen);
        if (payload) {
            memcpy(payload, tokens, total * 4);
            k3_boundary_encode(&o.out, (enum k3_wire_dtype)n->wire, payload + total * 4);
        }
    } else {
        /* One int32 per sequence (the sampled token, -1 if none was asked, or for VERIFY the number of
         * committed tokens), then the logits rows that were asked, then the committed tokens. */
        size_t n_logit_floats = 0;
        for (uint32_t i = 0; i < h->n_seqs; i++) {
            if (h->seqs[i].flags & RF_SEQ_ALL_LOGITS) n_logit_floats += (size_t)h->seqs[i].n_tokens * n->hp.n_vocab;
        }
        int32_t committed[RF_MAX_SEQS][SPEC_BLOCK_MAX];
        int n_comm[RF_MAX_SEQS] = {0};
        size_t n_comm_total = 0;
        /* The drafts' distributions (RF_SEQ_HAS_Q) from the 4th part, parsed per VERIFY sequence. */
        const uint8_t *qp = p->n > 4 ? p->data[4] : NULL, *qend = qp ? qp + p->len[4] : NULL;
        int row0 = 0;
        for (uint32_t i = 0; i < h->n_seqs; i++) {
            const rf_seq *s = &h->seqs[i];
            int nrows = (s->flags & (RF_SEQ_ALL_LOGITS | RF_SEQ_VERIFY)) ? (int)s->n_tokens
                        : !(s->flags & RF_SEQ_NO_SAMPLE) ? 1 : 0;
            if (s->flags & RF_SEQ_VERIFY) {
                node_seq *q = node_find_seq(n, s->seq_id, false);
                int k = (int)s->n_tokens - 1;
                spec_q qs[SPEC_BLOCK_MAX];
                int32_t qid[SPEC_BLOCK_MAX][64];
                float qpr[SPEC_BLOCK_MAX][64];
                bool have_q = (s->flags & RF_SEQ_HAS_Q) != 0;
                for (int d = 0; have_q && d < k; d++) {
                    uint32_t cnt;
                    if (!qp || qp + 4 > qend) { /* announced but missing: refuse, never read garbage */
                        have_q = false;
                        break;
                    }
                    memcpy(&cnt, qp, 4);
                    qp += 4;
                    if (cnt > 64 || qp + cnt * 8 > qend) {
                        have_q = false;
                        break;
                    }
                    for (uint32_t c = 0; c < cnt; c++) {
                        memcpy(&qid[d][c], qp + c * 8, 4);
                        memcpy(&qpr[d][c], qp + c * 8 + 4, 4);
                    }
                    qp += cnt * 8;
                    qs[d] = (spec_q){.n = (int)cnt, .id = qid[d], .p = qpr[d]};
                }
                if (k + 1 > SPEC_BLOCK_MAX || !q || !q->has_smp || ((s->flags & RF_SEQ_HAS_Q) && !have_q)) {
                    k3_output_free(&o);
                    node_error(n, h->step_id, "VERIFY block for sequence %" PRIu64 " is malformed", s->seq_id);
                    goto out;
                }
                n_comm[i] = spec_accept(&q->smp, o.logits + (size_t)row0 * n->hp.n_vocab, (int32_t)n->hp.n_vocab,
                                        tokens + node_seq_offset(h, i), k, have_q ? qs : NULL,
                                        committed[i]);
                n_comm_total += (size_t)n_comm[i];
            }
            row0 += nrows;
        }
        plen = h->n_seqs * 4 + n_logit_floats * 4 + n_comm_total * 4;
        payload = malloc(plen);
        int row = 0;
        size_t lo = 0;
        for (uint32_t i = 0; payload && i < h->n_seqs; i++) {
            const rf_seq *s = &h->seqs[i];
            int32_t tok = -1;
            node_seq *q = node_find_seq(n, s->seq_id, false);
            const float *lrow = NULL;
            if (s->flags & RF_SEQ_VERIFY) {
                memcpy(payload + i * 4, &n_comm[i], 4);
                if (s->flags & RF_SEQ_ALL_LOGITS) {
                    memcpy(payload + h->n_seqs * 4 + lo * 4, o.logits + (size_t)row * n->hp.n_vocab,
                           (size_t)s->n_tokens * n->hp.n_vocab * 4);
                    lo += (size_t)s->n_tokens * n->hp.n_vocab;
                }
                row += (int)s->n_tokens;
                continue;
            }
            if (s->flags & RF_SEQ_ALL_LOGITS) {
                memcpy(payload + h->n_seqs * 4 + lo * 4, o.logits + (size_t)row * n->hp.n_vocab,
                       (size_t)s->n_tokens * n->hp.n_vocab * 4);
                lo += (size_t)s->n_tokens * n->hp.n_vocab;
                row += (int)s->n_tokens;
                lrow = o.logits + (size_t)(row - 1) * n->hp.n_vocab;
            } else if (!(s->flags & RF_SEQ_NO_SAMPLE)) {
                lrow = o.logits + (size_t)row * n->hp.n_vocab;
                row++;
            }
            if (lrow && q && q->has_smp) tok = smp_sample(&q->smp, lrow);
            memcpy(payload + i * 4, &tok, 4);
        }
        for (uint32_t i = 0; payload && i < h->n_seqs; i++) {
            if (!n_comm[i]) continue;
            memcpy(payload + h->n_seqs * 4 + lo * 4, committed[i], (size_t)n_comm[i] * 4);
            lo += (size_t)n_comm[i];
        }
        oh.type = RF_RESULT;
    }
    k3_output_free(&o);
    if (!payload) {
        node_error(n, h->step_id, "out of memory for the outgoing frame");
        goto out;
    }
    oh.payload_bytes = plen;
    stamps[n_stamps - 1].t_send = rf_now();
    size_t hl = rf_header_size(oh.n_seqs), sl = rf_stamps_size(n_stamps);
    size_t xl = want_receipt ? rf_receipts_size(&rx, 0) : 0;
    uint8_t *hb = malloc(hl), *sb = malloc(sl + xl);
    sl += xl;
    if (hb && sb) {
        rf_header_encode(&oh, hb);
        rf_stamps_encode(stamps, n_stamps, sb);
        if (want_receipt) rf_receipts_encode(&rx, NULL, 0, sb + rf_stamps_size(n_stamps));
        if (!last) {
            const void *parts[4] = {hb, payload, sb, p->n > 4 ? p->data[4] : NULL};
            size_t lens[4] = {hl, plen, sl, p->n > 4 ? p->len[4] : 0};
            if (zs_send_wait(n->next, parts, lens, p->n > 4 ? 4 : 3, 5000, &err) != 0) {
                node_error(n, h->step_id, "stage %d cannot reach the next stage: %s", n->stage + 1, err.msg);
            }
        } else {
            const void *parts[4] = {n->coord_id, hb, payload, sb};
            size_t lens[4] = {n->coord_id_len, hl, plen, sl};
            if (zs_send(n->router, parts, lens, 4, true, &err) != 0) node_log(n, "cannot return a result: %s", err.msg);
        }
    }
    free(hb);
    free(sb);
    /* The frame is on its way: now hash what came in and what went out, sign, and tell the coordinator
     * directly. The next stage hashes the same bytes as its input, so the coordinator can check the chain. */
    if (want_receipt) node_send_receipt(n, h, &rx, p->data[2], p->len[2], payload, plen);
    free(payload);
out:
    free(rows);
    k3_boundary_free(&in);
}

static void node_free(node *n, const zs_parts *p, const rf_header *h) {
    for (uint32_t i = 0; i < h->n_seqs; i++) {
        node_seq *q = node_find_seq(n, h->seqs[i].seq_id, false);
        if (q) node_free_seq(q);
    }
    if (n->next) { /* pass it down the ring so every stage forgets the sequence */
        const void *parts[3] = {p->data[1], p->data[2], p->n > 3 ? p->data[3] : ""};
        size_t lens[3] = {p->len[1], p->len[2], p->n > 3 ? p->len[3] : 0};
        rl_err err;
        zs_send(n->next, parts, lens, 3, true, &err);
    }
}


/* ---- fetch: a coordinator streams this node the layers it lacks ---------------------------------- */

/* mkdir -p */
static int node_mkdirs(const char *path) {
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(tmp, 0700) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    return mkdir(tmp, 0700) != 0 && errno != EEXIST ? -1 : 0;
}

static void node_fetch_abort(node *n) {
    if (n->fetch.f) fclose(n->fetch.f);
    if (n->fetch.active) unlink(n->fetch.tmp);
    memset(&n->fetch, 0, sizeof n->fetch);
}

static void node_fetch_begin(node *n, uint64_t step, const zs_parts *p) {
    node_fetch_abort(n);
    node_fetch *f = &n->fetch;
    cJSON *j = p->n >= 4 ? cJSON_ParseWithLength(p->data[2], p->len[2]) : NULL;
    const char *hash = jstr(j, "model_hash");
    double a = jnum(j, "a", -1), b = jnum(j, "b", -1), bytes = jnum(j, "file_bytes", -1);
    if (!hash || strlen(hash) != 64 || strspn(hash, "0123456789abcdef") != 64 || a < 0 || b <= a || bytes <= 0 ||
        p->len[3] > bytes) {
        cJSON_Delete(j);
        node_error(n, step, "FETCH_BEGIN lacks a valid model_hash, layer range or size");
        return;
    }
    if (node_mkdirs(n->cache_dir) != 0) {
        cJSON_Delete(j);
        node_error(n, step, "cannot create the cache folder %s: %s", n->cache_dir, strerror(errno));
        return;
    }
    snprintf(f->hash, sizeof f->hash, "%s", hash);
    f->a = (uint32_t)a;
    f->b = (uint32_t)b;
    f->expect = (uint64_t)bytes;
    cJSON_Delete(j);
    snprintf(f->final, sizeof f->final, "%s/%s-%u-%u.gguf", n->cache_dir, f->hash, f->a, f->b);
    snprintf(f->tmp, sizeof f->tmp, "%s.part", f->final);
    f->f = fopen(f->tmp, "wb");
    if (!f->f) {
        node_error(n, step, "cannot write %s: %s", f->tmp, strerror(errno));
        return;
    }
    f->active = true;
    f->last_pct = -1;
    crypto_generichash_init(&f->h, NULL, 0, 32);
    /* The header travels with FETCH_BEGIN; the data section follows in FETCH_DATA chunks. */
    if (fwrite(p->data[3], 1, p->len[3], f->f) != p->len[3]) {
        node_error(n, step, "cannot write %s", f->tmp);
        node_fetch_abort(n);
        return;
    }
    crypto_generichash_update(&f->h, p->data[3], p->len[3]);
    f->written = p->len[3];
    node_log(n, "receiving layers [%u, %u) of %.12s... (%.1f MiB)", f->a, f->b, f->hash, (double)f->expect / 1048576.0);
    node_reply(n, RF_FETCH_ACK, step, NULL, 0);
}

static void node_fetch_data(node *n, uint64_t step, const zs_parts *p) {
    node_fetch *f = &n->fetch;
    if (!f->active) {
        node_error(n, step, "FETCH_DATA without FETCH_BEGIN");
        return;
    }
    if (f->written + p->len[2] > f->expect || fwrite(p->data[2], 1, p->len[2], f->f) != p->len[2]) {
        node_error(n, step, "fetched data overruns the announced %" PRIu64 " bytes, or cannot be written", f->expect);
        node_fetch_abort(n);
        return;
    }
    crypto_generichash_update(&f->h, p->data[2], p->len[2]);
    f->written += p->len[2];
    int pct = (int)(100.0 * (double)f->written / (double)f->expect);
    if (pct / 10 != f->last_pct / 10) {
        f->last_pct = pct;
        fprintf(stderr, "\rringlm node %s: receiving [%-20.*s] %3d%%", n->o->listen, pct / 5, "####################", pct);
        if (pct == 100) fputc('\n', stderr);
    }
    node_reply(n, RF_FETCH_ACK, step, NULL, 0);
}

static void node_fetch_end(node *n, uint64_t step, const zs_parts *p) {
    node_fetch *f = &n->fetch;
    if (!f->active) {
        node_error(n, step, "FETCH_END without FETCH_BEGIN");
        return;
    }
    cJSON *j = cJSON_ParseWithLength(p->data[2], p->len[2]);
    const char *want = jstr(j, "blake2b");
    unsigned char out[32];
    char got[65];
    crypto_generichash_final(&f->h, out, 32);
    sodium_bin2hex(got, sizeof got, out, 32);
    bool ok = want && strcmp(want, got) == 0 && f->written == f->expect;
    cJSON_Delete(j);
    if (!ok) {
        node_error(n, step, "fetched range file is corrupt (%" PRIu64 " of %" PRIu64 " bytes, hash %s)", f->written,
                   f->expect, want && strcmp(want, got) == 0 ? "ok" : "mismatch");
        node_fetch_abort(n);
        return;
    }
    int bad = fflush(f->f) != 0 || fsync(fileno(f->f)) != 0;
    bad |= fclose(f->f) != 0;
    f->f = NULL;
    if (bad || rename(f->tmp, f->final) != 0) {
        node_error(n, step, "cannot keep %s: %s", f->final, strerror(errno));
        node_fetch_abort(n);
        return;
    }
    if (n->n_models < NODE_MAX_MODELS) {
        node_model *nm = &n->models[n->n_models++];
        snprintf(nm->path, sizeof nm->path, "%s", f->final);
        snprintf(nm->hash, sizeof nm->hash, "%s", f->hash);
        nm->range = true;
        nm->a = f->a;
        nm->b = f->b;
        nm->bytes = f->expect;
    }
    node_log(n, "kept layers [%u, %u) in %s", f->a, f->b, f->final);
    memset(f, 0, sizeof *f);
    node_reply(n, RF_READY, step, "{\"fetched\":true}", 16);
}

/* ---- main loop --------------------------------------------------------------------------------- */

static bool node_stop_pending(void) {
    sigset_t pend;
    return sigpending(&pend) == 0 && (sigismember(&pend, SIGINT) || sigismember(&pend, SIGTERM));
}

int node_run(const node_opts *o, rl_err *err) {
    node *n = calloc(1, sizeof *n);
    if (!n) return rl_errf(err, "out of memory");
    n->o = o;
    n->zctx = zmq_ctx_new();
    int rc = -1;
    if (!n->zctx) {
        rl_errf(err, "cannot create a ZeroMQ context");
        goto done_free;
    }
    if (zs_auth_start(&n->auth, n->zctx, err) != 0) goto done_ctx;
    for (int i = 0; i < o->n_allow; i++) zs_auth_allow(&n->auth, o->allow[i].curve_pk, "coordinator");
    n->router = zs_server(n->zctx, o->listen, &o->id, err);
    if (!n->router) goto done_auth;
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (o->cache_dir) snprintf(n->cache_dir, sizeof n->cache_dir, "%s", o->cache_dir);
    else if (xdg) snprintf(n->cache_dir, sizeof n->cache_dir, "%s/ringlm/node-%.16s", xdg, o->id.pk_hex);
    else snprintf(n->cache_dir, sizeof n->cache_dir, "%s/.cache/ringlm/node-%.16s", home ? home : "/tmp", o->id.pk_hex);
    node_scan_models(n);
    node_scan_cache(n);
    n->speed = o->speed_gbs > 0 ? o->speed_gbs * 1e9 : node_probe_speed(o->threads);
    node_log(n, "ready: key %s, %d model(s), %.1f GB/s matrix-vector, %d threads", o->id.pk_hex, n->n_models,
             n->speed / 1e9, o->threads);
    while (!node_stop_pending()) {
        zmq_pollitem_t items[2] = {{n->router, 0, ZMQ_POLLIN, 0}, {n->next, 0, ZMQ_POLLIN, 0}};
        int np = n->next ? 2 : 1;
        if (zmq_poll(items, np, 250) < 0) {
            if (errno == EINTR) continue;
            rl_errf(err, "poll failed: %s", zmq_strerror(errno));
            goto done_sock;
        }
        if (np == 2 && (items[1].revents & ZMQ_POLLIN)) { /* downstream never talks back: drain */
            zs_parts junk;
            rl_err e2;
            while (zs_recv(n->next, &junk, &e2) == 0) zs_parts_free(&junk);
        }
        if (!(items[0].revents & ZMQ_POLLIN)) continue;
        for (;;) {
            zs_parts p;
            rl_err e2;
            if (node_stop_pending()) break; /* a queue of frames must not delay a stop */
            int r = zs_recv(n->router, &p, &e2);
            if (r != 0) break;
            rf_header *h = malloc(sizeof *h);
            if (!h || p.n < 3) {
                if (o->verbose) node_log(n, "dropped a message of %d parts", p.n);
                free(h);
                zs_parts_free(&p);
                continue;
            }
            n->cur_ring = 0;
            if (rf_header_decode(h, p.data[1], p.len[1], &e2) != 0) {
                /* An authenticated peer sent garbage: say so (if it is our coordinator) and go on. */
                if (p.len[0] == n->coord_id_len && memcmp(p.data[0], n->coord_id, p.len[0]) == 0) {
                    node_error(n, 0, "malformed frame: %s", e2.msg);
                } else {
                    node_log(n, "dropped a malformed frame: %s", e2.msg);
                }
                free(h);
                zs_parts_free(&p);
                continue;
            }
            n->cur_ring = h->ring_id;
            if (h->type == RF_INFO_REQ || h->type == RF_ASSIGN || h->type == RF_PING || h->type == RF_FETCH_BEGIN) {
                /* Only a coordinator sends these; remember where to send results and errors. */
                n->coord_id_len = p.len[0] < sizeof n->coord_id ? p.len[0] : sizeof n->coord_id;
                memcpy(n->coord_id, p.data[0], n->coord_id_len);
            }
            switch (h->type) {
            case RF_INFO_REQ: node_info(n); break;
            case RF_ASSIGN: node_assign(n, h->step_id, p.data[2], p.len[2]); break;
            case RF_PING: node_reply(n, RF_PONG, h->step_id, NULL, 0); break;
            case RF_FORWARD: node_forward(n, &p, h); break;
            case RF_FREE: node_free(n, &p, h); break;
            case RF_FETCH_BEGIN: node_fetch_begin(n, h->step_id, &p); break;
            case RF_FETCH_DATA: node_fetch_data(n, h->step_id, &p); break;
            case RF_FETCH_END: node_fetch_end(n, h->step_id, &p); break;
            default: node_error(n, h->step_id, "unexpected %s frame", rf_type_name(h->type)); break;
            }
            free(h);
            zs_parts_free(&p);
        }
    }
    node_log(n, "stopping");
    rc = 0;
done_sock:
    node_fetch_abort(n);
    node_unload(n);
    if (n->next) zmq_close(n->next);
    zmq_close(n->router);
done_auth:
    zs_auth_stop(&n->auth);
done_ctx:
    zmq_ctx_term(n->zctx);
done_free:
    free(n);
    return rc;
}
