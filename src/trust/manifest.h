/* manifest.h - the model manifest hash of a layer range: what a receipt says "this model" with.
 *
 * manifest_range_hash(m, hp, a, b) is BLAKE2b-256 over this byte string (integers little-endian):
 *
 *   "RLMF" | u32 version 1 | u32 a | u32 b | u32 n_layer
 *   u64 n_kv, then for each metadata key, sorted by strcmp on the key (bytes), except keys starting with
 *   "split." (a split set and one file are the same model) and "ringlm." (what the coordinator adds to a
 *   range file it streams):
 *       u32 key length | key bytes | u32 gguf type | value
 *     value by type: u8/i8 1 byte, u16/i16 2, u32/i32/f32 4, u64/i64/f64 8 (floats as their IEEE bits),
 *     bool 1 byte (0 or 1), string u64 length | bytes, array u32 element type | u64 count | the elements
 *     as above (every string of a string array: u64 length | bytes). Arrays of arrays are refused.
 *   u64 n_tensors, then for each tensor of the range, sorted by strcmp on the name:
 *       u32 name length | name bytes | u32 ggml type | i64 ne[0..3] (1 past n_dims) | u64 data bytes
 *       | BLAKE2b-256 of the tensor's data bytes (32)
 *
 * The tensors of [a, b): every "blk.N." tensor with a <= N < b, token_embd.weight when a == 0, and every
 * other tensor (output, output_norm, ...) when b == n_layer - the same rule the coordinator uses to cut a
 * range file (manifest_tensor_in_range). Nothing depends on the file layout (tensor order, offsets, alignment,
 * split count, n_dims), so the whole model, a split set of it and a range file holding exactly those
 * tensors (metadata copied with gguf_set_kv, ringlm.range.* added, split.* removed) hash the same. Any
 * change to a weight byte of the range, a tensor's type or shape, or a metadata value changes it.
 *
 * Cost: one BLAKE2b pass over the range's weights (tensors hashed in parallel); see docs/receipts.md. */
#ifndef RINGLM_MANIFEST_H
#define RINGLM_MANIFEST_H

#include <stdbool.h>
#include <stdint.h>

#include "../base/err.h"
#include "../gguf/model_file.h"
#include "../model/k3_hparams.h"

#define MANIFEST_VERSION 1

/* Is the tensor called name part of a stage running layers [a, b) of an n_layer model? */
bool manifest_tensor_in_range(const char *name, uint32_t a, uint32_t b, uint32_t n_layer);

/* The manifest hash of layers [a, b) (0 <= a < b <= hp->n_layer). Fails if the file holds no tensor of
 * some layer in the range (a range file of other layers), or on metadata it cannot serialize. */
int manifest_range_hash(const mf_model *m, const k3_hparams *hp, uint32_t a, uint32_t b, uint8_t out[32], rl_err *err);

/* The same with an explicit number of hashing threads (0 = as many as online CPUs, at most 8). */
int manifest_range_hash_threads(const mf_model *m, const k3_hparams *hp, uint32_t a, uint32_t b, int n_threads,
                            uint8_t out[32], rl_err *err);

/* A tensor as the hash sees it: what a manifest file keeps of it (trust/manifest_file.h), without data. */
typedef struct manifest_tensor {
    const char *name;
    int type; /* enum ggml_type */
    int n_dims;
    int64_t ne[4];
    uint64_t nbytes;
    uint8_t hash[32]; /* BLAKE2b-256 of its data */
    uint32_t file;    /* manifest files: the split file it lives in, and where */
    uint64_t offset;
} manifest_tensor;

/* The range hash above from its parts: meta's keys and the range's tensors d[0..n) (sorted here by name),
 * the same bytes manifest_range_hash hashes. Fails, as manifest_range_hash does, on a range outside the model or
 * one with a layer none of d belongs to. */
struct gguf_context;
int manifest_hash_descs(const struct gguf_context *meta, uint32_t n_layer, uint32_t a, uint32_t b, manifest_tensor *d, int n,
                    uint8_t out[32], rl_err *err);
/* BLAKE2b-256 of each tensor's data into out[i], on n_threads threads (0: online CPUs, at most 8), with a
 * progress bar on stderr labelled `progress` (NULL: none); -1 when out of memory. */
int manifest_hash_tensors(const mf_tensor *const *ts, int n, int n_threads, const char *progress, uint8_t (*out)[32]);

#endif
