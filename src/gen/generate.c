#include "generate.h"
#include "../base/clock.h"

#include <stdlib.h>
#include <string.h>

#include "emit.h"

/* One forward pass over tokens[0..n) of the sequence; logits of the last one into *row. */
static int gen_step(k3_engine *e, k3_state *st, const int32_t *tokens, uint32_t n, bool want_logits, float **row,
                    rl_err *err) {
    int32_t last = (int32_t)n - 1;
    k3_batch b = {.n_seqs = 1, .seqs = &st, .n_tokens = &n, .tokens = tokens, .n_logits = want_logits ? 1 : 0,
                  .logit_rows = &last};
    k3_output o;
    if (k3_forward(e, &b, &o, err) != 0) return -1;
    if (want_logits) {
        *row = o.logits;
        o.logits = NULL;
    }
    k3_output_free(&o);
    return 0;
}

/* Prefills prompt[0..n_prompt) in chunks of `chunk`; the logits of the last token into *row. Returns 0, -1 on
 * an error, or 1 when SIGINT is pending between two chunks (the caller stops, "interrupted"). */
static int gen_prefill(k3_engine *e, k3_state *st, const int32_t *prompt, size_t n_prompt, uint32_t chunk,
                       float **row, rl_err *err) {
    for (size_t i = 0; i < n_prompt; i += chunk) {
        uint32_t n = (uint32_t)(n_prompt - i < chunk ? n_prompt - i : chunk);
        bool last = i + n == n_prompt;
        if (gen_step(e, st, prompt + i, n, last, row, err) != 0) return -1;
        if (!last && gen_sigint_pending()) return 1;
    }
    return 0;
}

/* The warm-up run: the prompt once and one decode step, untimed, then the state cleared. llama-bench does
 * this before it times anything (its default warm-up run), so its figures are of compute memory already
 * allocated and touched; a timed first pass pays for both (page faults of the compute buffer: 3-5% of a
 * 512-token prefill of bench/models/medium.gguf here). With it the two engines are timed alike. The caller
 * has checked that the prompt leaves room for the step. Returns as gen_prefill. */
static int gen_warmup(k3_engine *e, k3_state *st, const int32_t *prompt, size_t n_prompt, uint32_t chunk,
                      rl_err *err) {
    float *row = NULL;
    int rc = gen_prefill(e, st, prompt, n_prompt, chunk, &row, err);
    free(row);
    row = NULL;
    if (rc == 0) rc = gen_step(e, st, prompt + n_prompt - 1, 1, true, &row, err);
    free(row);
    k3_state_reset(st);
    return rc;
}

int gen_run(k3_engine *e, const tok_tokenizer *tok, const int32_t *prompt, size_t n_prompt, const gen_params *p,
            gen_token_cb cb, void *user, gen_metrics *m, rl_err *err) {
    memset(m, 0, sizeof *m);
    m->prompt_tokens = (int)n_prompt;
    if (n_prompt == 0) return rl_errf(err, "empty prompt");
    if (n_prompt >= p->n_ctx) {
        return rl_errf(err, "prompt of %zu tokens does not fit the context of %u", n_prompt, p->n_ctx);
    }
    k3_state st;
    smp_sampler smp;
    gen_out out;
    if (k3_state_init(&st, &e->hp, 0, e->hp.n_layer, p->n_ctx, err) != 0) return -1;
    if (smp_init(&smp, &p->smp, (int32_t)e->hp.n_vocab, err) != 0) {
        k3_state_free(&st);
        return -1;
    }
    uint32_t chunk = p->chunk ? p->chunk : (uint32_t)n_prompt;
    int rc = p->warmup ? gen_warmup(e, &st, prompt, n_prompt, chunk, err) : 0;
    gen_out_begin(&out, tok, p, cb, user, m);
    for (size_t i = 0; i < n_prompt; i++) smp_accept(&smp, prompt[i]); /* penalties see the prompt too */

    float *row = NULL;
    m->stop_reason = "length";
    if (rc == 0) rc = gen_prefill(e, &st, prompt, n_prompt, chunk, &row, err);
    if (rc == 1) {
        m->stop_reason = "interrupted";
        rc = 0;
        goto done;
    }
    if (rc != 0) goto done;
    m->prefill_s = rl_clock_now() - out.t0;
    for (int g = 0; p->n_predict < 0 || g < p->n_predict; g++) {
        int32_t id = smp_sample(&smp, row);
        free(row);
        row = NULL;
        smp_accept(&smp, id);
        int r = gen_out_token(&out, id, err);
        if (r != 0) {
            rc = r < 0 ? -1 : 0;
            break;
        }
        if (gen_sigint_pending()) {
            m->stop_reason = "interrupted";
            break;
        }
        if (p->n_predict >= 0 && g + 1 >= p->n_predict) break; /* no forward pass for a token never used */
        if (st.n_past + 1 > st.n_ctx) {
            m->stop_reason = "context";
            break;
        }
        if (gen_step(e, &st, &id, 1, true, &row, err) != 0) {
            rc = -1;
            break;
        }
    }
done:
    gen_out_end(&out, rc == 0, n_prompt);
    m->compute_bytes = k3_engine_compute_bytes(e);
    free(row);
    smp_free(&smp);
    k3_state_free(&st);
    return rc;
}
