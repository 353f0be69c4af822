#include "stage.h"
#include "../base/clock.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../speculate/accept.h"

_Static_assert(sizeof(smp_logprob) == FRAME_LOGPROB_BYTES, "the wire's log-probability entry is smp_logprob's layout");

static stage_seq *stage_find(ring_stage *s, uint64_t id, bool create);

void stage_init(ring_stage *s, k3_engine *e, uint32_t n_ctx, int n_pool, int wire) {
    memset(s, 0, sizeof *s);
    s->e = e;
    s->n_ctx = n_ctx;
    s->n_pool = n_pool < 0 ? 0 : n_pool > FRAME_MAX_SEQS ? FRAME_MAX_SEQS : n_pool;
    s->wire = wire;
}

static void stage_seq_free(stage_seq *q) {
    k3_state_free(&q->st);
    k3_ckpts_free(&q->ck);
    free(q->toks);
    if (q->has_smp) smp_free(&q->smp);
    gr_free(q->gram);
    memset(q, 0, sizeof *q);
}

void stage_free(ring_stage *s) {
    for (int i = 0; i < FRAME_MAX_SEQS; i++) {
        if (s->seqs[i].used) stage_seq_free(&s->seqs[i]);
    }
    if (s->pool_ready) k3_state_pool_free(&s->pool); /* (after the states bound to it) */
    s->pool_ready = false;
    free(s->tap_rows);
    s->tap_rows = NULL;
    s->n_tap_rows = 0;
    free(s->routes);
    s->routes = NULL;
    s->routes_len = 0;
}

void stage_set_taps(ring_stage *s, const uint32_t *layers, int n) {
    s->n_taps = 0;
    for (int i = 0; i < n && s->n_taps < 16; i++) {
        if (layers[i] > s->e->a && layers[i] <= s->e->b) s->taps[s->n_taps++] = layers[i];
    }
}

/* Keeps the tap rows of the FRAME_SEQ_TAPS sequences. o->taps has every token of the batch that ran: all of
 * the frame's, less the stale sequences' on the last stage (their rows are sent as zeros: the coordinator
 * drops a stale block's taps). */
static int stage_keep_taps(ring_stage *s, const frame_header *h, const uint8_t *stale, uint64_t ran, const float *taps,
                           rl_err *err) {
    const size_t d = s->e->hp.n_embd;
    uint32_t n = 0;
    for (uint32_t i = 0; i < h->n_seqs; i++) n += (h->seqs[i].flags & FRAME_SEQ_TAPS) ? h->seqs[i].n_tokens : 0;
    s->tap_rows = calloc((size_t)s->n_taps * n * d + 1, sizeof(float));
    if (!s->tap_rows) return rl_errf(err, "out of memory for taps");
    for (int k = 0; k < s->n_taps; k++) {
        uint32_t off = 0, r = 0;
        for (uint32_t i = 0; i < h->n_seqs; i++) {
            uint32_t nt = h->seqs[i].n_tokens;
            if ((h->seqs[i].flags & FRAME_SEQ_TAPS) && !stale[i]) {
                memcpy(s->tap_rows + ((size_t)k * n + r) * d, taps + ((size_t)k * ran + off) * d, nt * d * sizeof(float));
            }
            r += (h->seqs[i].flags & FRAME_SEQ_TAPS) ? nt : 0;
            off += stale[i] ? 0 : nt;
        }
    }
    s->n_tap_rows = n;
    return 0;
}

/* What stage_replay runs a frame for: one sequence on its own state, the others on stand-ins. */
typedef struct stage_replay_spec {
    uint64_t seq_id;
    const uint8_t *stale; /* per frame sequence (NULL: none): the node ran it as a stale VERIFY block */
} stage_replay_spec;

static bool stage_standin(const stage_replay_spec *rp, const frame_seq *sq) { return rp && sq->seq_id != rp->seq_id; }

/* Last stage: which VERIFY sequences of the frame are stale (stage_seq.has_commit). A stand-in has no
 * history here: the replay says what the node found. */
static int stage_find_stale(ring_stage *s, const frame_header *h, const int32_t *tokens, const stage_replay_spec *rp,
                            uint8_t *stale) {
    int n = 0;
    uint32_t off = 0;
    for (uint32_t i = 0; i < h->n_seqs; i++) {
        const frame_seq *sq = &h->seqs[i];
        if (stage_standin(rp, sq)) {
            stale[i] = rp->stale && rp->stale[i] && (sq->flags & FRAME_SEQ_VERIFY);
            n += stale[i];
            off += sq->n_tokens;
            continue;
        }
        const stage_seq *q = (sq->flags & FRAME_SEQ_VERIFY) && !(sq->flags & FRAME_SEQ_NEW) ? stage_find(s, sq->seq_id, false) : NULL;
        stale[i] = q && q->has_commit && (sq->pos > q->valid_end || (sq->pos == q->valid_end && tokens[off] != q->next_tok));
        n += stale[i];
        off += sq->n_tokens;
    }
    return n;
}

