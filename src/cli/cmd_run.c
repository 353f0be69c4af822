/* ringlm run: one prompt, on this machine or on a ring of nodes (the work is prompt_run's, src/coord/prompt_run.h). */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../base/heap.h"
#include "../coord/prompt_run.h"
#include "../speculate/spec_gen.h"
#include "cli.h"

static void run_usage(FILE *f) {
    fprintf(f,
            "usage: ringlm run -m MODEL.gguf (-p PROMPT | --tokens 1,2,3 | --tokens @FILE) [-n N] [--chat] [--system TEXT]\n"
            "                  [--temp T] [--top-k K] [--top-p P] [--min-p P] [--repeat-penalty R]\n"
            "                  [--presence-penalty P] [--frequency-penalty F] [--logit-bias ID+B|ID-B]... [--seed S] [--threads N]\n"
            "                  [--no-repack] [--flash-attn on|off|auto] [--cache-type f32|f16] [--mem GB [--expert-copy DIR]]\n"
            "                  [--device NAME[,NAME...]] [--vram GB] [--gpu-layers N] [--n-cpu-moe N | --cpu-moe] [--ctx N] [--chunk N] [--ignore-eos] [--ids] [--metrics-json FILE] [--progress] [--warmup]\n"
            "                  [--ring ring.conf --key coord.key [--wire f32|f16|bf16] [--keep-order] [--manifest M instead of -m]]\n"
            "                  [--draft none|ngram|DRAFT.gguf|dspark:DRAFT.gguf [--draft-n K] [--draft-fixed]\n"
            "                  [--draft-p-min P] [--draft-depth D] [--draft-fallback on|off]] [--receipts FILE]\n"
            "                  [--audit-rate R [--audit-seed S] [--audit-tol T] [--audit-tol-arch T]] [--node-timeout S] [--link-timeout S]\n"
            "                  [--relay-listen HOST:PORT]\n\n"
            "Streams the generated text to stdout, then prints one metrics line on stderr.\n"
            "  -n N          tokens to generate (default 128; -1 = until the context is full)\n"
            "  --tokens @FILE  the prompt's ids from FILE (comma-separated; a long prompt does not fit a command line)\n"
            "  --chat        wrap the prompt as a user turn in the model's chat format; a K3 reply prints its\n"
            "                reasoning, then a blank line and its answer (the section names are not text)\n"
            "  --temp 0      greedy decoding (default 0.8 with top-k 40, top-p 0.95, min-p 0.05)\n"
            "  --ids         print the generated token ids (comma-separated) instead of text\n"
            "  --warmup      first run the prompt and one step untimed, then start over: the timings are then of\n"
            "                warm compute memory, as llama-bench's (its default warm-up run); for benchmarks\n"
            "  --logit-bias ID+B  add B to token ID's logit before sampling (ID-B subtracts, ID-inf bans it),\n"
            "                as llama.cpp's --logit-bias; repeatable\n"
            "  --no-repack   keep every weight in the file mapping; by default quantized matmul weights are\n"
            "                copied into the CPU's repacked layouts where llama.cpp would repack them (faster\n"
            "                kernels, the same bits as llama.cpp at its defaults; costs their size in RAM)\n"
            "  --flash-attn on|off|auto  MLA attention by flash attention, as llama.cpp's default graph (default\n"
            "                  auto: on, as every CPU runs it)\n"
            "  --cache-type f32|f16  element type of the MLA latent cache (default f16, as llama.cpp's)\n"
            "  --mem GB      at most GB of resident weights: when the model does not fit, its dense part stays\n"
            "                resident and routed experts are read from the file into a cache filling the rest\n"
            "                (same output, bit for bit; docs/experts.md); the summary adds hit rate and reads.\n"
            "                --expert-copy DIR keeps the experts re-laid for the CPU's repacked kernels in DIR\n"
            "                (a sparse file up to their size), so each is re-laid once, not at every read\n"
            "                With a device it is the RAM below it: VRAM -> RAM -> disk (dense parts on the device)\n"
            "  --device NAME  compute on that device (`ringlm devices`; default: the first GPU, else the CPU);\n"
            "                --gpu-layers N puts the first N layers there and the rest on the CPU (default:\n"
            "                as many as fit); --n-cpu-moe N / --cpu-moe keep the routed experts of the first N /\n"
            "                all layers in RAM; --vram GB: the device memory weights may take, at most\n"
            "                (default: its free memory less a tenth and 256 MiB) (docs/devices.md)\n"
            "  --ring FILE   run across the nodes in FILE (\"HOST:PORT PUBKEY_HEX [mem=GB]\" per line) as the\n"
            "                coordinator with identity --key; prints the plan and per-stage timings\n"
            "  --manifest M  (ring, instead of -m) the coordinator holds only the model's manifest (ringlm\n"
            "                manifest); nodes map their layers from the split files they hold (--models) and\n"
            "                stream the rest from each other, every tensor checked against M\n"
            "  --keep-order  (ring) run the nodes in ring.conf's order; by default, with 2 or more nodes, they\n"
            "                time round trips to each other and run in the order with the shortest (docs/plan.md)\n"
            "  --draft D     speculative decoding: ngram (prompt lookup), a small draft model sharing the\n"
            "                vocabulary, or dspark:FILE (a DSpark draft: a block per pass from the target's hidden\n"
            "                states); up to --draft-n tokens (default 7) verified per target pass; --draft-p-min P\n"
            "                stops a DSpark block at the first token its confidence head rates below P;\n"
            "                --draft-depth D (ring) keeps up to D blocks in flight, each drafted assuming the\n"
            "                ones before it are accepted (default 2; at most 8; fewer while the chain they assume\n"
            "                is unlikely, from the measured acceptance); --draft-fallback on (default):\n"
            "                drafts that are not paying (fewer than 1 in 10 kept over 16, or, adaptive, slower than\n"
            "                plain steps by the measured costs of a step and a verified draft) pause for 32 plain\n"
            "                steps, then are tried again (the pause doubling while they still do not pay); off:\n"
            "                always draft\n"
            "  --receipts F  (ring) every stage signs a receipt per traversal; each traversal is checked as it\n"
            "                returns and its receipts are written to F as JSON lines (ringlm receipts verify)\n"
            "  --audit-rate R  (ring) audit each finished sequence with probability R (0..1; receipts on): this\n"
            "                machine recomputes one stage, drawn from --audit-seed, and compares its output with\n"
            "                what the node sent, within --audit-tol (relative, default 0.01); a mismatch names the\n"
            "                node faulty and fails the run; a CPU stage on another CPU architecture than this one\n"
            "                is compared within --audit-tol-arch (default 0.05: other kernels round otherwise)\n"
            "  --node-timeout S  (ring) a node that answers nothing for S seconds while a step waits on it is\n"
            "                declared dead (default 60; measured from the first unanswered ping)\n"
            "  --link-timeout S  (ring) a link gone silent (a cable pulled, a router dropping: no reset ever\n"
            "                comes) is declared down within S seconds or 3 of its measured round trips, whichever\n"
            "                is longer (default 0.5; ZeroMQ heartbeats), and the step runs again without it\n"
            "  --relay-listen HOST:PORT  (ring) run a relay for ring.conf's nodes behind NATs: they dial out to it\n"
            "                (ringlm node --dial HOST:PORT) and ring.conf writes them relay:HOST:PORT (docs/ring.md)\n");
}

