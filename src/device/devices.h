/* Folder src/device/: compute devices: ggml's backends (the CPU, and GPU backend modules loaded at run
 * time), listed, and chosen by name. May include: base.
 */
/* devices.h - the devices ggml can compute on, found once per process.
 *
 * The CPU backend is linked into ringlm. GPU backends are ggml's dynamic modules (libggml-<name>.so, built
 * with GGML_BACKEND_DL) in a directory: RINGLM_BACKEND_DIR if set, else the one the build fetched them into
 * (scripts/ggml-backends.sh). They share the ggml the binary exports, so a module's buffers and graphs are
 * ours. Loading registers their devices with ggml's own registry (ggml's process-wide state, not ours):
 * dv_load is idempotent, a module already registered is not loaded twice. */
#ifndef RINGLM_DEVICES_H
#define RINGLM_DEVICES_H

#include <stdbool.h>
#include <stddef.h>

#include "../base/err.h"

struct ggml_backend_device;

/* Loads every backend module of the directories (separated by ':'; NULL: the default above) that is not
 * loaded yet. A module that cannot load (its driver library missing, say) is not an error: its reason is
 * written, one line per module, into `why` (when not NULL, cut to why_len; a missing driver or runtime
 * library is named as such), and the CPU still works. Fails only when a directory is named explicitly and
 * cannot be read. */
int dv_load(const char *dirs, char *why, size_t why_len, rl_err *err);

/* One device as `ringlm devices` lists it. */
typedef struct dv_info {
    const char *name;        /* CPU, Vulkan0, CUDA0, ... (ggml's names) */
    const char *description; /* the hardware */
    const char *backend;     /* the backend's name: CPU, Vulkan, CUDA */
    bool gpu;                /* a GPU (or integrated GPU), as ggml classes it */
    size_t free, total;      /* memory in bytes, as the device reports it */
} dv_info;

size_t dv_count(void);
void dv_get(size_t i, dv_info *out);

/* The device named `name` (as listed), after dv_load. An unknown name is an error that lists the names. */
int dv_find(const char *name, struct ggml_backend_device **dev, rl_err *err);
/* The first GPU (or integrated GPU) ggml sees, or NULL when there is none: run on the CPU. */
struct ggml_backend_device *dv_default_gpu(void);
/* The devices to compute on for --device's value, in order: "CPU" gives none (*n = 0: the CPU); "A,B,..." those
 * devices (a CPU device alone counts as "CPU"; in a list, or a name twice, is an error); no value (NULL), the
 * environment's RINGLM_DEVICE if set, else every GPU ggml sees (none: the CPU). Loads the modules. */
int dv_pick(const char *names, struct ggml_backend_device **devs, int max, int *n, rl_err *err);

/* A device's speed, measured by running on it what decoding and prefill run most: a q8_0 matrix of 64 MiB
 * times one column (bytes of weights read per second, *bps) and one of 8 MiB times 128 columns (FLOP/s,
 * *flops), each the best of four runs after one that warms it up (a Vulkan device compiles its pipelines
 * then). n_threads: for the CPU device. Takes about a second on a GPU, several on a software one. */
int dv_measure(struct ggml_backend_device *dev, int n_threads, double *bps, double *flops, rl_err *err);

#endif
