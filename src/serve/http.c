#include "http.h"

#include "../text/chat_gram.h"
#include "../text/chat_out.h"
#include "../text/json_schema.h"

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

typedef struct http_buf {
    char *p;
    size_t len, cap;
} http_buf;

static int hb_add(http_buf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc < b->len + n + 1) nc *= 2;
        char *np = realloc(b->p, nc);
        if (!np) return -1;
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
    return 0;
}

static int hb_printf(http_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int hb_printf(http_buf *b, const char *fmt, ...) {
    char tmp[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return -1;
    if ((size_t)n < sizeof tmp) return hb_add(b, tmp, (size_t)n);
    char *big = malloc((size_t)n + 1);
    if (!big) return -1;
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    int rc = hb_add(b, big, (size_t)n);
    free(big);
    return rc;
}

static uint64_t http_random64(void) {
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
static bool http_client_gone(int fd) {
    if (fd < 0) return false;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

static int http_conn_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

/* Length of the valid UTF-8 sequence at s (1-4), or 0 if the bytes there are not one (overlong forms,
 * surrogates and code points above U+10FFFF included). */
static size_t http_utf8_len(const unsigned char *s, size_t left) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t n = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    if (n == 0 || n > left) return 0;
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
    }
    if (c == 0xe0 && s[1] < 0xa0) return 0; /* overlong */
    if (c == 0xed && s[1] >= 0xa0) return 0; /* surrogate */
    if (c == 0xf0 && s[1] < 0x90) return 0; /* overlong */
    if (c == 0xf4 && s[1] >= 0x90) return 0; /* above U+10FFFF */
    return n;
}

/* Text that came from a client, made safe to show. For a JSON body (log = false) every byte that is not
 * valid UTF-8 becomes U+FFFD, so a client's JSON parser never meets invalid text (cJSON escapes control
 * characters itself). For the log (log = true) control characters and invalid bytes become \xNN, so no
 * request can write a line, an escape sequence or binary into the server's log. Cuts at out_size. */
static void http_clean(const char *in, char *out, size_t out_size, bool log) {
    const unsigned char *s = (const unsigned char *)in;
    size_t n = strlen(in), o = 0;
    for (size_t i = 0; i < n && o + 5 < out_size;) {
        size_t k = http_utf8_len(s + i, n - i);
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

static void http_log(const http_server *h, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void http_log(const http_server *h, const char *fmt, ...) {
    if (h->cfg.quiet) return;
    char line[1024], clean[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    http_clean(line, clean, sizeof clean, true);
    fprintf(stderr, "ringlm serve: %s\n", clean);
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

/* Per request (one call chain of the access handler). */
typedef struct http_conn {
    http_server *h;
    int ep;
    http_buf body;
    bool too_large;
    bool answered;
} http_conn;

static enum MHD_Result http_queue(http_conn *hc, struct MHD_Connection *c, int status, struct MHD_Response *r) {
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Access-Control-Allow-Origin", "*");
    enum MHD_Result rc = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    http_count(hc->h, hc->ep, status);
    hc->answered = true;
    return rc;
}

/* Takes ownership of body (malloc'ed). */
static enum MHD_Result http_send(http_conn *hc, struct MHD_Connection *c, int status, const char *type, char *body,
                                 size_t len) {
    struct MHD_Response *r = MHD_create_response_from_buffer_with_free_callback(len, body, free);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", type);
    return http_queue(hc, c, status, r);
}

static enum MHD_Result http_send_json(http_conn *hc, struct MHD_Connection *c, int status, cJSON *j) {
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!s) return MHD_NO;
    size_t n = strlen(s);
    char *t = realloc(s, n + 2); /* a final newline reads better with curl */
    if (t) s = t, s[n++] = '\n', s[n] = 0;
    return http_send(hc, c, status, "application/json", s, n);
}

static cJSON *http_error_json(const char *msg, const char *type, const char *param, const char *code) {
    cJSON *j = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(j, "error");
    cJSON_AddStringToObject(e, "message", msg);
    cJSON_AddStringToObject(e, "type", type);
    if (param) cJSON_AddStringToObject(e, "param", param);
    else cJSON_AddNullToObject(e, "param");
    if (code) cJSON_AddStringToObject(e, "code", code);
    else cJSON_AddNullToObject(e, "code");
    return j;
}

/* What went wrong with a request: everything an OpenAI error body carries. */
typedef struct http_fail {
    int status;
    const char *type, *code;
    char param[64];
    char msg[768];
} http_fail;

static int http_failf(http_fail *f, int status, const char *type, const char *code, const char *param, const char *fmt,
                      ...) __attribute__((format(printf, 6, 7)));
static int http_failf(http_fail *f, int status, const char *type, const char *code, const char *param, const char *fmt,
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

/* 400 invalid_request_error about one field. */
#define BAD(f, param, ...) http_failf((f), 400, "invalid_request_error", NULL, (param), __VA_ARGS__)

static enum MHD_Result http_send_fail(http_conn *hc, struct MHD_Connection *c, const http_fail *f) {
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

static enum MHD_Result http_send_error(http_conn *hc, struct MHD_Connection *c, int status, const char *type,
                                       const char *code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));
static enum MHD_Result http_send_error(http_conn *hc, struct MHD_Connection *c, int status, const char *type,
                                       const char *code, const char *param, const char *fmt, ...) {
    http_fail f = {.status = status, .type = type, .code = code};
    snprintf(f.param, sizeof f.param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f.msg, sizeof f.msg, fmt, ap);
    va_end(ap);
    return http_send_fail(hc, c, &f);
}

/* ---- request fields ---------------------------------------------------------------------------------- */

static bool http_absent(const cJSON *v) { return !v || cJSON_IsNull(v); }

/* A number field in [lo, hi]; absent or null leaves *out alone. */
static int http_get_num(const cJSON *j, const char *name, double lo, double hi, double *out, http_fail *f) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, name);
    if (http_absent(v)) return 0;
    if (!cJSON_IsNumber(v)) return BAD(f, name, "'%s' must be a number", name);
    if (!(v->valuedouble >= lo && v->valuedouble <= hi)) {
        return BAD(f, name, "'%s' is %g; it must be between %g and %g", name, v->valuedouble, lo, hi);
    }
    *out = v->valuedouble;
    return 0;
}

static int http_get_int(const cJSON *j, const char *name, double lo, double hi, long long *out, http_fail *f) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, name);
    if (http_absent(v)) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble != (double)(long long)v->valuedouble) {
        return BAD(f, name, "'%s' must be an integer", name);
    }
    if (!(v->valuedouble >= lo && v->valuedouble <= hi)) {
        return BAD(f, name, "'%s' is %.0f; it must be between %.0f and %.0f", name, v->valuedouble, lo, hi);
    }
    *out = (long long)v->valuedouble;
    return 0;
}

static int http_get_bool(const cJSON *j, const char *name, bool *out, http_fail *f) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, name);
    if (http_absent(v)) return 0;
    if (!cJSON_IsBool(v)) return BAD(f, name, "'%s' must be true or false", name);
    *out = cJSON_IsTrue(v);
    return 0;
}

/* Strings that must outlive the parse (joined content parts), freed with the job. */
typedef struct http_strs {
    char **v;
    int n, cap;
} http_strs;

static char *http_keep(http_strs *s, char *p) {
    if (!p) return NULL;
    if (s->n == s->cap) {
        int nc = s->cap ? s->cap * 2 : 8;
        char **nv = realloc(s->v, (size_t)nc * sizeof *nv);
        if (!nv) {
            free(p);
            return NULL;
        }
        s->v = nv;
        s->cap = nc;
    }
    return s->v[s->n++] = p;
}

static void http_strs_free(http_strs *s) {
    for (int i = 0; i < s->n; i++) free(s->v[i]);
    free(s->v);
}

/* One parsed completion request. */
/* The served name equal to s, or NULL. */
static const char *http_model_name(const http_server *h, const char *s) {
    for (int i = 0; i < h->n_names; i++) {
        if (strcmp(s, h->names[i]) == 0) return h->names[i];
    }
    return NULL;
}

/* "'a', 'b' or 'c'" for messages (cut to n). */
static void http_names_list(const http_server *h, char *buf, size_t n) {
    size_t at = 0;
    buf[0] = 0;
    for (int i = 0; i < h->n_names && at < n; i++) {
        const char *sep = i == 0 ? "" : i == h->n_names - 1 ? " or " : ", ";
        int w = snprintf(buf + at, n - at, "%s'%s'", sep, h->names[i]);
        if (w < 0) break;
        at += (size_t)w;
    }
}

/* Choices one request may ask for: n per prompt, times the prompts of a completions prompt array. */
#define HTTP_MAX_CHOICES 16

typedef struct http_job {
    bool chat, stream, include_usage;
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

static void http_job_free(http_job *jb) {
    gr_free(jb->grammar);
    jb->grammar = NULL;
    for (int i = 0; i < HTTP_MAX_CHOICES; i++) free(jb->prompt[i]), free(jb->echo_text[i]);
    free(jb->bias);
    http_strs_free(&jb->strs);
}

/* Adds one logit bias (b: a number, or false to ban the token) for token id. */
static int http_bias_add(const http_server *h, http_job *jb, double id, const cJSON *b, const char *key, http_fail *f) {
    int32_t n_vocab = h->tok->n_vocab;
    if (!(id >= 0 && id < n_vocab && id == (double)(int32_t)id)) {
        return BAD(f, "logit_bias", "logit_bias: \"%s\" is not a token id in [0, %d)", key, n_vocab);
    }
    float v;
    if (cJSON_IsFalse(b)) v = -INFINITY; /* llama-server's ban */
    else if (cJSON_IsNumber(b) && isfinite(b->valuedouble)) v = (float)b->valuedouble;
    else return BAD(f, "logit_bias", "logit_bias: the bias of token %s must be a number (or false to ban it)", key);
    if (jb->p.smp.n_bias == SMP_MAX_BIAS) return BAD(f, "logit_bias", "logit_bias: at most %d tokens", SMP_MAX_BIAS);
    if (jb->p.smp.n_bias % 64 == 0) {
        smp_bias *nb = realloc(jb->bias, ((size_t)jb->p.smp.n_bias + 64) * sizeof *nb);
        if (!nb) return http_failf(f, 500, "server_error", NULL, NULL, "out of memory");
        jb->bias = nb;
    }
    jb->bias[jb->p.smp.n_bias++] = (smp_bias){(int32_t)id, v};
    jb->p.smp.bias = jb->bias;
    return 0;
}

/* logit_bias: OpenAI's object of token id strings to numbers ({"15043": -100}), or llama-server's array
 * of [id or text, bias] pairs (a text biases each of its tokens); a bias of false bans the token. The
 * bias is added to the logit before any other sampling step, greedy included (sampler.h), as llama.cpp
 * does; OpenAI's -100 therefore all but bans a token, and any finite number is taken as it is. */
static int http_parse_bias(const http_server *h, const cJSON *j, http_job *jb, http_fail *f) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "logit_bias"), *e;
    if (http_absent(v)) return 0;
    if (cJSON_IsObject(v)) {
        cJSON_ArrayForEach(e, v) {
            char *end = NULL;
            errno = 0;
            long id = strtol(e->string, &end, 10);
            if (!*e->string || *end || errno || id < 0) {
                return BAD(f, "logit_bias", "logit_bias: key \"%.64s\" is not a token id", e->string);
            }
            if (http_bias_add(h, jb, (double)id, e, e->string, f) != 0) return -1;
        }
        return 0;
    }
    if (!cJSON_IsArray(v)) return BAD(f, "logit_bias", "'logit_bias' must be an object of token ids to biases");
    cJSON_ArrayForEach(e, v) {
        const cJSON *k = cJSON_GetArrayItem(e, 0), *b = cJSON_GetArrayItem(e, 1);
        if (!cJSON_IsArray(e) || cJSON_GetArraySize(e) != 2 || !(cJSON_IsNumber(k) || cJSON_IsString(k))) {
            return BAD(f, "logit_bias", "logit_bias: each entry of the array must be [token id or text, bias]");
        }
        if (cJSON_IsNumber(k)) {
            char key[32];
            snprintf(key, sizeof key, "%g", k->valuedouble);
            if (http_bias_add(h, jb, k->valuedouble, b, key, f) != 0) return -1;
            continue;
        }
        int32_t *ids = NULL;
        size_t n = 0;
        rl_err err;
        if (tok_encode(h->tok, k->valuestring, strlen(k->valuestring), false, &ids, &n, &err) != 0) {
            return BAD(f, "logit_bias", "logit_bias: %s", err.msg);
        }
        for (size_t i = 0; i < n; i++) {
            char key[32];
            snprintf(key, sizeof key, "%d", (int)ids[i]);
            if (http_bias_add(h, jb, ids[i], b, key, f) != 0) {
                free(ids);
                return -1;
            }
        }
        free(ids);
    }
    return 0;
}

