/* k3_memory.h - the sizes a planner needs: weights of any layer range, per-sequence state, cache per
 * token, and the boundary state that crosses a cut between stages (docs/k3-spec.md §6). */
#ifndef RINGLM_K3_MEMORY_H
#define RINGLM_K3_MEMORY_H

#include <stddef.h>
#include <stdint.h>

#include "../gguf/model_file.h"
#include "k3_hparams.h"

/* Weight bytes a stage running layers [a, b) maps: its blk.N.* tensors, plus token_embd when a == 0 and
 * the output tensors (output, output_norm, output_res_score) when b == n_layer. */
size_t k3_range_weight_bytes(const mf_model *m, const k3_hparams *hp, uint32_t a, uint32_t b);

/* Of k3_range_weight_bytes, the routed experts' (the *_exps tensors): what an expert cache may leave on disk;
 * the rest is the range's dense part. */
size_t k3_range_expert_bytes(const mf_model *m, const k3_hparams *hp, uint32_t a, uint32_t b);

/* Of [a, b)'s weights under hp's device layout (hp->n_dev 0: all on the CPU), what stays in RAM: *dense the
 * CPU layers' weights other than routed experts, the token embeddings and the head where the CPU holds it;
 * *experts the routed experts in RAM (k3_experts_on_cpu). Under --mem these two are what the budget holds:
 * the dense part resident, the experts through the cache. */
void k3_range_ram_bytes(const mf_model *m, const k3_hparams *hp, uint32_t a, uint32_t b, size_t *dense,
                        size_t *experts);

/* What the weights may take on a device with `free` bytes free: less a tenth and 256 MiB (compute buffers
 * and per-sequence state). */
size_t k3_dev_room(size_t free);

/* Splits layers [a, a + n) over nd devices in proportion to their room, as llama.cpp's default tensor split
 * does (by free memory): device d gets [end[d - 1], end[d]) (end[-1] = a), end[nd - 1] = a + n. The engine
 * splits its device layers so, and the coordinator's printed plan says it per device. */
void k3_dev_split(uint32_t a, uint32_t n, const size_t *room, int nd, uint32_t *end);

/* Weight bytes of one layer's blk.N.* tensors. */
size_t k3_layer_weight_bytes(const mf_model *m, uint32_t il);

/* Recurrent state of the KDA layers in [a, b) for one sequence (f32 conv windows + delta matrices);
 * constant in context length. */
size_t k3_range_kda_state_bytes(const k3_hparams *hp, uint32_t a, uint32_t b);

/* The copies one sequence keeps in [a, b) for rolling back verified blocks of up to `block` tokens when it
 * keeps n_blocks of them (k3_state_keep_blocks; the speculation's blocks in flight), with the slot a new
 * block is computed into: per KDA layer and slot, the delta state after every token of the block and the
 * conv windows (k3_state_rb_reserve). KDA state is large (K3: 6.3 MiB a layer), so this is often more than
 * the rest of the state: 0 when block or n_blocks is 0 (no speculation). */
size_t k3_range_rollback_bytes(const k3_hparams *hp, uint32_t a, uint32_t b, uint32_t block, int n_blocks);

/* MLA latent cache bytes per token for the MLA layers in [a, b), with elem_size 4 (f32) or 2 (f16). */
size_t k3_range_mla_bytes_per_token(const k3_hparams *hp, uint32_t a, uint32_t b, size_t elem_size);

/* f32 values per token in the boundary state entering layer il (hidden stream + banked checkpoints). */
size_t k3_boundary_floats(const k3_hparams *hp, uint32_t il);

/* Weight bytes one token reads in [a, b): every tensor, except that routed experts count k/E of their bytes
 * and the embedding one row. Divided into memory bandwidth, this bounds decode speed. */
size_t k3_range_active_bytes(const mf_model *m, const k3_hparams *hp, uint32_t a, uint32_t b);

/* The compute buffer of a prefill chunk of `chunk` tokens at the end of an n_ctx context, at the defaults
 * (flash attention): the f16 attention mask, n_ctx x chunk (the largest part at long context, when the range
 * has an MLA layer), and the activations, about 14 f32 vectors of n_embd per chunk token (measured on the
 * synthesized presets, where ggml-alloc's plan gives 13.0 to 13.9; an estimate, not ggml-alloc's plan). */
size_t k3_range_compute_bytes(const k3_hparams *hp, uint32_t a, uint32_t b, uint32_t n_ctx, uint32_t chunk);

/* The state of n_seq sequences of up to n_ctx tokens each in [a, b): KDA state and the MLA cache, of
 * cache_elem bytes per element (4: f32, 2: f16, the default). */
size_t k3_range_state_bytes(const k3_hparams *hp, uint32_t a, uint32_t b, uint32_t n_seq, uint32_t n_ctx,
                            size_t cache_elem);

#endif
