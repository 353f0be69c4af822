/* Folder src/base/: the error type, whole-file reading, the growable buffer and the monotonic clock, shared by
 * every layer. May include: nothing (the bottom layer). (README "Layout"; tests/t_layout.sh checks both.)
 */
/* err.h - one error type for the whole tree: a message that names the problem.
 *
 * Functions that can fail take `rl_err *err` last and return 0 on success, -1 on failure with err->msg
 * set. err may be NULL when the caller does not care about the message. */
#ifndef RINGLM_ERR_H
#define RINGLM_ERR_H

#include <stddef.h>

typedef struct rl_err {
    char msg[1024];
} rl_err;

/* Formats the message into err (if not NULL) and returns -1, so `return rl_errf(err, ...)` reads well. The
 * arguments may include err->msg itself. */
int rl_errf(rl_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prepends "prefix: " to an existing message (for adding context on the way up). Returns -1. */
int rl_err_prefix(rl_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
