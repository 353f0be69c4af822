/* chat_gram.c - the forced tool-call reply's grammar (chat_gram.h). */
#include "chat_gram.h"

#include <cJSON.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_schema.h"

static gr_item R(int r) { return (gr_item){.kind = GR_RULE, .rule = r}; }
static gr_item L(const char *s) { return (gr_item){.kind = GR_LIT, .lit = s}; }

/* "<O>tag<P>" / "<C>tag<P>" as literal text in buf */
static const char *open_tag(char *buf, size_t n, const char *tag) {
    snprintf(buf, n, "%c%s%c", CHAT_SYM_OPEN, tag, CHAT_SYM_SEP);
    return buf;
}
static const char *close_tag(char *buf, size_t n, const char *tag) {
    snprintf(buf, n, "%c%s%c", CHAT_SYM_CLOSE, tag, CHAT_SYM_SEP);
    return buf;
}

/* the template's escape_attr */
static void attr_esc(char *out, size_t n, const char *v) {
    size_t k = 0;
    for (; *v && k + 7 < n; v++) {
        if (*v == '&') memcpy(out + k, "&amp;", 5), k += 5;
        else if (*v == '"') memcpy(out + k, "&quot;", 6), k += 6;
        else out[k++] = *v;
    }
    out[k] = 0;
}

/* text without control tokens: any bytes but the symbols' */
static int free_text(gr_builder *b) {
    int r = gr_rule_new(b);
    uint8_t set[32];
    gr_set_clear(set);
    gr_set_add(set, 0x01, 0xF7); /* (no NUL either: replies are C strings on the way out) */
    gr_alt_add(b, r, NULL, 0);
    gr_alt_add(b, r, (gr_item[]){{.kind = GR_SET, .set = set}, R(r)}, 2);
    return r;
}

/* xtml_type of the values a property's schema allows, when it is one type; NULL otherwise */
static const char *xtml_type(const cJSON *p) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "type");
    if (cJSON_IsString(t)) {
        const char *s = t->valuestring;
        if (!strcmp(s, "integer") || !strcmp(s, "number")) return "number";
        if (!strcmp(s, "string") || !strcmp(s, "boolean") || !strcmp(s, "null") || !strcmp(s, "object") ||
            !strcmp(s, "array"))
            return s;
        return NULL;
    }
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(p, "enum");
    bool strings = cJSON_IsArray(e) && e->child;
    for (const cJSON *v = e ? e->child : NULL; v; v = v->next) strings = strings && cJSON_IsString(v);
    return strings ? "string" : NULL;
}

/* One argument tag: <O>argument key="K" type="T"<P>VALUE<C>argument<P>. A string's value is raw text (the
 * listed ones with an enum); any other, JSON for its schema (type "json" when the schema allows several). */
static int k3_argument(gr_builder *b, const char *key, const cJSON *p, int text, bool lenient, rl_err *err) {
    const char *type = xtml_type(p);
    int val;
    if (type && !strcmp(type, "string")) {
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(p, "enum");
        if (cJSON_IsArray(e) && e->child) {
            val = gr_rule_new(b);
            for (const cJSON *v = e->child; v; v = v->next)
                if (cJSON_IsString(v)) gr_alt_add(b, val, (gr_item[]){L(v->valuestring)}, 1);
        } else {
            val = text;
        }
    } else if ((val = js_rule_add(b, p, lenient, err)) < 0) {
        return rl_err_prefix(err, "tool argument '%s'", key);
    }
    char k[512], head[700], end[32];
    attr_esc(k, sizeof k, key);
    snprintf(head, sizeof head, "%cargument key=\"%s\" type=\"%s\"%c", CHAT_SYM_OPEN, k, type ? type : "json",
             CHAT_SYM_SEP);
    int r = gr_rule_new(b);
    gr_alt_add(b, r, (gr_item[]){L(head), R(val), L(close_tag(end, sizeof end, "argument"))}, 3);
    return r;
}

/* A call's arguments: K3, the properties in order (the optional ones may be left out); K3_LITE, one JSON
 * block for the whole parameters schema. */
