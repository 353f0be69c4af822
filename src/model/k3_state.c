#include "k3_state.h"

#include <stdlib.h>
#include <string.h>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

int k3_state_init(k3_state *s, const k3_hparams *hp, uint32_t a, uint32_t b, uint32_t n_ctx, rl_err *err) {
    memset(s, 0, sizeof *s);
    s->a = a;
    s->b = b;
    s->n_ctx = n_ctx;
    uint32_t n = b - a;
    s->conv = calloc(n, sizeof *s->conv);
    s->delta = calloc(n, sizeof *s->delta);
    s->kcache = calloc(n, sizeof *s->kcache);
    struct ggml_init_params ip = {.mem_size = (size_t)(3 * n + 4) * ggml_tensor_overhead(), .mem_buffer = NULL,
                                  .no_alloc = true};
    s->ctx = ggml_init(ip);
    if (!s->conv || !s->delta || !s->kcache || !s->ctx) {
        k3_state_free(s);
        return rl_errf(err, "out of memory for sequence state");
    }
    const int64_t di = k3_d_inner(hp), dk = hp->kda_head_dim;
    int any = 0;
    for (uint32_t il = a; il < b; il++) {
        if (!hp->is_mla[il]) {
            s->conv[il - a] = ggml_new_tensor_3d(s->ctx, GGML_TYPE_F32, hp->conv_kernel - 1, di, 3);
            s->delta[il - a] = ggml_new_tensor_3d(s->ctx, GGML_TYPE_F32, dk, dk, hp->n_head);
        } else {
            s->kcache[il - a] = ggml_new_tensor_2d(s->ctx, GGML_TYPE_F32, hp->kv_lora_rank + hp->rope_dim, n_ctx);
        }
        any = 1;
    }
    if (any) {
        s->buf = ggml_backend_alloc_ctx_tensors_from_buft(s->ctx, ggml_backend_cpu_buffer_type());
        if (!s->buf) {
            k3_state_free(s);
            return rl_errf(err, "cannot allocate sequence state for layers [%u, %u) and %u tokens", a, b, n_ctx);
        }
        ggml_backend_buffer_clear(s->buf, 0);
    }
    return 0;
}

void k3_state_free(k3_state *s) {
    if (s->buf) ggml_backend_buffer_free(s->buf);
    if (s->ctx) ggml_free(s->ctx);
    free(s->conv);
    free(s->delta);
    free(s->kcache);
    memset(s, 0, sizeof *s);
}

void k3_state_reset(k3_state *s) {
    /* Only the recurrent parts need zeros; the MLA cache is addressed by position. */
    for (uint32_t i = 0; i < s->b - s->a; i++) {
        if (s->conv[i]) memset(s->conv[i]->data, 0, ggml_nbytes(s->conv[i]));
        if (s->delta[i]) memset(s->delta[i]->data, 0, ggml_nbytes(s->delta[i]));
    }
    s->n_past = 0;
}

size_t k3_state_bytes(const k3_state *s) { return s->buf ? ggml_backend_buffer_get_size(s->buf) : 0; }

static size_t k3_kda_bytes(const k3_state *s) {
    size_t n = 0;
    for (uint32_t i = 0; i < s->b - s->a; i++) {
        if (s->conv[i]) n += ggml_nbytes(s->conv[i]) + ggml_nbytes(s->delta[i]);
    }
    return n;
}

int k3_state_snapshot(const k3_state *s, k3_snapshot *snap, rl_err *err) {
    size_t need = k3_kda_bytes(s);
    if (snap->n_bytes != need) {
        uint8_t *p = realloc(snap->kda, need ? need : 1);
        if (!p) return rl_errf(err, "out of memory for a %zu-byte state snapshot", need);
        snap->kda = p;
        snap->n_bytes = need;
    }
    size_t off = 0;
    for (uint32_t i = 0; i < s->b - s->a; i++) {
        if (!s->conv[i]) continue;
        memcpy(snap->kda + off, s->conv[i]->data, ggml_nbytes(s->conv[i]));
        off += ggml_nbytes(s->conv[i]);
        memcpy(snap->kda + off, s->delta[i]->data, ggml_nbytes(s->delta[i]));
        off += ggml_nbytes(s->delta[i]);
    }
    snap->n_past = s->n_past;
    return 0;
}

int k3_state_restore(k3_state *s, const k3_snapshot *snap, rl_err *err) {
    if (snap->n_bytes != k3_kda_bytes(s)) return rl_errf(err, "snapshot does not belong to this state");
    size_t off = 0;
    for (uint32_t i = 0; i < s->b - s->a; i++) {
        if (!s->conv[i]) continue;
        memcpy(s->conv[i]->data, snap->kda + off, ggml_nbytes(s->conv[i]));
        off += ggml_nbytes(s->conv[i]);
        memcpy(s->delta[i]->data, snap->kda + off, ggml_nbytes(s->delta[i]));
        off += ggml_nbytes(s->delta[i]);
    }
    s->n_past = snap->n_past;
    return 0;
}

void k3_snapshot_free(k3_snapshot *snap) {
    free(snap->kda);
    memset(snap, 0, sizeof *snap);
}
