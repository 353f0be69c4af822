/* tokenizer.c - byte-level BPE with llama.cpp's kimi-k2 pre-tokenizer (see tokenizer.h, docs/tokenizer.md).
 *
 * Everything here is written to reproduce llama.cpp's token ids exactly, quirks included; each quirk is
 * named where it is reproduced. The pre-split is one PCRE2 pattern that encodes llama.cpp's hand-written
 * kimi-k2 splitter (unicode.cpp), not the HF regex it was derived from: the two differ (case does not split
 * a letter run, combining marks are not letters). */
#include "tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <gguf.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../gguf/model_file.h"

/* ------------------------------------------------------------------------------------------------------ */
/* UTF-8, exactly as llama.cpp's unicode_cpt_from_utf8 / unicode_cpt_to_utf8 treat it                      */

/* Decodes one code point at s[i]. Returns its length, or 0 if llama.cpp would reject it (then the caller
 * substitutes U+FFFD and moves on by ONE byte). llama.cpp checks only the lead byte's length class and that
 * the continuation bytes are 10xxxxxx: overlong forms (C0 AF = '/') and surrogates (ED A0 80 = U+D800) are
 * accepted. Values above U+10FFFF (lead F4..F7) are accepted by its decoder but make its encoder throw,
 * which aborts llama_tokenize; we reject them here instead (tokenizer.h). */
static size_t tk_utf8_dec(const unsigned char *s, size_t n, size_t i, uint32_t *cp) {
    unsigned b = s[i];
    if (b < 0x80) {
        *cp = b;
        return 1;
    }
    size_t k;
    uint32_t v;
    if ((b & 0x40) == 0) return 0; /* lone continuation byte */
    if ((b & 0x20) == 0) { k = 2; v = b & 0x1F; }
    else if ((b & 0x10) == 0) { k = 3; v = b & 0x0F; }
    else if ((b & 0x08) == 0) { k = 4; v = b & 0x07; }
    else return 0;                 /* F8..FF */
    if (i + k > n) return 0;       /* truncated at the end of the fragment */
    for (size_t j = 1; j < k; j++) {
        if ((s[i + j] & 0xC0) != 0x80) return 0;
        v = (v << 6) | (s[i + j] & 0x3F);
    }
    if (v > 0x10FFFF) return 0;
    *cp = v;
    return k;
}

/* Encodes cp (<= 0x10FFFF; surrogates are encoded like any other value, as llama.cpp does). */
static size_t tk_utf8_enc(uint32_t cp, char *o) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* ------------------------------------------------------------------------------------------------------ */
/* GPT-2 byte <-> unicode mapping. Printable bytes (! .. ~, ¡ .. ¬, ® .. ÿ) stand for themselves; the other  */
/* 68 bytes, in order, become U+0100 + n. Closed forms instead of a table: no state to initialize.          */

static uint32_t tk_byte_cp(unsigned b) {
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE) return b;
    if (b <= 0x20) return 0x100 + b;                 /* 33 bytes: 0x00..0x20 */
    if (b >= 0x7F && b <= 0xA0) return 0x100 + 33 + (b - 0x7F); /* 34 bytes */
    return 0x100 + 67;                               /* 0xAD */
}

/* The byte a mapped code point stands for, or -1. */
static int tk_cp_byte(uint32_t cp) {
    if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF)) return (int)cp;
    if (cp >= 0x100 && cp <= 0x120) return (int)(cp - 0x100);
    if (cp >= 0x121 && cp <= 0x142) return (int)(cp - 0x121 + 0x7F);
    if (cp == 0x143) return 0xAD;
    return -1;
}

/* Makes room for `need` elements in a growing array. */
static int tk_grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *np = realloc(*p, c * elem);
    if (!np) return -1;
    *p = np;
    *cap = c;
    return 0;
}

/* ------------------------------------------------------------------------------------------------------ */
/* String -> int32 hash map                                                                                */

static uint32_t tk_hash(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ULL;
    }
    uint32_t r = (uint32_t)(h ^ (h >> 32));
    return r ? r : 1;
}

static int tk_map_init(tok_map *m, size_t n_keys) {
    size_t cap = 16;
    while (cap < 2 * n_keys) cap <<= 1;
    memset(m, 0, sizeof *m);
    m->hash = calloc(cap, sizeof *m->hash);
    m->key = calloc(cap, sizeof *m->key);
    m->key_len = calloc(cap, sizeof *m->key_len);
    m->val = calloc(cap, sizeof *m->val);
    if (!m->hash || !m->key || !m->key_len || !m->val) return -1;
    m->mask = (uint32_t)(cap - 1);
    return 0;
}

static void tk_map_free(tok_map *m) {
    free(m->hash);
    free(m->key);
    free(m->key_len);
    free(m->val);
    memset(m, 0, sizeof *m);
}

static int32_t tk_map_get(const tok_map *m, const char *k, size_t n) {
    if (!m->mask) return -1;
    uint32_t h = tk_hash(k, n);
    for (uint32_t i = h & m->mask;; i = (i + 1) & m->mask) {
        if (!m->hash[i]) return -1;
        if (m->hash[i] == h && m->key_len[i] == n && memcmp(m->key[i], k, n) == 0) return m->val[i];
    }
}

/* Inserts k (which must outlive the map); an existing key keeps its value unless overwrite. */
static void tk_map_put(tok_map *m, const char *k, size_t n, int32_t v, bool overwrite) {
    uint32_t h = tk_hash(k, n);
    for (uint32_t i = h & m->mask;; i = (i + 1) & m->mask) {
        if (!m->hash[i]) {
            m->hash[i] = h;
            m->key[i] = k;
            m->key_len[i] = (uint32_t)n;
            m->val[i] = v;
            return;
        }
        if (m->hash[i] == h && m->key_len[i] == n && memcmp(m->key[i], k, n) == 0) {
            if (overwrite) m->val[i] = v;
            return;
        }
    }
}