static int call_args(gr_builder *b, chat_format fmt, const cJSON *params, int text, bool lenient, rl_err *err) {
    char c[32];
    if (fmt == CHAT_FMT_K3_LITE) {
        cJSON *any = params ? NULL : cJSON_Parse("{\"type\":\"object\"}");
        int v = js_rule_add(b, params ? params : any, lenient, err);
        cJSON_Delete(any);
        if (v < 0) return rl_err_prefix(err, "tool parameters");
        int r = gr_rule_new(b);
        char head[64];
        snprintf(head, sizeof head, "%cjson type=\"object\"%c", CHAT_SYM_OPEN, CHAT_SYM_SEP);
        gr_alt_add(b, r, (gr_item[]){L(head), R(v), L(close_tag(c, sizeof c, "json"))}, 3);
        return r;
    }
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(params, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(params, "required");
    int n = cJSON_GetArraySize(props);
    int next = gr_rule_new(b); /* after the last property: nothing */
    gr_alt_add(b, next, NULL, 0);
    for (int i = n - 1; i >= 0; i--) {
        const cJSON *p = cJSON_GetArrayItem(props, i);
        int a = k3_argument(b, p->string, p, text, lenient, err);
        if (a < 0) return -1;
        bool required = false;
        for (const cJSON *q = cJSON_IsArray(req) ? req->child : NULL; q; q = q->next)
            required = required || (cJSON_IsString(q) && !strcmp(q->valuestring, p->string));
        int r = gr_rule_new(b);
        gr_alt_add(b, r, (gr_item[]){R(a), R(next)}, 2);
        if (!required) gr_alt_add(b, r, (gr_item[]){R(next)}, 1);
        next = r;
    }
    return next;
}

/* The reply's root: with thinking, the think section's rest (the generation prompt opened it), its closer
 * and the response's opener, then `response` (the response section's body onwards); without, `response`. */
static int reply_root(gr_builder *b, int text, bool thinking, int response) {
    char c_think[32], o_resp[32];
    int root = gr_rule_new(b);
    if (thinking)
        gr_alt_add(b, root, (gr_item[]){R(text), L(close_tag(c_think, sizeof c_think, "think")),
                                        L(open_tag(o_resp, sizeof o_resp, "response")), R(response)}, 4);
    else gr_alt_add(b, root, (gr_item[]){R(response)}, 1);
    return root;
}

gr_grammar *chat_tools_grammar_new(chat_format fmt, const cJSON *tools, const char *only, bool thinking,
                                   bool optional, rl_err *err) {
    if (fmt != CHAT_FMT_K3 && fmt != CHAT_FMT_K3_LITE)
        return rl_errf(err, "tool calls can be constrained only in Kimi K3 chat formats (this model's is %s)",
                       chat_format_name(fmt)), NULL;
    gr_builder *b = gr_builder_new();
    if (!b) return rl_errf(err, "out of memory"), NULL;
    int text = free_text(b);
    /* per tool: its argument rule (built once, used by every call index) */
    int n_tools = cJSON_GetArraySize(tools), found = 0, rc = 0;
    int *args = calloc((size_t)(n_tools ? n_tools : 1), sizeof *args);
    if (!args) rc = rl_errf(err, "out of memory");
    for (int t = 0; t < n_tools && rc == 0; t++) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(tools, t), "function");
        const char *name = cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring;
        args[t] = -1;
        if (only && strcmp(only, name) != 0) continue;
        found++;
        bool strict = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(fn, "strict"));
        args[t] = call_args(b, fmt, cJSON_GetObjectItemCaseSensitive(fn, "parameters"), text, !strict, err);
        if (args[t] < 0) rc = rl_err_prefix(err, "tool '%s'", name);
    }
    if (rc == 0 && found == 0) rc = rl_errf(err, "tool_choice names '%s', which is not among the tools", only ? only : "?");
    /* calls[k]: the k-th call and those after it (at most CHAT_GRAM_MAX_CALLS) */
    int next = -1;
    char tag[64];
    for (int k = CHAT_GRAM_MAX_CALLS; k >= 1 && rc == 0; k--) {
        int call = gr_rule_new(b), r = gr_rule_new(b);
        for (int t = 0; t < n_tools; t++) {
            if (args[t] < 0) continue;
            const cJSON *fn = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(tools, t), "function");
            char nm[512], head[700];
            attr_esc(nm, sizeof nm, cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring);
            snprintf(head, sizeof head, "%ccall tool=\"%s\" index=\"%d\"%c", CHAT_SYM_OPEN, nm, k, CHAT_SYM_SEP);
            gr_alt_add(b, call, (gr_item[]){L(head), R(args[t]), L(close_tag(tag, sizeof tag, "call"))}, 3);
        }
        gr_alt_add(b, r, (gr_item[]){R(call)}, 1);
        if (next >= 0) gr_alt_add(b, r, (gr_item[]){R(call), R(next)}, 2);
        next = r;
    }
    free(args);
    gr_grammar *g = NULL;
    if (rc == 0) { /* [the think section's rest, its closer, the response's opener] the response's rest, then tools */
        char c_resp[32], o_tools[32], c_tools[32], c_msg[32];
        int section = gr_rule_new(b), response = gr_rule_new(b);
        gr_alt_add(b, section, (gr_item[]){L(open_tag(o_tools, sizeof o_tools, "tools")), R(next),
                                           L(close_tag(c_tools, sizeof c_tools, "tools")),
                                           L(close_tag(c_msg, sizeof c_msg, "message"))}, 4);
        gr_alt_add(b, response, (gr_item[]){R(text), L(close_tag(c_resp, sizeof c_resp, "response")), R(section)}, 3);
        if (optional) /* tool_choice auto: the reply may also end without calls */
            gr_alt_add(b, response, (gr_item[]){R(text), L(close_tag(c_resp, sizeof c_resp, "response")),
                                                L(close_tag(c_msg, sizeof c_msg, "message"))}, 3);
        g = gr_build(b, reply_root(b, text, thinking, response), err);
    }
    gr_builder_free(b);
    return g;
}

