/* chat.c - Kimi chat templates rendered without a Jinja engine (see chat.h).
 *
 * Each formatter follows its template statement by statement; the comments name the template constructs
 * being reproduced. The expected outputs in tests/unit/test_text.c were produced by llama.cpp's Jinja
 * renderer (common_chat_templates_apply) on the same conversations. */
#include "chat.h"

#include <cJSON.h>
#include <gguf.h>

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/buf.h"
#include "../gguf/model_file.h"

/* ------------------------------------------------------------------------------------------------------ */
/* A growing string                                                                                       */

typedef rl_buf sb; /* (base/buf.h; its oom flag lets a renderer check once, at the end) */

static void sb_addn(sb *b, const char *s, size_t n) { rl_buf_add(b, s, n); }
static void sb_add(sb *b, const char *s) { sb_addn(b, s, strlen(s)); }

static void sb_addf(sb *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_addf(sb *b, const char *fmt, ...) {
    char buf[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n > 0) sb_addn(b, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
}

static bool nonempty(const char *s) { return s && *s; }

/* Jinja's `s|trim` is non-empty (ASCII whitespace, as llama.cpp's engine trims) */
static bool nonblank(const char *s) {
    if (!s) return false;
    for (; *s; s++)
        if (!strchr(" \t\n\r\f\v", *s)) return true;
    return false;
}

/* ------------------------------------------------------------------------------------------------------ */
/* tojson, as llama.cpp's Jinja engine prints values: ", " and ": " separators, non-ASCII as is, control    */
/* characters as \b \f \n \r \t or \u00xx, integers exactly, other numbers like printf %g.                 */

static void json_str(sb *b, const char *s) {
    sb_add(b, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        switch (c) {
        case '"': sb_add(b, "\\\""); break;
        case '\\': sb_add(b, "\\\\"); break;
        case '\b': sb_add(b, "\\b"); break;
        case '\f': sb_add(b, "\\f"); break;
        case '\n': sb_add(b, "\\n"); break;
        case '\r': sb_add(b, "\\r"); break;
        case '\t': sb_add(b, "\\t"); break;
        default:
            if (c < 0x20) sb_addf(b, "\\u%04x", c);
            else sb_addn(b, s, 1);
        }
    }
    sb_add(b, "\"");
}

static void json_num(sb *b, double d) {
    if (d == floor(d) && fabs(d) < 9.2e18 && !(d == 0 && signbit(d))) sb_addf(b, "%lld", (long long)d);
    else sb_addf(b, "%g", d);
}

static void json_dump(sb *b, const cJSON *v) {
    if (cJSON_IsNull(v)) sb_add(b, "null");
    else if (cJSON_IsTrue(v)) sb_add(b, "true");
    else if (cJSON_IsFalse(v)) sb_add(b, "false");
    else if (cJSON_IsNumber(v)) json_num(b, v->valuedouble);
    else if (cJSON_IsString(v)) json_str(b, v->valuestring);
    else if (cJSON_IsArray(v) || cJSON_IsObject(v)) {
        bool obj = cJSON_IsObject(v);
        sb_add(b, obj ? "{" : "[");
        for (const cJSON *c = v->child; c; c = c->next) {
            if (c != v->child) sb_add(b, ", ");
            if (obj) {
                json_str(b, c->string);
                sb_add(b, ": ");
            }
            json_dump(b, c);
        }
        sb_add(b, obj ? "}" : "]");
    }
}

/* K3's json_sorted: every mapping's keys in byte order, no blanks, scalars as tojson(ensure_ascii=false) */
static void json_sorted(sb *b, const cJSON *v) {
    if (cJSON_IsObject(v)) {
        int n = cJSON_GetArraySize(v), k = 0;
        const cJSON **kids = n ? malloc((size_t)n * sizeof *kids) : NULL;
        if (n && !kids) {
            b->oom = 1;
            return;
        }
        for (const cJSON *c = v->child; c; c = c->next) kids[k++] = c;
        for (int i = 1; i < n; i++) { /* insertion sort: declarations are small */
            const cJSON *x = kids[i];
            int j = i;
            for (; j > 0 && strcmp(kids[j - 1]->string, x->string) > 0; j--) kids[j] = kids[j - 1];
            kids[j] = x;
        }
        sb_add(b, "{");
        for (int i = 0; i < n; i++) {
            if (i) sb_add(b, ",");
            json_str(b, kids[i]->string);
            sb_add(b, ":");
            json_sorted(b, kids[i]);
        }
        sb_add(b, "}");
        free(kids);
    } else if (cJSON_IsArray(v)) {
        sb_add(b, "[");
        for (const cJSON *c = v->child; c; c = c->next) {
            if (c != v->child) sb_add(b, ",");
            json_sorted(b, c);
        }
        sb_add(b, "]");
    } else {
        json_dump(b, v);
    }
}

/* chat_opts.tools, parsed (*out NULL for none: absent or []); -1 when it is not a JSON array */
static int tools_parse(const chat_opts *o, cJSON **out, rl_err *err) {
    *out = NULL;
    if (!o->tools) return 0;
    cJSON *t = cJSON_Parse(o->tools);
    if (!t || !cJSON_IsArray(t)) {
        cJSON_Delete(t);
        return rl_errf(err, "chat: the tools are not a JSON array");
    }
    if (t->child) *out = t;
    else cJSON_Delete(t);
    return 0;
}

/* Tool-call arguments, parsed. llama.cpp hands templates the parsed JSON and refuses text that is not
 * JSON; no arguments at all count as {}. */
static cJSON *args_parse(const chat_tool_call *tc, int idx, rl_err *err) {
    cJSON *j = cJSON_Parse(tc->arguments ? tc->arguments : "{}");
    if (!j) {
        rl_errf(err, "chat: the arguments of tool call %d (%s) are not valid JSON", idx + 1,
                tc->name ? tc->name : "?");
    }
    return j;
}

/* K3_LITE / K2: a string is printed as it is, anything else with tojson */
static int args_show(sb *b, const chat_tool_call *tc, int idx, rl_err *err) {
    cJSON *j = args_parse(tc, idx, err);
    if (!j) return -1;
    if (cJSON_IsString(j)) sb_add(b, j->valuestring);
    else json_dump(b, j);
    cJSON_Delete(j);
    return 0;
}

/* ------------------------------------------------------------------------------------------------------ */
/* Kimi-K3.jinja                                                                                           */

/* escape_attr: value|string|replace('&', '&amp;')|replace('"', '&quot;') */
static void k3_attr(sb *b, const char *k, const char *v) {
    sb_add(b, " ");
    sb_add(b, k);
    sb_add(b, "=\"");
    for (; *v; v++) {
        if (*v == '&') sb_add(b, "&amp;");
        else if (*v == '"') sb_add(b, "&quot;");
        else sb_addn(b, v, 1);
    }
    sb_add(b, "\"");
}

static void k3_close(sb *b, const char *tag) {
    sb_add(b, "<|close|>");
    sb_add(b, tag);
    sb_add(b, "<|sep|>");
}

static const char *k3_role(chat_role r) {
    return r == CHAT_SYSTEM ? "system" : r == CHAT_USER ? "user" : r == CHAT_ASSISTANT ? "assistant" : "tool";
}

/* xtml_type / xtml_value of one argument */
static void k3_argument(sb *b, const cJSON *v) {
    const char *type = cJSON_IsBool(v) ? "boolean" : cJSON_IsNull(v) ? "null" : cJSON_IsNumber(v) ? "number"
                       : cJSON_IsString(v) ? "string" : cJSON_IsObject(v) ? "object" : "array";
    sb_add(b, "<|open|>argument");
    k3_attr(b, "key", v->string);
    k3_attr(b, "type", type);
    sb_add(b, "<|sep|>");
    if (cJSON_IsString(v)) sb_add(b, v->valuestring);
    else json_dump(b, v);
    k3_close(b, "argument");
}

/* render_assistant's tool-call part */
static int k3_tool_calls(sb *b, const chat_msg *m, rl_err *err) {
    sb_add(b, "<|open|>tools<|sep|>");
    for (int i = 0; i < m->n_tool_calls; i++) {
        const chat_tool_call *tc = &m->tool_calls[i];
        if (!tc->name) return rl_errf(err, "chat: Kimi K3 tool calls require a function name (call %d)", i + 1);
        char idx[16];
        snprintf(idx, sizeof idx, "%d", i + 1);
        sb_add(b, "<|open|>call");
        k3_attr(b, "tool", tc->name);
        k3_attr(b, "index", idx);
        sb_add(b, "<|sep|>");
        cJSON *j = args_parse(tc, i, err);
        if (!j) return -1;
        if (cJSON_IsObject(j)) { /* arguments is mapping: one tag per key, in order */
            for (const cJSON *c = j->child; c; c = c->next) k3_argument(b, c);
        } else if (cJSON_IsString(j)) { /* a JSON string: shown as a json block unless blank */
            if (nonblank(j->valuestring)) {
                sb_add(b, "<|open|>json");
                k3_attr(b, "type", "object");
                sb_add(b, "<|sep|>");
                sb_add(b, j->valuestring);
                k3_close(b, "json");
            }
        } else {
            cJSON_Delete(j);
            return rl_errf(err, "chat: Kimi K3 tool call arguments must be a mapping or a JSON object string "
                                "(call %d to %s)", i + 1, tc->name);
        }
        cJSON_Delete(j);
        k3_close(b, "call");
    }
    k3_close(b, "tools");
    return 0;
}

typedef struct k3_state {
    const chat_msg *calls_msg; /* the last assistant message (state.tool_calls); NULL = none yet */
    int tool_index;
} k3_state;

/* render_tool_message */
static int k3_tool_result(sb *b, const chat_msg *m, k3_state *st, const char *resolved, rl_err *err) {
    st->tool_index++;
    const char *name = resolved ? resolved : m->name;
    if (!name && st->calls_msg && st->tool_index <= st->calls_msg->n_tool_calls)
        name = st->calls_msg->tool_calls[st->tool_index - 1].name; /* matched by order */
    if (!name) {
        return rl_errf(err, "chat: Kimi K3 tool messages need a resolvable tool name: give the tool's name, or "
                            "match a preceding assistant tool call by id or by order (tool result %d)",
                       st->tool_index);
    }
    char idx[16];
    snprintf(idx, sizeof idx, "%d", st->tool_index);
    sb_add(b, "<|open|>message");
    k3_attr(b, "role", "tool");
    k3_attr(b, "tool", name);
    k3_attr(b, "index", idx);
    sb_add(b, "<|sep|>");
    if (m->content) sb_add(b, m->content);
    k3_close(b, "message");
    sb_add(b, "<|end_of_msg|>");
    return 0;
}

static bool k3_calls_have_id(const chat_msg *a, const char *id) {
    for (int i = 0; a && id && i < a->n_tool_calls; i++)
        if (a->tool_calls[i].id && strcmp(a->tool_calls[i].id, id) == 0) return true;
    return false;
}

/* A run of consecutive tool messages starting at msgs[0]. When every result names a call of the last
 * assistant message by id, they are shown in the order of those calls (once per distinct id), each named
 * after its call; otherwise in their own order. */
static int k3_tool_run(sb *b, const chat_msg *msgs, int n, k3_state *st, rl_err *err) {
    int resolved = 0;
    for (int i = 0; i < n; i++) resolved += k3_calls_have_id(st->calls_msg, msgs[i].tool_call_id);
    if (resolved == n) {
        const chat_msg *a = st->calls_msg;
        for (int c = 0; c < a->n_tool_calls; c++) {
            const char *id = a->tool_calls[c].id;
            if (!id) continue;
            bool seen = false;
            for (int p = 0; p < c; p++) seen |= a->tool_calls[p].id && strcmp(a->tool_calls[p].id, id) == 0;
            if (seen) continue;
            for (int i = 0; i < n; i++)
                if (msgs[i].tool_call_id && strcmp(msgs[i].tool_call_id, id) == 0 &&
                    k3_tool_result(b, &msgs[i], st, a->tool_calls[c].name, err))
                    return -1;
        }
        return 0;
    }
    for (int i = 0; i < n; i++)
        if (k3_tool_result(b, &msgs[i], st, NULL, err)) return -1;
    return 0;
}

static int render_k3(sb *b, const chat_msg *msgs, int n, const chat_opts *o, const cJSON *tools, rl_err *err) {
    const char *effort = o->thinking_effort ? o->thinking_effort : "max";
    bool effort_none = strcmp(effort, "none") == 0;
    bool effort_ok = strcmp(effort, "low") == 0 || strcmp(effort, "high") == 0 || strcmp(effort, "max") == 0;
    if (o->thinking && !effort_none && !effort_ok) {
        return rl_errf(err, "chat: unsupported thinking_effort=%s; supported values are low, high, and max", effort);
    }
    if (tools) { /* render_tool_declare(tools) */
        sb_add(b, "<|open|>message role=\"system\" type=\"tool-declare\"<|sep|># Tools\nHere are the available tools, "
                  "described in JSONSchema.\n\n```json\n");
        json_sorted(b, tools);
        sb_add(b, "\n```<|close|>message<|sep|><|end_of_msg|>");
    }
    if (o->thinking && effort_ok) { /* internal_system_message('thinking-effort', ...) */
        sb_add(b, "<|open|>message");
        k3_attr(b, "role", "system");
        k3_attr(b, "type", "thinking-effort");
        sb_add(b, "<|sep|>`thinking_effort` guides on how much to think in your thinking channel (not including the "
                  "response channel), supported values include `low`, `medium`, `high`, and `max`.\n"
                  "Now the system is invoked with `thinking_effort=");
        sb_add(b, effort);
        sb_add(b, "`.");
        k3_close(b, "message");
        sb_add(b, "<|end_of_msg|>");
    }
    k3_state st = {NULL, 0};
    for (int i = 0; i < n; i++) {
        const chat_msg *m = &msgs[i];
        if (m->role == CHAT_TOOL) {
            if (i > 0 && msgs[i - 1].role == CHAT_TOOL) continue; /* shown with its run */
            int e = i;
            while (e < n && msgs[e].role == CHAT_TOOL) e++;
            if (k3_tool_run(b, m, e - i, &st, err)) return -1;
            continue;
        }
        if (m->role == CHAT_ASSISTANT) {
            st.calls_msg = m->n_tool_calls > 0 ? m : NULL;
            st.tool_index = 0;
        }
        sb_add(b, "<|open|>message");
        k3_attr(b, "role", k3_role(m->role));
        if (nonempty(m->name)) k3_attr(b, "name", m->name);
        sb_add(b, "<|sep|>");
        if (m->role == CHAT_ASSISTANT) { /* render_assistant */
            if (o->thinking) {
                sb_add(b, "<|open|>think<|sep|>");
                if (nonblank(m->reasoning)) sb_add(b, m->reasoning); /* shown untrimmed */
                k3_close(b, "think");
            }
            sb_add(b, "<|open|>response<|sep|>");
            if (m->content) sb_add(b, m->content);
            k3_close(b, "response");
            if (m->n_tool_calls > 0 && k3_tool_calls(b, m, err)) return -1;
        } else if (m->content) {
            sb_add(b, m->content);
        }
        k3_close(b, "message");
        sb_add(b, "<|end_of_msg|>");
    }
    if (o->add_generation_prompt) {
        sb_add(b, "<|open|>message role=\"assistant\"<|sep|>");
        sb_add(b, o->thinking ? "<|open|>think<|sep|>" : "<|open|>response<|sep|>");
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------------------ */
/* ringlm synth's template (K3 framing, reduced)                                                            */

static int render_k3_lite(sb *b, const chat_msg *msgs, int n, const chat_opts *o, const cJSON *tools, rl_err *err) {
    int tool_index = 0;
    if (tools) {
        sb_add(b, "<|open|>message role=\"system\" type=\"tool-declare\"<|sep|># Tools\n```json\n");
        json_dump(b, tools);
        sb_add(b, "\n```<|close|>message<|sep|><|end_of_msg|>");
    }
    for (int i = 0; i < n; i++) {
        const chat_msg *m = &msgs[i];
        if (m->role == CHAT_TOOL) {
            tool_index++;
            sb_add(b, "<|open|>message role=\"tool\"");
            if (nonempty(m->name)) {
                sb_add(b, " tool=\"");
                sb_add(b, m->name);
                sb_add(b, "\"");
            }
            sb_addf(b, " index=\"%d\"<|sep|>", tool_index);
        } else {
            if (m->role == CHAT_ASSISTANT) tool_index = 0;
            sb_add(b, "<|open|>message role=\"");
            sb_add(b, k3_role(m->role));
            sb_add(b, "\"<|sep|>");
        }
        if (m->role == CHAT_ASSISTANT) {
            if (o->thinking) {
                sb_add(b, "<|open|>think<|sep|>");
                if (nonempty(m->reasoning)) sb_add(b, m->reasoning);
                sb_add(b, "<|close|>think<|sep|>");
            }
            sb_add(b, "<|open|>response<|sep|>");
            if (nonempty(m->content)) sb_add(b, m->content);
            sb_add(b, "<|close|>response<|sep|>");
            if (m->n_tool_calls > 0) {
                sb_add(b, "<|open|>tools<|sep|>");
                for (int c = 0; c < m->n_tool_calls; c++) {
                    const chat_tool_call *tc = &m->tool_calls[c];
                    if (!tc->name) return rl_errf(err, "chat: a tool call needs a function name (call %d)", c + 1);
                    sb_add(b, "<|open|>call tool=\"");
                    sb_add(b, tc->name);
                    sb_addf(b, "\" index=\"%d\"<|sep|><|open|>json type=\"object\"<|sep|>", c + 1);
                    if (args_show(b, tc, c, err)) return -1;
                    sb_add(b, "<|close|>json<|sep|><|close|>call<|sep|>");
                }
                sb_add(b, "<|close|>tools<|sep|>");
            }
        } else if (nonempty(m->content)) {
            sb_add(b, m->content);
        }
        sb_add(b, "<|close|>message<|sep|><|end_of_msg|>");
    }
    if (o->add_generation_prompt) {
        sb_add(b, "<|open|>message role=\"assistant\"<|sep|>");
        sb_add(b, o->thinking ? "<|open|>think<|sep|>" : "<|open|>response<|sep|>");
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------------------ */
/* Kimi-K2-Instruct.jinja and Kimi-K2-Thinking.jinja                                                       */

typedef struct k2_state {
    int counter;        /* tool_call_counter */
    char **queue;       /* tool_response_queue: ids of calls not yet answered */
    int q_head, q_n, q_cap;
} k2_state;

static void k2_role(sb *b, const chat_msg *m) {
    const char *rn = nonempty(m->name) ? m->name : k3_role(m->role); /* message.get('name') or message['role'] */
    sb_add(b, m->role == CHAT_USER ? "<|im_user|>" : m->role == CHAT_ASSISTANT ? "<|im_assistant|>" : "<|im_system|>");
    sb_add(b, rn);
    sb_add(b, "<|im_middle|>");
}

static int k2_calls(sb *b, const chat_msg *m, k2_state *st, rl_err *err) {
    sb_add(b, "<|tool_calls_section_begin|>");
    for (int c = 0; c < m->n_tool_calls; c++) {
        const chat_tool_call *tc = &m->tool_calls[c];
        if (!tc->name) return rl_errf(err, "chat: a tool call needs a function name (call %d)", c + 1);
        sb b_id = {0};
        sb_add(&b_id, "functions.");
        sb_add(&b_id, tc->name);
        sb_addf(&b_id, ":%d", st->counter++);
        if (b_id.oom) {
            free(b_id.p);
            return rl_errf(err, "chat: out of memory");
        }
        if (st->q_n == st->q_cap) {
            int nc = st->q_cap ? 2 * st->q_cap : 8;
            char **nq = realloc(st->queue, (size_t)nc * sizeof *nq);
            if (!nq) {
                free(b_id.p);
                return rl_errf(err, "chat: out of memory");
            }
            st->queue = nq;
            st->q_cap = nc;
        }
        st->queue[st->q_n++] = b_id.p;
        sb_add(b, "<|tool_call_begin|>");
        sb_add(b, b_id.p);
        sb_add(b, "<|tool_call_argument_begin|>");
        if (args_show(b, tc, c, err)) return -1;
        sb_add(b, "<|tool_call_end|>");
    }
    sb_add(b, "<|tool_calls_section_end|>");
    return 0;
}

static void k2_tool_result(sb *b, const chat_msg *m, k2_state *st) {
    sb_add(b, "## Return of ");
    if (st->q_head < st->q_n) {
        sb_add(b, st->queue[st->q_head++]); /* tool_response_queue.ids.pop(0) */
    } else {
        sb_add(b, "functions.");
        sb_add(b, m->name ? m->name : "unknown"); /* message.get('name', 'unknown') */
        sb_addf(b, ":%d", st->counter);
    }
    sb_add(b, "\n");
    if (m->content) sb_add(b, m->content);
}

static int render_k2(sb *b, const chat_msg *msgs, int n, const chat_opts *o, const cJSON *tools, bool thinking_tmpl,
                     rl_err *err) {
    k2_state st = {0};
    int rc = 0;
    static const char sys_default[] = "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by "
                                      "Moonshot AI.<|im_end|>";
    /* Thinking: messages up to the last assistant message without tool calls are history (empty think);
     * the ones after it keep their reasoning */
    int last_plain = -1;
    for (int i = 0; i < n; i++)
        if (msgs[i].role == CHAT_ASSISTANT && msgs[i].n_tool_calls == 0) last_plain = i;
    if (tools) { /* <|im_system|>tool_declare<|im_middle|>{{ tools | tojson }}<|im_end|> */
        sb_add(b, "<|im_system|>tool_declare<|im_middle|>");
        json_dump(b, tools);
        sb_add(b, "<|im_end|>");
    }
    if (thinking_tmpl && (n == 0 || msgs[0].role != CHAT_SYSTEM)) sb_add(b, sys_default);
    for (int i = 0; i < n && rc == 0; i++) {
        const chat_msg *m = &msgs[i];
        /* Instruct adds the default system prompt inside its loop; the "{% endif %}" that ends it keeps the
         * newline in front of it */
        if (!thinking_tmpl && i == 0 && m->role != CHAT_SYSTEM) {
            sb_add(b, sys_default);
            sb_add(b, "\n");
        }
        k2_role(b, m);
        if (m->role == CHAT_ASSISTANT && thinking_tmpl) {
            sb_add(b, "<think>");
            if (i > last_plain && m->reasoning) sb_add(b, m->reasoning);
            sb_add(b, "</think>");
            if (m->content) sb_add(b, m->content);
            if (m->n_tool_calls > 0) rc = k2_calls(b, m, &st, err);
        } else if (m->role == CHAT_ASSISTANT && m->n_tool_calls > 0) {
            if (m->content) sb_add(b, m->content);
            rc = k2_calls(b, m, &st, err);
        } else if (m->role == CHAT_TOOL) {
            k2_tool_result(b, m, &st);
        } else if (m->content) {
            sb_add(b, m->content);
        }
        sb_add(b, "<|im_end|>");
    }
    if (rc == 0 && o->add_generation_prompt) sb_add(b, "<|im_assistant|>assistant<|im_middle|>");
    for (int i = 0; i < st.q_n; i++) free(st.queue[i]);
    free(st.queue);
    return rc;
}

/* ------------------------------------------------------------------------------------------------------ */

chat_opts chat_opts_default(void) { return (chat_opts){.add_generation_prompt = true, .thinking = true}; }

const char *chat_format_name(chat_format fmt) {
    switch (fmt) {
    case CHAT_FMT_K3: return "kimi-k3";
    case CHAT_FMT_K3_LITE: return "kimi-k3-lite (ringlm synth)";
    case CHAT_FMT_K2: return "kimi-k2";
    case CHAT_FMT_K2_THINKING: return "kimi-k2-thinking";
    }
    return "?";
}

int chat_detect(const char *tmpl, chat_format *fmt, rl_err *err) {
    if (!tmpl) {
        *fmt = CHAT_FMT_K3;
        return 0;
    }
    if (strstr(tmpl, "<|open|>") && strstr(tmpl, "<|close|>") && strstr(tmpl, "<|end_of_msg|>")) {
        *fmt = strstr(tmpl, "thinking_effort") ? CHAT_FMT_K3 : CHAT_FMT_K3_LITE;
        return 0;
    }
    if (strstr(tmpl, "<|im_middle|>")) {
        *fmt = strstr(tmpl, "<think>") ? CHAT_FMT_K2_THINKING : CHAT_FMT_K2;
        return 0;
    }
    return rl_errf(err, "chat: the model's chat template is not a Kimi template (no <|open|>/<|close|>/<|end_of_msg|> "
                        "or <|im_middle|> markers); ringlm has no Jinja engine to run other templates");
}

int chat_detect_model(const struct mf_model *m, chat_format *fmt, rl_err *err) {
    const char *tmpl = NULL;
    if (mf_get_str(m, "tokenizer.chat_template", &tmpl, false, err) < 0) return -1;
    return chat_detect(tmpl, fmt, err);
}

int chat_render(chat_format fmt, const chat_msg *msgs, int n_msgs, const chat_opts *o, char **out, size_t *out_len,
                rl_err *err) {
    *out = NULL;
    *out_len = 0;
    chat_opts def = chat_opts_default();
    if (!o) o = &def;
    for (int i = 0; i < n_msgs; i++) {
        if (msgs[i].role < CHAT_SYSTEM || msgs[i].role > CHAT_TOOL) return rl_errf(err, "chat: message %d has no valid role", i);
        if (msgs[i].n_tool_calls < 0 || (msgs[i].n_tool_calls > 0 && !msgs[i].tool_calls))
            return rl_errf(err, "chat: message %d has a bad tool call list", i);
    }
    cJSON *tools;
    if (tools_parse(o, &tools, err)) return -1;
    sb b = {0};
    sb_add(&b, ""); /* an empty conversation still gives a (NUL-terminated) string */
    int rc;
    switch (fmt) {
    case CHAT_FMT_K3: rc = render_k3(&b, msgs, n_msgs, o, tools, err); break;
    case CHAT_FMT_K3_LITE: rc = render_k3_lite(&b, msgs, n_msgs, o, tools, err); break;
    case CHAT_FMT_K2: rc = render_k2(&b, msgs, n_msgs, o, tools, false, err); break;
    case CHAT_FMT_K2_THINKING: rc = render_k2(&b, msgs, n_msgs, o, tools, true, err); break;
    default: rc = rl_errf(err, "chat: unknown format %d", (int)fmt);
    }
    cJSON_Delete(tools);
    if (rc == 0 && b.oom) rc = rl_errf(err, "chat: out of memory");
    if (rc) {
        rl_buf_free(&b);
        return -1;
    }
    *out = rl_buf_take(&b, out_len);
    return 0;
}
