/* test_receipt - signed receipts and manifest hashes (src/trust/receipt.h, manifest.h):
 *   sign/verify; the encoding is canonical (same receipt, same bytes; every single field change gives
 *   other bytes and a failing signature; non-canonical receipts refused); pack/unpack and JSON round
 *   trips; the nonce book (FIFO eviction, consistency under churn); the traversal checks catch a gap, an
 *   overlap, wrong order, a broken chain, a reused nonce, a receipt of another request, a foreign key, a
 *   stage claiming a range it was not given, a wrong manifest hash (and honest 1-, 2- and 4-stage
 *   traversals pass); the manifest hash of a range is the same for the whole model, a split set and a
 *   range file, and changes with one weight byte or one metadata value. Timings on "# " lines. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "ggml.h"
#include "gguf.h"
#include "gguf/model_file.h"
#include "model/k3_hparams.h"
#include "tools/synth.h"
#include "tools/synth_config.h"
#include "trust/keys.h"
#include "trust/manifest.h"
#include "trust/receipt.h"

#include "check.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

enum { N_NODES = 5 }; /* 4 ring nodes + 1 foreign key */
static keys_identity ids[N_NODES];

/* ---- a traversal builder ---- */

typedef struct trav {
    int n;
    uint32_t n_layer;
    receipt_rec rs[8];
    receipt_stage_expect st[8];
    receipt_expect e;
    uint8_t first_in[32], last_out[32];
    receipt_seq seqs[2];
} trav;

/* An honest traversal of n stages over L layers: stage i on node i, layers cut evenly, chained hashes. */
static void make_trav(trav *t, int n, uint32_t L, uint64_t request, const uint8_t nonce[32]) {
    memset(t, 0, sizeof *t);
    t->n = n;
    t->n_layer = L;
    t->seqs[0] = (receipt_seq){.seq_id = 3, .pos = 10, .n_tokens = 1};
    t->seqs[1] = (receipt_seq){.seq_id = 9, .pos = 0, .n_tokens = 7};
    char buf[64];
    snprintf(buf, sizeof buf, "tokens of request %llu", (unsigned long long)request);
    uint8_t prev[32];
    receipt_hash(buf, strlen(buf), prev);
    memcpy(t->first_in, prev, 32);
    for (int i = 0; i < n; i++) {
        receipt_rec *r = &t->rs[i];
        receipt_stage_expect *s = &t->st[i];
        s->layer_start = L * (uint32_t)i / (uint32_t)n;
        s->layer_end = L * (uint32_t)(i + 1) / (uint32_t)n;
        memcpy(s->node_pk, ids[i].sign_pk, 32);
        snprintf(buf, sizeof buf, "manifest %u-%u", s->layer_start, s->layer_end);
        receipt_hash(buf, strlen(buf), s->manifest);
        r->ring_id = 0xfedcba9876543210ULL;
        r->request_id = request;
        memcpy(r->nonce, nonce, 32);
        memcpy(r->manifest, s->manifest, 32);
        r->layer_start = s->layer_start;
        r->layer_end = s->layer_end;
        memcpy(r->in_hash, prev, 32);
        snprintf(buf, sizeof buf, "output of stage %d of request %llu", i, (unsigned long long)request);
        receipt_hash(buf, strlen(buf), r->out_hash);
        memcpy(prev, r->out_hash, 32);
        receipt_seq rev[2] = {t->seqs[1], t->seqs[0]}; /* given unsorted: receipt_set_seqs sorts */
        receipt_set_seqs(r, rev, 2, NULL);
        receipt_sign(r, &ids[i], NULL);
    }
    memcpy(t->last_out, prev, 32);
    t->e = (receipt_expect){.ring_id = 0xfedcba9876543210ULL,
                         .request_id = request,
                         .n_layer = L,
                         .n_stages = n,
                         .stages = t->st,
                         .first_in = t->first_in,
                         .last_out = t->last_out,
                         .seqs = t->seqs,
                         .n_seqs = 2};
    memcpy(t->e.nonce, nonce, 32);
}

/* Problems reported by a check, one message each. */
typedef struct probs {
    int n;
    char msg[32][512];
} probs;

static void collect(void *user, int stage, const char *msg) {
    probs *p = user;
    if (p->n < 32) snprintf(p->msg[p->n], sizeof p->msg[0], "[stage %d] %s", stage, msg);
    p->n++;
}

