/* ring_bad_frames - an authenticated coordinator that sends a node malformed frames.
 *
 *   ring_bad_frames --node HOST:PORT --node-key NODE_PUBKEY_HEX --key coord.key --model MODEL.gguf
 *
 * For each bad frame the node must answer ERROR with a message naming the problem, and still answer a
 * PING afterwards. Prints "ok - ..." / "not ok - ..." lines; exit 0 when all pass. (Unauthenticated
 * garbage never gets this far: the CURVE handshake drops it; t_ring.sh covers that.)
 *
 * --fuzz N [--seed S]: then sends N frames made by mutating valid ones of every type (bytes flipped,
 * parts cut short, grown, dropped or added, header fields set to random values), checking every 25 that
 * the node still answers a PING. Seeded: a failure is reproduced by its seed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zmq.h>

#include "gguf/file_hash.h"
#include "model/k3_hparams.h"
#include "text/chat_gram.h"
#include "text/grammar.h"
#include "text/json_schema.h"
#include "text/tokenizer.h"
#include "wire/frame.h"
#include "net/zsock.h"

static int n_pass, n_fail;

/* Waits up to ms for a reply; returns its type (0 on timeout) and copies its payload (an ERROR's: its text)
 * into msg. */
static int reply_within(void *s, int ms, char *msg, size_t cap) {
    zmq_pollitem_t it = {s, 0, ZMQ_POLLIN, 0};
    msg[0] = 0;
    if (zmq_poll(&it, 1, ms) <= 0) return 0;
    zs_parts p;
    rl_err e;
    if (zs_recv(s, &p, &e) != 0) return 0;
    frame_header *h = calloc(1, sizeof *h);
    int type = 0;
    if (p.n >= 2 && frame_header_decode(h, p.data[0], p.len[0], &e) == 0) {
        type = h->type;
        snprintf(msg, cap, "%.*s", (int)p.len[1], (const char *)p.data[1]);
    }
    free(h);
    zs_parts_free(&p);
    return type;
}

static int reply(void *s, char *msg, size_t cap) { return reply_within(s, 5000, msg, cap); }

static void send_parts(void *s, const void *const *d, const size_t *l, int n) {
    rl_err e;
    if (zs_wait_writable(s, 5000)) zs_send(s, d, l, n, true, &e);
}

/* The header, the payload and (n_stamps >= 0) the stamps part with those n_stamps stamps. */
static void send_stamped(void *s, const frame_header *h, const void *payload, size_t plen, const frame_stamp *st,
                         int n_stamps) {
    uint8_t hb[2048], sb[256];
    frame_header_encode(h, hb);
    frame_stamps_encode(st, n_stamps > 0 ? (uint32_t)n_stamps : 0, sb);
    const void *d[3] = {hb, payload ? payload : "", sb};
    size_t l[3] = {frame_header_size(h->n_seqs), plen, frame_stamps_size(n_stamps > 0 ? (uint32_t)n_stamps : 0)};
    send_parts(s, d, l, n_stamps >= 0 ? 3 : 2);
}

static void send_hdr(void *s, const frame_header *h, const void *payload, size_t plen, int with_stamps) {
    send_stamped(s, h, payload, plen, NULL, with_stamps ? 0 : -1);
}

/* A FORWARD with the last stage's sampler part (the 4th). */
static void send_hdr4(void *s, const frame_header *h, const void *payload, size_t plen, const void *q, size_t qlen) {
    uint8_t hb[2048], sb[8];
    frame_header_encode(h, hb);
    frame_stamps_encode(NULL, 0, sb);
    const void *d[4] = {hb, payload, sb, q};
    size_t l[4] = {frame_header_size(h->n_seqs), plen, frame_stamps_size(0), qlen};
    send_parts(s, d, l, 4);
}

/* The node answers a PING after `what`. */
static void still_answering(void *s, const char *what) {
    char msg[1024];
    frame_header h = {.type = FRAME_PING, .step_id = 77};
    send_hdr(s, &h, NULL, 0, 0);
    int alive = reply(s, msg, sizeof msg) == FRAME_PONG;
    printf("%s - still answering after: %s\n", alive ? "ok" : "not ok", what);
    alive ? n_pass++ : n_fail++;
}