/* ------------------------------------------------------------------------------------------------------ */
/* The kimi-k2 split as one PCRE2 pattern                                                                  */
/*
 * llama.cpp's splitter (unicode_regex_split_custom_kimi_k2) tries, at each code point:
 *   1. a run of Han (its own fixed block list, HAN below - not the Unicode Han script);
 *   2. [one char that is not CR, LF, a letter or a number] then letters that are not Han, then an optional
 *      'contraction (s t m d re ve ll, ASCII case-insensitive). Letters are \p{L} only: a combining mark ends
 *      the run, and the run is never cut at a case change (the HF regex would cut "camelCase");
 *   3. numbers (\p{N}: Nd, Nl, No) in pieces of 3 from the left;
 *   4. an optional space, a run of chars that are not whitespace/letter/number, then any CR/LF;
 *   5. whitespace through the last CR/LF of the whitespace run;
 *   6. a whitespace run followed by something: all but its last char (that one joins the next word);
 *   7. the rest of a whitespace run;  8. any one char (unreachable: every char falls in 1..7).
 * The alternatives below are those rules in that order; anchored matching from each end gives the words.
 *
 * Unicode version. llama.cpp's tables are Unicode 15.1; the PCRE2 this was written against (10.42) has
 * Unicode 14. Comparing every code point, PCRE2's \p{L}/\p{N} miss exactly the letters and numbers added
 * in 15.0/15.1 and nothing else differs. Those code points are swapped, in the copy PCRE2 matches, for a
 * stand-in of the same class and UTF-8 length that PCRE2 knows (tk_proxy), so every class in the pattern
 * stays a single character class: runs are then matched without backtracking frames, and a megabyte-long
 * word does not exhaust the JIT stack. Whitespace is llama.cpp's explicit list, not PCRE2's \s. */
#define TK_HAN "\\x{3400}-\\x{4DBF}\\x{4E00}-\\x{9FFF}\\x{F900}-\\x{FAFF}\\x{20000}-\\x{2A6DF}\\x{2A700}-\\x{2EBEF}" \
               "\\x{2F800}-\\x{2FA1F}"
#define TK_WS "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}" \
              "\\x{3000}"

static const char tk_pattern[] =
    "[" TK_HAN "]+"
    "|[^\\r\\n\\p{L}\\p{N}]?[^\\P{L}" TK_HAN "]+(?:'(?:[sStTmMdD]|[rR][eE]|[vV][eE]|[lL][lL]))?"
    "|\\p{N}{1,3}"
    "| ?[^" TK_WS "\\p{L}\\p{N}]+[\\r\\n]*"
    "|[" TK_WS "]*[\\r\\n]+"
    "|[" TK_WS "]+(?![^" TK_WS "])"
    "|[" TK_WS "]+"
    "|(?s:.)";

/* Code points whose class PCRE2's Unicode 14 tables get wrong for llama.cpp's 15.1 ones, and the stand-in
 * each gets in the matched copy: letters new in 15.0/15.1 -> U+10400 (a letter), numbers -> U+1D7CE (a
 * digit), U+2B739 (a Han-block letter) -> U+20000, surrogates (llama.cpp passes them through as "other"
 * characters, PCRE2 rejects them) -> U+FFFD. Each stand-in has the same UTF-8 length as what it replaces,
 * so byte offsets in the two copies agree. */
static const struct {
    uint32_t lo, hi, proxy;
} tk_proxies[] = {
    {0x0D800, 0x0DFFF, 0xFFFD},  {0x1123F, 0x11240, 0x10400}, {0x11F02, 0x11F02, 0x10400}, {0x11F04, 0x11F10, 0x10400},
    {0x11F12, 0x11F33, 0x10400}, {0x11F50, 0x11F59, 0x1D7CE}, {0x1342F, 0x1342F, 0x10400}, {0x13441, 0x13446, 0x10400},
    {0x1B132, 0x1B132, 0x10400}, {0x1B155, 0x1B155, 0x10400}, {0x1D2C0, 0x1D2D3, 0x1D7CE}, {0x1DF25, 0x1DF2A, 0x10400},
    {0x1E030, 0x1E06D, 0x10400}, {0x1E4D0, 0x1E4EB, 0x10400}, {0x1E4F0, 0x1E4F9, 0x1D7CE}, {0x2B739, 0x2B739, 0x20000},
    {0x2EBF0, 0x2EE5D, 0x10400}, {0x31350, 0x323AF, 0x10400},
};

static uint32_t tk_proxy(uint32_t cp) {
    if (cp < 0xD800) return cp;
    for (size_t i = 0; i < sizeof tk_proxies / sizeof tk_proxies[0]; i++)
        if (cp >= tk_proxies[i].lo && cp <= tk_proxies[i].hi) return tk_proxies[i].proxy;
    return cp;
}

static int tk_compile(tok_tokenizer *t, rl_err *err) {
    char ver[64] = "";
    pcre2_config(PCRE2_CONFIG_UNICODE_VERSION, ver);
    int major = 0, minor = 0;
    if (sscanf(ver, "%d.%d", &major, &minor) != 2 || major < 14) {
        return rl_errf(err, "tokenizer: libpcre2 has Unicode tables '%s'; at least 14.0 is needed to split "
                            "text as llama.cpp does (its tables are Unicode 15.1)", ver);
    }
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)tk_pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_ANCHORED, &ec,
                                   &eo, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return rl_errf(err, "tokenizer: the kimi-k2 split pattern does not compile at offset %zu: %s", (size_t)eo,
                       (const char *)msg);
    }
    /* JIT is only a speed-up; the interpreter gives the same matches. Anchoring is a compile option because
     * the JIT does not support PCRE2_ANCHORED at match time. */
    t->re_jit = pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) == 0;
    t->re = re;
    return 0;
}

/* ------------------------------------------------------------------------------------------------------ */
/* Loading                                                                                                 */

/* Token type (GGUF tokenizer.ggml.token_type) -> attribute, as llama.cpp maps them. */
static uint32_t tk_type_attr(int32_t type) {
    switch (type) {
    case 1: return TOK_ATTR_NORMAL;
    case 2: return TOK_ATTR_UNKNOWN;
    case 3: return TOK_ATTR_CONTROL;
    case 4: return TOK_ATTR_USER_DEFINED;
    case 5: return TOK_ATTR_UNUSED;
    case 6: return TOK_ATTR_BYTE;
    default: return TOK_ATTR_UNDEFINED;
    }
}

/* Texts llama.cpp recognises by name at load time (llama-vocab.cpp). Where a kind's id is not given by a
 * GGUF key, the token with one of these texts becomes that kind and is forced to CONTROL. */
static const char *const tk_eot_names[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                                           "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]",
                                           "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
                                           "<end_of_utterance>", NULL};
static const char *const tk_eom_names[] = {"<|eom_id|>", NULL};
static const char *const tk_fim_pre_names[] = {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>",
                                               "<\xef\xbd\x9c" "fim\xe2\x96\x81" "begin\xef\xbd\x9c>", "<PRE>",
                                               "\xe2\x96\x81<PRE>", "<|code_prefix|>", "<|prefix|>", NULL};
