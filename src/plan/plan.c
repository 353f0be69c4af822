/* plan.c - the layer cut: an exact dynamic program over (nodes considered, layers covered).
 *
 * A plan is a sequence of stages on strictly increasing node indices, each stage a non-empty contiguous
 * layer range, together covering [0, n_layer). Its cost is the slowest stage (that bounds the ring's
 * tokens per second once it is pipelined); ties go to fewer stages (one hop less per token), then to
 * memory spread evenly over the nodes.
 *
 * The order of preference is lexicographic, and a lexicographic (max, count, ...) does not decompose:
 * a prefix with a smaller max but more stages can lose once a later, slower stage hides that max. So the
 * plan is made in three passes, each of which does decompose (its value combines monotonically):
 *   1. minimize the max stage time                                            -> T*
 *   2. only stages with time <= T*: minimize (stages, max memory share)       -> S*, M*
 *   3. only stages with time <= T* and share <= M*: minimize (stages, -min memory share)
 * Pass 3 still finds S* stages (pass 2's plan is admissible there and pass 3 cannot do better), so its
 * plan is optimal for the whole order. Every stage metric is computed by the same function in every
 * pass, so comparing with T* and M* is exact in floating point. */
#include "plan.h"

#include "../model/k3_memory.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define KIB 1024.0
#define MIB (1024.0 * 1024.0)
#define GIB (1024.0 * 1024.0 * 1024.0)

/* Everything a stage's cost needs, with prefix sums so a stage costs O(1). The totals are checked for
 * 64-bit overflow up front, so no difference of prefix sums (and no stage total) can wrap. */
typedef struct cost_ctx {
    const plan_model *m;
    const plan_node *nodes;
    int n_nodes;
    uint32_t n;
    double headroom;
    uint64_t pre_raw[PLAN_MAX_LAYERS + 1];    /* weights + n_seq * state of layers [0, i) */
    uint64_t pre_active[PLAN_MAX_LAYERS + 1]; /* bytes read per token in layers [0, i) */
    uint64_t *pre_lack;                       /* per node (n + 1 each): bytes it lacks of layers [0, i); NULL: none */
    uint64_t pre_exps[PLAN_MAX_LAYERS + 1];   /* routed expert bytes of layers [0, i) */
    uint64_t pre_exps_active[PLAN_MAX_LAYERS + 1]; /* of pre_active, the routed experts' */
    uint64_t pre_host[PLAN_MAX_LAYERS + 1];   /* of pre_raw, n_seq * the state held in host memory */
} cost_ctx;

/* Memory a stage with `raw` bytes needs once headroom is added, rounded up to a byte (saturating).
 * headroom arrives as a double and 0.1 is not exact in binary: 10 GiB * 0.1 comes out a hair above 1 GiB,
 * and a plain ceil would add a byte, so ten 1 GiB layers would not fit an 11 GiB node at 10%. A product
 * within 1e-12 (relative) of a whole number counts as that number. */
static uint64_t need_of(uint64_t raw, double headroom) {
    long double x = (long double)raw * (long double)headroom, whole = roundl(x);
    if (fabsl(x - whole) <= x * 1e-12L) x = whole;
    long double extra = ceill(x);
    if ((long double)raw + extra >= 18446744073709551615.0L) return UINT64_MAX;
    return raw + (uint64_t)extra;
}

static uint64_t stage_raw(const cost_ctx *c, uint32_t a, uint32_t b) {
    uint64_t raw = c->pre_raw[b] - c->pre_raw[a];
    if (a == 0) raw += c->m->first_bytes;
    if (b == c->n) raw += c->m->last_bytes;
    return raw;
}

static double stage_time(const cost_ctx *c, int node, uint32_t a, uint32_t b) {
    uint64_t active = c->pre_active[b] - c->pre_active[a];
    if (b == c->n) active += c->m->last_active;
    return (double)active / c->nodes[node].speed;
}

static uint64_t stage_lack(const cost_ctx *c, int node, uint32_t a, uint32_t b) {
    const uint64_t *l = c->nodes[node].lack;
    if (!l || !c->pre_lack) return 0;
    const uint64_t *pre = c->pre_lack + (size_t)node * (c->n + 1);
    return pre[b] - pre[a] + (a == 0 ? l[c->n] : 0) + (b == c->n ? l[c->n + 1] : 0);
}

