/* file.h - a whole file read into memory (configs, calibration text, scores files, request bodies), whole
 * reads and writes at an offset, and folders made with their parents. */
#ifndef RINGLM_FILE_H
#define RINGLM_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

/* Reads path into *out (malloc'ed, NUL-terminated past *len bytes). `what` names the file in errors
 * ("cannot open calibration file PATH: ..."); NULL: just the path. */
int rl_read_file(const char *path, const char *what, char **out, size_t *len, rl_err *err);

/* Reads / writes all n bytes at offset off, retrying short transfers and EINTR: 0, or an errno (EIO for a
 * file that ends early). */
int rl_pread_all(int fd, void *dst, size_t n, uint64_t off);
int rl_pwrite_all(int fd, const void *src, size_t n, uint64_t off);

/* mkdir -p: path and every missing folder above it (mode 0700: caches of model data are the user's). 0, or
 * -1 with errno set (ENAMETOOLONG for a path past PATH_MAX). */
int rl_mkdirs(const char *path);

#endif