static const char *const tk_fim_suf_names[] = {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
                                               "<\xef\xbd\x9c" "fim\xe2\x96\x81hole\xef\xbd\x9c>", "<SUF>",
                                               "\xe2\x96\x81<SUF>", "<|code_suffix|>", "<|suffix|>", NULL};
static const char *const tk_fim_mid_names[] = {"<|fim_middle|>", "<fim-middle>", "<fim_middle>",
                                               "<\xef\xbd\x9c" "fim\xe2\x96\x81" "end\xef\xbd\x9c>", "<MID>",
                                               "\xe2\x96\x81<MID>", "<|code_middle|>", "<|middle|>", NULL};
static const char *const tk_fim_pad_names[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", NULL};
static const char *const tk_fim_rep_names[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>",
                                               "<reponame>", NULL};
static const char *const tk_fim_sep_names[] = {"<|file_sep|>", NULL};
/* Every token with one of these texts ends generation and is forced to CONTROL. */
static const char *const tk_eog_names[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>",
                                           "<|flush|>", "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>",
                                           "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
                                           "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
                                           "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
                                           "[e~[", NULL};

/* Typed metadata reads with llama.cpp's strictness (a u32 key stored as another type fails the load). */
static int tk_key(const struct gguf_context *g, const char *key, enum gguf_type want, int64_t *id, rl_err *err) {
    *id = gguf_find_key(g, key);
    if (*id < 0) return 1;
    enum gguf_type got = gguf_get_kv_type(g, *id);
    if (got != want) {
        return rl_errf(err, "tokenizer: metadata key %s has type %s, expected %s", key, gguf_type_name(got),
                       gguf_type_name(want));
    }
    return 0;
}

static int tk_arr(const struct gguf_context *g, const char *key, enum gguf_type elem, int64_t *id, rl_err *err) {
    int rc = tk_key(g, key, GGUF_TYPE_ARRAY, id, err);
    if (rc) return rc;
    if (gguf_get_arr_type(g, *id) != elem) {
        return rl_errf(err, "tokenizer: metadata key %s is an array of %s, expected %s", key,
                       gguf_type_name(gguf_get_arr_type(g, *id)), gguf_type_name(elem));
    }
    return 0;
}

/* Reads an optional u32 token id key into *id when it is present and inside the vocabulary (llama.cpp
 * ignores an out-of-range id with a warning and keeps the default). Returns 1 if the key was usable. */
static int tk_id_key(const struct gguf_context *g, const char *key, int32_t n_vocab, int32_t *id, rl_err *err) {
    int64_t k;
    int rc = tk_key(g, key, GGUF_TYPE_UINT32, &k, err);
    if (rc) return rc < 0 ? -1 : 0;
    uint32_t v = gguf_get_val_u32(g, k);
    if (v >= (uint32_t)n_vocab) return 0;
    *id = (int32_t)v;
    return 1;
}

static int tk_bool_key(const struct gguf_context *g, const char *key, bool *out, rl_err *err) {
    int64_t k;
    int rc = tk_key(g, key, GGUF_TYPE_BOOL, &k, err);
    if (rc) return rc < 0 ? -1 : 0;
    *out = gguf_get_val_bool(g, k);
    return 0;
}

static const char *tk_txt(const tok_tokenizer *t, int32_t id) { return t->text_pool + t->text_off[id]; }
static size_t tk_txt_len(const tok_tokenizer *t, int32_t id) { return t->text_off[id + 1] - t->text_off[id] - 1; }

/* The first token (lowest id) whose text is in names, or -1. llama.cpp takes the first in its hash map's
 * iteration order; vocabularies with two candidates for one kind are not expected (none in Kimi's). */
static int32_t tk_find_named(const tok_tokenizer *t, const char *const *names) {
    int32_t best = -1;
    for (int i = 0; names[i]; i++) {
        int32_t id = tk_map_get(&t->by_text, names[i], strlen(names[i]));
        if (id >= 0 && (best < 0 || id < best)) best = id;
    }
    return best;
}

/* The piece of a NORMAL token: its mapped characters back to bytes. A character outside the byte mapping
 * renders as "[UNK_BYTE_0x<its utf-8 in hex><the whole token text>]", as llama_decode_text does. */
static int tk_normal_piece(const char *txt, size_t n, char **out, size_t *cap, size_t *len) {
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = tk_utf8_dec((const unsigned char *)txt, n, i, &cp);
        if (!k) {
            cp = 0xFFFD;
            k = 1;
        }
        i += k;
        /* room for the longest case: "[UNK_BYTE_0x" + 8 hex digits + the text + "]" */
        if (tk_grow((void **)out, cap, *len + 24 + n, 1)) return -1;
        int b = tk_cp_byte(cp);
        if (b >= 0) {
            (*out)[(*len)++] = (char)b;
            continue;
        }
        char u[4];
        size_t un = tk_utf8_enc(cp, u);
        *len += (size_t)sprintf(*out + *len, "[UNK_BYTE_0x");
        for (size_t j = 0; j < un; j++) *len += (size_t)sprintf(*out + *len, "%02x", (unsigned char)u[j]);
        memcpy(*out + *len, txt, n);
        *len += n;
        (*out)[(*len)++] = ']';
    }
    return 0;
}

static int tk_cmp_special(const void *a, const void *b, void *ctx) {
    const tok_tokenizer *t = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    size_t lx = tk_txt_len(t, x), ly = tk_txt_len(t, y);
    if (lx != ly) return lx > ly ? -1 : 1; /* longest first, as llama.cpp sorts its special-token cache */
    return x < y ? -1 : x > y;            /* ties: by id (llama.cpp's std::sort leaves them unspecified) */
}

void tok_free(tok_tokenizer *t) {
    if (!t) return;
    free(t->text_pool);
    free(t->text_off);
    free(t->attr);
    free(t->piece_pool);
    free(t->piece_off);
    free(t->eog);
    tk_map_free(&t->by_text);
    free(t->merge_pool);
    tk_map_free(&t->merges);
    free(t->special);
    if (t->re) pcre2_code_free((pcre2_code *)t->re);
    memset(t, 0, sizeof *t);
}

