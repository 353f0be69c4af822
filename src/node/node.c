#include "node.h"
#include "../base/json.h"
#include "../base/file.h"
#include "../base/clock.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
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

#include "../device/devices.h"
#include "../gen/emit.h"
#include "../gguf/file_hash.h"
#include "../model/expert_cache.h"
#include "../model/k3_forward.h"
#include "../model/k3_memory.h"
#include "../speculate/accept.h"
#include "../text/chat_gram.h"
#include "../text/sampler.h"
#include "../text/tokenizer.h"
#include "../trust/manifest.h"
#include "../trust/receipt.h"
#include "../wire/frame.h"
#include "../exec/stage.h"
#include "../net/probe.h"
#include "range_parts.h"
#include "../net/zsock.h"

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


typedef struct node {
    const node_opts *o;
    void *zctx;
    zs_auth auth;
    void *router, *next;
    zs_monitor next_mon; /* the downstream link's events, while next is open: a forward stops waiting once it closed */
    char next_addr[128]; /* where next goes */
    /* The coordinator this node serves: one at a time (docs/ring.md, "One coordinator per ring"). coord_id is
     * the routing id its latest message came from (replies go there); the owner is that id without its last
     * "-" field, which is per connection, so one coordinator process that re-opens its ring stays the owner.
     * The owner lets go when its connection closes (the router's monitor names the fd), and only then may
     * another coordinator, whatever its key, take the node. */
    char coord_id[256];
    size_t coord_id_len;
    bool owned;
    char owner[256];      /* "coord-<key16>-<session>" (bytes, owner_len of them) */
    size_t owner_len;
    int owner_fd;         /* the connection its latest message came in on */
    char owner_key[72];   /* its key as users write it, and where it connects from */
    char owner_peer[64];
    double owner_since;
    double busy_logged;   /* the last refusal logged (one per 10 s) */
    zs_monitor router_mon;
    uint64_t cur_ring; /* ring_id of the frame being handled; replies carry it, so a coordinator can tell an
                        * error about an earlier ring's frame (sent late) from one about its own */
    node_model models[NODE_MAX_MODELS];
    int n_models;
    char cache_dir[1024];
    node_fetch fetch;
    double speed; /* bytes of weights per second in a matrix-vector product */
    double flops; /* FLOP/s in a 128-column matrix product (a prefill chunk's shape) */
    double disk;  /* bytes per second read from disk (0: no --mem, so experts are never read from disk) */
    /* The GPU its engines compute on (docs/devices.md), offered to the planner as a tier before RAM (and,
     * under --mem, RAM before disk): dev_name empty when it computes on the CPU. */
    char dev_name[64]; /* "Vulkan0", or "CUDA0,CUDA1" for several */
    uint64_t dev_bytes;
    double dev_speed, dev_flops;
    uint32_t gpu_layers, n_cpu_moe; /* the split the coordinator assigned (ASSIGN), or UINT32_MAX: none */
    /* the assignment */
    bool loaded;
    char hash[65];
    mf_model m;
    k3_hparams hp;
    k3_engine e;
    uint32_t a, b, n_ctx;
    int n_seqs; /* sequences the ring holds at once (ASSIGN): the stage pools their states */
    /* Its stage's own timed frames (stage_time at ASSIGN; READY "steps"), from which the coordinator fits
     * this node's figures for its prediction (predict.h, predict_stage_calibrate); kept for the assignment they
     * timed (step_key), so an ASSIGN of the same range and shape does not time it again. */
    int n_steps;
    uint32_t step_tok[3];
    double step_s[3];
    char step_key[200];
    int stage, n_stages, wire;
    ring_stage stage_rt; /* the sequences' state and the compute of this stage (stage.h) */
    tok_tokenizer tok;   /* last stage: the model's vocabulary, so it can sample constrained output */
    smp_vocab *vocab;    /* ... (tok's bytes per token; NULL: not the last stage, or the file has no vocabulary) */
    int rb_blocks;       /* ASSIGN "rollback_blocks": blocks a sequence keeps for rollback (0: K3_RB_BLOCKS) */
    uint32_t taps[16];   /* the ring's DSpark tap layers (ASSIGN "taps"); the stage keeps those it holds */
    int n_taps;
    /* A manifest ring (docs/ring.md, "Manifest rings"): the range was put together from parts under the
     * coordinator's manifest, kept here; and the fetchers' keys this node lends its split files to. */
    manifest_file mf;
    bool have_mf;
    char lent[PARTS_MAX_HOLDERS][65];
    int n_lent;
    /* The ring's other nodes, which may time round trips to this one (PEERS; probe.h). */
    char probers[PB_MAX_PEERS][65];
    int n_probers;
    uint8_t manifest[32]; /* manifest_range_hash of the assigned range: hashed by a thread from load on, so that
                           * the first receipt does not wait for a pass over every weight byte */
    bool have_manifest;
    struct node_mfst_job {
        pthread_t thread;
        bool running;
        const mf_model *m;
        k3_hparams hp;
        uint32_t a, b;
        uint8_t out[32];
        int rc;
        rl_err err;
    } mfst;
    /* What this stage received and sent for the steps it signed receipts for, oldest first, at most
     * o->audit_keep_bytes: an auditor asks for them (AUDIT_REQ) and checks them against the receipts. */
    struct node_audit_rec {
        uint64_t ring_id, step_id;
        uint8_t *in, *out;
        size_t in_len, out_len;
    } *alog;
    size_t alog_n, alog_cap, alog_head, alog_bytes;
    /* Receipts still to sign: the frames already went on; they are hashed and signed once the node has
     * been quiet for a millisecond, or before it handles its next message (node_flush_receipts). */
    struct node_rjob {
        frame_header *h;
        uint8_t nonce[32];
        uint8_t *in, *out;
        size_t in_len, out_len;
    } *rjobs;
    int n_rjobs, cap_rjobs;
#ifdef RINGLM_ADVERSARY
    long adv_forwards;  /* FORWARD frames run so far */
    uint8_t *adv_old;   /* replay: the first receipt this node signed (packed) */
    size_t adv_old_len;
    keys_identity adv_other; /* wrongkey: a key of its own making */
    bool adv_have_other;
#endif
} node;

static void node_alog_clear(node *n);
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

/* Times a q8_0 matrix product on rows x cols weights and n_tok columns of input: with one column the shape
 * of decoding, where every weight byte is read once per token (result: bytes of weights per second), with
 * many the shape of a prefill chunk (result: FLOP/s). */
static double node_probe_matmul(int threads, int64_t rows, int64_t cols, int64_t n_tok) {
    struct ggml_init_params ip = {.mem_size = (size_t)rows * cols * 34 / 32 + (size_t)(cols + rows) * (size_t)n_tok * 4 +
                                                 (8 << 20), .mem_buffer = NULL,
                                  .no_alloc = false};
    struct ggml_context *c = ggml_init(ip);
    if (!c) return 1e9;
    struct ggml_tensor *w = ggml_new_tensor_2d(c, GGML_TYPE_Q8_0, cols, rows);
    struct ggml_tensor *x = ggml_new_tensor_2d(c, GGML_TYPE_F32, cols, n_tok);
    memset(w->data, 0, ggml_nbytes(w));
    memset(x->data, 0, ggml_nbytes(x));
    struct ggml_cgraph *g = ggml_new_graph(c);
    ggml_build_forward_expand(g, ggml_mul_mat(c, w, x));
    double best = 1e30;
    for (int r = 0; r < 4; r++) {
        const double t0 = rl_clock_now();
        ggml_graph_compute_with_ctx(c, g, threads);
        double dt = rl_clock_now() - t0;
        if (dt < best) best = dt;
    }
    double r = n_tok == 1 ? (double)ggml_nbytes(w) / best : 2.0 * (double)rows * (double)cols * (double)n_tok / best;
    ggml_free(c);
    return r;
}

/* Disk read speed: up to 256 MiB of the largest file (at least 16 MiB) in dir, read past the page cache
 * (O_DIRECT, or after dropping the file's cached pages where the filesystem has no direct reads). 0 when
 * there is no such file: the node then reports no disk, and the planner gives it only ranges that fit. */
