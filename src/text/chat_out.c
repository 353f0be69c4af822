/* chat_out.c - following a K3 reply's framing (chat_out.h). */
#include "chat_out.h"

#include <cJSON.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { CS_BODY, CS_NAME, CS_CLOSE_NAME, CS_BETWEEN };

void chat_split_init(chat_split *s, const tok_tokenizer *t, bool on, chat_format fmt, bool thinking) {
    memset(s, 0, sizeof *s);
    s->open = s->sep = s->close = -1;
    s->state = CS_BODY;
    s->chan = CHAT_CH_CONTENT;
    if (!on || (fmt != CHAT_FMT_K3 && fmt != CHAT_FMT_K3_LITE)) return;
    int32_t o = tok_find(t, "<|open|>", 8), p = tok_find(t, "<|sep|>", 7), c = tok_find(t, "<|close|>", 9);
    if (o < 0 || p < 0 || c < 0) return;
    s->open = o, s->sep = p, s->close = c;
    s->chan = thinking ? CHAT_CH_REASONING : CHAT_CH_CONTENT;
}

static bool name_is(const chat_split *s, const char *name) {
    return s->name_len == strlen(name) && memcmp(s->name, name, s->name_len) == 0;
}

static void name_add(chat_split *s, const tok_tokenizer *t, int32_t id) {
    const char *p;
    size_t n;
    if (tok_piece(t, id, false, &p, &n) == 0) {
        for (size_t i = 0; i < n && s->name_len < sizeof s->name; i++) s->name[s->name_len++] = p[i];
    }
}

/* Inside the tools section every token is the section's (its nested call / argument framing included)
 * until <|close|>tools<|sep|>. */
static chat_chan split_tools(chat_split *s, const tok_tokenizer *t, int32_t id) {
    if (id == s->open || id == s->close) {
        s->state = id == s->open ? CS_NAME : CS_CLOSE_NAME;
        s->name_len = 0;
    } else if (id == s->sep && (s->state == CS_NAME || s->state == CS_CLOSE_NAME)) {
        if (s->state == CS_CLOSE_NAME && name_is(s, "tools")) s->tools = false, s->state = CS_BETWEEN;
        else s->state = CS_BODY;
    } else if (s->state == CS_NAME || s->state == CS_CLOSE_NAME) {
        name_add(s, t, id);
    }
    return CHAT_CH_TOOLS;
}

chat_chan chat_split_push(chat_split *s, const tok_tokenizer *t, int32_t id) {
    if (s->open < 0) return CHAT_CH_CONTENT;
    if (s->tools) return split_tools(s, t, id);
    if (id == s->open || id == s->close) {
        s->state = id == s->open ? CS_NAME : CS_CLOSE_NAME;
        s->name_len = 0;
        return CHAT_CH_NONE;
    }
    if (id == s->sep && (s->state == CS_NAME || s->state == CS_CLOSE_NAME)) {
        if (s->state == CS_CLOSE_NAME) {
            s->state = CS_BETWEEN;
        } else {
            s->state = CS_BODY;
            s->chan = name_is(s, "think") ? CHAT_CH_REASONING : CHAT_CH_CONTENT;
            s->tools = name_is(s, "tools");
        }
        return CHAT_CH_NONE;
    }
    if (s->state == CS_NAME || s->state == CS_CLOSE_NAME) {
        name_add(s, t, id);
        return CHAT_CH_NONE;
    }
    return s->state == CS_BODY ? s->chan : CHAT_CH_CONTENT;
}

/* ---- tool calls -------------------------------------------------------------------------------------- */

/* Does the text at p (n bytes) start with tag (1), or is it cut short inside it (0), or neither (-1)? */
static int tag_at(const char *p, size_t n, const char *tag) {
    size_t k = strlen(tag);
    if (n >= k) return memcmp(p, tag, k) == 0 ? 1 : -1;
    return memcmp(p, tag, n) == 0 ? 0 : -1;
}

static const char *find(const char *p, const char *end, const char *what) {
    size_t k = strlen(what);
    for (; p + k <= end; p++)
        if (memcmp(p, what, k) == 0) return p;
    return NULL;
}

