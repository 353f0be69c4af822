/* sampler.c - the sampling chain of sampler.h. */
#include "sampler.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* ---- RNG: xoshiro256**, seeded through splitmix64 so that any seed (0 included) gives a good state ---- */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static uint64_t rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t rng_next(uint64_t s[4]) {
    uint64_t r = rotl64(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl64(s[3], 45);
    return r;
}

static double rng_uniform(uint64_t s[4]) { return (double)(rng_next(s) >> 11) * 0x1.0p-53; } /* [0, 1) */

/* The stream for output position k (k = 0: the seed's own). */
static void rng_seed_at(smp_sampler *s, uint64_t k) {
    uint64_t x = s->p.seed ^ (k * 0xD1B54A32D192ED03ULL);
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&x);
}

static void rng_seed(smp_sampler *s) { rng_seed_at(s, 0); }

/* ---- setup ---- */

smp_params smp_params_default(uint64_t seed) {
    return (smp_params){.seed = seed, .temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f,
                        .repeat_penalty = 1.0f, .frequency_penalty = 0.0f, .presence_penalty = 0.0f,
                        .penalty_last_n = 64};
}

int smp_init(smp_sampler *s, const smp_params *p, int32_t n_vocab, rl_err *err) {
    memset(s, 0, sizeof *s);
    if (n_vocab <= 0) return rl_errf(err, "sampler: vocabulary size %d", n_vocab);
    if (p->penalty_last_n < -1) return rl_errf(err, "sampler: penalty_last_n %d (use -1 for all)", p->penalty_last_n);
    if (!(p->repeat_penalty > 0)) return rl_errf(err, "sampler: repeat_penalty %g must be > 0", p->repeat_penalty);
    if (isnan(p->temperature) || isnan(p->top_p) || isnan(p->min_p) || isnan(p->frequency_penalty) ||
        isnan(p->presence_penalty))
        return rl_errf(err, "sampler: a parameter is NaN");
    if (p->n_bias < 0 || p->n_bias > SMP_MAX_BIAS || (p->n_bias > 0 && !p->bias))
        return rl_errf(err, "sampler: %d logit biases (at most %d)", p->n_bias, SMP_MAX_BIAS);
    for (int32_t i = 0; i < p->n_bias; i++) {
        if (p->bias[i].id < 0 || p->bias[i].id >= n_vocab)
            return rl_errf(err, "sampler: logit bias for token %d, outside the vocabulary of %d", p->bias[i].id, n_vocab);
        if (isnan(p->bias[i].bias) || p->bias[i].bias == INFINITY)
            return rl_errf(err, "sampler: logit bias %g for token %d (a finite number, or -inf to ban it)",
                           p->bias[i].bias, p->bias[i].id);
    }
    s->p = *p;
    s->n_vocab = n_vocab;
    if (p->n_bias > 0) {
        if (!(s->bias = malloc((size_t)p->n_bias * sizeof *s->bias))) return rl_errf(err, "sampler: out of memory");
        memcpy(s->bias, p->bias, (size_t)p->n_bias * sizeof *s->bias);
    }
    s->p.bias = s->bias;
    if (p->grammar) {
        if (!p->vocab || p->vocab->n != n_vocab) {
            smp_free(s);
            return rl_errf(err, "sampler: constrained output needs the vocabulary's %d tokens", n_vocab);
        }
        if (gr_state_init(p->grammar, &s->gs) || !(s->masked = malloc((size_t)n_vocab * sizeof *s->masked)) ||
            !(s->cand2 = malloc((size_t)n_vocab * sizeof *s->cand2))) {
            smp_free(s);
            return rl_errf(err, "sampler: out of memory");
        }
    }
    s->count = calloc((size_t)n_vocab, sizeof *s->count);
    s->cand = malloc((size_t)n_vocab * sizeof *s->cand);
    if (p->penalty_last_n > 0) {
        s->hist_cap = (size_t)p->penalty_last_n;
        s->hist = malloc(s->hist_cap * sizeof *s->hist);
    }
    if (!s->count || !s->cand || (p->penalty_last_n > 0 && !s->hist)) {
        smp_free(s);
        return rl_errf(err, "sampler: out of memory for %d tokens", n_vocab);
    }
    rng_seed(s);
    return 0;
}

