/* ringlm serve: the OpenAI-compatible HTTP server, on this machine or on a ring of nodes (src/serve/,
 * docs/serve.md). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../ring/target.h"
#include "../serve/backend_ring.h"
#include "../base/heap.h"
#include "../speculate/draft_pool.h"
#include "../speculate/drafter.h"
#include "../serve/http.h"
#include "../serve/scheduler.h"
#include "cli.h"

static void serve_usage(FILE *f) {
    fprintf(f,
            "usage: ringlm serve -m MODEL.gguf [--host 127.0.0.1] [--port 8080] [--api-key KEY]\n"
            "                    [--parallel N] [--ctx N] [--queue N] [--threads N] [--chunk N]\n"
            "                    [--no-repack] [--flash-attn on|off|auto] [--cache-type f32|f16] [--mem GB [--expert-copy DIR]]\n"
            "                    [--device NAME[,NAME...]] [--vram GB] [--gpu-layers N] [--n-cpu-moe N | --cpu-moe]\n"
            "                    [--max-body BYTES] [--drain SECONDS] [--header-timeout S] [--idle-timeout S]\n"
            "                    [--max-conn-per-ip N] [--alias NAME]... [--quiet]\n"
            "                    [--draft ngram|none|DRAFT.gguf|dspark:DRAFT.gguf [--draft-n K] [--draft-threads N]]\n"
            "                    [--ring ring.conf --key coord.key [--manifest M instead of -m] [--wire f32|f16|bf16] [--keep-order] [--receipts FILE]\n"
            "                     [--audit-rate R [--audit-seed S] [--audit-tol T]] [--node-timeout S]]\n\n"
            "Serves the model over an OpenAI-compatible HTTP API (docs/serve.md):\n"
            "  POST /v1/chat/completions, POST /v1/completions (streamed with \"stream\": true),\n"
            "  GET /v1/models, GET /health, GET /metrics (Prometheus), GET / (a chat page).\n"
            "Requests share the model by continuous batching: each step runs one decode token of every\n"
            "running request and a prompt chunk of newly arrived ones in a single forward pass.\n\n"
            "  --host H       address to listen on (default 127.0.0.1; 0.0.0.0 for every interface)\n"
            "  --port P       port (default 8080; 0 = any free port, printed at start)\n"
            "  --api-key KEY  require \"Authorization: Bearer KEY\" on /v1/* (default: no key)\n"
            "  --alias NAME   another name a request's \"model\" may use (repeatable; the first is the one\n"
            "                 /v1/models lists first and responses name when a request names none)\n"
            "  --parallel N   sequences generated at once (default 4); each holds a --ctx state\n"
            "  --ctx N        context of each sequence, prompt + generated tokens (default 4096)\n"
            "  --queue N      requests that may wait for a free sequence (default 16); more get 429\n"
            "  --threads N    compute threads on this machine (default: all cores; not used with --ring)\n"
            "  --chunk N      prompt tokens per step over all new requests (default 256)\n"
            "  --no-repack    keep every weight in the file mapping (default: quantized matmul weights are\n"
            "                 copied into the CPU's repacked layouts where llama.cpp would; not used with --ring)\n"
            "  --flash-attn on|off|auto, --cache-type f32|f16  MLA attention by flash attention over an f16 cache,\n"
            "                 as llama.cpp's defaults (the defaults here too); off / f32: the softmax path\n"
            "  --mem GB       at most GB of resident weights; past it routed experts are read from the file\n"
            "                 through a cache (docs/experts.md; /metrics has its counters; not used with --ring);\n"
            "                 --expert-copy DIR keeps them re-laid for the repacked kernels there\n"
            "  --device NAME, --gpu-layers N, --n-cpu-moe N, --cpu-moe  where to compute: a GPU (default: the\n"
            "                 first found, else the CPU), how many layers on it, routed experts kept in RAM;\n"
            "                 --vram GB: the device memory weights may take (docs/devices.md). With --mem:\n"
            "                 VRAM -> RAM -> disk\n"
            "  --max-body B   largest request body in bytes (default 1048576); larger gets 413\n"
            "  --header-timeout S  a connection must send a request's headers within S seconds of connecting\n"
            "                 or of its previous response, or it is closed (default 10)\n"
            "  --idle-timeout S    a connection that sends and receives nothing for S seconds is closed\n"
            "                 (default 120)\n"
            "  --max-conn-per-ip N connections one client address may hold at once (default 32)\n"
            "  --drain S      on SIGINT/SIGTERM, let running requests finish for up to S seconds\n"
            "                 (default 30), then cancel them; a second signal cancels at once\n"
            "  --quiet        no log line per request\n"
            "  --draft D      speculative decoding for every request: ngram (prompt lookup over the request's\n"
            "                 own text), a small draft model sharing the vocabulary, run here with a state\n"
            "                 per sequence and one batch per drafted token for all requests, or dspark:FILE (a\n"
            "                 DSpark draft: a block per pass from the target's hidden states at its tap layers,\n"
            "                 which every step returns, from the ring's stages too). A request may say\n"
            "                 \"draft\": \"ngram\", \"model\", \"dspark\" or \"none\". Up to --draft-n tokens\n"
            "                 (default 7) are verified in the request's step; the output is unchanged at\n"
            "                 temperature 0 and keeps its distribution otherwise\n"
            "  --draft-threads N  compute threads of the draft model (default: --threads)\n"
            "  --ring FILE    run the model on the nodes in FILE (\"HOST:PORT PUBKEY_HEX [mem=GB]\" per line)\n"
            "                 as their coordinator with identity --key: every step is one frame through the\n"
            "                 ring carrying every running request; a ring that breaks answers 503 and is\n"
            "                 re-planned at the next request once every node answers again\n"
            "  --manifest M   (with --ring, instead of -m) this machine holds only the model's manifest (ringlm\n"
            "                 manifest): nodes map their layers from the split files they hold (--models) and\n"
            "                 stream the rest from each other, every tensor checked against M\n"
            "  --key FILE     the coordinator's key (ringlm keygen), with --ring\n"
            "  --wire T       boundary states between nodes as f32 (default, exact), f16 or bf16\n"
            "  --keep-order   run the nodes in ring.conf's order (default: the order with the shortest measured\n"
            "                 round trip, docs/plan.md)\n"
            "  --receipts F   every stage signs a receipt per step, checked as it arrives and appended to F\n"
            "                 (JSON lines, ringlm receipts verify); a node whose receipt fails is left out\n"
            "  --node-timeout S  a node that answers nothing for S seconds while a step waits on it is\n"
            "                 declared dead (default 60; measured from the first unanswered ping)\n"
            "  --audit-rate R audit each finished request with probability R (receipts on): this machine\n"
            "                 recomputes one stage for it (drawn from --audit-seed) and compares within\n"
            "                 --audit-tol (default 0.01); a node that fails is left out of the ring, and\n"
            "                 /health and /metrics say so (docs/receipts.md)\n");
}

/* The model's id: the file's name without its directories. */
static const char *serve_model_id(const char *path) {
    const char *s = strrchr(path, '/');
    return s && s[1] ? s + 1 : path;
}

