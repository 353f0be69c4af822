/* test_spec - speculative decoding on one machine, in process.
 *   1. Greedy: for 20 prompts and each drafter (n-gram, a draft model that agrees often: the target's own
 *      q8_0 copy, one that rarely does: the small k3 draft, and a DSpark draft fed the target's taps),
 *      the speculative output equals plain greedy decoding token for token.
 *   2. Sampling preserves the target's distribution: over many seeds, the tokens at generation steps 1
 *      and 2 (step 0 is sampled before any drafting) have the same distribution with and without
 *      speculation (two-sample chi-square on the common tokens, and total variation distance).
 *   3. A draft model keeps what it ran while drafting and rolls back on rejection: after any mix of
 *      accepted, rejected and pipelined blocks (stale ones, wrong guesses, drafting twice from one point),
 *      its drafts are exactly those of a fresh state that ran only the committed tokens. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gen/generate.h"
#include "speculate/spec_gen.h"
#include "tools/synth.h"
#include "tools/synth_config.h"
#include "tools/synth_dspark.h"

#include "check.h"

typedef struct collect {
    int32_t ids[256];
    int n;
} collect;

static int on_tok(void *u, int32_t id, const char *t, size_t l) {
    (void)t, (void)l;
    collect *c = u;
    if (id >= 0 && c->n < 256) c->ids[c->n++] = id;
    return 0;
}

static void synth(const char *cfg, const char *type, const char *path, const char *draft_kind) {
    synth_config c;
    rl_err err;
    if (synth_config_load(&c, cfg, &err) != 0) exit(1);
    if (draft_kind && strcmp(draft_kind, "k3") == 0) {
        uint32_t v = c.hp.n_vocab;
        synth_config_load(&c, "draft", &err);
        c.hp.n_vocab = v;
    }
    c.type = synth_type_parse(type);
    c.n_over = 0;
    synth_opts o = {.out = path, .seed = 1, .n_split = 1, .n_threads = 2};
    if ((draft_kind && strcmp(draft_kind, "dspark") == 0 ? synth_dspark_write(&c, &o, &err) : synth_write(&c, &o, &err)) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
}

/* Greedy continuation of h[0..n) by a fresh state on the draft model's engine, run as the drafter runs it:
 * the prompt but its last token batched, the rest with step kernels. */
static int ref_drafts(k3_engine *e, const k3_hparams *hp, const int32_t *h, uint32_t n, uint32_t n_prompt, int k,
                      int32_t *out) {
    k3_state st, *sp = &st;
    rl_err err;
    if (k3_state_init(&st, &e->hp, 0, hp->n_layer, 256, &err) != 0) return -1;
    int32_t t[300];
    memcpy(t, h, n * sizeof *t);
    uint32_t at = 0, len = n;
    int rc = 0;
    for (int i = -1; i < k && rc == 0; i++) { /* i = -1: the prompt, no draft */
        uint32_t c = i < 0 ? n_prompt - 1 : len - at;
        int32_t last = (int32_t)c - 1;
        k3_batch b = {.n_seqs = 1, .seqs = &sp, .n_tokens = &c, .tokens = t + at, .n_logits = i < 0 ? 0 : 1,
                      .logit_rows = &last, .step_kernels = i >= 0};
        k3_output o;
        if (k3_forward(e, &b, &o, &err) != 0) {
            rc = -1;
            break;
        }
        at += c;
        if (i >= 0) {
            int32_t best = 0;
            for (uint32_t v = 1; v < hp->n_vocab; v++) best = o.logits[v] > o.logits[best] ? (int32_t)v : best;
            out[i] = t[len++] = best;
        }
        k3_output_free(&o);
    }
    k3_state_free(&st);
    return rc;
}

/* The cost model of adaptive drafting (spec_len_pick), on figures measured through 4 CPU nodes at 10 ms a hop
 * (bench/results/spec-depth-10: a plain step's traversal 124 ms, each verified draft +70 ms of the stages'
 * compute, 6 ms drafting one) and on a slow link; every expected value worked out by hand in the comment. */
