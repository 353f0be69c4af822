/* oracle.c - asks the pinned llama.cpp (prebuilt libllama) for the right answer, for the tests.
 *
 *   oracle logits   -m MODEL.gguf --tokens 1,2,3 [--mode batch|step] -o OUT.bin [--threads N]
 *   oracle tokenize -m MODEL.gguf --file STRINGS.txt [-o OUT.txt] [--special]
 *   oracle info     -m MODEL.gguf
 *
 * Every mode runs CPU only and, like llama.cpp's defaults, with flash attention and an f16 KV cache
 * (--fa off, --cache-type f32 for the other path, as `ringlm --flash-attn off --cache-type f32`). Weights
 * go where llama.cpp puts them by default (the CPU's repacked layouts for the
 * types and shapes it repacks); --no-repack keeps them all in the mapping, as `ringlm --no-repack` does.
 * See README.md. Any failure prints one message on stderr and exits 1. */
#include <ctype.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>

#include "ggml-backend.h"
#include "llama.h"

#include "../../src/base/err.h"
#include "../../src/model/logits_file.h"

/* ---- llama.cpp's log: silenced, but read ---------------------------------------------------------- */

/* llama.cpp logs in pieces (GGML_LOG_LEVEL_CONT continues the last line), so lines are put back together
 * before being looked at. Two things are taken from them: the "loaded meta data with N key-value pairs and
 * M tensors" line (for `info`), and the last few error lines, which are the only place llama.cpp says
 * *why* a model failed to load. */
#define LOG_LINE_MAX 4096
#define LOG_KEEP_ERRORS 3

typedef struct log_state {
    bool verbose;
    enum ggml_log_level level; /* level of the line being assembled */
    char line[LOG_LINE_MAX];
    size_t len;
    int n_kv, n_tensors; /* -1 until the meta data line is seen */
    char errors[LOG_KEEP_ERRORS][512];
    int n_errors; /* total error lines seen; errors[] keeps the last LOG_KEEP_ERRORS */
} log_state;

static log_state g_log = {.n_kv = -1, .n_tensors = -1};

static void log_line_done(log_state *ls) {
    ls->line[ls->len] = 0;
    const char *p = strstr(ls->line, "loaded meta data with ");
    int kv, nt;
    if (p && sscanf(p, "loaded meta data with %d key-value pairs and %d tensors", &kv, &nt) == 2) {
        ls->n_kv = kv;
        ls->n_tensors = nt;
    }
    if (ls->level == GGML_LOG_LEVEL_ERROR && ls->len > 0) {
        snprintf(ls->errors[ls->n_errors % LOG_KEEP_ERRORS], sizeof ls->errors[0], "%.500s", ls->line);
        ls->n_errors++;
    }
    ls->len = 0;
}

static void log_cb(enum ggml_log_level level, const char *text, void *user) {
    log_state *ls = user;
    if (ls->verbose) fputs(text, stderr);
    if (level != GGML_LOG_LEVEL_CONT) {
        if (ls->len > 0) log_line_done(ls); /* a new message while a line was open: close it */
        ls->level = level;
    }
    for (const char *p = text; *p; p++) {
        if (*p == '\n') {
            log_line_done(ls);
        } else if (ls->len + 1 < sizeof ls->line) { /* an overlong line is cut, not split */
            ls->line[ls->len++] = *p;
        }
    }
}

/* Appends llama.cpp's last error lines to err, so "could not load" says why. */
static void add_llama_errors(rl_err *err) {
    int n = g_log.n_errors < LOG_KEEP_ERRORS ? g_log.n_errors : LOG_KEEP_ERRORS;
    for (int i = 0; i < n; i++) {
        const char *e = g_log.errors[(g_log.n_errors - n + i) % LOG_KEEP_ERRORS];
        size_t used = strlen(err->msg);
        snprintf(err->msg + used, sizeof err->msg - used, "%s%s", i ? " | " : "; llama.cpp says: ", e);
    }
}

/* ---- command line ------------------------------------------------------------------------------ */

typedef struct args {
    const char *cmd;
    const char *model;
    const char *tokens; /* as given: "1,2,3" */
    const char *mode;
    const char *out;
    const char *file;
    int threads;
    int prefill; /* logits: first N tokens in one decode, then one per decode (0 = as --mode says) */
    int n_gen;   /* generate: tokens to generate */
    bool special;
    bool verbose;
    bool no_repack; /* llama.cpp's use_extra_bufts = false */
    bool fa;        /* --fa on|off: flash attention (default on: llama.cpp's auto, on a CPU) */
    bool cache_f16; /* --cache-type f32|f16 (default f16, llama.cpp's) */
    int gpu_layers; /* --gpu-layers N: llama.cpp's n_gpu_layers (the oracle-gpu build: Vulkan or CUDA) */
} args;

