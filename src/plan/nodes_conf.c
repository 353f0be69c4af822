/* nodes_conf.c - the device catalog and the nodes.conf parser (nodes_conf.h). */
#include "nodes_conf.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Vendor figures, rounded: memory per device, memory bandwidth, dense f16 tensor throughput. They are what
 * a plan assumes unless a line overrides them; every one is a spec sheet's, not a measurement. */
static const nodes_conf_device catalog[] = {
    {"rtx5090", "NVIDIA GeForce RTX 5090", 32, 1792, 105, 1},
    {"rtx4090", "NVIDIA GeForce RTX 4090", 24, 1008, 83, 1},
    {"rtx3090", "NVIDIA GeForce RTX 3090", 24, 936, 71, 1},
    {"rtxpro6000", "NVIDIA RTX PRO 6000 Blackwell", 96, 1792, 126, 1},
    {"h100", "NVIDIA H100 SXM", 80, 3350, 989, 1},
    {"h200", "NVIDIA H200 SXM", 141, 4800, 989, 1},
    {"gb10", "NVIDIA GB10 (DGX Spark class), unified memory", 128, 273, 62, 1},
    {"m3ultra", "Apple M3 Ultra, unified memory", 512, 819, 28, 1},
    {"cpu-ddr5", "a desktop CPU, 2-channel DDR5", 64, 80, 1.5, 4},
    {"epyc-ddr5", "a 12-channel DDR5 server CPU", 768, 460, 5, 4},
    {NULL, NULL, 0, 0, 0, 0},
};

const nodes_conf_device *nodes_conf_catalog(void) { return catalog; }

const nodes_conf_device *nodes_conf_find_device(const char *name) {
    for (const nodes_conf_device *d = catalog; d->name; d++) {
        if (strcmp(d->name, name) == 0) return d;
    }
    return NULL;
}

void nodes_conf_print_catalog(FILE *f) {
    fprintf(f, "%-12s %8s %10s %8s %9s  %s\n", "device", "mem GB", "bw GB/s", "TFLOPS", "col_reads", "what");
    for (const nodes_conf_device *d = catalog; d->name; d++) {
        fprintf(f, "%-12s %8.0f %10.0f %8.1f %9.0f  %s\n", d->name, d->mem_gb, d->bw_gbs, d->tflops, d->col_reads, d->what);
    }
}

static int nodes_conf_place(nodes_conf_file *c, const char *name) {
    for (int i = 0; i < c->n_places; i++) {
        if (strcmp(c->places[i], name) == 0) return i;
    }
    if (c->n_places == NODES_CONF_MAX_PLACES) return -1;
    snprintf(c->places[c->n_places], sizeof c->places[0], "%s", name);
    for (int i = 0; i <= c->n_places; i++) c->delay_ms[i][c->n_places] = c->delay_ms[c->n_places][i] = -1;
    c->delay_ms[c->n_places][c->n_places] = 0.1; /* one place: one switch */
    return c->n_places++;
}

static int nodes_conf_num(const char *v, double *out) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end || !isfinite(x) || x < 0) return -1;
    *out = x;
    return 0;
}

/* What a place name means: a node's name (its place) or a place itself. */
static int nodes_conf_resolve(nodes_conf_file *c, const char *name) {
    for (int i = 0; i < c->n; i++) {
        if (strcmp(c->nodes[i].name, name) == 0) return c->nodes[i].place;
    }
    return nodes_conf_place(c, name);
}

/* A node's (or the coordinator's) KEY=VALUE figures from tok[from..nt), into nd; *loc, *at and *host (may be
 * NULL: the key is then refused) take loc=, at= and host=. The device's catalog figures fill what the line
 * leaves out. */
