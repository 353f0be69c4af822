/* openai_response.c - the completion endpoints: a parsed job submitted to the scheduler as one request per
 * choice, then answered as OpenAI's response objects - whole, or streamed as server-sent events while the
 * thread waits for text (choices, usage, logprobs, reasoning_content, tool calls, receipts). */
#include "http_int.h"
#include "../base/clock.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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
    /* OpenAI's field for prompt tokens served from its prompt cache: here, restored instead of read. */
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "prompt_tokens_details"), "cached_tokens", up->n_cached);
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
    rl_buf b = {0};
    rl_buf_add(&b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)p[i];
        if (ch == '"' || ch == '\\') {
            char e[2] = {'\\', (char)ch};
            rl_buf_add(&b, e, 2);
        } else if (ch < 0x20) {
            rl_buf_printf(&b, "\\u%04x", ch);
        } else {
            rl_buf_add(&b, p + i, 1);
        }
    }
    rl_buf_add(&b, "\"", 1);
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
static int http_tools_end(const rl_buf *raw, sch_finish fin, chat_call *calls, int *n, const char **finish) {
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
        free(rs[i].ids.p);
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
                    rs[i].end.ids = NULL;
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
        if (i % per_prompt == 0) sum.n_cached += rs[i].end.n_cached;
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

static void http_sse(http_stream *st, cJSON *j) {
    if (st->include_usage && !cJSON_GetObjectItemCaseSensitive(j, "usage")) cJSON_AddNullToObject(j, "usage");
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!s) return;
    rl_buf_add(&st->out, "data: ", 6);
    rl_buf_add(&st->out, s, strlen(s));
    rl_buf_add(&st->out, "\n\n", 2);
    free(s);
}

/* return_token_ids: the int32 ids held in b as the choice's "token_ids" array. */
static void http_add_ids(cJSON *choice, const rl_buf *b) {
    cJSON *a = cJSON_AddArrayToObject(choice, "token_ids");
    for (size_t i = 0; i < b->len / sizeof(int32_t); i++) {
        int32_t v;
        memcpy(&v, b->p + i * sizeof v, sizeof v);
        cJSON_AddItemToArray(a, cJSON_CreateNumber(v));
    }
}