static const char usage[] =
    "usage: oracle logits   -m MODEL.gguf --tokens 1,2,3 [--mode batch|step] -o OUT.bin [--threads N]\n"
    "       oracle logits   -m MODEL.gguf --tokens 1,2,3 --prefill N -o OUT.bin   (N in one decode, then steps)\n"
    "       oracle generate -m MODEL.gguf --tokens 1,2,3 -n N [--threads N]   (greedy; prints the new ids)\n"
    "       oracle bench    -m MODEL.gguf --tokens 1,2,3 -n N [--threads N]   (prefill, then N decode steps;\n"
    "                       prints JSON with prefill_tok_s and decode_tok_s)\n"
    "       oracle tokenize -m MODEL.gguf --file STRINGS.txt [-o OUT.txt] [--special]\n"
    "       oracle info     -m MODEL.gguf\n"
    "       logits, generate, bench: [--no-repack] keeps every weight in the mapping (use_extra_bufts off);\n"
    "                       [--fa on|off] flash attention (default on); [--cache-type f32|f16] (default f16)\n"
    "       logits, generate, bench: [--gpu-layers N] llama.cpp's n_gpu_layers (0: the CPU; the oracle-gpu\n"
    "                       build, linked with llama.cpp's Vulkan build, runs them on Vulkan0)\n"
    "       any command: [--verbose] shows llama.cpp's log on stderr\n";

