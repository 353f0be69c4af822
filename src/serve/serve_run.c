/* `ringlm serve`'s lifecycle (serve_run.h). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../coord/target.h"
#include "../base/clock.h"
#include "../model/k3_memory.h"
#include "../speculate/draft_pool.h"
#include "../speculate/drafter.h"
#include "backend_local.h"
#include "backend_ring.h"
#include "http.h"
#include "scheduler.h"
#include "serve_run.h"

/* Everything the server holds, released in the reverse order by serve_state_free. */
typedef struct serve_state {
    mf_model m;
    k3_hparams hp;
    manifest_file mf;
    tok_tokenizer tok;
    k3_engine e;
    sch_backend be;
    ring_conf rconf;
    ring_relay relay;       /* --relay-listen: for rconf's nodes behind NATs */
    keys_identity rid;
    FILE *rfile;            /* --receipts, appended to */
    sch_sched s;
    http_server h;
    spec_pool dpool;
    spec_drafter *dspark;   /* [parallel]: one DSpark context per sequence */
    int n_dspark;
    bool have_tok, have_engine, have_sched, have_dpool;
} serve_state;

/* The model's id: the file's name without its directories. */
static const char *serve_model_id(const char *path) {
    const char *s = strrchr(path, '/');
    return s && s[1] ? s + 1 : path;
}

/* DSpark: a context per sequence (the weights are one mapping of the file, shared). Opened before the ring,
 * which must know the tap layers: every ASSIGN tells the stages that hold them to send them. */
static int serve_dspark_open(const serve_opts *o, serve_state *st, rl_err *err) {
    st->dspark = calloc((size_t)o->parallel, sizeof *st->dspark);
    if (!st->dspark) return rl_errf(err, "out of memory");
    for (; st->n_dspark < o->parallel; st->n_dspark++) {
        if (spec_drafter_open(&st->dspark[st->n_dspark], o->draft, &st->m, &st->hp, (uint32_t)o->ctx,
                              o->draft_threads ? o->draft_threads : o->threads, NULL, err) != 0) {
            return -1;
        }
    }
    return 0;
}

/* The backend on the ring: the model file stays mapped here for its hash, its tokenizer and the layers
 * streamed to nodes that lack it; the nodes compute. */
static int serve_ring_open(const serve_opts *o, serve_state *st, rl_err *err) {
    if (ring_conf_load(&st->rconf, o->ring_path, err) != 0 || keys_load(&st->rid, o->key_path, err) != 0 ||
        ring_relay_start(&st->relay, o->trust.relay_listen, &st->rconf, &st->rid, err) != 0)
        return -1;
    sch_ring_config rcfg = {.conf = &st->rconf, .id = &st->rid, .m = &st->m, .hp = &st->hp,
                            .opts = ring_opts_default(), .n_slots = o->parallel};
    rcfg.opts.n_ctx = (uint32_t)o->ctx;
    rcfg.opts.wire = o->wire;
    rcfg.opts.keep_order = o->keep_order;
    rcfg.opts.manifest = o->manifest ? &st->mf : NULL;
    rcfg.opts.manifest_path = o->manifest;
    rcfg.opts.audit_rate = o->trust.audit_rate;
    rcfg.opts.audit_seed = o->trust.audit_seed;
    rcfg.opts.audit_tol = o->trust.audit_tol;
    rcfg.opts.audit_tol_arch = o->trust.audit_tol_arch;
    if (o->trust.node_timeout > 0) rcfg.opts.dead_s = o->trust.node_timeout;
    rcfg.opts.link_s = o->trust.link_timeout;
    rcfg.opts.relay_addr = ring_relay_addr(&st->relay);
    if (strcmp(o->draft, "none") != 0) { /* each step verifies a block of up to draft_n drafts per sequence */
        rcfg.opts.spec_block = (uint32_t)o->draft_n + 1;
        rcfg.opts.spec_depth = 1;
    }
    if (st->dspark) {
        const uint32_t *layers;
        rcfg.opts.n_taps = spec_drafter_taps(&st->dspark[0], &layers);
        memcpy(rcfg.opts.taps, layers, (size_t)rcfg.opts.n_taps * sizeof *layers);
    }
    /* The prompt cache: checkpoints on every stage, per slot's sequence (backend_ring.h). Whether a resumed
     * prompt is exact depends on the nodes' kernels; they repack weights by default, so it is judged so. */
    char why[256] = "";
    if (o->ctx_checkpoints > 0) {
        rcfg.opts.ctx_checkpoints = o->ctx_checkpoints;
        rcfg.reread_chunk = (uint32_t)o->chunk;
        rcfg.exact = k3_range_split_invariant(&st->m, &st->hp, 0, st->hp.n_layer, false, why, sizeof why);
    }
    if (o->trust.receipts) {
        st->rfile = fopen(o->trust.receipts, "a");
        if (!st->rfile) return rl_errf(err, "cannot open %s for appending: %s", o->trust.receipts, strerror(errno));
        setvbuf(st->rfile, NULL, _IOLBF, 0); /* whole lines, so a reader never sees half a receipt */
        rcfg.opts.receipts = true;
        rcfg.opts.receipts_out = st->rfile;
    }
    if (sch_backend_ring(&st->be, &rcfg, err) != 0) return -1;
    if (o->ctx_checkpoints > 0) {
        fprintf(stderr, "ringlm serve: prompt cache: %d checkpoints per slot on every stage (%.2f MiB each over the "
                        "ring), in the slots only (--cache-ram is not used with --ring); %s (%s)\n",
                o->ctx_checkpoints, (double)k3_range_kda_state_bytes(&st->hp, 0, st->hp.n_layer) / 1048576.0,
                rcfg.exact ? "a resumed prompt gives the bits of a fresh read" : "a resumed prompt may differ from a fresh read in the last bits",
                why);
    }
    return 0;
}

