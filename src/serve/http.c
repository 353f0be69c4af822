#include "http_int.h"
#include "../base/clock.h"

#include "../text/chat_gram.h"
#include "../text/chat_out.h"
#include "../text/json_schema.h"
#include "../text/utf8.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cJSON.h>
#include <microhttpd.h>

/* ---- small helpers ------------------------------------------------------------------------------------ */

uint64_t http_random64(void) {
    uint64_t v = 0;
    if (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v) {
        /* getrandom cannot fail this way on Linux >= 3.17 with a small buffer; the clock will do. */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        v = (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull ^ (uint64_t)ts.tv_sec;
    }
    return v;
}

/* True when the peer closed its end (or the socket broke). */
bool http_client_gone(int fd) {
    if (fd < 0) return false;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

int http_conn_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

/* Text that came from a client, made safe to show. For a JSON body (log = false) every byte that is not
 * valid UTF-8 becomes U+FFFD, so a client's JSON parser never meets invalid text (cJSON escapes control
 * characters itself). For the log (log = true) control characters and invalid bytes become \xNN, so no
 * request can write a line, an escape sequence or binary into the server's log. Cuts at out_size. */
void http_clean(const char *in, char *out, size_t out_size, bool log) {
    const unsigned char *s = (const unsigned char *)in;
    size_t n = strlen(in), o = 0;
    for (size_t i = 0; i < n && o + 5 < out_size;) {
        size_t k = utf8_len(s + i, n - i, NULL);
        /* In the log, C1 controls (U+0080..U+009F: U+009B starts an escape sequence on some terminals) and
         * the line and paragraph separators U+2028/U+2029 are escaped too. */
        bool c1 = k == 2 && s[i] == 0xc2 && s[i + 1] < 0xa0;
        bool sep = k == 3 && s[i] == 0xe2 && s[i + 1] == 0x80 && (s[i + 2] == 0xa8 || s[i + 2] == 0xa9);
        if (log && ((k == 1 && (s[i] < 0x20 || s[i] == 0x7f)) || c1 || sep)) {
            for (size_t j = 0; j < k && o + 5 < out_size; j++) o += (size_t)snprintf(out + o, out_size - o, "\\x%02x", s[i + j]);
            i += k;
        } else if (k == 0) {
            if (log) o += (size_t)snprintf(out + o, out_size - o, "\\x%02x", s[i]);
            else memcpy(out + o, "\xef\xbf\xbd", 3), o += 3;
            i++;
        } else {
            memcpy(out + o, s + i, k);
            o += k, i += k;
        }
    }
    out[o < out_size ? o : out_size - 1] = 0;
}

void http_log(const http_server *h, const char *fmt, ...) {
    if (h->cfg.quiet) return;
    char line[1024], clean[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    http_clean(line, clean, sizeof clean, true);
    fprintf(stderr, "ringlm serve: %s\n", clean);
}

/* The served name equal to s, or NULL. */
const char *http_model_name(const http_server *h, const char *s) {
    for (int i = 0; i < h->n_names; i++) {
        if (strcmp(s, h->names[i]) == 0) return h->names[i];
    }
    return NULL;
}

/* "'a', 'b' or 'c'" for messages (cut to n). */
void http_names_list(const http_server *h, char *buf, size_t n) {
    size_t at = 0;
    buf[0] = 0;
    for (int i = 0; i < h->n_names && at < n; i++) {
        const char *sep = i == 0 ? "" : i == h->n_names - 1 ? " or " : ", ";
        int w = snprintf(buf + at, n - at, "%s'%s'", sep, h->names[i]);
        if (w < 0) break;
        at += (size_t)w;
    }
}

/* ---- responses ---------------------------------------------------------------------------------------- */

static void http_count(http_server *h, int ep, int status) {
    pthread_mutex_lock(&h->mu);
    int i = 0;
    while (i < HTTP_MAX_CODES && h->codes[i] && h->codes[i] != status) i++;
    if (i < HTTP_MAX_CODES) {
        h->codes[i] = status;
        h->counts[ep][i]++;
    }
    pthread_mutex_unlock(&h->mu);
}

enum MHD_Result http_queue(http_conn *hc, struct MHD_Connection *c, int status, struct MHD_Response *r) {
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Access-Control-Allow-Origin", "*");
    enum MHD_Result rc = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    http_count(hc->h, hc->ep, status);
    hc->answered = true;
    return rc;
}

/* Takes ownership of body (malloc'ed). */
enum MHD_Result http_send(http_conn *hc, struct MHD_Connection *c, int status, const char *type, char *body,
                                 size_t len) {
    struct MHD_Response *r = MHD_create_response_from_buffer_with_free_callback(len, body, free);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", type);
    return http_queue(hc, c, status, r);
}

enum MHD_Result http_send_json(http_conn *hc, struct MHD_Connection *c, int status, cJSON *j) {
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!s) return MHD_NO;
    size_t n = strlen(s);
    char *t = realloc(s, n + 2); /* a final newline reads better with curl */
    if (t) s = t, s[n++] = '\n', s[n] = 0;
    return http_send(hc, c, status, "application/json", s, n);
}

cJSON *http_error_json(const char *msg, const char *type, const char *param, const char *code) {
    cJSON *j = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(j, "error");
    cJSON_AddStringToObject(e, "message", msg);
    cJSON_AddStringToObject(e, "type", type);
    if (param) cJSON_AddStringToObject(e, "param", param);
    else cJSON_AddNullToObject(e, "param");
    if (code) cJSON_AddStringToObject(e, "code", code);
    else cJSON_AddNullToObject(e, "code");
    return j;
}

int http_failf(http_fail *f, int status, const char *type, const char *code, const char *param, const char *fmt,
                      ...) {
    f->status = status;
    f->type = type;
    f->code = code;
    snprintf(f->param, sizeof f->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->msg, sizeof f->msg, fmt, ap);
    va_end(ap);
    return -1;
}

enum MHD_Result http_send_fail(http_conn *hc, struct MHD_Connection *c, const http_fail *f) {
    struct MHD_Response *r;
    char msg[sizeof f->msg * 3 / 2]; /* messages quote what the client sent: never echo invalid UTF-8 */
    http_clean(f->msg, msg, sizeof msg, false);
    cJSON *j = http_error_json(msg, f->type, f->param[0] ? f->param : NULL, f->code);
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!s) return MHD_NO;
    size_t n = strlen(s);
    char *t = realloc(s, n + 2);
    if (t) s = t, s[n++] = '\n', s[n] = 0;
    r = MHD_create_response_from_buffer_with_free_callback(n, s, free);
    if (!r) {
        free(s);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "application/json");
    if (f->status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    if (f->status == 429) MHD_add_response_header(r, "Retry-After", "1");
    if (f->status == 405) {
        MHD_add_response_header(r, "Allow", hc->ep == HTTP_EP_CHAT || hc->ep == HTTP_EP_COMPLETIONS ? "POST, OPTIONS"
                                                                                                : "GET, HEAD, OPTIONS");
    }
    http_log(hc->h, "%d %s", f->status, f->msg);
    return http_queue(hc, c, f->status, r);
}

enum MHD_Result http_send_error(http_conn *hc, struct MHD_Connection *c, int status, const char *type,
                                       const char *code, const char *param, const char *fmt, ...) {
    http_fail f = {.status = status, .type = type, .code = code};
    snprintf(f.param, sizeof f.param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f.msg, sizeof f.msg, fmt, ap);
    va_end(ap);
    return http_send_fail(hc, c, &f);
}

/* ---- the other endpoints ------------------------------------------------------------------------------ */

static cJSON *http_model_obj(const http_server *h, const char *name) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)h->created);
    cJSON_AddStringToObject(m, "owned_by", "ringlm");
    cJSON_AddNumberToObject(m, "context_length", h->n_ctx);
    /* what a request may ask of this model (chat_gram_caps): a client can tell before it gets a 400 */
    cJSON *c = cJSON_AddObjectToObject(m, "capabilities");
    cJSON_AddBoolToObject(c, "chat", h->cfg.have_chat);
    cJSON_AddBoolToObject(c, "reasoning", h->cfg.have_chat && h->caps.sections);
    cJSON_AddBoolToObject(c, "tool_choice_required", h->cfg.have_chat && h->caps.sections);
    cJSON_AddBoolToObject(c, "response_format", h->caps.eog);
    return m;
}