/* One way of splitting a stage between a device and RAM (stage_eval_tiers): the device holds layers
 * [a, a + g) less the routed experts of [a, a + n) (n <= g), and the output head when g covers the stage and
 * it is the last; RAM the rest and the embedding. Fills the stage if both tiers fit and it beats what it
 * holds (a tie keeps what it holds). On a node with a disk speed the RAM tier may hold less than its part: its
 * dense weights and the least expert cache must fit, its routed experts are cached in what is left and the
 * misses read from disk, as on a node of one tier (VRAM -> RAM -> disk). */
static void tier_try(const cost_ctx *c, const plan_node *nd, uint32_t a, uint32_t b, uint32_t g, uint32_t n,
                     plan_stage *s, int *have) {
    const bool head = b == c->n, head_dev = head && a + g == b;
    const uint64_t x_ram = c->pre_exps[a + n] - c->pre_exps[a];
    const uint64_t host_dev = c->pre_host[a + g] - c->pre_host[a]; /* the device layers' state kept in RAM */
    const uint64_t dev_raw = c->pre_raw[a + g] - c->pre_raw[a] - x_ram - host_dev + (head_dev ? c->m->last_bytes : 0);
    const uint64_t ram_raw = c->pre_raw[b] - c->pre_raw[a + g] + x_ram + host_dev + (a == 0 ? c->m->first_bytes : 0) +
                             (head && !head_dev ? c->m->last_bytes : 0);
    const uint64_t dev = need_of(dev_raw, c->headroom);
    uint64_t ram = need_of(ram_raw, c->headroom);
    if (dev > nd->mem_bytes) return;
    const uint64_t xa_ram = c->pre_exps_active[a + n] - c->pre_exps_active[a];
    double cached = 1.0, disk_t = 0;
    if (ram > nd->ram_bytes) {
        const uint64_t ram_x = x_ram + c->pre_exps[b] - c->pre_exps[a + g]; /* the routed experts in RAM */
        if (!(nd->disk_bps > 0) || ram_x == 0) return;
        const uint64_t dense = need_of(ram_raw - ram_x, c->headroom);
        if (dense >= nd->ram_bytes || nd->ram_bytes - dense < c->m->expert_min) return;
        cached = fmin(1.0, (double)(nd->ram_bytes - dense) / (double)ram_x); /* (1: only headroom overflowed) */
        disk_t = (double)(xa_ram + c->pre_exps_active[b] - c->pre_exps_active[a + g]) * (1.0 - cached) / nd->disk_bps;
        ram = nd->ram_bytes;
    }
    const uint64_t head_act = head ? c->m->last_active : 0;
    const uint64_t act_dev = c->pre_active[a + g] - c->pre_active[a] - xa_ram + (head_dev ? head_act : 0);
    const uint64_t act_ram = c->pre_active[b] - c->pre_active[a + g] + xa_ram + (head_dev ? 0 : head_act);
    const double t = (double)act_dev / nd->speed + (double)act_ram / nd->ram_speed + disk_t;
    if (*have && !(t < s->time)) return;
    *have = 1;
    s->time = t;
    s->dev_layers = g;
    s->cpu_moe = n;
    s->dev_bytes = dev;
    s->mem_bytes = dev + ram;
    s->cached = cached;
    s->disk_time = disk_t;
}

/* A stage on a node with two tiers (plan.h). Both searches are binary: the device's part only shrinks as
 * n grows and only grows with g. */
