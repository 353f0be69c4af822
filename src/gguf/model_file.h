/* Folder src/gguf/: model files: open and map (split sets), validation, typed metadata access, the streaming
 * GGUF writer. May include:
 * base. (README "Layout"; tests/t_layout.sh checks both.)
 */
/* model_file.h - a GGUF model opened for reading: metadata, tensor table, tensor data mapped from disk.
 *
 * Reads single files and split sets (NAME-00001-of-000NN.gguf, any member may be named) as one model.
 * Everything a malformed file can get wrong is checked here, before anyone dereferences a tensor pointer:
 * magic, version, metadata, tensor types and shapes, data ranges inside the file, split consistency. */
#ifndef RINGLM_MODEL_FILE_H
#define RINGLM_MODEL_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/err.h"

struct gguf_context;

typedef struct mf_split {
    char *path;
    struct gguf_context *gguf; /* metadata and tensor infos (no data) */
    void *map;                 /* the whole file, read-only (NULL for an empty file) */
    size_t size;
    size_t data_offset; /* where tensor data starts in this file */
} mf_split;

typedef struct mf_tensor {
    const char *name; /* owned by the split's gguf context */
    int type;         /* enum ggml_type */
    int n_dims;
    int64_t ne[4];
    size_t nbytes;
    int split;        /* index into mf_model.splits */
    size_t offset;    /* absolute offset of the data in that split's file */
    const void *data; /* mapped */
} mf_tensor;

typedef struct mf_model {
    int n_split;
    mf_split *splits;
    int n_tensor;
    mf_tensor *tensors; /* in file order, split by split */
    struct gguf_context *meta; /* == splits[0].gguf: metadata lives in the first split */
    size_t tensor_bytes;       /* sum of nbytes */
} mf_model;

int mf_open(mf_model *m, const char *path, rl_err *err);
void mf_close(mf_model *m);

const mf_tensor *mf_find(const mf_model *m, const char *name);

/* Strictly typed metadata getters, with llama.cpp's type rules (a u32 key stored as another width is an
 * error). Return 0 if found, 1 if absent and not required, -1 on error (absent and required, wrong type). */
int mf_get_u32(const mf_model *m, const char *key, uint32_t *out, bool required, rl_err *err);
int mf_get_f32(const mf_model *m, const char *key, float *out, bool required, rl_err *err);
int mf_get_bool(const mf_model *m, const char *key, bool *out, bool required, rl_err *err);
int mf_get_str(const mf_model *m, const char *key, const char **out, bool required, rl_err *err);
/* A u32 scalar (broadcast to all n) or a u32/i32 array of exactly n elements. */
int mf_get_u32_or_arr(const mf_model *m, const char *key, uint32_t *out, size_t n, bool required, rl_err *err);

#endif
