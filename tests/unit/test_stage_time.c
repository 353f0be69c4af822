/* test_stage_time - a node times its stage at ASSIGN (exec/stage.h: stage_time) for the coordinator's
 * prediction. Frames of no tokens and frames past the context are refused by name before anything runs; a
 * valid timing gives a positive time per frame and leaves no sequence behind; a real sequence then runs,
 * and timing again works. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "exec/stage.h"
#include "tools/synth.h"
#include "tools/synth_config.h"
#include <ggml.h>
#include "check.h"

static void quiet(enum ggml_log_level level, const char *text, void *user) {
    (void)user;
    if (level >= GGML_LOG_LEVEL_WARN) fputs(text, stderr);
}

/* One new greedy sequence of a token through the (whole-model, last) stage: 0 when it ran. */
static int one_frame(ring_stage *s, uint64_t seq_id, rl_err *err) {
    frame_header h = {.type = FRAME_FORWARD, .n_seqs = 1, .payload_bytes = 4};
    h.seqs[0] = (frame_seq){.seq_id = seq_id, .n_tokens = 1, .flags = FRAME_SEQ_NEW, .smp = {.repeat_penalty = 1.0f, .top_p = 1.0f}};
    const int32_t tok = 5;
    uint8_t *out = NULL;
    size_t out_len = 0;
    int rc = stage_run(s, &h, (const uint8_t *)&tok, 4, NULL, 0, &out, &out_len, err);
    free(out);
    return rc;
}

int main(void) {
    ggml_log_set(quiet, NULL);
    char dir[] = "/tmp/ringlm-stime-XXXXXX", path[256];
    if (!mkdtemp(dir)) return 1;
    snprintf(path, sizeof path, "%s/tiny.gguf", dir);
    synth_config c;
    rl_err err;
    if (synth_config_load(&c, "tiny", &err) != 0) return 1;
    synth_opts so = {.out = path, .seed = 3, .n_split = 1, .n_threads = 2};
    if (synth_write(&c, &so, &err) != 0) return 1;
    mf_model m;
    k3_hparams hp;
    k3_engine e;
    const k3_engine_opts eo = {.n_threads = 1};
    if (k3_open(&m, &hp, path, &err) != 0 || k3_engine_init(&e, &m, &hp, 0, hp.n_layer, &eo, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    ring_stage s;
    stage_init(&s, &e, 16, 1, K3_WIRE_F32); /* a context of 16, a pool of one sequence */

    const uint32_t none[3] = {1, 0, 4}, big[3] = {1, 1, 64}, ok[3] = {1, 1, 8};
    double sec[3] = {0};
    int rc = stage_time(&s, none, 3, sec, &err);
    CHECK(rc != 0 && strstr(err.msg, "a frame of no tokens"), "a frame of no tokens is refused: %s", rc ? err.msg : "(ran)");
    rc = stage_time(&s, big, 3, sec, &err);
    CHECK(rc != 0 && strstr(err.msg, "67 tokens do not fit a context of 16"), "frames past the context are refused: %s",
          rc ? err.msg : "(ran)");
    rc = stage_time(&s, ok, 3, sec, &err);
    CHECK(rc == 0 && sec[0] > 0 && sec[1] > 0 && sec[2] > 0, "1, 1 and 8 tokens timed: %.2f, %.2f, %.2f ms", sec[0] * 1e3,
          sec[1] * 1e3, sec[2] * 1e3);
    int left = 0;
    for (int i = 0; i < FRAME_MAX_SEQS; i++) left += s.seqs[i].used;
    CHECK(left == 0, "the timing leaves no sequence behind (%d left)", left);
    rc = one_frame(&s, 7, &err);
    CHECK(rc == 0, "a real sequence then runs in the pool's one slot (%s)", rc ? err.msg : "ran");
    stage_forget(&s, 7);
    rc = stage_time(&s, ok, 3, sec, &err);
    CHECK(rc == 0, "and timing again works (%s)", rc ? err.msg : "ran");

    stage_free(&s);
    k3_engine_free(&e);
    mf_close(&m);
    unlink(path);
    rmdir(dir);
    return check_done();
}