static int stage_eval_tiers(const cost_ctx *c, const plan_node *nd, uint32_t a, uint32_t b, plan_stage *s) {
    const uint32_t len = b - a;
    const bool head = b == c->n;
    int have = 0;
    /* the least n (experts of the first n layers in RAM) that lets the rest fit the device */
    uint32_t lo = 0, hi = len + 1;
    while (lo < hi) {
        const uint32_t n = lo + (hi - lo) / 2;
        const uint64_t x_ram = c->pre_exps[a + n] - c->pre_exps[a];
        const uint64_t dev_raw = c->pre_raw[b] - c->pre_raw[a] - x_ram - (c->pre_host[b] - c->pre_host[a]) +
                                 (head ? c->m->last_bytes : 0);
        if (need_of(dev_raw, c->headroom) <= nd->mem_bytes) hi = n;
        else lo = n + 1;
    }
    if (lo <= len) tier_try(c, nd, a, b, len, lo, s, &have);
    /* the most layers that fit the device whole, short of the whole stage (that is n = 0 above) */
    lo = 0, hi = len - 1;
    while (lo < hi) {
        const uint32_t g = hi - (hi - lo) / 2;
        if (need_of(c->pre_raw[a + g] - c->pre_raw[a] - (c->pre_host[a + g] - c->pre_host[a]), c->headroom) <= nd->mem_bytes) lo = g;
        else hi = g - 1;
    }
    tier_try(c, nd, a, b, lo, 0, s, &have);
    if (nd->ram_speed > nd->speed) tier_try(c, nd, a, b, 0, 0, s, &have);
    return have;
}

/* Fills a stage for layers [a, b) on `node`; returns whether it fits the node's memory, whole or (on a node
 * with a disk speed) with its routed experts through a cache. Memory and time only grow with the stage, as
 * dp_run's early stop needs: more layers add dense bytes and experts to the same cache. On a node with two
 * tiers the stage splits between them (stage_eval_tiers), and dp_run tries every start instead. */
static int stage_eval(const cost_ctx *c, int node, uint32_t a, uint32_t b, plan_stage *s) {
    const plan_node *nd = &c->nodes[node];
    memset(s, 0, sizeof *s);
    s->node = node;
    s->a = a;
    s->b = b;
    s->lack_bytes = stage_lack(c, node, a, b);
    s->cached = 1.0;
    if (nd->ram_bytes > 0) return stage_eval_tiers(c, nd, a, b, s);
    s->mem_bytes = need_of(stage_raw(c, a, b), c->headroom);
    s->time = stage_time(c, node, a, b);
    if (s->mem_bytes <= nd->mem_bytes) return 1;
    const uint64_t exps = c->pre_exps[b] - c->pre_exps[a];
    if (!(nd->disk_bps > 0) || exps == 0) return 0;
    const uint64_t dense = need_of(stage_raw(c, a, b) - exps, c->headroom);
    if (dense >= nd->mem_bytes || nd->mem_bytes - dense < c->m->expert_min) return 0;
    s->cached = fmin(1.0, (double)(nd->mem_bytes - dense) / (double)exps); /* (1: only headroom overflowed) */
    const double active = (double)(c->pre_exps_active[b] - c->pre_exps_active[a]);
    s->disk_time = active * (1.0 - s->cached) / nd->disk_bps;
    s->time += s->disk_time;
    s->mem_bytes = nd->mem_bytes;
    return 1;
}

/* Share of the node's memory the stage uses; only called for stages that fit, so mem_bytes > 0 or the
 * need is 0 too (a node with no memory can only hold a stage that needs nothing). */
static double stage_share(const cost_ctx *c, const plan_stage *s) {
    const plan_node *nd = &c->nodes[s->node];
    uint64_t mem = nd->mem_bytes + nd->ram_bytes < nd->mem_bytes ? UINT64_MAX : nd->mem_bytes + nd->ram_bytes;
    return mem ? (double)s->mem_bytes / (double)mem : 0.0;
}

enum dp_metric { DP_TIME, DP_SHARE, DP_NEG_SHARE };

typedef struct dp_spec {
    int count_stages;      /* compare the stage count before the metric */
    enum dp_metric metric; /* minimized as the max over the stages */
    double max_time;       /* only stages this fast (INFINITY: no limit) */
    double max_share;      /* only stages using at most this share of their node (INFINITY: no limit) */
} dp_spec;

/* Best plan covering layers [0, k) with nodes [0, j). from: the first layer of the last stage, which then
 * runs on node j-1; DP_SKIP: node j-1 is not used; DP_NONE: no plan. */
#define DP_SKIP (-1)
#define DP_NONE (-2)
typedef struct dp_cell {
    uint64_t lack; /* bytes streamed: compared first, a sum (so every pass still decomposes) */
    int stages;
    int from;
    double v;
} dp_cell;

