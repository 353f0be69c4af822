/* coord_receipts.c - the coordinator's side of receipts: each traversal's receipts are taken in as they
 * arrive out of band (ring_take_receipt, coord_io.c) and checked once complete (trust/ledger.h); here the
 * coordinator waits for those still owed and reports the ledger's verdict. */
#include "coord_int.h"
#include "../base/clock.h"

#include <string.h>

#include "../gen/emit.h"

int ring_receipts_finish(ring_coord *rc, double timeout_s, rl_err *err) {
    if (!rc->have_ledger) return 0;
    double t0 = rl_clock_now();
    while (rc->ledger.n_travs > 0 && !rc->ledger.failed && rl_clock_now() - t0 < timeout_s) {
        zs_parts p;
        frame_header h;
        int from;
        rl_err e2;
        /* Nothing of this type comes: the wait just services RECEIPT messages for 50 ms. */
        int r = ring_wait(rc, FRAME_FETCH_BEGIN, -1, 0.05, NULL, &from, &p, &h, &e2);
        if (r == 0) zs_parts_free(&p);
        else if (strncmp(e2.msg, "no ", 3) != 0) return rl_errf(err, "receipts: %s", e2.msg); /* interrupted, ... */
    }
    if (rc->ledger.failed) return rl_errf(err, "%s", rc->ledger.error);
    int missing = 0;
    const ledger_trav *t = ledger_oldest(&rc->ledger, &missing);
    if (t) {
        return rl_errf(err, "receipts: stage %d (%s) sent no receipt for step %llu within %.0f s", missing,
                       rc->conf.nodes[rc->plan.stages[missing].node].addr, (unsigned long long)t->step_id, timeout_s);
    }
    return 0;
}
