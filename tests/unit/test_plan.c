/* test_plan - the layer cut (src/plan/plan): hand-made rings whose answer is known, the error messages,
 * and a seeded property check against a brute force over every node subset and every cut position.
 *
 * The brute force recomputes memory and time from plan.h's documented definitions on its own (need = raw
 * + ceil(raw * headroom), time = active / speed), so it checks the dynamic program, not a copy of it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "plan/plan.h"

#include "check.h"

#define GiB (1024ull * 1024 * 1024)

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rng(void) { /* xorshift64*: reproducible inputs from a fixed seed */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1DULL;
}
static uint64_t rng_in(uint64_t lo, uint64_t hi) { return lo + rng() % (hi - lo + 1); }

/* a model of n uniform layers: `bytes` weights and `bytes` read per token each, no state, no extras */
static void uniform_model(plan_model *m, uint32_t n, uint64_t bytes) {
    memset(m, 0, sizeof *m);
    m->n_layer = n;
    for (uint32_t i = 0; i < n; i++) m->layer_bytes[i] = m->layer_active[i] = bytes;
}

static void set_node(plan_node *nd, const char *name, uint64_t mem, double speed) {
    memset(nd, 0, sizeof *nd);
    snprintf(nd->name, sizeof nd->name, "%s", name);
    nd->mem_bytes = mem;
    nd->speed = speed;
}

/* ---- the reference definitions (plan.h), written out independently ---- */

static uint64_t ref_need(const plan_model *m, uint32_t a, uint32_t b, double headroom) {
    uint64_t raw = 0;
    for (uint32_t i = a; i < b; i++) raw += m->layer_bytes[i] + (uint64_t)m->n_seq * m->layer_state[i];
    if (a == 0) raw += m->first_bytes;
    if (b == m->n_layer) raw += m->last_bytes;
    /* plan.h: a product within 1e-12 of a whole number is that number (0.1 is not exact in binary) */
    long double x = (long double)raw * (long double)headroom;
    if (fabsl(x - roundl(x)) <= x * 1e-12L) x = roundl(x);
    return raw + (uint64_t)ceill(x);
}

static double ref_time(const plan_model *m, uint32_t a, uint32_t b, double speed) {
    uint64_t act = 0;
    for (uint32_t i = a; i < b; i++) act += m->layer_active[i];
    if (b == m->n_layer) act += m->last_active;
    return (double)act / speed;
}

static int close_to(double x, double y) { return fabs(x - y) <= 1e-12 * fmax(fabs(x), fabs(y)); }

/* Structural checks every plan must pass: contiguous cover in ring order, every limit respected, the
 * reported numbers right. Returns NULL or a short reason. */
static const char *check_valid(const plan_model *m, const plan_node *nodes, int n_nodes, double headroom,
                               const plan_result *r) {
    if (r->n_stages < 1 || r->n_stages > n_nodes) return "stage count out of range";
    if (r->n_nodes != n_nodes) return "n_nodes not recorded";
    uint32_t at = 0;
    int prev_node = -1;
    double mx = 0;
    for (int i = 0; i < r->n_stages; i++) {
        const plan_stage *s = &r->stages[i];
        if (s->a != at || s->b <= s->a || s->b > m->n_layer) return "not a contiguous cover";
        if (s->node <= prev_node || s->node >= n_nodes) return "nodes not in ring order";
        uint64_t need = ref_need(m, s->a, s->b, headroom);
        if (s->mem_bytes != need) return "stage memory misreported";
        if (need > nodes[s->node].mem_bytes) return "stage over its node's memory";
        if (!close_to(s->time, ref_time(m, s->a, s->b, nodes[s->node].speed))) return "stage time misreported";
        if (s->time > mx) mx = s->time;
        at = s->b;
        prev_node = s->node;
    }
    if (at != m->n_layer) return "layers not all covered";
    if (!close_to(r->max_time, mx)) return "max_time is not the slowest stage";
    return NULL;
}

/* Brute force over every node subset (in ring order) and every way to cut the layers into that many
 * non-empty ranges, ranking plans the way plan.h documents: max time, stages, largest memory share,
 * then smallest memory share (larger is better). Returns whether any plan fits. */
typedef struct ref_best {
    uint64_t lack; /* bytes streamed (plan_node.lack): ranked first */
    double time, max_share, min_share;
    int stages;
} ref_best;

static uint64_t ref_lack(const plan_model *m, const plan_node *nd, uint32_t a, uint32_t b) {
    if (!nd->lack) return 0;
    uint64_t l = 0;
    for (uint32_t i = a; i < b; i++) l += nd->lack[i] < m->layer_bytes[i] ? nd->lack[i] : m->layer_bytes[i];
    if (a == 0) l += nd->lack[m->n_layer];
    if (b == m->n_layer) l += nd->lack[m->n_layer + 1];
    return l;
}

/* Every plan there is: each non-empty subset of the nodes, in ring order, and each way of cutting the layers
 * into that many contiguous stages; visit gets stage s as nodes node[s], layers [a[s], b[s]). */
typedef struct ref_cut {
    int n;
    int node[PLAN_MAX_NODES];
    uint32_t a[PLAN_MAX_NODES], b[PLAN_MAX_NODES];
} ref_cut;

static void ref_each_plan(uint32_t n, int n_nodes, void (*visit)(const ref_cut *, void *), void *user) {
    for (unsigned sub = 1; sub < (1u << n_nodes); sub++) {
        ref_cut c = {0};
        for (int i = 0; i < n_nodes; i++)
            if (sub & (1u << i)) c.node[c.n++] = i;
        if ((uint32_t)c.n > n) continue;
        /* cut positions: a bit set at i means a stage ends after layer i (i < n - 1) */
        for (unsigned cuts = 0; cuts < (1u << (n - 1)); cuts++) {
            if (__builtin_popcount(cuts) != c.n - 1) continue;
            for (uint32_t i = 0, st = 0, a = 0; i < n; i++) {
                if (i == n - 1 || (cuts & (1u << i))) c.a[st] = a, c.b[st++] = i + 1, a = i + 1;
            }
            visit(&c, user);
        }
    }
}