/* The frame without its stale sequences: header, tokens and boundary rows (into h2, tok2, bin2). */
static int stage_drop_stale(const frame_header *h, const int32_t *tokens, const k3_boundary *bin, const uint8_t *stale,
                            frame_header *h2, int32_t *tok2, k3_boundary *bin2, rl_err *err) {
    *h2 = *h;
    h2->n_seqs = 0;
    uint32_t off = 0, o2 = 0;
    for (uint32_t i = 0; i < h->n_seqs; i++) {
        if (!stale[i]) {
            h2->seqs[h2->n_seqs++] = h->seqs[i];
            memcpy(tok2 + o2, tokens + off, h->seqs[i].n_tokens * sizeof *tokens);
            o2 += h->seqs[i].n_tokens;
        }
        off += h->seqs[i].n_tokens;
    }
    if (!bin || !bin->h || o2 == 0) return 0;
    if (k3_boundary_alloc(bin2, o2, bin->n_embd, bin->n_ckpt, err) != 0) return -1;
    const size_t d = bin->n_embd, nc = bin->n_ckpt;
    off = o2 = 0;
    for (uint32_t i = 0; i < h->n_seqs; i++) {
        uint32_t nt = h->seqs[i].n_tokens;
        if (!stale[i]) {
            memcpy(bin2->h + o2 * d, bin->h + off * d, nt * d * sizeof(float));
            if (nc) memcpy(bin2->ckpt + o2 * nc * d, bin->ckpt + off * nc * d, nt * nc * d * sizeof(float));
            o2 += nt;
        }
        off += nt;
    }
    return 0;
}

static stage_seq *stage_find(ring_stage *s, uint64_t id, bool create) {
    stage_seq *free_slot = NULL;
    for (int i = 0; i < FRAME_MAX_SEQS; i++) {
        if (s->seqs[i].used && s->seqs[i].id == id) return &s->seqs[i];
        if (!s->seqs[i].used && !free_slot) free_slot = &s->seqs[i];
    }
    if (!create || !free_slot) return NULL;
    free_slot->used = true;
    free_slot->id = id;
    return free_slot;
}

void stage_forget(ring_stage *s, uint64_t seq_id) {
    stage_seq *q = stage_find(s, seq_id, false);
    if (q) stage_seq_free(q);
}

/* Index of sequence i's first token in the frame's token list. */
static uint32_t stage_seq_offset(const frame_header *h, uint32_t i) {
    uint32_t off = 0;
    for (uint32_t k = 0; k < i; k++) off += h->seqs[k].n_tokens;
    return off;
}

/* A new sequence's sampler inputs at the head of the 4th part (docs: frame.h): per FRAME_SEQ_HAS_BIAS
 * sequence in frame order its logit biases (the bytes are an smp_bias array, unaligned: copied out when the
 * sampler is made), then per FRAME_SEQ_HAS_GRAMMAR sequence its budget and grammar; *q_off where the drafts'
 * distributions begin. Checked whole before anything runs, so a bad list fails the frame cleanly. */
typedef struct stage_smp_in {
    const uint8_t *bias;
    uint32_t nb;
    const uint8_t *gram; /* the grammar's wire form (decoded when the sampler is made), gram_len bytes */
    uint32_t gram_len;
    int32_t budget;
    bool resume;         /* FRAME_SEQ_RESUME: tokens gen_start.. of the frame were generated */
    uint32_t gen_start;
} stage_smp_in;

static int stage_smp_parse(const frame_header *h, const uint8_t *q, size_t q_len, stage_smp_in *in, size_t *q_off,
                           rl_err *err) {
    size_t o = 0;
    for (uint32_t i = 0; i < h->n_seqs; i++) {
        const frame_seq *sq = &h->seqs[i];
        in[i] = (stage_smp_in){0};
        if ((sq->flags & (FRAME_SEQ_HAS_BIAS | FRAME_SEQ_HAS_GRAMMAR)) && !(sq->flags & FRAME_SEQ_NEW)) {
            return rl_errf(err, "sequence %" PRIu64 ": %s on a frame that does not start it", sq->seq_id,
                           sq->flags & FRAME_SEQ_HAS_BIAS ? "logit biases" : "a grammar");
        }
        if ((sq->flags & FRAME_SEQ_RESUME) && (sq->flags & FRAME_SEQ_VERIFY)) {
            return rl_errf(err, "sequence %" PRIu64 ": a resumed sequence cannot start with a VERIFY block", sq->seq_id);
        }
        if (!(sq->flags & FRAME_SEQ_HAS_BIAS)) continue;
        uint32_t n;
        if (!q || q_len - o < 4) return rl_errf(err, "sequence %" PRIu64 ": its logit biases are missing", sq->seq_id);
        memcpy(&n, q + o, 4);
        if (n > SMP_MAX_BIAS || (q_len - o - 4) / sizeof(smp_bias) < n) {
            return rl_errf(err, "sequence %" PRIu64 ": %u logit biases do not fit the frame", sq->seq_id, n);
        }
        in[i].bias = q + o + 4;
        in[i].nb = n;
        o += 4 + (size_t)n * sizeof(smp_bias);
    }
    for (uint32_t i = 0; i < h->n_seqs; i++) {
        const frame_seq *sq = &h->seqs[i];
        if (!(sq->flags & FRAME_SEQ_HAS_GRAMMAR)) continue;
        uint32_t n;
        if (!q || q_len - o < 8) return rl_errf(err, "sequence %" PRIu64 ": its grammar is missing", sq->seq_id);
        memcpy(&in[i].budget, q + o, 4);
        memcpy(&n, q + o + 4, 4);
        if (q_len - o - 8 < n) return rl_errf(err, "sequence %" PRIu64 ": a grammar of %u bytes does not fit the frame", sq->seq_id, n);
        in[i].gram = q + o + 8;
        in[i].gram_len = n;
        o += 8 + (size_t)n;
    }
    for (uint32_t i = 0; i < h->n_seqs; i++) {
        const frame_seq *sq = &h->seqs[i];
        if (!(sq->flags & FRAME_SEQ_RESUME)) continue;
        if (!q || q_len - o < 4) return rl_errf(err, "sequence %" PRIu64 ": its resume point is missing", sq->seq_id);
        memcpy(&in[i].gen_start, q + o, 4);
        if (in[i].gen_start > sq->n_tokens) {
            return rl_errf(err, "sequence %" PRIu64 ": resumed at token %u of a %u-token frame", sq->seq_id,
                           in[i].gen_start, sq->n_tokens);
        }
        in[i].resume = true;
        o += 4;
    }
    *q_off = o;
    return 0;
}