int tok_load_gguf(tok_tokenizer *t, const struct gguf_context *g, rl_err *err) {
    memset(t, 0, sizeof *t);
    int64_t k;
    int rc;

    /* model and pre-tokenizer: only what K3 uses, anything else is a clear refusal */
    if ((rc = tk_key(g, "tokenizer.ggml.model", GGUF_TYPE_STRING, &k, err)) != 0) {
        return rc < 0 ? -1 : rl_errf(err, "tokenizer: the file has no tokenizer.ggml.model (no vocabulary)");
    }
    const char *model = gguf_get_val_str(g, k);
    if (strcmp(model, "gpt2") != 0) {
        return rl_errf(err, "tokenizer: tokenizer.ggml.model '%s' is not supported (only 'gpt2', byte-level BPE)",
                       model);
    }
    if ((rc = tk_key(g, "tokenizer.ggml.pre", GGUF_TYPE_STRING, &k, err)) != 0) {
        return rc < 0 ? -1 : rl_errf(err, "tokenizer: the file has no tokenizer.ggml.pre; only the 'kimi-k2' "
                                          "pre-tokenizer is supported");
    }
    const char *pre = gguf_get_val_str(g, k);
    if (strcmp(pre, "kimi-k2") != 0) {
        return rl_errf(err, "tokenizer: pre-tokenizer '%s' is not supported (only 'kimi-k2')", pre);
    }

    /* tokens */
    if ((rc = tk_arr(g, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &k, err)) != 0) {
        return rc < 0 ? -1 : rl_errf(err, "tokenizer: the file has no tokenizer.ggml.tokens");
    }
    size_t nv = gguf_get_arr_n(g, k);
    if (nv == 0 || nv > INT32_MAX / 2) return rl_errf(err, "tokenizer: vocabulary of %zu tokens", nv);
    t->n_vocab = (int32_t)nv;
    size_t pool = 0;
    char empty[48];
    for (size_t i = 0; i < nv; i++) {
        size_t l = strlen(gguf_get_arr_str(g, k, i));
        pool += (l ? l : (size_t)snprintf(empty, sizeof empty, "[EMPTY_%zu]", i)) + 1;
    }
    if (pool > UINT32_MAX) return rl_errf(err, "tokenizer: token texts total %zu bytes (too large)", pool);
    t->text_pool = malloc(pool);
    t->text_off = malloc((nv + 1) * sizeof *t->text_off);
    t->attr = malloc(nv * sizeof *t->attr);
    t->eog = calloc(nv, 1);
    if (!t->text_pool || !t->text_off || !t->attr || !t->eog || tk_map_init(&t->by_text, nv)) goto oom;
    size_t off = 0;
    for (size_t i = 0; i < nv; i++) {
        const char *s = gguf_get_arr_str(g, k, i);
        size_t l = strlen(s);
        t->text_off[i] = (uint32_t)off;
        if (l) {
            memcpy(t->text_pool + off, s, l + 1);
        } else { /* llama.cpp renames empty tokens so that every text is unique and non-empty */
            l = (size_t)snprintf(t->text_pool + off, pool - off, "[EMPTY_%zu]", i);
        }
        int32_t dup = tk_map_get(&t->by_text, t->text_pool + off, l);
        if (dup >= 0) { /* llama.cpp asserts that every text is unique and aborts */
            rl_errf(err, "tokenizer: tokens %d and %zu have the same text '%.80s'; llama.cpp refuses such a "
                         "vocabulary", dup, i, t->text_pool + off);
            goto fail;
        }
        tk_map_put(&t->by_text, t->text_pool + off, l, (int32_t)i, true);
        off += l + 1;
    }
    t->text_off[nv] = (uint32_t)off;

    /* token types */
    rc = tk_arr(g, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, &k, err);
    if (rc < 0) goto fail;
    if (rc == 0) {
        if (gguf_get_arr_n(g, k) < nv) {
            rl_errf(err, "tokenizer: tokenizer.ggml.token_type has %zu entries for %zu tokens",
                    gguf_get_arr_n(g, k), nv);
            goto fail;
        }
        const int32_t *ty = gguf_get_arr_data(g, k);
        for (size_t i = 0; i < nv; i++) t->attr[i] = tk_type_attr(ty[i]);
    } else {
        for (size_t i = 0; i < nv; i++) t->attr[i] = TOK_ATTR_NORMAL;
    }

    /* merges ("left right" in mapped form; rank = position). kimi-k2 may have none (llama.cpp allows it). */
    rc = tk_arr(g, "tokenizer.ggml.merges", GGUF_TYPE_STRING, &k, err);
    if (rc < 0) goto fail;
    if (rc == 0) {
        size_t nm = gguf_get_arr_n(g, k), mp = 0;
        if (nm > INT32_MAX) {
            rl_errf(err, "tokenizer: %zu merges", nm);
            goto fail;
        }
        for (size_t i = 0; i < nm; i++) mp += strlen(gguf_get_arr_str(g, k, i)) + 1;
        t->merge_pool = malloc(mp ? mp : 1);
        if (!t->merge_pool || tk_map_init(&t->merges, nm)) goto oom;
        size_t mo = 0;
        for (size_t i = 0; i < nm; i++) {
            const char *s = gguf_get_arr_str(g, k, i);
            size_t l = strlen(s);
            memcpy(t->merge_pool + mo, s, l + 1);
            /* llama.cpp splits at the first space after the first byte; without one the merge becomes the
             * pair ("", ""), which no pair of symbols can match. The key is then the string itself. */
            if (l >= 2 && memchr(s + 1, ' ', l - 1)) tk_map_put(&t->merges, t->merge_pool + mo, l, (int32_t)i, false);
            mo += l + 1;
        }
        t->n_merges = (int32_t)nm;
    }

    /* special ids. gpt2 vocabularies default BOS and EOS to id 11 (llama.cpp), if the vocabulary has it. */
    t->bos_id = t->eos_id = nv > 11 ? 11 : -1;
    t->eot_id = t->eom_id = t->unk_id = t->pad_id = t->mask_id = -1;
    int32_t fim[6] = {-1, -1, -1, -1, -1, -1}; /* pre suf mid pad rep sep */
    int has_eot, has_eom, has_fim[6];
    if (tk_id_key(g, "tokenizer.ggml.bos_token_id", t->n_vocab, &t->bos_id, err) < 0 ||
        tk_id_key(g, "tokenizer.ggml.eos_token_id", t->n_vocab, &t->eos_id, err) < 0 ||
        (has_eot = tk_id_key(g, "tokenizer.ggml.eot_token_id", t->n_vocab, &t->eot_id, err)) < 0 ||
        (has_eom = tk_id_key(g, "tokenizer.ggml.eom_token_id", t->n_vocab, &t->eom_id, err)) < 0 ||
        tk_id_key(g, "tokenizer.ggml.unknown_token_id", t->n_vocab, &t->unk_id, err) < 0 ||
        tk_id_key(g, "tokenizer.ggml.padding_token_id", t->n_vocab, &t->pad_id, err) < 0 ||
        tk_id_key(g, "tokenizer.ggml.mask_token_id", t->n_vocab, &t->mask_id, err) < 0 ||
        (has_fim[0] = tk_id_key(g, "tokenizer.ggml.fim_pre_token_id", t->n_vocab, &fim[0], err)) < 0 ||
        (has_fim[1] = tk_id_key(g, "tokenizer.ggml.fim_suf_token_id", t->n_vocab, &fim[1], err)) < 0 ||
        (has_fim[2] = tk_id_key(g, "tokenizer.ggml.fim_mid_token_id", t->n_vocab, &fim[2], err)) < 0 ||
        (has_fim[3] = tk_id_key(g, "tokenizer.ggml.fim_pad_token_id", t->n_vocab, &fim[3], err)) < 0 ||
        (has_fim[4] = tk_id_key(g, "tokenizer.ggml.fim_rep_token_id", t->n_vocab, &fim[4], err)) < 0 ||
        (has_fim[5] = tk_id_key(g, "tokenizer.ggml.fim_sep_token_id", t->n_vocab, &fim[5], err)) < 0 ||
        tk_bool_key(g, "tokenizer.ggml.add_bos_token", &t->add_bos, err) < 0 ||
        tk_bool_key(g, "tokenizer.ggml.add_eos_token", &t->add_eos, err) < 0)
        goto fail;

    /* llama.cpp's by-name detection, in its order. A kind found by name is forced to CONTROL. */
    {
        static const char *const *const fim_names[6] = {tk_fim_pre_names, tk_fim_suf_names, tk_fim_mid_names,
                                                        tk_fim_pad_names, tk_fim_rep_names, tk_fim_sep_names};
        int32_t id;
        if (!has_eot && (id = tk_find_named(t, tk_eot_names)) >= 0) {
            t->eot_id = id;
            t->attr[id] |= TOK_ATTR_CONTROL;
        }
        if (!has_eom && (id = tk_find_named(t, tk_eom_names)) >= 0) {
            t->eom_id = id;
            t->attr[id] |= TOK_ATTR_CONTROL;
        }
        for (int f = 0; f < 6; f++) {
            if (!has_fim[f] && (id = tk_find_named(t, fim_names[f])) >= 0) {
                fim[f] = id;
                t->attr[id] |= TOK_ATTR_CONTROL;
            }
        }
        /* a CONTROL token whose text contains "unused" is also UNUSED */
        for (int32_t i = 0; i < t->n_vocab; i++)
            if ((t->attr[i] & TOK_ATTR_CONTROL) && strstr(tk_txt(t, i), "unused")) t->attr[i] |= TOK_ATTR_UNUSED;
        /* end-of-generation set: fim pad/rep/sep, every token named like an end marker, eos, eot, eom */
        for (int f = 3; f < 6; f++)
            if (fim[f] >= 0) t->eog[fim[f]] = 1;
        for (int i = 0; tk_eog_names[i]; i++) {
            id = tk_map_get(&t->by_text, tk_eog_names[i], strlen(tk_eog_names[i]));
            if (id >= 0) {
                t->eog[id] = 1;
                t->attr[id] |= TOK_ATTR_CONTROL;
            }
        }
        /* gpt-oss markers always render (llama.cpp makes them USER_DEFINED) */
        static const char *const gptoss[] = {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>", NULL};
        for (int i = 0; gptoss[i]; i++)
            if ((id = tk_map_get(&t->by_text, gptoss[i], strlen(gptoss[i]))) >= 0) t->attr[id] = TOK_ATTR_USER_DEFINED;
        if (t->eos_id >= 0) t->eog[t->eos_id] = 1;
        if (t->eot_id >= 0) t->eog[t->eot_id] = 1;
        if (t->eom_id >= 0) t->eog[t->eom_id] = 1;
        /* <|end|> is not an end when <|return|> and <|call|> (or <|calls|> and <|flush|>) also are */
        int32_t e_end = -1, has_ret = 0, has_call = 0, has_flush = 0;
        for (int32_t i = 0; i < t->n_vocab; i++) {
            if (!t->eog[i]) continue;
            const char *s = tk_txt(t, i);
            if (strcmp(s, "<|return|>") == 0) has_ret = 1;
            else if (strcmp(s, "<|call|>") == 0 || strcmp(s, "<|calls|>") == 0) has_call = 1;
            else if (strcmp(s, "<|flush|>") == 0) has_flush = 1;
            else if (strcmp(s, "<|end|>") == 0) e_end = i;
        }
        if (e_end >= 0 && has_call && (has_ret || has_flush)) {
            t->eog[e_end] = 0;
            t->attr[e_end] = TOK_ATTR_USER_DEFINED;
        }
        /* </s> is not an end (and is NORMAL) when <|tool_response> is one */
        int32_t e_s = -1, has_tr = 0;
        for (int32_t i = 0; i < t->n_vocab; i++) {
            if (!t->eog[i]) continue;
            if (strcmp(tk_txt(t, i), "<|tool_response>") == 0) has_tr = 1;
            else if (strcmp(tk_txt(t, i), "</s>") == 0) e_s = i;
        }
        if (has_tr && e_s >= 0) {
            t->eog[e_s] = 0;
            t->attr[e_s] = TOK_ATTR_NORMAL;
        }
    }

    /* special tokens that the partition step looks for */
    t->special = malloc(nv * sizeof *t->special);
    if (!t->special) goto oom;
    for (int32_t i = 0; i < t->n_vocab; i++)
        if (t->attr[i] & (TOK_ATTR_CONTROL | TOK_ATTR_USER_DEFINED | TOK_ATTR_UNKNOWN)) t->special[t->n_special++] = i;
    qsort_r(t->special, (size_t)t->n_special, sizeof *t->special, tk_cmp_special, t);

    /* pieces (rendered with special = true; tok_piece blanks CONTROL/UNKNOWN when special is false) */
    {
        size_t cap = 0, len = 0;
        char *pp = NULL;
        t->piece_off = malloc((nv + 1) * sizeof *t->piece_off);
        if (!t->piece_off) goto oom;
        for (int32_t i = 0; i < t->n_vocab; i++) {
            t->piece_off[i] = (uint32_t)len;
            uint32_t a = t->attr[i];
            const char *s = tk_txt(t, i);
            size_t n = tk_txt_len(t, i);
            if (tk_grow((void **)&pp, &cap, len + n + 1, 1)) {
                free(pp);
                goto oom;
            }
            if (a & (TOK_ATTR_UNKNOWN | TOK_ATTR_CONTROL | TOK_ATTR_USER_DEFINED)) {
                memcpy(pp + len, s, n);
                len += n;
            } else if (a & TOK_ATTR_NORMAL) {
                if (tk_normal_piece(s, n, &pp, &cap, &len)) {
                    free(pp);
                    goto oom;
                }
            } else if (a & TOK_ATTR_BYTE) {
                /* "<0xAB>" style byte token: llama.cpp reads two hex digits at offset 3 */
                char hx[3] = {n > 3 ? s[3] : 0, n > 4 ? s[4] : 0, 0};
                pp[len++] = (char)strtol(hx, NULL, 16);
            } /* UNUSED / UNDEFINED: nothing */
            if (len > UINT32_MAX - 1) {
                free(pp);
                rl_errf(err, "tokenizer: decoded pieces too large");
                goto fail;
            }
        }
        t->piece_off[nv] = (uint32_t)len;
        t->piece_pool = pp ? pp : malloc(1);
        if (!t->piece_pool) goto oom;
    }

    if (tk_compile(t, err)) goto fail;
    return 0;
oom:
    rl_errf(err, "tokenizer: out of memory loading %d tokens", t->n_vocab);
fail:
    tok_free(t);
    return -1;
}

int tok_load(tok_tokenizer *t, const struct mf_model *m, rl_err *err) {
    if (tok_load_gguf(t, m->meta, err)) return rl_err_prefix(err, "%s", m->splits[0].path);
    return 0;
}

/* ------------------------------------------------------------------------------------------------------ */
/* Encoding                                                                                                */

typedef struct tk_sym {
    int32_t start, n; /* byte span in the mapped word; n = 0 once merged into the left neighbour */
    int32_t prev, next;
} tk_sym;

typedef struct tk_bigram {
    int32_t rank, left, right, size; /* size = left.n + right.n when queued: a mismatch means it is stale */
} tk_bigram;

typedef struct tk_frag {
    size_t off, len;
    int32_t id; /* >= 0: a special token; -1: raw text [off, off + len) */
} tk_frag;

typedef struct tk_work {
    const tok_tokenizer *t;
    char *norm, *subj;   /* the fragment re-encoded; subj (in norm's buffer) has surrogates replaced for PCRE2 */
    size_t norm_cap;
    char *mapped;        /* one word in GPT-2 mapped form */
    size_t mapped_cap;
    tk_sym *sym;
    size_t sym_cap;
    tk_bigram *heap;
    size_t heap_n, heap_cap;
    char *key;
    size_t key_cap;
    int32_t *ids;
    size_t n_ids, ids_cap;
    pcre2_match_data *md;
} tk_work;


static int tk_emit(tk_work *w, int32_t id) {
    if (tk_grow((void **)&w->ids, &w->ids_cap, w->n_ids + 1, sizeof *w->ids)) return -1;
    w->ids[w->n_ids++] = id;
    return 0;
}

static int tk_heap_less(const tk_bigram *a, const tk_bigram *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static int tk_heap_push(tk_work *w, tk_bigram b) {
    if (tk_grow((void **)&w->heap, &w->heap_cap, w->heap_n + 1, sizeof *w->heap)) return -1;
    size_t i = w->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!tk_heap_less(&b, &w->heap[p])) break;
        w->heap[i] = w->heap[p];
        i = p;
    }
    w->heap[i] = b;
    return 0;
}

