/* audit.h - audits: recompute a stage's layers for one sequence and compare with what its node sent.
 *
 * A receipt says what a node claims to have computed; an audit checks the claim. The auditor (the
 * coordinator, which holds the model file) takes the frames a stage ran for one sequence - the payloads
 * the node received and sent, whose hashes the node signed in its receipts - and runs that sequence's
 * share of each frame, in order from its first token, through its own copy of the stage's layers
 * (ring/stage.h, the same code a node runs). Per-sequence state (MLA caches, KDA state) depends on every
 * earlier frame, which is why a sequence is replayed from its start rather than one step in isolation.
 *
 * Compared per frame, for that sequence only: the token ids passed on (exactly), the boundary state sent
 * on (h and the banked checkpoints, within tol relative to the largest magnitude of that token's vector:
 * float results differ a little between machines, kernels and batch shapes), and on the last stage the
 * sampled tokens and accepted drafts (exactly: sampling is seeded and replayed) and returned logits
 * (within tol). The first frame that differs is reported, with the largest difference found. */
#ifndef RINGLM_AUDIT_H
#define RINGLM_AUDIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/err.h"
#include "../model/k3_forward.h"
#include "../wire/frame.h"

typedef struct audit_frame {
    const rf_header *h;                /* the FORWARD frame's header (its sequences) */
    const uint8_t *in, *out, *q;       /* payload received, payload sent on, drafts' distributions (or NULL) */
    size_t in_len, out_len, q_len;
} audit_frame;

typedef struct audit_report {
    bool match;
    int bad_frame;    /* first frame that differs (-1 when all match) */
    double max_diff;  /* largest relative difference of the compared floats */
    long frames, tokens;
    char what[512];   /* what differs, when !match */
} audit_report;

/* Replays sequence seq_id's share of frames[0..n) through a fresh stage on engine e (bound to the audited
 * stage's layers, n_ctx and wire as the node's) and compares. Frames without the sequence are skipped;
 * the first one that has it must start it (RF_SEQ_NEW). Returns 0 with rep filled (match or not), -1 when
 * the audit could not be run (malformed input: err says why). */
int audit_replay_seq(k3_engine *e, uint32_t n_ctx, int wire, uint64_t seq_id, const audit_frame *frames, int n,
                     double tol, audit_report *rep, rl_err *err);

#endif