void smp_free(smp_sampler *s) {
    free(s->hist);
    free(s->count);
    free(s->cand);
    free(s->bias);
    free(s->masked);
    free(s->cand2);
    gr_state_free(&s->gs);
    gr_state_free(&s->gtry);
    memset(s, 0, sizeof *s);
}

void smp_reset(smp_sampler *s) {
    memset(s->count, 0, (size_t)s->n_vocab * sizeof *s->count);
    s->hist_n = s->hist_head = 0;
    rng_seed(s);
    if (s->p.grammar) {
        gr_state_free(&s->gs);
        gr_state_init(s->p.grammar, &s->gs); /* (out of memory: no parse alive, so the free choice stands) */
    }
    s->n_gen = 0;
}

void smp_accept_history(smp_sampler *dst, const smp_sampler *src) {
    for (size_t i = 0; i < src->hist_n; i++) smp_accept(dst, src->hist[(src->hist_head + i) % src->hist_cap]);
}

void smp_accept(smp_sampler *s, int32_t tok) {
    if (s->p.penalty_last_n == 0 || tok < 0 || tok >= s->n_vocab) return;
    if (s->p.penalty_last_n < 0) { /* unbounded history */
        if (s->hist_n == s->hist_cap) {
            size_t c = s->hist_cap ? 2 * s->hist_cap : 256;
            int32_t *nh = realloc(s->hist, c * sizeof *nh);
            if (!nh) return; /* keep counting what fits; the window only gets shorter */
            s->hist = nh;
            s->hist_cap = c;
        }
        s->hist[s->hist_n++] = tok;
        s->count[tok]++;
        return;
    }
    if (s->hist_n == s->hist_cap) { /* full ring: the oldest token leaves the window */
        s->count[s->hist[s->hist_head]]--;
        s->hist[s->hist_head] = tok;
        s->hist_head = (s->hist_head + 1) % s->hist_cap;
    } else {
        s->hist[(s->hist_head + s->hist_n) % s->hist_cap] = tok;
        s->hist_n++;
    }
    s->count[tok]++;
}

/* ---- the chain ---- */

