#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../model/k3_forward.h"
#include "../model/logits_file.h"
#include "../coord/coord.h"
#include "../coord/target.h"
#include "cli.h"

static void logits_usage(FILE *f) {
    fprintf(f, "usage: ringlm logits -m MODEL.gguf --tokens 1,2,3 [--mode batch|step] [--chunk N | --prefill N] [--split-invariant]\n"
               "                     [--threads N] [--no-repack] [--flash-attn on|off|auto] [--cache-type f32|f16] [--mem GB [--expert-copy DIR]]\n"
            "                  [--device NAME[,NAME...]] [--vram GB] [--gpu-layers N] [--n-cpu-moe N | --cpu-moe] [--ring ring.conf --key coord.key [--wire f32|f16|bf16]] -o OUT.bin\n\n"
               "Writes the logits of every position (the oracle's file format, src/model/logits_file.h).\n"
               "batch: all tokens in one forward pass (or --chunk N tokens per pass); step: one token per pass;\n"
               "--prefill N: N tokens in one pass, then one token per pass (a prompt, then decode steps).\n"
               "--split-invariant: passes of 2 or more tokens as serve reads prompts (the same bits for any such split;\n"
               "docs/numerics.md), not llama.cpp's (whose flash attention rounds a pass under 64 tokens otherwise).\n"
               "--no-repack: every weight stays in the file mapping (llama.cpp's --no-repack); the default copies\n"
               "quantized matmul weights into the CPU's repacked layouts where llama.cpp would.\n"
               "--flash-attn on|off|auto, --cache-type f32|f16: MLA attention by flash attention over an f16 cache (the\n"
               "defaults, as llama.cpp's), or the softmax path / an f32 cache.\n"
               "--mem GB: at most GB of resident weights, routed experts past it read from the file (the same logits);\n"
               "--expert-copy DIR keeps them there re-laid for the CPU's repacked kernels.\n"
               "--device NAME, --gpu-layers N, --n-cpu-moe N, --cpu-moe: compute on a GPU (docs/devices.md; default:\n"
               "the first GPU found, else the CPU), its first N layers there, routed experts kept in RAM; --vram GB:\n"
               "the device memory the weights may take. With --mem too: VRAM -> RAM -> disk.\n"
               "--manifest M (with --ring, instead of -m): this machine holds only the model's manifest; the nodes\n"
               "map their layers from the split files they hold and stream the rest from each other.\n");
}

/* Parses "1,2,3" into a malloc'ed array. */
static int parse_tokens(const char *s, int32_t **out, int *n) {
    int cap = 16, k = 0;
    int32_t *v = malloc((size_t)cap * sizeof *v);
    if (!v) return -1;
    while (*s) {
        char *end;
        long x = strtol(s, &end, 10);
        if (end == s || x < 0 || x > 0x7fffffff) {
            free(v);
            return -1;
        }
        if (k == cap) {
            int32_t *nv = realloc(v, (size_t)(cap *= 2) * sizeof *v);
            if (!nv) {
                free(v);
                return -1;
            }
            v = nv;
        }
        v[k++] = (int32_t)x;
        s = end;
        if (*s == ',') s++;
        else if (*s) {
            free(v);
            return -1;
        }
    }
    *out = v;
    *n = k;
    return k > 0 ? 0 : -1;
}