/* The fields both endpoints share: sampling, limits, stop, stream. OpenAI's defaults where absent
 * (temperature 1, top_p 1, no penalties), top_k / min_p off unless asked for. */
static int http_parse_common(const http_server *h, const cJSON *j, http_job *jb, http_fail *f) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "model");
    jb->model = h->names[0];
    if (!http_absent(v)) {
        if (!cJSON_IsString(v)) return BAD(f, "model", "'model' must be a string");
        if (!(jb->model = http_model_name(h, v->valuestring))) {
            char list[512];
            http_names_list(h, list, sizeof list);
            return http_failf(f, 404, "invalid_request_error", "model_not_found", "model",
                              "model '%s' is not served here; this server serves %s", v->valuestring, list);
        }
    }
    smp_params *sp = &jb->p.smp;
    *sp = smp_params_default(http_random64());
    sp->temperature = 1.0f;
    sp->top_k = 0;
    sp->top_p = 1.0f;
    sp->min_p = 0.0f;
    double d;
    long long ll;
    if ((d = sp->temperature, http_get_num(j, "temperature", 0, 2, &d, f)) != 0) return -1;
    sp->temperature = (float)d;
    if ((d = sp->top_p, http_get_num(j, "top_p", 0, 1, &d, f)) != 0) return -1;
    sp->top_p = (float)d;
    if ((d = sp->min_p, http_get_num(j, "min_p", 0, 1, &d, f)) != 0) return -1;
    sp->min_p = (float)d;
    if ((ll = sp->top_k, http_get_int(j, "top_k", 0, 1e9, &ll, f)) != 0) return -1;
    sp->top_k = (int32_t)ll;
    if ((d = 0, http_get_num(j, "presence_penalty", -2, 2, &d, f)) != 0) return -1;
    sp->presence_penalty = (float)d;
    if ((d = 0, http_get_num(j, "frequency_penalty", -2, 2, &d, f)) != 0) return -1;
    sp->frequency_penalty = (float)d;
    if ((d = sp->repeat_penalty, http_get_num(j, "repeat_penalty", 0.01, 100, &d, f)) != 0) return -1;
    sp->repeat_penalty = (float)d;
    ll = 0;
    v = cJSON_GetObjectItemCaseSensitive(j, "seed");
    if (!http_absent(v)) {
        if (http_get_int(j, "seed", -9.2e18, 9.2e18, &ll, f) != 0) return -1;
        sp->seed = (uint64_t)ll;
    }
    if (http_parse_bias(h, j, jb, f) != 0) return -1;
    /* echo (completions): the prompt comes back before the completion, and with logprobs its tokens'
     * log-probabilities too; max_tokens 0 then only scores the prompt (what evaluation harnesses ask). */
    if (!jb->chat && http_get_bool(j, "echo", &jb->echo, f) != 0) return -1;
    if (jb->chat && !http_absent(cJSON_GetObjectItemCaseSensitive(j, "echo"))) {
        return BAD(f, "echo", "'echo' is for /v1/completions");
    }
    ll = 0;
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(j, "max_tokens");
    if (jb->echo && cJSON_IsNumber(mt) && mt->valuedouble == 0) {
        jb->score_only = true; /* one token is generated (every request generates one) and not shown */
        ll = 1;
    } else if (http_get_int(j, "max_tokens", 1, 1e9, &ll, f) != 0) {
        return -1;
    }
    if (jb->chat && http_get_int(j, "max_completion_tokens", 1, 1e9, &ll, f) != 0) return -1;
    jb->p.max_tokens = (int)ll;
    if (!jb->chat && ll == 0) jb->p.max_tokens = 16; /* OpenAI's default for /v1/completions */
    if (http_get_bool(j, "ignore_eos", &jb->p.ignore_eos, f) != 0) return -1;
    if (http_get_bool(j, "stream", &jb->stream, f) != 0) return -1;
    /* ringlm's own field: the signed receipts of the request's traversals, in the response. */
    if (http_get_bool(j, "receipts", &jb->p.receipts, f) != 0) return -1;
    if (jb->p.receipts && !h->s->be.receipts) {
        return BAD(f, "receipts", "this server signs no receipts: it needs a ring (--ring) with --receipts or --audit-rate");
    }
    /* ringlm's own field: speculative drafting for this request, "ngram" (prompt lookup), "model" (the
     * server's draft model), "dspark" (the server's DSpark draft), up to the server's --draft-n tokens per
     * step, or "none"; absent: the server's --draft. */
    jb->p.draft_n = h->cfg.draft_n;
    jb->p.draft_model = h->cfg.draft_model;
    jb->p.draft_dspark = h->cfg.draft_dspark;
    v = cJSON_GetObjectItemCaseSensitive(j, "draft");
    if (!http_absent(v)) {
        const char *d = cJSON_IsString(v) ? v->valuestring : "";
        if (strcmp(d, "ngram") != 0 && strcmp(d, "none") != 0 && strcmp(d, "model") != 0 && strcmp(d, "dspark") != 0) {
            return BAD(f, "draft", "'draft' must be \"ngram\", \"model\", \"dspark\" or \"none\" (the draft model is chosen when the server starts)");
        }
        if (strcmp(d, "model") == 0 && !h->cfg.have_draft_model) {
            return BAD(f, "draft", "this server has no draft model: start it with --draft MODEL.gguf");
        }
        if (strcmp(d, "dspark") == 0 && !h->cfg.have_dspark) {
            return BAD(f, "draft", "this server has no DSpark draft: start it with --draft dspark:DRAFT.gguf");
        }
        jb->p.draft_n = strcmp(d, "none") == 0 ? 0 : h->cfg.draft_k;
        jb->p.draft_model = strcmp(d, "model") == 0;
        jb->p.draft_dspark = strcmp(d, "dspark") == 0;
    }
    v = cJSON_GetObjectItemCaseSensitive(j, "stream_options");
    if (!http_absent(v)) {
        if (!cJSON_IsObject(v)) return BAD(f, "stream_options", "'stream_options' must be an object");
        if (http_get_bool(v, "include_usage", &jb->include_usage, f) != 0) {
            snprintf(f->param, sizeof f->param, "stream_options.include_usage");
            return -1;
        }
    }
    ll = 1;
    if (http_get_int(j, "n", 1, HTTP_MAX_CHOICES, &ll, f) != 0) {
        return BAD(f, "n", "'n' must be a number of choices, 1 to %d", HTTP_MAX_CHOICES);
    }
    jb->n = (int)ll;
    v = cJSON_GetObjectItemCaseSensitive(j, "stop");
    if (cJSON_IsString(v)) {
        jb->p.stop[jb->p.n_stop++] = v->valuestring;
    } else if (cJSON_IsArray(v)) {
        const cJSON *e;
        cJSON_ArrayForEach(e, v) {
            if (!cJSON_IsString(e)) return BAD(f, "stop", "'stop' must be a string or an array of strings");
            if (jb->p.n_stop == SCH_MAX_STOP) return BAD(f, "stop", "at most %d stop strings are supported", SCH_MAX_STOP);
            jb->p.stop[jb->p.n_stop++] = e->valuestring;
        }
    } else if (!http_absent(v)) {
        return BAD(f, "stop", "'stop' must be a string or an array of strings");
    }
    /* Log-probabilities: chat asks with logprobs: true and top_logprobs: N; completions (the legacy API)
     * with logprobs: N. The model's own distribution (sampler.h: smp_logprobs), at most 20 alternatives. */
    v = cJSON_GetObjectItemCaseSensitive(j, "logprobs");
    if (jb->chat) {
        if (http_get_bool(j, "logprobs", &jb->p.logprobs, f) != 0) return -1;
        ll = 0;
        if (http_get_int(j, "top_logprobs", 0, SMP_TOP_LOGPROBS, &ll, f) != 0) return -1;
        if (!http_absent(cJSON_GetObjectItemCaseSensitive(j, "top_logprobs")) && !jb->p.logprobs) {
            return BAD(f, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
        }
        jb->top_logprobs = (int)ll;
    } else if (!http_absent(v) && !cJSON_IsFalse(v)) {
        ll = 0;
        if (!cJSON_IsNumber(v) || http_get_int(j, "logprobs", 0, SMP_TOP_LOGPROBS, &ll, f) != 0) {
            return BAD(f, "logprobs", "'logprobs' must be how many alternatives to return per token, 0 to %d", SMP_TOP_LOGPROBS);
        }
        jb->p.logprobs = true;
        jb->top_logprobs = (int)ll;
    }
    jb->p.prompt_logprobs = jb->echo && jb->p.logprobs;
    /* Asked-for features we do not have: say so rather than silently ignore them. */
    v = cJSON_GetObjectItemCaseSensitive(j, "suffix");
    if (!http_absent(v) && !(cJSON_IsString(v) && !*v->valuestring)) return BAD(f, "suffix", "'suffix' is not supported");
    ll = 1;
    if (http_get_int(j, "best_of", 1, 1, &ll, f) != 0) return BAD(f, "best_of", "'best_of' must be 1");
    return 0;
}

/* A message's content: a string, null, or an array of {"type": "text", "text": ...} parts (joined). */
static int http_content(const cJSON *v, const char *param, const char **out, http_strs *strs, http_fail *f) {
    *out = NULL;
    if (http_absent(v)) return 0;
    if (cJSON_IsString(v)) {
        *out = v->valuestring;
        return 0;
    }
    if (!cJSON_IsArray(v)) return BAD(f, param, "'%s' must be a string or an array of text parts", param);
    http_buf b = {0};
    const cJSON *part;
    cJSON_ArrayForEach(part, v) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsObject(part) || !cJSON_IsString(t) || strcmp(t->valuestring, "text") != 0 || !cJSON_IsString(x)) {
            free(b.p);
            return BAD(f, param, "'%s': only parts of type \"text\" with a string \"text\" are supported", param);
        }
        if (hb_add(&b, x->valuestring, strlen(x->valuestring)) != 0) {
            free(b.p);
            return http_failf(f, 500, "server_error", NULL, NULL, "out of memory");
        }
    }
    if (!b.p && hb_add(&b, "", 0) != 0) return http_failf(f, 500, "server_error", NULL, NULL, "out of memory");
    *out = http_keep(strs, b.p);
    return *out ? 0 : http_failf(f, 500, "server_error", NULL, NULL, "out of memory");
}

