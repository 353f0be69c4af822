/* synth_vocab.c - learns a small byte-level BPE from the embedded corpus and lays it out like K3's vocabulary.
 *
 * Training is the classic incremental BPE: the corpus is pre-split into words (merges never cross a word
 * boundary, as in llama.cpp where the kimi-k2 splitter runs before BPE), identical words are counted once
 * with a weight, and each step merges the most frequent adjacent pair. Pair counts are kept up to date
 * incrementally (only words that contain the merged pair are touched, found through a per-pair word list),
 * and the best pair comes from a max-heap with lazy deletion. Ties are broken by the pair's bytes
 * (left token, then right token, compared as byte strings), so the result depends on nothing but the corpus
 * and n_vocab. */
#include "synth_vocab.h"

#include <gguf.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------------------ */
/* Pre-splitting: an approximation of llama.cpp's kimi-k2 splitter (unicode.cpp), good enough to decide    */
/* where merges may be learned. Exactness does not matter for training; llama.cpp splits with its own.     */

enum { SV_C_OTHER, SV_C_LETTER, SV_C_DIGIT, SV_C_SPACE, SV_C_HAN };

static size_t sv_utf8_dec(const unsigned char *s, size_t len, size_t pos, uint32_t *cp) {
    unsigned c = s[pos];
    size_t n;
    uint32_t v;
    if (c < 0x80) { *cp = c; return 1; }
    if (c >= 0xC2 && c <= 0xDF) { n = 2; v = c & 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) { n = 3; v = c & 0x0F; }
    else if (c >= 0xF0 && c <= 0xF4) { n = 4; v = c & 0x07; }
    else { *cp = 0xFFFD; return 1; }
    if (pos + n > len) { *cp = 0xFFFD; return 1; }
    for (size_t i = 1; i < n; i++) {
        unsigned d = s[pos + i];
        if ((d & 0xC0) != 0x80) { *cp = 0xFFFD; return 1; }
        v = (v << 6) | (d & 0x3F);
    }
    *cp = v;
    return n;
}

