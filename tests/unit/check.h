/* check.h - the unit tests' TAP-style check: prints "ok - …" or "not ok - …" and counts; check_done()
 * prints the tally and gives main's exit status. Header-only: each unit test is one program. */
#ifndef RINGLM_TEST_CHECK_H
#define RINGLM_TEST_CHECK_H

#include <stdio.h>

static int n_fail, n_pass;

#define CHECK(cond, ...)                                                                                              \
    do {                                                                                                              \
        if (cond) {                                                                                                   \
            n_pass++;                                                                                                 \
            printf("ok - ");                                                                                          \
        } else {                                                                                                      \
            n_fail++;                                                                                                 \
            printf("not ok - ");                                                                                      \
        }                                                                                                             \
        printf(__VA_ARGS__);                                                                                          \
        printf("\n");                                                                                                 \
    } while (0)

static inline int check_done(void) {
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}

#endif