/* response_format json_object / json_schema: constrained decoding (sampler.h: grammar), JSON matching the
 * schema, within max_tokens. On a ring the last stage samples: the grammar travels to it (frame.h). Drafts
 * stay: the scheduler cuts those the grammar refuses, and acceptance judges the rest against the
 * constrained distribution (accept.h). A K3 chat reply (jb->p.split, the markers in the vocabulary) gets the
 * JSON as its response section's body, after the reasoning when thinking is on: the answer lands in
 * `content`, as llama-server applies a schema after the reasoning. Parsed after the prompt, which decides
 * the reply's shape. */
static int http_parse_format(const http_server *h, const cJSON *j, http_job *jb, http_fail *f) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "response_format");
    if (http_absent(v)) return 0;
    const cJSON *t = cJSON_IsObject(v) ? cJSON_GetObjectItemCaseSensitive(v, "type") : NULL;
    if (!cJSON_IsString(t)) {
        return BAD(f, "response_format", "'response_format' must be an object with a 'type' (text, json_object or json_schema)");
    }
    bool is_schema = strcmp(t->valuestring, "json_schema") == 0;
    if (!is_schema && strcmp(t->valuestring, "json_object") != 0) {
        if (strcmp(t->valuestring, "text") == 0) return 0;
        char clean[96];
        http_clean(t->valuestring, clean, sizeof clean, false);
        return BAD(f, "response_format", "unknown response_format type '%s' (text, json_object or json_schema)", clean);
    }
    const cJSON *sc = NULL;
    bool strict = false;
    if (is_schema) { /* {"type":"json_schema","json_schema":{"name":..., "schema":{...}, "strict":...}} */
        const cJSON *w = cJSON_GetObjectItemCaseSensitive(v, "json_schema");
        if (!cJSON_IsObject(w)) {
            return BAD(f, "response_format", "response_format json_schema needs 'json_schema': an object "
                       "with the 'schema'");
        }
        sc = cJSON_GetObjectItemCaseSensitive(w, "schema");
        if (http_absent(sc)) sc = NULL; /* OpenAI: no schema is any JSON value */
        /* strict: every keyword enforced, or a 400 naming the one that cannot be; otherwise those are
         * ignored (the output still parses, and follows everything else the schema says) */
        strict = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(w, "strict"));
    }
    if (!h->caps.eog) { /* the JSON could never end: the output would run on unconstrained past it */
        return http_failf(f, 400, "invalid_request_error", "response_format_unsupported", "response_format",
                          "this model cannot honour response_format: its vocabulary lacks %s", h->caps.lacks);
    }
    const cJSON any = {.type = cJSON_True};
    rl_err e;
    if (jb->p.split && h->caps.sections)
        jb->grammar = chat_json_grammar_new(jb->p.split_fmt, is_schema ? (sc ? sc : &any) : NULL, !strict, jb->p.thinking, &e);
    else jb->grammar = is_schema ? js_grammar_new(sc ? sc : &any, !strict, &e) : js_object_grammar_new(&e);
    if (!jb->grammar) return BAD(f, "response_format", "%s", e.msg);
    jb->p.smp.budget = jb->p.max_tokens;
    jb->p.smp.vocab = h->vocab;
    return 0;
}

/* tools and tool_choice: the declarations (as JSON text for the template, *text; cJSON_free it), whether
 * the reply's calls are parsed, and for tool_choice "required" or a named tool the grammar's inputs. */
static int http_parse_tools(const http_server *h, const cJSON *j, http_job *jb, char **text, http_fail *f) {
    *text = NULL;
    const cJSON *tl = cJSON_GetObjectItemCaseSensitive(j, "tools"), *tc = cJSON_GetObjectItemCaseSensitive(j, "tool_choice");
    int n_tools = 0;
    if (!http_absent(tl)) {
        if (!cJSON_IsArray(tl)) return BAD(f, "tools", "'tools' must be an array of {\"type\": \"function\", \"function\": {...}}");
        const cJSON *t;
        cJSON_ArrayForEach(t, tl) {
            char param[64];
            snprintf(param, sizeof param, "tools[%d]", n_tools);
            const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type"), *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name"), *par = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
            if (!cJSON_IsString(type) || strcmp(type->valuestring, "function") != 0 || !cJSON_IsObject(fn) ||
                !cJSON_IsString(name) || !*name->valuestring) {
                return BAD(f, param, "'%s' must be {\"type\": \"function\", \"function\": {\"name\": ..., \"parameters\": {...}}}", param);
            }
            if (!http_absent(par) && !cJSON_IsObject(par)) return BAD(f, param, "'%s.function.parameters' must be a JSON schema (an object)", param);
            n_tools++;
        }
    }
    enum { TC_NONE, TC_AUTO, TC_REQUIRED, TC_NAMED } mode = TC_AUTO;
    const char *named = NULL;
    if (!http_absent(tc)) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tc, "function");
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (cJSON_IsString(tc) && strcmp(tc->valuestring, "none") == 0) mode = TC_NONE;
        else if (cJSON_IsString(tc) && strcmp(tc->valuestring, "auto") == 0) mode = TC_AUTO;
        else if (cJSON_IsString(tc) && strcmp(tc->valuestring, "required") == 0) mode = TC_REQUIRED;
        else if (cJSON_IsObject(tc) && cJSON_IsString(nm)) mode = TC_NAMED, named = nm->valuestring;
        else {
            return BAD(f, "tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                       "{\"type\": \"function\", \"function\": {\"name\": ...}}");
        }
    }
    if ((mode == TC_REQUIRED || mode == TC_NAMED) && n_tools == 0) {
        return BAD(f, "tool_choice", "'tool_choice' %s needs 'tools' to choose from", mode == TC_REQUIRED ? "\"required\"" : "naming a function");
    }
    if (n_tools == 0) return 0;
    jb->parse_tools = mode != TC_NONE && jb->p.split;
    if ((mode == TC_REQUIRED || mode == TC_NAMED) && !h->caps.sections) {
        /* the calls' grammar is made of the markers: without them it cannot be met, and the reply would be
         * free text posing as a forced call */
        return http_failf(f, 400, "invalid_request_error", "tool_calls_unsupported", "tool_choice",
                          "tool_choice %s cannot be honoured by this model: its vocabulary lacks %s",
                          mode == TC_REQUIRED ? "\"required\"" : "naming a function", h->caps.lacks);
    }
    if (mode == TC_REQUIRED || mode == TC_NAMED) {
        if (jb->grammar) return BAD(f, "tool_choice", "a required tool call and response_format cannot be combined");
        rl_err e;
        if (!(jb->grammar = chat_tools_grammar_new(h->cfg.chat_fmt, tl, named, jb->p.thinking, false, &e))) {
            return BAD(f, "tool_choice", "%s", e.msg);
        }
        jb->p.smp.budget = jb->p.max_tokens;
        jb->p.smp.vocab = h->vocab;
    } else if (mode == TC_AUTO && jb->parse_tools && !jb->grammar && h->caps.sections) {
        /* As llama-server does: free text, but calls, when the model writes them, well formed and with
         * arguments that follow their tool's schema (exactly for "strict" tools). No budget: a reply cut
         * by max_tokens ends "length", as any text, rather than being steered to close early. */
        rl_err e;
        if (!(jb->grammar = chat_tools_grammar_new(h->cfg.chat_fmt, tl, NULL, jb->p.thinking, true, &e))) {
            return BAD(f, "tools", "%s", e.msg);
        }
        jb->p.smp.budget = 0;
        jb->p.smp.vocab = h->vocab;
    }
    if (!(*text = cJSON_PrintUnformatted(tl))) return http_failf(f, 500, "server_error", NULL, NULL, "out of memory");
    return 0;
}

/* messages -> chat_msg[] -> the model's chat format -> tokens (special markers parsed). */
static int http_parse_chat(const http_server *h, const cJSON *j, http_job *jb, http_fail *f) {
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(j, "messages");
    if (!msgs) return BAD(f, "messages", "'messages' is required");
    if (!cJSON_IsArray(msgs)) return BAD(f, "messages", "'messages' must be an array");
    int n = cJSON_GetArraySize(msgs);
    if (n == 0) return BAD(f, "messages", "'messages' must not be empty");
    if (!h->cfg.have_chat) {
        return http_failf(f, 400, "invalid_request_error", "chat_template_unsupported", "messages",
                          "this model's chat template is not supported (%s); use /v1/completions", h->chat_err);
    }
    chat_msg *cm = calloc((size_t)n, sizeof *cm);
    chat_tool_call *calls = NULL;
    int n_calls_total = 0, rc = -1;
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs) {
        const cJSON *tc = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
        if (cJSON_IsArray(tc)) n_calls_total += cJSON_GetArraySize(tc);
    }
    if (n_calls_total) calls = calloc((size_t)n_calls_total, sizeof *calls);
    if (!cm || (n_calls_total && !calls)) {
        rc = http_failf(f, 500, "server_error", NULL, NULL, "out of memory");
        goto out;
    }
    int i = 0, ci = 0;
    char param[64];
    cJSON_ArrayForEach(m, msgs) {
        chat_msg *o = &cm[i];
        snprintf(param, sizeof param, "messages[%d]", i);
        if (!cJSON_IsObject(m)) {
            BAD(f, param, "'%s' must be an object", param);
            goto out;
        }
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        snprintf(param, sizeof param, "messages[%d].role", i);
        if (!cJSON_IsString(role)) {
            BAD(f, param, "'%s' is required and must be a string", param);
            goto out;
        }
        const char *r = role->valuestring;
        if (strcmp(r, "system") == 0 || strcmp(r, "developer") == 0) o->role = CHAT_SYSTEM;
        else if (strcmp(r, "user") == 0) o->role = CHAT_USER;
        else if (strcmp(r, "assistant") == 0) o->role = CHAT_ASSISTANT;
        else if (strcmp(r, "tool") == 0) o->role = CHAT_TOOL;
        else {
            BAD(f, param, "'%s' is '%s'; expected system, developer, user, assistant or tool", param, r);
            goto out;
        }
        snprintf(param, sizeof param, "messages[%d].content", i);
        if (http_content(cJSON_GetObjectItemCaseSensitive(m, "content"), param, &o->content, &jb->strs, f) != 0) goto out;
        struct {
            const char *key;
            const char **dst;
        } opt[] = {{"name", &o->name}, {"tool_call_id", &o->tool_call_id}, {"reasoning_content", &o->reasoning}};
        for (size_t k = 0; k < sizeof opt / sizeof *opt; k++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(m, opt[k].key);
            if (http_absent(v)) continue;
            snprintf(param, sizeof param, "messages[%d].%s", i, opt[k].key);
            if (!cJSON_IsString(v)) {
                BAD(f, param, "'%s' must be a string", param);
                goto out;
            }
            *opt[k].dst = v->valuestring;
        }
        const cJSON *tcs = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
        if (!http_absent(tcs)) {
            snprintf(param, sizeof param, "messages[%d].tool_calls", i);
            if (!cJSON_IsArray(tcs)) {
                BAD(f, param, "'%s' must be an array", param);
                goto out;
            }
            o->tool_calls = calls + ci;
            const cJSON *tc;
            cJSON_ArrayForEach(tc, tcs) {
                const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tc, "function");
                const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
                const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
                const cJSON *id = cJSON_GetObjectItemCaseSensitive(tc, "id");
                if (!cJSON_IsObject(fn) || !cJSON_IsString(name) || !(http_absent(args) || cJSON_IsString(args))) {
                    BAD(f, param, "'%s': each call needs function.name (string) and optional function.arguments (string)",
                        param);
                    goto out;
                }
                calls[ci].name = name->valuestring;
                calls[ci].arguments = cJSON_IsString(args) ? args->valuestring : NULL;
                calls[ci].id = cJSON_IsString(id) ? id->valuestring : NULL;
                ci++;
                o->n_tool_calls++;
            }
        }
        i++;
    }
    /* Thinking on or off, and how hard, through the template's own switches: chat_template_kwargs
     * (llama-server's: {"thinking": false}, {"thinking_effort": "low"}), or OpenAI's reasoning_effort
     * (none / minimal: no thinking; low: low; medium: high; high: max - K3's efforts are low, high, max). */
    chat_opts co = chat_opts_default();
    const cJSON *kw = cJSON_GetObjectItemCaseSensitive(j, "chat_template_kwargs");
    if (!http_absent(kw)) {
        if (!cJSON_IsObject(kw)) {
            BAD(f, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
            goto out;
        }
        if (http_get_bool(kw, "thinking", &co.thinking, f) != 0) {
            snprintf(f->param, sizeof f->param, "chat_template_kwargs.thinking");
            goto out;
        }
        const cJSON *te = cJSON_GetObjectItemCaseSensitive(kw, "thinking_effort");
        if (!http_absent(te)) {
            if (!cJSON_IsString(te)) {
                BAD(f, "chat_template_kwargs.thinking_effort", "'thinking_effort' must be a string (low, high or max)");
                goto out;
            }
            co.thinking_effort = te->valuestring;
        }
    }
    const cJSON *re = cJSON_GetObjectItemCaseSensitive(j, "reasoning_effort");
    if (!http_absent(re)) {
        static const char *const from[] = {"none", "minimal", "low", "medium", "high"};
        static const char *const to[] = {NULL, NULL, "low", "high", "max"};
        int k = -1;
        for (int e = 0; cJSON_IsString(re) && e < 5; e++) {
            if (strcmp(re->valuestring, from[e]) == 0) k = e;
        }
        if (k < 0) {
            BAD(f, "reasoning_effort", "'reasoning_effort' must be none, minimal, low, medium or high");
            goto out;
        }
        co.thinking = to[k] != NULL;
        if (to[k]) co.thinking_effort = to[k];
    }
    jb->p.split = h->cfg.chat_fmt == CHAT_FMT_K3 || h->cfg.chat_fmt == CHAT_FMT_K3_LITE;
    jb->p.split_fmt = h->cfg.chat_fmt;
    jb->p.thinking = co.thinking;
    if (http_parse_format(h, j, jb, f) != 0) goto out;
    char *tools_text = NULL;
    if (http_parse_tools(h, j, jb, &tools_text, f) != 0) goto out;
    co.tools = tools_text;
    char *text = NULL;
    size_t len = 0;
    rl_err err = {{0}};
    int rr = chat_render(h->cfg.chat_fmt, cm, n, &co, &text, &len, &err);
    cJSON_free(tools_text);
    if (rr != 0) {
        BAD(f, "messages", "cannot render the conversation: %s", err.msg);
        goto out;
    }
    jb->n_prompts = 1;
    if (tok_encode(h->tok, text, len, true, &jb->prompt[0], &jb->n_prompt[0], &err) != 0) {
        free(text);
        http_failf(f, 500, "server_error", NULL, NULL, "cannot tokenize the conversation: %s", err.msg);
        goto out;
    }
    free(text);
    rc = 0;
out:
    free(cm);
    free(calls);
    return rc;
}

