/* ring_conf.c - ring.conf: the nodes of a ring, one per line (coord.h). */
#include "coord.h"

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
            rc = rl_errf(err, "%s:%d: expected \"HOST:PORT PUBLIC_KEY_HEX [mem=GB] [standby]\"", path, lineno);
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