static void expect(void *s, const char *what, const char *needle) {
    char msg[1024];
    int t = reply(s, msg, sizeof msg);
    int ok = t == FRAME_ERROR && strstr(msg, needle) != NULL;
    printf("%s - %s: %s\n", ok ? "ok" : "not ok", what, t == FRAME_ERROR ? msg : t ? "(another reply)" : "(no reply)");
    ok ? n_pass++ : n_fail++;
    still_answering(s, what);
}

/* Waits up to 5 s for a RESULT; returns its payload (malloc'ed, *len bytes), or NULL for anything else. */
static uint8_t *result_payload(void *s, size_t *len) {
    zmq_pollitem_t it = {s, 0, ZMQ_POLLIN, 0};
    zs_parts p;
    rl_err e;
    uint8_t *out = NULL;
    *len = 0;
    frame_header *rh = calloc(1, sizeof *rh);
    if (rh && zmq_poll(&it, 1, 5000) > 0 && zs_recv(s, &p, &e) == 0) {
        if (p.n >= 2 && frame_header_decode(rh, p.data[0], p.len[0], &e) == 0 && rh->type == FRAME_RESULT &&
            (out = malloc(p.len[1] ? p.len[1] : 1)) != NULL) {
            memcpy(out, p.data[1], p.len[1]);
            *len = p.len[1];
        }
        zs_parts_free(&p);
    }
    free(rh);
    return out;
}

/* ---- fuzzing ----------------------------------------------------------------------------------------- */

static uint64_t fz_next(uint64_t *x) { /* xorshift64* */
    *x ^= *x >> 12, *x ^= *x << 25, *x ^= *x >> 27;
    return *x * 0x2545f4914f6cdd1dull;
}

/* Drains replies until a PONG for `step` comes (at most 10 s). */
static int fz_alive(void *s, uint64_t step) {
    frame_header h = {.type = FRAME_PING, .step_id = step};
    send_hdr(s, &h, NULL, 0, 0);
    for (int i = 0; i < 1000; i++) {
        zmq_pollitem_t it = {s, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 10000) <= 0) return 0;
        zs_parts p;
        rl_err e;
        if (zs_recv(s, &p, &e) != 0) continue;
        frame_header *rh = calloc(1, sizeof *rh);
        int ok = rh && p.n >= 1 && frame_header_decode(rh, p.data[0], p.len[0], &e) == 0 && rh->type == FRAME_PONG &&
                 rh->step_id == step;
        free(rh);
        zs_parts_free(&p);
        if (ok) return 1;
    }
    return 0;
}

