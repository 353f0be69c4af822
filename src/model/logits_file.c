#include "logits_file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LF_MAGIC "RINGLM-LOGITS 1"
#define LF_MAX_HEADER (1 << 20)

int lf_write(const char *path, const lf_header *h, const float *logits, rl_err *err) {
    FILE *f = fopen(path, "wb");
    if (!f) return rl_errf(err, "cannot create %s: %s", path, strerror(errno));
    fprintf(f, "%s\nsource %s\nmode %s\nn_vocab %d\nn_rows %d\ntokens ", LF_MAGIC, h->source, h->mode,
            h->n_vocab, h->n_rows);
    for (int i = 0; i < h->n_rows; i++) fprintf(f, "%s%d", i ? "," : "", h->tokens[i]);
    fprintf(f, "\nend\n");
    /* The payload is little-endian f32; every target we build for is little-endian. */
    size_t n = (size_t)h->n_rows * (size_t)h->n_vocab;
    int bad = fwrite(logits, sizeof(float), n, f) != n;
    bad |= fclose(f) != 0; /* always close, even after a failed write */
    if (bad) return rl_errf(err, "cannot write %s: %s", path, strerror(errno));
    return 0;
}

/* Reads one '\n'-terminated line into buf; returns its length or -1 at EOF / overlong line. */
static long lf_line(FILE *f, char *buf, size_t cap, size_t *used) {
    size_t n = 0;
    int c;
    while ((c = fgetc(f)) != EOF && c != '\n') {
        if (n + 1 >= cap || *used + n >= LF_MAX_HEADER) return -1;
        buf[n++] = (char)c;
    }
    if (c == EOF) return -1;
    buf[n] = 0;
    *used += n + 1;
    return (long)n;
}

int lf_read(const char *path, lf_header *h, float **logits, rl_err *err) {
    memset(h, 0, sizeof *h);
    *logits = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return rl_errf(err, "cannot open %s: %s", path, strerror(errno));
    size_t cap = LF_MAX_HEADER, used = 0;
    char *line = malloc(cap);
    int ok = 0, have_tokens = 0;
    if (!line) goto fail_oom;
    if (lf_line(f, line, cap, &used) < 0 || strcmp(line, LF_MAGIC) != 0) {
        rl_errf(err, "%s: not a logits file (first line is not \"%s\")", path, LF_MAGIC);
        goto fail;
    }
    h->n_vocab = h->n_rows = -1;
    for (;;) {
        if (lf_line(f, line, cap, &used) < 0) {
            rl_errf(err, "%s: header ends before the \"end\" line", path);
            goto fail;
        }
        if (strcmp(line, "end") == 0) break;
        char *sp = strchr(line, ' ');
        if (!sp) {
            rl_errf(err, "%s: bad header line \"%.40s\"", path, line);
            goto fail;
        }
        *sp = 0;
        const char *key = line, *val = sp + 1;
        if (strcmp(key, "source") == 0) {
            snprintf(h->source, sizeof h->source, "%s", val);
        } else if (strcmp(key, "mode") == 0) {
            snprintf(h->mode, sizeof h->mode, "%s", val);
        } else if (strcmp(key, "n_vocab") == 0) {
            h->n_vocab = atoi(val);
        } else if (strcmp(key, "n_rows") == 0) {
            h->n_rows = atoi(val);
        } else if (strcmp(key, "tokens") == 0) {
            if (h->n_rows < 0) {
                rl_errf(err, "%s: \"tokens\" before \"n_rows\"", path);
                goto fail;
            }
            h->tokens = calloc((size_t)h->n_rows + 1, sizeof(int32_t));
            if (!h->tokens) goto fail_oom;
            int n = 0;
            const char *p = val;
            while (*p && n < h->n_rows) {
                char *end;
                long v = strtol(p, &end, 10);
                if (end == p) break;
                h->tokens[n++] = (int32_t)v;
                p = *end == ',' ? end + 1 : end;
            }
            if (n != h->n_rows) {
                rl_errf(err, "%s: %d token ids for %d rows", path, n, h->n_rows);
                goto fail;
            }
            have_tokens = 1;
        } /* unknown keys are ignored: later versions may add some */
    }
    if (h->n_vocab <= 0 || h->n_rows <= 0 || !have_tokens) {
        rl_errf(err, "%s: header lacks n_vocab, n_rows or tokens", path);
        goto fail;
    }
    size_t n = (size_t)h->n_rows * (size_t)h->n_vocab;
    *logits = malloc(n * sizeof(float));
    if (!*logits) goto fail_oom;
    if (fread(*logits, sizeof(float), n, f) != n) {
        rl_errf(err, "%s: payload shorter than %d rows x %d floats", path, h->n_rows, h->n_vocab);
        goto fail;
    }
    if (fgetc(f) != EOF) {
        rl_errf(err, "%s: bytes after the %d x %d payload", path, h->n_rows, h->n_vocab);
        goto fail;
    }
    ok = 1;
    goto done;
fail_oom:
    rl_errf(err, "%s: out of memory", path);
fail:
    lf_free(h, *logits);
    *logits = NULL;
done:
    free(line);
    fclose(f);
    return ok ? 0 : -1;
}

void lf_free(lf_header *h, float *logits) {
    free(h->tokens);
    h->tokens = NULL;
    free(logits);
}
