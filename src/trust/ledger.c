/* ledger.c - the coordinator's book of receipts (ledger.h). */
#include "ledger.h"

#include <stdlib.h>
#include <string.h>

int ledger_init(ledger_book *l, const ledger_config *c, rl_err *err) {
    memset(l, 0, sizeof *l);
    if (c->n_stages < 1 || c->n_stages > RECEIPT_MAX_STAGES) return rl_errf(err, "receipts: %d stages", c->n_stages);
    l->c = *c;
    memcpy(l->stages, c->stages, (size_t)c->n_stages * sizeof *l->stages);
    for (int s = 0; s < c->n_stages; s++) snprintf(l->names[s], sizeof l->names[s], "%s", c->names ? c->names[s] : "?");
    l->c.stages = l->stages;
    l->c.names = NULL;
    l->blame = -1;
    return receipt_book_init(&l->book, 1u << 16, err);
}

static void ledger_trav_drop(ledger_book *l, ledger_trav *t) {
    free(t->q);
    free(t->seqs);
    free(t->rs);
    free(t->got);
    *t = l->travs[--l->n_travs];
}

void ledger_free(ledger_book *l) {
    while (l->n_travs > 0) ledger_trav_drop(l, &l->travs[0]);
    free(l->travs);
    for (int i = 0; i < l->n_hist; i++) {
        ledger_hist *r = &l->hist[(l->hist_head + i) % l->cap_hist];
        free(r->seqs), free(r->q), free(r->hash);
    }
    free(l->hist);
    receipt_book_free(&l->book);
    memset(l, 0, sizeof *l);
}

static ledger_trav *ledger_find(ledger_book *l, uint64_t step) {
    for (int i = 0; i < l->n_travs; i++) {
        if (l->travs[i].step_id == step) return &l->travs[i];
    }
    return NULL;
}

static void ledger_fail(ledger_book *l, int stage, const char *msg) {
    if (l->failed) return; /* keep the first */
    l->failed = true;
    l->blame = stage;
    snprintf(l->blame_why, sizeof l->blame_why, "%s", msg);
    if (stage >= 0) {
        snprintf(l->error, sizeof l->error, "receipts: node %s (stage %d): %s", l->names[stage], stage, msg);
    } else {
        snprintf(l->error, sizeof l->error, "receipts: %s", msg);
    }
}

int ledger_begin(ledger_book *l, uint64_t step, const uint8_t nonce[32], const uint8_t first_in[32], const frame_seq *seqs,
             uint32_t n_seqs, rl_err *err) {
    if (l->n_travs == l->cap_travs) {
        int cap = l->cap_travs ? l->cap_travs * 2 : 32;
        ledger_trav *nt = realloc(l->travs, (size_t)cap * sizeof *nt);
        if (!nt) return rl_errf(err, "out of memory");
        l->travs = nt;
        l->cap_travs = cap;
    }
    ledger_trav *t = &l->travs[l->n_travs];
    memset(t, 0, sizeof *t);
    t->step_id = step;
    memcpy(t->nonce, nonce, 32);
    memcpy(t->first_in, first_in, 32);
    t->seqs = malloc((size_t)n_seqs * sizeof *t->seqs + 1);
    t->rs = calloc((size_t)l->c.n_stages, sizeof *t->rs);
    t->got = calloc((size_t)l->c.n_stages, sizeof *t->got);
    if (!t->seqs || !t->rs || !t->got) {
        free(t->seqs), free(t->rs), free(t->got);
        return rl_errf(err, "out of memory");
    }
    memcpy(t->seqs, seqs, (size_t)n_seqs * sizeof *t->seqs);
    t->n_seqs = n_seqs;
    l->n_travs++;
    return 0;
}

void ledger_set_q(ledger_book *l, uint64_t step, const void *q, size_t q_len) {
    ledger_trav *t = l->c.keep > 0 ? ledger_find(l, step) : NULL;
    if (t && q_len && (t->q = malloc(q_len))) {
        memcpy(t->q, q, q_len);
        t->q_len = q_len;
    }
}

/* Remembers a checked traversal for audits, forgetting the oldest beyond keep. Takes t's seqs and q. */
static void ledger_hist_add(ledger_book *l, ledger_trav *t) {
    if (!l->hist) {
        l->hist = calloc((size_t)l->c.keep, sizeof *l->hist);
        if (!l->hist) return;
        l->cap_hist = l->c.keep;
    }
    ledger_hist *r;
    if (l->n_hist == l->cap_hist) { /* full: the oldest makes room */
        r = &l->hist[l->hist_head];
        free(r->seqs), free(r->q), free(r->hash);
        l->hist_head = (l->hist_head + 1) % l->cap_hist;
        l->n_hist--;
    }
    r = &l->hist[(l->hist_head + l->n_hist) % l->cap_hist];
    *r = (ledger_hist){.step_id = t->step_id, .n_seqs = t->n_seqs, .seqs = t->seqs, .q = t->q, .q_len = t->q_len,
                   .hash = malloc((size_t)l->c.n_stages * sizeof *r->hash)};
    t->seqs = NULL;
    t->q = NULL;
    if (!r->hash) {
        free(r->seqs), free(r->q);
        return;
    }
    for (int i = 0; i < l->c.n_stages; i++) {
        memcpy(r->hash[i][0], t->rs[i].in_hash, 32);
        memcpy(r->hash[i][1], t->rs[i].out_hash, 32);
    }
    l->n_hist++;
}