/* A fresh last-stage sampler for sequence q from its frame entry and the 4th part's inputs (logit biases,
 * grammar). */
static int stage_new_sampler(ring_stage *s, stage_seq *q, const frame_seq *sq, const stage_smp_in *in, rl_err *err) {
    const k3_engine *e = s->e;
    if (q->has_smp) smp_free(&q->smp);
    smp_params sp = {.seed = sq->smp.seed, .temperature = sq->smp.temperature, .top_k = sq->smp.top_k,
                     .top_p = sq->smp.top_p, .min_p = sq->smp.min_p,
                     .repeat_penalty = sq->smp.repeat_penalty,
                     .frequency_penalty = sq->smp.frequency_penalty,
                     .presence_penalty = sq->smp.presence_penalty,
                     .penalty_last_n = sq->smp.penalty_last_n};
    smp_bias *bl = NULL;
    if (in->nb > 0) {
        if (!(bl = malloc(in->nb * sizeof *bl))) return rl_errf(err, "out of memory");
        memcpy(bl, in->bias, in->nb * sizeof *bl);
        sp.bias = bl;
        sp.n_bias = (int32_t)in->nb;
    }
    gr_free(q->gram);
    q->gram = NULL;
    if (in->gram) { /* constrained output: this stage needs the tokens' bytes to follow it */
        if (!s->vocab) {
            free(bl);
            return rl_errf(err, "sequence %" PRIu64 ": constrained output, but this stage has no vocabulary",
                           sq->seq_id);
        }
        if (!(q->gram = gr_decode(in->gram, in->gram_len, err))) {
            free(bl);
            return rl_errf(err, "sequence %" PRIu64 ": %s", sq->seq_id, err->msg);
        }
        sp.grammar = q->gram;
        sp.budget = in->budget;
        sp.vocab = s->vocab;
    }
    q->has_smp = smp_init(&q->smp, &sp, (int32_t)e->hp.n_vocab, err) == 0;
    free(bl);
    if (!q->has_smp) return rl_errf(err, "sequence %" PRIu64 ": %s", sq->seq_id, err->msg);
    return 0;
}

/* Gets every sequence of the frame ready: finds or creates its state, rolls back a partly accepted
 * block, checks its position; fills states/ntok/keep, qv (each sequence's entry) and, on the last stage,
 * the logit rows. In a replay (rp) every other sequence gets a stand-in from stand[i]: a fresh state just
 * large enough for its tokens, at position 0 - what it computes is thrown away; it is there so that the
 * batch has the node's shape. */
