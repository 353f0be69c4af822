/* Folder src/serve/: the OpenAI-compatible HTTP server, the continuous-batching scheduler, the chat page. May
 * include: base, model, text, speculate, coord, net. (README "Layout"; tests/t_layout.sh checks both.)
 */
/* scheduler.h - continuous batching: many generation requests share one model, one forward pass per step.
 *
 * One scheduler thread owns the backend (the model). Requests arrive from any thread (sch_submit) into a
 * bounded queue; the thread admits them into free slots (at most n_slots sequences at once, each with its
 * own state of n_ctx tokens) and loops:
 *
 *   1. drop cancelled requests (a client that went away) and free their slots;
 *   2. fill free slots from the queue, oldest first;
 *   3. build ONE batch: a decode token for every sequence that is generating, plus prefill chunks of
 *      sequences still reading their prompt (oldest first, at most `chunk` prompt tokens per step in all);
 *   4. one backend step over that batch; every sequence that asked for it gets its next token;
 *   5. per request: stop checks (end-of-generation token, stop strings, max_tokens, context full), text
 *      through a UTF-8-safe streaming detokenizer, and the new text appended to the request where the
 *      thread that submitted it waits for it (sch_request_wait).
 *
 * So a new request starts its prefill at the next step instead of waiting for others to finish, and
 * running streams keep getting a token every step while it does.
 *
 * The scheduler knows nothing of HTTP: text in, text and a finish reason out. It knows nothing of where
 * the model runs either: every forward pass goes through an sch_backend (below). sch_backend_local
 * (backend_local.h) runs it on this machine with a k3_engine; a ring backend can take its place without touching this file. */
#ifndef RINGLM_SCHEDULER_H
#define RINGLM_SCHEDULER_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/buf.h"
#include "../base/err.h"
#include "../model/expert_cache.h"
#include "../model/k3_forward.h"
#include "../speculate/spec_gen.h"
#include "../text/chat_out.h"
#include "../text/sampler.h"
#include "../text/tokenizer.h"

/* ---- the backend contract ----------------------------------------------------------------------------
 *
 * A backend holds n_slots sequences, addressed by slot index, each able to hold n_ctx tokens, and the
 * sampler of each (sampling happens where the logits are: on a ring that is the last stage, so the
 * sampler travels with the sequence rather than living here).
 *
 * step(): runs one forward pass over n entries, each a distinct slot with >= 1 tokens. An entry with
 * `begin` starts a fresh sequence in its slot (position 0, empty state) and a fresh sampler built from
 * *smp; later entries of that slot continue where the previous one stopped. Every token given to a
 * sequence also enters its sampler's penalty history, in order (the prompt counts, as in gen_run). An
 * entry with `sample` gets the token sampled from the logits after its last token in `token`. Returns 0,
 * or -1 with err set, or SCH_STEP_UNAVAILABLE with err set when the model cannot be reached (a ring with a
 * node down): the same failure, but its requests are answered 503 rather than 500. After a failure the
 * scheduler gives up the sequences of that batch (it ends them and fails their requests), so a backend
 * need not roll anything back.
 *
 * end(): the sequence in `slot` is finished or abandoned; the slot's next entry will have `begin`.
 * nodes(): what /health and /metrics show per node (fills up to max, returns the count).
 *
 * All three are called from the scheduler thread only, never concurrently. */
#define SCH_STEP_UNAVAILABLE (-2)
/* Speculation that does not pay falls back to plain decoding, per request, as `run` does (speculate/spec_gen.h,
 * SPEC_FALLBACK_*: the same window, threshold and pauses); a probe's cost (a draft model catching up, then
 * drafting) is spread over the pause. */
#define SCH_SPEC_WINDOW SPEC_FALLBACK_WINDOW
#define SCH_SPEC_MIN_KEPT SPEC_FALLBACK_MIN_KEPT
#define SCH_SPEC_PAUSE SPEC_FALLBACK_PAUSE
#define SCH_SPEC_PAUSE_MAX SPEC_FALLBACK_PAUSE_MAX
#define SCH_MAX_DRAFT 16

/* Speculative entries (n_draft > 0): tokens are [last, d1 .. dk], the drafts after the last sampled token;
 * the backend runs all k+1 and keeps the longest prefix of drafts its sampler agrees with (spec/accept.h),
 * returning the committed tokens (accepted drafts, then its own token) in out[0 .. n_out). The rejected
 * part is the backend's to drop before the slot's next entry, which continues after the committed ones. */