static double node_probe_disk(const char *dir) {
    DIR *d = dir ? opendir(dir) : NULL;
    if (!d) return 0;
    char best[1024] = "", path[1024];
    off_t best_size = 16 << 20;
    for (struct dirent *de; (de = readdir(d));) {
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        if (stat(path, &st) == 0 && S_ISREG(st.st_mode) && st.st_size >= best_size) {
            best_size = st.st_size;
            snprintf(best, sizeof best, "%s", path);
        }
    }
    closedir(d);
    if (!best[0]) return 0;
    int fd = open(best, O_RDONLY | O_DIRECT);
    if (fd < 0 && (fd = open(best, O_RDONLY)) >= 0) (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    const size_t chunk = 4 << 20, want = 256u << 20;
    void *buf = NULL;
    if (fd < 0 || posix_memalign(&buf, 4096, chunk) != 0) {
        if (fd >= 0) close(fd);
        return 0;
    }
    const double t0 = rl_clock_now();
    size_t got = 0;
    for (ssize_t r; got < want && (r = pread(fd, buf, chunk, (off_t)got)) > 0;) got += (size_t)r;
    const double t1 = rl_clock_now();
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
    free(buf);
    double s = t1 - t0;
    return got >= (16u << 20) && s > 0 ? (double)got / s : 0;
}

/* Decode's speed: 64 MiB of weights (7680 = 240 q8_0 blocks, 34 bytes each), one token. */
static double node_probe_speed(int threads) { return node_probe_matmul(threads, 8192, 7680, 1); }
/* Prefill's: 8 MiB of weights times 128 tokens (2 GFLOP). */
static double node_probe_flops(int threads) { return node_probe_matmul(threads, 1024, 7680, 128); }

/* The GPUs this node's engines compute on (--device, else every GPU), the memory it offers on them and their
 * speed. A device name that does not exist stops the node now rather than at its first ASSIGN. Under --mem
 * the device is the tier above RAM, and the routed experts planned for RAM go through the expert cache.
 * Several devices split a range's device layers in proportion to their free memory and run them one after
 * another: they are offered as one, their memory summed, their speed that of a byte spread alike over them
 * (sum of memory / sum of memory over speed). */
static int node_probe_device(node *n, rl_err *err) {
    const node_opts *o = n->o;
    struct ggml_backend_device *devs[K3_MAX_DEV];
    int nd = 0;
    rl_err le;
    (void)dv_load(NULL, NULL, 0, &le); /* every device, for INFO's list, whichever this node computes on */
    if (dv_pick(o->eng.device, devs, K3_MAX_DEV, &nd, err) != 0) return -1;
    if (nd == 0) return 0;
    /* compute buffers outside the planner's headroom: a quarter GiB per device */
    const uint64_t margin = (uint64_t)256 << 20;
    uint64_t free_all = 0, room = 0;
    double per_speed = 0, per_flops = 0;
    for (int d = 0; d < nd; d++) {
        size_t fr = 0, tot = 0;
        ggml_backend_dev_memory(devs[d], &fr, &tot);
        free_all += fr;
        const uint64_t r = fr > margin ? fr - margin : 0;
        room += r;
        size_t len = strlen(n->dev_name);
        snprintf(n->dev_name + len, sizeof n->dev_name - len, "%s%s", d ? "," : "", ggml_backend_dev_name(devs[d]));
        double bps = 0, fl = 0;
        if (o->device_speed_gbs > 0) continue;
        if (dv_measure(devs[d], o->threads, &bps, &fl, err) != 0) return -1;
        per_speed += (double)r / bps;
        per_flops += (double)r / fl;
    }
    n->dev_bytes = o->vram_gb > 0 ? (uint64_t)(o->vram_gb * 1073741824.0) : room;
    if (o->vram_gb > 0 && n->dev_bytes > free_all) {
        return rl_errf(err, "--vram %.2f GB is more than %s ha%s free (%.2f GB)", o->vram_gb, n->dev_name,
                       nd > 1 ? "ve" : "s", (double)free_all / 1073741824.0);
    }
    n->dev_speed = o->device_speed_gbs > 0 ? o->device_speed_gbs * 1e9 : per_speed > 0 ? (double)room / per_speed : 0;
    n->dev_flops = o->device_speed_gbs > 0 || !(per_flops > 0) ? 0 : (double)room / per_flops;
    if (!(n->dev_speed > 0)) { /* no room on any device (full, or a figure that cannot be measured): offer none */
        node_log(n, "computes on %s, but offers none of it to the planner (no free memory)", n->dev_name);
        n->dev_name[0] = 0;
        return 0;
    }
    node_log(n, "computes on %s (%s%s): offers %.2f GB of it at %.1f GB/s matrix-vector%s", n->dev_name,
             ggml_backend_dev_description(devs[0]), nd > 1 ? ", ..." : "", (double)n->dev_bytes / 1073741824.0,
             n->dev_speed / 1e9, o->device_speed_gbs > 0 ? " (--device-speed)" : ", measured");
    return 0;
}

/* ---- replies ----------------------------------------------------------------------------------- */

/* A reply (header + payload) to the peer with routing id `to` (the coordinator, or one it refuses). */
static int node_reply_to(node *n, const void *to, size_t to_len, int type, uint64_t step, const void *payload,
                         size_t len, rl_err *err) {
    frame_header h = {.type = (uint16_t)type, .ring_id = n->cur_ring, .step_id = step, .payload_bytes = len};
    uint8_t hb[64];
    frame_header_encode(&h, hb);
    const void *parts[3] = {to, hb, payload ? payload : ""};
    size_t lens[3] = {to_len, frame_header_size(0), len};
    return zs_send(n->router, parts, lens, 3, true, err);
}

static int node_reply(node *n, int type, uint64_t step, const void *payload, size_t len) {
    rl_err err;
    if (node_reply_to(n, n->coord_id, n->coord_id_len, type, step, payload, len, &err) != 0) {
        node_log(n, "cannot reach the coordinator: %s", err.msg);
        return -1;
    }
    return 0;
}

/* ERROR to the coordinator. lost: the address of another node this one saw die (its link closed), which
 * the coordinator then names as the cause instead of this node; NULL otherwise. */
static void node_error_at(node *n, uint64_t step, const char *lost, const char *msg) {
    node_log(n, "error: %s", msg);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "msg", msg);
    cJSON_AddStringToObject(j, "node", n->o->listen);
    if (lost) cJSON_AddStringToObject(j, "lost", lost);
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (s && n->coord_id_len) node_reply(n, FRAME_ERROR, step, s, strlen(s));
    free(s);
}

static void node_error(node *n, uint64_t step, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void node_error(node *n, uint64_t step, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    node_error_at(n, step, NULL, msg);
}

static void node_info(node *n) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "version", FRAME_VERSION);
    cJSON_AddStringToObject(j, "pubkey", n->o->id.pk_hex);
    uint64_t mem = n->o->mem_gb > 0 ? (uint64_t)(n->o->mem_gb * 1073741824.0) : node_mem_available();
    cJSON_AddNumberToObject(j, "mem_bytes", (double)mem);
    cJSON_AddNumberToObject(j, "threads", n->o->threads);
    /* The devices this machine has and the one its engine computes on (docs/devices.md): that one's memory
     * and speed are offered as a tier before the RAM above (plan.h). */
    cJSON *ds = cJSON_AddArrayToObject(j, "devices");
    for (size_t i = 0; i < dv_count(); i++) {
        dv_info d;
        dv_get(i, &d);
        cJSON *dj = cJSON_CreateObject();
        cJSON_AddStringToObject(dj, "name", d.name);
        cJSON_AddStringToObject(dj, "backend", d.backend);
        cJSON_AddBoolToObject(dj, "gpu", d.gpu);
        cJSON_AddNumberToObject(dj, "free_bytes", (double)d.free);
        cJSON_AddNumberToObject(dj, "total_bytes", (double)d.total);
        cJSON_AddItemToArray(ds, dj);
    }
    cJSON_AddStringToObject(j, "backend", n->dev_name[0] ? n->dev_name : "CPU");
    if (n->dev_name[0]) {
        cJSON *dj = cJSON_AddObjectToObject(j, "device");
        cJSON_AddStringToObject(dj, "name", n->dev_name);
        cJSON_AddNumberToObject(dj, "mem_bytes", (double)n->dev_bytes);
        cJSON_AddNumberToObject(dj, "speed_bps", n->dev_speed);
        if (n->dev_flops > 0) cJSON_AddNumberToObject(dj, "flops", n->dev_flops);
    }
    cJSON_AddBoolToObject(j, "repack", !n->o->eng.no_repack);
    cJSON_AddBoolToObject(j, "flash_attn", !n->o->eng.no_flash_attn);
    cJSON_AddStringToObject(j, "cache_type", n->o->eng.cache_f32 ? "f32" : "f16");
    cJSON_AddNumberToObject(j, "speed_bps", n->speed);
    cJSON_AddNumberToObject(j, "flops", n->flops);
    if (n->disk > 0) cJSON_AddNumberToObject(j, "disk_bps", n->disk);
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
    /* Every GGUF file in --models by name and size, split set members too, whole or not: a coordinator with a
     * manifest plans from these (the tensors are checked against it when they are mapped). */
    cJSON *fs = cJSON_AddArrayToObject(j, "files");
    DIR *d = n->o->models_dir ? opendir(n->o->models_dir) : NULL;
    for (struct dirent *de; d && (de = readdir(d));) {
        size_t len = strlen(de->d_name);
        char path[1400];
        struct stat st;
        if (len < 6 || de->d_name[0] == '.' || strcmp(de->d_name + len - 5, ".gguf") != 0) continue;
        snprintf(path, sizeof path, "%s/%s", n->o->models_dir, de->d_name);
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) continue;
        cJSON *fe = cJSON_CreateObject();
        cJSON_AddStringToObject(fe, "name", de->d_name);
        cJSON_AddNumberToObject(fe, "bytes", (double)st.st_size);
        cJSON_AddItemToArray(fs, fe);
    }
    if (d) closedir(d);
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (s) node_reply(n, FRAME_INFO, 0, s, strlen(s));
    free(s);
}

/* ---- assignment -------------------------------------------------------------------------------- */

static void node_drop_seqs(node *n) {
    stage_free(&n->stage_rt);
    stage_init(&n->stage_rt, &n->e, n->n_ctx, n->n_seqs, n->wire);
    stage_set_taps(&n->stage_rt, n->taps, n->n_taps);
    n->stage_rt.rb_blocks = n->rb_blocks;
    n->stage_rt.vocab = n->vocab;
}

static void *node_mfst_main(void *arg) {
    struct node_mfst_job *j = arg;
    j->rc = manifest_range_hash_threads(j->m, &j->hp, j->a, j->b, 1, j->out, &j->err);
    return NULL;
}

/* The manifest hash of the loaded range: the background hash's result (waiting for it if need be). */
static int node_manifest(node *n, rl_err *err) {
    if (n->mfst.running) {
        pthread_join(n->mfst.thread, NULL);
        n->mfst.running = false;
        if (n->mfst.rc == 0) memcpy(n->manifest, n->mfst.out, 32), n->have_manifest = true;
    }
    if (!n->have_manifest) n->have_manifest = manifest_range_hash(&n->m, &n->hp, n->a, n->b, n->manifest, err) == 0;
    return n->have_manifest ? 0 : -1;
}

static void node_unload(node *n) {
    node_drop_seqs(n);
    if (n->mfst.running) { /* it reads the mapping about to go */
        pthread_join(n->mfst.thread, NULL);
        n->mfst.running = false;
    }
    if (n->loaded) {
        k3_engine_free(&n->e);
        mf_close(&n->m);
    }
    if (n->have_mf) manifest_file_free(&n->mf);
    n->have_mf = false;
    if (n->vocab) {
        tok_vocab_free(n->vocab);
        tok_free(&n->tok);
        n->vocab = NULL;
    }
    n->loaded = false;
}

/* Closes the link downstream, and its monitor. */
static void node_close_next(node *n) {
    if (!n->next) return;
    if (n->next_mon.pair) {
        zmq_socket_monitor(n->next, NULL, 0);
        zs_monitor_stop(&n->next_mon);
    }
    zmq_close(n->next);
    n->next = NULL;
}

/* Forwards a frame downstream, waiting up to 5 s for the link to take it - but no longer than the link
 * lives: once the next stage's connection closed (its process died) the frame cannot arrive, and a node
 * stuck waiting would not answer the coordinator's INFO when it re-opens the ring around the restarted
 * node (ring_open waits 5 s for it too, so a re-open right after a death could fail for this node). */
static int node_send_next(node *n, const void *const *parts, const size_t *lens, int np, rl_err *err) {
    for (int waited = 0;; waited += 50) {
        if (zs_wait_writable(n->next, 50)) return zs_send(n->next, parts, lens, np, true, err);
        if (n->next_mon.pair) zs_monitor_poll(&n->next_mon);
        if (n->next_mon.disconnected) return rl_errf(err, "the link closed: %s", n->next_mon.last);
        if (waited >= 5000) return rl_errf(err, "send failed: no connected peer after 5000 ms");
    }
}

