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
    rf_sampling smp;
    bool taps;       /* DSpark: ask the stages for the taps the ring was opened with (ring_opts.taps) */
    float *feat;     /* the rows of the last call (spec_verifier.features) */
    uint32_t n_feat, cap_feat;
    struct spec_ring_flight { /* blocks submitted and not collected, oldest first */
        uint64_t step;
        ring_seq_req rq;
    } fl[SPEC_MAX_DEPTH];
    int n_fl;
} spec_ring;

spec_verifier spec_verifier_ring(spec_ring *r);

#endif
