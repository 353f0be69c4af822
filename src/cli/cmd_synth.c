#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../tools/synth.h"
#include "../tools/synth_config.h"
#include "../tools/synth_dspark.h"
#include "../trust/manifest_file.h"
#include "cli.h"

static void synth_usage(FILE *f) {
    fprintf(f,
            "usage: ringlm synth -o FILE.gguf [--seed N] [--config tiny|small|medium|draft|PATH.json]\n"
            "                    [--type TYPE] [--split N] [--threads N] [--draft k3|dspark] [--progress] [--dry-run]\n"
            "                    [--shape-only] [--corpus TEXT.txt]\n\n"
            "Writes a kimi-k3 GGUF with seeded random weights that llama.cpp loads too.\n"
            "  --type TYPE   storage type of every matrix (f32 f16 bf16 q8_0 q4_0 q4_K q2_K iq4_nl ...);\n"
            "                replaces the config's per-tensor types (attn_k_b stays f32)\n"
            "  --split N     write a split set of N files NAME-0000i-of-0000N.gguf\n"
            "  --draft k3    write the small K3 draft model for the config's vocabulary\n"
            "  --draft dspark\n"
            "                write a DSpark draft for the config as target, in llama.cpp's generic dflash\n"
            "                layout: the target's vocabulary and hidden size, taps over its layers\n"
            "                (docs/dspark.md)\n"
            "  --corpus F    learn the BPE vocabulary from text file F instead of the corpus built into ringlm\n"
            "                (a trained model's own text: tools/train)\n"
            "  --shape-only  write no weights: a shape-only manifest of the model (its metadata, tensor shapes and\n"
            "                types; ringlm manifest's format without hashes) for `ringlm plan` (e.g. K3's real\n"
            "                shapes, bench/configs/k3-real.json)\n");
}

int cmd_synth(int argc, char **argv) {
    const char *out = NULL, *config = "tiny", *type = NULL, *draft = NULL, *corpus = NULL;
    unsigned long long seed = 1;
    int n_split = 1, threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    bool progress = isatty(2), dry_run = false, shape_only = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            synth_usage(stdout);
            return 0;
        } else if ((strcmp(a, "-o") == 0 || strcmp(a, "--output") == 0) && v) {
            out = v, i++;
        } else if (strcmp(a, "--config") == 0 && v) {
            config = v, i++;
        } else if (strcmp(a, "--type") == 0 && v) {
            type = v, i++;
        } else if (strcmp(a, "--draft") == 0 && v) {
            draft = v, i++;
        } else if (strcmp(a, "--seed") == 0 && v) {
            if (cli_parse_u64(v, &seed) != 0) {
                fprintf(stderr, "ringlm synth: bad --seed '%s'\n", v);
                return 2;
            }
            i++;
        } else if (strcmp(a, "--split") == 0 && v) {
            if (cli_parse_int(v, &n_split) != 0 || n_split < 1 || n_split > 9999) {
                fprintf(stderr, "ringlm synth: bad --split '%s' (1..9999)\n", v);
                return 2;
            }
            i++;
        } else if (strcmp(a, "--threads") == 0 && v) {
            if (cli_parse_int(v, &threads) != 0 || threads < 1) {
                fprintf(stderr, "ringlm synth: bad --threads '%s'\n", v);
                return 2;
            }
            i++;
        } else if (strcmp(a, "--corpus") == 0 && v) {
            corpus = v;
            i++;
        } else if (strcmp(a, "--dry-run") == 0) {
            dry_run = true;
        } else if (strcmp(a, "--shape-only") == 0) {
            shape_only = true;
        } else if (strcmp(a, "--progress") == 0) {
            progress = true;
        } else if (strcmp(a, "--no-progress") == 0) {
            progress = false;
        } else {
            fprintf(stderr, "ringlm synth: unknown or incomplete option '%s'\n", a);
            synth_usage(stderr);
            return 2;
        }
    }
    if (!out && !dry_run) {
        fprintf(stderr, "ringlm synth: -o FILE.gguf is required\n");
        synth_usage(stderr);
        return 2;
    }
    rl_err err = {{0}};
    synth_config c;
    if (synth_config_load(&c, config, &err) != 0) {
        fprintf(stderr, "ringlm synth: %s\n", err.msg);
        return 1;
    }
    bool dspark = false;
    if (draft) {
        if (strcmp(draft, "dspark") == 0) {
            dspark = true; /* c stays the target config: the draft is derived from it */
        } else if (strcmp(draft, "k3") != 0) {
            fprintf(stderr, "ringlm synth: unknown draft kind '%s' (k3, dspark)\n", draft);
            return 2;
        }
    }
    if (draft && !dspark) {
        uint32_t vocab = c.hp.n_vocab;
        if (synth_config_load(&c, "draft", &err) != 0) {
            fprintf(stderr, "ringlm synth: %s\n", err.msg);
            return 1;
        }
        c.hp.n_vocab = vocab; /* a draft must share the target's vocabulary */
    }
    if (type) {
        int t = synth_type_parse(type);
        if (t < 0) {
            fprintf(stderr, "ringlm synth: unknown type '%s'\n", type);
            return 2;
        }
        c.type = t;
        c.n_over = 0;
    }
    mf_model shapes;
    synth_opts o = {.out = out, .seed = seed, .n_split = n_split, .n_threads = threads, .progress = progress,
                    .dry_run = dry_run, .corpus = corpus, .shapes = shape_only ? &shapes : NULL};
    if (shape_only && (dspark || n_split > 1 || dry_run)) {
        fprintf(stderr, "ringlm synth: --shape-only writes one manifest of a target model (no --split, --draft dspark, --dry-run)\n");
        return 2;
    }
    if ((dspark ? synth_dspark_write(&c, &o, &err) : synth_write(&c, &o, &err)) != 0) {
        fprintf(stderr, "ringlm synth: %s\n", err.msg);
        return 1;
    }
    if (shape_only) { /* a shape-only manifest (trust/manifest_file.h): what `ringlm plan` needs of a model */
        manifest_file mf;
        free(shapes.splits[0].path);
        shapes.splits[0].path = strdup(out);
        int rc = manifest_file_build(&mf, &shapes, 1, false, &err) == 0 ? manifest_file_write(&mf, out, &err) : -1;
        if (rc == 0) {
            printf("shape-only manifest of config %s: %d tensors, %.2f GiB of weights, written to %s\n", c.name, shapes.n_tensor,
                   (double)shapes.tensor_bytes / 1073741824.0, out);
            manifest_file_free(&mf);
        }
        mf_close(&shapes);
        if (rc != 0) {
            fprintf(stderr, "ringlm synth: %s\n", err.msg);
            return 1;
        }
    }
    return 0;
}
