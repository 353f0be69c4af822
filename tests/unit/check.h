/* check.h - the unit tests' TAP-style check: prints "ok - …" or "not ok - …" and counts; check_done()
 * prints the tally and gives main's exit status. Header-only: each unit test is one program.
 *
 * SKIP(…) is for a check this machine cannot make (no huge pages, a sanitizer's allocator): it prints TAP's
 * "ok - # SKIP …" and counts apart, so the tally says what was not tested instead of passing it. */
#ifndef RINGLM_TEST_CHECK_H
#define RINGLM_TEST_CHECK_H

#include <stdio.h>

static int n_fail, n_pass, n_skip;

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

#define SKIP(...)                                                                                                     \
    do {                                                                                                              \
        n_skip++;                                                                                                     \
        printf("ok - # SKIP ");                                                                                       \
        printf(__VA_ARGS__);                                                                                          \
        printf("\n");                                                                                                 \
    } while (0)

/* A skip fails nothing (the machine is not at fault), but ", N skipped" keeps it out of "passed". */
static inline int check_done(void) {
    if (n_skip)
        printf("%d passed, %d failed, %d skipped\n", n_pass, n_fail, n_skip);
    else
        printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}

#endif
