/* grammar.c - byte grammars and their recognizer (grammar.h).
 *
 * The compiled grammar lays each alternative out as a run of elements ended by END, like llama.cpp's
 * llama_grammar_element arrays. A parse stack lists element positions, the top one last; after expansion
 * every live stack's top is a byte set (or the stack is empty: the sentence is whole). Expansion replaces
 * a rule reference by each of the rule's alternatives, below them the position after the reference - left
 * out when that is END, so right recursion (how repetition is written) does not grow the stack. */
#include "grammar.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

enum { OP_END, OP_SET, OP_REF };

typedef struct gr_el {
    uint32_t op : 2;
    uint32_t arg : 30; /* OP_SET: set index; OP_REF: rule */
} gr_el;

#define INF_LEN (UINT32_MAX / 4)

struct gr_grammar {
    gr_el *el;          /* alternatives, each ended by OP_END */
    uint32_t *minrest;  /* [n_el] fewest bytes from this element to its alternative's end */
    uint32_t *alt;      /* [n_alt] first element of each alternative, grouped by rule */
    uint32_t *rule_alt; /* [n_rules + 1] the rule's alternatives: alt[rule_alt[r] .. rule_alt[r + 1]) */
    uint8_t (*sets)[32];
    int root;
    uint32_t n_rules, n_sets, n_alts, n_el;
    atomic_int refs;
};

/* ---- building ---------------------------------------------------------------------------------------- */

typedef struct b_alt {
    int rule;
    uint32_t start, len; /* into b->el */
} b_alt;

struct gr_builder {
    gr_el *el;
    size_t n_el, cap_el;
    b_alt *alts;
    size_t n_alts, cap_alts;
    uint8_t (*sets)[32];
    size_t n_sets, cap_sets;
    int32_t single[256]; /* interned singleton set per byte; -1 = none yet */
    int n_rules;
    int oom;
};

static int grow(void **p, size_t *cap, size_t need, size_t size) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *np = realloc(*p, c * size);
    if (!np) return -1;
    *p = np;
    *cap = c;
    return 0;
}

gr_builder *gr_builder_new(void) {
    gr_builder *b = calloc(1, sizeof *b);
    if (b) memset(b->single, 0xff, sizeof b->single);
    return b;
}

void gr_builder_free(gr_builder *b) {
    if (!b) return;
    free(b->el), free(b->alts), free(b->sets), free(b);
}

int gr_rule_new(gr_builder *b) { return b->n_rules++; }

void gr_set_clear(uint8_t set[32]) { memset(set, 0, 32); }

void gr_set_add(uint8_t set[32], unsigned char lo, unsigned char hi) {
    for (unsigned c = lo; c <= hi; c++) set[c >> 3] |= (uint8_t)(1u << (c & 7));
}

static bool set_has(const uint8_t set[32], unsigned char c) { return set[c >> 3] >> (c & 7) & 1; }

static int32_t set_intern(gr_builder *b, const uint8_t set[32]) {
    for (size_t i = 0; i < b->n_sets; i++)
        if (memcmp(b->sets[i], set, 32) == 0) return (int32_t)i;
    if (grow((void **)&b->sets, &b->cap_sets, b->n_sets + 1, 32)) return b->oom = 1, -1;
    memcpy(b->sets[b->n_sets], set, 32);
    return (int32_t)b->n_sets++;
}

static int32_t set_single(gr_builder *b, unsigned char c) {
    if (b->single[c] >= 0) return b->single[c];
    uint8_t s[32];
    gr_set_clear(s);
    gr_set_add(s, c, c);
    return b->single[c] = set_intern(b, s);
}

static void el_push(gr_builder *b, unsigned op, uint32_t arg) {
    if (b->oom || grow((void **)&b->el, &b->cap_el, b->n_el + 1, sizeof *b->el)) {
        b->oom = 1;
        return;
    }
    b->el[b->n_el++] = (gr_el){.op = op, .arg = arg};
}

