#include "gguf_write.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ggml.h"
#include "gguf.h"

void gw_split_path(const char *out, int s, int n, char *buf, size_t cap) {
    if (n <= 1) {
        snprintf(buf, cap, "%s", out);
        return;
    }
    size_t len = strlen(out);
    int stem = (len > 5 && strcmp(out + len - 5, ".gguf") == 0) ? (int)len - 5 : (int)len;
    snprintf(buf, cap, "%.*s-%05d-of-%05d.gguf", stem, out, s + 1, n);
}

/* Redraws the bar only when the whole percentage changes (*last holds the previous one). */
static void gw_progress(const char *label, size_t done, size_t total, int *last) {
    if (!label || total == 0) return;
    int pct = (int)(100.0 * (double)done / (double)total);
    if (pct == *last) return;
    *last = pct;
    int w = 40, fill = pct * w / 100;
    fprintf(stderr, "\r%s [", label);
    for (int i = 0; i < w; i++) fputc(i < fill ? '#' : ' ', stderr);
    fprintf(stderr, "] %3d%% %7.1f MiB", pct, (double)done / 1048576.0);
    if (done == total) fputc('\n', stderr);
    fflush(stderr);
}

static int gw_zero_pad(FILE *f, long target, rl_err *err) {
    long pos = ftell(f);
    if (pos < 0 || pos > target) return rl_errf(err, "internal error: file offset %ld beyond %ld", pos, target);
    for (; pos < target; pos++) {
        if (fputc(0, f) == EOF) return rl_errf(err, "write failed: %s", strerror(errno));
    }
    return 0;
}

int gw_write(const struct gguf_context *meta, const gw_tensor *tensors, int n_tensors, const gw_opts *o,
             gw_data_fn fn, void *ctx, rl_err *err) {
    struct ggml_context *tctx = NULL;
    struct gguf_context **g = NULL;
    int n_split = o->n_split < 1 ? 1 : o->n_split;
    int rc = -1;
    char *path = NULL;
    if (n_tensors < 1) return rl_errf(err, "%s: no tensors to write", o->out);
    if (n_split > n_tensors) n_split = n_tensors;

    /* Tensor descriptors (no data) for the gguf tensor tables. */
    struct ggml_init_params ip = {.mem_size = (size_t)(n_tensors + 1) * ggml_tensor_overhead(), .mem_buffer = NULL,
                                  .no_alloc = true};
    tctx = ggml_init(ip);
    g = calloc((size_t)n_split, sizeof *g);
    if (!tctx || !g) {
        rl_errf(err, "out of memory");
        goto done;
    }
    static const char *const split_keys[] = {"split.no", "split.count", "split.tensors.count"};
    for (int s = 0; s < n_split; s++) {
        g[s] = gguf_init_empty();
        if (!g[s]) {
            rl_errf(err, "out of memory");
            goto done;
        }
        if (s == 0) {
            gguf_set_kv(g[0], meta); /* metadata lives in the first file */
            for (int k = 0; k < 3; k++) gguf_remove_key(g[0], split_keys[k]);
        }
        if (n_split > 1) {
            gguf_set_val_u16(g[s], "split.no", (uint16_t)s);
            gguf_set_val_u16(g[s], "split.count", (uint16_t)n_split);
            gguf_set_val_i32(g[s], "split.tensors.count", n_tensors);
        }
    }
    size_t total = 0;
    for (int i = 0; i < n_tensors; i++) {
        const gw_tensor *st = &tensors[i];
        if (st->ne[0] % ggml_blck_size((enum ggml_type)st->type) != 0) {
            rl_errf(err, "tensor %s: row of %lld does not fit %s blocks", st->name, (long long)st->ne[0],
                    ggml_type_name((enum ggml_type)st->type));
            goto done;
        }
        struct ggml_tensor *t = ggml_new_tensor(tctx, (enum ggml_type)st->type, st->n_dims, st->ne);
        ggml_set_name(t, st->name);
        gguf_add_tensor(g[(int)((int64_t)i * n_split / n_tensors)], t);
        total += ggml_nbytes(t);
    }

    size_t out_len = strlen(o->out) + 32;
    path = malloc(out_len);
    if (!path) {
        rl_errf(err, "out of memory");
        goto done;
    }
    size_t done_bytes = 0;
    int first = 0, last_pct = -1;
    for (int s = 0; s < n_split; s++) {
        gw_split_path(o->out, s, n_split, path, out_len);
        FILE *f = fopen(path, "wb");
        if (!f) {
            rl_errf(err, "cannot create %s: %s", path, strerror(errno));
            goto done;
        }
        int frc = gguf_write_to_file_ptr(g[s], f, true) ? 0 : rl_errf(err, "cannot write metadata to %s", path);
        /* A context built in memory has no data offset yet: tensor data starts after the metadata, padded to
         * the alignment (gguf_write_to_file lays a file out the same way). */
        size_t al = gguf_get_alignment(g[s]);
        size_t data_off = (gguf_get_meta_size(g[s]) + al - 1) / al * al;
        int64_t nt = gguf_get_n_tensors(g[s]);
        for (int64_t i = 0; i < nt && frc == 0; i++) {
            frc = gw_zero_pad(f, (long)(data_off + gguf_get_tensor_offset(g[s], i)), err);
            long at = ftell(f);
            if (frc == 0) frc = fn(ctx, first + (int)i, f, err);
            if (frc == 0 && ftell(f) - at != (long)gguf_get_tensor_size(g[s], i)) {
                frc = rl_errf(err, "internal error: tensor %s: %ld bytes written, %zu expected",
                              tensors[first + i].name, ftell(f) - at, gguf_get_tensor_size(g[s], i));
            }
            done_bytes += gguf_get_tensor_size(g[s], i);
            gw_progress(o->progress, done_bytes, total, &last_pct);
        }
        /* Pad the last tensor like gguf_write_to_file does, so the file size is a multiple of alignment. */
        if (frc == 0 && nt > 0) {
            size_t end = data_off + gguf_get_tensor_offset(g[s], nt - 1) + gguf_get_tensor_size(g[s], nt - 1);
            frc = gw_zero_pad(f, (long)((end + al - 1) / al * al), err);
        }
        if (fclose(f) != 0 && frc == 0) frc = rl_errf(err, "cannot write %s: %s", path, strerror(errno));
        if (frc != 0) {
            remove(path); /* never leave a half-written model behind */
            for (int p = 0; p < s; p++) { /* nor the earlier files of its set */
                gw_split_path(o->out, p, n_split, path, out_len);
                remove(path);
            }
            goto done;
        }
        first += (int)nt;
    }
    rc = 0;
done:
    free(path);
    if (g) {
        for (int s = 0; s < n_split; s++) {
            if (g[s]) gguf_free(g[s]);
        }
        free(g);
    }
    if (tctx) ggml_free(tctx);
    return rc;
}
