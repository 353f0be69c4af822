/* (sync_file_range is a GNU extension: _GNU_SOURCE comes from the build flags) */
#include "expert_copy.h"

#include "../base/file.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define XCP_MAGIC "RLMXCPY1"
#define XCP_ALIGN 4096

/* The header: magic, key, n_layers, n_expert, then per layer its stride. */
typedef struct xcp_head {
    char magic[8];
    uint64_t key;
    uint32_t n_layers, n_expert;
} xcp_head;

uint64_t xcp_hash(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ULL;
    return h;
}

static uint64_t xcp_round(uint64_t n) { return (n + XCP_ALIGN - 1) / XCP_ALIGN * XCP_ALIGN; }

/* The file's header bytes for this layout (magic, key, counts, strides). */
static uint8_t *xcp_header(uint64_t key, uint32_t n_layers, uint32_t n_expert, const uint64_t *stride, size_t *len) {
    *len = sizeof(xcp_head) + (size_t)n_layers * sizeof *stride;
    uint8_t *h = calloc(1, *len);
    if (!h) return NULL;
    xcp_head hd = {.key = key, .n_layers = n_layers, .n_expert = n_expert};
    memcpy(hd.magic, XCP_MAGIC, 8);
    memcpy(h, &hd, sizeof hd);
    memcpy(h + sizeof hd, stride, (size_t)n_layers * sizeof *stride);
    return h;
}

int xcp_open(xcp_file *f, const char *dir, uint64_t key, uint32_t n_layers, uint32_t n_expert, const uint64_t *stride,
             rl_err *err) {
    memset(f, 0, sizeof *f);
    f->fd = -1;
    f->n_layers = n_layers, f->n_expert = n_expert;
    size_t hlen;
    uint8_t *head = xcp_header(key, n_layers, n_expert, stride, &hlen);
    f->off = calloc(n_layers, sizeof *f->off);
    f->stride = malloc((size_t)n_layers * sizeof *f->stride);
    f->have = calloc((size_t)n_layers * n_expert, 1);
    if (!head || !f->off || !f->stride || !f->have) {
        free(head);
        xcp_close(f);
        return rl_errf(err, "out of memory for the expert copy's tables");
    }
    memcpy(f->stride, stride, (size_t)n_layers * sizeof *stride);
    f->map_off = xcp_round(hlen);
    uint64_t at = f->map_off + xcp_round((uint64_t)n_layers * n_expert);
    for (uint32_t l = 0; l < n_layers; l++) {
        if (!stride[l]) continue;
        f->off[l] = at;
        at += xcp_round(stride[l] * n_expert);
    }
    const uint64_t size = at;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        int e = errno;
        free(head);
        xcp_close(f);
        return rl_errf(err, "--expert-copy %s: cannot create the folder: %s", dir, strerror(e));
    }
    snprintf(f->path, sizeof f->path, "%s/%016" PRIx64 ".xcopy", dir, key);
    /* An existing copy of this layout: its map says which experts are there. */
    int fd = open(f->path, O_RDWR | O_CLOEXEC);
    bool fresh = fd < 0;
    if (fd >= 0) {
        uint8_t *got = malloc(hlen);
        struct stat st;
        bool ok = got && fstat(fd, &st) == 0 && (uint64_t)st.st_size == size && rl_pread_all(fd, got, hlen, 0) == 0 &&
                  memcmp(got, head, hlen) == 0 && rl_pread_all(fd, f->have, (size_t)n_layers * n_expert, f->map_off) == 0;
        free(got);
        for (size_t i = 0; ok && i < (size_t)n_layers * n_expert; i++) {
            ok = f->have[i] <= 1 && (!f->have[i] || stride[i / n_expert]);
            f->n_have += f->have[i];
        }
        if (!ok) { /* another layout, torn or foreign: rebuilt */
            close(fd);
            fd = -1;
            fresh = true;
            memset(f->have, 0, (size_t)n_layers * n_expert);
            f->n_have = 0;
        }
    }
    if (fresh) {
        struct statvfs vs;
        if (statvfs(dir, &vs) == 0 && (uint64_t)vs.f_bavail * vs.f_frsize < size + ((uint64_t)64 << 20)) {
            free(head);
            xcp_close(f);
            return rl_errf(err, "--expert-copy %s: the copy may take %.2f GB and the disk has %.2f GB free", dir,
                           (double)size / 1e9, (double)vs.f_bavail * (double)vs.f_frsize / 1e9);
        }
        fd = open(f->path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        int e = fd < 0 ? errno : 0;
        /* A fresh file: the header and an empty (sparse, zero) map, so a crash from here leaves a copy of nothing. */
        if (fd >= 0 && (ftruncate(fd, (off_t)size) != 0 || (e = rl_pwrite_all(fd, head, hlen, 0)) != 0)) {
            if (!e) e = errno;
            close(fd);
            fd = -1;
        }
        if (fd < 0) { /* (the message first: closing clears f->path) */
            rl_errf(err, "--expert-copy: cannot create %s: %s", f->path, strerror(e));
            free(head);
            xcp_close(f);
            return -1;
        }
    }
    free(head);
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
    f->fd = fd;
    return 0;
}

void xcp_close(xcp_file *f) {
    if (f->fd >= 0) {
        /* The data first, then the map that vouches for them. */
        if (fdatasync(f->fd) == 0 && rl_pwrite_all(f->fd, f->have, (size_t)f->n_layers * f->n_expert, f->map_off) == 0) {
            (void)fdatasync(f->fd);
        }
        close(f->fd);
    }
    free(f->off);
    free(f->stride);
    free(f->have);
    memset(f, 0, sizeof *f);
    f->fd = -1;
}

bool xcp_has(const xcp_file *f, uint32_t l, uint32_t e) {
    return f->fd >= 0 && __atomic_load_n(&f->have[(size_t)l * f->n_expert + e], __ATOMIC_ACQUIRE) != 0;
}

int xcp_read(const xcp_file *f, uint32_t l, uint32_t e, int n, void *const *dst, const size_t *len) {
    uint64_t at = f->off[l] + (uint64_t)e * f->stride[l];
    const uint64_t start = at;
    for (int i = 0; i < n; i++) {
        int rc = rl_pread_all(f->fd, dst[i], len[i], at);
        if (rc) return rc;
        at += len[i];
    }
    /* Advice only: the bytes are in the slot now (the budget counts them there, not in the page cache). */
    (void)posix_fadvise(f->fd, (off_t)start, (off_t)(at - start), POSIX_FADV_DONTNEED);
    return 0;
}

int xcp_write(xcp_file *f, uint32_t l, uint32_t e, int n, const void *const *src, const size_t *len) {
    uint64_t at = f->off[l] + (uint64_t)e * f->stride[l];
    const uint64_t start = at;
    for (int i = 0; i < n; i++) {
        int rc = rl_pwrite_all(f->fd, src[i], len[i], at);
        if (rc) return rc;
        at += len[i];
    }
    /* Written back now and dropped: dirty pages would count against the memory the budget is about. */
    if (sync_file_range(f->fd, (off_t)start, (off_t)(at - start),
                        SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER) != 0) {
        return errno;
    }
    (void)posix_fadvise(f->fd, (off_t)start, (off_t)(at - start), POSIX_FADV_DONTNEED);
    __atomic_store_n(&f->have[(size_t)l * f->n_expert + e], 1, __ATOMIC_RELEASE);
    return 0;
}