/* A manifest ring's range (ASSIGN "manifest": true, the manifest in the message's last part): the manifest is
 * checked against the model id and kept in the cache, then the range is put together from this node's split
 * files, its store and the holders ASSIGN names (range_parts.h). Fills n->mf, n->m and n->hp. */
static int node_open_parts(node *n, const zs_parts *p, const cJSON *j, const char *hash, uint32_t a, uint32_t b,
                           rl_err *err) {
    if (p->n < 4 || p->len[3] < 8) return rl_errf(err, "ASSIGN says manifest but carries none");
    if (strlen(hash) != 64 || strspn(hash, "0123456789abcdef") != 64) return rl_errf(err, "ASSIGN: bad model_hash");
    char path[1200], tmp[1300];
    snprintf(path, sizeof path, "%s/manifest-%s.gguf", n->cache_dir, hash);
    snprintf(tmp, sizeof tmp, "%s.part", path);
    if (rl_mkdirs(n->cache_dir) != 0) return rl_errf(err, "cannot create %s: %s", n->cache_dir, strerror(errno));
    FILE *f = fopen(tmp, "wb");
    if (!f) return rl_errf(err, "cannot create %s: %s", tmp, strerror(errno));
    bool ok = fwrite(p->data[3], 1, p->len[3], f) == p->len[3];
    if (fclose(f) != 0 || !ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return rl_errf(err, "cannot write %s", path);
    }
    if (manifest_file_read(&n->mf, path, err) != 0) return -1;
    n->have_mf = true;
    uint8_t id[32];
    char hex[65];
    if (manifest_file_range_hash(&n->mf, 0, n->mf.n_layer, id, err) != 0) return -1;
    sodium_bin2hex(hex, sizeof hex, id, 32);
    if (strcmp(hex, hash) != 0) return rl_errf(err, "the manifest sent is not that of model %.16s...", hash);
    if (b > n->mf.n_layer) return rl_errf(err, "layer range [%u, %u) beyond the model's %u layers", a, b, n->mf.n_layer);
    parts_holder hold[PARTS_MAX_HOLDERS];
    int n_hold = 0, rc = -1;
    const uint32_t n_files = manifest_file_n_files(&n->mf);
    const cJSON *hs = cJSON_GetObjectItemCaseSensitive(j, "holders"), *it;
    cJSON_ArrayForEach(it, hs) {
        if (n_hold == PARTS_MAX_HOLDERS) break;
        parts_holder *h = &hold[n_hold];
        const char *addr = rl_json_str(it, "addr"), *pk = rl_json_str(it, "pubkey");
        if (!addr || !pk || keys_peer_parse(&h->key, pk, err) != 0) {
            rl_errf(err, "ASSIGN: a holder without addr or a valid pubkey");
            goto out;
        }
        snprintf(h->addr, sizeof h->addr, "%s", addr);
        if (!(h->files = calloc(n_files + 1, 1))) {
            rl_errf(err, "out of memory");
            goto out;
        }
        n_hold++;
        const cJSON *fv;
        cJSON_ArrayForEach(fv, cJSON_GetObjectItemCaseSensitive(it, "files")) {
            if (cJSON_IsNumber(fv) && fv->valuedouble >= 0 && fv->valuedouble < n_files) h->files[(uint32_t)fv->valuedouble] = true;
        }
    }
    parts_opts ro = {.models_dir = n->o->models_dir, .cache_dir = n->cache_dir, .id = &n->o->id, .zctx = n->zctx,
                  .holders = hold, .n_holders = n_hold, .ring_id = n->cur_ring, .n_threads = n->o->threads,
                  .log_name = n->o->listen};
    parts_stats st;
    double t0 = rl_clock_now();
    if (parts_assemble(&n->mf, a, b, &ro, &n->m, &st, err) != 0) goto out;
    if (k3_hparams_read(&n->hp, &n->m, err) != 0 || k3_check_tensors_range(&n->hp, &n->m, a, b, false, err) != 0) {
        mf_close(&n->m);
        goto out;
    }
    node_log(n, "layers [%u, %u) from parts in %.1f s: %d tensors (%.1f MiB) from its split files (%d checked now, "
                "%d checked before), %d from its store, %d (%.1f MiB) pulled from other nodes",
             a, b, rl_clock_now() - t0, st.local, (double)st.local_bytes / 1048576.0, st.local_checked,
             st.local - st.local_checked, st.stored, st.pulled, (double)st.pulled_bytes / 1048576.0);
    rc = 0;
out:
    for (int k = 0; k < n_hold; k++) free(hold[k].files);
    return rc;
}

/* The keys a coordinator's message names in its JSON array `field` (LEND's fetchers, PEERS' peers) replace
 * the node's keys of that label, on its allowlist and in keys[0..*n_keys). 0, or -1 after an ERROR naming
 * what was wrong (the old keys are gone then too). */
static int node_set_keys(node *n, uint64_t step, const zs_parts *p, const char *type, const char *field,
                         const char *label, char (*keys)[65], int max, int *n_keys) {
    cJSON *j = p->n >= 3 ? cJSON_ParseWithLength(p->data[2], p->len[2]) : NULL;
    const cJSON *arr = j ? cJSON_GetObjectItemCaseSensitive(j, field) : NULL, *it;
    int rc = 0;
    zs_auth_forget(&n->auth, label);
    *n_keys = 0;
    if (!cJSON_IsArray(arr)) {
        node_error(n, step, "%s lacks its %s", type, field);
        cJSON_Delete(j);
        return -1;
    }
    cJSON_ArrayForEach(it, arr) {
        keys_peer pk;
        rl_err e2;
        if (!cJSON_IsString(it) || keys_peer_parse(&pk, it->valuestring, &e2) != 0) {
            node_error(n, step, "%s: a %s key is not valid", type, label);
            rc = -1;
            break;
        }
        if (*n_keys == max) break;
        zs_auth_allow(&n->auth, pk.curve_pk, label, pk.pk_hex);
        snprintf(keys[(*n_keys)++], sizeof keys[0], "%s", pk.pk_hex);
    }
    cJSON_Delete(j);
    return rc;
}

static bool node_key_in(char (*keys)[65], int n_keys, const char *key) {
    for (int i = 0; i < n_keys; i++) {
        if (strcmp(keys[i], key) == 0) return true;
    }
    return false;
}

/* LEND: the coordinator names the nodes that will pull from this one's split files (a manifest ring); only
 * those keys may, until the next LEND. */
static void node_lend(node *n, uint64_t step, const zs_parts *p) {
    if (node_set_keys(n, step, p, "LEND", "fetchers", "fetcher", n->lent, PARTS_MAX_HOLDERS, &n->n_lent) == 0) {
        node_reply(n, FRAME_LENT, step, NULL, 0);
    }
}

/* PEERS: the coordinator names the ring's other nodes, which may then time round trips to this one (PROBE_PING)
 * until the next PEERS or until that coordinator leaves. */
static void node_peers(node *n, uint64_t step, const zs_parts *p) {
    if (node_set_keys(n, step, p, "PEERS", "peers", "peer", n->probers, PB_MAX_PEERS, &n->n_probers) == 0) {
        node_reply(n, FRAME_PEERS_OK, step, NULL, 0);
    }
}

/* PROBE: time round trips to the peers the coordinator lists (probe.h) and tell it. The node answers nothing
 * else meanwhile; the coordinator probes one node at a time, so no peer waits on this one. */
static void node_probe(node *n, uint64_t step, const zs_parts *p) {
    cJSON *j = p->n >= 3 ? cJSON_ParseWithLength(p->data[2], p->len[2]) : NULL;
    const cJSON *ps = j ? cJSON_GetObjectItemCaseSensitive(j, "peers") : NULL, *it;
    probe_peer peers[PB_MAX_PEERS];
    double rtt[PB_MAX_PEERS];
    int np = 0;
    rl_err err = {{0}};
    if (!cJSON_IsArray(ps) || cJSON_GetArraySize(ps) > PB_MAX_PEERS) {
        node_error(n, step, "PROBE lacks its peers, or names more than %d", PB_MAX_PEERS);
        cJSON_Delete(j);
        return;
    }
    cJSON_ArrayForEach(it, ps) {
        const char *addr = rl_json_str(it, "addr"), *key = rl_json_str(it, "key");
        if (!addr || !key || strlen(addr) >= sizeof peers[0].addr || keys_peer_parse(&peers[np].key, key, &err) != 0) {
            node_error(n, step, "PROBE: a peer lacks a valid addr or key");
            cJSON_Delete(j);
            return;
        }
        snprintf(peers[np++].addr, sizeof peers[0].addr, "%s", addr);
    }
    cJSON_Delete(j);
    if (probe_measure(n->zctx, &n->o->id, peers, np, 5.0, rtt, &err) != 0) {
        node_error(n, step, "%s", err.msg);
        return;
    }
    cJSON *r = cJSON_CreateObject();
    cJSON *a = r ? cJSON_AddArrayToObject(r, "rtt_s") : NULL;
    for (int i = 0; a && i < np; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(rtt[i]));
    char *js = a ? cJSON_PrintUnformatted(r) : NULL;
    cJSON_Delete(r);
    if (!js) {
        node_error(n, step, "out of memory");
        return;
    }
    node_reply(n, FRAME_PROBE_RESULT, step, js, strlen(js));
    free(js);
}

/* PROBE_PING from a peer the coordinator named (PEERS): answered at once. */
static void node_probe_ping(node *n, const zs_parts *p, const frame_header *h) {
    bool known = node_key_in(n->probers, n->n_probers, p->user);
    rl_err e2;
    if (known) node_reply_to(n, p->data[0], p->len[0], FRAME_PROBE_PONG, h->step_id, NULL, 0, &e2);
    else node_log(n, "dropped a PROBE_PING from %.16s..., which its coordinator did not name", p->user[0] ? p->user : "?");
}

/* PULL: bytes of one of this node's split files, for a node the coordinator lent them to. Answered at once
 * from the file (nothing is kept between pulls), errors to the puller. */