static int dp_better(const dp_spec *sp, uint64_t l1, int s1, double v1, uint64_t l2, int s2, double v2) {
    if (l1 != l2) return l1 < l2;
    if (sp->count_stages && s1 != s2) return s1 < s2;
    return v1 < v2;
}

/* t has (n_nodes + 1) * (n + 1) cells. O(n_nodes * n^2) stage evaluations at most; the inner loop stops
 * as soon as a longer stage stops fitting, since memory and time only grow as the stage grows. */
static void dp_run(const cost_ctx *c, const dp_spec *sp, dp_cell *t) {
    const uint32_t w = c->n + 1;
    for (uint32_t k = 0; k <= c->n; k++) t[k] = (dp_cell){0, 0, k == 0 ? DP_SKIP : DP_NONE, -INFINITY};
    for (int j = 1; j <= c->n_nodes; j++) {
        const int node = j - 1;
        const dp_cell *prev = t + (size_t)(j - 1) * w;
        dp_cell *row = t + (size_t)j * w;
        for (uint32_t k = 0; k <= c->n; k++) {
            /* leaving the node out comes first, so a tie keeps the node free */
            dp_cell best = prev[k];
            if (best.from != DP_NONE) best.from = DP_SKIP;
            /* A node with two tiers moves a stage's parts between them as it grows: its memory and time need
             * not grow in step, so every start is tried. */
            const bool exhaustive = c->nodes[node].ram_bytes > 0;
            for (uint32_t a = k; a-- > 0;) {
                plan_stage s;
                if (!stage_eval(c, node, a, k, &s) || s.time > sp->max_time) {
                    if (exhaustive) continue;
                    break;
                }
                const double share = stage_share(c, &s);
                if (share > sp->max_share) {
                    if (exhaustive) continue;
                    break;
                }
                if (prev[a].from == DP_NONE) continue;
                const double mv = sp->metric == DP_TIME ? s.time : sp->metric == DP_SHARE ? share : -share;
                const int cs = prev[a].stages + 1;
                const double cv = prev[a].v > mv ? prev[a].v : mv;
                const uint64_t cl = prev[a].lack + s.lack_bytes;
                if (best.from == DP_NONE || dp_better(sp, cl, cs, cv, best.lack, best.stages, best.v))
                    best = (dp_cell){cl, cs, (int)a, cv};
            }
            row[k] = best;
        }
    }
}

/* "9.1 GiB" / "512.0 MiB" / "12.0 KiB" / "100 B" with `dec` decimals. */
static void fmt_bytes(char *buf, size_t n, uint64_t v, int dec) {
    if ((double)v >= GIB)
        snprintf(buf, n, "%.*f GiB", dec, (double)v / GIB);
    else if ((double)v >= MIB)
        snprintf(buf, n, "%.*f MiB", dec, (double)v / MIB);
    else if ((double)v >= KIB)
        snprintf(buf, n, "%.*f KiB", dec, (double)v / KIB);
    else
        snprintf(buf, n, "%llu B", (unsigned long long)v);
}

/* Formats two sizes that a message compares so that they never read the same when they differ
 * ("needs 8.0 GiB ... offers 8.0 GiB" would say nothing): more decimals, then exact bytes. */
static void fmt_pair(char *ba, char *bb, size_t n, uint64_t a, uint64_t b) {
    for (int dec = 1; dec <= 3; dec++) {
        fmt_bytes(ba, n, a, dec);
        fmt_bytes(bb, n, b, dec);
        if (a == b || strcmp(ba, bb) != 0) return;
    }
    snprintf(ba, n, "%llu bytes", (unsigned long long)a);
    snprintf(bb, n, "%llu bytes", (unsigned long long)b);
}

/* names are fixed arrays that a caller may fill to the brim, without a terminator */
static int name_len(const plan_node *nd) { return (int)strnlen(nd->name, sizeof nd->name); }

/* The smallest need of layer i in any plan: alone in its stage, with the embedding / head it must carry. */
static uint64_t layer_alone_need(const cost_ctx *c, uint32_t i) {
    return need_of(stage_raw(c, i, i + 1), c->headroom);
}