void gr_alt_add(gr_builder *b, int r, const gr_item *items, int n) {
    if (b->oom) return;
    uint32_t start = (uint32_t)b->n_el;
    for (int i = 0; i < n; i++) {
        const gr_item *it = &items[i];
        if (it->kind == GR_RULE) {
            el_push(b, OP_REF, (uint32_t)it->rule);
        } else if (it->kind == GR_SET) {
            int32_t s = set_intern(b, it->set);
            if (s >= 0) el_push(b, OP_SET, (uint32_t)s);
        } else {
            for (const char *c = it->lit; *c; c++) {
                int32_t s = set_single(b, (unsigned char)*c);
                if (s >= 0) el_push(b, OP_SET, (uint32_t)s);
            }
        }
    }
    if (b->oom || grow((void **)&b->alts, &b->cap_alts, b->n_alts + 1, sizeof *b->alts)) {
        b->oom = 1;
        return;
    }
    b->alts[b->n_alts++] = (b_alt){.rule = r, .start = start, .len = (uint32_t)b->n_el - start};
}

gr_grammar *gr_ref(gr_grammar *g) {
    if (g) atomic_fetch_add(&g->refs, 1);
    return g;
}

void gr_free(gr_grammar *g) {
    if (!g || atomic_fetch_sub(&g->refs, 1) > 1) return;
    free(g->el), free(g->minrest), free(g->alt), free(g->rule_alt), free(g->sets), free(g);
}

static uint32_t sat_add(uint32_t a, uint32_t b) { return a + b >= INF_LEN ? INF_LEN : a + b; }

/* Expanding a rule that reaches itself through references that can all be empty would never reach a byte
 * (and, with several such alternatives, branch exponentially first): find one. The rules a rule can start
 * with form a graph; a depth-first search with colours finds a cycle. Returns the rule, -1 for none, -2
 * out of memory. */
static int left_visit(const gr_grammar *g, const uint32_t *rule_min, uint8_t *colour, int r) {
    colour[r] = 1;
    for (uint32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++) {
        for (uint32_t p = g->alt[a]; g->el[p].op == OP_REF; p++) {
            int t = (int)g->el[p].arg;
            if (colour[t] == 1) return t;
            if (colour[t] == 0) {
                int c = left_visit(g, rule_min, colour, t);
                if (c >= 0) return c;
            }
            if (rule_min[t] != 0) break; /* t reads a byte before what follows it */
        }
    }
    colour[r] = 2;
    return -1;
}

static int left_recursive(const gr_grammar *g, int nr, const uint32_t *rule_min) {
    uint8_t *colour = calloc((size_t)nr, 1);
    if (!colour) return -2;
    int found = -1;
    for (int r = 0; r < nr && found < 0; r++)
        if (colour[r] == 0) found = left_visit(g, rule_min, colour, r);
    free(colour);
    return found;
}

