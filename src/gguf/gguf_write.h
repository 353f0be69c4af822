/* gguf_write.h - writes a GGUF model, one file or a split set, tensor data streamed in by the caller.
 *
 * The layout is gguf_write_to_file's (metadata, then each tensor at its aligned offset, the file padded to
 * the alignment), so llama.cpp and mf_open read it; but the data never has to be in memory at once: the
 * caller writes each tensor's bytes when asked (synth generates them, reap copies slices of a mapping).
 * A file that fails half way is removed, never left behind. */
#ifndef RINGLM_GGUF_WRITE_H
#define RINGLM_GGUF_WRITE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "../base/err.h"

struct gguf_context;

typedef struct gw_tensor {
    const char *name;
    int type; /* enum ggml_type */
    int n_dims;
    int64_t ne[4];
} gw_tensor;

/* Writes exactly the bytes of tensor i (ggml_nbytes of its type and shape) at f's position. */
typedef int (*gw_data_fn)(void *ctx, int i, FILE *f, rl_err *err);

typedef struct gw_opts {
    const char *out;      /* NAME.gguf; with n_split > 1, NAME-0000i-of-0000n.gguf (gw_split_path) */
    int n_split;          /* <= 1: one file; at most one tensor per file */
    const char *progress; /* label of a progress bar on stderr; NULL: none */
} gw_opts;

/* Copies meta's key/values into the (first) file, less any split.* keys (written anew for a split set),
 * then the tensors in order, split as evenly as their count allows. Checks that each row fits its type's
 * blocks before creating anything. */
int gw_write(const struct gguf_context *meta, const gw_tensor *t, int n, const gw_opts *o, gw_data_fn fn, void *ctx,
             rl_err *err);

/* The path of file s (0-based) of an n-file set named after out. */
void gw_split_path(const char *out, int s, int n, char *buf, size_t cap);

#endif
