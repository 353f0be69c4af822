/* prompt_run.h - `ringlm run`: one prompt generated on this machine or through a ring of nodes (as its
 * coordinator), speculating or not, its text streamed to stdout and a summary on stderr.
 *
 * The command line's parsing is the cli's (src/cli/cmd_run.c); this is what it asked for, done: open the model
 * (or its manifest), the tokenizer, the prompt as token ids (--tokens as given, or -p encoded, wrapped in the
 * model's chat format with --chat), the drafter; then generate locally or on the ring, print the summary
 * lines and write --metrics-json. It lives in src/coord/ because the ring coordinator is one of the ways it
 * runs, and only this layer may include both it and the one-machine loops (gen, speculate). */
#ifndef RINGLM_PROMPT_RUN_H
#define RINGLM_PROMPT_RUN_H

#include <stdbool.h>

#include "../base/err.h"
#include "../gen/generate.h"
#include "../model/k3_forward.h"
#include "coord.h"

typedef struct prompt_opts {
    const char *model;       /* the model file (-m), or NULL with manifest */
    const char *manifest;    /* (ring) the coordinator holds only the model's manifest; exactly one of the two */
    const char *prompt;      /* the prompt's text (-p), or NULL with tokens */
    const char *tokens;      /* its ids, "1,2,3" or "@FILE" (--tokens); exactly one of the two */
    const char *system;      /* with chat: a system turn first (NULL: none) */
    bool chat;               /* wrap the prompt as a user turn in the model's chat format */
    bool ids;                /* print the generated ids (comma-separated) instead of text */
    bool progress;           /* show loading progress on stderr */
    const char *metrics;     /* write the metrics as JSON here (NULL: no file) */
    int threads, ctx, chunk; /* compute threads here, context (prompt + generated), prefill chunk */
    k3_engine_opts eo;       /* all but n_threads and progress (set from threads and progress here) */
    gen_params gp;           /* n_ctx and chunk as ctx and chunk; smp.bias checked against the vocabulary here */
    /* Speculation: draft NULL or "none" for none; else ngram, a draft model's file or dspark:FILE. */
    const char *draft;
    int draft_n, draft_depth;
    float draft_p_min;
    bool draft_fixed;        /* always draft_n drafts (by default the length adapts to acceptance) */
    bool draft_no_fallback;  /* draft every step, paying or not (spec_gen.h SPEC_FALLBACK_*) */
    /* The ring (ring_path NULL: this machine computes). */
    const char *ring_path, *key_path;
    int wire;                /* enum k3_wire_dtype of boundary states between nodes */
    bool keep_order;
    ring_trust trust;
} prompt_opts;

/* Runs o to the end. Ctrl-C: the caller blocks SIGINT; the loops poll it between steps and stop cleanly (a
 * normal end, stop reason "interrupted"). -1 with err when anything fails (the text streamed so far stays
 * printed). */
int prompt_run(const prompt_opts *o, rl_err *err);

#endif