static void node_pull(node *n, const zs_parts *p, const frame_header *h) {
    bool lent = node_key_in(n->lent, n->n_lent, p->user);
    cJSON *j = p->n >= 3 ? cJSON_ParseWithLength(p->data[2], p->len[2]) : NULL;
    const char *file = j ? rl_json_str(j, "file") : NULL;
    double off = j ? rl_json_num(j, "offset", -1) : -1, len = j ? rl_json_num(j, "len", -1) : -1;
    rl_err err = {{0}};
    uint8_t *buf = NULL;
    int rc;
    if (!lent) {
        rc = rl_errf(&err, "this node lends its files only to nodes its coordinator names");
    } else if (!file || off < 0 || len < 1 || len > (64 << 20)) {
        rc = rl_errf(&err, "malformed PULL");
    } else if (!(buf = malloc((size_t)len))) {
        rc = rl_errf(&err, "out of memory");
    } else {
        rc = parts_read(n->o->models_dir, file, (uint64_t)off, (size_t)len, buf, &err);
    }
    rl_err e2;
    if (rc == 0) {
        node_reply_to(n, p->data[0], p->len[0], FRAME_PULL_DATA, h->step_id, buf, (size_t)len, &e2);
    } else {
        node_log(n, "refused a PULL from %.16s...: %s", p->user[0] ? p->user : "?", err.msg);
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "msg", err.msg);
        char *es = cJSON_PrintUnformatted(e);
        cJSON_Delete(e);
        if (es) node_reply_to(n, p->data[0], p->len[0], FRAME_ERROR, h->step_id, es, strlen(es), &e2);
        free(es);
    }
    free(buf);
    cJSON_Delete(j);
}

/* Times the assigned stage on a scratch sequence: two one-token frames (a decode step, sampled twice: both
 * go to the fit, which weighs each frame relative to its own time) and one chunk of up to 64
 * tokens, for the coordinator's prediction (READY "steps"; docs/plan.md). Not under --mem (the frames
 * would time the disk and fill the expert cache with the scratch's experts), not on a GPU, and not for a
 * context too small to hold them. A failure only leaves the steps out: the probe's figures then stand. */
static void node_time_stage(node *n) {
    char key[sizeof n->step_key];
    snprintf(key, sizeof key, "%s %u %u %u %d %u %u %d", n->hash, n->a, n->b, n->n_ctx, n->n_seqs, n->gpu_layers,
             n->n_cpu_moe, n->wire);
    if (n->n_steps > 0 && strcmp(key, n->step_key) == 0) return;
    n->n_steps = 0;
    n->step_key[0] = 0;
    /* Nor on a GPU node: its devices keep their probe's figures (on lavapipe the node crashed in these
     * frames at ASSIGN, in tests/t_gpu.sh's Vulkan ring, not yet understood; docs/plan.md). */
    if (n->disk > 0 || n->n_ctx < 16 || n->dev_name[0]) return;
    const uint32_t chunk = n->n_ctx - 4 < 64 ? n->n_ctx - 4 : 64; /* with the three one-token frames, below n_ctx */
    uint32_t tok[3] = {1, 1, chunk};
    double sec[3];
    rl_err err;
    if (stage_time(&n->stage_rt, tok, 3, sec, &err) != 0) {
        node_log(n, "timing the stage failed (%s); the coordinator predicts from the probe's figures", err.msg);
        return;
    }
    memcpy(n->step_tok, tok, sizeof tok);
    memcpy(n->step_s, sec, sizeof sec);
    n->n_steps = 3;
    snprintf(n->step_key, sizeof n->step_key, "%s", key);
    node_log(n, "stage timed: a 1-token frame %.1f / %.1f ms, %u tokens %.1f ms", sec[0] * 1e3, sec[1] * 1e3, chunk,
             sec[2] * 1e3);
}

/* What an ASSIGN asks of this node (ring_open's JSON), read by node_assign_parse and node_assign_find; the
 * JSON it came in owns the strings. */
typedef struct node_assignment {
    const char *hash;                /* the model's id: whole-file hash, or the manifest's */
    double a, b, n_ctx;              /* the layer range [a, b) and each sequence's context */
    const cJSON *next;               /* the next stage's {addr, pubkey} (absent: this is the last stage) */
    const char *upstream;            /* the previous stage's key (absent: stage 0, fed by the coordinator) */
    bool by_manifest;                /* a manifest ring: the range is put together from parts */
    const char *path;                /* the file holding the range ("the manifest" for a manifest ring) */
    bool range_file;                 /* path is a streamed range file, not the whole model */
    uint32_t gpu_layers, n_cpu_moe;  /* the plan's split between device and RAM (UINT32_MAX: none) */
} node_assignment;

/* Step 1: the range, the model and the neighbours the ASSIGN names, checked for sense. */
static int node_assign_parse(node *n, uint64_t step, const cJSON *j, node_assignment *as) {
    as->hash = rl_json_str(j, "model_hash");
    as->a = rl_json_num(j, "a", -1), as->b = rl_json_num(j, "b", -1), as->n_ctx = rl_json_num(j, "n_ctx", 4096);
    as->next = cJSON_GetObjectItemCaseSensitive(j, "next");
    as->upstream = rl_json_str(j, "upstream");
    if (!as->hash || as->a < 0 || as->b <= as->a || as->n_ctx < 1 || as->n_ctx > (1 << 24)) {
        node_error(n, step, "ASSIGN lacks model_hash or a valid layer range / n_ctx");
        return -1;
    }
    as->by_manifest = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "manifest"));
    /* The plan's split of the range between the device and RAM (plan_stage.dev_layers, cpu_moe), unless this
     * node's own --gpu-layers / --n-cpu-moe fix it. */
    const double gl = rl_json_num(j, "gpu_layers", -1), ncm = rl_json_num(j, "n_cpu_moe", -1);
    as->gpu_layers = gl >= 0 && gl <= as->b - as->a ? (uint32_t)gl : UINT32_MAX;
    as->n_cpu_moe = ncm >= 0 && ncm <= as->b ? (uint32_t)ncm : UINT32_MAX;
    return 0;
}

/* Step 2: the file this node maps the range from: the whole model if it holds it, else a range file that
 * covers the range (a manifest ring's parts are found when they are put together). */
static int node_assign_find(node *n, uint64_t step, node_assignment *as) {
    const uint32_t a = (uint32_t)as->a, b = (uint32_t)as->b;
    as->path = as->by_manifest ? "the manifest" : NULL;
    as->range_file = false;
    for (int i = 0; i < n->n_models && !as->path; i++) {
        if (strcmp(n->models[i].hash, as->hash) == 0 && !n->models[i].range) as->path = n->models[i].path;
    }
    for (int i = 0; i < n->n_models && !as->path; i++) {
        const node_model *nm = &n->models[i];
        if (nm->range && strcmp(nm->hash, as->hash) == 0 && nm->a <= a && nm->b >= b) {
            as->path = nm->path;
            as->range_file = true;
        }
    }
    if (!as->path) {
        node_error(n, step, "model %.16s... is not among this node's models (--models %s)", as->hash,
                   n->o->models_dir ? n->o->models_dir : "not given");
        return -1;
    }
    return 0;
}

/* Step 3's end: the range just loaded, kept: its vocabulary on the last stage, what it is (so that the same
 * ASSIGN again keeps it loaded), and its manifest hash for receipts - from the manifest when its parts were
 * checked against it, else hashed by a thread. */
static void node_assign_keep(node *n, const node_assignment *as) {
    const uint32_t b = (uint32_t)as->b;
    rl_err err;
    /* The last stage samples: constrained output needs each token's bytes. A file without a vocabulary
     * still serves everything else (a grammar is then refused, naming why). */
    if (b == n->hp.n_layer) {
        rl_err te;
        if (tok_load(&n->tok, &n->m, &te) != 0) {
            node_log(n, "no vocabulary in %s, so no constrained output: %s", as->path, te.msg);
        } else if (!(n->vocab = chat_gram_vocab_new(&n->tok))) {
            tok_free(&n->tok);
        }
    }
    n->have_manifest = false;
    snprintf(n->hash, sizeof n->hash, "%s", as->hash);
    n->a = (uint32_t)as->a;
    n->b = b;
    n->gpu_layers = as->gpu_layers;
    n->n_cpu_moe = as->n_cpu_moe;
    /* (field by field: a compound literal of this struct, hparams inside, is a large stack temporary) */
    n->mfst.m = &n->m;
    n->mfst.hp = n->hp;
    n->mfst.a = n->a;
    n->mfst.b = n->b;
    n->mfst.rc = -1;
    if (n->have_mf) { /* every tensor matched the manifest: its range hash is the range's */
        n->have_manifest = manifest_file_range_hash(&n->mf, n->a, n->b, n->manifest, &err) == 0;
    } else {
        n->mfst.running = pthread_create(&n->mfst.thread, NULL, node_mfst_main, &n->mfst) == 0;
    }
}

/* Step 3: every sequence of the last assignment dropped, and the range mapped and its engine built - unless
 * this node holds that very range, split the same way, already (a ring re-opened over the same plan). */
static int node_assign_load(node *n, uint64_t step, const zs_parts *p, const cJSON *j, const node_assignment *as) {
    const double a = as->a, b = as->b;
    const char *hash = as->hash, *path = as->path;
    bool same = n->loaded && strcmp(n->hash, hash) == 0 && n->a == (uint32_t)a && n->b == (uint32_t)b &&
                n->gpu_layers == as->gpu_layers && n->n_cpu_moe == as->n_cpu_moe;
    node_drop_seqs(n);
    node_alog_clear(n); /* a new assignment is a new ring: its step ids start again */
    if (same) return 0;
    rl_err err;
    node_unload(n);
    if ((as->by_manifest  ? node_open_parts(n, p, j, hash, (uint32_t)a, (uint32_t)b, &err)
         : as->range_file ? k3_open_range(&n->m, &n->hp, path, (uint32_t)a, (uint32_t)b, &err)
                          : k3_open(&n->m, &n->hp, path, &err)) != 0) {
        node_error(n, step, "%s", err.msg);
        if (n->have_mf) manifest_file_free(&n->mf), n->have_mf = false;
        return -1;
    }
    if ((uint32_t)b > n->hp.n_layer) {
        node_error(n, step, "layer range [%g, %g) beyond the model's %u layers", a, b, n->hp.n_layer);
        mf_close(&n->m);
        return -1;
    }
    k3_engine_opts eo = n->o->eng;
    eo.n_threads = n->o->threads;
    if (as->gpu_layers != UINT32_MAX && !eo.gpu_layers_set) eo.gpu_layers_set = true, eo.gpu_layers = as->gpu_layers;
    if (as->n_cpu_moe != UINT32_MAX && eo.n_cpu_moe == 0) eo.n_cpu_moe = as->n_cpu_moe;
    if (k3_engine_init(&n->e, &n->m, &n->hp, (uint32_t)a, (uint32_t)b, &eo, &err) != 0) {
        node_error(n, step, "%s", err.msg);
        mf_close(&n->m);
        return -1;
    }
    k3_weights_prefault(&n->e.w, false);
    if (n->e.hp.n_dev > 0) {
        char where[512];
        k3_engine_describe(&n->e, where, sizeof where);
        node_log(n, "layers [%g, %g) computing on %s", a, b, where);
    }
    if (n->e.xc) {
        node_log(n, "layers [%g, %g) exceed --mem: routed experts read from the file through an expert cache of "
                    "%.1f MiB", a, b, (double)n->e.xc->cache_bytes / 1048576.0);
    }
    n->loaded = true;
    node_assign_keep(n, as);
    return 0;
}

