/* ring_pair - two sequences at once through a ring, against the same batches on one machine.
 *
 *   ring_pair -m MODEL.gguf --ring ring.conf --key coord.key
 *
 * Sends a 20-token and a 13-token prompt in one FORWARD frame, then 4 decode steps carrying both
 * sequences, asking every position's logits; runs the same batches (same shapes) through a local engine;
 * prints "ok"/"not ok" lines and exits 0 only if every logit is identical. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/k3_forward.h"
#include "coord/coord.h"

int main(int argc, char **argv) {
    const char *model = NULL, *conf_path = NULL, *key = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-m")) model = argv[i + 1];
        else if (!strcmp(argv[i], "--ring")) conf_path = argv[i + 1];
        else if (!strcmp(argv[i], "--key")) key = argv[i + 1];
    }
    if (!model || !conf_path || !key) {
        fprintf(stderr, "usage: ring_pair -m MODEL --ring CONF --key KEY\n");
        return 2;
    }
    rl_err err;
    mf_model m;
    k3_hparams hp;
    ring_conf conf;
    keys_identity id;
    if (k3_open(&m, &hp, model, &err) != 0 || ring_conf_load(&conf, conf_path, &err) != 0 || keys_load(&id, key, &err) != 0) {
        fprintf(stderr, "ring_pair: %s\n", err.msg);
        return 1;
    }
    const uint32_t V = hp.n_vocab;
    int32_t a[24], b[17];
    uint64_t x = 99;
    for (int i = 0; i < 24; i++) a[i] = (int32_t)((x = x * 6364136223846793005ULL + 1) >> 33) % (int32_t)(V - 256);
    for (int i = 0; i < 17; i++) b[i] = (int32_t)((x = x * 6364136223846793005ULL + 1) >> 33) % (int32_t)(V - 256);
    float *ring_l = calloc((size_t)(24 + 17) * V, sizeof(float)), *local_l = calloc((size_t)(24 + 17) * V, sizeof(float));

    /* Through the ring. */
    ring_coord rc;
    ring_opts o = ring_opts_default();
    o.n_ctx = 256;
    o.quiet = true;
    if (ring_open(&rc, &conf, &id, &m, &hp, &o, &err) != 0) {
        fprintf(stderr, "ring_pair: %s\n", err.msg);
        return 1;
    }
    smp_params g = smp_params_default(0);
    g.temperature = 0;
    ring_seq_req rq[2] = {
        {.seq_id = 1, .pos = 0, .n = 20, .flags = FRAME_SEQ_NEW | FRAME_SEQ_ALL_LOGITS, .tokens = a, .smp = ring_sampling(&g),
         .logits = ring_l},
        {.seq_id = 2, .pos = 0, .n = 13, .flags = FRAME_SEQ_NEW | FRAME_SEQ_ALL_LOGITS, .tokens = b, .smp = ring_sampling(&g),
         .logits = ring_l + (size_t)24 * V}};
    int rc_ = ring_step(&rc, rq, 2, &err);
    for (int s = 0; s < 4 && rc_ == 0; s++) {
        rq[0] = (ring_seq_req){.seq_id = 1, .pos = 20 + (uint32_t)s, .n = 1, .flags = FRAME_SEQ_ALL_LOGITS, .tokens = a + 20 + s,
                               .smp = ring_sampling(&g), .logits = ring_l + (size_t)(20 + s) * V};
        rq[1] = (ring_seq_req){.seq_id = 2, .pos = 13 + (uint32_t)s, .n = 1, .flags = FRAME_SEQ_ALL_LOGITS, .tokens = b + 13 + s,
                               .smp = ring_sampling(&g), .logits = ring_l + (size_t)(24 + 13 + s) * V};
        rc_ = ring_step(&rc, rq, 2, &err);
    }
    ring_close(&rc);
    if (rc_ != 0) {
        fprintf(stderr, "ring_pair: %s\n", err.msg);
        return 1;
    }

    /* The same batches on one machine. */
    k3_engine e;
    k3_state sa, sb;
    if (k3_engine_init(&e, &m, &hp, 0, hp.n_layer, &(k3_engine_opts){.n_threads = 1}, &err) != 0 || k3_state_init(&sa, &e.hp, 0, hp.n_layer, 256, &err) != 0 ||
        k3_state_init(&sb, &e.hp, 0, hp.n_layer, 256, &err) != 0) {
        fprintf(stderr, "ring_pair: %s\n", err.msg);
        return 1;
    }
    k3_state *seqs[2] = {&sa, &sb};
    for (int s = -1; s < 4; s++) {
        uint32_t nt[2] = {s < 0 ? 20u : 1u, s < 0 ? 13u : 1u};
        int32_t toks[33], rows[33];
        memcpy(toks, s < 0 ? a : a + 20 + s, nt[0] * 4);
        memcpy(toks + nt[0], s < 0 ? b : b + 13 + s, nt[1] * 4);
        for (int r = 0; r < 33; r++) rows[r] = r;
        k3_batch bt = {.n_seqs = 2, .seqs = seqs, .n_tokens = nt, .tokens = toks, .n_logits = (int)(nt[0] + nt[1]),
                       .logit_rows = rows};
        k3_output out;
        if (k3_forward(&e, &bt, &out, &err) != 0) {
            fprintf(stderr, "ring_pair: %s\n", err.msg);
            return 1;
        }
        memcpy(local_l + (size_t)(s < 0 ? 0 : 20 + s) * V, out.logits, (size_t)nt[0] * V * 4);
        memcpy(local_l + (size_t)(24 + (s < 0 ? 0 : 13 + s)) * V, out.logits + (size_t)nt[0] * V, (size_t)nt[1] * V * 4);
        k3_output_free(&out);
    }
    int same_a = memcmp(ring_l, local_l, (size_t)24 * V * 4) == 0;
    int same_b = memcmp(ring_l + (size_t)24 * V, local_l + (size_t)24 * V, (size_t)17 * V * 4) == 0;
    printf("%s - sequence 1 (20-token prompt + 4 steps) in shared frames: logits identical to one machine\n", same_a ? "ok" : "not ok");
    printf("%s - sequence 2 (13-token prompt + 4 steps) in shared frames: logits identical to one machine\n", same_b ? "ok" : "not ok");
    k3_state_free(&sa);
    k3_state_free(&sb);
    k3_engine_free(&e);
    mf_close(&m);
    free(ring_l);
    free(local_l);
    return same_a && same_b ? 0 : 1;
}