gr_grammar *gr_build(const gr_builder *b, int root, rl_err *err) {
    if (b->oom) return rl_errf(err, "grammar: out of memory"), NULL;
    if (root < 0 || root >= b->n_rules) return rl_errf(err, "grammar: no rule %d", root), NULL;
    int nr = b->n_rules;
    size_t n_el = b->n_el + b->n_alts; /* each alternative gains its END */
    gr_grammar *g = calloc(1, sizeof *g);
    if (!g) return rl_errf(err, "grammar: out of memory"), NULL;
    g->root = root;
    g->n_rules = (uint32_t)nr;
    g->n_sets = (uint32_t)b->n_sets;
    g->n_alts = (uint32_t)b->n_alts;
    g->n_el = (uint32_t)n_el;
    atomic_init(&g->refs, 1);
    g->el = malloc((n_el + 1) * sizeof *g->el);
    g->minrest = malloc((n_el + 1) * sizeof *g->minrest);
    g->alt = malloc((b->n_alts + 1) * sizeof *g->alt);
    g->rule_alt = calloc((size_t)nr + 1, sizeof *g->rule_alt);
    g->sets = malloc((b->n_sets + 1) * 32);
    uint32_t *rule_min = malloc((size_t)nr * sizeof *rule_min);
    if (!g->el || !g->minrest || !g->alt || !g->rule_alt || !g->sets || !rule_min) {
        free(rule_min);
        gr_free(g);
        return rl_errf(err, "grammar: out of memory"), NULL;
    }
    if (b->n_sets) memcpy(g->sets, b->sets, b->n_sets * 32);
    /* group the alternatives by rule (counting sort keeps each rule's alternatives in their order) */
    for (size_t a = 0; a < b->n_alts; a++) g->rule_alt[b->alts[a].rule + 1]++;
    for (int r = 0; r < nr; r++) g->rule_alt[r + 1] += g->rule_alt[r];
    uint32_t *fill = calloc((size_t)nr, sizeof *fill);
    if (!fill) {
        free(rule_min);
        gr_free(g);
        return rl_errf(err, "grammar: out of memory"), NULL;
    }
    size_t at = 0;
    for (int r = 0; r < nr; r++) {
        for (size_t a = 0; a < b->n_alts; a++) {
            if (b->alts[a].rule != r) continue;
            g->alt[g->rule_alt[r] + fill[r]++] = (uint32_t)at;
            if (b->alts[a].len) memcpy(g->el + at, b->el + b->alts[a].start, b->alts[a].len * sizeof *g->el);
            at += b->alts[a].len;
            g->el[at++] = (gr_el){.op = OP_END};
        }
    }
    free(fill);
    int bad = -1;
    for (int r = 0; r < nr && bad < 0; r++)
        if (g->rule_alt[r] == g->rule_alt[r + 1]) bad = r;
    if (bad >= 0) {
        free(rule_min);
        gr_free(g);
        return rl_errf(err, "grammar: rule %d has no alternative", bad), NULL;
    }
    /* fewest bytes each rule derives: a fixed point from "infinitely many" down */
    for (int r = 0; r < nr; r++) rule_min[r] = INF_LEN;
    for (bool changed = true; changed;) {
        changed = false;
        for (int r = 0; r < nr; r++) {
            for (uint32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++) {
                uint32_t len = 0;
                for (uint32_t p = g->alt[a]; g->el[p].op != OP_END; p++)
                    len = sat_add(len, g->el[p].op == OP_SET ? 1 : rule_min[g->el[p].arg]);
                if (len < rule_min[r]) rule_min[r] = len, changed = true;
            }
        }
    }
    for (size_t p = n_el; p-- > 0;) {
        const gr_el *e = &g->el[p];
        g->minrest[p] = e->op == OP_END ? 0 : sat_add(e->op == OP_SET ? 1 : rule_min[e->arg], g->minrest[p + 1]);
    }
    bool finite = rule_min[root] < INF_LEN;
    int left = finite ? left_recursive(g, nr, rule_min) : -1;
    free(rule_min);
    if (!finite) {
        gr_free(g);
        return rl_errf(err, "grammar: the start rule derives no finite text"), NULL;
    }
    if (left != -1) {
        gr_free(g);
        if (left == -2) return rl_errf(err, "grammar: out of memory"), NULL;
        return rl_errf(err, "grammar: rule %d can reach itself before reading a byte (left recursion)", left), NULL;
    }
    return g;
}

/* ---- the wire form ----------------------------------------------------------------------------------- */

#define WIRE_HEAD 24 /* "RLG1", then u32 n_rules, root, n_sets, n_alts, n_items */

static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static uint32_t get32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

int gr_encode(const gr_grammar *g, uint8_t **out, size_t *out_len) {
    const uint32_t n_items = g->n_el - g->n_alts; /* every alternative's items, less its END */
    const size_t len = WIRE_HEAD + (size_t)g->n_sets * 32 + (size_t)g->n_alts * 8 + (size_t)n_items * 4;
    uint8_t *b = malloc(len);
    if (!b) return -1;
    memcpy(b, "RLG1", 4);
    put32(b + 4, g->n_rules);
    put32(b + 8, (uint32_t)g->root);
    put32(b + 12, g->n_sets);
    put32(b + 16, g->n_alts);
    put32(b + 20, n_items);
    size_t o = WIRE_HEAD;
    if (g->n_sets) memcpy(b + o, g->sets, (size_t)g->n_sets * 32);
    o += (size_t)g->n_sets * 32;
    size_t oi = o + (size_t)g->n_alts * 8;
    for (uint32_t r = 0; r < g->n_rules; r++) {
        for (uint32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++) {
            uint32_t k = 0;
            for (uint32_t p = g->alt[a]; g->el[p].op != OP_END; p++, k++) {
                put32(b + oi, (uint32_t)g->el[p].op << 30 | g->el[p].arg);
                oi += 4;
            }
            put32(b + o, r);
            put32(b + o + 4, k);
            o += 8;
        }
    }
    *out = b;
    *out_len = len;
    return 0;
}

