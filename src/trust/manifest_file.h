/* manifest_file.h - a model manifest: everything about a model but its weights, in a small file.
 *
 * `ringlm manifest MODEL.gguf -o MODEL.manifest` reads the model (one file or a split set) once and writes
 * its metadata (tokenizer, chat template, hyperparameters: every key but split.*) and, per tensor, name,
 * type, shape, size, the split file and offset it lives in, and the BLAKE2b-256 of its data. From that,
 * any layer range's manifest hash (manifest.h, what receipts carry) is computed without the weights, equal
 * to manifest_range_hash over the model itself.
 *
 * The file is a GGUF without tensor data: the model's keys, then ringlm.manifest.* arrays (one element per
 * tensor, in the model's order): names, types, n_dims, ne (4 per tensor), nbytes, file, offset, hash (32
 * bytes per tensor), and files (the split files' names) and version. ringlm.* keys are outside the range
 * hash, so the manifest's own keys change nothing. */
#ifndef RINGLM_MANIFEST_FILE_H
#define RINGLM_MANIFEST_FILE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "../base/err.h"
#include "../gguf/model_file.h"
#include "manifest.h"

#define MANIFEST_FILE_VERSION 1

typedef struct manifest_file {
    struct gguf_context *g; /* the manifest: the model's keys and ringlm.manifest.* */
    int n;
    manifest_tensor *t;         /* names point into g */
    uint32_t n_layer;
    bool shape_only; /* ringlm.manifest.shape_only: shapes and types, no hashes (synth --shape-only: planning) */
} manifest_file;

/* Hashes every tensor of m (n_threads: 0 = online CPUs, at most 8; progress: a bar on stderr) into a
 * manifest. A model without data (mf_compose with no files: synth --shape-only) gives a shape-only manifest:
 * zero hashes, marked so. */
int manifest_file_build(manifest_file *f, const mf_model *m, int n_threads, bool progress, rl_err *err);
int manifest_file_write(const manifest_file *f, const char *path, rl_err *err);
/* Reads and checks one (every array's length, types, sizes against shapes). */
int manifest_file_read(manifest_file *f, const char *path, rl_err *err);
/* 0, or -1 with err saying that a shape-only manifest cannot do `what` (it has no hashes). */
int manifest_file_need_hashes(const manifest_file *f, const char *what, rl_err *err);
/* Is the GGUF at path a manifest (it has ringlm.manifest.version)? */
bool manifest_file_is(const char *path);
/* The manifest hash of layers [a, b), as manifest_range_hash over the model. */
int manifest_file_range_hash(const manifest_file *f, uint32_t a, uint32_t b, uint8_t out[32], rl_err *err);
/* Checks split files of the model against its manifest: each must be one of the manifest's files (by
 * name), hold exactly the tensors the manifest places in it, with their types, shapes and offsets, and
 * every tensor's bytes must hash as listed. Problems go to `problems` one per line, naming the file and
 * tensor; *n_bad counts them. The manifest's files not given are listed on `absent` (NULL: not). */
int manifest_file_check(const manifest_file *f, const char *const *paths, int n_paths, FILE *problems, FILE *absent,
                    long *n_bad, rl_err *err);
/* The split files the manifest names (tensor.file indexes them). */
uint32_t manifest_file_n_files(const manifest_file *f);
const char *manifest_file_name(const manifest_file *f, uint32_t k);
/* need[k] (manifest_file_n_files entries) = does split file k hold a tensor of layers [a, b)? (What a node given
 * that range must download.) */
void manifest_file_range_files(const manifest_file *f, uint32_t a, uint32_t b, bool *need);
/* A copy of the model's own metadata: the manifest's keys less ringlm.manifest.* (NULL: out of memory). */
struct gguf_context *manifest_file_meta(const manifest_file *f);
/* The model as the manifest describes it, without weights (gguf/model_file.h mf_compose: every tensor's data
 * is NULL): tokenizer, chat template, hyperparameters and tensor sizes for a coordinator that holds no file.
 * k3_hparams_read and k3_check_tensors accept it; nothing may read its weights. */
int manifest_file_model(const manifest_file *f, mf_model *m, rl_err *err);
void manifest_file_free(manifest_file *f);

#endif
