/* test_serve_spec - speculative entries in the serve backend (scheduler.h: sch_step.n_draft), in process.
 *   The local backend verifies [last, d1..dk] in one step and keeps the drafts its greedy sampler agrees
 *   with: drafts equal to plain greedy decoding are all kept (plus the bonus token), a wrong draft is
 *   replaced by the right token, and the sequence then continues exactly as plain decoding does (the
 *   rejected drafts are rolled back before the slot's next entry), also next to another sequence in the
 *   same batch. Malformed speculative entries are refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "serve/scheduler.h"
#include "tools/synth.h"
#include "tools/synth_config.h"

#include "check.h"

enum { N_PROMPT = 9, N_GEN = 24 };

/* Plain greedy decoding in slot `slot`: prefill, then one token per step. */
static int plain(sch_backend *be, int slot, const int32_t *prompt, const smp_params *sp, int32_t *out) {
    rl_err err;
    sch_step st = {.slot = slot, .begin = true, .smp = sp, .n_tokens = N_PROMPT, .tokens = prompt, .sample = true};
    if (be->step(be->impl, &st, 1, &err) != 0) return fprintf(stderr, "%s\n", err.msg), -1;
    out[0] = st.token;
    for (int i = 1; i < N_GEN; i++) {
        st = (sch_step){.slot = slot, .n_tokens = 1, .tokens = &out[i - 1], .sample = true};
        if (be->step(be->impl, &st, 1, &err) != 0) return fprintf(stderr, "%s\n", err.msg), -1;
        out[i] = st.token;
    }
    return 0;
}

int main(void) {
    char dir[] = "/tmp/ringlm-sspec-XXXXXX";
    if (!mkdtemp(dir)) return 1;
    char path[128];
    snprintf(path, sizeof path, "%s/t.gguf", dir);
    synth_config c;
    rl_err err;
    if (synth_config_load(&c, "tiny", &err) != 0) return 1;
    synth_opts o = {.out = path, .seed = 3, .n_split = 1, .n_threads = 2};
    if (synth_write(&c, &o, &err) != 0) return fprintf(stderr, "%s\n", err.msg), 1;
    mf_model m;
    k3_hparams hp;
    k3_engine e;
    sch_backend be;
    if (k3_open(&m, &hp, path, &err) != 0 || k3_engine_init(&e, &m, &hp, 0, hp.n_layer, 2, &err) != 0 ||
        sch_backend_local(&be, &e, 3, 128, &err) != 0) {
        return fprintf(stderr, "%s\n", err.msg), 1;
    }
    smp_params sp = smp_params_default(1);
    sp.temperature = 0;
    int32_t prompt[N_PROMPT] = {11, 400, 23, 9, 77, 500, 2, 301, 64};
    int32_t ref[N_GEN];
    if (plain(&be, 0, prompt, &sp, ref) != 0) return 1;

    /* Slot 1: speculative entries with drafts that are right, partly right, or wrong, next to slot 2 doing
     * plain decoding of the same prompt in the same batches. */
    int32_t got[N_GEN + SCH_MAX_DRAFT + 2], got2[N_GEN + 2];
    int n_got = 0, n_got2 = 0, steps = 0, kept = 0, drafted = 0;
    sch_step st[2] = {{.slot = 1, .begin = true, .smp = &sp, .n_tokens = N_PROMPT, .tokens = prompt, .sample = true},
                      {.slot = 2, .begin = true, .smp = &sp, .n_tokens = N_PROMPT, .tokens = prompt, .sample = true}};
    int ok = be.step(be.impl, st, 2, &err) == 0;
    if (ok) got[n_got++] = st[0].token, got2[n_got2++] = st[1].token;
    const int pattern[] = {4, 3, 0, 5, 2, 1, 6}; /* how many of each block's drafts are right */
    for (int b = 0; ok && n_got < N_GEN - 8; b++) {
        int right = pattern[b % 7], k = 5;
        int32_t block[SCH_MAX_DRAFT + 1];
        block[0] = got[n_got - 1];
        for (int i = 1; i <= k; i++) {
            int32_t want = ref[n_got - 1 + i];
            block[i] = i <= right ? want : (want + 1) % (int32_t)hp.n_vocab; /* a wrong draft */
        }
        st[0] = (sch_step){.slot = 1, .n_tokens = (uint32_t)k + 1, .tokens = block, .sample = true, .n_draft = k};
        st[1] = (sch_step){.slot = 2, .n_tokens = 1, .tokens = &got2[n_got2 - 1], .sample = true};
        ok = be.step(be.impl, st, 2, &err) == 0;
        if (!ok) break;
        steps++;
        drafted += k;
        kept += st[0].n_out - 1;
        int want_out = right < k ? right + 1 : k + 1;
        if (st[0].n_out != want_out) {
            fprintf(stderr, "block %d: %d drafts right, %d committed\n", b, right, st[0].n_out);
            ok = 0;
        }
        for (int i = 0; i < st[0].n_out; i++) got[n_got++] = st[0].out[i];
        got2[n_got2++] = st[1].token;
    }
    CHECK(ok, "speculative entries ran: %d steps, %d of %d drafts kept, exactly the right ones%s%s", steps, kept, drafted,
          ok ? "" : ": ", ok ? "" : err.msg);
    /* Then plain steps on slot 1: it continues where the committed tokens end. */
    while (ok && n_got < N_GEN) {
        sch_step s1 = {.slot = 1, .n_tokens = 1, .tokens = &got[n_got - 1], .sample = true};
        ok = be.step(be.impl, &s1, 1, &err) == 0;
        if (ok) got[n_got++] = s1.token;
    }
    CHECK(ok && n_got >= N_GEN && memcmp(got, ref, sizeof ref) == 0,
          "verified blocks then plain steps == plain greedy decoding, token for token (%d tokens)", N_GEN);
    CHECK(ok && memcmp(got2, ref, (size_t)n_got2 * sizeof *got2) == 0,
          "the plain sequence batched next to them == plain greedy decoding (%d tokens)", n_got2);

    /* Malformed speculative entries are refused (the scheduler never sends them; a backend must not crash). */
    int32_t blk[3] = {ref[0], ref[1], ref[2]};
    sch_step bad = {.slot = 0, .n_tokens = 3, .tokens = blk, .sample = true, .n_draft = 5};
    CHECK(be.step(be.impl, &bad, 1, &err) != 0, "drafts that do not match the entry's tokens are refused: %s", err.msg);
    bad = (sch_step){.slot = 0, .n_tokens = 3, .tokens = blk, .sample = false, .n_draft = 2};
    CHECK(be.step(be.impl, &bad, 1, &err) != 0, "a speculative entry that samples nothing is refused: %s", err.msg);

    be.free(be.impl);
    k3_engine_free(&e);
    mf_close(&m);
    unlink(path);
    rmdir(dir);
    return check_done();
}