/* prompt: a string, [string], [token ids] or [[token ids]] (one prompt per request). Text is tokenized as
 * `ringlm run -p` does (special markers are not parsed), so the same prompt gives the same tokens. */
/* One prompt: a string, or an array of token ids. */
static int http_parse_one_prompt(const http_server *h, const cJSON *v, http_job *jb, int k, http_fail *f) {
    int32_t **out = &jb->prompt[k];
    size_t *n_out = &jb->n_prompt[k];
    rl_err err = {{0}};
    if (cJSON_IsString(v)) {
        if (tok_encode(h->tok, v->valuestring, strlen(v->valuestring), false, out, n_out, &err) != 0) {
            return http_failf(f, 500, "server_error", NULL, NULL, "cannot tokenize the prompt: %s", err.msg);
        }
        if (jb->echo && !(jb->echo_text[k] = strdup(v->valuestring))) {
            return http_failf(f, 500, "server_error", NULL, NULL, "out of memory");
        }
        return 0;
    }
    if (!cJSON_IsArray(v)) return BAD(f, "prompt", "'prompt' must be a string, an array of token ids, or an array of those");
    int n = cJSON_GetArraySize(v);
    *out = malloc((size_t)(n ? n : 1) * sizeof **out);
    if (!*out) return http_failf(f, 500, "server_error", NULL, NULL, "out of memory");
    const cJSON *e;
    cJSON_ArrayForEach(e, v) {
        if (!cJSON_IsNumber(e) || e->valuedouble != (double)(int32_t)e->valuedouble || e->valuedouble < 0 ||
            e->valuedouble >= h->tok->n_vocab) {
            return BAD(f, "prompt", "'prompt' token ids must be integers in [0, %d)", h->tok->n_vocab);
        }
        (*out)[(*n_out)++] = (int32_t)e->valuedouble;
    }
    size_t tl;
    if (jb->echo && tok_decode(h->tok, *out, *n_out, false, false, &jb->echo_text[k], &tl, &err) != 0) {
        return http_failf(f, 500, "server_error", NULL, NULL, "cannot decode the prompt: %s", err.msg);
    }
    return 0;
}

/* A string, an array of token ids, or an array of prompts (each a string or an array of ids): one choice
 * (n of them) per prompt, in order. */
static int http_parse_prompt(const http_server *h, const cJSON *j, http_job *jb, http_fail *f) {
    const cJSON *tl = cJSON_GetObjectItemCaseSensitive(j, "tools");
    if (!http_absent(tl) && !(cJSON_IsArray(tl) && cJSON_GetArraySize(tl) == 0)) {
        return BAD(f, "tools", "'tools' are for /v1/chat/completions (a completion has no chat template to declare them in)");
    }
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "prompt");
    if (!v) return BAD(f, "prompt", "'prompt' is required");
    const cJSON *first = cJSON_IsArray(v) ? cJSON_GetArrayItem(v, 0) : NULL;
    if (!first || !(cJSON_IsString(first) || cJSON_IsArray(first))) { /* one prompt */
        jb->n_prompts = 1;
        return http_parse_one_prompt(h, v, jb, 0, f);
    }
    int n = cJSON_GetArraySize(v);
    if (n * jb->n > HTTP_MAX_CHOICES) {
        return BAD(f, "prompt", "%d prompts x n = %d choices: at most %d per request", n, jb->n, HTTP_MAX_CHOICES);
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, v) {
        if (!(cJSON_IsString(e) || cJSON_IsArray(e))) {
            return BAD(f, "prompt", "each prompt of a prompt array must be a string or an array of token ids");
        }
        int k = jb->n_prompts++;
        if (http_parse_one_prompt(h, e, jb, k, f) != 0) return -1;
    }
    return 0;
}

/* ---- completion responses ----------------------------------------------------------------------------- */

static void http_new_id(http_server *h, bool chat, char *id, size_t n) {
    pthread_mutex_lock(&h->mu);
    uint64_t k = h->next_id++;
    pthread_mutex_unlock(&h->mu);
    snprintf(id, n, "%s-%016llx%08llx", chat ? "chatcmpl" : "cmpl", (unsigned long long)h->id_base,
             (unsigned long long)k);
}

/* usage; with speculative drafts, how many the model kept and rejected, in the fields OpenAI gives its
 * predicted outputs (completion_tokens_details). */
static cJSON *http_usage(const sch_update *up) {
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", up->n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", up->n_gen);
    cJSON_AddNumberToObject(u, "total_tokens", up->n_prompt + up->n_gen);
    if (up->drafted > 0) {
        cJSON *d = cJSON_AddObjectToObject(u, "completion_tokens_details");
        cJSON_AddNumberToObject(d, "accepted_prediction_tokens", up->accepted);
        cJSON_AddNumberToObject(d, "rejected_prediction_tokens", up->drafted - up->accepted);
    }
    return u;
}

/* The object every response and chunk starts with. */
static cJSON *http_envelope(const char *model, const char *id, const char *object, time_t created) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", id);
    cJSON_AddStringToObject(j, "object", object);
    cJSON_AddNumberToObject(j, "created", (double)created);
    cJSON_AddStringToObject(j, "model", model);
    cJSON_AddStringToObject(j, "system_fingerprint", "ringlm");
    return j;
}

/* Generated text as a JSON string. A token may decode to a NUL byte, which a C string (cJSON's) would
 * end at, dropping the rest of the text: such text is escaped here and kept as raw JSON, NUL as \u0000. */
static cJSON *http_text_item(const char *p, size_t n) {
    if (!memchr(p, 0, n)) return cJSON_CreateString(p);
    http_buf b = {0};
    hb_add(&b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)p[i];
        if (ch == '"' || ch == '\\') {
            char e[2] = {'\\', (char)ch};
            hb_add(&b, e, 2);
        } else if (ch < 0x20) {
            hb_printf(&b, "\\u%04x", ch);
        } else {
            hb_add(&b, p + i, 1);
        }
    }
    hb_add(&b, "\"", 1);
    cJSON *j = b.p ? cJSON_CreateRaw(b.p) : cJSON_CreateString("");
    free(b.p);
    return j;
}

/* Log-probabilities as OpenAI shows them: chat {"content": [{token, logprob, bytes, top_logprobs: [...]}]},
 * completions {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}; *off is the text's
 * length before these tokens (completions' offsets run over the whole text, across stream chunks). A
 * token's text is its piece, invalid UTF-8 as U+FFFD; "bytes" are the piece exactly. -inf (a banned
 * token) is shown as -9999, as JSON has no infinity and OpenAI floors its logprobs there. */
static double http_lp_num(float v) { return isfinite(v) ? (double)v : -9999.0; }

static cJSON *http_lp_token(const http_server *h, int32_t id, const char **bytes, size_t *len) {
    static const char none = 0;
    if (tok_piece(h->tok, id, false, bytes, len) != 0) *bytes = &none, *len = 0;
    char tmp[512], clean[1024];
    size_t n = *len < sizeof tmp - 1 ? *len : sizeof tmp - 1;
    memcpy(tmp, *bytes, n);
    tmp[n] = 0;
    http_clean(tmp, clean, sizeof clean, false);
    return cJSON_CreateString(clean);
}

static cJSON *http_lp_bytes(const char *b, size_t n) {
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((unsigned char)b[i]));
    return a;
}