gr_grammar *gr_decode(const uint8_t *b, size_t len, rl_err *err) {
    if (len < WIRE_HEAD || memcmp(b, "RLG1", 4) != 0) return rl_errf(err, "grammar: not a grammar's wire form"), NULL;
    const uint32_t nr = get32(b + 4), root = get32(b + 8), ns = get32(b + 12), na = get32(b + 16), ni = get32(b + 20);
    /* each count bounded by the bytes it needs, before anything is sized from it */
    if (nr == 0 || nr > len || root >= nr || ns > len / 32 || na > len / 8 || ni > len / 4 || ni >= (1u << 30) ||
        len != WIRE_HEAD + (size_t)ns * 32 + (size_t)na * 8 + (size_t)ni * 4) {
        return rl_errf(err, "grammar: its wire form's counts do not match its %zu bytes", len), NULL;
    }
    const uint8_t *sets = b + WIRE_HEAD, *alts = sets + (size_t)ns * 32, *items = alts + (size_t)na * 8;
    gr_builder *bl = gr_builder_new();
    gr_item *it = malloc(((size_t)ni + 1) * sizeof *it);
    if (!bl || !it) {
        gr_builder_free(bl);
        free(it);
        return rl_errf(err, "grammar: out of memory"), NULL;
    }
    for (uint32_t r = 0; r < nr; r++) gr_rule_new(bl);
    for (uint32_t i = 0; i < ns; i++) set_intern(bl, sets + (size_t)i * 32); /* first, so they keep their numbers */
    const char *bad = NULL;
    size_t at = 0;
    for (uint32_t a = 0; a < na && !bad; a++) {
        uint32_t rule = get32(alts + (size_t)a * 8), k = get32(alts + (size_t)a * 8 + 4);
        if (rule >= nr || k > ni - at) {
            bad = "an alternative of no rule, or past the items";
            break;
        }
        for (uint32_t j = 0; j < k; j++) {
            uint32_t v = get32(items + (at + j) * 4), op = v >> 30, arg = v & ((1u << 30) - 1);
            if (op == OP_SET && arg < ns) it[j] = (gr_item){.kind = GR_SET, .set = sets + (size_t)arg * 32};
            else if (op == OP_REF && arg < nr) it[j] = (gr_item){.kind = GR_RULE, .rule = (int)arg};
            else bad = "an item that is neither a listed byte set nor a rule";
        }
        if (!bad) gr_alt_add(bl, (int)rule, it, (int)k);
        at += k;
    }
    if (!bad && at != ni) bad = "items no alternative holds";
    free(it);
    gr_grammar *g = NULL;
    if (bad) rl_errf(err, "grammar: its wire form has %s", bad);
    else g = gr_build(bl, (int)root, err);
    gr_builder_free(bl);
    return g;
}

/* ---- recognizing ------------------------------------------------------------------------------------- */

static int st_reserve(gr_state *s, size_t more) {
    return grow((void **)&s->buf, &s->cap, s->n + more, sizeof *s->buf);
}

/* Adds a stack unless it is there already (or the state is full). */
static int st_push(gr_state *s, const uint32_t *fr, uint32_t len) {
    size_t at = 0;
    for (int i = 0; i < s->n_stacks; i++) {
        uint32_t l = s->buf[at];
        if (l == len && memcmp(s->buf + at + 1, fr, len * sizeof *fr) == 0) return 0;
        at += 1 + l;
    }
    if (s->n_stacks == GR_MAX_STACKS) return 0;
    if (st_reserve(s, 1 + len)) return -1;
    s->buf[s->n++] = len;
    memcpy(s->buf + s->n, fr, len * sizeof *fr);
    s->n += len;
    s->n_stacks++;
    return 0;
}

/* Expands a stack into out until its top is a byte set (or it is empty). fr is not changed: a reference
 * builds each alternative's stack in a fresh copy. depth bounds chains of empty alternatives. */
static int expand(const gr_grammar *g, gr_state *out, const uint32_t *fr, uint32_t len, int depth) {
    if (depth > 2 * GR_MAX_FRAMES) return 0;
    if (len == 0) return st_push(out, fr, 0);
    uint32_t pos = fr[len - 1];
    gr_el e = g->el[pos];
    if (e.op == OP_SET) return st_push(out, fr, len);
    if (e.op == OP_END) return expand(g, out, fr, len - 1, depth + 1);
    uint32_t base = len - 1;
    bool cont = g->el[pos + 1].op != OP_END;
    if (base + cont + 1 > GR_MAX_FRAMES) return 0;
    uint32_t *nf = malloc((base + 2) * sizeof *nf);
    if (!nf) return -1;
    memcpy(nf, fr, base * sizeof *nf);
    if (cont) nf[base] = pos + 1;
    int rc = 0;
    for (uint32_t a = g->rule_alt[e.arg]; a < g->rule_alt[e.arg + 1] && rc == 0; a++) {
        nf[base + cont] = g->alt[a];
        rc = expand(g, out, nf, base + cont + 1, depth + 1);
    }
    free(nf);
    return rc;
}

