/* `ringlm relay`: forward TCP with an added one-way delay and a bandwidth cap (src/tools/relay.c). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tools/relay.h"
#include "cli.h"

static void relay_usage(FILE *f) {
    fprintf(f,
            "usage: ringlm relay --listen HOST:PORT --to HOST:PORT [--delay-ms D] [--rate-mbit R] [--log]\n\n"
            "Accepts TCP connections on --listen and forwards each to --to, delaying every byte by D ms in each\n"
            "direction and capping each direction of each connection at R Mbit/s (0 = unlimited, the default).\n"
            "Emulates an internet link for tests and benchmarks (docs/relay.md). Prints\n"
            "\"relay: listening on ADDR -> TO, ...\" on stderr when ready (port 0 picks a free port, shown in\n"
            "ADDR). SIGINT or SIGTERM stops it (exit 0).\n"
            "  --delay-ms D    one-way delay, fractions allowed (default 0)\n"
            "  --rate-mbit R   cap in 10^6 bit/s per connection and direction (default 0: unlimited)\n"
            "  --log           one stderr line per connection opened and closed\n");
}

/* A finite, non-negative decimal number. */
static int parse_nonneg(const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno || !isfinite(v) || v < 0) return -1;
    *out = v;
    return 0;
}

int cmd_relay(int argc, char **argv) {
    relay_opts o = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            relay_usage(stdout);
            return 0;
        } else if (strcmp(a, "--listen") == 0 && v) {
            o.listen = v, i++;
        } else if (strcmp(a, "--to") == 0 && v) {
            o.to = v, i++;
        } else if (strcmp(a, "--delay-ms") == 0 && v) {
            if (parse_nonneg(v, &o.delay_ms) != 0) {
                fprintf(stderr, "ringlm relay: bad --delay-ms '%s' (a number >= 0)\n", v);
                return 2;
            }
            i++;
        } else if (strcmp(a, "--rate-mbit") == 0 && v) {
            if (parse_nonneg(v, &o.rate_mbit) != 0) {
                fprintf(stderr, "ringlm relay: bad --rate-mbit '%s' (a number >= 0)\n", v);
                return 2;
            }
            i++;
        } else if (strcmp(a, "--log") == 0) {
            o.log = true;
        } else {
            fprintf(stderr, "ringlm relay: unknown or incomplete option '%s'\n", a);
            relay_usage(stderr);
            return 2;
        }
    }
    if (!o.listen || !o.to) {
        fprintf(stderr, "ringlm relay: --listen and --to are required\n");
        relay_usage(stderr);
        return 2;
    }
    rl_err err = {{0}};
    if (relay_run(&o, &err) != 0) {
        fprintf(stderr, "ringlm relay: %s\n", err.msg);
        return 1;
    }
    return 0;
}