static cJSON *http_logprobs(const http_server *h, bool chat, const smp_logprob *lp, size_t n, int top, size_t *off,
                            int32_t first) {
    const char *b;
    size_t bl;
    cJSON *j = cJSON_CreateObject();
    if (chat) {
        cJSON *content = cJSON_AddArrayToObject(j, "content");
        for (size_t i = 0; i < n; i++) {
            cJSON *e = cJSON_CreateObject();
            cJSON_AddItemToObject(e, "token", http_lp_token(h, lp[i].id, &b, &bl));
            cJSON_AddNumberToObject(e, "logprob", http_lp_num(lp[i].logprob));
            cJSON_AddItemToObject(e, "bytes", http_lp_bytes(b, bl));
            cJSON *tl = cJSON_AddArrayToObject(e, "top_logprobs");
            for (int k = 0; k < top && lp[i].top_id[k] >= 0; k++) {
                cJSON *t = cJSON_CreateObject();
                cJSON_AddItemToObject(t, "token", http_lp_token(h, lp[i].top_id[k], &b, &bl));
                cJSON_AddNumberToObject(t, "logprob", http_lp_num(lp[i].top_logprob[k]));
                cJSON_AddItemToObject(t, "bytes", http_lp_bytes(b, bl));
                cJSON_AddItemToArray(tl, t);
            }
            cJSON_AddItemToArray(content, e);
        }
        return j;
    }
    cJSON *toks = cJSON_AddArrayToObject(j, "tokens"), *tlp = cJSON_AddArrayToObject(j, "token_logprobs");
    cJSON *tops = cJSON_AddArrayToObject(j, "top_logprobs"), *offs = cJSON_AddArrayToObject(j, "text_offset");
    if (first >= 0) { /* echo: the prompt's first token, which nothing predicts (null, as OpenAI's) */
        cJSON_AddItemToArray(toks, http_lp_token(h, first, &b, &bl));
        cJSON_AddItemToArray(tlp, cJSON_CreateNull());
        cJSON_AddItemToArray(tops, cJSON_CreateNull());
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)*off));
        *off += bl;
    }
    for (size_t i = 0; i < n; i++) {
        cJSON_AddItemToArray(toks, http_lp_token(h, lp[i].id, &b, &bl));
        cJSON_AddItemToArray(tlp, cJSON_CreateNumber(http_lp_num(lp[i].logprob)));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)*off));
        *off += bl;
        cJSON *t = cJSON_CreateObject();
        for (int k = 0; k < top && lp[i].top_id[k] >= 0; k++) {
            cJSON *name = http_lp_token(h, lp[i].top_id[k], &b, &bl);
            /* two alternatives with the same text (byte tokens cleaned to U+FFFD): the likelier one stays */
            if (!cJSON_GetObjectItemCaseSensitive(t, name->valuestring)) {
                cJSON_AddNumberToObject(t, name->valuestring, http_lp_num(lp[i].top_logprob[k]));
            }
            cJSON_Delete(name);
        }
        cJSON_AddItemToArray(tops, t);
    }
    return j;
}

/* One choice: chat message / chat delta / completion text (len bytes). text NULL = no content key (chat
 * deltas). lp: its "logprobs" (taken), NULL for null. */
static cJSON *http_choice(int index, bool chat, bool delta, bool role, const char *text, size_t len,
                          const char *finish, cJSON *lp) {
    cJSON *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", index);
    if (chat) {
        cJSON *m = cJSON_AddObjectToObject(c, delta ? "delta" : "message");
        if (role) cJSON_AddStringToObject(m, "role", "assistant");
        if (text) cJSON_AddItemToObject(m, "content", http_text_item(text, len));
    } else {
        cJSON_AddItemToObject(c, "text", http_text_item(text ? text : "", text ? len : 0));
    }
    if (lp) cJSON_AddItemToObject(c, "logprobs", lp);
    else cJSON_AddNullToObject(c, "logprobs");
    if (finish) cJSON_AddStringToObject(c, "finish_reason", finish);
    else cJSON_AddNullToObject(c, "finish_reason");
    return c;
}

/* OpenAI has no "cancelled"/"error" finish reason: those never reach a client as one. */
static const char *http_finish_reason(sch_finish fin) { return fin == SCH_FIN_LENGTH ? "length" : "stop"; }

/* calls[from, to) as OpenAI's tool_calls entries; ids from the completion's id, the choice and the index */
static cJSON *http_tool_calls(const chat_call *calls, int from, int to, const char *id, int choice) {
    cJSON *a = cJSON_CreateArray();
    for (int i = from; i < to; i++) {
        cJSON *c = cJSON_CreateObject(), *fn;
        char cid[96];
        const char *tail = strchr(id, '-');
        snprintf(cid, sizeof cid, "call_%s_%d_%d", tail ? tail + 1 : id, choice, i);
        cJSON_AddNumberToObject(c, "index", i);
        cJSON_AddStringToObject(c, "id", cid);
        cJSON_AddStringToObject(c, "type", "function");
        fn = cJSON_AddObjectToObject(c, "function");
        cJSON_AddStringToObject(fn, "name", calls[i].name);
        cJSON_AddStringToObject(fn, "arguments", calls[i].arguments);
        cJSON_AddItemToArray(a, c);
    }
    return a;
}

/* The end of a reply with a tool-call section: its calls (returned, *n of them: chat_calls_free them), or
 * none when it is not whole and valid - then the section is text for the content and the finish reason
 * says why (length: cut off; tool_call_error: malformed). */
static int http_tools_end(const http_buf *raw, sch_finish fin, chat_call *calls, int *n, const char **finish) {
    int pr = chat_tools_parse(raw->p, raw->len, calls, n);
    if (pr == 1 && *n > 0) {
        *finish = "tool_calls";
        return 1;
    }
    chat_calls_free(calls, *n);
    *n = 0;
    *finish = fin == SCH_FIN_LENGTH ? "length" : "tool_call_error";
    return 0;
}

/* One choice being generated: its request and what it has produced. */
typedef struct http_run {
    sch_request *r;
    bool done;
    sch_update end;     /* its last update (fin, counts, error, receipts) */
    http_buf text, lps; /* not streamed: the text so far, the smp_logprob entries as bytes */
    http_buf reasoning; /* not streamed: the reasoning so far (chat) */
    http_buf tools;     /* the raw tool-call section so far (chat_out.h CHAT_CH_TOOLS) */
    bool parse_tools;   /* ... parsed into tool_calls (else shown as text) */
    int calls_sent;     /* streamed: the tool calls already sent as deltas */
    size_t lp_off;      /* completions' text_offset: the choice's text bytes so far */
    char *echo;         /* echo: the prompt's text, shown first (owned; NULL: no echo) */
    int32_t echo_first; /* echo with logprobs: the prompt's first token; -1 otherwise */
    size_t n_plp;       /* ... and how many prompt entries come first in its logprobs */
    bool echoed, score_only;
} http_run;

static void http_runs_free(http_run *rs, int n) {
    for (int i = 0; i < n; i++) {
        if (rs[i].r) {
            sch_cancel(rs[i].r); /* no-op when it finished */
            sch_request_release(rs[i].r);
        }
        free(rs[i].end.receipts);
        free(rs[i].text.p);
        free(rs[i].lps.p);
        free(rs[i].reasoning.p);
        free(rs[i].tools.p);
        free(rs[i].echo);
    }
}

/* Waits for news from any unfinished choice (at most about timeout_ms): the update and its choice in *k,
 * true when there was one. */
