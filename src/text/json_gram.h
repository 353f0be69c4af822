/* json_gram.h - is this text the start of a JSON object? Byte by byte, for constrained decoding.
 *
 * A pushdown recognizer of RFC 8259 JSON (at most JG_MAX_DEPTH nested containers, at most JG_MAX_WS
 * whitespace bytes in a row, so a model cannot stall in blank space), whose top-level value must be an
 * object (response_format json_object). jg_feed says whether the bytes keep the text a prefix of such a
 * document; jg_done whether it is a whole one; jg_close the shortest bytes that would finish it, which a
 * sampler forces when its token budget runs out. The state is a plain struct: copy it to try bytes. */
#ifndef RINGLM_JSON_GRAM_H
#define RINGLM_JSON_GRAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define JG_MAX_DEPTH 32
#define JG_MAX_WS 4

typedef struct jg_state {
    uint8_t mode;              /* what the next byte may be (json_gram.c) */
    uint8_t sub;               /* inside a string escape, a number or a literal: how far */
    uint8_t ws;                /* whitespace bytes in a row */
    uint8_t depth;             /* open containers */
    uint8_t key;               /* the string being read is an object key */
    uint8_t stack[JG_MAX_DEPTH]; /* per open container: '{' or '[' */
} jg_state;

void jg_init(jg_state *s);
/* Feeds n bytes; false (s then undefined: feed a copy) when they cannot continue a JSON object. */
bool jg_feed(jg_state *s, const char *bytes, size_t n);
/* A whole document: the top-level object is closed. */
bool jg_done(const jg_state *s);
/* The shortest bytes that finish the document (at most JG_CLOSE_MAX, NUL-terminated in out); their count. */
#define JG_CLOSE_MAX (4 * JG_MAX_DEPTH + 16)
size_t jg_close(const jg_state *s, char *out);

#endif
