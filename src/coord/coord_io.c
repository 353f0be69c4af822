/* coord_io.c - the coordinator's messages to and from its nodes: a frame sent (waiting for the link, but
 * never past an abort or a link that closed), one answer waited for (pinging the nodes it watches, failing
 * on an ERROR or a silent node), and what arrives out of band meanwhile taken in (receipts into the ledger,
 * taps and routing statistics into their step). The coordinator's other files talk to nodes only through
 * these (coord_int.h), so they depend on this file, not on coord.c, which opens the ring and drives steps. */
#include "coord_int.h"
#include "../base/json.h"
#include "../base/clock.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>
#include <zmq.h>

#include "../gen/emit.h"

/* ---- sending -------------------------------------------------------------------------------------------- */

bool ring_aborted(const ring_coord *rc) { return rc->o.abort && atomic_load(rc->o.abort); }

int ring_send(ring_coord *rc, int node, int type, uint64_t step, const frame_header *hh, const void *payload,
              size_t plen, const void *stamps, size_t slen, rl_err *err) {
    return ring_send4(rc, node, type, step, hh, payload, plen, stamps, slen, NULL, 0, err);
}

int ring_send4(ring_coord *rc, int node, int type, uint64_t step, const frame_header *hh, const void *payload,
               size_t plen, const void *stamps, size_t slen, const void *extra, size_t elen, rl_err *err) {
    frame_header h0 = {.type = (uint16_t)type, .ring_id = rc->ring_id, .step_id = step, .payload_bytes = plen};
    const frame_header *h = hh ? hh : &h0;
    size_t hl = frame_header_size(h->n_seqs);
    uint8_t *hb = malloc(hl);
    if (!hb) return rl_errf(err, "out of memory");
    frame_header_encode(h, hb);
    const void *parts[4] = {hb, payload ? payload : "", stamps ? stamps : "", extra};
    size_t lens[4] = {hl, plen, slen, elen};
    int np = extra ? 4 : stamps ? 3 : 2;
    /* INFO requests are retried by the caller; everything else waits a while for the link, but not past an
     * abort, nor once the link closed after its handshake (the node died: the frame can never arrive). */
    int r;
    if (type == FRAME_INFO_REQ || type == FRAME_PING) {
        r = zs_send(rc->nodes[node].sock, parts, lens, np, true, err);
    } else {
        r = -1;
        for (double waited = 0;; waited += 0.1) {
            if (zs_wait_writable(rc->nodes[node].sock, 100)) {
                r = zs_send(rc->nodes[node].sock, parts, lens, np, true, err);
                break;
            }
            zs_monitor_poll(&rc->nodes[node].mon);
            if (ring_aborted(rc) || gen_sigint_pending()) {
                rl_errf(err, "interrupted");
                break;
            }
            if (rc->nodes[node].mon.disconnected || waited >= rc->o.dead_s) {
                rl_errf(err, "send failed: no connected peer after %.1f s", waited);
                break;
            }
        }
    }
    free(hb);
    if (r != 0) {
        zs_monitor_poll(&rc->nodes[node].mon);
        return rl_errf(err, "cannot reach node %s%s%s", rc->conf.nodes[node].addr,
                       rc->nodes[node].mon.last[0] ? ": " : "", rc->nodes[node].mon.last);
    }
    return 0;
}

/* ---- waiting -------------------------------------------------------------------------------------------- */

/* Waits for one message of `want` type (from any node, or from `only` if >= 0). Answers nothing itself,
 * but notes PONGs, pings every node each second and fails on ERROR, on a node silent for dead_s, or
 * after timeout_s. *from is the node index the message came from. */
