/* Folder src/text/: tokenizer (kimi-k2 pre-split, BPE), Kimi chat formats, samplers. May include: base, gguf.
 * (README "Layout"; tests/t_layout.sh checks both.)
 */
/* tokenizer.h - Kimi's byte-level BPE tokenizer, token for token what llama.cpp produces.
 *
 * Only what K3 files use is supported: tokenizer.ggml.model "gpt2" (byte-level BPE) with the "kimi-k2"
 * pre-tokenizer. Anything else is refused with an error at load time, never tokenized approximately.
 *
 * tok_encode(parse_special) == llama_tokenize(add_special = false, parse_special):
 *   1. special tokens (CONTROL / UNKNOWN only when parse_special; USER_DEFINED always) are cut out of the
 *      text, longest token first, each over every remaining text fragment, left to right;
 *   2. each remaining fragment is decoded to code points the way llama.cpp does (an invalid byte becomes
 *      U+FFFD, overlong forms are accepted and re-encoded short, surrogates pass through) and split into
 *      words by the kimi-k2 rules (a PCRE2 pattern, see tokenizer.c and docs/tokenizer.md);
 *   3. each word is mapped byte -> GPT-2 unicode form and merged by BPE rank (lowest rank first, leftmost
 *      first among equal ranks); a final piece missing from the vocabulary falls back to its single bytes.
 *
 * Decoding (tok_piece / tok_decode / tok_stream) follows llama_token_to_piece: NORMAL tokens map back to
 * bytes, CONTROL/UNKNOWN tokens render their text only with `special`, USER_DEFINED always render their
 * text, UNUSED tokens render as nothing.
 *
 * A loaded tokenizer is read-only: any number of threads may encode/decode with it at once. */
#ifndef RINGLM_TOKENIZER_H
#define RINGLM_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/err.h"
#include "sampler.h"

struct mf_model;
struct gguf_context;

/* Token attributes: llama.h's llama_token_attr bits (a token may carry several). */
enum {
    TOK_ATTR_UNDEFINED = 0,
    TOK_ATTR_UNKNOWN = 1 << 0,
    TOK_ATTR_UNUSED = 1 << 1,
    TOK_ATTR_NORMAL = 1 << 2,
    TOK_ATTR_CONTROL = 1 << 3,
    TOK_ATTR_USER_DEFINED = 1 << 4,
    TOK_ATTR_BYTE = 1 << 5,
};

/* A string -> int32 hash map over strings owned elsewhere (open addressing, power-of-two size). */
typedef struct tok_map {
    uint32_t mask;      /* capacity - 1; 0 when empty */
    uint32_t *hash;     /* per slot; 0 = free (real hashes are forced non-zero) */
    const char **key;
    uint32_t *key_len;
    int32_t *val;
} tok_map;

typedef struct tok_tokenizer {
    int32_t n_vocab;
    char *text_pool;        /* every token's text, NUL-terminated, back to back */
    uint32_t *text_off;     /* [n_vocab + 1] offsets into text_pool; length = off[i+1] - off[i] - 1 */
    uint32_t *attr;         /* [n_vocab] TOK_ATTR_* bits after llama.cpp's load-time adjustments */
    char *piece_pool;       /* decoded bytes of every token as rendered with special = true */
    uint32_t *piece_off;    /* [n_vocab + 1] */
    uint8_t *eog;           /* [n_vocab] 1 = ends generation (llama.cpp's special_eog_ids) */
    tok_map by_text;        /* token text -> id (texts are unique: a vocabulary with a repeated text is refused) */
    char *merge_pool;
    int32_t n_merges;
    tok_map merges;         /* "left right" (mapped form) -> rank; the first of duplicate merges wins */
    int32_t *special;       /* ids of CONTROL / USER_DEFINED / UNKNOWN tokens, longest text first */
    int32_t n_special;
    int32_t bos_id, eos_id, eot_id, eom_id, unk_id, pad_id, mask_id; /* -1 = none */
    bool add_bos, add_eos;  /* tokenizer.ggml.add_bos_token / add_eos_token (kimi-k2 default: false) */
    void *re;               /* compiled pcre2 pattern (pcre2_code_8 *) of the kimi-k2 split */
    bool re_jit;            /* the pattern was JIT-compiled */
} tok_tokenizer;