/* ---- routing ------------------------------------------------------------------------------------------ */

/* Constant-time comparison: the time a wrong key takes says nothing about how much of it was right. */
static bool http_key_ok(const http_server *h, struct MHD_Connection *c) {
    if (!h->api_key) return true;
    const char *a = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!a || strncasecmp(a, "Bearer ", 7) != 0) return false;
    a += 7;
    while (*a == ' ') a++;
    size_t la = strlen(a), lk = strlen(h->api_key);
    unsigned char diff = la != lk;
    for (size_t i = 0; i < lk; i++) diff |= (unsigned char)(a[i < la ? i : 0] ^ h->api_key[i]);
    return diff == 0;
}

/* The OpenAI paths are served with and without their /v1 prefix, as llama-server serves them. */
static const char *http_api_path(const char *url) { return strncmp(url, "/v1/", 4) == 0 ? url + 3 : url; }

static int http_route(const char *url) {
    const char *p = http_api_path(url);
    if (strcmp(p, "/chat/completions") == 0) return HTTP_EP_CHAT;
    if (strcmp(p, "/completions") == 0) return HTTP_EP_COMPLETIONS;
    if (strcmp(p, "/models") == 0 || strncmp(p, "/models/", 8) == 0) return HTTP_EP_MODELS;
    if (strcmp(url, "/health") == 0) return HTTP_EP_HEALTH;
    if (strcmp(url, "/metrics") == 0) return HTTP_EP_METRICS;
    if (strcmp(url, "/") == 0 || strcmp(url, "/index.html") == 0) return HTTP_EP_PAGE;
    return HTTP_EP_OTHER;
}

