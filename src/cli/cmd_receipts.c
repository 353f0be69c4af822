/* ringlm receipts verify FILE --model MODEL.gguf --ring ring.conf [--key COORD]: parses, loads the ring's
 * keys and the model, and runs the offline verifier (trust/receipt_log.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "../gguf/model_file.h"
#include "../model/k3_hparams.h"
#include "../trust/manifest_file.h"
#include "../coord/coord.h"
#include "../trust/keys.h"
#include "../trust/receipt_log.h"
#include "cli.h"

static void receipts_usage(FILE *f) {
    fprintf(f,
            "usage: ringlm receipts verify FILE (--model MODEL.gguf | --manifest MODEL.manifest) --ring ring.conf\n"
            "                              [--key COORD.pub|COORD.key|HEX]\n\n"
            "--manifest: the model's manifest (ringlm manifest) instead of the model: the same checks, no weights.\n"
            "Checks a JSON-lines receipts log (one receipt per line, docs/receipts.md). Receipts are grouped into\n"
            "traversals by (request id, nonce); in each, every signature must verify, every signer must be a\n"
            "ring.conf node, the stages must follow ring.conf's order and cover the model's layers with no gap or\n"
            "overlap, each stage's output hash must be the next one's input hash, ring id and positions must agree,\n"
            "no nonce may appear in two traversals, and each manifest hash must match MODEL.gguf's layers.\n"
            "--key names the coordinator's public key: a receipt signed with it is reported as such.\n\n"
            "Prints \"ok: N traversals, M receipts verified\" and exits 0, or one line per problem on stderr\n"
            "and exits 1.\n");
}

static int parse_coord_key(uint8_t coord_pk[32], const char *arg, rl_err *err) {
    keys_peer p;
    char line[256] = {0};
    FILE *f = fopen(arg, "r");
    if (!f) {
        if (keys_peer_parse(&p, arg, err) != 0)
            return rl_err_prefix(err, "--key '%s' is neither a file nor a public key", arg);
    } else {
        bool ok = fgets(line, sizeof line, f) != NULL;
        fclose(f);
        if (ok && strncmp(line, "ringlm-key", 10) == 0) {
            keys_identity id;
            if (keys_load(&id, arg, err) != 0) return -1;
            memcpy(coord_pk, id.sign_pk, 32);
            sodium_memzero(&id, sizeof id);
            return 0;
        }
        line[strcspn(line, " \t\r\n")] = 0;
        if (keys_peer_parse(&p, line, err) != 0) return rl_err_prefix(err, "--key %s", arg);
    }
    memcpy(coord_pk, p.sign_pk, 32);
    return 0;
}

static int receipts_verify(int argc, char **argv) {
    const char *file = NULL, *model = NULL, *ring = NULL, *key = NULL, *manifest = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            receipts_usage(stdout);
            return 0;
        } else if ((strcmp(a, "--model") == 0 || strcmp(a, "-m") == 0) && val) {
            model = val, i++;
        } else if (strcmp(a, "--manifest") == 0 && val) {
            manifest = val, i++;
        } else if (strcmp(a, "--ring") == 0 && val) {
            ring = val, i++;
        } else if (strcmp(a, "--key") == 0 && val) {
            key = val, i++;
        } else if (a[0] != '-' && !file) {
            file = a;
        } else {
            fprintf(stderr, "ringlm receipts verify: unknown or incomplete option '%s'\n", a);
            receipts_usage(stderr);
            return 2;
        }
    }
    if (!file || !!model == !!manifest || !ring) {
        receipts_usage(stderr);
        return 2;
    }
    rl_err err = {{0}};
    ring_conf conf;
    uint8_t coord_pk[32];
    if (ring_conf_load(&conf, ring, &err) != 0 || (key && parse_coord_key(coord_pk, key, &err) != 0)) {
        fprintf(stderr, "ringlm receipts: %s\n", err.msg);
        return 1;
    }
    mf_model m;
    k3_hparams hp;
    manifest_file mf;
    memset(&m, 0, sizeof m);
    if (manifest ? manifest_file_read(&mf, manifest, &err) != 0 : k3_open(&m, &hp, model, &err) != 0) {
        fprintf(stderr, "ringlm receipts: %s\n", err.msg);
        return 1;
    }
    if (manifest && manifest_file_need_hashes(&mf, "verify receipts", &err) != 0) {
        fprintf(stderr, "ringlm receipts: %s\n", err.msg);
        manifest_file_free(&mf);
        return 1;
    }
    receipt_log_node nodes[PLAN_MAX_NODES];
    for (int i = 0; i < conf.n; i++) {
        memcpy(nodes[i].sign_pk, conf.nodes[i].key.sign_pk, 32);
        snprintf(nodes[i].addr, sizeof nodes[i].addr, "%s", conf.nodes[i].addr);
    }
    receipt_log_opts o = {.m = manifest ? NULL : &m, .hp = manifest ? NULL : &hp, .manifest = manifest ? &mf : NULL,
                   .nodes = nodes, .n_nodes = conf.n, .coord_pk = key ? coord_pk : NULL,
                   .problems = stderr};
    receipt_log_result r;
    int rc = receipt_log_verify(file, &o, &r, &err);
    if (manifest) manifest_file_free(&mf);
    else mf_close(&m);
    if (rc < 0) {
        fprintf(stderr, "ringlm receipts: %s\n", err.msg);
        return 1;
    }
    if (rc == 0) {
        printf("ok: %zu traversal%s, %zu receipt%s verified\n", r.traversals, r.traversals == 1 ? "" : "s",
               r.receipts, r.receipts == 1 ? "" : "s");
        return 0;
    }
    fprintf(stderr, "ringlm receipts: %ld problem%s: %ld of %zu traversals fail%s\n", r.problems,
            r.problems == 1 ? "" : "s", r.bad_traversals, r.traversals, r.bad_lines ? ", and some lines are not receipts" : "");
    return 1;
}

int cmd_receipts(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "verify") == 0) return receipts_verify(argc - 1, argv + 1);
    if (argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        receipts_usage(stdout);
        return 0;
    }
    receipts_usage(stderr);
    return 2;
}
