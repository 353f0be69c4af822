/* prompt_cache.c - the server's host-RAM prompt cache (prompt_cache.h). */
#include "prompt_cache.h"

#include <stdlib.h>
#include <string.h>

void pc_init(pc_cache *c, size_t budget) {
    memset(c, 0, sizeof *c);
    c->budget = budget;
}

static void pc_drop(pc_cache *c, int i) {
    c->bytes -= pc_entry_bytes(c->e[i].n, c->e[i].len);
    free(c->e[i].tokens);
    free(c->e[i].blob);
    c->e[i] = c->e[--c->n];
}

void pc_free(pc_cache *c) {
    while (c->n > 0) pc_drop(c, c->n - 1);
    free(c->e);
    memset(c, 0, sizeof *c);
}

size_t pc_entry_bytes(uint32_t n, size_t len) { return len + (size_t)n * sizeof(int32_t) + sizeof(pc_entry); }

/* Eight bytes at a time, multiply-xor-rotate: a few GB/s, so checking a state of hundreds of MiB before
 * restoring it costs a small fraction of reading its tokens again. */
static uint64_t pc_mix(uint64_t h, const uint8_t *p, size_t len) {
    const uint64_t k = 0x9e3779b97f4a7c15ULL;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = (h ^ (w * k)) * 0xbf58476d1ce4e5b9ULL;
        h ^= h >> 31;
    }
    for (; i < len; i++) h = (h ^ p[i]) * 0x100000001b3ULL;
    return h ^ (uint64_t)len;
}

uint64_t pc_sum(const int32_t *tokens, uint32_t n, const uint8_t *blob, size_t len) {
    uint64_t h = pc_mix(0xcbf29ce484222325ULL, (const uint8_t *)tokens, (size_t)n * sizeof *tokens);
    return pc_mix(h, blob, len);
}

static int pc_index(const pc_cache *c, const int32_t *tokens, uint32_t n) {
    for (int i = 0; i < c->n; i++) {
        if (c->e[i].n == n && memcmp(c->e[i].tokens, tokens, (size_t)n * sizeof *tokens) == 0) return i;
    }
    return -1;
}

bool pc_has(const pc_cache *c, const int32_t *tokens, uint32_t n) { return pc_index(c, tokens, n) >= 0; }

int pc_find(pc_cache *c, const int32_t *tokens, size_t n, uint32_t max) {
    for (;;) {
        int best = -1;
        for (int i = 0; i < c->n; i++) {
            const pc_entry *e = &c->e[i];
            if (e->n == 0 || e->n > n || e->n > max || (best >= 0 && e->n <= c->e[best].n)) continue;
            if (memcmp(e->tokens, tokens, (size_t)e->n * sizeof *tokens) == 0) best = i;
        }
        if (best < 0) return -1;
        pc_entry *e = &c->e[best];
        if (pc_sum(e->tokens, e->n, e->blob, e->len) == e->sum) {
            e->used = ++c->clock;
            return best;
        }
        c->corrupt++; /* never restore it; look for the next longest */
        pc_drop(c, best);
    }
}

int pc_put(pc_cache *c, const int32_t *tokens, uint32_t n, uint8_t *blob, size_t len, rl_err *err) {
    const size_t need = pc_entry_bytes(n, len);
    if (need > c->budget) {
        free(blob);
        return rl_errf(err, "a cached prefix of %u tokens takes %zu bytes, over the prompt cache's %zu", n, need, c->budget);
    }
    int same = pc_index(c, tokens, n);
    if (same >= 0) pc_drop(c, same);
    while (c->bytes + need > c->budget && c->n > 0) {
        int lru = 0;
        for (int i = 1; i < c->n; i++) {
            if (c->e[i].used < c->e[lru].used) lru = i;
        }
        pc_drop(c, lru);
        c->evicted++;
    }
    if (c->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 8;
        pc_entry *ne = realloc(c->e, (size_t)cap * sizeof *ne);
        if (!ne) {
            free(blob);
            return rl_errf(err, "out of memory for the prompt cache's index");
        }
        c->e = ne;
        c->cap = cap;
    }
    int32_t *t = malloc((n ? n : 1) * sizeof *t);
    if (!t) {
        free(blob);
        return rl_errf(err, "out of memory for a cached prefix of %u tokens", n);
    }
    memcpy(t, tokens, (size_t)n * sizeof *t);
    c->e[c->n++] = (pc_entry){.tokens = t, .n = n, .blob = blob, .len = len, .sum = pc_sum(t, n, blob, len), .used = ++c->clock};
    c->bytes += need;
    c->stored++;
    return 0;
}
