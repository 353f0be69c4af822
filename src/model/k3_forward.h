/* Folder src/model/: K3 hyperparameters and tensor manifest, weights of a layer range, the forward graph, the
 * expert cache (routed experts read from the file under --mem), per-sequence state, boundary state, memory
 * arithmetic, the logits file format. May include: base, device, gguf. (README
 * "Layout"; tests/t_layout.sh checks both.)
 */
/* k3_forward.h - our K3 forward pass on ggml, for one layer range [a, b) (docs/k3-spec.md §5).
 *
 * An engine binds the range's weights and runs batches: several sequences at once, any number of tokens
 * each (prefill chunks or single decode steps), each sequence with its own k3_state. Input is token ids
 * (a == 0) or the boundary state entering layer a; output is the boundary state at b, plus logits for the
 * asked-for rows when b == n_layer. One machine is the range [0, n_layer). */
#ifndef RINGLM_K3_FORWARD_H
#define RINGLM_K3_FORWARD_H

#include <stdbool.h>
#include <stdint.h>

#include "../base/err.h"
#include "../gguf/model_file.h"
#include "k3_boundary.h"
#include "k3_hparams.h"
#include "k3_state.h"
#include "k3_weights.h"

struct ggml_backend;
struct ggml_gallocr;
struct ggml_backend_sched;
struct xc_cache;
struct xc_stats;

typedef struct k3_engine {
    k3_hparams hp;
    k3_weights w;
    uint32_t a, b;
    int n_threads;
    bool flash_attn;            /* !k3_engine_opts.no_flash_attn */
    struct ggml_backend *backend;     /* the CPU */
    struct ggml_backend *dev_backend[K3_MAX_DEV]; /* the devices layers [hp.dev_a, hp.dev_b) run on, hp.n_dev of
                                                   * them (split at hp.dev_end); none: the CPU only */
    struct ggml_gallocr *galloc;
    uint64_t plan_outputs;      /* which nodes were outputs when galloc last planned (k3_forward) */
    void *compute_base;         /* galloc's buffer when it was last given huge pages (base/heap.h) */
    void *graph_buf; /* the graph's tensor and node structs, kept between calls: a fresh multi-MiB malloc
                      * per token is a fresh mmap, and its page faults cost a few percent of decode time */
    size_t graph_cap;
    /* The MLA causal masks, outside the compute buffer: a mask grows with the context (n_kv x chunk; 64 MiB
     * for a 512-token chunk at 64k), so in the compute buffer every chunk of a long prompt needed a larger
     * buffer, which the allocator maps anew and the kernel faults in again, page by page; here it grows by
     * doubling, up to what the sequences' context can need (k3_masks_place). Mapped by us (mask_mem), not
     * malloc'ed: the smaller sizes it outgrows would stay as holes in the heap, which rl_heap_keep keeps. */
    struct ggml_backend_buffer *mask_buf;
    void *mask_mem;
    size_t mask_cap;
    struct ggml_backend_sched *sched; /* runs graphs over a device and the CPU, or over cached experts (stops
                                       * at each pass); NULL on the CPU alone */
    size_t sched_size;
    struct xc_cache *xc; /* routed experts read from the file through a cache (k3_engine_opts.mem_bytes), or NULL */
    struct k3_graph *kept;  /* the last decode step's graph (one token per sequence), built and allocated, for
                            * the next step of the same sequences (k3_forward.c), or NULL */
    uint64_t n_reused;    /* steps that ran the kept graph instead of building one */
} k3_engine;

/* How an engine computes. All zero is llama.cpp's defaults (a zero-initialized struct is the usual
 * argument; NULL means the same with one thread). */
typedef struct k3_engine_opts {
    int n_threads;  /* CPU threads; <= 0: 1 */
    bool no_repack; /* keep every weight in the file mapping (llama.cpp's --no-repack) */
    bool progress;  /* a bar on stderr while weights are copied into a device */
    bool no_flash_attn; /* MLA attention by softmax(kq)·v instead of ggml_flash_attn_ext (llama.cpp's -fa off) */
    bool flash_attn_on; /* --flash-attn on: flash attention on every device; auto (the default) leaves it off on a
                         * Vulkan device, whose flash attention over the MLA cache wrote out of bounds here */
    bool cache_f32;     /* the MLA latent cache in f32 instead of f16 (llama.cpp's -ctk f32) */
    size_t mem_bytes;   /* resident weights at most this (0: no limit): when the range's weights do not fit,
                         * its routed experts are read from the file into a cache that fills what the dense
                         * part leaves (expert_cache.h); the logits stay the same bits */
    const char *expert_copy; /* with the expert cache (mem_bytes): a folder keeping the experts as the cache's
                              * repacked slots hold them, so each is re-laid once, not at every read
                              * (expert_copy.h; NULL: none) */
    const char *device; /* the devices to compute on, by ggml's names (`ringlm devices`): CPU, Vulkan0, CUDA0,
                         * or a list "CUDA0,CUDA1" over which the device layers are split in proportion to free
                         * memory; NULL: $RINGLM_DEVICE, else every GPU found, else the CPU (dv_pick) */
    size_t vram_bytes;  /* device memory the weights may take, at most, all devices together (0: each device's
                         * free memory less a tenth and 256 MiB); decides the default split, and refuses one
                         * that does not fit it */
    bool gpu_layers_set;
    uint32_t gpu_layers; /* with gpu_layers_set: the first gpu_layers layers of the range on the device, the
                          * rest on the CPU (0: all on the CPU); else all of them, output head included */
    uint32_t n_cpu_moe; /* the routed experts of layers 0 .. n_cpu_moe-1 stay in RAM and run on the CPU while
                         * the rest of those layers is on the device (llama.cpp's --n-cpu-moe; UINT32_MAX:
                         * --cpu-moe, all of them) */
} k3_engine_opts;