static tk_bigram tk_heap_pop(tk_work *w) {
    tk_bigram top = w->heap[0], last = w->heap[--w->heap_n];
    size_t i = 0, n = w->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && tk_heap_less(&w->heap[c + 1], &w->heap[c])) c++;
        if (!tk_heap_less(&w->heap[c], &last)) break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n) w->heap[i] = last;
    return top;
}

/* Queues the pair (l, r) if a merge joins them. */
static int tk_try_pair(tk_work *w, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return 0;
    const tk_sym *a = &w->sym[l], *b = &w->sym[r];
    size_t n = (size_t)a->n + 1 + (size_t)b->n;
    if (tk_grow((void **)&w->key, &w->key_cap, n, 1)) return -1;
    memcpy(w->key, w->mapped + a->start, (size_t)a->n);
    w->key[a->n] = ' ';
    memcpy(w->key + a->n + 1, w->mapped + b->start, (size_t)b->n);
    int32_t rank = tk_map_get(&w->t->merges, w->key, n);
    if (rank < 0) return 0;
    return tk_heap_push(w, (tk_bigram){rank, l, r, a->n + b->n});
}

/* BPE over one word (raw bytes). */
static int tk_bpe_word(tk_work *w, const char *word, size_t len) {
    const tok_tokenizer *t = w->t;
    if (tk_grow((void **)&w->mapped, &w->mapped_cap, 2 * len, 1) ||
        tk_grow((void **)&w->sym, &w->sym_cap, len, sizeof *w->sym))
        return -1;
    int32_t mlen = 0;
    for (size_t i = 0; i < len; i++) {
        size_t k = tk_utf8_enc(tk_byte_cp((unsigned char)word[i]), w->mapped + mlen);
        w->sym[i] = (tk_sym){mlen, (int32_t)k, (int32_t)i - 1, i + 1 < len ? (int32_t)i + 1 : -1};
        mlen += (int32_t)k;
    }
    w->heap_n = 0;
    for (size_t i = 1; i < len; i++)
        if (tk_try_pair(w, (int32_t)i - 1, (int32_t)i)) return -1;
    while (w->heap_n) {
        tk_bigram b = tk_heap_pop(w);
        tk_sym *l = &w->sym[b.left], *r = &w->sym[b.right];
        /* stale: one side was merged away or grew since the pair was queued (llama.cpp compares texts) */
        if (l->n == 0 || r->n == 0 || l->next != b.right || l->n + r->n != b.size) continue;
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) w->sym[r->next].prev = b.left;
        if (tk_try_pair(w, l->prev, b.left) || tk_try_pair(w, b.left, l->next)) return -1;
    }
    for (size_t i = 0; i < len; i++) {
        const tk_sym *s = &w->sym[i];
        if (!s->n) continue;
        int32_t id = tk_map_get(&t->by_text, w->mapped + s->start, (size_t)s->n);
        if (id >= 0) {
            if (tk_emit(w, id)) return -1;
            continue;
        }
        /* a merged piece that is not a token: llama.cpp looks up each BYTE of its mapped text on its own,
         * so a 2-byte mapped character usually finds nothing and is dropped */
        for (int32_t j = 0; j < s->n; j++) {
            id = tk_map_get(&t->by_text, w->mapped + s->start + j, 1);
            if (id >= 0 && tk_emit(w, id)) return -1;
        }
    }
    return 0;
}

