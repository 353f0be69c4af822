/* k3_engine.c - an engine's life (k3_forward.h): where its layers compute (the devices and how many layers each
 * holds, by default what fits), its weights bound, the expert cache under --mem, the CPU backend; and the
 * memory it keeps from one batch to the next for k3_forward.c: the graph's nodes, the attention masks, the
 * scheduler. */
#include "k3_forward_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

#include "../base/heap.h"
#include "../device/devices.h"
#include "expert_cache.h"
#include "k3_memory.h"

/* What the weights may take on each device (k3_dev_room), and with a cap (--vram) at most that in all,
 * shared in proportion. */
static void k3_dev_rooms(ggml_backend_dev_t *devs, int nd, size_t cap, size_t *room) {
    double total = 0;
    for (int d = 0; d < nd; d++) {
        size_t fr = 0, tot = 0;
        ggml_backend_dev_memory(devs[d], &fr, &tot);
        room[d] = k3_dev_room(fr);
        total += (double)room[d];
    }
    for (int d = 0; cap > 0 && (double)cap < total && d < nd; d++) room[d] = (size_t)((double)room[d] * (double)cap / total);
}

/* How many layers of [a, b), from a, the devices hold by default: the most whose split (above) puts within
 * every device's room its layers' weights (and the head's on the device whose layers end the model). */
static uint32_t k3_fit_layers(const mf_model *m, const k3_hparams *hp, uint32_t a, uint32_t b, ggml_backend_dev_t *devs,
                              int nd, size_t cap) {
    size_t room[K3_MAX_DEV];
    uint32_t end[K3_MAX_DEV];
    k3_dev_rooms(devs, nd, cap, room);
    for (uint32_t n = b - a; n > 0; n--) {
        k3_dev_split(a, n, room, nd, end);
        bool fits = true;
        for (int d = 0; d < nd && fits; d++) { /* (counting the head where a device's layers end the model) */
            const uint32_t lo = d ? end[d - 1] : a;
            fits = lo == end[d] || k3_range_weight_bytes(m, hp, lo, end[d]) <= room[d];
        }
        if (fits) return n;
    }
    return 0;
}

/* The default layout under --mem with devices (VRAM -> RAM -> disk): every layer on the devices, with the
 * routed experts of the first N in RAM, N the least that lets the rest fit (the dense parts, read whole every
 * token, take the device's memory first; the experts in RAM are then cached or read from the file); when the
 * dense parts alone overflow, the most layers whose dense parts fit, all their experts in RAM. Returns the
 * layers on the devices; *n_cpu_moe is a layer index (experts of the layers below it in RAM). */
static uint32_t k3_fit_mem(const mf_model *m, const k3_hparams *hp, uint32_t a, uint32_t b, ggml_backend_dev_t *devs,
                           int nd, size_t cap, uint32_t *n_cpu_moe) {
    size_t room[K3_MAX_DEV];
    uint32_t end[K3_MAX_DEV];
    k3_dev_rooms(devs, nd, cap, room);
    k3_dev_split(a, b - a, room, nd, end);
    for (uint32_t cm = a; cm <= b; cm++) {
        bool fits = true;
        for (int d = 0; d < nd && fits; d++) {
            const uint32_t lo = d ? end[d - 1] : a, hi = cm < lo ? lo : cm > end[d] ? end[d] : cm;
            fits = lo == end[d] || k3_range_weight_bytes(m, hp, lo, end[d]) - k3_range_expert_bytes(m, hp, lo, hi) <= room[d];
        }
        if (fits) {
            *n_cpu_moe = cm;
            return b - a;
        }
    }
    *n_cpu_moe = UINT32_MAX;
    for (uint32_t n = b - a - 1; n > 0; n--) {
        k3_dev_split(a, n, room, nd, end);
        bool fits = true;
        for (int d = 0; d < nd && fits; d++) {
            const uint32_t lo = d ? end[d - 1] : a;
            fits = lo == end[d] || k3_range_weight_bytes(m, hp, lo, end[d]) - k3_range_expert_bytes(m, hp, lo, end[d]) <= room[d];
        }
        if (fits) return n;
    }
    return 0;
}