static void test_len_pick(void) {
    /* alpha 0.3, k = 1: 1.3 tokens in 0.200 s = 6.5/s < 1 / 0.124 = 8.06/s, and longer blocks worse: plain */
    CHECK(spec_len_pick(0.3, 0, 0.124, 0.070, 0.006, 1, 7) == 0, "a CPU ring, a draft kept 3 times in 10: plain steps pay more (0)");
    /* alpha 0.95, k = 7: (1 - 0.95^8) / 0.05 = 6.73 tokens in 0.124 + 7 * 0.076 = 0.656 s: 10.3/s > 8.06/s */
    CHECK(spec_len_pick(0.95, 0, 0.124, 0.070, 0.006, 1, 7) >= 1, "the same ring, a draft kept 95%% of the time: drafting pays");
    /* verified drafts nearly free (a GPU): alpha 0.3, k = 1: 1.3 / 0.131 = 9.9/s > 8.06/s */
    CHECK(spec_len_pick(0.3, 0, 0.124, 0.001, 0.006, 1, 7) >= 1, "drafts nearly free to verify: a 30%% draft pays");
    /* a 500 ms traversal, +10 ms a verified draft, 2 ms drafting one, alpha 0.5: tokens a second by k:
     * 1: 1.5/0.512 = 2.93, 2: 1.75/0.524 = 3.34, 3: 1.875/0.536 = 3.50, 4: 1.9375/0.548 = 3.536,
     * 5: 1.96875/0.560 = 3.516: 4 */
    CHECK(spec_len_pick(0.5, 0, 0.5, 0.010, 0.002, 1, 7) == 4, "a slow link, a draft kept half the time: 4 drafts a block");
    /* no plain step timed: every block costs t_trav, and the answer is never 0 */
    CHECK(spec_len_pick(0.01, 0.124, 0, 0, 0.006, 1, 7) >= 1, "no plain step timed yet: at least one draft");
}