/* Called when pass 1 found no plan: say why, as precisely as the numbers allow. */
static int explain_infeasible(const cost_ctx *c, const dp_cell *t, uint64_t weights, uint64_t state, rl_err *err) {
    uint64_t offered = 0, largest = 0;
    for (int i = 0; i < c->n_nodes; i++) {
        uint64_t mb = c->nodes[i].mem_bytes + c->nodes[i].ram_bytes;
        if (mb < c->nodes[i].mem_bytes) mb = UINT64_MAX;
        offered = offered + mb < offered ? UINT64_MAX : offered + mb;
        if (mb > largest) largest = mb;
    }
    /* the layer that overflows the largest node by the most, if any does */
    int worst = -1;
    uint64_t worst_need = 0;
    for (uint32_t i = 0; i < c->n; i++) {
        uint64_t nd = layer_alone_need(c, i);
        if (nd > largest && nd > worst_need) {
            worst = (int)i;
            worst_need = nd;
        }
    }
    char s_worst[64] = "", s_largest[64] = "", layer_msg[256] = "";
    if (worst >= 0) {
        const char *with = c->n == 1                     ? " (with the embedding and the output head)"
                           : worst == 0                  ? " (with the embedding)"
                           : (uint32_t)worst == c->n - 1 ? " (with the output head)"
                                                         : "";
        fmt_pair(s_worst, s_largest, sizeof s_worst, worst_need, largest);
        snprintf(layer_msg, sizeof layer_msg, "layer %d%s needs %s, more than any node offers (largest: %s)", worst,
                 with, s_worst, s_largest);
    }

    /* Too little memory in all comes first: no cut helps then. A huge layer is named as well, since adding
     * nodes of the same size would not be enough. */
    const uint64_t total_need = need_of(weights + state, c->headroom);
    bool any_disk = false;
    for (int i = 0; i < c->n_nodes; i++) any_disk |= c->nodes[i].disk_bps > 0;
    if (any_disk) {
        /* Nodes that read experts from disk hold more than their memory: only the dense parts must fit. */
        const uint64_t dense = weights - c->pre_exps[c->n];
        const uint64_t dense_need = need_of(dense + state, c->headroom);
        char s_need[64], s_off[64], s_d[64], s_st[64];
        fmt_pair(s_need, s_off, sizeof s_need, dense_need, offered);
        fmt_bytes(s_d, sizeof s_d, dense, 1);
        fmt_bytes(s_st, sizeof s_st, state, 1);
        return rl_errf(err, "ring too small, even with routed experts read from disk: the model's dense part needs %s "
                            "(dense weights %s + state %s + %g%% headroom) and the %d node%s offer%s %s in all%s", s_need,
                       s_d, s_st, c->headroom * 100.0, c->n_nodes, c->n_nodes == 1 ? "" : "s", c->n_nodes == 1 ? "s" : "",
                       s_off, dense_need <= offered ? "; no cut leaves every stage its dense part, state and two experts "
                                                      "in memory (a node without a disk speed holds its layers whole)" : "");
    }
    if (total_need > offered) {
        char s_need[64], s_off[64], s_w[64], s_st[64], detail[256];
        fmt_pair(s_need, s_off, sizeof s_need, total_need, offered);
        fmt_bytes(s_w, sizeof s_w, weights, 1);
        fmt_bytes(s_st, sizeof s_st, state, 1);
        int len = snprintf(detail, sizeof detail, "weights %s", s_w);
        if (state && len > 0 && (size_t)len < sizeof detail)
            len += snprintf(detail + len, sizeof detail - (size_t)len, " + state %s", s_st);
        if (c->headroom > 0 && len > 0 && (size_t)len < sizeof detail)
            snprintf(detail + len, sizeof detail - (size_t)len, " + %g%% headroom", c->headroom * 100.0);
        return rl_errf(err, "ring too small: the model needs %s (%s) but the %d node%s offer%s %s in all%s%s", s_need,
                       detail, c->n_nodes, c->n_nodes == 1 ? "" : "s", c->n_nodes == 1 ? "s" : "", s_off,
                       worst >= 0 ? "; also " : "", layer_msg);
    }
    if (worst >= 0) return rl_errf(err, "%s", layer_msg);

    /* Enough memory in all and every layer fits somewhere: the ring order and contiguity are the
     * problem. Report how far the ordered nodes get. */
    const dp_cell *last = t + (size_t)c->n_nodes * (c->n + 1);
    uint32_t reach = 0;
    for (uint32_t k = 0; k <= c->n; k++)
        if (last[k].from != DP_NONE) reach = k;
    char s_need[64], s_off[64];
    fmt_pair(s_need, s_off, sizeof s_need, total_need, offered);
    return rl_errf(err,
                   "ring cannot hold the model in contiguous stages: it needs %s and the %d node%s offer%s %s in "
                   "all, but in ring order they hold at most layers 0-%u of %u (no node after those has room for "
                   "layer %u; reorder the ring or add memory)",
                   s_need, c->n_nodes, c->n_nodes == 1 ? "" : "s", c->n_nodes == 1 ? "s" : "", s_off,
                   reach ? reach - 1 : 0, c->n, reach);
}

