/* accept.h - verifying a drafted block: which drafted tokens the target keeps.
 *
 * The target ran [last, d1 .. dk] and has logits for each of those k+1 positions. Position i predicts the
 * token after it, so d(i+1) is judged by row i:
 *   greedy (temperature <= 0): keep d(i+1) while it equals the target's own choice; on the first
 *     mismatch return the target's token instead; if all k match, add the target's next token (the
 *     bonus). Output equals plain greedy decoding, always.
 *   sampling: speculative sampling. Keep d with probability min(1, p(d)/q(d)), where p is the target's
 *     final distribution (after penalties, top-k/p, min-p, temperature: exactly what plain sampling would
 *     draw from) and q the drafter's; on rejection draw from max(0, p - q) renormalized. A drafter
 *     without a distribution (n-gram) has q = 1 on its token. The output has the target's distribution.
 * With a grammar (constrained output, sampler.h) p is what constrained sampling draws from (smp_dist), so
 * a draft the grammar refuses is never kept, and the sampler's grammar follows the committed tokens.
 * (Callers cut such drafts before verification - smp_grammar_prefix - rather than pay to run them.)
 * Penalty history follows the inputs: block[i] is accepted into the sampler's history just before row i is
 * judged (so the history is what plain decoding would have at that position); the returned correction or
 * bonus token is NOT accepted, since it is the next block's first input. */
#ifndef RINGLM_ACCEPT_H
#define RINGLM_ACCEPT_H

#include <stdint.h>

#include "../text/sampler.h"

/* The drafter's distribution at one position: candidates and their probabilities (sum <= 1). */
typedef struct spec_q {
    int n;
    const int32_t *id;
    const float *p;
} spec_q;

/* block: the k+1 tokens that were run ([last, d1..dk]); logits: their k+1 rows of n_vocab. qs: k entries or
 * NULL (deterministic drafter). out: room for k+1 tokens; returns the number committed (accepted drafts
 * followed by the correction or bonus token). */
int spec_accept(smp_sampler *s, const float *logits, int32_t n_vocab, const int32_t *block, int k, const spec_q *qs,
                int32_t *out);

#endif
