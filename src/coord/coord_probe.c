/* coord_probe.c - the coordinator measures its ring's delays and orders the ring by them (coord_int.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>

#include "../gen/emit.h"
#include "../base/clock.h"
#include "../wire/frame.h"
#include "coord_int.h"
#include "../net/probe.h"
#include "../plan/ring_order.h"

/* A node is asked to time every other node of a plan (node.c keeps that many probers). */
_Static_assert(PB_MAX_PEERS == PLAN_MAX_NODES, "a prober's peers: the nodes of a plan");

/* A peer that never answered: so far that no order uses its link while another exists. */
#define CP_UNREACHABLE_S 1e3

static int cp_send_json(ring_coord *rc, int node, int type, cJSON *j, rl_err *err) {
    char *js = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    if (!js) return rl_errf(err, "out of memory");
    int r = ring_send(rc, node, type, 0, NULL, js, strlen(js), NULL, 0, err);
    free(js);
    return r;
}

int ring_ping(ring_coord *rc, int node, uint64_t step, rl_err *err) {
    if (ring_send(rc, node, FRAME_PING, step, NULL, NULL, 0, NULL, 0, err) != 0) return -1;
    for (;;) {
        zs_parts p;
        frame_header h;
        int from;
        if (ring_wait(rc, FRAME_PONG, node, 10, NULL, &from, &p, &h, err) != 0) return -1;
        zs_parts_free(&p);
        if (h.step_id == step) return 0;
    }
}

int ring_coord_rtts(ring_coord *rc, const bool *use, rl_err *err) {
    const ring_conf *conf = &rc->conf;
    /* The coordinator's own round trips, PB_ROUNDS PINGs each (step ids of their own: a late PONG of an
     * earlier round is not taken for this one's). */
    for (int i = 0; i < conf->n; i++) {
        if (!use[i]) continue;
        double best = -1;
        for (int r = 0; r < PB_ROUNDS; r++) {
            uint64_t step = 0x70726f6265000000ull + (uint64_t)r; /* "probe" */
            double t0 = rl_clock_now();
            if (ring_ping(rc, i, step, err) != 0) return -1;
            double rtt = rl_clock_now() - t0;
            if (best < 0 || rtt < best) best = rtt;
        }
        rc->coord_delay_s[i] = best / 2;
    }
    return 0;
}

int ring_probe(ring_coord *rc, const bool *use, rl_err *err) {
    const ring_conf *conf = &rc->conf;
    zs_parts p;
    frame_header h;
    int from;
    /* Who may probe whom: every node, the others. */
    for (int i = 0; i < conf->n; i++) {
        if (!use[i]) continue;
        cJSON *j = cJSON_CreateObject();
        cJSON *a = j ? cJSON_AddArrayToObject(j, "peers") : NULL;
        for (int k = 0; a && k < conf->n; k++) {
            if (use[k] && k != i) cJSON_AddItemToArray(a, cJSON_CreateString(conf->nodes[k].key.pk_hex));
        }
        if (cp_send_json(rc, i, FRAME_PEERS, j, err) != 0 || ring_wait(rc, FRAME_PEERS_OK, i, 10, NULL, &from, &p, &h, err) != 0) {
            return -1;
        }
        zs_parts_free(&p);
    }
    if (ring_coord_rtts(rc, use, err) != 0) return -1;
    /* Each node's round trips to the others, one node at a time (the pinged ones must be free to answer). */
    for (int i = 0; i < conf->n; i++) {
        if (!use[i]) continue;
        cJSON *j = cJSON_CreateObject();
        cJSON *a = j ? cJSON_AddArrayToObject(j, "peers") : NULL;
        int peer[PLAN_MAX_NODES], np = 0;
        for (int k = 0; a && k < conf->n; k++) {
            if (!use[k] || k == i) continue;
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "addr", conf->nodes[k].addr);
            cJSON_AddStringToObject(o, "key", conf->nodes[k].key.pk_hex);
            cJSON_AddItemToArray(a, o);
            peer[np++] = k;
        }
        if (cp_send_json(rc, i, FRAME_PROBE, j, err) != 0 || ring_wait(rc, FRAME_PROBE_RESULT, i, 30, NULL, &from, &p, &h, err) != 0) {
            return -1;
        }
        cJSON *res = cJSON_ParseWithLength(p.data[1], p.len[1]);
        const cJSON *rt = res ? cJSON_GetObjectItemCaseSensitive(res, "rtt_s") : NULL;
        int ok = cJSON_IsArray(rt) && cJSON_GetArraySize(rt) == np;
        for (int q = 0; ok && q < np; q++) {
            const cJSON *v = cJSON_GetArrayItem(rt, q);
            if (!cJSON_IsNumber(v)) {
                ok = 0;
                break;
            }
            rc->delay_s[i][peer[q]] = v->valuedouble >= 0 ? v->valuedouble / 2 : CP_UNREACHABLE_S;
        }
        cJSON_Delete(res);
        zs_parts_free(&p);
        if (!ok) return rl_errf(err, "node %s sent a malformed PROBE_RESULT", conf->nodes[i].addr);
    }
    rc->have_delays = true;
    return 0;
}

typedef struct cp_view {
    const ring_coord *rc;
    const int *idx; /* order-solver index -> ring.conf index */
} cp_view;

static double cp_delay(const void *user, int a, int b) {
    const cp_view *v = user;
    if (a < 0) return v->rc->coord_delay_s[v->idx[b]];
    if (b < 0) return v->rc->coord_delay_s[v->idx[a]];
    return v->rc->delay_s[v->idx[a]][v->idx[b]];
}

int ring_order_measured(const ring_coord *rc, const bool *use, int *order, int *n, double *cycle_s,
                        double *conf_cycle_s, rl_err *err) {
    int idx[PLAN_MAX_NODES], m = 0, ord[PLAN_MAX_NODES], ident[PLAN_MAX_NODES];
    for (int i = 0; i < rc->conf.n; i++) {
        if (use[i]) idx[m] = i, ident[m] = m, m++;
    }
    *n = m;
    if (m == 0) return rl_errf(err, "no nodes to order");
    cp_view v = {rc, idx};
    bool exact;
    if (order_best_order(m, cp_delay, &v, ord, cycle_s, &exact, err) != 0) return -1;
    *conf_cycle_s = order_cycle(m, cp_delay, &v, ident);
    /* Nearly equal orders keep ring.conf's: a measurement's noise (a fraction of a millisecond on a LAN) must
     * not shuffle a ring, nor move a node from one stage to another between runs. Moving pays when it saves
     * at least 2 ms and 5% of the round trip. */
    if (*conf_cycle_s - *cycle_s < 2e-3 || *conf_cycle_s - *cycle_s < 0.05 * *conf_cycle_s) {
        memcpy(ord, ident, sizeof ident);
        *cycle_s = *conf_cycle_s;
    }
    for (int k = 0; k < m; k++) order[k] = idx[ord[k]];
    return 0;
}
