#include <stdio.h>
#include <string.h>

#include "../gguf/model_file.h"
#include "../model/k3_forward.h"
#include "../model/k3_hparams.h"
#include "../tools/inspect.h"
#include "cli.h"

static void inspect_usage(FILE *f) {
    fprintf(f, "usage: ringlm inspect FILE.gguf [--kv] [--range A:B] [--seqs N] [--ctx N] [--cache-type f16|f32]\n"
               "                     [--chunk N]\n\n"
               "Prints architecture, hyperparameters, tensor count, bytes per layer and per type, per-sequence\n"
               "state sizes and the memory needed to hold layers [A, B) for N sequences of --ctx tokens, the\n"
               "MLA cache in --cache-type (default f16, as run/serve/node), and the compute buffer of a prefill\n"
               "chunk of --chunk tokens (default 512) at the end of that context.\n"
               "A split set (NAME-00001-of-000NN.gguf) is read as one model. --kv prints key value lines.\n");
}

int cmd_inspect(int argc, char **argv) {
    const char *path = NULL;
    inspect_opts o = {.kv_format = 0, .range_a = 0, .range_b = -1, .n_seq = 1, .n_ctx = 4096};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int n;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            inspect_usage(stdout);
            return 0;
        } else if (strcmp(a, "--kv") == 0) {
            o.kv_format = 1;
        } else if (strcmp(a, "--range") == 0 && v) {
            if (sscanf(v, "%d:%d", &o.range_a, &o.range_b) != 2 || o.range_a < 0 || o.range_b <= o.range_a) {
                fprintf(stderr, "ringlm inspect: bad --range '%s' (A:B with 0 <= A < B)\n", v);
                return 2;
            }
            i++;
        } else if ((strcmp(a, "--seqs") == 0 || strcmp(a, "--ctx") == 0) && v) {
            if (cli_parse_int(v, &n) != 0 || n < 0) {
                fprintf(stderr, "ringlm inspect: bad %s '%s'\n", a, v);
                return 2;
            }
            if (a[2] == 's') o.n_seq = (unsigned)n;
            else o.n_ctx = (unsigned)n;
            i++;
        } else if (strcmp(a, "--chunk") == 0 && v) {
            if (cli_parse_int(v, &n) != 0 || n < 1) return cli_bad_option("inspect", a, v, true, "a number of tokens, at least 1");
            o.chunk = (unsigned)n;
            i++;
        } else if (strcmp(a, "--cache-type") == 0 && v) {
            k3_engine_opts eo = {0};
            int bad = 0;
            const char *want = NULL;
            cli_parse_engine(a, v, &eo, &bad, &want);
            if (bad) return cli_bad_option("inspect", a, v, true, want);
            o.cache_f32 = eo.cache_f32;
            i++;
        } else if (a[0] != '-' && !path) {
            path = a;
        } else {
            fprintf(stderr, "ringlm inspect: unknown or incomplete option '%s'\n", a);
            inspect_usage(stderr);
            return 2;
        }
    }
    if (!path) {
        inspect_usage(stderr);
        return 2;
    }
    mf_model m;
    k3_hparams hp;
    rl_err err = {{0}};
    if (k3_open(&m, &hp, path, &err) != 0) {
        fprintf(stderr, "ringlm inspect: %s\n", err.msg);
        return 1;
    }
    if (o.range_b > (int)hp.n_layer) {
        fprintf(stderr, "ringlm inspect: --range %d:%d is beyond the model's %u layers\n", o.range_a, o.range_b,
                hp.n_layer);
        mf_close(&m);
        return 1;
    }
    inspect_print(stdout, &m, &hp, &o);
    mf_close(&m);
    return 0;
}