int k3_engine_describe(const k3_engine *e, char *buf, size_t len) {
    if (e->hp.n_dev == 0) return snprintf(buf, len, "CPU: layers [%u, %u)", e->a, e->b);
    int n = 0;
    for (int d = 0; d < e->hp.n_dev && n >= 0 && (size_t)n < len; d++) {
        ggml_backend_dev_t dv = ggml_backend_get_device(e->dev_backend[d]);
        const uint32_t lo = d ? e->hp.dev_end[d - 1] : e->hp.dev_a;
        const bool head = e->hp.dev_output && d == e->hp.n_dev - 1;
        n += snprintf(buf + n, len - (size_t)n, "%s%s (%s): layers [%u, %u)%s, %.1f MiB of weights", d ? "; " : "",
                      ggml_backend_dev_name(dv), ggml_backend_dev_description(dv), lo, e->hp.dev_end[d],
                      head ? " and the output head" : "", (double)e->w.x_bytes[K3_W_DEV + d] / 1048576.0);
    }
    if (n > 0 && (size_t)n < len && !e->flash_attn) n += snprintf(buf + n, len - (size_t)n, ", MLA attention by softmax");
    if (n > 0 && (size_t)n < len && e->hp.dev_b < e->b) n += snprintf(buf + n, len - (size_t)n, "; layers [%u, %u) on the CPU", e->hp.dev_b, e->b);
    if (n > 0 && (size_t)n < len && e->hp.dev_cpu_moe > e->hp.dev_a) {
        const uint32_t hi = e->hp.dev_cpu_moe < e->hp.dev_b ? e->hp.dev_cpu_moe : e->hp.dev_b;
        n += snprintf(buf + n, len - (size_t)n, "; routed experts of layers [%u, %u) in RAM", e->hp.dev_a, hi);
    }
    return n;
}

