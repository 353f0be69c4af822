#include "k3_weights.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

#include "../base/heap.h"

/* The op each K3 weight is used in (k3_layers.c), as llama.cpp's tensor table has it; it decides which
 * buffer types may hold the weight. Everything not listed (norms, biases, ResMix scores, the short
 * convolutions, ssm_a, token_embd's get_rows) is WP_USE_OTHER. */
wp_use k3_weight_use(const char *name) {
    static const char *const mm[] = {
        "attn_q.weight", "attn_k.weight", "attn_v.weight", "ssm_f_a.weight", "ssm_f_b.weight", "ssm_beta.weight",
        "ssm_g.weight", "attn_q_a.weight", "attn_q_b.weight", "attn_kv_a_mqa.weight", "attn_k_b.weight",
        "attn_v_b.weight", "attn_gate.weight", "attn_output.weight", "ffn_gate.weight", "ffn_up.weight",
        "ffn_down.weight", "ffn_gate_inp.weight", "ffn_routed_down.weight", "ffn_routed_up.weight",
        "ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight"};
    static const char *const mmid[] = {"ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"};
    if (strcmp(name, "output.weight") == 0) return WP_USE_MUL_MAT;
    if (strncmp(name, "blk.", 4) != 0) return WP_USE_OTHER;
    const char *dot = strchr(name + 4, '.');
    if (!dot) return WP_USE_OTHER;
    for (size_t i = 0; i < sizeof mm / sizeof mm[0]; i++) {
        if (strcmp(dot + 1, mm[i]) == 0) return WP_USE_MUL_MAT;
    }
    for (size_t i = 0; i < sizeof mmid / sizeof mmid[0]; i++) {
        if (strcmp(dot + 1, mmid[i]) == 0) return WP_USE_MUL_MAT_ID;
    }
    return WP_USE_OTHER;
}

size_t k3_range_repack_bytes(const mf_model *m, const k3_hparams *hp, uint32_t a, uint32_t b) {
    wp_list l;
    wp_list_cpu(&l, true);
    size_t n = 0;
    for (int i = 0; i < m->n_tensor; i++) {
        const mf_tensor *t = &m->tensors[i];
        uint32_t il;
        bool in = sscanf(t->name, "blk.%u.", &il) == 1 ? il >= a && il < b : strcmp(t->name, "output.weight") == 0 && b == hp->n_layer;
        if (in && wp_choose(&l, (int)t->type, t->ne, k3_weight_use(t->name), (int)hp->n_expert_used) >= 0) n += t->nbytes;
    }
    return n;
}

bool k3_range_split_invariant(const mf_model *m, const k3_hparams *hp, uint32_t a, uint32_t b, bool no_repack,
                              char *why, size_t why_len) {
    if (hp->n_dev > 0) {
        snprintf(why, why_len, "layers computed on a device (split invariance is measured on the CPU only)");
        return false;
    }
    wp_list l;
    wp_list_cpu(&l, !no_repack);
    for (int i = 0; i < m->n_tensor; i++) {
        const mf_tensor *t = &m->tensors[i];
        uint32_t il;
        bool in = sscanf(t->name, "blk.%u.", &il) == 1 ? il >= a && il < b : strcmp(t->name, "output.weight") == 0 && b == hp->n_layer;
        const wp_use use = k3_weight_use(t->name);
        if (!in || use == WP_USE_OTHER) continue;
        const enum ggml_type ty = (enum ggml_type)t->type;
        const bool measured = ty == GGML_TYPE_F32 || ty == GGML_TYPE_F16 || ty == GGML_TYPE_BF16 || ty == GGML_TYPE_Q8_0 ||
                              ty == GGML_TYPE_Q4_0 || ty == GGML_TYPE_Q2_K || ty == GGML_TYPE_Q4_K || ty == GGML_TYPE_IQ4_NL;
        if (!measured) {
            snprintf(why, why_len, "%s is %s, whose kernels round a token by the piece it is in", t->name, ggml_type_name(ty));
            return false;
        }
        if (ty != GGML_TYPE_Q4_0 && wp_choose(&l, (int)t->type, t->ne, use, (int)hp->n_expert_used) >= 0) {
            snprintf(why, why_len, "%s is %s repacked for this CPU, whose GEMM rounds a batch's last rows apart "
                     "(--no-repack makes it exact)", t->name, ggml_type_name(ty));
            return false;
        }
    }
    snprintf(why, why_len, "every matmul weight's kernels are split-invariant");
    return true;
}

/* Creates the descriptor of a file tensor where the placement puts it: in the mapping (zero-copy, bound
 * here) or in an extra buffer type's context (allocated and filled by k3_weights_copy). NULL if absent. */
