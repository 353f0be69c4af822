#include "scheduler.h"
#include "../base/clock.h"

#include "../speculate/accept.h"
#include "../text/utf8.h"
#include "../speculate/draft_pool.h"
#include "../speculate/drafter.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const char *sch_finish_name(sch_finish f) {
    switch (f) {
    case SCH_FIN_STOP: return "stop";
    case SCH_FIN_LENGTH: return "length";
    case SCH_FIN_CANCELLED: return "cancelled";
    case SCH_FIN_ERROR: return "error";
    default: return "running";
    }
}

/* ---- histograms -------------------------------------------------------------------------------------- */

static void sch_hist_init(sch_hist *h, const double *le, int n) {
    memset(h, 0, sizeof *h);
    h->n = n < SCH_HIST_MAX ? n : SCH_HIST_MAX;
    memcpy(h->le, le, (size_t)h->n * sizeof *le);
}

static void sch_hist_add(sch_hist *h, double v) {
    int i = 0;
    while (i < h->n && v > h->le[i]) i++;
    h->count[i]++;
    h->sum += v;
    h->total++;
}

/* ---- requests ---------------------------------------------------------------------------------------- */

sch_request *sch_request_new(const int32_t *prompt, size_t n_prompt, const sch_params *p, rl_err *err) {
    sch_request *r = calloc(1, sizeof *r);
    if (!r) {
        if (p->own_grammar) gr_free((gr_grammar *)p->smp.grammar);
        rl_errf(err, "out of memory");
        return NULL;
    }
    r->refs = 1;
    r->slot = -1;
    r->p = *p;
    r->p.n_stop = 0;
    r->p.smp.bias = NULL; /* the request's own copy, below */
    r->p.smp.n_bias = 0;
    if (pthread_cond_init(&r->cond, NULL) != 0) {
        if (p->own_grammar) gr_free((gr_grammar *)p->smp.grammar);
        free(r);
        rl_errf(err, "cannot create a condition variable");
        return NULL;
    }
    r->prompt = malloc((n_prompt ? n_prompt : 1) * sizeof *r->prompt);
    if (!r->prompt) goto oom;
    if (n_prompt) memcpy(r->prompt, prompt, n_prompt * sizeof *prompt);
    r->n_prompt = n_prompt;
    for (int i = 0; i < p->n_stop && i < SCH_MAX_STOP; i++) {
        if (!p->stop[i] || !*p->stop[i]) continue; /* an empty stop string would match everywhere */
        char *c = strdup(p->stop[i]);
        if (!c) goto oom;
        r->p.stop[r->p.n_stop++] = c;
    }
    if (p->prompt_logprobs && !(r->plp = malloc((n_prompt ? n_prompt : 1) * sizeof *r->plp))) goto oom;
    if (p->smp.n_bias > 0) {
        smp_bias *b = malloc((size_t)p->smp.n_bias * sizeof *b);
        if (!b) goto oom;
        memcpy(b, p->smp.bias, (size_t)p->smp.n_bias * sizeof *b);
        r->p.smp.bias = b;
        r->p.smp.n_bias = p->smp.n_bias;
    }
    return r;
oom:
    r->refs = 1;
    sch_request_release(r);
    rl_errf(err, "out of memory");
    return NULL;
}

static void sch_request_destroy(sch_request *r) {
    for (int i = 0; i < r->p.n_stop; i++) free((char *)r->p.stop[i]);
    free((smp_bias *)r->p.smp.bias);
    if (r->p.own_grammar) gr_free((gr_grammar *)r->p.smp.grammar);
    pthread_cond_destroy(&r->cond);
    free(r->prompt);
    rl_buf_free(&r->out);
    rl_buf_free(&r->rout);
    rl_buf_free(&r->tout);
    free(r->lp);
    free(r->ids);
    free(r->plp);
    free(r->receipts);
    rl_buf_free(&r->hold);
    free(r->hist);
    gr_state_free(&r->gs);
    gr_state_free(&r->gtry);
    free(r);
}

void sch_request_release(sch_request *r) {
    if (!r) return;
    if (!r->s) { /* never submitted: nobody else holds it */
        sch_request_destroy(r);
        return;
    }
    sch_sched *s = r->s;
    pthread_mutex_lock(&s->mu);
    int left = --r->refs;
    pthread_mutex_unlock(&s->mu);
    if (left == 0) sch_request_destroy(r);
}

void sch_cancel(sch_request *r) {
    if (!r || !r->s) return;
    sch_sched *s = r->s;
    pthread_mutex_lock(&s->mu);
    if (r->fin == SCH_RUNNING && !r->cancelled) {
        r->cancelled = true;
        pthread_cond_signal(&s->cond);
    }
    pthread_mutex_unlock(&s->mu);
}

bool sch_request_wait(sch_request *r, int timeout_ms, sch_update *u) {
    memset(u, 0, sizeof *u);
    sch_sched *s = r->s;
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += timeout_ms / 1000;
    dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) dl.tv_sec++, dl.tv_nsec -= 1000000000L;
    pthread_mutex_lock(&s->mu);
    /* (ids count as news on their own: a token whose text is empty or held back still reaches the client) */
    while (r->out.len == 0 && r->rout.len == 0 && r->tout.len == 0 && r->n_ids == 0 && r->fin == SCH_RUNNING) {
        if (pthread_cond_timedwait(&r->cond, &s->mu, &dl) == ETIMEDOUT) break;
    }
    bool news = r->out.len > 0 || r->rout.len > 0 || r->tout.len > 0 || r->n_ids > 0 || r->fin != SCH_RUNNING;
    /* Hand over the buffers themselves; the scheduler starts new ones. */
    if (r->tout.len > 0) u->tools = rl_buf_take(&r->tout, &u->tools_len);
    if (r->rout.len > 0) u->reasoning = rl_buf_take(&r->rout, &u->reasoning_len);
    if (news && r->n_lp > 0) {
        u->lp = r->lp;
        u->n_lp = r->n_lp;
        r->lp = NULL;
        r->n_lp = r->cap_lp = 0;
    }
    if (news && r->n_ids > 0) {
        u->ids = r->ids;
        u->n_ids = r->n_ids;
        r->ids = NULL;
        r->n_ids = r->cap_ids = 0;
    }
    if (r->out.len > 0) u->text = rl_buf_take(&r->out, &u->len);
    u->fin = r->fin;
    u->n_prompt = (int)r->n_prompt;
    u->n_gen = r->n_gen;
    u->n_cached = (int)r->n_cached;
    u->drafted = r->drafted;
    u->accepted = r->accepted;
    memcpy(u->err, r->err, sizeof u->err);
    u->unavailable = r->unavailable;
    if (r->fin != SCH_RUNNING) {
        u->receipts = r->receipts;
        r->receipts = NULL;
    }
    pthread_mutex_unlock(&s->mu);
    return news;
}

