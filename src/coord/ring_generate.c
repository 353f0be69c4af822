/* ring_generate.c - the one-shot decode loop over the ring (`ringlm run --ring`): gen_run's contract. */
#include "coord_int.h"
#include "../base/clock.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>
#include <sodium.h>
#include <zmq.h>

#include "../gen/emit.h"

/* The ring failed (err): close it and open one over the nodes the failures did not name (ex, kept across
 * recoveries), as `serve --ring` does (docs/serve.md, "When a node fails"); a node that fails the open is
 * left out too. 0 when a ring is open again; -1 with err saying why not (rc is closed then). */
int ring_reform(ring_coord *rc, bool *ex, rl_err *err) {
    /* A node caught lying (a receipt check) may already have corrupted what this run printed: the run
     * fails naming it, as before, rather than go on. */
    for (int i = 0; i < rc->conf.n; i++)
        if (rc->faulty[i]) return -1;
    const ring_conf conf = rc->conf;
    const keys_identity *id = rc->id;
    const mf_model *m = rc->m;
    const k3_hparams hp = rc->hp;
    ring_opts o = rc->o;
    ring_close(rc);
    for (int attempt = 0; attempt <= conf.n; attempt++) {
        int named = 0, left = 0;
        for (int i = 0; i < conf.n; i++) {
            if (!ex[i] && ring_names(err->msg, conf.nodes[i].addr)) ex[i] = true, named++;
            left += !ex[i];
        }
        if (left == 0 || (attempt > 0 && named == 0)) return -1; /* the last error stands: nothing to leave out */
        fprintf(stderr, "\nringlm run: ring: %s; re-forming it over the %d node(s) left\n", err->msg, left);
        o.exclude = ex;
        if (ring_open(rc, &conf, id, m, &hp, &o, err) == 0) return 0;
    }
    return -1;
}