static void http_sse_chunk(http_stream *st, int index, bool role, const char *text, size_t len, const char *finish,
                           cJSON *lp) {
    cJSON *j = http_envelope(st->model, st->id, st->chat ? "chat.completion.chunk" : "text_completion", st->created);
    cJSON *ch = cJSON_AddArrayToObject(j, "choices");
    cJSON *c = http_choice(index, st->chat, true, role, text, len, finish, lp);
    http_run *rn = &st->runs[index];
    if (st->token_ids && rn->ids.len > 0) { /* the ids of the tokens this chunk's text came from, and any held back */
        http_add_ids(c, &rn->ids);
        rn->ids.len = 0;
    }
    cJSON_AddItemToArray(ch, c);
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
            rl_buf_printf(&st->out, "data: %s\n\n", s);
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
    rl_buf_add(&st->out, "data: [DONE]\n\n", 14);
    http_log(st->h, "%s stream: %d choice(s), prompt %d, completion %d tokens, %s, %.2f s", st->chat ? "chat" : "completion",
             st->n_runs, st->runs[0].end.n_prompt, n_gen, failed ? sch_finish_name(failed->fin) : "done", rl_clock_now() - st->t0);
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
                rl_buf_add(&rn->tools, u.tools, u.tools_len);
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
            if (u.ids) rl_buf_add(&rn->ids, (const char *)u.ids, u.n_ids * sizeof *u.ids);
            free(u.ids);
            size_t skip = 0; /* logprob entries already shown (the prompt's) */
            if (rn->echo && !rn->echoed) { /* echo: the prompt (and its entries) first, in a chunk of its own */
                rn->echoed = true;
                skip = rn->n_plp < u.n_lp ? rn->n_plp : u.n_lp;
                cJSON *lp = st->top_logprobs >= 0 ? http_logprobs(st->h, false, u.lp, skip, st->top_logprobs, &rn->lp_off,
                                                                  rn->echo_first)
                                                  : NULL;
                http_sse_chunk(st, k, false, rn->echo, strlen(rn->echo), NULL, lp);
            }
            /* A token whose text is empty (a control token) or held back (a partial UTF-8 sequence) still sends
             * its id at once when ids are asked: a client that resends them must not wait a step for them. */
            if ((u.text || u.n_lp > skip || (st->token_ids && rn->ids.len > 0)) && !rn->score_only) {
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

enum MHD_Result http_completion(http_conn *hc, struct MHD_Connection *c, bool chat) {
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
    if (http_request_parse(h, j, chat, &jb, &f) != 0) goto fail;
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
    }
    { /* all the choices at once: admitted together (a choice's bits depend on what shares its steps) */
        sch_request *rs[HTTP_MAX_CHOICES];
        for (int k = 0; k < n_runs; k++) rs[k] = runs[k].r;
        switch (sch_submit_all(h->s, rs, n_runs, &err)) {
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
    double t0 = rl_clock_now();

    if (jb.stream) {
        http_stream *st = calloc(1, sizeof *st);
        if (!st) {
            http_failf(&f, 500, "server_error", NULL, NULL, "out of memory");
            goto fail;
        }
        *st = (http_stream){.h = h, .n_runs = n_runs, .per_prompt = jb.n, .fd = http_conn_fd(c), .chat = chat,
                            .include_usage = jb.include_usage, .token_ids = jb.token_ids, .top_logprobs = jb.p.logprobs ? jb.top_logprobs : -1,
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
    const bool want_lp = jb.p.logprobs, want_ids = jb.token_ids;
    const int top_lp = jb.top_logprobs, per_prompt = jb.n;
    const char *model = jb.model;
    http_job_free(&jb);
    for (;;) {
        sch_update u;
        int k;
        if (http_runs_wait(runs, n_runs, 100, &u, &k)) {
            if (u.text) rl_buf_add(&runs[k].text, u.text, u.len);
            if (u.reasoning) rl_buf_add(&runs[k].reasoning, u.reasoning, u.reasoning_len);
            free(u.reasoning);
            if (u.tools) rl_buf_add(&runs[k].tools, u.tools, u.tools_len);
            free(u.tools);
            if (u.lp) rl_buf_add(&runs[k].lps, (const char *)u.lp, u.n_lp * sizeof *u.lp);
            if (u.ids) rl_buf_add(&runs[k].ids, (const char *)u.ids, u.n_ids * sizeof *u.ids);
            free(u.ids);
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
        rl_buf all = {0}; /* echo: the prompt's text, then (unless only scoring) the completion's */
        if (rn->echo) rl_buf_add(&all, rn->echo, strlen(rn->echo));
        if (!rn->score_only && rn->text.len) rl_buf_add(&all, rn->text.p, rn->text.len);
        const char *finish = http_finish_reason(rn->end.fin);
        chat_call calls[CHAT_MAX_CALLS];
        int nc = 0;
        bool with_calls = false;
        if (rn->tools.len) { /* a tool-call section: its calls, or (not parsed, or not valid) its text */
            with_calls = rn->parse_tools && http_tools_end(&rn->tools, rn->end.fin, calls, &nc, &finish);
            if (!with_calls) rl_buf_add(&all, rn->tools.p, rn->tools.len);
        }
        const rl_buf *shown = rn->echo || (rn->tools.len && !with_calls) ? &all : &rn->text;
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
        if (want_ids) http_add_ids(c1, &rn->ids);
        cJSON_AddItemToArray(ch, c1);
        n_gen += rn->end.n_gen;
    }
    cJSON_AddItemToObject(resp, "usage", http_runs_usage(runs, n_runs, per_prompt));
    cJSON *rj = http_runs_receipts(runs, n_runs);
    if (rj) cJSON_AddItemToObject(resp, "receipts", rj);
    http_log(h, "%s: %d choice(s), prompt %d, completion %d tokens, %s, %.2f s", chat ? "chat" : "completion", n_runs,
             runs[0].end.n_prompt, n_gen, sch_finish_name(runs[0].end.fin), rl_clock_now() - t0);
    http_runs_free(runs, n_runs);
    return http_send_json(hc, c, 200, resp);

fail:
    cJSON_Delete(j);
    http_runs_free(runs, n_runs);
    http_job_free(&jb);
    ret = http_send_fail(hc, c, &f);
    return ret;
}