static int parse_int(const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

/* Which options each command takes, so a misplaced one is an error rather than silently ignored. */
enum { C_LOGITS = 1, C_TOKENIZE = 2, C_INFO = 4, C_GENERATE = 8, C_BENCH = 16, C_ALL = 31 };

static int parse_args(int argc, char **argv, args *a, rl_err *err) {
    memset(a, 0, sizeof *a);
    a->threads = 2;
    a->mode = "batch";
    a->fa = a->cache_f16 = true; /* llama.cpp's defaults */
    if (argc < 2) return rl_errf(err, "no command given");
    a->cmd = argv[1];
    int cmd;
    if (strcmp(a->cmd, "logits") == 0) cmd = C_LOGITS;
    else if (strcmp(a->cmd, "tokenize") == 0) cmd = C_TOKENIZE;
    else if (strcmp(a->cmd, "info") == 0) cmd = C_INFO;
    else if (strcmp(a->cmd, "generate") == 0) cmd = C_GENERATE;
    else if (strcmp(a->cmd, "bench") == 0) cmd = C_BENCH;
    else return rl_errf(err, "unknown command \"%s\"", a->cmd);

    static const struct {
        const char *name, *alias;
        int cmds;
        bool has_value;
    } opts[] = {
        {"-m", "--model", C_ALL, true},       {"--tokens", NULL, C_LOGITS | C_GENERATE | C_BENCH, true},
        {"--mode", NULL, C_LOGITS, true},     {"-o", "--out", C_LOGITS | C_TOKENIZE, true},
        {"--threads", NULL, C_LOGITS | C_GENERATE | C_BENCH, true},  {"--file", NULL, C_TOKENIZE, true},
        {"--prefill", NULL, C_LOGITS, true},  {"-n", NULL, C_GENERATE | C_BENCH, true},
        {"--special", NULL, C_TOKENIZE, false}, {"--verbose", NULL, C_ALL, false},
        {"--no-repack", NULL, C_LOGITS | C_GENERATE | C_BENCH, false},
        {"--fa", NULL, C_LOGITS | C_GENERATE | C_BENCH, true}, {"--cache-type", NULL, C_LOGITS | C_GENERATE | C_BENCH, true},
        {"--gpu-layers", NULL, C_LOGITS | C_GENERATE | C_BENCH, true},
    };
    for (int i = 2; i < argc; i++) {
        const char *o = argv[i];
        int k = -1;
        for (int j = 0; j < (int)(sizeof opts / sizeof opts[0]); j++) {
            if (strcmp(o, opts[j].name) == 0 || (opts[j].alias && strcmp(o, opts[j].alias) == 0)) k = j;
        }
        if (k < 0) return rl_errf(err, "unknown option \"%s\"", o);
        if (!(opts[k].cmds & cmd)) return rl_errf(err, "option %s does not apply to \"%s\"", o, a->cmd);
        const char *v = NULL;
        if (opts[k].has_value) {
            if (i + 1 >= argc) return rl_errf(err, "option %s needs a value", o);
            v = argv[++i];
        }
        const char *name = opts[k].name;
        if (strcmp(name, "-m") == 0) a->model = v;
        else if (strcmp(name, "--tokens") == 0) a->tokens = v;
        else if (strcmp(name, "--mode") == 0) a->mode = v;
        else if (strcmp(name, "-o") == 0) a->out = v;
        else if (strcmp(name, "--file") == 0) a->file = v;
        else if (strcmp(name, "--special") == 0) a->special = true;
        else if (strcmp(name, "--verbose") == 0) a->verbose = true;
        else if (strcmp(name, "--no-repack") == 0) a->no_repack = true;
        else if (strcmp(name, "--fa") == 0) {
            if (strcmp(v, "on") && strcmp(v, "off")) return rl_errf(err, "--fa \"%s\": want on or off", v);
            a->fa = strcmp(v, "on") == 0;
        } else if (strcmp(name, "--cache-type") == 0) {
            if (strcmp(v, "f32") && strcmp(v, "f16")) return rl_errf(err, "--cache-type \"%s\": want f32 or f16", v);
            a->cache_f16 = strcmp(v, "f16") == 0;
        }
        else if (strcmp(name, "--prefill") == 0 || strcmp(name, "-n") == 0) {
            long t;
            if (parse_int(v, 1, 1 << 20, &t) < 0) return rl_errf(err, "%s \"%s\": want a positive number", name, v);
            if (name[1] == 'n') a->n_gen = (int)t;
            else a->prefill = (int)t;
        } else if (strcmp(name, "--gpu-layers") == 0) {
            long t;
            if (parse_int(v, 0, 100000, &t) < 0) return rl_errf(err, "--gpu-layers \"%s\": want a number 0 or more", v);
            a->gpu_layers = (int)t;
        } else if (strcmp(name, "--threads") == 0) {
            long t;
            if (parse_int(v, 1, 1024, &t) < 0) return rl_errf(err, "--threads \"%s\": want a number 1..1024", v);
            a->threads = (int)t;
        }
    }
    if (!a->model) return rl_errf(err, "%s: -m MODEL.gguf is required", a->cmd);
    if (cmd == C_LOGITS) {
        if (!a->tokens) return rl_errf(err, "logits: --tokens is required");
        if (!a->out) return rl_errf(err, "logits: -o OUT.bin is required");
        if (strcmp(a->mode, "batch") != 0 && strcmp(a->mode, "step") != 0) {
            return rl_errf(err, "logits: --mode \"%s\": want batch or step", a->mode);
        }
    }
    if ((cmd == C_GENERATE || cmd == C_BENCH) && (!a->tokens || a->n_gen <= 0)) return rl_errf(err, "generate: --tokens and -n are required");
    if (cmd == C_TOKENIZE && !a->file) return rl_errf(err, "tokenize: --file STRINGS.txt is required");
    return 0;
}

/* "1,2,3" -> malloc'ed ids. Each id must be a plain non-negative decimal; the vocab bound is checked
 * once the model is loaded. */
static int parse_tokens(const char *s, int32_t **out, int *n_out, rl_err *err) {
    int cap = 1;
    for (const char *p = s; *p; p++) cap += *p == ',';
    int32_t *t = malloc((size_t)cap * sizeof *t);
    if (!t) return rl_errf(err, "out of memory");
    int n = 0;
    const char *p = s;
    for (;;) {
        const char *q = p;
        while (isdigit((unsigned char)*q)) q++;
        long v;
        char num[16];
        if (q == p || q - p >= (long)sizeof num) goto bad;
        memcpy(num, p, (size_t)(q - p));
        num[q - p] = 0;
        if (parse_int(num, 0, INT32_MAX, &v) < 0) goto bad;
        t[n++] = (int32_t)v;
        if (*q == 0) break;
        if (*q != ',') goto bad;
        p = q + 1;
    }
    *out = t;
    *n_out = n;
    return 0;
bad:
    free(t);
    return rl_errf(err, "--tokens \"%.60s\": want comma-separated token ids like 1,2,3", s);
}

/* ---- llama.cpp setup --------------------------------------------------------------------------- */

/* The prebuilt libggml has no CPU code of its own: the CPU backend comes as libggml-cpu-<cpu>.so
 * variants that must be loaded at run time. ggml_backend_load_all() only looks next to the executable
 * and in the current directory, so instead we look where libggml itself was loaded from (via the
 * rpath), which is the unpacked package directory holding the variants. Like ggml we load the variant
 * with the best ggml_backend_score for this CPU, except sapphirerapids: its AMX buffer type segfaults in
 * this release (llama.cpp issue 20824; scripts/ggml-variant.sh builds ours without it the same way). */
static int init_backend(rl_err *err) {
    Dl_info info;
    if (!dladdr((void *)ggml_backend_load_all_from_path, &info) || !info.dli_fname) {
        return rl_errf(err, "cannot find where libggml was loaded from (dladdr failed)");
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", info.dli_fname);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    else snprintf(dir, sizeof dir, ".");
    DIR *d = opendir(dir);
    char best[4096 + 256] = "";
    int best_score = 0;
    for (struct dirent *de = d ? readdir(d) : NULL; de; de = readdir(d)) {
        const char *n = de->d_name;
        size_t len = strlen(n);
        /* libggml-cpu-<variant>.so, or the one libggml-cpu.so of a build without GGML_CPU_ALL_VARIANTS
         * (scripts/ggml-cuda.sh's). */
        if (strncmp(n, "libggml-cpu", 11) != 0 || (n[11] != '-' && n[11] != '.') || len < 4 ||
            strcmp(n + len - 3, ".so") != 0)
            continue;
        if (strstr(n, "sapphirerapids")) continue;
        char path[sizeof best];
        snprintf(path, sizeof path, "%s/%s", dir, n);
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!h) continue;
        int (*score)(void) = (int (*)(void))dlsym(h, "ggml_backend_score");
        int sc = score ? score() : 1; /* a lone libggml-cpu.so does not score itself */
        dlclose(h);
        if (sc > best_score) {
            best_score = sc;
            snprintf(best, sizeof best, "%s", path);
        }
    }
    if (d) closedir(d);
    if (best[0]) ggml_backend_load(best);
    /* A GPU build (oracle-gpu) has its GPU backend module beside the CPU variants. */
    static const char *const gpu[] = {"libggml-vulkan.so", "libggml-cuda.so"};
    for (size_t i = 0; i < sizeof gpu / sizeof gpu[0]; i++) {
        char path[sizeof best];
        snprintf(path, sizeof path, "%s/%s", dir, gpu[i]);
        if (access(path, R_OK) == 0) ggml_backend_load(path);
    }
    if (!ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU)) {
        return rl_errf(err, "no CPU backend could be loaded from %s (expected libggml-cpu-*.so there)", dir);
    }
    /* Backends are registered now, so this does not go looking for more. */
    llama_backend_init();
    return 0;
}

