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

/* ---- receipts: gathered out of band, checked when complete ---------------------------------------- */

struct ring_trav *ring_trav_find(ring_coord *rc, uint64_t step) {
    for (int i = 0; i < rc->n_travs; i++) {
        if (rc->travs[i].step_id == step) return &rc->travs[i];
    }
    return NULL;
}

void ring_trav_drop(ring_coord *rc, struct ring_trav *t) {
    free(t->q);
    free(t->seqs);
    free(t->rs);
    free(t->got);
    *t = rc->travs[--rc->n_travs];
}

void ring_rcpt_fail(ring_coord *rc, const char *msg) {
    if (rc->rcpt_failed) return; /* keep the first */
    rc->rcpt_failed = true;
    snprintf(rc->rcpt_error, sizeof rc->rcpt_error, "receipts: %s", msg);
}

/* The first problem a traversal's check reports, and the stage it is about. */
struct ring_blame {
    ring_coord *rc;
    int stage;
    char msg[600];
};
static void ring_blame_stage(void *user, int stage, const char *msg) {
    struct ring_blame *b = user;
    if (b->msg[0]) return;
    b->stage = stage;
    snprintf(b->msg, sizeof b->msg, "%s", msg);
}

/* Remembers a checked traversal for audits (what was sent, and every stage's signed hashes), forgetting
 * the oldest beyond audit_keep. Takes t's seqs and q. */
void ring_hist_add(ring_coord *rc, struct ring_trav *t) {
    int keep = rc->o.audit_keep > 0 ? rc->o.audit_keep : 4096;
    if (!rc->hist) {
        rc->hist = calloc((size_t)keep, sizeof *rc->hist);
        if (!rc->hist) return;
        rc->cap_hist = keep;
    }
    struct ring_hist *r;
    if (rc->n_hist == rc->cap_hist) { /* full: the oldest makes room */
        r = &rc->hist[rc->hist_head];
        free(r->seqs), free(r->q), free(r->hash);
        rc->hist_head = (rc->hist_head + 1) % rc->cap_hist;
        rc->n_hist--;
    }
    r = &rc->hist[(rc->hist_head + rc->n_hist) % rc->cap_hist];
    *r = (struct ring_hist){.step_id = t->step_id, .n_seqs = t->n_seqs, .seqs = t->seqs, .q = t->q, .q_len = t->q_len,
                            .hash = malloc((size_t)rc->plan.n_stages * sizeof *r->hash)};
    t->seqs = NULL;
    t->q = NULL;
    if (!r->hash) {
        free(r->seqs), free(r->q);
        return;
    }
    for (int i = 0; i < rc->plan.n_stages; i++) {
        memcpy(r->hash[i][0], t->rs[i].in_hash, 32);
        memcpy(r->hash[i][1], t->rs[i].out_hash, 32);
    }
    rc->n_hist++;
}

void ring_hist_free(ring_coord *rc) {
    for (int i = 0; i < rc->n_hist; i++) {
        struct ring_hist *r = &rc->hist[(rc->hist_head + i) % rc->cap_hist];
        free(r->seqs), free(r->q), free(r->hash);
    }
    free(rc->hist);
    rc->hist = NULL;
    rc->n_hist = rc->cap_hist = rc->hist_head = 0;
    for (int i = 0; i < PLAN_MAX_NODES; i++) {
        if (rc->aud_eng[i]) k3_engine_free(rc->aud_eng[i]);
        free(rc->aud_eng[i]);
        rc->aud_eng[i] = NULL;
    }
}