static enum MHD_Result http_get(http_conn *hc, struct MHD_Connection *c, const char *url) {
    http_server *h = hc->h;
    switch (hc->ep) {
    case HTTP_EP_MODELS: {
        const char *p = http_api_path(url);
        if (strcmp(p, "/models") == 0) {
            cJSON *j = cJSON_CreateObject();
            cJSON_AddStringToObject(j, "object", "list");
            cJSON *d = cJSON_AddArrayToObject(j, "data");
            for (int i = 0; i < h->n_names; i++) cJSON_AddItemToArray(d, http_model_obj(h, h->names[i]));
            return http_send_json(hc, c, 200, j);
        }
        const char *name = http_model_name(h, p + 8);
        if (name) return http_send_json(hc, c, 200, http_model_obj(h, name));
        char list[512];
        http_names_list(h, list, sizeof list);
        return http_send_error(hc, c, 404, "invalid_request_error", "model_not_found", "model",
                               "model '%s' is not served here; this server serves %s", p + 8, list);
    }
    case HTTP_EP_HEALTH: return http_health(hc, c);
    case HTTP_EP_METRICS: return http_metrics(hc, c);
    case HTTP_EP_PAGE: {
        size_t n;
        const char *page = http_page_html(&n);
        struct MHD_Response *r = MHD_create_response_from_buffer(n, (void *)page, MHD_RESPMEM_PERSISTENT);
        if (!r) return MHD_NO;
        MHD_add_response_header(r, "Content-Type", "text/html; charset=utf-8");
        return http_queue(hc, c, 200, r);
    }
    default: return MHD_NO;
    }
}