static int stage_prepare(ring_stage *s, const frame_header *h, const int32_t *tokens, const stage_replay_spec *rp,
                         const stage_smp_in *in, stage_seq *stand, stage_seq **qv,
                         k3_state **states, uint32_t *ntok, uint8_t *keep, int32_t *rows, int *n_rows, rl_err *err) {
    const k3_engine *e = s->e;
    bool last = e->b == e->hp.n_layer;
    uint32_t off = 0;
    for (uint32_t i = 0; i < h->n_seqs; i++) {
        const frame_seq *sq = &h->seqs[i];
        bool standin = stage_standin(rp, sq);
        /* FRAME_SEQ_NEW with FRAME_SEQ_RESTORE begins the sequence again from one of its checkpoints: it exists */
        const bool restore = !standin && (sq->flags & FRAME_SEQ_RESTORE);
        const bool fresh = standin || ((sq->flags & FRAME_SEQ_NEW) && !restore);
        stage_seq *q = standin ? &stand[i] : stage_find(s, sq->seq_id, fresh);
        for (uint32_t k = 0; k < i && q; k++) {
            if (h->seqs[k].seq_id == sq->seq_id) q = NULL; /* listed twice */
        }
        if (!q) {
            return rl_errf(err, "sequence %" PRIu64 " is unknown here, listed twice, or no slot is free", sq->seq_id);
        }
        qv[i] = q;
        if (!standin && (sq->flags & (FRAME_SEQ_CKPT | FRAME_SEQ_RESTORE))) {
            if (s->max_ck < 1) {
                return rl_errf(err, "sequence %" PRIu64 ": a prompt cache checkpoint, but this stage keeps none "
                               "(ASSIGN's ctx_checkpoints is 0)", sq->seq_id);
            }
            if ((sq->flags & FRAME_SEQ_CKPT) && (sq->flags & FRAME_SEQ_VERIFY)) {
                return rl_errf(err, "sequence %" PRIu64 ": a checkpoint after a VERIFY block", sq->seq_id);
            }
        }
        if (fresh) {
            if (!standin && sq->pos != 0) return rl_errf(err, "new sequence %" PRIu64 " must start at position 0", sq->seq_id);
            const int slot = standin ? -1 : (int)(q - s->seqs);
            if (q->st.ctx) {
                k3_state_reset(&q->st);
            } else if (slot >= 0 && slot < s->n_pool) { /* a slot of the stage's pool, made with its first */
                if (!s->pool_ready) {
                    if (k3_state_pool_init(&s->pool, &e->hp, e->a, e->b, s->n_ctx, s->n_pool, err) != 0) {
                        stage_seq_free(q);
                        return rl_err_prefix(err, "states of %d sequences", s->n_pool);
                    }
                    s->pool_ready = true;
                }
                if (k3_state_init_pooled(&q->st, &s->pool, slot, err) != 0) {
                    stage_seq_free(q);
                    return -1;
                }
            } else if (k3_state_init(&q->st, &e->hp, e->a, e->b, standin ? sq->n_tokens : s->n_ctx, err) != 0) {
                stage_seq_free(q);
                return -1;
            }
            if (s->rb_blocks > 0 && q->st.rb_max != s->rb_blocks && k3_state_keep_blocks(&q->st, s->rb_blocks, err) != 0) {
                stage_seq_free(q);
                return -1;
            }
            q->used = true;
            q->id = sq->seq_id;
            k3_ckpts_drop(&q->ck, 0);
            if (last && !standin && s->max_ck > 0 && !q->toks && !(q->toks = malloc((size_t)s->n_ctx * sizeof *q->toks))) {
                return rl_errf(err, "out of memory");
            }
            if (last && stage_new_sampler(s, q, sq, &in[i], err) != 0) return -1;
        } else if (restore) {
            const int k = k3_ckpts_at(&q->ck, sq->pos);
            if (k < 0) return rl_errf(err, "sequence %" PRIu64 " has no checkpoint at position %u here", sq->seq_id, sq->pos);
            if (k3_state_restore(&q->st, &q->ck.c[k].snap, err) != 0) {
                return rl_errf(err, "sequence %" PRIu64 ": %s", sq->seq_id, err->msg);
            }
            k3_ckpts_drop(&q->ck, k + 1);
            q->has_commit = false;
            if (last && (sq->flags & FRAME_SEQ_NEW)) {
                if (!q->toks) return rl_errf(err, "sequence %" PRIu64 ": no tokens kept to begin again from", sq->seq_id);
                if (stage_new_sampler(s, q, sq, &in[i], err) != 0) return -1;
                for (uint32_t t = 0; t < sq->pos; t++) smp_accept(&q->smp, q->toks[t]); /* as a fresh read would */
            }
        } else if (sq->pos < q->st.n_past) {
            /* Speculation: the last verified block was only partly accepted; drop the rest. */
            if (k3_state_rollback(&q->st, sq->pos, err) != 0) {
                return rl_errf(err, "sequence %" PRIu64 ": %s", sq->seq_id, err->msg);
            }
        } else if (sq->pos != q->st.n_past) {
            return rl_errf(err, "sequence %" PRIu64 " is at position %u here, the frame says %u", sq->seq_id,
                           q->st.n_past, sq->pos);
        }
        /* A one-token VERIFY block (speculation paused) commits its token: nothing in it is ever rolled back
         * (frame.h), and without copies the step keeps its graph for the next, as a plain step does. */
        keep[i] = (sq->flags & FRAME_SEQ_VERIFY) && sq->n_tokens > 1;
        states[i] = &q->st;
        ntok[i] = sq->n_tokens;
        if (last) {
            if (sq->flags & (FRAME_SEQ_ALL_LOGITS | FRAME_SEQ_VERIFY | FRAME_SEQ_PROMPT_LP)) {
                for (uint32_t t = 0; t < sq->n_tokens; t++) rows[(*n_rows)++] = (int32_t)(off + t);
            } else if (!(sq->flags & FRAME_SEQ_NO_SAMPLE)) {
                rows[(*n_rows)++] = (int32_t)(off + sq->n_tokens - 1);
            }
            if (!(sq->flags & FRAME_SEQ_VERIFY)) q->has_commit = false;
            if (q->toks && sq->pos <= s->n_ctx && sq->n_tokens <= s->n_ctx - sq->pos) {
                memcpy(q->toks + sq->pos, tokens + off, (size_t)sq->n_tokens * sizeof *tokens);
            }
            /* Penalty history follows the inputs; a VERIFY block's inputs are accepted as they are judged. */
            if (q->has_smp && !(sq->flags & FRAME_SEQ_VERIFY)) {
                for (uint32_t t = 0; t < sq->n_tokens; t++) smp_accept(&q->smp, tokens[off + t]);
            }
            /* A rebuilt sequence: what it had generated is its sampler's output again (grammar, budget and the
             * RNG's position, sampler.h), so it samples on as the lost ring would have. */
            for (uint32_t t = in[i].resume && q->has_smp ? in[i].gen_start : sq->n_tokens; t < sq->n_tokens; t++) {
                smp_take(&q->smp, tokens[off + t]);
            }
        }
        off += sq->n_tokens;
    }
    return 0;
}

/* The last stage's RESULT payload: one int32 per sequence (the sampled token, -1 if none was asked, or
 * for VERIFY the number of committed tokens), then the logits rows that were asked, then the committed
 * tokens of every VERIFY sequence. */
