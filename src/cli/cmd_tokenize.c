/* `ringlm tokenize`: token ids of a text, in the same format as the llama.cpp oracle prints them. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../gguf/model_file.h"
#include "../text/tokenizer.h"
#include "cli.h"

static const char tokenize_usage[] =
    "usage: ringlm tokenize -m MODEL.gguf [--special] TEXT\n"
    "       ringlm tokenize -m MODEL.gguf [--special] --file STRINGS.txt\n"
    "       ringlm tokenize -m MODEL.gguf [--special] --decode --file IDS.txt\n\n"
    "Prints the token ids of TEXT comma-separated (what llama_tokenize gives with add_special=false).\n"
    "--special   match special tokens (<|open|>, [BOS], ...) written in the text (parse_special)\n"
    "--file F    one string per line, C-escaped (\\\\ \\n \\r \\t \\xHH); one line of ids per string\n"
    "--decode    the lines of F are comma-separated ids; prints each decoded text, escaped the same way\n"
    "            (with --special, control tokens are rendered as their text)\n";

/* Undoes the escapes of the oracle's input format in place; returns the new length or -1. */
static long unescape_line(char *s, size_t len, const char *path, int lineno, rl_err *err) {
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] != '\\') {
            s[o++] = s[i];
            continue;
        }
        if (++i >= len) return rl_errf(err, "%s:%d: a lone \\ at the end of the line", path, lineno);
        switch (s[i]) {
        case '\\': s[o++] = '\\'; break;
        case 'n': s[o++] = '\n'; break;
        case 'r': s[o++] = '\r'; break;
        case 't': s[o++] = '\t'; break;
        case 'x': {
            char hx[3] = {i + 1 < len ? s[i + 1] : 0, i + 2 < len ? s[i + 2] : 0, 0};
            char *end;
            long v = strtol(hx, &end, 16);
            if (!hx[0] || !hx[1] || *end || hx[0] == '-' || hx[0] == '+' || hx[0] == ' ')
                return rl_errf(err, "%s:%d: \\x wants two hex digits", path, lineno);
            s[o++] = (char)v;
            i += 2;
            break;
        }
        default:
            return rl_errf(err, "%s:%d: unknown escape \\%c (known: \\\\ \\n \\r \\t \\xHH)", path, lineno, s[i]);
        }
    }
    return (long)o;
}

static void print_escaped(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\\') fputs("\\\\", stdout);
        else if (c == '\n') fputs("\\n", stdout);
        else if (c == '\r') fputs("\\r", stdout);
        else if (c == '\t') fputs("\\t", stdout);
        else if (c < 0x20 || c == 0x7F) printf("\\x%02x", c);
        else putchar(c);
    }
    putchar('\n');
}

static int print_ids(const tok_tokenizer *t, const char *text, size_t len, bool special, rl_err *err) {
    int32_t *ids;
    size_t n;
    if (tok_encode(t, text, len, special, &ids, &n, err)) return -1;
    for (size_t i = 0; i < n; i++) printf("%s%d", i ? "," : "", (int)ids[i]);
    putchar('\n');
    free(ids);
    return 0;
}

static int print_decoded(const tok_tokenizer *t, char *line, size_t len, bool special, const char *path, int lineno,
                         rl_err *err) {
    int32_t *ids = malloc((len / 2 + 1) * sizeof *ids);
    size_t n = 0;
    if (!ids) return rl_errf(err, "out of memory");
    line[len] = 0;
    for (char *p = line; *p;) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < INT32_MIN || v > INT32_MAX || (*end && *end != ',')) {
            free(ids);
            return rl_errf(err, "%s:%d: not a comma-separated list of token ids", path, lineno);
        }
        ids[n++] = (int32_t)v;
        p = *end ? end + 1 : end;
    }
    char *s;
    size_t sl;
    int rc = tok_decode(t, ids, n, special, false, &s, &sl, err);
    free(ids);
    if (rc) return rl_err_prefix(err, "%s:%d", path, lineno);
    print_escaped(s, sl);
    free(s);
    return 0;
}

static int run_file(const tok_tokenizer *t, const char *path, bool special, bool decode, rl_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return rl_errf(err, "cannot open %s: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    int rc = 0;
    for (int lineno = 1; rc == 0 && (got = getline(&line, &cap, f)) >= 0; lineno++) {
        size_t ll = (size_t)got;
        if (ll && line[ll - 1] == '\n') ll--;
        if (decode) {
            rc = print_decoded(t, line, ll, special, path, lineno, err);
        } else {
            long ul = unescape_line(line, ll, path, lineno, err);
            rc = ul < 0 ? -1 : print_ids(t, line, (size_t)ul, special, err);
            if (rc && ul >= 0) rl_err_prefix(err, "%s:%d", path, lineno);
        }
    }
    if (rc == 0 && ferror(f)) rc = rl_errf(err, "cannot read %s: %s", path, strerror(errno));
    free(line);
    fclose(f);
    return rc;
}

int cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *file = NULL, *text = NULL;
    bool special = false, decode = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(tokenize_usage, stdout);
            return 0;
        } else if ((strcmp(argv[i], "-m") == 0 || strcmp(argv[i], "--model") == 0) && i + 1 < argc) {
            model = argv[++i];
        } else if (strcmp(argv[i], "--file") == 0 && i + 1 < argc) {
            file = argv[++i];
        } else if (strcmp(argv[i], "--special") == 0) {
            special = true;
        } else if (strcmp(argv[i], "--decode") == 0) {
            decode = true;
        } else if (strcmp(argv[i], "--") == 0 && i + 1 < argc && !text) {
            text = argv[++i];
        } else if (argv[i][0] != '-' && !text) {
            text = argv[i];
        } else {
            fprintf(stderr, "ringlm tokenize: unknown option or extra argument '%s'\n\n%s", argv[i], tokenize_usage);
            return 2;
        }
    }
    if (!model || (!file) == (!text) || (decode && !file)) {
        fputs(tokenize_usage, stderr);
        return 2;
    }
    rl_err err = {{0}};
    mf_model m;
    tok_tokenizer t;
    if (mf_open(&m, model, &err)) {
        fprintf(stderr, "ringlm tokenize: %s\n", err.msg);
        return 1;
    }
    int rc = tok_load(&t, &m, &err);
    mf_close(&m);
    if (rc) {
        fprintf(stderr, "ringlm tokenize: %s\n", err.msg);
        return 1;
    }
    rc = file ? run_file(&t, file, special, decode, &err) : print_ids(&t, text, strlen(text), special, &err);
    tok_free(&t);
    if (rc == 0 && (fflush(stdout) != 0 || ferror(stdout))) rc = rl_errf(&err, "cannot write the output");
    if (rc) {
        fprintf(stderr, "ringlm tokenize: %s\n", err.msg);
        return 1;
    }
    return 0;
}