int ring_wait(ring_coord *rc, int want, int only, double timeout_s, const bool *watch, int *from, zs_parts *out,
              frame_header *h, rl_err *err) {
    double t0 = rl_clock_now();
    bool checked_after_read = false;
    rc->wait_timed_out = false;
    for (;;) {
        double now = rl_clock_now();
        if (now - t0 > timeout_s) {
            rc->wait_timed_out = true;
            return rl_errf(err, "no %s within %.0f s", frame_type_name(want), timeout_s);
        }
        if (watch && now - rc->last_ping >= 1.0) {
            rc->last_ping = now;
            for (int i = 0; i < rc->conf.n; i++) {
                if (watch[i]) {
                    rl_err e2;
                    ring_send(rc, i, FRAME_PING, 0, NULL, NULL, 0, NULL, 0, &e2);
                    if (rc->nodes[i].ping_since <= rc->nodes[i].last_seen) rc->nodes[i].ping_since = now;
                }
            }
        }
        /* Liveness is judged after this pass has read everything waiting (below): a PONG that came in while
         * the last wait returned early on its own message must count before a silence is called. */
        if (watch && checked_after_read) {
            for (int i = 0; i < rc->conf.n; i++) {
                if (!watch[i]) continue;
                zs_monitor_poll(&rc->nodes[i].mon);
                if (rc->nodes[i].mon.disconnected) {
                    return rl_errf(err, "lost node %s: %s", rc->conf.nodes[i].addr, rc->nodes[i].mon.last);
                }
                const ring_node_state *ns = &rc->nodes[i];
                if (ns->ping_since > ns->last_seen && now - ns->ping_since > rc->o.dead_s) {
                    return rl_errf(err, "node %s stopped responding (nothing for %.0f s)%s%s", rc->conf.nodes[i].addr,
                                   rc->o.dead_s, rc->nodes[i].mon.last[0] ? ": " : "", rc->nodes[i].mon.last);
                }
            }
        }
        checked_after_read = true;
        zmq_pollitem_t items[PLAN_MAX_NODES];
        for (int i = 0; i < rc->conf.n; i++) items[i] = (zmq_pollitem_t){rc->nodes[i].sock, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(items, rc->conf.n, 100) < 0 && errno != EINTR) {
            return rl_errf(err, "poll failed: %s", zmq_strerror(errno));
        }
        if (gen_sigint_pending() || ring_aborted(rc)) return rl_errf(err, "interrupted");
        /* Waiting on one node's answer (a load, a stream's acknowledgement): its link closing after the
         * handshake means the answer can never come. */
        if (only >= 0) {
            zs_monitor_poll(&rc->nodes[only].mon);
            if (rc->nodes[only].mon.disconnected) {
                return rl_errf(err, "lost node %s: %s", rc->conf.nodes[only].addr, rc->nodes[only].mon.last);
            }
        }
        for (int i = 0; i < rc->conf.n; i++) {
            if (!(items[i].revents & ZMQ_POLLIN)) continue;
            for (;;) {
                zs_parts p;
                int r = zs_recv(rc->nodes[i].sock, &p, err);
                if (r == 1) break;
                if (r < 0) return -1;
                rc->nodes[i].last_seen = rl_clock_now();
                rl_err e2;
                if (p.n < 2 || frame_header_decode(h, p.data[0], p.len[0], &e2) != 0) {
                    zs_parts_free(&p);
                    return rl_errf(err, "node %s sent a malformed frame: %s", rc->conf.nodes[i].addr,
                                   p.n < 2 ? "too few parts" : e2.msg);
                }
                /* A message about another ring's frame is not ours: a receipt a node signed for the ring that
                 * just broke, or an ERROR from a node that was still sending that ring's last frame downstream
                 * when it broke, reaches whichever coordinator now holds our routing id. It proves the node
                 * is alive and nothing else. Ring id 0: about no frame at all (a malformed one). */
                if (h->ring_id != 0 && h->ring_id != rc->ring_id) {
                    rc->stale_msgs++;
                    zs_parts_free(&p);
                    continue;
                }
                if (h->type == FRAME_ERROR) {
                    cJSON *j = cJSON_ParseWithLength(p.data[1], p.len[1]);
                    const cJSON *msg = j ? cJSON_GetObjectItemCaseSensitive(j, "msg") : NULL;
                    const char *lost = j ? rl_json_str(j, "lost") : NULL;
                    rc->busy_node = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "busy")) ? i : -1;
                    int dead = -1;
                    for (int k = 0; lost && dead < 0 && k < rc->conf.n; k++) {
                        if (strcmp(rc->conf.nodes[k].addr, lost) == 0) dead = k;
                    }
                    if (dead >= 0 && dead != i) { /* it saw the next node die: that node is the cause, not it */
                        rl_errf(err, "lost node %s: the stage before it saw its connection close (the process died or the network dropped)",
                                rc->conf.nodes[dead].addr);
                    } else {
                        rl_errf(err, "node %s: %s", rc->conf.nodes[i].addr,
                                cJSON_IsString(msg) ? msg->valuestring : "(unreadable error)");
                    }
                    cJSON_Delete(j);
                    zs_parts_free(&p);
                    return -1;
                }
                if (h->type == want && (only < 0 || only == i)) {
                    *from = i;
                    *out = p;
                    return 0;
                }
                if (h->type == FRAME_RECEIPT && rc->have_ledger) ring_take_receipt(rc, i, &p, h);
                if (h->type == FRAME_TAPS) ring_take_taps(rc, i, &p, h);
                if (h->type == FRAME_ROUTES) ring_take_routes(rc, i, &p, h);
                zs_parts_free(&p); /* PONGs and late answers */
            }
        }
        for (int i = 0; i < rc->conf.n; i++) zs_monitor_poll(&rc->nodes[i].mon);
    }
}

