/* test_heap - rl_heap_keep (src/base/heap.h) keeps a step's freed buffers in the process.
 *
 * The first version compiled to an empty function (its #ifdef __GLIBC__ came before any C library header),
 * and nothing noticed: ring nodes went on faulting their rollback buffers in for every sequence. This test
 * does what a node does between two sequences, buffers of a few MB allocated, touched and freed, and checks
 * that the second round takes its pages from the process (almost no page faults) and that the heap did not
 * shrink under the freed memory. glibc only, and not under a sanitizer (which brings its own allocator). */
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "base/heap.h"

#include "check.h"

#if defined(__SANITIZE_ADDRESS__)
#define HEAP_TEST_SKIP "a sanitizer's allocator"
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HEAP_TEST_SKIP "a sanitizer's allocator"
#endif
#endif
#if !defined(HEAP_TEST_SKIP) && !defined(__GLIBC__)
#define HEAP_TEST_SKIP "not glibc"
#endif

#ifndef HEAP_TEST_SKIP
#include <malloc.h>

enum { N_BUF = 24, BUF_BYTES = 6 << 20 }; /* 144 MiB in blocks below the 32 MiB mapping threshold */

static long minor_faults(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_minflt;
}

/* Allocates, touches and frees N_BUF buffers (a rollback block's per-layer copies); returns the faults. */
static long one_round(void) {
    void *p[N_BUF];
    long f0 = minor_faults();
    for (int i = 0; i < N_BUF; i++) {
        p[i] = malloc(BUF_BYTES);
        if (p[i]) memset(p[i], i + 1, BUF_BYTES);
    }
    long f = minor_faults() - f0;
    for (int i = N_BUF - 1; i >= 0; i--) free(p[i]); /* from the top: what glibc would hand back at once */
    return f;
}
#endif

int main(void) {
#ifdef HEAP_TEST_SKIP
    rl_heap_keep();
    CHECK(1, "# SKIP rl_heap_keep: %s", HEAP_TEST_SKIP);
#else
    rl_heap_keep();
    const long pages = (long)N_BUF * BUF_BYTES / 4096;
    long first = one_round();
    struct mallinfo2 mi = mallinfo2();
    long second = one_round();
    /* The first round faults every page in (about `pages`); with the heap kept the second faults almost none.
     * Without rl_heap_keep glibc trims the top and the second round faults as many as the first. */
    CHECK(first > pages / 2, "the first round faults its pages in (%ld faults, %ld pages)", first, pages);
    CHECK(second < pages / 20, "the second round reuses them (%ld faults of %ld pages)", second, pages);
    CHECK(mi.arena >= (size_t)N_BUF * BUF_BYTES, "the heap keeps the freed %d MiB (%zu MiB in the arena)",
          N_BUF * (BUF_BYTES >> 20), mi.arena >> 20);
#endif
    return check_done();
}
