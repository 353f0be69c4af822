/* node_fetch.c - a coordinator streams this node the layers it lacks: a range file in chunks, checked by
 * BLAKE2b before it is kept. */
#include "node_int.h"

/* ---- fetch: a coordinator streams this node the layers it lacks ---------------------------------- */

void node_fetch_abort(node *n) {
    if (n->fetch.f) fclose(n->fetch.f);
    if (n->fetch.active) unlink(n->fetch.tmp);
    memset(&n->fetch, 0, sizeof n->fetch);
}

void node_fetch_begin(node *n, uint64_t step, const zs_parts *p) {
    node_fetch_abort(n);
    node_fetch *f = &n->fetch;
    cJSON *j = p->n >= 4 ? cJSON_ParseWithLength(p->data[2], p->len[2]) : NULL;
    const char *hash = rl_json_str(j, "model_hash");
    double a = rl_json_num(j, "a", -1), b = rl_json_num(j, "b", -1), bytes = rl_json_num(j, "file_bytes", -1);
    if (!hash || strlen(hash) != 64 || strspn(hash, "0123456789abcdef") != 64 || a < 0 || b <= a || bytes <= 0 ||
        p->len[3] > bytes) {
        cJSON_Delete(j);
        node_error(n, step, "FETCH_BEGIN lacks a valid model_hash, layer range or size");
        return;
    }
    if (rl_mkdirs(n->cache_dir) != 0) {
        cJSON_Delete(j);
        node_error(n, step, "cannot create the cache folder %s: %s", n->cache_dir, strerror(errno));
        return;
    }
    snprintf(f->hash, sizeof f->hash, "%s", hash);
    f->a = (uint32_t)a;
    f->b = (uint32_t)b;
    f->expect = (uint64_t)bytes;
    cJSON_Delete(j);
    snprintf(f->final, sizeof f->final, "%s/%s-%u-%u.gguf", n->cache_dir, f->hash, f->a, f->b);
    snprintf(f->tmp, sizeof f->tmp, "%s.part", f->final);
    f->f = fopen(f->tmp, "wb");
    if (!f->f) {
        node_error(n, step, "cannot write %s: %s", f->tmp, strerror(errno));
        return;
    }
    f->active = true;
    f->last_pct = -1;
    crypto_generichash_init(&f->h, NULL, 0, 32);
    /* The header travels with FETCH_BEGIN; the data section follows in FETCH_DATA chunks. */
    if (fwrite(p->data[3], 1, p->len[3], f->f) != p->len[3]) {
        node_error(n, step, "cannot write %s", f->tmp);
        node_fetch_abort(n);
        return;
    }
    crypto_generichash_update(&f->h, p->data[3], p->len[3]);
    f->written = p->len[3];
    node_log(n, "receiving layers [%u, %u) of %.12s... (%.1f MiB)", f->a, f->b, f->hash, (double)f->expect / 1048576.0);
    node_reply(n, FRAME_FETCH_ACK, step, NULL, 0);
}

void node_fetch_data(node *n, uint64_t step, const zs_parts *p) {
    node_fetch *f = &n->fetch;
    if (!f->active) {
        node_error(n, step, "FETCH_DATA without FETCH_BEGIN");
        return;
    }
    if (f->written + p->len[2] > f->expect || fwrite(p->data[2], 1, p->len[2], f->f) != p->len[2]) {
        node_error(n, step, "fetched data overruns the announced %" PRIu64 " bytes, or cannot be written", f->expect);
        node_fetch_abort(n);
        return;
    }
    crypto_generichash_update(&f->h, p->data[2], p->len[2]);
    f->written += p->len[2];
    int pct = (int)(100.0 * (double)f->written / (double)f->expect);
    if (pct / 10 != f->last_pct / 10) {
        f->last_pct = pct;
        fprintf(stderr, "\rringlm node %s: receiving [%-20.*s] %3d%%", n->name, pct / 5, "####################", pct);
        if (pct == 100) fputc('\n', stderr);
    }
    node_reply(n, FRAME_FETCH_ACK, step, NULL, 0);
}

void node_fetch_end(node *n, uint64_t step, const zs_parts *p) {
    node_fetch *f = &n->fetch;
    if (!f->active) {
        node_error(n, step, "FETCH_END without FETCH_BEGIN");
        return;
    }
    cJSON *j = cJSON_ParseWithLength(p->data[2], p->len[2]);
    const char *want = rl_json_str(j, "blake2b");
    unsigned char out[32];
    char got[65];
    crypto_generichash_final(&f->h, out, 32);
    sodium_bin2hex(got, sizeof got, out, 32);
    bool hash_ok = want && strcmp(want, got) == 0; /* before cJSON_Delete: want points into j */
    bool ok = hash_ok && f->written == f->expect;
    cJSON_Delete(j);
    if (!ok) {
        node_error(n, step, "fetched range file is corrupt (%" PRIu64 " of %" PRIu64 " bytes, hash %s)", f->written,
                   f->expect, hash_ok ? "ok" : "mismatch");
        node_fetch_abort(n);
        return;
    }
    int bad = fflush(f->f) != 0 || fsync(fileno(f->f)) != 0;
    bad |= fclose(f->f) != 0;
    f->f = NULL;
    if (bad || rename(f->tmp, f->final) != 0) {
        node_error(n, step, "cannot keep %s: %s", f->final, strerror(errno));
        node_fetch_abort(n);
        return;
    }
    if (n->n_models < NODE_MAX_MODELS) {
        node_model *nm = &n->models[n->n_models++];
        snprintf(nm->path, sizeof nm->path, "%s", f->final);
        snprintf(nm->hash, sizeof nm->hash, "%s", f->hash);
        nm->range = true;
        nm->a = f->a;
        nm->b = f->b;
        nm->bytes = f->expect;
    }
    node_log(n, "kept layers [%u, %u) in %s", f->a, f->b, f->final);
    memset(f, 0, sizeof *f);
    node_reply(n, FRAME_READY, step, "{\"fetched\":true}", 16);
}

