#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tools/logits_compare.h"
#include "cli.h"

int cmd_compare(int argc, char **argv) {
    const char *files[2] = {NULL, NULL};
    int nf = 0;
    double tol = 1e-3;
    int need_argmax = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf("usage: ringlm compare A.bin B.bin [--tol REL] [--argmax]\n\n"
                   "Compares two logits files. Passes (exit 0) when max|A-B| <= REL * max|A| (default 1e-3)\n"
                   "and, with --argmax, every row has the same argmax. Prints the figures either way.\n");
            return 0;
        } else if (strcmp(argv[i], "--tol") == 0 && i + 1 < argc) {
            char *end;
            tol = strtod(argv[++i], &end);
            if (*end || tol < 0) {
                fprintf(stderr, "ringlm compare: bad --tol '%s'\n", argv[i]);
                return 2;
            }
        } else if (strcmp(argv[i], "--argmax") == 0) {
            need_argmax = 1;
        } else if (argv[i][0] != '-' && nf < 2) {
            files[nf++] = argv[i];
        } else {
            fprintf(stderr, "ringlm compare: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    if (nf != 2) {
        fprintf(stderr, "usage: ringlm compare A.bin B.bin [--tol REL] [--argmax]\n");
        return 2;
    }
    lc_result r;
    rl_err err = {{0}};
    if (lc_compare_files(files[0], files[1], &r, &err) != 0) {
        fprintf(stderr, "ringlm compare: %s\n", err.msg);
        return 1;
    }
    int ok = r.nonfinite == 0 && r.rel <= tol && (!need_argmax || r.argmax_agree == r.n_rows);
    printf("rows %d vocab %d max_abs_diff %.3g max_abs_logit %.3g rel %.3g (tol %.3g) worst_row %d "
           "argmax_agree %d/%d nonfinite %d: %s\n",
           r.n_rows, r.n_vocab, r.max_abs_diff, r.max_abs_logit, r.rel, tol, r.worst_row, r.argmax_agree, r.n_rows,
           r.nonfinite, ok ? "PASS" : "FAIL");
    return ok ? 0 : 1;
}
