/* backend_ring.h - the scheduler's backend on a ring of nodes (`ringlm serve --ring`).
 *
 * Each scheduler step becomes ONE FORWARD frame through the ring carrying every sequence of the batch (a
 * decode token or a prompt chunk), submitted with ring_submit and collected with ring_collect. The last
 * stage samples: a sequence's sampling parameters travel with its first frame (RF_SEQ_NEW), prompt chunks
 * that need no token go as RF_SEQ_NO_SAMPLE, and the token the last stage returns per sequence is the
 * step's sampled token. Scheduler slots map to ring sequence ids that are never reused (one fresh id per
 * request, from a counter of this backend that survives re-opening the ring), so a frame still in flight
 * can never be mistaken for a later request's. Finished sequences are freed on the nodes (ring_free_seqs).
 *
 * Failures. A step that fails (a node died or answered ERROR; the coordinator's message names the node)
 * marks the ring broken and that node down, and fails the step with SCH_RING_UNAVAILABLE. The next step
 * re-opens the ring: a quick TCP probe of every node in ring.conf first (a node that refuses the
 * connection fails the step at once, without ring_open's 5 s wait), then ring_close + ring_open (re-plan,
 * re-assign; every node must answer). Sequences that had not yet sampled anything (prefilling, including
 * those that were not in the failed batch) are replayed on the new ring from the tokens they were given,
 * which is exact; a failed batch made only of such sequences is retried once on a re-opened ring, so a
 * node restarted while the server sat idle costs no request. Sequences that had produced tokens fail.
 *
 * Everything runs on the scheduler thread (after sch_backend_ring returns), as the contract requires. */
#ifndef RINGLM_BACKEND_RING_H
#define RINGLM_BACKEND_RING_H

#include "../ring/coord.h"
#include "scheduler.h"

/* What a failed step returns when the ring is broken or cannot be re-opened (a ring error, not a bug), so
 * that the server answers these requests 503 (docs/serve.md); any other failure returns -1. The value is
 * the contract's "model unreachable" return (SCH_STEP_UNAVAILABLE, -2); a scheduler that does not tell it
 * apart treats it as any failure (500). */
#define SCH_RING_UNAVAILABLE SCH_STEP_UNAVAILABLE

typedef struct sch_ring_config {
    const ring_conf *conf;   /* the nodes; all four pointers must outlive the backend */
    const rk_identity *id;   /* the coordinator's key */
    const mf_model *m;       /* the model file (hash, and layers streamed to nodes that lack it) */
    const k3_hparams *hp;
    ring_opts opts;          /* n_ctx is the per-sequence context */
    int n_slots;
} sch_ring_config;

/* Opens the ring (plans it, assigns every node its layers and waits until all are loaded; prints the plan
 * unless opts.quiet) and makes the backend. Fails with the coordinator's message when the ring cannot be
 * opened. */
int sch_backend_ring(sch_backend *be, const sch_ring_config *cfg, rl_err *err);

#endif