static void http_sock_mark(http_server *h, struct MHD_Connection *c, bool in_request);

/* The nice value of connection threads (see http_handle). */
#define HTTP_THREAD_NICE 10

static enum MHD_Result http_handle(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                   const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    http_server *h = cls;
    http_conn *hc = *con_cls;
    if (!hc) {
        /* First call: headers only. Everything decidable without the body is answered now, so a request
         * we will refuse never has its body read (nor, with Expect: 100-continue, even sent). */
        hc = calloc(1, sizeof *hc);
        if (!hc) return MHD_NO;
        /* This connection's thread yields to the model's: on a machine with as many compute threads as cores,
         * a connection thread that wakes to send a token preempts a compute thread mid-step, and the others
         * then spin at the step's next barrier until it runs again. At nice 10 they mostly run between steps,
         * which is when there is text to send anyway (bench/bench_serve.sh: about 1.1x the aggregate tok/s
         * at 16 streams on 2 cores). Raising one's own nice needs no privilege; a failure changes nothing. */
        if (setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), HTTP_THREAD_NICE) != 0) {
            http_log(h, "cannot lower the priority of a connection thread: %s", strerror(errno));
        }
        hc->h = h;
        hc->ep = http_route(url);
        *con_cls = hc;
        http_sock_mark(h, c, true);
        pthread_mutex_lock(&h->mu);
        h->inflight++;
        pthread_mutex_unlock(&h->mu);
        bool post = hc->ep == HTTP_EP_CHAT || hc->ep == HTTP_EP_COMPLETIONS;
        if (strcmp(method, "OPTIONS") == 0) { /* CORS preflight: browsers on other origins may call us */
            struct MHD_Response *r = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
            if (!r) return MHD_NO;
            MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
            /* Whatever headers the page's client says it will send (the openai SDK adds x-stainless-*
             * ones): a fixed list blocks every client that sends one more. Only header-name characters
             * and separators are echoed. */
            const char *want = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Headers");
            bool echo = want && *want && strlen(want) < 2048;
            for (const char *q = want; echo && *q; q++) {
                echo = isalnum((unsigned char)*q) || strchr("-_!#$%&'*+.^`|~, ", *q);
            }
            MHD_add_response_header(r, "Access-Control-Allow-Headers", echo ? want : "Authorization, Content-Type");
            MHD_add_response_header(r, "Vary", "Access-Control-Request-Headers");
            MHD_add_response_header(r, "Access-Control-Max-Age", "86400");
            return http_queue(hc, c, 204, r);
        }
        if (hc->ep == HTTP_EP_OTHER) {
            return http_send_error(hc, c, 404, "invalid_request_error", "not_found", NULL, "no such endpoint: %s %s",
                                   method, url);
        }
        bool get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
        if (post ? strcmp(method, "POST") != 0 : !get) {
            return http_send_error(hc, c, 405, "invalid_request_error", "method_not_allowed", NULL,
                                   "%s does not accept %s; use %s", url, method, post ? "POST" : "GET");
        }
        if ((post || hc->ep == HTTP_EP_MODELS) && !http_key_ok(h, c)) {
            return http_send_error(hc, c, 401, "invalid_request_error", "invalid_api_key", NULL,
                                   "missing or wrong API key: send the header \"Authorization: Bearer KEY\"");
        }
        if (!post) return http_get(hc, c, url);
        /* RFC 9112 6.1: a request whose Transfer-Encoding is not exactly "chunked" cannot be framed; it gets
         * 400 now (MHD would otherwise wait for a body it cannot delimit). */
        const char *te = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Transfer-Encoding");
        if (te && strcasecmp(te, "chunked") != 0) {
            return http_send_error(hc, c, 400, "invalid_request_error", "bad_transfer_encoding", NULL,
                                   "Transfer-Encoding '%s' is not supported: send the body as is or chunked", te);
        }
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > h->cfg.body_limit) {
            return http_send_error(hc, c, 413, "invalid_request_error", "request_too_large", NULL,
                                   "the body has %s bytes; the limit is %zu", cl, h->cfg.body_limit);
        }
        return MHD_YES;
    }
    if (hc->answered) { /* already refused: drop whatever body still arrives */
        *upload_size = 0;
        return MHD_YES;
    }
    if (*upload_size) {
        if (hc->body.len + *upload_size > h->cfg.body_limit) hc->too_large = true;
        if (!hc->too_large && rl_buf_add(&hc->body, upload, *upload_size) != 0) hc->too_large = true;
        *upload_size = 0;
        return MHD_YES;
    }
    if (hc->too_large) {
        return http_send_error(hc, c, 413, "invalid_request_error", "request_too_large", NULL,
                               "the body is over the limit of %zu bytes", h->cfg.body_limit);
    }
    return http_completion(hc, c, hc->ep == HTTP_EP_CHAT);
}

