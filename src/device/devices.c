#include "devices.h"
#include "../base/clock.h"

#include <dirent.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

#ifndef RINGLM_BACKEND_DIR
#define RINGLM_BACKEND_DIR ""
#endif

/* Whether a backend whose module is libggml-<name>.so is registered already (ggml names its Vulkan
 * backend "Vulkan", its module "vulkan"). */
static bool dv_registered(const char *name) {
    for (size_t i = 0; i < ggml_backend_reg_count(); i++) {
        if (strcasecmp(ggml_backend_reg_name(ggml_backend_reg_get(i)), name) == 0) return true;
    }
    return false;
}

static void dv_note(char *why, size_t why_len, const char *fmt, const char *a, const char *b) {
    if (!why || why_len == 0) return;
    size_t n = strlen(why);
    if (n + 1 < why_len) snprintf(why + n, why_len - n, fmt, a, b);
}

/* What a module's failed load means, from the dynamic loader's message: a missing driver or runtime library
 * named as such (a machine with the CUDA module and no NVIDIA driver is the usual case: the module is built
 * ahead, on a machine without a GPU, scripts/ggml-cuda.sh), anything else in the loader's words. */
static void dv_explain(const char *path, const char *dl, char *out, size_t len) {
    static const struct {
        const char *lib, *what;
    } known[] = {
        {"libcuda.so", "no NVIDIA driver on this machine (%s not found); the CUDA module %s needs one"},
        {"libcudart.so", "the CUDA runtime is not installed (%s not found), which the CUDA module %s needs"},
        {"libcublas", "cuBLAS is not installed (%s not found), which the CUDA module %s needs"},
        {"libvulkan.so", "no Vulkan loader on this machine (%s not found; Debian: libvulkan1), which %s needs"},
    };
    if (!dl) dl = "unknown error";
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        const char *at = strstr(dl, known[i].lib);
        const char *colon = at ? strchr(at, ':') : NULL;
        if (at && colon && strstr(dl, "cannot open shared object file")) {
            char lib[128];
            snprintf(lib, sizeof lib, "%.*s", (int)(colon - at), at);
            snprintf(out, len, known[i].what, lib, path);
            return;
        }
    }
    snprintf(out, len, "%s", dl);
}

static int dv_load_dir(const char *dir, bool named, char *why, size_t why_len, rl_err *err);

int dv_load(const char *dirs, char *why, size_t why_len, rl_err *err) {
    if (why && why_len) why[0] = 0;
    const bool named = dirs != NULL;
    if (!dirs) dirs = getenv("RINGLM_BACKEND_DIR");
    if (!dirs) dirs = RINGLM_BACKEND_DIR;
    /* The Vulkan backend reorders a graph's nodes for concurrency (ggml_vk_graph_optimize). On K3's graph
     * that made Mesa's lavapipe crash in every run (in its worker thread, under the whole graph; run node
     * by node, which leaves nothing to reorder, it does not), and the graph in its built order runs right.
     * Set before the module reads it; a user's own setting wins. */
    setenv("GGML_VK_DISABLE_GRAPH_OPTIMIZE", "1", 0);
    /* Directories separated by ':' (the Vulkan module the build fetched, and scripts/ggml-cuda.sh's CUDA
     * one, say); empty: a CPU-only build. */
    for (const char *p = dirs; *p;) {
        const char *end = strchr(p, ':');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        char dir[4096];
        if (n >= sizeof dir) return rl_errf(err, "backend module directory too long: %.64s...", p);
        memcpy(dir, p, n);
        dir[n] = 0;
        if (n && dv_load_dir(dir, named, why, why_len, err) != 0) return -1;
        p += n + (end ? 1 : 0);
    }
    return 0;
}

