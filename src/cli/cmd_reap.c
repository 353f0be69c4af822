#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../model/k3_forward.h"
#include "../prune/reap_job.h"
#include "../coord/coord.h"
#include "cli.h"

static void reap_usage(FILE *f) {
    fprintf(f,
            "usage: ringlm reap -m MODEL.gguf --calib FILE[,FILE...] (--keep N | --prune FRACTION) -o OUT.gguf\n"
            "                   [--tokens N] [--ctx N] [--chunk N] [--protect LIST] [--frequency] [--scores FILE.json]\n"
            "                   [--report FILE.md --eval FILE[,FILE...]] [--split N] [--threads N] [--no-progress]\n"
            "                   [--ring ring.conf --key coord.key]\n"
            "       ringlm reap -m MODEL.gguf --scores FILE.json (--keep N | --prune FRACTION) -o OUT.gguf ...\n\n"
            "Prunes routed experts by REAP saliency (docs/reap.md): each expert's mean, over the calibration tokens\n"
            "routed to it, of its gate weight times the norm of its output; the lowest-scoring experts of every MoE\n"
            "layer go, the same number per layer. Quantized blocks are copied as they are.\n\n"
            "  --calib FILES     plain text, or JSONL ({\"text\": ...} or {\"messages\": [...]} rendered with the\n"
            "                    model's chat template); --tokens N caps them (default: all)\n"
            "  --keep N          experts kept per MoE layer (at least the router's top-k)\n"
            "  --prune F         fraction of experts pruned, in (0, 1)\n"
            "  --ctx N           calibration sequence length (default 512); --chunk N tokens per pass (default 512)\n"
            "  --protect LIST    experts never pruned: EXPERT (every layer) or LAYER:EXPERT, comma-separated\n"
            "  --frequency       frequency-weighted saliency: the sum instead of the mean\n"
            "  --scores FILE     with --calib, write every layer's per-expert scores and counts (JSON);\n"
            "                    without, prune from that file instead of calibrating\n"
            "  --report FILE     top-1 agreement, mean KL and perplexity of the pruned model against the\n"
            "                    unpruned one on held-out text (--eval), at the chosen ratio and 0/25/50/75%%\n"
            "  --ring R --key K  score through a ring (ring.conf, the coordinator's key): each stage scores its\n"
            "                    own layers as the text flows through; the same scores as one machine\n"
            "  --split N         write OUT as N files (default: as many as the input)\n"
            "  --threads N, --no-repack, --flash-attn on|off|auto, --cache-type f32|f16: as for run\n");
}

/* Scoring through a ring (--ring): the job's reap_score_fn. */
typedef struct reap_ring {
    const char *conf_path, *key_path, *model;
    uint32_t ctx;
    bool progress;
    char where[64];
} reap_ring;

static int reap_ring_score(void *ctx, const calib_set *c, uint32_t chunk, reap_stats *s, rl_err *err) {
    reap_ring *r = ctx;
    ring_conf conf;
    keys_identity id;
    mf_model m;
    k3_hparams hp;
    ring_coord ring;
    if (ring_conf_load(&conf, r->conf_path, err) != 0 || keys_load(&id, r->key_path, err) != 0) return -1;
    if (k3_open(&m, &hp, r->model, err) != 0) return -1;
    ring_opts ro = ring_opts_default();
    ro.n_ctx = (r->ctx + 255u) / 256u * 256u;
    ro.quiet = !r->progress;
    int rc = ring_open(&ring, &conf, &id, &m, &hp, &ro, err);
    if (rc == 0) {
        rc = ring_reap_score(&ring, c, chunk, s, r->progress, err);
        ring_close(&ring);
    }
    mf_close(&m);
    return rc;
}

/* Splits s ("a,b,c", a writable copy the pointers then point into) into up to max pointers appended to v. */
static int reap_list(char *s, const char **v, int *n, int max) {
    for (char *p = strtok(s, ","); p; p = strtok(NULL, ",")) {
        if (*n == max) return -1;
        v[(*n)++] = p;
    }
    return 0;
}