static int stage_result(ring_stage *s, const frame_header *h, const int32_t *tokens, const float *logits,
                        const uint8_t *stale, stage_seq *const *qv, const uint8_t *qp, size_t q_len, uint8_t **out,
                        size_t *out_len, rl_err *err) {
    const uint32_t n_vocab = s->e->hp.n_vocab;
    size_t n_logit_floats = 0;
    for (uint32_t i = 0; i < h->n_seqs; i++) {
        if (h->seqs[i].flags & FRAME_SEQ_ALL_LOGITS) n_logit_floats += (size_t)h->seqs[i].n_tokens * n_vocab;
    }
    int32_t (*committed)[STAGE_BLOCK_MAX] = calloc(h->n_seqs, sizeof *committed);
    int n_comm[FRAME_MAX_SEQS] = {0};
    if (!committed) return rl_errf(err, "out of memory");
    size_t n_comm_total = 0;
    /* The drafts' distributions (FRAME_SEQ_HAS_Q), parsed per VERIFY sequence. */
    const uint8_t *qend = qp ? qp + q_len : NULL;
    int row0 = 0;
    for (uint32_t i = 0; i < h->n_seqs; i++) {
        const frame_seq *sq = &h->seqs[i];
        int nrows = (sq->flags & (FRAME_SEQ_ALL_LOGITS | FRAME_SEQ_VERIFY | FRAME_SEQ_PROMPT_LP)) ? (int)sq->n_tokens
                    : !(sq->flags & FRAME_SEQ_NO_SAMPLE) ? 1 : 0;
        if (stale[i]) { /* not run: no rows, nothing committed; its q entries are skipped below */
            for (int d = 0; qp && (sq->flags & FRAME_SEQ_HAS_Q) && d < (int)sq->n_tokens - 1; d++) {
                uint32_t cnt;
                if (qp + 4 > qend) break;
                memcpy(&cnt, qp, 4);
                if (cnt > 64 || (size_t)(qend - qp - 4) < (size_t)cnt * 8) break;
                qp += 4 + (size_t)cnt * 8;
            }
            continue;
        }
        if (sq->flags & FRAME_SEQ_VERIFY) {
            stage_seq *q = qv[i];
            int k = (int)sq->n_tokens - 1;
            spec_q qs[STAGE_BLOCK_MAX];
            int32_t qid[STAGE_BLOCK_MAX][64];
            float qpr[STAGE_BLOCK_MAX][64];
            bool have_q = (sq->flags & FRAME_SEQ_HAS_Q) != 0;
            for (int d = 0; have_q && d < k && d < STAGE_BLOCK_MAX; d++) {
                uint32_t cnt;
                if (!qp || qp + 4 > qend) { /* announced but missing: refuse, never read garbage */
                    have_q = false;
                    break;
                }
                memcpy(&cnt, qp, 4);
                qp += 4;
                if (cnt > 64 || (size_t)(qend - qp) < (size_t)cnt * 8) {
                    have_q = false;
                    break;
                }
                for (uint32_t c = 0; c < cnt; c++) {
                    memcpy(&qid[d][c], qp + c * 8, 4);
                    memcpy(&qpr[d][c], qp + c * 8 + 4, 4);
                }
                qp += cnt * 8;
                qs[d] = (spec_q){.n = (int)cnt, .id = qid[d], .p = qpr[d]};
            }
            if (k + 1 > STAGE_BLOCK_MAX || !q || !q->has_smp || ((sq->flags & FRAME_SEQ_HAS_Q) && !have_q)) {
                free(committed);
                return rl_errf(err, "VERIFY block for sequence %" PRIu64 " is malformed", sq->seq_id);
            }
            n_comm[i] = spec_accept(&q->smp, logits + (size_t)row0 * n_vocab, (int32_t)n_vocab,
                                    tokens + stage_seq_offset(h, i), k, have_q ? qs : NULL, committed[i]);
            n_comm_total += (size_t)n_comm[i];
            q->has_commit = true;
            q->valid_end = sq->pos + (uint32_t)n_comm[i];
            q->next_tok = committed[i][n_comm[i] - 1];
        }
        row0 += nrows;
    }
    /* Log-probabilities of what each FRAME_SEQ_LOGPROBS sequence gets back: its sampled token, or each
     * committed one (committed token j was chosen from the block's row j). */
    size_t n_lp = 0;
    for (uint32_t i = 0; i < h->n_seqs; i++) {
        const frame_seq *sq = &h->seqs[i];
        if (stale[i]) continue;
        if ((sq->flags & FRAME_SEQ_PROMPT_LP) && sq->n_tokens > 0) n_lp += sq->n_tokens - 1;
        if (!(sq->flags & FRAME_SEQ_LOGPROBS)) continue;
        n_lp += (sq->flags & FRAME_SEQ_VERIFY) ? (size_t)n_comm[i] : !(sq->flags & FRAME_SEQ_NO_SAMPLE) ? 1 : 0;
    }
    size_t plen = h->n_seqs * 4 + n_logit_floats * 4 + n_comm_total * 4 + n_lp * FRAME_LOGPROB_BYTES;
    uint8_t *payload = malloc(plen);
    if (!payload) {
        free(committed);
        return rl_errf(err, "out of memory for the outgoing frame");
    }
    int row = 0;
    size_t lo = 0;
    const float **lp_row = calloc(h->n_seqs ? h->n_seqs : 1, sizeof *lp_row); /* the row its token came from */
    const float **p_row = calloc(h->n_seqs ? h->n_seqs : 1, sizeof *p_row);   /* its first row */
    if (!lp_row || !p_row) {
        free(lp_row);
        free(p_row);
        free(committed);
        free(payload);
        return rl_errf(err, "out of memory");
    }
    for (uint32_t i = 0; i < h->n_seqs; i++) {
        const frame_seq *sq = &h->seqs[i];
        int32_t tok = -1;
        stage_seq *q = qv[i];
        const float *lrow = NULL;
        lp_row[i] = p_row[i] = logits ? logits + (size_t)row * n_vocab : NULL;
        if (sq->flags & FRAME_SEQ_ALL_LOGITS) { /* a stale block did not run: its rows are zeros, as its taps */
            const size_t nb = (size_t)sq->n_tokens * n_vocab * 4;
            if (stale[i]) memset(payload + h->n_seqs * 4 + lo * 4, 0, nb);
            else memcpy(payload + h->n_seqs * 4 + lo * 4, logits + (size_t)row * n_vocab, nb);
            lo += (size_t)sq->n_tokens * n_vocab;
        }
        if (sq->flags & FRAME_SEQ_VERIFY) {
            memcpy(payload + i * 4, &n_comm[i], 4);
            row += stale[i] ? 0 : (int)sq->n_tokens;
            continue;
        }
        if (sq->flags & FRAME_SEQ_ALL_LOGITS) {
            row += (int)sq->n_tokens;
            lrow = logits + (size_t)(row - 1) * n_vocab;
        } else if (sq->flags & FRAME_SEQ_PROMPT_LP) { /* every row was computed; the last one samples, if asked */
            row += (int)sq->n_tokens;
            if (!(sq->flags & FRAME_SEQ_NO_SAMPLE)) lrow = logits + (size_t)(row - 1) * n_vocab;
        } else if (!(sq->flags & FRAME_SEQ_NO_SAMPLE)) {
            lrow = logits + (size_t)row * n_vocab;
            row++;
        }
        if (lrow && q && q->has_smp) tok = smp_sample(&q->smp, lrow);
        lp_row[i] = lrow;
        memcpy(payload + i * 4, &tok, 4);
    }
    for (uint32_t i = 0; i < h->n_seqs; i++) {
        if (!n_comm[i]) continue;
        memcpy(payload + h->n_seqs * 4 + lo * 4, committed[i], (size_t)n_comm[i] * 4);
        lo += (size_t)n_comm[i];
    }
    uint8_t *lp_at = payload + h->n_seqs * 4 + lo * 4;
    for (uint32_t i = 0; i < h->n_seqs; i++) {
        const frame_seq *sq = &h->seqs[i];
        if (stale[i]) continue;
        const int32_t *tk = tokens + stage_seq_offset(h, i);
        for (uint32_t t = 0; (sq->flags & FRAME_SEQ_PROMPT_LP) && t + 1 < sq->n_tokens; t++) {
            smp_logprob lp;
            smp_logprobs(p_row[i] + (size_t)t * n_vocab, (int32_t)n_vocab, tk[t + 1], &lp);
            memcpy(lp_at, &lp, FRAME_LOGPROB_BYTES);
            lp_at += FRAME_LOGPROB_BYTES;
        }
        if (!(sq->flags & FRAME_SEQ_LOGPROBS)) continue;
        int nt = (sq->flags & FRAME_SEQ_VERIFY) ? n_comm[i] : !(sq->flags & FRAME_SEQ_NO_SAMPLE) ? 1 : 0;
        for (int t = 0; t < nt; t++) {
            smp_logprob lp;
            int32_t id;
            memcpy(&id, (sq->flags & FRAME_SEQ_VERIFY) ? (const void *)&committed[i][t] : (const void *)(payload + i * 4), 4);
            smp_logprobs(lp_row[i] + (size_t)t * n_vocab, (int32_t)n_vocab, id, &lp);
            memcpy(lp_at, &lp, FRAME_LOGPROB_BYTES);
            lp_at += FRAME_LOGPROB_BYTES;
        }
    }
    free(lp_row);
    free(p_row);
    free(committed);
    *out = payload;
    *out_len = plen;
    return 0;
}

