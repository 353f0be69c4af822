/* ring_bad_frames - an authenticated coordinator that sends a node malformed frames.
 *
 *   ring_bad_frames --node HOST:PORT --node-key NODE_PUBKEY_HEX --key coord.key --model MODEL.gguf
 *
 * For each bad frame the node must answer ERROR with a message naming the problem, and still answer a
 * PING afterwards. Prints "ok - ..." / "not ok - ..." lines; exit 0 when all pass. (Unauthenticated
 * garbage never gets this far: the CURVE handshake drops it; t_ring.sh covers that.) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zmq.h>

#include "gguf/file_hash.h"
#include "model/k3_hparams.h"
#include "ring/frame.h"
#include "ring/zsock.h"

static int n_pass, n_fail;

/* Waits up to 5 s for a reply; returns its type (0 on timeout) and copies an ERROR's text into msg. */
static int reply(void *s, char *msg, size_t cap) {
    zmq_pollitem_t it = {s, 0, ZMQ_POLLIN, 0};
    msg[0] = 0;
    if (zmq_poll(&it, 1, 5000) <= 0) return 0;
    zs_parts p;
    rl_err e;
    if (zs_recv(s, &p, &e) != 0) return 0;
    rf_header *h = calloc(1, sizeof *h);
    int type = 0;
    if (p.n >= 2 && rf_header_decode(h, p.data[0], p.len[0], &e) == 0) {
        type = h->type;
        if (type == RF_ERROR) snprintf(msg, cap, "%.*s", (int)p.len[1], (const char *)p.data[1]);
    }
    free(h);
    zs_parts_free(&p);
    return type;
}

static void send_parts(void *s, const void *const *d, const size_t *l, int n) {
    rl_err e;
    zs_send_wait(s, d, l, n, 5000, &e);
}

static void send_hdr(void *s, const rf_header *h, const void *payload, size_t plen, int with_stamps) {
    uint8_t hb[2048], sb[8];
    rf_header_encode(h, hb);
    rf_stamps_encode(NULL, 0, sb);
    const void *d[3] = {hb, payload ? payload : "", sb};
    size_t l[3] = {rf_header_size(h->n_seqs), plen, rf_stamps_size(0)};
    send_parts(s, d, l, with_stamps ? 3 : 2);
}

static void expect(void *s, const char *what, const char *needle) {
    char msg[1024];
    int t = reply(s, msg, sizeof msg);
    int ok = t == RF_ERROR && strstr(msg, needle) != NULL;
    printf("%s - %s: %s\n", ok ? "ok" : "not ok", what, t == RF_ERROR ? msg : t ? "(another reply)" : "(no reply)");
    ok ? n_pass++ : n_fail++;
    /* ... and the node is still there. */
    rf_header h = {.type = RF_PING, .step_id = 77};
    send_hdr(s, &h, NULL, 0, 0);
    int alive = reply(s, msg, sizeof msg) == RF_PONG;
    printf("%s - still answering after: %s\n", alive ? "ok" : "not ok", what);
    alive ? n_pass++ : n_fail++;
}