/* ---- text out ---------------------------------------------------------------------------------------- */

/* Appends text to the request's output as valid UTF-8: the API speaks JSON, which must be UTF-8, and a
 * random-weight model can emit lone byte tokens. Called with the scheduler's mutex held. */
static void sch_emit_to(sch_request *r, rl_buf *out, const char *text, size_t len) {
    static const char repl[] = "\xEF\xBF\xBD";
    const unsigned char *u = (const unsigned char *)text;
    size_t i = 0, run = 0;
    bool changed = false;
    while (i < len) {
        size_t bad, k = utf8_len(u + i, len - i, &bad);
        if (k) {
            i += k;
            continue;
        }
        changed = true;
        if (i > run) rl_buf_add(out, text + run, i - run);
        rl_buf_add(out, repl, 3);
        i += bad;
        run = i;
    }
    if (!changed) {
        if (len) rl_buf_add(out, text, len);
    } else if (len > run) {
        rl_buf_add(out, text + run, len - run);
    }
    if (len) pthread_cond_signal(&r->cond);
}

static void sch_emit(sch_request *r, const char *text, size_t len) { sch_emit_to(r, &r->out, text, len); }

/* New text from the detokenizer: emit what cannot be part of a stop string, hold back the rest. Returns
 * true when a stop string matched (the text before it is emitted, the match and what follows are not). */
static bool sch_text(sch_request *r, const char *text, size_t len) {
    if (r->p.n_stop == 0) {
        sch_emit(r, text, len);
        return false;
    }
    if (len && rl_buf_add(&r->hold, text, len) != 0) {
        sch_emit(r, text, len); /* no memory to hold it back: better to show it than to lose it */
        return false;
    }
    size_t first = (size_t)-1;
    for (int i = 0; i < r->p.n_stop; i++) {
        const char *m = memmem(r->hold.p, r->hold.len, r->p.stop[i], strlen(r->p.stop[i]));
        if (m && (size_t)(m - r->hold.p) < first) first = (size_t)(m - r->hold.p);
    }
    if (first != (size_t)-1) {
        sch_emit(r, r->hold.p, first);
        r->hold.len = 0;
        return true;
    }
    /* Keep the longest tail that is a proper prefix of some stop string: it may complete later. */
    size_t keep = 0;
    for (int i = 0; i < r->p.n_stop; i++) {
        size_t sl = strlen(r->p.stop[i]);
        for (size_t k = sl - 1 < r->hold.len ? sl - 1 : r->hold.len; k > keep; k--) {
            if (memcmp(r->hold.p + r->hold.len - k, r->p.stop[i], k) == 0) {
                keep = k;
                break;
            }
        }
    }
    sch_emit(r, r->hold.p, r->hold.len - keep);
    if (keep) memmove(r->hold.p, r->hold.p + r->hold.len - keep, keep);
    r->hold.len = keep;
    return false;
}

/* ---- the scheduler thread ---------------------------------------------------------------------------- */

/* Ends a request: frees its slot, wakes its waiter and drops the scheduler's reference. With `flush`, what
 * the detokenizer and the stop matcher still hold is real output and goes out first (not after a stop
 * string matched: what follows the match is never shown). Mutex held. */
static void sch_finish_req(sch_sched *s, sch_request *r, sch_finish fin, const char *msg, bool flush) {
    if (r->slot >= 0) {
        if (flush) {
            const char *text;
            size_t len;
            tok_stream_flush(&r->ts, &text, &len);
            if (len) rl_buf_add(&r->hold, text, len);
            if (r->hold.len) sch_emit(r, r->hold.p, r->hold.len);
            tok_stream_flush(&r->ts_r, &text, &len);
            if (len) sch_emit_to(r, &r->rout, text, len);
            tok_stream_flush(&r->ts_t, &text, &len);
            if (len) sch_emit_to(r, &r->tout, text, len);
        }
        r->hold.len = 0;
        tok_stream_free(&r->ts);
        tok_stream_free(&r->ts_r);
        tok_stream_free(&r->ts_t);
        if (r->p.receipts && s->be.receipts && !r->receipts) r->receipts = s->be.receipts(s->be.impl, r->slot);
        s->be.end(s->be.impl, r->slot);
        s->slots[r->slot] = NULL;
        s->freed[r->slot] = ++s->n_freed;
        s->n_active--;
        r->slot = -1;
    }
    r->fin = fin;
    if (msg) snprintf(r->err, sizeof r->err, "%s", msg);
    s->m.finished[fin]++;
    pthread_cond_broadcast(&r->cond);
    /* Zero only when the submitter let go first (cancel, then release): nobody can be waiting on it. */
    if (--r->refs == 0) sch_request_destroy(r);
    if (s->n_active == 0 && s->n_queued == 0) pthread_cond_broadcast(&s->idle);
}

static void sch_reap(sch_sched *s) {
    for (sch_request **pp = &s->q_head, *prev = NULL; *pp;) {
        sch_request *r = *pp;
        if (!r->cancelled) {
            prev = r;
            pp = &r->next;
            continue;
        }
        *pp = r->next;
        if (s->q_tail == r) s->q_tail = prev;
        s->n_queued--;
        r->next = NULL;
        sch_finish_req(s, r, SCH_FIN_CANCELLED, NULL, false);
    }
    for (int i = 0; i < s->be.n_slots; i++) {
        if (s->slots[i] && s->slots[i]->cancelled) sch_finish_req(s, s->slots[i], SCH_FIN_CANCELLED, NULL, false);
    }
}

/* The request of r's share group that r can be forked from: admitted, running, sharing r's prompt, and not
 * yet past its own prompt's last token. Mutex held. */
