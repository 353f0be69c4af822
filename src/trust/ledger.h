/* ledger.h - the coordinator's book of receipts (docs/receipts.md).
 *
 * Every traversal stays here from the moment its frame leaves until its result and every stage's receipt
 * are in; then it is checked (receipt.h: signatures, signers, ranges, chain, ids, positions, nonce) against
 * what the coordinator expects from its own plan and model, never against what the receipts claim. A
 * checked traversal is written out and, while audits are on, remembered with every stage's signed hashes
 * (the audits' evidence: coord/coord_audit.c asks the node for the bytes and coord/audit.h recomputes them).
 * The ledger never talks to a node: the ring hands it what arrives. The first failed check is kept, with
 * the stage it is about, so the coordinator can name and leave out that node. */
#ifndef RINGLM_LEDGER_H
#define RINGLM_LEDGER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "../base/err.h"
#include "../wire/frame.h"
#include "receipt.h"

typedef struct ledger_trav {
    uint64_t step_id;
    uint8_t nonce[32], first_in[32], last_out[32];
    bool have_result;
    frame_seq *seqs;     /* the frame's sequence entries (what the receipts must list; kept for audits) */
    uint32_t n_seqs;
    uint8_t *q;       /* its drafts' distributions, kept for audits (or NULL) */
    size_t q_len;
    receipt_rec *rs; /* [n_stages], by the stage of the node that sent it */
    bool *got;
    int n_got;
} ledger_trav;

typedef struct ledger_hist {
    uint64_t step_id;
    uint32_t n_seqs;
    frame_seq *seqs;
    uint8_t *q;              /* the drafts' distributions sent with it (or NULL) */
    size_t q_len;
    uint8_t (*hash)[2][32];  /* [stage] = {input hash, output hash} from the checked receipts */
} ledger_hist;

typedef struct ledger_config {
    uint64_t ring_id;
    uint32_t n_layer;
    int n_stages;
    const receipt_stage_expect *stages; /* [n_stages]: who runs which layers, and each range's manifest hash */
    const char *const *names;        /* [n_stages]: the stages' nodes as messages name them */
    FILE *out;                       /* checked receipts as JSON lines (or NULL) */
    void (*on_receipts)(void *user, const receipt_rec *rs, int n_stages); /* each checked traversal (or NULL) */
    void *user;
    int keep;                        /* checked traversals remembered for audits (0: none) */
} ledger_config;

typedef struct ledger_book {
    ledger_config c;
    receipt_stage_expect stages[RECEIPT_MAX_STAGES];
    char names[RECEIPT_MAX_STAGES][128];
    receipt_nonce_book book;
    ledger_trav *travs;
    int n_travs, cap_travs;
    ledger_hist *hist;           /* a ring buffer of the last c.keep checked traversals */
    int n_hist, cap_hist, hist_head;
    long checked;            /* receipts checked and found good */
    bool failed;             /* a check failed: error says how; blame is the stage it is about (or -1) */
    char error[1024];
    int blame;
    char blame_why[600];
} ledger_book;

int ledger_init(ledger_book *l, const ledger_config *c, rl_err *err);
void ledger_free(ledger_book *l);
/* A frame sent: its traversal's nonce, the hash of its input, and its sequence entries (copied). */
int ledger_begin(ledger_book *l, uint64_t step, const uint8_t nonce[32], const uint8_t first_in[32], const frame_seq *seqs,
             uint32_t n_seqs, rl_err *err);
/* Its drafts' distributions, kept for audits (copied; ignored when keep is 0). */
void ledger_set_q(ledger_book *l, uint64_t step, const void *q, size_t q_len);
/* Its result arrived (last_out: the hash of what the last stage returned); checks it if complete. */
void ledger_result(ledger_book *l, uint64_t step, const uint8_t last_out[32]);
/* A receipt (packed) from the node of `stage` (-1: a node that is no stage; who names it). */
void ledger_take(ledger_book *l, int stage, const char *who, uint64_t step, const void *data, size_t len);
/* The oldest traversal still waiting for receipts (or NULL), and the first stage it waits for. */
const ledger_trav *ledger_oldest(const ledger_book *l, int *missing);
/* The i-th remembered traversal, oldest first (i < n_hist). */
const ledger_hist *ledger_hist_at(const ledger_book *l, int i);

#endif
