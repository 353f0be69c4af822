/* Folder src/exec/: one stage's execution: a layer range run on a batch of sequences' entries, with their
 * states, rollback copies, taps and last-stage sampling and verification. May include: base, model, text,
 * speculate, wire. (README "Layout"; tests/t_layout.sh checks both.)
 */
/* stage.h - what one stage of the ring computes for a FORWARD frame, apart from the network.
 *
 * A node runs every frame it receives through stage_run; an auditor (coord/audit.h) runs a copy of a
 * node's frames through its own stage to check what the node sent. Both must do exactly the same thing,
 * which is why this is one function: per-sequence state (created on FRAME_SEQ_NEW, rolled back when a frame
 * starts behind it after a partly accepted VERIFY block, kept as a checkpoint and returned to for a prompt
 * that shares its prefix), the layers, and on the last stage the sampling and the acceptance of drafted
 * blocks. Payload formats: wire/frame.h. */
#ifndef RINGLM_STAGE_H
#define RINGLM_STAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/err.h"
#include "../model/k3_ckpt.h"
#include "../model/k3_forward.h"
#include "../text/sampler.h"
#include "../wire/frame.h"

#define STAGE_BLOCK_MAX 32 /* tokens of one VERIFY block (last token + drafts) */

typedef struct stage_seq {
    bool used;
    uint64_t id;
    k3_state st;
    smp_sampler smp; /* last stage only */
    bool has_smp;
    gr_grammar *gram; /* constrained output (FRAME_SEQ_HAS_GRAMMAR): smp's grammar, owned */
    /* Last stage, after a VERIFY block: the sequence is valid up to valid_end and continues with next_tok.
     * A later VERIFY block that starts past valid_end, or at it with another token, was drafted assuming
     * more was accepted (pipelined speculation): it is stale and answered with 0 committed, not run. */
    bool has_commit;
    uint32_t valid_end;
    int32_t next_tok;
    /* The prompt cache (FRAME_SEQ_CKPT, FRAME_SEQ_RESTORE): its checkpoints, and on the last stage the token at
     * each position it has read (a sequence that begins again from a checkpoint gets them as its sampler's
     * penalty history). */
    k3_ckpts ck;
    int32_t *toks; /* [n_ctx], last stage, allocated with the first checkpoint */
} stage_seq;

typedef struct ring_stage {
    k3_engine *e;   /* bound to layers [e->a, e->b); not owned */
    uint32_t n_ctx; /* per-sequence context */
    int wire;       /* enum k3_wire_dtype of the boundary state it sends */
    const smp_vocab *vocab; /* last stage: the tokens' bytes, for constrained output (NULL: grammars refused); not owned */
    stage_seq seqs[FRAME_MAX_SEQS];
    /* The states of seqs[0 .. n_pool) are slots of one pool (k3_state_pool), made with the first of them: the
     * forward pass then runs their KDA recurrence and MLA attention as one op each, as a server's do, instead
     * of a few ops per sequence. n_pool is the ring's sequences at once (ASSIGN's n_seqs); more, and stand-ins,
     * get states of their own. */
    int n_pool;
    bool pool_ready;
    /* Blocks each sequence keeps for rollback: the coordinator's speculative blocks in flight (ASSIGN's
     * rollback_blocks), so that a node holds the copies it can need and no more; 0: K3_RB_BLOCKS. */
    int rb_blocks;
    /* Checkpoints each sequence keeps (ASSIGN's ctx_checkpoints; 0: FRAME_SEQ_CKPT is refused). The coordinator
     * and an auditor place them alike (k3_ckpt.h), so it must be the same number everywhere. */
    int max_ck;
    k3_state_pool pool;
    /* DSpark taps this stage computes (the listed layers it holds: a < layer <= b) for FRAME_SEQ_TAPS
     * sequences; after stage_run, tap_rows holds them, [tap][row][n_embd], n_tap_rows rows (node: FRAME_TAPS) */
    int n_taps;
    uint32_t taps[16];
    float *tap_rows;
    uint32_t n_tap_rows;
    /* After stage_run of a frame with FRAME_SEQ_ROUTES sequences, on a stage holding MoE layers: the ROUTES
     * payload (frame.h) for them, routes_len bytes (node: FRAME_ROUTES); NULL otherwise */
    uint8_t *routes;
    size_t routes_len;
} ring_stage;

void stage_init(ring_stage *s, k3_engine *e, uint32_t n_ctx, int n_pool, int wire);
void stage_free(ring_stage *s); /* frees every sequence's state */
/* Keeps, of the ring's tap layers, those this stage computes. */
void stage_set_taps(ring_stage *s, const uint32_t *layers, int n);
void stage_forget(ring_stage *s, uint64_t seq_id);

/* Runs one frame: in/in_len is the FORWARD payload (int32 tokens of every sequence, then on a stage with
 * a > 0 the boundary state), q/q_len the drafts' distributions part (FRAME_SEQ_HAS_Q; may be NULL). On
 * success *out (malloc'ed, *out_len bytes) is the next stage's payload (the tokens again, then the
 * boundary state leaving this stage), or on the last stage the RESULT payload. On failure err says what
 * is wrong with the frame and no sequence has advanced (except a sequence the frame created). */
int stage_run(ring_stage *s, const frame_header *h, const uint8_t *in, size_t in_len, const uint8_t *q, size_t q_len,
              uint8_t **out, size_t *out_len, rl_err *err);

/* Times frames of n_tok[0..n) tokens of one scratch sequence (id STAGE_SCRATCH_ID) through this stage, after
 * a one-token frame that starts it (the first run of a graph pays its allocation, so it is not timed); the
 * sequence is forgotten after. The frames are what the ring sends: tokens (and on a later stage a boundary
 * state of small values), the last stage sampling greedily. sec[i]: wall seconds of frame i. Every n_tok[i]
 * must be at least 1 and their sum below n_ctx. (node.c: the node's own measure of its stage, docs/plan.md.) */
#define STAGE_SCRATCH_ID UINT64_MAX
int stage_time(ring_stage *s, const uint32_t *n_tok, int n, double *sec, rl_err *err);

/* Replays what a node ran for one sequence (coord/audit.h): the whole frame runs as stage_run would run
 * it, with seq_id on its state here and every other sequence of the frame on a stand-in - a fresh state
 * holding just its tokens, at position 0, dropped after the frame. Why the whole frame and not the
 * sequence alone: ggml's CPU kernels pick their path from the batch's shape (a matmul of one column takes
 * the dot kernel, of two or more llamafile's GEMM; repacked weights take their GEMM four columns at a time
 * and the GEMV for the rest; any VERIFY block gives the whole batch step kernels; the output matmul runs
 * over every sequence's logit rows), and the paths round differently. On a MoE a last-bit difference can
 * swap a near-tied expert, so a sequence recomputed alone can differ from its batch by far more than
 * rounding, and an honest node would be found faulty. Every op of the graph computes a sequence's tokens
 * from its own tokens and state only, so with the node's batch shape the replay gives the node's bits.
 * stale (last stage; NULL: none): per frame sequence, whether the node found it a stale VERIFY block and
 * did not run it (docs: stage_seq.has_commit) - a stand-in has no history to tell. The output is the
 * frame's whole payload, as stage_run's; only seq_id's share of it means anything. */
int stage_replay(ring_stage *s, const frame_header *h, const uint8_t *in, size_t in_len, const uint8_t *q, size_t q_len,
                 uint64_t seq_id, const uint8_t *stale, uint8_t **out, size_t *out_len, rl_err *err);

#endif