/* ---- the header deadline (slowloris) ------------------------------------------------------------------ */

typedef struct http_sock {
    int fd;
    double since;        /* when it connected, or when its last response ended */
    bool in_request;     /* its headers are in: the deadline does not apply until the response ends */
    bool shut;           /* shut down by the watchdog already */
    struct http_sock *prev, *next;
} http_sock;

static http_sock *http_sock_of(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* MHD calls this as a connection opens and as it closes (before its socket is closed, so the watchdog,
 * holding mu, never shuts down an fd that already belongs to another connection). */
static void http_notify_conn(void *cls, struct MHD_Connection *c, void **socket_context,
                             enum MHD_ConnectionNotificationCode code) {
    http_server *h = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        http_sock *k = calloc(1, sizeof *k);
        if (!k) return; /* then it has no deadline, only MHD's idle timeout */
        k->fd = http_conn_fd(c);
        k->since = rl_clock_now();
        pthread_mutex_lock(&h->mu);
        k->next = h->socks;
        if (h->socks) h->socks->prev = k;
        h->socks = k;
        pthread_mutex_unlock(&h->mu);
        *socket_context = k;
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED && *socket_context) {
        http_sock *k = *socket_context;
        pthread_mutex_lock(&h->mu);
        if (k->prev) k->prev->next = k->next;
        else h->socks = k->next;
        if (k->next) k->next->prev = k->prev;
        pthread_mutex_unlock(&h->mu);
        free(k);
        *socket_context = NULL;
    }
}

static void http_sock_mark(http_server *h, struct MHD_Connection *c, bool in_request) {
    http_sock *k = http_sock_of(c);
    if (!k) return;
    pthread_mutex_lock(&h->mu);
    k->in_request = in_request;
    k->since = rl_clock_now();
    pthread_mutex_unlock(&h->mu);
}

static void *http_watchdog(void *arg) {
    http_server *h = arg;
    pthread_mutex_lock(&h->mu);
    while (h->watching) {
        double now = rl_clock_now();
        long shut = 0;
        for (http_sock *k = h->socks; k; k = k->next) {
            if (k->in_request || k->shut || now - k->since < h->cfg.header_timeout_s) continue;
            shutdown(k->fd, SHUT_RDWR); /* its thread sees the end of the stream and closes it */
            k->shut = true;
            shut++;
        }
        if (shut && h->header_timeouts == 0) {
            pthread_mutex_unlock(&h->mu);
            http_log(h, "closed %ld connection(s) that sent no complete request headers within %.0f s (later "
                        "ones are counted in /metrics)", shut, h->cfg.header_timeout_s);
            pthread_mutex_lock(&h->mu);
        }
        h->header_timeouts += (uint64_t)shut;
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_nsec += 200 * 1000000L;
        if (dl.tv_nsec >= 1000000000L) dl.tv_sec++, dl.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&h->idle, &h->mu, &dl);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

/* Called once a response is completely sent, or the connection died: the request is over. */
static void http_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)toe;
    http_server *h = cls;
    http_conn *hc = *con_cls;
    if (!hc) return;
    http_sock_mark(h, c, false); /* a kept-alive connection has header_timeout_s for its next request */
    pthread_mutex_lock(&h->mu);
    if (--h->inflight == 0) pthread_cond_broadcast(&h->idle);
    pthread_mutex_unlock(&h->mu);
    free(hc->body.p);
    free(hc);
    *con_cls = NULL;
}

