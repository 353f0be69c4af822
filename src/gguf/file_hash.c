#include "file_hash.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include <sodium.h>

/* The cache line: "size mtime_ns hash". A mismatch of size or mtime means the file changed. */
static int fh_cached(const char *path, const struct stat *st, char hex[65]) {
    char cpath[4096];
    snprintf(cpath, sizeof cpath, "%s.ringlm-hash", path);
    FILE *f = fopen(cpath, "r");
    if (!f) return -1;
    long long size, mtime;
    char h[65] = {0};
    int ok = fscanf(f, "%lld %lld %64s", &size, &mtime, h) == 3;
    fclose(f);
    long long want_mtime = (long long)st->st_mtim.tv_sec * 1000000000LL + st->st_mtim.tv_nsec;
    if (!ok || size != (long long)st->st_size || mtime != want_mtime || strlen(h) != 64) return -1;
    memcpy(hex, h, 65);
    return 0;
}

static void fh_store(const char *path, const struct stat *st, const char hex[65]) {
    char cpath[4096];
    snprintf(cpath, sizeof cpath, "%s.ringlm-hash", path);
    FILE *f = fopen(cpath, "w"); /* a read-only folder just means no cache */
    if (!f) return;
    fprintf(f, "%lld %lld %s\n", (long long)st->st_size,
            (long long)st->st_mtim.tv_sec * 1000000000LL + st->st_mtim.tv_nsec, hex);
    fclose(f);
}

int fh_model_hash(const mf_model *m, char hex[65], rl_err *err) {
    if (sodium_init() < 0) return rl_errf(err, "libsodium failed to initialise");
    const char *key = m->splits[0].path;
    struct stat st;
    if (stat(key, &st) != 0) return rl_errf(err, "cannot stat %s", key);
    if (m->n_split == 1 && fh_cached(key, &st, hex) == 0) return 0;
    crypto_generichash_state s;
    crypto_generichash_init(&s, NULL, 0, 32);
    for (int i = 0; i < m->n_split; i++) {
        /* The mapping is already there: hash it in 1 MiB steps. */
        const unsigned char *p = m->splits[i].map;
        for (size_t off = 0; off < m->splits[i].size; off += 1 << 20) {
            size_t n = m->splits[i].size - off < (1u << 20) ? m->splits[i].size - off : 1u << 20;
            crypto_generichash_update(&s, p + off, n);
        }
    }
    unsigned char out[32];
    crypto_generichash_final(&s, out, 32);
    sodium_bin2hex(hex, 65, out, 32);
    if (m->n_split == 1) fh_store(key, &st, hex);
    return 0;
}