/* Step 4: the stage over the loaded range: context, sequences held at once, the wire's type, rollback
 * blocks, the DSpark taps it holds. */
static void node_assign_stage(node *n, const cJSON *j, const node_assignment *as) {
    n->n_ctx = (uint32_t)as->n_ctx;
    const double n_seqs = rl_json_num(j, "n_seqs", 1);
    n->n_seqs = n_seqs >= 1 && n_seqs <= FRAME_MAX_SEQS ? (int)n_seqs : 1;
    n->stage = (int)rl_json_num(j, "stage", 0);
    n->n_stages = (int)rl_json_num(j, "n_stages", 1);
    const char *wire = rl_json_str(j, "wire");
    n->wire = wire && strcmp(wire, "f16") == 0 ? K3_WIRE_F16 : wire && strcmp(wire, "bf16") == 0 ? K3_WIRE_BF16 : K3_WIRE_F32;
    const double rb = rl_json_num(j, "rollback_blocks", 0);
    n->rb_blocks = rb >= 1 && rb <= K3_RB_BLOCKS ? (int)rb : 0;
    stage_init(&n->stage_rt, &n->e, n->n_ctx, n->n_seqs, n->wire); /* no sequence: node_drop_seqs above */
    n->stage_rt.rb_blocks = n->rb_blocks;
    n->stage_rt.vocab = n->vocab;
    n->n_taps = 0;
    const cJSON *taps = cJSON_GetObjectItemCaseSensitive(j, "taps"), *tv;
    cJSON_ArrayForEach(tv, taps) {
        if (n->n_taps < 16 && cJSON_IsNumber(tv) && tv->valuedouble >= 1 && tv->valuedouble <= n->hp.n_layer) {
            n->taps[n->n_taps++] = (uint32_t)tv->valuedouble;
        }
    }
    stage_set_taps(&n->stage_rt, n->taps, n->n_taps);
}

/* Step 5: the neighbours: trust exactly the upstream key we were given; connect to the downstream one, and
 * wait until that encrypted link is up, so a broken ring shows now rather than at the first frame. */
static int node_assign_links(node *n, uint64_t step, const node_assignment *as) {
    rl_err err;
    zs_auth_forget(&n->auth, "upstream");
    if (as->upstream) {
        keys_peer up;
        if (keys_peer_parse(&up, as->upstream, &err) != 0) {
            node_error(n, step, "upstream key: %s", err.msg);
            return -1;
        }
        zs_auth_allow(&n->auth, up.curve_pk, "upstream", up.pk_hex);
    }
    node_close_next(n);
    if (!cJSON_IsObject(as->next)) return 0;
    const char *addr = rl_json_str(as->next, "addr"), *pk = rl_json_str(as->next, "pubkey");
    keys_peer down;
    if (!addr || !pk || keys_peer_parse(&down, pk, &err) != 0) {
        node_error(n, step, "ASSIGN's next hop lacks addr or a valid pubkey");
        return -1;
    }
    /* A routing id of this connection's own: the next stage's ROUTER then never sees two connections
     * claim one id (a re-assigned ring connects again while the old link may still be registered). */
    char rid[80];
    snprintf(rid, sizeof rid, "node-%.16s-%08x", n->o->id.pk_hex, randombytes_random());
    n->next = zs_client(n->zctx, addr, &n->o->id, down.curve_pk_z85, rid, &err);
    snprintf(n->next_addr, sizeof n->next_addr, "%s", addr);
    if (!n->next) {
        node_error(n, step, "next hop %s: %s", addr, err.msg);
        return -1;
    }
    /* Answer READY only once the encrypted link downstream is up: a broken ring shows now. */
    rl_err me;
    if (zs_monitor_start(&n->next_mon, n->zctx, n->next, "next", &me) != 0) zs_monitor_stop(&n->next_mon);
    bool up = zs_wait_writable(n->next, 10000);
    if (!up) {
        if (n->next_mon.pair) zs_monitor_poll(&n->next_mon);
        node_error(n, step, "cannot connect to the next stage %s within 10 s%s%s", addr,
                   n->next_mon.last[0] ? ": " : "", n->next_mon.last);
        node_close_next(n);
        return -1;
    }
    return 0;
}

/* Step 6: READY, with the range, where it computes, and the stage's own timed frames (node_time_stage). */
static void node_assign_ready(node *n, uint64_t step) {
    char spec[96] = "";
    if (n->rb_blocks > 0) { /* what a sequence's rollback copies come to, at most (k3_memory.h) */
        snprintf(spec, sizeof spec, "; %d speculative block%s in flight kept for rollback", n->rb_blocks,
                 n->rb_blocks > 1 ? "s" : "");
    }
    node_log(n, "stage %d of %d: layers [%u, %u) of %.12s..., %s%s", n->stage + 1, n->n_stages, n->a, n->b, n->hash,
             n->next ? "forwarding downstream" : "last stage, returning to the coordinator", spec);
    node_time_stage(n);
    cJSON *r = cJSON_CreateObject();
    cJSON_AddNumberToObject(r, "a", n->a);
    cJSON_AddNumberToObject(r, "b", n->b);
    cJSON_AddNumberToObject(r, "weight_bytes", (double)k3_range_weight_bytes(&n->m, &n->hp, n->a, n->b));
    char where[512];
    k3_engine_describe(&n->e, where, sizeof where);
    cJSON_AddStringToObject(r, "where", where);
    if (n->n_steps > 0) {
        cJSON *sa = cJSON_AddArrayToObject(r, "steps");
        for (int i = 0; i < n->n_steps; i++) {
            cJSON *st = cJSON_CreateObject();
            cJSON_AddNumberToObject(st, "tokens", n->step_tok[i]);
            cJSON_AddNumberToObject(st, "s", n->step_s[i]);
            cJSON_AddItemToArray(sa, st);
        }
#ifdef RINGLM_ADVERSARY
        if (n->o->misbehave && strcmp(n->o->misbehave, "badsteps") == 0) { /* a frame that took no time */
            cJSON *st = cJSON_CreateObject();
            cJSON_AddNumberToObject(st, "tokens", 1);
            cJSON_AddNumberToObject(st, "s", -1);
            cJSON_AddItemToArray(sa, st);
        }
#endif
    }
    char *s = cJSON_PrintUnformatted(r);
    cJSON_Delete(r);
    if (s) node_reply(n, FRAME_READY, step, s, strlen(s));
    free(s);
}

/* ASSIGN: this node's stage of a ring, in the steps above; the first that fails has answered ERROR, and the
 * rest are not taken. */
static void node_assign(node *n, uint64_t step, const zs_parts *p) {
    cJSON *j = cJSON_ParseWithLength(p->data[2], p->len[2]);
    if (!j) {
        node_error(n, step, "ASSIGN is not valid JSON");
        return;
    }
    node_assignment as;
    if (node_assign_parse(n, step, j, &as) == 0 && node_assign_find(n, step, &as) == 0 &&
        node_assign_load(n, step, p, j, &as) == 0) {
        node_assign_stage(n, j, &as);
        if (node_assign_links(n, step, &as) == 0) node_assign_ready(n, step);
    }
    cJSON_Delete(j);
}

/* ---- forward ----------------------------------------------------------------------------------- */

/* ---- audit log: what this stage received and sent, for an auditor to check --------------------- */

static void node_alog_drop_oldest(node *n) {
    struct node_audit_rec *r = &n->alog[n->alog_head];
    n->alog_bytes -= r->in_len + r->out_len;
    free(r->in);
    free(r->out);
    memset(r, 0, sizeof *r);
    n->alog_head = (n->alog_head + 1) % n->alog_cap;
    n->alog_n--;
}

static void node_alog_clear(node *n) {
    while (n->alog_n) node_alog_drop_oldest(n);
    free(n->alog);
    n->alog = NULL;
    n->alog_cap = n->alog_head = n->alog_bytes = 0;
}

/* Keeps one step's input and output (malloc'ed; taken over), forgetting the oldest steps beyond the byte
 * budget. A failure to keep them is not an error of the step: an audit of it then finds nothing and says so. */
static void node_alog_add(node *n, const frame_header *h, uint8_t *in, size_t in_len, uint8_t *out, size_t out_len) {
    size_t keep = n->o->audit_keep_bytes ? n->o->audit_keep_bytes : (size_t)256 << 20;
    if (in_len + out_len > keep) {
        free(in);
        free(out);
        return;
    }
    while (n->alog_n && n->alog_bytes + in_len + out_len > keep) node_alog_drop_oldest(n);
    if (n->alog_n == n->alog_cap) { /* grow, unwrapping the ring so the oldest is at 0 again */
        size_t cap = n->alog_cap ? n->alog_cap * 2 : 64;
        struct node_audit_rec *a = calloc(cap, sizeof *a);
        if (!a) {
            free(in);
            free(out);
            return;
        }
        for (size_t i = 0; i < n->alog_n; i++) a[i] = n->alog[(n->alog_head + i) % n->alog_cap];
        free(n->alog);
        n->alog = a;
        n->alog_cap = cap;
        n->alog_head = 0;
    }
    struct node_audit_rec r = {.ring_id = h->ring_id, .step_id = h->step_id, .in = in, .out = out,
                               .in_len = in_len, .out_len = out_len};
    n->alog[(n->alog_head + n->alog_n) % n->alog_cap] = r;
    n->alog_n++;
    n->alog_bytes += in_len + out_len;
}

static const struct node_audit_rec *node_alog_find(const node *n, uint64_t ring_id, uint64_t step) {
    for (size_t i = 0; i < n->alog_n; i++) {
        const struct node_audit_rec *r = &n->alog[(n->alog_head + i) % n->alog_cap];
        if (r->ring_id == ring_id && r->step_id == step) return r;
    }
    return NULL;
}

#ifdef RINGLM_ADVERSARY
/* ---- test builds only: a node that lies (tests/t_trust.sh) --------------------------------------- */

