/* backend_ring.h - the scheduler's backend on a ring of nodes (`ringlm serve --ring`).
 *
 * Each scheduler step becomes ONE FORWARD frame through the ring carrying every sequence of the batch (a
 * decode token or a prompt chunk), submitted with ring_submit and collected with ring_collect. The last
 * stage samples: a sequence's sampling parameters travel with its first frame (FRAME_SEQ_NEW), prompt chunks
 * that need no token go as FRAME_SEQ_NO_SAMPLE, and the token the last stage returns per sequence is the
 * step's sampled token. Scheduler slots map to ring sequence ids that are never reused (a fresh id per
 * request, from a counter of this backend that survives re-opening the ring; only a request that resumes a
 * cached prefix continues its slot's last sequence, below). Steps are collected before the next is sent, so
 * no frame is in flight when a sequence changes hands. Finished sequences are freed on the nodes
 * (ring_free_seqs), with the prompt cache when their slot takes another conversation.
 *
 * Failures. A step that fails (a node died, went silent or answered ERROR; the coordinator's message names
 * the node) marks the ring broken and that node lost, and the step runs again on a re-formed ring: a quick
 * TCP probe of every ring.conf node, then ring_open over the nodes left (survivors and standbys; a node
 * that fails the open is left out and the open tried again). Every sequence is rebuilt there from the tokens
 * it holds (kept per slot): its prompt as a prefill, then what it generated with step kernels, the last
 * stage's sampler resuming (FRAME_SEQ_RESUME). Only when no plan fits does the step fail, with
 * SCH_RING_UNAVAILABLE. Nodes that come back are taken in while the server is idle (ring_idle_probe).
 *
 * Prompt cache (opts.ctx_checkpoints > 0; docs/serve.md). A finished sequence stays on the ring while its slot is
 * free: every stage keeps its layers' state, and checkpoints of their KDA state where the scheduler asks
 * (FRAME_SEQ_CKPT: prompt ends, every --checkpoint-every tokens). The coordinator keeps the positions of
 * those checkpoints (model/k3_ckpt.h places them as the stages do) and the tokens the sequence holds, so a
 * request whose prompt shares a prefix with them continues the same ring sequence from the latest checkpoint
 * in that prefix (FRAME_SEQ_NEW | FRAME_SEQ_RESTORE at that position) and sends only the tokens after it. A
 * ring re-formed since holds nothing of it: the request then sends its whole prompt (a miss, never a failure).
 * While the server is idle, what a sequence generated is read again as prompt pieces from its prompt's
 * checkpoint (as on one machine), so a next turn reads only its new tokens.
 *
 * Everything runs on the scheduler thread (after sch_backend_ring returns), as the contract requires. */
#ifndef RINGLM_BACKEND_RING_H
#define RINGLM_BACKEND_RING_H

#include "../coord/coord.h"
#include "scheduler.h"

/* What a failed step returns when the ring is broken or cannot be re-opened (a ring error, not a bug), so
 * that the server answers these requests 503 (docs/serve.md); any other failure returns -1. The value is
 * the contract's "model unreachable" return (SCH_STEP_UNAVAILABLE, -2); a scheduler that does not tell it
 * apart treats it as any failure (500). */
#define SCH_RING_UNAVAILABLE SCH_STEP_UNAVAILABLE

typedef struct sch_ring_config {
    const ring_conf *conf;   /* the nodes; all four pointers must outlive the backend */
    const keys_identity *id;   /* the coordinator's key */
    const mf_model *m;       /* the model file (hash, and layers streamed to nodes that lack it) */
    const k3_hparams *hp;
    ring_opts opts;          /* n_ctx is the per-sequence context; opts.ctx_checkpoints > 0 turns the prompt cache on */
    int n_slots;
    uint32_t reread_chunk;   /* prompt cache: tokens per idle re-read piece (0: 256) */
    bool exact;              /* prompt cache: a resumed prompt gives a fresh read's bits (docs/numerics.md) */
} sch_ring_config;

/* Opens the ring (plans it, assigns every node its layers and waits until all are loaded; prints the plan
 * unless opts.quiet) and makes the backend. Fails with the coordinator's message when the ring cannot be
 * opened. */
int sch_backend_ring(sch_backend *be, const sch_ring_config *cfg, rl_err *err);

#endif
