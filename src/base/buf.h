/* buf.h - the one growable byte buffer: appended to, kept NUL-terminated (so text in it is a C string), and
 * handed over whole with rl_buf_take (the taker frees it; the buffer starts again empty). Capacity doubles,
 * so appending n bytes in pieces costs O(n). */
#ifndef RINGLM_BUF_H
#define RINGLM_BUF_H

#include <stdbool.h>
#include <stddef.h>

typedef struct rl_buf {
    char *p;          /* NULL until something is added; then p[len] == 0 */
    size_t len, cap;
    bool oom;         /* an add failed for want of memory: later adds fail too, so a writer of many pieces
                       * may check once, at the end */
} rl_buf;

/* Appends n bytes; -1 out of memory (the buffer is left as it was, and oom set). */
int rl_buf_add(rl_buf *b, const void *s, size_t n);
/* Appends printf-formatted text; -1 out of memory or a bad format. */
int rl_buf_printf(rl_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The bytes (malloc'ed, NUL-terminated; NULL when nothing was ever added), their count in *len when len is
 * not NULL; the buffer is empty (and oom clear) afterwards. */
char *rl_buf_take(rl_buf *b, size_t *len);
void rl_buf_free(rl_buf *b);

#endif