int plan_make(const plan_model *m, const plan_node *nodes, int n_nodes, double headroom, plan_result *out,
              rl_err *err) {
    if (!m || !nodes || !out) return rl_errf(err, "plan: missing model, nodes or result");
    if (n_nodes <= 0) return rl_errf(err, "plan: no nodes in the ring");
    if (n_nodes > PLAN_MAX_NODES) return rl_errf(err, "plan: %d nodes, at most %d supported", n_nodes, PLAN_MAX_NODES);
    if (m->n_layer == 0) return rl_errf(err, "plan: the model has no layers");
    if (m->n_layer > PLAN_MAX_LAYERS)
        return rl_errf(err, "plan: the model has %u layers, at most %d supported", m->n_layer, PLAN_MAX_LAYERS);
    if (!(headroom >= 0) || !isfinite(headroom)) return rl_errf(err, "plan: headroom %g must be >= 0", headroom);
    for (int i = 0; i < n_nodes; i++) {
        if (!(nodes[i].speed > 0) || !isfinite(nodes[i].speed))
            return rl_errf(err, "plan: node %d (%.*s) has speed %g, must be a finite number > 0", i,
                           name_len(&nodes[i]), nodes[i].name, nodes[i].speed);
        if (nodes[i].ram_bytes > 0 && (!(nodes[i].ram_speed > 0) || !isfinite(nodes[i].ram_speed)))
            return rl_errf(err, "plan: node %d (%.*s) has RAM speed %g, must be a finite number > 0", i,
                           name_len(&nodes[i]), nodes[i].name, nodes[i].ram_speed);
        if (!(nodes[i].disk_bps >= 0) || !isfinite(nodes[i].disk_bps))
            return rl_errf(err, "plan: node %d (%.*s) has disk speed %g, must be a finite number >= 0", i,
                           name_len(&nodes[i]), nodes[i].name, nodes[i].disk_bps);
    }

    /* on the heap: the context is ~4 KiB and the table up to ~270 KiB */
    cost_ctx *c = calloc(1, sizeof *c);
    dp_cell *t = malloc(sizeof *t * (size_t)(n_nodes + 1) * (m->n_layer + 1));
    if (!c || !t) {
        free(c);
        free(t);
        return rl_errf(err, "plan: out of memory");
    }
    c->m = m;
    c->nodes = nodes;
    c->n_nodes = n_nodes;
    c->n = m->n_layer;
    c->headroom = headroom;

    /* Weights and state separately for the message. Every term is unsigned, so once the grand totals
     * fit 64 bits every prefix sum and every stage total does too. */
    uint64_t weights = 0, state = 0, active = 0, total_raw = 0;
    int ovf = __builtin_add_overflow(m->first_bytes, m->last_bytes, &weights) ||
              __builtin_add_overflow(0, m->last_active, &active);
    for (uint32_t i = 0; i < c->n && !ovf; i++) {
        uint64_t st;
        ovf = __builtin_mul_overflow((uint64_t)m->n_seq, m->layer_state[i], &st) ||
              __builtin_add_overflow(weights, m->layer_bytes[i], &weights) ||
              __builtin_add_overflow(state, st, &state) ||
              __builtin_add_overflow(active, m->layer_active[i], &active);
        c->pre_raw[i + 1] = c->pre_raw[i] + m->layer_bytes[i] + st;
        c->pre_active[i + 1] = c->pre_active[i] + m->layer_active[i];
        /* parts of the sums above, so they cannot wrap either (a model that says otherwise is refused) */
        ovf = ovf || m->layer_exps[i] > m->layer_bytes[i] || m->layer_exps_active[i] > m->layer_active[i] ||
              m->layer_host[i] > m->layer_state[i];
        c->pre_host[i + 1] = c->pre_host[i] + (uint64_t)m->n_seq * m->layer_host[i];
        c->pre_exps[i + 1] = c->pre_exps[i] + m->layer_exps[i];
        c->pre_exps_active[i + 1] = c->pre_exps_active[i] + m->layer_exps_active[i];
    }
    if (ovf || __builtin_add_overflow(weights, state, &total_raw)) {
        free(c);
        free(t);
        return rl_errf(err, "plan: the model's sizes overflow 64 bits");
    }
    /* What each node lacks, as prefix sums; a node cannot lack more than the weights, so no sum wraps. */
    bool any_lack = false;
    for (int i = 0; i < n_nodes; i++) any_lack |= nodes[i].lack != NULL;
    if (any_lack && !(c->pre_lack = calloc((size_t)n_nodes * (c->n + 1), sizeof *c->pre_lack))) {
        free(c);
        free(t);
        return rl_errf(err, "plan: out of memory");
    }
    for (int i = 0; any_lack && i < n_nodes; i++) {
        uint64_t *pre = c->pre_lack + (size_t)i * (c->n + 1);
        for (uint32_t l = 0; nodes[i].lack && l < c->n; l++) {
            pre[l + 1] = pre[l] + (nodes[i].lack[l] < m->layer_bytes[l] ? nodes[i].lack[l] : m->layer_bytes[l]);
        }
    }

    const uint32_t w = c->n + 1;
    const dp_cell *goal = t + (size_t)n_nodes * w + c->n;
    /* pass 1: the smallest max stage time */
    dp_spec sp = {0, DP_TIME, INFINITY, INFINITY};
    dp_run(c, &sp, t);
    if (goal->from == DP_NONE) {
        int rc = explain_infeasible(c, t, weights, state, err);
        free(c->pre_lack);
        free(c);
        free(t);
        return rc;
    }
    const double best_time = goal->v;
    /* pass 2: fewest stages at that time, then the smallest largest memory share */
    sp = (dp_spec){1, DP_SHARE, best_time, INFINITY};
    dp_run(c, &sp, t);
    const double best_share = goal->v;
    /* pass 3: same count and largest share, then the largest smallest share */
    sp = (dp_spec){1, DP_NEG_SHARE, best_time, best_share};
    dp_run(c, &sp, t);

    /* walk back from the goal; stages come out last first */
    memset(out, 0, sizeof *out);
    out->n_nodes = n_nodes;
    plan_stage rev[PLAN_MAX_NODES];
    int ns = 0;
    uint32_t k = c->n;
    for (int j = n_nodes; k > 0 && j > 0; j--) {
        const dp_cell *cell = t + (size_t)j * w + k;
        if (cell->from == DP_SKIP) continue;
        stage_eval(c, j - 1, (uint32_t)cell->from, k, &rev[ns++]);
        k = (uint32_t)cell->from;
    }
    for (int i = 0; i < ns; i++) {
        out->stages[i] = rev[ns - 1 - i];
        if (out->stages[i].time > out->max_time) out->max_time = out->stages[i].time;
    }
    out->n_stages = ns;
    free(c->pre_lack);
    free(c);
    free(t);
    return 0;
}