static struct llama_model *load_model(const char *path, bool vocab_only, bool check_data, bool repack, int ngl,
                                     rl_err *err) {
    /* A missing file gets a plain message, not llama.cpp's. */
    FILE *f = fopen(path, "rb");
    if (!f) {
        rl_errf(err, "cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    fclose(f);
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = ngl;
    mp.vocab_only = vocab_only;
    /* `info` is the place to find bad weights, so there llama.cpp also scans the data for NaN/inf. */
    mp.check_tensors = check_data;
    /* Repacked weight layouts (the CPU's "extra" buffer types, chosen per CPU feature and tensor shape) are
     * llama.cpp's default; without them every weight runs the plain ggml kernels. */
    mp.use_extra_bufts = repack;
    g_log.n_errors = 0;
    struct llama_model *m = llama_model_load_from_file(path, mp);
    if (!m) {
        rl_errf(err, "llama.cpp could not load %s", path);
        add_llama_errors(err);
    }
    return m;
}

/* ---- logits ------------------------------------------------------------------------------------ */

static struct llama_context *new_context(struct llama_model *model, int n_tokens, const args *a, rl_err *err) {
    const int threads = a->threads;
    struct llama_context_params cp = llama_context_default_params();
    /* Room for all tokens, in one batch and one micro-batch, so `batch` really is one graph.
     * Rounded up to 256 because llama.cpp pads the context to that anyway. */
    uint32_t n = ((uint32_t)n_tokens + 255u) / 256u * 256u;
    cp.n_ctx = n;
    cp.n_batch = n;
    cp.n_ubatch = n;
    cp.n_seq_max = 1;
    cp.n_outputs_max = 0;         /* = n_batch: every position is an output */
    cp.n_outputs_max_per_seq = 0; /* the default (1) only limits backend sampling, but say what we mean */
    cp.n_threads = threads;
    cp.n_threads_batch = threads;
    cp.flash_attn_type = a->fa ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.type_k = a->cache_f16 ? GGML_TYPE_F16 : GGML_TYPE_F32;
    cp.type_v = cp.type_k;
    cp.offload_kqv = a->gpu_layers > 0; /* the KV cache beside its layers, as llama.cpp's default */
    cp.op_offload = false;
    cp.swa_full = true; /* keep every position: a sliding window then only masks, never evicts */
    cp.embeddings = false;
    cp.no_perf = true;
    g_log.n_errors = 0;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        rl_errf(err, "llama.cpp could not create a context for %d tokens", n_tokens);
        add_llama_errors(err);
        return NULL;
    }
    if (llama_n_ctx(ctx) < (uint32_t)n_tokens || llama_n_batch(ctx) < (uint32_t)n_tokens ||
        llama_n_ubatch(ctx) < (uint32_t)n_tokens) {
        rl_errf(err, "llama.cpp gave n_ctx %u, n_batch %u, n_ubatch %u; need %d for all tokens", llama_n_ctx(ctx),
                llama_n_batch(ctx), llama_n_ubatch(ctx), n_tokens);
        llama_free(ctx);
        return NULL;
    }
    return ctx;
}

/* Decodes tokens[first..first+count) at positions first.. of sequence 0, every position an output, and
 * copies the rows into out (count rows of n_vocab). */
static int decode_rows(struct llama_context *ctx, struct llama_batch *b, const int32_t *tokens, int first, int count,
                       int n_vocab, float *out, rl_err *err) {
    for (int i = 0; i < count; i++) {
        b->token[i] = tokens[first + i];
        b->pos[i] = first + i;
        b->n_seq_id[i] = 1;
        b->seq_id[i][0] = 0;
        b->logits[i] = 1;
    }
    b->n_tokens = count;
    g_log.n_errors = 0;
    int32_t rc = llama_decode(ctx, *b);
    if (rc != 0) {
        rl_errf(err, "llama_decode of %d token(s) at position %d returned %d", count, first, (int)rc);
        add_llama_errors(err);
        return -1;
    }
    for (int i = 0; i < count; i++) {
        const float *row = llama_get_logits_ith(ctx, i);
        if (!row) return rl_errf(err, "llama.cpp has no logits for position %d", first + i);
        memcpy(out + (size_t)i * (size_t)n_vocab, row, (size_t)n_vocab * sizeof(float));
    }
    return 0;
}

static int cmd_logits(const args *a, rl_err *err) {
    int32_t *tokens = NULL;
    int n = 0, ret = -1;
    struct llama_model *model = NULL;
    struct llama_context *ctx = NULL;
    struct llama_batch batch = {0};
    bool have_batch = false;
    float *logits = NULL;

    if (parse_tokens(a->tokens, &tokens, &n, err) < 0) return -1;
    if (!(model = load_model(a->model, false, false, !a->no_repack, a->gpu_layers, err))) goto done;
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    int n_vocab = llama_vocab_n_tokens(vocab);
    for (int i = 0; i < n; i++) {
        if (tokens[i] >= n_vocab) {
            rl_errf(err, "token %d (at index %d) is out of range: the vocabulary has %d tokens", (int)tokens[i], i,
                    n_vocab);
            goto done;
        }
    }
    if (!(ctx = new_context(model, n, a, err))) goto done;
    logits = malloc((size_t)n * (size_t)n_vocab * sizeof(float));
    if (!logits) {
        rl_errf(err, "out of memory for %d x %d logits", n, n_vocab);
        goto done;
    }
    bool step = strcmp(a->mode, "step") == 0;
    /* First chunk: all tokens (batch), one (step), or --prefill N; then one token per decode. */
    int first = a->prefill > 0 ? (a->prefill < n ? a->prefill : n) : step ? 1 : n;
    batch = llama_batch_init(first, 0, 1);
    have_batch = true;
    if (decode_rows(ctx, &batch, tokens, 0, first, n_vocab, logits, err) < 0) goto done;
    for (int i = first; i < n; i++) {
        if (decode_rows(ctx, &batch, tokens, i, 1, n_vocab, logits + (size_t)i * (size_t)n_vocab, err) < 0) goto done;
    }
    lf_header h = {.n_vocab = n_vocab, .n_rows = n, .tokens = tokens};
    snprintf(h.source, sizeof h.source, "llama.cpp");
    if (a->prefill > 0) snprintf(h.mode, sizeof h.mode, "prefill%d", first);
    else snprintf(h.mode, sizeof h.mode, "%s", a->mode);
    if (lf_write(a->out, &h, logits, err) < 0) goto done;
    ret = 0;
done:
    if (have_batch) llama_batch_free(batch);
    free(logits);
    if (ctx) llama_free(ctx);
    if (model) llama_model_free(model);
    free(tokens);
    return ret;
}

/* ---- tokenize ---------------------------------------------------------------------------------- */

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Undoes the C escapes \\ \n \r \t \xHH in place; returns the new length or -1. */
static long unescape(char *s, size_t len, const char *path, int lineno, rl_err *err) {
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] != '\\') {
            s[o++] = s[i];
            continue;
        }
        if (++i >= len) return rl_errf(err, "%s:%d: a lone \\ at the end of the line", path, lineno);
        switch (s[i]) {
        case '\\': s[o++] = '\\'; break;
        case 'n': s[o++] = '\n'; break;
        case 'r': s[o++] = '\r'; break;
        case 't': s[o++] = '\t'; break;
        case 'x': {
            int hi = i + 1 < len ? hexval((unsigned char)s[i + 1]) : -1;
            int lo = i + 2 < len ? hexval((unsigned char)s[i + 2]) : -1;
            if (hi < 0 || lo < 0) return rl_errf(err, "%s:%d: \\x wants two hex digits", path, lineno);
            s[o++] = (char)(hi * 16 + lo);
            i += 2;
            break;
        }
        default:
            return rl_errf(err, "%s:%d: unknown escape \\%c (known: \\\\ \\n \\r \\t \\xHH)", path, lineno, s[i]);
        }
    }
    return (long)o;
}

