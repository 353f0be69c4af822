#include "err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int rl_errf(rl_err *err, const char *fmt, ...) {
    if (err) {
        /* Through a copy: callers add context with rl_errf(err, "...: %s", err->msg), and vsnprintf must
         * not write the buffer it is reading. */
        char buf[sizeof err->msg];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(buf, sizeof buf, fmt, ap);
        va_end(ap);
        memcpy(err->msg, buf, sizeof buf);
    }
    return -1;
}

int rl_err_prefix(rl_err *err, const char *fmt, ...) {
    if (err) {
        char prefix[sizeof err->msg];
        char old[sizeof err->msg];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(prefix, sizeof prefix, fmt, ap);
        va_end(ap);
        memcpy(old, err->msg, sizeof old);
        snprintf(err->msg, sizeof err->msg, "%s: %s", prefix, old);
    }
    return -1;
}
