#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cJSON.h>

#include "../base/heap.h"
#include "../gen/generate.h"
#include "../model/expert_cache.h"
#include "../model/k3_memory.h"
#include "../ring/coord.h"
#include "../ring/predict.h"
#include "../speculate/spec_gen.h"
#include "../ring/verify_ring.h"
#include "../text/chat.h"
#include "../text/chat_out.h"
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
            "                  [--draft-p-min P] [--draft-depth D]] [--receipts FILE]\n"
            "                  [--audit-rate R [--audit-seed S] [--audit-tol T]] [--node-timeout S]\n\n"
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
            "                ones before it are accepted (default 2; at most 3)\n"
            "  --receipts F  (ring) every stage signs a receipt per traversal; each traversal is checked as it\n"
            "                returns and its receipts are written to F as JSON lines (ringlm receipts verify)\n"
            "  --audit-rate R  (ring) audit each finished sequence with probability R (0..1; receipts on): this\n"
            "                machine recomputes one stage, drawn from --audit-seed, and compares its output with\n"
            "                what the node sent, within --audit-tol (relative, default 0.01); a mismatch names the\n"
            "                node faulty and fails the run\n"
            "  --node-timeout S  (ring) a node that answers nothing for S seconds while a step waits on it is\n"
            "                declared dead (default 60; measured from the first unanswered ping)\n");
}

typedef struct run_out {
    bool ids;
    int n;
    /* --chat on a K3 model: the reply's channels (chat_out.h), so that the framing's section names
     * ("think", "response") are not printed as text; what is printed is serve's reasoning_content, then
     * "\n\n" where the answer begins, then its content */
    bool split_on;
    chat_split split;
    const tok_tokenizer *tok;
    chat_chan shown; /* the channel of the text printed last */
    const xc_stats *xc;  /* the engine's expert cache, if it has one */
    xc_stats xc_prefill; /* its counters when the first token came out: what prefill read */
    bool got_first;
} run_out;

static int run_on_token(void *user, int32_t id, const char *text, size_t len) {
    run_out *o = user;
    if (!o->got_first && o->xc) o->xc_prefill = *o->xc;
    o->got_first = true;
    if (o->ids) {
        if (id >= 0) printf("%s%d", o->n++ ? "," : "", id);
    } else {
        /* id -1: text held back for a whole UTF-8 sequence, flushed at the end: the channel printed last */
        chat_chan ch = !o->split_on ? CHAT_CH_CONTENT : id >= 0 ? chat_split_push(&o->split, o->tok, id) : o->shown;
        if (ch != CHAT_CH_NONE && len) {
            if (ch == CHAT_CH_CONTENT && o->shown == CHAT_CH_REASONING) fputs("\n\n", stdout);
            fwrite(text, 1, len, stdout);
            o->shown = ch;
        }
    }
    fflush(stdout);
    return 0;
}

static cJSON *run_xc_json(const xc_stats *s) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "tokens", (double)s->tokens);
    cJSON_AddNumberToObject(j, "hit_rate", s->needed ? (double)s->hits / (double)s->needed : 0);
    cJSON_AddNumberToObject(j, "bytes_read", (double)s->bytes_read);
    cJSON_AddNumberToObject(j, "bytes_read_per_token", s->tokens ? (double)s->bytes_read / (double)s->tokens : 0);
    cJSON_AddNumberToObject(j, "bytes_used_per_token", s->tokens ? (double)s->bytes_used / (double)s->tokens : 0);
    cJSON_AddNumberToObject(j, "prefetched", (double)s->prefetched);
    cJSON_AddNumberToObject(j, "prefetch_accuracy", s->prefetched ? (double)s->prefetch_used / (double)s->prefetched : 0);
    cJSON_AddNumberToObject(j, "loads", (double)s->loads);
    cJSON_AddNumberToObject(j, "passes", (double)s->passes);
    cJSON_AddNumberToObject(j, "wait_s", s->wait_s);
    cJSON_AddNumberToObject(j, "from_copy", (double)s->from_copy);
    cJSON_AddNumberToObject(j, "copied", (double)s->copied);
    return j;
}

/* The summary line of an expert cache: hit rate, bytes read per token against what the tokens used, how
 * often the look-ahead was right, and how long the compute waited for the disk. */