/* Loads the vocabulary of an opened model (tokenizer.ggml.* keys). */
int tok_load(tok_tokenizer *t, const struct mf_model *m, rl_err *err);
/* The same from a bare gguf context (tests build vocabularies in memory). */
int tok_load_gguf(tok_tokenizer *t, const struct gguf_context *g, rl_err *err);
void tok_free(tok_tokenizer *t);

/* Tokenizes len bytes of text (any bytes, NULs included). *ids is allocated (free() it); *n_ids may be 0.
 * Same result as llama_tokenize(vocab, text, len, ..., add_special = false, parse_special). The one
 * deliberate difference: a 4-byte sequence that decodes above U+10FFFF (lead byte F4..F7) makes llama.cpp
 * throw and abort the process; here its bytes are treated as invalid, each becoming U+FFFD. */
int tok_encode(const tok_tokenizer *t, const char *text, size_t len, bool parse_special, int32_t **ids,
               size_t *n_ids, rl_err *err);

/* The bytes of one token (llama_token_to_piece with lstrip 0): points into the tokenizer, not NUL-terminated
 * in general. Returns -1 for an id outside the vocabulary. */
int tok_piece(const tok_tokenizer *t, int32_t id, bool special, const char **bytes, size_t *len);

/* Concatenated pieces (llama_detokenize with unparse_special = special; remove_special drops a leading BOS
 * and a trailing EOS when the vocabulary adds them). *out is allocated and NUL-terminated (free() it). */
int tok_decode(const tok_tokenizer *t, const int32_t *ids, size_t n_ids, bool special, bool remove_special,
               char **out, size_t *out_len, rl_err *err);

/* Lookups. tok_find returns the id whose text is exactly `text` (as stored), or -1. */
int32_t tok_find(const tok_tokenizer *t, const char *text, size_t len);
const char *tok_text(const tok_tokenizer *t, int32_t id); /* NULL for an id out of range */
uint32_t tok_attr(const tok_tokenizer *t, int32_t id);    /* 0 for an id out of range */
bool tok_is_eog(const tok_tokenizer *t, int32_t id);

/* The vocabulary for constrained sampling (sampler.h): pieces point into t, which must outlive it. NULL
 * when out of memory. */
/* syms[k] (a control token's text, n_syms <= 8) reads as the one byte GR_SYM(k) (grammar.h), so a grammar
 * can ask for that token; other control tokens have no bytes (a grammar never allows them). */
smp_vocab *tok_vocab_new(const tok_tokenizer *t, const char *const *syms, int n_syms);
void tok_vocab_free(smp_vocab *v);

/* Streaming detokenizer: feed tokens one at a time and print what comes out. A piece that ends inside a
 * UTF-8 sequence (a multi-byte character split across tokens) is held back until the sequence completes,
 * so every chunk handed out is whole characters; bytes that can never become valid UTF-8 are passed on
 * as they are, so nothing is lost. */
typedef struct tok_stream {
    const tok_tokenizer *t;
    bool special;
    char *buf;     /* what the last call handed out */
    size_t cap;
    char pend[4];  /* bytes held back: the start of an unfinished character (at most 3) */
    size_t held;
} tok_stream;

void tok_stream_init(tok_stream *s, const tok_tokenizer *t, bool special);
/* Appends token id's piece; (*text, *len) is what may be printed now (valid until the next call). */
int tok_stream_push(tok_stream *s, int32_t id, const char **text, size_t *len, rl_err *err);
/* The same for raw bytes (what tok_stream_push does after looking the piece up). */
int tok_stream_push_bytes(tok_stream *s, const char *bytes, size_t n, const char **text, size_t *len, rl_err *err);
/* End of stream: hands out whatever is still held (an incomplete sequence, as raw bytes). */
void tok_stream_flush(tok_stream *s, const char **text, size_t *len);
void tok_stream_free(tok_stream *s);

/* Length of the longest prefix of s[0..n) that does not end inside an incomplete (but so far valid)
 * UTF-8 sequence. What tok_stream uses; exposed for tests. */
size_t tok_utf8_safe_prefix(const char *s, size_t n);

#endif