/* The backend on this machine: an engine for the whole model. */
static int serve_local_open(const serve_opts *o, serve_state *st, rl_err *err) {
    k3_engine_opts eo = o->eo;
    eo.n_threads = o->threads;
    eo.progress = o->progress;
    if (k3_engine_init(&st->e, &st->m, &st->hp, 0, st->hp.n_layer, &eo, err) != 0) return -1;
    st->have_engine = true;
    k3_weights_prefault(&st->e.w, o->progress && st->m.tensor_bytes > (64u << 20));
    if (sch_backend_local(&st->be, &st->e, o->parallel, (uint32_t)o->ctx, err) != 0) return -1;
    if (o->ctx_checkpoints <= 0) return 0; /* no prompt cache */
    char why[256];
    sch_local_cache_opts co = {.ram_bytes = o->cache_ram, .ctx_checkpoints = o->ctx_checkpoints,
                               .reread_chunk = (uint32_t)o->chunk};
    co.exact = k3_range_split_invariant(&st->m, &st->hp, 0, st->hp.n_layer, o->eo.no_repack, why, sizeof why);
    if (sch_local_cache_on(&st->be, &co, err) != 0) {
        st->be.free(st->be.impl);
        return -1;
    }
    fprintf(stderr, "ringlm serve: prompt cache: %d checkpoints per slot (%.2f MiB each), %.0f MiB of host RAM; %s (%s)\n",
            o->ctx_checkpoints, (double)sch_local_ckpt_bytes(&st->be) / 1048576.0, (double)o->cache_ram / 1048576.0,
            co.exact ? "a resumed prompt gives the bits of a fresh read" : "a resumed prompt may differ from a fresh read in the last bits",
            why);
    return 0;
}

/* The line that says the server is up, and where. */
static void serve_announce(const serve_opts *o, const serve_state *st, const http_config *hc, bool draft_model,
                           bool draft_dspark) {
    char where[64];
    if (o->ring_path) snprintf(where, sizeof where, "a ring of %d nodes", st->rconf.n);
    else snprintf(where, sizeof where, "%d threads", o->threads);
    const bool drafts = strcmp(o->draft, "none") != 0;
    fprintf(stderr,
            "ringlm serve: listening on http://%s%s%s:%d  (model %s, %d sequences x %d tokens, queue %d, %s%s%s%s%s)\n",
            strchr(o->host, ':') ? "[" : "", o->host, strchr(o->host, ':') ? "]" : "", st->h.port, hc->model_id,
            o->parallel, o->ctx, o->queue, where, o->api_key ? ", API key required" : "", drafts ? ", drafts: " : "",
            drafts ? (draft_dspark ? "dspark:" : "") : "",
            drafts ? (draft_model || draft_dspark ? serve_model_id(o->draft) : o->draft) : "");
}

/* Waits for SIGINT or SIGTERM, then stops: no new connections, running requests given up to o->drain
 * seconds (a second signal cuts that short), the rest cancelled, every response sent to its end. */
static void serve_wait_stop(const serve_opts *o, serve_state *st) {
    sigset_t stop_sigs;
    sigemptyset(&stop_sigs);
    sigaddset(&stop_sigs, SIGINT);
    sigaddset(&stop_sigs, SIGTERM);
    int sig;
    do sig = sigwaitinfo(&stop_sigs, NULL);
    while (sig < 0 && errno == EINTR);
    fprintf(stderr, "ringlm serve: %s: not accepting connections; letting running requests finish (up to %d s)\n",
            strsignal(sig), o->drain);
    http_quiesce(&st->h);
    sch_close(&st->s);
    double deadline = rl_clock_now() + o->drain;
    const struct timespec zero = {0, 0};
    /* Idle means every response has been sent to the end, not merely generated. */
    while (!http_wait_idle(&st->h, 0.1)) {
        if (rl_clock_now() >= deadline || sigtimedwait(&stop_sigs, NULL, &zero) > 0) {
            fprintf(stderr, "ringlm serve: cancelling the requests still running\n");
            break;
        }
    }
    sch_abort(&st->s); /* cancels them, and a ring stops waiting on any node */
    http_wait_idle(&st->h, 5); /* cancelled streams still send their closing error event */
    http_stop(&st->h); /* waits for every connection's thread: their requests have all ended now */
    fprintf(stderr, "ringlm serve: stopped\n");
}