static void run_xc_print(const char *phase, const xc_stats *s) {
    fprintf(stderr, "[ringlm] experts (%s): hit rate %.1f%%, read %.2f MiB/token (the chosen experts: %.2f MiB/token), "
                    "look-ahead %.0f%% of %llu used, waited %.3f s\n", phase,
            s->needed ? 100.0 * (double)s->hits / (double)s->needed : 0.0,
            s->tokens ? (double)s->bytes_read / (double)s->tokens / 1048576.0 : 0.0,
            s->tokens ? (double)s->bytes_used / (double)s->tokens / 1048576.0 : 0.0,
            s->prefetched ? 100.0 * (double)s->prefetch_used / (double)s->prefetched : 0.0,
            (unsigned long long)s->prefetched, s->wait_s);
}

static int run_write_metrics(const char *path, const gen_metrics *m, cJSON *ring, const spec_metrics *sm,
                             const run_out *ro, rl_err *err) {
    cJSON *j = cJSON_CreateObject();
    if (ro->xc) {
        cJSON *x = run_xc_json(ro->xc);
        xc_stats d = xc_stats_sub(ro->xc, &ro->xc_prefill);
        cJSON_AddItemToObject(x, "prefill", run_xc_json(&ro->xc_prefill));
        cJSON_AddItemToObject(x, "decode", run_xc_json(&d));
        cJSON_AddItemToObject(j, "expert_cache", x);
    }
    if (sm) {
        cJSON_AddNumberToObject(j, "acceptance_rate", sm->acceptance_rate);
        cJSON_AddNumberToObject(j, "tokens_per_traversal", sm->tokens_per_traversal);
        cJSON_AddNumberToObject(j, "draft_s", sm->draft_s);
        cJSON_AddNumberToObject(j, "verify_s", sm->verify_s);
        cJSON_AddNumberToObject(j, "traversals", (double)sm->traversals);
        cJSON_AddNumberToObject(j, "drafted", (double)sm->drafted);
        cJSON_AddNumberToObject(j, "accepted", (double)sm->accepted);
        cJSON_AddNumberToObject(j, "cancelled", (double)sm->cancelled);
        char dg[17];
        snprintf(dg, sizeof dg, "%016llx", (unsigned long long)sm->draft_digest);
        cJSON_AddStringToObject(j, "draft_digest", dg);
    }
    if (ring) cJSON_AddItemToObject(j, "ring", ring);
    cJSON_AddNumberToObject(j, "prompt_tokens", m->prompt_tokens);
    cJSON_AddNumberToObject(j, "generated_tokens", m->generated_tokens);
    cJSON_AddNumberToObject(j, "prefill_tok_s", m->prefill_tok_s);
    cJSON_AddNumberToObject(j, "ttft_s", m->ttft_s);
    cJSON_AddNumberToObject(j, "decode_tok_s", m->decode_tok_s);
    cJSON_AddNumberToObject(j, "peak_rss_bytes", (double)m->peak_rss_bytes);
    if (m->compute_bytes) cJSON_AddNumberToObject(j, "compute_bytes", (double)m->compute_bytes);
    cJSON_AddStringToObject(j, "stop_reason", m->stop_reason ? m->stop_reason : "");
    char *s = cJSON_Print(j);
    cJSON_Delete(j);
    FILE *f = s ? fopen(path, "w") : NULL;
    int rc = 0;
    if (!f || fputs(s, f) < 0 || fputc('\n', f) == EOF) rc = rl_errf(err, "cannot write %s", path);
    if (f && fclose(f) != 0) rc = rl_errf(err, "cannot write %s", path);
    free(s);
    return rc;
}

static int parse_float(const char *s, float *out) {
    char *end;
    float v = strtof(s, &end);
    if (end == s || *end) return -1;
    *out = v;
    return 0;
}

/* Parses "1,2,3"; returns the count or -1. */
static long parse_ids(const char *s, int32_t **out) {
    size_t cap = 16, n = 0;
    int32_t *v = malloc(cap * sizeof *v);
    while (v && *s) {
        char *end;
        long x = strtol(s, &end, 10);
        if (end == s || x < 0 || x > 0x7fffffff) break;
        if (n == cap) {
            int32_t *nv = realloc(v, (cap *= 2) * sizeof *v);
            if (!nv) break;
            v = nv;
        }
        v[n++] = (int32_t)x;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') break;
    }
    if (!v || *s || n == 0) {
        free(v);
        return -1;
    }
    *out = v;
    return (long)n;
}

