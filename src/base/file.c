#include "file.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int rl_read_file(const char *path, const char *what, char **out, size_t *len, rl_err *err) {
    const char *w = what ? what : "", *sp = what ? " " : "";
    FILE *f = fopen(path, "rb");
    if (!f) return rl_errf(err, "cannot open %s%s%s: %s", w, sp, path, strerror(errno));
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n + 1 >= cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0) break;
    }
    bool bad = !buf || ferror(f);
    fclose(f);
    if (bad) {
        bool oom = !buf;
        free(buf);
        return rl_errf(err, oom ? "out of memory reading %s%s%s" : "cannot read %s%s%s", w, sp, path);
    }
    buf[n] = 0;
    *out = buf;
    *len = n;
    return 0;
}
