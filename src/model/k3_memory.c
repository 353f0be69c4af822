#include "k3_memory.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

size_t k3_dev_room(size_t free) {
    const size_t headroom = free / 10 + ((size_t)256 << 20);
    return free > headroom ? free - headroom : 0;
}

void k3_dev_split(uint32_t a, uint32_t n, const size_t *room, int nd, uint32_t *end) {
    double total = 0, acc = 0;
    for (int d = 0; d < nd; d++) total += (double)room[d];
    for (int d = 0; d < nd; d++) {
        acc += (double)room[d];
        end[d] = d == nd - 1 ? a + n : a + (uint32_t)floor((double)n * (total > 0 ? acc / total : (double)(d + 1) / nd) + 0.5);
    }
}

size_t k3_layer_weight_bytes(const mf_model *m, uint32_t il) {
    char prefix[32];
    int n = snprintf(prefix, sizeof prefix, "blk.%u.", il);
    size_t bytes = 0;
    for (int i = 0; i < m->n_tensor; i++) {
        if (strncmp(m->tensors[i].name, prefix, (size_t)n) == 0) bytes += m->tensors[i].nbytes;
    }
    return bytes;
}

static size_t k3_named_bytes(const mf_model *m, const char *name) {
    const mf_tensor *t = mf_find(m, name);
    return t ? t->nbytes : 0;
}

size_t k3_range_weight_bytes(const mf_model *m, const k3_hparams *hp, uint32_t a, uint32_t b) {
    size_t bytes = 0;
    for (uint32_t il = a; il < b && il < hp->n_layer; il++) bytes += k3_layer_weight_bytes(m, il);
    if (a == 0) bytes += k3_named_bytes(m, "token_embd.weight");
    if (b >= hp->n_layer) {
        bytes += k3_named_bytes(m, "output.weight") + k3_named_bytes(m, "output_norm.weight") +
                 k3_named_bytes(m, "output_res_score.weight");
    }
    return bytes;
}

size_t k3_range_expert_bytes(const mf_model *m, const k3_hparams *hp, uint32_t a, uint32_t b) {
    static const char *const exps[3] = {"ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"};
    size_t bytes = 0;
    char name[96];
    for (uint32_t il = a; il < b && il < hp->n_layer; il++) {
        for (int k = 0; k < 3; k++) {
            snprintf(name, sizeof name, "blk.%u.%s", il, exps[k]);
            bytes += k3_named_bytes(m, name);
        }
    }
    return bytes;
}

void k3_range_ram_bytes(const mf_model *m, const k3_hparams *hp, uint32_t a, uint32_t b, size_t *dense,
                        size_t *experts) {
    *dense = *experts = 0;
    for (uint32_t il = a; il < b && il < hp->n_layer; il++) {
        const size_t ex = k3_range_expert_bytes(m, hp, il, il + 1);
        if (!k3_on_dev(hp, il)) *dense += k3_layer_weight_bytes(m, il) - ex;
        if (k3_experts_on_cpu(hp, il)) *experts += ex;
    }
    if (a == 0) *dense += k3_named_bytes(m, "token_embd.weight");
    if (b >= hp->n_layer && !(hp->n_dev > 0 && hp->dev_output)) {
        *dense += k3_named_bytes(m, "output.weight") + k3_named_bytes(m, "output_norm.weight") +
                  k3_named_bytes(m, "output_res_score.weight");
    }
}

size_t k3_range_kda_state_bytes(const k3_hparams *hp, uint32_t a, uint32_t b) {
    const size_t di = k3_d_inner(hp), dk = hp->kda_head_dim;
    const size_t conv = 3 * (size_t)(hp->conv_kernel - 1) * di * sizeof(float);
    const size_t delta = (size_t)hp->n_head * dk * dk * sizeof(float);
    size_t bytes = 0;
    for (uint32_t il = a; il < b && il < hp->n_layer; il++) {
        if (!hp->is_mla[il]) bytes += conv + delta;
    }
    return bytes;
}

size_t k3_range_rollback_bytes(const k3_hparams *hp, uint32_t a, uint32_t b, uint32_t block, int n_blocks) {
    if (block == 0 || n_blocks < 1) return 0;
    const size_t di = k3_d_inner(hp), dk = hp->kda_head_dim;
    const size_t conv = 3 * ((size_t)(hp->conv_kernel - 1) + block) * di * sizeof(float);
    const size_t delta = (size_t)block * hp->n_head * dk * dk * sizeof(float);
    size_t bytes = 0;
    for (uint32_t il = a; il < b && il < hp->n_layer; il++) {
        if (!hp->is_mla[il]) bytes += conv + delta;
    }
    return (size_t)(n_blocks + 1) * bytes;
}

size_t k3_range_mla_bytes_per_token(const k3_hparams *hp, uint32_t a, uint32_t b, size_t elem_size) {
    size_t per_layer = (size_t)(hp->kv_lora_rank + hp->rope_dim) * elem_size, bytes = 0;
    for (uint32_t il = a; il < b && il < hp->n_layer; il++) {
        if (hp->is_mla[il]) bytes += per_layer;
    }
    return bytes;
}

size_t k3_boundary_floats(const k3_hparams *hp, uint32_t il) {
    return (size_t)hp->n_embd * (1 + k3_n_banked_before(hp, il));
}

size_t k3_range_compute_bytes(const k3_hparams *hp, uint32_t a, uint32_t b, uint32_t n_ctx, uint32_t chunk) {
    bool mla = false;
    for (uint32_t il = a; il < b && il < hp->n_layer; il++) mla |= hp->is_mla[il];
    const size_t mask = mla ? (size_t)n_ctx * chunk * 2 : 0;
    return mask + (size_t)chunk * 14 * hp->n_embd * sizeof(float);
}

size_t k3_range_state_bytes(const k3_hparams *hp, uint32_t a, uint32_t b, uint32_t n_seq, uint32_t n_ctx,
                            size_t cache_elem) {
    return (size_t)n_seq * (k3_range_kda_state_bytes(hp, a, b) + (size_t)n_ctx * k3_range_mla_bytes_per_token(hp, a, b, cache_elem));
}

size_t k3_range_active_bytes(const mf_model *m, const k3_hparams *hp, uint32_t a, uint32_t b) {
    size_t bytes = 0;
    char prefix[32];
    for (int i = 0; i < m->n_tensor; i++) {
        const mf_tensor *t = &m->tensors[i];
        unsigned il;
        bool in_range = false;
        if (sscanf(t->name, "blk.%u.", &il) == 1) {
            snprintf(prefix, sizeof prefix, "blk.%u.", il);
            in_range = il >= a && il < b && strncmp(t->name, prefix, strlen(prefix)) == 0;
        } else if (strcmp(t->name, "token_embd.weight") == 0) {
            if (a == 0) bytes += t->nbytes / (size_t)(t->ne[1] ? t->ne[1] : 1); /* one row */
            continue;
        } else {
            in_range = b >= hp->n_layer; /* output tensors */
        }
        if (!in_range) continue;
        if (strstr(t->name, "_exps.") && hp->n_expert) {
            bytes += (size_t)((double)t->nbytes * hp->n_expert_used / hp->n_expert);
        } else {
            bytes += t->nbytes;
        }
    }
    return bytes;
}