static void fuzz_frames(void *s, long n, uint64_t seed, const char *hash, uint32_t n_layer) {
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    long sent = 0, checks = 0;
    int alive = 1;
    for (long i = 0; i < n && alive; i++) {
        /* A valid frame of a random type ... */
        frame_header h = {.type = FRAME_FORWARD, .step_id = (uint64_t)i + 1000};
        uint8_t payload[4096], extra[512];
        size_t plen = 0, elen = 0;
        int kind = (int)(fz_next(&x) % 9);
        uint64_t seq = 1 + fz_next(&x) % 4;
        uint32_t nt = 1 + (uint32_t)(fz_next(&x) % 4);
        switch (kind) {
        case 0: /* FORWARD starting a sequence */
        case 1: /* FORWARD continuing one, maybe a VERIFY block with distributions */
            h.n_seqs = 1;
            h.seqs[0] = (frame_seq){.seq_id = seq, .pos = kind == 0 ? 0 : (uint32_t)(fz_next(&x) % 8), .n_tokens = nt,
                                 .flags = kind == 0 ? FRAME_SEQ_NEW : (uint32_t)(fz_next(&x) % 32),
                                 .smp = {.repeat_penalty = 1.0f, .top_p = 1.0f, .temperature = 0.5f}};
            for (uint32_t t = 0; t < nt; t++) {
                int32_t id = (int32_t)(fz_next(&x) % 200);
                memcpy(payload + t * 4, &id, 4);
            }
            plen = nt * 4;
            for (uint32_t d = 0; d + 1 < nt && elen + 12 <= sizeof extra; d++) {
                uint32_t one = 1;
                int32_t id = 7;
                float pr = 0.5f;
                memcpy(extra + elen, &one, 4), memcpy(extra + elen + 4, &id, 4), memcpy(extra + elen + 8, &pr, 4);
                elen += 12;
            }
            break;
        case 2: h.type = FRAME_FREE, h.n_seqs = 1, h.seqs[0].seq_id = seq; break;
        case 3: h.type = FRAME_PING; break;
        case 4: h.type = FRAME_INFO_REQ; break;
        case 5: /* AUDIT_REQ for a few steps */
            h.type = FRAME_AUDIT_REQ;
            {
                uint32_t c = 1 + (uint32_t)(fz_next(&x) % 3);
                memcpy(payload, &c, 4);
                for (uint32_t k = 0; k < c; k++) {
                    uint64_t st = 1000 + fz_next(&x) % (uint64_t)(i + 1);
                    memcpy(payload + 4 + k * 8, &st, 8);
                }
                plen = 4 + c * 8;
            }
            break;
        case 6: /* ASSIGN of the whole model again (or of a range) */
            h.type = FRAME_ASSIGN;
            plen = (size_t)snprintf((char *)payload, sizeof payload, "{\"model_hash\":\"%s\",\"a\":0,\"b\":%u,\"n_ctx\":64}",
                                    hash, fz_next(&x) % 4 ? n_layer : 1 + (uint32_t)(fz_next(&x) % n_layer));
            break;
        case 7: /* FETCH_BEGIN / DATA / END */
            h.type = (uint16_t)(FRAME_FETCH_BEGIN + (int)(fz_next(&x) % 4));
            plen = (size_t)snprintf((char *)payload, sizeof payload,
                                    "{\"model_hash\":\"%064d\",\"a\":0,\"b\":1,\"file_bytes\":100,\"blake2b\":\"%064d\"}", 1, 2);
            memcpy(extra, "GGUF\3\0\0\0", 8), elen = 8;
            break;
        default: h.type = (uint16_t)(1 + fz_next(&x) % FRAME_TYPE_MAX); break;
        }
        h.payload_bytes = plen;
        uint8_t hb[2048], sb[64];
        size_t hl = frame_header_size(h.n_seqs), sl = frame_stamps_size(0);
        frame_header_encode(&h, hb);
        frame_stamps_encode(NULL, 0, sb);
        if (fz_next(&x) % 3 == 0) { /* with a receipts request */
            memcpy(sb + sl, "RCX1", 4);
            for (int k = 0; k < 32; k++) sb[sl + 4 + k] = (uint8_t)fz_next(&x);
            memset(sb + sl + 36, 0, 4);
            sl += 40;
        }
        uint8_t *parts[4] = {hb, payload, sb, extra};
        size_t lens[4] = {hl, plen, sl, elen}, caps[4] = {sizeof hb, sizeof payload, sizeof sb, sizeof extra};
        int np = elen ? 4 : 3;
        /* ... then broken, one to four ways. */
        int muts = 1 + (int)(fz_next(&x) % 4);
        for (int m = 0; m < muts; m++) {
            int pi = (int)(fz_next(&x) % (uint64_t)np);
            switch (fz_next(&x) % 6) {
            case 0: /* flip bytes */
                for (int k = 0; lens[pi] && k < 1 + (int)(fz_next(&x) % 8); k++) {
                    parts[pi][fz_next(&x) % lens[pi]] ^= (uint8_t)(1 + fz_next(&x) % 255);
                }
                break;
            case 1: lens[pi] = lens[pi] ? fz_next(&x) % lens[pi] : 0; break; /* cut */
            case 2: { /* grow with random bytes */
                size_t add = fz_next(&x) % 64;
                if (lens[pi] + add > caps[pi]) add = caps[pi] - lens[pi];
                for (size_t k = 0; k < add; k++) parts[pi][lens[pi] + k] = (uint8_t)fz_next(&x);
                lens[pi] += add;
                break;
            }
            case 3: np = 1 + (int)(fz_next(&x) % 4); break; /* too few or too many parts */
            case 4: /* a header field set to a random value: type, n_seqs, payload_bytes, a seq's counts */
                if (hl >= 36) {
                    static const int offs[] = {4, 6, 24, 28, 32, 40, 44, 52, 56, 60}; /* version, type, flags, n_seqs, payload_bytes, budget_ms, a sequence's id, pos, count, flags */
                    int o = offs[fz_next(&x) % (sizeof offs / sizeof offs[0])];
                    uint32_t v = (uint32_t)fz_next(&x);
                    if (fz_next(&x) % 2) v %= 300;
                    if ((size_t)o + 4 <= lens[0]) memcpy(hb + o, &v, 4);
                }
                break;
            default: /* a byte of the header flipped */
                if (lens[0]) hb[fz_next(&x) % lens[0]] ^= (uint8_t)(1 + fz_next(&x) % 255);
                break;
            }
        }
        const void *d[4] = {parts[0], parts[1], parts[2], parts[3]};
        send_parts(s, d, lens, np);
        sent++;
        if (i % 25 == 24 || i == n - 1) {
            alive = fz_alive(s, 900000 + (uint64_t)i);
            checks++;
        }
    }
    printf("%s - fuzz: %ld mutated frames (seed %llu), the node answered all %ld liveness checks\n",
           alive ? "ok" : "not ok", sent, (unsigned long long)seed, checks);
    alive ? n_pass++ : n_fail++;
}