/* Splits one raw-text fragment into words and BPE-encodes each. */
static int tk_encode_fragment(tk_work *w, const char *text, size_t len, rl_err *err) {
    /* Re-encode code point by code point, as llama.cpp rebuilds its words from code points: invalid bytes
     * become U+FFFD (EF BF BD), overlong forms become their short form. PCRE2 matches a second copy in which
     * a few code points are replaced by stand-ins of the same length (tk_proxy), so offsets agree. */
    if (tk_grow((void **)&w->norm, &w->norm_cap, 2 * (3 * len + 1), 1)) goto oom;
    w->subj = w->norm + w->norm_cap / 2; /* both copies in one buffer */
    size_t nn = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t k = tk_utf8_dec((const unsigned char *)text, len, i, &cp);
        if (!k) {
            cp = 0xFFFD;
            k = 1;
        }
        i += k;
        size_t e = tk_utf8_enc(cp, w->norm + nn);
        uint32_t px = tk_proxy(cp);
        if (px == cp) memcpy(w->subj + nn, w->norm + nn, e);
        else tk_utf8_enc(px, w->subj + nn);
        nn += e;
    }
    for (size_t pos = 0; pos < nn;) {
        int rc = pcre2_match((const pcre2_code *)w->t->re, (PCRE2_SPTR)w->subj, nn, pos, PCRE2_NO_UTF_CHECK, w->md,
                             NULL);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT) /* not expected (no pattern part needs a frame per char); the
                                               * interpreter keeps its frames on the heap */
            rc = pcre2_match((const pcre2_code *)w->t->re, (PCRE2_SPTR)w->subj, nn, pos,
                             PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, w->md, NULL);
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return rl_errf(err, "tokenizer: splitting failed at byte %zu: %s", pos, (const char *)msg);
        }
        size_t end = pcre2_get_ovector_pointer(w->md)[1];
        if (end <= pos) return rl_errf(err, "tokenizer: empty split at byte %zu (pattern bug)", pos);
        if (tk_bpe_word(w, w->norm + pos, end - pos)) goto oom;
        pos = end;
    }
    return 0;