typedef struct sch_step {
    int slot;
    bool begin;
    uint32_t n_cached;     /* with begin: the slot already holds the state after the first n_cached prompt tokens
                            * (resume() put it there); tokens are the ones after them, and those n_cached enter
                            * the fresh sampler's penalty history first */
    bool ckpt;             /* keep a checkpoint of the slot's state after this entry (a prompt piece), which
                            * resume() can return to */
    const smp_params *smp; /* read when begin */
    bool receipts;         /* read when begin: keep this sequence's receipts (sch_backend.receipts) */
    uint32_t n_tokens;
    const int32_t *tokens;
    bool sample;
    int32_t token; /* out, when sample */
    int n_draft;   /* speculative: drafts after the first token (sample is true) */
    int32_t out[SCH_MAX_DRAFT + 1]; /* out, when n_draft > 0 */
    int n_out;
    bool prompt_lp;     /* return plp: the log-probabilities of this entry's own tokens after the first */
    smp_logprob *plp;   /* out, when prompt_lp: n_tokens - 1 entries, entry t = tokens[t + 1] at row t */
    bool logprobs;      /* read with sample: also return lp (below) */
    smp_logprob lp[SCH_MAX_DRAFT + 1]; /* out, when logprobs: of token, or of out[0 .. n_out) (smp_logprobs) */
    bool taps;          /* DSpark (after set_taps): return this entry's features */
    const float *feat;  /* out, when taps: n_tokens rows of n_taps * n_embd floats, token-major (the stream
                         * entering each tap layer at each of its tokens); valid until the next step */
} sch_step;

typedef struct sch_node_stat {
    char name[64];
    char addr[128];        /* where it is ("local" for this process) */
    uint32_t layer_a, layer_b;
    bool up;
    double compute_s;      /* seconds spent computing forward passes, in total */
    uint64_t steps;        /* forward passes */
    bool faulty;           /* caught lying (a receipt check or an audit): out of the ring for good */
    int stage;             /* its stage in the ring that is open, -1 when it holds none (a standby, or down) */
    bool standby;          /* ring.conf calls it a standby */
    char reach[12];        /* "direct", "dial-out" (to this server's relay), "relayed" (another's): coord.h ring_reach */
    char relay[128];       /* the relay it dialled out to ("" when direct) */
    char fault[256];       /* what was caught */
    uint64_t audits;       /* audits of this node, and the seconds they took */
    double audit_s;
} sch_node_stat;

#define SCH_MAX_NODES 64

/* A ring's recoveries (sch_backend.ring_stats): rings re-formed under running requests, the seconds that took
 * (re-plan, re-assign), the tokens replayed to rebuild sequences, and how many rings were opened in all. */
typedef struct sch_ring_stat {
    uint64_t recoveries, replayed, generation;
    double recovery_s;
} sch_ring_stat;

/* A backend's prompt cache (sch_backend.cache_stats). */
typedef struct sch_cache_stat {
    uint64_t ckpts;          /* checkpoints held in slots now */
    size_t ckpt_bytes;       /* their bytes (KDA state; MLA rows stay in the slot) */
    uint64_t entries;        /* host-RAM cache entries now, their bytes, and its budget */
    size_t host_bytes, host_budget;
    uint64_t stored, evicted, corrupt; /* host entries stored, evicted for room, dropped as corrupt */
    bool exact;              /* a resumed prompt gives the bits a fresh read gives (docs/numerics.md) */
} sch_cache_stat;