int main(void) {
    test_len_pick();
    char dir[] = "/tmp/ringlm-spec-XXXXXX";
    if (!mkdtemp(dir)) return 1;
    char target[128], self8[128], small[128], dsp[128], dspark[140];
    snprintf(target, sizeof target, "%s/t.gguf", dir);
    snprintf(self8, sizeof self8, "%s/d8.gguf", dir);
    snprintf(small, sizeof small, "%s/ds.gguf", dir);
    synth("tiny", "f32", target, NULL);
    synth("tiny", "q8_0", self8, NULL);
    synth("tiny", "f32", small, "k3");
    snprintf(dsp, sizeof dsp, "%s/dspark.gguf", dir);
    snprintf(dspark, sizeof dspark, "dspark:%s", dsp);
    synth("tiny", "f32", dsp, "dspark");
    rl_err err;
    mf_model m;
    k3_hparams hp;
    k3_engine e;
    tok_tokenizer tok;
    if (k3_open(&m, &hp, target, &err) != 0 || k3_engine_init(&e, &m, &hp, 0, hp.n_layer, &(k3_engine_opts){.n_threads = 2}, &err) != 0 ||
        tok_load(&tok, &m, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    const uint32_t V = hp.n_vocab;
    gen_params gp = {.n_predict = 24, .n_ctx = 256, .ignore_eog = true};
    gp.smp = smp_params_default(1);
    gp.smp.temperature = 0;
    spec_params sp = {.k_max = 5, .adaptive = true};
    const char *drafters[4] = {"ngram", self8, small, dspark};
    const char *names[4] = {"n-gram", "q8_0 self-draft", "k3 draft", "DSpark draft"};

    /* 1. Greedy equivalence; prompts that repeat themselves, so n-gram has something to find. */
    for (int dk = 0; dk < 4; dk++) {
        int same = 0;
        double acc = 0, tpt = 0;
        for (int pr = 0; pr < 20; pr++) {
            int32_t prompt[24];
            uint64_t x = (uint64_t)pr * 7919 + 1;
            for (int i = 0; i < 12; i++) prompt[i] = (int32_t)((x = x * 6364136223846793005ULL + 1) >> 40) % (int32_t)(V - 256);
            for (int i = 12; i < 24; i++) prompt[i] = prompt[i - 12 + (pr % 3)]; /* a partial repeat */
            collect plain = {0}, spec = {0};
            gen_metrics gm;
            spec_metrics sm;
            if (gen_run(&e, &tok, prompt, 24, &gp, on_tok, &plain, &gm, &err) != 0) return 1;
            spec_drafter d;
            if (spec_drafter_open(&d, drafters[dk], &m, &hp, 256, 2, &gp.smp, &err) != 0) {
                fprintf(stderr, "%s\n", err.msg);
                return 1;
            }
            spec_local sl = {.e = &e, .n_ctx = 256};
            spec_verifier v = spec_verifier_local(&sl);
            int rc = spec_run(&v, &d, &tok, prompt, 24, &gp, &sp, on_tok, &spec, &gm, &sm, &err);
            spec_drafter_close(&d);
            same += rc == 0 && plain.n == spec.n && memcmp(plain.ids, spec.ids, (size_t)plain.n * 4) == 0;
            acc += sm.acceptance_rate;
            tpt += sm.tokens_per_traversal;
        }
        CHECK(same == 20, "greedy, %s: %d/20 prompts give exactly the plain greedy tokens (acceptance %.0f%%, %.2f tokens per pass)",
              names[dk], same, 5 * acc, tpt / 20);
    }

    /* 2. Sampling distribution: N seeds each, tokens at steps 1 and 2, for a draft close to the target
     * (most drafts accepted) and an unrelated one (most rejected, so the residual draw carries it). */
    enum { N = 600 };
    gen_params gs = gp;
    gs.n_predict = 3;
    gs.smp = smp_params_default(0);
    gs.smp.temperature = 1.0f;
    gs.smp.top_k = 0;
    gs.smp.top_p = 1.0f;
    gs.smp.min_p = 0.0f;
    int32_t prompt[8] = {5, 17, 300, 2, 99, 64, 128, 700};
    int *hp_[2], *hs_[2];
    for (int k = 0; k < 2; k++) hp_[k] = calloc(V, sizeof(int)), hs_[k] = calloc(V, sizeof(int));
    for (int s = 0; s < N; s++) { /* the plain reference once */
        collect a = {0};
        gen_metrics gm;
        gs.smp.seed = (uint64_t)s + 1;
        if (gen_run(&e, &tok, prompt, 8, &gs, on_tok, &a, &gm, &err) != 0) return 1;
        for (int k = 0; k < 2; k++) {
            if (a.n > k + 1) hp_[k][a.ids[k + 1]]++;
        }
    }
    const char *sdraft[3] = {self8, small, dspark};
    for (int dk = 0; dk < 3; dk++) {
        for (int k = 0; k < 2; k++) memset(hs_[k], 0, V * sizeof(int));
        long drafted = 0, accepted = 0;
        spec_drafter d;
        smp_params dsp = gs.smp;
        dsp.seed = 77;
        if (spec_drafter_open(&d, sdraft[dk], &m, &hp, 256, 2, &dsp, &err) != 0) return 1;
        for (int s = 0; s < N; s++) {
            collect b = {0};
            gen_metrics gm;
            spec_metrics sm;
            spec_local sl = {.e = &e, .n_ctx = 256};
            spec_verifier v = spec_verifier_local(&sl);
            gs.smp.seed = (uint64_t)s + 1000003; /* independent of the plain runs */
            if (spec_run(&v, &d, &tok, prompt, 8, &gs, &sp, on_tok, &b, &gm, &sm, &err) != 0) return 1;
            drafted += sm.drafted;
            accepted += sm.accepted;
            for (int k = 0; k < 2; k++) {
                if (b.n > k + 1) hs_[k][b.ids[k + 1]]++;
            }
        }
        spec_drafter_close(&d);
        for (int k = 0; k < 2; k++) {
            /* Two-sample chi-square over tokens seen at least 10 times in total; the rest pooled. */
            double chi = 0, tv = 0;
            int df = -1, pool_a = 0, pool_b = 0;
            for (uint32_t t = 0; t < V; t++) {
                int x = hp_[k][t], y = hs_[k][t];
                tv += fabs((double)x - y) / (2.0 * N);
                if (x + y < 10) {
                    pool_a += x, pool_b += y;
                    continue;
                }
                chi += (double)(x - y) * (x - y) / (x + y);
                df++;
            }
            if (pool_a + pool_b > 0) {
                chi += (double)(pool_a - pool_b) * (pool_a - pool_b) / (pool_a + pool_b);
                df++;
            }
            /* Chi-square upper 0.1% point (Wilson-Hilferty). */
            double z = 3.09, crit = df * pow(1 - 2.0 / (9 * df) + z * sqrt(2.0 / (9 * df)), 3);
            CHECK(chi < crit, "sampling with the %s, step %d: same distribution as plain sampling (chi2 %.1f < %.1f, %d dof, TV %.3f)",
                  names[dk + 1], k + 1, chi, crit, df, tv);
        }
        CHECK(drafted > 0 && (dk != 0 || accepted > 0) && accepted < drafted,
              "sampling with the %s exercised %s (%ld of %ld drafts accepted)", names[dk + 1],
              dk == 0 ? "acceptance and rejection" : "rejection and the residual draw", accepted, drafted);
    }

    /* 3. The draft model's kept state, against fresh states. Outcomes drawn from a fixed generator: each
     * round drafts a block, maybe a second behind it from its guess (pipelining), then commits a random
     * number of the first block's drafts and a correction, or all of them and a bonus that is or is not the
     * guess; the second block is committed only when it still stands. Sometimes a block is drafted twice
     * from the same point. After every commit the drafts from what is committed are compared with a fresh
     * state's greedy continuation; a control compares them with a fresh state one committed token short. */
    {
        spec_drafter d;
        smp_params gsp = gp.smp;
        if (spec_drafter_open(&d, small, &m, &hp, 256, 2, &gsp, &err) != 0) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        int32_t h[256], prompt[12];
        for (int i = 0; i < 12; i++) prompt[i] = (int32_t)(31 * i + 7) % (int32_t)V;
        memcpy(h, prompt, sizeof prompt);
        uint32_t n = 12;
        uint64_t x = 12345;
#define RND(mod) ((int)(((x = x * 6364136223846793005ULL + 1442695040888963407ULL) >> 33) % (uint64_t)(mod)))
        int ok = 0, rounds = 0, control_differs = 0, stale = 0, wrong_guess = 0, twice = 0, elsewhere = 0, full = 0,
            partial = 0;
        int32_t first = 3;
        err.msg[0] = 0;
        if (spec_drafter_begin(&d, prompt, 12, 1, &err) != 0 || spec_drafter_commit(&d, &first, 1, &err) != 0) return 1;
        h[n++] = first;
        while (n < 190) {
            int32_t a[SPEC_MAX_DRAFT + 1], b[SPEC_MAX_DRAFT + 1];
            int na = 0, nb = 0, ka = 1 + RND(5), kb = 1 + RND(5);
            const spec_q *qs;
            int r4 = RND(4);
            if (r4 == 0) { /* drafting twice from the same point: the second must not see the first */
                if (spec_drafter_propose(&d, h, n, n, ka + 1, a, &na, &qs, &err) != 0) break;
                twice++;
            } else if (r4 == 1) { /* a block drafted first on other assumptions: two tokens nobody committed */
                h[n] = (int32_t)RND(V), h[n + 1] = (int32_t)RND(V);
                if (spec_drafter_propose(&d, h, n + 2, n, 2, a, &na, &qs, &err) != 0) break;
                elsewhere++;
            }
            bool ahead = RND(2) == 0;
            if (spec_drafter_propose(&d, h, n, n, ahead ? ka + 1 : ka, a, &na, &qs, &err) != 0) break;
            /* compare the block's drafts with a fresh state's greedy continuation, and with the control's */
            int32_t want[SPEC_MAX_DRAFT + 1], ctl[SPEC_MAX_DRAFT + 1];
            if (ref_drafts(&d.e, &d.hp, h, n, 12, na, want) != 0 || ref_drafts(&d.e, &d.hp, h, n - 1, 12, na, ctl) != 0) break;
            rounds++;
            ok += na == (ahead ? ka + 1 : ka) && memcmp(a, want, (size_t)na * sizeof *a) == 0;
            control_differs += memcmp(ctl, want, (size_t)na * sizeof *a) != 0;
            if (ahead) { /* the block behind it, from the first block's drafts and guess */
                memcpy(h + n, a, (size_t)(ka + 1) * sizeof *a);
                if (spec_drafter_propose(&d, h, n + (uint32_t)ka + 1, n, kb, b, &nb, &qs, &err) != 0) break;
            }
            /* the first block's outcome */
            int acc = RND(3) == 0 ? ka : RND(ka + 1);
            int32_t out[SPEC_MAX_DRAFT + 1];
            memcpy(out, a, (size_t)acc * sizeof *a);
            int32_t corr = (int32_t)RND(V);
            if (acc < ka && corr == a[acc]) corr = (corr + 1) % (int32_t)V;
            bool holds = ahead && acc == ka && RND(2) == 0;
            if (holds) corr = a[ka];
            else if (ahead && acc == ka && corr == a[ka]) corr = (corr + 1) % (int32_t)V;
            out[acc] = corr;
            if (spec_drafter_commit(&d, out, acc + 1, &err) != 0) break;
            memcpy(h + n, out, (size_t)(acc + 1) * sizeof *out);
            n += (uint32_t)acc + 1;
            if (acc == ka) full++; else partial++;
            if (ahead && !holds) {
                if (acc == ka) wrong_guess++; else stale++;
            }
            if (holds) { /* the second block stands: its outcome */
                int acc2 = RND(kb + 1);
                memcpy(out, b, (size_t)acc2 * sizeof *b);
                out[acc2] = acc2 < kb ? (b[acc2] + 1) % (int32_t)V : (int32_t)RND(V);
                if (spec_drafter_commit(&d, out, acc2 + 1, &err) != 0) break;
                memcpy(h + n, out, (size_t)(acc2 + 1) * sizeof *out);
                n += (uint32_t)acc2 + 1;
            }
        }
#undef RND
        if (err.msg[0]) fprintf(stderr, "%s\n", err.msg);
        CHECK(rounds > 20 && ok == rounds, "draft model state: %d/%d rounds draft exactly what a fresh state of the committed tokens does "
              "(%d wholly accepted, %d partly; %d stale blocks behind, %d wrong guesses, %d re-drafts, %d after a block on other "
              "assumptions)", ok, rounds, full, partial, stale, wrong_guess, twice, elsewhere);
        CHECK(stale > 0 && wrong_guess > 0 && twice > 0 && elsewhere > 0 && full > 0 && partial > 0,
              "draft model state: every case exercised");
        CHECK(d.reruns == (unsigned)(elsewhere + twice), "draft model state: rebuilt from the history only where the kept "
              "blocks cannot reach (%u rebuilds for %d blocks on other assumptions and %d re-drafts from one point, which must "
              "run the point's own token again); every other case rolls back into them", d.reruns, elsewhere, twice);
        CHECK(control_differs > rounds / 2, "draft model state, control: a fresh state one token short drafts otherwise in %d/%d rounds",
              control_differs, rounds);
        spec_drafter_close(&d);
    }
    for (int k = 0; k < 2; k++) free(hp_[k]), free(hs_[k]);
    tok_free(&tok);
    k3_engine_free(&e);
    mf_close(&m);
    unlink(target);
    unlink(self8);
    unlink(small);
    unlink(dsp);
    rmdir(dir);
    return check_done();
}
