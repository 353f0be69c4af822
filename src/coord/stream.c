/* stream.c - the coordinator streams a node the layers it lacks: a range file of the model, in chunks
 * under flow control, checked by BLAKE2b (docs/ring.md, "Plan, load"). */
#include "coord_int.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cJSON.h>
#include <sodium.h>
#include <zmq.h>

#include "../gguf/file_hash.h"
#include "ggml.h"
#include "gguf.h"

/* Is file tensor t needed by a stage running [a, b)? */
static bool ring_tensor_in_range(const char *name, uint32_t a, uint32_t b, uint32_t n_layer) {
    unsigned il;
    if (sscanf(name, "blk.%u.", &il) == 1) return il >= a && il < b;
    if (strcmp(name, "token_embd.weight") == 0) return a == 0;
    return b == n_layer;
}

/* Sends one FETCH_DATA chunk, first waiting while 8 are unacknowledged (the node writes them to disk). */
static int ring_send_chunk(ring_coord *rc, int node, const uint8_t *chunk, size_t *fill, uint64_t *chunk_id,
                           int *in_flight, uint64_t *sent, uint64_t file_bytes, int *last_pct,
                           crypto_generichash_state *hs, rl_err *err) {
    while (*in_flight >= 8) {
        zs_parts p;
        frame_header h;
        int from;
        if (ring_wait(rc, FRAME_FETCH_ACK, node, rc->o.step_s, NULL, &from, &p, &h, err) != 0) return -1;
        zs_parts_free(&p);
        (*in_flight)--;
    }
    crypto_generichash_update(hs, chunk, *fill);
    if (ring_send(rc, node, FRAME_FETCH_DATA, (*chunk_id)++, NULL, chunk, *fill, NULL, 0, err) != 0) return -1;
    (*in_flight)++;
    *sent += *fill;
    *fill = 0;
    int pct = (int)(100.0 * (double)*sent / (double)file_bytes);
    if (pct / 10 != *last_pct / 10 && isatty(2)) {
        *last_pct = pct;
        fprintf(stderr, "\rringlm: streaming [%-20.*s] %3d%%%s", pct / 5, "####################", pct, pct == 100 ? "\n" : "");
    }
    return 0;
}

/* Streams a node the range file for layers [a, b): the model's metadata with only those tensors, then
 * the data in 4 MiB chunks (at most 8 unacknowledged), then the file's BLAKE2b, which the node checks
 * before it keeps the file under the model's content hash. */