int cmd_logits(int argc, char **argv) {
    const char *model = NULL, *out = NULL, *mode = "batch", *toks = NULL, *ring_path = NULL, *key_path = NULL;
    const char *wire = "f32", *manifest = NULL;
    int threads = (int)sysconf(_SC_NPROCESSORS_ONLN), chunk = 0, prefill = 0;
    bool split_inv = false;
    k3_engine_opts eo = {0}; /* llama.cpp's defaults */
    int bad = 0;
    const char *want = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            logits_usage(stdout);
            return 0;
        } else if (strcmp(a, "-m") == 0 && v) {
            model = v, i++;
        } else if (strcmp(a, "-o") == 0 && v) {
            out = v, i++;
        } else if (strcmp(a, "--ring") == 0 && v) {
            ring_path = v, i++;
        } else if (strcmp(a, "--manifest") == 0 && v) {
            manifest = v, i++;
        } else if (strcmp(a, "--key") == 0 && v) {
            key_path = v, i++;
        } else if (strcmp(a, "--wire") == 0 && v) {
            wire = v, i++;
        } else if (strcmp(a, "--tokens") == 0 && v) {
            toks = v, i++;
        } else if (strcmp(a, "--mode") == 0 && v && (strcmp(v, "batch") == 0 || strcmp(v, "step") == 0)) {
            mode = v, i++;
        } else if (strcmp(a, "--chunk") == 0 && v && cli_parse_int(v, &chunk) == 0 && chunk > 0) {
            i++;
        } else if (strcmp(a, "--prefill") == 0 && v && cli_parse_int(v, &prefill) == 0 && prefill > 0) {
            i++;
        } else if (strcmp(a, "--threads") == 0 && v && cli_parse_int(v, &threads) == 0 && threads > 0) {
            i++;
        } else if (strcmp(a, "--split-invariant") == 0) {
            split_inv = true;
        } else if (cli_engine_flag(a, &eo)) {
        } else if (v && cli_parse_engine(a, v, &eo, &bad, &want)) {
            if (bad) return cli_bad_option("logits", a, v, true, want);
            i++;
        } else {
            fprintf(stderr, "ringlm logits: unknown or bad option '%s'\n", a);
            logits_usage(stderr);
            return 2;
        }
    }
    int32_t *tokens = NULL;
    int n = 0;
    if (!model == !manifest || !out || !toks || (manifest && !ring_path)) {
        if (manifest && !ring_path) fprintf(stderr, "ringlm logits: --manifest needs --ring: the weights are on the nodes\n");
        logits_usage(stderr);
        return 2;
    }
    if (parse_tokens(toks, &tokens, &n) != 0) {
        fprintf(stderr, "ringlm logits: bad --tokens '%s' (comma-separated ids)\n", toks);
        return 2;
    }
    rl_err err = {{0}};
    mf_model m;
    k3_hparams hp;
    k3_engine e;
    k3_state st;
    int rc = 1;
    manifest_file mf;
    if (ring_target_open(model, manifest, &m, &hp, &mf, &err) != 0) {
        fprintf(stderr, "ringlm logits: %s\n", err.msg);
        free(tokens);
        return 1;
    }
    if (ring_path) {
        /* Through the ring: the same chunks, every position's logits returned by the last stage. */
        ring_conf conf;
        keys_identity id;
        ring_coord ring;
        float *all = malloc((size_t)n * hp.n_vocab * sizeof(float));
        if (!all || !key_path || ring_conf_load(&conf, ring_path, &err) != 0 || keys_load(&id, key_path, &err) != 0) {
            if (!key_path) rl_errf(&err, "--ring needs --key");
            free(all);
            goto fail_model;
        }
        ring_opts ro = ring_opts_default();
        ro.n_ctx = ((uint32_t)n + 255u) / 256u * 256u;
        ro.wire = strcmp(wire, "f16") == 0 ? 1 : strcmp(wire, "bf16") == 0 ? 2 : 0;
        ro.quiet = true;
        ro.manifest = manifest ? &mf : NULL;
        ro.manifest_path = manifest;
        if (ring_open(&ring, &conf, &id, &m, &hp, &ro, &err) != 0) {
            free(all);
            goto fail_model;
        }
        bool stp = strcmp(mode, "step") == 0;
        smp_params greedy = smp_params_default(0);
        greedy.temperature = 0;
        int cn = stp ? 1 : chunk > 0 ? chunk : n;
        int frc = 0;
        for (int i = 0; i < n && frc == 0; i += cn) {
            if (prefill > 0) cn = i == 0 ? prefill : 1;
            int per = i + cn > n ? n - i : cn;
            ring_seq_req rq = {.seq_id = 1, .pos = (uint32_t)i, .n = (uint32_t)per, .tokens = tokens + i,
                               .flags = FRAME_SEQ_ALL_LOGITS | (i == 0 ? FRAME_SEQ_NEW : 0),
                               .logits = all + (size_t)i * hp.n_vocab, .smp = ring_sampling(&greedy)};
            frc = ring_step(&ring, &rq, 1, &err);
        }
        ring_close(&ring);
        if (frc == 0) {
            lf_header h = {.n_vocab = (int32_t)hp.n_vocab, .n_rows = n, .tokens = tokens};
            snprintf(h.source, sizeof h.source, "ringlm-ring");
            if (prefill > 0) snprintf(h.mode, sizeof h.mode, "prefill%d", prefill < n ? prefill : n);
            else snprintf(h.mode, sizeof h.mode, "%s", mode);
            rc = lf_write(out, &h, all, &err) == 0 ? 0 : 1;
        }
        free(all);
        goto fail_model;
    }
    eo.n_threads = threads;
    if (k3_engine_init(&e, &m, &hp, 0, hp.n_layer, &eo, &err) != 0) goto fail_model;
    /* Context rounded up to 256 tokens, as the oracle sizes llama.cpp's. */
    if (k3_state_init(&st, &e.hp, 0, hp.n_layer, ((uint32_t)n + 255u) / 256u * 256u, &err) != 0) goto fail_engine;
    float *logits = malloc((size_t)n * hp.n_vocab * sizeof(float));
    if (!logits) {
        rl_errf(&err, "out of memory");
        goto fail_state;
    }
    bool step = strcmp(mode, "step") == 0;
    int chunk_n = step ? 1 : chunk > 0 ? chunk : n;
    for (int i = 0; i < n; i += chunk_n) {
        /* --prefill N: the first N tokens in one pass, then one token per pass (prompt, then decode). */
        if (prefill > 0) chunk_n = i == 0 ? prefill : 1;
        int per = i + chunk_n > n ? n - i : chunk_n;
        k3_state *sp = &st;
        uint32_t nt = (uint32_t)per;
        int32_t *rows = malloc((size_t)per * sizeof *rows);
        for (int r = 0; r < per; r++) rows[r] = r;
        k3_batch b = {.n_seqs = 1, .seqs = &sp, .n_tokens = &nt, .tokens = tokens + i, .n_logits = per, .logit_rows = rows,
                      .split_invariant = split_inv};
        k3_output o;
        int frc = k3_forward(&e, &b, &o, &err);
        free(rows);
        if (frc != 0) {
            free(logits);
            goto fail_state;
        }
        memcpy(logits + (size_t)i * hp.n_vocab, o.logits, (size_t)per * hp.n_vocab * sizeof(float));
        k3_output_free(&o);
    }
    lf_header h = {.n_vocab = (int32_t)hp.n_vocab, .n_rows = n, .tokens = tokens};
    snprintf(h.source, sizeof h.source, "ringlm");
    if (prefill > 0) snprintf(h.mode, sizeof h.mode, "prefill%d", prefill < n ? prefill : n);
    else snprintf(h.mode, sizeof h.mode, "%s", mode);
    rc = lf_write(out, &h, logits, &err) == 0 ? 0 : 1;
    free(logits);
fail_state:
    k3_state_free(&st);
fail_engine:
    k3_engine_free(&e);
fail_model:
    if (rc != 0) fprintf(stderr, "ringlm logits: %s\n", err.msg);
    ring_target_close(&m, &mf);
    free(tokens);
    return rc;
}