static probs run_check(const trav *t) {
    probs p = {0};
    int k = receipt_check_traversal_all(t->rs, t->n, &t->e, collect, &p);
    if (k != p.n) p.n = -1;
    return p;
}

static const char *first_msg(const probs *p) { return p->n > 0 ? p->msg[0] : ""; }

/* The check reports a problem whose message contains `want`; prints that message (or all of them). */
static void expect_problem(const trav *t, const char *what, const char *want) {
    probs p = run_check(t);
    int hit = -1;
    for (int i = 0; i < p.n && i < 32 && hit < 0; i++) {
        if (strstr(p.msg[i], want)) hit = i;
    }
    CHECK(hit >= 0, "%s is caught: %s", what, hit >= 0 ? p.msg[hit] : "(not reported)");
    if (hit < 0) {
        for (int i = 0; i < p.n && i < 32; i++) printf("    got: %s\n", p.msg[i]);
    }
}

static void resign(trav *t, int i, int key) { receipt_sign(&t->rs[i], &ids[key], NULL); }

/* A copy whose expectations point into the copy itself (a struct copy would point into the original). */
static void copy_trav(trav *dst, const trav *src) {
    *dst = *src;
    dst->e.stages = dst->st;
    dst->e.first_in = src->e.first_in ? dst->first_in : NULL;
    dst->e.last_out = src->e.last_out ? dst->last_out : NULL;
    dst->e.seqs = src->e.seqs ? dst->seqs : NULL;
}

/* ---- encoding ---- */

