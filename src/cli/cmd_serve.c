/* ringlm serve: the OpenAI-compatible HTTP server, on this machine or on a ring of nodes (src/serve/,
 * docs/serve.md); the server's lifecycle is serve_run's (src/serve/serve_run.h). */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "../base/heap.h"
#include "../serve/scheduler.h"
#include "../serve/serve_run.h"
#include "cli.h"

static void serve_usage(FILE *f) {
    fprintf(f,
            "usage: ringlm serve -m MODEL.gguf [--host 127.0.0.1] [--port 8080] [--api-key KEY]\n"
            "                    [--parallel N] [--ctx N] [--queue N] [--threads N] [--chunk N]\n"
            "                    [--cache-ram MIB] [--ctx-checkpoints N] [--checkpoint-every N]\n"
            "                    [--no-repack] [--flash-attn on|off|auto] [--cache-type f32|f16] [--mem GB [--expert-copy DIR]]\n"
            "                    [--device NAME[,NAME...]] [--vram GB] [--gpu-layers N] [--n-cpu-moe N | --cpu-moe]\n"
            "                    [--max-body BYTES] [--drain SECONDS] [--header-timeout S] [--idle-timeout S]\n"
            "                    [--max-conn-per-ip N] [--alias NAME]... [--quiet]\n"
            "                    [--draft ngram|none|DRAFT.gguf|dspark:DRAFT.gguf [--draft-n K] [--draft-threads N] [--draft-fallback on|off]]\n"
            "                    [--ring ring.conf --key coord.key [--manifest M instead of -m] [--wire f32|f16|bf16] [--keep-order] [--receipts FILE]\n"
            "                     [--audit-rate R [--audit-seed S] [--audit-tol T] [--audit-tol-arch T]] [--node-timeout S] [--link-timeout S]\n"
            "                     [--relay-listen HOST:PORT]]\n\n"
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
            "  --cache-ram MIB  host RAM for the prompt cache (default 8192; 0: prefixes stay in the slots only):\n"
            "                 a request that starts with tokens an earlier one read (a conversation's next turn,\n"
            "                 an agent's next call) reads only what follows; \"cache_prompt\": false turns it off\n"
            "                 per request (docs/serve.md, \"Prompt cache\"; with --ring prefixes stay in the\n"
            "                 slots, on the nodes)\n"
            "  --ctx-checkpoints N  checkpoints of the recurrent state kept per slot (default 8; 0: no prompt\n"
            "                 cache at all), taken at the end of each prompt and every --checkpoint-every\n"
            "                 prompt tokens (default 4096; 0: only at the end); with --ring every stage keeps\n"
            "                 them for its layers\n"
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
            "  --draft-fallback on|off  on (default): a request whose drafts are not paying (fewer than 1 in 10\n"
            "                 kept over 16) decodes plainly for 32 steps, then probes again, the pause doubling\n"
            "                 while they keep failing (to 1024); /metrics ringlm_spec_fallbacks_total. off: every\n"
            "                 step drafts, as ringlm run does\n"
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
            "  --link-timeout S  a link gone silent (a cable pulled, a router dropping: no reset ever comes)\n"
            "                 is declared down within S seconds or 3 of its measured round trips, whichever is\n"
            "                 longer (default 0.5), and the running steps go on over the nodes left\n"
            "  --relay-listen HOST:PORT  run a relay for ring.conf's nodes behind NATs: they dial out to it\n"
            "                 (ringlm node --dial HOST:PORT) and ring.conf writes them relay:HOST:PORT (docs/ring.md)\n"
            "  --audit-rate R audit each finished request with probability R (receipts on): this machine\n"
            "                 recomputes one stage for it (drawn from --audit-seed) and compares within\n"
            "                 --audit-tol (default 0.01; a CPU stage on another CPU architecture than this\n"
            "                 one within --audit-tol-arch, default 0.05); a node that fails is left out of the ring, and\n"
            "                 /health and /metrics say so (docs/receipts.md)\n");
}

