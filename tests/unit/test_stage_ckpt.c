/* test_stage_ckpt - serve's prompt cache on a stage (exec/stage.h; FRAME_SEQ_CKPT, FRAME_SEQ_RESTORE) and the
 * checkpoint placement every party shares (model/k3_ckpt.h).
 *
 * Placement: a list of positions alone (what a ring's coordinator keeps) holds the positions a list of states
 * holds after the same calls; the same position is replaced, the oldest goes when full, one older than every
 * one kept is not taken. Stage: a sequence that begins again from a checkpoint (NEW | RESTORE) gives the
 * logits and the penalised greedy token of a fresh sequence that read the same pieces, bit for bit; a
 * checkpoint the stage does not hold, one evicted, one on a stage that keeps none, and one after a VERIFY
 * block are refused by name. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "exec/stage.h"
#include "model/k3_ckpt.h"
#include "tools/synth.h"
#include "tools/synth_config.h"
#include <ggml.h>
#include "check.h"

static void quiet(enum ggml_log_level level, const char *text, void *user) {
    (void)user;
    if (level >= GGML_LOG_LEVEL_WARN) fputs(text, stderr);
}

/* A repetition penalty, so that a sampler's history shows in its token. */
static const frame_sampling SMP = {.repeat_penalty = 1.3f, .top_p = 1.0f, .penalty_last_n = 64};

/* One frame of one sequence through the whole-model (last) stage; with ALL_LOGITS *logits gets them
 * (malloc'ed). Returns the stage's rc; *tok the sampled token. */
static int frame(ring_stage *s, uint64_t id, uint32_t pos, const int32_t *tok, uint32_t n, uint32_t flags, int32_t *out_tok,
                 float **logits, rl_err *err) {
    frame_header h = {.type = FRAME_FORWARD, .n_seqs = 1, .payload_bytes = (uint64_t)n * 4};
    h.seqs[0] = (frame_seq){.seq_id = id, .pos = pos, .n_tokens = n, .flags = flags | FRAME_SEQ_SPLIT_INV, .smp = SMP};
    uint8_t *out = NULL;
    size_t out_len = 0;
    int rc = stage_run(s, &h, (const uint8_t *)tok, (size_t)n * 4, NULL, 0, &out, &out_len, err);
    if (rc == 0 && out_tok) memcpy(out_tok, out, 4);
    if (rc == 0 && logits) {
        *logits = malloc(out_len - 4);
        memcpy(*logits, out + 4, out_len - 4);
    }
    free(out);
    return rc;
}

static void placement(void) {
    k3_ckpts a;
    rl_err err;
    CHECK(k3_ckpts_init(&a, 0, &err) != 0, "a list of no checkpoints is refused");
    k3_ckpts_init(&a, 3, &err);
    const uint32_t seq[] = {10, 20, 20, 30, 40, 5, 35};
    const int want_idx[] = {0, 1, 1, 2, 2, -1, 1};
    bool ok = true;
    for (int i = 0; i < 7; i++) ok = ok && k3_ckpts_place(&a, seq[i]) == want_idx[i];
    CHECK(ok && a.n == 3 && a.c[0].pos == 30 && a.c[1].pos == 35 && a.c[2].pos == 40,
          "placement: same position replaced, oldest evicted when full, older than all refused: %u %u %u", a.c[0].pos,
          a.c[1].pos, a.c[2].pos);
    CHECK(k3_ckpts_best(&a, 39) == 1 && k3_ckpts_best(&a, 29) == -1 && k3_ckpts_at(&a, 40) == 2 && k3_ckpts_at(&a, 41) == -1,
          "best at or before, and exact lookups");
    k3_ckpts_drop(&a, 1);
    CHECK(a.n == 1 && k3_ckpts_bytes(&a) == 0, "drop from an index; a list of positions holds no state");
    k3_ckpts_free(&a);
}