static bool http_runs_wait(http_run *rs, int n, int timeout_ms, sch_update *u, int *k) {
    int active = 0;
    for (int i = 0; i < n; i++) active += !rs[i].done;
    if (active == 0) return false;
    int slice = active > 1 ? 5 : timeout_ms; /* several: poll each in turn */
    for (int waited = 0; waited <= timeout_ms; waited += slice) {
        for (int i = 0; i < n; i++) {
            if (rs[i].done) continue;
            if (sch_request_wait(rs[i].r, active > 1 ? 0 : slice, u)) {
                *k = i;
                if (u->fin != SCH_RUNNING) {
                    rs[i].done = true;
                    rs[i].end = *u;
                    rs[i].end.text = NULL; /* the caller's */
                    rs[i].end.lp = NULL;
                    rs[i].end.reasoning = NULL;
                    u->receipts = NULL; /* kept in end */
                }
                return true;
            }
        }
        if (active > 1) {
            struct timespec ts = {0, (long)slice * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
    return false;
}

/* The first failed choice (an error ends the whole response), or NULL. */
static const sch_update *http_runs_failed(const http_run *rs, int n) {
    for (int i = 0; i < n; i++) {
        if (rs[i].done && (rs[i].end.fin == SCH_FIN_ERROR || rs[i].end.fin == SCH_FIN_CANCELLED)) return &rs[i].end;
    }
    return NULL;
}

/* Usage over the choices: each prompt's tokens once (n choices of one prompt share it, as OpenAI counts). */
static cJSON *http_runs_usage(const http_run *rs, int n_runs, int per_prompt) {
    sch_update sum = {0};
    for (int i = 0; i < n_runs; i++) {
        if (i % per_prompt == 0) sum.n_prompt += rs[i].end.n_prompt;
        sum.n_gen += rs[i].score_only ? 0 : rs[i].end.n_gen; /* echo with max_tokens 0: nothing generated is shown */
        sum.drafted += rs[i].end.drafted;
        sum.accepted += rs[i].end.accepted;
    }
    return http_usage(&sum);
}

/* The choices' receipts as one array (each receipt names its sequence and step), or NULL if none. */
static cJSON *http_runs_receipts(const http_run *rs, int n) {
    cJSON *all = NULL;
    for (int i = 0; i < n; i++) {
        cJSON *rj = rs[i].end.receipts ? cJSON_Parse(rs[i].end.receipts) : NULL;
        if (!rj) continue;
        if (!all) all = cJSON_CreateArray();
        while (cJSON_GetArraySize(rj) > 0) cJSON_AddItemToArray(all, cJSON_DetachItemFromArray(rj, 0));
        cJSON_Delete(rj);
    }
    return all;
}

/* A streamed response in progress: owns the requests and the SSE bytes not yet handed to MHD. */
typedef struct http_stream {
    http_server *h;
    http_run runs[HTTP_MAX_CHOICES];
    int n_runs, per_prompt;
    int fd;
    bool chat, include_usage, ended;
    int top_logprobs; /* -1: none asked */
    const char *model; /* one of h->names */
    char id[64];
    time_t created;
    double t0;
    http_buf out;
    size_t off;
} http_stream;

static void http_sse(http_stream *st, cJSON *j) {
    if (st->include_usage && !cJSON_GetObjectItemCaseSensitive(j, "usage")) cJSON_AddNullToObject(j, "usage");
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!s) return;
    hb_add(&st->out, "data: ", 6);
    hb_add(&st->out, s, strlen(s));
    hb_add(&st->out, "\n\n", 2);
    free(s);
}

static void http_sse_chunk(http_stream *st, int index, bool role, const char *text, size_t len, const char *finish,
                           cJSON *lp) {
    cJSON *j = http_envelope(st->model, st->id, st->chat ? "chat.completion.chunk" : "text_completion", st->created);
    cJSON *ch = cJSON_AddArrayToObject(j, "choices");
    cJSON_AddItemToArray(ch, http_choice(index, st->chat, true, role, text, len, finish, lp));
    http_sse(st, j);
}

/* After every choice finished (or one failed: u, and the rest are cancelled). */
static void http_sse_end(http_stream *st, const sch_update *failed) {
    int n_gen = 0;
    for (int i = 0; i < st->n_runs; i++) n_gen += st->runs[i].end.n_gen;
    if (failed) {
        /* Headers (200) are long gone: the error travels in the stream, as OpenAI's does. */
        const char *msg = failed->fin == SCH_FIN_ERROR ? failed->err : "the request was cancelled (the server is shutting down)";
        cJSON *e = http_error_json(msg, "server_error", NULL,
                                   failed->fin == SCH_FIN_ERROR ? (failed->unavailable ? "unavailable" : "internal_error")
                                                                : "cancelled");
        char *s = cJSON_PrintUnformatted(e);
        cJSON_Delete(e);
        if (s) {
            hb_printf(&st->out, "data: %s\n\n", s);
            free(s);
        }
    } else {
        cJSON *rj = http_runs_receipts(st->runs, st->n_runs);
        if (rj) { /* one more chunk, with no choices: the receipts (asked with "receipts": true) */
            cJSON *j = http_envelope(st->model, st->id, st->chat ? "chat.completion.chunk" : "text_completion", st->created);
            cJSON_AddArrayToObject(j, "choices");
            cJSON_AddItemToObject(j, "receipts", rj);
            http_sse(st, j);
        }
        if (st->include_usage) {
            cJSON *j = http_envelope(st->model, st->id, st->chat ? "chat.completion.chunk" : "text_completion", st->created);
            cJSON_AddArrayToObject(j, "choices");
            cJSON_AddItemToObject(j, "usage", http_runs_usage(st->runs, st->n_runs, st->per_prompt));
            http_sse(st, j);
        }
    }
    hb_add(&st->out, "data: [DONE]\n\n", 14);
    http_log(st->h, "%s stream: %d choice(s), prompt %d, completion %d tokens, %s, %.2f s", st->chat ? "chat" : "completion",
             st->n_runs, st->runs[0].end.n_prompt, n_gen, failed ? sch_finish_name(failed->fin) : "done", sch_now() - st->t0);
}

static ssize_t http_stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    http_stream *st = cls;
    while (st->off == st->out.len) {
        st->off = st->out.len = 0;
        if (st->ended) return MHD_CONTENT_READER_END_OF_STREAM;
        if (http_client_gone(st->fd)) {
            for (int i = 0; i < st->n_runs; i++) sch_cancel(st->runs[i].r);
            http_log(st->h, "client went away mid-stream; request cancelled");
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        sch_update u;
        int k;
        if (http_runs_wait(st->runs, st->n_runs, 100, &u, &k)) {
            http_run *rn = &st->runs[k];
            if (u.reasoning) { /* its own chunk, as llama-server and vLLM send reasoning_content deltas */
                cJSON *j = http_envelope(st->model, st->id, "chat.completion.chunk", st->created);
                cJSON *c = http_choice(k, true, true, false, NULL, 0, NULL, NULL);
                cJSON_AddItemToObject(cJSON_GetObjectItemCaseSensitive(c, "delta"), "reasoning_content",
                                      http_text_item(u.reasoning, u.reasoning_len));
                cJSON_AddItemToArray(cJSON_AddArrayToObject(j, "choices"), c);
                http_sse(st, j);
                free(u.reasoning);
            }
            if (u.tools) { /* tool calls: each sent as a delta once whole; unparsed, the section is text */
                hb_add(&rn->tools, u.tools, u.tools_len);
                if (rn->parse_tools) {
                    chat_call calls[CHAT_MAX_CALLS];
                    int nc = 0;
                    if (chat_tools_parse(rn->tools.p, rn->tools.len, calls, &nc) >= 0 && nc > rn->calls_sent) {
                        cJSON *j = http_envelope(st->model, st->id, "chat.completion.chunk", st->created);
                        cJSON *c = http_choice(k, true, true, false, NULL, 0, NULL, NULL);
                        cJSON_AddItemToObject(cJSON_GetObjectItemCaseSensitive(c, "delta"), "tool_calls",
                                              http_tool_calls(calls, rn->calls_sent, nc, st->id, k));
                        cJSON_AddItemToArray(cJSON_AddArrayToObject(j, "choices"), c);
                        http_sse(st, j);
                        rn->calls_sent = nc;
                    }
                    chat_calls_free(calls, nc);
                } else {
                    http_sse_chunk(st, k, false, u.tools, u.tools_len, NULL, NULL);
                }
                free(u.tools);
            }
            size_t skip = 0; /* logprob entries already shown (the prompt's) */
            if (rn->echo && !rn->echoed) { /* echo: the prompt (and its entries) first, in a chunk of its own */
                rn->echoed = true;
                skip = rn->n_plp < u.n_lp ? rn->n_plp : u.n_lp;
                cJSON *lp = st->top_logprobs >= 0 ? http_logprobs(st->h, false, u.lp, skip, st->top_logprobs, &rn->lp_off,
                                                                  rn->echo_first)
                                                  : NULL;
                http_sse_chunk(st, k, false, rn->echo, strlen(rn->echo), NULL, lp);
            }
            if ((u.text || u.n_lp > skip) && !rn->score_only) {
                cJSON *lp = st->top_logprobs >= 0
                                ? http_logprobs(st->h, st->chat, u.lp + skip, u.n_lp - skip, st->top_logprobs, &rn->lp_off, -1)
                                : NULL;
                http_sse_chunk(st, k, false, u.text ? u.text : "", u.len, NULL, lp);
            }
            free(u.text);
            free(u.lp);
            if (u.fin == SCH_FIN_STOP || u.fin == SCH_FIN_LENGTH) {
                const char *fr = http_finish_reason(u.fin);
                if (rn->parse_tools && rn->tools.len) {
                    chat_call calls[CHAT_MAX_CALLS];
                    int nc = 0;
                    if (!http_tools_end(&rn->tools, u.fin, calls, &nc, &fr)) { /* the section as text */
                        http_sse_chunk(st, k, false, rn->tools.p, rn->tools.len, NULL, NULL);
                    }
                    chat_calls_free(calls, nc);
                }
                http_sse_chunk(st, k, false, st->chat ? NULL : "", 0, fr, NULL);
            }
        }
        const sch_update *failed = http_runs_failed(st->runs, st->n_runs);
        bool all = true;
        for (int i = 0; i < st->n_runs; i++) all = all && st->runs[i].done;
        if (failed || all) {
            for (int i = 0; failed && i < st->n_runs; i++) sch_cancel(st->runs[i].r);
            http_sse_end(st, failed);
            st->ended = true;
        }
    }
    size_t n = st->out.len - st->off < max ? st->out.len - st->off : max;
    memcpy(buf, st->out.p + st->off, n);
    st->off += n;
    return (ssize_t)n;
}

static void http_stream_free(void *cls) {
    http_stream *st = cls;
    http_runs_free(st->runs, st->n_runs); /* cancels what still runs (the connection died first) */
    free(st->out.p);
    free(st);
}

/* ---- the completion endpoints ------------------------------------------------------------------------- */

/* Where the JSON text holds a NUL: a raw 0 byte, or a \u0000 escape (a backslash that is not itself
 * escaped, then u0000 in any case). NULL if none. */
static const char *http_find_nul(const char *b, size_t n) {
    if (!b) return NULL;
    for (size_t i = 0; i < n; i++) {
        if (b[i] == 0) return b + i;
        if (b[i] != '\\') continue;
        if (i + 5 < n && (b[i + 1] == 'u' || b[i + 1] == 'U') && b[i + 2] == '0' && b[i + 3] == '0' && b[i + 4] == '0' &&
            b[i + 5] == '0') {
            return b + i;
        }
        i++; /* the escaped character: "\\u0000" is a backslash, then text */
    }
    return NULL;
}

static enum MHD_Result http_completion(http_conn *hc, struct MHD_Connection *c, bool chat) {
    http_server *h = hc->h;
    http_fail f = {0};
    http_job jb = {.chat = chat, .n = 1};
    enum MHD_Result ret;
    http_run runs[HTTP_MAX_CHOICES];
    memset(runs, 0, sizeof runs);
    int n_runs = 0;
    rl_err err = {{0}};
    const char *perr = NULL;
    /* cJSON's strings end at their first NUL, so a "\u0000" would cut a prompt or a name short without a
     * word: refuse it (and a raw NUL byte, which JSON never allows) rather than run a different request. */
    cJSON *j = NULL;
    const char *nul = http_find_nul(hc->body.p, hc->body.len);
    if (nul) {
        BAD(&f, NULL, "the body contains a NUL character (%s at byte %zu): strings with NUL are not accepted",
            *nul ? "\\u0000" : "a raw NUL byte", (size_t)(nul - hc->body.p));
        goto fail;
    }
    /* hb_add keeps the body NUL-terminated; counting the NUL lets cJSON refuse trailing garbage. */
    j = cJSON_ParseWithLengthOpts(hc->body.p ? hc->body.p : "", hc->body.len + 1, &perr, true);
    if (!j) {
        size_t at = perr && hc->body.p ? (size_t)(perr - hc->body.p) : 0;
        BAD(&f, NULL, "the body is not valid JSON (error near byte %zu)", at);
        goto fail;
    }
    if (!cJSON_IsObject(j)) {
        BAD(&f, NULL, "the body must be a JSON object");
        goto fail;
    }
    if (http_parse_common(h, j, &jb, &f) != 0) goto fail;
    if (chat ? http_parse_chat(h, j, &jb, &f) != 0 : (http_parse_prompt(h, j, &jb, &f) != 0 || http_parse_format(h, j, &jb, &f) != 0))
        goto fail;
    for (int i = 0; i < jb.n_prompts; i++) {
        if (jb.n_prompt[i] >= h->n_ctx) {
            http_failf(&f, 400, "invalid_request_error", "context_length_exceeded", chat ? "messages" : "prompt",
                       "the prompt%s has %zu tokens but the context holds %u, and at least one token must be generated",
                       jb.n_prompts > 1 ? " array holds one that" : "", jb.n_prompt[i], h->n_ctx);
            goto fail;
        }
        if (jb.n_prompt[i] == 0) {
            BAD(&f, chat ? "messages" : "prompt", "the prompt is empty");
            goto fail;
        }
    }
    /* Every choice is a request of its own; those of one prompt share its reading (sch_params.share: a
     * number no other request of this server uses). Choice j of a prompt samples with seed + j, so n
     * seeded choices differ from each other and are the same every time. */
    n_runs = jb.n_prompts * jb.n;
    uint64_t share0 = 0;
    if (jb.n > 1) {
        pthread_mutex_lock(&h->mu);
        share0 = h->share_seq;
        h->share_seq += (uint64_t)jb.n_prompts;
        pthread_mutex_unlock(&h->mu);
    }
    for (int k = 0; k < n_runs; k++) {
        sch_params p = jb.p;
        p.smp.seed = jb.p.smp.seed + (uint64_t)(k % jb.n);
        p.share = jb.n > 1 ? share0 + 1 + (uint64_t)(k / jb.n) : 0;
        if (jb.echo && !(runs[k].echo = strdup(jb.echo_text[k / jb.n] ? jb.echo_text[k / jb.n] : ""))) {
            http_failf(&f, 500, "server_error", NULL, NULL, "out of memory");
            goto fail;
        }
        runs[k].echo_first = jb.p.prompt_logprobs ? jb.prompt[k / jb.n][0] : -1;
        runs[k].n_plp = jb.p.prompt_logprobs ? jb.n_prompt[k / jb.n] - 1 : 0;
        runs[k].score_only = jb.score_only;
        runs[k].parse_tools = jb.parse_tools;
        p.smp.grammar = gr_ref(jb.grammar);
        p.own_grammar = jb.grammar != NULL;
        if (!(runs[k].r = sch_request_new(jb.prompt[k / jb.n], jb.n_prompt[k / jb.n], &p, &err))) {
            http_failf(&f, 500, "server_error", NULL, NULL, "%s", err.msg);
            goto fail;
        }
        switch (sch_submit(h->s, runs[k].r, &err)) {
        case SCH_OK: break;
        case SCH_QUEUE_FULL: http_failf(&f, 429, "rate_limit_error", "queue_full", NULL, "server busy: %s", err.msg); goto fail;
        case SCH_CLOSED: http_failf(&f, 503, "server_error", "shutting_down", NULL, "%s", err.msg); goto fail;
        case SCH_BAD_PROMPT: BAD(&f, chat ? "messages" : "prompt", "%s", err.msg); goto fail;
        }
    }
    cJSON_Delete(j);
    j = NULL;
    char id[64];
    http_new_id(h, chat, id, sizeof id);
    time_t created = time(NULL);
    double t0 = sch_now();

    if (jb.stream) {
        http_stream *st = calloc(1, sizeof *st);
        if (!st) {
            http_failf(&f, 500, "server_error", NULL, NULL, "out of memory");
            goto fail;
        }
        *st = (http_stream){.h = h, .n_runs = n_runs, .per_prompt = jb.n, .fd = http_conn_fd(c), .chat = chat,
                            .include_usage = jb.include_usage, .top_logprobs = jb.p.logprobs ? jb.top_logprobs : -1,
                            .model = jb.model, .created = created, .t0 = t0};
        memcpy(st->runs, runs, sizeof runs); /* the stream owns them now */
        memset(runs, 0, sizeof runs);
        snprintf(st->id, sizeof st->id, "%s", id);
        for (int k = 0; chat && k < n_runs; k++) http_sse_chunk(st, k, true, "", 0, NULL, NULL); /* OpenAI's first chunks: the role */
        struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, http_stream_read, st,
                                                                      http_stream_free);
        if (!resp) {
            http_stream_free(st);
            http_job_free(&jb);
            return MHD_NO;
        }
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        MHD_add_response_header(resp, "X-Accel-Buffering", "no");
        http_job_free(&jb);
        return http_queue(hc, c, 200, resp);
    }

    /* Not streamed: wait for every choice's whole text, watching for the client to hang up meanwhile. */
    int fd = http_conn_fd(c);
    const bool want_lp = jb.p.logprobs;
    const int top_lp = jb.top_logprobs, per_prompt = jb.n;
    const char *model = jb.model;
    http_job_free(&jb);
    for (;;) {
        sch_update u;
        int k;
        if (http_runs_wait(runs, n_runs, 100, &u, &k)) {
            if (u.text) hb_add(&runs[k].text, u.text, u.len);
            if (u.reasoning) hb_add(&runs[k].reasoning, u.reasoning, u.reasoning_len);
            free(u.reasoning);
            if (u.tools) hb_add(&runs[k].tools, u.tools, u.tools_len);
            free(u.tools);
            if (u.lp) hb_add(&runs[k].lps, (const char *)u.lp, u.n_lp * sizeof *u.lp);
            free(u.text);
            free(u.lp);
        }
        bool all = true;
        for (int i = 0; i < n_runs; i++) all = all && runs[i].done;
        if (all || http_runs_failed(runs, n_runs)) break;
        if (http_client_gone(fd)) {
            http_runs_free(runs, n_runs);
            http_log(h, "client went away while waiting; request cancelled");
            return MHD_NO; /* nobody to answer */
        }
    }
    const sch_update *bad = http_runs_failed(runs, n_runs);
    if (bad) {
        enum MHD_Result rr;
        if (bad->fin == SCH_FIN_ERROR && bad->unavailable) { /* a ring node is down: try again later */
            rr = http_send_error(hc, c, 503, "server_error", "unavailable", NULL, "%s", bad->err);
        } else if (bad->fin == SCH_FIN_ERROR) {
            rr = http_send_error(hc, c, 500, "server_error", "internal_error", NULL, "generation failed: %s", bad->err);
        } else {
            rr = http_send_error(hc, c, 503, "server_error", "shutting_down", NULL,
                                 "the request was cancelled: the server is shutting down");
        }
        http_runs_free(runs, n_runs);
        return rr;
    }
    cJSON *resp = http_envelope(model, id, chat ? "chat.completion" : "text_completion", created);
    cJSON *ch = cJSON_AddArrayToObject(resp, "choices");
    int n_gen = 0;
    for (int k = 0; k < n_runs; k++) {
        http_run *rn = &runs[k];
        size_t lp_off = 0, n_lp = rn->lps.len / sizeof(smp_logprob);
        if (rn->score_only && n_lp > rn->n_plp) n_lp = rn->n_plp; /* max_tokens 0: the prompt's alone */
        cJSON *lpj = want_lp ? http_logprobs(h, chat, (const smp_logprob *)rn->lps.p, n_lp, top_lp, &lp_off, rn->echo_first)
                             : NULL;
        http_buf all = {0}; /* echo: the prompt's text, then (unless only scoring) the completion's */
        if (rn->echo) hb_add(&all, rn->echo, strlen(rn->echo));
        if (!rn->score_only && rn->text.len) hb_add(&all, rn->text.p, rn->text.len);
        const char *finish = http_finish_reason(rn->end.fin);
        chat_call calls[CHAT_MAX_CALLS];
        int nc = 0;
        bool with_calls = false;
        if (rn->tools.len) { /* a tool-call section: its calls, or (not parsed, or not valid) its text */
            with_calls = rn->parse_tools && http_tools_end(&rn->tools, rn->end.fin, calls, &nc, &finish);
            if (!with_calls) hb_add(&all, rn->tools.p, rn->tools.len);
        }
        const http_buf *shown = rn->echo || (rn->tools.len && !with_calls) ? &all : &rn->text;
        cJSON *c1 = http_choice(k, chat, false, true, shown->p ? shown->p : "", shown->p ? shown->len : 0, finish, lpj);
        free(all.p);
        if (with_calls) {
            cJSON *msg = cJSON_GetObjectItemCaseSensitive(c1, "message");
            if (!rn->text.len) cJSON_ReplaceItemInObject(msg, "content", cJSON_CreateNull()); /* OpenAI: calls alone */
            cJSON_AddItemToObject(msg, "tool_calls", http_tool_calls(calls, 0, nc, id, k));
        }
        chat_calls_free(calls, nc);
        if (chat && rn->reasoning.len) {
            cJSON_AddItemToObject(cJSON_GetObjectItemCaseSensitive(c1, "message"), "reasoning_content",
                                  http_text_item(rn->reasoning.p, rn->reasoning.len));
        }
        cJSON_AddItemToArray(ch, c1);
        n_gen += rn->end.n_gen;
    }
    cJSON_AddItemToObject(resp, "usage", http_runs_usage(runs, n_runs, per_prompt));
    cJSON *rj = http_runs_receipts(runs, n_runs);
    if (rj) cJSON_AddItemToObject(resp, "receipts", rj);
    http_log(h, "%s: %d choice(s), prompt %d, completion %d tokens, %s, %.2f s", chat ? "chat" : "completion", n_runs,
             runs[0].end.n_prompt, n_gen, sch_finish_name(runs[0].end.fin), sch_now() - t0);
    http_runs_free(runs, n_runs);
    return http_send_json(hc, c, 200, resp);

fail:
    cJSON_Delete(j);
    http_runs_free(runs, n_runs);
    http_job_free(&jb);
    ret = http_send_fail(hc, c, &f);
    return ret;
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

static enum MHD_Result http_health(http_conn *hc, struct MHD_Connection *c) {
    http_server *h = hc->h;
    sch_metrics m;
    sch_metrics_get(h->s, &m);
    pthread_mutex_lock(&h->mu);
    bool closing = h->closing;
    pthread_mutex_unlock(&h->mu);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "status", closing ? "shutting_down" : "ok");
    cJSON_AddStringToObject(j, "model", h->names[0]);
    cJSON_AddStringToObject(j, "backend", m.backend ? m.backend : "");
    cJSON *sl = cJSON_AddObjectToObject(j, "slots");
    cJSON_AddNumberToObject(sl, "total", m.n_slots);
    cJSON_AddNumberToObject(sl, "active", m.active);
    cJSON_AddNumberToObject(sl, "queued", m.queued);
    cJSON_AddNumberToObject(sl, "queue_capacity", m.queue_cap);
    cJSON_AddNumberToObject(sl, "context", h->n_ctx);
    if (m.backend && strcmp(m.backend, "ring") == 0) {
        cJSON *r = cJSON_AddObjectToObject(j, "ring");
        cJSON_AddNumberToObject(r, "generation", (double)m.ring.generation);
        cJSON_AddNumberToObject(r, "recoveries", (double)m.ring.recoveries);
    }
    cJSON *nodes = cJSON_AddArrayToObject(j, "nodes");
    for (int i = 0; i < m.n_nodes; i++) {
        cJSON *n = cJSON_CreateObject();
        cJSON_AddStringToObject(n, "name", m.nodes[i].name);
        cJSON_AddStringToObject(n, "addr", m.nodes[i].addr);
        cJSON *l = cJSON_AddArrayToObject(n, "layers");
        cJSON_AddItemToArray(l, cJSON_CreateNumber(m.nodes[i].layer_a));
        cJSON_AddItemToArray(l, cJSON_CreateNumber(m.nodes[i].layer_b));
        cJSON_AddStringToObject(n, "status", m.nodes[i].faulty ? "faulty" : m.nodes[i].up ? "up" : "down");
        /* its part: a stage of the ring that is open, or a standby (up, in no stage), or down / faulty */
        const sch_node_stat *ns = &m.nodes[i];
        cJSON_AddStringToObject(n, "role", ns->faulty ? "faulty" : !ns->up ? "down" : ns->stage >= 0 ? "stage" : "standby");
        if (ns->up && !ns->faulty && ns->stage >= 0) cJSON_AddNumberToObject(n, "stage", ns->stage);
        if (m.nodes[i].faulty) cJSON_AddStringToObject(n, "fault", m.nodes[i].fault);
        if (m.nodes[i].audits) cJSON_AddNumberToObject(n, "audits", (double)m.nodes[i].audits);
        cJSON_AddItemToArray(nodes, n);
    }
    return http_send_json(hc, c, closing ? 503 : 200, j);
}

/* Prometheus label values escape backslash, quote and newline. */
static void http_label(http_buf *b, const char *s) {
    for (; *s; s++) {
        if (*s == '\\' || *s == '"') hb_printf(b, "\\%c", *s);
        else if (*s == '\n') hb_add(b, "\\n", 2);
        else hb_add(b, s, 1);
    }
}

/* The start of one node's series: NAME{node="..."[,addr="..."] - the caller adds more labels, "}" and the value. */
static void http_node_series(http_buf *b, const char *name, const sch_node_stat *n, bool with_addr) {
    hb_printf(b, "%s{node=\"", name);
    http_label(b, n->name);
    if (with_addr) {
        hb_add(b, "\",addr=\"", 8);
        http_label(b, n->addr);
    }
    hb_add(b, "\"", 1);
}

static void http_family(http_buf *b, const char *name, const char *type, const char *help) {
    hb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void http_hist(http_buf *b, const char *name, const char *help, const sch_hist *hs) {
    http_family(b, name, "histogram", help);
    uint64_t cum = 0;
    for (int i = 0; i < hs->n; i++) {
        cum += hs->count[i];
        hb_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, hs->le[i], (unsigned long long)cum);
    }
    cum += hs->count[hs->n];
    hb_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name, (unsigned long long)cum, name,
              hs->sum, name, (unsigned long long)hs->total);
}