oom:
    return rl_errf(err, "tokenizer: out of memory");
}

int tok_encode(const tok_tokenizer *t, const char *text, size_t len, bool parse_special, int32_t **ids,
               size_t *n_ids, rl_err *err) {
    *ids = NULL;
    *n_ids = 0;
    tk_work w;
    memset(&w, 0, sizeof w);
    w.t = t;
    tk_frag *fa = NULL, *fb = NULL;
    size_t na = 0, ca = 0, nb = 0, cb = 0;
    int ret = -1;
    if (!(w.md = pcre2_match_data_create(1, NULL))) goto oom;

    /* Special tokens first: for each one (longest text first), cut every occurrence out of every raw
     * fragment left so far. Without parse_special only USER_DEFINED tokens are cut (llama.cpp skips
     * CONTROL and UNKNOWN then); Kimi has none, so the text is then one fragment. */
    if (len) {
        if (tk_grow((void **)&fa, &ca, 1, sizeof *fa)) goto oom;
        fa[na++] = (tk_frag){0, len, -1};
    }
    for (int32_t si = 0; si < t->n_special && na; si++) {
        int32_t sid = t->special[si];
        if (!parse_special && (t->attr[sid] & (TOK_ATTR_CONTROL | TOK_ATTR_UNKNOWN))) continue;
        const char *st = tk_txt(t, sid);
        size_t sl = tk_txt_len(t, sid);
        nb = 0;
        for (size_t f = 0; f < na; f++) {
            if (fa[f].id >= 0) {
                if (tk_grow((void **)&fb, &cb, nb + 1, sizeof *fb)) goto oom;
                fb[nb++] = fa[f];
                continue;
            }
            size_t off = fa[f].off, rem = fa[f].len;
            while (rem) {
                const char *p = sl <= rem ? memmem(text + off, rem, st, sl) : NULL;
                if (tk_grow((void **)&fb, &cb, nb + 2, sizeof *fb)) goto oom;
                if (!p) {
                    fb[nb++] = (tk_frag){off, rem, -1};
                    break;
                }
                size_t m = (size_t)(p - text);
                if (m > off) fb[nb++] = (tk_frag){off, m - off, -1};
                fb[nb++] = (tk_frag){0, 0, sid};
                rem = off + rem - (m + sl);
                off = m + sl;
            }
        }
        tk_frag *tf = fa;
        fa = fb;
        fb = tf;
        size_t tc = ca;
        ca = cb;
        cb = tc;
        na = nb;
    }
    for (size_t f = 0; f < na; f++) {
        if (fa[f].id >= 0) {
            if (tk_emit(&w, fa[f].id)) goto oom;
        } else if (tk_encode_fragment(&w, text + fa[f].off, fa[f].len, err)) {
            goto done;
        }
    }
    *ids = w.ids;
    *n_ids = w.n_ids;
    w.ids = NULL;
    ret = 0;
    goto done;
oom:
    rl_errf(err, "tokenizer: out of memory");
done:
    free(fa);
    free(fb);
    free(w.norm);
    free(w.mapped);
    free(w.sym);
    free(w.heap);
    free(w.key);
    free(w.ids);
    if (w.md) pcre2_match_data_free(w.md);
    return ret;
}

/* ------------------------------------------------------------------------------------------------------ */
/* Decoding                                                                                                */

int tok_piece(const tok_tokenizer *t, int32_t id, bool special, const char **bytes, size_t *len) {
    if (id < 0 || id >= t->n_vocab) return -1;
    if (!special && (t->attr[id] & (TOK_ATTR_UNKNOWN | TOK_ATTR_CONTROL))) {
        *bytes = t->piece_pool;
        *len = 0;
        return 0;
    }
    *bytes = t->piece_pool + t->piece_off[id];
    *len = t->piece_off[id + 1] - t->piece_off[id];
    return 0;
}