int main(void) {
    ggml_log_set(quiet, NULL);
    placement();
    char dir[] = "/tmp/ringlm-sckpt-XXXXXX", path[256];
    if (!mkdtemp(dir)) return 1;
    snprintf(path, sizeof path, "%s/tiny.gguf", dir);
    synth_config c;
    rl_err err;
    if (synth_config_load(&c, "tiny", &err) != 0) return 1;
    synth_opts so = {.out = path, .seed = 5, .n_split = 1, .n_threads = 2};
    if (synth_write(&c, &so, &err) != 0) return 1;
    mf_model m;
    k3_hparams hp;
    k3_engine e;
    const k3_engine_opts eo = {.n_threads = 1};
    if (k3_open(&m, &hp, path, &err) != 0 || k3_engine_init(&e, &m, &hp, 0, hp.n_layer, &eo, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    int32_t t[48];
    for (int i = 0; i < 48; i++) t[i] = 3 + (i * 37) % ((int)hp.n_vocab - 3);

    ring_stage s;
    stage_init(&s, &e, 64, 2, K3_WIRE_F32);
    int rc = frame(&s, 1, 0, t, 10, FRAME_SEQ_NEW | FRAME_SEQ_NO_SAMPLE | FRAME_SEQ_CKPT, NULL, NULL, &err);
    CHECK(rc != 0 && strstr(err.msg, "keeps none (ASSIGN's ctx_checkpoints is 0)"), "a checkpoint on a stage that keeps none: %s",
          rc ? err.msg : "(ran)");
    stage_free(&s);

    stage_init(&s, &e, 64, 2, K3_WIRE_F32);
    s.max_ck = 2;
    /* Sequence 1: 10 tokens (checkpoint), 6 more (checkpoint), 4 more; then it begins again at 10. */
    int32_t tok1 = -1, tok2 = -1;
    float *l1 = NULL, *l2 = NULL;
    rc = frame(&s, 1, 0, t, 10, FRAME_SEQ_NEW | FRAME_SEQ_NO_SAMPLE | FRAME_SEQ_CKPT, NULL, NULL, &err);
    rc = rc ? rc : frame(&s, 1, 10, t + 10, 6, FRAME_SEQ_NO_SAMPLE | FRAME_SEQ_CKPT, NULL, NULL, &err);
    rc = rc ? rc : frame(&s, 1, 16, t + 16, 4, 0, NULL, NULL, &err);
    CHECK(rc == 0, "a sequence reads 10 + 6 + 4 tokens with two checkpoints (%s)", rc ? err.msg : "ran");
    rc = frame(&s, 1, 10, t + 30, 5, FRAME_SEQ_NEW | FRAME_SEQ_RESTORE | FRAME_SEQ_ALL_LOGITS, &tok1, &l1, &err);
    CHECK(rc == 0, "it begins again from its checkpoint at 10 with 5 other tokens (%s)", rc ? err.msg : "ran");
    /* The same pieces read fresh: 10 tokens, then those 5. */
    rc = frame(&s, 2, 0, t, 10, FRAME_SEQ_NEW | FRAME_SEQ_NO_SAMPLE, NULL, NULL, &err);
    rc = rc ? rc : frame(&s, 2, 10, t + 30, 5, FRAME_SEQ_ALL_LOGITS, &tok2, &l2, &err);
    CHECK(rc == 0 && l1 && l2 && memcmp(l1, l2, (size_t)5 * hp.n_vocab * sizeof(float)) == 0,
          "its logits equal a fresh read of the same pieces, bit for bit");
    CHECK(tok1 == tok2 && tok1 >= 0, "its penalised greedy token too (%d, %d)", tok1, tok2);
    const stage_seq *q1 = NULL, *q2 = NULL;
    for (int i = 0; i < FRAME_MAX_SEQS; i++) {
        if (s.seqs[i].used && s.seqs[i].id == 1) q1 = &s.seqs[i];
        if (s.seqs[i].used && s.seqs[i].id == 2) q2 = &s.seqs[i];
    }
    CHECK(q1 && q2 && q1->has_smp && q2->has_smp && q1->smp.hist_n == 15 && q2->smp.hist_n == 15 &&
              memcmp(q1->smp.count, q2->smp.count, hp.n_vocab * sizeof(int32_t)) == 0,
          "its fresh sampler's penalty history is the prefix and the new tokens, as the fresh read's (%zu, %zu tokens)",
          q1 ? q1->smp.hist_n : 0, q2 ? q2->smp.hist_n : 0);
    free(l1), free(l2);
    rc = frame(&s, 1, 16, t + 16, 3, FRAME_SEQ_RESTORE | FRAME_SEQ_NO_SAMPLE, NULL, NULL, &err);
    CHECK(rc != 0 && strstr(err.msg, "sequence 1 has no checkpoint at position 16 here"),
          "the checkpoint after the one restored was dropped: %s", rc ? err.msg : "(ran)");
    /* Three more checkpoints on a list of two: the one at 10 is evicted. */
    rc = frame(&s, 1, 10, t + 30, 4, FRAME_SEQ_RESTORE | FRAME_SEQ_NO_SAMPLE | FRAME_SEQ_CKPT, NULL, NULL, &err);
    rc = rc ? rc : frame(&s, 1, 14, t + 34, 4, FRAME_SEQ_NO_SAMPLE | FRAME_SEQ_CKPT, NULL, NULL, &err);
    CHECK(rc == 0, "two more checkpoints (%s)", rc ? err.msg : "ran");
    rc = frame(&s, 1, 10, t + 30, 3, FRAME_SEQ_RESTORE | FRAME_SEQ_NO_SAMPLE, NULL, NULL, &err);
    CHECK(rc != 0 && strstr(err.msg, "no checkpoint at position 10"), "the oldest was evicted past two: %s", rc ? err.msg : "(ran)");
    rc = frame(&s, 1, 14, t + 34, 2, FRAME_SEQ_RESTORE | FRAME_SEQ_NO_SAMPLE, NULL, NULL, &err);
    CHECK(rc == 0, "the latest two are there (%s)", rc ? err.msg : "ran");
    rc = frame(&s, 3, 5, t, 3, FRAME_SEQ_NEW | FRAME_SEQ_RESTORE, NULL, NULL, &err);
    CHECK(rc != 0 && strstr(err.msg, "sequence 3 is unknown here"), "beginning again a sequence the stage never had: %s",
          rc ? err.msg : "(ran)");
    rc = frame(&s, 1, 16, t + 40, 3, FRAME_SEQ_VERIFY | FRAME_SEQ_CKPT, NULL, NULL, &err);
    CHECK(rc != 0 && strstr(err.msg, "a checkpoint after a VERIFY block"), "a checkpoint after a VERIFY block is refused: %s",
          rc ? err.msg : "(ran)");

    stage_free(&s);
    k3_engine_free(&e);
    mf_close(&m);
    unlink(path);
    rmdir(dir);
    return check_done();
}