static void http_mhd_log(void *cls, const char *fmt, va_list ap) {
    const http_server *h = cls;
    if (h->cfg.quiet) return;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n && line[n - 1] == '\n') line[--n] = 0;
    fprintf(stderr, "ringlm serve: http: %s\n", line);
}

/* ---- start and stop ----------------------------------------------------------------------------------- */

int http_start(http_server *h, const http_config *cfg, sch_sched *s, const tok_tokenizer *tok, rl_err *err) {
    memset(h, 0, sizeof *h);
    h->listen_fd = -1;
    h->cfg = *cfg;
    h->s = s;
    h->tok = tok;
    if (!(h->vocab = chat_gram_vocab_new(tok))) return rl_errf(err, "out of memory for the vocabulary");
    chat_gram_caps_get(tok, cfg->chat_fmt, &h->caps);
    if (!cfg->quiet && cfg->have_chat && !h->caps.sections)
        fprintf(stderr, "ringlm serve: warning: tool_choice required or named is refused (400): the vocabulary lacks %s\n", h->caps.lacks);
    if (!cfg->quiet && !h->caps.eog)
        fprintf(stderr, "ringlm serve: warning: response_format is refused (400): the vocabulary lacks %s\n", h->caps.lacks);
    h->n_ctx = s->be.n_ctx;
    h->created = time(NULL);
    h->id_base = http_random64();
    /* The names: aliases first (the first is the primary, as llama-server's --alias), then the file's. */
    if (cfg->n_aliases >= HTTP_MAX_NAMES) return rl_errf(err, "at most %d --alias names", HTTP_MAX_NAMES - 1);
    for (int i = 0; i <= cfg->n_aliases && h->n_names < HTTP_MAX_NAMES; i++) {
        const char *nm = i < cfg->n_aliases ? cfg->aliases[i] : cfg->model_id;
        if (!nm || !*nm || strlen(nm) >= HTTP_NAME_MAX) {
            return rl_errf(err, "model name '%.64s' must be 1 to %d bytes", nm ? nm : "", HTTP_NAME_MAX - 1);
        }
        bool dup = false;
        for (int k = 0; k < h->n_names; k++) dup |= strcmp(h->names[k], nm) == 0;
        if (!dup) snprintf(h->names[h->n_names++], HTTP_NAME_MAX, "%s", nm);
    }
    h->model_id = strdup(cfg->model_id);
    h->api_key = cfg->api_key ? strdup(cfg->api_key) : NULL;
    h->chat_err = strdup(cfg->chat_err ? cfg->chat_err : "");
    if (!h->model_id || (cfg->api_key && !h->api_key) || !h->chat_err) {
        free(h->model_id), free(h->api_key), free(h->chat_err);
        return rl_errf(err, "out of memory");
    }
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->idle, NULL);
    if (h->cfg.max_per_ip <= 0) h->cfg.max_per_ip = 32;
    if (h->cfg.header_timeout_s <= 0) h->cfg.header_timeout_s = 10;
    if (h->cfg.idle_timeout_s <= 0) h->cfg.idle_timeout_s = 120;

    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", cfg->port);
    int gai = getaddrinfo(cfg->host, port, &hints, &ai);
    if (gai != 0) {
        rl_errf(err, "cannot resolve --host %s: %s", cfg->host, gai_strerror(gai));
        goto fail;
    }
    /* The socket is ours, so a failure can say why (address in use, not ours, ...); MHD takes it over. */
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    if (fd < 0) {
        rl_errf(err, "cannot create a socket for %s: %s", cfg->host, strerror(errno));
        freeaddrinfo(ai);
        goto fail;
    }
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one); /* restart at once after a stop */
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 128) != 0) {
        rl_errf(err, "cannot listen on %s port %d: %s", cfg->host, cfg->port, strerror(errno));
        close(fd);
        freeaddrinfo(ai);
        goto fail;
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ITC |
                     MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    freeaddrinfo(ai);
    h->d = MHD_start_daemon(flags, 0, NULL, NULL, http_handle, h,
                            MHD_OPTION_EXTERNAL_LOGGER, http_mhd_log, h, /* first, or MHD logs some on its own */
                            MHD_OPTION_LISTEN_SOCKET, fd,
                            MHD_OPTION_NOTIFY_COMPLETED, http_completed, h,
                            MHD_OPTION_NOTIFY_CONNECTION, http_notify_conn, h,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)(cfg->max_connections > 0 ? cfg->max_connections : 64),
                            MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)h->cfg.max_per_ip,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)(h->cfg.idle_timeout_s + 0.5),
                            /* A header or chunk-size line must fit a connection's memory whole, or MHD answers
                             * its own HTML 500: 256 KiB takes any line a client sends in earnest (a 100 KB chunk
                             * extension included); pages are touched only as used. */
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)256 << 10,
                            MHD_OPTION_END);
    if (!h->d) {
        close(fd);
        rl_errf(err, "cannot start the HTTP server on %s port %d", cfg->host, cfg->port);
        goto fail;
    }
    h->watching = true;
    if (pthread_create(&h->watchdog, NULL, http_watchdog, h) != 0) {
        h->watching = false;
        MHD_stop_daemon(h->d);
        rl_errf(err, "cannot start the HTTP server's watchdog thread");
        goto fail;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    h->port = di ? di->port : cfg->port;
    return 0;
fail:
    pthread_cond_destroy(&h->idle);
    pthread_mutex_destroy(&h->mu);
    free(h->model_id), free(h->api_key), free(h->chat_err);
    tok_vocab_free(h->vocab);
    memset(h, 0, sizeof *h);
    return -1;
}