/* The ROUTES payload (frame.h) of the FRAME_SEQ_ROUTES sequences: o's routing has every token that ran (stale
 * sequences' rows are sent as zeros, like taps; a scoring frame has none). */
static int stage_keep_routes(ring_stage *s, const frame_header *h, const uint8_t *stale, const k3_routes *r,
                             rl_err *err) {
    uint32_t n = 0;
    for (uint32_t i = 0; i < h->n_seqs; i++) n += (h->seqs[i].flags & FRAME_SEQ_ROUTES) ? h->seqs[i].n_tokens : 0;
    const size_t per = (size_t)n * r->k, cell = (size_t)r->n_layers * per;
    s->routes_len = 16 + cell * 12;
    s->routes = calloc(s->routes_len, 1);
    if (!s->routes) return rl_errf(err, "out of memory for routing statistics");
    const uint32_t hd[4] = {r->layer0, r->n_layers, r->k, n};
    memcpy(s->routes, hd, sizeof hd);
    uint8_t *ids = s->routes + 16, *w = ids + cell * 4, *nm = w + cell * 4;
    for (uint32_t l = 0; l < r->n_layers; l++) {
        const size_t src_l = (size_t)l * r->n_tokens * r->k;
        uint32_t off = 0, row = 0;
        for (uint32_t i = 0; i < h->n_seqs; i++) {
            const uint32_t nt = h->seqs[i].n_tokens;
            if ((h->seqs[i].flags & FRAME_SEQ_ROUTES) && !stale[i]) {
                const size_t d = (size_t)l * per + (size_t)row * r->k, sidx = src_l + (size_t)off * r->k, c = (size_t)nt * r->k;
                memcpy(ids + d * 4, r->ids + sidx, c * 4);
                memcpy(w + d * 4, r->weight + sidx, c * 4);
                memcpy(nm + d * 4, r->norm + sidx, c * 4);
            }
            row += (h->seqs[i].flags & FRAME_SEQ_ROUTES) ? nt : 0;
            off += stale[i] ? 0 : nt;
        }
    }
    return 0;
}