typedef struct sch_backend {
    void *impl;
    int n_slots;
    uint32_t n_ctx;
    uint32_t n_vocab; /* token ids must be below this (checked at submit: one bad id would fail a batch) */
    const char *kind; /* "local", later "ring" */
    int (*step)(void *impl, sch_step *steps, int n, rl_err *err);
    void (*end)(void *impl, int slot);
    int (*nodes)(void *impl, sch_node_stat *out, int max);
    void (*free)(void *impl);
    /* Optional: background work while nothing runs (the ring's audits, the prompt cache's re-reads). Called on
     * the scheduler thread without the mutex; returns 1 when it did something (it is called again), 0 when
     * there is nothing, or -ms when there will be something in ms milliseconds (it is called again then, or
     * when a request comes). */
    int (*idle)(void *impl);
    /* Optional (a ring with receipts): the signed receipts of every traversal that carried the slot's
     * sequence, as a malloc'ed JSON array (docs/receipts.md's objects); called once as the sequence ends,
     * before end(). NULL when there are none to give. */
    char *(*receipts)(void *impl, int slot);
    /* Optional (needed for DSpark drafts): from now on, entries with `taps` return the stream entering
     * these target layers (docs/k3-spec.md §10.1.3), in this order. Called once, before the first step. */
    int (*set_taps)(void *impl, const uint32_t *layers, int n, rl_err *err);
    /* Optional: slot dst begins as a copy of slot src's sequence where it stands (positions, state), with a
     * fresh sampler built from *smp whose penalty history is src's; dst's next entry continues it (no
     * `begin`). The scheduler forks a prompt read once into the slots of the other choices (n > 1). */
    int (*fork)(void *impl, int src, int dst, const smp_params *smp, rl_err *err);
    /* Optional (a prompt cache, docs/serve.md): makes `slot` hold the state after the longest prefix of
     * tokens[0 .. n) the backend can restore exactly (the slot's own checkpoints or its host-RAM cache), at most
     * n - 2 tokens (what follows is read as a piece of two tokens or more, which split invariance needs), and
     * says how long in *n_cached (0: none; the slot then begins empty). What the slot held before is kept in
     * the host cache first when it is worth keeping. reuse false (cache_prompt: false): nothing is restored,
     * but what the slot held is still kept. The slot's next entry has begin and n_cached. Errors only on
     * failure to restore (the request then reads its whole prompt: *n_cached is 0). */
    int (*resume)(void *impl, int slot, const int32_t *tokens, size_t n, bool reuse, uint32_t *n_cached, rl_err *err);
    /* Optional, with resume: how many tokens of tokens[0 .. n) a resume into this (free) slot would restore from
     * the slot itself, so that a request goes to the slot that holds its conversation. */
    uint32_t (*match)(void *impl, int slot, const int32_t *tokens, size_t n);
    /* Optional, with resume: the cache's counters (scheduler thread). */
    void (*cache_stats)(void *impl, struct sch_cache_stat *out);
    /* Optional (a ring): its recovery counters, read with nodes(). */
    void (*ring_stats)(void *impl, sch_ring_stat *out);
    /* Optional: from now on, fail whatever the backend waits for at once (a ring waiting on a node that
     * hangs). Called from another thread while the server stops; the scheduler thread then finishes. */
    void (*abort)(void *impl);
    /* Optional (a local engine over an expert cache, --mem): its counters, read by the scheduler thread
     * after each step (the engine updates them while it computes). */
    const xc_stats *xc;
} sch_backend;

/* The one-machine backend is backend_local.h's, the ring's backend_ring.h's. */

/* ---- requests ---------------------------------------------------------------------------------------- */

typedef enum sch_finish {
    SCH_RUNNING = 0,
    SCH_FIN_STOP,      /* end-of-generation token or a stop string */
    SCH_FIN_LENGTH,    /* max_tokens reached or the context is full */
    SCH_FIN_CANCELLED, /* sch_cancel, or cancelled at shutdown */
    SCH_FIN_ERROR,     /* the backend failed; the message is in the request */
} sch_finish;

#define SCH_MAX_STOP 16

typedef struct sch_params {
    smp_params smp;
    int max_tokens;          /* tokens to generate at most; <= 0: until the context is full */
    bool ignore_eos;         /* keep going past end-of-generation tokens (they render as nothing) */
    const char *stop[SCH_MAX_STOP]; /* stop strings (copied by sch_request_new); the match is not returned */
    int n_stop;
    bool receipts;           /* return the receipts of the request's traversals (needs a backend that signs) */
    int draft_n;             /* drafts of up to this many tokens per step (0: none) */
    bool draft_model;        /* from the server's draft model (sch_config.draft), else by prompt lookup */
    bool draft_dspark;       /* from the server's DSpark draft (sch_config.dspark) */
    bool logprobs;           /* keep each generated token's log-probability and top alternatives (sch_update.lp) */
    bool prompt_logprobs;    /* ... and the prompt's (its tokens after the first, before the generated ones); the
                              * prompt is then read in one step, whatever the step budget */
    bool split;              /* a chat reply: split its reasoning out (text/chat_out.h) in split_fmt, */
    chat_format split_fmt;
    bool thinking;           /* ... whose generation prompt opened the think section */
    bool own_grammar;        /* smp.grammar is a reference the request takes over (also when
                              * sch_request_new fails) and drops (gr_free) with the request */
    uint64_t share;          /* nonzero: requests with this value and the same prompt and penalty settings (the
                              * choices of one n > 1 request) may read the prompt once: the first admitted reads
                              * all but its last token, the others are forked from it (backend.fork) and each
                              * reads that last token itself. Not with prompt_logprobs, receipts or DSpark. */
    bool no_cache;           /* cache_prompt: false: read the whole prompt (its state is still cached for others) */
    bool token_ids;          /* keep the generated token ids (sch_update.ids; return_token_ids) */
} sch_params;

