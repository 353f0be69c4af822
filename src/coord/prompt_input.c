/* The prompt as token ids (prompt_int.h). */
#include <stdlib.h>
#include <string.h>

#include "../base/file.h"
#include "../text/chat.h"
#include "prompt_int.h"

/* Parses "1,2,3"; returns the count or -1. */
static long prompt_ids_parse(const char *s, int32_t **out) {
    size_t cap = 16, n = 0;
    int32_t *v = malloc(cap * sizeof *v);
    while (v && *s) {
        char *end;
        long x = strtol(s, &end, 10);
        if (end == s || x < 0 || x > 0x7fffffff) break;
        if (n == cap) {
            int32_t *nv = realloc(v, (cap *= 2) * sizeof *v);
            if (!nv) break;
            v = nv;
        }
        v[n++] = (int32_t)x;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') break;
    }
    if (!v || *s || n == 0) {
        free(v);
        return -1;
    }
    *out = v;
    return (long)n;
}

/* --tokens: "1,2,3" or "@FILE", each id checked against the vocabulary. */
static int prompt_input_ids(const char *arg, const k3_hparams *hp, int32_t **toks, size_t *n_toks, rl_err *err) {
    /* @FILE: one argument holds at most 128 KiB on Linux (MAX_ARG_STRLEN), about 25,000 ids. */
    char *file = NULL;
    if (arg[0] == '@') {
        size_t len = 0;
        if (rl_read_file(arg + 1, NULL, &file, &len, err) != 0) return rl_err_prefix(err, "--tokens");
        while (len > 0 && (file[len - 1] == '\n' || file[len - 1] == '\r' || file[len - 1] == ' ')) file[--len] = 0;
    }
    long n = prompt_ids_parse(file ? file : arg, toks);
    free(file);
    if (n < 0) {
        rl_errf(err, "bad --tokens %s'%.200s' (comma-separated ids)", arg[0] == '@' ? "file " : "",
                arg[0] == '@' ? arg + 1 : arg);
        return -1;
    }
    *n_toks = (size_t)n;
    for (size_t i = 0; i < *n_toks; i++) {
        if ((uint32_t)(*toks)[i] >= hp->n_vocab) {
            rl_errf(err, "token id %d out of range (vocabulary %u)", (*toks)[i], hp->n_vocab);
            return -1;
        }
    }
    return 0;
}

int prompt_input_encode(const prompt_opts *o, const mf_model *m, const k3_hparams *hp, const tok_tokenizer *tok,
                        int32_t **toks, size_t *n_toks, char **text, prompt_out *po, rl_err *err) {
    if (o->tokens) return prompt_input_ids(o->tokens, hp, toks, n_toks, err);
    const char *src = o->prompt;
    size_t src_len = strlen(o->prompt);
    bool special = false;
    if (o->chat) {
        chat_format fmt;
        if (chat_detect_model(m, &fmt, err) != 0) return -1;
        chat_msg msgs[2];
        int nm = 0;
        memset(msgs, 0, sizeof msgs);
        if (o->system) msgs[nm].role = CHAT_SYSTEM, msgs[nm++].content = o->system;
        msgs[nm].role = CHAT_USER, msgs[nm++].content = o->prompt;
        chat_opts co = chat_opts_default();
        if (chat_render(fmt, msgs, nm, &co, text, &src_len, err) != 0) return -1;
        chat_split_init(&po->split, tok, true, fmt, co.thinking);
        po->split_on = po->split.open >= 0; /* K3's framing tokens are in the vocabulary */
        po->tok = tok;
        src = *text;
        special = true; /* the chat markers are special tokens */
    }
    return tok_encode(tok, src, src_len, special, toks, n_toks, err);
}
