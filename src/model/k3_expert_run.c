/* k3_expert_run.c - the routed experts of a MoE layer through the expert cache (--mem, expert_cache.h): the
 * graph's passes over the cache's slots, and the compute that stops before each pass so that the host reads
 * what the router chose and makes those experts resident. The logits are the same bits as with every weight
 * resident. */
#include "k3_forward_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-backend.h"
#include "ggml.h"

#include "expert_cache.h"

/* How many layers ahead the look-ahead guesses (k3_moe_cached). One: on the medium bench model two layers
 * ahead guessed 39% right instead of ~75%, read 119 MiB per token instead of 77 and decoded 6.3 tok/s
 * instead of 8.2 (bench_experts.sh's setup). */
#define K3_XC_AHEAD 1

/* Where the compute of a graph over cached experts stops (k3_xc_compute): before each pass of a MoE layer's
 * experts, so that the host reads what the router chose and puts those experts in slots. */
typedef struct k3_xstop {
    int node;                /* the pass's first node */
    uint32_t il;
    int pass, n_pass;        /* this pass of the n_pass the graph has for the layer */
    struct ggml_tensor *sel; /* pass 0: the chosen experts [K, T] (a copy kept as an output) */
    struct ggml_tensor *ahead[K3_XC_AHEAD]; /* pass 0: the next layers' choice from this layer's input
                                             * (look-ahead), or NULL */
    struct ggml_tensor *ids; /* the pass's slot ids [K, T], or [1, N] with several passes (input) */
    struct ggml_tensor *tok; /* several passes: [N] the token each of the pass's rows reads (input) */
    struct ggml_tensor *pick;/* pass 0 of several: [K*T] which pass's output row each row takes (input) */
    /* The ops reading tok and pick (get_rows). The host writes those inputs at the stop, while the compute
     * runs: the ops must run on the CPU, which reads them where they are written. On a device they would
     * read the copy the scheduler made when their split began, which may be before the stop. */
    struct ggml_tensor *gather, *merge;
} k3_xstop;

/* Sizes g->stops for the most passes the range's MoE layers can need for the batch (xc_max_passes) and
 * returns how many graph nodes the passes add, at most; g->stops stays NULL when out of memory. */
size_t k3_xc_stops_new(k3_graph *g) {
    const int64_t rows = (int64_t)g->hp->n_expert_used * g->T;
    for (uint32_t il = g->a; il < g->b; il++) g->cap_stops += k3_is_moe(g->hp, il) ? xc_max_passes(g->xc, il, rows) : 0;
    g->stops = calloc((size_t)g->cap_stops + 1, sizeof *g->stops);
    return (size_t)g->cap_stops * 12 + (size_t)(g->b - g->a) * 16;
}

/* The routed experts over the cache's slots (expert_cache.h): the same three ggml_mul_mat_id, on the slot
 * tensors with slot ids. When one pass may not hold the batch's experts, the graph has several, each over
 * N = K*T one-expert rows (the token each row reads, gathered, and one slot id per row: the rows of the
 * pass's experts, then padding), and each row's output is taken back from the pass that computed it
 * (get_rows copies, exactly). What the compute needs at its stops is recorded in g->stops. */