static void test_encoding(void) {
    uint8_t nonce[32];
    randombytes_buf(nonce, 32);
    trav t;
    make_trav(&t, 2, 6, 7, nonce);
    receipt_rec r = t.rs[1];
    rl_err err = {{0}};
    CHECK(receipt_verify_sig(&r, &err) == 0, "a signed receipt verifies (%s)", err.msg);
    CHECK(r.seqs[0].seq_id == 3 && r.seqs[1].seq_id == 9, "receipt_set_seqs sorts the sequences by seq id");

    uint8_t a[RECEIPT_MAX_ENCODED], b[RECEIPT_MAX_ENCODED];
    size_t la = 0, lb = 0;
    receipt_encode(&r, a, sizeof a, &la, NULL);
    receipt_rec copy = r;
    receipt_encode(&copy, b, sizeof b, &lb, NULL);
    CHECK(la == lb && la == RECEIPT_FIXED_BYTES + 2 * RECEIPT_SEQ_BYTES && memcmp(a, b, la) == 0,
          "same receipt, same %zu bytes (194 + 16 per sequence)", la);
    CHECK(memcmp(a, "RCP1", 4) == 0 && a[4] == 1 && a[5] == 0 && a[6] == 0x10 && a[13] == 0xfe && a[14] == 7 &&
              a[86] == 3 && a[90] == 6 && memcmp(a + 158, ids[1].sign_pk, 32) == 0 && a[190] == 2 && a[194] == 3 &&
              a[194 + 8] == 10 && a[194 + 16] == 9 && a[194 + 28] == 7,
          "the bytes sit where docs/receipts.md says (magic, version, ring id LE, layers, signer, seqs)");
    /* A minimal receipt, byte by byte as documented: all zero but version 1, layers [0, 1), one sequence
     * (id 0, pos 0, 1 token). */
    receipt_rec z;
    memset(&z, 0, sizeof z);
    z.version = 1, z.layer_end = 1, z.n_seqs = 1, z.seqs[0].n_tokens = 1;
    size_t lz = 0;
    receipt_encode(&z, b, sizeof b, &lz, NULL);
    char hz[2 * 210 + 1], want[2 * 210 + 1] = "";
    sodium_bin2hex(hz, sizeof hz, b, lz);
    const char *parts[][2] = {{"52435031", "1"}, {"0100", "1"}, {"00", "16"},      {"00", "64"}, {"00000000", "1"},
                              {"01000000", "1"}, {"00", "96"},  {"01000000", "1"}, {"00", "12"}, {"01000000", "1"}};
    for (size_t k = 0; k < sizeof parts / sizeof parts[0]; k++) {
        for (int rep = atoi(parts[k][1]); rep > 0; rep--) strcat(want, parts[k][0]);
    }
    CHECK(lz == 210 && strcmp(hz, want) == 0, "a minimal receipt encodes to the documented 210 bytes");

    /* Every single field change: other bytes, and the old signature fails. */
    struct {
        const char *name;
        int field;
    } muts[] = {{"version", 0},
                {"ring id", 1},
                {"request id", 2},
                {"nonce", 3},
                {"manifest", 4},
                {"layer_start", 5},
                {"layer_end", 6},
                {"input hash", 7},
                {"output hash", 8},
                {"signer", 9},
                {"seq id", 10},
                {"first pos", 11},
                {"n tokens", 12},
                {"one more sequence", 13},
                {"one sequence fewer", 14}};
    for (size_t k = 0; k < sizeof muts / sizeof muts[0]; k++) {
        receipt_rec m = r;
        switch (muts[k].field) {
        case 0: m.version = 2; break;
        case 1: m.ring_id ^= 1ull << 63; break;
        case 2: m.request_id++; break;
        case 3: m.nonce[31] ^= 1; break;
        case 4: m.manifest[0] ^= 0x80; break;
        case 5: m.layer_start = 4; break;
        case 6: m.layer_end = 5; break;
        case 7: m.in_hash[17] ^= 4; break;
        case 8: m.out_hash[31] ^= 1; break;
        case 9: memcpy(m.signer, ids[2].sign_pk, 32); break;
        case 10: m.seqs[1].seq_id = 10; break;
        case 11: m.seqs[0].pos++; break;
        case 12: m.seqs[1].n_tokens = 8; break;
        case 13: m.seqs[2] = (receipt_seq){.seq_id = 11, .pos = 0, .n_tokens = 1}, m.n_seqs = 3; break;
        case 14: m.n_seqs = 1; break;
        }
        size_t lm = 0;
        int enc = receipt_encode(&m, b, sizeof b, &lm, NULL);
        bool differs = enc != 0 || lm != la || memcmp(a, b, la) != 0;
        CHECK(differs && receipt_verify_sig(&m, &err) != 0,
              "changing the %s changes the bytes%s and fails the signature (%s)", muts[k].name,
              enc ? " (refused: no longer canonical)" : "", err.msg);
    }
    receipt_rec s = r;
    s.sig[5] ^= 1;
    CHECK(receipt_verify_sig(&s, NULL) != 0, "a flipped signature bit fails");

    /* Non-canonical receipts are refused rather than signed. */
    receipt_rec u = r;
    u.seqs[0] = r.seqs[1], u.seqs[1] = r.seqs[0];
    CHECK(receipt_sign(&u, &ids[1], &err) != 0 && strstr(err.msg, "ascending"), "unsorted sequences are refused: %s",
          err.msg);
    u = r;
    u.seqs[1].seq_id = u.seqs[0].seq_id;
    CHECK(receipt_sign(&u, &ids[1], &err) != 0, "a repeated seq id is refused: %s", err.msg);
    receipt_seq dup[2] = {{1, 0, 1}, {1, 5, 1}};
    CHECK(receipt_set_seqs(&u, dup, 2, &err) != 0, "receipt_set_seqs refuses a repeated seq id: %s", err.msg);
    u = r;
    u.layer_end = u.layer_start;
    CHECK(receipt_sign(&u, &ids[1], &err) != 0, "an empty layer range is refused: %s", err.msg);
    u = r;
    u.seqs[0].n_tokens = 0;
    CHECK(receipt_sign(&u, &ids[1], &err) != 0, "a sequence of 0 tokens is refused: %s", err.msg);

    /* Wire form. */
    uint8_t w[RECEIPT_MAX_PACKED];
    size_t lw = 0;
    receipt_rec back;
    CHECK(receipt_pack(&r, w, sizeof w, &lw, &err) == 0 && lw == la + 64 && receipt_unpack(&back, w, lw, &err) == 0 &&
              receipt_equal(&back, &r) && receipt_verify_sig(&back, NULL) == 0,
          "pack/unpack round trip (%zu bytes) keeps the signature valid", lw);
    CHECK(receipt_unpack(&back, w, lw - 1, &err) != 0, "a truncated wire receipt is refused: %s", err.msg);
    w[194] = 200; /* seq id of entry 0 above entry 1: not canonical */
    CHECK(receipt_unpack(&back, w, lw, &err) != 0 && strstr(err.msg, "canonical"),
          "a non-canonical wire receipt is refused: %s", err.msg);
}

