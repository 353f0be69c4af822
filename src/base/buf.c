/* buf.c - the growable byte buffer (buf.h). */
#include "buf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int rl_buf_add(rl_buf *b, const void *s, size_t n) {
    if (b->oom) return -1;
    if (b->len + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 64;
        while (nc < b->len + n + 1) nc *= 2;
        char *np = realloc(b->p, nc);
        if (!np) {
            b->oom = true;
            return -1;
        }
        b->p = np;
        b->cap = nc;
    }
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
    return 0;
}

int rl_buf_printf(rl_buf *b, const char *fmt, ...) {
    char tmp[1024]; /* most lines fit: one vsnprintf; longer ones are formatted again into their size */
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0 || b->oom) return -1;
    if ((size_t)n < sizeof tmp) return rl_buf_add(b, tmp, (size_t)n);
    char *big = malloc((size_t)n + 1);
    if (!big) {
        b->oom = true;
        return -1;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    int rc = rl_buf_add(b, big, (size_t)n);
    free(big);
    return rc;
}

char *rl_buf_take(rl_buf *b, size_t *len) {
    char *p = b->p;
    if (len) *len = b->len;
    *b = (rl_buf){0};
    return p;
}

void rl_buf_free(rl_buf *b) {
    free(b->p);
    *b = (rl_buf){0};
}