static bool node_adv_is(const node *n, const char *mode) {
    const char *m = n->o->misbehave;
    if (!m) return false;
    size_t l = strlen(mode);
    if (strncmp(m, mode, l) != 0 || (m[l] && m[l] != '@')) return false;
    long from = m[l] == '@' ? atol(m + l + 1) : 0;
    return n->adv_forwards > from;
}

/* skip / perturb: change what is sent on, then sign it honestly (only an audit can catch this). */
static void node_adv_output(node *n, const frame_header *h, const uint8_t *in, uint8_t *out, size_t out_len) {
    bool skip = node_adv_is(n, "skip"), perturb = node_adv_is(n, "perturb");
    if (!skip && !perturb) return;
    uint64_t total = 0;
    for (uint32_t i = 0; i < h->n_seqs; i++) total += h->seqs[i].n_tokens;
    if (n->b == n->hp.n_layer) { /* the last stage: another token than the model's */
        for (uint32_t i = 0; i < h->n_seqs; i++) {
            int32_t t;
            memcpy(&t, out + i * 4, 4);
            if (t < 0 || (h->seqs[i].flags & FRAME_SEQ_VERIFY)) continue;
            t = (int32_t)(((uint32_t)t + 1) % n->hp.n_vocab);
            memcpy(out + i * 4, &t, 4);
        }
        return;
    }
    rl_err err;
    k3_boundary bo = {0}, bi = {0};
    if (k3_boundary_decode(&bo, out + total * 4, out_len - total * 4, (uint32_t)total, n->hp.n_embd, &err) != 0) return;
    size_t nh = (size_t)bo.n_tokens * bo.n_embd;
    float mx = 0;
    for (size_t i = 0; i < nh; i++) mx = fmaxf(mx, fabsf(bo.h[i]));
    if (skip && n->a > 0 && k3_boundary_decode(&bi, in + total * 4, h->payload_bytes - total * 4, (uint32_t)total,
                                               n->hp.n_embd, &err) == 0) {
        memcpy(bo.h, bi.h, nh * sizeof *bo.h); /* as if these layers added nothing */
    } else {
        for (size_t i = 0; i < nh; i += 7) bo.h[i] += (skip ? -1.0f : 0.05f) * mx;
    }
    k3_boundary_encode(&bo, (enum k3_wire_dtype)n->wire, out + total * 4);
    k3_boundary_free(&bo);
    k3_boundary_free(&bi);
}

/* wrongkey / claim: a receipt signed by another key, or for a layer range the node was not given. */
static void node_adv_receipt(node *n, receipt_rec *r) {
    if (node_adv_is(n, "claim")) {
        if (r->layer_end < n->hp.n_layer) r->layer_end++;
        else r->layer_start--;
    }
}
static const keys_identity *node_adv_signer(node *n) {
    if (!node_adv_is(n, "wrongkey")) return &n->o->id;
    rl_err err;
    if (!n->adv_have_other) n->adv_have_other = keys_generate(&n->adv_other, &err) == 0;
    return n->adv_have_other ? &n->adv_other : &n->o->id;
}
/* replay: keeps its first receipt and sends that one again instead of a fresh one. */
static void node_adv_replay(node *n, const uint8_t **packed, size_t *len) {
    if (!n->adv_old) {
        n->adv_old = malloc(*len);
        if (n->adv_old) memcpy(n->adv_old, *packed, *len), n->adv_old_len = *len;
        return;
    }
    if (node_adv_is(n, "replay")) *packed = n->adv_old, *len = n->adv_old_len;
}
#endif

/* AUDIT_REQ: u32 n | n x u64 step id -> AUDIT_DATA (frame.h). */
static void node_audit(node *n, const zs_parts *p, const frame_header *h) {
    uint32_t cnt = 0;
    if (p->len[2] >= 4) memcpy(&cnt, p->data[2], 4);
    if (p->len[2] < 4 || cnt > 65536 || p->len[2] != 4 + (size_t)cnt * 8) {
        node_error(n, h->step_id, "AUDIT_REQ of %zu bytes is malformed", p->len[2]);
        return;
    }
    const uint8_t *ids = (const uint8_t *)p->data[2] + 4;
    size_t len = 4;
    for (uint32_t i = 0; i < cnt; i++) {
        uint64_t step;
        memcpy(&step, ids + i * 8, 8);
        const struct node_audit_rec *r = node_alog_find(n, h->ring_id, step);
        len += 25 + (r ? r->in_len + r->out_len : 0);
    }
    uint8_t *buf = malloc(len), *w = buf;
    if (!buf) {
        node_error(n, h->step_id, "out of memory for AUDIT_DATA (%zu bytes)", len);
        return;
    }
    memcpy(w, &cnt, 4);
    w += 4;
    for (uint32_t i = 0; i < cnt; i++) {
        uint64_t step, il = 0, ol = 0;
        memcpy(&step, ids + i * 8, 8);
        const struct node_audit_rec *r = node_alog_find(n, h->ring_id, step);
        uint8_t kept = r != NULL;
        if (r) il = r->in_len, ol = r->out_len;
        memcpy(w, &step, 8), memcpy(w + 8, &kept, 1), memcpy(w + 9, &il, 8), memcpy(w + 17, &ol, 8);
        w += 25;
        if (r) {
            memcpy(w, r->in, il);
            memcpy(w + il, r->out, ol);
#ifdef RINGLM_ADVERSARY
            if (ol && node_adv_is(n, "auditlie")) w[il + ol - 1] ^= 1; /* hands the auditor other bytes */
#endif
            w += il + ol;
        }
    }
    node_reply(n, FRAME_AUDIT_DATA, h->step_id, buf, len);
    free(buf);
}


/* Signs this stage's receipt for one traversal and sends it to the coordinator (out of band). */
static void node_send_receipt(node *n, const frame_header *h, const uint8_t nonce[32], const void *in, size_t in_len,
                              const void *out_bytes, size_t out_len) {
    rl_err err;
    receipt_rec *r = calloc(1, sizeof *r);
    receipt_seq sq[FRAME_MAX_SEQS];
    uint8_t packed[RECEIPT_MAX_PACKED];
    size_t packed_len = 0;
    for (uint32_t i = 0; i < h->n_seqs; i++) {
        sq[i] = (receipt_seq){.seq_id = h->seqs[i].seq_id, .pos = h->seqs[i].pos, .n_tokens = h->seqs[i].n_tokens};
    }
    int ok = r != NULL;
    if (ok) ok = node_manifest(n, &err) == 0;
    if (ok) {
        r->ring_id = h->ring_id;
        r->request_id = h->step_id;
        memcpy(r->nonce, nonce, 32);
        memcpy(r->manifest, n->manifest, 32);
        r->layer_start = n->a;
        r->layer_end = n->b;
        receipt_hash(in, in_len, r->in_hash);
        receipt_hash(out_bytes, out_len, r->out_hash);
        const keys_identity *signer = &n->o->id;
#ifdef RINGLM_ADVERSARY
        node_adv_receipt(n, r);
        signer = node_adv_signer(n);
#endif
        ok = receipt_set_seqs(r, sq, h->n_seqs, &err) == 0 && receipt_sign(r, signer, &err) == 0 &&
             receipt_pack(r, packed, sizeof packed, &packed_len, &err) == 0;
    }
    free(r);
    if (!ok) {
        node_error(n, h->step_id, "cannot sign a receipt: %s", err.msg);
        return;
    }
    const uint8_t *send = packed;
#ifdef RINGLM_ADVERSARY
    node_adv_replay(n, &send, &packed_len);
#endif
    /* The header names the receipt's own ring, not the frame being handled now: a receipt flushed as the
     * next coordinator's first message arrives belongs to the ring that sent the frame. */
    uint64_t cur = n->cur_ring;
    n->cur_ring = h->ring_id;
    node_reply(n, FRAME_RECEIPT, h->step_id, send, packed_len);
    n->cur_ring = cur;
}

/* Signs and sends every pending receipt, oldest first, and files the frames in the audit log.
 *
 * Why not at once: a stage's frame is handed to the next one by ZeroMQ's I/O threads after zs_send
 * returns; hashing and signing right then competes with that hand-off (and with the next stage's compute,
 * when nodes share a machine) and lengthens every traversal. A millisecond later the hand-off is done and
 * the work overlaps the next stage's compute instead. Receipts travel out of band, so a little late is
 * fine; they are always sent before the node handles anything else. */
static void node_flush_receipts(node *n) {
    for (int i = 0; i < n->n_rjobs; i++) {
        struct node_rjob *j = &n->rjobs[i];
        node_send_receipt(n, j->h, j->nonce, j->in, j->in_len, j->out, j->out_len);
        node_alog_add(n, j->h, j->in, j->in_len, j->out, j->out_len);
        free(j->h);
    }
    n->n_rjobs = 0;
}

static void node_free_rjobs(node *n) {
    for (int i = 0; i < n->n_rjobs; i++) free(n->rjobs[i].h), free(n->rjobs[i].in), free(n->rjobs[i].out);
    free(n->rjobs);
    n->rjobs = NULL;
    n->n_rjobs = n->cap_rjobs = 0;
}

/* Queues this frame's receipt (takes out; copies the input). Signs at once if it cannot queue. */
static void node_queue_receipt(node *n, const frame_header *h, const uint8_t nonce[32], const void *in, size_t in_len,
                               uint8_t *out, size_t out_len) {
    if (n->n_rjobs == n->cap_rjobs) {
        int cap = n->cap_rjobs ? n->cap_rjobs * 2 : 8;
        struct node_rjob *nj = realloc(n->rjobs, (size_t)cap * sizeof *nj);
        if (nj) n->rjobs = nj, n->cap_rjobs = cap;
    }
    struct node_rjob j = {.h = malloc(sizeof *h), .in = malloc(in_len + 1), .out = out, .in_len = in_len,
                          .out_len = out_len};
    if (n->n_rjobs == n->cap_rjobs || !j.h || !j.in) {
        free(j.h), free(j.in);
        node_send_receipt(n, h, nonce, in, in_len, out, out_len);
        free(out);
        return;
    }
    *j.h = *h;
    memcpy(j.nonce, nonce, 32);
    memcpy(j.in, in, in_len);
    n->rjobs[n->n_rjobs++] = j;
}

