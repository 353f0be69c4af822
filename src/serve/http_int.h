/* http_int.h - what the files of the HTTP front share (http.c: the server, routing, sending;
 * openai_request.c: a completion request's body -> a job; openai_response.c: the completion endpoints,
 * running a job and answering it whole or streamed; metrics.c: /health and /metrics). Not for users of the
 * server: they include http.h. */
#ifndef RINGLM_HTTP_INT_H
#define RINGLM_HTTP_INT_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cJSON.h>
#include <microhttpd.h>

#include "../base/buf.h"
#include "../text/chat_out.h"
#include "http.h"

/* Per request (one call chain of the access handler). */
typedef struct http_conn {
    http_server *h;
    int ep;
    rl_buf body;
    bool too_large;
    bool answered;
} http_conn;

/* What went wrong with a request: everything an OpenAI error body carries. */
typedef struct http_fail {
    int status;
    const char *type, *code;
    char param[64];
    char msg[768];
} http_fail;

/* 400 invalid_request_error about one field. */
#define BAD(f, param, ...) http_failf((f), 400, "invalid_request_error", NULL, (param), __VA_ARGS__)

/* Strings that must outlive the parse (joined content parts), freed with the job. */
typedef struct http_strs {
    char **v;
    int n, cap;
} http_strs;

/* Choices one request may ask for: n per prompt, times the prompts of a completions prompt array. */
#define HTTP_MAX_CHOICES 16

typedef struct http_job {
    bool chat, stream, include_usage;
    bool token_ids;    /* return_token_ids (vLLM's field): each choice lists its generated token ids */
    const char *model; /* the name the request used (one of h->names), echoed in the response */
    sch_params p;
    int n_prompts;     /* 1, or a completions prompt array's length */
    int32_t *prompt[HTTP_MAX_CHOICES];
    size_t n_prompt[HTTP_MAX_CHOICES];
    int n;             /* choices per prompt */
    http_strs strs;
    smp_bias *bias; /* jb->p.smp.bias */
    int top_logprobs; /* with p.logprobs: how many alternatives per token to show (0..SMP_TOP_LOGPROBS) */
    bool echo;        /* completions: the prompt's text (and logprobs) before the completion's */
    bool score_only;  /* echo with max_tokens 0: the generated token is dropped */
    char *echo_text[HTTP_MAX_CHOICES]; /* each prompt's text, as given or decoded from its ids */
    gr_grammar *grammar; /* response_format json_object / json_schema, or tool_choice required / named: what
                          * the output must follow (each choice's request takes a reference) */
    bool parse_tools; /* chat with tools (and tool_choice not "none"): the reply's tool calls are parsed */
} http_job;

/* One choice being generated: its request and what it has produced. */
typedef struct http_run {
    sch_request *r;
    bool done;
    sch_update end;     /* its last update (fin, counts, error, receipts) */
    rl_buf text, lps; /* not streamed: the text so far, the smp_logprob entries as bytes */
    rl_buf reasoning; /* not streamed: the reasoning so far (chat) */
    rl_buf tools;     /* the raw tool-call section so far (chat_out.h CHAT_CH_TOOLS) */
    rl_buf ids;       /* return_token_ids: generated token ids (int32) not yet sent (streamed) or all (not) */
    bool parse_tools;   /* ... parsed into tool_calls (else shown as text) */
    int calls_sent;     /* streamed: the tool calls already sent as deltas */
    size_t lp_off;      /* completions' text_offset: the choice's text bytes so far */
    char *echo;         /* echo: the prompt's text, shown first (owned; NULL: no echo) */
    int32_t echo_first; /* echo with logprobs: the prompt's first token; -1 otherwise */
    size_t n_plp;       /* ... and how many prompt entries come first in its logprobs */
    bool echoed, score_only;
} http_run;

/* A streamed response in progress: owns the requests and the SSE bytes not yet handed to MHD. */
typedef struct http_stream {
    http_server *h;
    http_run runs[HTTP_MAX_CHOICES];
    int n_runs, per_prompt;
    int fd;
    bool chat, include_usage, ended;
    bool token_ids; /* each content chunk lists the ids of its tokens (http_job.token_ids) */
    int top_logprobs; /* -1: none asked */
    const char *model; /* one of h->names */
    char id[64];
    time_t created;
    double t0;
    rl_buf out;
    size_t off;
} http_stream;

/* ---- http.c: buffers, names, logging, errors, sending ---- */

/* Client text made safe to echo in a message or a log line (cut to out_size; log: escapes for a terminal). */
void http_clean(const char *in, char *out, size_t out_size, bool log);
/* The client hung up (its socket polls as closed); fd from http_conn_fd, -1 when unknown. */
bool http_client_gone(int fd);
int http_conn_fd(struct MHD_Connection *c);
cJSON *http_error_json(const char *msg, const char *type, const char *param, const char *code);
/* Fills *f (an OpenAI error: status, type, code, param, message); returns -1. BAD: a 400 about one field. */
int http_failf(http_fail *f, int status, const char *type, const char *code, const char *param, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* One line on stderr unless --quiet. */
void http_log(const http_server *h, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The served name equal to s, or NULL; every served name as "'a', 'b' or 'c'" for messages. */
const char *http_model_name(const http_server *h, const char *s);
void http_names_list(const http_server *h, char *buf, size_t n);
/* Responses: counted per endpoint and status (/metrics), CORS headers added, the connection marked answered. */
enum MHD_Result http_queue(http_conn *hc, struct MHD_Connection *c, int status, struct MHD_Response *r);
/* 64 random bits (ids, a request's default seed). */
uint64_t http_random64(void);
enum MHD_Result http_send(http_conn *hc, struct MHD_Connection *c, int status, const char *type, char *body, size_t len);
enum MHD_Result http_send_error(http_conn *hc, struct MHD_Connection *c, int status, const char *type, const char *code, const char *param, const char *fmt, ...) __attribute__((format(printf, 7, 8)));
enum MHD_Result http_send_fail(http_conn *hc, struct MHD_Connection *c, const http_fail *f);
enum MHD_Result http_send_json(http_conn *hc, struct MHD_Connection *c, int status, cJSON *j);

/* ---- openai_request.c ---- */

/* The body of a /v1/chat/completions (chat) or /v1/completions request, checked field by field, into *jb
 * (free it with http_job_free, also after a failure); -1 with *f saying what is wrong. */
int http_request_parse(const http_server *h, const cJSON *j, bool chat, http_job *jb, http_fail *f);
void http_job_free(http_job *jb);

/* ---- openai_response.c ---- */

/* POST /v1/chat/completions (chat) and /v1/completions: parse, submit one scheduler request per choice,
 * answer whole or as an SSE stream. */
enum MHD_Result http_completion(http_conn *hc, struct MHD_Connection *c, bool chat);

/* ---- metrics.c ---- */

/* GET /health and GET /metrics. */
enum MHD_Result http_health(http_conn *hc, struct MHD_Connection *c);
enum MHD_Result http_metrics(http_conn *hc, struct MHD_Connection *c);

#endif
