/* range_parts.c - a node's range from its split files, its store and pulls from holders (range_parts.h). */
#include "range_parts.h"
#include "../base/clock.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cJSON.h>
#include <sodium.h>
#include <zmq.h>

#include "../base/file.h"
#include "../gen/emit.h"
#include "../trust/manifest.h"
#include "../wire/frame.h"
#include "ggml.h"
#include "gguf.h"
#include "../net/zsock.h"

#define PARTS_CHUNK (4u << 20)  /* bytes one PULL asks for */
#define PARTS_IN_FLIGHT 8       /* PULLs outstanding on one link */
#define PARTS_MAX_READ (64u << 20)

/* A split file's name as a manifest lists it: no folders, no hidden files, *.gguf. */
static bool parts_plain_name(const char *name) {
    size_t n = strlen(name);
    return n > 5 && n < 256 && name[0] != '.' && !strchr(name, '/') && strcmp(name + n - 5, ".gguf") == 0;
}

int parts_read(const char *models_dir, const char *name, uint64_t off, size_t len, void *buf, rl_err *err) {
    if (!models_dir) return rl_errf(err, "this node has no --models folder to lend files from");
    if (!parts_plain_name(name)) return rl_errf(err, "'%.80s' is not a split file name", name);
    if (len > PARTS_MAX_READ) return rl_errf(err, "a read of %zu bytes is too large (at most %u)", len, PARTS_MAX_READ);
    char path[1400];
    snprintf(path, sizeof path, "%s/%s", models_dir, name);
    int fd = open(path, O_RDONLY);
    if (fd < 0) return rl_errf(err, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        rc = rl_errf(err, "%s: not a regular file", path);
    } else if (off > (uint64_t)st.st_size || len > (uint64_t)st.st_size - off) {
        rc = rl_errf(err, "%s: %zu bytes at %" PRIu64 " lie past its end (%lld bytes)", path, len, off,
                     (long long)st.st_size);
    }
    for (size_t done = 0; rc == 0 && done < len;) {
        ssize_t r = pread(fd, (char *)buf + done, len - done, (off_t)(off + done));
        if (r <= 0) rc = rl_errf(err, "%s: read failed: %s", path, r < 0 ? strerror(errno) : "unexpected end");
        else done += (size_t)r;
    }
    close(fd);
    return rc;
}

/* ---- what this node verified before ------------------------------------------------------------ */

/* One line per local tensor whose bytes matched a manifest: "<blake2b hex> <file size> <mtime ns> <offset>
 * <file name>". A line holds only while the file keeps its size and mtime, so a file replaced or touched is
 * checked again; a tensor of another model (another hash) never matches. */
static void parts_verified_line(char *buf, size_t n, const manifest_tensor *t, const char *name, const struct stat *st) {
    char hex[65];
    sodium_bin2hex(hex, sizeof hex, t->hash, 32);
    snprintf(buf, n, "%s %lld %lld %" PRIu64 " %s\n", hex, (long long)st->st_size,
             (long long)st->st_mtim.tv_sec * 1000000000ll + st->st_mtim.tv_nsec, t->offset, name);
}

static bool parts_verified(const char *cache, const char *line) {
    if (!cache) return false;
    size_t ll = strlen(line);
    for (const char *p = cache; (p = strstr(p, line)) != NULL; p++) {
        if (p == cache || p[-1] == '\n') return true;
        if (!p[ll - 1]) break;
    }
    return false;
}

/* ---- pulls ----------------------------------------------------------------------------------- */

typedef struct parts_link {
    void *sock;
    uint64_t next_step;
} parts_link;

static int parts_send_pull(parts_link *l, const parts_opts *o, const char *file, uint64_t off, uint32_t len, rl_err *err) {
    char js[400];
    int jl = snprintf(js, sizeof js, "{\"file\":\"%s\",\"offset\":%" PRIu64 ",\"len\":%u}", file, off, len);
    frame_header h = {.type = FRAME_PULL, .ring_id = o->ring_id, .step_id = l->next_step++, .payload_bytes = (uint64_t)jl};
    uint8_t hb[256];
    frame_header_encode(&h, hb);
    const void *parts[2] = {hb, js};
    size_t lens[2] = {frame_header_size(0), (size_t)jl};
    return zs_send(l->sock, parts, lens, 2, true, err);
}