typedef struct ref_plan_ctx {
    const plan_model *m;
    const plan_node *nodes;
    double headroom;
    ref_best *best;
    int found;
} ref_plan_ctx;

static void ref_plan_visit(const ref_cut *c, void *user) {
    ref_plan_ctx *x = user;
    double t = 0, hi = 0, lo = INFINITY;
    uint64_t lk = 0;
    for (int s = 0; s < c->n; s++) {
        const plan_node *nd = &x->nodes[c->node[s]];
        uint64_t need = ref_need(x->m, c->a[s], c->b[s], x->headroom);
        if (need > nd->mem_bytes) return;
        double share = nd->mem_bytes ? (double)need / (double)nd->mem_bytes : 0.0;
        t = fmax(t, ref_time(x->m, c->a[s], c->b[s], nd->speed));
        lk += ref_lack(x->m, nd, c->a[s], c->b[s]);
        hi = fmax(hi, share);
        lo = fmin(lo, share);
    }
    ref_best cand = {lk, t, hi, lo, c->n};
    const ref_best *b = x->best;
    int better = !x->found || cand.lack < b->lack || (cand.lack == b->lack && cand.time < b->time) ||
                 (cand.lack == b->lack && cand.time == b->time &&
                  (cand.stages < b->stages ||
                   (cand.stages == b->stages &&
                    (cand.max_share < b->max_share || (cand.max_share == b->max_share && cand.min_share > b->min_share)))));
    if (better) *x->best = cand;
    x->found = 1;
}

static int ref_plan(const plan_model *m, const plan_node *nodes, int n_nodes, double headroom, ref_best *best) {
    ref_plan_ctx x = {m, nodes, headroom, best, 0};
    ref_each_plan(m->n_layer, n_nodes, ref_plan_visit, &x);
    return x.found;
}

static void result_shares(const plan_node *nodes, const plan_result *r, double *hi, double *lo) {
    *hi = 0;
    *lo = INFINITY;
    for (int i = 0; i < r->n_stages; i++) {
        uint64_t mem = nodes[r->stages[i].node].mem_bytes;
        double s = mem ? (double)r->stages[i].mem_bytes / (double)mem : 0.0;
        *hi = fmax(*hi, s);
        *lo = fmin(*lo, s);
    }
}

/* A random case: uneven or uniform layers, optional state, embedding, head and headroom, and nodes that
 * each offer 30%..250% of an even share of the model (some much less), so both outcomes occur. */
static void random_case(plan_model *m, plan_node *nodes, int *n_nodes, double *headroom, uint32_t max_layers,
                        int max_nodes) {
    memset(m, 0, sizeof *m);
    m->n_layer = (uint32_t)rng_in(1, max_layers);
    int uniform = rng() % 3 == 0;
    uint64_t ub = rng_in(1, 100);
    for (uint32_t i = 0; i < m->n_layer; i++) {
        m->layer_bytes[i] = uniform ? ub : rng_in(1, 100);
        m->layer_active[i] = rng() % 2 ? m->layer_bytes[i] : rng_in(0, 100);
        m->layer_state[i] = rng() % 2 ? 0 : rng_in(0, 10);
        m->layer_host[i] = i % 2 ? m->layer_state[i] / 2 : 0; /* (no draw: the cases stay those of before) */
    }
    m->n_seq = (uint32_t)rng_in(0, 3);
    m->first_bytes = rng() % 2 ? 0 : rng_in(0, 60);
    m->last_bytes = rng() % 2 ? 0 : rng_in(0, 60);
    m->last_active = rng() % 2 ? 0 : rng_in(0, 200);
    static const double hr[] = {0, 0.1, 0.25, 0.5};
    *headroom = hr[rng() % 4];
    *n_nodes = (int)rng_in(1, (uint64_t)max_nodes);
    uint64_t total = ref_need(m, 0, m->n_layer, *headroom);
    uint64_t scale = rng_in(30, 250);
    int same_speed = rng() % 3 == 0; /* equal speeds make ties, which exercise the tie-breaks */
    for (int i = 0; i < *n_nodes; i++) {
        char name[32];
        snprintf(name, sizeof name, "n%d:7000", i);
        uint64_t mem = total * scale / 100 / (uint64_t)*n_nodes;
        mem = rng() % 4 == 0 ? rng_in(0, mem + 1) : rng_in(mem / 2, mem + mem / 2 + 1);
        double speed = same_speed ? 1.0 : (double)rng_in(1, 4) * (rng() % 2 ? 1.0 : 0.75);
        set_node(&nodes[i], name, mem, speed);
        /* what it lacks: nothing (NULL), or some layers, in part or whole (a third of the cases) */
        static uint64_t lack[PLAN_MAX_NODES][PLAN_MAX_LAYERS + 2];
        if (rng() % 3 == 0) {
            for (uint32_t l = 0; l < m->n_layer; l++) lack[i][l] = rng() % 2 ? 0 : rng_in(0, m->layer_bytes[l]);
            lack[i][m->n_layer] = rng() % 2 ? 0 : m->first_bytes;
            lack[i][m->n_layer + 1] = rng() % 2 ? 0 : m->last_bytes;
            nodes[i].lack = lack[i];
        }
    }
}

/* ---- two tiers (plan_node.ram_bytes): a device and RAM, plan.h's definitions written out again ---- */

/* Bytes of [a, b) on the device and in RAM, and read per token on each, for g layers on the device of which
 * the first n keep their experts in RAM (weights and n_seq states, of which the host part in RAM; the
 * embedding in RAM; the head with the device when g covers the last stage). */
