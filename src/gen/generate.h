/* Folder src/gen/: the decode loop on one machine (prefill, sampling, streaming, timings). May include: base,
 * model, text. (README "Layout"; tests/t_layout.sh checks both.)
 */
/* generate.h - the decode loop: prompt tokens in, sampled tokens and text out, with timings.
 *
 * Runs on a k3_engine for the whole model (one machine). The prompt is prefilled in chunks, then one
 * token per step is sampled, streamed through a callback as text, and fed back. Stops at an
 * end-of-generation token, after n_predict tokens, when the context is full, when the callback says
 * so, or when SIGINT is pending (the caller blocks SIGINT; we poll it between steps, so a Ctrl-C never
 * interrupts a half-done step). */
#ifndef RINGLM_GENERATE_H
#define RINGLM_GENERATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/err.h"
#include "../model/k3_forward.h"
#include "../text/sampler.h"
#include "../text/tokenizer.h"

typedef struct gen_params {
    int n_predict;       /* tokens to generate at most (< 0: until the context is full) */
    uint32_t n_ctx;      /* context capacity (prompt + generated) */
    uint32_t chunk;      /* prefill chunk size (0: the whole prompt at once) */
    bool ignore_eog;     /* keep going past end-of-generation tokens */
    bool warmup;         /* first the prompt and one step untimed, then a clean state (llama-bench's warm-up) */
    smp_params smp;
} gen_params;

typedef struct gen_metrics {
    int prompt_tokens, generated_tokens;
    double prefill_s;  /* prompt processing */
    double ttft_s;     /* start to first generated token */
    double decode_s;   /* from the first to the last generated token */
    double prefill_tok_s, decode_tok_s;
    size_t peak_rss_bytes;
    size_t compute_bytes;    /* the engine's compute buffer at the end (k3_engine_compute_bytes; 0 on a ring) */
    const char *stop_reason; /* "eog", "length", "context", "interrupted", "callback" */
} gen_metrics;

/* Called for every generated token with the text it completes (possibly empty while a UTF-8 character
 * is still unfinished). Return non-zero to stop. */
typedef int (*gen_token_cb)(void *user, int32_t id, const char *text, size_t len);

int gen_run(k3_engine *e, const tok_tokenizer *tok, const int32_t *prompt, size_t n_prompt, const gen_params *p,
            gen_token_cb cb, void *user, gen_metrics *m, rl_err *err);


#endif