static sch_request *sch_leader(sch_sched *s, const sch_request *r) {
    for (int j = 0; j < s->be.n_slots; j++) {
        sch_request *l = s->slots[j];
        if (l && l != r && l->lead && l->p.share == r->p.share && l->fin == SCH_RUNNING && !l->cancelled &&
            l->n_fed < l->n_prompt && l->n_prompt == r->n_prompt &&
            memcmp(l->prompt, r->prompt, r->n_prompt * sizeof *r->prompt) == 0) {
            return l;
        }
    }
    return NULL;
}

/* Whether request r may start from a cached prefix: not when it needs every prompt position computed (the
 * prompt's log-probabilities, receipts of every traversal, DSpark features of every position). */
static bool sch_may_resume(const sch_sched *s, const sch_request *r) {
    return s->be.resume && !r->p.no_cache && !r->p.prompt_logprobs && !r->p.receipts && !r->p.draft_dspark;
}

/* The free slot for r: the one holding the longest prefix of its prompt (a conversation goes back to its slot),
 * else the one idle longest, whose state is the least likely to be asked for again. -1: none free. */
static int sch_pick_slot(sch_sched *s, const sch_request *r) {
    int best = -1;
    uint32_t best_m = 0;
    for (int i = 0; i < s->be.n_slots; i++) {
        if (s->slots[i]) continue;
        uint32_t m = s->be.match && sch_may_resume(s, r) ? s->be.match(s->be.impl, i, r->prompt, r->n_prompt) : 0;
        if (best < 0 || m > best_m || (m == best_m && s->freed[i] < s->freed[best])) best = i, best_m = m;
    }
    return best;
}

static void sch_admit(sch_sched *s) {
    while (s->q_head) {
        int i = sch_pick_slot(s, s->q_head);
        if (i < 0) break;
        sch_request *r = s->q_head;
        s->q_head = r->next;
        if (!s->q_head) s->q_tail = NULL;
        r->next = NULL;
        s->n_queued--;
        r->slot = i;
        r->n_fed = 0;
        r->n_cached = 0;
        r->n_ckpt = 0;
        r->begun = false;
        r->n_hist = 0;
        if (r->p.draft_model && !s->cfg.draft) r->p.draft_n = 0; /* http refuses it; a direct caller too */
        if (r->p.draft_dspark && !s->cfg.dspark) r->p.draft_n = 0;
        if (r->p.draft_model && r->p.draft_n > 0) spec_pool_reset(s->cfg.draft, i);
        r->ds_ok = r->p.draft_dspark && r->p.draft_n > 0;
        rl_err e;
        if (r->ds_ok && spec_drafter_begin(&s->cfg.dspark[i], NULL, 0, 0, &e) != 0) { /* forgets the last context */
            fprintf(stderr, "ringlm serve: DSpark drafter not reset, the request goes without drafts: %s\n", e.msg);
            r->ds_ok = false;
        }
        /* A choice of an n > 1 request: read the prompt once, in whichever came first (sch_params.share). */
        r->lead = r->follow = false;
        if (r->p.share && s->be.fork && r->n_prompt >= 2 && !r->p.prompt_logprobs && !r->p.receipts && !r->p.draft_dspark) {
            r->follow = sch_leader(s, r) != NULL;
            r->lead = !r->follow;
        }
        r->resume = s->be.resume && !r->follow; /* also with reuse off: the slot's old state is kept first */
        r->sp_win_d = r->sp_win_a = r->sp_pause = 0;
        r->sp_next = SCH_SPEC_PAUSE;
        r->gs_on = false;
        if (r->p.draft_n > 0 && r->p.smp.grammar) { /* without its state (no memory) it goes undrafted */
            gr_state_free(&r->gs);
            if (gr_state_init(r->p.smp.grammar, &r->gs) == 0) r->gs_on = true;
            else r->p.draft_n = 0;
        }
        if (r->p.draft_n > 0 && (r->hist = malloc((r->n_prompt + 64) * sizeof *r->hist))) {
            memcpy(r->hist, r->prompt, r->n_prompt * sizeof *r->hist);
            r->n_hist = r->n_prompt;
            r->cap_hist = r->n_prompt + 64;
        }
        tok_stream_init(&r->ts, s->tok, false);
        tok_stream_init(&r->ts_r, s->tok, false);
        tok_stream_init(&r->ts_t, s->tok, true);
        chat_split_init(&r->split, s->tok, r->p.split, r->p.split_fmt, r->p.thinking);
        s->slots[i] = r;
        s->n_active++;
    }
}