/* ---- out of band: what arrives while the coordinator waits ---------------------------------------------- */

/* The step in flight with this id (NULL: collected already, or never sent). */
struct ring_pending *ring_find_pending(ring_coord *rc, uint64_t step) {
    for (int i = 0; i < rc->n_pending; i++) {
        if (rc->pending[i].step_id == step) return &rc->pending[i];
    }
    return NULL;
}

/* How many of the ring's tap layers stage s holds (a < layer <= b, like stage_set_taps). */
int ring_stage_taps(const ring_coord *rc, int s) {
    int n = 0;
    for (int k = 0; k < rc->o.n_taps; k++) n += rc->o.taps[k] > rc->plan.stages[s].a && rc->o.taps[k] <= rc->plan.stages[s].b;
    return n;
}

/* A TAPS message (frame.h): this node's rows of a step in flight, checked against what its stage holds.
 * Taps only steer drafts, so a bad message never fails the step: a malformed one from a stage that owes
 * taps counts as that stage's (its rows stay zero, so the drafts suffer, not the output) and the step
 * does not wait for it; a second one from the same stage, or one from a stage that holds no tap layer,
 * is ignored, so it cannot stand in for another stage's. Each is counted (ring_stats_json: taps_dropped)
 * and the first is logged with the node's address. */
static void ring_taps_drop(ring_coord *rc, int from, uint64_t step, const char *why) {
    if (rc->taps_dropped++ == 0) {
        fprintf(stderr, "ringlm: ring: node %s sent %s for step %llu; dropped (DSpark drafts may suffer, the output "
                        "does not; later ones are only counted)\n",
                rc->conf.nodes[from].addr, why, (unsigned long long)step);
    }
}

void ring_take_taps(ring_coord *rc, int from, const zs_parts *p, const frame_header *h) {
    struct ring_pending *pd = ring_find_pending(rc, h->step_id);
    int s = -1;
    for (int i = 0; i < rc->plan.n_stages; i++) s = rc->plan.stages[i].node == from ? i : s;
    if (!pd || !pd->taps || s < 0) return; /* a step already collected (or never sent): nothing owed */
    const uint64_t bit = 1ull << (unsigned)s;
    if (ring_stage_taps(rc, s) == 0 || (pd->taps_from & bit)) {
        ring_taps_drop(rc, from, h->step_id, ring_stage_taps(rc, s) ? "a second TAPS message" : "taps its stage does not hold");
        return;
    }
    pd->taps_from |= bit;
    pd->taps_got++;
    const uint8_t *b = p->n >= 2 ? p->data[1] : NULL;
    size_t len = p->n >= 2 ? p->len[1] : 0;
    uint32_t nt, nr;
    const size_t d = rc->hp.n_embd;
    if (len < 4 || (memcpy(&nt, b, 4), nt != (uint32_t)ring_stage_taps(rc, s)) || len < 8 + 4 * (size_t)nt) {
        ring_taps_drop(rc, from, h->step_id, "a malformed TAPS message (its tap count)");
        return;
    }
    memcpy(&nr, b + 4 + 4 * (size_t)nt, 4);
    if (nr != pd->tap_rows || len != 8 + 4 * (size_t)nt + (size_t)nt * nr * d * sizeof(float)) {
        ring_taps_drop(rc, from, h->step_id, "a malformed TAPS message (its size)");
        return;
    }
    for (uint32_t t = 0; t < nt; t++) {
        uint32_t layer;
        memcpy(&layer, b + 4 + 4 * (size_t)t, 4);
        if (layer <= rc->plan.stages[s].a || layer > rc->plan.stages[s].b) {
            ring_taps_drop(rc, from, h->step_id, "a malformed TAPS message (a layer outside its stage)");
            return;
        }
    }
    const float *rows = (const float *)(b + 8 + 4 * (size_t)nt); /* zmq message data is malloc-aligned */
    for (uint32_t t = 0; t < nt; t++) {
        uint32_t layer;
        memcpy(&layer, b + 4 + 4 * (size_t)t, 4);
        for (int k = 0; k < rc->o.n_taps; k++) {
            if (rc->o.taps[k] != layer) continue;
            for (uint32_t r = 0; r < nr; r++) {
                memcpy(pd->taps + ((size_t)r * rc->o.n_taps + k) * d, rows + ((size_t)t * nr + r) * d, d * sizeof(float));
            }
        }
    }
}

/* A failed check that blames a stage: its node is faulty (serve leaves it out of the next plan). */
void ring_rcpt_blame(ring_coord *rc) {
    const ledger_book *l = &rc->ledger;
    if (!l->failed || l->blame < 0 || rc->receipt_blamed) return;
    int node = rc->plan.stages[l->blame].node;
    rc->faulty[node] = true;
    snprintf(rc->fault[node], sizeof rc->fault[node], "receipt check failed: %s", l->blame_why);
    rc->receipt_blamed = true;
}