struct sch_sched;

/* Shared between the thread that submits it and the scheduler thread; fields below "scheduler only" are
 * touched by the scheduler thread alone, everything else under the scheduler's mutex. */
typedef struct sch_request {
    struct sch_sched *s;
    int32_t *prompt;
    size_t n_prompt;
    sch_params p;            /* stop strings and logit biases owned by the request */
    double t_arrival;
    pthread_cond_t cond;     /* signalled when out/fin change */
    int refs;                /* the submitter's and, once submitted, the scheduler's */
    bool cancelled;
    sch_finish fin;
    char err[256];
    bool unavailable;        /* SCH_FIN_ERROR because the backend returned SCH_STEP_UNAVAILABLE */
    char *receipts;          /* at the end, when asked: a JSON array of receipts (handed to the last update) */
    rl_buf out;              /* text produced and not yet taken by sch_request_wait */
    rl_buf rout;             /* reasoning text (p.split) not yet taken */
    rl_buf tout;             /* tool-call section text (p.split; chat_out.h CHAT_CH_TOOLS) not yet taken */
    smp_logprob *lp;         /* p.logprobs: the generated tokens' log-probabilities not yet taken, in order */
    smp_logprob *plp;        /* p.prompt_logprobs: where the backend puts the prompt's (n_prompt entries) */
    size_t n_lp, cap_lp;
    int32_t *ids;            /* p.token_ids: the generated tokens' ids not yet taken */
    size_t n_ids, cap_ids;
    int n_gen;               /* completion tokens so far */
    uint32_t n_cached;       /* prompt tokens restored from the prompt cache instead of read */
    int drafted, accepted;   /* speculative draft tokens verified for it, and kept */
    struct sch_request *next;/* queue link */
    /* scheduler only */
    int slot;                /* -1 while queued */
    size_t n_fed;            /* prompt tokens given to the backend so far (or restored: n_cached) */
    bool resume;             /* admitted, its prompt cache lookup (backend.resume) still to do */
    bool begun;              /* its first entry went to the backend (or it was forked) */
    size_t n_ckpt;           /* where its last checkpoint was taken (sch_step.ckpt) */
    int32_t last;            /* the last sampled token (fed at the next step) */
    double t_last;           /* when the last token was sampled */
    tok_stream ts;
    tok_stream ts_r;         /* the reasoning's detokenizer */
    tok_stream ts_t;         /* the tool-call section's (control tokens spelled out) */
    chat_split split;
    bool ds_ok;              /* DSpark: its drafter has the features of every position the target ran */
    bool lead;               /* p.share: others may be forked from it once it has read all but its last prompt token */
    bool follow;             /* p.share: waits for such a request of its group, to be forked from it */
    int32_t *hist;           /* prompt and sampled tokens, for drafting (draft_n > 0) */
    int sp_win_d, sp_win_a;  /* drafts verified and kept since the last judgement (SCH_SPEC_WINDOW) */
    int sp_pause;            /* decode steps left without drafts (a fallback to plain decoding) */
    int sp_next;             /* the pause after the next failed window (doubles, SCH_SPEC_*) */
    bool gs_on;              /* drafting with p.smp.grammar: gs follows the output, so drafts it refuses are cut
                              * before they are verified (smp_grammar_prefix); gtry is scratch */
    gr_state gs, gtry;
    size_t n_hist, cap_hist;
    rl_buf hold;             /* text held back because it may be the start of a stop string */
} sch_request;

/* What sch_request_wait hands over: new text (malloc'ed, NUL-terminated, NULL when none; free() it) and,
 * once fin != SCH_RUNNING, the end. */