int main(int argc, char **argv) {
    const char *node = NULL, *node_key = NULL, *key = NULL, *model = NULL;
    long fuzz = 0;
    unsigned long long seed = 1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--fuzz")) fuzz = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--seed")) seed = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--node")) node = argv[i + 1];
        else if (!strcmp(argv[i], "--node-key")) node_key = argv[i + 1];
        else if (!strcmp(argv[i], "--key")) key = argv[i + 1];
        else if (!strcmp(argv[i], "--model")) model = argv[i + 1];
    }
    rl_err err;
    keys_identity id;
    keys_peer peer;
    mf_model m;
    char hash[65];
    k3_hparams hp;
    if (!node || !node_key || !key || !model || keys_load(&id, key, &err) != 0 || keys_peer_parse(&peer, node_key, &err) != 0 ||
        k3_open(&m, &hp, model, &err) != 0 || fh_model_hash(&m, hash, &err) != 0) {
        fprintf(stderr, "usage: ring_bad_frames --node H:P --node-key HEX --key coord.key --model M (%s)\n", err.msg);
        return 2;
    }
    void *ctx = zmq_ctx_new();
    void *s = zs_client(ctx, NULL, node, &id, peer.curve_pk_z85, "coord-bad", ZS_LINK_SLOW_S, &err);
    frame_header info = {.type = FRAME_INFO_REQ};
    send_hdr(s, &info, NULL, 0, 0); /* introduces us as the coordinator: an INFO request takes a free node */
    char msg[1024];
    if (reply(s, msg, sizeof msg) != FRAME_INFO) {
        printf("not ok - the node did not answer a first INFO request\n");
        return 1;
    }
    uint8_t raw[64];
    memset(raw, 0, sizeof raw);
    const void *d2[2] = {raw, ""};
    size_t l2[2] = {3, 0};
    send_parts(s, d2, l2, 2);
    expect(s, "a 3-byte header", "too short");
    memcpy(raw, "XXXX", 4);
    l2[0] = frame_header_size(0); /* a whole header's length, with another magic */
    send_parts(s, d2, l2, 2);
    expect(s, "bad magic", "bad magic");

    frame_header h = {.type = FRAME_FORWARD};
    uint8_t hb[2048];
    frame_header_encode(&h, hb);
    hb[4] = 99; /* version */
    const void *d3[2] = {hb, ""};
    size_t l3[2] = {frame_header_size(0), 0};
    send_parts(s, d3, l3, 2);
    expect(s, "another protocol version", "version mismatch");
    frame_header_encode(&h, hb);
    hb[6] = 200; /* type */
    send_parts(s, d3, l3, 2);
    expect(s, "an unknown frame type", "unknown frame type");
    frame_header_encode(&h, hb);
    hb[28] = 0xe8, hb[29] = 0x03; /* n_seqs = 1000 */
    send_parts(s, d3, l3, 2);
    expect(s, "too many sequences", "sequences (limit");
    frame_header_encode(&h, hb);
    hb[28] = 2; /* n_seqs = 2 but no entries follow */
    send_parts(s, d3, l3, 2);
    expect(s, "a header shorter than its sequence list", "sequences need");

    frame_header f = {.type = FRAME_FORWARD, .n_seqs = 1};
    f.seqs[0] = (frame_seq){.seq_id = 1, .n_tokens = 1, .flags = FRAME_SEQ_NEW,
                         .smp = {.repeat_penalty = 1.0f, .top_p = 1.0f}}; /* valid greedy sampling */
    int32_t tok = 1;
    f.payload_bytes = 4;
    send_hdr(s, &f, &tok, 4, 1);
    expect(s, "FORWARD before ASSIGN", "before ASSIGN");
    frame_header a = {.type = FRAME_ASSIGN};
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
    printf("%s - a valid ASSIGN is answered READY\n", t == FRAME_READY ? "ok" : "not ok");
    t == FRAME_READY ? n_pass++ : n_fail++;
    f.payload_bytes = 4;
    send_hdr(s, &f, &tok, 3, 1); /* payload shorter than announced */
    expect(s, "FORWARD whose payload is not the announced size", "does not fit");
    /* A frame whose deadline (budget_ms) was spent before it could run here: an earlier stage's stamp shows
     * 2 s of its 1 s budget gone (the coordinator has given it up), so the node refuses it rather than compute. */
    {
        frame_header late = f;
        late.seqs[0].seq_id = 70;
        late.budget_ms = 1000;
        const double now = frame_now();
        frame_stamp st = {.stage = 0, .n_tokens = 1, .t_recv = now - 3, .t_start = now - 3, .t_end = now - 1, .t_send = now - 1};
        send_stamped(s, &late, &tok, 4, &st, 1);
        expect(s, "a FORWARD whose deadline was spent before it reached this stage", "past its deadline");
        late.budget_ms = 60000; /* the same with time to spare runs (and answers RESULT) */
        late.seqs[0].seq_id = 71;
        send_stamped(s, &late, &tok, 4, &st, 1);
        size_t rl0 = 0;
        uint8_t *r0 = result_payload(s, &rl0);
        printf("%s - the same frame within its deadline runs\n", r0 ? "ok" : "not ok");
        r0 ? n_pass++ : n_fail++;
        free(r0);
    }
    frame_header g = f;
    g.seqs[0].flags = 0;
    g.seqs[0].seq_id = 42;
    send_hdr(s, &g, &tok, 4, 1);
    expect(s, "FORWARD for an unknown sequence", "unknown here");
    g.seqs[0].flags = FRAME_SEQ_NEW;
    g.seqs[0].pos = 5;
    send_hdr(s, &g, &tok, 4, 1);
    expect(s, "a new sequence not at position 0", "position 0");
    int32_t big = 1 << 30;
    g.seqs[0].pos = 0;
    send_hdr(s, &g, &big, 4, 1);
    expect(s, "a token id out of range", "out of range");
    frame_header v = f;
    v.seqs[0].n_tokens = 3;
    v.seqs[0].flags = FRAME_SEQ_NEW | FRAME_SEQ_VERIFY | FRAME_SEQ_HAS_Q;
    v.payload_bytes = 12;
    int32_t three[3] = {1, 2, 3};
    send_hdr(s, &v, three, 12, 1); /* HAS_Q but no q part */
    expect(s, "VERIFY that announces draft distributions and sends none", "malformed");
    /* A stale VERIFY block (it starts past what its sequence committed: the coordinator moved on) is not run;
     * one that also asks for every row's logits (no coordinator sends both, a fuzzer did) gets zero rows back,
     * never rows read from a batch it was not part of (CI's fuzz seed 1796450711 crashed the node there). */
    frame_header sv = f;
    sv.seqs[0].seq_id = 60;
    sv.seqs[0].n_tokens = 2;
    sv.seqs[0].flags = FRAME_SEQ_NEW | FRAME_SEQ_VERIFY;
    sv.payload_bytes = 8;
    int32_t two[2] = {1, 2};
    send_hdr(s, &sv, two, 8, 1);
    int st1 = reply(s, msg, sizeof msg);
    sv.seqs[0].flags = FRAME_SEQ_VERIFY | FRAME_SEQ_ALL_LOGITS;
    sv.seqs[0].pos = 10;
    send_hdr(s, &sv, two, 8, 1);
    size_t got_len = 0;
    uint8_t *got = result_payload(s, &got_len);
    const size_t want = 4 + 2 * (size_t)hp.n_vocab * 4;
    int zeros = st1 == FRAME_RESULT && got && got_len == want;
    for (size_t k = 0; zeros && k < want; k++) zeros = got[k] == 0;
    free(got);
    printf("%s - a stale VERIFY block that asks for every row's logits: not run, 0 committed, zero rows (%zu bytes)\n",
           zeros ? "ok" : "not ok", got_len);
    zeros ? n_pass++ : n_fail++;
    still_answering(s, "a stale VERIFY block with every row's logits");
    /* The sampler's part: logit biases and grammars of new sequences, checked before anything runs. */
    frame_header b = f;
    b.seqs[0].seq_id = 50;
    b.seqs[0].flags = FRAME_SEQ_NEW | FRAME_SEQ_HAS_BIAS;
    send_hdr(s, &b, &tok, 4, 1);
    expect(s, "logit biases announced and not sent", "logit biases are missing");
    uint8_t qb[256] = {0};
    uint32_t nb = 1000;
    memcpy(qb, &nb, 4);
    send_hdr4(s, &b, &tok, 4, qb, 12);
    expect(s, "more logit biases than the part holds", "do not fit the frame");
    b.seqs[0].flags = FRAME_SEQ_HAS_BIAS; /* on a sequence's later frame */
    send_hdr4(s, &b, &tok, 4, qb, 12);
    expect(s, "logit biases on a frame that does not start the sequence", "does not start it");
    b.seqs[0].flags = FRAME_SEQ_NEW | FRAME_SEQ_HAS_GRAMMAR;
    send_hdr(s, &b, &tok, 4, 1);
    expect(s, "a grammar announced and not sent", "grammar is missing");
    uint32_t gl = 100000;
    memcpy(qb + 4, &gl, 4);
    send_hdr4(s, &b, &tok, 4, qb, 40);
    expect(s, "a grammar longer than the part", "does not fit the frame");
    gl = 32;
    memcpy(qb + 4, &gl, 4);
    memset(qb + 8, 'x', 32);
    send_hdr4(s, &b, &tok, 4, qb, 40);
    expect(s, "a grammar that is not one", "not a grammar's wire form");
    /* A rebuilt sequence's resume point (FRAME_SEQ_RESUME): missing, past its frame, or on a VERIFY block. */
    b.seqs[0].flags = FRAME_SEQ_NEW | FRAME_SEQ_RESUME;
    send_hdr(s, &b, &tok, 4, 1);
    expect(s, "a resume announced and its point not sent", "resume point is missing");
    uint32_t at = 5;
    send_hdr4(s, &b, &tok, 4, &at, 4);
    expect(s, "a resume point past the frame's tokens", "resumed at token 5 of a 1-token frame");
    b.seqs[0].flags = FRAME_SEQ_RESUME | FRAME_SEQ_VERIFY;
    send_hdr4(s, &b, &tok, 4, &at, 4);
    expect(s, "a resumed sequence starting with a VERIFY block", "cannot start with a VERIFY block");
    b.seqs[0].flags = FRAME_SEQ_NEW | FRAME_SEQ_HAS_GRAMMAR;
    gr_grammar *jg = js_object_grammar_new(&err);
    uint8_t *gw = NULL;
    size_t gwl = 0;
    if (!jg || gr_encode(jg, &gw, &gwl) != 0) {
        printf("not ok - a grammar to send: %s\n", err.msg);
        n_fail++;
    } else {
        uint8_t *q2 = malloc(8 + gwl);
        int32_t budget = 0;
        uint32_t l32 = (uint32_t)gwl;
        memcpy(q2, &budget, 4), memcpy(q2 + 4, &l32, 4), memcpy(q2 + 8, gw, gwl);
        q2[8 + 20] ^= 1; /* n_items off by one: the counts no longer add up to its bytes */
        send_hdr4(s, &b, &tok, 4, q2, 8 + gwl);
        expect(s, "a grammar whose counts do not match its bytes", "do not match");
        q2[8 + 20] ^= 1;
        /* A valid one: the node samples the first token of a JSON object. */
        tok_tokenizer tk;
        b.seqs[0].seq_id = 51;
        send_hdr4(s, &b, &tok, 4, q2, 8 + gwl);
        rl_err e;
        int32_t got = -1;
        size_t rl = 0;
        uint8_t *res = result_payload(s, &rl);
        if (res && rl >= 4) memcpy(&got, res, 4);
        free(res);
        char *text = NULL;
        bool brace = false;
        if (got >= 0 && tok_load(&tk, &m, &e) == 0) {
            size_t tl = 0;
            if (tok_decode(&tk, &got, 1, false, false, &text, &tl, &e) == 0) brace = tl > 0 && text[0] == 0x7b;
            free(text);
            tok_free(&tk);
        }
        printf("%s - a new sequence with a valid grammar (json_object) samples a token that opens an object (%d)\n",
               brace ? "ok" : "not ok", got);
        brace ? n_pass++ : n_fail++;
        free(q2);
    }
    free(gw);
    gr_free(jg);
    frame_header fd = {.type = FRAME_FETCH_DATA};
    send_hdr(s, &fd, "x", 1, 0);
    expect(s, "FETCH_DATA without FETCH_BEGIN", "without FETCH_BEGIN");
    /* Probing (net/probe.h): malformed PEERS and PROBE are refused by name; a PROBE_PING from a key the
     * coordinator did not name a peer (here the coordinator's own) gets no answer; a peer that is not there
     * is reported as unanswered (-1), not as an error. */
    frame_header pe = {.type = FRAME_PEERS}, pr = {.type = FRAME_PROBE};
    frame_header le = {.type = FRAME_LEND};
    send_hdr(s, &le, "{}", 2, 0);
    expect(s, "LEND without fetchers", "LEND lacks its fetchers");
    send_hdr(s, &le, "{\"fetchers\":[7]}", strlen("{\"fetchers\":[7]}"), 0);
    expect(s, "LEND naming a key that is not one", "LEND: a fetcher key is not valid");
    send_hdr(s, &pe, bad_json, strlen(bad_json), 0);
    expect(s, "PEERS that is not JSON", "PEERS lacks its peers");
    send_hdr(s, &pe, "{\"peers\":[\"beef\"]}", strlen("{\"peers\":[\"beef\"]}"), 0);
    expect(s, "PEERS naming a key that is not one", "a peer key is not valid");
    send_hdr(s, &pr, "{}", 2, 0);
    expect(s, "PROBE without peers", "PROBE lacks its peers");
    send_hdr(s, &pr, "{\"peers\":[{\"addr\":\"127.0.0.1:1\"}]}", strlen("{\"peers\":[{\"addr\":\"127.0.0.1:1\"}]}"), 0);
    expect(s, "PROBE of a peer without a key", "a peer lacks a valid addr or key");
    frame_header pp = {.type = FRAME_PROBE_PING, .step_id = 3};
    send_hdr(s, &pp, NULL, 0, 0);
    int pt = reply_within(s, 1000, msg, sizeof msg);
    printf("%s - a PROBE_PING from a key not named a peer gets no answer\n", pt == 0 ? "ok" : "not ok");
    pt == 0 ? n_pass++ : n_fail++;
    snprintf(js, sizeof js, "{\"peers\":[{\"addr\":\"127.0.0.1:1\",\"key\":\"%s\"}]}", node_key);
    send_hdr(s, &pr, js, strlen(js), 0);
    pt = reply_within(s, 15000, msg, sizeof msg); /* (the probe gives up on the peer after 5 s) */
    int pok = pt == FRAME_PROBE_RESULT && strcmp(msg, "{\"rtt_s\":[-1]}") == 0;
    printf("%s - a PROBE of a peer that is not there: unanswered, %s\n", pok ? "ok" : "not ok", pt ? msg : "(no reply)");
    pok ? n_pass++ : n_fail++;
    if (fuzz > 0) fuzz_frames(s, fuzz, seed, hash, hp.n_layer);
    zmq_close(s);
    zmq_ctx_term(ctx);
    mf_close(&m);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