int ring_stream(ring_coord *rc, int node, const mf_model *m, uint32_t a, uint32_t b, rl_err *err) {
    struct gguf_context *g = gguf_init_empty();
    gguf_set_kv(g, m->meta);
    gguf_remove_key(g, "split.no");
    gguf_remove_key(g, "split.count");
    gguf_remove_key(g, "split.tensors.count");
    gguf_set_val_u32(g, "ringlm.range.start", a);
    gguf_set_val_u32(g, "ringlm.range.end", b);
    gguf_set_val_str(g, "ringlm.range.model_blake2b", rc->model_hash);
    struct ggml_init_params ip = {.mem_size = (size_t)(m->n_tensor + 1) * ggml_tensor_overhead(), .mem_buffer = NULL,
                                  .no_alloc = true};
    struct ggml_context *tctx = ggml_init(ip);
    const mf_tensor **sel = calloc((size_t)m->n_tensor + 1, sizeof *sel);
    int n_sel = 0, rc_ = -1;
    uint8_t *meta = NULL, *chunk = NULL;
    if (!tctx || !sel) {
        rl_errf(err, "out of memory");
        goto done;
    }
    for (int i = 0; i < m->n_tensor; i++) {
        const mf_tensor *t = &m->tensors[i];
        if (!ring_tensor_in_range(t->name, a, b, rc->hp.n_layer)) continue;
        struct ggml_tensor *d = ggml_new_tensor(tctx, (enum ggml_type)t->type, 4, t->ne);
        ggml_set_name(d, t->name);
        gguf_add_tensor(g, d);
        sel[n_sel++] = t;
    }
    size_t al = gguf_get_alignment(g), meta_size = gguf_get_meta_size(g);
    size_t data_off = (meta_size + al - 1) / al * al;
    size_t data_end = 0;
    if (n_sel) data_end = gguf_get_tensor_offset(g, n_sel - 1) + gguf_get_tensor_size(g, n_sel - 1);
    data_end = (data_end + al - 1) / al * al;
    uint64_t file_bytes = data_off + data_end;
    meta = calloc(1, data_off);
    chunk = malloc(4u << 20);
    if (!meta || !chunk) {
        rl_errf(err, "out of memory");
        goto done;
    }
    gguf_get_meta_data(g, meta);
    crypto_generichash_state hs;
    crypto_generichash_init(&hs, NULL, 0, 32);
    crypto_generichash_update(&hs, meta, data_off);
    char js[256];
    snprintf(js, sizeof js, "{\"model_hash\":\"%s\",\"a\":%u,\"b\":%u,\"file_bytes\":%" PRIu64 "}", rc->model_hash, a,
             b, file_bytes);
    fprintf(stderr, "ringlm: streaming layers [%u, %u) (%.1f MiB) to %s\n", a, b, (double)file_bytes / 1048576.0,
            rc->conf.nodes[node].addr);
    if (ring_send(rc, node, FRAME_FETCH_BEGIN, 0, NULL, js, strlen(js), meta, data_off, err) != 0) goto done;
    int in_flight = 1, last_pct = -1;
    uint64_t chunk_id = 1, sent = data_off;
    size_t fill = 0;
    for (int k = 0; k <= n_sel; k++) {
        /* Tensor k's bytes at its offset, zero padding before it (k == n_sel: the final padding). */
        size_t off = k < n_sel ? gguf_get_tensor_offset(g, k) : data_end;
        size_t pos = sent - data_off + fill;
        const uint8_t *src = k < n_sel ? sel[k]->data : NULL;
        size_t want = (off - pos) + (k < n_sel ? sel[k]->nbytes : 0), done_b = 0;
        while (done_b < want) {
            size_t pad = off > pos + done_b ? off - pos - done_b : 0;
            size_t take = 0;
            if (pad) {
                take = pad < (4u << 20) - fill ? pad : (4u << 20) - fill;
                memset(chunk + fill, 0, take);
            } else {
                size_t in_t = pos + done_b - off;
                take = sel[k]->nbytes - in_t < (4u << 20) - fill ? sel[k]->nbytes - in_t : (4u << 20) - fill;
                memcpy(chunk + fill, src + in_t, take);
            }
            fill += take;
            done_b += take;
            if (fill == (4u << 20) && ring_send_chunk(rc, node, chunk, &fill, &chunk_id, &in_flight, &sent, file_bytes,
                                                      &last_pct, &hs, err) != 0) {
                goto done;
            }
        }
    }
    if (fill && ring_send_chunk(rc, node, chunk, &fill, &chunk_id, &in_flight, &sent, file_bytes, &last_pct, &hs, err) != 0) {
        goto done;
    }
    while (in_flight > 0) {
        zs_parts p;
        frame_header h;
        int from;
        if (ring_wait(rc, FRAME_FETCH_ACK, node, rc->o.step_s, NULL, &from, &p, &h, err) != 0) goto done;
        zs_parts_free(&p);
        in_flight--;
    }
    unsigned char out[32];
    char hex[65];
    crypto_generichash_final(&hs, out, 32);
    sodium_bin2hex(hex, sizeof hex, out, 32);
    snprintf(js, sizeof js, "{\"blake2b\":\"%s\"}", hex);
    if (ring_send(rc, node, FRAME_FETCH_END, chunk_id, NULL, js, strlen(js), NULL, 0, err) != 0) goto done;
    zs_parts p;
    frame_header h;
    int from;
    if (ring_wait(rc, FRAME_READY, node, rc->o.load_s, NULL, &from, &p, &h, err) != 0) goto done;
    zs_parts_free(&p);
    rc_ = 0;
done:
    free(meta);
    free(chunk);
    free(sel);
    if (tctx) ggml_free(tctx);
    gguf_free(g);
    return rc_;
}
