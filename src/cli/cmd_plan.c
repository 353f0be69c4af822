#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../model/k3_hparams.h"
#include <cJSON.h>

#include "../coord/coord.h"
#include "../plan/plan_nodes.h"
#include "../coord/target.h"
#include "cli.h"

static void plan_usage(FILE *f) {
    fprintf(f, "usage: ringlm plan (-m MODEL.gguf | --manifest MODEL.manifest) --ring ring.conf --key coord.key\n"
               "                   [--ctx N] [--parallel N] [--relay-listen HOST:PORT (its nodes behind NATs dial there)]\n"
               "       ringlm plan (-m MODEL.gguf | --manifest MODEL.manifest) --nodes nodes.conf [--ctx N] [--parallel N]\n"
               "                   [--prompt N] [--chunk N] [--acceptance A [--draft-n K] [--draft DRAFT.gguf]\n"
               "                   [--draft-depth D]] [--json]\n"
               "       ringlm plan --devices\n\n"
               "--nodes: a ring that does not exist yet, of machines described by their figures (nodes.conf: node,\n"
               "delay and coordinator lines; src/plan/nodes_conf.h, docs/plan.md): chooses the ring order with the\n"
               "shortest round trip, cuts the layers, and predicts decode tok/s (greedy, and speculative at acceptance\n"
               "A with K drafted, chosen when not given, up to D blocks in flight as run --ring's --draft-depth, default 2;\n"
               "with --draft, drafting on the coordinator is counted), time to first token of an N-token prompt,\n"
               "aggregate tok/s of --parallel streams and the network floor, saying which term dominates.\n"
               "--devices lists the catalog of devices nodes.conf may name.\n\n"
               "--ring:\n"
               "Asks the ring's nodes for what they offer (memory, speed, the files they hold), makes the plan that\n"
               "run --ring and serve --ring would make, prints it, and stops: nothing is loaded. With --manifest it\n"
               "also says, per stage, which split files its range needs and which of them its node lacks (what to\n"
               "download into that node's --models; a ring starts without them too, streaming them from nodes that\n"
               "hold them). --ctx and --parallel: the context and sequences each node must hold state for\n"
               "(defaults 4096 and 1).\n");
}