/* Handles a freshly sampled token. Mutex held. */
static void sch_on_token(sch_sched *s, sch_request *r, int32_t id, const smp_logprob *lp, double now) {
    if (r->hist) { /* n-gram drafting reads it; without room it just stops growing (drafts get worse) */
        if (r->n_hist == r->cap_hist) {
            int32_t *h = realloc(r->hist, r->cap_hist * 2 * sizeof *h);
            if (h) r->hist = h, r->cap_hist *= 2;
        }
        if (r->n_hist < r->cap_hist) r->hist[r->n_hist++] = id;
    }
    if (r->gs_on && !tok_is_eog(s->tok, id)) { /* as the backend's sampler takes it (smp_take) */
        const smp_vocab *v = r->p.smp.vocab;
        if (id >= 0 && id < v->n) gr_feed(r->p.smp.grammar, &r->gs, v->piece[id], v->len[id]);
    }
    r->n_gen++;
    s->m.gen_tokens++;
    if (r->n_gen == 1) sch_hist_add(&s->m.ttft, now - r->t_arrival);
    else sch_hist_add(&s->m.itl, now - r->t_last);
    r->t_last = now;
    r->last = id;
    if (!r->p.ignore_eos && tok_is_eog(s->tok, id)) {
        sch_finish_req(s, r, SCH_FIN_STOP, NULL, true);
        return;
    }
    if (r->p.token_ids) { /* without room the id is lost, never the text */
        if (r->n_ids == r->cap_ids) {
            size_t c = r->cap_ids ? 2 * r->cap_ids : 32;
            int32_t *ni = realloc(r->ids, c * sizeof *ni);
            if (ni) r->ids = ni, r->cap_ids = c;
        }
        if (r->n_ids < r->cap_ids) r->ids[r->n_ids++] = id;
        pthread_cond_signal(&r->cond);
    }
    if (r->p.logprobs && lp) { /* without room the entry is lost, never the text */
        if (r->n_lp == r->cap_lp) {
            size_t c = r->cap_lp ? 2 * r->cap_lp : 16;
            smp_logprob *nl = realloc(r->lp, c * sizeof *nl);
            if (nl) r->lp = nl, r->cap_lp = c;
        }
        if (r->n_lp < r->cap_lp) r->lp[r->n_lp++] = *lp;
    }
    const char *text;
    size_t len;
    rl_err err;
    chat_chan ch = chat_split_push(&r->split, s->tok, id);
    if (ch == CHAT_CH_REASONING || ch == CHAT_CH_TOOLS) { /* no stop strings there (they end the answer) */
        bool tools = ch == CHAT_CH_TOOLS; /* kept with its control tokens spelled out, for chat_tools_parse */
        if (tok_stream_push(tools ? &r->ts_t : &r->ts_r, id, &text, &len, &err) != 0) {
            sch_finish_req(s, r, SCH_FIN_ERROR, err.msg, false);
            return;
        }
        if (tools) sch_emit_to(r, &r->tout, text, len);
        else sch_emit_to(r, &r->rout, text, len);
        len = 0;
    } else if (ch == CHAT_CH_CONTENT) {
        if (tok_stream_push(&r->ts, id, &text, &len, &err) != 0) {
            sch_finish_req(s, r, SCH_FIN_ERROR, err.msg, false);
            return;
        }
    } else {
        len = 0; /* framing: a section's name */
    }
    if (ch == CHAT_CH_CONTENT && sch_text(r, text, len)) {
        sch_finish_req(s, r, SCH_FIN_STOP, NULL, false);
        return;
    }
    if (r->p.max_tokens > 0 && r->n_gen >= r->p.max_tokens) {
        sch_finish_req(s, r, SCH_FIN_LENGTH, NULL, true);
        return;
    }
    /* Fed so far: the prompt and every sampled token but this one; the next step feeds this one. */
    if (r->n_prompt + (size_t)r->n_gen + 1 > s->be.n_ctx) sch_finish_req(s, r, SCH_FIN_LENGTH, NULL, true);
}

/* A ring's counters, and each new recovery's seconds into the histogram. Mutex held. */
static void sch_ring_take(sch_sched *s, const sch_ring_stat *rs) {
    uint64_t d = rs->recoveries - s->m.ring.recoveries;
    for (uint64_t k = 0; rs->recoveries > s->m.ring.recoveries && k < d && k < 64; k++) {
        sch_hist_add(&s->m.recovery, (rs->recovery_s - s->m.ring.recovery_s) / (double)d);
    }
    s->m.ring = *rs;
}

/* Nothing running: the backend's idle work (a ring's audits and node checks) or a sleep until a request, a
 * cancel or stop. Called and returns with the mutex held. Returns false when the thread should end. */
static bool sch_idle(sch_sched *s) {
    if (s->stopping && s->n_queued == 0) return false;
    if (!s->be.idle || s->n_queued != 0) {
        pthread_cond_wait(&s->cond, &s->mu);
        return true;
    }
    pthread_mutex_unlock(&s->mu);
    int did = s->be.idle(s->be.impl);
    sch_node_stat nodes[SCH_MAX_NODES];
    int n_nodes = s->be.nodes(s->be.impl, nodes, SCH_MAX_NODES);
    sch_ring_stat rs = {0};
    if (s->be.ring_stats) s->be.ring_stats(s->be.impl, &rs);
    pthread_mutex_lock(&s->mu);
    sch_ring_take(s, &rs);
    s->m.n_nodes = n_nodes; /* idle work may have found a node gone or back: /health shows it */
    memcpy(s->m.nodes, nodes, (size_t)n_nodes * sizeof *nodes);
    if (did > 0) return true; /* maybe more, unless requests came meanwhile (the loop admits them first) */
    /* Nothing now: sleep until a request, a cancel or stop, but call idle() again within a second (the
     * backend paces its own background checks), or when it said it will have work. */
    if (!s->stopping) {
        const long ms = did < 0 && -did < 1000 ? -did : 1000;
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += ms * 1000000L;
        until.tv_sec += until.tv_nsec / 1000000000L;
        until.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&s->cond, &s->mu, &until);
    }
    return true;
}

/* Prompt cache lookups of the requests just admitted (backend.resume), outside the mutex like forks: restoring
 * a long prefix copies its state. A lookup that fails costs the request its cached prefix, nothing more.
 * Called and returns with the mutex held. */
static void sch_resumes(sch_sched *s) {
    int nr = 0;
    for (int i = 0; i < s->be.n_slots; i++) {
        sch_request *r = s->slots[i];
        if (r && r->resume) s->f_src[nr++] = i;
    }
    if (nr == 0) return;
    pthread_mutex_unlock(&s->mu);
    for (int k = 0; k < nr; k++) {
        sch_request *r = s->slots[s->f_src[k]];
        uint32_t got = 0;
        rl_err e;
        /* A leader of n > 1 choices reads all but the last token, which must then be a piece of two or more
         * too: it resumes within the prompt less that token. */
        const size_t n = r->lead && r->n_prompt > 1 ? r->n_prompt - 1 : r->n_prompt;
        if (s->be.resume(s->be.impl, r->slot, r->prompt, n, sch_may_resume(s, r), &got, &e) != 0) {
            fprintf(stderr, "ringlm serve: the prompt cache could not restore a prefix, the request reads its whole "
                            "prompt: %s\n", e.msg);
            got = 0;
        }
        s->f_dst[k] = (int)got;
    }
    pthread_mutex_lock(&s->mu);
    for (int k = 0; k < nr; k++) {
        sch_request *r = s->slots[s->f_src[k]];
        const bool looked = sch_may_resume(s, r);
        r->resume = false;
        r->n_cached = (uint32_t)s->f_dst[k];
        r->n_fed = r->n_cached;
        r->n_ckpt = r->n_cached;
        s->m.prompt_cached += r->n_cached;
        if (looked && r->n_cached > 0) s->m.cache_hits++;
        else if (looked) s->m.cache_misses++;
    }
}

/* Forks: a request waiting for its group's first to read all but the last prompt token gets a copy of that
 * state (outside the mutex: a ring's fork is a round trip; only this thread touches slots). One whose first
 * went away reads its prompt itself. Called and returns with the mutex held. */