static int dv_load_dir(const char *dir, bool named, char *why, size_t why_len, rl_err *err) {
    DIR *d = opendir(dir);
    if (!d) {
        if (named) return rl_errf(err, "cannot read the backend module directory %s", dir);
        dv_note(why, why_len, "no GPU backends: cannot read %s%s\n", dir, "");
        return 0;
    }
    struct dirent *de;
    while ((de = readdir(d))) {
        /* libggml-<name>.so, except the stand-in for ggml-base and CPU variants (ours is linked in). */
        const char *f = de->d_name;
        size_t n = strlen(f);
        if (strncmp(f, "libggml-", 8) != 0 || n < 12 || strcmp(f + n - 3, ".so") != 0) continue;
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)(n - 11), f + 8);
        if (strcmp(name, "base") == 0 || strncmp(name, "cpu", 3) == 0 || dv_registered(name)) continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, f);
        if (ggml_backend_load(path)) continue;
        /* Why not, in the dynamic loader's words (ggml's loader only logs it): a missing driver library
         * (libvulkan.so.1, libcudart) is the usual reason. Only after the load failed: opening a module
         * twice runs its static constructors twice, and unloading one that started driver threads is not
         * safe. */
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
        if (h) {
            dlclose(h);
            dv_note(why, why_len, "%s: ggml could not initialize %s\n", name, path);
        } else {
            h = dlopen(path, RTLD_LAZY | RTLD_LOCAL);
            if (h) {
                dv_note(why, why_len, "%s: %s\n", name, "ggml could not initialize it");
                dlclose(h);
            } else {
                char plain[1024];
                dv_explain(path, dlerror(), plain, sizeof plain);
                dv_note(why, why_len, "%s: %s\n", name, plain);
            }
        }
    }
    closedir(d);
    return 0;
}

size_t dv_count(void) { return ggml_backend_dev_count(); }

void dv_get(size_t i, dv_info *out) {
    ggml_backend_dev_t d = ggml_backend_dev_get(i);
    memset(out, 0, sizeof *out);
    out->name = ggml_backend_dev_name(d);
    out->description = ggml_backend_dev_description(d);
    out->backend = ggml_backend_reg_name(ggml_backend_dev_backend_reg(d));
    enum ggml_backend_dev_type t = ggml_backend_dev_type(d);
    out->gpu = t == GGML_BACKEND_DEVICE_TYPE_GPU || t == GGML_BACKEND_DEVICE_TYPE_IGPU;
    ggml_backend_dev_memory(d, &out->free, &out->total);
}

int dv_find(const char *name, struct ggml_backend_device **dev, rl_err *err) {
    char names[512] = "";
    for (size_t i = 0; i < ggml_backend_dev_count(); i++) {
        ggml_backend_dev_t d = ggml_backend_dev_get(i);
        if (strcmp(ggml_backend_dev_name(d), name) == 0) {
            *dev = d;
            return 0;
        }
        size_t n = strlen(names);
        snprintf(names + n, sizeof names - n, "%s%s", n ? ", " : "", ggml_backend_dev_name(d));
    }
    return rl_errf(err, "no device named '%s' (this machine has: %s; `ringlm devices` lists them)", name, names);
}

struct ggml_backend_device *dv_default_gpu(void) {
    for (size_t i = 0; i < ggml_backend_dev_count(); i++) {
        ggml_backend_dev_t d = ggml_backend_dev_get(i);
        enum ggml_backend_dev_type t = ggml_backend_dev_type(d);
        if (t == GGML_BACKEND_DEVICE_TYPE_GPU || t == GGML_BACKEND_DEVICE_TYPE_IGPU) return d;
    }
    return NULL;
}

int dv_pick(const char *names, struct ggml_backend_device **devs, int max, int *n, rl_err *err) {
    *n = 0;
    if (!names || !names[0]) names = getenv("RINGLM_DEVICE");
    if (names && !names[0]) names = NULL;
    if (names && strcmp(names, "CPU") == 0) return 0;
    char why[1024];
    if (dv_load(NULL, why, sizeof why, err) != 0) return -1;
    if (!names) { /* every GPU, as llama.cpp splits layers over all it finds */
        for (size_t i = 0; i < ggml_backend_dev_count() && *n < max; i++) {
            ggml_backend_dev_t d = ggml_backend_dev_get(i);
            enum ggml_backend_dev_type t = ggml_backend_dev_type(d);
            if (t == GGML_BACKEND_DEVICE_TYPE_GPU || t == GGML_BACKEND_DEVICE_TYPE_IGPU) devs[(*n)++] = d;
        }
        return 0;
    }
    char list[512];
    if (strlen(names) >= sizeof list) return rl_errf(err, "device list too long: %.40s...", names);
    snprintf(list, sizeof list, "%s", names);
    for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        ggml_backend_dev_t d;
        if (dv_find(tok, &d, err) != 0) {
            /* A module that did not load is likely why (CUDA0 on a machine without the NVIDIA driver). */
            if (why[0]) {
                char msg[sizeof err->msg];
                snprintf(msg, sizeof msg, "%s", err->msg);
                size_t k = strlen(why);
                while (k && why[k - 1] == '\n') why[--k] = 0;
                for (char *c = why; *c; c++)
                    if (*c == '\n') *c = ';';
                rl_errf(err, "%s; not loaded: %s", msg, why);
            }
            return -1;
        }
        if (ggml_backend_dev_type(d) == GGML_BACKEND_DEVICE_TYPE_CPU) {
            if (strchr(names, ',')) return rl_errf(err, "--device %s: the CPU is not a device to split layers onto "
                                                       "(layers not on the devices run there anyway: --gpu-layers)", names);
            return 0;
        }
        for (int k = 0; k < *n; k++) {
            if (devs[k] == d) return rl_errf(err, "--device %s names %s twice", names, tok);
        }
        if (*n == max) return rl_errf(err, "--device %s: at most %d devices", names, max);
        devs[(*n)++] = d;
    }
    if (*n == 0) return rl_errf(err, "--device '%s' names no device", names);
    return 0;
}

