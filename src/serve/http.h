/* http.h - the OpenAI-compatible HTTP front of `ringlm serve` (libmicrohttpd + cJSON).
 *
 * Endpoints (docs/serve.md has the fields and error cases):
 *   POST /v1/chat/completions   messages -> the model's chat format -> tokens; streamed (SSE) or not
 *   POST /v1/completions        prompt text (or token ids) as is; streamed or not
 *   GET  /v1/models             the one served model; GET /v1/models/ID the same for its id
 *   GET  /health                {"status": "ok", "nodes": [...]} (503 "shutting_down" while stopping)
 *   GET  /metrics               Prometheus text
 *   GET  /                      a self-contained chat page
 *
 * Every connection gets its own thread (MHD_USE_THREAD_PER_CONNECTION): a completion handler submits to
 * the scheduler and then waits for its text, which is simplest to write as blocking code. The thread
 * count is bounded by the connection limit. While it waits, the thread watches its socket for a hang-up
 * so that a client that goes away frees its sequence slot at the scheduler's next step. */
#ifndef RINGLM_HTTP_H
#define RINGLM_HTTP_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/err.h"
#include "../text/chat.h"
#include "../text/chat_gram.h"
#include "../text/tokenizer.h"
#include "scheduler.h"

typedef struct http_config {
    const char *host;      /* address to listen on (name or literal, IPv4 or IPv6) */
    int port;              /* 0: any free port (http_port tells which) */
    const char *api_key;   /* NULL: no key; else the /v1 endpoints need "Authorization: Bearer KEY" */
    size_t body_limit;     /* request bodies above this get 413 */
    const char *model_id;  /* the model's name: the file's (what /v1/models lists, a request's `model` may name) */
    const char *const *aliases; /* more names it answers to (--alias, repeatable); the first is the primary */
    int n_aliases;
    bool have_chat;        /* the model's chat template is one we render */
    chat_format chat_fmt;
    const char *chat_err;  /* why not, when !have_chat */
    int max_connections;
    int max_per_ip;        /* connections one client address may hold at once (0 = 32); more are closed */
    double header_timeout_s; /* a connection must send a request's headers within this (0 = 10 s) */
    double idle_timeout_s;   /* a connection silent this long is closed (0 = 120 s) */
    bool quiet;            /* no per-request log lines on stderr */
    int draft_n;           /* drafts per step for requests that do not say (0: none; --draft ngram|MODEL) */
    int draft_k;           /* the length a request asking "draft": "ngram" or "model" gets (--draft-n) */
    bool draft_model;      /* requests that do not say draft from the draft model (--draft MODEL.gguf) */
    bool have_draft_model; /* a request may ask "draft": "model" */
    bool draft_dspark;     /* requests that do not say draft with DSpark (--draft dspark:FILE) */
    bool have_dspark;      /* a request may ask "draft": "dspark" */
} http_config;

/* Requests answered, by endpoint and status (for /metrics). */
enum { HTTP_EP_CHAT, HTTP_EP_COMPLETIONS, HTTP_EP_MODELS, HTTP_EP_HEALTH, HTTP_EP_METRICS, HTTP_EP_PAGE,
       HTTP_EP_OTHER, HTTP_EP_COUNT };
#define HTTP_MAX_CODES 16
#define HTTP_MAX_NAMES 16 /* the file's name and up to 15 aliases */
#define HTTP_NAME_MAX 256

typedef struct http_server {
    struct MHD_Daemon *d;
    int listen_fd;          /* after quiesce: ours to close */
    int port;
    http_config cfg;
    char *model_id, *api_key, *chat_err;
    char names[HTTP_MAX_NAMES][HTTP_NAME_MAX]; /* every name the model answers to; names[0] the primary */
    int n_names;
    sch_sched *s;
    const tok_tokenizer *tok;
    smp_vocab *vocab;        /* tok's pieces for JSON-constrained sampling (owned) */
    chat_gram_caps caps;     /* the constrained output this model can honour (checked at start) */
    uint32_t n_ctx;
    time_t created;
    uint64_t id_base;
    pthread_mutex_t mu;     /* guards what follows */
    pthread_cond_t idle;    /* signalled when inflight drops to 0 */
    uint64_t next_id;
    uint64_t share_seq;     /* share groups handed out (sch_params.share) */
    int inflight;           /* requests between their first byte and the end of their response */
    bool closing;
    int codes[HTTP_MAX_CODES];
    uint64_t counts[HTTP_EP_COUNT][HTTP_MAX_CODES];
    /* Open connections, for the header deadline: a watchdog thread shuts down any that has not sent a whole
     * request's headers header_timeout_s after it connected (or after its previous response), so slow or
     * silent clients cannot hold every connection (slowloris). Guarded by mu. */
    struct http_sock *socks;
    uint64_t header_timeouts;
    pthread_t watchdog;
    bool watching;
} http_server;

/* Starts listening. s and tok must outlive the server. */
int http_start(http_server *h, const http_config *cfg, sch_sched *s, const tok_tokenizer *tok, rl_err *err);
/* Stops accepting connections; open ones go on (and /health answers 503 on them). */
void http_quiesce(http_server *h);
/* Waits until no request is in progress (every response completely sent), at most timeout_s; true if so. */
bool http_wait_idle(http_server *h, double timeout_s);
/* Closes every connection, waits for their threads and frees the server. Cancel the scheduler's requests
 * first, or this waits for them to finish. */
void http_stop(http_server *h);

/* The chat page (page.c). */
const char *http_page_html(size_t *len);

#endif