/* TAPS (frame.h): this stage's DSpark taps of the frame just forwarded, straight to the coordinator. */
static void node_send_taps(node *n, uint64_t step) {
    const ring_stage *s = &n->stage_rt;
    size_t rows = (size_t)s->n_taps * s->n_tap_rows * n->hp.n_embd * sizeof(float);
    size_t len = 4 + 4 * (size_t)s->n_taps + 4 + rows;
    uint8_t *buf = malloc(len);
    if (!buf) {
        node_log(n, "out of memory for %zu bytes of taps", len);
        return;
    }
    uint32_t nt = (uint32_t)s->n_taps;
    memcpy(buf, &nt, 4);
    memcpy(buf + 4, s->taps, 4 * (size_t)nt);
    memcpy(buf + 4 + 4 * (size_t)nt, &s->n_tap_rows, 4);
    memcpy(buf + 8 + 4 * (size_t)nt, s->tap_rows, rows);
#ifdef RINGLM_ADVERSARY
    if (node_adv_is(n, "badtaps")) len -= 4; /* one float short */
    if (node_adv_is(n, "duptaps")) {         /* the real taps, then a second message of other rows */
        node_reply(n, FRAME_TAPS, step, buf, len);
        for (size_t i = 0; i < rows / sizeof(float); i++) ((float *)(buf + 8 + 4 * (size_t)nt))[i] = 1.0f;
    }
#endif
    node_reply(n, FRAME_TAPS, step, buf, len);
    free(buf);
}

static void node_forward(node *n, const zs_parts *p, const frame_header *h) {
    rl_err err;
    double t_recv = frame_now();
    if (!n->loaded) {
        node_error(n, h->step_id, "FORWARD before ASSIGN");
        return;
    }
    if (p->n < 4) {
        node_error(n, h->step_id, "FORWARD with %d parts, expected 4", p->n - 1);
        return;
    }
    frame_stamp stamps[FRAME_MAX_STAMPS + 1];
    uint32_t n_stamps = 0;
    if (frame_stamps_decode(stamps, &n_stamps, p->data[3], p->len[3], &err) != 0 || n_stamps >= FRAME_MAX_STAMPS) {
        node_error(n, h->step_id, "FORWARD: %s", n_stamps >= FRAME_MAX_STAMPS ? "too many hops" : err.msg);
        return;
    }
    /* Receipts: when the coordinator asks (the extension with its nonce), this stage signs what it ran. */
    frame_receipts rx;
    int want_receipt = frame_receipts_decode(&rx, p->data[3], p->len[3], &err);
    if (want_receipt < 0 || (want_receipt == 0 && rx.n >= FRAME_MAX_RECEIPTS)) {
        node_error(n, h->step_id, "FORWARD: %s", want_receipt < 0 ? err.msg : "too many receipts");
        return;
    }
    want_receipt = want_receipt == 0;
    double t_start = frame_now();
    uint8_t *payload = NULL;
    size_t plen = 0;
    if (stage_run(&n->stage_rt, h, p->data[2], p->len[2], p->n > 4 ? p->data[4] : NULL, p->n > 4 ? p->len[4] : 0,
                  &payload, &plen, &err) != 0) {
        node_error(n, h->step_id, "%s", err.msg);
        return;
    }
    bool last = n->b == n->hp.n_layer;
#ifdef RINGLM_ADVERSARY
    n->adv_forwards++;
    node_adv_output(n, h, p->data[2], payload, plen);
#endif
    double t_end = frame_now();
    uint64_t total = 0;
    for (uint32_t i = 0; i < h->n_seqs; i++) total += h->seqs[i].n_tokens;
    stamps[n_stamps++] = (frame_stamp){.stage = (uint32_t)n->stage, .n_tokens = (uint32_t)total, .t_recv = t_recv,
                                    .t_start = t_start, .t_end = t_end};
    frame_header oh = *h;
    if (last) oh.type = FRAME_RESULT;
    oh.payload_bytes = plen;
    stamps[n_stamps - 1].t_send = frame_now();
    size_t hl = frame_header_size(oh.n_seqs), sl = frame_stamps_size(n_stamps);
    size_t xl = want_receipt ? frame_receipts_size(&rx, 0) : 0;
    uint8_t *hb = malloc(hl), *sb = malloc(sl + xl);
    sl += xl;
    if (hb && sb) {
        frame_header_encode(&oh, hb);
        frame_stamps_encode(stamps, n_stamps, sb);
        if (want_receipt) frame_receipts_encode(&rx, NULL, 0, sb + frame_stamps_size(n_stamps));
        if (!last) {
            const void *parts[4] = {hb, payload, sb, p->n > 4 ? p->data[4] : NULL};
            size_t lens[4] = {hl, plen, sl, p->n > 4 ? p->len[4] : 0};
            if (node_send_next(n, parts, lens, p->n > 4 ? 4 : 3, &err) != 0) {
                char msg[1024];
                snprintf(msg, sizeof msg, "stage %d cannot reach the next stage: %s", n->stage + 1, err.msg);
                node_error_at(n, h->step_id, n->next_mon.disconnected ? n->next_addr : NULL, msg);
            }
        } else {
            const void *parts[4] = {n->coord_id, hb, payload, sb};
            size_t lens[4] = {n->coord_id_len, hl, plen, sl};
            if (zs_send(n->router, parts, lens, 4, true, &err) != 0) node_log(n, "cannot return a result: %s", err.msg);
        }
    }
    free(hb);
    free(sb);
    if (n->stage_rt.n_tap_rows > 0) node_send_taps(n, h->step_id);
    if (n->stage_rt.routes) {
        size_t rl = n->stage_rt.routes_len;
#ifdef RINGLM_ADVERSARY
        if (node_adv_is(n, "badroutes")) rl -= 4; /* one value short */
        if (node_adv_is(n, "duproutes")) node_reply(n, FRAME_ROUTES, h->step_id, n->stage_rt.routes, rl);
#endif
        node_reply(n, FRAME_ROUTES, h->step_id, n->stage_rt.routes, rl);
    }
    /* The frame is on its way: now hash what came in and what went out, sign, and tell the coordinator
     * directly. The next stage hashes the same bytes as its input, so the coordinator can check the chain. */
    if (want_receipt) node_queue_receipt(n, h, rx.nonce, p->data[2], p->len[2], payload, plen);
    else free(payload);
}

static void node_free(node *n, const zs_parts *p, const frame_header *h) {
    for (uint32_t i = 0; i < h->n_seqs; i++) stage_forget(&n->stage_rt, h->seqs[i].seq_id);
    if (n->next) { /* pass it down the ring so every stage forgets the sequence */
        const void *parts[3] = {p->data[1], p->data[2], p->n > 3 ? p->data[3] : ""};
        size_t lens[3] = {p->len[1], p->len[2], p->n > 3 ? p->len[3] : 0};
        rl_err err;
        zs_send(n->next, parts, lens, 3, true, &err);
    }
}


/* ---- fetch: a coordinator streams this node the layers it lacks ---------------------------------- */

static void node_fetch_abort(node *n) {
    if (n->fetch.f) fclose(n->fetch.f);
    if (n->fetch.active) unlink(n->fetch.tmp);
    memset(&n->fetch, 0, sizeof n->fetch);
}

