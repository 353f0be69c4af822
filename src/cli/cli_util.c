#include <errno.h>
#include <limits.h>
#include <stdlib.h>

#include "cli.h"

int cli_parse_u64(const char *s, unsigned long long *out) {
    if (!s || !*s || *s == '-') return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || *end) return -1;
    *out = v;
    return 0;
}

int cli_parse_int(const char *s, int *out) {
    if (!s || !*s) return -1;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < INT_MIN || v > INT_MAX) return -1;
    *out = (int)v;
    return 0;
}
