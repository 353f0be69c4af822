/* weight_place.h - where each weight tensor lives: which ggml buffer type, chosen the way llama.cpp chooses.
 *
 * llama.cpp keeps, per device, a list of buffer types in order of preference and gives each weight the first
 * one whose device can run the op the weight is used in (llama-model-loader.cpp, select_weight_buft). On a
 * CPU the list starts with the CPU backend's "extra" buffer types (CPU_REPACK: Q4_0, Q4_K, IQ4_NL, Q2_K ...
 * re-laid in interleaved blocks for faster kernels, chosen per CPU feature and shape), then plain host
 * memory. A weight in an extra buffer type is copied (and re-laid) out of the file mapping; every other one
 * stays zero-copy in the mapping. Using the same rule makes our matmuls run llama.cpp's default kernels, so
 * the logits equal llama.cpp's at its defaults, bit for bit (docs/numerics.md).
 *
 * This is also the seam for GPU devices (a device's buffer type first in the list) and for weights kept
 * outside memory: a placement names a buffer type, the caller allocates and loads. */
#ifndef RINGLM_WEIGHT_PLACE_H
#define RINGLM_WEIGHT_PLACE_H

#include <stdbool.h>
#include <stdint.h>

#define WP_MAX_BUFT 8

struct ggml_backend_buffer_type;
struct ggml_backend_device;

/* The op a weight is used in, as llama.cpp's tensor table says (llm_tensor_info.op). */
typedef enum wp_use {
    WP_USE_OTHER = 0, /* norms, biases, convolutions, embeddings (get_rows): never re-laid */
    WP_USE_MUL_MAT,   /* ggml_mul_mat(w, x) with x f32 */
    WP_USE_MUL_MAT_ID /* ggml_mul_mat_id(w, x, ids): routed experts */
} wp_use;

/* Buffer types in order of preference; a weight none of them takes stays in the mapping (host memory). */
typedef struct wp_list {
    struct ggml_backend_buffer_type *buft[WP_MAX_BUFT];
    struct ggml_backend_device *dev[WP_MAX_BUFT];
    int n;
} wp_list;

/* The CPU's list: with extra, the CPU backend's extra buffer types (what llama.cpp's use_extra_bufts adds,
 * its default); without, none (every weight in the mapping, llama.cpp's --no-repack). */
void wp_list_cpu(wp_list *l, bool extra);

/* Index in l of the first buffer type that runs `use` on a weight of this type and shape, or -1 for the
 * mapping. n_ids is the routed-expert count (top-k) for WP_USE_MUL_MAT_ID. Asks ggml's own supports_op on
 * the same probe op llama.cpp builds, so the answer is llama.cpp's on every CPU. */
int wp_choose(const wp_list *l, int type, const int64_t ne[4], wp_use use, int n_ids);

#endif
