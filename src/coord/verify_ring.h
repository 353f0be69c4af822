/* verify_ring.h - the speculative verifier through the ring: one FORWARD per drafted block; every stage
 * keeps rollback copies for the block and rolls back the rejected part when the next frame arrives at an
 * earlier position; the last stage accepts and returns the committed tokens. Blocks can be pipelined
 * (submit/collect): several in flight, processed in order by every stage. */
#ifndef RINGLM_VERIFY_RING_H
#define RINGLM_VERIFY_RING_H

#include "coord.h"
#include "../speculate/spec_gen.h"

typedef struct spec_ring {
    ring_coord *rc;
    uint32_t chunk;
    uint64_t seq;
    frame_sampling smp;
    bool taps;       /* DSpark: ask the stages for the taps the ring was opened with (ring_opts.taps) */
    float *feat;     /* the rows of the last call (spec_verifier.features) */
    uint32_t n_feat, cap_feat;
    struct spec_ring_flight { /* blocks submitted and not collected, oldest first */
        uint64_t step;
        ring_seq_req rq;
        int gen;               /* the ring generation it was sent on (an earlier one's blocks are gone) */
        bool failed;           /* its submit failed (err kept in msg) */
        char msg[300];
        int32_t tokens[SPEC_MAX_DRAFT + 1]; /* kept to send it again on a re-formed ring */
        uint8_t q[SPEC_MAX_DRAFT * (4 + 64 * 8)];
        size_t q_len;
    } fl[SPEC_MAX_DEPTH];
    int n_fl;
    /* Recovery (docs/serve.md, "When a node fails"): a lost node re-forms the ring over the nodes left and
     * the sequence is rebuilt from its tokens: the prompt, then every committed output (hist), the last
     * stage's sampler taking those as its output again. */
    int32_t *hist;
    size_t n_hist, cap_hist, n_prompt;
    const smp_params *sp;
    bool ex[PLAN_MAX_NODES]; /* nodes left out so far */
    int gen, recoveries;
    bool broken;             /* the ring failed under a block that was stale anyway: re-form at the next one */
    bool dead;               /* recovery gave up (the ring is closed): every later collect fails */
    char broken_msg[300];
} spec_ring;

spec_verifier spec_verifier_ring(spec_ring *r);

#endif