int k3_engine_init(k3_engine *e, const mf_model *m, const k3_hparams *hp, uint32_t a, uint32_t b,
                   const k3_engine_opts *o, rl_err *err);
void k3_engine_free(k3_engine *e);
/* One line saying where the engine computes: the device, its layers, the weights it holds there. */
int k3_engine_describe(const k3_engine *e, char *buf, size_t len);
/* The expert cache's counters (NULL when every weight is resident). */
const struct xc_stats *k3_engine_cache_stats(const k3_engine *e);
/* Bytes of the engine's compute buffer: what its largest graph so far needed (activations, masks). */
size_t k3_engine_compute_bytes(const k3_engine *e);

/* ggml's CPU flash attention takes its tiled kernel for this many query rows or more, a row-by-row one below
 * (GGML_FA_TILE_Q in the pinned release's ggml-cpu/common.h); the two round differently. */
#define K3_FA_TILE_Q 64

typedef struct k3_batch {
    int n_seqs;
    k3_state **seqs;          /* one state per sequence, all distinct, for this engine's range */
    const uint32_t *n_tokens; /* tokens of each sequence in this batch (>= 1) */
    const int32_t *tokens;    /* a == 0: the tokens, sequence after sequence */
    const k3_boundary *in;    /* a > 0: the boundary state of the same tokens, same order */
    const uint8_t *keep_rollback; /* per sequence (NULL = none): keep what k3_state_rollback needs to return
                                   * to any position inside this batch's tokens (speculative verification);
                                   * implies step_kernels */
    bool step_kernels;        /* every token's numbers bit for bit what a one-token step gives, not the
                               * batched GEMM's (docs/numerics.md): verified blocks reproduce greedy */
    bool split_invariant;     /* every token of a piece of 2 or more tokens gets the bits it gets in any other
                               * split of the same tokens into such pieces (a prompt read in other chunks, or
                               * resumed from a cached prefix): flash attention always takes ggml's tiled
                               * kernel (a piece shorter than K3_FA_TILE_Q gets padding query rows), and such
                               * pieces of several sequences are not grouped. One-token steps are unchanged.
                               * Not with repacked weights, whose GEMM groups a batch's rows by four
                               * (docs/numerics.md, "Split invariance") */
    int n_logits;             /* b == n_layer: how many rows need logits */
    const int32_t *logit_rows;/* their indices in the batch (0 .. total-1) */
    int n_taps;               /* stream taps for a DSpark draft (docs/k3-spec.md §10.1.3): the stream h entering each */
    const uint32_t *tap_layers; /* listed layer, every token of the batch; ids in [a, b] (b: leaving it) */
    bool routes;              /* report every MoE layer's routing (k3_routes): expert saliency (REAP) */
} k3_batch;

/* What the router of each MoE layer in [a, b) did to each token of a batch, with k3_batch.routes: the
 * experts it chose (top-k order), the gate weight each got (as the layer weights it: unbiased sigmoid,
 * renormalized, scaled) and the L2 norm of each chosen expert's output r_e, in the space the expert writes
 * (the latent space for the latent MoE, before the weighted sum, the routed norm and the up-projection).
 * Arrays are [layer][token][k], layers in order from the first MoE layer of the range. */
typedef struct k3_routes {
    uint32_t n_layers;   /* MoE layers in the range */
    uint32_t layer0;     /* the first of them */
    uint32_t n_tokens, k;
    int32_t *ids;
    float *weight;
    float *norm;
} k3_routes;

typedef struct k3_output {
    k3_boundary out; /* b < n_layer: boundary entering layer b (allocated here) */
    float *logits;   /* b == n_layer: n_logits rows of n_vocab (malloc'ed here) */
    int n_logits;
    float *taps;     /* n_taps > 0: [tap][token][n_embd], in tap_layers order (malloc'ed here) */
    k3_routes routes; /* k3_batch.routes: every MoE layer's routing (arrays malloc'ed here) */
} k3_output;

/* Runs the batch, advances every sequence's position. On error no state has advanced ... unless the
 * compute itself failed (it cannot on CPU once the graph is built). */
int k3_forward(k3_engine *e, const k3_batch *batch, k3_output *out, rl_err *err);
void k3_output_free(k3_output *o);
/* Tokens t0 .. t0+n of a batch's taps (k3_output.taps, tap-major over the batch's `total` tokens), token-major
 * into dst: n rows of n_taps * n_embd floats, tap k of a row at [k * n_embd, (k+1) * n_embd) - the layout a
 * DSpark draft takes (dspark_push). */
void k3_tap_rows(const float *taps, int n_taps, uint32_t n_embd, size_t total, size_t t0, uint32_t n, float *dst);

#endif