/* The best of four timed runs of g, after a first untimed one. */
static int dv_time(ggml_backend_t be, struct ggml_cgraph *g, double *best) {
    *best = 1e30;
    for (int r = 0; r < 5; r++) {
        const double t0 = rl_clock_now();
        if (ggml_backend_graph_compute(be, g) != GGML_STATUS_SUCCESS) return -1;
        ggml_backend_synchronize(be);
        const double dt = rl_clock_now() - t0;
        if (r > 0 && dt < *best) *best = dt;
    }
    return 0;
}

int dv_measure(struct ggml_backend_device *dev, int n_threads, double *bps, double *flops, rl_err *err) {
    const char *name = ggml_backend_dev_name(dev);
    ggml_backend_t be = ggml_backend_dev_init(dev, NULL);
    if (!be) return rl_errf(err, "cannot start device %s to measure it", name);
    if (ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU) ggml_backend_cpu_set_n_threads(be, n_threads > 0 ? n_threads : 1);
    /* 7680 columns = 240 q8_0 blocks; the same shapes as the node's CPU probe, so the figures compare */
    struct ggml_init_params ip = {.mem_size = 16 * ggml_tensor_overhead() + 2 * ggml_graph_overhead(), .mem_buffer = NULL,
                                  .no_alloc = true};
    struct ggml_context *c = ggml_init(ip);
    if (!c) {
        ggml_backend_free(be);
        return rl_errf(err, "out of memory measuring %s", name);
    }
    struct ggml_tensor *w1 = ggml_new_tensor_2d(c, GGML_TYPE_Q8_0, 7680, 8192);
    struct ggml_tensor *x1 = ggml_new_tensor_2d(c, GGML_TYPE_F32, 7680, 1);
    struct ggml_tensor *w2 = ggml_new_tensor_2d(c, GGML_TYPE_Q8_0, 7680, 1024);
    struct ggml_tensor *x2 = ggml_new_tensor_2d(c, GGML_TYPE_F32, 7680, 128);
    struct ggml_tensor *y1 = ggml_mul_mat(c, w1, x1), *y2 = ggml_mul_mat(c, w2, x2);
    struct ggml_cgraph *g1 = ggml_new_graph(c), *g2 = ggml_new_graph(c);
    ggml_build_forward_expand(g1, y1);
    ggml_build_forward_expand(g2, y2);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(c, be);
    int rc = 0;
    double t1 = 0, t2 = 0;
    if (!buf) {
        rc = rl_errf(err, "%s: cannot allocate 75 MiB to measure it", name);
    } else {
        ggml_backend_buffer_clear(buf, 0); /* zero scales and inputs: the time does not depend on the values */
        if (dv_time(be, g1, &t1) != 0 || dv_time(be, g2, &t2) != 0) rc = rl_errf(err, "%s: a matrix product failed", name);
    }
    if (rc == 0) {
        *bps = (double)ggml_nbytes(w1) / t1;
        *flops = 2.0 * 1024.0 * 7680.0 * 128.0 / t2;
    }
    if (buf) ggml_backend_buffer_free(buf);
    ggml_free(c);
    ggml_backend_free(be);
    return rc;
}