int gr_state_init(const gr_grammar *g, gr_state *s) {
    memset(s, 0, sizeof *s);
    for (uint32_t a = g->rule_alt[g->root]; a < g->rule_alt[g->root + 1]; a++) {
        uint32_t fr = g->alt[a];
        if (expand(g, s, &fr, 1, 0)) return -1;
    }
    return 0;
}

void gr_state_free(gr_state *s) {
    free(s->buf);
    memset(s, 0, sizeof *s);
}

int gr_state_copy(gr_state *dst, const gr_state *src) {
    dst->n = 0;
    if (grow((void **)&dst->buf, &dst->cap, src->n, sizeof *dst->buf)) return -1;
    if (src->n) memcpy(dst->buf, src->buf, src->n * sizeof *dst->buf);
    dst->n = src->n;
    dst->n_stacks = src->n_stacks;
    return 0;
}

static bool feed1(const gr_grammar *g, gr_state *s, unsigned char c) {
    gr_state out = {0};
    size_t at = 0;
    uint32_t tmp[GR_MAX_FRAMES];
    for (int i = 0; i < s->n_stacks; i++) {
        uint32_t len = s->buf[at];
        const uint32_t *fr = s->buf + at + 1;
        at += 1 + len;
        if (len == 0 || !set_has(g->sets[g->el[fr[len - 1]].arg], c)) continue;
        memcpy(tmp, fr, len * sizeof *tmp);
        tmp[len - 1]++; /* past the set */
        if (expand(g, &out, tmp, len, 0)) break;
    }
    free(s->buf);
    *s = out;
    return s->n_stacks > 0;
}

bool gr_feed(const gr_grammar *g, gr_state *s, const char *bytes, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!feed1(g, s, (unsigned char)bytes[i])) return false;
    return s->n_stacks > 0;
}

bool gr_done(const gr_grammar *g, const gr_state *s) {
    (void)g;
    size_t at = 0;
    for (int i = 0; i < s->n_stacks; i++) {
        if (s->buf[at] == 0) return true;
        at += 1 + s->buf[at];
    }
    return false;
}

/* Fewest bytes that finish stack i (its frames' rests summed); which stack has the fewest. */
static size_t close_min(const gr_grammar *g, const gr_state *s, int *which) {
    size_t best = SIZE_MAX, at = 0;
    for (int i = 0; i < s->n_stacks; i++) {
        uint32_t len = s->buf[at];
        uint32_t sum = 0;
        for (uint32_t f = 0; f < len; f++) sum = sat_add(sum, g->minrest[s->buf[at + 1 + f]]);
        if (sum < best) best = sum, *which = i;
        at += 1 + len;
    }
    return best;
}

size_t gr_close_len(const gr_grammar *g, const gr_state *s) {
    int w;
    return close_min(g, s, &w);
}

size_t gr_close(const gr_grammar *g, const gr_state *s, char *out, size_t cap) {
    gr_state t = {0};
    if (gr_state_copy(&t, s)) return SIZE_MAX;
    size_t n = 0;
    for (;;) {
        int w = -1;
        size_t left = close_min(g, &t, &w);
        if (left == SIZE_MAX || n + left + 1 > cap) {
            n = SIZE_MAX;
            break;
        }
        if (left == 0) break;
        /* follow the cheapest stack: its top set's lowest byte */
        size_t at = 0;
        for (int i = 0; i < w; i++) at += 1 + t.buf[at];
        const uint8_t *set = g->sets[g->el[t.buf[at + t.buf[at]]].arg];
        unsigned c = 0;
        while (c < 256 && !set_has(set, (unsigned char)c)) c++;
        out[n++] = (char)c;
        if (!feed1(g, &t, (unsigned char)c)) {
            n = SIZE_MAX;
            break;
        }
    }
    if (n != SIZE_MAX) out[n] = 0;
    gr_state_free(&t);
    return n;
}