static int read_file(const char *path, char **data, size_t *len, rl_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return rl_errf(err, "cannot open %s: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            fclose(f);
            return rl_errf(err, "%s: out of memory", path);
        }
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        char *nb = realloc(buf, cap * 2);
        if (!nb) free(buf);
        buf = nb;
        cap *= 2;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return rl_errf(err, "cannot read %s", path);
    }
    *data = buf;
    *len = n;
    return 0;
}

static int tokenize_one(const struct llama_vocab *vocab, const char *text, size_t len, bool special,
                        llama_token **toks, int *cap, int *n_out, rl_err *err) {
    if (len > INT32_MAX) return rl_errf(err, "a string of %zu bytes is too long for llama_tokenize", len);
    int32_t n = llama_tokenize(vocab, text, (int32_t)len, *toks, *cap, false, special);
    if (n == INT32_MIN) return rl_errf(err, "llama_tokenize overflowed on a string of %zu bytes", len);
    if (n < 0) { /* buffer too small: -n is the count needed */
        llama_token *nt = realloc(*toks, (size_t)(-n) * sizeof *nt);
        if (!nt) return rl_errf(err, "out of memory for %d tokens", -n);
        *toks = nt;
        *cap = -n;
        n = llama_tokenize(vocab, text, (int32_t)len, *toks, *cap, false, special);
        if (n < 0) return rl_errf(err, "llama_tokenize failed (%d) on a string of %zu bytes", (int)n, len);
    }
    *n_out = n;
    return 0;
}

