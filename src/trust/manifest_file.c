#include "manifest_file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sodium.h>
#include <sys/types.h>

#include "ggml.h"
#include "gguf.h"

#define K(s) "ringlm.manifest." s

static const char *manifest_base(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

int manifest_file_build(manifest_file *f, const mf_model *m, int n_threads, bool progress, rl_err *err) {
    memset(f, 0, sizeof *f);
    uint32_t L = 0;
    if (mf_get_u32(m, K3_ARCH ".block_count", &L, true, err) < 0) return -1;
    const int n = m->n_tensor;
    const mf_tensor **ts = calloc((size_t)n + 1, sizeof *ts);
    uint8_t(*hs)[32] = calloc((size_t)n + 1, sizeof *hs);
    const char **names = calloc((size_t)n + 1, sizeof *names), **files = calloc((size_t)m->n_split + 1, sizeof *files);
    uint32_t *ty = calloc((size_t)n + 1, 4), *nd = calloc((size_t)n + 1, 4), *fi = calloc((size_t)n + 1, 4);
    int64_t *ne = calloc((size_t)n * 4 + 1, 8);
    uint64_t *nb = calloc((size_t)n + 1, 8), *off = calloc((size_t)n + 1, 8);
    int rc = -1;
    f->g = gguf_init_empty();
    if (!ts || !hs || !names || !files || !ty || !nd || !fi || !ne || !nb || !off || !f->g) {
        rl_errf(err, "out of memory");
        goto done;
    }
    bool shapes = n > 0;
    for (int i = 0; i < n; i++) ts[i] = &m->tensors[i], shapes &= m->tensors[i].data == NULL;
    if (!shapes && manifest_hash_tensors(ts, n, n_threads, progress ? "manifest" : NULL, hs) != 0) {
        rl_errf(err, "out of memory");
        goto done;
    }
    gguf_set_kv(f->g, m->meta);
    gguf_remove_key(f->g, "split.no");
    gguf_remove_key(f->g, "split.count");
    gguf_remove_key(f->g, "split.tensors.count");
    for (int i = 0; i < n; i++) {
        const mf_tensor *t = &m->tensors[i];
        names[i] = t->name;
        ty[i] = (uint32_t)t->type;
        nd[i] = (uint32_t)t->n_dims;
        memcpy(ne + 4 * (size_t)i, t->ne, 32);
        nb[i] = t->nbytes;
        fi[i] = (uint32_t)t->split;
        off[i] = t->offset;
    }
    for (int s = 0; s < m->n_split; s++) files[s] = manifest_base(m->splits[s].path);
    gguf_set_val_u32(f->g, K("version"), MANIFEST_FILE_VERSION);
    if (shapes) gguf_set_val_bool(f->g, K("shape_only"), true);
    gguf_set_arr_str(f->g, K("files"), files, (size_t)m->n_split);
    gguf_set_arr_str(f->g, K("names"), names, (size_t)n);
    gguf_set_arr_data(f->g, K("types"), GGUF_TYPE_UINT32, ty, (size_t)n);
    gguf_set_arr_data(f->g, K("n_dims"), GGUF_TYPE_UINT32, nd, (size_t)n);
    gguf_set_arr_data(f->g, K("ne"), GGUF_TYPE_INT64, ne, (size_t)n * 4);
    gguf_set_arr_data(f->g, K("nbytes"), GGUF_TYPE_UINT64, nb, (size_t)n);
    gguf_set_arr_data(f->g, K("file"), GGUF_TYPE_UINT32, fi, (size_t)n);
    gguf_set_arr_data(f->g, K("offset"), GGUF_TYPE_UINT64, off, (size_t)n);
    gguf_set_arr_data(f->g, K("hash"), GGUF_TYPE_UINT8, hs, (size_t)n * 32);
    /* Re-read from the context just written, so a built manifest and a read one are the same object. */
    char tmp[] = "/tmp/ringlm-manifest-XXXXXX";
    int fd = mkstemp(tmp);
    if (fd < 0) {
        rl_errf(err, "cannot make a temporary file: %s", strerror(errno));
        goto done;
    }
    close(fd);
    rc = manifest_file_write(f, tmp, err);
    gguf_free(f->g);
    f->g = NULL;
    if (rc == 0) rc = manifest_file_read(f, tmp, err);
    remove(tmp);
done:
    if (rc != 0) manifest_file_free(f);
    free(ts);
    free(hs);
    free(names);
    free(files);
    free(ty);
    free(nd);
    free(fi);
    free(ne);
    free(nb);
    free(off);
    return rc;
}

int manifest_file_write(const manifest_file *f, const char *path, rl_err *err) {
    FILE *fp = fopen(path, "wb");
    if (!fp) return rl_errf(err, "cannot create %s: %s", path, strerror(errno));
    int rc = gguf_write_to_file_ptr(f->g, fp, true) ? 0 : rl_errf(err, "cannot write %s", path);
    if (fclose(fp) != 0 && rc == 0) rc = rl_errf(err, "cannot write %s: %s", path, strerror(errno));
    if (rc != 0) remove(path);
    return rc;
}

/* The array at key: of type t and exactly n elements, or NULL (err says which key). */
static const void *manifest_arr(const struct gguf_context *g, const char *key, enum gguf_type t, size_t n, rl_err *err) {
    int64_t id = gguf_find_key(g, key);
    if (id < 0 || gguf_get_kv_type(g, id) != GGUF_TYPE_ARRAY || gguf_get_arr_type(g, id) != t ||
        gguf_get_arr_n(g, id) != n) {
        rl_errf(err, "manifest: %s missing, or not %zu elements of %s", key, n, gguf_type_name(t));
        return NULL;
    }
    return t == GGUF_TYPE_STRING ? (const void *)g : gguf_get_arr_data(g, id);
}

bool manifest_file_is(const char *path) {
    struct gguf_init_params ip = {.no_alloc = true, .ctx = NULL};
    struct gguf_context *g = gguf_init_from_file(path, ip);
    bool is = g && gguf_find_key(g, K("version")) >= 0;
    if (g) gguf_free(g);
    return is;
}

int manifest_file_read(manifest_file *f, const char *path, rl_err *err) {
    memset(f, 0, sizeof *f);
    FILE *probe = fopen(path, "rb");
    if (!probe) return rl_errf(err, "cannot open manifest %s: %s", path, strerror(errno));
    fclose(probe);
    struct gguf_init_params ip = {.no_alloc = true, .ctx = NULL};
    f->g = gguf_init_from_file(path, ip);
    if (!f->g) return rl_errf(err, "%s: not a GGUF file (a manifest is one), or a damaged one", path);
    struct gguf_context *g = f->g;
    int64_t vid = gguf_find_key(g, K("version")), nid = gguf_find_key(g, K("names"));
    int64_t lid = gguf_find_key(g, K3_ARCH ".block_count");
    if (vid < 0 || gguf_get_kv_type(g, vid) != GGUF_TYPE_UINT32 || gguf_get_val_u32(g, vid) != MANIFEST_FILE_VERSION) {
        manifest_file_free(f);
        return rl_errf(err, "%s: not a ringlm manifest (version %d)", path, MANIFEST_FILE_VERSION);
    }
    if (nid < 0 || gguf_get_kv_type(g, nid) != GGUF_TYPE_ARRAY || gguf_get_arr_type(g, nid) != GGUF_TYPE_STRING ||
        lid < 0 || gguf_get_kv_type(g, lid) != GGUF_TYPE_UINT32) {
        manifest_file_free(f);
        return rl_errf(err, "%s: manifest without tensor names or %s.block_count", path, K3_ARCH);
    }
    const size_t n = gguf_get_arr_n(g, nid);
    f->n_layer = gguf_get_val_u32(g, lid);
    int64_t fid = gguf_find_key(g, K("files"));
    size_t n_files = fid >= 0 && gguf_get_kv_type(g, fid) == GGUF_TYPE_ARRAY ? gguf_get_arr_n(g, fid) : 0;
    const uint32_t *ty = manifest_arr(g, K("types"), GGUF_TYPE_UINT32, n, err);
    const uint32_t *nd = ty ? manifest_arr(g, K("n_dims"), GGUF_TYPE_UINT32, n, err) : NULL;
    const int64_t *ne = nd ? manifest_arr(g, K("ne"), GGUF_TYPE_INT64, n * 4, err) : NULL;
    const uint64_t *nb = ne ? manifest_arr(g, K("nbytes"), GGUF_TYPE_UINT64, n, err) : NULL;
    const uint32_t *fi = nb ? manifest_arr(g, K("file"), GGUF_TYPE_UINT32, n, err) : NULL;
    const uint64_t *off = fi ? manifest_arr(g, K("offset"), GGUF_TYPE_UINT64, n, err) : NULL;
    const uint8_t *hs = off ? manifest_arr(g, K("hash"), GGUF_TYPE_UINT8, n * 32, err) : NULL;
    if (!hs || n_files == 0 || n > (1u << 24)) {
        if (hs) rl_errf(err, "manifest: no split file names, or an absurd tensor count");
        rl_err_prefix(err, path);
        manifest_file_free(f);
        return -1;
    }
    int64_t sid = gguf_find_key(g, K("shape_only"));
    f->shape_only = sid >= 0 && gguf_get_kv_type(g, sid) == GGUF_TYPE_BOOL && gguf_get_val_bool(g, sid);
    f->t = calloc(n + 1, sizeof *f->t);
    if (!f->t) {
        manifest_file_free(f);
        return rl_errf(err, "out of memory");
    }
    f->n = (int)n;
    for (size_t i = 0; i < n; i++) {
        manifest_tensor *t = &f->t[i];
        t->name = gguf_get_arr_str(g, nid, i);
        t->type = (int)ty[i];
        t->n_dims = (int)nd[i];
        memcpy(t->ne, ne + 4 * i, 32);
        t->nbytes = nb[i];
        t->file = fi[i];
        t->offset = off[i];
        memcpy(t->hash, hs + 32 * i, 32);
        bool ok = ty[i] < GGML_TYPE_COUNT && ggml_blck_size((enum ggml_type)ty[i]) > 0 && nd[i] >= 1 && nd[i] <= 4 &&
                  fi[i] < n_files;
        for (int d = 0; ok && d < 4; d++) ok = ne[4 * i + d] >= 1 && ne[4 * i + d] < (1ll << 40);
        if (ok) {
            ok = ne[4 * i] % ggml_blck_size((enum ggml_type)ty[i]) == 0 &&
                 ggml_row_size((enum ggml_type)ty[i], ne[4 * i]) * (uint64_t)(ne[4 * i + 1] * ne[4 * i + 2] * ne[4 * i + 3]) ==
                     nb[i];
        }
        if (!ok) {
            rl_errf(err, "%s: tensor %zu (%s): type, shape, size or file do not add up", path, i, t->name);
            manifest_file_free(f);
            return -1;
        }
    }
    return 0;
}

int manifest_file_range_hash(const manifest_file *f, uint32_t a, uint32_t b, uint8_t out[32], rl_err *err) {
    manifest_tensor *d = calloc((size_t)f->n + 1, sizeof *d);
    if (!d) return rl_errf(err, "out of memory");
    int n = 0;
    for (int i = 0; i < f->n; i++) {
        if (manifest_tensor_in_range(f->t[i].name, a, b, f->n_layer)) d[n++] = f->t[i];
    }
    int rc = manifest_hash_descs(f->g, f->n_layer, a, b, d, n, out, err);
    free(d);
    return rc;
}

int manifest_file_check(const manifest_file *f, const char *const *paths, int n_paths, FILE *problems, FILE *absent,
                    long *n_bad, rl_err *err) {
    *n_bad = 0;
    int64_t fid = gguf_find_key(f->g, K("files"));
    const size_t n_files = gguf_get_arr_n(f->g, fid);
    bool *given = calloc(n_files + 1, 1);
    if (!given) return rl_errf(err, "out of memory");
    for (int p = 0; p < n_paths; p++) {
        const char *path = paths[p];
        size_t fi = n_files;
        for (size_t k = 0; k < n_files; k++) {
            if (strcmp(gguf_get_arr_str(f->g, fid, k), manifest_base(path)) == 0) fi = k;
        }
        if (fi == n_files) {
            fprintf(problems, "%s: not a file of this model (its manifest lists %zu other%s)\n", path, n_files,
                    n_files == 1 ? "" : "s");
            (*n_bad)++;
            continue;
        }
        given[fi] = true;
        struct gguf_init_params ip = {.no_alloc = true, .ctx = NULL};
        struct gguf_context *g = gguf_init_from_file(path, ip);
        FILE *fp = g ? fopen(path, "rb") : NULL;
        if (!g || !fp) {
            fprintf(problems, "%s: cannot be read as GGUF\n", path);
            (*n_bad)++;
            if (g) gguf_free(g);
            continue;
        }
        const size_t data0 = gguf_get_data_offset(g);
        int listed = 0;
        for (int i = 0; i < f->n; i++) {
            const manifest_tensor *t = &f->t[i];
            if (t->file != fi) continue;
            listed++;
            int64_t ti = gguf_find_tensor(g, t->name);
            if (ti < 0) {
                fprintf(problems, "%s: tensor %s missing\n", path, t->name);
                (*n_bad)++;
                continue;
            }
            if ((int)gguf_get_tensor_type(g, ti) != t->type || gguf_get_tensor_size(g, ti) != t->nbytes ||
                data0 + gguf_get_tensor_offset(g, ti) != t->offset) {
                fprintf(problems, "%s: tensor %s: type, size or place differ from the manifest\n", path, t->name);
                (*n_bad)++;
                continue;
            }
            /* Read and hash in pieces: a K3 expert tensor is gigabytes. */
            crypto_generichash_state h;
            crypto_generichash_init(&h, NULL, 0, 32);
            static const size_t piece = 1 << 22;
            unsigned char *buf = malloc(piece);
            bool ok = buf && fseeko(fp, (off_t)t->offset, SEEK_SET) == 0;
            for (uint64_t left = t->nbytes; ok && left > 0;) {
                size_t want = left < piece ? (size_t)left : piece;
                ok = fread(buf, 1, want, fp) == want;
                if (ok) crypto_generichash_update(&h, buf, want);
                left -= want;
            }
            free(buf);
            uint8_t got[32];
            crypto_generichash_final(&h, got, 32);
            if (!ok) {
                fprintf(problems, "%s: tensor %s: its bytes cannot be read (a truncated file?)\n", path, t->name);
                (*n_bad)++;
            } else if (memcmp(got, t->hash, 32) != 0) {
                fprintf(problems, "%s: tensor %s: its bytes do not hash as the manifest says (a damaged or other file)\n",
                        path, t->name);
                (*n_bad)++;
            }
        }
        if (gguf_get_n_tensors(g) != listed) {
            fprintf(problems, "%s: %lld tensors, the manifest places %d in it\n", path, (long long)gguf_get_n_tensors(g),
                    listed);
            (*n_bad)++;
        }
        fclose(fp);
        gguf_free(g);
    }
    for (size_t k = 0; absent && k < n_files; k++) {
        if (!given[k]) fprintf(absent, "%s\n", gguf_get_arr_str(f->g, fid, k));
    }
    free(given);
    return 0;
}

int manifest_file_need_hashes(const manifest_file *f, const char *what, rl_err *err) {
    if (!f->shape_only) return 0;
    return rl_errf(err, "a shape-only manifest (synth --shape-only) has no tensor hashes: it plans rings, it cannot %s", what);
}

uint32_t manifest_file_n_files(const manifest_file *f) {
    return (uint32_t)gguf_get_arr_n(f->g, gguf_find_key(f->g, K("files")));
}

const char *manifest_file_name(const manifest_file *f, uint32_t k) {
    return gguf_get_arr_str(f->g, gguf_find_key(f->g, K("files")), k);
}

void manifest_file_range_files(const manifest_file *f, uint32_t a, uint32_t b, bool *need) {
    memset(need, 0, manifest_file_n_files(f));
    for (int i = 0; i < f->n; i++) need[f->t[i].file] |= manifest_tensor_in_range(f->t[i].name, a, b, f->n_layer);
}

struct gguf_context *manifest_file_meta(const manifest_file *f) {
    struct gguf_context *g = gguf_init_empty();
    if (!g) return NULL;
    gguf_set_kv(g, f->g);
    static const char *const own[] = {K("shape_only"), K("version"), K("names"), K("types"), K("n_dims"), K("ne"), K("nbytes"),
                                      K("file"), K("offset"), K("hash"), K("files")};
    for (size_t i = 0; i < sizeof own / sizeof *own; i++) gguf_remove_key(g, own[i]);
    return g;
}

int manifest_file_model(const manifest_file *f, mf_model *m, rl_err *err) {
    struct gguf_context *meta = manifest_file_meta(f);
    if (!meta) return rl_errf(err, "out of memory");
    if (mf_compose(m, meta, f->n, err) != 0) return -1;
    for (int i = 0; i < f->n; i++) {
        const manifest_tensor *t = &f->t[i];
        mf_tensor mt = {.name = t->name, .type = t->type, .n_dims = t->n_dims, .nbytes = t->nbytes, .split = 0};
        memcpy(mt.ne, t->ne, sizeof mt.ne);
        if (mf_compose_tensor(m, &mt, err) != 0) {
            mf_close(m);
            return -1;
        }
    }
    return 0;
}

void manifest_file_free(manifest_file *f) {
    if (f->g) gguf_free(f->g);
    free(f->t);
    memset(f, 0, sizeof *f);
}
