#include "model_file.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ggml.h"
#include "gguf.h"

/* ggml reports why gguf parsing failed only through its logger. We capture the last error line while
 * we parse, so the user sees "gguf: ... tensor 'x' has invalid ggml type 99" and not just "failed". */
typedef struct mf_logcap {
    char last[512];
} mf_logcap;

static void mf_log_cb(enum ggml_log_level level, const char *text, void *user) {
    mf_logcap *cap = user;
    if (level == GGML_LOG_LEVEL_ERROR || level == GGML_LOG_LEVEL_WARN) {
        snprintf(cap->last, sizeof cap->last, "%s", text);
        size_t n = strlen(cap->last);
        while (n && (cap->last[n - 1] == '\n' || cap->last[n - 1] == ' ')) cap->last[--n] = 0;
    }
}

static int mf_open_split(mf_split *s, const char *path, rl_err *err) {
    memset(s, 0, sizeof *s);
    s->path = strdup(path);
    if (!s->path) return rl_errf(err, "out of memory");
    int fd = open(path, O_RDONLY);
    if (fd < 0) return rl_errf(err, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return rl_errf(err, "%s: not a regular file", path);
    }
    s->size = (size_t)st.st_size;
    if (s->size < 8) {
        close(fd);
        return rl_errf(err, "%s: truncated: %zu bytes, too short for a GGUF header", path, s->size);
    }
    s->map = mmap(NULL, s->size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (s->map == MAP_FAILED) {
        s->map = NULL;
        return rl_errf(err, "%s: mmap failed: %s", path, strerror(errno));
    }
    if (memcmp(s->map, "GGUF", 4) != 0) {
        return rl_errf(err, "%s: bad magic (not a GGUF file)", path);
    }
    uint32_t version;
    memcpy(&version, (const char *)s->map + 4, 4);
    if (version != 2 && version != 3) {
        return rl_errf(err, "%s: unsupported GGUF version %u (this build reads 2 and 3)", path, version);
    }

    mf_logcap cap = {{0}};
    ggml_log_callback old_cb;
    void *old_ud;
    ggml_log_get(&old_cb, &old_ud);
    ggml_log_set(mf_log_cb, &cap);
    struct gguf_init_params gp = {.no_alloc = true, .ctx = NULL};
    s->gguf = gguf_init_from_buffer(s->map, s->size, gp);
    ggml_log_set(old_cb, old_ud);
    if (!s->gguf) {
        return rl_errf(err, "%s: invalid GGUF: %s", path, cap.last[0] ? cap.last : "unreadable header");
    }
    s->data_offset = gguf_get_data_offset(s->gguf);
    return 0;
}

static void mf_close_split(mf_split *s) {
    if (s->gguf) gguf_free(s->gguf);
    if (s->map) munmap(s->map, s->size);
    free(s->path);
    memset(s, 0, sizeof *s);
}

/* Finds "-NNNNN-of-MMMMM.gguf" at the end of path. Returns the count M (0 if path is not a split name),
 * and the length of the prefix before it. */
static int mf_split_name(const char *path, size_t *prefix_len) {
    size_t n = strlen(path);
    const char *suffix = "-00000-of-00000.gguf";
    size_t sl = strlen(suffix);
    if (n < sl) return 0;
    const char *p = path + n - sl;
    int no, count;
    char tail[8];
    if (sscanf(p, "-%5d-of-%5d%7s", &no, &count, tail) != 3 || strcmp(tail, ".gguf") != 0) return 0;
    if (count < 1 || no < 1 || no > count) return 0;
    *prefix_len = (size_t)(p - path);
    return count;
}

static int mf_kv_u16(const struct gguf_context *g, const char *key, int *out) {
    int64_t id = gguf_find_key(g, key);
    if (id < 0) return 1;
    enum gguf_type t = gguf_get_kv_type(g, id);
    if (t == GGUF_TYPE_UINT16) *out = gguf_get_val_u16(g, id);
    else if (t == GGUF_TYPE_INT32) *out = gguf_get_val_i32(g, id);
    else if (t == GGUF_TYPE_UINT32) *out = (int)gguf_get_val_u32(g, id);
    else return -1;
    return 0;
}

/* Builds the tensor table and checks every data range lies inside its file. */
static int mf_index(mf_model *m, rl_err *err) {
    int64_t total = 0;
    for (int s = 0; s < m->n_split; s++) total += gguf_get_n_tensors(m->splits[s].gguf);
    if (total > INT_MAX / 2) return rl_errf(err, "%s: absurd tensor count %lld", m->splits[0].path, (long long)total);
    m->tensors = calloc((size_t)total + 1, sizeof *m->tensors);
    if (!m->tensors) return rl_errf(err, "out of memory for %lld tensors", (long long)total);
    for (int s = 0; s < m->n_split; s++) {
        mf_split *sp = &m->splits[s];
        int64_t n = gguf_get_n_tensors(sp->gguf);
        for (int64_t i = 0; i < n; i++) {
            mf_tensor *t = &m->tensors[m->n_tensor];
            t->name = gguf_get_tensor_name(sp->gguf, i);
            t->type = gguf_get_tensor_type(sp->gguf, i);
            const int64_t *ne = gguf_get_tensor_ne(sp->gguf, i);
            t->n_dims = 1;
            for (int d = 0; d < 4; d++) {
                t->ne[d] = ne[d];
                if (ne[d] != 1) t->n_dims = d + 1;
            }
            t->nbytes = gguf_get_tensor_size(sp->gguf, i);
            t->split = s;
            size_t rel = gguf_get_tensor_offset(sp->gguf, i);
            if (sp->data_offset > sp->size || rel > sp->size - sp->data_offset ||
                t->nbytes > sp->size - sp->data_offset - rel) {
                return rl_errf(err,
                               "%s: truncated: tensor '%s' needs bytes up to %zu but the file has %zu",
                               sp->path, t->name, sp->data_offset + rel + t->nbytes, sp->size);
            }
            t->offset = sp->data_offset + rel;
            t->data = (const char *)sp->map + t->offset;
            m->tensor_bytes += t->nbytes;
            for (int j = 0; j < m->n_tensor; j++) {
                if (m->tensors[j].split != s && strcmp(m->tensors[j].name, t->name) == 0) {
                    return rl_errf(err, "split set: tensor '%s' is in both %s and %s", t->name,
                                   m->splits[m->tensors[j].split].path, sp->path);
                }
            }
            m->n_tensor++;
        }
    }
    return 0;
}

int mf_open(mf_model *m, const char *path, rl_err *err) {
    memset(m, 0, sizeof *m);
    size_t prefix_len = 0;
    int count = mf_split_name(path, &prefix_len);
    if (count < 1) count = 1;
    m->splits = calloc((size_t)count, sizeof *m->splits);
    if (!m->splits) return rl_errf(err, "out of memory");
    if (count == 1 && prefix_len == 0) {
        m->n_split = 1;
        if (mf_open_split(&m->splits[0], path, err) != 0) goto fail;
        int sc = 1, no = 0;
        if (mf_kv_u16(m->splits[0].gguf, "split.count", &sc) == 0 && sc > 1) {
            mf_kv_u16(m->splits[0].gguf, "split.no", &no);
            rl_errf(err, "%s: is part %d of a %d-file split set, but its name lacks -NNNNN-of-NNNNN.gguf", path,
                    no + 1, sc);
            goto fail;
        }
    } else {
        for (int i = 0; i < count; i++) {
            char *p = malloc(prefix_len + 32);
            if (!p) {
                rl_errf(err, "out of memory");
                goto fail;
            }
            snprintf(p, prefix_len + 32, "%.*s-%05d-of-%05d.gguf", (int)prefix_len, path, i + 1, count);
            m->n_split = i + 1;
            int rc = mf_open_split(&m->splits[i], p, err);
            free(p);
            if (rc != 0) {
                rl_err_prefix(err, "split set member %d of %d", i + 1, count);
                goto fail;
            }
            int no = -1, sc = -1;
            if (mf_kv_u16(m->splits[i].gguf, "split.no", &no) != 0 ||
                mf_kv_u16(m->splits[i].gguf, "split.count", &sc) != 0) {
                rl_errf(err, "%s: split set member without valid split.no / split.count keys", m->splits[i].path);
                goto fail;
            }
            if (no != i || sc != count) {
                rl_errf(err, "%s: inconsistent split set: file says it is part %d of %d, its name says %d of %d",
                        m->splits[i].path, no + 1, sc, i + 1, count);
                goto fail;
            }
        }
    }
    m->meta = m->splits[0].gguf;
    if (mf_index(m, err) != 0) goto fail;
    if (count > 1) {
        int want = -1;
        if (mf_kv_u16(m->meta, "split.tensors.count", &want) == 0 && want != m->n_tensor) {
            rl_errf(err, "inconsistent split set: %d tensors in %d files, split.tensors.count says %d", m->n_tensor,
                    count, want);
            goto fail;
        }
    }
    return 0;
fail:
    mf_close(m);
    return -1;
}

void mf_close(mf_model *m) {
    for (int i = 0; i < m->n_split; i++) mf_close_split(&m->splits[i]);
    for (int i = 0; m->own_names && i < m->n_tensor; i++) free((char *)m->tensors[i].name);
    free(m->splits);
    free(m->tensors);
    memset(m, 0, sizeof *m);
}

int mf_compose(mf_model *m, struct gguf_context *meta, int max_tensors, rl_err *err) {
    memset(m, 0, sizeof *m);
    m->splits = calloc(1, sizeof *m->splits);
    m->tensors = calloc((size_t)(max_tensors > 0 ? max_tensors : 1), sizeof *m->tensors);
    if (!m->splits || !m->tensors) {
        free(m->splits);
        free(m->tensors);
        gguf_free(meta);
        memset(m, 0, sizeof *m);
        return rl_errf(err, "out of memory");
    }
    m->n_split = 1;
    m->splits[0].gguf = meta;
    m->splits[0].path = strdup("(metadata)");
    m->meta = meta;
    m->cap_tensor = max_tensors > 0 ? max_tensors : 1;
    m->own_names = true;
    return 0;
}

int mf_compose_file(mf_model *m, const char *path, bool is_gguf, int *index, rl_err *err) {
    mf_split *ns = realloc(m->splits, (size_t)(m->n_split + 1) * sizeof *ns);
    if (!ns) return rl_errf(err, "out of memory");
    m->splits = ns;
    mf_split *s = &m->splits[m->n_split];
    int rc;
    if (is_gguf) {
        rc = mf_open_split(s, path, err);
    } else { /* raw bytes: a tensor a node was streamed */
        memset(s, 0, sizeof *s);
        rc = -1;
        int fd = open(path, O_RDONLY);
        struct stat st;
        if (fd < 0) {
            rl_errf(err, "cannot open %s: %s", path, strerror(errno));
        } else if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size == 0) {
            rl_errf(err, "%s: not a regular, non-empty file", path);
        } else if ((s->map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0)) == MAP_FAILED) {
            s->map = NULL;
            rl_errf(err, "%s: mmap failed: %s", path, strerror(errno));
        } else {
            s->size = (size_t)st.st_size;
            rc = (s->path = strdup(path)) ? 0 : rl_errf(err, "out of memory");
        }
        if (fd >= 0) close(fd);
    }
    if (rc != 0) {
        mf_close_split(s);
        return -1;
    }
    *index = m->n_split++;
    return 0;
}

