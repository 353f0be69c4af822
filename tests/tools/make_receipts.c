/* make_receipts - writes a JSON-lines receipts log for a model, honest or with one deliberate defect, for
 * tests/t_receipts.sh.
 *
 *   make_receipts --model M.gguf --dir DIR [--stages N] [--traversals T] [--tamper KIND]
 *
 * Writes DIR/ring.conf (N nodes, 127.0.0.1:7701.., keys from fixed seeds), DIR/coord.pub (a coordinator
 * key, also fixed) and prints the log on stdout: T traversals of N stages each, layers cut evenly, request
 * ids 1001.., manifest hashes computed from the model. The defect goes into traversal 2 (1 if T == 1):
 *   gap          stage 1 claims one layer less at its start (re-signed)
 *   overlap      stage 1 claims one layer more at its start (re-signed)
 *   order        stages 0 and 1 signed by each other's node (against ring.conf order)
 *   chain        stage 1's output hash perturbed (re-signed)
 *   nonce        traversal 2 reuses traversal 1's nonce (its own request id)
 *   request      traversal 2's stage 1 receipt replaced by traversal 1's
 *   foreign      stage 1 signed by a key not in ring.conf
 *   coord        stage 1 signed by the coordinator's key
 *   badsig       stage 1's output hash changed after signing
 *   manifest     stage 0's manifest hash wrong (re-signed)
 *   ringid       stage 1 from another ring (re-signed)
 *   twice        stage 1 signed by stage 0's node
 *   positions    stage 1's position changed (re-signed)
 *   garbage      a line that is not a receipt
 *   missing      the last stage's receipt left out */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "gguf/model_file.h"
#include "model/k3_hparams.h"
#include "trust/keys.h"
#include "trust/manifest.h"
#include "trust/receipt.h"

static void seed_id(keys_identity *id, uint8_t seed_byte) {
    uint8_t seed[32];
    memset(seed, seed_byte, 32);
    memset(id, 0, sizeof *id);
    crypto_sign_seed_keypair(id->sign_pk, id->sign_sk, seed);
    sodium_bin2hex(id->pk_hex, sizeof id->pk_hex, id->sign_pk, 32);
}

static void hash_str(const char *s, uint8_t out[32]) { receipt_hash(s, strlen(s), out); }