static int cmd_tokenize(const args *a, rl_err *err) {
    char *data = NULL;
    size_t len = 0;
    int ret = -1, cap = 256;
    struct llama_model *model = NULL;
    llama_token *toks = malloc((size_t)cap * sizeof *toks);
    FILE *out = NULL;
    if (!toks) return rl_errf(err, "out of memory");
    if (read_file(a->file, &data, &len, err) < 0) goto done;
    if (!(model = load_model(a->model, true, false, false, 0, err))) goto done;
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    out = a->out ? fopen(a->out, "w") : stdout;
    if (!out) {
        rl_errf(err, "cannot create %s: %s", a->out, strerror(errno));
        goto done;
    }
    /* One string per line; a final line without '\n' still counts, an empty file has none. */
    size_t pos = 0;
    for (int lineno = 1; pos < len; lineno++) {
        char *line = data + pos;
        char *nl = memchr(line, '\n', len - pos);
        size_t ll = nl ? (size_t)(nl - line) : len - pos;
        pos += ll + (nl ? 1 : 0);
        long ul = unescape(line, ll, a->file, lineno, err);
        if (ul < 0) goto done;
        int n = 0;
        if (tokenize_one(vocab, line, (size_t)ul, a->special, &toks, &cap, &n, err) < 0) {
            rl_err_prefix(err, "%s:%d", a->file, lineno);
            goto done;
        }
        for (int i = 0; i < n; i++) fprintf(out, "%s%d", i ? "," : "", (int)toks[i]);
        fputc('\n', out);
    }
    if (fflush(out) != 0 || ferror(out)) {
        rl_errf(err, "cannot write %s: %s", a->out ? a->out : "stdout", strerror(errno));
        goto done;
    }
    ret = 0;
done:
    if (out && out != stdout && fclose(out) != 0 && ret == 0) {
        ret = rl_errf(err, "cannot write %s: %s", a->out, strerror(errno));
    }
    if (model) llama_model_free(model);
    free(data);
    free(toks);
    return ret;
}