int mf_compose_tensor(mf_model *m, const mf_tensor *t, rl_err *err) {
    if (m->n_tensor >= m->cap_tensor) return rl_errf(err, "composed model: more than %d tensors", m->cap_tensor);
    if (t->split < 0 || t->split >= m->n_split) return rl_errf(err, "tensor '%s': no such file", t->name);
    const mf_split *s = &m->splits[t->split];
    if (s->map && (t->offset > s->size || t->nbytes > s->size - t->offset)) {
        return rl_errf(err, "%s: truncated: tensor '%s' needs bytes up to %zu but the file has %zu", s->path, t->name,
                       t->offset + t->nbytes, s->size);
    }
    mf_tensor *d = &m->tensors[m->n_tensor];
    *d = *t;
    d->name = strdup(t->name);
    if (!d->name) return rl_errf(err, "out of memory");
    d->data = s->map ? (const char *)s->map + t->offset : NULL;
    m->tensor_bytes += t->nbytes;
    m->n_tensor++;
    return 0;
}

const mf_tensor *mf_find(const mf_model *m, const char *name) {
    for (int i = 0; i < m->n_tensor; i++) {
        if (strcmp(m->tensors[i].name, name) == 0) return &m->tensors[i];
    }
    return NULL;
}

/* Looks up key; returns its id, or -1 when absent (and sets err when required). */
static int64_t mf_key(const mf_model *m, const char *key, bool required, rl_err *err, int *rc) {
    int64_t id = gguf_find_key(m->meta, key);
    if (id < 0) *rc = required ? rl_errf(err, "missing metadata key %s", key) : 1;
    return id;
}