/* Releases what st holds; rc is the run's result so far, returned unless closing the receipts file fails. */
static int serve_state_free(serve_state *st, const serve_opts *o, int rc, rl_err *err) {
    if (st->have_sched) sch_free(&st->s); /* frees the backend too */
    if (st->have_dpool) spec_pool_close(&st->dpool);
    for (int i = 0; i < st->n_dspark; i++) spec_drafter_close(&st->dspark[i]);
    free(st->dspark);
    if (st->have_engine) k3_engine_free(&st->e);
    ring_relay_stop(&st->relay); /* after the ring's backend: its links ran through it */
    if (st->rfile && fclose(st->rfile) != 0 && rc == 0) rc = rl_errf(err, "cannot write %s", o->trust.receipts);
    if (st->have_tok) tok_free(&st->tok);
    ring_target_close(&st->m, &st->mf);
    return rc;
}

int serve_run(const serve_opts *o, rl_err *err) {
    serve_state st;
    memset(&st, 0, sizeof st);
    if (ring_target_open(o->model, o->manifest, &st.m, &st.hp, &st.mf, err) != 0) return -1;
    int rc = -1;
    if (tok_load(&st.tok, &st.m, err) != 0) goto out;
    st.have_tok = true;
    chat_format fmt = CHAT_FMT_K3;
    rl_err chat_err = {{0}};
    bool have_chat = chat_detect_model(&st.m, &fmt, &chat_err) == 0;
    if (!have_chat) fprintf(stderr, "ringlm serve: warning: /v1/chat/completions disabled: %s\n", chat_err.msg);
    const bool draft_dspark = strncmp(o->draft, "dspark:", 7) == 0;
    if (draft_dspark && serve_dspark_open(o, &st, err) != 0) goto out;
    if ((o->ring_path ? serve_ring_open(o, &st, err) : serve_local_open(o, &st, err)) != 0) goto out;
    /* A draft model runs here whatever runs the target: one state per sequence (docs/serve.md). */
    const bool draft_model = strcmp(o->draft, "ngram") != 0 && strcmp(o->draft, "none") != 0 && !draft_dspark;
    if (draft_model) {
        if (spec_pool_open(&st.dpool, o->draft, st.hp.n_vocab, o->parallel, (uint32_t)o->ctx,
                           o->draft_threads ? o->draft_threads : o->threads, err) != 0) {
            st.be.free(st.be.impl);
            goto out;
        }
        st.have_dpool = true;
    }
    sch_config sc = {.queue_cap = o->queue, .chunk = (uint32_t)o->chunk, .ckpt_every = (uint32_t)o->ckpt_every,
                     .no_draft_fallback = o->no_draft_fallback, .draft = draft_model ? &st.dpool : NULL,
                     .dspark = st.dspark};
    if (sch_init(&st.s, &st.be, &st.tok, &sc, err) != 0) {
        st.be.free(st.be.impl);
        goto out;
    }
    st.have_sched = true;
    if (sch_start(&st.s, err) != 0) goto out;
    http_config hc = {.host = o->host, .port = o->port, .api_key = o->api_key, .body_limit = o->max_body,
                      .model_id = serve_model_id(o->model ? o->model : o->manifest), .aliases = o->aliases,
                      .n_aliases = o->n_aliases, .have_chat = have_chat, .chat_fmt = fmt, .chat_err = chat_err.msg,
                      .max_connections = 64 + 2 * (o->parallel + o->queue), .quiet = o->quiet,
                      .max_per_ip = o->per_ip, .header_timeout_s = o->header_timeout,
                      .idle_timeout_s = o->idle_timeout, .draft_n = strcmp(o->draft, "none") != 0 ? o->draft_n : 0,
                      .draft_k = o->draft_n, .draft_model = draft_model, .have_draft_model = draft_model,
                      .draft_dspark = draft_dspark, .have_dspark = draft_dspark};
    if (http_start(&st.h, &hc, &st.s, &st.tok, err) != 0) goto out;
    serve_announce(o, &st, &hc, draft_model, draft_dspark);
    serve_wait_stop(o, &st);
    rc = 0;
out:
    return serve_state_free(&st, o, rc, err);
}