static int parse_float(const char *s, float *out) {
    char *end;
    float v = strtof(s, &end);
    if (end == s || *end) return -1;
    *out = v;
    return 0;
}

/* What `ringlm run` was asked to do: prompt_run's options, and what they point into. */
typedef struct run_args {
    prompt_opts o;
    unsigned long long seed;
    smp_bias bias[64]; /* --logit-bias (o.gp.smp.bias points here) */
} run_args;

/* "ID+B" / "ID-B" (B a number or inf), llama.cpp's --logit-bias form. */
static int run_parse_bias(const char *v, smp_bias *out) {
    char *end;
    errno = 0;
    long id = strtol(v, &end, 10);
    if (end == v || errno || id < 0 || id > INT32_MAX || (*end != '+' && *end != '-')) return 1;
    char sign = *end++;
    if (!*end || isspace((unsigned char)*end) || *end == '+' || *end == '-') return 1;
    char *e2;
    float b = strtof(end, &e2);
    if (*e2 || isnan(b) || (isinf(b) && sign == '+')) return 1;
    *out = (smp_bias){(int32_t)id, sign == '-' ? -b : b};
    return 0;
}

/* 0: go on; 1: --help was printed (exit 0); 2: bad usage (said on stderr). */
static int run_parse(int argc, char **argv, run_args *args) {
    *args = (run_args){.o = {.wire = K3_WIRE_F32, .draft_n = 7, .draft_depth = 2,
                             .threads = (int)sysconf(_SC_NPROCESSORS_ONLN), .ctx = 4096, .chunk = 512,
                             .progress = isatty(2), .gp = {.n_predict = 128}},
                       .seed = 0xC0FFEE};
    prompt_opts *a = &args->o;
    a->gp.smp = smp_params_default(args->seed);
    for (int i = 1; i < argc; i++) {
        const char *opt = argv[i];
        if (strcmp(opt, "--help") == 0 || strcmp(opt, "-h") == 0) {
            run_usage(stdout);
            return 1;
        }
        /* Switches first; everything else takes the next argument as its value. */
        if (strcmp(opt, "--chat") == 0) {
            a->chat = true;
            continue;
        }
        if (strcmp(opt, "--ids") == 0) {
            a->ids = true;
            continue;
        }
        if (strcmp(opt, "--warmup") == 0) {
            a->gp.warmup = true;
            continue;
        }
        if (strcmp(opt, "--ignore-eos") == 0) {
            a->gp.ignore_eog = true;
            continue;
        }
        if (strcmp(opt, "--keep-order") == 0) {
            a->keep_order = true;
            continue;
        }
        if (strcmp(opt, "--progress") == 0) {
            a->progress = true;
            continue;
        }
        if (strcmp(opt, "--draft-fixed") == 0) {
            a->draft_fixed = true;
            continue;
        }
        if (cli_engine_flag(opt, &a->eo)) continue;
        /* A missing value still goes through the chain (as ""), so that an unknown option is named as one. */
        const char *given = i + 1 < argc ? argv[++i] : NULL, *v = given ? given : "";
        int bad = 0;
        const char *want = NULL; /* what a bad value should have been */
        bool known = true;
        if (strcmp(opt, "-m") == 0) {
            a->model = v;
        } else if (strcmp(opt, "--manifest") == 0) {
            a->manifest = v;
        } else if (strcmp(opt, "-p") == 0) {
            a->prompt = v;
        } else if (strcmp(opt, "--system") == 0) {
            a->system = v;
        } else if (strcmp(opt, "--ring") == 0) {
            a->ring_path = v;
        } else if (strcmp(opt, "--draft") == 0) {
            a->draft = v;
        } else if (cli_parse_trust(opt, v, &a->trust, &bad)) {
        } else if (strcmp(opt, "--draft-p-min") == 0) {
            bad = parse_float(v, &a->draft_p_min) || a->draft_p_min < 0 || a->draft_p_min > 1, want = "a probability, 0 to 1";
        } else if (strcmp(opt, "--draft-fallback") == 0) {
            bad = strcmp(v, "on") != 0 && strcmp(v, "off") != 0, want = "on or off";
            a->draft_no_fallback = strcmp(v, "off") == 0;
        } else if (strcmp(opt, "--draft-depth") == 0) {
            bad = cli_parse_int(v, &a->draft_depth) || a->draft_depth < 1 || a->draft_depth > SPEC_MAX_DEPTH, want = "blocks in flight, 1 to the most supported";
        } else if (strcmp(opt, "--draft-n") == 0) {
            bad = cli_parse_int(v, &a->draft_n) || a->draft_n < 1 || a->draft_n > SPEC_MAX_DRAFT, want = "a number of tokens, 1 to the most a pass verifies";
        } else if (strcmp(opt, "--key") == 0) {
            a->key_path = v;
        } else if (strcmp(opt, "--wire") == 0) {
            a->wire = strcmp(v, "f16") == 0 ? K3_WIRE_F16 : strcmp(v, "bf16") == 0 ? K3_WIRE_BF16 : K3_WIRE_F32;
            bad = strcmp(v, "f32") && strcmp(v, "f16") && strcmp(v, "bf16"), want = "f32, f16 or bf16";
        } else if (strcmp(opt, "--tokens") == 0) {
            a->tokens = v;
        } else if (strcmp(opt, "--metrics-json") == 0) {
            a->metrics = v;
        } else if (strcmp(opt, "-n") == 0) {
            bad = cli_parse_int(v, &a->gp.n_predict), want = "a number of tokens (-1: until the context is full)";
        } else if (cli_parse_engine(opt, v, &a->eo, &bad, &want)) {
        } else if (strcmp(opt, "--threads") == 0) {
            bad = cli_parse_int(v, &a->threads) || a->threads < 1, want = "a number, at least 1";
        } else if (strcmp(opt, "--ctx") == 0) {
            bad = cli_parse_int(v, &a->ctx) || a->ctx < 8, want = "a number of tokens, at least 8";
        } else if (strcmp(opt, "--chunk") == 0) {
            bad = cli_parse_int(v, &a->chunk) || a->chunk < 1, want = "a number of tokens, at least 1";
        } else if (strcmp(opt, "--seed") == 0) {
            bad = cli_parse_u64(v, &args->seed), want = "a non-negative integer";
            a->gp.smp.seed = args->seed;
        } else if (strcmp(opt, "--temp") == 0) {
            bad = parse_float(v, &a->gp.smp.temperature), want = "a number";
        } else if (strcmp(opt, "--top-k") == 0) {
            bad = cli_parse_int(v, &a->gp.smp.top_k), want = "an integer";
        } else if (strcmp(opt, "--top-p") == 0) {
            bad = parse_float(v, &a->gp.smp.top_p), want = "a number";
        } else if (strcmp(opt, "--min-p") == 0) {
            bad = parse_float(v, &a->gp.smp.min_p), want = "a number";
        } else if (strcmp(opt, "--repeat-penalty") == 0) {
            bad = parse_float(v, &a->gp.smp.repeat_penalty), want = "a number";
        } else if (strcmp(opt, "--presence-penalty") == 0) {
            bad = parse_float(v, &a->gp.smp.presence_penalty), want = "a number";
        } else if (strcmp(opt, "--frequency-penalty") == 0) {
            bad = parse_float(v, &a->gp.smp.frequency_penalty), want = "a number";
        } else if (strcmp(opt, "--logit-bias") == 0) {
            want = "TOKEN_ID+BIAS or TOKEN_ID-BIAS (e.g. 15043+1, 15043-inf), at most 64 of them";
            bad = a->gp.smp.n_bias == 64 || run_parse_bias(v, &args->bias[a->gp.smp.n_bias]);
            if (!bad) a->gp.smp.bias = args->bias, a->gp.smp.n_bias++;
        } else {
            bad = 1, known = false;
        }
        if (bad || !given) return cli_bad_option("run", opt, given, known, want);
    }
    if (!a->model == !a->manifest || (!a->prompt == !a->tokens)) {
        fprintf(stderr, "ringlm run: -m MODEL (or, with --ring, --manifest FILE) and exactly one of -p PROMPT or "
                        "--tokens are required\n");
        run_usage(stderr);
        return 2;
    }
    if (a->manifest && !a->ring_path) {
        fprintf(stderr, "ringlm run: --manifest needs --ring: the weights are on the nodes\n");
        return 2;
    }
    if (cli_trust_check(&a->trust, a->ring_path != NULL, "run")) return 2;
    if (a->ring_path && !a->key_path) {
        fprintf(stderr, "ringlm run: --ring needs --key (the coordinator's identity, from ringlm keygen)\n");
        return 2;
    }
    if (a->gp.warmup && (a->ring_path || (a->draft && strcmp(a->draft, "none") != 0))) {
        fprintf(stderr, "ringlm run: --warmup times plain decoding on one machine; it does not go with --ring or --draft\n");
        return 2;
    }
    a->gp.n_ctx = (uint32_t)a->ctx;
    a->gp.chunk = (uint32_t)a->chunk;
    return 0;
}

int cmd_run(int argc, char **argv) {
    run_args args;
    int pr = run_parse(argc, argv, &args);
    if (pr) return pr == 1 ? 0 : 2;

    /* Ctrl-C: block SIGINT and let the loop poll for it between steps, so it stops cleanly. */
    sigset_t sigint;
    sigemptyset(&sigint);
    sigaddset(&sigint, SIGINT);
    sigprocmask(SIG_BLOCK, &sigint, NULL);
    if (!args.o.eo.mem_bytes) rl_heap_keep(); /* a step's buffers stay for the next (base/heap.h) */

    rl_err err = {{0}};
    if (prompt_run(&args.o, &err) != 0) {
        fprintf(stderr, "ringlm run: %s\n", err.msg);
        return 1;
    }
    return 0;
}
