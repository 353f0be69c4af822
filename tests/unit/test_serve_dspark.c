/* test_serve_dspark - the scheduler's DSpark path, in process, on the local backend (scheduler.h: set_taps,
 * sch_step.taps/feat; sch_config.dspark). What the end-to-end test (t_serve_dspark.sh) cannot reach:
 *   - a backend that loses a step's features: the request's drafter is out of step for good, so drafting
 *     stops for it (no draft from a wrong context), and the request still runs to its end with the text it
 *     has without drafts;
 *   - a backend that cannot return hidden states at all: the scheduler refuses to start, saying why;
 *   - a ring opened with other taps than the draft's refuses them.
 * And the plain case: DSpark drafts through the scheduler give the text of plain greedy decoding. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coord/coord.h"
#include "serve/backend_local.h"
#include "speculate/drafter.h"
#include "tools/synth.h"
#include "tools/synth_config.h"
#include "tools/synth_dspark.h"

#include "check.h"

enum { N_GEN = 40, N_SLOTS = 2 };

/* A backend around the local one that, from step `lose_from` on, returns no features (feat = NULL). */
typedef struct lossy {
    sch_backend in;
    int steps, lose_from;
} lossy;

static int lossy_step(void *impl, sch_step *st, int n, rl_err *err) {
    lossy *l = impl;
    int rc = l->in.step(l->in.impl, st, n, err);
    if (rc == 0 && ++l->steps >= l->lose_from) {
        for (int i = 0; i < n; i++) st[i].feat = NULL;
    }
    return rc;
}
static void lossy_end(void *impl, int slot) { lossy *l = impl; l->in.end(l->in.impl, slot); }
static int lossy_nodes(void *impl, sch_node_stat *o, int max) { lossy *l = impl; return l->in.nodes(l->in.impl, o, max); }
static void lossy_free(void *impl) { lossy *l = impl; l->in.free(l->in.impl); }
static int lossy_taps(void *impl, const uint32_t *layers, int n, rl_err *err) {
    lossy *l = impl;
    return l->in.set_taps(l->in.impl, layers, n, err);
}

static sch_backend lossy_wrap(lossy *l, const sch_backend *in, int lose_from, bool taps) {
    *l = (lossy){.in = *in, .lose_from = lose_from};
    sch_backend b = *in;
    b.impl = l;
    b.step = lossy_step;
    b.end = lossy_end;
    b.nodes = lossy_nodes;
    b.free = lossy_free;
    b.set_taps = taps ? lossy_taps : NULL;
    return b;
}

/* One request through a scheduler; its text into out (NUL-terminated), its update's counts into *u. */
static int run_one(sch_sched *s, const int32_t *prompt, size_t n, bool dspark, char *out, size_t cap, sch_update *fin) {
    rl_err err;
    sch_params p = {.smp = smp_params_default(1), .max_tokens = N_GEN, .ignore_eos = true, .draft_n = dspark ? 6 : 0,
                    .draft_dspark = dspark};
    p.smp.temperature = 0;
    sch_request *r = sch_request_new(prompt, n, &p, &err);
    if (!r || sch_submit(s, r, &err) != SCH_OK) return fprintf(stderr, "%s\n", err.msg), -1;
    size_t len = 0;
    sch_update u;
    do {
        if (!sch_request_wait(r, 1000, &u)) continue;
        if (u.text && len + u.len < cap) memcpy(out + len, u.text, u.len), len += u.len;
        free(u.text);
        free(u.receipts);
    } while (u.fin == SCH_RUNNING);
    out[len] = 0;
    *fin = u;
    sch_request_release(r);
    return 0;
}