int tok_decode(const tok_tokenizer *t, const int32_t *ids, size_t n_ids, bool special, bool remove_special,
               char **out, size_t *out_len, rl_err *err) {
    *out = NULL;
    *out_len = 0;
    /* llama_detokenize's remove_special: only when the vocabulary itself adds BOS / EOS */
    if (remove_special && t->add_bos && n_ids > 0 && ids[0] == t->bos_id) {
        ids++;
        n_ids--;
    }
    if (remove_special && t->add_eos && n_ids > 0 && ids[n_ids - 1] == t->eos_id) n_ids--;
    size_t total = 0;
    for (size_t i = 0; i < n_ids; i++) {
        const char *p;
        size_t n;
        if (tok_piece(t, ids[i], special, &p, &n)) {
            return rl_errf(err, "detokenize: token id %d at position %zu is outside the vocabulary (%d)", ids[i], i,
                           t->n_vocab);
        }
        total += n;
    }
    char *s = malloc(total + 1);
    if (!s) return rl_errf(err, "detokenize: out of memory");
    size_t o = 0;
    for (size_t i = 0; i < n_ids; i++) {
        const char *p;
        size_t n;
        tok_piece(t, ids[i], special, &p, &n);
        memcpy(s + o, p, n);
        o += n;
    }
    s[o] = 0;
    *out = s;
    *out_len = o;
    return 0;
}

int32_t tok_find(const tok_tokenizer *t, const char *text, size_t len) { return tk_map_get(&t->by_text, text, len); }

const char *tok_text(const tok_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab ? tk_txt(t, id) : NULL;
}

uint32_t tok_attr(const tok_tokenizer *t, int32_t id) { return id >= 0 && id < t->n_vocab ? t->attr[id] : 0; }

bool tok_is_eog(const tok_tokenizer *t, int32_t id) { return id >= 0 && id < t->n_vocab && t->eog[id]; }

/* ------------------------------------------------------------------------------------------------------ */
/* Streaming                                                                                               */

size_t tok_utf8_safe_prefix(const char *str, size_t n) {
    const unsigned char *s = (const unsigned char *)str;
    /* Only the last 3 bytes can belong to an unfinished character. Find the last lead byte among them and
     * hold it back if what follows it is a valid but too short start of its sequence. */
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        unsigned b = s[n - back];
        if ((b & 0xC0) == 0x80) continue; /* continuation: keep looking for the lead */
        size_t need = b >= 0xC2 && b <= 0xDF ? 2 : b >= 0xE0 && b <= 0xEF ? 3 : b >= 0xF0 && b <= 0xF4 ? 4 : 0;
        if (need <= back) return n; /* ASCII, invalid lead, or a complete sequence */
        if (back >= 2) {             /* second byte ranges that keep the sequence valid (RFC 3629) */
            unsigned c = s[n - back + 1];
            if ((b == 0xE0 && c < 0xA0) || (b == 0xED && c > 0x9F) || (b == 0xF0 && c < 0x90) ||
                (b == 0xF4 && c > 0x8F))
                return n;
        }
        return n - back;
    }
    return n;
}

void tok_stream_init(tok_stream *s, const tok_tokenizer *t, bool special) {
    memset(s, 0, sizeof *s);
    s->t = t;
    s->special = special;
}

int tok_stream_push_bytes(tok_stream *s, const char *bytes, size_t n, const char **text, size_t *len, rl_err *err) {
    /* out = held tail + new bytes; hand out its safe prefix, keep the rest (at most 3 bytes) apart from
     * the output buffer so the caller's view stays valid until the next call */
    if (tk_grow((void **)&s->buf, &s->cap, s->held + n + 1, 1)) return rl_errf(err, "detokenize: out of memory");
    memcpy(s->buf, s->pend, s->held);
    memcpy(s->buf + s->held, bytes, n);
    size_t total = s->held + n, ok = tok_utf8_safe_prefix(s->buf, total);
    s->held = total - ok;
    memcpy(s->pend, s->buf + ok, s->held);
    s->buf[ok] = 0;
    *text = s->buf;
    *len = ok;
    return 0;
}

int tok_stream_push(tok_stream *s, int32_t id, const char **text, size_t *len, rl_err *err) {
    const char *p;
    size_t n;
    if (tok_piece(s->t, id, s->special, &p, &n)) {
        return rl_errf(err, "detokenize: token id %d is outside the vocabulary (%d)", id, s->t->n_vocab);
    }
    return tok_stream_push_bytes(s, p, n, text, len, err);
}

void tok_stream_flush(tok_stream *s, const char **text, size_t *len) {
    /* pend is only rewritten by the next push, so pointing at it is safe */
    *text = s->pend;
    *len = s->held;
    s->held = 0;
}

void tok_stream_free(tok_stream *s) {
    free(s->buf);
    memset(s, 0, sizeof *s);
}

/* The vocabulary as constrained sampling sees it: each token's bytes as text would show them (control
 * tokens have none, so a grammar never lets one through), and which tokens end generation. */
static const char sym_bytes[8] = {(char)GR_SYM(0), (char)GR_SYM(1), (char)GR_SYM(2), (char)GR_SYM(3),
                                  (char)GR_SYM(4), (char)GR_SYM(5), (char)GR_SYM(6), (char)GR_SYM(7)};

smp_vocab *tok_vocab_new(const tok_tokenizer *t, const char *const *syms, int n_syms) {
    smp_vocab *v = calloc(1, sizeof *v);
    const char **piece = v ? malloc((size_t)t->n_vocab * sizeof *piece) : NULL;
    uint32_t *len = piece ? malloc((size_t)t->n_vocab * sizeof *len) : NULL;
    uint8_t *eog = len ? malloc((size_t)t->n_vocab) : NULL;
    if (!eog) {
        free(v), free(piece), free(len);
        return NULL;
    }
    for (int32_t i = 0; i < t->n_vocab; i++) {
        size_t n;
        tok_piece(t, i, false, &piece[i], &n);
        len[i] = (uint32_t)n;
        eog[i] = tok_is_eog(t, i);
        /* bytes 0xF8-0xFF never occur in UTF-8 text and stand for the symbols: a token holding one (a
         * byte-fallback token) would pass for a control token, so no grammar may take it */
        for (size_t b = 0; b < n; b++)
            if ((unsigned char)piece[i][b] >= 0xF8) len[i] = 0;
    }
    for (int k = 0; k < n_syms && k < 8; k++) {
        int32_t id = tok_find(t, syms[k], strlen(syms[k]));
        if (id >= 0) piece[id] = &sym_bytes[k], len[id] = 1;
    }
    *v = (smp_vocab){.n = t->n_vocab, .piece = piece, .len = len, .eog = eog};
    return v;
}

void tok_vocab_free(smp_vocab *v) {
    if (!v) return;
    free((void *)v->piece);
    free((void *)v->len);
    free((void *)v->eog);
    free(v);
}