struct ggml_tensor *k3_moe_cached(k3_graph *g, struct ggml_tensor *xn, struct ggml_tensor *sel, struct ggml_tensor *xl) {
    struct ggml_context *c = g->ctx;
    const k3_hparams *hp = g->hp;
    const uint32_t il = g->a + (uint32_t)g->rel;
    const int64_t K = hp->n_expert_used, T = g->T, dl = xl->ne[0], N = K * T;
    const int n_pass = xc_max_passes(g->xc, il, N);
    struct ggml_tensor *selc = ggml_cont(c, sel); /* read back at the stop: a view's memory is the argsort's */
    ggml_set_output(selc);
    ggml_build_forward_expand(g->gf, selc);
    struct ggml_tensor *ahead[K3_XC_AHEAD] = {0};
    for (uint32_t d = 1; d <= K3_XC_AHEAD; d++) {
        if (il + d >= g->b || !xc_max_passes(g->xc, il + d, 1)) break; /* not a layer of the cache's */
        /* Look-ahead: the next layer's router on this layer's input, an estimate of its choice (only read):
         * its reads are queued while this one computes. */
        const k3_layer_w *nx = &g->w->layers[il + d - g->a];
        struct ggml_tensor *pr = ggml_add(c, ggml_sigmoid(c, k3_mm(g, nx->gate_inp, xn)), nx->probs_b);
        ahead[d - 1] = ggml_cont(c, ggml_argsort_top_k(c, pr, (int)K));
        ggml_set_output(ahead[d - 1]);
        ggml_build_forward_expand(g->gf, ahead[d - 1]);
    }
    /* The passes are not put into the graph here: the final expansion places them where a run without the
     * cache has its expert ops, so the graph's order is that run's (a device fuses neighbouring ops, and a
     * different order fuses differently: last bits). k3_stops_locate finds where each pass begins. */
    struct ggml_tensor *merged = NULL, *xr = ggml_reshape_2d(c, xl, dl, T);
    for (int p = 0; p < n_pass; p++) {
        const int k = g->n_stops++;
        k3_xstop *st = &g->stops[k];
        struct ggml_tensor *x = xl, *ids;
        if (n_pass == 1) {
            ids = ggml_new_tensor_2d(c, GGML_TYPE_I32, K, T);
        } else {
            st->tok = ggml_new_tensor_1d(c, GGML_TYPE_I32, N);
            ggml_set_input(st->tok);
            ggml_format_name(st->tok, "xc.stop%d", k);
            ids = ggml_new_tensor_2d(c, GGML_TYPE_I32, 1, N);
            st->gather = ggml_get_rows(c, xr, st->tok);
            x = ggml_reshape_3d(c, st->gather, dl, 1, N);
        }
        ggml_set_input(ids);
        ggml_format_name(ids, "xc.stop%d", k);
        struct ggml_tensor *up = ggml_mul_mat_id(c, xc_tensor(g->xc, il, 1), x, ids);   /* [Fe, K, T] or [Fe, 1, N] */
        struct ggml_tensor *gate = ggml_mul_mat_id(c, xc_tensor(g->xc, il, 0), x, ids);
        struct ggml_tensor *ex = ggml_mul_mat_id(c, xc_tensor(g->xc, il, 2), k3_situ(g, gate, up), ids);
        st->il = il, st->pass = p, st->n_pass = n_pass, st->ids = ids;
        if (p == 0) {
            st->sel = selc;
            memcpy(st->ahead, ahead, sizeof ahead);
        }
        if (n_pass == 1) return ex;
        struct ggml_tensor *rows = ggml_reshape_2d(c, ex, dl, N);
        merged = merged ? ggml_concat(c, merged, rows, 1) : rows;
    }
    struct ggml_tensor *pick = ggml_new_tensor_1d(c, GGML_TYPE_I32, N);
    ggml_set_input(pick);
    g->stops[g->n_stops - n_pass].pick = pick;
    struct ggml_tensor *out = ggml_get_rows(c, merged, pick);
    g->stops[g->n_stops - n_pass].merge = out;
    return ggml_reshape_3d(c, out, dl, K, T);
}

/* Where each pass of cached experts begins in the finished graph: its first node reading the pass's slot ids
 * or token rows (named "xc.stopK"). The compute stops before it (k3_xc_eval), so the passes must come in the
 * order of g->stops, each after every node of the one before: a pass's reads may evict the slots the pass
 * before it uses. The graph's depth-first order gives that (a layer needs the one before it, and a pass's
 * rows are merged after the pass before); it is checked, not assumed. */
int k3_stops_locate(k3_graph *g, rl_err *err) {
    int cur = -1;
    for (int i = 0; i < ggml_graph_n_nodes(g->gf); i++) {
        const struct ggml_tensor *t = ggml_graph_node(g->gf, i);
        const struct ggml_tensor *in = t->op == GGML_OP_MUL_MAT_ID ? t->src[2] : t->op == GGML_OP_GET_ROWS ? t->src[1] : NULL;
        int k = -1;
        if (!in || sscanf(ggml_get_name(in), "xc.stop%d", &k) != 1 || k == cur) continue;
        if (k != cur + 1 || k >= g->n_stops || i == 0) {
            return rl_errf(err, "expert pass %d of the graph comes out of order (at node %d, after pass %d)", k, i, cur);
        }
        g->stops[k].node = i;
        cur = k;
    }
    if (cur != g->n_stops - 1) return rl_errf(err, "expert pass %d is not in the graph", cur + 1);
    return 0;
}

/* Puts on the CPU the ops that read what the host writes at the cached experts' stops (k3_xstop). */
void k3_sched_pin_stops(k3_engine *e, const k3_graph *g) {
    for (int i = 0; i < g->n_stops; i++) {
        if (g->stops[i].gather) ggml_backend_sched_set_tensor_backend(e->sched, g->stops[i].gather, e->backend);
        if (g->stops[i].merge) ggml_backend_sched_set_tensor_backend(e->sched, g->stops[i].merge, e->backend);
    }
}

/* A compute over cached experts, as the scheduler's evaluation callback sees it (k3_xc_eval). */
typedef struct k3_xrun {
    k3_graph *g;
    int next;          /* the next stop */
    int rows;
    int32_t *ids, *slots, *tok;
    xc_plan plan;
    int rc;
    rl_err *err;
} k3_xrun;

/* The scheduler computes the graph up to a node this asks for, then calls back with it: the node before
 * each pass of a MoE layer's experts. There the host reads what the router chose (first pass), plans the
 * passes, makes this pass's experts resident and writes their slot ids (a pass the batch does not need is all
 * padding: computed, never picked); before the layer's last pass computes, the look-ahead's
 * guess for the next layer starts reading, so the reads overlap it. Returning false stops the compute. */