int cmd_serve(int argc, char **argv) {
    const char *alias[15]; /* --alias (o.aliases) */
    unsigned long long max_body = 1u << 20;
    /* eo all zero: llama.cpp's defaults; n_threads from --threads when the engine starts */
    serve_opts o = {.host = "127.0.0.1", .port = 8080, .aliases = alias, .parallel = 4, .ctx = 4096, .queue = 16,
                    .chunk = 256, .drain = 30, .header_timeout = 10, .idle_timeout = 120, .per_ip = 32,
                    .threads = (int)sysconf(_SC_NPROCESSORS_ONLN), .progress = isatty(2), .draft = "none",
                    .draft_n = 7, .wire = K3_WIRE_F32, .cache_ram = (size_t)8192 << 20, .ctx_checkpoints = 8,
                    .ckpt_every = 4096};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            serve_usage(stdout);
            return 0;
        }
        if (strcmp(a, "--quiet") == 0) {
            o.quiet = true;
            continue;
        }
        if (cli_engine_flag(a, &o.eo)) continue;
        if (strcmp(a, "--keep-order") == 0) {
            o.keep_order = true;
            continue;
        }
        /* A missing value still goes through the chain (as ""), so that an unknown option is named as one. */
        const char *given = i + 1 < argc ? argv[++i] : NULL, *v = given ? given : "";
        int bad = 0;
        const char *want = NULL; /* what a bad value should have been */
        bool known = true;
        if (strcmp(a, "-m") == 0) {
            o.model = v;
        } else if (strcmp(a, "--manifest") == 0) {
            o.manifest = v;
        } else if (strcmp(a, "--ring") == 0) {
            o.ring_path = v;
        } else if (strcmp(a, "--key") == 0) {
            o.key_path = v;
        } else if (strcmp(a, "--wire") == 0) {
            o.wire = strcmp(v, "f16") == 0 ? K3_WIRE_F16 : strcmp(v, "bf16") == 0 ? K3_WIRE_BF16 : K3_WIRE_F32;
            bad = strcmp(v, "f32") && strcmp(v, "f16") && strcmp(v, "bf16"), want = "f32, f16 or bf16";
        } else if (cli_parse_trust(a, v, &o.trust, &bad)) {
        } else if (strcmp(a, "--host") == 0) {
            o.host = v;
        } else if (strcmp(a, "--api-key") == 0) {
            o.api_key = v;
            bad = !*v, want = "a non-empty key";
        } else if (strcmp(a, "--port") == 0) {
            bad = cli_parse_int(v, &o.port) || o.port < 0 || o.port > 65535, want = "a port number, 0 to 65535";
        } else if (strcmp(a, "--parallel") == 0) {
            bad = cli_parse_int(v, &o.parallel) || o.parallel < 1 || o.parallel > 256, want = "a number of sequences, 1 to 256";
        } else if (strcmp(a, "--ctx") == 0) {
            bad = cli_parse_int(v, &o.ctx) || o.ctx < 8, want = "a number of tokens, at least 8";
        } else if (strcmp(a, "--queue") == 0) {
            bad = cli_parse_int(v, &o.queue) || o.queue < 0 || o.queue > 100000, want = "a number, 0 to 100000";
        } else if (strcmp(a, "--threads") == 0) {
            bad = cli_parse_int(v, &o.threads) || o.threads < 1, want = "a number, at least 1";
        } else if (strcmp(a, "--chunk") == 0) {
            bad = cli_parse_int(v, &o.chunk) || o.chunk < 1, want = "a number of tokens, at least 1";
        } else if (strcmp(a, "--cache-ram") == 0) {
            int mib = 0;
            bad = cli_parse_int(v, &mib) || mib < 0, want = "MiB, 0 or more";
            o.cache_ram = (size_t)mib << 20;
        } else if (strcmp(a, "--ctx-checkpoints") == 0) {
            bad = cli_parse_int(v, &o.ctx_checkpoints) || o.ctx_checkpoints < 0 || o.ctx_checkpoints > 1024, want = "a number, 0 to 1024";
        } else if (strcmp(a, "--checkpoint-every") == 0) {
            bad = cli_parse_int(v, &o.ckpt_every) || o.ckpt_every < 0, want = "a number of tokens, 0 or more";
        } else if (strcmp(a, "--draft") == 0) {
            o.draft = v;
        } else if (strcmp(a, "--draft-fallback") == 0) {
            bad = !v || (strcmp(v, "on") != 0 && strcmp(v, "off") != 0), want = "on or off";
            o.no_draft_fallback = v && strcmp(v, "off") == 0;
        } else if (strcmp(a, "--draft-threads") == 0) {
            bad = cli_parse_int(v, &o.draft_threads) || o.draft_threads < 1, want = "a number, at least 1";
        } else if (strcmp(a, "--draft-n") == 0) {
            bad = cli_parse_int(v, &o.draft_n) || o.draft_n < 1 || o.draft_n > SCH_MAX_DRAFT, want = "a number of tokens, 1 to the most a step verifies";
        } else if (strcmp(a, "--drain") == 0) {
            bad = cli_parse_int(v, &o.drain) || o.drain < 0, want = "seconds, 0 or more";
        } else if (strcmp(a, "--header-timeout") == 0) {
            bad = cli_parse_int(v, &o.header_timeout) || o.header_timeout < 1 || o.header_timeout > 3600, want = "seconds, 1 to 3600";
        } else if (strcmp(a, "--idle-timeout") == 0) {
            bad = cli_parse_int(v, &o.idle_timeout) || o.idle_timeout < 1 || o.idle_timeout > 86400, want = "seconds, 1 to 86400";
        } else if (strcmp(a, "--max-conn-per-ip") == 0) {
            bad = cli_parse_int(v, &o.per_ip) || o.per_ip < 1 || o.per_ip > 100000, want = "a number, 1 to 100000";
        } else if (cli_parse_engine(a, v, &o.eo, &bad, &want)) {
        } else if (strcmp(a, "--alias") == 0) {
            bad = o.n_aliases == (int)(sizeof alias / sizeof alias[0]) || !*v, want = "a non-empty name (at most 15 aliases)";
            if (!bad) alias[o.n_aliases++] = v;
        } else if (strcmp(a, "--max-body") == 0) {
            bad = cli_parse_u64(v, &max_body) || max_body < 1024, want = "bytes, at least 1024";
        } else {
            bad = 1, known = false;
        }
        if (bad || !given) return cli_bad_option("serve", a, given, known, want);
    }
    if (!o.model == !o.manifest) {
        fprintf(stderr, "ringlm serve: -m MODEL (or, with --ring, --manifest FILE) is required\n");
        serve_usage(stderr);
        return 2;
    }
    if (o.manifest && !o.ring_path) {
        fprintf(stderr, "ringlm serve: --manifest needs --ring: the weights are on the nodes\n");
        return 2;
    }
    if (cli_trust_check(&o.trust, o.ring_path != NULL, "serve")) return 2;
    if (!o.ring_path != !o.key_path) {
        fprintf(stderr, "ringlm serve: --ring and --key go together (the ring's nodes, the coordinator's identity)\n");
        return 2;
    }

    o.max_body = (size_t)max_body;
    if (!o.eo.mem_bytes) rl_heap_keep(); /* a step's buffers stay for the next (base/heap.h) */

    /* SIGINT/SIGTERM are blocked here, before any thread exists, so every thread inherits the mask and the
     * signals stay pending until serve_run takes them with sigwaitinfo: shutdown then runs as ordinary
     * code, with no handler and no global flag. SIGPIPE too: a client that hangs up must not kill us. */
    sigset_t blocked;
    sigemptyset(&blocked);
    sigaddset(&blocked, SIGINT);
    sigaddset(&blocked, SIGTERM);
    sigaddset(&blocked, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &blocked, NULL);

    rl_err err = {{0}};
    if (serve_run(&o, &err) != 0) {
        fprintf(stderr, "ringlm serve: %s\n", err.msg);
        return 1;
    }
    return 0;
}