gr_grammar *chat_json_grammar_new(chat_format fmt, const cJSON *schema, bool lenient, bool thinking, rl_err *err) {
    if (fmt != CHAT_FMT_K3 && fmt != CHAT_FMT_K3_LITE)
        return rl_errf(err, "chat_json_grammar_new: not a Kimi K3 chat format (%s)", chat_format_name(fmt)), NULL;
    cJSON *object = schema ? NULL : cJSON_Parse("{\"type\":\"object\"}");
    gr_builder *b = (schema || object) ? gr_builder_new() : NULL;
    if (!b) {
        cJSON_Delete(object);
        return rl_errf(err, "out of memory"), NULL;
    }
    gr_grammar *g = NULL;
    int value = js_rule_add(b, schema ? schema : object, lenient, err);
    if (value >= 0) {
        /* the value, then either the end of generation at once (the split ends the content there) or the
         * sections closed as the template closes them: a budget never has to pay for the closers */
        char c_resp[32], c_msg[32];
        int response = gr_rule_new(b);
        gr_alt_add(b, response, (gr_item[]){R(value)}, 1);
        gr_alt_add(b, response, (gr_item[]){R(value), L(close_tag(c_resp, sizeof c_resp, "response")),
                                            L(close_tag(c_msg, sizeof c_msg, "message"))}, 3);
        g = gr_build(b, reply_root(b, free_text(b), thinking, response), err);
    }
    gr_builder_free(b);
    cJSON_Delete(object);
    return g;
}

void chat_gram_caps_get(const tok_tokenizer *t, chat_format fmt, chat_gram_caps *c) {
    static const char *const marks[] = {"<|open|>", "<|sep|>", "<|close|>"};
    memset(c, 0, sizeof *c);
    size_t k = 0;
    if (fmt == CHAT_FMT_K3 || fmt == CHAT_FMT_K3_LITE) {
        c->sections = true;
        for (int i = 0; i < 3; i++) {
            if (tok_find(t, marks[i], strlen(marks[i])) >= 0) continue;
            c->sections = false;
            k += (size_t)snprintf(c->lacks + k, sizeof c->lacks - k, "%s%s", k ? " " : "the tokens ", marks[i]);
        }
    } else {
        k += (size_t)snprintf(c->lacks, sizeof c->lacks, "K3's section markers (its chat format is %s)",
                              chat_format_name(fmt));
    }
    for (int32_t i = 0; i < t->n_vocab && !c->eog; i++) c->eog = tok_is_eog(t, i);
    if (!c->eog && k < sizeof c->lacks)
        snprintf(c->lacks + k, sizeof c->lacks - k, "%san end-of-generation token", k ? " and " : "");
}

smp_vocab *chat_gram_vocab_new(const tok_tokenizer *t) {
    static const char *const syms[] = {"<|open|>", "<|sep|>", "<|close|>"}; /* CHAT_SYM_OPEN, _SEP, _CLOSE */
    return tok_vocab_new(t, syms, 3);
}
