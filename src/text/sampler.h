/* sampler.h - picking the next token from a row of logits.
 *
 * One fixed chain, in the order of llama.cpp's default sampler chain (common/common.h, minus the samplers
 * ringlm does not have):
 *
 *   0. logit bias  logit[id] += bias for each listed token (-inf bans it); first, as common_sampler puts
 *                 llama_sampler_logit_bias ahead of the chain, so greedy decoding sees it too
 *   1. penalties  over the last penalty_last_n accepted tokens, a token seen c > 0 times gets
 *                 logit = logit <= 0 ? logit * repeat_penalty : logit / repeat_penalty,
 *                 then logit -= c * frequency_penalty + presence_penalty       (llama_sampler_penalties)
 *   2. top-k      keep the k highest logits (k <= 0: off)
 *   3. top-p      keep the smallest prefix of the sorted tokens whose softmax mass reaches p (p >= 1: off)
 *   4. min-p      keep tokens with p_i >= min_p * p_max, i.e. logit >= max + ln(min_p) (min_p <= 0: off)
 *   5. temperature  divide the logits by T; T <= 0 keeps only the highest (greedy)
 *   6. sample     softmax over what is left and draw with the sampler's own RNG
 *
 * So top-p and min-p look at the distribution before temperature, as in llama.cpp. Each filter keeps at
 * least one token. Ties are broken towards the lower token id, so results never depend on sort stability.
 * NaN logits count as -inf. The RNG (xoshiro256** seeded by splitmix64) lives in the sampler: the same
 * seed and the same inputs give the same tokens; nothing is global. It is keyed by output position: the
 * draws made for the k-th generated token come from a stream seeded by (seed, k), so a sampler rebuilt
 * from a sequence's tokens (a ring re-formed after a node loss: smp_take over what was generated) draws
 * on exactly as the lost one would have. It is not llama.cpp's mt19937, so
 * sampled (non-greedy) tokens are not expected to equal llama.cpp's. */
#ifndef RINGLM_SAMPLER_H
#define RINGLM_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "../base/err.h"
#include "grammar.h"

/* One token's additive logit bias (OpenAI's logit_bias, llama.cpp's --logit-bias); -INFINITY bans it. */
typedef struct smp_bias {
    int32_t id;
    float bias;
} smp_bias;

#define SMP_MAX_BIAS 4096 /* listed tokens per sampler (OpenAI allows 300) */

/* Each token's bytes and whether it ends generation: what constrained sampling (smp_params.grammar) needs to
 * know of the vocabulary (tok_vocab_new builds it). */
typedef struct smp_vocab {
    int32_t n;
    const char *const *piece;
    const uint32_t *len;
    const uint8_t *eog;
} smp_vocab;

typedef struct smp_params {
    uint64_t seed;
    float temperature;       /* <= 0: greedy */
    int32_t top_k;           /* <= 0: off */
    float top_p;             /* >= 1: off */
    float min_p;             /* <= 0: off */
    float repeat_penalty;    /* 1: off */
    float frequency_penalty; /* 0: off */
    float presence_penalty;  /* 0: off */
    int32_t penalty_last_n;  /* how many recent accepted tokens the penalties see; 0: off; -1: all of them */
    const smp_bias *bias;    /* n_bias entries, not owned: smp_init copies them (a token listed twice: both add) */
    int32_t n_bias;
    /* The output must be a sentence of this grammar (structured output: text/json_schema.h builds them;
     * NULL: free): every sampled token must keep the text a prefix of one, generation may end only when
     * it is whole, and no token may leave a shortest completion longer than the tokens left in the budget,
     * so it is whole in time. Not owned: must outlive the sampler. */
    const gr_grammar *grammar;
    int32_t budget;          /* grammar: tokens it may sample at most (max_tokens); <= 0: no limit */
    const smp_vocab *vocab;  /* grammar: the tokens' bytes (not owned: must outlive the sampler) */
} smp_params;

typedef struct smp_cand {
    int32_t id;
    float logit;
    float p;
} smp_cand;