static int stage_exec(ring_stage *s, const frame_header *h, const uint8_t *in, size_t in_len, const uint8_t *q,
                      size_t q_len, const stage_replay_spec *rp, uint8_t **out, size_t *out_len, rl_err *err) {
    k3_engine *e = s->e;
    *out = NULL;
    *out_len = 0;
    free(s->tap_rows);
    s->tap_rows = NULL;
    s->n_tap_rows = 0;
    free(s->routes);
    s->routes = NULL;
    s->routes_len = 0;
    bool want_taps = false, want_routes = false;
    for (uint32_t i = 0; i < h->n_seqs && s->n_taps > 0; i++) want_taps |= (h->seqs[i].flags & FRAME_SEQ_TAPS) != 0;
    for (uint32_t i = 0; i < h->n_seqs && e->b > e->hp.n_dense_lead; i++) {
        want_routes |= (h->seqs[i].flags & FRAME_SEQ_ROUTES) != 0;
    }
    /* Payload: the tokens of every sequence (int32), then for later stages the boundary state. */
    uint64_t total = 0;
    for (uint32_t i = 0; i < h->n_seqs; i++) total += h->seqs[i].n_tokens;
    if (h->n_seqs == 0 || total == 0 || total > s->n_ctx * (uint64_t)h->n_seqs || in_len < total * 4 ||
        in_len != h->payload_bytes) {
        return rl_errf(err, "FORWARD payload of %zu bytes does not fit %u sequences / %" PRIu64 " tokens", in_len,
                       h->n_seqs, total);
    }
    const int32_t *tokens = (const int32_t *)in;
    k3_boundary bin = {0};
    if (e->a > 0 && k3_boundary_decode(&bin, in + total * 4, in_len - total * 4, (uint32_t)total, e->hp.n_embd,
                                       err) != 0) {
        return rl_errf(err, "FORWARD: %s", err->msg);
    }
    k3_state *states[FRAME_MAX_SEQS];
    uint32_t ntok[FRAME_MAX_SEQS];
    uint8_t keep[FRAME_MAX_SEQS] = {0}, stale[FRAME_MAX_SEQS] = {0};
    stage_seq *qv[FRAME_MAX_SEQS] = {0}, *qv2[FRAME_MAX_SEQS] = {0};
    stage_seq *stand = rp ? calloc(FRAME_MAX_SEQS, sizeof *stand) : NULL;
    int32_t *rows = malloc((total + 1) * sizeof *rows), *tok2 = NULL;
    int n_rows = 0, rc = -1;
    bool last = e->b == e->hp.n_layer;
    k3_output o = {0};
    k3_boundary bin2 = {0};
    frame_header *h2 = NULL;
    const frame_header *hb = h; /* what runs: the frame, less its stale sequences on the last stage */
    const int32_t *tb = tokens;
    const k3_boundary *bb = &bin;
    uint64_t ran = total;
    if (!rows || (rp && !stand)) {
        rl_errf(err, "out of memory");
        goto out;
    }
    if (last && stage_find_stale(s, h, tokens, rp, stale) > 0) {
        h2 = malloc(sizeof *h2);
        tok2 = malloc(total * sizeof *tok2);
        if (!h2 || !tok2) {
            rl_errf(err, "out of memory");
            goto out;
        }
        if (stage_drop_stale(h, tokens, e->a > 0 ? &bin : NULL, stale, h2, tok2, &bin2, err) != 0) goto out;
        hb = h2, tb = tok2, bb = &bin2;
        ran = 0;
        for (uint32_t i = 0; i < h2->n_seqs; i++) ran += h2->seqs[i].n_tokens;
    }
    /* The sampler's part of the 4th part on the last stage: logit biases, then the drafts' distributions.
     * A new sequence is never stale, so the lists follow the frame's order less its stale blocks. */
    stage_smp_in sin[FRAME_MAX_SEQS];
    size_t q_off = 0;
    memset(sin, 0, sizeof sin);
    if (last) {
        if (stage_smp_parse(h, q, q_len, sin, &q_off, err) != 0) goto out;
        for (uint32_t i = 0, j = 0; i < h->n_seqs; i++) {
            if (!stale[i]) sin[j++] = sin[i];
        }
    }
    if (hb->n_seqs > 0) { /* (a frame of only stale blocks is not run at all: cancelled here) */
        if (stage_prepare(s, hb, tb, rp, sin, stand, qv2, states, ntok, keep, rows, &n_rows, err) != 0) goto out;
        for (uint32_t i = 0, j = 0; i < h->n_seqs; i++) qv[i] = stale[i] ? NULL : qv2[j++];
        bool step = false; /* FRAME_SEQ_STEP: a rebuilt sequence's decoded tokens, as their steps computed them */
        bool split = false; /* FRAME_SEQ_SPLIT_INV: serve's prompt pieces */
        for (uint32_t k = 0; k < hb->n_seqs; k++) step = step || (hb->seqs[k].flags & FRAME_SEQ_STEP);
        for (uint32_t k = 0; k < hb->n_seqs; k++) split = split || (hb->seqs[k].flags & FRAME_SEQ_SPLIT_INV);
        k3_batch b = {.n_seqs = (int)hb->n_seqs, .seqs = states, .n_tokens = ntok, .tokens = tb,
                      .in = e->a > 0 ? bb : NULL, .keep_rollback = keep, .n_logits = last ? n_rows : 0,
                      .logit_rows = rows, .n_taps = want_taps ? s->n_taps : 0, .tap_layers = s->taps,
                      .step_kernels = step, .split_invariant = split, .routes = want_routes};
        if (k3_forward(e, &b, &o, err) != 0) goto out;
        /* The checkpoints asked for (the states moved: a failure here fails the frame as stage.h says). */
        for (uint32_t k = 0; k < hb->n_seqs; k++) {
            if (!(hb->seqs[k].flags & FRAME_SEQ_CKPT) || stage_standin(rp, &hb->seqs[k])) continue;
            stage_seq *cq = qv2[k];
            if ((cq->ck.max == 0 && k3_ckpts_init(&cq->ck, s->max_ck, err) != 0) || k3_ckpts_take(&cq->ck, &cq->st, err) != 0) {
                rl_err_prefix(err, "sequence %" PRIu64 ": a checkpoint", hb->seqs[k].seq_id);
                goto out;
            }
        }
    }
    if (want_taps && stage_keep_taps(s, h, stale, ran, o.taps, err) != 0) goto out; /* states moved: see stage.h */
    if (want_routes && stage_keep_routes(s, h, stale, &o.routes, err) != 0) goto out;
    if (!last) {
        size_t plen = total * 4 + k3_boundary_wire_size(&o.out, (enum k3_wire_dtype)s->wire);
        uint8_t *payload = malloc(plen);
        if (!payload) {
            rl_errf(err, "out of memory for the outgoing frame");
            goto out;
        }
        memcpy(payload, tokens, total * 4);
        k3_boundary_encode(&o.out, (enum k3_wire_dtype)s->wire, payload + total * 4);
        *out = payload;
        *out_len = plen;
        rc = 0;
    } else {
        rc = stage_result(s, h, tokens, o.logits, stale, qv, q ? q + q_off : NULL, q ? q_len - q_off : 0, out, out_len,
                          err);
    }
out:
    for (int i = 0; stand && i < FRAME_MAX_SEQS; i++) {
        if (stand[i].st.ctx || stand[i].has_smp) stage_seq_free(&stand[i]);
    }
    free(stand);
    k3_output_free(&o);
    free(rows);
    free(tok2);
    free(h2);
    k3_boundary_free(&bin);
    k3_boundary_free(&bin2);
    return rc;
}