int k3_engine_init(k3_engine *e, const mf_model *m, const k3_hparams *hp, uint32_t a, uint32_t b,
                   const k3_engine_opts *o, rl_err *err) {
    const k3_engine_opts dflt = {0};
    if (!o) o = &dflt;
    memset(e, 0, sizeof *e);
    e->hp = *hp;
    e->a = a;
    e->b = b;
    e->n_threads = o->n_threads > 0 ? o->n_threads : 1;
    e->flash_attn = !o->no_flash_attn;
    e->hp.kv_type = o->cache_f32 ? GGML_TYPE_F32 : GGML_TYPE_F16;
    ggml_backend_dev_t devs[K3_MAX_DEV];
    int nd = 0;
    if (a < b && dv_pick(o->device, devs, K3_MAX_DEV, &nd, err) != 0) return -1;
    uint32_t n_cpu_moe = o->n_cpu_moe, n_dev = 0;
    if (nd && o->gpu_layers_set) {
        n_dev = o->gpu_layers < b - a ? o->gpu_layers : b - a;
    } else if (nd && o->mem_bytes > 0 && o->n_cpu_moe == 0) {
        n_dev = k3_fit_mem(m, hp, a, b, devs, nd, o->vram_bytes, &n_cpu_moe);
    } else if (nd) {
        n_dev = k3_fit_layers(m, hp, a, b, devs, nd, o->vram_bytes);
    }
    if (n_dev > 0) {
        size_t room[K3_MAX_DEV];
        uint32_t end[K3_MAX_DEV];
        k3_dev_rooms(devs, nd, o->vram_bytes, room);
        k3_dev_split(a, n_dev, room, nd, end);
        e->hp.dev_a = a;
        e->hp.dev_b = a + n_dev;
        e->hp.dev_output = n_dev == b - a && b == hp->n_layer;
        e->hp.dev_cpu_moe = n_cpu_moe;
        /* Devices the split gives no layer are left out (the head goes with the last layer's). */
        for (int d = 0, lo = (int)a; d < nd; lo = (int)end[d++]) {
            if (end[d] == (uint32_t)lo) continue;
            const int k = e->hp.n_dev++;
            e->hp.dev_buft[k] = ggml_backend_dev_buffer_type(devs[d]);
            e->hp.dev_end[k] = end[d];
            e->dev_backend[k] = ggml_backend_dev_init(devs[d], NULL);
            if (!e->dev_backend[k]) {
                rl_errf(err, "cannot start device %s", ggml_backend_dev_name(devs[d]));
                k3_engine_free(e);
                return -1;
            }
            /* Flash attention auto: not on Vulkan. Its kernel over the MLA cache (K the cache rows, V their
             * latent part) wrote past its output on Mesa's lavapipe, crashing the op after it when a graph ran
             * node by node (and now and then in whole graphs; llama.cpp's own Vulkan build too); the softmax
             * path runs right there. --flash-attn on asks for it anyway. */
            const char *reg = ggml_backend_reg_name(ggml_backend_dev_backend_reg(devs[d]));
            if (strcmp(reg, "Vulkan") == 0 && !o->flash_attn_on) e->flash_attn = false;
        }
        if (o->vram_bytes > 0) { /* a forced split (--gpu-layers, --n-cpu-moe) against the cap */
            size_t ram_dense = 0, ram_experts = 0;
            k3_range_ram_bytes(m, &e->hp, a, b, &ram_dense, &ram_experts);
            const size_t on_dev = k3_range_weight_bytes(m, hp, a, b) - ram_dense - ram_experts;
            if (on_dev > o->vram_bytes) {
                rl_errf(err, "layers [%u, %u) put %.1f MiB of weights on %s, more than --vram %.4f GB (%.1f MiB): "
                             "offload fewer layers (--gpu-layers) or keep more experts in RAM (--n-cpu-moe)",
                        a, a + n_dev, (double)on_dev / 1048576.0, ggml_backend_dev_name(devs[0]),
                        (double)o->vram_bytes / 1073741824.0, (double)o->vram_bytes / 1048576.0);
                k3_engine_free(e);
                return -1;
            }
        }
    }
    /* Under a budget the weights in RAM exceed, the routed experts there stay in the file (expert_cache.h):
     * the dense part in RAM is resident, the experts go through the cache in what it leaves. Weights on a
     * device do not count: --mem is the machine's RAM, and the device's memory is the tier above it. */
    bool cache = false;
    size_t dense = 0;
    if (o->mem_bytes > 0 && a < b && b <= hp->n_layer) {
        size_t experts = 0;
        k3_range_ram_bytes(m, &e->hp, a, b, &dense, &experts);
        cache = experts > 0 && dense + experts > o->mem_bytes;
        const size_t least = dense + xc_min_expert_bytes(m, &e->hp, a, b);
        if (dense + experts > o->mem_bytes && o->mem_bytes < least) {
            const double G = 1073741824.0;
            rl_errf(err, "--mem %.4f GB is too small for layers [%u, %u): they keep %.4f GB resident in RAM (dense "
                         "weights %.4f GB and two expert slots of each kind); the least that runs is --mem %.4f",
                    (double)o->mem_bytes / G, a, b, (double)least / G, (double)dense / G, ceil((double)least / G * 1e4) / 1e4);
            k3_engine_free(e);
            return -1;
        }
    }
    if (k3_weights_bind(&e->w, m, &e->hp, a, b, o->no_repack, cache, o->progress, err) != 0) {
        k3_engine_free(e);
        return -1;
    }
    if (cache) {
        e->xc = calloc(1, sizeof *e->xc);
        if (!e->xc) {
            k3_engine_free(e);
            return rl_errf(err, "out of memory for the expert cache");
        }
        if (xc_open(e->xc, m, &e->hp, a, b, o->mem_bytes - dense, &e->w.place, err) != 0) {
            free(e->xc);
            e->xc = NULL;
            k3_engine_free(e);
            return -1;
        }
        if (o->expert_copy && xc_copy_open(e->xc, o->expert_copy, err) != 0) {
            k3_engine_free(e);
            return -1;
        }
    }
    e->backend = ggml_backend_cpu_init();
    if (!e->backend) {
        k3_engine_free(e);
        return rl_errf(err, "cannot start the ggml CPU backend");
    }
    ggml_backend_cpu_set_n_threads(e->backend, e->n_threads);
    e->galloc = ggml_gallocr_new(ggml_backend_cpu_buffer_type());
    if (!e->galloc) {
        k3_engine_free(e);
        return rl_errf(err, "cannot create the graph allocator");
    }
    return 0;
}