typedef struct sch_update {
    char *text;
    size_t len;
    char *reasoning;  /* new reasoning text (p.split; malloc'ed, NUL-terminated, NULL when none; free() it) */
    size_t reasoning_len;
    char *tools;      /* new text of the tool-call section (p.split: control tokens spelled out, for
                       * chat_tools_parse; valid UTF-8, malloc'ed, NUL-terminated, NULL when none; free() it) */
    size_t tools_len;
    sch_finish fin;
    int n_prompt, n_gen;
    int n_cached;     /* prompt tokens restored from the prompt cache (usage.prompt_tokens_details.cached_tokens) */
    int32_t *ids;     /* with p.token_ids: the ids of the tokens generated since the last update (an end-of-generation
                       * token that ends it left out, as from the text), n_ids of them, malloc'ed (caller frees) */
    size_t n_ids;
    int drafted, accepted; /* speculative draft tokens verified, and kept (0, 0 without drafts) */
    char err[256];
    bool unavailable; /* with SCH_FIN_ERROR: the model could not be reached (answer 503) */
    char *receipts;   /* once finished, if asked: the receipts as a JSON array (caller frees) */
    smp_logprob *lp;  /* with p.logprobs: the tokens generated since the last update (end-of-generation tokens
                       * left out), n_lp of them, malloc'ed (caller frees); they may run ahead of the text,
                       * which holds back an incomplete character or a possible stop string */
    size_t n_lp;
} sch_update;

/* ---- the scheduler ----------------------------------------------------------------------------------- */

struct spec_pool;
struct spec_drafter;

typedef struct sch_config {
    int queue_cap;  /* requests that may wait for a slot; more are refused (SCH_QUEUE_FULL) */
    uint32_t chunk; /* prompt tokens per step, over all prefilling sequences */
    uint32_t ckpt_every; /* with a prompt cache: a checkpoint also every this many prompt tokens (0: only at the
                          * end of each prompt) */
    struct spec_pool *draft; /* a draft model with a state per slot, for draft_model requests (NULL: none);
                              * the caller's, used by the scheduler thread alone while it runs */
    bool no_draft_fallback;  /* drafts never paused (SCH_SPEC_*): every step drafts, as `ringlm run` does */
    struct spec_drafter *dspark; /* [n_slots] DSpark drafters (spec_drafter_open "dspark:..."), one per
                              * slot, for draft_dspark requests (NULL: none); the backend must have
                              * set_taps. The caller's, like draft */
} sch_config;

/* Histogram with fixed upper bounds (seconds), Prometheus-style cumulative on output. */
#define SCH_HIST_MAX 16
typedef struct sch_hist {
    int n;                        /* bounds in use */
    double le[SCH_HIST_MAX];
    uint64_t count[SCH_HIST_MAX + 1]; /* per bucket, not cumulative; [n] = above the last bound */
    double sum;
    uint64_t total;
} sch_hist;

typedef struct sch_metrics {
    uint64_t prompt_tokens, gen_tokens;  /* processed / sampled, in total */
    uint64_t prompt_shared;              /* prompt tokens not read again: forked from another choice's */
    uint64_t prompt_cached;              /* prompt tokens not read again: restored from the prompt cache */
    uint64_t cache_hits, cache_misses;   /* requests that restored a prefix, and those that looked and found none */
    bool has_cache;                      /* the backend has a prompt cache: cache below is its state */
    sch_cache_stat cache;
    uint64_t steps, step_tokens;         /* forward passes, and the tokens they carried */
    uint64_t drafted, accepted;          /* speculative drafts sent, and kept */
    uint64_t draft_refused;              /* drafts cut before verification: the request's grammar refused them */
    double draft_s;                      /* seconds the draft model spent drafting */
    uint64_t spec_fallbacks;             /* times a request's drafts were paused: too few kept (SCH_SPEC_*) */
    uint64_t spec_paused_steps;          /* decode steps a request took undrafted while paused */
    uint64_t finished[SCH_FIN_ERROR + 1];/* requests by finish reason */
    double busy_s;                       /* seconds inside backend steps */
    int active, queued, n_slots, queue_cap;
    sch_hist ttft, itl, step_s;
    sch_hist recovery;                   /* a ring's recoveries: seconds each took to re-form it */
    int n_nodes;
    sch_node_stat nodes[SCH_MAX_NODES];
    sch_ring_stat ring;
    const char *backend;
    bool has_xc;                         /* the engine reads routed experts through a cache (--mem) */
    xc_stats xc;                         /* its counters after the last step */
} sch_metrics;

