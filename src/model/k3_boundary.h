/* k3_boundary.h - the state that crosses a cut between two stages, per token (docs/k3-spec.md §6.3; the
 * data path: docs/ring.md).
 *
 * Entering layer il, each token carries the stream h (n_embd floats: the partial sum since the last bank)
 * and every checkpoint banked below il (k3_n_banked_before(il) vectors of n_embd). Layout, per token t:
 * h[t*n_embd ..], ckpt[(t*n_ckpt + j)*n_embd ..] for checkpoint j, matching ggml's [n_embd, n_ckpt, T].
 *
 * Wire form (k3_boundary_encode): a 24-byte little-endian header
 *   "K3BS" | u32 version 1 | u32 n_tokens | u32 n_embd | u32 n_ckpt | u32 dtype (0 f32, 1 f16, 2 bf16)
 * then h and ckpt in that dtype. f32 is exact; f16/bf16 halve the bytes at a rounding cost. */
#ifndef RINGLM_K3_BOUNDARY_H
#define RINGLM_K3_BOUNDARY_H

#include <stddef.h>
#include <stdint.h>

#include "../base/err.h"

enum k3_wire_dtype { K3_WIRE_F32 = 0, K3_WIRE_F16 = 1, K3_WIRE_BF16 = 2 };

typedef struct k3_boundary {
    uint32_t n_tokens, n_embd, n_ckpt;
    float *h;    /* n_tokens * n_embd */
    float *ckpt; /* n_tokens * n_ckpt * n_embd (NULL when n_ckpt == 0) */
} k3_boundary;

int k3_boundary_alloc(k3_boundary *bs, uint32_t n_tokens, uint32_t n_embd, uint32_t n_ckpt, rl_err *err);
void k3_boundary_free(k3_boundary *bs);

size_t k3_boundary_wire_size(const k3_boundary *bs, enum k3_wire_dtype dt);
/* Writes into buf (k3_boundary_wire_size bytes). */
void k3_boundary_encode(const k3_boundary *bs, enum k3_wire_dtype dt, uint8_t *buf);
/* Parses a wire buffer; checks the header against the size and the limits given. */
int k3_boundary_decode(k3_boundary *bs, const uint8_t *buf, size_t len, uint32_t max_tokens, uint32_t n_embd,
                       rl_err *err);

#endif