static void sch_forks(sch_sched *s) {
    int nf = 0;
    for (int i = 0; i < s->be.n_slots; i++) {
        sch_request *r = s->slots[i], *l = r && r->follow ? sch_leader(s, r) : NULL;
        if (r && r->follow && !l) r->follow = false;
        if (l && l->n_fed + 1 == l->n_prompt) s->f_src[nf] = l->slot, s->f_dst[nf++] = i;
    }
    if (nf == 0) return;
    pthread_mutex_unlock(&s->mu);
    for (int k = 0; k < nf; k++) {
        rl_err e;
        if (s->be.fork(s->be.impl, s->f_src[k], s->f_dst[k], &s->slots[s->f_dst[k]]->p.smp, &e) != 0) {
            fprintf(stderr, "ringlm serve: a choice could not share its prompt's state, it reads the prompt itself: %s\n",
                    e.msg);
            s->f_src[k] = -1;
        }
    }
    pthread_mutex_lock(&s->mu);
    for (int k = 0; k < nf; k++) {
        sch_request *r = s->slots[s->f_dst[k]];
        r->follow = false;
        if (s->f_src[k] < 0) continue;
        r->begun = true;
        r->n_fed = r->n_prompt - 1;
        s->m.prompt_shared += r->n_fed;
    }
}

/* The next prompt piece of a request with `left` tokens to read and `budget` left in this step: at most the
 * budget, never one token out of several, never leaving one behind. 0: none this step. With the whole budget
 * (full) a piece is always given, going one or two tokens over a budget under 3 rather than never ending. */
static uint32_t sch_piece(size_t left, uint32_t budget, bool full) {
    if (left <= 1) return (uint32_t)left;
    uint32_t k = left < budget ? (uint32_t)left : budget;
    if (left - k == 1) k--;             /* leave two or none */
    if (k >= 2) return k;
    if (!full) return 0;
    return left == 3 ? 3 : 2;           /* a budget of 1 or 2 */
}

/* The step's batch, under the mutex: decode tokens first (every generating sequence moves each step, with
 * its n-gram drafts; those a draft model or DSpark drafts are listed for sch_drafts), then prompt chunks,
 * oldest request first, within the step's prompt budget. Returns the number of entries. */
static int sch_batch(sch_sched *s, int *nd_model, int *nd_ds) {
    int n = 0;
    *nd_model = *nd_ds = 0;
    uint32_t budget = s->cfg.chunk;
    for (int i = 0; i < s->be.n_slots; i++) {
        sch_request *r = s->slots[i];
        if (!r || r->n_fed < r->n_prompt) continue;
        s->steps[n] = (sch_step){.slot = i, .n_tokens = 1, .tokens = &r->last, .sample = true,
                                 .logprobs = r->p.logprobs, .taps = r->ds_ok};
        /* Speculation: prompt lookup over the request's tokens, bounded by what is left to generate and the
         * context (fed so far: the prompt and every sampled token but the last). */
        int k = r->hist ? r->p.draft_n : 0;
        if (k > SCH_MAX_DRAFT) k = SCH_MAX_DRAFT;
        if (r->p.max_tokens > 0 && r->p.max_tokens - r->n_gen - 1 < k) k = r->p.max_tokens - r->n_gen - 1;
        int64_t room = (int64_t)s->be.n_ctx - (int64_t)(r->n_prompt + (size_t)r->n_gen);
        if (room < k) k = (int)room;
        if (k > 0 && r->sp_pause > 0) { /* drafts paused: they were not paying (SCH_SPEC_*) */
            r->sp_pause--;
            s->m.spec_paused_steps++;
            k = 0;
        }
        if (k > 0 && r->p.draft_model) { /* drafted by sch_drafts, for all such requests at once */
            s->d_entry[*nd_model] = n;
            s->d_slot[*nd_model] = i;
            s->d_k[*nd_model] = k;
            s->d_hist[*nd_model] = r->hist;
            s->d_nhist[(*nd_model)++] = r->n_hist;
            k = 0;
        }
        if (r->p.draft_dspark) { /* drafted by sch_drafts, from the features of its committed positions */
            if (k > 0 && r->ds_ok) s->s_entry[*nd_ds] = n, s->s_k[(*nd_ds)++] = k;
            k = 0;
        }
        int nd = k > 0 ? spec_ngram(r->hist, r->n_hist, k, s->blocks[i] + 1) : 0;
        if (nd > 0) {
            s->blocks[i][0] = r->last;
            s->steps[n].tokens = s->blocks[i];
            s->steps[n].n_tokens = (uint32_t)nd + 1;
            s->steps[n].n_draft = nd;
        }
        s->step_req[n++] = r;
    }
    for (;;) {
        sch_request *best = NULL;
        for (int i = 0; i < s->be.n_slots; i++) {
            sch_request *r = s->slots[i];
            bool taken = false;
            for (int k = 0; k < n && !taken; k++) taken = s->step_req[k] == r;
            if (r && !taken && !r->follow && r->n_fed < r->n_prompt && (!best || r->t_arrival < best->t_arrival)) best = r;
        }
        if (!best || budget == 0) break;
        size_t left = best->n_prompt - best->n_fed;
        uint32_t k = left < budget ? (uint32_t)left : budget;
        if (best->p.prompt_logprobs) k = (uint32_t)left; /* one step: every row scores the next token */
        if (best->lead && left > 1 && k > left - 1) k = (uint32_t)(left - 1); /* the others fork from here */
        /* Pieces of one token round differently from longer ones (a matmul of one column takes another
         * kernel), so a prompt is read in pieces of two or more and never leaves a single token for later:
         * then any split of it gives the same bits, and a prompt resumed from a cache checkpoint equals one
         * read whole (docs/numerics.md, "Split invariance"). A 1-token prompt is one piece of one. */
        if (!best->lead && !best->p.prompt_logprobs) k = sch_piece(left, budget, budget == s->cfg.chunk);
        if (k == 0) break; /* waits for a step with more of the budget left */
        const bool end = best->n_fed + k == best->n_prompt;
        /* Checkpoints where a prompt (or a leader's part of it) ends, and every ckpt_every tokens; only after a
         * piece of two or more tokens, whose state a fresh read of any split reproduces (a one-token piece's
         * does not: it is a leader's followers' last token, or a one-token prompt). */
        const bool lead_end = best->lead && best->n_fed + k + 1 == best->n_prompt;
        const bool ckpt = s->be.resume && k >= 2 &&
                          (end || lead_end || (s->cfg.ckpt_every > 0 && best->n_fed + k - best->n_ckpt >= s->cfg.ckpt_every));
        if (ckpt) best->n_ckpt = best->n_fed + k;
        s->steps[n] = (sch_step){.slot = best->slot, .begin = !best->begun, .n_cached = best->n_cached,
                                 .ckpt = ckpt, .smp = &best->p.smp,
                                 .receipts = best->p.receipts, .taps = best->ds_ok,
                                 .n_tokens = k, .tokens = best->prompt + best->n_fed,
                                 .sample = end, .logprobs = best->p.logprobs,
                                 .prompt_lp = best->p.prompt_logprobs, .plp = best->plp};
        best->begun = true;
        s->step_req[n++] = best;
        budget = k >= budget ? 0 : budget - k;
    }
    return n;
}

