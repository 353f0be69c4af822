#include "generate.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

static double gen_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

size_t gen_peak_rss(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return (size_t)ru.ru_maxrss * 1024; /* Linux reports KiB */
}

/* True when a SIGINT is pending (the caller keeps it blocked while we run). */
static bool gen_interrupted(void) {
    sigset_t pend;
    return sigpending(&pend) == 0 && sigismember(&pend, SIGINT);
}

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
    tok_stream ts;
    if (k3_state_init(&st, &e->hp, 0, e->hp.n_layer, p->n_ctx, err) != 0) return -1;
    if (smp_init(&smp, &p->smp, (int32_t)e->hp.n_vocab, err) != 0) {
        k3_state_free(&st);
        return -1;
    }
    tok_stream_init(&ts, tok, false);
    for (size_t i = 0; i < n_prompt; i++) smp_accept(&smp, prompt[i]); /* penalties see the prompt too */

    int rc = 0;
    float *row = NULL;
    double t0 = gen_now();
    uint32_t chunk = p->chunk ? p->chunk : (uint32_t)n_prompt;
    m->stop_reason = "length";
    for (size_t i = 0; i < n_prompt && rc == 0; i += chunk) {
        uint32_t n = (uint32_t)(n_prompt - i < chunk ? n_prompt - i : chunk);
        bool last = i + n == n_prompt;
        rc = gen_step(e, &st, prompt + i, n, last, &row, err);
        if (rc == 0 && !last && gen_interrupted()) {
            m->stop_reason = "interrupted";
            goto done;
        }
    }
    if (rc != 0) goto done;
    double t_prefill = gen_now();
    m->prefill_s = t_prefill - t0;
    double t_first = 0;
    for (int g = 0; p->n_predict < 0 || g < p->n_predict; g++) {
        int32_t id = smp_sample(&smp, row);
        free(row);
        row = NULL;
        smp_accept(&smp, id);
        m->generated_tokens++;
        if (g == 0) {
            t_first = gen_now();
            m->ttft_s = t_first - t0;
        }
        if (!p->ignore_eog && tok_is_eog(tok, id)) {
            m->stop_reason = "eog";
            break;
        }
        const char *text;
        size_t len;
        if (tok_stream_push(&ts, id, &text, &len, err) != 0) {
            rc = -1;
            break;
        }
        if (cb && cb(user, id, text, len) != 0) {
            m->stop_reason = "callback";
            break;
        }
        if (gen_interrupted()) {
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
    if (rc == 0 && cb) {
        const char *text;
        size_t len;
        tok_stream_flush(&ts, &text, &len);
        if (len) cb(user, -1, text, len);
    }
    if (m->generated_tokens > 0) {
        m->decode_s = gen_now() - t_first;
        if (m->generated_tokens > 1 && m->decode_s > 0) m->decode_tok_s = (m->generated_tokens - 1) / m->decode_s;
    }
    if (m->prefill_s > 0) m->prefill_tok_s = (double)n_prompt / m->prefill_s;
done:
    m->peak_rss_bytes = gen_peak_rss();
    free(row);
    tok_stream_free(&ts);
    smp_free(&smp);
    k3_state_free(&st);
    return rc;
}
