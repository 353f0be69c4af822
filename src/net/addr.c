#include "addr.h"

#include <stdlib.h>
#include <string.h>

int net_addr_split(const char *s, char *host, size_t host_cap, char *port, size_t port_cap, rl_err *err) {
    const char *h = s, *he, *p;
    if (s[0] == '[') {
        h = s + 1;
        he = strchr(h, ']');
        if (!he || he[1] != ':') return rl_errf(err, "bad address '%s': want [HOST]:PORT", s);
        p = he + 2;
    } else {
        he = strrchr(s, ':'); /* the last colon: "::1:80" is host ::1, port 80 */
        if (!he) return rl_errf(err, "bad address '%s': want HOST:PORT", s);
        p = he + 1;
    }
    size_t hl = (size_t)(he - h), pl = strlen(p);
    if (hl >= host_cap) return rl_errf(err, "bad address '%s': host name too long", s);
    char *end = (char *)p;
    long v = pl && pl < 6 ? strtol(p, &end, 10) : -1;
    if (v < 0 || v > 65535 || *end || p[0] < '0' || p[0] > '9' || pl >= port_cap) {
        return rl_errf(err, "bad address '%s': the port must be a number 0-65535", s);
    }
    memcpy(host, h, hl);
    host[hl] = 0;
    memcpy(port, p, pl + 1);
    return 0;
}