static int mf_wrong_type(const mf_model *m, int64_t id, const char *key, const char *want, rl_err *err) {
    return rl_errf(err, "metadata key %s has wrong type %s (expected %s)", key,
                   gguf_type_name(gguf_get_kv_type(m->meta, id)), want);
}

int mf_get_u32(const mf_model *m, const char *key, uint32_t *out, bool required, rl_err *err) {
    int rc = 0;
    int64_t id = mf_key(m, key, required, err, &rc);
    if (id < 0) return rc;
    if (gguf_get_kv_type(m->meta, id) != GGUF_TYPE_UINT32) return mf_wrong_type(m, id, key, "u32", err);
    *out = gguf_get_val_u32(m->meta, id);
    return 0;
}

int mf_get_f32(const mf_model *m, const char *key, float *out, bool required, rl_err *err) {
    int rc = 0;
    int64_t id = mf_key(m, key, required, err, &rc);
    if (id < 0) return rc;
    if (gguf_get_kv_type(m->meta, id) != GGUF_TYPE_FLOAT32) return mf_wrong_type(m, id, key, "f32", err);
    *out = gguf_get_val_f32(m->meta, id);
    return 0;
}

int mf_get_bool(const mf_model *m, const char *key, bool *out, bool required, rl_err *err) {
    int rc = 0;
    int64_t id = mf_key(m, key, required, err, &rc);
    if (id < 0) return rc;
    if (gguf_get_kv_type(m->meta, id) != GGUF_TYPE_BOOL) return mf_wrong_type(m, id, key, "bool", err);
    *out = gguf_get_val_bool(m->meta, id);
    return 0;
}