/* The drafts of the batch's draft-model and DSpark entries, outside the mutex (r->hist changes on this
 * thread only), then every drafted block cut where the request's grammar refuses it (not worth verifying).
 * A drafting failure costs drafts, never requests. Returns the seconds drafting took; *refused, the drafts
 * the grammar cut. */
static double sch_drafts(sch_sched *s, int n, int nd_model, int nd_ds, uint64_t *refused) {
    rl_err err = {{0}};
    double t0 = rl_clock_now();
    if (nd_model > 0) { /* the draft model, for every request that uses it at once */
        if (spec_pool_propose(s->cfg.draft, nd_model, s->d_slot, s->d_hist, s->d_nhist, s->d_k, &s->d_out[0][0],
                              SCH_MAX_DRAFT, s->d_n, &err) != 0) {
            fprintf(stderr, "ringlm serve: drafting failed, this step goes without drafts: %s\n", err.msg);
        }
        for (int d = 0; d < nd_model; d++) {
            int slot = s->d_slot[d], e = s->d_entry[d], nd = s->d_n[d];
            if (nd <= 0) continue;
            s->blocks[slot][0] = *s->steps[e].tokens;
            memcpy(&s->blocks[slot][1], s->d_out[d], (size_t)nd * sizeof(int32_t));
            s->steps[e].tokens = s->blocks[slot];
            s->steps[e].n_tokens = (uint32_t)nd + 1;
            s->steps[e].n_draft = nd;
        }
    }
    for (int d = 0; d < nd_ds; d++) {
        /* DSpark, one block per request: [last, MASK...] over the features the target gave so far. A drafter
         * out of step with its sequence (a failure below) stops drafting for the request; the request itself
         * goes on, undrafted. */
        int e = s->s_entry[d];
        sch_request *r = s->step_req[e];
        int32_t *blk = s->blocks[r->slot];
        const spec_q *qs;
        int nd = 0;
        if (spec_drafter_propose(&s->cfg.dspark[r->slot], r->hist, r->n_hist, r->n_hist, s->s_k[d], blk + 1, &nd, &qs,
                                 &err) != 0) {
            fprintf(stderr, "ringlm serve: DSpark drafting failed, the request goes on without drafts: %s\n", err.msg);
            r->ds_ok = false;
            s->steps[e].taps = false;
            continue;
        }
        if (nd <= 0) continue;
        blk[0] = r->last;
        s->steps[e].tokens = blk;
        s->steps[e].n_tokens = (uint32_t)nd + 1;
        s->steps[e].n_draft = nd;
    }
    double t_draft = nd_model > 0 || nd_ds > 0 ? rl_clock_now() - t0 : 0;
    *refused = 0;
    for (int k = 0; k < n; k++) {
        sch_step *sp = &s->steps[k];
        sch_request *r = s->step_req[k];
        if (sp->n_draft <= 0 || !r->gs_on) continue;
        int ok = smp_grammar_prefix(&r->p.smp, &r->gs, r->n_gen, sp->tokens + 1, sp->n_draft, &r->gtry);
        *refused += (uint64_t)(sp->n_draft - ok);
        sp->n_draft = ok;
        sp->n_tokens = (uint32_t)ok + 1;
    }
    return t_draft;
}

/* What entry k of a step that returned rc brought its request, under the mutex: a failure ends it; prompt
 * tokens and their log-probabilities are counted in; DSpark features go to its drafter; the sampled or
 * committed tokens go through sch_on_token (r stays valid after it ends: an uncancelled request still holds
 * its submitter's reference, so sch_finish_req does not free it). */
static void sch_take(sch_sched *s, int k, int rc, const rl_err *err, double now) {
    sch_request *r = s->step_req[k];
    sch_step *sp = &s->steps[k];
    if (rc != 0) {
        r->unavailable = rc == SCH_STEP_UNAVAILABLE;
        sch_finish_req(s, r, SCH_FIN_ERROR, err->msg, false);
        return;
    }
    s->m.step_tokens += sp->n_tokens;
    if (r->n_fed < r->n_prompt) {
        r->n_fed += sp->n_tokens;
        s->m.prompt_tokens += sp->n_tokens;
        if (sp->prompt_lp && sp->n_tokens > 1) { /* the prompt's entries come before the generated ones */
            size_t need = r->n_lp + sp->n_tokens - 1;
            if (need > r->cap_lp) {
                smp_logprob *nl = realloc(r->lp, need * sizeof *nl);
                if (nl) r->lp = nl, r->cap_lp = need;
            }
            if (need <= r->cap_lp) {
                memcpy(r->lp + r->n_lp, sp->plp, (sp->n_tokens - 1) * sizeof *sp->plp);
                r->n_lp = need;
            }
        }
    }
    if (r->cancelled) return; /* reaped at the top of the loop */
    if (sp->taps && r->ds_ok) { /* the features of the positions the target ran and kept */
        uint32_t rows = sp->n_draft > 0 ? (uint32_t)sp->n_out : sp->n_tokens;
        rl_err e;
        if (!sp->feat || spec_drafter_features(&s->cfg.dspark[r->slot], sp->feat, rows, &e) != 0) {
            fprintf(stderr, "ringlm serve: DSpark features lost, the request goes on without drafts: %s\n",
                    sp->feat ? e.msg : "the backend returned none");
            r->ds_ok = false;
        }
    }
    if (sp->n_draft > 0) { /* the committed tokens in order, until one ends the request */
        s->m.drafted += (uint64_t)sp->n_draft;
        s->m.accepted += (uint64_t)(sp->n_out - 1);
        r->drafted += sp->n_draft;
        r->accepted += sp->n_out - 1;
        r->sp_win_d += sp->n_draft;
        r->sp_win_a += sp->n_out - 1;
        if (r->sp_win_d >= SCH_SPEC_WINDOW) { /* judge the window: too few kept, and plain decoding is cheaper */
            if (r->sp_win_a * SCH_SPEC_MIN_KEPT < r->sp_win_d && !s->cfg.no_draft_fallback) {
                r->sp_pause = r->sp_next;
                r->sp_next = r->sp_next * 2 < SCH_SPEC_PAUSE_MAX ? r->sp_next * 2 : SCH_SPEC_PAUSE_MAX;
                s->m.spec_fallbacks++;
            } else {
                r->sp_next = SCH_SPEC_PAUSE;
            }
            r->sp_win_d = r->sp_win_a = 0;
        }
        for (int t = 0; t < sp->n_out && r->fin == SCH_RUNNING; t++) {
            sch_on_token(s, r, sp->out[t], sp->logprobs ? &sp->lp[t] : NULL, now);
        }
    } else if (sp->sample) {
        sch_on_token(s, r, sp->token, sp->logprobs ? &sp->lp[0] : NULL, now);
    }
}