static void node_fetch_begin(node *n, uint64_t step, const zs_parts *p) {
    node_fetch_abort(n);
    node_fetch *f = &n->fetch;
    cJSON *j = p->n >= 4 ? cJSON_ParseWithLength(p->data[2], p->len[2]) : NULL;
    const char *hash = rl_json_str(j, "model_hash");
    double a = rl_json_num(j, "a", -1), b = rl_json_num(j, "b", -1), bytes = rl_json_num(j, "file_bytes", -1);
    if (!hash || strlen(hash) != 64 || strspn(hash, "0123456789abcdef") != 64 || a < 0 || b <= a || bytes <= 0 ||
        p->len[3] > bytes) {
        cJSON_Delete(j);
        node_error(n, step, "FETCH_BEGIN lacks a valid model_hash, layer range or size");
        return;
    }
    if (rl_mkdirs(n->cache_dir) != 0) {
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
    node_reply(n, FRAME_FETCH_ACK, step, NULL, 0);
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
    node_reply(n, FRAME_FETCH_ACK, step, NULL, 0);
}

static void node_fetch_end(node *n, uint64_t step, const zs_parts *p) {
    node_fetch *f = &n->fetch;
    if (!f->active) {
        node_error(n, step, "FETCH_END without FETCH_BEGIN");
        return;
    }
    cJSON *j = cJSON_ParseWithLength(p->data[2], p->len[2]);
    const char *want = rl_json_str(j, "blake2b");
    unsigned char out[32];
    char got[65];
    crypto_generichash_final(&f->h, out, 32);
    sodium_bin2hex(got, sizeof got, out, 32);
    bool hash_ok = want && strcmp(want, got) == 0; /* before cJSON_Delete: want points into j */
    bool ok = hash_ok && f->written == f->expect;
    cJSON_Delete(j);
    if (!ok) {
        node_error(n, step, "fetched range file is corrupt (%" PRIu64 " of %" PRIu64 " bytes, hash %s)", f->written,
                   f->expect, hash_ok ? "ok" : "mismatch");
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
    node_reply(n, FRAME_READY, step, "{\"fetched\":true}", 16);
}

/* ---- one coordinator at a time ------------------------------------------------------------------ */

/* The owner part of a coordinator's routing id: all but its last "-" field (coord.c: ring_open_connect). */
static size_t node_owner_len(const char *id, size_t len) {
    for (size_t i = len; i > 0; i--) {
        if (id[i - 1] == '-') return i - 1;
    }
    return len;
}

/* Connections that closed: the owner's closing frees the node. Drained before every coordinator message,
 * so a successor that connects right after the owner's exit finds the node free. */
static void node_watch_owner(node *n) {
    if (!n->router_mon.pair) return;
    zs_monitor_poll(&n->router_mon);
    if (n->owned && n->router_mon.watch_gone) {
        node_log(n, "coordinator %.16s... (%s) disconnected; another may take this node now", n->owner_key,
                 n->owner_peer);
        n->owned = false;
        zs_auth_forget(&n->auth, "fetcher"); /* what it lent, it lent for that coordinator's ring */
        n->n_lent = 0;
        zs_auth_forget(&n->auth, "peer");
        n->n_probers = 0;
    }
    n->router_mon.watch_gone = false;
    if (!n->owned) n->router_mon.watch_fd = -1;
}

/* Message types only a coordinator sends. FORWARD and FREE come from the coordinator too when this is
 * stage 0, else from the upstream node: those are told apart by their routing id (coordinators' start
 * "coord-", upstream nodes' "node-"). */
static bool node_from_coordinator(const zs_parts *p, const frame_header *h) {
    switch (h->type) {
    case FRAME_INFO_REQ: case FRAME_ASSIGN: case FRAME_PING: case FRAME_AUDIT_REQ: case FRAME_LEND: case FRAME_PEERS: case FRAME_PROBE:
    case FRAME_FETCH_BEGIN: case FRAME_FETCH_DATA: case FRAME_FETCH_END: return true;
    default: return p->len[0] >= 6 && memcmp(p->data[0], "coord-", 6) == 0;
    }
}

/* A coordinator's message: true if this node serves it (taking the node if it is free), else false after
 * answering it with an ERROR that names the coordinator the node serves. */
static bool node_admit(node *n, const zs_parts *p, const frame_header *h) {
    node_watch_owner(n);
    size_t ol = node_owner_len(p->data[0], p->len[0]);
    /* The session in the routing id, and the key the handshake proved: one allowed coordinator cannot pass
     * for another by choosing its routing id. */
    bool mine = n->owned && ol == n->owner_len && memcmp(p->data[0], n->owner, ol) == 0 &&
                strcmp(p->user, n->owner_key) == 0;
    /* Only an INFO request takes a free node: every ring_open starts with one. Anything else from a
     * coordinator that is not the owner may be a message its connection delivered just before it closed,
     * read after the close freed the node: taking the node on it would hold it for a dead coordinator. */
    if (!n->owned && h->type == FRAME_INFO_REQ) {
        n->owned = true;
        n->owner_len = ol < sizeof n->owner ? ol : sizeof n->owner; /* bytes: a routing id may hold NULs */
        memcpy(n->owner, p->data[0], n->owner_len);
        snprintf(n->owner_key, sizeof n->owner_key, "%s", p->user);
        snprintf(n->owner_peer, sizeof n->owner_peer, "%s", p->peer[0] ? p->peer : "?");
        n->owner_since = rl_clock_now();
        node_log(n, "serving coordinator %.16s... from %s", n->owner_key[0] ? n->owner_key : "(unknown key)",
                 n->owner_peer);
        mine = true;
    }
    if (mine) {
        n->owner_fd = p->fd;
        n->router_mon.watch_fd = p->fd; /* its latest connection: the one whose close frees the node */
        n->coord_id_len = p->len[0] < sizeof n->coord_id ? p->len[0] : sizeof n->coord_id; /* replies go there */
        memcpy(n->coord_id, p->data[0], n->coord_id_len);
        return true;
    }
    char msg[600];
    bool same_key = strcmp(p->user, n->owner_key) == 0;
    if (!n->owned) {
        snprintf(msg, sizeof msg, "serves no coordinator now (its coordinator's connection closed): open the ring again");
    } else {
        snprintf(msg, sizeof msg,
                 "in use by another coordinator%s (key %.16s..., from %s, for %.0f s): a ring serves one coordinator at "
                 "a time; stop that one, or wait until it closes its ring",
                 same_key ? " process with the same key" : "", n->owner_key, n->owner_peer, rl_clock_now() - n->owner_since);
    }
    double now = rl_clock_now();
    if (n->owned && now - n->busy_logged >= 10) {
        n->busy_logged = now;
        node_log(n, "refused coordinator %.16s... from %s: %s", p->user[0] ? p->user : "?", p->peer, msg);
    }
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "msg", msg);
    cJSON_AddStringToObject(j, "node", n->o->listen);
    if (n->owned) cJSON_AddBoolToObject(j, "busy", true);
    char *js = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    rl_err e2; /* a refused peer that already left: nothing to do (cur_ring is this message's ring) */
    node_reply_to(n, p->data[0], p->len[0], FRAME_ERROR, h->step_id, js, js ? strlen(js) : 0, &e2);
    free(js);
    return false;
}

/* ---- main loop --------------------------------------------------------------------------------- */

static bool node_stop_pending(void) {
    sigset_t pend;
    return sigpending(&pend) == 0 && (sigismember(&pend, SIGINT) || sigismember(&pend, SIGTERM));
}

int node_run(const node_opts *o, rl_err *err) {
    /* aligned_alloc, not calloc: node holds libsodium's hash state, which is declared 64-byte aligned, so
     * the compiler may copy its fields with aligned vector moves that fault on calloc's 16-byte alignment. */
    node *n = aligned_alloc(_Alignof(node), sizeof *n);
    if (!n) return rl_errf(err, "out of memory");
    memset(n, 0, sizeof *n);
    n->o = o;
    n->zctx = zmq_ctx_new();
    int rc = -1;
    if (!n->zctx) {
        rl_errf(err, "cannot create a ZeroMQ context");
        goto done_free;
    }
    if (zs_auth_start(&n->auth, n->zctx, err) != 0) goto done_ctx;
    for (int i = 0; i < o->n_allow; i++) zs_auth_allow(&n->auth, o->allow[i].curve_pk, "coordinator", o->allow[i].pk_hex);
    n->router = zs_server(n->zctx, o->listen, &o->id, err);
    if (!n->router) goto done_auth;
    if (zs_monitor_start_gone(&n->router_mon, n->zctx, n->router, "router", err) != 0) {
        zmq_close(n->router);
        goto done_auth;
    }
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (o->cache_dir) snprintf(n->cache_dir, sizeof n->cache_dir, "%s", o->cache_dir);
    else if (xdg) snprintf(n->cache_dir, sizeof n->cache_dir, "%s/ringlm/node-%.16s", xdg, o->id.pk_hex);
    else snprintf(n->cache_dir, sizeof n->cache_dir, "%s/.cache/ringlm/node-%.16s", home ? home : "/tmp", o->id.pk_hex);
    node_scan_models(n);
    node_scan_cache(n);
    n->speed = o->speed_gbs > 0 ? o->speed_gbs * 1e9 : node_probe_speed(o->threads);
    n->flops = o->tflops > 0 ? o->tflops * 1e12 : node_probe_flops(o->threads);
    /* Only a node with a budget reads experts from disk (without --mem its weights are not capped). */
    if (o->eng.mem_bytes > 0) n->disk = o->disk_gbs > 0 ? o->disk_gbs * 1e9 : node_probe_disk(o->models_dir);
    if (node_probe_device(n, err) != 0) goto done_sock;
    node_log(n, "ready: key %s, %d model(s), %.1f GB/s matrix-vector, %.3f TFLOPS matrix-matrix, %d threads%s", o->id.pk_hex,
             n->n_models, n->speed / 1e9, n->flops / 1e12, o->threads, n->disk > 0 ? ", experts from disk past --mem" : "");
    while (!node_stop_pending()) {
        /* The router's monitor is drained on every pass, messages or not: its events queue up otherwise. */
        zmq_pollitem_t items[3] = {{n->router, 0, ZMQ_POLLIN, 0}, {n->next, 0, ZMQ_POLLIN, 0},
                                   {n->router_mon.pair, 0, ZMQ_POLLIN, 0}};
        if (!n->next) items[1] = items[2];
        int np = n->next ? 3 : 2;
        if (zmq_poll(items, np, n->n_rjobs ? 1 : 250) < 0) {
            if (errno == EINTR) continue;
            rl_errf(err, "poll failed: %s", zmq_strerror(errno));
            goto done_sock;
        }
        node_watch_owner(n);
        if (n->next && (items[1].revents & ZMQ_POLLIN)) { /* downstream never talks back: drain */
            zs_parts junk;
            rl_err e2;
            while (zs_recv(n->next, &junk, &e2) == 0) zs_parts_free(&junk);
        }
        if (!(items[0].revents & ZMQ_POLLIN)) {
            node_flush_receipts(n); /* a quiet millisecond */
            continue;
        }
        for (;;) {
            zs_parts p;
            rl_err e2;
            if (node_stop_pending()) break; /* a queue of frames must not delay a stop */
            int r = zs_recv(n->router, &p, &e2);
            if (r != 0) break;
            node_flush_receipts(n);
            frame_header *h = malloc(sizeof *h);
            if (!h || p.n < 3) {
                if (o->verbose) node_log(n, "dropped a message of %d parts", p.n);
                free(h);
                zs_parts_free(&p);
                continue;
            }
            n->cur_ring = 0;
            if (frame_header_decode(h, p.data[1], p.len[1], &e2) != 0) {
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
            if (node_from_coordinator(&p, h) && !node_admit(n, &p, h)) { /* another coordinator's: refused */
                free(h);
                zs_parts_free(&p);
                continue;
            }
            switch (h->type) {
            case FRAME_INFO_REQ: node_info(n); break;
            case FRAME_ASSIGN: node_assign(n, h->step_id, &p); break;
            case FRAME_LEND: node_lend(n, h->step_id, &p); break;
            case FRAME_PULL: node_pull(n, &p, h); break;
            case FRAME_PEERS:
#ifdef RINGLM_ADVERSARY
                if (n->o->misbehave && strcmp(n->o->misbehave, "noprobe") == 0) { /* knows no probes (an older node) */
                    node_error(n, h->step_id, "unexpected %s frame", frame_type_name(h->type));
                    break;
                }
#endif
                node_peers(n, h->step_id, &p);
                break;
            case FRAME_PROBE: node_probe(n, h->step_id, &p); break;
            case FRAME_PROBE_PING: node_probe_ping(n, &p, h); break;
            case FRAME_PING: node_reply(n, FRAME_PONG, h->step_id, NULL, 0); break;
            case FRAME_FORWARD: node_forward(n, &p, h); break;
            case FRAME_FREE: node_free(n, &p, h); break;
            case FRAME_AUDIT_REQ: /* only the coordinator audits; the answer goes to it */
                if (p.len[0] == n->coord_id_len && memcmp(p.data[0], n->coord_id, p.len[0]) == 0) node_audit(n, &p, h);
                else node_log(n, "dropped an AUDIT_REQ that did not come from the coordinator");
                break;
            case FRAME_FETCH_BEGIN: node_fetch_begin(n, h->step_id, &p); break;
            case FRAME_FETCH_DATA: node_fetch_data(n, h->step_id, &p); break;
            case FRAME_FETCH_END: node_fetch_end(n, h->step_id, &p); break;
            default: node_error(n, h->step_id, "unexpected %s frame", frame_type_name(h->type)); break;
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
    node_free_rjobs(n);
    node_alog_clear(n);
#ifdef RINGLM_ADVERSARY
    free(n->adv_old);
#endif
    node_close_next(n);
    zmq_socket_monitor(n->router, NULL, 0);
    zs_monitor_stop(&n->router_mon);
    zmq_close(n->router);
done_auth:
    zs_auth_stop(&n->auth);
done_ctx:
    zmq_ctx_term(n->zctx);
done_free:
    free(n);
    return rc;
}
