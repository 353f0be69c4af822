#include "calib.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>

#include "../base/file.h"


/* Appends a document's tokens as sequences of at most ctx; returns 1 once max_tokens is reached. */
static int calib_add(calib_set *c, const int32_t *ids, size_t n, uint32_t ctx, size_t max_tokens, rl_err *err) {
    for (size_t o = 0; o < n;) {
        size_t take = n - o < ctx ? n - o : ctx;
        if (max_tokens && c->n_ids + take > max_tokens) take = max_tokens - c->n_ids;
        if (take == 0) return 1;
        int32_t *ni = realloc(c->ids, (c->n_ids + take) * sizeof *ni);
        size_t *ns = realloc(c->start, (size_t)(c->n_seq + 1) * sizeof *ns);
        if (ns) c->start = ns;
        uint32_t *nl = realloc(c->len, (size_t)(c->n_seq + 1) * sizeof *nl);
        if (nl) c->len = nl;
        if (ni) c->ids = ni;
        if (!ni || !ns || !nl) return rl_errf(err, "out of memory for calibration tokens");
        memcpy(c->ids + c->n_ids, ids + o, take * sizeof *ids);
        c->start[c->n_seq] = c->n_ids;
        c->len[c->n_seq] = (uint32_t)take;
        c->n_seq++;
        c->n_ids += take;
        o += take;
        if (max_tokens && c->n_ids >= max_tokens) return 1;
    }
    return 0;
}

/* One document: tokenized, then cut into sequences; *full once max_tokens is reached. */
static int calib_doc(calib_set *c, const tok_tokenizer *tok, const char *text, size_t len, bool special, uint32_t ctx,
                     size_t max_tokens, int *full, rl_err *err) {
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = tok_encode(tok, text, len, special, &ids, &n, err);
    if (rc == 0) {
        int r = calib_add(c, ids, n, ctx, max_tokens, err);
        if (r < 0) rc = -1;
        *full = r == 1;
    }
    free(ids);
    return rc;
}

static int calib_role(const char *r, chat_role *out) {
    if (strcmp(r, "system") == 0) *out = CHAT_SYSTEM;
    else if (strcmp(r, "user") == 0) *out = CHAT_USER;
    else if (strcmp(r, "assistant") == 0) *out = CHAT_ASSISTANT;
    else if (strcmp(r, "tool") == 0) *out = CHAT_TOOL;
    else return -1;
    return 0;
}

/* One JSONL line into text (malloc'ed) and whether its markers are special tokens. */
static int calib_line(const char *path, int lineno, const char *line, size_t len, const chat_format *fmt, char **text,
                      size_t *text_len, bool *special, rl_err *err) {
    cJSON *j = cJSON_ParseWithLength(line, len);
    int rc = 0;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "text"), *ms = cJSON_GetObjectItemCaseSensitive(j, "messages");
    if (!cJSON_IsObject(j)) {
        rc = rl_errf(err, "%s line %d: not a JSON object", path, lineno);
    } else if (cJSON_IsString(t)) {
        *text_len = strlen(t->valuestring);
        *text = malloc(*text_len + 1);
        if (!*text) rc = rl_errf(err, "out of memory");
        else memcpy(*text, t->valuestring, *text_len + 1);
        *special = false;
    } else if (cJSON_IsArray(ms) && cJSON_GetArraySize(ms) > 0) {
        int n = cJSON_GetArraySize(ms), i = 0;
        chat_msg *msgs = calloc((size_t)n, sizeof *msgs);
        if (!msgs) rc = rl_errf(err, "out of memory");
        for (const cJSON *m = ms ? ms->child : NULL; m && rc == 0; m = m->next, i++) {
            const cJSON *r = cJSON_GetObjectItemCaseSensitive(m, "role"), *c = cJSON_GetObjectItemCaseSensitive(m, "content");
            if (!cJSON_IsString(r) || calib_role(r->valuestring, &msgs[i].role) != 0 || !cJSON_IsString(c)) {
                rc = rl_errf(err, "%s line %d: message %d needs a role (system, user, assistant, tool) and a string content",
                             path, lineno, i);
            }
            if (rc == 0) msgs[i].content = c->valuestring;
        }
        chat_opts co = chat_opts_default();
        co.add_generation_prompt = false;
        if (rc == 0 && !fmt) {
            rc = rl_errf(err, "%s line %d: chat messages, but the model's chat template is not one ringlm renders (use "
                              "{\"text\": ...})", path, lineno);
        }
        if (rc == 0 && chat_render(*fmt, msgs, n, &co, text, text_len, err) != 0) rc = -1;
        *special = true;
        free(msgs);
    } else {
        rc = rl_errf(err, "%s line %d: needs \"text\" (a string) or \"messages\" (a non-empty array)", path, lineno);
    }
    cJSON_Delete(j);
    return rc;
}

int calib_load(calib_set *c, const char *what, const char *const *files, int n_files, const tok_tokenizer *tok,
               const chat_format *fmt, uint32_t ctx, size_t max_tokens, rl_err *err) {
    memset(c, 0, sizeof *c);
    if (ctx < 2) return rl_errf(err, "%s sequences of %u tokens: at least 2", what, ctx);
    if (n_files < 1) return rl_errf(err, "no %s file", what);
    int full = 0;
    for (int fi = 0; fi < n_files && !full; fi++) {
        char *buf = NULL;
        size_t len = 0;
        char label[64];
        snprintf(label, sizeof label, "%s file", what);
        if (rl_read_file(files[fi], label, &buf, &len, err) != 0) goto fail;
        size_t p = 0;
        while (p < len && (buf[p] == ' ' || buf[p] == '\t' || buf[p] == '\n' || buf[p] == '\r')) p++;
        const size_t before = c->n_ids;
        int rc = 0;
        if (p < len && buf[p] == '{') {
            int lineno = 0;
            for (size_t s = 0; s < len && rc == 0 && !full;) {
                size_t e = s;
                while (e < len && buf[e] != '\n') e++;
                lineno++;
                size_t a = s;
                while (a < e && (buf[a] == ' ' || buf[a] == '\t' || buf[a] == '\r')) a++;
                if (a < e) {
                    char *text = NULL;
                    size_t tl = 0;
                    bool special = false;
                    rc = calib_line(files[fi], lineno, buf + s, e - s, fmt, &text, &tl, &special, err);
                    if (rc == 0) rc = calib_doc(c, tok, text, tl, special, ctx, max_tokens, &full, err);
                    free(text);
                }
                s = e + 1;
            }
        } else {
            rc = calib_doc(c, tok, buf, len, false, ctx, max_tokens, &full, err);
        }
        free(buf);
        if (rc != 0) goto fail;
        if (c->n_ids == before && !full) {
            rl_errf(err, "%s file %s has no text", what, files[fi]);
            goto fail;
        }
    }
    if (c->n_ids == 0) {
        rl_errf(err, "no %s tokens", what);
        goto fail;
    }
    return 0;
fail:
    calib_free(c);
    return -1;
}

void calib_free(calib_set *c) {
    free(c->ids);
    free(c->start);
    free(c->len);
    memset(c, 0, sizeof *c);
}
