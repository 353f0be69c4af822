/* file.h - a whole file read into memory (configs, calibration text, scores files, request bodies). */
#ifndef RINGLM_FILE_H
#define RINGLM_FILE_H

#include <stddef.h>

#include "err.h"

/* Reads path into *out (malloc'ed, NUL-terminated past *len bytes). `what` names the file in errors
 * ("cannot open calibration file PATH: ..."); NULL: just the path. */
int rl_read_file(const char *path, const char *what, char **out, size_t *len, rl_err *err);

#endif