typedef struct sch_sched {
    sch_backend be;
    const tok_tokenizer *tok;
    sch_config cfg;
    pthread_mutex_t mu;
    pthread_cond_t cond;       /* wakes the scheduler thread: a new request, a cancel, stop */
    pthread_cond_t idle;       /* signalled when nothing is active or queued */
    pthread_t thread;
    bool started, closed, stopping;
    sch_request *q_head, *q_tail;
    int n_queued, n_active;
    sch_request **slots;       /* [n_slots] */
    sch_metrics m;
    /* step scratch (scheduler thread only) */
    sch_step *steps;
    sch_request **step_req;
    int32_t (*blocks)[SCH_MAX_DRAFT + 1]; /* [n_slots]: [last, drafts] of speculative entries */
    int *d_entry, *d_slot, *d_k, *d_n;   /* [n_slots]: the step's draft-model requests (entry, slot, k, drafts) */
    int *s_entry, *s_k;                  /* [n_slots]: the step's DSpark requests (entry, k) */
    const int32_t **d_hist;
    size_t *d_nhist;
    int32_t (*d_out)[SCH_MAX_DRAFT];
    int *f_src, *f_dst;                  /* [n_slots]: the step's forks (p.share), or its cache lookups */
    uint64_t *freed, n_freed;            /* [n_slots]: when each slot was last freed (a count of frees) */
} sch_sched;

/* Takes over the backend (sch_free frees it). tok must outlive the scheduler. */
int sch_init(sch_sched *s, const sch_backend *be, const tok_tokenizer *tok, const sch_config *cfg, rl_err *err);
int sch_start(sch_sched *s, rl_err *err);
/* Refuses new requests from now on (sch_submit returns SCH_CLOSED); running ones go on. */
void sch_close(sch_sched *s);
/* Waits until nothing is active or queued, at most timeout_s; returns true when idle. */
bool sch_wait_idle(sch_sched *s, double timeout_s);
/* Cancels everything queued or running. */
void sch_cancel_all(sch_sched *s);
/* sch_cancel_all, and the backend gives up on what it waits for (backend.abort): a server that stops does
 * not wait on a node that hangs. */
void sch_abort(sch_sched *s);
/* Stops the thread once nothing is running (call sch_close and sch_cancel_all first to make that soon),
 * then frees everything, the backend too. Every submitted request must have been released before: they
 * wait on the scheduler's mutex. */
void sch_free(sch_sched *s);

/* A request for the given prompt (copied) and parameters (stop strings copied). NULL on no memory. */
sch_request *sch_request_new(const int32_t *prompt, size_t n_prompt, const sch_params *p, rl_err *err);

typedef enum sch_submit_rc { SCH_OK = 0, SCH_QUEUE_FULL, SCH_CLOSED, SCH_BAD_PROMPT } sch_submit_rc;
/* Queues the request. SCH_BAD_PROMPT: empty, a token id outside the vocabulary, or no room left in the
 * context to generate (err says which).
 * On anything but SCH_OK the request was not taken; the caller still releases it. */
sch_submit_rc sch_submit(sch_sched *s, sch_request *r, rl_err *err);
/* Queues n requests at once, all or none (the choices of one request): they arrive together, so the scheduler
 * admits them in the same step when slots are free, and a queue without room for all of them refuses them all.
 * Their prompts then share steps alike every time, which their bits depend on (docs/serve.md). */
sch_submit_rc sch_submit_all(sch_sched *s, sch_request *const *rs, int n, rl_err *err);

/* Waits up to timeout_ms for new text or the end; returns true when *u holds something new (text, or
 * u->fin set), false on timeout. After fin is reported, further calls report it again at once. */
bool sch_request_wait(sch_request *r, int timeout_ms, sch_update *u);
/* The submitter no longer wants the result: the scheduler drops it at its next step. */
void sch_cancel(sch_request *r);
/* Drops the caller's reference (before or after submit); the last one frees the request. */
void sch_request_release(sch_request *r);

/* A consistent copy of the counters (any thread). */
void sch_metrics_get(sch_sched *s, sch_metrics *m);

const char *sch_finish_name(sch_finish f); /* "stop", "length", "cancelled", "error" */


#endif