/* ---- info -------------------------------------------------------------------------------------- */

typedef struct kv_pair {
    char *key, *val;
} kv_pair;

static int kv_cmp(const void *x, const void *y) {
    return strcmp(((const kv_pair *)x)->key, ((const kv_pair *)y)->key);
}

/* Prints a value on one line: the same escapes the tokenize input uses, so multi-line strings (chat
 * templates) cannot break the "kv <key> <value>" format. */
static void print_escaped(const char *s) {
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '\\') fputs("\\\\", stdout);
        else if (*p == '\n') fputs("\\n", stdout);
        else if (*p == '\r') fputs("\\r", stdout);
        else if (*p == '\t') fputs("\\t", stdout);
        else if (*p < 0x20 || *p == 0x7f) printf("\\x%02x", *p);
        else putchar(*p);
    }
}

/* llama_model_meta_*_by_index are snprintf-like: they return the full length, so a too-small buffer is
 * grown and the call repeated. */
static char *meta_str(const struct llama_model *m, int i, bool key) {
    size_t cap = 256;
    for (;;) {
        char *buf = malloc(cap);
        if (!buf) return NULL;
        int32_t n = key ? llama_model_meta_key_by_index(m, i, buf, cap) : llama_model_meta_val_str_by_index(m, i, buf, cap);
        if (n < 0) {
            free(buf);
            return NULL;
        }
        if ((size_t)n < cap) return buf;
        free(buf);
        cap = (size_t)n + 1;
    }
}

static int cmd_info(const args *a, rl_err *err) {
    struct llama_model *model = load_model(a->model, false, true, false, 0, err);
    if (!model) return -1;
    int ret = -1;
    int n_meta = llama_model_meta_count(model);
    kv_pair *kv = calloc(n_meta > 0 ? (size_t)n_meta : 1, sizeof *kv);
    if (!kv) {
        rl_errf(err, "out of memory");
        goto done;
    }
    for (int i = 0; i < n_meta; i++) {
        kv[i].key = meta_str(model, i, true);
        kv[i].val = meta_str(model, i, false);
        if (!kv[i].key || !kv[i].val) {
            rl_errf(err, "cannot read metadata pair %d of %d", i, n_meta);
            goto done;
        }
    }
    char arch[256];
    if (llama_model_meta_val_str(model, "general.architecture", arch, sizeof arch) < 0) snprintf(arch, sizeof arch, "?");
    printf("arch %s\n", arch);
    printf("n_layer %d\n", (int)llama_model_n_layer(model));
    printf("n_embd %d\n", (int)llama_model_n_embd(model));
    printf("n_head %d\n", (int)llama_model_n_head(model));
    printf("n_vocab %d\n", (int)llama_vocab_n_tokens(llama_model_get_vocab(model)));
    printf("n_ctx_train %d\n", (int)llama_model_n_ctx_train(model));
    printf("n_params %llu\n", (unsigned long long)llama_model_n_params(model));
    printf("n_tensors %d\n", g_log.n_tensors);
    printf("n_kv %d\n", g_log.n_kv);
    /* llama.cpp keeps the pairs in a hash map: sort them so the output is stable. It also leaves out
     * every array-valued pair (tokenizer.ggml.tokens, merges, token_type, ...); the length check below
     * keeps that promise should a later version start exposing them. */
    qsort(kv, (size_t)n_meta, sizeof *kv, kv_cmp);
    for (int i = 0; i < n_meta; i++) {
        bool big_array = strncmp(kv[i].key, "tokenizer.ggml.", 15) == 0 &&
                         (strcmp(kv[i].key + 15, "tokens") == 0 || strcmp(kv[i].key + 15, "merges") == 0 ||
                          strcmp(kv[i].key + 15, "token_type") == 0);
        if (big_array && strlen(kv[i].val) >= 200) continue;
        printf("kv %s ", kv[i].key);
        print_escaped(kv[i].val);
        putchar('\n');
    }
    if (fflush(stdout) != 0 || ferror(stdout)) {
        rl_errf(err, "cannot write stdout: %s", strerror(errno));
        goto done;
    }
    ret = 0;
done:
    if (kv) {
        for (int i = 0; i < n_meta; i++) {
            free(kv[i].key);
            free(kv[i].val);
        }
        free(kv);
    }
    llama_model_free(model);
    return ret;
}