int mf_get_str(const mf_model *m, const char *key, const char **out, bool required, rl_err *err) {
    int rc = 0;
    int64_t id = mf_key(m, key, required, err, &rc);
    if (id < 0) return rc;
    if (gguf_get_kv_type(m->meta, id) != GGUF_TYPE_STRING) return mf_wrong_type(m, id, key, "string", err);
    *out = gguf_get_val_str(m->meta, id);
    return 0;
}

int mf_get_u32_or_arr(const mf_model *m, const char *key, uint32_t *out, size_t n, bool required, rl_err *err) {
    int rc = 0;
    int64_t id = mf_key(m, key, required, err, &rc);
    if (id < 0) return rc;
    enum gguf_type t = gguf_get_kv_type(m->meta, id);
    if (t == GGUF_TYPE_UINT32) {
        uint32_t v = gguf_get_val_u32(m->meta, id);
        for (size_t i = 0; i < n; i++) out[i] = v;
        return 0;
    }
    if (t != GGUF_TYPE_ARRAY) return mf_wrong_type(m, id, key, "u32 or array", err);
    enum gguf_type at = gguf_get_arr_type(m->meta, id);
    if (at != GGUF_TYPE_UINT32 && at != GGUF_TYPE_INT32) {
        return rl_errf(err, "metadata key %s is an array of %s (expected u32 or i32)", key, gguf_type_name(at));
    }
    if (gguf_get_arr_n(m->meta, id) != n) {
        return rl_errf(err, "metadata key %s has %zu elements, expected %zu (one per layer)", key,
                       gguf_get_arr_n(m->meta, id), n);
    }
    const uint32_t *a = gguf_get_arr_data(m->meta, id);
    for (size_t i = 0; i < n; i++) {
        if (at == GGUF_TYPE_INT32 && (int32_t)a[i] < 0) {
            return rl_errf(err, "metadata key %s element %zu is negative", key, i);
        }
        out[i] = a[i];
    }
    return 0;
}