/* The value of attribute key="..." in a tag header [h, e), unescaped (&amp; &quot;); NULL when absent. */
static char *attr(const char *h, const char *e, const char *key) {
    char pat[32];
    snprintf(pat, sizeof pat, " %s=\"", key);
    const char *a = find(h, e, pat);
    if (!a) return NULL;
    a += strlen(pat);
    const char *q = memchr(a, '"', (size_t)(e - a));
    if (!q) return NULL;
    char *v = malloc((size_t)(q - a) + 1), *o = v;
    if (!v) return NULL;
    for (const char *c = a; c < q;) {
        if (q - c >= 5 && memcmp(c, "&amp;", 5) == 0) *o++ = '&', c += 5;
        else if (q - c >= 6 && memcmp(c, "&quot;", 6) == 0) *o++ = '"', c += 6;
        else *o++ = *c++;
    }
    *o = 0;
    return v;
}

static const char *skip_ws(const char *p, const char *end) {
    while (p < end && strchr(" \t\r\n", *p)) p++;
    return p;
}

void chat_calls_free(chat_call *calls, int n) {
    for (int i = 0; i < n; i++) {
        free(calls[i].name), free(calls[i].arguments);
        calls[i].name = calls[i].arguments = NULL;
    }
}

/* One call's arguments, from p (after the call's header) up to its closer. Returns 1 with *after past the
 * closer, 0 cut short, -1 malformed. */
static int parse_args(const char *p, const char *end, cJSON *args, const char **after) {
    static const char ARG_END[] = "<|close|>argument<|sep|>", JSON_END[] = "<|close|>json<|sep|>";
    for (;;) {
        p = skip_ws(p, end);
        size_t n = (size_t)(end - p);
        int c = tag_at(p, n, "<|close|>call<|sep|>"), a = tag_at(p, n, "<|open|>argument"),
            j = tag_at(p, n, "<|open|>json");
        if (c == 1) {
            *after = p + strlen("<|close|>call<|sep|>");
            return 1;
        }
        if (a != 1 && j != 1) return c == 0 || a == 0 || j == 0 ? 0 : -1;
        const char *h = p, *he = find(p, end, "<|sep|>");
        if (!he) return 0;
        const char *body = he + strlen("<|sep|>"), *be = find(body, end, a == 1 ? ARG_END : JSON_END);
        if (!be) return 0;
        char *text = malloc((size_t)(be - body) + 1);
        if (!text) return -1;
        memcpy(text, body, (size_t)(be - body));
        text[be - body] = 0;
        int rc = 0;
        if (a == 1) {
            char *key = attr(h, he, "key"), *type = attr(h, he, "type");
            cJSON *v = NULL;
            if (!type || strcmp(type, "string") == 0) v = cJSON_CreateString(text);
            else v = cJSON_Parse(text);
            if (!key || !v || cJSON_GetObjectItemCaseSensitive(args, key)) rc = -1, cJSON_Delete(v);
            else cJSON_AddItemToObject(args, key, v);
            free(key), free(type);
        } else { /* a JSON object: its members are the arguments */
            cJSON *o = cJSON_Parse(text);
            if (!cJSON_IsObject(o)) {
                rc = -1;
            } else {
                while (o->child) {
                    cJSON *kid = cJSON_DetachItemViaPointer(o, o->child);
                    cJSON_AddItemToObject(args, kid->string, kid);
                }
            }
            cJSON_Delete(o);
        }
        free(text);
        if (rc) return rc;
        p = be + strlen(a == 1 ? ARG_END : JSON_END);
    }
}

int chat_tools_parse(const char *text, size_t len, chat_call *calls, int *n) {
    const char *p = text, *end = text + len;
    *n = 0;
    for (;;) {
        p = skip_ws(p, end);
        size_t left = (size_t)(end - p);
        int done = tag_at(p, left, "<|close|>tools<|sep|>"), call = tag_at(p, left, "<|open|>call");
        if (done == 1) return 1;
        if (call != 1) return done == 0 || call == 0 ? 0 : -1;
        if (*n == CHAT_MAX_CALLS) return -1;
        const char *he = find(p, end, "<|sep|>");
        if (!he) return 0;
        char *name = attr(p, he, "tool");
        if (!name) return -1;
        cJSON *args = cJSON_CreateObject();
        const char *after = NULL;
        int rc = args ? parse_args(he + strlen("<|sep|>"), end, args, &after) : -1;
        char *json = rc == 1 ? cJSON_PrintUnformatted(args) : NULL;
        cJSON_Delete(args);
        if (rc != 1 || !json) {
            free(name);
            if (json) cJSON_free(json);
            return rc == 1 ? -1 : rc;
        }
        calls[*n].name = name;
        calls[*n].arguments = strdup(json);
        cJSON_free(json);
        if (!calls[*n].arguments) {
            free(name);
            return -1;
        }
        (*n)++;
        p = after;
    }
}