/* A RECEIPT message from node `from`: it counts as the receipt of the stage that node was assigned. */
void ring_take_receipt(ring_coord *rc, int from, const zs_parts *p, const frame_header *h) {
    int stage = -1;
    for (int s = 0; s < rc->plan.n_stages; s++) {
        if (rc->plan.stages[s].node == from) stage = s;
    }
    ledger_take(&rc->ledger, stage, rc->conf.nodes[from].addr, h->step_id, p->n >= 2 ? p->data[1] : "", p->n >= 2 ? p->len[1] : 0);
    ring_rcpt_blame(rc);
}

/* The stages that owe a FRAME_SEQ_ROUTES step their routing statistics: those holding MoE layers. */
int ring_routes_need(const ring_coord *rc) {
    int n = 0;
    for (int s = 0; s < rc->plan.n_stages; s++) n += rc->plan.stages[s].b > rc->hp.n_dense_lead;
    return n;
}

/* A ROUTES message (frame.h) of a step in flight into rc->routes (REAP scoring, ring_reap.c), checked against
 * what the node's stage holds; a malformed one fails the step with a message naming the node. */
void ring_take_routes(ring_coord *rc, int from, const zs_parts *p, const frame_header *h) {
    struct ring_pending *pd = ring_find_pending(rc, h->step_id);
    int s = -1;
    for (int i = 0; i < rc->plan.n_stages; i++) s = rc->plan.stages[i].node == from ? i : s;
    if (!pd || pd->route_rows == 0 || pd->routes_err[0]) return; /* nothing owed, or already failed */
    const char *addr = rc->conf.nodes[from].addr;
    if (s < 0) {
        snprintf(pd->routes_err, sizeof pd->routes_err, "node %s sent routing statistics but holds no stage", addr);
        return;
    }
    const uint32_t a = rc->plan.stages[s].a, b = rc->plan.stages[s].b;
    const uint32_t l0 = a > rc->hp.n_dense_lead ? a : rc->hp.n_dense_lead;
    const uint64_t bit = 1ull << (unsigned)s;
    if (b <= rc->hp.n_dense_lead || (pd->routes_from & bit)) {
        snprintf(pd->routes_err, sizeof pd->routes_err, "node %s sent %s routing statistics for step %llu", addr,
                 (pd->routes_from & bit) ? "a second set of" : "(holding no MoE layer)", (unsigned long long)h->step_id);
        return;
    }
    pd->routes_from |= bit;
    pd->routes_got++;
    const uint8_t *d = p->n >= 2 ? p->data[1] : NULL;
    const size_t len = p->n >= 2 ? p->len[1] : 0;
    uint32_t hd[4] = {0};
    if (len >= 16) memcpy(hd, d, 16);
    const size_t cell = (size_t)hd[1] * hd[3] * hd[2];
    if (len < 16 || hd[0] != l0 || hd[1] != b - l0 || hd[2] != rc->hp.n_expert_used || hd[3] != pd->route_rows ||
        len != 16 + cell * 12) {
        snprintf(pd->routes_err, sizeof pd->routes_err,
                 "node %s sent malformed routing statistics for step %llu (layers %u+%u, k %u, %u rows, %zu bytes; "
                 "want layers %u+%u, k %u, %u rows)", addr, (unsigned long long)h->step_id, hd[0], hd[1], hd[2], hd[3],
                 len, l0, b - l0, rc->hp.n_expert_used, pd->route_rows);
        return;
    }
    /* Copied out: the message's bytes carry no alignment promise. */
    k3_routes r = {.n_layers = hd[1], .layer0 = hd[0], .n_tokens = hd[3], .k = hd[2]};
    r.ids = malloc(cell * 4 + 1);
    r.weight = malloc(cell * 4 + 1);
    r.norm = malloc(cell * 4 + 1);
    rl_err err;
    if (!r.ids || !r.weight || !r.norm) {
        snprintf(pd->routes_err, sizeof pd->routes_err, "out of memory for routing statistics");
    } else {
        memcpy(r.ids, d + 16, cell * 4);
        memcpy(r.weight, d + 16 + cell * 4, cell * 4);
        memcpy(r.norm, d + 16 + cell * 8, cell * 4);
        if (reap_stats_add(rc->routes, &r, &err) != 0) {
            snprintf(pd->routes_err, sizeof pd->routes_err, "node %s: routing statistics: %s", addr, err.msg);
        }
    }
    free(r.ids);
    free(r.weight);
    free(r.norm);
}