static void k3_masks_unmap(k3_engine *e) {
    if (e->mask_buf) ggml_backend_buffer_free(e->mask_buf); /* a buffer over our pointer: frees nothing */
    if (e->mask_mem) munmap(e->mask_mem, e->mask_cap);
    e->mask_buf = NULL;
    e->mask_mem = NULL;
    e->mask_cap = 0;
}

void k3_engine_free(k3_engine *e) {
    k3_kept_drop(e);
    if (e->xc) {
        xc_close(e->xc);
        free(e->xc);
    }
    if (e->sched) ggml_backend_sched_free(e->sched);
    if (e->galloc) ggml_gallocr_free(e->galloc);
    if (e->backend) ggml_backend_free(e->backend);
    for (int d = 0; d < K3_MAX_DEV; d++) {
        if (e->dev_backend[d]) ggml_backend_free(e->dev_backend[d]);
    }
    k3_weights_free(&e->w);
    rl_heap_unmap(e->graph_buf, e->graph_cap);
    k3_masks_unmap(e);
    memset(e, 0, sizeof *e);
}

const struct xc_stats *k3_engine_cache_stats(const k3_engine *e) { return e->xc ? &e->xc->st : NULL; }

size_t k3_engine_compute_bytes(const k3_engine *e) {
    if (e->sched) {
        size_t n = ggml_backend_sched_get_buffer_size(e->sched, e->backend);
        for (int d = 0; d < e->hp.n_dev; d++) n += ggml_backend_sched_get_buffer_size(e->sched, e->dev_backend[d]);
        return n + e->mask_cap;
    }
    return (e->galloc ? ggml_gallocr_get_buffer_size(e->galloc, 0) : 0) + e->mask_cap;
}

/* ---- memory kept from batch to batch (k3_forward.c asks for it) -------------------------------- */

int k3_engine_graph_mem(k3_engine *e, size_t need, rl_err *err) {
    if (need <= e->graph_cap) return 0;
    /* Not realloc: the old graph is not needed, and copying it would touch the new pages twice. */
    rl_heap_unmap(e->graph_buf, e->graph_cap);
    e->graph_cap = 0;
    if (!(e->graph_buf = rl_heap_map(need))) { /* several MiB, written node by node: huge pages */
        return rl_errf(err, "out of memory for the graph");
    }
    e->graph_cap = need;
    return 0;
}

int k3_engine_mask_mem(k3_engine *e, size_t need, size_t full, rl_err *err) {
    if (need <= e->mask_cap) return 0;
    size_t cap = 2 * e->mask_cap < full ? 2 * e->mask_cap : full;
    if (cap < need) cap = need;
    k3_masks_unmap(e);
    void *mem = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) return rl_errf(err, "out of memory for attention masks (%zu MiB)", cap >> 20);
    e->mask_mem = mem;
    e->mask_cap = cap;
    e->mask_buf = ggml_backend_cpu_buffer_from_ptr(mem, cap);
    if (!e->mask_buf) {
        k3_masks_unmap(e);
        return rl_errf(err, "cannot make a buffer of the attention masks' memory");
    }
    return 0;
}

int k3_engine_sched(k3_engine *e, size_t size, rl_err *err) {
    /* Its hash set is sized once, so a larger graph gets a new one (rare: sized generously). The CPU comes
     * last: ggml's scheduler puts inputs there. A device engine keeps one scheduler for its life, as
     * llama.cpp does, rather than a new one (and new device buffers) whenever a graph's outputs change: that
     * switch comes between every prefill and decode step. */
    if (e->sched && size <= e->sched_size) return 0;
    if (e->sched) ggml_backend_sched_free(e->sched);
    e->sched_size = size > 2 * e->sched_size ? size : 2 * e->sched_size;
    if (e->hp.n_dev > 0 && e->sched_size < 65536) e->sched_size = 65536;
    ggml_backend_t bk[K3_MAX_DEV + 1];
    int nb = 0;
    for (int d = 0; d < e->hp.n_dev; d++) bk[nb++] = e->dev_backend[d];
    bk[nb++] = e->backend;
    e->sched = ggml_backend_sched_new(bk, NULL, nb, e->sched_size, false, false);
    e->plan_outputs = 0;
    if (!e->sched) return rl_errf(err, "cannot create the graph scheduler");
    return 0;
}
