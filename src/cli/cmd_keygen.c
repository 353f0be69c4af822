#include <stdio.h>
#include <string.h>

#include "../trust/keys.h"
#include "cli.h"

int cmd_keygen(int argc, char **argv) {
    const char *out = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-o") == 0 && i + 1 < argc) {
            out = argv[++i];
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf("usage: ringlm keygen -o FILE.key\n\nMakes a node or coordinator identity (Ed25519, libsodium), "
                   "writes it with mode 0600\nand prints its public key in hex on stdout.\n");
            return 0;
        } else {
            fprintf(stderr, "ringlm keygen: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!out) {
        fprintf(stderr, "usage: ringlm keygen -o FILE.key\n");
        return 2;
    }
    keys_identity id;
    rl_err err = {{0}};
    if (keys_generate(&id, &err) != 0 || keys_save(&id, out, &err) != 0) {
        fprintf(stderr, "ringlm keygen: %s\n", err.msg);
        return 1;
    }
    printf("%s\n", id.pk_hex);
    return 0;
}
