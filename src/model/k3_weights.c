#include "k3_weights.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

/* Creates a tensor descriptor for a file tensor and points it at the mapped bytes. NULL if absent. */
static struct ggml_tensor *k3_bind(k3_weights *w, const mf_model *m, const char *name) {
    const mf_tensor *t = mf_find(m, name);
    if (!t) return NULL;
    struct ggml_tensor *g = ggml_new_tensor(w->ctx, (enum ggml_type)t->type, 4, t->ne);
    ggml_set_name(g, name);
    /* The tensor lives inside its split's mapping; ggml_backend_tensor_alloc records buffer and address. */
    ggml_backend_tensor_alloc(w->bufs[t->split], g, (void *)t->data);
    return g;
}

int k3_weights_bind(k3_weights *w, const mf_model *m, const k3_hparams *hp, uint32_t a, uint32_t b, rl_err *err) {
    memset(w, 0, sizeof *w);
    if (a >= b || b > hp->n_layer) return rl_errf(err, "bad layer range [%u, %u) for %u layers", a, b, hp->n_layer);
    w->a = a;
    w->b = b;
    w->layers = calloc(b - a, sizeof *w->layers);
    w->bufs = calloc((size_t)m->n_split, sizeof *w->bufs);
    struct ggml_init_params ip = {.mem_size = (size_t)(m->n_tensor + 8) * ggml_tensor_overhead(), .mem_buffer = NULL,
                                  .no_alloc = true};
    w->ctx = ggml_init(ip);
    if (!w->layers || !w->bufs || !w->ctx) {
        k3_weights_free(w);
        return rl_errf(err, "out of memory binding weights");
    }
    for (int s = 0; s < m->n_split; s++) {
        /* The mapping is page-aligned, which satisfies ggml's tensor alignment. */
        w->bufs[s] = ggml_backend_cpu_buffer_from_ptr(m->splits[s].map, m->splits[s].size);
        if (!w->bufs[s]) {
            k3_weights_free(w);
            return rl_errf(err, "cannot wrap the mapping of %s", m->splits[s].path);
        }
        w->n_bufs = s + 1;
    }
    char n[96];
#define T(field, fmt) (snprintf(n, sizeof n, fmt, il), L->field = k3_bind(w, m, n))
    for (uint32_t il = a; il < b; il++) {
        k3_layer_w *L = &w->layers[il - a];
        T(attn_norm, "blk.%u.attn_norm.weight");
        T(ffn_norm, "blk.%u.ffn_norm.weight");
        T(attn_res_score, "blk.%u.attn_res_score.weight");
        T(ffn_res_score, "blk.%u.ffn_res_score.weight");
        if (!hp->is_mla[il]) {
            T(wq, "blk.%u.attn_q.weight");
            T(wk, "blk.%u.attn_k.weight");
            T(wv, "blk.%u.attn_v.weight");
            T(conv_q, "blk.%u.ssm_conv1d_q.weight");
            T(conv_k, "blk.%u.ssm_conv1d_k.weight");
            T(conv_v, "blk.%u.ssm_conv1d_v.weight");
            T(f_a, "blk.%u.ssm_f_a.weight");
            T(f_b, "blk.%u.ssm_f_b.weight");
            T(dt_b, "blk.%u.ssm_dt.bias");
            T(ssm_a, "blk.%u.ssm_a");
            T(beta, "blk.%u.ssm_beta.weight");
            T(ssm_g, "blk.%u.ssm_g.weight");
            T(ssm_norm, "blk.%u.ssm_norm.weight");
        } else {
            T(q_a, "blk.%u.attn_q_a.weight");
            T(q_a_norm, "blk.%u.attn_q_a_norm.weight");
            T(q_b, "blk.%u.attn_q_b.weight");
            T(q, "blk.%u.attn_q.weight");
            T(kv_a, "blk.%u.attn_kv_a_mqa.weight");
            T(kv_a_norm, "blk.%u.attn_kv_a_norm.weight");
            T(k_b, "blk.%u.attn_k_b.weight");
            T(v_b, "blk.%u.attn_v_b.weight");
            T(gate, "blk.%u.attn_gate.weight");
        }
        T(wo, "blk.%u.attn_output.weight");
        T(ffn_gate, "blk.%u.ffn_gate.weight");
        T(ffn_up, "blk.%u.ffn_up.weight");
        T(ffn_down, "blk.%u.ffn_down.weight");
        T(gate_inp, "blk.%u.ffn_gate_inp.weight");
        T(probs_b, "blk.%u.exp_probs_b.bias");
        T(routed_down, "blk.%u.ffn_routed_down.weight");
        T(routed_up, "blk.%u.ffn_routed_up.weight");
        T(routed_norm, "blk.%u.ffn_routed_norm.weight");
        T(gate_exps, "blk.%u.ffn_gate_exps.weight");
        T(up_exps, "blk.%u.ffn_up_exps.weight");
        T(down_exps, "blk.%u.ffn_down_exps.weight");
        T(gate_sh, "blk.%u.ffn_gate_shexp.weight");
        T(up_sh, "blk.%u.ffn_up_shexp.weight");
        T(down_sh, "blk.%u.ffn_down_shexp.weight");
    }
#undef T
    if (a == 0) w->tok_embd = k3_bind(w, m, "token_embd.weight");
    if (b == hp->n_layer) {
        w->output = k3_bind(w, m, "output.weight");
        w->output_norm = k3_bind(w, m, "output_norm.weight");
        w->output_res_score = k3_bind(w, m, "output_res_score.weight");
    }
    return 0;
}

void k3_weights_free(k3_weights *w) {
    if (w->ctx) ggml_free(w->ctx);
    for (int s = 0; s < w->n_bufs; s++) ggml_backend_buffer_free(w->bufs[s]);
    free(w->bufs);
    free(w->layers);
    memset(w, 0, sizeof *w);
}

size_t k3_weights_prefault(const k3_weights *w, bool progress) {
    size_t total = 0, done = 0;
    for (struct ggml_tensor *t = ggml_get_first_tensor(w->ctx); t; t = ggml_get_next_tensor(w->ctx, t)) {
        total += ggml_nbytes(t);
    }
    volatile uint8_t sink = 0;
    int last_pct = -1;
    for (struct ggml_tensor *t = ggml_get_first_tensor(w->ctx); t; t = ggml_get_next_tensor(w->ctx, t)) {
        const volatile uint8_t *p = t->data;
        size_t n = ggml_nbytes(t);
        for (size_t i = 0; i < n; i += 4096) sink ^= p[i];
        done += n;
        int pct = total ? (int)(100.0 * (double)done / (double)total) : 100;
        if (progress && pct != last_pct) {
            last_pct = pct;
            fprintf(stderr, "\rloading [%-40.*s] %3d%% %8.1f MiB", pct * 40 / 100,
                    "########################################", pct, (double)done / 1048576.0);
            if (done == total) fputc('\n', stderr);
        }
    }
    (void)sink;
    return total;
}
