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
    int cap_tensor;            /* composed models (mf_compose): room in tensors, whose names it owns */
    bool own_names;
} mf_model;

int mf_open(mf_model *m, const char *path, rl_err *err);
void mf_close(mf_model *m);

/* A model put together from parts (a node that maps its range from the split files it holds and the tensors
 * it was streamed, under a manifest's metadata): meta becomes splits[0] (no file; the model owns it and frees
 * it), then files are added (mapped whole: a GGUF split, whose header is parsed and kept, or raw bytes), and
 * tensors, each at an absolute offset of one added file (checked to lie inside it) or with no data at all
 * (split 0: a manifest's view of a model, for metadata and sizes only; data is NULL). */
int mf_compose(mf_model *m, struct gguf_context *meta, int max_tensors, rl_err *err);
/* Maps path (is_gguf: parsed as a GGUF too) as the next split; *index is where it went. */
int mf_compose_file(mf_model *m, const char *path, bool is_gguf, int *index, rl_err *err);
/* Adds a tensor (t's name copied; t->split, t->offset, t->nbytes say where its bytes are; t->data ignored). */
int mf_compose_tensor(mf_model *m, const mf_tensor *t, rl_err *err);

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
