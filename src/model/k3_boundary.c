#include "k3_boundary.h"

#include <stdlib.h>
#include <string.h>

#include "ggml.h"

int k3_boundary_alloc(k3_boundary *bs, uint32_t n_tokens, uint32_t n_embd, uint32_t n_ckpt, rl_err *err) {
    memset(bs, 0, sizeof *bs);
    bs->n_tokens = n_tokens;
    bs->n_embd = n_embd;
    bs->n_ckpt = n_ckpt;
    bs->h = malloc((size_t)n_tokens * n_embd * sizeof(float) + 1);
    if (n_ckpt) bs->ckpt = malloc((size_t)n_tokens * n_ckpt * n_embd * sizeof(float));
    if (!bs->h || (n_ckpt && !bs->ckpt)) {
        k3_boundary_free(bs);
        return rl_errf(err, "out of memory for a %u-token boundary state", n_tokens);
    }
    return 0;
}

void k3_boundary_free(k3_boundary *bs) {
    free(bs->h);
    free(bs->ckpt);
    memset(bs, 0, sizeof *bs);
}

static size_t k3_dt_size(enum k3_wire_dtype dt) { return dt == K3_WIRE_F32 ? 4 : 2; }

size_t k3_boundary_wire_size(const k3_boundary *bs, enum k3_wire_dtype dt) {
    return 24 + (size_t)bs->n_tokens * bs->n_embd * (1 + bs->n_ckpt) * k3_dt_size(dt);
}

static void k3_put32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8), p[2] = (uint8_t)(v >> 16), p[3] = (uint8_t)(v >> 24);
}
static uint32_t k3_get32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void k3_pack(const float *src, size_t n, enum k3_wire_dtype dt, uint8_t *dst) {
    if (dt == K3_WIRE_F32) memcpy(dst, src, n * 4);
    else if (dt == K3_WIRE_F16) ggml_fp32_to_fp16_row(src, (ggml_fp16_t *)dst, (int64_t)n);
    else ggml_fp32_to_bf16_row(src, (ggml_bf16_t *)dst, (int64_t)n);
}

static void k3_unpack(const uint8_t *src, size_t n, enum k3_wire_dtype dt, float *dst) {
    if (dt == K3_WIRE_F32) memcpy(dst, src, n * 4);
    else if (dt == K3_WIRE_F16) ggml_fp16_to_fp32_row((const ggml_fp16_t *)src, dst, (int64_t)n);
    else ggml_bf16_to_fp32_row((const ggml_bf16_t *)src, dst, (int64_t)n);
}

void k3_boundary_encode(const k3_boundary *bs, enum k3_wire_dtype dt, uint8_t *buf) {
    memcpy(buf, "K3BS", 4);
    k3_put32(buf + 4, 1);
    k3_put32(buf + 8, bs->n_tokens);
    k3_put32(buf + 12, bs->n_embd);
    k3_put32(buf + 16, bs->n_ckpt);
    k3_put32(buf + 20, (uint32_t)dt);
    size_t nh = (size_t)bs->n_tokens * bs->n_embd;
    k3_pack(bs->h, nh, dt, buf + 24);
    if (bs->n_ckpt) k3_pack(bs->ckpt, nh * bs->n_ckpt, dt, buf + 24 + nh * k3_dt_size(dt));
}

int k3_boundary_decode(k3_boundary *bs, const uint8_t *buf, size_t len, uint32_t max_tokens, uint32_t n_embd,
                       rl_err *err) {
    memset(bs, 0, sizeof *bs);
    if (len < 24 || memcmp(buf, "K3BS", 4) != 0) return rl_errf(err, "boundary state: bad header");
    if (k3_get32(buf + 4) != 1) return rl_errf(err, "boundary state: unsupported version %u", k3_get32(buf + 4));
    uint32_t nt = k3_get32(buf + 8), ne = k3_get32(buf + 12), nc = k3_get32(buf + 16), dt = k3_get32(buf + 20);
    if (dt > K3_WIRE_BF16) return rl_errf(err, "boundary state: unknown dtype %u", dt);
    if (ne != n_embd) return rl_errf(err, "boundary state: width %u, this model has %u", ne, n_embd);
    if (nt == 0 || nt > max_tokens) return rl_errf(err, "boundary state: %u tokens (limit %u)", nt, max_tokens);
    if (nc > 1024) return rl_errf(err, "boundary state: %u checkpoints", nc);
    size_t want = 24 + (size_t)nt * ne * (1 + nc) * k3_dt_size((enum k3_wire_dtype)dt);
    if (len != want) return rl_errf(err, "boundary state: %zu bytes, header implies %zu", len, want);
    if (k3_boundary_alloc(bs, nt, ne, nc, err) != 0) return -1;
    size_t nh = (size_t)nt * ne;
    k3_unpack(buf + 24, nh, (enum k3_wire_dtype)dt, bs->h);
    if (nc) k3_unpack(buf + 24 + nh * k3_dt_size((enum k3_wire_dtype)dt), nh * nc, (enum k3_wire_dtype)dt, bs->ckpt);
    return 0;
}