/* ---- generate ---------------------------------------------------------------------------------- */

/* Greedy generation: the prompt in one decode, then argmax (first index on ties) one token at a time. */
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* generate (and bench, which times it instead of printing the tokens). */
static int cmd_generate(const args *a, rl_err *err) {
    const bool bench = strcmp(a->cmd, "bench") == 0;
    int32_t *tokens = NULL;
    int n = 0, ret = -1;
    struct llama_model *model = NULL;
    struct llama_context *ctx = NULL;
    struct llama_batch batch = {0};
    bool have_batch = false;
    float *row = NULL;
    if (parse_tokens(a->tokens, &tokens, &n, err) < 0) return -1;
    int32_t *all = realloc(tokens, (size_t)(n + a->n_gen) * sizeof *all);
    if (!all) {
        free(tokens);
        return rl_errf(err, "out of memory");
    }
    tokens = all;
    if (!(model = load_model(a->model, false, false, !a->no_repack, a->gpu_layers, err))) goto done;
    int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    for (int i = 0; i < n; i++) {
        if (tokens[i] >= n_vocab) {
            rl_errf(err, "token %d is out of range: the vocabulary has %d tokens", (int)tokens[i], n_vocab);
            goto done;
        }
    }
    if (!(ctx = new_context(model, n + a->n_gen, a, err))) goto done;
    batch = llama_batch_init(n, 0, 1);
    have_batch = true;
    row = malloc((size_t)n * (size_t)n_vocab * sizeof(float));
    if (!row) {
        rl_errf(err, "out of memory");
        goto done;
    }
    int first = n, count = n;
    double t0 = now_s(), t_prefill = 0;
    for (int g = 0; g < a->n_gen; g++) {
        if (decode_rows(ctx, &batch, tokens, first - count, count, n_vocab, row, err) < 0) goto done;
        const float *last = row + (size_t)(count - 1) * (size_t)n_vocab;
        int best = 0;
        for (int j = 1; j < n_vocab; j++) {
            if (last[j] > last[best]) best = j;
        }
        tokens[first] = best;
        if (g == 0) t_prefill = now_s();
        if (!bench) printf("%s%d", g ? "," : "", best);
        first++;
        count = 1;
    }
    if (bench) {
        /* Decode: a->n_gen - 1 single-token decodes after the prompt's (as ringlm run counts them). */
        double t_end = now_s();
        printf("{\"prompt_tokens\": %d, \"generated_tokens\": %d, \"prefill_tok_s\": %.3f, \"decode_tok_s\": %.3f, "
               "\"threads\": %d}\n", n, a->n_gen, n / (t_prefill - t0),
               a->n_gen > 1 ? (a->n_gen - 1) / (t_end - t_prefill) : 0.0, a->threads);
    } else {
        printf("\n");
    }
    ret = 0;
done:
    if (have_batch) llama_batch_free(batch);
    free(row);
    if (ctx) llama_free(ctx);
    if (model) llama_model_free(model);
    free(tokens);
    return ret;
}

/* ---- main -------------------------------------------------------------------------------------- */

int main(int argc, char **argv) {
    rl_err err = {{0}};
    args a;
    if (argc >= 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
        fputs(usage, stdout);
        return 0;
    }
    if (parse_args(argc, argv, &a, &err) < 0) {
        fprintf(stderr, "oracle: %s\n%s", err.msg, usage);
        return 1;
    }
    /* Before anything can log: llama.cpp otherwise writes its whole load log to stderr. */
    g_log.verbose = a.verbose;
    llama_log_set(log_cb, &g_log);
    int rc = init_backend(&err);
    if (rc == 0) {
        if (strcmp(a.cmd, "logits") == 0) rc = cmd_logits(&a, &err);
        else if (strcmp(a.cmd, "tokenize") == 0) rc = cmd_tokenize(&a, &err);
        else if (strcmp(a.cmd, "generate") == 0 || strcmp(a.cmd, "bench") == 0) rc = cmd_generate(&a, &err);
        else rc = cmd_info(&a, &err);
        llama_backend_free();
    }
    if (rc < 0) {
        fprintf(stderr, "oracle %s: %s\n", a.cmd, err.msg);
        return 1;
    }
    return 0;
}