/* A traversal with its result and every stage's receipt: check it, log it, forget it. */
void ring_trav_check(ring_coord *rc, struct ring_trav *t) {
    if (!t->have_result || t->n_got < rc->plan.n_stages) return;
    rcpt_seq sorted[RF_MAX_SEQS];
    for (uint32_t i = 0; i < t->n_seqs; i++) sorted[i] = (rcpt_seq){t->seqs[i].seq_id, t->seqs[i].pos, t->seqs[i].n_tokens};
    for (uint32_t i = 1; i < t->n_seqs; i++) { /* the receipts' canonical order */
        for (uint32_t j = i; j > 0 && sorted[j - 1].seq_id > sorted[j].seq_id; j--) {
            rcpt_seq x = sorted[j];
            sorted[j] = sorted[j - 1];
            sorted[j - 1] = x;
        }
    }
    rcpt_expect e = {.ring_id = rc->ring_id, .request_id = t->step_id, .n_layer = rc->hp.n_layer,
                     .n_stages = rc->plan.n_stages, .stages = rc->rexp, .seen = &rc->book, .first_in = t->first_in,
                     .last_out = t->last_out, .seqs = sorted, .n_seqs = t->n_seqs};
    memcpy(e.nonce, t->nonce, 32);
    rl_err err;
    struct ring_blame b = {rc, -1, ""};
    if (rcpt_check_traversal_all(t->rs, rc->plan.n_stages, &e, ring_blame_stage, &b) != 0) {
        /* The stage the first problem is about is the node to blame: mark it faulty, name it. */
        char msg[900];
        if (b.stage >= 0) {
            int node = rc->plan.stages[b.stage].node;
            snprintf(msg, sizeof msg, "node %s (stage %d): %s", rc->conf.nodes[node].addr, b.stage, b.msg);
            rc->faulty[node] = true;
            snprintf(rc->fault[node], sizeof rc->fault[node], "receipt check failed: %s", b.msg);
        } else {
            snprintf(msg, sizeof msg, "%s", b.msg);
        }
        ring_rcpt_fail(rc, msg);
    } else {
        rc->receipts_checked += rc->plan.n_stages;
        for (int i = 0; rc->o.receipts_out && i < rc->plan.n_stages; i++) {
            char *line = NULL;
            if (rcpt_to_json(&t->rs[i], &line, &err) == 0) fprintf(rc->o.receipts_out, "%s\n", line);
            free(line);
        }
        if (rc->o.on_receipts) rc->o.on_receipts(rc->o.on_receipts_user, t->rs, rc->plan.n_stages);
        if (rc->o.audit_rate > 0) ring_hist_add(rc, t);
    }
    ring_trav_drop(rc, t);
}

/* A RECEIPT message from node `from`: it goes in the slot of the stage that node was assigned, whatever
 * the receipt claims (the link is authenticated; a node claiming another range is then caught). */
void ring_take_receipt(ring_coord *rc, int from, const zs_parts *p, const rf_header *h) {
    struct ring_trav *t = ring_trav_find(rc, h->step_id);
    int stage = -1;
    for (int s = 0; s < rc->plan.n_stages; s++) {
        if (rc->plan.stages[s].node == from) stage = s;
    }
    char msg[300];
    if (!t || stage < 0) {
        snprintf(msg, sizeof msg, "node %s sent a receipt for step %llu that is not in flight", rc->conf.nodes[from].addr,
                 (unsigned long long)h->step_id);
        ring_rcpt_fail(rc, msg);
        return;
    }
    rl_err err;
    if (t->got[stage] || rcpt_unpack(&t->rs[stage], p->data[1], p->len[1], &err) != 0) {
        snprintf(msg, sizeof msg, "node %s (stage %d) sent %s for step %llu: %s", rc->conf.nodes[from].addr, stage,
                 t->got[stage] ? "a second receipt" : "an unreadable receipt", (unsigned long long)h->step_id,
                 t->got[stage] ? "replay?" : err.msg);
        ring_rcpt_fail(rc, msg);
        return;
    }
    t->got[stage] = true;
    t->n_got++;
    ring_trav_check(rc, t);
}

int ring_receipts_finish(ring_coord *rc, double timeout_s, rl_err *err) {
    if (!rc->o.receipts) return 0;
    double t0 = gen_mono();
    while (rc->n_travs > 0 && !rc->rcpt_failed && gen_mono() - t0 < timeout_s) {
        zs_parts p;
        rf_header h;
        int from;
        rl_err e2;
        /* Nothing of this type comes: the wait just services RECEIPT messages for 50 ms. */
        int r = ring_wait(rc, RF_FETCH_BEGIN, -1, 0.05, NULL, &from, &p, &h, &e2);
        if (r == 0) zs_parts_free(&p);
        else if (strncmp(e2.msg, "no ", 3) != 0) return rl_errf(err, "receipts: %s", e2.msg); /* interrupted, ... */
    }
    if (rc->rcpt_failed) return rl_errf(err, "%s", rc->rcpt_error);
    if (rc->n_travs > 0) {
        struct ring_trav *t = &rc->travs[0];
        int missing = 0;
        for (int s = 0; s < rc->plan.n_stages && t->got; s++) {
            if (!t->got[s]) missing = s;
        }
        return rl_errf(err, "receipts: stage %d (%s) sent no receipt for step %llu within %.0f s", missing,
                       rc->conf.nodes[rc->plan.stages[missing].node].addr, (unsigned long long)t->step_id, timeout_s);
    }
    return 0;
}