static struct ggml_tensor *k3_bind(k3_weights *w, const mf_model *m, const char *name, wp_use use, int n_ids, int dev) {
    const mf_tensor *t = mf_find(m, name);
    if (!t) return NULL;
    int k = dev >= 0 ? K3_W_DEV + dev : wp_choose(&w->place, (int)t->type, t->ne, use, n_ids);
    if (k >= 0 && !w->xctx[k]) {
        struct ggml_init_params ip = {.mem_size = (size_t)(m->n_tensor + 8) * ggml_tensor_overhead(),
                                      .mem_buffer = NULL, .no_alloc = true};
        w->xctx[k] = ggml_init(ip);
    }
    if (k >= 0 && !w->xctx[k]) k = -1; /* no memory for a context: leave it in the mapping */
    struct ggml_tensor *g = ggml_new_tensor(k >= 0 ? w->xctx[k] : w->ctx, (enum ggml_type)t->type, 4, t->ne);
    ggml_set_name(g, name);
    /* The tensor lives inside its split's mapping; ggml_backend_tensor_alloc records buffer and address. */
    if (k < 0) ggml_backend_tensor_alloc(w->bufs[t->split], g, (void *)t->data);
    return g;
}

/* Allocates each extra buffer type's tensors and copies them in from the mapping (the buffer's set_tensor
 * re-lays them), then tells the kernel the file pages they came from are not needed: the copy is what is
 * read from now on, and the mapping's pages would otherwise stay resident beside it. */
static int k3_weights_copy(k3_weights *w, const mf_model *m, const k3_hparams *hp, bool progress, rl_err *err) {
    for (int k = 0; k < K3_W_SLOTS; k++) {
        if (!w->xctx[k] || !ggml_get_first_tensor(w->xctx[k])) continue;
        size_t need = 0;
        for (struct ggml_tensor *t = ggml_get_first_tensor(w->xctx[k]); t; t = ggml_get_next_tensor(w->xctx[k], t)) {
            need += ggml_nbytes(t);
        }
        ggml_backend_buffer_type_t buft = k >= K3_W_DEV ? hp->dev_buft[k - K3_W_DEV] : w->place.buft[k];
        w->xbuf[k] = ggml_backend_alloc_ctx_tensors_from_buft(w->xctx[k], buft);
        if (!w->xbuf[k] && k >= K3_W_DEV) {
            ggml_backend_dev_t d = ggml_backend_buft_get_device(buft);
            size_t fr = 0, tot = 0;
            if (d) ggml_backend_dev_memory(d, &fr, &tot);
            return rl_errf(err, "cannot allocate %.1f MiB of %s memory for the weights of layers on that device (it "
                                "has %.1f MiB free of %.1f MiB): offload fewer layers (--gpu-layers)",
                           (double)need / 1048576.0, ggml_backend_buft_name(buft), (double)fr / 1048576.0,
                           (double)tot / 1048576.0);
        }
        if (!w->xbuf[k]) {
            return rl_errf(err, "cannot allocate %.1f MiB of %s memory for repacked weights (--no-repack keeps them "
                                "in the file mapping)", (double)need / 1048576.0, ggml_backend_buft_name(buft));
        }
        ggml_backend_buffer_set_usage(w->xbuf[k], GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
        /* Written whole just below, tensor by tensor: huge pages make that one fault per 2 MiB (base/heap.h).
         * The CPU's extra buffer types are its memory, though not "host" to ggml (their layouts are not
         * the tensors' own); a device's is not ours to advise. */
        if (k < K3_W_DEV) {
            rl_heap_advise_huge(ggml_backend_buffer_get_base(w->xbuf[k]), ggml_backend_buffer_get_size(w->xbuf[k]));
        }
        const long pg = sysconf(_SC_PAGESIZE);
        /* A bar for the copy into a device (the one that takes a while on a large range: the file is read and
         * sent over PCIe); repacking into the CPU's layouts stays quiet, as llama.cpp's does. */
        const bool bar = progress && k >= K3_W_DEV;
        int last_pct = -1;
        for (struct ggml_tensor *t = ggml_get_first_tensor(w->xctx[k]); t; t = ggml_get_next_tensor(w->xctx[k], t)) {
            const mf_tensor *src = mf_find(m, ggml_get_name(t));
            size_t n = ggml_nbytes(t);
            ggml_backend_tensor_set(t, src->data, 0, n);
            w->x_bytes[k] += n;
            const int pct = need ? (int)(100.0 * (double)w->x_bytes[k] / (double)need) : 100;
            if (bar && pct != last_pct) {
                last_pct = pct;
                fprintf(stderr, "\rcopying to %s [%-40.*s] %3d%% %8.1f MiB", ggml_backend_buft_name(buft), pct * 40 / 100,
                        "########################################", pct, (double)w->x_bytes[k] / 1048576.0);
                if (w->x_bytes[k] == need) fputc('\n', stderr);
            }
            uintptr_t lo = ((uintptr_t)src->data + (uintptr_t)pg - 1) & ~((uintptr_t)pg - 1);
            uintptr_t hi = ((uintptr_t)src->data + n) & ~((uintptr_t)pg - 1);
            /* The mapping is a read-only MAP_SHARED of the file, so dropped pages are read back from it if
             * anything else touches them (a draft sharing output.weight): advice only, a failure costs RAM. */
            if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED);
        }
    }
    return 0;
}