static bool k3_xc_eval(struct ggml_tensor *t, bool ask, void *user) {
    k3_xrun *x = user;
    k3_graph *g = x->g;
    if (x->next >= g->n_stops || t != ggml_graph_node(g->gf, g->stops[x->next].node - 1)) return false;
    if (ask) return true;
    const k3_xstop *st = &g->stops[x->next];
    const k3_xstop *s0 = st - st->pass;
    x->next++;
    if (st->pass == 0) {
        ggml_backend_tensor_get(st->sel, x->ids, 0, (size_t)x->rows * sizeof *x->ids);
        if ((x->rc = xc_plan_layer(g->xc, st->il, x->ids, x->rows, &x->plan, x->err)) != 0) return false;
        if (x->plan.n_groups > st->n_pass) { /* xc_max_passes bounds it: cannot happen */
            x->rc = rl_errf(x->err, "layer %u needs %d passes, the graph has %d", st->il, x->plan.n_groups, st->n_pass);
            return false;
        }
        if (st->pick) {
            /* Row r's output: in its pass's block, at its place among that pass's rows (in row order). */
            int *at = calloc((size_t)st->n_pass, sizeof *at);
            if (!at) {
                x->rc = rl_errf(x->err, "out of memory for expert ids");
                return false;
            }
            for (int r = 0; r < x->rows; r++) {
                const int gr = x->plan.group_of[r];
                x->slots[r] = gr * x->rows + at[gr]++;
            }
            free(at);
            ggml_backend_tensor_set(st->pick, x->slots, 0, (size_t)x->rows * sizeof *x->slots);
        }
    }
    const int N = x->rows;
    int n_in = 0;
    if (st->pass < x->plan.n_groups) {
        if ((x->rc = xc_load_pass(g->xc, st->il, &x->plan, st->pass, x->slots, x->err)) != 0) return false;
        for (int d = 0; st->pass == x->plan.n_groups - 1 && d < K3_XC_AHEAD && s0->ahead[d]; d++) {
            ggml_backend_tensor_get(s0->ahead[d], x->ids, 0, (size_t)N * sizeof *x->ids);
            xc_prefetch(g->xc, st->il + 1 + (uint32_t)d, x->ids, N);
        }
    } else {
        for (int r = 0; r < N; r++) x->slots[r] = -1; /* a pass the batch does not need: all padding */
    }
    if (!st->tok) {
        ggml_backend_tensor_set(st->ids, x->slots, 0, (size_t)N * sizeof *x->slots); /* one pass: every row */
    } else {
        /* The pass's rows first, in row order (their place in the pass is what pick names), then padding
         * rows reading token 0 through slot 0. */
        const int K = (int)g->hp->n_expert_used;
        for (int r = 0; r < N; r++) {
            if (x->slots[r] < 0) continue;
            x->tok[n_in] = r / K;
            x->ids[n_in++] = x->slots[r];
        }
        for (int i = n_in; i < N; i++) x->tok[i] = 0, x->ids[i] = 0;
        ggml_backend_tensor_set(st->tok, x->tok, 0, (size_t)N * sizeof *x->tok);
        ggml_backend_tensor_set(st->ids, x->ids, 0, (size_t)N * sizeof *x->ids);
    }
    if (st->pass == st->n_pass - 1) xc_plan_free(&x->plan);
    return true;
}

/* Runs a graph over cached experts through the scheduler, which stops where k3_xc_eval asks. A read that
 * fails stops the compute: the sequences' states are then partly advanced, as after a failed compute. */
int k3_xc_compute(k3_engine *e, k3_graph *g, rl_err *err) {
    k3_xrun x = {.g = g, .rows = (int)(g->hp->n_expert_used * g->T), .err = err};
    x.ids = malloc((size_t)x.rows * sizeof *x.ids);
    x.slots = malloc((size_t)x.rows * sizeof *x.slots);
    x.tok = malloc((size_t)x.rows * sizeof *x.tok);
    if (!x.ids || !x.slots || !x.tok) x.rc = rl_errf(err, "out of memory for expert ids");
    if (x.rc == 0) {
        ggml_backend_sched_set_eval_callback(e->sched, k3_xc_eval, &x);
        enum ggml_status st = ggml_backend_sched_graph_compute(e->sched, g->gf);
        ggml_backend_sched_set_eval_callback(e->sched, NULL, NULL);
        if (x.rc == 0 && st != GGML_STATUS_SUCCESS) x.rc = rl_errf(err, "ggml graph compute failed");
        if (x.rc == 0 && x.next != g->n_stops) x.rc = rl_errf(err, "the compute stopped at %d of %d expert passes", x.next, g->n_stops);
    }
    xc_plan_free(&x.plan);
    free(x.ids);
    free(x.slots);
    free(x.tok);
    return x.rc;
}