static void test_json(void) {
    uint8_t nonce[32];
    randombytes_buf(nonce, 32);
    trav t;
    make_trav(&t, 1, 6, UINT64_MAX, nonce);
    receipt_rec r = t.rs[0];
    r.ring_id = UINT64_MAX - 1; /* above 2^53: JSON numbers would round it */
    r.seqs[1].seq_id = UINT64_MAX;
    receipt_sign(&r, &ids[0], NULL);
    char *j1 = NULL, *j2 = NULL;
    receipt_rec back;
    rl_err err = {{0}};
    int ok = receipt_to_json(&r, &j1, &err) == 0 && !strchr(j1, '\n') && receipt_from_json(&back, j1, &err) == 0 &&
             receipt_equal(&back, &r) && receipt_to_json(&back, &j2, &err) == 0 && strcmp(j1, j2) == 0 &&
             receipt_verify_sig(&back, &err) == 0;
    CHECK(ok, "JSON round trip is exact, one line, u64 values above 2^53 included (%s)", err.msg);
    printf("# %s\n", j1 ? j1 : "");
    struct {
        const char *what, *from, *to, *msg;
    } bad[] = {
        {"a missing key", "\"v\":1,", "", "lacks the key \"v\""},
        {"an unknown key", "\"v\":1,", "\"v\":1,\"extra\":1,", "unknown key"},
        {"a u64 as a JSON number", "\"request_id\":\"18446744073709551615\"", "\"request_id\":18446744073709551615",
         "decimal string"},
        {"a u64 that overflows", "\"request_id\":\"18446744073709551615\"", "\"request_id\":\"18446744073709551616\"",
         "decimal u64"},
        {"a short hex field", "\"nonce\":\"", "\"nonce\":\"0", "hex digits"},
        {"trailing garbage", NULL, NULL, "not valid JSON"},
        {"another version", "\"v\":1,", "\"v\":2,", "version 2"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        char line[4096];
        if (!bad[k].from) {
            snprintf(line, sizeof line, "%s}", j1);
        } else {
            const char *at = strstr(j1, bad[k].from);
            snprintf(line, sizeof line, "%.*s%s%s", (int)(at - j1), j1, bad[k].to, at + strlen(bad[k].from));
        }
        int rc = receipt_from_json(&back, line, &err);
        CHECK(rc != 0 && strstr(err.msg, bad[k].msg), "JSON with %s is refused: %s", bad[k].what, err.msg);
    }
    free(j1);
    free(j2);
}

static void test_book(void) {
    receipt_nonce_book b;
    rl_err err;
    receipt_book_init(&b, 4, &err);
    uint8_t n[6][32];
    for (int i = 0; i < 6; i++) randombytes_buf(n[i], 32);
    int added = 0;
    for (int i = 0; i < 4; i++) added += receipt_book_add(&b, n[i]);
    CHECK(added == 4 && receipt_book_add(&b, n[2]) == 0 && receipt_book_has(&b, n[0]),
          "the nonce book remembers and refuses a repeat");
    receipt_book_add(&b, n[4]);
    CHECK(!receipt_book_has(&b, n[0]) && receipt_book_has(&b, n[1]) && receipt_book_has(&b, n[4]) && b.n == 4,
          "a full book forgets its oldest nonce first (FIFO)");
    receipt_book_free(&b);

    /* Churn: 200000 nonces through a book of 1000 (probing and backward-shift deletion stay consistent). */
    enum { CAP = 1000, TOTAL = 200000 };
    receipt_book_init(&b, CAP, &err);
    uint8_t(*all)[32] = malloc((size_t)TOTAL * 32);
    for (int i = 0; i < TOTAL; i++) {
        randombytes_buf(all[i], 32);
        receipt_book_add(&b, all[i]);
    }
    int wrong = 0;
    for (int i = 0; i < TOTAL; i++) wrong += receipt_book_has(&b, all[i]) != (i >= TOTAL - CAP);
    CHECK(wrong == 0 && b.n == CAP, "after 200000 nonces a 1000-entry book holds exactly the last 1000 (%d wrong)",
          wrong);
    free(all);
    receipt_book_free(&b);
}

/* ---- traversal checks ---- */

static void test_traversals(void) {
    receipt_nonce_book book;
    receipt_book_init(&book, 64, NULL);
    uint8_t nonce[32];
    trav t;
    for (int n = 1; n <= 4; n *= 2) {
        randombytes_buf(nonce, 32);
        make_trav(&t, n, 12, 100 + (uint64_t)n, nonce);
        t.e.seen = &book;
        probs p = run_check(&t);
        CHECK(p.n == 0, "an honest %d-stage traversal verifies%s%s", n, p.n ? ": " : "", first_msg(&p));
        rl_err err = {{0}};
        t.e.seen = NULL;
        CHECK(receipt_check_traversal(t.rs, t.n, &t.e, &err) == 0, "receipt_check_traversal agrees (%d stages)", n);
    }

    randombytes_buf(nonce, 32);
    trav good;
    make_trav(&good, 4, 12, 7, nonce); /* stages [0,3) [3,6) [6,9) [9,12) */

    /* Skipped layers: stage 2 starts one layer late (node re-signs its false claim). */
    copy_trav(&t, &good);
    t.rs[2].layer_start = 7;
    resign(&t, 2, 2);
    expect_problem(&t, "a gap (stage 2 claims [7, 9))",
                   "coverage: layers [6, 7) are skipped between stage 1 and stage 2");
    /* The same gap in the assignment itself (a coordinator bug): receipts and assignment agree, coverage does not. */
    t.st[2].layer_start = 7;
    expect_problem(&t, "a gap in the assignment", "layers [6, 7) are skipped");
    copy_trav(&t, &good);
    t.n = 3;
    t.e.n_stages = 3;
    t.e.last_out = NULL;
    expect_problem(&t, "a missing last stage",
                   "layers [9, 12) are skipped: the last stage ends at layer 9 of the model's 12");

    /* Overlap: stage 1 runs one layer into stage 2's range. */
    copy_trav(&t, &good);
    t.rs[1].layer_end = 7;
    resign(&t, 1, 1);
    expect_problem(&t, "an overlap", "layers [6, 7) run twice: stage 2 (layers [6, 9)) overlaps stage 1");

    /* Wrong order: stages 1 and 2 swapped. */
    copy_trav(&t, &good);
    t.rs[1] = good.rs[2];
    t.rs[2] = good.rs[1];
    expect_problem(&t, "wrong order", "order: stage 2's layers [3, 6) come before stage 1's [6, 9)");

    /* Broken chain: stage 1's output hash perturbed (and re-signed: the node lies consistently). */
    copy_trav(&t, &good);
    t.rs[1].out_hash[0] ^= 1;
    resign(&t, 1, 1);
    expect_problem(&t, "a broken chain", "chain: broken between stage 1 and stage 2");
    copy_trav(&t, &good);
    t.rs[3].out_hash[0] ^= 1;
    resign(&t, 3, 3);
    expect_problem(&t, "a last stage whose output is not the result received",
                   "but the result the coordinator received");

    /* Replay: the same nonce twice. */
    copy_trav(&t, &good);
    t.e.seen = &book;
    probs p1 = run_check(&t);
    CHECK(p1.n == 0, "the traversal verifies the first time its nonce is seen%s%s", p1.n ? ": " : "", first_msg(&p1));
    expect_problem(&t, "a reused nonce (the whole traversal replayed)", "was already used by an earlier traversal");
    t.e.seen = NULL;

    /* Replay: stage 2's receipt taken from another request (request 6, its own nonce). */
    uint8_t old_nonce[32];
    randombytes_buf(old_nonce, 32);
    trav old;
    make_trav(&old, 4, 12, 6, old_nonce);
    copy_trav(&t, &good);
    t.rs[2] = old.rs[2];
    expect_problem(&t, "a receipt of another request (request id)", "request id 6, but this traversal is request 7");
    expect_problem(&t, "a receipt of another request (nonce)", "(a receipt of another traversal)");

    /* Another key: signed (validly) by the foreign key instead of node 2. */
    copy_trav(&t, &good);
    resign(&t, 2, 4);
    char want[200];
    snprintf(want, sizeof want, "signer: signed by %s, but stage 2 (layers [6, 9)) was assigned to %s", ids[4].pk_hex,
             ids[2].pk_hex);
    expect_problem(&t, "a receipt signed by another key", want);
    /* Another key claiming to be node 2: the signature fails. */
    copy_trav(&t, &good);
    resign(&t, 2, 4);
    memcpy(t.rs[2].signer, ids[2].sign_pk, 32);
    expect_problem(&t, "a receipt signed by another key under node 2's name",
                   "signature: the signature does not verify");
    /* Altered after signing. */
    copy_trav(&t, &good);
    t.rs[0].seqs[0].pos++;
    snprintf(want, sizeof want, "stage 0 (layers [0, 3), node %.16s..): signature: the signature does not verify",
             ids[0].pk_hex);
    expect_problem(&t, "a receipt altered after signing", want);

    /* A stage claiming a range it was not given (the ranges still tile the model). */
    copy_trav(&t, &good);
    t.rs[1].layer_end = 7, t.rs[2].layer_start = 7;
    resign(&t, 1, 1);
    resign(&t, 2, 2);
    expect_problem(&t, "a stage claiming a range it was not given",
                   "claims layers [3, 7), but stage 1 was assigned [3, 6)");

    /* Wrong manifest hash: another model (or other weights) for stage 3. */
    copy_trav(&t, &good);
    t.rs[3].manifest[5] ^= 1;
    resign(&t, 3, 3);
    snprintf(want, sizeof want, "stage 3 (layers [9, 12), node %.16s..): manifest: hash", ids[3].pk_hex);
    expect_problem(&t, "a wrong manifest hash", want);

    /* Other fields that must agree. */
    copy_trav(&t, &good);
    t.rs[1].ring_id++;
    resign(&t, 1, 1);
    expect_problem(&t, "a receipt of another ring",
                   "ring id 18364758544493064721, but this traversal ran on ring 18364758544493064720");
    copy_trav(&t, &good);
    t.rs[2].seqs[1].pos = 1;
    resign(&t, 2, 2);
    expect_problem(
        &t, "other positions",
        "positions: sequence entry 1 is (seq 9, pos 1, 7 tokens), but the coordinator sent (seq 9, pos 0, 7 tokens)");
    t.e.seqs = NULL;
    expect_problem(&t, "other positions than stage 0's", "but stage 0 has (seq 9, pos 0, 7 tokens)");
    copy_trav(&t, &good);
    t.first_in[0] ^= 1;
    expect_problem(&t, "a first stage whose input is not the tokens sent",
                   "but the tokens the coordinator sent hash to");
    copy_trav(&t, &good);
    t.n = 5;
    t.rs[4] = good.rs[3];
    expect_problem(&t, "an extra receipt", "5 receipts, but the traversal was assigned 4 stages");

    rl_err err = {{0}};
    copy_trav(&t, &good);
    t.rs[1].layer_end = 7;
    resign(&t, 1, 1);
    int rc = receipt_check_traversal(t.rs, t.n, &t.e, &err);
    CHECK(rc != 0 && strstr(err.msg, "more problem"), "receipt_check_traversal returns the first problem and a count: %s",
          err.msg);
    receipt_book_free(&book);
}

/* ---- manifest hashes ---- */

/* A range file made the way the coordinator makes one (ring_stream): all metadata copied with
 * gguf_set_kv, split.* removed, ringlm.range.* added, only the range's tensors - added here in reverse
 * file order, to show the order does not matter. set_key/set_val: one metadata value changed. */
static int write_range(const mf_model *m, uint32_t a, uint32_t b, uint32_t L, const char *path, const char *set_key,
                       const char *set_val) {
    struct gguf_context *g = gguf_init_empty();
    gguf_set_kv(g, m->meta);
    gguf_remove_key(g, "split.no");
    gguf_remove_key(g, "split.count");
    gguf_remove_key(g, "split.tensors.count");
    gguf_set_val_u32(g, "ringlm.range.start", a);
    gguf_set_val_u32(g, "ringlm.range.end", b);
    gguf_set_val_str(g, "ringlm.range.model_blake2b", "00");
    if (set_key) gguf_set_val_str(g, set_key, set_val);
    struct ggml_init_params ip = {
        .mem_size = (size_t)(m->n_tensor + 1) * ggml_tensor_overhead(), .mem_buffer = NULL, .no_alloc = true};
    struct ggml_context *tctx = ggml_init(ip);
    for (int i = m->n_tensor - 1; i >= 0; i--) {
        const mf_tensor *t = &m->tensors[i];
        if (!manifest_tensor_in_range(t->name, a, b, L)) continue;
        struct ggml_tensor *d = ggml_new_tensor(tctx, (enum ggml_type)t->type, 4, t->ne);
        ggml_set_name(d, t->name);
        gguf_add_tensor(g, d);
        gguf_set_tensor_data(g, t->name, t->data);
    }
    bool ok = gguf_write_to_file(g, path, false);
    ggml_free(tctx);
    gguf_free(g);
    return ok ? 0 : -1;
}

/* whole: a whole model (k3_open), else a range file (k3_open_range). */
static int hash_file(const char *path, bool whole, uint32_t a, uint32_t b, uint8_t out[32], rl_err *err) {
    mf_model m;
    k3_hparams hp;
    if ((whole ? k3_open(&m, &hp, path, err) : k3_open_range(&m, &hp, path, a, b, err)) != 0) return -1;
    int rc = manifest_range_hash(&m, &hp, a, b, out, err);
    mf_close(&m);
    return rc;
}

static void test_manifest(const char *dir) {
    char whole[256], split[256], split1[300], range[256], alt[256];
    snprintf(whole, sizeof whole, "%s/tiny.gguf", dir);
    snprintf(split, sizeof split, "%s/tinysplit.gguf", dir);
    snprintf(split1, sizeof split1, "%s/tinysplit-00001-of-00003.gguf", dir);
    snprintf(range, sizeof range, "%s/range.gguf", dir);
    snprintf(alt, sizeof alt, "%s/alt.gguf", dir);
    synth_config c;
    rl_err err = {{0}};
    if (synth_config_load(&c, "tiny", &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    c.type = synth_type_parse("q8_0");
    synth_opts so = {.out = whole, .seed = 5, .n_split = 1, .n_threads = 2};
    synth_opts so3 = {.out = split, .seed = 5, .n_split = 3, .n_threads = 2};
    if (synth_write(&c, &so, &err) != 0 || synth_write(&c, &so3, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    mf_model m;
    k3_hparams hp;
    if (k3_open(&m, &hp, whole, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    const uint32_t L = hp.n_layer;
    uint32_t cuts[][2] = {{0, 2}, {2, 4}, {4, L}, {0, L}, {3, 4}};
    for (size_t k = 0; k < sizeof cuts / sizeof cuts[0]; k++) {
        uint32_t a = cuts[k][0], b = cuts[k][1];
        uint8_t hw[32], hr[32], hs[32];
        err.msg[0] = 0;
        int ok = manifest_range_hash(&m, &hp, a, b, hw, &err) == 0 && write_range(&m, a, b, L, range, NULL, NULL) == 0 &&
                 hash_file(range, false, a, b, hr, &err) == 0 && hash_file(split1, true, a, b, hs, &err) == 0;
        CHECK(ok && memcmp(hw, hr, 32) == 0 && memcmp(hw, hs, 32) == 0,
              "layers [%u, %u): the whole file, a 3-way split set and a range file give the same manifest hash (%s)", a,
              b, err.msg);
    }
    uint8_t h01[32], h12[32], h1t[32];
    manifest_range_hash(&m, &hp, 0, 1, h01, NULL);
    manifest_range_hash(&m, &hp, 1, 2, h12, NULL);
    manifest_range_hash_threads(&m, &hp, 0, 1, 1, h1t, NULL);
    CHECK(memcmp(h01, h12, 32) != 0 && memcmp(h01, h1t, 32) == 0, "other ranges hash differently; 1 thread == many");

    /* One metadata value changed: the hash changes. A ringlm.* key added: it does not. */
    uint8_t h24[32], hx[32];
    manifest_range_hash(&m, &hp, 2, 4, h24, NULL);
    int ok = write_range(&m, 2, 4, L, alt, "general.name", "not the same model") == 0 &&
             hash_file(alt, false, 2, 4, hx, &err) == 0;
    CHECK(ok && memcmp(hx, h24, 32) != 0, "one metadata value changed changes the hash");
    ok = write_range(&m, 2, 4, L, alt, "ringlm.note", "anything") == 0 && hash_file(alt, false, 2, 4, hx, &err) == 0;
    CHECK(ok && memcmp(hx, h24, 32) == 0, "a ringlm.* key added does not change the hash");

    /* One weight byte changed: the hash of its range changes, other ranges keep theirs. */
    const mf_tensor *t = mf_find(&m, "blk.3.ffn_down_exps.weight");
    if (!t) t = mf_find(&m, "blk.3.attn_norm.weight");
    FILE *fi = fopen(whole, "rb");
    FILE *fo = fopen(alt, "wb");
    char buf[1 << 16];
    size_t got, pos = 0, at = t ? t->offset + t->nbytes / 2 : 0;
    while (fi && fo && (got = fread(buf, 1, sizeof buf, fi)) > 0) {
        if (at >= pos && at < pos + got) buf[at - pos] ^= 0x01;
        fwrite(buf, 1, got, fo);
        pos += got;
    }
    if (fi) fclose(fi);
    if (fo) fclose(fo);
    uint8_t hb24[32], hb45[32], h45[32];
    manifest_range_hash(&m, &hp, 4, 5, h45, NULL);
    ok = t && hash_file(alt, true, 2, 4, hb24, &err) == 0 && hash_file(alt, true, 4, 5, hb45, &err) == 0;
    CHECK(ok && memcmp(hb24, h24, 32) != 0 && memcmp(hb45, h45, 32) == 0,
          "one weight byte of %s changed changes the hash of [2, 4) and not of [4, 5)", t ? t->name : "?");

    /* A range file of other layers cannot stand in. */
    write_range(&m, 0, 2, L, range, NULL, NULL);
    mf_model rm;
    k3_hparams rhp;
    uint8_t hh[32];
    int refused = 0;
    if (mf_open(&rm, range, &err) == 0) {
        rhp = hp;
        refused = manifest_range_hash(&rm, &rhp, 2, 4, hh, &err) != 0;
        mf_close(&rm);
    }
    CHECK(refused && strstr(err.msg, "no tensor of layer 2"), "hashing layers a range file lacks fails: %s", err.msg);
    CHECK(manifest_range_hash(&m, &hp, 4, 4, hh, &err) != 0 && manifest_range_hash(&m, &hp, 0, L + 1, hh, &err) != 0,
          "empty and out-of-model ranges are refused: %s", err.msg);

    /* Cost: the whole tiny model's hash. */
    double t0 = now();
    int reps = 20;
    for (int i = 0; i < reps; i++) manifest_range_hash(&m, &hp, 0, L, hh, NULL);
    double dt = (now() - t0) / reps;
    printf("# manifest_range_hash of the whole tiny model (%.1f MiB of tensors): %.2f ms (%.2f s per GB)\n",
           (double)m.tensor_bytes / 1048576.0, dt * 1e3, dt / ((double)m.tensor_bytes / 1e9));
    mf_close(&m);
}

static void bench_receipts(void) {
    /* One decode step of real K3 width: a boundary of 1 token x 7168 f32 (plus a banked checkpoint). */
    size_t bytes = 24 + 2 * 7168 * 4;
    uint8_t *state = calloc(1, bytes);
    uint8_t nonce[32];
    randombytes_buf(nonce, 32);
    trav t;
    make_trav(&t, 1, 6, 1, nonce);
    receipt_rec r = t.rs[0];
    int reps = 2000;
    double t0 = now();
    for (int i = 0; i < reps; i++) {
        state[0] = (uint8_t)i;
        receipt_hash(state, bytes, r.out_hash);
        receipt_sign(&r, &ids[0], NULL);
    }
    double sign_us = (now() - t0) / reps * 1e6;
    t0 = now();
    for (int i = 0; i < reps; i++) receipt_verify_sig(&r, NULL);
    double ver_us = (now() - t0) / reps * 1e6;
    t0 = now();
    for (int i = 0; i < reps; i++) receipt_sign(&r, &ids[0], NULL);
    double sign_only = (now() - t0) / reps * 1e6;
    printf("# receipt: hash a %zu-byte boundary + encode + sign: %.1f us (sign alone %.1f us); verify: %.1f us\n",
           bytes, sign_us, sign_only, ver_us);
    free(state);
}

int main(void) {
    if (sodium_init() < 0) return 1;
    for (int i = 0; i < N_NODES; i++) keys_generate(&ids[i], NULL);
    char dir[] = "/tmp/ringlm-rcpt-XXXXXX";
    if (!mkdtemp(dir)) return 1;
    test_encoding();
    test_json();
    test_book();
    test_traversals();
    test_manifest(dir);
    bench_receipts();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return check_done();
}