/* Streams tensor t from holder h into dst (via dst.part), checking its BLAKE2b against the manifest's. */
static int parts_pull(const parts_opts *o, const manifest_file *f, const parts_holder *h, parts_link *l, const manifest_tensor *t,
                   const char *dst, rl_err *err) {
    const char *file = manifest_file_name(f, t->file);
    if (!l->sock) {
        char rid[80];
        snprintf(rid, sizeof rid, "pull-%.16s-%08x", o->id->pk_hex, randombytes_random());
        l->sock = zs_client(o->zctx, o->tn, h->addr, o->id, h->key.curve_pk_z85, rid, ZS_LINK_SLOW_S, err); /* a bulk transfer: no hurry */
        if (!l->sock) return rl_err_prefix(err, "node %s", h->addr);
        l->next_step = 1;
        if (!zs_wait_writable(l->sock, 10000)) {
            return rl_errf(err, "cannot connect to node %s within 10 s to fetch tensor %s", h->addr, t->name);
        }
    }
    char tmp[1200];
    snprintf(tmp, sizeof tmp, "%s.part", dst);
    FILE *out = fopen(tmp, "wb");
    if (!out) return rl_errf(err, "cannot create %s: %s", tmp, strerror(errno));
    crypto_generichash_state hs;
    crypto_generichash_init(&hs, NULL, 0, 32);
    const double timeout = o->timeout_s > 0 ? o->timeout_s : 60;
    const uint64_t first = l->next_step;
    uint64_t asked = 0, got = 0, expect = first;
    int in_flight = 0, rc = 0;
    double last = rl_clock_now();
    while (rc == 0 && got < t->nbytes) {
        while (rc == 0 && in_flight < PARTS_IN_FLIGHT && asked < t->nbytes) {
            uint32_t len = t->nbytes - asked < PARTS_CHUNK ? (uint32_t)(t->nbytes - asked) : PARTS_CHUNK;
            rc = parts_send_pull(l, o, file, t->offset + asked, len, err);
            asked += len;
            in_flight++;
        }
        if (rc != 0) break;
        zmq_pollitem_t it = {l->sock, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 100) < 0 && errno != EINTR) {
            rc = rl_errf(err, "poll failed: %s", zmq_strerror(errno));
            break;
        }
        if (gen_sigint_pending()) {
            rc = rl_errf(err, "interrupted");
            break;
        }
        if (!(it.revents & ZMQ_POLLIN)) {
            if (rl_clock_now() - last > timeout) {
                rc = rl_errf(err, "node %s sent nothing for %.0f s while streaming tensor %s of %s", h->addr, timeout,
                             t->name, file);
            }
            continue;
        }
        for (;;) {
            zs_parts p;
            int r = zs_recv(l->sock, &p, err);
            if (r == 1) break;
            if (r < 0) {
                rc = -1;
                break;
            }
            last = rl_clock_now();
            frame_header rh;
            rl_err e2;
            if (p.n < 2 || frame_header_decode(&rh, p.data[0], p.len[0], &e2) != 0) {
                rc = rl_errf(err, "node %s sent a malformed frame while streaming tensor %s", h->addr, t->name);
            } else if (rh.type == FRAME_ERROR) {
                cJSON *j = cJSON_ParseWithLength(p.data[1], p.len[1]);
                const char *msg = j ? cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "msg")) : NULL;
                rc = rl_errf(err, "node %s refused to stream tensor %s of %s: %s", h->addr, t->name, file,
                             msg ? msg : "(unreadable error)");
                cJSON_Delete(j);
            } else if (rh.type != FRAME_PULL_DATA || rh.step_id < first || rh.step_id != expect) {
                rc = rl_errf(err, "node %s answered out of turn while streaming tensor %s (%s %" PRIu64 ", expected %" PRIu64 ")",
                             h->addr, t->name, frame_type_name(rh.type), rh.step_id, expect);
            } else {
                uint64_t at = (expect - first) * (uint64_t)PARTS_CHUNK;
                uint64_t want = t->nbytes - at < PARTS_CHUNK ? t->nbytes - at : PARTS_CHUNK;
                if (p.len[1] != want) {
                    rc = rl_errf(err, "node %s sent %zu bytes of tensor %s where %" PRIu64 " were asked for", h->addr,
                                 p.len[1], t->name, want);
                } else if (fwrite(p.data[1], 1, p.len[1], out) != p.len[1]) {
                    rc = rl_errf(err, "cannot write %s: %s", tmp, strerror(errno));
                } else {
                    crypto_generichash_update(&hs, p.data[1], p.len[1]);
                    got += p.len[1];
                    expect++;
                    in_flight--;
                }
            }
            zs_parts_free(&p);
            if (rc != 0) break;
        }
    }
    if (fclose(out) != 0 && rc == 0) rc = rl_errf(err, "cannot write %s", tmp);
    uint8_t hash[32];
    crypto_generichash_final(&hs, hash, 32);
    if (rc == 0 && memcmp(hash, t->hash, 32) != 0) {
        rc = rl_errf(err, "tensor %s streamed from node %s (its %s) does not hash as the manifest says: refused", t->name,
                     h->addr, file);
    }
    if (rc == 0 && rename(tmp, dst) != 0) rc = rl_errf(err, "cannot keep %s: %s", dst, strerror(errno));
    if (rc != 0) {
        unlink(tmp);
        /* Replies still on the way would be read by the next pull as out of turn: this link is done. */
        zmq_close(l->sock);
        l->sock = NULL;
    }
    return rc;
}

