/* emit.h - what every decode loop does with a committed token, whoever computed it (one machine, the ring,
 * speculation): count it, stamp the first one, stop at end-of-generation, stream its text; and at the end,
 * flush held-back text and fill the rates of gen_metrics. One place, so the three loops cannot drift. */
#ifndef RINGLM_EMIT_H
#define RINGLM_EMIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "generate.h"

typedef struct gen_out {
    tok_stream ts;
    bool ignore_eog;
    gen_token_cb cb;
    void *user;
    gen_metrics *m;
    double t0, t_first; /* start (rl_clock_now), first generated token */
} gen_out;

/* Monotonic seconds. */

/* The process's peak resident memory in bytes (0 if unknown). */
size_t gen_peak_rss(void);

/* True when a SIGINT is pending (callers keep it blocked and poll between steps). */
bool gen_sigint_pending(void);

/* Starts the clock; m is the caller's (already zeroed) metrics. */
void gen_out_begin(gen_out *o, const tok_tokenizer *tok, const gen_params *p, gen_token_cb cb, void *user,
                   gen_metrics *m);

/* One committed token. Returns 0 to go on, 1 to stop (m->stop_reason set: "eog" or "callback"), -1 on error. */
int gen_out_token(gen_out *o, int32_t id, rl_err *err);

/* Flushes held-back text to the callback when ok, fills decode and prefill rates and peak RSS, frees. */
void gen_out_end(gen_out *o, bool ok, size_t n_prompt);

#endif