static int nodes_conf_figures(nodes_conf_node *nd, char **tok, int from, int nt, const char **loc, const char **at, const char **host,
                      bool need_device, const char *path, int ln, rl_err *err) {
    nd->line = ln;
    nd->threads = 1;
    nd->count = 1;
    nd->eff = 0.5;
    nd->net_mbit = 1000;
    double mem = -1, bw = -1, tf = -1, count = 1, cr = -1;
    for (int k = from; k < nt; k++) {
        char *eq = strchr(tok[k], '=');
        if (!eq) return rl_errf(err, "%s:%d: '%s' is not KEY=VALUE", path, ln, tok[k]);
        *eq = 0;
        const char *key = tok[k], *v = eq + 1;
        double x = 0;
        bool num = nodes_conf_num(v, &x) == 0;
        if (strcmp(key, "device") == 0) snprintf(nd->device, sizeof nd->device, "%s", v);
        else if (strcmp(key, "loc") == 0 && loc) *loc = v;
        else if (strcmp(key, "at") == 0 && at) *at = v;
        else if (strcmp(key, "host") == 0 && host && v[0]) *host = v;
        else if (strcmp(key, "threads") == 0 && host && num && x >= 1 && x <= 4096 && x == floor(x)) nd->threads = (int)x;
        else if (strcmp(key, "mem") == 0 && num && x > 0) mem = x;
        else if (strcmp(key, "bw") == 0 && num && x > 0) bw = x;
        else if (strcmp(key, "tflops") == 0 && num && x > 0) tf = x;
        else if (strcmp(key, "col_reads") == 0 && num && x >= 1 && x <= 64) cr = x;
        else if (strcmp(key, "count") == 0 && num && x >= 1 && x <= 64 && x == floor(x)) count = x;
        else if (strcmp(key, "eff") == 0 && num && x > 0 && x <= 1) nd->eff = x;
        else if (strcmp(key, "net") == 0 && num && x > 0) nd->net_mbit = x;
        else if (strcmp(key, "disk") == 0 && num && x > 0) nd->disk_gbs = x;
        else if (strcmp(key, "ram") == 0 && num && x > 0) nd->ram_gb = x;
        else if (strcmp(key, "ram_bw") == 0 && num && x > 0) nd->ram_bw_gbs = x;
        else if (strcmp(key, "ram_tflops") == 0 && num && x > 0) nd->ram_tflops = x;
        else {
            return rl_errf(err, "%s:%d: bad %s=%s (keys: device, count, mem, bw, tflops, col_reads 1..64, eff 0..1, net, disk, "
                                "ram, ram_bw, ram_tflops, %s)", path, ln, key, v, at ? "at, loc" : "loc, host, threads 1..4096");
        }
    }
    if (!nd->device[0]) {
        if (!need_device) return 0;
        return rl_errf(err, "%s:%d: node %s has no device= (a catalog name, or custom with mem= and bw=)", path, ln, nd->name);
    }
    const nodes_conf_device *d = strcmp(nd->device, "custom") == 0 ? NULL : nodes_conf_find_device(nd->device);
    if (!d && strcmp(nd->device, "custom") != 0) {
        return rl_errf(err, "%s:%d: unknown device '%s' (ringlm plan --devices lists them; or device=custom mem= bw=)", path, ln, nd->device);
    }
    if (!d && (mem < 0 || bw < 0)) return rl_errf(err, "%s:%d: device=custom needs mem= and bw=", path, ln);
    nd->count = (int)count;
    nd->mem_gb = mem > 0 ? mem : d->mem_gb * count;
    nd->bw_gbs = bw > 0 ? bw : d->bw_gbs * count;
    nd->tflops = tf > 0 ? tf : d ? d->tflops * count : 1.0;
    nd->col_reads = cr > 0 ? cr : d ? d->col_reads : 1.0;
    if ((nd->ram_bw_gbs > 0 || nd->ram_tflops > 0) && !(nd->ram_gb > 0)) {
        return rl_errf(err, "%s:%d: ram_bw= and ram_tflops= describe the RAM that ram=GB offers: add ram=", path, ln);
    }
    if (nd->ram_gb > 0) { /* defaults: a desktop's two channels of DDR5 (the catalog's cpu-ddr5) */
        const nodes_conf_device *cpu = nodes_conf_find_device("cpu-ddr5");
        if (!(nd->ram_bw_gbs > 0)) nd->ram_bw_gbs = cpu->bw_gbs;
        if (!(nd->ram_tflops > 0)) nd->ram_tflops = cpu->tflops;
    }
    return 0;
}

