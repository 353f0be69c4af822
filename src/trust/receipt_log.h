/* receipt_log.h - the offline verifier of a receipts log (`ringlm receipts verify`, docs/receipts.md).
 *
 * Checks a JSON-lines log of receipts. Receipts are grouped into traversals by (request id, nonce). The
 * assignment is not in the log, so it is rebuilt from the ring's nodes and the receipts: every signer
 * must be one of the nodes, the stages' layer ranges must follow the nodes' order, and they must cover
 * [0, n_layer) of the model given (n_layer from the file or its manifest, never from the receipts); each
 * stage's manifest hash is recomputed for its range, from the model or from its manifest file. Then every check of receipt_check_traversal runs
 * (signatures, coverage, chain, ids, positions, nonce freshness across the log).
 *
 * Memory stays small for long logs: the first pass keeps only (request id, nonce, offset, line) per
 * receipt; each traversal's lines are read again when it is checked. */
#ifndef RINGLM_RECEIPT_LOG_H
#define RINGLM_RECEIPT_LOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "../base/err.h"
#include "../gguf/model_file.h"
#include "../model/k3_hparams.h"
#include "receipt.h"

/* A node of the ring, in ring order (ring.conf's). */
typedef struct receipt_log_node {
    uint8_t sign_pk[32];
    char addr[128];
} receipt_log_node;

typedef struct receipt_log_opts {
    const mf_model *m;        /* the model the ring ran, or NULL with manifest */
    const k3_hparams *hp;     /* with m */
    const struct manifest_file *manifest; /* instead of m and hp: its manifest (trust/manifest_file.h) - the range
                                       * hashes come from it, no weights needed */
    const receipt_log_node *nodes;
    int n_nodes;
    const uint8_t *coord_pk;  /* the coordinator's key (or NULL): a receipt it signed is named as such */
    FILE *problems;           /* one line per problem found (or NULL) */
} receipt_log_opts;

typedef struct receipt_log_result {
    size_t traversals, receipts;
    long problems, bad_traversals;
    bool bad_lines;           /* some lines are not receipts */
} receipt_log_result;

/* 0: every traversal verifies; 1: problems (counted in *res, written to o->problems); -1: the log could not
 * be checked at all (err says why). */
int receipt_log_verify(const char *file, const receipt_log_opts *o, receipt_log_result *res, rl_err *err);

#endif
