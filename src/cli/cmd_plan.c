#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../model/k3_hparams.h"
#include "../ring/coord.h"
#include "cli.h"

static void plan_usage(FILE *f) {
    fprintf(f, "usage: ringlm plan (-m MODEL.gguf | --manifest MODEL.manifest) --ring ring.conf --key coord.key\n"
               "                   [--ctx N] [--parallel N]\n\n"
               "Asks the ring's nodes for what they offer (memory, speed, the files they hold), makes the plan that\n"
               "run --ring and serve --ring would make, prints it, and stops: nothing is loaded. With --manifest it\n"
               "also says, per stage, which split files its range needs and which of them its node lacks (what to\n"
               "download into that node's --models; a ring starts without them too, streaming them from nodes that\n"
               "hold them). --ctx and --parallel: the context and sequences each node must hold state for\n"
               "(defaults 4096 and 1).\n");
}

int cmd_plan(int argc, char **argv) {
    const char *model = NULL, *manifest = NULL, *ring_path = NULL, *key_path = NULL;
    int ctx = 4096, parallel = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            plan_usage(stdout);
            return 0;
        }
        if (!v) return cli_bad_option("plan", a, NULL, a[0] == '-', NULL);
        i++;
        if (strcmp(a, "-m") == 0) model = v;
        else if (strcmp(a, "--manifest") == 0) manifest = v;
        else if (strcmp(a, "--ring") == 0) ring_path = v;
        else if (strcmp(a, "--key") == 0) key_path = v;
        else if (strcmp(a, "--ctx") == 0) {
            if (cli_parse_int(v, &ctx) != 0 || ctx < 8) return cli_bad_option("plan", a, v, true, "a number of tokens, at least 8");
        } else if (strcmp(a, "--parallel") == 0) {
            if (cli_parse_int(v, &parallel) != 0 || parallel < 1) return cli_bad_option("plan", a, v, true, "a number, at least 1");
        } else {
            return cli_bad_option("plan", a, v, false, NULL);
        }
    }
    if (!model == !manifest || !ring_path || !key_path) {
        fprintf(stderr, "ringlm plan: one of -m MODEL or --manifest FILE, and --ring and --key, are required\n");
        plan_usage(stderr);
        return 2;
    }
    rl_err err = {{0}};
    mf_model m;
    k3_hparams hp;
    mfst_file mf;
    ring_conf conf;
    rk_identity id;
    ring_coord rc;
    int rc_ = 1;
    if (cli_open_target(model, manifest, &m, &hp, &mf, &err) != 0) goto out_noclose;
    if (ring_conf_load(&conf, ring_path, &err) != 0 || rk_load(&id, key_path, &err) != 0) goto out;
    ring_opts o = ring_opts_default();
    o.n_ctx = (uint32_t)ctx;
    o.n_seqs = parallel;
    o.manifest = manifest ? &mf : NULL;
    o.manifest_path = manifest;
    o.plan_only = true;
    if (ring_open(&rc, &conf, &id, &m, &hp, &o, &err) != 0) goto out;
    ring_close(&rc);
    rc_ = 0;
out:
    cli_close_target(&m, &mf);
out_noclose:
    if (rc_ != 0) fprintf(stderr, "ringlm plan: %s\n", err.msg);
    return rc_;
}