int nodes_conf_load(nodes_conf_file *c, const char *path, rl_err *err) {
    memset(c, 0, sizeof *c);
    c->coord_place = -1;
    FILE *f = fopen(path, "r");
    if (!f) return rl_errf(err, "cannot open %s: %s", path, strerror(errno));
    char line[1024];
    int ln = 0, rc = 0;
    struct { char a[64], b[64]; double ms; int line; } delays[512];
    int n_delays = 0;
    char coord_at[64] = "", coord_loc[64] = "";
    char node_host[PLAN_MAX_NODES][64]; /* each node's host=, resolved once every 'host' line is read */
    int host_line[PLAN_MAX_NODES] = {0};
    int coord_line = 0;
    while (rc == 0 && fgets(line, sizeof line, f)) {
        ln++;
        char *hash = strchr(line, '#');
        if (hash) *hash = 0;
        char *tok[24];
        int nt = 0;
        for (char *s = strtok(line, " \t\r\n"); s && nt < 24; s = strtok(NULL, " \t\r\n")) tok[nt++] = s;
        if (nt == 0) continue;
        if (strcmp(tok[0], "node") == 0) {
            if (nt < 2 || strchr(tok[1], '=')) {
                rc = rl_errf(err, "%s:%d: 'node' needs a name first", path, ln);
                break;
            }
            if (c->n == PLAN_MAX_NODES) {
                rc = rl_errf(err, "%s:%d: more than %d nodes", path, ln, PLAN_MAX_NODES);
                break;
            }
            for (int i = 0; i < c->n; i++) {
                if (strcmp(c->nodes[i].name, tok[1]) == 0) rc = rl_errf(err, "%s:%d: node %s named twice (line %d)", path, ln, tok[1], c->nodes[i].line);
            }
            if (rc) break;
            nodes_conf_node *nd = &c->nodes[c->n];
            memset(nd, 0, sizeof *nd);
            snprintf(nd->name, sizeof nd->name, "%s", tok[1]);
            const char *loc = NULL, *host = NULL;
            if ((rc = nodes_conf_figures(nd, tok, 2, nt, &loc, NULL, &host, true, path, ln, err)) != 0) break;
            snprintf(node_host[c->n], sizeof node_host[0], "%s", host ? host : "");
            nd->place = nodes_conf_place(c, loc ? loc : nd->name);
            if (nd->place < 0) {
                rc = rl_errf(err, "%s:%d: too many places", path, ln);
                break;
            }
            c->n++;
        } else if (strcmp(tok[0], "delay") == 0) {
            double ms;
            if (nt != 4 || nodes_conf_num(tok[3], &ms) != 0) {
                rc = rl_errf(err, "%s:%d: 'delay A B MS' (A, B: nodes or places; MS: one-way milliseconds)", path, ln);
                break;
            }
            if (n_delays == 512) {
                rc = rl_errf(err, "%s:%d: more than 512 delays", path, ln);
                break;
            }
            snprintf(delays[n_delays].a, 64, "%s", tok[1]);
            snprintf(delays[n_delays].b, 64, "%s", tok[2]);
            delays[n_delays].ms = ms;
            delays[n_delays++].line = ln;
        } else if (strcmp(tok[0], "coordinator") == 0) {
            const char *at = NULL, *loc = NULL;
            memset(&c->coord, 0, sizeof c->coord);
            snprintf(c->coord.name, sizeof c->coord.name, "coordinator");
            if ((rc = nodes_conf_figures(&c->coord, tok, 1, nt, &loc, &at, NULL, false, path, ln, err)) != 0) break;
            if (!at == !loc) {
                rc = rl_errf(err, "%s:%d: 'coordinator at=NODE' or 'coordinator loc=PLACE' (then optionally device= and "
                             "its figures, for the draft)", path, ln);
                break;
            }
            snprintf(coord_at, sizeof coord_at, "%s", at ? at : "");
            snprintf(coord_loc, sizeof coord_loc, "%s", loc ? loc : "");
            coord_line = ln;
        } else if (strcmp(tok[0], "host") == 0) {
            double cores = 0;
            if (nt != 3 || strncmp(tok[2], "cores=", 6) != 0 || nodes_conf_num(tok[2] + 6, &cores) != 0 || cores < 1 ||
                cores > 65536 || cores != floor(cores)) {
                rc = rl_errf(err, "%s:%d: 'host MACHINE cores=N' (N: the machine's cores, a whole number)", path, ln);
                break;
            }
            int k = 0;
            while (k < c->n_hosts && strcmp(c->hosts[k], tok[1]) != 0) k++;
            if (k < c->n_hosts) {
                rc = rl_errf(err, "%s:%d: host %s described twice (line %d)", path, ln, tok[1], host_line[k]);
                break;
            }
            if (k == PLAN_MAX_NODES) {
                rc = rl_errf(err, "%s:%d: more than %d hosts", path, ln, PLAN_MAX_NODES);
                break;
            }
            snprintf(c->hosts[k], sizeof c->hosts[0], "%s", tok[1]);
            c->host_cores[k] = (int)cores;
            host_line[k] = ln;
            c->n_hosts++;
        } else {
            rc = rl_errf(err, "%s:%d: unknown statement '%s' (node, delay, coordinator, host)", path, ln, tok[0]);
        }
    }
    fclose(f);
    if (rc) return -1;
    if (c->n == 0) return rl_errf(err, "%s: no nodes", path);
    for (int i = 0; i < c->n; i++) { /* host= names a 'host' line, before or after the node's */
        if (!node_host[i][0]) continue;
        int k = 0;
        while (k < c->n_hosts && strcmp(c->hosts[k], node_host[i]) != 0) k++;
        if (k == c->n_hosts) {
            return rl_errf(err, "%s:%d: node %s: host=%s, but no 'host %s cores=N' line says how many cores it has", path,
                           c->nodes[i].line, c->nodes[i].name, node_host[i], node_host[i]);
        }
        c->nodes[i].host = k + 1;
    }
    /* Places named only by delays are places too; delays apply once every node's place is known. */
    for (int i = 0; i < n_delays; i++) {
        int a = nodes_conf_resolve(c, delays[i].a), b = nodes_conf_resolve(c, delays[i].b);
        if (a < 0 || b < 0) return rl_errf(err, "%s:%d: too many places", path, delays[i].line);
        c->delay_ms[a][b] = c->delay_ms[b][a] = delays[i].ms;
    }
    /* The coordinator's machine (for pricing a draft): its own figures, else the node it runs at, else the
     * first node's. */
    int at_node = 0;
    if (coord_at[0]) {
        at_node = -1;
        for (int i = 0; i < c->n; i++) at_node = strcmp(c->nodes[i].name, coord_at) == 0 ? i : at_node;
        if (at_node < 0) return rl_errf(err, "%s:%d: coordinator at=%s: no such node", path, coord_line, coord_at);
        c->coord_place = c->nodes[at_node].place;
    } else if (coord_loc[0]) {
        c->coord_place = nodes_conf_resolve(c, coord_loc);
        if (c->coord_place < 0) return rl_errf(err, "%s:%d: too many places", path, coord_line);
    } else {
        c->coord_place = c->nodes[0].place;
    }
    if (!c->coord.device[0]) {
        c->coord = c->nodes[at_node];
        c->coord_figures_from = at_node;
    } else {
        c->coord_figures_from = -1;
    }
    return 0;
}