int cmd_serve(int argc, char **argv) {
    const char *model = NULL, *host = "127.0.0.1", *api_key = NULL, *ring_path = NULL, *key_path = NULL;
    const char *wire = "f32", *manifest = NULL;
    ring_trust trust = {0};
    FILE *rfile = NULL;
    int port = 8080, parallel = 4, ctx = 4096, queue = 16, chunk = 256, drain = 30;
    int header_timeout = 10, idle_timeout = 120, per_ip = 32;
    int threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    unsigned long long max_body = 1u << 20;
    bool quiet = false, keep_order = false;
    k3_engine_opts eo = {0}; /* llama.cpp's defaults; n_threads from --threads when the engine starts */
    const char *alias[15];
    int n_alias = 0;
    const char *draft = "none";
    int draft_n = 7, draft_threads = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            serve_usage(stdout);
            return 0;
        }
        if (strcmp(a, "--quiet") == 0) {
            quiet = true;
            continue;
        }
        if (cli_engine_flag(a, &eo)) continue;
        if (strcmp(a, "--keep-order") == 0) {
            keep_order = true;
            continue;
        }
        /* A missing value still goes through the chain (as ""), so that an unknown option is named as one. */
        const char *given = i + 1 < argc ? argv[++i] : NULL, *v = given ? given : "";
        int bad = 0;
        const char *want = NULL; /* what a bad value should have been */
        bool known = true;
        if (strcmp(a, "-m") == 0) {
            model = v;
        } else if (strcmp(a, "--manifest") == 0) {
            manifest = v;
        } else if (strcmp(a, "--ring") == 0) {
            ring_path = v;
        } else if (strcmp(a, "--key") == 0) {
            key_path = v;
        } else if (strcmp(a, "--wire") == 0) {
            wire = v;
            bad = strcmp(v, "f32") && strcmp(v, "f16") && strcmp(v, "bf16"), want = "f32, f16 or bf16";
        } else if (cli_parse_trust(a, v, &trust, &bad)) {
        } else if (strcmp(a, "--host") == 0) {
            host = v;
        } else if (strcmp(a, "--api-key") == 0) {
            api_key = v;
            bad = !*v, want = "a non-empty key";
        } else if (strcmp(a, "--port") == 0) {
            bad = cli_parse_int(v, &port) || port < 0 || port > 65535, want = "a port number, 0 to 65535";
        } else if (strcmp(a, "--parallel") == 0) {
            bad = cli_parse_int(v, &parallel) || parallel < 1 || parallel > 256, want = "a number of sequences, 1 to 256";
        } else if (strcmp(a, "--ctx") == 0) {
            bad = cli_parse_int(v, &ctx) || ctx < 8, want = "a number of tokens, at least 8";
        } else if (strcmp(a, "--queue") == 0) {
            bad = cli_parse_int(v, &queue) || queue < 0 || queue > 100000, want = "a number, 0 to 100000";
        } else if (strcmp(a, "--threads") == 0) {
            bad = cli_parse_int(v, &threads) || threads < 1, want = "a number, at least 1";
        } else if (strcmp(a, "--chunk") == 0) {
            bad = cli_parse_int(v, &chunk) || chunk < 1, want = "a number of tokens, at least 1";
        } else if (strcmp(a, "--draft") == 0) {
            draft = v;
        } else if (strcmp(a, "--draft-threads") == 0) {
            bad = cli_parse_int(v, &draft_threads) || draft_threads < 1, want = "a number, at least 1";
        } else if (strcmp(a, "--draft-n") == 0) {
            bad = cli_parse_int(v, &draft_n) || draft_n < 1 || draft_n > SCH_MAX_DRAFT, want = "a number of tokens, 1 to the most a step verifies";
        } else if (strcmp(a, "--drain") == 0) {
            bad = cli_parse_int(v, &drain) || drain < 0, want = "seconds, 0 or more";
        } else if (strcmp(a, "--header-timeout") == 0) {
            bad = cli_parse_int(v, &header_timeout) || header_timeout < 1 || header_timeout > 3600, want = "seconds, 1 to 3600";
        } else if (strcmp(a, "--idle-timeout") == 0) {
            bad = cli_parse_int(v, &idle_timeout) || idle_timeout < 1 || idle_timeout > 86400, want = "seconds, 1 to 86400";
        } else if (strcmp(a, "--max-conn-per-ip") == 0) {
            bad = cli_parse_int(v, &per_ip) || per_ip < 1 || per_ip > 100000, want = "a number, 1 to 100000";
        } else if (cli_parse_engine(a, v, &eo, &bad, &want)) {
        } else if (strcmp(a, "--alias") == 0) {
            bad = n_alias == (int)(sizeof alias / sizeof alias[0]) || !*v, want = "a non-empty name (at most 15 aliases)";
            if (!bad) alias[n_alias++] = v;
        } else if (strcmp(a, "--max-body") == 0) {
            bad = cli_parse_u64(v, &max_body) || max_body < 1024, want = "bytes, at least 1024";
        } else {
            bad = 1, known = false;
        }
        if (bad || !given) return cli_bad_option("serve", a, given, known, want);
    }
    if (!model == !manifest) {
        fprintf(stderr, "ringlm serve: -m MODEL (or, with --ring, --manifest FILE) is required\n");
        serve_usage(stderr);
        return 2;
    }
    if (manifest && !ring_path) {
        fprintf(stderr, "ringlm serve: --manifest needs --ring: the weights are on the nodes\n");
        return 2;
    }
    if (cli_trust_check(&trust, ring_path != NULL, "serve")) return 2;
    if (!ring_path != !key_path) {
        fprintf(stderr, "ringlm serve: --ring and --key go together (the ring's nodes, the coordinator's identity)\n");
        return 2;
    }

    if (!eo.mem_bytes) rl_heap_keep(); /* a step's buffers stay for the next (base/heap.h) */

    /* SIGINT/SIGTERM are blocked here, before any thread exists, so every thread inherits the mask and the
     * signals stay pending until this thread takes them with sigwaitinfo: shutdown then runs as ordinary
     * code, with no handler and no global flag. SIGPIPE too: a client that hangs up must not kill us. */
    sigset_t stop_sigs, blocked;
    sigemptyset(&stop_sigs);
    sigaddset(&stop_sigs, SIGINT);
    sigaddset(&stop_sigs, SIGTERM);
    blocked = stop_sigs;
    sigaddset(&blocked, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &blocked, NULL);

    rl_err err = {{0}};
    mf_model m;
    k3_hparams hp;
    k3_engine e;
    tok_tokenizer tok;
    sch_backend be;
    ring_conf rconf;
    rk_identity rid;
    sch_sched s;
    http_server h;
    spec_pool dpool;
    spec_drafter *dspark = NULL; /* [parallel]: one DSpark context per sequence */
    int n_dspark = 0;
    bool have_tok = false, have_engine = false, have_sched = false, have_dpool = false;
    int rc = 1;
    mfst_file mf;
    if (ring_target_open(model, manifest, &m, &hp, &mf, &err) != 0) goto out_noclose;
    if (tok_load(&tok, &m, &err) != 0) goto out;
    have_tok = true;
    chat_format fmt = CHAT_FMT_K3;
    rl_err chat_err = {{0}};
    bool have_chat = chat_detect_model(&m, &fmt, &chat_err) == 0;
    if (!have_chat) fprintf(stderr, "ringlm serve: warning: /v1/chat/completions disabled: %s\n", chat_err.msg);
    /* DSpark: a context per sequence (the weights are one mapping of the file, shared). Opened before the
     * ring, which must know the tap layers: every ASSIGN tells the stages that hold them to send them. */
    const bool draft_dspark = strncmp(draft, "dspark:", 7) == 0;
    if (draft_dspark) {
        dspark = calloc((size_t)parallel, sizeof *dspark);
        if (!dspark) {
            rl_errf(&err, "out of memory");
            goto out;
        }
        for (; n_dspark < parallel; n_dspark++) {
            if (spec_drafter_open(&dspark[n_dspark], draft, &m, &hp, (uint32_t)ctx, draft_threads ? draft_threads : threads,
                                  NULL, &err) != 0) {
                goto out;
            }
        }
    }
    if (ring_path) {
        /* The model file stays mapped here for its hash, its tokenizer and the layers streamed to nodes that
         * lack it; the nodes compute. */
        if (ring_conf_load(&rconf, ring_path, &err) != 0 || rk_load(&rid, key_path, &err) != 0) goto out;
        sch_ring_config rcfg = {.conf = &rconf, .id = &rid, .m = &m, .hp = &hp, .opts = ring_opts_default(),
                                .n_slots = parallel};
        rcfg.opts.n_ctx = (uint32_t)ctx;
        rcfg.opts.wire = strcmp(wire, "f16") == 0 ? 1 : strcmp(wire, "bf16") == 0 ? 2 : 0;
        rcfg.opts.keep_order = keep_order;
        rcfg.opts.manifest = manifest ? &mf : NULL;
        rcfg.opts.manifest_path = manifest;
        rcfg.opts.audit_rate = trust.audit_rate;
        rcfg.opts.audit_seed = trust.audit_seed;
        rcfg.opts.audit_tol = trust.audit_tol;
        if (trust.node_timeout > 0) rcfg.opts.dead_s = trust.node_timeout;
        if (strcmp(draft, "none") != 0) { /* each step verifies a block of up to draft_n drafts per sequence */
            rcfg.opts.spec_block = (uint32_t)draft_n + 1;
            rcfg.opts.spec_depth = 1;
        }
        if (draft_dspark) {
            const uint32_t *layers;
            rcfg.opts.n_taps = spec_drafter_taps(&dspark[0], &layers);
            memcpy(rcfg.opts.taps, layers, (size_t)rcfg.opts.n_taps * sizeof *layers);
        }
        if (trust.receipts) {
            rfile = fopen(trust.receipts, "a");
            if (!rfile) {
                rl_errf(&err, "cannot open %s for appending: %s", trust.receipts, strerror(errno));
                goto out;
            }
            setvbuf(rfile, NULL, _IOLBF, 0); /* whole lines, so a reader never sees half a receipt */
            rcfg.opts.receipts = true;
            rcfg.opts.receipts_out = rfile;
        }
        if (sch_backend_ring(&be, &rcfg, &err) != 0) goto out;
    } else {
        eo.n_threads = threads;
        eo.progress = isatty(2);
        if (k3_engine_init(&e, &m, &hp, 0, hp.n_layer, &eo, &err) != 0) goto out;
        have_engine = true;
        k3_weights_prefault(&e.w, isatty(2) && m.tensor_bytes > (64u << 20));
        if (sch_backend_local(&be, &e, parallel, (uint32_t)ctx, &err) != 0) goto out;
    }
    /* A draft model runs here whatever runs the target: one state per sequence (docs/serve.md). */
    const bool draft_model = strcmp(draft, "ngram") != 0 && strcmp(draft, "none") != 0 && !draft_dspark;
    if (draft_model) {
        if (spec_pool_open(&dpool, draft, hp.n_vocab, parallel, (uint32_t)ctx, draft_threads ? draft_threads : threads,
                           &err) != 0) {
            be.free(be.impl);
            goto out;
        }
        have_dpool = true;
    }
    sch_config sc = {.queue_cap = queue, .chunk = (uint32_t)chunk, .draft = draft_model ? &dpool : NULL,
                     .dspark = dspark};
    if (sch_init(&s, &be, &tok, &sc, &err) != 0) {
        be.free(be.impl);
        goto out;
    }
    have_sched = true;
    if (sch_start(&s, &err) != 0) goto out;
    http_config hc = {.host = host, .port = port, .api_key = api_key, .body_limit = (size_t)max_body,
                      .model_id = serve_model_id(model ? model : manifest), .aliases = alias, .n_aliases = n_alias, .have_chat = have_chat, .chat_fmt = fmt,
                      .chat_err = chat_err.msg, .max_connections = 64 + 2 * (parallel + queue), .quiet = quiet,
                      .max_per_ip = per_ip, .header_timeout_s = header_timeout, .idle_timeout_s = idle_timeout,
                      .draft_n = strcmp(draft, "none") != 0 ? draft_n : 0, .draft_k = draft_n,
                      .draft_model = draft_model, .have_draft_model = draft_model, .draft_dspark = draft_dspark,
                      .have_dspark = draft_dspark};
    if (http_start(&h, &hc, &s, &tok, &err) != 0) goto out;
    char where[64];
    if (ring_path) snprintf(where, sizeof where, "a ring of %d nodes", rconf.n);
    else snprintf(where, sizeof where, "%d threads", threads);
    fprintf(stderr,
            "ringlm serve: listening on http://%s%s%s:%d  (model %s, %d sequences x %d tokens, queue %d, %s%s%s%s%s)\n",
            strchr(host, ':') ? "[" : "", host, strchr(host, ':') ? "]" : "", h.port, hc.model_id, parallel, ctx, queue,
            where, api_key ? ", API key required" : "", strcmp(draft, "none") ? ", drafts: " : "",
            strcmp(draft, "none") ? (draft_dspark ? "dspark:" : "") : "",
            strcmp(draft, "none") ? (draft_model || draft_dspark ? serve_model_id(draft) : draft) : "");

    int sig;
    do sig = sigwaitinfo(&stop_sigs, NULL);
    while (sig < 0 && errno == EINTR);
    fprintf(stderr, "ringlm serve: %s: not accepting connections; letting running requests finish (up to %d s)\n",
            strsignal(sig), drain);
    http_quiesce(&h);
    sch_close(&s);
    double deadline = sch_now() + drain;
    const struct timespec zero = {0, 0};
    /* Idle means every response has been sent to the end, not merely generated. */
    while (!http_wait_idle(&h, 0.1)) {
        if (sch_now() >= deadline || sigtimedwait(&stop_sigs, NULL, &zero) > 0) {
            fprintf(stderr, "ringlm serve: cancelling the requests still running\n");
            break;
        }
    }
    sch_abort(&s); /* cancels them, and a ring stops waiting on any node */
    http_wait_idle(&h, 5); /* cancelled streams still send their closing error event */
    http_stop(&h); /* waits for every connection's thread: their requests have all ended now */
    fprintf(stderr, "ringlm serve: stopped\n");
    rc = 0;
out:
    if (have_sched) sch_free(&s); /* frees the backend too */
    if (have_dpool) spec_pool_close(&dpool);
    for (int i = 0; i < n_dspark; i++) spec_drafter_close(&dspark[i]);
    free(dspark);
    if (have_engine) k3_engine_free(&e);
    if (rfile && fclose(rfile) != 0 && rc == 0) rc = -1, rl_errf(&err, "cannot write %s", trust.receipts);
    if (have_tok) tok_free(&tok);
    ring_target_close(&m, &mf);
out_noclose:
    if (rc != 0) fprintf(stderr, "ringlm serve: %s\n", err.msg);
    return rc;
}
