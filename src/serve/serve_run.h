/* serve_run.h - `ringlm serve`'s lifecycle: the model (or its manifest) and tokenizer opened, the backend made
 * (an engine here, or a ring of nodes as their coordinator), drafts (a draft model's pool, DSpark contexts),
 * the scheduler and the HTTP server started; then, at SIGINT or SIGTERM, a drain and the shutdown.
 *
 * The command line's parsing is the cli's (src/cli/cmd_serve.c); this is what it asked for, done. */
#ifndef RINGLM_SERVE_RUN_H
#define RINGLM_SERVE_RUN_H

#include <stdbool.h>
#include <stddef.h>

#include "../base/err.h"
#include "../model/k3_forward.h"
#include "../coord/coord.h"

typedef struct serve_opts {
    const char *model;       /* the model file (-m), or NULL with manifest */
    const char *manifest;    /* (ring) the coordinator holds only the model's manifest; exactly one of the two */
    const char *host;        /* address to listen on */
    int port;                /* 0: any free port (printed at start) */
    const char *api_key;     /* NULL: no key */
    const char *const *aliases; /* more names the model answers to */
    int n_aliases;
    size_t max_body;         /* largest request body */
    int header_timeout, idle_timeout, per_ip; /* seconds, seconds, connections per client address */
    bool quiet;              /* no log line per request */
    int parallel, ctx, queue, chunk; /* sequences at once, context of each, requests waiting, prompt tokens per step */
    int drain;               /* seconds running requests may take to finish after the first signal */
    /* The prompt cache (one machine; docs/serve.md): host RAM for prefixes slots moved on from (0: none),
     * checkpoints per slot (0: no prompt cache at all), and a checkpoint every this many prompt tokens. */
    size_t cache_ram;
    int ctx_checkpoints, ckpt_every;
    int threads;             /* compute threads here (the engine's; the draft model's unless draft_threads) */
    bool progress;           /* show loading progress on stderr */
    k3_engine_opts eo;       /* all but n_threads and progress (set from threads and progress here) */
    /* Drafts: "none", "ngram", a draft model's file or dspark:FILE. */
    const char *draft;
    int draft_n, draft_threads; /* draft_threads 0: threads */
    bool no_draft_fallback;  /* --draft-fallback off: drafts never paused for plain decoding */
    /* The ring (ring_path NULL: this machine computes). */
    const char *ring_path, *key_path;
    int wire;                /* enum k3_wire_dtype of boundary states between nodes */
    bool keep_order;
    ring_trust trust;
} serve_opts;

/* Serves until SIGINT or SIGTERM, then drains and stops; 0 after a clean stop, -1 with err when anything
 * fails. The caller blocks SIGINT, SIGTERM and SIGPIPE before any thread exists (so every thread inherits
 * the mask): the signals stay pending until serve_run takes them with sigwaitinfo, and shutdown runs as
 * ordinary code, with no handler and no global flag; a client that hangs up cannot kill the process. */
int serve_run(const serve_opts *o, rl_err *err);

#endif
