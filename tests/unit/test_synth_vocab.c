/* test_synth_vocab.c - the synthetic K3 vocabulary: layout, merges, determinism, round trips, GGUF keys.
 *
 * Prints "ok - ..." / "not ok - ..." lines and exits non-zero if any check failed. The round-trip check uses
 * a small rank-based BPE encoder written here (the way llama.cpp applies merges: lowest rank first, leftmost
 * on ties, inside each pre-split piece), so it also proves the merges are usable as written. */
#include "tools/synth_vocab.h"

#include <gguf.h>

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int n_fail;

static void check(int cond, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void check(int cond, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s - ", cond ? "ok" : "not ok");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    if (!cond) n_fail++;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* ---- a string -> int table for the test encoder ---- */

typedef struct {
    char **keys;
    int *vals;
    size_t cap;
} str_map;

static size_t str_hash(const char *s) {
    size_t h = 5381;
    while (*s) h = h * 33 + (unsigned char)*s++;
    return h;
}

static void map_init(str_map *m, size_t n) {
    m->cap = 16;
    while (m->cap < 2 * n + 16) m->cap *= 2;
    m->keys = calloc(m->cap, sizeof *m->keys);
    m->vals = calloc(m->cap, sizeof *m->vals);
}

static void map_put(str_map *m, char *key, int val) {
    size_t i = str_hash(key) & (m->cap - 1);
    while (m->keys[i]) i = (i + 1) & (m->cap - 1);
    m->keys[i] = key;
    m->vals[i] = val;
}

static int map_get(const str_map *m, const char *key) {
    for (size_t i = str_hash(key) & (m->cap - 1); m->keys[i]; i = (i + 1) & (m->cap - 1))
        if (strcmp(m->keys[i], key) == 0) return m->vals[i];
    return -1;
}

static void map_free(str_map *m) {
    free(m->keys);
    free(m->vals);
}

/* Encodes text with the vocabulary's merges; returns the number of tokens written to ids (or -1). */
static int encode(const sv_vocab *v, const str_map *ranks, const str_map *tok_ids, const char *text, size_t len,
                  int32_t *ids, int cap) {
    enum { MAX_PIECE = 4096, MAX_SYM = 512 };
    int n_ids = 0;
    char(*sym)[MAX_SYM] = malloc((size_t)MAX_PIECE * MAX_SYM);
    char buf[2 * MAX_SYM];
    if (!sym) return -1;
    for (size_t pos = 0; pos < len;) {
        size_t end = sv_pretok_next(text, len, pos);
        int n = 0;
        for (size_t k = pos; k < end; k++) {
            if (n == MAX_PIECE) goto fail;
            int l = sv_byte_to_utf8((uint8_t)text[k], sym[n]);
            sym[n][l] = 0;
            n++;
        }
        for (;;) {
            int best = -1, best_rank = 0;
            for (int k = 0; k + 1 < n; k++) {
                size_t la = strlen(sym[k]), lb = strlen(sym[k + 1]);
                if (la + lb + 2 > sizeof buf) continue;
                memcpy(buf, sym[k], la);
                buf[la] = ' ';
                memcpy(buf + la + 1, sym[k + 1], lb + 1);
                int r = map_get(ranks, buf);
                if (r >= 0 && (best < 0 || r < best_rank)) {
                    best = k;
                    best_rank = r;
                }
            }
            if (best < 0) break;
            if (strlen(sym[best]) + strlen(sym[best + 1]) + 1 > sizeof sym[0]) goto fail;
            strcat(sym[best], sym[best + 1]);
            memmove(sym[best + 1], sym[best + 2], (size_t)(n - best - 2) * sizeof sym[0]);
            n--;
        }
        for (int k = 0; k < n; k++) {
            int id = map_get(tok_ids, sym[k]);
            if (id < 0 || n_ids == cap) goto fail;
            ids[n_ids++] = id;
        }
        pos = end;
    }
    free(sym);
    (void)v;
    return n_ids;
fail:
    free(sym);
    return -1;
}

/* Maps the token texts back to bytes. Returns the length written to out, or -1. */
static long decode(const sv_vocab *v, const int32_t *ids, int n, char *out, size_t cap) {
    int inv[512];
    memset(inv, 0xFF, sizeof inv);
    for (int b = 0; b < 256; b++) {
        char u[2];
        int l = sv_byte_to_utf8((uint8_t)b, u);
        int cp = l == 1 ? (unsigned char)u[0] : (((unsigned char)u[0] & 0x1F) << 6) | ((unsigned char)u[1] & 0x3F);
        inv[cp] = b;
    }
    size_t o = 0;
    for (int i = 0; i < n; i++) {
        const unsigned char *s = (const unsigned char *)v->tokens[ids[i]];
        while (*s) {
            int cp;
            if (*s < 0x80) cp = *s++;
            else if ((*s & 0xE0) == 0xC0 && s[1]) {
                cp = ((s[0] & 0x1F) << 6) | (s[1] & 0x3F);
                s += 2;
            } else
                return -1;
            if (cp >= 512 || inv[cp] < 0 || o == cap) return -1;
            out[o++] = (char)inv[cp];
        }
    }
    return (long)o;
}

/* ---- checks ---- */

static void check_layout(const sv_vocab *v, int32_t n_vocab) {
    const int32_t base = n_vocab - 256;
    check(v->n_tokens == n_vocab && v->base == base, "n=%d: %d tokens, base %d", n_vocab, v->n_tokens, v->base);
    int bytes_ok = 1;
    for (int b = 0; b < 256; b++) {
        char u[3] = {0};
        sv_byte_to_utf8((uint8_t)b, u);
        if (strcmp(v->tokens[b], u) != 0 || v->types[b] != SV_TYPE_NORMAL) bytes_ok = 0;
    }
    check(bytes_ok, "n=%d: ids 0..255 are the 256 mapped bytes, NORMAL", n_vocab);
    check(strcmp(v->tokens[' '], "\xC4\xA0") == 0 && strcmp(v->tokens['\n'], "\xC4\x8A") == 0 &&
              strcmp(v->tokens['A'], "A") == 0 && strcmp(v->tokens[0xFF], "\xC3\xBF") == 0,
          "n=%d: byte mapping is GPT-2's (space -> U+0120, newline -> U+010A)", n_vocab);
    check(v->n_merges > 0 && v->n_merges <= base - 256, "n=%d: %d merges fit below the special region", n_vocab,
          v->n_merges);
    int region_ok = 1;
    for (int32_t i = 256; i < 256 + v->n_merges; i++) region_ok &= v->types[i] == SV_TYPE_NORMAL;
    char buf[64];
    for (int32_t i = 256 + v->n_merges; i < base; i++) {
        snprintf(buf, sizeof buf, "[PAD%d]", i);
        region_ok &= v->types[i] == SV_TYPE_UNUSED && strcmp(v->tokens[i], buf) == 0;
    }
    for (int32_t i = base; i < n_vocab; i++) region_ok &= v->types[i] == SV_TYPE_CONTROL;
    check(region_ok, "n=%d: merge tokens NORMAL, fillers [PAD<i>] UNUSED, last 256 CONTROL", n_vocab);
    static const struct {
        int off;
        const char *text;
    } named[] = {{0, "[BOS]"},        {1, "[EOS]"},   {2, "<|end_of_msg|>"}, {3, "<|open|>"},
                 {4, "<|close|>"},    {5, "<|sep|>"}, {6, "[start_header_id]"}, {7, "[end_header_id]"},
                 {9, "[EOT]"},        {254, "[UNK]"}, {255, "[PAD]"}};
    int names_ok = 1;
    for (size_t i = 0; i < sizeof named / sizeof named[0]; i++) {
        if (strcmp(v->tokens[base + named[i].off], named[i].text) != 0) {
            names_ok = 0;
            printf("# id %d is %s, expected %s\n", base + named[i].off, v->tokens[base + named[i].off], named[i].text);
        }
    }
    snprintf(buf, sizeof buf, "<|reserved_token_%d|>", base + 8);
    names_ok &= strcmp(v->tokens[base + 8], buf) == 0;
    snprintf(buf, sizeof buf, "<|reserved_token_%d|>", base + 253);
    names_ok &= strcmp(v->tokens[base + 253], buf) == 0;
    check(names_ok, "n=%d: special names at K3's offsets, reserved slots named by id", n_vocab);
    check(v->bos_id == base && v->eos_id == base + 2 && v->pad_id == base + 255 && v->mask_id == base + 253 &&
              v->unk_id == base + 254 && v->eot_id == base + 9,
          "n=%d: bos/eos/pad/mask/unk/eot = base+0/2/255/253/254/9", n_vocab);

    char **sorted = malloc((size_t)n_vocab * sizeof *sorted);
    memcpy(sorted, v->tokens, (size_t)n_vocab * sizeof *sorted);
    qsort(sorted, (size_t)n_vocab, sizeof *sorted, cmp_str);
    int dup = 0;
    for (int32_t i = 1; i < n_vocab; i++)
        if (strcmp(sorted[i - 1], sorted[i]) == 0) {
            if (!dup) printf("# duplicate token %s\n", sorted[i]);
            dup++;
        }
    free(sorted);
    check(dup == 0, "n=%d: all %d token strings are distinct", n_vocab, n_vocab);

    str_map ids;
    map_init(&ids, (size_t)n_vocab);
    for (int32_t i = 0; i < n_vocab; i++) map_put(&ids, v->tokens[i], i);
    int merges_ok = 1;
    for (int32_t i = 0; i < v->n_merges && merges_ok; i++) {
        const char *m = v->merges[i], *sp = strchr(m, ' ');
        if (!sp || strchr(sp + 1, ' ') || sp == m || !sp[1]) {
            merges_ok = 0;
            printf("# merge %d malformed: '%s'\n", i, m);
            break;
        }
        char left[512], right[512], joined[1024];
        size_t nl = (size_t)(sp - m), nr = strlen(sp + 1);
        if (nl >= sizeof left || nr >= sizeof right) {
            merges_ok = 0;
            break;
        }
        memcpy(left, m, nl);
        left[nl] = 0;
        memcpy(right, sp + 1, nr + 1);
        memcpy(joined, left, nl);
        memcpy(joined + nl, right, nr + 1);
        int l = map_get(&ids, left), r = map_get(&ids, right), j = map_get(&ids, joined);
        if (l < 0 || r < 0 || l >= 256 + i || r >= 256 + i || j != 256 + i) {
            merges_ok = 0;
            printf("# merge %d '%s': left %d right %d result %d\n", i, m, l, r, j);
        }
    }
    map_free(&ids);
    check(merges_ok, "n=%d: merge i joins two earlier tokens into token 256+i", n_vocab);
}

static int same_vocab(const sv_vocab *a, const sv_vocab *b) {
    if (a->n_tokens != b->n_tokens || a->n_merges != b->n_merges) return 0;
    for (int32_t i = 0; i < a->n_tokens; i++)
        if (strcmp(a->tokens[i], b->tokens[i]) != 0 || a->types[i] != b->types[i]) return 0;
    for (int32_t i = 0; i < a->n_merges; i++)
        if (strcmp(a->merges[i], b->merges[i]) != 0) return 0;
    return 1;
}

static void check_roundtrip(const sv_vocab *v, const char *label, const char *text) {
    str_map ranks, ids;
    map_init(&ranks, (size_t)v->n_merges);
    map_init(&ids, (size_t)v->n_tokens);
    for (int32_t i = 0; i < v->n_merges; i++) map_put(&ranks, v->merges[i], i);
    for (int32_t i = 0; i < v->n_tokens; i++) map_put(&ids, v->tokens[i], i);
    size_t len = strlen(text);
    int32_t *tok = malloc((len + 1) * sizeof *tok);
    char *back = malloc(len + 1);
    int n = encode(v, &ranks, &ids, text, len, tok, (int)len + 1);
    long m = n >= 0 ? decode(v, tok, n, back, len + 1) : -1;
    int normal = 1;
    for (int i = 0; i < n; i++) normal &= v->types[tok[i]] == SV_TYPE_NORMAL;
    check(n > 0 && m == (long)len && memcmp(back, text, len) == 0 && normal,
          "n=%d: %s round-trips (%zu bytes -> %d tokens)", v->n_tokens, label, len, n);
    free(tok);
    free(back);
    map_free(&ranks);
    map_free(&ids);
}

static void check_pretok(void) {
    static const struct {
        const char *text;
        const char *pieces; /* '|' separated */
    } cases[] = {
        {"Hello world", "Hello| world"},
        {"HelloWorld camelCase", "HelloWorld| camelCase"},
        {"12345 678", "123|45| |678"},
        {"don't stop", "don't| stop"},
        {"你好世界abc", "你好世界|abc"},
        {"a  b", "a| | b"},
        {"a\n\nb", "a|\n\n|b"},
        {"x = (y + 1);", "x| =| (|y| +| |1|);"},
        {"  ", "  "},
        {"é😀!", "é|😀!"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char got[256] = {0};
        size_t len = strlen(cases[i].text), o = 0;
        for (size_t pos = 0; pos < len;) {
            size_t end = sv_pretok_next(cases[i].text, len, pos);
            if (end <= pos || end > len) break;
            if (pos) got[o++] = '|';
            memcpy(got + o, cases[i].text + pos, end - pos);
            o += end - pos;
            pos = end;
        }
        got[o] = 0;
        int ok = strcmp(got, cases[i].pieces) == 0;
        check(ok, "pre-split of case %zu", i);
        if (!ok) printf("# got '%s', expected '%s'\n", got, cases[i].pieces);
    }
}

static void check_gguf(const sv_vocab *v) {
    rl_err err = {{0}};
    struct gguf_context *g = gguf_init_empty();
    check(sv_write_gguf(v, g, &err) == 0, "gguf: metadata written (%s)", err.msg);
    char path[] = "/tmp/test_synth_vocab_XXXXXX";
    int fd = mkstemp(path);
    if (fd >= 0) close(fd);
    check(fd >= 0 && gguf_write_to_file(g, path, true), "gguf: saved to %s", path);
    gguf_free(g);
    struct gguf_init_params ip = {true, NULL};
    struct gguf_context *r = gguf_init_from_file(path, ip);
    check(r != NULL, "gguf: read back");
    if (!r) {
        unlink(path);
        return;
    }
    int64_t k;
    k = gguf_find_key(r, "tokenizer.ggml.model");
    check(k >= 0 && strcmp(gguf_get_val_str(r, k), "gpt2") == 0, "gguf: tokenizer.ggml.model = gpt2");
    k = gguf_find_key(r, "tokenizer.ggml.pre");
    check(k >= 0 && strcmp(gguf_get_val_str(r, k), "kimi-k2") == 0, "gguf: tokenizer.ggml.pre = kimi-k2");
    k = gguf_find_key(r, "tokenizer.ggml.tokens");
    int ok = k >= 0 && gguf_get_arr_type(r, k) == GGUF_TYPE_STRING && gguf_get_arr_n(r, k) == (size_t)v->n_tokens;
    for (int32_t i = 0; ok && i < v->n_tokens; i++) ok = strcmp(gguf_get_arr_str(r, k, (size_t)i), v->tokens[i]) == 0;
    check(ok, "gguf: tokens (%d strings) match", v->n_tokens);
    k = gguf_find_key(r, "tokenizer.ggml.token_type");
    ok = k >= 0 && gguf_get_arr_type(r, k) == GGUF_TYPE_INT32 && gguf_get_arr_n(r, k) == (size_t)v->n_tokens &&
         memcmp(gguf_get_arr_data(r, k), v->types, (size_t)v->n_tokens * sizeof(int32_t)) == 0;
    check(ok, "gguf: token_type is an INT32 array that matches");
    k = gguf_find_key(r, "tokenizer.ggml.merges");
    ok = k >= 0 && gguf_get_arr_type(r, k) == GGUF_TYPE_STRING && gguf_get_arr_n(r, k) == (size_t)v->n_merges;
    for (int32_t i = 0; ok && i < v->n_merges; i++) ok = strcmp(gguf_get_arr_str(r, k, (size_t)i), v->merges[i]) == 0;
    check(ok, "gguf: merges (%d) match", v->n_merges);
    static const char *id_keys[] = {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                                    "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id"};
    const int32_t want[] = {v->bos_id, v->eos_id, v->unk_id, v->pad_id};
    for (int i = 0; i < 4; i++) {
        k = gguf_find_key(r, id_keys[i]);
        check(k >= 0 && gguf_get_kv_type(r, k) == GGUF_TYPE_UINT32 && gguf_get_val_u32(r, k) == (uint32_t)want[i],
              "gguf: %s = %d (u32)", id_keys[i], want[i]);
    }
    k = gguf_find_key(r, "tokenizer.ggml.add_bos_token");
    check(k >= 0 && gguf_get_kv_type(r, k) == GGUF_TYPE_BOOL && !gguf_get_val_bool(r, k),
          "gguf: add_bos_token = false");
    k = gguf_find_key(r, "tokenizer.chat_template");
    check(k >= 0 && strcmp(gguf_get_val_str(r, k), sv_chat_template()) == 0 &&
              strstr(sv_chat_template(), "<|open|>") && strstr(sv_chat_template(), "<|close|>") &&
              strstr(sv_chat_template(), "<|end_of_msg|>"),
          "gguf: chat_template is ours and uses K3's markers");
    check(gguf_find_key(r, "tokenizer.ggml.mask_token_id") < 0, "gguf: no mask_token_id in a target file");
    gguf_free(r);
    unlink(path);
}

int main(void) {
    rl_err err = {{0}};
    check_pretok();

    sv_text texts[SV_CORPUS_MAX];
    int n_texts = sv_corpus(texts, SV_CORPUS_MAX);
    size_t total = 0;
    int texts_ok = n_texts > 0 && n_texts <= SV_CORPUS_MAX;
    for (int i = 0; texts_ok && i < n_texts; i++) {
        total += texts[i].len;
        texts_ok = texts[i].len > 0 && texts[i].data[texts[i].len] == 0 && memchr(texts[i].data, 0, texts[i].len) == NULL;
    }
    check(texts_ok && total > 100000, "embedded corpus: %d texts, %zu bytes, NUL-terminated, no NUL inside", n_texts,
          total);

    sv_vocab small = {0};
    check(sv_build(&small, 767, &err) != 0 && strstr(err.msg, "768"), "n_vocab 767 is refused (%s)", err.msg);

    const int32_t sizes[] = {1024, 4096};
    sv_vocab v[2] = {{0}};
    for (int i = 0; i < 2; i++) {
        double t0 = now_s();
        int rc = sv_build(&v[i], sizes[i], &err);
        double dt = now_s() - t0;
        check(rc == 0, "n=%d: built in %.3f s, %d merges (%s)", sizes[i], dt, v[i].n_merges, rc ? err.msg : "");
        if (rc) return 1;
        check_layout(&v[i], sizes[i]);
    }
    check(v[0].n_merges == 1024 - 512 && v[1].n_merges == 4096 - 512, "the corpus fills 1024 and 4096 with merges");
    int prefix = v[0].n_merges <= v[1].n_merges;
    for (int32_t i = 0; prefix && i < v[0].n_merges; i++) prefix = strcmp(v[0].merges[i], v[1].merges[i]) == 0;
    check(prefix, "the 1024 vocabulary's merges are the first merges of the 4096 one");

    sv_vocab again = {0};
    check(sv_build(&again, 4096, &err) == 0 && same_vocab(&v[1], &again), "n=4096: a second build is identical");
    sv_free(&again);

    const char *samples[][2] = {
        {"English", "The train left the city a little after eleven, and the windows showed our reflections."},
        {"Chinese", "每天早上六点，街角的早餐店就开门了。老板记得每个熟客的口味。"},
        {"code", "int main(void) {\n    for (int i = 0; i < 10; i++) printf(\"%d\\n\", i);\n    return 0;\n}\n"},
        {"mixed", "Ünïcödé 日本語 한국어 😀👍🏽 \t\r\n  12,345.67 ₩15,000 <|open|> [PAD] \x01\x7f"},
    };
    for (int i = 0; i < 2; i++)
        for (size_t s = 0; s < sizeof samples / sizeof samples[0]; s++) check_roundtrip(&v[i], samples[s][0], samples[s][1]);

    check_gguf(&v[0]);

    /* the largest size synth is expected to use (its time printed, not asserted: tests assert no timing) */
    sv_vocab big = {0};
    double t0 = now_s();
    int rc = sv_build(&big, 32768, &err);
    double dt = now_s() - t0;
    check(rc == 0, "n=32768: built in %.3f s, %d merges, %d fillers", dt, big.n_merges,
          big.base - 256 - big.n_merges);
    if (rc == 0) check_layout(&big, 32768);
    sv_free(&big);

    sv_free(&v[0]);
    sv_free(&v[1]);
    printf("%s\n", n_fail ? "FAILED" : "PASSED");
    return n_fail ? 1 : 0;
}