static void ref_tier(const plan_model *m, uint32_t a, uint32_t b, uint32_t g, uint32_t n, uint64_t *dev, uint64_t *ram,
                     uint64_t *adev, uint64_t *aram) {
    *dev = *ram = *adev = *aram = 0;
    for (uint32_t i = a; i < b; i++) {
        const uint64_t w = m->layer_bytes[i] + (uint64_t)m->n_seq * m->layer_state[i];
        if (i < a + g) {
            const uint64_t x = i < a + n ? m->layer_exps[i] : 0, xa = i < a + n ? m->layer_exps_active[i] : 0;
            const uint64_t h = (uint64_t)m->n_seq * m->layer_host[i];
            *dev += w - x - h, *ram += x + h;
            *adev += m->layer_active[i] - xa, *aram += xa;
        } else {
            *ram += w, *aram += m->layer_active[i];
        }
    }
    if (a == 0) *ram += m->first_bytes;
    if (b == m->n_layer) {
        if (g == b - a) *dev += m->last_bytes, *adev += m->last_active;
        else *ram += m->last_bytes, *aram += m->last_active;
    }
}

static uint64_t ref_head(uint64_t raw, double headroom) {
    long double x = (long double)raw * (long double)headroom;
    if (fabsl(x - roundl(x)) <= x * 1e-12L) x = roundl(x);
    return raw + (uint64_t)ceill(x);
}

/* The stage's best time on a two-tier node by plan.h's rule, or INFINITY if nothing fits. */
static double ref_tier_time(const plan_model *m, const plan_node *nd, uint32_t a, uint32_t b, double headroom) {
    const uint32_t len = b - a;
    uint32_t cand_g[3], cand_n[3];
    int nc = 0;
    for (uint32_t n = 0; n <= len; n++) { /* the least n that fits the device, all layers there */
        uint64_t d, r, ad, ar;
        ref_tier(m, a, b, len, n, &d, &r, &ad, &ar);
        if (ref_head(d, headroom) <= nd->mem_bytes) {
            cand_g[nc] = len, cand_n[nc++] = n;
            break;
        }
    }
    uint32_t gmax = 0;
    for (uint32_t g = 0; g < len; g++) { /* the most whole layers short of all */
        uint64_t d, r, ad, ar;
        ref_tier(m, a, b, g, 0, &d, &r, &ad, &ar);
        if (ref_head(d, headroom) <= nd->mem_bytes) gmax = g;
    }
    cand_g[nc] = gmax, cand_n[nc++] = 0;
    if (nd->ram_speed > nd->speed) cand_g[nc] = 0, cand_n[nc++] = 0;
    double best = INFINITY;
    for (int k = 0; k < nc; k++) {
        uint64_t d, r, ad, ar;
        ref_tier(m, a, b, cand_g[k], cand_n[k], &d, &r, &ad, &ar);
        if (ref_head(d, headroom) > nd->mem_bytes) continue;
        double disk = 0;
        if (ref_head(r, headroom) > nd->ram_bytes) {
            /* VRAM -> RAM -> disk: the RAM part's routed experts cached in what its dense part leaves */
            uint64_t x = 0, xa = 0;
            for (uint32_t i = a; i < b; i++) {
                if (i >= a + cand_g[k] || i < a + cand_n[k]) x += m->layer_exps[i], xa += m->layer_exps_active[i];
            }
            if (!(nd->disk_bps > 0) || x == 0) continue;
            const uint64_t dense = ref_head(r - x, headroom);
            if (dense >= nd->ram_bytes || nd->ram_bytes - dense < m->expert_min) continue;
            disk = (double)xa * (1.0 - fmin(1.0, (double)(nd->ram_bytes - dense) / (double)x)) / nd->disk_bps;
        }
        best = fmin(best, (double)ad / nd->speed + (double)ar / nd->ram_speed + disk);
    }
    return best;
}

/* The smallest max stage time over every node subset and cut, nodes with one or two tiers. */
typedef struct ref_tier_ctx {
    const plan_model *m;
    const plan_node *nodes;
    double headroom, best;
} ref_tier_ctx;

static void ref_tier_visit(const ref_cut *c, void *user) {
    ref_tier_ctx *x = user;
    double t = 0;
    for (int s = 0; s < c->n && isfinite(t); s++) {
        const plan_node *nd = &x->nodes[c->node[s]];
        const uint32_t a = c->a[s], b = c->b[s];
        t = fmax(t, nd->ram_bytes ? ref_tier_time(x->m, nd, a, b, x->headroom)
                    : ref_need(x->m, a, b, x->headroom) <= nd->mem_bytes ? ref_time(x->m, a, b, nd->speed)
                                                                         : INFINITY);
    }
    x->best = fmin(x->best, t);
}

static double ref_tier_plan(const plan_model *m, const plan_node *nodes, int n_nodes, double headroom) {
    ref_tier_ctx x = {m, nodes, headroom, INFINITY};
    ref_each_plan(m->n_layer, n_nodes, ref_tier_visit, &x);
    return x.best;
}