static int sv_is_han(uint32_t c) {
    /* the same blocks llama.cpp's unicode_cpt_is_han lists */
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
           (c >= 0x2A700 && c <= 0x2EBEF) || (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

/* Coarse Unicode classes: letters (\p{L}), digits (\p{N}), whitespace, Han, and everything else (punctuation,
 * symbols, emoji, combining marks - a mark is not a letter for llama.cpp's splitter, so it ends a word). */
static int sv_class(uint32_t c) {
    if (c < 0x80) {
        if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return SV_C_LETTER;
        if (c >= '0' && c <= '9') return SV_C_DIGIT;
        if (c == ' ' || (c >= 9 && c <= 13)) return SV_C_SPACE;
        return SV_C_OTHER;
    }
    if (sv_is_han(c)) return SV_C_HAN;
    if (c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
        c == 0x202F || c == 0x205F || c == 0x3000)
        return SV_C_SPACE;
    if (c < 0x100) {
        if (c == 0xAA || c == 0xB5 || c == 0xBA) return SV_C_LETTER;
        if (c == 0xB2 || c == 0xB3 || c == 0xB9 || (c >= 0xBC && c <= 0xBE)) return SV_C_DIGIT;
        if (c >= 0xC0 && c != 0xD7 && c != 0xF7) return SV_C_LETTER;
        return SV_C_OTHER;
    }
    if (c < 0x300) return (c <= 0x2C1 || (c >= 0x2C6 && c <= 0x2D1) || (c >= 0x2E0 && c <= 0x2E4) || c == 0x2EC ||
                           c == 0x2EE) ? SV_C_LETTER : SV_C_OTHER;
    if (c < 0x370) return SV_C_OTHER;                                   /* combining marks */
    if (c < 0x400) return (c == 0x375 || c == 0x37E || c == 0x384 || c == 0x385 || c == 0x387 || c == 0x3F6)
                              ? SV_C_OTHER : SV_C_LETTER;
    if (c < 0x530) return (c >= 0x482 && c <= 0x489) ? SV_C_OTHER : SV_C_LETTER;
    if ((c >= 0x660 && c <= 0x669) || (c >= 0x6F0 && c <= 0x6F9) || (c >= 0x966 && c <= 0x96F)) return SV_C_DIGIT;
    if (c < 0x2000) return SV_C_LETTER;                                 /* other scripts, roughly */
    if ((c >= 0x2150 && c <= 0x218B) || (c >= 0x2460 && c <= 0x249B) || (c >= 0x2070 && c <= 0x2079 && c != 0x2071) ||
        (c >= 0x2080 && c <= 0x2089))
        return SV_C_DIGIT;
    if (c == 0x2071 || c == 0x207F || (c >= 0x2090 && c <= 0x209C)) return SV_C_LETTER;
    if (c < 0x2C00) return SV_C_OTHER;                                  /* punctuation, symbols, arrows, boxes */
    if (c < 0x2E00) return SV_C_LETTER;
    if (c < 0x3000) return SV_C_OTHER;                                  /* radicals are So, not Han */
    if (c < 0x3040) {
        if (c == 0x3007 || (c >= 0x3021 && c <= 0x3029) || (c >= 0x3038 && c <= 0x303A)) return SV_C_DIGIT;
        if (c == 0x3005 || c == 0x3006 || (c >= 0x3031 && c <= 0x3035) || c == 0x303B || c == 0x303C)
            return SV_C_LETTER;
        return SV_C_OTHER;                                              /* CJK punctuation */
    }
    if (c < 0x3100) {
        if ((c >= 0x3041 && c <= 0x3096) || (c >= 0x309D && c <= 0x309F) || (c >= 0x30A1 && c <= 0x30FA) ||
            c >= 0x30FC)
            return SV_C_LETTER;
        return SV_C_OTHER;                                              /* voicing marks, ゠, ・ */
    }
    if (c < 0x3190) return SV_C_LETTER;                                 /* bopomofo, hangul jamo */
    if (c >= 0x31A0 && c <= 0x31BF) return SV_C_LETTER;
    if (c >= 0x31F0 && c <= 0x31FF) return SV_C_LETTER;
    if (c < 0xA000) return SV_C_OTHER;                                  /* enclosed / compatibility symbols */
    if (c < 0xD800) return SV_C_LETTER;                                 /* Yi, ..., Hangul syllables */
    if (c < 0xF900) return SV_C_OTHER;                                  /* surrogates, private use */
    if (c >= 0xFB00 && c <= 0xFDFF) return SV_C_LETTER;
    if (c >= 0xFE70 && c <= 0xFEFC) return SV_C_LETTER;
    if (c >= 0xFF10 && c <= 0xFF19) return SV_C_DIGIT;
    if ((c >= 0xFF21 && c <= 0xFF3A) || (c >= 0xFF41 && c <= 0xFF5A) || (c >= 0xFF66 && c <= 0xFFDC))
        return SV_C_LETTER;
    if (c < 0x10000) return SV_C_OTHER;
    if (c >= 0x1D7CE && c <= 0x1D7FF) return SV_C_DIGIT;
    if (c < 0x1D000 || (c >= 0x1D400 && c < 0x1F000) || (c >= 0x20000 && c < 0xE0000)) return SV_C_LETTER;
    return SV_C_OTHER;                                                  /* emoji, symbols, tags */
}

size_t sv_pretok_next(const char *text, size_t len, size_t pos) {
    const unsigned char *s = (const unsigned char *)text;
    uint32_t c, d;
    size_t n = sv_utf8_dec(s, len, pos, &c), p;
    int k = sv_class(c);

    /* 1. a run of Han */
    if (k == SV_C_HAN) {
        for (p = pos + n; p < len; p += n) {
            n = sv_utf8_dec(s, len, p, &d);
            if (sv_class(d) != SV_C_HAN) break;
        }
        return p;
    }
    /* 2. [one char that is not CR/LF, letter or digit] then non-Han letters, then a contraction */
    p = 0;
    if (k == SV_C_LETTER) {
        p = pos + n;
    } else if (k != SV_C_DIGIT && c != '\r' && c != '\n' && pos + n < len) {
        size_t m = sv_utf8_dec(s, len, pos + n, &d);
        if (sv_class(d) == SV_C_LETTER) p = pos + n + m;
    }
    if (p) {
        while (p < len) {
            size_t m = sv_utf8_dec(s, len, p, &d);
            if (sv_class(d) != SV_C_LETTER) break;
            p += m;
        }
        if (p + 1 < len && s[p] == '\'') {
            int a = s[p + 1] | 0x20, b = p + 2 < len ? (s[p + 2] | 0x20) : 0;
            if (a == 's' || a == 't' || a == 'm' || a == 'd') p += 2;
            else if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) p += 3;
        }
        return p;
    }
    /* 3. digits, in pieces of up to 3 from the left */
    if (k == SV_C_DIGIT) {
        int count = 1;
        for (p = pos + n; p < len && count < 3; p += n, count++) {
            n = sv_utf8_dec(s, len, p, &d);
            if (sv_class(d) != SV_C_DIGIT) break;
        }
        return p;
    }
    /* 4. an optional space, a run of "other" characters, then any CR/LF */
    p = pos;
    d = c;
    if (c == ' ' && pos + 1 < len) {
        sv_utf8_dec(s, len, pos + 1, &d);
        p = pos + 1;
    }
    if (sv_class(d) == SV_C_OTHER) {
        while (p < len) {
            size_t m = sv_utf8_dec(s, len, p, &d);
            if (sv_class(d) != SV_C_OTHER) break;
            p += m;
        }
        while (p < len && (s[p] == '\r' || s[p] == '\n')) p++;
        return p;
    }
    /* 5-7. whitespace: through the last CR/LF of the run; else all but the last char of a run followed by
     * text; else the whole run */
    size_t last_nl = 0, last_start = pos, ncp = 0;
    for (p = pos; p < len;) {
        size_t m = sv_utf8_dec(s, len, p, &d);
        if (sv_class(d) != SV_C_SPACE) break;
        if (d == '\r' || d == '\n') last_nl = p + m;
        last_start = p;
        p += m;
        ncp++;
    }
    if (last_nl) return last_nl;
    if (ncp > 1 && p < len) return last_start;
    if (ncp > 0) return p;
    return pos + n; /* 8. one character */
}

/* ------------------------------------------------------------------------------------------------------ */
/* Byte-to-unicode mapping (GPT-2): printable bytes map to themselves, the others to U+0100 upwards.       */

static int sv_byte_printable(int b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

int sv_byte_to_utf8(uint8_t b, char out[2]) {
    uint32_t cp = b;
    if (!sv_byte_printable(b)) {
        int n = 0;
        for (int i = 0; i < b; i++) n += !sv_byte_printable(i);
        cp = 256u + (uint32_t)n;
    }
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

/* ------------------------------------------------------------------------------------------------------ */
/* Trainer state. All tables are plain arrays; nothing is global.                                          */

typedef struct {
    int32_t a, b;
    int64_t count;
    int64_t pushed;   /* count carried by this pair's newest heap entry (-1: none) */
    int32_t *words;   /* words that contained the pair at some point (may hold stale entries) */
    int32_t n_words, cap_words;
    int32_t dirty;    /* merge step that last changed the count */
    uint8_t dead;     /* merged, or banned because its concatenation already is a token */
} sv_pair;

typedef struct {
    int64_t count;
    int32_t pair;
} sv_hent;

typedef struct {
    /* tokens (training ids: 0..255 bytes, then 256 + merge index), as raw bytes in one pool */
    uint8_t *pool;
    size_t pool_len, pool_cap;
    uint32_t *tok_off, *tok_len;
    int32_t n_tok, cap_tok;
    int32_t *tok_hash;            /* open addressing: token id or -1 */
    uint32_t tok_hash_cap;
    /* words */
    int32_t *syms;                /* every word's symbols, back to back */
    size_t *w_off;
    int32_t *w_len;
    int64_t *w_count;
    int32_t *w_stamp;
    int32_t n_words;
    /* pairs */
    sv_pair *pairs;
    int32_t n_pairs, cap_pairs;
    int32_t *pair_hash;           /* open addressing: pair index or -1 */
    uint32_t pair_hash_cap;
    /* heap */
    sv_hent *heap;
    size_t n_heap, cap_heap;
    int32_t *dirty;
    int32_t n_dirty, cap_dirty;
    /* merges, as training token ids */
    int32_t *m_a, *m_b;
    int32_t n_merges;
} sv_trainer;

static uint64_t sv_hash_bytes(const uint8_t *p, size_t n) {
    uint64_t h = 1469598103934665603ull;      /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static uint64_t sv_hash_pair(int32_t a, int32_t b) {
    uint64_t h = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    return h ^ (h >> 33);
}

static int sv_grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) return -1;
    *p = q;
    *cap = c;
    return 0;
}

static int sv_grow32(void **p, int32_t *cap, int32_t need, size_t elem) {
    size_t c = (size_t)*cap;
    if (sv_grow(p, &c, (size_t)need, elem)) return -1;
    *cap = (int32_t)c;
    return 0;
}

/* --- token table --- */

static int32_t sv_tok_find(const sv_trainer *t, const uint8_t *p, size_t n) {
    uint32_t mask = t->tok_hash_cap - 1;
    for (uint32_t i = (uint32_t)sv_hash_bytes(p, n) & mask;; i = (i + 1) & mask) {
        int32_t id = t->tok_hash[i];
        if (id < 0) return -1;
        if (t->tok_len[id] == n && memcmp(t->pool + t->tok_off[id], p, n) == 0) return id;
    }
}

static void sv_tok_hash_put(sv_trainer *t, int32_t id) {
    uint32_t mask = t->tok_hash_cap - 1;
    uint32_t i = (uint32_t)sv_hash_bytes(t->pool + t->tok_off[id], t->tok_len[id]) & mask;
    while (t->tok_hash[i] >= 0) i = (i + 1) & mask;
    t->tok_hash[i] = id;
}

static int sv_tok_add(sv_trainer *t, const uint8_t *a, size_t na, const uint8_t *b, size_t nb) {
    if (sv_grow((void **)&t->pool, &t->pool_cap, t->pool_len + na + nb, 1)) return -1;
    if (t->n_tok + 1 > t->cap_tok) {
        int32_t c = t->cap_tok;
        if (sv_grow32((void **)&t->tok_off, &c, t->n_tok + 1, sizeof *t->tok_off)) return -1;
        c = t->cap_tok;
        if (sv_grow32((void **)&t->tok_len, &c, t->n_tok + 1, sizeof *t->tok_len)) return -1;
        t->cap_tok = c;
    }
    /* callers pass bytes from outside the pool: growing it above may have moved it */
    memmove(t->pool + t->pool_len, a, na);
    if (nb) memmove(t->pool + t->pool_len + na, b, nb);
    t->tok_off[t->n_tok] = (uint32_t)t->pool_len;
    t->tok_len[t->n_tok] = (uint32_t)(na + nb);
    t->pool_len += na + nb;
    if ((uint32_t)(t->n_tok + 1) * 2 > t->tok_hash_cap) {
        uint32_t cap = t->tok_hash_cap ? t->tok_hash_cap * 2 : 1024;
        int32_t *h = malloc(cap * sizeof *h);
        if (!h) return -1;
        free(t->tok_hash);
        t->tok_hash = h;
        t->tok_hash_cap = cap;
        memset(h, 0xFF, cap * sizeof *h);
        for (int32_t i = 0; i < t->n_tok; i++) sv_tok_hash_put(t, i);
    }
    sv_tok_hash_put(t, t->n_tok);
    t->n_tok++;
    return 0;
}

/* Pair order for ties: left token's bytes, then right token's bytes. */
static int sv_bytes_cmp(const sv_trainer *t, int32_t x, int32_t y) {
    uint32_t nx = t->tok_len[x], ny = t->tok_len[y];
    int c = memcmp(t->pool + t->tok_off[x], t->pool + t->tok_off[y], nx < ny ? nx : ny);
    if (c) return c;
    return nx < ny ? -1 : nx > ny;
}

/* --- pairs --- */

static int32_t sv_pair_get(sv_trainer *t, int32_t a, int32_t b) {
    uint32_t mask = t->pair_hash_cap - 1;
    uint32_t i = (uint32_t)sv_hash_pair(a, b) & mask;
    for (;; i = (i + 1) & mask) {
        int32_t p = t->pair_hash[i];
        if (p < 0) break;
        if (t->pairs[p].a == a && t->pairs[p].b == b) return p;
    }
    if ((uint32_t)(t->n_pairs + 1) * 2 > t->pair_hash_cap) {
        uint32_t cap = t->pair_hash_cap * 2;
        int32_t *h = malloc(cap * sizeof *h);
        if (!h) return -1;
        memset(h, 0xFF, cap * sizeof *h);
        for (int32_t p = 0; p < t->n_pairs; p++) {
            uint32_t j = (uint32_t)sv_hash_pair(t->pairs[p].a, t->pairs[p].b) & (cap - 1);
            while (h[j] >= 0) j = (j + 1) & (cap - 1);
            h[j] = p;
        }
        free(t->pair_hash);
        t->pair_hash = h;
        t->pair_hash_cap = cap;
        mask = cap - 1;
        for (i = (uint32_t)sv_hash_pair(a, b) & mask; t->pair_hash[i] >= 0; i = (i + 1) & mask) {}
    }
    if (sv_grow32((void **)&t->pairs, &t->cap_pairs, t->n_pairs + 1, sizeof *t->pairs)) return -1;
    sv_pair *np = &t->pairs[t->n_pairs];
    memset(np, 0, sizeof *np);
    np->a = a;
    np->b = b;
    np->pushed = -1;
    np->dirty = -1;
    t->pair_hash[i] = t->n_pairs;
    return t->n_pairs++;
}

/* Adds delta to the pair's count; with w >= 0, also remembers that word w contains it. */
static int sv_pair_add(sv_trainer *t, int32_t a, int32_t b, int64_t delta, int32_t w, int32_t step) {
    int32_t p = sv_pair_get(t, a, b);
    if (p < 0) return -1;
    sv_pair *pp = &t->pairs[p];
    pp->count += delta;
    if (w >= 0 && (pp->n_words == 0 || pp->words[pp->n_words - 1] != w)) {
        if (sv_grow32((void **)&pp->words, &pp->cap_words, pp->n_words + 1, sizeof *pp->words)) return -1;
        pp->words[pp->n_words++] = w;
    }
    if (pp->dirty != step) {
        pp->dirty = step;
        if (sv_grow32((void **)&t->dirty, &t->cap_dirty, t->n_dirty + 1, sizeof *t->dirty)) return -1;
        t->dirty[t->n_dirty++] = p;
    }
    return 0;
}

/* --- heap: max by count, then min by pair bytes --- */

static int sv_hent_better(const sv_trainer *t, const sv_hent *x, const sv_hent *y) {
    if (x->count != y->count) return x->count > y->count;
    const sv_pair *px = &t->pairs[x->pair], *py = &t->pairs[y->pair];
    int c = sv_bytes_cmp(t, px->a, py->a);
    if (!c) c = sv_bytes_cmp(t, px->b, py->b);
    return c < 0;
}

static int sv_heap_push(sv_trainer *t, int32_t pair) {
    if (sv_grow((void **)&t->heap, &t->cap_heap, t->n_heap + 1, sizeof *t->heap)) return -1;
    sv_hent e = {t->pairs[pair].count, pair};
    size_t i = t->n_heap++;
    while (i > 0) {
        size_t up = (i - 1) / 2;
        if (!sv_hent_better(t, &e, &t->heap[up])) break;
        t->heap[i] = t->heap[up];
        i = up;
    }
    t->heap[i] = e;
    t->pairs[pair].pushed = e.count;
    return 0;
}

static sv_hent sv_heap_pop(sv_trainer *t) {
    sv_hent top = t->heap[0], last = t->heap[--t->n_heap];
    size_t i = 0, n = t->n_heap;
    for (;;) {
        size_t l = 2 * i + 1, best = l;
        if (l >= n) break;
        if (l + 1 < n && sv_hent_better(t, &t->heap[l + 1], &t->heap[l])) best = l + 1;
        if (!sv_hent_better(t, &t->heap[best], &last)) break;
        t->heap[i] = t->heap[best];
        i = best;
    }
    if (n) t->heap[i] = last;
    return top;
}

static int sv_flush_dirty(sv_trainer *t) {
    for (int32_t i = 0; i < t->n_dirty; i++) {
        sv_pair *p = &t->pairs[t->dirty[i]];
        if (!p->dead && p->count > 0 && p->count != p->pushed && sv_heap_push(t, t->dirty[i])) return -1;
    }
    t->n_dirty = 0;
    return 0;
}

static void sv_trainer_free(sv_trainer *t) {
    free(t->pool);
    free(t->tok_off);
    free(t->tok_len);
    free(t->tok_hash);
    free(t->syms);
    free(t->w_off);
    free(t->w_len);
    free(t->w_count);
    free(t->w_stamp);
    for (int32_t i = 0; i < t->n_pairs; i++) free(t->pairs[i].words);
    free(t->pairs);
    free(t->pair_hash);
    free(t->heap);
    free(t->dirty);
    free(t->m_a);
    free(t->m_b);
    memset(t, 0, sizeof *t);
}

/* Splits every text into words and collects the distinct ones with their counts. */
static int sv_collect_words(sv_trainer *t, const sv_text *texts, int n_texts) {
    size_t total = 0;
    for (int i = 0; i < n_texts; i++) total += texts[i].len;
    uint32_t cap = 1024;
    while (cap < 2 * total + 16) cap *= 2;   /* at least twice as many slots as there can be words */
    int32_t *hash = malloc(cap * sizeof *hash);
    t->syms = malloc((total + 1) * sizeof *t->syms);
    size_t cap_w = 0, n_syms = 0;
    if (!hash || !t->syms) goto oom;
    memset(hash, 0xFF, cap * sizeof *hash);
    for (int f = 0; f < n_texts; f++) {
        const char *s = texts[f].data;
        size_t len = texts[f].len;
        for (size_t pos = 0; pos < len;) {
            size_t end = sv_pretok_next(s, len, pos);
            const uint8_t *wp = (const uint8_t *)s + pos;
            size_t wn = end - pos;
            uint32_t i = (uint32_t)sv_hash_bytes(wp, wn) & (cap - 1);
            for (;; i = (i + 1) & (cap - 1)) {
                int32_t w = hash[i];
                if (w < 0) break;
                if ((size_t)t->w_len[w] == wn) {
                    size_t k = 0;
                    const int32_t *ws = t->syms + t->w_off[w];
                    while (k < wn && ws[k] == wp[k]) k++;
                    if (k == wn) break;
                }
            }
            if (hash[i] >= 0) {
                t->w_count[hash[i]]++;
            } else {
                int32_t w = t->n_words;
                if ((size_t)w + 1 > cap_w) {
                    size_t c = cap_w;
                    if (sv_grow((void **)&t->w_off, &c, (size_t)w + 1, sizeof *t->w_off)) goto oom;
                    c = cap_w;
                    if (sv_grow((void **)&t->w_len, &c, (size_t)w + 1, sizeof *t->w_len)) goto oom;
                    c = cap_w;
                    if (sv_grow((void **)&t->w_count, &c, (size_t)w + 1, sizeof *t->w_count)) goto oom;
                    c = cap_w;
                    if (sv_grow((void **)&t->w_stamp, &c, (size_t)w + 1, sizeof *t->w_stamp)) goto oom;
                    cap_w = c;
                }
                t->w_off[w] = n_syms;
                t->w_len[w] = (int32_t)wn;
                t->w_count[w] = 1;
                t->w_stamp[w] = -1;
                for (size_t k = 0; k < wn; k++) t->syms[n_syms++] = wp[k];
                hash[i] = w;
                t->n_words++;
            }
            pos = end;
        }
    }
    free(hash);
    return 0;
oom:
    free(hash);
    return -1;
}

/* Merges pair (a,b) into token nt in every word that holds it, updating pair counts. */
static int sv_apply_merge(sv_trainer *t, int32_t pi, int32_t nt, int32_t step) {
    int32_t a = t->pairs[pi].a, b = t->pairs[pi].b;
    /* the pair's word list is not appended to during this step (new pairs all involve nt), but its storage
     * could move if the pairs array is reallocated, so work from a detached copy */
    int32_t *list = t->pairs[pi].words, n_list = t->pairs[pi].n_words;
    t->pairs[pi].words = NULL;
    t->pairs[pi].n_words = t->pairs[pi].cap_words = 0;
    int rc = 0;
    for (int32_t li = 0; li < n_list && !rc; li++) {
        int32_t w = list[li];
        if (t->w_stamp[w] == step) continue;
        t->w_stamp[w] = step;
        int32_t *s = t->syms + t->w_off[w];
        int32_t n = t->w_len[w], k;
        for (k = 0; k + 1 < n; k++)
            if (s[k] == a && s[k + 1] == b) break;
        if (k + 1 >= n) continue;                       /* stale entry */
        int64_t wc = t->w_count[w];
        for (k = 0; k + 1 < n && !rc; k++) rc = sv_pair_add(t, s[k], s[k + 1], -wc, -1, step);
        int32_t m = 0;
        for (k = 0; k < n; k++) {
            if (k + 1 < n && s[k] == a && s[k + 1] == b) {
                s[m++] = nt;
                k++;
            } else {
                s[m++] = s[k];
            }
        }
        t->w_len[w] = m;
        for (k = 0; k + 1 < m && !rc; k++)
            rc = sv_pair_add(t, s[k], s[k + 1], wc, (s[k] == nt || s[k + 1] == nt) ? w : -1, step);
    }
    free(list);
    return rc;
}

static int sv_train(sv_trainer *t, const sv_text *texts, int n_texts, int32_t max_merges) {
    for (int i = 0; i < 256; i++) {
        uint8_t b = (uint8_t)i;
        if (sv_tok_add(t, &b, 1, NULL, 0)) return -1;
    }
    if (sv_collect_words(t, texts, n_texts)) return -1;
    t->pair_hash_cap = 1u << 16;
    t->pair_hash = malloc(t->pair_hash_cap * sizeof *t->pair_hash);
    t->m_a = malloc(((size_t)max_merges + 1) * sizeof *t->m_a);
    t->m_b = malloc(((size_t)max_merges + 1) * sizeof *t->m_b);
    if (!t->pair_hash || !t->m_a || !t->m_b) return -1;
    memset(t->pair_hash, 0xFF, t->pair_hash_cap * sizeof *t->pair_hash);
    for (int32_t w = 0; w < t->n_words; w++) {
        const int32_t *s = t->syms + t->w_off[w];
        for (int32_t k = 0; k + 1 < t->w_len[w]; k++)
            if (sv_pair_add(t, s[k], s[k + 1], t->w_count[w], w, 0)) return -1;
    }
    if (sv_flush_dirty(t)) return -1;
    int32_t step = 1;
    while (t->n_merges < max_merges && t->n_heap > 0) {
        sv_hent e = sv_heap_pop(t);
        sv_pair *p = &t->pairs[e.pair];
        if (p->dead || e.count != p->count) continue;   /* stale entry */
        if (p->count < 2) break;                        /* the heap's best is rare: nothing left worth learning */
        p->dead = 1;
        int32_t a = p->a, b = p->b;
        /* two different pairs can spell the same bytes ("ab"+"c", "a"+"bc"); one token per string, so the
         * later pair is never merged - llama.cpp then reaches that token only through the first merge */
        size_t na = t->tok_len[a], nb = t->tok_len[b];
        uint8_t tmp[512];
        if (na + nb <= sizeof tmp) {
            memcpy(tmp, t->pool + t->tok_off[a], na);
            memcpy(tmp + na, t->pool + t->tok_off[b], nb);
            if (sv_tok_find(t, tmp, na + nb) >= 0) continue;
        } else {
            continue;                                   /* absurdly long token: not worth a vocabulary slot */
        }
        if (sv_tok_add(t, tmp, na, tmp + na, nb)) return -1;
        int32_t nt = t->n_tok - 1;
        t->m_a[t->n_merges] = a;
        t->m_b[t->n_merges] = b;
        t->n_merges++;
        if (sv_apply_merge(t, e.pair, nt, step) || sv_flush_dirty(t)) return -1;
        step++;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------------------ */
/* Vocabulary layout                                                                                       */

static const struct {
    int off;
    const char *text;
} sv_special_names[] = {
    {SV_OFF_BOS, "[BOS]"},
    {SV_OFF_EOS_DOC, "[EOS]"},
    {SV_OFF_END_OF_MSG, "<|end_of_msg|>"},
    {SV_OFF_OPEN, "<|open|>"},
    {SV_OFF_CLOSE, "<|close|>"},
    {SV_OFF_SEP, "<|sep|>"},
    {6, "[start_header_id]"},
    {7, "[end_header_id]"},
    {SV_OFF_EOT, "[EOT]"},
    {18, "<|media_begin|>"},
    {19, "<|media_content|>"},
    {20, "<|media_end|>"},
    {21, "<|media_pad|>"},
    {65, "<osagent_mode>"},
    {SV_OFF_UNK, "[UNK]"},
    {SV_OFF_PAD, "[PAD]"},
};

/* Mapped (byte-to-unicode) form of bytes, as a new string. */
static char *sv_mapped(const uint8_t *p, size_t n) {
    char *s = malloc(2 * n + 1), *o = s;
    if (!s) return NULL;
    for (size_t i = 0; i < n; i++) o += sv_byte_to_utf8(p[i], o);
    *o = 0;
    return s;
}

static char *sv_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

void sv_free(sv_vocab *v) {
    if (!v) return;
    if (v->tokens)
        for (int32_t i = 0; i < v->n_tokens; i++) free(v->tokens[i]);
    if (v->merges)
        for (int32_t i = 0; i < v->n_merges; i++) free(v->merges[i]);
    free(v->tokens);
    free(v->types);
    free(v->merges);
    memset(v, 0, sizeof *v);
}

int sv_build_from(sv_vocab *v, int32_t n_vocab, const sv_text *texts, int n_texts, rl_err *err) {
    memset(v, 0, sizeof *v);
    if (n_vocab < 768) return rl_errf(err, "synth vocab: n_vocab %d is too small (at least 768)", n_vocab);
    const int32_t base = n_vocab - SV_SPECIAL_N;
    sv_trainer t;
    memset(&t, 0, sizeof t);
    if (sv_train(&t, texts, n_texts, base - 256)) {
        sv_trainer_free(&t);
        return rl_errf(err, "synth vocab: out of memory while learning merges");
    }
    v->n_tokens = n_vocab;
    v->base = base;
    v->tokens = calloc((size_t)n_vocab, sizeof *v->tokens);
    v->types = calloc((size_t)n_vocab, sizeof *v->types);
    v->merges = calloc((size_t)t.n_merges + 1, sizeof *v->merges);
    if (!v->tokens || !v->types || !v->merges) goto oom;
    v->n_merges = t.n_merges;
    /* bytes and merge results: training id == vocabulary id */
    for (int32_t i = 0; i < t.n_tok; i++) {
        v->tokens[i] = sv_mapped(t.pool + t.tok_off[i], t.tok_len[i]);
        if (!v->tokens[i]) goto oom;
        v->types[i] = SV_TYPE_NORMAL;
    }
    for (int32_t i = 0; i < t.n_merges; i++) {
        const char *l = v->tokens[t.m_a[i]], *r = v->tokens[t.m_b[i]];
        size_t nl = strlen(l), nr = strlen(r);
        v->merges[i] = malloc(nl + nr + 2);
        if (!v->merges[i]) goto oom;
        memcpy(v->merges[i], l, nl);
        v->merges[i][nl] = ' ';
        memcpy(v->merges[i] + nl + 1, r, nr + 1);
    }
    /* fillers, named like the converter names ids missing from tiktoken */
    char buf[64];
    for (int32_t i = t.n_tok; i < base; i++) {
        snprintf(buf, sizeof buf, "[PAD%d]", i);
        if (!(v->tokens[i] = sv_strdup(buf))) goto oom;
        v->types[i] = SV_TYPE_UNUSED;
    }
    for (int32_t k = 0; k < SV_SPECIAL_N; k++) {
        const char *name = NULL;
        for (size_t j = 0; j < sizeof sv_special_names / sizeof sv_special_names[0]; j++)
            if (sv_special_names[j].off == k) name = sv_special_names[j].text;
        if (!name) {
            snprintf(buf, sizeof buf, "<|reserved_token_%d|>", base + k);
            name = buf;
        }
        if (!(v->tokens[base + k] = sv_strdup(name))) goto oom;
        v->types[base + k] = SV_TYPE_CONTROL;
    }
    v->bos_id = base + SV_OFF_BOS;
    v->eos_id = base + SV_OFF_END_OF_MSG;
    v->pad_id = base + SV_OFF_PAD;
    v->mask_id = base + SV_OFF_MASK;
    v->unk_id = base + SV_OFF_UNK;
    v->eot_id = base + SV_OFF_EOT;
    sv_trainer_free(&t);
    return 0;
oom:
    sv_trainer_free(&t);
    sv_free(v);
    return rl_errf(err, "synth vocab: out of memory");
}

int sv_build(sv_vocab *v, int32_t n_vocab, rl_err *err) {
    sv_text texts[SV_CORPUS_MAX];
    int n = sv_corpus(texts, SV_CORPUS_MAX);
    if (n > SV_CORPUS_MAX) n = SV_CORPUS_MAX;
    if (n <= 0) {
        memset(v, 0, sizeof *v);
        return rl_errf(err, "synth vocab: the embedded corpus is empty");
    }
    return sv_build_from(v, n_vocab, texts, n, err);
}

/* ------------------------------------------------------------------------------------------------------ */
/* GGUF metadata                                                                                           */

/* Our own template for K3's XTML chat framing (see the header for what it renders). Kept small on purpose:
 * tool declarations (as JSON), plain text content, optional reasoning, tool calls with JSON arguments, tool
 * results. `thinking` is K3's
 * switch; when it is not given, llama.cpp's generic `enable_thinking` (which it always passes) decides. */
static const char sv_template[] =
    "{%- if thinking is not defined -%}\n"
    "  {%- set thinking = enable_thinking if enable_thinking is defined else true -%}\n"
    "{%- endif -%}\n"
    "{%- set ns = namespace(tool_index=0) -%}\n"
    "{%- if tools is defined and tools -%}\n"
    "  {{- '<|open|>message role=\"system\" type=\"tool-declare\"<|sep|># Tools\\n```json\\n' + (tools | tojson) + '\\n```<|close|>message<|sep|><|end_of_msg|>' -}}\n"
    "{%- endif -%}\n"
    "{%- for m in messages -%}\n"
    "  {%- set role = m['role'] -%}\n"
    "  {%- if role == 'tool' -%}\n"
    "    {%- set ns.tool_index = ns.tool_index + 1 -%}\n"
    "    {{- '<|open|>message role=\"tool\"' -}}\n"
    "    {%- if m['name'] is defined and m['name'] -%}{{- ' tool=\"' + m['name'] + '\"' -}}{%- endif -%}\n"
    "    {{- ' index=\"' + (ns.tool_index | string) + '\"<|sep|>' -}}\n"
    "  {%- elif role == 'assistant' -%}\n"
    "    {%- set ns.tool_index = 0 -%}\n"
    "    {{- '<|open|>message role=\"assistant\"<|sep|>' -}}\n"
    "  {%- else -%}\n"
    "    {{- '<|open|>message role=\"' + role + '\"<|sep|>' -}}\n"
    "  {%- endif -%}\n"
    "  {%- if role == 'assistant' -%}\n"
    "    {%- if thinking -%}\n"
    "      {{- '<|open|>think<|sep|>' -}}\n"
    "      {%- if m['reasoning_content'] is defined and m['reasoning_content'] -%}{{- m['reasoning_content'] -}}{%- endif -%}\n"
    "      {{- '<|close|>think<|sep|>' -}}\n"
    "    {%- endif -%}\n"
    "    {{- '<|open|>response<|sep|>' -}}\n"
    "    {%- if m['content'] is defined and m['content'] -%}{{- m['content'] -}}{%- endif -%}\n"
    "    {{- '<|close|>response<|sep|>' -}}\n"
    "    {%- if m['tool_calls'] is defined and m['tool_calls'] -%}\n"
    "      {{- '<|open|>tools<|sep|>' -}}\n"
    "      {%- for tc in m['tool_calls'] -%}\n"
    "        {%- set f = tc['function'] if tc['function'] is defined else tc -%}\n"
    "        {{- '<|open|>call tool=\"' + f['name'] + '\" index=\"' + (loop.index | string) + '\"<|sep|>' -}}\n"
    "        {{- '<|open|>json type=\"object\"<|sep|>' -}}\n"
    "        {%- if f['arguments'] is string -%}{{- f['arguments'] -}}{%- else -%}{{- f['arguments'] | tojson -}}{%- endif -%}\n"
    "        {{- '<|close|>json<|sep|><|close|>call<|sep|>' -}}\n"
    "      {%- endfor -%}\n"
    "      {{- '<|close|>tools<|sep|>' -}}\n"
    "    {%- endif -%}\n"
    "  {%- elif m['content'] is defined and m['content'] -%}\n"
    "    {{- m['content'] -}}\n"
    "  {%- endif -%}\n"
    "  {{- '<|close|>message<|sep|><|end_of_msg|>' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "  {{- '<|open|>message role=\"assistant\"<|sep|>' -}}\n"
    "  {{- '<|open|>think<|sep|>' if thinking else '<|open|>response<|sep|>' -}}\n"
    "{%- endif -%}\n";

const char *sv_chat_template(void) { return sv_template; }

int sv_write_gguf(const sv_vocab *v, struct gguf_context *g, rl_err *err) {
    if (!v || !g || v->n_tokens < 768 || !v->tokens || !v->types)
        return rl_errf(err, "synth vocab: nothing to write (vocabulary not built)");
    gguf_set_val_str(g, "tokenizer.ggml.model", "gpt2");
    gguf_set_val_str(g, "tokenizer.ggml.pre", "kimi-k2");
    gguf_set_arr_str(g, "tokenizer.ggml.tokens", (const char **)v->tokens, (size_t)v->n_tokens);
    gguf_set_arr_data(g, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, v->types, (size_t)v->n_tokens);
    gguf_set_arr_str(g, "tokenizer.ggml.merges", (const char **)v->merges, (size_t)v->n_merges);
    gguf_set_val_u32(g, "tokenizer.ggml.bos_token_id", (uint32_t)v->bos_id);
    gguf_set_val_u32(g, "tokenizer.ggml.eos_token_id", (uint32_t)v->eos_id);
    gguf_set_val_u32(g, "tokenizer.ggml.unknown_token_id", (uint32_t)v->unk_id);
    gguf_set_val_u32(g, "tokenizer.ggml.padding_token_id", (uint32_t)v->pad_id);
    gguf_set_val_bool(g, "tokenizer.ggml.add_bos_token", false);
    gguf_set_val_str(g, "tokenizer.chat_template", sv_template);
    return 0;
}