int ring_generate(ring_coord *rc, const tok_tokenizer *tok, const int32_t *prompt, size_t n_prompt,
                  const gen_params *p, gen_token_cb cb, void *user, gen_metrics *m, rl_err *err) {
    memset(m, 0, sizeof *m);
    m->prompt_tokens = (int)n_prompt;
    m->stop_reason = "length";
    if (n_prompt == 0) return rl_errf(err, "empty prompt");
    if (n_prompt >= rc->o.n_ctx) {
        return rl_errf(err, "prompt of %zu tokens does not fit the context of %u", n_prompt, rc->o.n_ctx);
    }
    frame_sampling smp = ring_sampling(&p->smp);
    gen_out out;
    gen_out_begin(&out, tok, p, cb, user, m);
    int rc_ = 0;
    uint32_t chunk = p->chunk ? p->chunk : (uint32_t)n_prompt, pos = 0;
    int32_t next = -1;
    bool ex[PLAN_MAX_NODES] = {0};
    for (int i = 0; rc->o.exclude && i < rc->conf.n; i++) ex[i] = rc->o.exclude[i];
    int32_t *gen = malloc(sizeof *gen * (p->n_predict > 0 ? (size_t)p->n_predict + 1 : rc->o.n_ctx + 1));
    if (!gen) return rl_errf(err, "out of memory");
    int n_gen = 0, recoveries = 0;
    uint64_t seq = 0;
prefill:
    seq = rc->next_seq++;
    pos = 0;
    /* Prefill: every chunk is submitted before any result is awaited, so the stages work on different
     * chunks at once (stage 0 on chunk k+1 while stage 1 has chunk k). */
    size_t n_chunks = (n_prompt + chunk - 1) / chunk;
    if (n_chunks > 32) n_chunks = 32; /* at most this many in flight; the rest follow as results return */
    ring_seq_req rqs[32];
    uint64_t steps[32];
    size_t sent = 0, got = 0, i_next = 0;
    while (rc_ == 0 && got * (size_t)chunk < n_prompt) {
        while (rc_ == 0 && i_next < n_prompt && sent - got < n_chunks) {
            uint32_t n = (uint32_t)(n_prompt - i_next < chunk ? n_prompt - i_next : chunk);
            bool lastc = i_next + n == n_prompt;
            ring_seq_req *rq = &rqs[sent % 32];
            bool first = i_next == 0, bias = first && p->smp.n_bias > 0;
            *rq = (ring_seq_req){.seq_id = seq, .pos = pos, .n = n, .tokens = prompt + i_next, .smp = smp,
                                 .flags = (first ? FRAME_SEQ_NEW : 0) | (bias ? FRAME_SEQ_HAS_BIAS : 0) |
                                          (lastc ? 0 : FRAME_SEQ_NO_SAMPLE),
                                 .bias = bias ? p->smp.bias : NULL, .n_bias = bias ? (uint32_t)p->smp.n_bias : 0};
            rc_ = ring_submit(rc, rq, 1, &steps[sent % 32], err);
            pos += n;
            i_next += n;
            sent++;
        }
        if (rc_ == 0) {
            rc_ = ring_collect(rc, steps[got % 32], &rqs[got % 32], 1, err);
            next = rqs[got % 32].token;
            got++;
        }
    }
    if (rc_ != 0 && !gen_sigint_pending() && recoveries < 4 && ring_reform(rc, ex, err) == 0) {
        recoveries++; /* nothing was generated yet: the prompt again, from the start */
        rc_ = 0;
        goto prefill;
    }
    m->prefill_s = rl_clock_now() - out.t0;
    for (int g = n_gen; rc_ == 0 && (p->n_predict < 0 || g < p->n_predict); g++) {
        int32_t id = next;
        if (id < 0) {
            rc_ = rl_errf(err, "the last stage returned no token");
            break;
        }
        int r = gen_out_token(&out, id, err);
        if (r != 0) {
            if (r < 0) rc_ = -1;
            break;
        }
        gen[n_gen++] = id;
        if (gen_sigint_pending()) {
            m->stop_reason = "interrupted";
            break;
        }
        if (p->n_predict >= 0 && g + 1 >= p->n_predict) break;
        if (pos + 1 > rc->o.n_ctx) {
            m->stop_reason = "context";
            break;
        }
        ring_seq_req rq = {.seq_id = seq, .pos = pos, .n = 1, .tokens = &id, .smp = smp};
        rc_ = ring_step(rc, &rq, 1, err);
        while (rc_ != 0 && !gen_sigint_pending() && recoveries < 4 && ring_reform(rc, ex, err) == 0) {
            /* Rebuilt as it was built: the prompt as a prefill, then what was generated with step kernels,
             * the last stage's sampler taking it as its output again (FRAME_SEQ_RESUME): it samples on exactly
             * as the lost ring would have. */
            recoveries++;
            seq = rc->next_seq++;
            bool bias = p->smp.n_bias > 0;
            ring_seq_req r0 = {.seq_id = seq, .pos = 0, .n = (uint32_t)n_prompt, .tokens = prompt, .smp = smp,
                               .flags = FRAME_SEQ_NEW | FRAME_SEQ_NO_SAMPLE | (bias ? FRAME_SEQ_HAS_BIAS : 0),
                               .bias = bias ? p->smp.bias : NULL, .n_bias = bias ? (uint32_t)p->smp.n_bias : 0};
            rq = (ring_seq_req){.seq_id = seq, .pos = (uint32_t)n_prompt, .n = (uint32_t)n_gen, .tokens = gen,
                                .smp = smp, .flags = FRAME_SEQ_RESUME | FRAME_SEQ_STEP, .gen_start = 0};
            uint64_t s0, s1;
            rc_ = ring_submit(rc, &r0, 1, &s0, err);
            if (rc_ == 0) rc_ = ring_submit(rc, &rq, 1, &s1, err);
            if (rc_ == 0) rc_ = ring_collect(rc, s0, &r0, 1, err);
            if (rc_ == 0) rc_ = ring_collect(rc, s1, &rq, 1, err);
        }
        pos++;
        next = rq.token;
    }
    gen_out_end(&out, rc_ == 0, n_prompt);
    free(gen);
    rl_err e2;
    if (rc->zctx) ring_free_seqs(rc, &seq, 1, &e2);
    return rc_;
}
