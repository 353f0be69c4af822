/* grammar.h - context-free grammars over bytes, recognized a byte at a time, for constrained decoding.
 *
 * A grammar is a list of rules; a rule is a list of alternatives; an alternative is a sequence of byte sets
 * and references to rules (GBNF's model, as llama.cpp's grammar engine has it). A recognizer state is the
 * set of parse stacks still alive after the bytes fed so far (an alternative position per stack frame):
 * feeding a byte keeps the stacks whose top set holds it. Grammars are built by code (json_schema.h writes
 * them from JSON schemas), never parsed from text, and must not be left-recursive.
 *
 * Bytes 0xF8-0xFF never occur in UTF-8 text, so they name special tokens here (GR_SYM(k)): a grammar can
 * require <|open|> as one token, not as its spelling. The sampler maps such tokens to their byte (smp_vocab).
 *
 * What constrained decoding needs of a state: whether bytes can come next (gr_feed), whether the text may
 * end here (gr_done), and the fewest bytes that would end it (gr_close_len), so a sampler that must stop
 * within a token budget never starts what it cannot finish. */
#ifndef RINGLM_GRAMMAR_H
#define RINGLM_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/err.h"

#define GR_SYM(k) ((unsigned char)(0xF8 + (k))) /* special token k (0..7) */
#define GR_MAX_STACKS 64   /* live parses kept; an ambiguous grammar past this loses parses, never memory */
#define GR_MAX_FRAMES 512  /* nesting kept per parse (a JSON value 500 containers deep is refused) */

typedef struct gr_grammar gr_grammar;

/* ---- building ---------------------------------------------------------------------------------------- */

typedef struct gr_builder gr_builder;

/* One item of an alternative: a byte set, a literal (each byte a singleton set) or a rule. */
typedef struct gr_item {
    enum { GR_SET, GR_LIT, GR_RULE } kind;
    const uint8_t *set; /* GR_SET: 32 bytes, bit b = byte b allowed */
    const char *lit;    /* GR_LIT: NUL-terminated */
    int rule;           /* GR_RULE */
} gr_item;

gr_builder *gr_builder_new(void);
void gr_builder_free(gr_builder *b);
/* A new rule with no alternatives yet; its id. Rules may be referenced before they are defined. */
int gr_rule_new(gr_builder *b);
/* Adds an alternative to rule r (n = 0: the empty alternative). */
void gr_alt_add(gr_builder *b, int r, const gr_item *items, int n);
/* The grammar with rule root as its start; b is left as it was. Fails on a rule with no alternative, a
 * rule that can derive no finite text, or out of memory. */
gr_grammar *gr_build(const gr_builder *b, int root, rl_err *err);
/* A grammar never changes once built, so requests share one: gr_ref takes a reference (returns g), gr_free
 * drops one and frees the grammar with the last (from any thread). */
gr_grammar *gr_ref(gr_grammar *g);
void gr_free(gr_grammar *g);

/* The wire form (a grammar sent to the ring's last stage, which samples): *out malloc'ed, *out_len bytes;
 * -1 out of memory. gr_decode checks every count and index of untrusted bytes and builds the grammar again
 * (gr_build's checks included); the result recognizes exactly what the encoded one did. */
int gr_encode(const gr_grammar *g, uint8_t **out, size_t *out_len);
gr_grammar *gr_decode(const uint8_t *buf, size_t len, rl_err *err);
/* Byte-set helpers: 32-byte bitmaps. */
void gr_set_clear(uint8_t set[32]);
void gr_set_add(uint8_t set[32], unsigned char lo, unsigned char hi);

/* ---- recognizing ------------------------------------------------------------------------------------- */

typedef struct gr_state {
    uint32_t *buf; /* the stacks, one after another: [frames][frame ...] */
    size_t n, cap;
    int n_stacks;
} gr_state;

/* The state before any byte. Fails only out of memory. */
int gr_state_init(const gr_grammar *g, gr_state *s);
void gr_state_free(gr_state *s);
/* dst = src (dst's memory reused) */
int gr_state_copy(gr_state *dst, const gr_state *src);
/* Feeds n bytes; false when no parse survives them (s is then empty: copy it first to try bytes). */
bool gr_feed(const gr_grammar *g, gr_state *s, const char *bytes, size_t n);
/* The text so far is a whole sentence of the grammar. */
bool gr_done(const gr_grammar *g, const gr_state *s);
/* The fewest bytes that would make it whole (0 when done; SIZE_MAX when no parse is alive). */
size_t gr_close_len(const gr_grammar *g, const gr_state *s);
/* Writes one shortest completion (at most cap - 1 bytes, NUL-terminated); its length, or SIZE_MAX when it
 * does not fit or no parse is alive. (Tests use it to check gr_close_len.) */
size_t gr_close(const gr_grammar *g, const gr_state *s, char *out, size_t cap);

#endif