static enum MHD_Result http_metrics(http_conn *hc, struct MHD_Connection *c) {
    static const char *const ep_names[HTTP_EP_COUNT] = {"/v1/chat/completions", "/v1/completions", "/v1/models",
                                                        "/health", "/metrics", "/", "other"};
    http_server *h = hc->h;
    sch_metrics m;
    sch_metrics_get(h->s, &m);
    int codes[HTTP_MAX_CODES];
    uint64_t counts[HTTP_EP_COUNT][HTTP_MAX_CODES];
    pthread_mutex_lock(&h->mu);
    memcpy(codes, h->codes, sizeof codes);
    memcpy(counts, h->counts, sizeof counts);
    uint64_t header_timeouts = h->header_timeouts;
    pthread_mutex_unlock(&h->mu);

    http_buf b = {0};
    http_family(&b, "ringlm_http_header_timeouts_total", "counter",
                "Connections closed for sending no complete request headers in time (--header-timeout).");
    hb_printf(&b, "ringlm_http_header_timeouts_total %llu\n", (unsigned long long)header_timeouts);
    http_family(&b, "ringlm_http_requests_total", "counter", "HTTP requests answered, by endpoint and status code.");
    for (int e = 0; e < HTTP_EP_COUNT; e++) {
        for (int i = 0; i < HTTP_MAX_CODES && codes[i]; i++) {
            if (counts[e][i]) {
                hb_printf(&b, "ringlm_http_requests_total{endpoint=\"%s\",status=\"%d\"} %llu\n", ep_names[e], codes[i],
                          (unsigned long long)counts[e][i]);
            }
        }
    }
    http_family(&b, "ringlm_requests_finished_total", "counter", "Generation requests ended, by reason.");
    for (int f = SCH_FIN_STOP; f <= SCH_FIN_ERROR; f++) {
        hb_printf(&b, "ringlm_requests_finished_total{reason=\"%s\"} %llu\n", sch_finish_name((sch_finish)f),
                  (unsigned long long)m.finished[f]);
    }
    http_family(&b, "ringlm_prompt_tokens_total", "counter", "Prompt tokens processed.");
    hb_printf(&b, "ringlm_prompt_tokens_total %llu\n", (unsigned long long)m.prompt_tokens);
    if (m.has_xc) { /* routed experts through a cache (--mem, docs/experts.md) */
        const struct {
            const char *name, *help;
            uint64_t v;
        } xc[] = {
            {"ringlm_expert_needed_total", "Routed experts the routers chose (distinct per layer and step).", m.xc.needed},
            {"ringlm_expert_hits_total", "Of them, resident when their layer asked (read ahead included).", m.xc.hits},
            {"ringlm_expert_loads_total", "Experts read from the file on demand.", m.xc.loads},
            {"ringlm_expert_prefetched_total", "Experts read ahead by the look-ahead router.", m.xc.prefetched},
            {"ringlm_expert_prefetch_used_total", "Of them, chosen by their layer before being evicted.", m.xc.prefetch_used},
            {"ringlm_expert_read_bytes_total", "Bytes of experts read from the file.", m.xc.bytes_read},
            {"ringlm_expert_used_bytes_total", "Bytes of the experts the routers chose.", m.xc.bytes_used},
            {"ringlm_expert_tokens_total", "Tokens run through the layers over the cache.", m.xc.tokens},
        };
        for (size_t i = 0; i < sizeof xc / sizeof xc[0]; i++) {
            http_family(&b, xc[i].name, "counter", xc[i].help);
            hb_printf(&b, "%s %llu\n", xc[i].name, (unsigned long long)xc[i].v);
        }
        http_family(&b, "ringlm_expert_wait_seconds_total", "counter", "Seconds the compute waited for expert reads.");
        hb_printf(&b, "ringlm_expert_wait_seconds_total %.6f\n", m.xc.wait_s);
    }
    http_family(&b, "ringlm_prompt_tokens_shared_total", "counter",
                "Prompt tokens not read again: the choices of an n > 1 request share one reading of the prompt.");
    hb_printf(&b, "ringlm_prompt_tokens_shared_total %llu\n", (unsigned long long)m.prompt_shared);
    http_family(&b, "ringlm_generated_tokens_total", "counter", "Tokens generated.");
    hb_printf(&b, "ringlm_generated_tokens_total %llu\n", (unsigned long long)m.gen_tokens);
    http_hist(&b, "ringlm_time_to_first_token_seconds", "From a request's arrival to its first generated token.",
              &m.ttft);
    http_hist(&b, "ringlm_inter_token_latency_seconds", "Between consecutive generated tokens of one request.", &m.itl);
    http_hist(&b, "ringlm_step_duration_seconds", "One batched forward step (all sequences together).", &m.step_s);
    http_family(&b, "ringlm_spec_draft_seconds_total", "counter", "Seconds the draft model spent drafting.");
    hb_printf(&b, "ringlm_spec_draft_seconds_total %.6f\n", m.draft_s);
    http_family(&b, "ringlm_spec_drafted_tokens_total", "counter", "Speculative draft tokens verified.");
    hb_printf(&b, "ringlm_spec_drafted_tokens_total %llu\n", (unsigned long long)m.drafted);
    http_family(&b, "ringlm_spec_accepted_tokens_total", "counter", "Speculative draft tokens the model kept.");
    hb_printf(&b, "ringlm_spec_accepted_tokens_total %llu\n", (unsigned long long)m.accepted);
    http_family(&b, "ringlm_spec_acceptance_ratio", "gauge", "Accepted / drafted tokens so far (0 without drafts).");
    hb_printf(&b, "ringlm_spec_acceptance_ratio %.6f\n", m.drafted ? (double)m.accepted / (double)m.drafted : 0.0);
    http_family(&b, "ringlm_spec_grammar_refused_tokens_total", "counter",
                "Draft tokens cut before verification because the request's grammar refused them.");
    hb_printf(&b, "ringlm_spec_grammar_refused_tokens_total %llu\n", (unsigned long long)m.draft_refused);
    http_family(&b, "ringlm_steps_total", "counter", "Batched forward steps.");
    hb_printf(&b, "ringlm_steps_total %llu\n", (unsigned long long)m.steps);
    http_family(&b, "ringlm_step_tokens_total", "counter", "Tokens carried by all steps (decode and prefill).");
    hb_printf(&b, "ringlm_step_tokens_total %llu\n", (unsigned long long)m.step_tokens);
    http_family(&b, "ringlm_busy_seconds_total", "counter", "Seconds spent inside forward steps.");
    hb_printf(&b, "ringlm_busy_seconds_total %.6f\n", m.busy_s);
    http_family(&b, "ringlm_sequences_active", "gauge", "Sequences holding a slot (prefilling or generating).");
    hb_printf(&b, "ringlm_sequences_active %d\n", m.active);
    http_family(&b, "ringlm_sequences_queued", "gauge", "Requests waiting for a slot.");
    hb_printf(&b, "ringlm_sequences_queued %d\n", m.queued);
    http_family(&b, "ringlm_sequence_slots", "gauge", "Sequences that can run at once (--parallel).");
    hb_printf(&b, "ringlm_sequence_slots %d\n", m.n_slots);
    http_family(&b, "ringlm_queue_capacity", "gauge", "Requests that may wait for a slot (--queue).");
    hb_printf(&b, "ringlm_queue_capacity %d\n", m.queue_cap);
    http_family(&b, "ringlm_context_tokens", "gauge", "Context capacity of each sequence (--ctx).");
    hb_printf(&b, "ringlm_context_tokens %u\n", h->n_ctx);
    /* Per node / per stage: one machine is one node running stage 0 with every layer; a ring fills in more. */
    int up = 0;
    for (int i = 0; i < m.n_nodes; i++) up += m.nodes[i].up;
    http_family(&b, "ringlm_nodes_up", "gauge", "Nodes answering.");
    hb_printf(&b, "ringlm_nodes_up %d\n", up);
    http_family(&b, "ringlm_nodes_down", "gauge", "Nodes not answering.");
    hb_printf(&b, "ringlm_nodes_down %d\n", m.n_nodes - up);
    if (m.backend && strcmp(m.backend, "ring") == 0) {
        http_family(&b, "ringlm_ring_generation", "gauge", "Rings opened so far (the first, and each one re-formed).");
        hb_printf(&b, "ringlm_ring_generation %llu\n", (unsigned long long)m.ring.generation);
        http_family(&b, "ringlm_ring_recoveries_total", "counter", "Rings re-formed under running requests after a node was lost.");
        hb_printf(&b, "ringlm_ring_recoveries_total %llu\n", (unsigned long long)m.ring.recoveries);
        http_family(&b, "ringlm_ring_recovery_seconds_total", "counter", "Seconds spent re-forming them (re-plan, re-assign).");
        hb_printf(&b, "ringlm_ring_recovery_seconds_total %.6f\n", m.ring.recovery_s);
        http_hist(&b, "ringlm_ring_recovery_seconds", "Each recovery: from the failed step to a re-formed ring.", &m.recovery);
        http_family(&b, "ringlm_ring_replayed_tokens_total", "counter", "Tokens sent again to rebuild sequences on re-formed rings.");
        hb_printf(&b, "ringlm_ring_replayed_tokens_total %llu\n", (unsigned long long)m.ring.replayed);
    }
    http_family(&b, "ringlm_node_up", "gauge", "1 when the node answers, by node.");
    for (int i = 0; i < m.n_nodes; i++) {
        http_node_series(&b, "ringlm_node_up", &m.nodes[i], true);
        hb_printf(&b, ",stage=\"%d\",layers=\"%u-%u\"} %d\n", i, m.nodes[i].layer_a, m.nodes[i].layer_b, m.nodes[i].up);
    }
    http_family(&b, "ringlm_node_role", "gauge", "1 for the node's part now (/health's role: stage, standby, down, faulty).");
    for (int i = 0; i < m.n_nodes; i++) {
        static const char *const roles[4] = {"stage", "standby", "down", "faulty"};
        const sch_node_stat *ns = &m.nodes[i];
        int r = ns->faulty ? 3 : !ns->up ? 2 : ns->stage >= 0 ? 0 : 1;
        for (int k = 0; k < 4; k++) {
            http_node_series(&b, "ringlm_node_role", ns, true);
            hb_printf(&b, ",role=\"%s\"} %d\n", roles[k], k == r);
        }
    }
    http_family(&b, "ringlm_node_faulty", "gauge", "1 when the node was caught lying (receipts or an audit) and left out.");
    for (int i = 0; i < m.n_nodes; i++) {
        http_node_series(&b, "ringlm_node_faulty", &m.nodes[i], true);
        hb_printf(&b, "} %d\n", m.nodes[i].faulty);
    }
    http_family(&b, "ringlm_audits_total", "counter", "Audits of each node (a sequence's frames recomputed).");
    for (int i = 0; i < m.n_nodes; i++) {
        http_node_series(&b, "ringlm_audits_total", &m.nodes[i], false);
        hb_printf(&b, "} %llu\n", (unsigned long long)m.nodes[i].audits);
    }
    http_family(&b, "ringlm_audit_seconds_total", "counter", "Seconds the coordinator spent auditing each node.");
    for (int i = 0; i < m.n_nodes; i++) {
        http_node_series(&b, "ringlm_audit_seconds_total", &m.nodes[i], false);
        hb_printf(&b, "} %.6f\n", m.nodes[i].audit_s);
    }
    http_family(&b, "ringlm_stage_compute_seconds_total", "counter", "Seconds each stage spent computing.");
    for (int i = 0; i < m.n_nodes; i++) {
        hb_printf(&b, "ringlm_stage_compute_seconds_total{stage=\"%d\",node=\"", i);
        http_label(&b, m.nodes[i].name);
        hb_printf(&b, "\"} %.6f\n", m.nodes[i].compute_s);
    }
    http_family(&b, "ringlm_stage_steps_total", "counter", "Forward passes each stage ran.");
    for (int i = 0; i < m.n_nodes; i++) {
        hb_printf(&b, "ringlm_stage_steps_total{stage=\"%d\",node=\"", i);
        http_label(&b, m.nodes[i].name);
        hb_printf(&b, "\"} %llu\n", (unsigned long long)m.nodes[i].steps);
    }
    http_family(&b, "ringlm_info", "gauge", "The served model and backend.");
    hb_add(&b, "ringlm_info{model=\"", 19);
    http_label(&b, h->names[0]);
    hb_printf(&b, "\",backend=\"%s\"} 1\n", m.backend ? m.backend : "");
    if (!b.p) return MHD_NO;
    return http_send(hc, c, 200, "text/plain; version=0.0.4; charset=utf-8", b.p, b.len);
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
        if (!hc->too_large && hb_add(&hc->body, upload, *upload_size) != 0) hc->too_large = true;
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
        k->since = sch_now();
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
    k->since = sch_now();
    pthread_mutex_unlock(&h->mu);
}

static void *http_watchdog(void *arg) {
    http_server *h = arg;
    pthread_mutex_lock(&h->mu);
    while (h->watching) {
        double now = sch_now();
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