void http_quiesce(http_server *h) {
    if (!h->d) return;
    pthread_mutex_lock(&h->mu);
    h->closing = true;
    pthread_mutex_unlock(&h->mu);
    if (h->listen_fd < 0) h->listen_fd = MHD_quiesce_daemon(h->d);
}

bool http_wait_idle(http_server *h, double timeout_s) {
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    double t = (double)dl.tv_sec + (double)dl.tv_nsec * 1e-9 + timeout_s;
    dl.tv_sec = (time_t)t;
    dl.tv_nsec = (long)((t - (double)dl.tv_sec) * 1e9);
    pthread_mutex_lock(&h->mu);
    while (h->inflight > 0) {
        if (pthread_cond_timedwait(&h->idle, &h->mu, &dl) == ETIMEDOUT) break;
    }
    bool idle = h->inflight == 0;
    pthread_mutex_unlock(&h->mu);
    return idle;
}

void http_stop(http_server *h) {
    if (!h->d) return;
    pthread_mutex_lock(&h->mu);
    h->watching = false;
    pthread_cond_broadcast(&h->idle);
    pthread_mutex_unlock(&h->mu);
    pthread_join(h->watchdog, NULL);
    MHD_stop_daemon(h->d);
    if (h->listen_fd >= 0) close(h->listen_fd);
    pthread_cond_destroy(&h->idle);
    pthread_mutex_destroy(&h->mu);
    free(h->model_id), free(h->api_key), free(h->chat_err);
    tok_vocab_free(h->vocab);
    memset(h, 0, sizeof *h);
}
