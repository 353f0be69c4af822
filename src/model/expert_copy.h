/* expert_copy.h - a copy on disk of routed experts as the expert cache's slots hold them (--expert-copy DIR).
 *
 * On this CPU llama.cpp re-lays Q4_0, Q4_K, IQ4_NL and Q2_K weights into interleaved layouts (weight_place.h),
 * and so does the expert cache's slots: an expert read from the model file is read into a bounce buffer and
 * re-laid into its slot by the repacking buffer's set_tensor, on the reader threads, which then compete with
 * the compute for the cores (docs/experts.md: 7.6 tok/s against 9.9 with plain slots). The copy keeps each
 * expert's slot bytes once they have been made: the first time an expert is read it is re-laid as before and
 * its slot bytes written here; from then on it is read from here straight into its slot, with no re-layout.
 *
 * One file per (model file, layer range, layout), named by a hash of what decides its bytes: the model
 * files' paths, sizes and modification times, each cached layer's expert tensors (offsets, types, shapes)
 * and the slots' buffer types. A header, then a byte per (layer, expert) saying whether its bytes are
 * there (written at close, after the data are synced, so a crash loses copies, never trusts a torn one),
 * then the experts, each at a fixed place (a sparse file: only what was copied takes disk). A file whose
 * header does not match is rebuilt. */
#ifndef RINGLM_EXPERT_COPY_H
#define RINGLM_EXPERT_COPY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/err.h"

typedef struct xcp_file {
    int fd;                 /* -1: no copy */
    char path[1100];
    uint32_t n_layers, n_expert;
    uint64_t *off;          /* [n_layers]: where the layer's expert 0 starts (0: layer not copied) */
    uint64_t *stride;       /* [n_layers]: one expert's bytes (its three projections' slot bytes) */
    uint8_t *have;          /* [n_layers * n_expert]: 1 once the expert's bytes are in the file */
    uint64_t map_off;       /* where the have-map is in the file */
    uint64_t n_have;        /* experts there when opened */
} xcp_file;

/* Opens (or creates) the copy for `key` in dir. stride[l]: one expert's bytes for layer l (0: not copied).
 * Needs room on the disk for every expert (the file is sparse: it is only the most it can take); without it,
 * or when dir cannot be written, fails naming why. */
int xcp_open(xcp_file *f, const char *dir, uint64_t key, uint32_t n_layers, uint32_t n_expert, const uint64_t *stride,
             rl_err *err);
/* Writes the have-map (after syncing the data) and closes. */
void xcp_close(xcp_file *f);

bool xcp_has(const xcp_file *f, uint32_t l, uint32_t e);
/* Reads expert e of layer l: n parts of len[i] bytes, one after another in the file, into dst[i]. 0 or an errno. */
int xcp_read(const xcp_file *f, uint32_t l, uint32_t e, int n, void *const *dst, const size_t *len);
/* Writes them, pushes them to the disk and drops them from the page cache (a budget of RAM is the point),
 * and marks the expert as there. 0 or an errno (then the expert stays absent). */
int xcp_write(xcp_file *f, uint32_t l, uint32_t e, int n, const void *const *src, const size_t *len);

/* FNV-1a 64 over bytes, continuing from h (start with XCP_HASH_INIT): the key's ingredients. */
#define XCP_HASH_INIT 0xcbf29ce484222325ULL
uint64_t xcp_hash(uint64_t h, const void *p, size_t n);

#endif
