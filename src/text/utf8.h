/* utf8.h - the one UTF-8 validator: what the API's JSON (which must be UTF-8) may carry of a model's bytes
 * or a client's text. Strict, as RFC 3629 and the WHATWG decoder: no overlong forms, no surrogates,
 * nothing above U+10FFFF. (The tokenizer decodes with llama.cpp's own, more lenient rules instead: it must
 * split text as llama.cpp does, not judge it.) */
#ifndef RINGLM_UTF8_H
#define RINGLM_UTF8_H

#include <stddef.h>

/* The length (1-4) of the valid UTF-8 sequence that s[0 .. n) starts with (n >= 1), or 0 when it starts
 * with none (an invalid byte, or a sequence cut off at n). Then *bad, when bad is not NULL, is the length of
 * the maximal subpart the WHATWG decoder replaces with one U+FFFD (1-3). */
size_t utf8_len(const unsigned char *s, size_t n, size_t *bad);

#endif