/* ---- assembly -------------------------------------------------------------------------------- */

int parts_assemble(const manifest_file *f, uint32_t a, uint32_t b, const parts_opts *o, mf_model *out, parts_stats *st,
                rl_err *err) {
    memset(st, 0, sizeof *st);
    memset(out, 0, sizeof *out);
    const uint32_t n_files = manifest_file_n_files(f);
    int *sel = calloc((size_t)f->n + 1, sizeof *sel), n_sel = 0;
    int *split_of = calloc((size_t)f->n + 1, sizeof *split_of); /* per selected tensor: its split in out */
    int *file_split = calloc((size_t)n_files + 1, sizeof *file_split);
    struct stat *file_st = calloc((size_t)n_files + 1, sizeof *file_st);
    bool *local = calloc((size_t)f->n + 1, 1);
    parts_link *links = calloc((size_t)o->n_holders + 1, sizeof *links);
    char *cache = NULL, store[1200], vpath[1200];
    const mf_tensor **check = NULL;
    uint8_t (*hs)[32] = NULL;
    int rc = -1;
    if (!sel || !split_of || !file_split || !file_st || !local || !links) {
        rl_errf(err, "out of memory");
        goto done;
    }
    for (int i = 0; i < f->n; i++) {
        if (manifest_tensor_in_range(f->t[i].name, a, b, f->n_layer)) sel[n_sel++] = i;
    }
    if (n_sel == 0) {
        rl_errf(err, "the manifest holds no tensor of layers [%u, %u)", a, b);
        goto done;
    }
    struct gguf_context *meta = manifest_file_meta(f);
    if (!meta) {
        rl_errf(err, "out of memory");
        goto done;
    }
    if (mf_compose(out, meta, n_sel, err) != 0) goto done;
    snprintf(store, sizeof store, "%s/tensors", o->cache_dir);
    snprintf(vpath, sizeof vpath, "%s/verified-tensors", o->cache_dir);
    size_t clen;
    rl_err ce;
    if (rl_read_file(vpath, NULL, &cache, &clen, &ce) != 0) cache = NULL; /* nothing verified yet */

    /* 1. The split files of the range this node holds: mapped whole (lazily paged), each of their tensors in
     * the range at the manifest's place, or the file is another version of it. */
    for (uint32_t k = 0; k < n_files; k++) file_split[k] = -1;
    for (int s = 0; s < n_sel; s++) {
        const manifest_tensor *t = &f->t[sel[s]];
        const char *name = manifest_file_name(f, t->file);
        if (file_split[t->file] == -1 && o->models_dir && parts_plain_name(name)) {
            char path[1400];
            snprintf(path, sizeof path, "%s/%s", o->models_dir, name);
            file_split[t->file] = -2; /* looked for */
            if (stat(path, &file_st[t->file]) == 0 && S_ISREG(file_st[t->file].st_mode)) {
                int idx;
                if (mf_compose_file(out, path, true, &idx, err) != 0) goto done;
                file_split[t->file] = idx;
            }
        }
        if (file_split[t->file] < 0) continue;
        const mf_split *sp = &out->splits[file_split[t->file]];
        int64_t ti = gguf_find_tensor(sp->gguf, t->name);
        if (ti < 0 || (int)gguf_get_tensor_type(sp->gguf, ti) != t->type || gguf_get_tensor_size(sp->gguf, ti) != t->nbytes ||
            sp->data_offset + gguf_get_tensor_offset(sp->gguf, ti) != t->offset) {
            rl_errf(err, "%s: tensor %s %s the manifest's (another version of the file?)", sp->path, t->name,
                    ti < 0 ? "is missing: its file differs from" : "has a type, size or place other than");
            goto done;
        }
        local[s] = true;
        split_of[s] = file_split[t->file];
    }

    /* 2. The others: from the store, else pulled from a node that lends their file. */
    for (int s = 0; s < n_sel; s++) {
        if (local[s]) continue;
        const manifest_tensor *t = &f->t[sel[s]];
        char hex[65], path[1300];
        sodium_bin2hex(hex, sizeof hex, t->hash, 32);
        snprintf(path, sizeof path, "%s/%s.bin", store, hex);
        struct stat ts;
        bool have = stat(path, &ts) == 0 && S_ISREG(ts.st_mode) && (uint64_t)ts.st_size == t->nbytes;
        if (have) {
            st->stored++;
        } else {
            int hi = -1;
            for (int k = 0; k < o->n_holders && hi < 0; k++) hi = o->holders[k].files[t->file] ? k : -1;
            if (hi < 0) {
                rl_errf(err, "tensor %s (in %s) is not on this node and no node lends that file", t->name,
                        manifest_file_name(f, t->file));
                goto done;
            }
            if (rl_mkdirs(store) != 0) {
                rl_errf(err, "cannot create %s: %s", store, strerror(errno));
                goto done;
            }
            if (parts_pull(o, f, &o->holders[hi], &links[hi], t, path, err) != 0) goto done;
            st->pulled++;
            st->pulled_bytes += t->nbytes;
        }
        int idx;
        if (t->nbytes == 0) { /* nothing to map: point it into any mapped part (no tensor of K3 is empty) */
            rl_errf(err, "tensor %s is empty", t->name);
            goto done;
        }
        if (mf_compose_file(out, path, false, &idx, err) != 0) goto done;
        split_of[s] = idx;
    }
    for (int s = 0; s < n_sel; s++) {
        const manifest_tensor *t = &f->t[sel[s]];
        mf_tensor mt = {.name = t->name, .type = t->type, .n_dims = t->n_dims, .nbytes = t->nbytes, .split = split_of[s],
                        .offset = local[s] ? t->offset : 0};
        memcpy(mt.ne, t->ne, sizeof mt.ne);
        if (mf_compose_tensor(out, &mt, err) != 0) goto done;
    }

    /* 3. Local tensors not verified before: hashed (in parallel) and compared; the matches remembered. */
    check = calloc((size_t)f->n + 1, sizeof *check);
    int *check_sel = calloc((size_t)f->n + 1, sizeof *check_sel), n_check = 0;
    hs = calloc((size_t)f->n + 1, sizeof *hs);
    if (!check || !check_sel || !hs) {
        free(check_sel);
        rl_errf(err, "out of memory");
        goto done;
    }
    for (int s = 0; s < n_sel; s++) {
        if (!local[s]) continue;
        const manifest_tensor *t = &f->t[sel[s]];
        char line[600];
        parts_verified_line(line, sizeof line, t, manifest_file_name(f, t->file), &file_st[t->file]);
        st->local++;
        st->local_bytes += t->nbytes;
        if (parts_verified(cache, line)) continue;
        check[n_check] = &out->tensors[s];
        check_sel[n_check++] = s;
        st->checked_bytes += t->nbytes;
    }
    if (n_check > 0) {
        const bool bar = st->checked_bytes > (256u << 20) && isatty(2);
        if (manifest_hash_tensors(check, n_check, o->n_threads, bar ? "verifying split files" : NULL, hs) != 0) {
            free(check_sel);
            rl_errf(err, "out of memory");
            goto done;
        }
        FILE *vf = NULL;
        for (int c = 0; c < n_check; c++) {
            const manifest_tensor *t = &f->t[sel[check_sel[c]]];
            if (memcmp(hs[c], t->hash, 32) != 0) {
                rl_errf(err, "%s: tensor %s: its bytes do not hash as the manifest says (a damaged or other file): refused",
                        out->splits[split_of[check_sel[c]]].path, t->name);
                if (vf) fclose(vf);
                free(check_sel);
                goto done;
            }
        }
        if (rl_mkdirs(o->cache_dir) == 0) vf = fopen(vpath, "a");
        for (int c = 0; vf && c < n_check; c++) {
            const manifest_tensor *t = &f->t[sel[check_sel[c]]];
            char line[600];
            parts_verified_line(line, sizeof line, t, manifest_file_name(f, t->file), &file_st[t->file]);
            fputs(line, vf);
        }
        if (vf) fclose(vf); /* not remembered: checked again next time, nothing worse */
        st->local_checked = n_check;
    }
    free(check_sel);
    rc = 0;
done:
    if (rc != 0) mf_close(out);
    for (int k = 0; links && k < o->n_holders; k++) {
        if (links[k].sock) zmq_close(links[k].sock);
    }
    free(links);
    free(sel);
    free(split_of);
    free(file_split);
    free(file_st);
    free(local);
    free(cache);
    free(check);
    free(hs);
    return rc;
}