typedef struct smp_sampler {
    smp_params p;
    int32_t n_vocab;
    uint64_t rng[4];
    int32_t *hist;     /* recent accepted tokens: a ring of penalty_last_n, or everything for -1 */
    size_t hist_n, hist_cap, hist_head;
    int32_t *count;    /* [n_vocab] occurrences of each token in hist */
    smp_cand *cand;    /* [n_vocab] scratch */
    smp_bias *bias;    /* the sampler's own copy of p.bias (p.bias points to it) */
    gr_state gs;       /* grammar: the parses of the text sampled so far */
    gr_state gtry;     /* grammar: scratch, gs with a candidate token fed */
    int32_t n_gen;     /* grammar: tokens sampled so far */
    float *masked;     /* grammar: [n_vocab] scratch, the logits with what the grammar refuses at -inf */
    smp_cand *cand2;   /* grammar: [n_vocab] scratch (smp_dist) */
} smp_sampler;

/* llama.cpp's defaults: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, no penalties (last_n 64). */
smp_params smp_params_default(uint64_t seed);

/* Fails on a bad parameter, naming it: a bias for a token id outside [0, n_vocab), or a NaN / +inf bias. */
int smp_init(smp_sampler *s, const smp_params *p, int32_t n_vocab, rl_err *err);
void smp_free(smp_sampler *s);
/* Forgets the history and restarts the RNG from the seed. */
void smp_reset(smp_sampler *s);
/* Adds a token to the penalty history (the caller decides whether prompt tokens count). */
void smp_accept(smp_sampler *s, int32_t token);
/* Adds src's penalty history to dst's, oldest first (a sequence forked from src's: its prompt counts). */
void smp_accept_history(smp_sampler *dst, const smp_sampler *src);
/* Picks a token from logits[n_vocab] (left unchanged). Does not accept it. With p.grammar, the token is the
 * next of the output (the grammar moves on, as smp_take). */
int32_t smp_sample(smp_sampler *s, const float *logits);

/* The distribution smp_sample draws from at this row, the grammar's masking included: *n candidates in
 * s->cand, probabilities in .p summing to 1 (speculative acceptance judges drafts against it; a token the
 * grammar refuses has none). Takes nothing. */
size_t smp_dist(smp_sampler *s, const float *logits);
/* Token id is the output's next although smp_sample did not pick it (an accepted draft, a residual draw,
 * or a generated token replayed into a rebuilt sampler): the grammar, the budget and the RNG's position
 * move on. */
void smp_take(smp_sampler *s, int32_t id);
/* How many of tok[0 .. n) constrained output (p->grammar) could take in order, from state st after n_gen
 * sampled tokens: the first one the grammar or the budget refuses and everything after it go, and nothing
 * follows an end-of-generation token. Without a grammar, n. scratch: a state of the caller's. Drafts are cut
 * with it before they are verified. */
int smp_grammar_prefix(const smp_params *p, const gr_state *st, int32_t n_gen, const int32_t *tok, int n,
                       gr_state *scratch);

/* A token's log-probability and the most likely tokens' (OpenAI's logprobs / top_logprobs, at most 20). */
#define SMP_TOP_LOGPROBS 20
typedef struct smp_logprob {
    int32_t id;
    float logprob;
    int32_t top_id[SMP_TOP_LOGPROBS]; /* most likely first; equal logits: lower id first */
    float top_logprob[SMP_TOP_LOGPROBS];
} smp_logprob;

/* The model's log-probabilities - the log-softmax of the raw logits, before bias, penalties, filters and
 * temperature, as llama-server (post_sampling_probs off) and OpenAI report them - of token id and of the
 * SMP_TOP_LOGPROBS most likely tokens (fewer when the vocabulary is smaller: the rest are id -1). NaN
 * logits count as -inf. */
void smp_logprobs(const float *logits, int32_t n_vocab, int32_t id, smp_logprob *out);

/* A uniform draw in [0, 1) from the sampler's own RNG (speculative acceptance draws from the same
 * stream, so a seed still fixes the whole output). */
double smp_uniform(smp_sampler *s);

/* Runs steps 1-5 only: *n_out candidates survive in s->cand (sorted by logit, highest first, unless no
 * step needed an order), with logits as modified. For tests and for inspecting a distribution. */
void smp_filter(smp_sampler *s, const float *logits, size_t *n_out);

#endif