int main(void) {
    static plan_model m; /* ~6 KiB: static keeps it off small stacks */
    plan_node nodes[PLAN_MAX_NODES];
    plan_result r;
    rl_err err = {{0}};

    /* one node takes everything */
    uniform_model(&m, 10, GiB);
    m.first_bytes = 2 * GiB;
    m.last_bytes = 3 * GiB;
    m.last_active = GiB;
    set_node(&nodes[0], "solo:7000", 100 * GiB, 1e9);
    int rc = plan_make(&m, nodes, 1, 0.1, &r, &err);
    CHECK(rc == 0 && r.n_stages == 1 && r.stages[0].node == 0 && r.stages[0].a == 0 && r.stages[0].b == 10,
          "one node takes all 10 layers");
    CHECK(rc == 0 && r.stages[0].mem_bytes == ref_need(&m, 0, 10, 0.1) &&
              r.stages[0].mem_bytes == 15 * GiB + 3 * GiB / 2,
          "its memory is (weights + embedding + head) * 1.1");
    CHECK(rc == 0 && close_to(r.max_time, 11.0 * GiB / 1e9), "its time is (layers + head) / speed");

    /* equal nodes split a uniform model evenly */
    uniform_model(&m, 93, GiB);
    for (int i = 0; i < 4; i++) {
        char name[32];
        snprintf(name, sizeof name, "eq%d:7000", i);
        set_node(&nodes[i], name, 64 * GiB, 1e9);
    }
    rc = plan_make(&m, nodes, 4, 0.1, &r, &err);
    int cnt[4] = {0}, n23 = 0, n24 = 0;
    for (int i = 0; rc == 0 && i < r.n_stages && i < 4; i++) cnt[i] = (int)(r.stages[i].b - r.stages[i].a);
    for (int i = 0; i < 4; i++) n23 += cnt[i] == 23, n24 += cnt[i] == 24;
    CHECK(rc == 0 && r.n_stages == 4 && n23 == 3 && n24 == 1, "93 layers on 4 equal nodes: %d/%d/%d/%d", cnt[0], cnt[1],
          cnt[2], cnt[3]);
    CHECK(rc == 0 && check_valid(&m, nodes, 4, 0.1, &r) == NULL, "... a valid plan");

    /* twice the speed, about twice the layers */
    uniform_model(&m, 90, GiB);
    set_node(&nodes[0], "slow:7000", 200 * GiB, 1e9);
    set_node(&nodes[1], "fast:7000", 200 * GiB, 2e9);
    rc = plan_make(&m, nodes, 2, 0.0, &r, &err);
    CHECK(rc == 0 && r.n_stages == 2 && r.stages[0].b - r.stages[0].a == 30 && r.stages[1].b - r.stages[1].a == 60,
          "speeds 1:2 over 90 layers -> 30/60 (got %u/%u)", rc == 0 ? r.stages[0].b - r.stages[0].a : 0,
          rc == 0 && r.n_stages > 1 ? r.stages[1].b - r.stages[1].a : 0);
    uniform_model(&m, 100, GiB);
    set_node(&nodes[0], "a:7000", 200 * GiB, 1e9);
    set_node(&nodes[1], "b:7000", 200 * GiB, 2e9);
    set_node(&nodes[2], "c:7000", 200 * GiB, 1e9);
    rc = plan_make(&m, nodes, 3, 0.0, &r, &err);
    CHECK(rc == 0 && r.n_stages == 3 && r.stages[1].b - r.stages[1].a == 50 && r.stages[0].b - r.stages[0].a == 25,
          "speeds 1:2:1 over 100 layers -> 25/50/25");

    /* memory-limited nodes get fewer layers even if fast */
    uniform_model(&m, 40, GiB);
    set_node(&nodes[0], "fast-small:7000", 11 * GiB, 10e9); /* 10 layers * 1.1 */
    set_node(&nodes[1], "slow-big:7000", 100 * GiB, 1e9);
    rc = plan_make(&m, nodes, 2, 0.1, &r, &err);
    CHECK(rc == 0 && r.n_stages == 2 && r.stages[0].b == 10 && r.stages[0].mem_bytes <= 11 * GiB,
          "a fast node with room for 10 layers gets exactly 10 (got %u)", rc == 0 ? r.stages[0].b : 0);
    CHECK(rc == 0 && check_valid(&m, nodes, 2, 0.1, &r) == NULL, "... a valid plan");

    /* a node too small for any layer is skipped */
    uniform_model(&m, 12, GiB);
    set_node(&nodes[0], "big-a:7000", 20 * GiB, 1e9);
    set_node(&nodes[1], "tiny:7000", GiB / 2, 5e9);
    set_node(&nodes[2], "big-b:7000", 20 * GiB, 1e9);
    rc = plan_make(&m, nodes, 3, 0.1, &r, &err);
    CHECK(rc == 0 && r.n_stages == 2 && r.stages[0].node == 0 && r.stages[1].node == 2 && r.stages[0].b == 6,
          "a node too small for one layer is skipped, the others split 6/6");
    {
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        if (f && rc == 0) plan_print(&r, nodes, f);
        if (f) fclose(f);
        CHECK(buf && strstr(buf, "big-a:7000") && strstr(buf, "big-b:7000") && strstr(buf, "0-5 (6)") &&
                  strstr(buf, "6-11 (6)") && strstr(buf, "total") && strstr(buf, "not used: tiny:7000"),
              "plan_print: stages, ranges, total and the node left out");
        if (buf) printf("%s", buf);
        free(buf);
    }

    /* fewer stages when more would not lower the max: the head dominates the last stage */
    uniform_model(&m, 4, GiB);
    m.last_active = 100 * GiB;
    for (int i = 0; i < 3; i++) set_node(&nodes[i], "eq:7000", 64 * GiB, 1e9);
    rc = plan_make(&m, nodes, 3, 0.0, &r, &err);
    CHECK(rc == 0 && r.n_stages == 2 && r.stages[r.n_stages - 1].b - r.stages[r.n_stages - 1].a == 1,
          "a large head: 2 stages, the head's stage with one layer");

    /* infeasible total memory: both numbers */
    uniform_model(&m, 10, GiB);
    m.n_seq = 4;
    for (int i = 0; i < 10; i++) m.layer_state[i] = GiB / 16;
    for (int i = 0; i < 3; i++) set_node(&nodes[i], "small:7000", 2 * GiB, 1e9);
    rc = plan_make(&m, nodes, 3, 0.2, &r, &err);
    printf("# %s\n", err.msg);
    CHECK(rc == -1 && strstr(err.msg, "ring too small: the model needs 15.0 GiB") &&
              strstr(err.msg, "weights 10.0 GiB") && strstr(err.msg, "state 2.5 GiB") &&
              strstr(err.msg, "20% headroom") && strstr(err.msg, "3 nodes offer 6.0 GiB"),
          "too little memory in all: the message names what is needed and what is offered");

    /* one layer larger than any node, though the total would do */
    uniform_model(&m, 20, GiB);
    m.layer_bytes[17] = 9 * GiB;
    for (int i = 0; i < 4; i++) set_node(&nodes[i], "n8:7000", 8 * GiB, 1e9);
    rc = plan_make(&m, nodes, 4, 0.0, &r, &err);
    printf("# %s\n", err.msg);
    CHECK(rc == -1 && strstr(err.msg, "layer 17 needs 9.0 GiB, more than any node offers (largest: 8.0 GiB)") &&
              !strstr(err.msg, "ring too small"),
          "one huge layer: the message says it needs more than any node");

    /* ... and when both are true, both are said */
    rc = plan_make(&m, nodes, 2, 0.0, &r, &err);
    CHECK(rc == -1 && strstr(err.msg, "ring too small") && strstr(err.msg, "layer 17 needs"),
          "too little in all and a huge layer: both in the message");

    /* enough in all, every layer fits somewhere, but not in contiguous ring order */
    uniform_model(&m, 3, 6 * GiB);
    for (int i = 0; i < 2; i++) set_node(&nodes[i], "n10:7000", 10 * GiB, 1e9);
    rc = plan_make(&m, nodes, 2, 0.0, &r, &err);
    printf("# %s\n", err.msg);
    CHECK(rc == -1 && strstr(err.msg, "contiguous") && strstr(err.msg, "layers 0-1 of 3"),
          "3 layers of 6 GiB on 2 nodes of 10 GiB: contiguity is the problem");
    uniform_model(&m, 2, GiB);
    m.layer_bytes[0] = 8 * GiB; /* fits only the big node, which then has no room for layer 1 */
    m.layer_bytes[1] = 4 * GiB;
    set_node(&nodes[0], "small:7000", 5 * GiB, 1e9);
    set_node(&nodes[1], "big:7000", 10 * GiB, 1e9);
    rc = plan_make(&m, nodes, 2, 0.0, &r, &err);
    printf("# %s\n", err.msg);
    CHECK(rc == -1 && strstr(err.msg, "contiguous") && strstr(err.msg, "layers 0-0 of 2"),
          "the big node first in the ring would be needed: ring order is the problem");

    /* bad inputs */
    uniform_model(&m, 4, GiB);
    set_node(&nodes[0], "ok:7000", 64 * GiB, 1e9);
    CHECK(plan_make(&m, nodes, 0, 0.1, &r, &err) == -1 && strstr(err.msg, "no nodes"), "0 nodes: %s", err.msg);
    CHECK(plan_make(&m, nodes, PLAN_MAX_NODES + 1, 0.1, &r, &err) == -1 && strstr(err.msg, "at most"),
          "too many nodes: %s", err.msg);
    set_node(&nodes[0], "zero:7000", 64 * GiB, 0.0);
    CHECK(plan_make(&m, nodes, 1, 0.1, &r, &err) == -1 && strstr(err.msg, "zero:7000") && strstr(err.msg, "speed"),
          "speed 0: %s", err.msg);
    set_node(&nodes[0], "nan:7000", 64 * GiB, NAN);
    CHECK(plan_make(&m, nodes, 1, 0.1, &r, &err) == -1 && strstr(err.msg, "speed"), "speed NaN: %s", err.msg);
    set_node(&nodes[0], "ok:7000", 64 * GiB, 1e9);
    CHECK(plan_make(&m, nodes, 1, NAN, &r, &err) == -1 && strstr(err.msg, "headroom"), "headroom NaN: %s", err.msg);
    CHECK(plan_make(&m, nodes, 1, -0.5, &r, &err) == -1 && strstr(err.msg, "headroom"), "headroom < 0: %s", err.msg);
    m.n_layer = 0;
    CHECK(plan_make(&m, nodes, 1, 0.1, &r, &err) == -1 && strstr(err.msg, "no layers"), "0 layers: %s", err.msg);
    m.n_layer = PLAN_MAX_LAYERS + 1;
    CHECK(plan_make(&m, nodes, 1, 0.1, &r, &err) == -1 && strstr(err.msg, "at most"), "too many layers: %s", err.msg);
    uniform_model(&m, 4, UINT64_MAX / 2);
    CHECK(plan_make(&m, nodes, 1, 0.1, &r, &err) == -1 && strstr(err.msg, "overflow"), "sizes past 64 bits: %s",
          err.msg);
    uniform_model(&m, 4, GiB);
    CHECK(plan_make(&m, nodes, 1, 0.1, &r, NULL) == 0, "err may be NULL");

    /* property: small cases against the brute force */
    int n_cases = 400, n_feasible = 0, bad_valid = 0, bad_feas = 0, bad_time = 0, bad_stages = 0, bad_share = 0;
    int bad_lack = 0, n_lack = 0;
    for (int it = 0; it < n_cases; it++) {
        int nn;
        double hr;
        random_case(&m, nodes, &nn, &hr, 10, 4);
        ref_best best = {0, 0, 0, 0, 0};
        int ref_ok = ref_plan(&m, nodes, nn, hr, &best);
        err.msg[0] = 0;
        rc = plan_make(&m, nodes, nn, hr, &r, &err);
        if ((rc == 0) != ref_ok) {
            if (bad_feas++ < 3)
                printf("# case %d: plan rc %d, brute force %s (%s)\n", it, rc, ref_ok ? "fits" : "none", err.msg);
            continue;
        }
        if (rc != 0) {
            if (err.msg[0] == 0) bad_feas++;
            continue;
        }
        n_feasible++;
        for (int i = 0; i < nn; i++) n_lack += nodes[i].lack != NULL && i == 0;
        const char *why = check_valid(&m, nodes, nn, hr, &r);
        if (why) {
            if (bad_valid++ < 3) printf("# case %d: %s\n", it, why);
            continue;
        }
        double hi, lo;
        result_shares(nodes, &r, &hi, &lo);
        uint64_t lk = 0, lk_said = 0;
        for (int i = 0; i < r.n_stages; i++) {
            lk += ref_lack(&m, &nodes[r.stages[i].node], r.stages[i].a, r.stages[i].b);
            lk_said += r.stages[i].lack_bytes;
        }
        if (lk != best.lack || lk_said != lk) {
            if (bad_lack++ < 3) printf("# case %d: streams %llu (says %llu), brute force %llu\n", it,
                                       (unsigned long long)lk, (unsigned long long)lk_said, (unsigned long long)best.lack);
        } else if (!close_to(r.max_time, best.time)) {
            if (bad_time++ < 3) printf("# case %d: max_time %.17g, brute force %.17g\n", it, r.max_time, best.time);
        } else if (r.n_stages != best.stages) {
            if (bad_stages++ < 3) printf("# case %d: %d stages, brute force %d\n", it, r.n_stages, best.stages);
        } else if (!close_to(hi, best.max_share) || !close_to(lo, best.min_share)) {
            if (bad_share++ < 3)
                printf("# case %d: shares %.6f..%.6f, brute force %.6f..%.6f\n", it, lo, hi, best.min_share,
                       best.max_share);
        }
    }
    CHECK(n_feasible > n_cases / 4 && n_feasible < n_cases, "random small cases: %d of %d fit (both kinds present)",
          n_feasible, n_cases);
    CHECK(bad_feas == 0, "plan fits exactly when the brute force finds a plan, and says why when not (%d wrong)",
          bad_feas);
    CHECK(bad_valid == 0, "every plan covers the layers in ring order within every node's memory (%d wrong)",
          bad_valid);
    CHECK(bad_lack == 0 && n_lack > 0, "what nodes lack: the fewest bytes streamed, first, and each stage says its share "
          "(%d wrong, %d cases with lacks)", bad_lack, n_lack);
    CHECK(bad_time == 0, "max_time equals the brute force's optimum (%d wrong)", bad_time);
    CHECK(bad_stages == 0, "ties: the fewest stages (%d wrong)", bad_stages);
    CHECK(bad_share == 0, "ties: the most even memory (%d wrong)", bad_share);

    /* property: large cases stay valid (and how long the worst case takes) */
    int big_bad = 0, big_fit = 0;
    clock_t t0 = clock();
    for (int it = 0; it < 60; it++) {
        int nn;
        double hr;
        random_case(&m, nodes, &nn, &hr, PLAN_MAX_LAYERS, PLAN_MAX_NODES);
        err.msg[0] = 0;
        rc = plan_make(&m, nodes, nn, hr, &r, &err);
        if (rc == 0) {
            big_fit++;
            const char *why = check_valid(&m, nodes, nn, hr, &r);
            if (why && big_bad++ < 3) printf("# large case %d: %s\n", it, why);
        } else if (err.msg[0] == 0) {
            big_bad++;
        }
    }
    CHECK(big_bad == 0 && big_fit > 0, "random large cases: %d fit, all valid", big_fit);
    uniform_model(&m, PLAN_MAX_LAYERS, GiB);
    for (int i = 0; i < PLAN_MAX_NODES; i++) set_node(&nodes[i], "max:7000", 1000 * GiB, 1e9 * (1 + i % 3));
    clock_t t1 = clock();
    rc = plan_make(&m, nodes, PLAN_MAX_NODES, 0.1, &r, &err);
    double sec = (double)(clock() - t1) / CLOCKS_PER_SEC;
    /* (the times are printed, not asserted: tests assert no timing, and under qemu or a loaded CI machine a
     * bound would be a coin toss) */
    CHECK(rc == 0 && check_valid(&m, nodes, PLAN_MAX_NODES, 0.1, &r) == NULL,
          "256 layers on 64 nodes: %d stages in %.3f s (random large cases %.3f s)", r.n_stages, sec,
          (double)(t1 - t0) / CLOCKS_PER_SEC);

    /* Routed experts from disk (plan_node.disk_bps): 10 layers of 1 GiB, 3/4 of each routed experts, a token
     * reading 1/8 of them; the least cache two experts of 1/64 GiB. */
    uniform_model(&m, 10, GiB);
    for (uint32_t i = 0; i < 10; i++) m.layer_exps[i] = 3 * GiB / 4, m.layer_exps_active[i] = 3 * GiB / 32;
    m.expert_min = GiB / 32;
    set_node(&nodes[0], "ram:7000", 6 * GiB, 1e9);
    rc = plan_make(&m, nodes, 1, 0.0, &r, &err);
    CHECK(rc != 0 && strstr(err.msg, "ring too small"), "6 GiB, no disk: 10 GiB do not fit (%s)", err.msg);
    nodes[0].disk_bps = 0.5e9;
    rc = plan_make(&m, nodes, 1, 0.0, &r, &err);
    /* dense 2.5 GiB resident, 3.5 GiB of 7.5 GiB of experts cached: a token misses 8/15 of 0.9375 GiB */
    const double cached = 3.5 / 7.5, miss = 10.0 * 3 * GiB / 32 * (1 - cached) / 0.5e9;
    CHECK(rc == 0 && r.n_stages == 1 && close_to(r.stages[0].cached, cached) && close_to(r.stages[0].disk_time, miss),
          "with a disk: one stage, %.3f of its experts cached (want %.3f), %.3f s/token from disk (want %.3f)",
          rc == 0 ? r.stages[0].cached : 0, cached, rc == 0 ? r.stages[0].disk_time : 0, miss);
    CHECK(rc == 0 && close_to(r.max_time, 10.0 * GiB / 1e9 + miss), "... its time adds the disk's to the compute");
    nodes[0].mem_bytes = 2 * GiB; /* below the dense part (2.5 GiB) */
    rc = plan_make(&m, nodes, 1, 0.0, &r, &err);
    CHECK(rc != 0 && strstr(err.msg, "even with routed experts read from disk"), "dense part too large: said so (%s)", err.msg);
    /* a node that holds everything beats one that would read from disk, at equal speed */
    set_node(&nodes[0], "disk:7000", 6 * GiB, 1e9);
    nodes[0].disk_bps = 0.5e9;
    set_node(&nodes[1], "big:7000", 20 * GiB, 1e9);
    rc = plan_make(&m, nodes, 2, 0.0, &r, &err);
    CHECK(rc == 0 && r.n_stages >= 1 && r.stages[r.n_stages - 1].node == 1 && r.stages[r.n_stages - 1].cached == 1.0,
          "the node that holds its range in memory takes the larger share");
    for (int i = 0; rc == 0 && i < r.n_stages; i++) {
        CHECK(r.stages[i].cached > 0 && r.stages[i].cached <= 1.0, "stage %d: a share in memory in (0, 1]", i);
    }
    nodes[0].disk_bps = -1;
    CHECK(plan_make(&m, nodes, 2, 0.0, &r, &err) != 0 && strstr(err.msg, "disk speed"), "a negative disk speed is refused");

    /* Two tiers (plan_node.ram_bytes): 10 layers of 1 GiB, 3/4 of each routed experts, a token reading all the
     * dense 1/4 and 1/8 of the experts; a device of 8 GiB at 10 GB/s, RAM of 64 GiB at 1 GB/s. The experts of
     * the first 3 layers in RAM let the rest fit (10 - 2.25 = 7.75 GiB), and beat 8 whole layers on the device. */
    uniform_model(&m, 10, GiB);
    for (uint32_t i = 0; i < 10; i++) {
        m.layer_exps[i] = 3 * GiB / 4, m.layer_exps_active[i] = 3 * GiB / 32;
        m.layer_active[i] = GiB / 4 + 3 * GiB / 32;
    }
    set_node(&nodes[0], "gpu:7000", 8 * GiB, 10e9);
    nodes[0].ram_bytes = 64 * GiB, nodes[0].ram_speed = 1e9;
    snprintf(nodes[0].device, sizeof nodes[0].device, "CUDA0");
    rc = plan_make(&m, nodes, 1, 0.0, &r, &err);
    const double t_moe = (2.5 * GiB + 7.0 * 3 * GiB / 32) / 10e9 + 3.0 * 3 * GiB / 32 / 1e9;
    CHECK(rc == 0 && r.n_stages == 1 && r.stages[0].dev_layers == 10 && r.stages[0].cpu_moe == 3 &&
              r.stages[0].dev_bytes == 31 * GiB / 4 && r.stages[0].mem_bytes == 10 * GiB && close_to(r.max_time, t_moe),
          "8 GiB device, 64 GiB RAM: all 10 layers on the device, experts of the first %u in RAM (want 3), %.3f s (want %.3f)",
          rc == 0 ? r.stages[0].cpu_moe : 0, rc == 0 ? r.max_time : 0, t_moe);
    CHECK(rc == 0 && fabs(ref_tier_plan(&m, nodes, 1, 0.0) - r.max_time) <= 1e-12 * r.max_time, "... the reference agrees");
    /* State held in host memory (speculation's rollback copies, read back from the device): 1/8 GiB a layer
     * for one sequence goes to RAM, so the device's part is the same 7.75 GiB and RAM takes 1.25 GiB more;
     * counted on the device it would have pushed a fourth layer's experts out. */
    m.n_seq = 1;
    for (uint32_t i = 0; i < 10; i++) m.layer_state[i] = m.layer_host[i] = GiB / 8;
    rc = plan_make(&m, nodes, 1, 0.0, &r, &err);
    CHECK(rc == 0 && r.stages[0].dev_layers == 10 && r.stages[0].cpu_moe == 3 && r.stages[0].dev_bytes == 31 * GiB / 4 &&
              r.stages[0].mem_bytes == 45 * GiB / 4,
          "rollback copies of device layers sit in RAM: the device keeps 7.75 GiB, RAM 3.5 GiB (got %u layers' experts "
          "in RAM, %.3f GiB on the device, %.3f in all)", rc == 0 ? r.stages[0].cpu_moe : 0,
          rc == 0 ? (double)r.stages[0].dev_bytes / GiB : 0, rc == 0 ? (double)r.stages[0].mem_bytes / GiB : 0);
    CHECK(rc == 0 && fabs(ref_tier_plan(&m, nodes, 1, 0.0) - r.max_time) <= 1e-12 * r.max_time, "... the reference agrees");
    for (uint32_t i = 0; i < 10; i++) m.layer_state[i] = m.layer_host[i] = 0;
    rc = plan_make(&m, nodes, 1, 0.0, &r, &err);
    {
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        plan_print(&r, nodes, f);
        fclose(f);
        CHECK(buf && strstr(buf, "CUDA0: layers 0-9, their routed experts of 0-2 in RAM") && strstr(buf, "7.8 GiB on CUDA0, 2.2 GiB in RAM"),
              "the printed plan says what is on the device and in RAM:\n%s", buf ? buf : "");
        free(buf);
    }
    nodes[0].ram_bytes = 2 * GiB; /* experts of 3 layers (2.25 GiB) no longer fit RAM; 2 whole layers do */
    rc = plan_make(&m, nodes, 1, 0.0, &r, &err);
    CHECK(rc == 0 && r.stages[0].dev_layers == 8 && r.stages[0].cpu_moe == 0 && r.stages[0].dev_bytes == 8 * GiB,
          "2 GiB of RAM: 8 layers whole on the device, 2 on the CPU (got %u, %u)", rc == 0 ? r.stages[0].dev_layers : 0,
          rc == 0 ? r.stages[0].cpu_moe : 0);
    nodes[0].ram_bytes = GiB;
    rc = plan_make(&m, nodes, 1, 0.0, &r, &err);
    CHECK(rc != 0 && strstr(err.msg, "ring too small"), "1 GiB of RAM: the 10 GiB do not fit 9 GiB (%s)", err.msg);
    /* VRAM -> RAM -> disk: with a disk the 1 GiB of RAM caches what it can of the experts of the first 3
     * layers (with --mem on a GPU node); the least cache is 1/32 GiB. The least n still decides the device's
     * part; 1 GiB of 2.25 caches 4/9, and a token misses 5/9 of the 3 layers' 9/32 GiB read from RAM. */
    m.expert_min = GiB / 32;
    nodes[0].disk_bps = 0.5e9;
    rc = plan_make(&m, nodes, 1, 0.0, &r, &err);
    const double miss3 = 3.0 * 3 * GiB / 32 * (1.0 - 4.0 / 9.0) / 0.5e9;
    CHECK(rc == 0 && r.stages[0].dev_layers == 10 && r.stages[0].cpu_moe == 3 && close_to(r.stages[0].cached, 4.0 / 9.0) &&
              close_to(r.stages[0].disk_time, miss3) && close_to(r.max_time, t_moe + miss3),
          "1 GiB of RAM and a disk: dense parts on the device, the first 3 layers' experts %.3f cached (want %.3f), "
          "%.4f s/token from disk (want %.4f)", rc == 0 ? r.stages[0].cached : 0, 4.0 / 9.0,
          rc == 0 ? r.stages[0].disk_time : 0, miss3);
    CHECK(rc == 0 && fabs(ref_tier_plan(&m, nodes, 1, 0.0) - r.max_time) <= 1e-12 * r.max_time, "... the reference agrees");
    {
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        plan_print(&r, nodes, f);
        fclose(f);
        CHECK(buf && strstr(buf, "their routed experts of 0-2 in RAM") && strstr(buf, "experts in RAM 44% in memory, the rest from disk"),
              "the printed plan says how much of the experts in RAM is cached:\n%s", buf ? buf : "");
        free(buf);
    }
    nodes[0].ram_bytes = GiB / 2;
    rc = plan_make(&m, nodes, 1, 0.0, &r, &err);
    CHECK(rc == 0 && r.stages[0].cpu_moe == 3 && close_to(r.stages[0].cached, 2.0 / 9.0), "1/2 GiB of RAM: 2/9 cached");
    nodes[0].disk_bps = 0, m.expert_min = 0;
    set_node(&nodes[0], "slowgpu:7000", 20 * GiB, 0.5e9);
    nodes[0].ram_bytes = 64 * GiB, nodes[0].ram_speed = 1e9;
    rc = plan_make(&m, nodes, 1, 0.0, &r, &err);
    CHECK(rc == 0 && r.stages[0].dev_layers == 0 && r.stages[0].dev_bytes == 0,
          "a device slower than the CPU gets nothing when RAM holds it all");
    nodes[0].ram_speed = 0;
    CHECK(plan_make(&m, nodes, 1, 0.0, &r, &err) != 0 && strstr(err.msg, "RAM speed"), "RAM without a speed is refused");
    /* random rings of one- and two-tier nodes against the brute force */
    int bad = 0, feasible = 0;
    for (int it = 0; it < 400; it++) {
        int nn;
        double hr;
        random_case(&m, nodes, &nn, &hr, 7, 3);
        m.expert_min = rng_in(0, 8);
        for (uint32_t i = 0; i < m.n_layer; i++) {
            m.layer_exps[i] = rng_in(0, m.layer_bytes[i]);
            m.layer_exps_active[i] = rng_in(0, m.layer_active[i] < m.layer_exps[i] ? m.layer_active[i] : m.layer_exps[i]);
        }
        for (int i = 0; i < nn; i++) {
            nodes[i].lack = NULL;
            if (rng() % 2) {
                nodes[i].ram_bytes = rng_in(1, 2 * nodes[i].mem_bytes + 50);
                nodes[i].ram_speed = nodes[i].speed * (double)rng_in(1, 8) / 4.0;
                if (rng() % 2) nodes[i].disk_bps = nodes[i].speed * (double)rng_in(1, 4) / 8.0; /* VRAM -> RAM -> disk */
            }
        }
        const double want = ref_tier_plan(&m, nodes, nn, hr);
        rc = plan_make(&m, nodes, nn, hr, &r, &err);
        if ((rc == 0) != isfinite(want) || (rc == 0 && fabs(r.max_time - want) > 1e-12 * want)) {
            if (bad++ < 3) printf("# case %d: plan %s %.6g, brute force %.6g\n", it, rc == 0 ? "ok" : err.msg, rc == 0 ? r.max_time : 0, want);
        }
        feasible += rc == 0;
        for (int s2 = 0; rc == 0 && s2 < r.n_stages; s2++) {
            const plan_stage *st = &r.stages[s2];
            const plan_node *nd = &nodes[st->node];
            if (!nd->ram_bytes) continue;
            uint64_t d, rr, ad, ar;
            ref_tier(&m, st->a, st->b, st->dev_layers, st->cpu_moe, &d, &rr, &ad, &ar);
            const uint64_t ram_part = ref_head(rr, hr) > nd->ram_bytes ? nd->ram_bytes : ref_head(rr, hr); /* (a cache fills RAM) */
            if (ref_head(d, hr) != st->dev_bytes || ref_head(d, hr) + ram_part != st->mem_bytes ||
                st->dev_bytes > nd->mem_bytes || st->mem_bytes - st->dev_bytes > nd->ram_bytes) {
                if (bad++ < 3) printf("# case %d: stage %d's tiers misreported or over\n", it, s2);
            }
        }
    }
    CHECK(bad == 0 && feasible > 50, "400 random rings with two-tier nodes (some with a disk): the plan's time equals the brute force's "
          "(%d feasible, %d wrong)", feasible, bad);

    return check_done();
}
