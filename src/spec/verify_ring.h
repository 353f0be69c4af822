/* verify_ring.h - the speculative verifier through the ring: one FORWARD per drafted block; every stage
 * keeps rollback copies for the block and rolls back the rejected part when the next frame arrives at an
 * earlier position; the last stage accepts and returns the committed tokens. */
#ifndef RINGLM_VERIFY_RING_H
#define RINGLM_VERIFY_RING_H

#include "../ring/coord.h"
#include "spec_gen.h"

typedef struct spec_ring {
    ring_coord *rc;
    uint32_t chunk;
    uint64_t seq;
    rf_sampling smp;
} spec_ring;

spec_verifier spec_verifier_ring(spec_ring *r);

#endif
