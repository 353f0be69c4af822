/* openai_request.c - a completion request's JSON body checked field by field into an http_job: sampling
 * and penalties, logit biases, stop strings, n, logprobs, echo, response_format (a grammar), tools and
 * tool_choice (a grammar), chat messages rendered in the model's chat format and tokenized, or a
 * completions prompt (text or token ids). Every refusal names its field (docs/serve.md has the table). */
#include "http_int.h"

#include "../text/chat_gram.h"
#include "../text/json_schema.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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
void http_job_free(http_job *jb) {
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
    /* The prompt cache is on unless a request turns it off (llama-server's field); vLLM's return_token_ids. */
    bool cache_prompt = true;
    if (http_get_bool(j, "cache_prompt", &cache_prompt, f) != 0) return -1;
    jb->p.no_cache = !cache_prompt;
    if (http_get_bool(j, "return_token_ids", &jb->token_ids, f) != 0) return -1;
    jb->p.token_ids = jb->token_ids;
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
    rl_buf b = {0};
    const cJSON *part;
    cJSON_ArrayForEach(part, v) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsObject(part) || !cJSON_IsString(t) || strcmp(t->valuestring, "text") != 0 || !cJSON_IsString(x)) {
            free(b.p);
            return BAD(f, param, "'%s': only parts of type \"text\" with a string \"text\" are supported", param);
        }
        if (rl_buf_add(&b, x->valuestring, strlen(x->valuestring)) != 0) {
            free(b.p);
            return http_failf(f, 500, "server_error", NULL, NULL, "out of memory");
        }
    }
    if (!b.p && rl_buf_add(&b, "", 0) != 0) return http_failf(f, 500, "server_error", NULL, NULL, "out of memory");
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

int http_request_parse(const http_server *h, const cJSON *j, bool chat, http_job *jb, http_fail *f) {
    if (http_parse_common(h, j, jb, f) != 0) return -1;
    if (chat) return http_parse_chat(h, j, jb, f);
    return http_parse_prompt(h, j, jb, f) != 0 || http_parse_format(h, j, jb, f) != 0 ? -1 : 0;
}