/* The first problem a traversal's check reports, and the stage it is about. */
struct ledger_blame {
    int stage;
    char msg[600];
};
static void ledger_blame_stage(void *user, int stage, const char *msg) {
    struct ledger_blame *b = user;
    if (b->msg[0]) return;
    b->stage = stage;
    snprintf(b->msg, sizeof b->msg, "%s", msg);
}

/* A traversal with its result and every stage's receipt: check it, log it, forget it. */
static void ledger_check(ledger_book *l, ledger_trav *t) {
    if (!t->have_result || t->n_got < l->c.n_stages) return;
    receipt_seq sorted[FRAME_MAX_SEQS];
    for (uint32_t i = 0; i < t->n_seqs; i++) sorted[i] = (receipt_seq){t->seqs[i].seq_id, t->seqs[i].pos, t->seqs[i].n_tokens};
    for (uint32_t i = 1; i < t->n_seqs; i++) { /* the receipts' canonical order */
        for (uint32_t j = i; j > 0 && sorted[j - 1].seq_id > sorted[j].seq_id; j--) {
            receipt_seq x = sorted[j];
            sorted[j] = sorted[j - 1];
            sorted[j - 1] = x;
        }
    }
    receipt_expect e = {.ring_id = l->c.ring_id, .request_id = t->step_id, .n_layer = l->c.n_layer,
                     .n_stages = l->c.n_stages, .stages = l->stages, .seen = &l->book, .first_in = t->first_in,
                     .last_out = t->last_out, .seqs = sorted, .n_seqs = t->n_seqs};
    memcpy(e.nonce, t->nonce, 32);
    struct ledger_blame b = {-1, ""};
    if (receipt_check_traversal_all(t->rs, l->c.n_stages, &e, ledger_blame_stage, &b) != 0) {
        ledger_fail(l, b.stage, b.msg); /* the stage the first problem is about is the node to blame */
    } else {
        l->checked += l->c.n_stages;
        for (int i = 0; l->c.out && i < l->c.n_stages; i++) {
            char *line = NULL;
            rl_err err;
            if (receipt_to_json(&t->rs[i], &line, &err) == 0) fprintf(l->c.out, "%s\n", line);
            free(line);
        }
        if (l->c.on_receipts) l->c.on_receipts(l->c.user, t->rs, l->c.n_stages);
        if (l->c.keep > 0) ledger_hist_add(l, t);
    }
    ledger_trav_drop(l, t);
}

void ledger_result(ledger_book *l, uint64_t step, const uint8_t last_out[32]) {
    ledger_trav *t = ledger_find(l, step);
    if (!t) return;
    memcpy(t->last_out, last_out, 32);
    t->have_result = true;
    ledger_check(l, t);
}

/* A receipt goes in the slot of the stage its sender was assigned, whatever the receipt claims (the link
 * is authenticated; a node claiming another range is then caught by the check). */
void ledger_take(ledger_book *l, int stage, const char *who, uint64_t step, const void *data, size_t len) {
    ledger_trav *t = ledger_find(l, step);
    char msg[400];
    if (!t || stage < 0 || stage >= l->c.n_stages) {
        snprintf(msg, sizeof msg, "node %s sent a receipt for step %llu that is not in flight", who,
                 (unsigned long long)step);
        ledger_fail(l, -1, msg);
        return;
    }
    rl_err err;
    if (t->got[stage] || receipt_unpack(&t->rs[stage], data, len, &err) != 0) {
        snprintf(msg, sizeof msg, "node %s (stage %d) sent %s for step %llu: %s", who, stage,
                 t->got[stage] ? "a second receipt" : "an unreadable receipt", (unsigned long long)step,
                 t->got[stage] ? "replay?" : err.msg);
        ledger_fail(l, -1, msg);
        return;
    }
    t->got[stage] = true;
    t->n_got++;
    ledger_check(l, t);
}

const ledger_trav *ledger_oldest(const ledger_book *l, int *missing) {
    if (l->n_travs == 0) return NULL;
    const ledger_trav *t = &l->travs[0];
    *missing = 0;
    for (int s = 0; s < l->c.n_stages; s++) {
        if (!t->got[s]) *missing = s;
    }
    return t;
}

const ledger_hist *ledger_hist_at(const ledger_book *l, int i) { return &l->hist[(l->hist_head + i) % l->cap_hist]; }
