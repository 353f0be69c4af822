/* ring_conf.c - ring.conf: the nodes of a ring, one per line (coord.h). */
#include "coord.h"
#include "../net/addr.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ring_conf_load(ring_conf *c, const char *path, rl_err *err) {
    memset(c, 0, sizeof *c);
    FILE *f = fopen(path, "r");
    if (!f) return rl_errf(err, "cannot open ring config %s: %s", path, strerror(errno));
    char line[1024];
    int lineno = 0, rc = 0;
    while (rc == 0 && fgets(line, sizeof line, f)) {
        lineno++;
        char *hash = strchr(line, '#');
        if (hash) *hash = 0;
        char addr[256], key[256], extra[2][256], more[8];
        int k = sscanf(line, "%255s %255s %255s %255s %7s", addr, key, extra[0], extra[1], more);
        if (k <= 0) continue;
        if (k < 2 || k > 4) {
            rc = rl_errf(err, "%s:%d: expected \"HOST:PORT PUBLIC_KEY_HEX [mem=GB] [standby]\" (relay:HOST:PORT for a node that dials out)", path, lineno);
            break;
        }
        if (c->n == PLAN_MAX_NODES) {
            rc = rl_errf(err, "%s: more than %d nodes", path, PLAN_MAX_NODES);
            break;
        }
        ring_node_conf *nc = &c->nodes[c->n];
        if (strlen(addr) >= sizeof nc->addr || !strchr(addr, ':')) {
            rc = rl_errf(err, "%s:%d: bad address '%s' (HOST:PORT)", path, lineno, addr);
            break;
        }
        snprintf(nc->addr, sizeof nc->addr, "%s", addr);
        if (keys_peer_parse(&nc->key, key, err) != 0) {
            rc = rl_err_prefix(err, "%s:%d", path, lineno);
            break;
        }
        char relay[128];
        if (strncmp(addr, "relay:", 6) == 0) { /* one relay serves many nodes: the key's start tells them apart */
            if (!tn_addr_relay(addr, relay, sizeof relay) || strchr(addr, '/') || strlen(addr) + 10 > sizeof nc->addr) {
                rc = rl_errf(err, "%s:%d: bad relay address '%s' (relay:HOST:PORT)", path, lineno, addr);
                break;
            }
            char tag[9];
            memcpy(tag, nc->key.pk_hex, 8), tag[8] = 0;
            snprintf(nc->addr, sizeof nc->addr, "relay:%s/%s", relay, tag);
        }
        for (int x = 0; x + 2 < k && rc == 0; x++) {
            char *end;
            if (strcmp(extra[x], "standby") == 0) nc->standby = true;
            else if (strncmp(extra[x], "mem=", 4) != 0 || (nc->mem_gb = strtod(extra[x] + 4, &end)) <= 0 || *end)
                rc = rl_errf(err, "%s:%d: unknown option '%s' (mem=GB or standby)", path, lineno, extra[x]);
        }
        if (rc != 0) break;
        for (int j = 0; j < c->n; j++) {
            if (strcmp(c->nodes[j].addr, nc->addr) == 0) rc = rl_errf(err, "%s:%d: %s is listed twice", path, lineno, addr);
        }
        c->n++;
    }
    fclose(f);
    if (rc == 0 && c->n == 0) rc = rl_errf(err, "%s lists no nodes", path);
    return rc;
}

bool ring_names(const char *msg, const char *addr) {
    size_t n = strlen(addr);
    for (const char *p = strstr(msg, addr); p; p = strstr(p + 1, addr)) {
        bool left = p == msg || !(isalnum((unsigned char)p[-1]) || p[-1] == '.' || p[-1] == ':');
        if (left && !isalnum((unsigned char)p[n])) return true;
    }
    return false;
}

/* HOST:PORT into host and port (net_addr_split); an address without a port is all host, the port "". */
static void ring_host_port(const char *hp, char *host, size_t hn, char *port, size_t pn) {
    rl_err e;
    if (net_addr_split(hp, host, hn, port, pn, &e) != 0) {
        snprintf(host, hn, "%s", hp);
        port[0] = 0;
    }
}

ring_reach_kind ring_reach(const ring_conf *conf, int i, const char *own_relay, char *via, size_t via_n, int *by) {
    char relay[128], h[128], oh[128];
    *by = -1;
    via[0] = 0;
    if (!tn_addr_relay(conf->nodes[i].addr, relay, sizeof relay)) return RING_REACH_DIRECT;
    snprintf(via, via_n, "%s", relay);
    char p[16], op[16];
    ring_host_port(relay, h, sizeof h, p, sizeof p);
    if (own_relay) { /* ours if the port is ours and the host is ours (or we listen on every address) */
        ring_host_port(own_relay, oh, sizeof oh, op, sizeof op);
        bool any = !oh[0] || strcmp(oh, "0.0.0.0") == 0 || strcmp(oh, "::") == 0 || strcmp(oh, "*") == 0;
        if (strcmp(p, op) == 0 && (any || strcmp(h, oh) == 0)) return RING_REACH_DIALOUT;
    }
    for (int j = 0; j < conf->n; j++) {
        char nh[128], np[16];
        if (j == i || strncmp(conf->nodes[j].addr, "relay:", 6) == 0) continue;
        ring_host_port(conf->nodes[j].addr, nh, sizeof nh, np, sizeof np);
        if (strcmp(nh, h) == 0) *by = j;
    }
    return RING_REACH_RELAYED;
}

const char *ring_reach_name(ring_reach_kind k) {
    return k == RING_REACH_DIRECT ? "direct" : k == RING_REACH_DIALOUT ? "dial-out" : "relayed";
}

void ring_dial_addr(const ring_conf *conf, int i, const char *own_relay, char *out, size_t n) {
    char via[128], h[128], p[16];
    int by;
    const char *addr = conf->nodes[i].addr, *tag = strchr(addr, '/');
    snprintf(out, n, "%s", addr);
    if (ring_reach(conf, i, own_relay, via, sizeof via, &by) != RING_REACH_DIALOUT || !tag) return;
    ring_host_port(own_relay, h, sizeof h, p, sizeof p);
    const char *host = !h[0] || strcmp(h, "0.0.0.0") == 0 || strcmp(h, "*") == 0 ? "127.0.0.1"
                       : strcmp(h, "::") == 0                                     ? "[::1]"
                       : strchr(h, ':')                                           ? NULL
                                                                                  : h;
    if (host) snprintf(out, n, "relay:%s:%s%s", host, p, tag);
    else snprintf(out, n, "relay:[%s]:%s%s", h, p, tag);
}