int cmd_plan(int argc, char **argv) {
    const char *model = NULL, *manifest = NULL, *ring_path = NULL, *key_path = NULL, *nodes_path = NULL, *draft = NULL;
    const char *relay_listen = NULL;
    int ctx = 4096, parallel = 1, prompt = 512, chunk = 256, draft_n = 0, draft_depth = 2;
    double acceptance = 0;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            plan_usage(stdout);
            return 0;
        }
        if (strcmp(a, "--devices") == 0) {
            nodes_conf_print_catalog(stdout);
            return 0;
        }
        if (strcmp(a, "--json") == 0) {
            json = true;
            continue;
        }
        if (!v) return cli_bad_option("plan", a, NULL, a[0] == '-', NULL);
        i++;
        if (strcmp(a, "-m") == 0) model = v;
        else if (strcmp(a, "--manifest") == 0) manifest = v;
        else if (strcmp(a, "--ring") == 0) ring_path = v;
        else if (strcmp(a, "--key") == 0) key_path = v;
        else if (strcmp(a, "--relay-listen") == 0) relay_listen = v;
        else if (strcmp(a, "--nodes") == 0) nodes_path = v;
        else if (strcmp(a, "--draft") == 0) draft = v;
        else if (strcmp(a, "--prompt") == 0) {
            if (cli_parse_int(v, &prompt) != 0 || prompt < 1) return cli_bad_option("plan", a, v, true, "a number of tokens, at least 1");
        } else if (strcmp(a, "--chunk") == 0) {
            if (cli_parse_int(v, &chunk) != 0 || chunk < 1) return cli_bad_option("plan", a, v, true, "a number of tokens, at least 1");
        } else if (strcmp(a, "--draft-n") == 0) {
            if (cli_parse_int(v, &draft_n) != 0 || draft_n < 1 || draft_n > 16) return cli_bad_option("plan", a, v, true, "1 to 16 tokens");
        } else if (strcmp(a, "--draft-depth") == 0) {
            if (cli_parse_int(v, &draft_depth) != 0 || draft_depth < 1 || draft_depth > 8) return cli_bad_option("plan", a, v, true, "1 to 8 blocks in flight");
        } else if (strcmp(a, "--acceptance") == 0) {
            char *end;
            acceptance = strtod(v, &end);
            if (end == v || *end || !(acceptance > 0 && acceptance < 1)) return cli_bad_option("plan", a, v, true, "a probability between 0 and 1");
        }
        else if (strcmp(a, "--ctx") == 0) {
            if (cli_parse_int(v, &ctx) != 0 || ctx < 8) return cli_bad_option("plan", a, v, true, "a number of tokens, at least 8");
        } else if (strcmp(a, "--parallel") == 0) {
            if (cli_parse_int(v, &parallel) != 0 || parallel < 1) return cli_bad_option("plan", a, v, true, "a number, at least 1");
        } else {
            return cli_bad_option("plan", a, v, false, NULL);
        }
    }
    if (!model == !manifest || (nodes_path ? (ring_path || key_path) : (!ring_path || !key_path))) {
        fprintf(stderr, "ringlm plan: one of -m MODEL or --manifest FILE, and either --nodes or --ring and --key, are "
                        "required\n");
        plan_usage(stderr);
        return 2;
    }
    if (draft && (!nodes_path || acceptance <= 0)) {
        fprintf(stderr, "ringlm plan: --draft prices speculation: it needs --nodes and --acceptance\n");
        return 2;
    }
    rl_err err = {{0}};
    if (nodes_path) {
        mf_model m;
        k3_hparams hp;
        manifest_file mf;
        static nodes_conf_file nc;    /* (large: off the stack) */
        static plan_nodes_result pr;
        predict_opts po = {.prompt = (uint32_t)prompt, .chunk = (uint32_t)chunk, .parallel = (uint32_t)parallel,
                      .draft_k = draft_n, .acceptance = acceptance, .draft_depth = draft_depth};
        int rc = 1;
        if (ring_target_open(model, manifest, &m, &hp, &mf, &err) == 0) {
            mf_model dm;
            int drc = 0;
            if (draft && (drc = mf_open(&dm, draft, &err)) == 0) {
                if ((drc = predict_draft_read(&po.draft, &dm, &m, &err)) != 0) rl_err_prefix(&err, "%s", draft);
                mf_close(&dm);
            }
            if (drc != 0) {
                ring_target_close(&m, &mf);
                fprintf(stderr, "ringlm plan: %s\n", err.msg);
                return 1;
            }
            if (nodes_conf_load(&nc, nodes_path, &err) == 0 && plan_nodes_plan(&m, &hp, &nc, (uint32_t)ctx, &po, &pr, &err) == 0) {
                if (json) {
                    cJSON *j = plan_nodes_json(&pr, &nc, &po);
                    char *js = j ? cJSON_Print(j) : NULL;
                    if (js) printf("%s\n", js), rc = 0;
                    else rl_errf(&err, "out of memory");
                    free(js);
                    cJSON_Delete(j);
                } else {
                    plan_nodes_print(&pr, &nc, &po, stdout);
                    rc = 0;
                }
            }
            ring_target_close(&m, &mf);
        }
        if (rc != 0) fprintf(stderr, "ringlm plan: %s\n", err.msg);
        return rc;
    }
    mf_model m;
    k3_hparams hp;
    manifest_file mf;
    ring_conf conf;
    keys_identity id;
    ring_coord rc;
    int rc_ = 1;
    if (ring_target_open(model, manifest, &m, &hp, &mf, &err) != 0) goto out_noclose;
    ring_relay relay = {0}; /* ring.conf's nodes behind NATs that dial this coordinator's relay */
    if (ring_conf_load(&conf, ring_path, &err) != 0 || keys_load(&id, key_path, &err) != 0 ||
        ring_relay_start(&relay, relay_listen, &conf, &id, &err) != 0)
        goto out;
    ring_opts o = ring_opts_default();
    o.relay_addr = ring_relay_addr(&relay);
    o.n_ctx = (uint32_t)ctx;
    o.n_seqs = parallel;
    o.manifest = manifest ? &mf : NULL;
    o.manifest_path = manifest;
    o.plan_only = true;
    if (acceptance > 0 && draft_n > 0) { /* the rollback copies of speculative blocks (plan_nodes_plan's) */
        o.spec_block = (uint32_t)draft_n + 1;
        o.spec_depth = draft_depth;
    }
    if (ring_open(&rc, &conf, &id, &m, &hp, &o, &err) != 0) goto out;
    ring_close(&rc);
    rc_ = 0;
out:
    ring_relay_stop(&relay);
    ring_target_close(&m, &mf);
out_noclose:
    if (rc_ != 0) fprintf(stderr, "ringlm plan: %s\n", err.msg);
    return rc_;
}
