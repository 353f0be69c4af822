#include "reap_write.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml.h"
#include "gguf.h"

#include "../gguf/gguf_write.h"

/* How a tensor is sliced: the axis that counts experts, or -1 (copied whole). */
static int reap_axis(const char *suffix) {
    if (strcmp(suffix, "ffn_gate_exps.weight") == 0 || strcmp(suffix, "ffn_up_exps.weight") == 0 ||
        strcmp(suffix, "ffn_down_exps.weight") == 0) {
        return 2;
    }
    if (strcmp(suffix, "ffn_gate_inp.weight") == 0) return 1;
    if (strcmp(suffix, "exp_probs_b.bias") == 0) return 0;
    return -1;
}

typedef struct reap_wt {
    const mf_tensor *src;
    const uint32_t *keep; /* NULL: copied whole */
    size_t slab;          /* bytes of one expert */
} reap_wt;

typedef struct reap_wctx {
    reap_wt *t;
    uint32_t n_keep;
} reap_wctx;

static int reap_write_data(void *ctx, int i, FILE *f, rl_err *err) {
    const reap_wctx *c = ctx;
    const reap_wt *w = &c->t[i];
    const unsigned char *src = w->src->data;
    if (!w->keep) {
        if (fwrite(src, 1, w->src->nbytes, f) != w->src->nbytes) return rl_errf(err, "write failed: %s", strerror(errno));
        return 0;
    }
    for (uint32_t k = 0; k < c->n_keep; k++) {
        if (fwrite(src + (size_t)w->keep[k] * w->slab, 1, w->slab, f) != w->slab) {
            return rl_errf(err, "write failed: %s", strerror(errno));
        }
    }
    return 0;
}

int reap_write(const mf_model *m, const k3_hparams *hp, const reap_plan *p, const reap_write_opts *o, rl_err *err) {
    if (p->n_expert != hp->n_expert) {
        return rl_errf(err, "the pruning plan is for %u experts, the model has %u", p->n_expert, hp->n_expert);
    }
    if (p->layer0 != hp->n_dense_lead || p->layer0 + p->n_layers != hp->n_layer) {
        return rl_errf(err, "the pruning plan covers MoE layers %u..%u, the model's are %u..%u", p->layer0,
                       p->layer0 + p->n_layers - 1, hp->n_dense_lead, hp->n_layer - 1);
    }
    gw_tensor *gt = calloc((size_t)m->n_tensor, sizeof *gt);
    reap_wt *wt = calloc((size_t)m->n_tensor, sizeof *wt);
    struct gguf_context *meta = gguf_init_empty();
    int rc = -1;
    if (!gt || !wt || !meta) {
        rl_errf(err, "out of memory");
        goto done;
    }
    uint32_t n_sliced = 0;
    for (int i = 0; i < m->n_tensor; i++) {
        const mf_tensor *t = &m->tensors[i];
        gt[i] = (gw_tensor){.name = t->name, .type = t->type, .n_dims = t->n_dims};
        memcpy(gt[i].ne, t->ne, sizeof gt[i].ne);
        wt[i].src = t;
        unsigned il;
        int off = 0;
        if (sscanf(t->name, "blk.%u.%n", &il, &off) != 1 || off == 0) continue;
        const int axis = reap_axis(t->name + off);
        if (axis < 0) continue;
        if (il < p->layer0 || il >= p->layer0 + p->n_layers) {
            rl_errf(err, "%s: an expert tensor in layer %u, which is not a MoE layer", t->name, il);
            goto done;
        }
        if (t->ne[axis] != (int64_t)hp->n_expert || axis != t->n_dims - 1) {
            rl_errf(err, "%s: %lld experts on axis %d, but expert_count is %u (a file sliced inconsistently)",
                    t->name, (long long)t->ne[axis], axis, hp->n_expert);
            goto done;
        }
        if (axis == 0 && ggml_blck_size((enum ggml_type)t->type) != 1) {
            rl_errf(err, "%s: a %s vector cannot be sliced per expert", t->name, ggml_type_name((enum ggml_type)t->type));
            goto done;
        }
        wt[i].slab = t->nbytes / hp->n_expert;
        wt[i].keep = p->keep + (size_t)(il - p->layer0) * p->n_keep;
        gt[i].ne[axis] = p->n_keep;
        n_sliced++;
    }
    /* Four sliced tensors per MoE layer at least (router, three expert tensors; the bias is K3's too). */
    if (n_sliced < 4 * p->n_layers) {
        rl_errf(err, "only %u expert tensors found for %u MoE layers", n_sliced, p->n_layers);
        goto done;
    }
    if (o->check_only) {
        rc = 0;
        goto done;
    }
    gguf_set_kv(meta, m->meta);
    char key[96];
    snprintf(key, sizeof key, "%s.expert_count", K3_ARCH);
    gguf_set_val_u32(meta, key, p->n_keep);
    /* Provenance (llama.cpp ignores keys it does not know). */
    gguf_set_val_u32(meta, "ringlm.reap.expert_count_original", p->n_expert);
    /* Which experts each MoE layer kept, [layer][kept] by original id: a pruned file says what it is. */
    gguf_set_arr_data(meta, "ringlm.reap.kept_experts", GGUF_TYPE_UINT32, p->keep, (size_t)p->n_layers * p->n_keep);
    reap_wctx wc = {wt, p->n_keep};
    gw_opts go = {.out = o->out, .n_split = o->n_split > 0 ? o->n_split : m->n_split,
                  .progress = o->progress ? "reap write" : NULL};
    rc = gw_write(meta, gt, m->n_tensor, &go, reap_write_data, &wc, err);
done:
    if (meta) gguf_free(meta);
    free(gt);
    free(wt);
    return rc;
}