/* The scheduler thread: the loop of scheduler.h, one step per turn. The requests of a step stay in their
 * slots while the mutex is released for the drafts and the step: only this thread removes them, and a
 * cancel merely marks them. */
static void *sch_main(void *arg) {
    sch_sched *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        sch_reap(s);
        sch_admit(s);
        if (s->n_active == 0) {
            if (!sch_idle(s)) break;
            continue;
        }
        sch_resumes(s);
        sch_forks(s);
        int nd_model, nd_ds;
        int n = sch_batch(s, &nd_model, &nd_ds);
        pthread_mutex_unlock(&s->mu);

        uint64_t refused;
        double t_draft = sch_drafts(s, n, nd_model, nd_ds, &refused);
        rl_err err = {{0}};
        double t0 = rl_clock_now();
        int rc = s->be.step(s->be.impl, s->steps, n, &err);
        double t1 = rl_clock_now();
        sch_node_stat nodes[SCH_MAX_NODES];
        int n_nodes = s->be.nodes(s->be.impl, nodes, SCH_MAX_NODES);
        sch_ring_stat rs = {0};
        if (s->be.ring_stats) s->be.ring_stats(s->be.impl, &rs);
        sch_cache_stat cs = {0};
        if (s->be.cache_stats) s->be.cache_stats(s->be.impl, &cs);

        pthread_mutex_lock(&s->mu);
        sch_ring_take(s, &rs);
        if (s->be.cache_stats) s->m.has_cache = true, s->m.cache = cs;
        s->m.steps++;
        s->m.busy_s += t1 - t0;
        if (s->be.xc) s->m.has_xc = true, s->m.xc = *s->be.xc;
        s->m.draft_s += t_draft;
        s->m.draft_refused += refused;
        sch_hist_add(&s->m.step_s, t1 - t0);
        s->m.n_nodes = n_nodes;
        memcpy(s->m.nodes, nodes, (size_t)n_nodes * sizeof *nodes);
        for (int k = 0; k < n; k++) sch_take(s, k, rc, &err, t1);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* ---- setup and control ------------------------------------------------------------------------------- */

static void sch_free_scratch(sch_sched *s) {
    free(s->slots);
    free(s->steps);
    free(s->step_req);
    free(s->blocks);
    free(s->d_entry);
    free(s->d_slot);
    free(s->d_k);
    free(s->d_n);
    free(s->d_hist);
    free(s->d_nhist);
    free(s->d_out);
    free(s->s_entry);
    free(s->s_k);
    free(s->f_src);
    free(s->f_dst);
    free(s->freed);
}

int sch_init(sch_sched *s, const sch_backend *be, const tok_tokenizer *tok, const sch_config *cfg, rl_err *err) {
    memset(s, 0, sizeof *s);
    s->be = *be;
    s->tok = tok;
    s->cfg = *cfg;
    if (s->cfg.chunk < 1) s->cfg.chunk = 1;
    if (s->cfg.queue_cap < 0) s->cfg.queue_cap = 0;
    s->slots = calloc((size_t)be->n_slots, sizeof *s->slots);
    /* A step holds at most one entry per slot. */
    s->steps = calloc((size_t)be->n_slots, sizeof *s->steps);
    s->step_req = calloc((size_t)be->n_slots, sizeof *s->step_req);
    s->blocks = calloc((size_t)be->n_slots, sizeof *s->blocks);
    size_t ns = (size_t)be->n_slots;
    s->d_entry = calloc(ns, sizeof *s->d_entry);
    s->d_slot = calloc(ns, sizeof *s->d_slot);
    s->d_k = calloc(ns, sizeof *s->d_k);
    s->d_n = calloc(ns, sizeof *s->d_n);
    s->d_hist = calloc(ns, sizeof *s->d_hist);
    s->d_nhist = calloc(ns, sizeof *s->d_nhist);
    s->d_out = calloc(ns, sizeof *s->d_out);
    s->s_entry = calloc(ns, sizeof *s->s_entry);
    s->s_k = calloc(ns, sizeof *s->s_k);
    s->f_src = calloc(ns, sizeof *s->f_src);
    s->f_dst = calloc(ns, sizeof *s->f_dst);
    s->freed = calloc(ns, sizeof *s->freed);
    if (!s->freed || !s->f_src || !s->f_dst || !s->slots || !s->steps || !s->step_req || !s->blocks || !s->d_entry || !s->d_slot || !s->d_k || !s->d_n ||
        !s->d_hist || !s->d_nhist || !s->d_out || !s->s_entry || !s->s_k) {
        sch_free_scratch(s);
        return rl_errf(err, "out of memory");
    }
    if (s->cfg.dspark) { /* the backend returns the stream at the draft's tap layers from now on */
        const uint32_t *layers;
        int nt = spec_drafter_taps(&s->cfg.dspark[0], &layers);
        if (!be->set_taps || nt <= 0 || be->set_taps(be->impl, layers, nt, err) != 0) {
            if (!be->set_taps || nt <= 0) rl_errf(err, "DSpark drafts need a backend that returns the target's hidden states");
            sch_free_scratch(s);
            return -1;
        }
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cond, NULL);
    pthread_cond_init(&s->idle, NULL);
    static const double ttft_le[] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
    static const double itl_le[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5};
    sch_hist_init(&s->m.ttft, ttft_le, (int)(sizeof ttft_le / sizeof *ttft_le));
    sch_hist_init(&s->m.itl, itl_le, (int)(sizeof itl_le / sizeof *itl_le));
    sch_hist_init(&s->m.step_s, itl_le, (int)(sizeof itl_le / sizeof *itl_le));
    static const double rec_le[] = {0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300};
    sch_hist_init(&s->m.recovery, rec_le, (int)(sizeof rec_le / sizeof *rec_le));
    s->m.n_slots = be->n_slots;
    s->m.queue_cap = s->cfg.queue_cap;
    s->m.backend = be->kind;
    s->m.n_nodes = be->nodes(be->impl, s->m.nodes, SCH_MAX_NODES);
    if (be->cache_stats) {
        s->m.has_cache = true;
        be->cache_stats(be->impl, &s->m.cache);
    }
    return 0;
}

int sch_start(sch_sched *s, rl_err *err) {
    int rc = pthread_create(&s->thread, NULL, sch_main, s);
    if (rc != 0) return rl_errf(err, "cannot start the scheduler thread: %s", strerror(rc));
    s->started = true;
    return 0;
}

void sch_close(sch_sched *s) {
    pthread_mutex_lock(&s->mu);
    s->closed = true;
    pthread_mutex_unlock(&s->mu);
}

bool sch_wait_idle(sch_sched *s, double timeout_s) {
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    double t = (double)dl.tv_sec + (double)dl.tv_nsec * 1e-9 + timeout_s;
    dl.tv_sec = (time_t)t;
    dl.tv_nsec = (long)((t - (double)dl.tv_sec) * 1e9);
    pthread_mutex_lock(&s->mu);
    while (s->n_active + s->n_queued > 0) {
        if (pthread_cond_timedwait(&s->idle, &s->mu, &dl) == ETIMEDOUT) break;
    }
    bool idle = s->n_active + s->n_queued == 0;
    pthread_mutex_unlock(&s->mu);
    return idle;
}

void sch_cancel_all(sch_sched *s) {
    pthread_mutex_lock(&s->mu);
    for (sch_request *r = s->q_head; r; r = r->next) r->cancelled = true;
    for (int i = 0; i < s->be.n_slots; i++) {
        if (s->slots[i]) s->slots[i]->cancelled = true;
    }
    pthread_cond_signal(&s->cond);
    pthread_mutex_unlock(&s->mu);
}

void sch_abort(sch_sched *s) {
    sch_cancel_all(s);
    if (s->be.abort) s->be.abort(s->be.impl);
}

void sch_free(sch_sched *s) {
    if (s->started && s->be.abort) s->be.abort(s->be.impl); /* the thread must not wait on a node now */
    if (s->started) {
        pthread_mutex_lock(&s->mu);
        s->closed = s->stopping = true;
        pthread_cond_signal(&s->cond);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
    }
    if (s->be.free) s->be.free(s->be.impl);
    pthread_cond_destroy(&s->cond);
    pthread_cond_destroy(&s->idle);
    pthread_mutex_destroy(&s->mu);
    sch_free_scratch(s);
    memset(s, 0, sizeof *s);
}

sch_submit_rc sch_submit(sch_sched *s, sch_request *r, rl_err *err) { return sch_submit_all(s, &r, 1, err); }

sch_submit_rc sch_submit_all(sch_sched *s, sch_request *const *rs, int n, rl_err *err) {
    for (int k = 0; k < n; k++) {
        const sch_request *r = rs[k];
        if (r->n_prompt == 0) {
            rl_errf(err, "the prompt is empty");
            return SCH_BAD_PROMPT;
        }
        if (r->n_prompt >= s->be.n_ctx) {
            rl_errf(err, "the prompt has %zu tokens but the context holds %u (and at least one must be generated)",
                    r->n_prompt, s->be.n_ctx);
            return SCH_BAD_PROMPT;
        }
        for (size_t i = 0; i < r->n_prompt; i++) {
            if (r->prompt[i] < 0 || (uint32_t)r->prompt[i] >= s->be.n_vocab) {
                rl_errf(err, "token id %d at position %zu is outside the vocabulary of %u", r->prompt[i], i, s->be.n_vocab);
                return SCH_BAD_PROMPT;
            }
        }
    }
    pthread_mutex_lock(&s->mu);
    if (s->closed) {
        pthread_mutex_unlock(&s->mu);
        rl_errf(err, "the server is shutting down");
        return SCH_CLOSED;
    }
    /* Full when every slot is taken and the queue too. Counting slots not yet claimed by the scheduler
     * thread keeps the answer independent of how quickly it picks requests up. */
    if (s->n_active + s->n_queued + n > s->be.n_slots + s->cfg.queue_cap) {
        pthread_mutex_unlock(&s->mu);
        rl_errf(err, "all %d sequence slots are busy and %d requests are already waiting%s", s->be.n_slots,
                s->n_queued, n > 1 ? " (no room for all the choices)" : "");
        return SCH_QUEUE_FULL;
    }
    const double now = rl_clock_now();
    for (int k = 0; k < n; k++) {
        sch_request *r = rs[k];
        r->s = s;
        r->refs++;
        r->t_arrival = now;
        if (s->q_tail) s->q_tail->next = r;
        else s->q_head = r;
        s->q_tail = r;
        s->n_queued++;
    }
    pthread_cond_signal(&s->cond);
    pthread_mutex_unlock(&s->mu);
    return SCH_OK;
}

void sch_metrics_get(sch_sched *s, sch_metrics *m) {
    pthread_mutex_lock(&s->mu);
    *m = s->m;
    m->active = s->n_active;
    m->queued = s->n_queued;
    pthread_mutex_unlock(&s->mu);
}
