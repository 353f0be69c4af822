#include "emit.h"
#include "../base/clock.h"

#include <signal.h>
#include <sys/resource.h>
#include <time.h>

size_t gen_peak_rss(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return (size_t)ru.ru_maxrss * 1024; /* Linux reports KiB */
}

bool gen_sigint_pending(void) {
    sigset_t pend;
    return sigpending(&pend) == 0 && sigismember(&pend, SIGINT);
}

void gen_out_begin(gen_out *o, const tok_tokenizer *tok, const gen_params *p, gen_token_cb cb, void *user,
                   gen_metrics *m) {
    tok_stream_init(&o->ts, tok, false);
    o->ignore_eog = p->ignore_eog;
    o->cb = cb;
    o->user = user;
    o->m = m;
    o->t0 = rl_clock_now();
    o->t_first = 0;
}

int gen_out_token(gen_out *o, int32_t id, rl_err *err) {
    gen_metrics *m = o->m;
    m->generated_tokens++;
    if (m->generated_tokens == 1) {
        o->t_first = rl_clock_now();
        m->ttft_s = o->t_first - o->t0;
    }
    if (!o->ignore_eog && tok_is_eog(o->ts.t, id)) {
        m->stop_reason = "eog";
        return 1;
    }
    const char *text;
    size_t len;
    if (tok_stream_push(&o->ts, id, &text, &len, err) != 0) return -1;
    if (o->cb && o->cb(o->user, id, text, len) != 0) {
        m->stop_reason = "callback";
        return 1;
    }
    return 0;
}

void gen_out_end(gen_out *o, bool ok, size_t n_prompt) {
    gen_metrics *m = o->m;
    if (ok && o->cb) {
        const char *text;
        size_t len;
        tok_stream_flush(&o->ts, &text, &len);
        if (len) o->cb(o->user, -1, text, len);
    }
    if (m->generated_tokens > 0) {
        m->decode_s = rl_clock_now() - o->t_first;
        if (m->generated_tokens > 1 && m->decode_s > 0) m->decode_tok_s = (m->generated_tokens - 1) / m->decode_s;
    }
    if (m->prefill_s > 0) m->prefill_tok_s = (double)n_prompt / m->prefill_s;
    m->peak_rss_bytes = gen_peak_rss();
    tok_stream_free(&o->ts);
}
