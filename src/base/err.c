#include "err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int rl_errf(rl_err *err, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
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
