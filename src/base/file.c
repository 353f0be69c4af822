#include "file.h"

#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

int rl_pread_all(int fd, void *dst, size_t n, uint64_t off) {
    uint8_t *p = dst;
    while (n > 0) {
        ssize_t r = pread(fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return r < 0 ? errno : EIO;
        p += r, n -= (size_t)r, off += (uint64_t)r;
    }
    return 0;
}

int rl_pwrite_all(int fd, const void *src, size_t n, uint64_t off) {
    const uint8_t *p = src;
    while (n > 0) {
        ssize_t r = pwrite(fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return r < 0 ? errno : EIO;
        p += r, n -= (size_t)r, off += (uint64_t)r;
    }
    return 0;
}

int rl_mkdirs(const char *path) {
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s", path) >= (int)sizeof tmp) { /* never a silently shorter path */
        errno = ENAMETOOLONG;
        return -1;
    }
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(tmp, 0700) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    if (mkdir(tmp, 0700) == 0) return 0;
    struct stat st; /* EEXIST: fine if it is a folder (a file of that name is not) */
    if (errno != EEXIST || stat(tmp, &st) != 0) return -1;
    if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    return 0;
}
