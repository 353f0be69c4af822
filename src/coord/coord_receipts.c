/* coord_receipts.c - the coordinator's side of receipts: each traversal's receipts gathered as they
 * arrive out of band, checked once complete (trust/receipt.h), and kept for audits. */
#include "coord_int.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>
#include <sodium.h>
#include <zmq.h>

#include "../gen/emit.h"
#include "../trust/manifest.h"

/* ---- receipts: the ring hands the ledger (trust/ledger.h) what arrives --------------------------- */

/* A failed check that blames a stage: its node is faulty (serve leaves it out of the next plan). */
void ring_rcpt_blame(ring_coord *rc) {
    const tl_ledger *l = &rc->ledger;
    if (!l->failed || l->blame < 0 || rc->rcpt_blamed) return;
    int node = rc->plan.stages[l->blame].node;
    rc->faulty[node] = true;
    snprintf(rc->fault[node], sizeof rc->fault[node], "receipt check failed: %s", l->blame_why);
    rc->rcpt_blamed = true;
}

/* A RECEIPT message from node `from`: it counts as the receipt of the stage that node was assigned. */
void ring_take_receipt(ring_coord *rc, int from, const zs_parts *p, const rf_header *h) {
    int stage = -1;
    for (int s = 0; s < rc->plan.n_stages; s++) {
        if (rc->plan.stages[s].node == from) stage = s;
    }
    tl_take(&rc->ledger, stage, rc->conf.nodes[from].addr, h->step_id, p->n >= 2 ? p->data[1] : "", p->n >= 2 ? p->len[1] : 0);
    ring_rcpt_blame(rc);
}

int ring_receipts_finish(ring_coord *rc, double timeout_s, rl_err *err) {
    if (!rc->have_ledger) return 0;
    double t0 = gen_mono();
    while (rc->ledger.n_travs > 0 && !rc->ledger.failed && gen_mono() - t0 < timeout_s) {
        zs_parts p;
        rf_header h;
        int from;
        rl_err e2;
        /* Nothing of this type comes: the wait just services RECEIPT messages for 50 ms. */
        int r = ring_wait(rc, RF_FETCH_BEGIN, -1, 0.05, NULL, &from, &p, &h, &e2);
        if (r == 0) zs_parts_free(&p);
        else if (strncmp(e2.msg, "no ", 3) != 0) return rl_errf(err, "receipts: %s", e2.msg); /* interrupted, ... */
    }
    if (rc->ledger.failed) return rl_errf(err, "%s", rc->ledger.error);
    int missing = 0;
    const tl_trav *t = tl_oldest(&rc->ledger, &missing);
    if (t) {
        return rl_errf(err, "receipts: stage %d (%s) sent no receipt for step %llu within %.0f s", missing,
                       rc->conf.nodes[rc->plan.stages[missing].node].addr, (unsigned long long)t->step_id, timeout_s);
    }
    return 0;
}
