#include "weight_place.h"

#include <string.h>

#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

void wp_list_cpu(wp_list *l, bool extra) {
    memset(l, 0, sizeof *l);
    if (!extra) return;
    ggml_backend_reg_t reg = ggml_backend_cpu_reg();
    ggml_backend_dev_t dev = reg ? ggml_backend_reg_dev_get(reg, 0) : NULL;
    ggml_backend_dev_get_extra_bufts_t fn =
        reg ? (ggml_backend_dev_get_extra_bufts_t)ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts")
            : NULL;
    ggml_backend_buffer_type_t *b = fn && dev ? fn(dev) : NULL;
    for (; b && *b && l->n < WP_MAX_BUFT; b++) {
        /* Never AMX (an installed ggml may have it): its kernel segfaults in this release (llama.cpp issue
         * 20824; scripts/ggml-variant.sh). */
        if (strcmp(ggml_backend_buft_name(*b), "AMX") == 0) continue;
        l->buft[l->n] = *b;
        l->dev[l->n] = dev;
        l->n++;
    }
}

/* llama.cpp's weight_buft_supported for the two ops that matter: the same probe shapes (512 columns), and
 * a zero-size buffer of the candidate type on the weight so that supports_op sees where it would live. */
static bool wp_supported(ggml_backend_buffer_type_t buft, ggml_backend_dev_t dev, int type, const int64_t ne[4],
                         wp_use use, int n_ids) {
    struct ggml_init_params ip = {.mem_size = 8 * ggml_tensor_overhead(), .mem_buffer = NULL, .no_alloc = true};
    struct ggml_context *c = ggml_init(ip);
    if (!c) return false;
    struct ggml_tensor *w = ggml_new_tensor(c, (enum ggml_type)type, 4, ne), *op = NULL;
    if (use == WP_USE_MUL_MAT) {
        op = ggml_mul_mat(c, w, ggml_new_tensor_4d(c, GGML_TYPE_F32, ne[0], 512, ne[2], ne[3]));
    } else if (use == WP_USE_MUL_MAT_ID && n_ids > 0) {
        struct ggml_tensor *b = ggml_new_tensor_3d(c, GGML_TYPE_F32, ne[0], n_ids, 512);
        op = ggml_mul_mat_id(c, w, b, ggml_new_tensor_2d(c, GGML_TYPE_I32, n_ids, 512));
    }
    bool ok = false;
    if (op) {
        w->buffer = ggml_backend_buft_alloc_buffer(buft, 0);
        ok = w->buffer && ggml_backend_dev_supports_op(dev, op);
        if (w->buffer) ggml_backend_buffer_free(w->buffer);
        w->buffer = NULL;
    }
    ggml_free(c);
    return ok;
}

int wp_choose(const wp_list *l, int type, const int64_t ne[4], wp_use use, int n_ids) {
    if (use == WP_USE_OTHER) return -1;
    for (int i = 0; i < l->n; i++) {
        if (wp_supported(l->buft[i], l->dev[i], type, ne, use, n_ids)) return i;
    }
    return -1;
}
