/* node_start.c - what a node knows of itself at start: the models it holds (by content hash), its memory,
 * and its measured speed (matmul, disk, devices), which INFO reports to the planner. */
#include "node_int.h"

/* ---- startup: models held, memory, a speed probe ------------------------------------------------ */

void node_scan_models(node *n) {
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
void node_scan_cache(node *n) {
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

uint64_t node_mem_available(void) {
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
double node_probe_disk(const char *dir) {
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
double node_probe_speed(int threads) { return node_probe_matmul(threads, 8192, 7680, 1); }
/* Prefill's: 8 MiB of weights times 128 tokens (2 GFLOP). */
double node_probe_flops(int threads) { return node_probe_matmul(threads, 1024, 7680, 128); }

/* The GPUs this node's engines compute on (--device, else every GPU), the memory it offers on them and their
 * speed. A device name that does not exist stops the node now rather than at its first ASSIGN. Under --mem
 * the device is the tier above RAM, and the routed experts planned for RAM go through the expert cache.
 * Several devices split a range's device layers in proportion to their free memory and run them one after
 * another: they are offered as one, their memory summed, their speed that of a byte spread alike over them
 * (sum of memory / sum of memory over speed). */
int node_probe_device(node *n, rl_err *err) {
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