int main(int argc, char **argv) {
    const char *model = NULL, *dir = NULL, *tamper = "none";
    int n_st = 2, n_tr = 3;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) goto usage;
        if (strcmp(argv[i], "--model") == 0)
            model = v;
        else if (strcmp(argv[i], "--dir") == 0)
            dir = v;
        else if (strcmp(argv[i], "--stages") == 0)
            n_st = atoi(v);
        else if (strcmp(argv[i], "--traversals") == 0)
            n_tr = atoi(v);
        else if (strcmp(argv[i], "--tamper") == 0)
            tamper = v;
        else
            goto usage;
        i++;
    }
    if (!model || !dir || n_st < 1 || n_st > 8 || n_tr < 1) goto usage;
    if (sodium_init() < 0) return 1;
    rl_err err = {{0}};
    mf_model m;
    k3_hparams hp;
    if (k3_open(&m, &hp, model, &err) != 0) {
        fprintf(stderr, "make_receipts: %s\n", err.msg);
        return 1;
    }
    const uint32_t L = hp.n_layer;
    if ((uint32_t)n_st > L) {
        fprintf(stderr, "make_receipts: %d stages for %u layers\n", n_st, L);
        return 1;
    }
    keys_identity nodes[8], foreign, coord;
    for (int i = 0; i < n_st; i++) seed_id(&nodes[i], (uint8_t)(0x10 + i));
    seed_id(&foreign, 0xEE);
    seed_id(&coord, 0xC0);
    char path[512];
    snprintf(path, sizeof path, "%s/ring.conf", dir);
    FILE *f = fopen(path, "w");
    if (!f) return 1;
    fprintf(f, "# written by make_receipts\n");
    for (int i = 0; i < n_st; i++) fprintf(f, "127.0.0.1:%d %s\n", 7701 + i, nodes[i].pk_hex);
    fclose(f);
    snprintf(path, sizeof path, "%s/coord.pub", dir);
    f = fopen(path, "w");
    if (!f) return 1;
    fprintf(f, "%s\n", coord.pk_hex);
    fclose(f);

    uint32_t ra[8], rb[8];
    uint8_t man[8][32];
    for (int i = 0; i < n_st; i++) {
        ra[i] = L * (uint32_t)i / (uint32_t)n_st;
        rb[i] = L * (uint32_t)(i + 1) / (uint32_t)n_st;
        if (manifest_range_hash(&m, &hp, ra[i], rb[i], man[i], &err) != 0) {
            fprintf(stderr, "make_receipts: %s\n", err.msg);
            return 1;
        }
    }
    const int bad_t = n_tr >= 2 ? 1 : 0, bs = n_st >= 2 ? 1 : 0;
    receipt_rec *all = calloc((size_t)n_tr * (size_t)n_st, sizeof *all);
    for (int t = 0; t < n_tr; t++) {
        char buf[128];
        snprintf(buf, sizeof buf, "nonce %d", t);
        uint8_t nonce[32], prev[32];
        hash_str(buf, nonce);
        if (t == bad_t && strcmp(tamper, "nonce") == 0) hash_str("nonce 0", nonce);
        snprintf(buf, sizeof buf, "tokens %d", t);
        hash_str(buf, prev);
        for (int i = 0; i < n_st; i++) {
            receipt_rec *r = &all[t * n_st + i];
            r->ring_id = 0x0123456789abcdefULL;
            r->request_id = 1001 + (uint64_t)t;
            memcpy(r->nonce, nonce, 32);
            memcpy(r->manifest, man[i], 32);
            r->layer_start = ra[i];
            r->layer_end = rb[i];
            memcpy(r->in_hash, prev, 32);
            snprintf(buf, sizeof buf, "state %d %d", t, i);
            hash_str(buf, r->out_hash);
            memcpy(prev, r->out_hash, 32);
            receipt_seq s[2] = {{.seq_id = 1, .pos = (uint32_t)t, .n_tokens = 1},
                             {.seq_id = 2, .pos = (uint32_t)t + 5, .n_tokens = 1}};
            receipt_set_seqs(r, s, 2, NULL);
            const keys_identity *key = &nodes[i];
            if (t == bad_t) {
                if (i == bs && strcmp(tamper, "gap") == 0) r->layer_start++;
                if (i == bs && strcmp(tamper, "overlap") == 0) r->layer_start--;
                if (i == bs && strcmp(tamper, "chain") == 0) r->out_hash[0] ^= 1;
                if (i == 0 && strcmp(tamper, "manifest") == 0) r->manifest[0] ^= 1;
                if (i == bs && strcmp(tamper, "ringid") == 0) r->ring_id++;
                if (i == bs && strcmp(tamper, "positions") == 0) r->seqs[1].pos++;
                if (i == bs && strcmp(tamper, "foreign") == 0) key = &foreign;
                if (i == bs && strcmp(tamper, "coord") == 0) key = &coord;
                if (i == bs && strcmp(tamper, "twice") == 0) key = &nodes[0];
                if (i <= 1 && n_st >= 2 && strcmp(tamper, "order") == 0) key = &nodes[1 - i];
            }
            if (receipt_sign(r, key, &err) != 0) {
                fprintf(stderr, "make_receipts: %s\n", err.msg);
                return 1;
            }
            if (t == bad_t && i == bs && strcmp(tamper, "badsig") == 0) r->out_hash[3] ^= 0x40;
        }
    }
    if (strcmp(tamper, "request") == 0 && n_tr >= 2) all[bad_t * n_st + bs] = all[0 * n_st + bs];
    for (int t = 0; t < n_tr; t++) {
        for (int i = 0; i < n_st; i++) {
            if (t == bad_t && i == n_st - 1 && strcmp(tamper, "missing") == 0) continue;
            char *js = NULL;
            if (receipt_to_json(&all[t * n_st + i], &js, &err) != 0) {
                fprintf(stderr, "make_receipts: %s\n", err.msg);
                return 1;
            }
            printf("%s\n", js);
            free(js);
            if (t == bad_t && i == 0 && strcmp(tamper, "garbage") == 0) printf("{\"v\":1,\"not\":\"a receipt\"}\n");
        }
    }
    free(all);
    mf_close(&m);
    return 0;
usage:
    fprintf(stderr, "usage: make_receipts --model M.gguf --dir DIR [--stages N] [--traversals T] [--tamper KIND]\n");
    return 2;
}