/* What `ringlm run` was asked to do. */
typedef struct run_args {
    const char *model, *prompt, *ids_arg, *metrics, *system;
    const char *ring_path, *key_path, *wire, *draft, *manifest;
    cli_trust trust;
    int draft_n, draft_depth;
    float draft_p_min;
    bool draft_fixed;
    int threads, ctx, chunk;
    bool chat, ids, progress, keep_order;
    k3_engine_opts eo; /* all but n_threads (set from threads when the engine starts) */
    unsigned long long seed;
    gen_params gp;
    smp_bias bias[64]; /* --logit-bias (gp.smp.bias points here) */
    const mfst_file *mf; /* --manifest, opened (cmd_run) */
    bool have_mf;
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
static int run_parse(int argc, char **argv, run_args *a) {
    *a = (run_args){.wire = "f32", .draft_n = 7, .draft_depth = 2, .threads = (int)sysconf(_SC_NPROCESSORS_ONLN),
                    .ctx = 4096, .chunk = 512, .progress = isatty(2), .seed = 0xC0FFEE, .gp = {.n_predict = 128}};
    a->gp.smp = smp_params_default(a->seed);
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
        } else if (strcmp(opt, "--draft-depth") == 0) {
            bad = cli_parse_int(v, &a->draft_depth) || a->draft_depth < 1 || a->draft_depth > SPEC_MAX_DEPTH, want = "blocks in flight, 1 to the most supported";
        } else if (strcmp(opt, "--draft-n") == 0) {
            bad = cli_parse_int(v, &a->draft_n) || a->draft_n < 1 || a->draft_n > SPEC_MAX_DRAFT, want = "a number of tokens, 1 to the most a pass verifies";
        } else if (strcmp(opt, "--key") == 0) {
            a->key_path = v;
        } else if (strcmp(opt, "--wire") == 0) {
            a->wire = v;
            bad = strcmp(v, "f32") && strcmp(v, "f16") && strcmp(v, "bf16"), want = "f32, f16 or bf16";
        } else if (strcmp(opt, "--tokens") == 0) {
            a->ids_arg = v;
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
            bad = cli_parse_u64(v, &a->seed), want = "a non-negative integer";
            a->gp.smp.seed = a->seed;
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
            bad = a->gp.smp.n_bias == 64 || run_parse_bias(v, &a->bias[a->gp.smp.n_bias]);
            if (!bad) a->gp.smp.bias = a->bias, a->gp.smp.n_bias++;
        } else {
            bad = 1, known = false;
        }
        if (bad || !given) return cli_bad_option("run", opt, given, known, want);
    }
    if (!a->model == !a->manifest || (!a->prompt == !a->ids_arg)) {
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

/* The prompt as token ids: --tokens as given (checked against the vocabulary), or -p encoded, wrapped in the
 * model's chat format with --chat (*text: the rendered chat, the caller frees it). */
static int run_prompt(const run_args *a, const mf_model *m, const k3_hparams *hp, const tok_tokenizer *tok,
                      int32_t **toks, size_t *n_toks, char **text, run_out *ro, rl_err *err) {
    if (a->ids_arg) {
        /* @FILE: one argument holds at most 128 KiB on Linux (MAX_ARG_STRLEN), about 25,000 ids. */
        char *file = NULL;
        if (a->ids_arg[0] == '@') {
            size_t len = 0;
            if (cli_read_file(a->ids_arg + 1, &file, &len, err) != 0) return rl_err_prefix(err, "--tokens");
            while (len > 0 && (file[len - 1] == '\n' || file[len - 1] == '\r' || file[len - 1] == ' ')) file[--len] = 0;
        }
        long n = parse_ids(file ? file : a->ids_arg, toks);
        free(file);
        if (n < 0) {
            rl_errf(err, "bad --tokens %s'%.200s' (comma-separated ids)", a->ids_arg[0] == '@' ? "file " : "",
                    a->ids_arg[0] == '@' ? a->ids_arg + 1 : a->ids_arg);
            return -1;
        }
        *n_toks = (size_t)n;
        for (size_t i = 0; i < *n_toks; i++) {
            if ((uint32_t)(*toks)[i] >= hp->n_vocab) {
                rl_errf(err, "token id %d out of range (vocabulary %u)", (*toks)[i], hp->n_vocab);
                return -1;
            }
        }
    } else {
        const char *src = a->prompt;
        size_t src_len = strlen(a->prompt);
        bool special = false;
        if (a->chat) {
            chat_format fmt;
            if (chat_detect_model(m, &fmt, err) != 0) return -1;
            chat_msg msgs[2];
            int nm = 0;
            memset(msgs, 0, sizeof msgs);
            if (a->system) msgs[nm].role = CHAT_SYSTEM, msgs[nm++].content = a->system;
            msgs[nm].role = CHAT_USER, msgs[nm++].content = a->prompt;
            chat_opts co = chat_opts_default();
            if (chat_render(fmt, msgs, nm, &co, text, &src_len, err) != 0) return -1;
            chat_split_init(&ro->split, tok, true, fmt, co.thinking);
            ro->split_on = ro->split.open >= 0; /* K3's framing tokens are in the vocabulary */
            ro->tok = tok;
            src = *text;
            special = true; /* the a->chat markers are special tokens */
        }
        if (tok_encode(tok, src, src_len, special, toks, n_toks, err) != 0) return -1;
    }
    return 0;
}

/* The generation over the ring (--ring): open it, generate (speculating when drafter is not NULL), check the
 * last receipts and run the audits drawn, print its per-stage table, close it. */
static int run_ring(const run_args *a, mf_model *m, k3_hparams *hp, const tok_tokenizer *tok, spec_drafter *drafter,
                    const spec_params *spp, const int32_t *toks, size_t n_toks, run_out *ro, gen_metrics *gm,
                    spec_metrics *smx, cJSON **ring_json, rl_err *err) {
    ring_conf conf;
    rk_identity id;
    ring_coord rc;
    if (ring_conf_load(&conf, a->ring_path, err) != 0 || rk_load(&id, a->key_path, err) != 0) return -1;
    ring_opts ro_ = ring_opts_default();
    ro_.n_ctx = (uint32_t)a->ctx;
    ro_.wire = strcmp(a->wire, "f16") == 0 ? 1 : strcmp(a->wire, "bf16") == 0 ? 2 : 0;
    ro_.keep_order = a->keep_order;
    FILE *rf = NULL;
    if (a->trust.receipts) {
        rf = fopen(a->trust.receipts, "w");
        if (!rf) {
            rl_errf(err, "cannot create %s", a->trust.receipts);
            return -1;
        }
        ro_.receipts = true;
        ro_.receipts_out = rf;
    }
    const uint32_t *taps;
    ro_.n_taps = drafter ? spec_drafter_taps(drafter, &taps) : 0;
    if (ro_.n_taps > 0) memcpy(ro_.taps, taps, (size_t)ro_.n_taps * sizeof *taps);
    ro_.audit_rate = a->trust.audit_rate;
    if (a->trust.node_timeout > 0) ro_.dead_s = a->trust.node_timeout;
    ro_.audit_seed = a->trust.audit_seed;
    ro_.audit_tol = a->trust.audit_tol;
    ro_.manifest = a->have_mf ? a->mf : NULL;
    ro_.manifest_path = a->manifest;
    if (drafter) { /* blocks of up to k_max drafts and the token before them, depth of them in flight */
        ro_.spec_block = (uint32_t)spp->k_max + 1;
        ro_.spec_depth = spp->depth < 1 ? 1 : spp->depth > SPEC_MAX_DEPTH ? SPEC_MAX_DEPTH : spp->depth;
    }
    if (ring_open(&rc, &conf, &id, m, hp, &ro_, err) != 0) {
        if (rf) fclose(rf);
        return -1;
    }
    int grc;
    if (drafter) {
        spec_ring sr = {.rc = &rc, .chunk = (uint32_t)a->chunk};
        spec_verifier v = spec_verifier_ring(&sr);
        grc = spec_run(&v, drafter, tok, toks, n_toks, &a->gp, spp, run_on_token, ro, gm, smx, err);
    } else {
        grc = ring_generate(&rc, tok, toks, n_toks, &a->gp, run_on_token, ro, gm, err);
    }
    if (grc == 0 && rc.o.receipts) grc = ring_receipts_finish(&rc, 10.0, err); /* the last steps' receipts */
    if (grc == 0 && a->trust.audit_rate > 0) grc = ring_audit_pending(&rc, err);
    if (grc == 0) {
        fprintf(stderr, "\n");
        ring_print_stats(&rc, stderr);
        pr_result pr;
        if (ring_prediction(&rc, (uint32_t)gm->prompt_tokens, (uint32_t)a->chunk, &pr) == 0) {
            /* What ran next to what the planner predicted for it (docs/plan.md). */
            fprintf(stderr, "time to first token: %.3f s; the plan predicted %.3f (%+.0f%%)\n", gm->ttft_s, pr.ttft_s,
                    100 * (pr.ttft_s / gm->ttft_s - 1));
            if (!drafter && gm->generated_tokens > 1) {
                fprintf(stderr, "decode: %.2f tok/s greedy; the plan predicted %.2f (%+.0f%%)\n", gm->decode_tok_s,
                        pr.greedy_tok_s, 100 * (pr.greedy_tok_s / gm->decode_tok_s - 1));
            }
        }
        *ring_json = ring_stats_json(&rc);
        if (a->trust.receipts) {
            fprintf(stderr, "receipts: %ld checked (signatures, signers, ranges, chain, nonces), written to %s\n",
                    rc.ledger.checked, a->trust.receipts);
        }
        if (a->trust.audit_rate > 0) {
            fprintf(stderr, "audits: %ld sequence(s) audited, %ld frame(s) recomputed in %.0f ms, largest difference "
                    "%.2g (tolerance %.2g); none failed\n", rc.audits, rc.audit_frames, rc.audit_s * 1e3, rc.audit_max_diff,
                    a->trust.audit_tol > 0 ? a->trust.audit_tol : 1e-2);
            for (int s = 0; s < rc.plan.n_stages; s++) {
                if (rc.aud_where[s][0]) fprintf(stderr, "  stage %d recomputed %s\n", s + 1, rc.aud_where[s]);
            }
        }
    }
    ring_close(&rc);
    if (rf && fclose(rf) != 0 && grc == 0) grc = rl_errf(err, "cannot write %s", a->trust.receipts);
    return grc;
}

int cmd_run(int argc, char **argv) {
    run_args args, *a = &args;
    int pr = run_parse(argc, argv, a);
    if (pr) return pr == 1 ? 0 : 2;

    /* Ctrl-C: block SIGINT and let the loop poll for it between steps, so it stops cleanly. */
    sigset_t sigint;
    sigemptyset(&sigint);
    sigaddset(&sigint, SIGINT);
    sigprocmask(SIG_BLOCK, &sigint, NULL);

    rl_err err = {{0}};
    mf_model m;
    k3_hparams hp;
    k3_engine e;
    tok_tokenizer tok;
    int32_t *toks = NULL;
    size_t n_toks = 0;
    char *text = NULL;
    int rc = 1;
    bool have_tok = false, have_engine = false;
    mfst_file mf;
    if (cli_open_target(a->model, a->manifest, &m, &hp, &mf, &err) != 0) goto out_noclose;
    a->mf = &mf;
    a->have_mf = a->manifest != NULL;
    if (tok_load(&tok, &m, &err) != 0) goto out;
    have_tok = true;
    for (int i = 0; i < a->gp.smp.n_bias; i++) {
        if ((uint32_t)a->bias[i].id >= hp.n_vocab) {
            rl_errf(&err, "--logit-bias: token id %d out of range (vocabulary %u)", a->bias[i].id, hp.n_vocab);
            goto out;
        }
    }
    if (!a->eo.mem_bytes) rl_heap_keep(); /* a step's buffers stay for the next (base/heap.h) */
    run_out ro = {.ids = a->ids, .shown = CHAT_CH_NONE};
    if (run_prompt(a, &m, &hp, &tok, &toks, &n_toks, &text, &ro, &err) != 0) goto out;
    gen_metrics gm;
    cJSON *ring_json = NULL;
    spec_metrics smx;
    bool spec = a->draft && strcmp(a->draft, "none") != 0;
    spec_drafter drafter;
    memset(&drafter, 0, sizeof drafter);
    if (spec && spec_drafter_open(&drafter, a->draft, &m, &hp, (uint32_t)a->ctx, a->threads, &a->gp.smp, &err) != 0) goto out;
    drafter.min_conf = a->draft_p_min;
    spec_params spp = {.k_max = a->draft_n, .adaptive = !a->draft_fixed, .depth = a->draft_depth};
    if (a->ring_path) {
        int grc = run_ring(a, &m, &hp, &tok, spec ? &drafter : NULL, &spp, toks, n_toks, &ro, &gm, &smx, &ring_json, &err);
        if (spec) spec_drafter_close(&drafter);
        if (grc != 0) goto out;
    } else {
        k3_engine_opts eo = a->eo;
        eo.n_threads = a->threads;
        eo.progress = a->progress;
        if (k3_engine_init(&e, &m, &hp, 0, hp.n_layer, &eo, &err) != 0) {
            if (spec) spec_drafter_close(&drafter);
            goto out;
        }
        have_engine = true;
        if (e.hp.n_dev > 0) {
            char where[512];
            k3_engine_describe(&e, where, sizeof where);
            fprintf(stderr, "[ringlm] computing on %s\n", where);
        }
        ro.xc = k3_engine_cache_stats(&e);
        k3_weights_prefault(&e.w, a->progress && m.tensor_bytes > (64u << 20));
        int grc;
        if (spec) {
            spec_local sl = {.e = &e, .n_ctx = (uint32_t)a->ctx, .chunk = (uint32_t)a->chunk};
            spec_verifier v = spec_verifier_local(&sl);
            grc = spec_run(&v, &drafter, &tok, toks, n_toks, &a->gp, &spp, run_on_token, &ro, &gm, &smx, &err);
            spec_drafter_close(&drafter);
        } else {
            grc = gen_run(&e, &tok, toks, n_toks, &a->gp, run_on_token, &ro, &gm, &err);
        }
        if (grc != 0) goto out;
    }
    printf(a->ids ? "\n" : "");
    fflush(stdout);
    fprintf(stderr,
            "\n[ringlm] prompt %d tokens, prefill %.1f tok/s, ttft %.3f s, generated %d tokens, decode %.2f tok/s, "
            "peak rss %.1f MiB, stop: %s\n",
            gm.prompt_tokens, gm.prefill_tok_s, gm.ttft_s, gm.generated_tokens, gm.decode_tok_s,
            (double)gm.peak_rss_bytes / 1048576.0, gm.stop_reason);
    if (spec) {
        fprintf(stderr, "[ringlm] speculative (%s): acceptance %.1f%%, %.2f tokens per target pass (%ld passes), "
                        "draft %.3f s, verify %.3f s\n",
                a->draft, 100 * smx.acceptance_rate, smx.tokens_per_traversal, smx.traversals, smx.draft_s, smx.verify_s);
    }
    if (ro.xc) {
        xc_stats d = xc_stats_sub(ro.xc, &ro.xc_prefill);
        size_t ram_dense = 0, ram_experts = 0; /* (the experts in RAM: a device holds the others) */
        k3_range_ram_bytes(&m, &e.hp, 0, hp.n_layer, &ram_dense, &ram_experts);
        fprintf(stderr, "[ringlm] expert cache: %.1f MiB for routed experts of %.1f MiB in RAM, the rest read from the file\n",
                (double)e.xc->cache_bytes / 1048576.0, (double)ram_experts / 1048576.0);
        run_xc_print("prefill", &ro.xc_prefill);
        run_xc_print("decode", &d);
        if (e.xc->copy_layer) {
            fprintf(stderr, "[ringlm] repacked copy %s: %llu experts there when opened, %llu read from it, %llu added\n",
                    e.xc->copy.path, (unsigned long long)e.xc->copy.n_have, (unsigned long long)ro.xc->from_copy,
                    (unsigned long long)ro.xc->copied);
        }
    }
    if (a->metrics && run_write_metrics(a->metrics, &gm, ring_json, spec ? &smx : NULL, &ro, &err) != 0) goto out;
    if (!a->metrics) cJSON_Delete(ring_json);
    rc = 0;
out:
    if (have_engine) k3_engine_free(&e);
    if (have_tok) tok_free(&tok);
    cli_close_target(&m, &mf);
out_noclose:
    if (rc != 0) fprintf(stderr, "ringlm run: %s\n", err.msg);
    free(toks);
    free(text);
    return rc;
}
