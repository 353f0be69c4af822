/* ring_reap.c - REAP scoring through the ring: calibration text flows through the stages as prefill
 * frames flagged FRAME_SEQ_ROUTES; every stage holding MoE layers sends its layers' routing back (ROUTES,
 * frame.h) and the coordinator adds it to one set of statistics for the whole model (as it arrives:
 * ring_take_routes, coord_io.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../prune/reap_run.h"
#include "../base/clock.h"
#include "coord_int.h"

int ring_reap_score(ring_coord *rc, const calib_set *c, uint32_t chunk, reap_stats *s, bool progress, rl_err *err) {
    if (chunk < 1) chunk = 512;
    rc->routes = s;
    int rc_ = 0;
    const double t0 = rl_clock_now();
    double last = 0;
    size_t done = 0;
    enum { IN_FLIGHT = 8 };
    smp_params greedy = smp_params_default(0); /* never used (no token is sampled), but checked on the way */
    greedy.temperature = 0;
    const frame_sampling smp = ring_sampling(&greedy);
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
                                                       .flags = (sent == 0 ? FRAME_SEQ_NEW : 0) | FRAME_SEQ_NO_SAMPLE | FRAME_SEQ_ROUTES};
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
