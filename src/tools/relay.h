/* relay.h - a TCP relay that adds a one-way delay and a bandwidth cap, to emulate internet links in tests
 * and benchmarks (this kernel has no netem).
 *
 * It is a plain byte-stream proxy: every connection accepted on `listen` is forwarded to `to`, and each
 * direction delays every byte by `delay_ms` and is capped at `rate_mbit` (per connection and direction:
 * bytes leave at most at that rate, as they would over a link of that speed). Byte order, half-close
 * (shutdown) and resets are carried through; nothing is assumed about what the bytes mean, so it works for
 * ZeroMQ, llama.cpp's RPC protocol or anything else over TCP.
 * One process, one epoll loop over all connections; see docs/relay.md. */
#ifndef RINGLM_RELAY_H
#define RINGLM_RELAY_H

#include <stdbool.h>
#include <stddef.h>

#include "../base/err.h"

typedef struct relay_opts {
    const char *listen; /* "HOST:PORT", "[V6]:PORT", ":PORT" (wildcard address); port 0 picks a free one */
    const char *to;     /* "HOST:PORT", resolved once at start; each address is tried in turn */
    double delay_ms;    /* one-way delay added in each direction, >= 0 */
    double rate_mbit;   /* cap per connection and direction in Mbit/s (10^6 bits); 0 = unlimited */
    bool log;           /* one stderr line per connection opened and closed */
} relay_opts;

/* Runs until SIGINT or SIGTERM (read through a signalfd; both are blocked while it runs) and returns 0 then.
 * Prints "relay: listening on ADDR -> TO, delay D ms, rate R Mbit/s" on stderr once it accepts connections
 * (ADDR has the real port when the given one is 0). Returns -1 with err set when it cannot start (bad
 * address, port in use) or the event loop itself fails; a failing connection only closes that connection. */
int relay_run(const relay_opts *o, rl_err *err);

#endif