/* higher logit first; equal logits: lower id first */
static int cand_before(const smp_cand *a, const smp_cand *b) {
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static int cand_cmp(const void *x, const void *y) {
    const smp_cand *a = x, *b = y;
    return cand_before(a, b) ? -1 : cand_before(b, a) ? 1 : 0;
}

/* Moves the k best candidates to the front of c[0..n) (in no particular order): quickselect with Hoare's
 * partition. cand_before is a strict total order (ids are unique), so every round makes progress. */
static void select_top(smp_cand *c, size_t n, size_t k) {
    size_t lo = 0, hi = n; /* the k best of [lo, hi) still have to reach the front of it */
    while (k > 0 && k < hi - lo) {
        smp_cand pivot = c[lo + (hi - 1 - lo) / 2]; /* lower middle: the split point never lands on hi */
        size_t i = lo, j = hi - 1;
        for (;;) {
            while (cand_before(&c[i], &pivot)) i++;
            while (cand_before(&pivot, &c[j])) j--;
            if (i >= j) break;
            smp_cand t = c[i];
            c[i] = c[j];
            c[j] = t;
            i++;
            j--;
        }
        size_t left = j + 1 - lo; /* [lo, j] are all at least as good as [j + 1, hi) */
        if (k < left) {
            hi = j + 1;
        } else if (k > left) {
            k -= left;
            lo = j + 1;
        } else {
            break;
        }
    }
}

static bool penalties_on(const smp_params *p) {
    return p->penalty_last_n != 0 &&
           !(p->repeat_penalty == 1.0f && p->frequency_penalty == 0.0f && p->presence_penalty == 0.0f);
}

/* softmax of c[0..n) into c[].p; c sorted or not */
static void softmax(smp_cand *c, size_t n) {
    float mx = -INFINITY;
    for (size_t i = 0; i < n; i++) mx = c[i].logit > mx ? c[i].logit : mx;
    double sum = 0;
    for (size_t i = 0; i < n; i++) {
        c[i].p = mx == -INFINITY ? 1.0f : expf(c[i].logit - mx);
        sum += c[i].p;
    }
    for (size_t i = 0; i < n; i++) c[i].p = (float)(c[i].p / sum);
}

void smp_filter(smp_sampler *s, const float *logits, size_t *n_out) {
    const smp_params *p = &s->p;
    smp_cand *c = s->cand;
    size_t n = (size_t)s->n_vocab;
    for (size_t i = 0; i < n; i++) c[i] = (smp_cand){(int32_t)i, isnan(logits[i]) ? -INFINITY : logits[i], 0};

    /* 0. logit bias */
    for (int32_t i = 0; i < p->n_bias; i++) c[p->bias[i].id].logit += p->bias[i].bias;
    /* 1. penalties */
    if (penalties_on(p)) {
        for (size_t i = 0; i < n; i++) {
            int32_t k = s->count[i];
            if (!k) continue;
            c[i].logit = c[i].logit <= 0 ? c[i].logit * p->repeat_penalty : c[i].logit / p->repeat_penalty;
            c[i].logit -= (float)k * p->frequency_penalty + p->presence_penalty;
        }
    }
    /* 2. top-k */
    if (p->top_k > 0 && (size_t)p->top_k < n) {
        select_top(c, n, (size_t)p->top_k);
        n = (size_t)p->top_k;
    }
    if (p->top_k > 0 || p->top_p < 1.0f) {
        qsort(c, n, sizeof *c, cand_cmp);
    }
    /* 3. top-p */
    if (p->top_p < 1.0f) {
        softmax(c, n);
        float cum = 0;
        for (size_t i = 0; i < n; i++) {
            cum += c[i].p;
            if (cum >= p->top_p) {
                n = i + 1;
                break;
            }
        }
    }
    /* 4. min-p */
    if (p->min_p > 0.0f && n > 1) {
        float mx = -INFINITY;
        for (size_t i = 0; i < n; i++) mx = c[i].logit > mx ? c[i].logit : mx;
        float thr = mx + logf(p->min_p);
        size_t m = 0;
        for (size_t i = 0; i < n; i++)
            if (c[i].logit >= thr) c[m++] = c[i]; /* keeps the order */
        n = m ? m : 1;
    }
    /* 5. temperature */
    if (p->temperature <= 0.0f) {
        size_t best = 0;
        for (size_t i = 1; i < n; i++)
            if (cand_before(&c[i], &c[best])) best = i;
        c[0] = c[best];
        n = 1;
    } else if (p->temperature != 1.0f) {
        for (size_t i = 0; i < n; i++) c[i].logit /= p->temperature;
    }
    *n_out = n;
}

static int32_t smp_sample_free(smp_sampler *s, const float *logits);

/* Feeds token id to a constrained state in place: may it come next? It must keep the text a prefix of a
 * sentence and, with a budget, leave the shortest completion no longer than the tokens left after it
 * (left < 0: no budget): every completion byte is a token of its own at worst, so the sentence can always
 * be finished in time. End of generation only once the sentence is whole. On false st is spent. */
static bool gram_step(const smp_params *p, gr_state *st, int32_t id, int64_t left) {
    const smp_vocab *v = p->vocab;
    if (v->eog[id]) return gr_done(p->grammar, st);
    uint32_t n = v->len[id];
    if (n == 0 || !gr_feed(p->grammar, st, v->piece[id], n)) return false;
    return left < 0 || (int64_t)gr_close_len(p->grammar, st) <= left;
}

/* The budget left after the next token, or -1 for none. */
static int64_t gram_left(const smp_params *p, int32_t n_gen) {
    return p->budget > 0 ? (int64_t)p->budget - n_gen - 1 : -1;
}

static bool smp_gram_ok(smp_sampler *s, int32_t id, int64_t left) {
    if (gr_state_copy(&s->gtry, &s->gs)) return false;
    return gram_step(&s->p, &s->gtry, id, left);
}

/* Masks what the grammar refuses (s->masked); false when it allows nothing (a vocabulary without the bytes
 * needed: then the free choice stands). A budget no token can keep (max_tokens below the shortest whole
 * sentence: a schema after a reasoning section, say) is dropped, and *left says so: the output stays in
 * the grammar and ends "length" unfinished, rather than running free. */
static bool smp_gram_mask(smp_sampler *s, const float *logits, int64_t *left) {
    for (int pass = 0; pass < 2; pass++) {
        bool any = false;
        for (int32_t i = 0; i < s->n_vocab; i++) {
            bool ok = smp_gram_ok(s, i, *left);
            s->masked[i] = ok ? logits[i] : -INFINITY;
            any = any || ok;
        }
        if (any || *left < 0) return any;
        *left = -1;
    }
    return false;
}

int32_t smp_sample(smp_sampler *s, const float *logits) {
    if (!s->p.grammar) {
        int32_t id = smp_sample_free(s, logits);
        smp_take(s, id);
        return id;
    }
    int64_t left = gram_left(&s->p, s->n_gen); /* after this one */
    /* Sample as if free; only when the grammar refuses that token, sample again from the logits it allows
     * (as llama.cpp's common_sampler does: most tokens pass, and a vocabulary scan per token is costly).
     * smp_dist describes the distribution this draws from. */
    int32_t id = smp_sample_free(s, logits);
    if (!smp_gram_ok(s, id, left)) {
        const int64_t asked = left;
        /* with the budget dropped the free draw is judged again, as smp_dist counts it */
        if (smp_gram_mask(s, logits, &left) && (left == asked || !smp_gram_ok(s, id, left)))
            id = smp_sample_free(s, s->masked);
    }
    smp_take(s, id);
    return id;
}

void smp_take(smp_sampler *s, int32_t id) {
    if (s->p.grammar && id >= 0 && id < s->n_vocab && !s->p.vocab->eog[id]) {
        gr_feed(s->p.grammar, &s->gs, s->p.vocab->piece[id], s->p.vocab->len[id]);
    }
    s->n_gen++;
    rng_seed_at(s, (uint64_t)s->n_gen); /* the next position's draws */
}

size_t smp_dist(smp_sampler *s, const float *logits) {
    size_t n;
    smp_filter(s, logits, &n);
    softmax(s->cand, n);
    if (!s->p.grammar) return n;
    /* smp_sample keeps its free draw x when the grammar allows it, else draws again from the masked logits:
     * P(x) = p_free(x) [x allowed] + R p_masked(x), R the free mass the grammar refuses. */
    int64_t left = gram_left(&s->p, s->n_gen);
    size_t m = 0;
    double refused = 0;
    for (size_t i = 0; i < n; i++) {
        if (smp_gram_ok(s, s->cand[i].id, left)) s->cand2[m++] = s->cand[i];
        else refused += s->cand[i].p;
    }
    if (m == n) return n;
    const int64_t asked = left;
    if (!smp_gram_mask(s, logits, &left)) { /* nothing allowed: the free draw stands */
        smp_filter(s, logits, &n);
        softmax(s->cand, n);
        return n;
    }
    if (left != asked) { /* the budget was dropped (smp_gram_mask): the free draw's part is judged without it */
        m = 0, refused = 0;
        for (size_t i = 0; i < n; i++) {
            if (smp_gram_ok(s, s->cand[i].id, left)) s->cand2[m++] = s->cand[i];
            else refused += s->cand[i].p;
        }
    }
    size_t n2;
    smp_filter(s, s->masked, &n2);
    softmax(s->cand, n2);
    /* The two parts summed per token, with s->masked (no longer needed) as a dense accumulator, -1 marking
     * a token already listed. */
    float *acc = s->masked;
    for (size_t i = 0; i < n2; i++) acc[s->cand[i].id] = 0;
    for (size_t i = 0; i < m; i++) acc[s->cand2[i].id] = 0;
    for (size_t i = 0; i < n2; i++) acc[s->cand[i].id] += (float)refused * s->cand[i].p;
    for (size_t i = 0; i < m; i++) acc[s->cand2[i].id] += s->cand2[i].p;
    for (size_t i = 0; i < n2; i++) {
        s->cand[i].p = acc[s->cand[i].id];
        acc[s->cand[i].id] = -1;
    }
    for (size_t i = 0; i < m; i++) {
        if (acc[s->cand2[i].id] < 0) continue;
        s->cand[n2] = s->cand2[i];
        s->cand[n2++].p = acc[s->cand2[i].id];
        acc[s->cand2[i].id] = -1;
    }
    return n2;
}

int smp_grammar_prefix(const smp_params *p, const gr_state *st, int32_t n_gen, const int32_t *tok, int n,
                       gr_state *scratch) {
    if (!p->grammar) return n;
    if (gr_state_copy(scratch, st)) return 0;
    for (int i = 0; i < n; i++) {
        if (tok[i] < 0 || tok[i] >= p->vocab->n || !gram_step(p, scratch, tok[i], gram_left(p, n_gen + i))) return i;
        if (p->vocab->eog[tok[i]]) return i + 1; /* the end: nothing can follow it */
    }
    return n;
}

static int32_t smp_sample_free(smp_sampler *s, const float *logits) {
    size_t n;
    smp_filter(s, logits, &n);
    if (n == 1) return s->cand[0].id;
    softmax(s->cand, n);
    double u = rng_uniform(s->rng), cum = 0;
    for (size_t i = 0; i < n; i++) {
        cum += s->cand[i].p;
        if (u < cum) return s->cand[i].id;
    }
    /* rounding left u above the total: the last token with any mass */
    for (size_t i = n; i-- > 0;)
        if (s->cand[i].p > 0) return s->cand[i].id;
    return s->cand[0].id;
}

double smp_uniform(smp_sampler *s) { return rng_uniform(s->rng); }

static float lp_val(const float *logits, int32_t i) { return isnan(logits[i]) ? -INFINITY : logits[i]; }

void smp_logprobs(const float *logits, int32_t n_vocab, int32_t id, smp_logprob *out) {
    float mx = -INFINITY;
    for (int32_t i = 0; i < n_vocab; i++) mx = fmaxf(mx, lp_val(logits, i));
    double sum = 0;
    for (int32_t i = 0; i < n_vocab && mx > -INFINITY; i++) sum += exp((double)lp_val(logits, i) - mx);
    /* All -inf (no real logits do that): call it uniform rather than divide by zero. */
    const bool flat = mx == -INFINITY;
    const double lse = flat ? 0 : mx + log(sum);
    out->id = id;
    out->logprob = id < 0 || id >= n_vocab ? -INFINITY
                   : flat                  ? -logf((float)n_vocab)
                                           : (float)((double)lp_val(logits, id) - lse);
    /* The top ones by insertion into a short sorted list: after the first few, almost every logit fails
     * the comparison with the list's last entry at once. Strict comparisons: ties keep the lower id. */
    int n = 0;
    for (int32_t i = 0; i < n_vocab; i++) {
        float v = lp_val(logits, i);
        if (n == SMP_TOP_LOGPROBS && !(v > lp_val(logits, out->top_id[n - 1]))) continue;
        int j = n < SMP_TOP_LOGPROBS ? n++ : n - 1;
        while (j > 0 && v > lp_val(logits, out->top_id[j - 1])) {
            out->top_id[j] = out->top_id[j - 1];
            j--;
        }
        out->top_id[j] = i;
    }
    for (int k = 0; k < SMP_TOP_LOGPROBS; k++) {
        out->top_logprob[k] = k >= n ? -INFINITY : flat ? -logf((float)n_vocab)
                                                        : (float)((double)lp_val(logits, out->top_id[k]) - lse);
        if (k >= n) out->top_id[k] = -1;
    }
}