int stage_run(ring_stage *s, const frame_header *h, const uint8_t *in, size_t in_len, const uint8_t *q, size_t q_len,
              uint8_t **out, size_t *out_len, rl_err *err) {
    return stage_exec(s, h, in, in_len, q, q_len, NULL, out, out_len, err);
}

int stage_replay(ring_stage *s, const frame_header *h, const uint8_t *in, size_t in_len, const uint8_t *q, size_t q_len,
                 uint64_t seq_id, const uint8_t *stale, uint8_t **out, size_t *out_len, rl_err *err) {
    const stage_replay_spec rp = {.seq_id = seq_id, .stale = stale};
    return stage_exec(s, h, in, in_len, q, q_len, &rp, out, out_len, err);
}

/* One frame of n tokens of the scratch sequence at pos: its payload built as the previous stage sends it. */
static int stage_time_frame(ring_stage *s, uint32_t pos, uint32_t n, double *sec, rl_err *err) {
    const k3_engine *e = s->e;
    frame_header h = {.type = FRAME_FORWARD, .n_seqs = 1};
    h.seqs[0] = (frame_seq){.seq_id = STAGE_SCRATCH_ID, .pos = pos, .n_tokens = n, .flags = pos == 0 ? FRAME_SEQ_NEW : 0,
                         .smp = {.temperature = 0, .top_p = 1, .repeat_penalty = 1}}; /* greedy */
    k3_boundary b = {0};
    const uint32_t n_ckpt = k3_n_banked_before(&e->hp, e->a);
    if (e->a > 0 && k3_boundary_alloc(&b, n, e->hp.n_embd, n_ckpt, err) != 0) return -1;
    const size_t bw = e->a > 0 ? k3_boundary_wire_size(&b, (enum k3_wire_dtype)s->wire) : 0;
    uint8_t *in = malloc((size_t)n * 4 + bw), *out = NULL;
    if (!in) {
        k3_boundary_free(&b);
        return rl_errf(err, "out of memory");
    }
    for (uint32_t t = 0; t < n; t++) { /* tokens of the vocabulary, spread over it; a state of small values */
        int32_t tok = (int32_t)(1 + (pos + t) * 7919u % (e->hp.n_vocab - 1));
        memcpy(in + 4 * (size_t)t, &tok, 4);
    }
    if (e->a > 0) {
        const size_t nh = (size_t)n * e->hp.n_embd, nc = nh * n_ckpt;
        for (size_t i = 0; i < nh; i++) b.h[i] = 0.01f * (float)((int)(i * 2654435761u % 201) - 100);
        for (size_t i = 0; i < nc; i++) b.ckpt[i] = 0.01f * (float)((int)(i * 40503u % 201) - 100);
        k3_boundary_encode(&b, (enum k3_wire_dtype)s->wire, in + (size_t)n * 4);
    }
    k3_boundary_free(&b);
    h.payload_bytes = (size_t)n * 4 + bw;
    size_t out_len = 0;
    const double t0 = rl_clock_now();
    int rc = stage_run(s, &h, in, h.payload_bytes, NULL, 0, &out, &out_len, err);
    if (sec) *sec = rl_clock_now() - t0;
    free(in);
    free(out);
    return rc;
}

int stage_time(ring_stage *s, const uint32_t *n_tok, int n, double *sec, rl_err *err) {
    uint64_t total = 1;
    for (int i = 0; i < n; i++) {
        if (n_tok[i] < 1) return rl_errf(err, "stage_time: a frame of no tokens");
        total += n_tok[i];
    }
    if (total >= s->n_ctx) return rl_errf(err, "stage_time: %" PRIu64 " tokens do not fit a context of %u", total, s->n_ctx);
    int rc = stage_time_frame(s, 0, 1, NULL, err);
    uint32_t pos = 1;
    for (int i = 0; i < n && rc == 0; i++) {
        rc = stage_time_frame(s, pos, n_tok[i], &sec[i], err);
        pos += n_tok[i];
    }
    stage_forget(s, STAGE_SCRATCH_ID);
    return rc;
}
