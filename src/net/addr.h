/* addr.h - "HOST:PORT" as every address in ringlm is written (ring.conf, --listen, --relay, relays' --to). */
#ifndef RINGLM_NET_ADDR_H
#define RINGLM_NET_ADDR_H

#include <stddef.h>

#include "../base/err.h"

/* Splits "HOST:PORT", "[V6]:PORT" (the brackets dropped) or ":PORT" (host empty: every address) into host
 * and a numeric port (0-65535). A missing or non-numeric port, an unclosed bracket or a host longer than
 * host_cap - 1 is refused with err naming the address. */
int net_addr_split(const char *s, char *host, size_t host_cap, char *port, size_t port_cap, rl_err *err);

#endif