int nodes_conf_host_slots(const nodes_conf_file *c, int k) {
    if (k < 1 || k > c->n_hosts) return 1;
    int threads = 1;
    for (int i = 0; i < c->n; i++) {
        if (c->nodes[i].host == k && c->nodes[i].threads > threads) threads = c->nodes[i].threads;
    }
    const int slots = c->host_cores[k - 1] / threads;
    return slots < 1 ? 1 : slots;
}

double nodes_conf_delay_s(const nodes_conf_file *c, int a, int b) {
    int pa = a < 0 ? c->coord_place : c->nodes[a].place, pb = b < 0 ? c->coord_place : c->nodes[b].place;
    double ms = c->delay_ms[pa][pb];
    return ms < 0 ? -1 : ms * 1e-3;
}

int nodes_conf_check_delays(const nodes_conf_file *c, rl_err *err) {
    for (int a = -1; a < c->n; a++) {
        for (int b = a + 1; b < c->n; b++) {
            if (nodes_conf_delay_s(c, a, b) < 0) {
                return rl_errf(err, "nodes.conf gives no delay between %s and %s (add 'delay %s %s MS', of the nodes or of "
                               "their places)", a < 0 ? "the coordinator" : c->nodes[a].name, c->nodes[b].name,
                               a < 0 ? c->places[c->coord_place] : c->places[c->nodes[a].place], c->places[c->nodes[b].place]);
            }
        }
    }
    return 0;
}