size_t k3_weights_copied_bytes(const k3_weights *w) {
    size_t n = 0;
    for (int k = 0; k < K3_W_SLOTS; k++) n += w->x_bytes[k];
    return n;
}

int k3_weights_bind(k3_weights *w, const mf_model *m, const k3_hparams *hp, uint32_t a, uint32_t b, bool no_repack,
                    bool experts_outside, bool progress, rl_err *err) {
    memset(w, 0, sizeof *w);
    if (a >= b || b > hp->n_layer) return rl_errf(err, "bad layer range [%u, %u) for %u layers", a, b, hp->n_layer);
    w->a = a;
    w->b = b;
    wp_list_cpu(&w->place, !no_repack);
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
        w->n_bufs = s + 1;
        if (!m->splits[s].map) continue; /* a composed model's metadata (mf_compose): no tensor lives there */
        /* The mapping is page-aligned, which satisfies ggml's tensor alignment. */
        w->bufs[s] = ggml_backend_cpu_buffer_from_ptr(m->splits[s].map, m->splits[s].size);
        if (!w->bufs[s]) {
            k3_weights_free(w);
            return rl_errf(err, "cannot wrap the mapping of %s", m->splits[s].path);
        }
        /* Weights: ggml's scheduler runs an op where its weights live (the CPU for these), rather than copy
         * them to a device at every pass. */
        ggml_backend_buffer_set_usage(w->bufs[s], GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    }
    for (int i = 0; i < m->n_tensor; i++) { /* a manifest's view of a model (mf_compose) has sizes, not weights */
        if (!m->tensors[i].data && m->tensors[i].nbytes > 0) {
            k3_weights_free(w);
            return rl_errf(err, "tensor %s has no data here (only the model's manifest is on this machine)",
                           m->tensors[i].name);
        }
    }
    char n[96];
    const int K = (int)hp->n_expert_used;
#define T(field, fmt) (snprintf(n, sizeof n, fmt, il), L->field = k3_bind(w, m, n, k3_weight_use(n), K, dev))
    for (uint32_t il = a; il < b; il++) {
        k3_layer_w *L = &w->layers[il - a];
        int dev = k3_dev_of(hp, il);
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
        if (!experts_outside || !k3_experts_on_cpu(hp, il)) { /* the cache holds those in RAM (expert_cache.h) */
            const int dev_layer = dev;
            if (il < hp->dev_cpu_moe) dev = -1; /* --n-cpu-moe: this layer's routed experts stay on the CPU */
            T(gate_exps, "blk.%u.ffn_gate_exps.weight");
            T(up_exps, "blk.%u.ffn_up_exps.weight");
            T(down_exps, "blk.%u.ffn_down_exps.weight");
            dev = dev_layer;
        }
        T(gate_sh, "blk.%u.ffn_gate_shexp.weight");
        T(up_sh, "blk.%u.ffn_up_shexp.weight");
        T(down_sh, "blk.%u.ffn_down_shexp.weight");
    }
#undef T
    if (a == 0) w->tok_embd = k3_bind(w, m, "token_embd.weight", k3_weight_use("token_embd.weight"), K, -1);
    if (b == hp->n_layer) {
        const int dev = hp->n_dev > 0 && hp->dev_output ? hp->n_dev - 1 : -1;
        w->output = k3_bind(w, m, "output.weight", k3_weight_use("output.weight"), K, dev);
        w->output_norm = k3_bind(w, m, "output_norm.weight", k3_weight_use("output_norm.weight"), K, dev);
        w->output_res_score = k3_bind(w, m, "output_res_score.weight", k3_weight_use("output_res_score.weight"), K, dev);
    }
    if (k3_weights_copy(w, m, hp, progress, err) != 0) {
        k3_weights_free(w);
        return -1;
    }
    return 0;
}

void k3_weights_free(k3_weights *w) {
    if (w->ctx) ggml_free(w->ctx);
    for (int k = 0; k < K3_W_SLOTS; k++) {
        if (w->xbuf[k]) ggml_backend_buffer_free(w->xbuf[k]);
        if (w->xctx[k]) ggml_free(w->xctx[k]);
    }
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
    return total + k3_weights_copied_bytes(w); /* the copies were read from the file when made */
}