void plan_print(const plan_result *r, const plan_node *nodes, FILE *f) {
    if (!r || !nodes || !f) return;
    char nn[32];
    snprintf(nn, sizeof nn, "%d node%s", r->n_stages, r->n_stages == 1 ? "" : "s");
    int wn = (int)strlen(nn);
    for (int i = 0; i < r->n_stages; i++) {
        int l = name_len(&nodes[r->stages[i].node]);
        if (l > wn) wn = l;
    }
    fprintf(f, "%-5s  %-*s  %-16s  %12s  %12s\n", "stage", wn, "node", "layers", "memory", "ms/token");
    uint64_t mem_total = 0;
    double time_total = 0;
    for (int i = 0; i < r->n_stages; i++) {
        const plan_stage *s = &r->stages[i];
        const plan_node *nd = &nodes[s->node];
        char lay[48], mem[32];
        snprintf(lay, sizeof lay, "%u-%u (%u)", s->a, s->b - 1, s->b - s->a);
        fmt_bytes(mem, sizeof mem, s->mem_bytes, 1);
        fprintf(f, "%5d  %-*.*s  %-16s  %12s  %12.3f", i, wn, name_len(nd), nd->name, lay, mem, s->time * 1e3);
        if (s->lack_bytes) {
            char lk[32];
            fmt_bytes(lk, sizeof lk, s->lack_bytes, 1);
            fprintf(f, "  (streams %s it lacks)", lk);
        }
        if (nd->ram_bytes > 0) {
            char db[32], rb[32], dn[72];
            fmt_bytes(db, sizeof db, s->dev_bytes, 1);
            fmt_bytes(rb, sizeof rb, s->mem_bytes - s->dev_bytes, 1);
            snprintf(dn, sizeof dn, "%s", nd->device[0] ? nd->device : "device");
            if (s->dev_layers == 0) {
                fprintf(f, "  (all in RAM, on the CPU)");
            } else {
                if (nd->n_parts > 1) { /* the node's split between its devices, as its engine makes it */
                    size_t room[PLAN_MAX_PARTS];
                    uint32_t end[PLAN_MAX_PARTS];
                    for (int k = 0; k < nd->n_parts; k++) room[k] = (size_t)nd->part_room[k];
                    k3_dev_split(s->a, s->dev_layers, room, nd->n_parts, end);
                    fprintf(f, "  (");
                    for (int k = 0, n = 0, lo = (int)s->a; k < nd->n_parts; lo = (int)end[k++]) {
                        if (end[k] == (uint32_t)lo) continue; /* (a device given no layer is left out) */
                        fprintf(f, "%s%s: layers %d-%u", n++ ? ", " : "", nd->part_name[k], lo, end[k] - 1);
                    }
                } else {
                    fprintf(f, "  (%s: layers %u-%u", dn, s->a, s->a + s->dev_layers - 1);
                }
                if (s->cpu_moe) fprintf(f, ", their routed experts of %u-%u in RAM", s->a, s->a + s->cpu_moe - 1);
                if (s->dev_layers < s->b - s->a) fprintf(f, "; CPU: layers %u-%u", s->a + s->dev_layers, s->b - 1);
                fprintf(f, "; %s on %s, %s in RAM)", db, dn, rb);
            }
        }
        if (s->cached < 1.0) {
            fprintf(f, "  (experts %s%.0f%% in memory, the rest from disk: %.3f ms/token of the time)",
                    nd->ram_bytes > 0 ? "in RAM " : "", 100.0 * s->cached, s->disk_time * 1e3);
        }
        fprintf(f, "\n");
        mem_total = mem_total + s->mem_bytes < mem_total ? UINT64_MAX : mem_total + s->mem_bytes;
        time_total += s->time;
    }
    /* the total time is one token's trip through the ring; the slowest stage bounds the pipelined rate */
    char lay[48] = "", mem[32];
    if (r->n_stages > 0)
        snprintf(lay, sizeof lay, "%u-%u (%u)", r->stages[0].a, r->stages[r->n_stages - 1].b - 1,
                 r->stages[r->n_stages - 1].b - r->stages[0].a);
    fmt_bytes(mem, sizeof mem, mem_total, 1);
    fprintf(f, "%-5s  %-*s  %-16s  %12s  %12.3f  (slowest stage %.3f ms", "total", wn, nn, lay, mem, time_total * 1e3,
            r->max_time * 1e3);
    if (r->max_time > 0) fprintf(f, ": at most %.1f tokens/s pipelined", 1.0 / r->max_time);
    fprintf(f, ")\n");

    /* the nodes the plan does not use, so an operator sees they were considered */
    int first = 1;
    for (int i = 0; i < r->n_nodes; i++) {
        bool used = false; /* (stages need not be in node order: a ring ordered by its delays) */
        for (int s = 0; s < r->n_stages && !used; s++) used = r->stages[s].node == i;
        if (used) continue;
        fprintf(f, "%s%.*s", first ? "not used: " : ", ", name_len(&nodes[i]), nodes[i].name);
        first = 0;
    }
    if (!first) fprintf(f, "\n");
}
