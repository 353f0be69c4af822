/* test_serve_spec - speculative entries in the serve backend (scheduler.h: sch_step.n_draft), in process.
 *   The local backend verifies [last, d1..dk] in one step and keeps the drafts its greedy sampler agrees
 *   with: drafts equal to plain greedy decoding are all kept (plus the bonus token), a wrong draft is
 *   replaced by the right token, and the sequence then continues exactly as plain decoding does (the
 *   rejected drafts are rolled back before the slot's next entry), also next to another sequence in the
 *   same batch. Malformed speculative entries are refused. DSpark taps: the features an entry gets are the
 *   stream at the tap layers of its own tokens, as its own forward pass computes them. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "serve/backend_local.h"
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
    if (k3_open(&m, &hp, path, &err) != 0 || k3_engine_init(&e, &m, &hp, 0, hp.n_layer, &(k3_engine_opts){.n_threads = 2}, &err) != 0 ||
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

    /* DSpark taps: entries that ask get the stream entering each tap layer at each of their tokens, token-major,
     * in one batch with entries that do not ask; the rows equal a single sequence's own forward pass. */
    const uint32_t taps[2] = {1, hp.n_layer};
    CHECK(be.set_taps && be.set_taps(be.impl, taps, 2, &err) == 0, "the local backend takes tap layers");
    uint32_t bad_tap = hp.n_layer + 1;
    CHECK(be.set_taps(be.impl, &bad_tap, 1, &err) != 0, "a tap past the last layer is refused: %s", err.msg);
    be.set_taps(be.impl, taps, 2, &err);
    sch_step ts[2] = {{.slot = 0, .begin = true, .smp = &sp, .n_tokens = N_PROMPT, .tokens = prompt, .sample = true, .taps = true},
                      {.slot = 1, .begin = true, .smp = &sp, .n_tokens = 4, .tokens = prompt + 2, .sample = true}};
    const size_t d = hp.n_embd, row = 2 * d;
    float *fp = malloc((N_PROMPT + 4) * row * sizeof *fp);
    ok = fp && be.step(be.impl, ts, 2, &err) == 0 && ts[0].feat && !ts[1].feat;
    if (ok) memcpy(fp, ts[0].feat, N_PROMPT * row * sizeof *fp);
    CHECK(ok, "a prefill entry with taps gets features, the one without none%s%s", ok ? "" : ": ", ok ? "" : err.msg);
    int32_t blk4[4] = {ts[0].token, ref[1], (ref[2] + 1) % (int32_t)hp.n_vocab, ref[3]}; /* 1 right, then wrong */
    ts[0] = (sch_step){.slot = 0, .n_tokens = 4, .tokens = blk4, .sample = true, .n_draft = 3, .taps = true};
    ts[1] = (sch_step){.slot = 1, .n_tokens = 1, .tokens = &ts[1].token, .sample = true, .taps = true};
    ok = ok && be.step(be.impl, ts, 2, &err) == 0 && ts[0].feat && ts[1].feat && ts[0].n_out == 2;
    if (ok) memcpy(fp + N_PROMPT * row, ts[0].feat, 4 * row * sizeof *fp);
    CHECK(ok, "a speculative entry with taps gets a row per token (%d committed)", ts[0].n_out);
    /* The reference: slot 0's tokens through a state of their own, the same way (a split-invariant prefill, then
     * a block kept for rollback). */
    k3_state ref_st;
    float worst = 0, scale = 0;
    if (ok && k3_state_init(&ref_st, &e.hp, 0, hp.n_layer, 128, &err) == 0) {
        k3_state *rs = &ref_st;
        const int32_t *chunks[2] = {prompt, blk4};
        uint32_t lens[2] = {N_PROMPT, 4}, at = 0;
        for (int c = 0; c < 2 && ok; c++) {
            uint8_t keep = c == 1;
            int32_t lrow = (int32_t)lens[c] - 1;
            k3_batch b = {.n_seqs = 1, .seqs = &rs, .n_tokens = &lens[c], .tokens = chunks[c], .keep_rollback = &keep,
                          .n_logits = 1, .logit_rows = &lrow, .n_taps = 2, .tap_layers = taps,
                          .split_invariant = true}; /* as the backend reads prompt pieces */
            k3_output o;
            ok = k3_forward(&e, &b, &o, &err) == 0;
            for (uint32_t t = 0; ok && t < lens[c]; t++) {
                for (int k = 0; k < 2; k++) {
                    for (size_t x = 0; x < d; x++) {
                        float want = o.taps[((size_t)k * lens[c] + t) * d + x], have = fp[(at + t) * row + (size_t)k * d + x];
                        if (fabsf(want - have) > worst) worst = fabsf(want - have);
                        if (fabsf(want) > scale) scale = fabsf(want);
                    }
                }
            }
            if (ok) k3_output_free(&o);
            at += lens[c];
        }
        k3_state_free(&ref_st);
    }
    CHECK(ok && scale > 0 && worst <= 1e-4f * scale,
          "the features equal one sequence's own forward pass, tap by tap, token by token (max |diff| %.3g of %.3g)", worst,
          scale);
    free(fp);

    be.free(be.impl);
    k3_engine_free(&e);
    mf_close(&m);
    unlink(path);
    rmdir(dir);
    return check_done();
}
