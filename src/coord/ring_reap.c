/* ring_reap.c - REAP scoring through the ring: calibration text flows through the stages as prefill
 * frames flagged RF_SEQ_ROUTES; every stage holding MoE layers sends its layers' routing back (ROUTES,
 * frame.h) and the coordinator adds it to one set of statistics for the whole model. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../prune/reap_run.h"
#include "coord_int.h"

int ring_routes_need(const ring_coord *rc) {
    int n = 0;
    for (int s = 0; s < rc->plan.n_stages; s++) n += rc->plan.stages[s].b > rc->hp.n_dense_lead;
    return n;
}

void ring_take_routes(ring_coord *rc, int from, const zs_parts *p, const rf_header *h) {
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

int ring_reap_score(ring_coord *rc, const calib_set *c, uint32_t chunk, reap_stats *s, bool progress, rl_err *err) {
    if (chunk < 1) chunk = 512;
    rc->routes = s;
    int rc_ = 0;
    const double t0 = reap_clock();
    double last = 0;
    size_t done = 0;
    enum { IN_FLIGHT = 8 };
    smp_params greedy = smp_params_default(0); /* never used (no token is sampled), but checked on the way */
    greedy.temperature = 0;
    const rf_sampling smp = ring_sampling(&greedy);
    for (int q = 0; q < c->n_seq && rc_ == 0; q++) {
        const uint64_t seq = rc->next_seq++;
        ring_seq_req rqs[IN_FLIGHT];
        uint64_t steps[IN_FLIGHT];
        uint32_t sent_at = 0;
        size_t sent = 0, got = 0;
        const size_t n_chunks = (c->len[q] + chunk - 1) / chunk;
        /* Several chunks of a sequence in flight fill the pipeline; every stage still sees them in order,
         * and each layer's sums grow in that order, as on one machine. */
        while (rc_ == 0 && got < n_chunks) {
            while (rc_ == 0 && sent < n_chunks && sent - got < IN_FLIGHT) {
                uint32_t n = c->len[q] - sent_at < chunk ? c->len[q] - sent_at : chunk;
                rqs[sent % IN_FLIGHT] = (ring_seq_req){.seq_id = seq, .pos = sent_at, .n = n,
                                                       .tokens = c->ids + c->start[q] + sent_at, .smp = smp,
                                                       .flags = (sent == 0 ? RF_SEQ_NEW : 0) | RF_SEQ_NO_SAMPLE | RF_SEQ_ROUTES};
                rc_ = ring_submit(rc, &rqs[sent % IN_FLIGHT], 1, &steps[sent % IN_FLIGHT], err);
                sent_at += n;
                sent++;
            }
            if (rc_ == 0) rc_ = ring_collect(rc, steps[got % IN_FLIGHT], &rqs[got % IN_FLIGHT], 1, err);
            if (rc_ == 0) done += rqs[got % IN_FLIGHT].n;
            got++;
            if (progress && rc_ == 0) reap_bar("reap score (ring)", done, c->n_ids, t0, &last);
        }
        rl_err e2;
        if (ring_free_seqs(rc, &seq, 1, rc_ == 0 ? err : &e2) != 0 && rc_ == 0) rc_ = -1;
    }
    rc->routes = NULL;
    return rc_;
}
