/* audit.h - audits: recompute a stage's layers for one sequence and compare with what its node sent.
 *
 * A receipt says what a node claims to have computed; an audit checks the claim. The auditor (the
 * coordinator, which holds the model file) takes the frames a stage ran for one sequence - the payloads
 * the node received and sent, whose hashes the node signed in its receipts - and runs them, in order from
 * the sequence's first token, through its own copy of the stage's layers (exec/stage.h: stage_replay, the
 * same code a node runs). Per-sequence state (MLA caches, KDA state) depends on every earlier frame, which
 * is why a sequence is replayed from its start rather than one step in isolation; and each frame runs
 * whole, the other sequences on stand-ins, because the kernels round by the batch's shape (stage.h).
 *
 * Compared per frame, for that sequence only: the token ids passed on (exactly), the boundary state sent
 * on (h and the banked checkpoints, within tol relative to the largest magnitude of that token's vector:
 * 0 with the node's kernels, more between machines and thread counts), and on the last stage the
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

struct smp_vocab;

typedef struct audit_frame {
    const frame_header *h;                /* the FORWARD frame's header (its sequences) */
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
 * stage's layers, n_ctx, wire and checkpoints per sequence as the node's) and compares. vocab: the last stage's (ring_stage.vocab),
 * for sequences with constrained output; NULL elsewhere. Frames without the sequence are skipped;
 * the first one that has it must start it (FRAME_SEQ_NEW). Returns 0 with rep filled (match or not), -1 when
 * the audit could not be run (malformed input: err says why). */
int audit_replay_seq(k3_engine *e, uint32_t n_ctx, int wire, int n_ckpt, const struct smp_vocab *vocab, uint64_t seq_id,
                     const audit_frame *frames, int n, double tol, audit_report *rep, rl_err *err);

/* Which finished sequences are audited, and at which stage: seeded draws (splitmix64), so a run's audits
 * are reproducible from its audit seed. The queue holds the sequences drawn and not yet audited. */
typedef struct audit_draws {
    uint64_t rng;
    uint64_t queue[256];
    int n;
} audit_draws;

void audit_draws_init(audit_draws *d, uint64_t seed);
/* Queues each finished sequence with probability rate; returns how many were drawn but found the queue full. */
int audit_draws_finished(audit_draws *d, double rate, const uint64_t *ids, int n);
/* Takes the oldest queued sequence and draws the stage (of n_stages) it is audited at; false if none waits. */
bool audit_draws_next(audit_draws *d, int n_stages, uint64_t *seq, int *stage);

#endif
