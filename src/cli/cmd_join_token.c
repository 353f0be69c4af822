/* `ringlm join-token`: a one-line join for a node behind a NAT (trust/join_token.h, docs/ring.md). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../trust/join_token.h"
#include "../trust/keys.h"
#include "cli.h"

static void jt_usage(FILE *f) {
    fprintf(f, "usage: ringlm join-token --key coord.key --relay HOST:PORT [--ttl HOURS] [--append ring.conf]\n\n"
               "Makes a token for a new node behind a NAT: it carries a fresh node key, the relay the node dials out\n"
               "to (this coordinator's --relay-listen address as the node reaches it, or a public node's relay) and\n"
               "this coordinator's key, signed with it, good for --ttl hours (default 24) to start a node with. Prints\n"
               "the token on stdout and the node's ring.conf line on stderr; --append adds that line to ring.conf.\n"
               "On the node: ringlm node --join TOKEN --models DIR. The token holds the node's secret key: send it\n"
               "as you would a password.\n");
}

int cmd_join_token(int argc, char **argv) {
    const char *key = NULL, *relay = NULL, *append = NULL;
    double ttl_h = 24;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            jt_usage(stdout);
            return 0;
        }
        if (!v) return cli_bad_option("join-token", a, NULL, !strcmp(a, "--key") || !strcmp(a, "--relay") ||
                                                              !strcmp(a, "--ttl") || !strcmp(a, "--append"), NULL);
        i++;
        if (strcmp(a, "--key") == 0) key = v;
        else if (strcmp(a, "--relay") == 0) relay = v;
        else if (strcmp(a, "--append") == 0) append = v;
        else if (strcmp(a, "--ttl") == 0) {
            if (cli_parse_double(v, &ttl_h) != 0 || !(ttl_h > 0 && ttl_h <= 24 * 365))
                return cli_bad_option("join-token", a, v, true, "hours, above 0, at most a year");
        } else {
            return cli_bad_option("join-token", a, v, false, NULL);
        }
    }
    if (!key || !relay) {
        jt_usage(stderr);
        return 2;
    }
    keys_identity coord, node;
    jt_token t;
    char text[600];
    rl_err err = {{0}};
    if (keys_load(&coord, key, &err) != 0 || jt_make(&coord, relay, ttl_h * 3600, &t, text, sizeof text, &err) != 0 ||
        keys_from_seed(&node, t.seed, &err) != 0) {
        fprintf(stderr, "ringlm join-token: %s\n", err.msg);
        return 1;
    }
    char line[300];
    snprintf(line, sizeof line, "relay:%s %s", relay, node.pk_hex);
    if (append) {
        FILE *f = fopen(append, "a");
        if (!f || fprintf(f, "%s\n", line) < 0 || fclose(f) != 0) {
            fprintf(stderr, "ringlm join-token: cannot append to %s\n", append);
            return 1;
        }
        fprintf(stderr, "ringlm join-token: added to %s: %s\n", append, line);
    } else {
        fprintf(stderr, "ringlm join-token: the node's line for ring.conf: %s\n", line);
    }
    printf("%s\n", text);
    return 0;
}