int main(int argc, char **argv) {
    const char *node = NULL, *node_key = NULL, *key = NULL, *model = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--node")) node = argv[i + 1];
        else if (!strcmp(argv[i], "--node-key")) node_key = argv[i + 1];
        else if (!strcmp(argv[i], "--key")) key = argv[i + 1];
        else if (!strcmp(argv[i], "--model")) model = argv[i + 1];
    }
    rl_err err;
    rk_identity id;
    rk_peer peer;
    mf_model m;
    char hash[65];
    k3_hparams hp;
    if (!node || !node_key || !key || !model || rk_load(&id, key, &err) != 0 || rk_peer_parse(&peer, node_key, &err) != 0 ||
        k3_open(&m, &hp, model, &err) != 0 || fh_model_hash(&m, hash, &err) != 0) {
        fprintf(stderr, "usage: ring_bad_frames --node H:P --node-key HEX --key coord.key --model M (%s)\n", err.msg);
        return 2;
    }
    void *ctx = zmq_ctx_new();
    void *s = zs_client(ctx, node, &id, peer.curve_pk_z85, "coord-bad", &err);
    rf_header ping = {.type = RF_PING};
    send_hdr(s, &ping, NULL, 0, 0); /* introduces us as the coordinator */
    char msg[1024];
    if (reply(s, msg, sizeof msg) != RF_PONG) {
        printf("not ok - the node did not answer a first PING\n");
        return 1;
    }
    uint8_t raw[64];
    memset(raw, 0, sizeof raw);
    const void *d2[2] = {raw, ""};
    size_t l2[2] = {3, 0};
    send_parts(s, d2, l2, 2);
    expect(s, "a 3-byte header", "too short");
    memcpy(raw, "XXXX", 4);
    l2[0] = 40;
    send_parts(s, d2, l2, 2);
    expect(s, "bad magic", "bad magic");

    rf_header h = {.type = RF_FORWARD};
    uint8_t hb[2048];
    rf_header_encode(&h, hb);
    hb[4] = 99; /* version */
    const void *d3[2] = {hb, ""};
    size_t l3[2] = {rf_header_size(0), 0};
    send_parts(s, d3, l3, 2);
    expect(s, "another protocol version", "version mismatch");
    rf_header_encode(&h, hb);
    hb[6] = 200; /* type */
    send_parts(s, d3, l3, 2);
    expect(s, "an unknown frame type", "unknown frame type");
    rf_header_encode(&h, hb);
    hb[28] = 0xe8, hb[29] = 0x03; /* n_seqs = 1000 */
    send_parts(s, d3, l3, 2);
    expect(s, "too many sequences", "sequences (limit");
    rf_header_encode(&h, hb);
    hb[28] = 2; /* n_seqs = 2 but no entries follow */
    send_parts(s, d3, l3, 2);
    expect(s, "a header shorter than its sequence list", "sequences need");

    rf_header f = {.type = RF_FORWARD, .n_seqs = 1};
    f.seqs[0] = (rf_seq){.seq_id = 1, .n_tokens = 1, .flags = RF_SEQ_NEW,
                         .smp = {.repeat_penalty = 1.0f, .top_p = 1.0f}}; /* valid greedy sampling */
    int32_t tok = 1;
    f.payload_bytes = 4;
    send_hdr(s, &f, &tok, 4, 1);
    expect(s, "FORWARD before ASSIGN", "before ASSIGN");
    rf_header a = {.type = RF_ASSIGN};
    const char *bad_json = "{not json";
    send_hdr(s, &a, bad_json, strlen(bad_json), 0);
    expect(s, "ASSIGN that is not JSON", "not valid JSON");
    char js[512];
    snprintf(js, sizeof js, "{\"model_hash\":\"%064d\",\"a\":0,\"b\":1,\"n_ctx\":64}", 0);
    send_hdr(s, &a, js, strlen(js), 0);
    expect(s, "ASSIGN of a model the node does not hold", "not among this node's models");
    snprintf(js, sizeof js, "{\"model_hash\":\"%s\",\"a\":0,\"b\":1000,\"n_ctx\":64}", hash);
    send_hdr(s, &a, js, strlen(js), 0);
    expect(s, "ASSIGN beyond the model's layers", "beyond");

    /* A valid assignment (the whole model, last stage) for the FORWARD checks. */
    snprintf(js, sizeof js, "{\"model_hash\":\"%s\",\"a\":0,\"b\":%u,\"n_ctx\":64}", hash, hp.n_layer);
    send_hdr(s, &a, js, strlen(js), 0);
    int t = reply(s, msg, sizeof msg);
    printf("%s - a valid ASSIGN is answered READY\n", t == RF_READY ? "ok" : "not ok");
    t == RF_READY ? n_pass++ : n_fail++;
    f.payload_bytes = 4;
    send_hdr(s, &f, &tok, 3, 1); /* payload shorter than announced */
    expect(s, "FORWARD whose payload is not the announced size", "does not fit");
    rf_header g = f;
    g.seqs[0].flags = 0;
    g.seqs[0].seq_id = 42;
    send_hdr(s, &g, &tok, 4, 1);
    expect(s, "FORWARD for an unknown sequence", "unknown here");
    g.seqs[0].flags = RF_SEQ_NEW;
    g.seqs[0].pos = 5;
    send_hdr(s, &g, &tok, 4, 1);
    expect(s, "a new sequence not at position 0", "position 0");
    int32_t big = 1 << 30;
    g.seqs[0].pos = 0;
    send_hdr(s, &g, &big, 4, 1);
    expect(s, "a token id out of range", "out of range");
    rf_header v = f;
    v.seqs[0].n_tokens = 3;
    v.seqs[0].flags = RF_SEQ_NEW | RF_SEQ_VERIFY | RF_SEQ_HAS_Q;
    v.payload_bytes = 12;
    int32_t three[3] = {1, 2, 3};
    send_hdr(s, &v, three, 12, 1); /* HAS_Q but no q part */
    expect(s, "VERIFY that announces draft distributions and sends none", "malformed");
    rf_header fd = {.type = RF_FETCH_DATA};
    send_hdr(s, &fd, "x", 1, 0);
    expect(s, "FETCH_DATA without FETCH_BEGIN", "without FETCH_BEGIN");
    zmq_close(s);
    zmq_ctx_term(ctx);
    mf_close(&m);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