int main(void) {
    char dir[] = "/tmp/ringlm-sds-XXXXXX";
    if (!mkdtemp(dir)) return 1;
    char tpath[128], dpath[160], spec[200];
    snprintf(tpath, sizeof tpath, "%s/t.gguf", dir);
    snprintf(dpath, sizeof dpath, "%s/d.gguf", dir);
    snprintf(spec, sizeof spec, "dspark:%s", dpath);
    synth_config c;
    rl_err err;
    synth_opts o = {.out = tpath, .seed = 3, .n_split = 1, .n_threads = 2};
    if (synth_config_load(&c, "tiny", &err) != 0 || synth_write(&c, &o, &err) != 0) return fprintf(stderr, "%s\n", err.msg), 1;
    o.out = dpath;
    o.seed = 5;
    if (synth_dspark_write(&c, &o, &err) != 0) return fprintf(stderr, "%s\n", err.msg), 1;
    mf_model m;
    k3_hparams hp;
    k3_engine e;
    tok_tokenizer tok;
    if (k3_open(&m, &hp, tpath, &err) != 0 || tok_load(&tok, &m, &err) != 0 ||
        k3_engine_init(&e, &m, &hp, 0, hp.n_layer, &(k3_engine_opts){.n_threads = 2}, &err) != 0) {
        return fprintf(stderr, "%s\n", err.msg), 1;
    }
    spec_drafter ds[N_SLOTS];
    for (int i = 0; i < N_SLOTS; i++) {
        if (spec_drafter_open(&ds[i], spec, &m, &hp, 128, 2, NULL, &err) != 0) return fprintf(stderr, "%s\n", err.msg), 1;
    }
    const int32_t prompt[] = {11, 400, 23, 9, 77, 500, 2, 301, 64, 12, 7};
    const size_t n_prompt = sizeof prompt / sizeof *prompt;
    static char plain[1 << 16], drafted[1 << 16], lost[1 << 16];
    sch_update up = {0}, ud = {0}, ul = {0};

    /* Plain greedy decoding: the reference text. */
    sch_backend be;
    sch_sched s;
    int ok = sch_backend_local(&be, &e, N_SLOTS, 128, &err) == 0 &&
             sch_init(&s, &be, &tok, &(sch_config){.queue_cap = 4, .chunk = 64}, &err) == 0 && sch_start(&s, &err) == 0 &&
             run_one(&s, prompt, n_prompt, false, plain, sizeof plain, &up) == 0;
    if (ok) sch_free(&s);
    CHECK(ok && up.fin == SCH_FIN_LENGTH && up.n_gen == N_GEN, "plain decoding: %d tokens%s%s", up.n_gen, ok ? "" : ": ",
          ok ? "" : err.msg);

    /* DSpark drafts through the scheduler: the same text, drafts verified. */
    ok = sch_backend_local(&be, &e, N_SLOTS, 128, &err) == 0 &&
         sch_init(&s, &be, &tok, &(sch_config){.queue_cap = 4, .chunk = 64, .dspark = ds}, &err) == 0 &&
         sch_start(&s, &err) == 0 && run_one(&s, prompt, n_prompt, true, drafted, sizeof drafted, &ud) == 0;
    if (ok) sch_free(&s);
    CHECK(ok && ud.n_gen == N_GEN && strcmp(drafted, plain) == 0 && ud.drafted > 0,
          "DSpark drafts: the text of plain decoding, %d drafts verified, %d kept", ud.drafted, ud.accepted);

    /* Features lost from the 4th step on (the prefill and two drafted steps had theirs; the 4th step's block is
     * drafted before it runs): the request stops drafting after 3 blocks, finishes, and its text is unchanged. */
    lossy l;
    ok = sch_backend_local(&be, &e, N_SLOTS, 128, &err) == 0;
    sch_backend lb = lossy_wrap(&l, &be, 4, true);
    ok = ok && sch_init(&s, &lb, &tok, &(sch_config){.queue_cap = 4, .chunk = 64, .dspark = ds}, &err) == 0 &&
         sch_start(&s, &err) == 0 && run_one(&s, prompt, n_prompt, true, lost, sizeof lost, &ul) == 0;
    if (ok) sch_free(&s);
    CHECK(ok && ul.fin == SCH_FIN_LENGTH && ul.n_gen == N_GEN && strcmp(lost, plain) == 0,
          "features lost mid-request: it still runs to its length with the same text");
    CHECK(ok && ul.drafted > 0 && ul.drafted <= 3 * 6 && ul.drafted < ud.drafted,
          "... and drafts no more once they are lost (%d drafts, at most 3 blocks of 6; %d with every feature)",
          ul.drafted, ud.drafted);

    /* A backend with no way to return hidden states: DSpark cannot start on it. */
    ok = sch_backend_local(&be, &e, N_SLOTS, 128, &err) == 0;
    lb = lossy_wrap(&l, &be, 1 << 30, false);
    int rc = ok ? sch_init(&s, &lb, &tok, &(sch_config){.queue_cap = 4, .chunk = 64, .dspark = ds}, &err) : 0;
    CHECK(ok && rc != 0 && strstr(err.msg, "hidden states"), "a backend without set_taps is refused: %s", err.msg);
    if (ok) lb.free(lb.impl);

    /* On a ring the taps must be the ones it was opened with (every ASSIGN names them). */
    ring_opts ro = ring_opts_default();
    ro.n_taps = 2;
    ro.taps[0] = 1, ro.taps[1] = hp.n_layer;
    const uint32_t same[2] = {1, hp.n_layer}, other[2] = {1, 2};
    CHECK(ring_opts_check_taps(&ro, same, 2, &err) == 0 && ring_opts_check_taps(&ro, other, 2, &err) != 0 &&
              ring_opts_check_taps(&ro, same, 1, &err) != 0,
          "a ring takes only the taps it was opened with: %s", err.msg);

    for (int i = 0; i < N_SLOTS; i++) spec_drafter_close(&ds[i]);
    k3_engine_free(&e);
    tok_free(&tok);
    mf_close(&m);
    unlink(tpath);
    unlink(dpath);
    rmdir(dir);
    return check_done();
}