int cmd_reap(int argc, char **argv) {
    reap_job j;
    memset(&j, 0, sizeof j);
    j.ctx = 512;
    j.chunk = 512;
    j.progress = isatty(2);
    j.eng.n_threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    const char *calib[64], *eval[64];
    char *copies[128];
    int n_copies = 0, n_calib = 0, n_eval = 0, rc = 2;
    const char *scores = NULL, *ring_path = NULL, *key_path = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        const char *want = NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            reap_usage(stdout);
            rc = 0;
            goto out;
        } else if (strcmp(a, "--frequency") == 0) {
            j.freq = true;
            continue;
        } else if (strcmp(a, "--no-progress") == 0) {
            j.progress = false;
            continue;
        } else if (strcmp(a, "--progress") == 0) {
            j.progress = true;
            continue;
        } else if (cli_engine_flag(a, &j.eng)) {
            continue;
        }
        if (!v) {
            static const char *const valued[] = {"-m", "--model", "-o", "--output", "--calib", "--eval", "--scores",
                                                 "--report", "--protect", "--keep", "--prune", "--tokens", "--ctx",
                                                 "--chunk", "--split", "--threads", "--flash-attn", "--cache-type",
                                                 "--ring", "--key"};
            bool known = false;
            for (size_t k = 0; k < sizeof valued / sizeof *valued; k++) known |= strcmp(a, valued[k]) == 0;
            cli_bad_option("reap", a, NULL, known, NULL);
            goto out;
        }
        i++;
        int x = 0;
        if (strcmp(a, "-m") == 0 || strcmp(a, "--model") == 0) {
            j.model = v;
        } else if (strcmp(a, "-o") == 0 || strcmp(a, "--output") == 0) {
            j.out = v;
        } else if (strcmp(a, "--calib") == 0 || strcmp(a, "--eval") == 0) {
            if (n_copies == 128 || !(copies[n_copies] = strdup(v))) goto out;
            int *n = a[2] == 'c' ? &n_calib : &n_eval;
            bad = reap_list(copies[n_copies++], a[2] == 'c' ? calib : eval, n, 64) != 0, want = "at most 64 files";
        } else if (strcmp(a, "--ring") == 0) {
            ring_path = v;
        } else if (strcmp(a, "--key") == 0) {
            key_path = v;
        } else if (strcmp(a, "--scores") == 0) {
            scores = v;
        } else if (strcmp(a, "--report") == 0) {
            j.report = v;
        } else if (strcmp(a, "--protect") == 0) {
            j.protect = v;
        } else if (strcmp(a, "--keep") == 0) {
            bad = cli_parse_int(v, &x) != 0 || x < 1, want = "a number of experts";
            j.keep = (uint32_t)x;
        } else if (strcmp(a, "--prune") == 0) {
            char *end;
            j.prune = strtod(v, &end);
            bad = *end != 0 || !(j.prune > 0 && j.prune < 1), want = "a fraction in (0, 1)";
        } else if (strcmp(a, "--tokens") == 0) {
            bad = cli_parse_int(v, &x) != 0 || x < 1, want = "a number of tokens";
            j.max_tokens = (size_t)x;
        } else if (strcmp(a, "--ctx") == 0 || strcmp(a, "--chunk") == 0) {
            bad = cli_parse_int(v, &x) != 0 || x < 2 || x > 1 << 20, want = "2 to 1048576 tokens";
            if (a[2] == 'c' && a[3] == 't') j.ctx = (uint32_t)x;
            else j.chunk = (uint32_t)x;
        } else if (strcmp(a, "--split") == 0) {
            bad = cli_parse_int(v, &j.n_split) != 0 || j.n_split < 1 || j.n_split > 9999, want = "1 to 9999 files";
        } else if (strcmp(a, "--threads") == 0) {
            bad = cli_parse_int(v, &j.eng.n_threads) != 0 || j.eng.n_threads < 1, want = "a thread count";
        } else if (!cli_parse_engine(a, v, &j.eng, &bad, &want)) {
            cli_bad_option("reap", a, v, false, NULL);
            goto out;
        }
        if (bad) {
            cli_bad_option("reap", a, v, true, want);
            goto out;
        }
    }
    if (!j.model) {
        fprintf(stderr, "ringlm reap: -m MODEL.gguf is required\n");
        reap_usage(stderr);
        goto out;
    }
    j.calib = calib;
    j.n_calib = n_calib;
    j.eval = eval;
    j.n_eval = n_eval;
    if (n_calib > 0) j.scores_out = scores;
    else j.scores_in = scores;
    reap_ring rr = {.conf_path = ring_path, .key_path = key_path, .model = j.model, .ctx = j.ctx, .progress = j.progress};
    if (ring_path) {
        if (!key_path) {
            fprintf(stderr, "ringlm reap: --ring needs --key (the coordinator's identity)\n");
            goto out;
        }
        j.score = reap_ring_score;
        j.score_ctx = &rr;
        snprintf(rr.where, sizeof rr.where, "the ring of %s", ring_path);
        j.where = rr.where;
    }
    rl_err err = {0};
    rc = reap_job_run(&j, &err) == 0 ? 0 : 1;
    if (rc != 0) fprintf(stderr, "ringlm reap: %s\n", err.msg);
out:
    for (int i = 0; i < n_copies; i++) free(copies[i]);
    return rc;
}
