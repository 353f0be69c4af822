/* test_heap - rl_heap_keep (src/base/heap.h) keeps a step's freed buffers in the process; rl_heap_map gives
 * blocks that fault in by the 2 MiB page where the kernel gives huge pages on request.
 *
 * The first version compiled to an empty function (its #ifdef __GLIBC__ came before any C library header),
 * and nothing noticed: ring nodes went on faulting their rollback buffers in for every sequence. This test
 * does what a node does between two sequences, buffers of a few MB allocated, touched and freed, and checks
 * that the second round takes its pages from the process (almost no page faults) and that the heap did not
 * shrink under the freed memory. glibc only, and not under a sanitizer (which brings its own allocator). */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "base/heap.h"

#include "check.h"

#if defined(__SANITIZE_ADDRESS__)
#define HEAP_TEST_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HEAP_TEST_SANITIZER 1
#endif
#endif
#ifdef HEAP_TEST_SANITIZER
#define HEAP_TEST_SKIP "a sanitizer's allocator"
#endif
#if !defined(HEAP_TEST_SKIP) && !defined(__GLIBC__)
#define HEAP_TEST_SKIP "not glibc"
#endif

static long minor_faults(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_minflt;
}

#ifndef HEAP_TEST_SKIP
#include <malloc.h>

enum { N_BUF = 24, BUF_BYTES = 6 << 20 }; /* 144 MiB in blocks below the 32 MiB mapping threshold */

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

/* The kernel's THP mode: the word in brackets of /sys/kernel/mm/transparent_hugepage/enabled ("" if none). */
static void thp_mode(char *mode, size_t cap) {
    mode[0] = 0;
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    char line[128] = "";
    if (!f) return;
    if (!fgets(line, sizeof line, f)) line[0] = 0;
    fclose(f);
    char *a = strchr(line, '['), *b = a ? strchr(a, ']') : NULL;
    if (a && b && (size_t)(b - a - 1) < cap) {
        memcpy(mode, a + 1, (size_t)(b - a - 1));
        mode[b - a - 1] = 0;
    }
}

/* rl_heap_map: zeroed, writable, a whole 2 MiB multiple mapped (the length rounded up), and, where THP is
 * "madvise" or "always", faulted in huge pages: 10 MiB and a bit in far fewer faults than its 4 KiB pages.
 * Under "madvise" (Debian's default) the same block taken from malloc without the advice faults every page. */
static void test_map(void) {
    const size_t n = (10u << 20) + 12345;
    long f0 = minor_faults();
    unsigned char *p = rl_heap_map(n);
    CHECK(p != NULL, "rl_heap_map gives %zu bytes", n);
    if (!p) return;
    size_t nonzero = 0;
    for (size_t i = 0; i < n; i += 4096) nonzero += p[i] != 0;
    memset(p, 0xab, n);
    p[(12u << 20) - 1] = 1; /* the rounded-up tail is part of the mapping */
    long faults = minor_faults() - f0;
    CHECK(nonzero == 0, "the block comes zeroed (%zu pages were not)", nonzero);
    char mode[32];
    thp_mode(mode, sizeof mode);
#ifdef HEAP_TEST_SANITIZER
    const bool counted = false; /* its checks of every write fault its shadow memory in, page by page */
#else
    const bool counted = true;
#endif
    /* qemu-user (tests/t_arm64.sh runs this under it and says so) takes madvise as a no-op and faults the
     * guest's pages in itself. */
    const char *emu = getenv("RINGLM_EMULATED");
    if (!counted) {
        SKIP("huge pages: a sanitizer's shadow memory faults too");
    } else if (emu && *emu) {
        SKIP("huge pages: run under %s, which ignores madvise", emu);
    } else if (strcmp(mode, "madvise") == 0 || strcmp(mode, "always") == 0) {
        CHECK(faults < (long)(n / 4096) / 8, "THP '%s': %zu bytes faulted in by huge pages (%ld faults, %zu small pages)",
              mode, n, faults, n / 4096);
    } else {
        SKIP("huge pages: THP mode '%s'", mode);
    }
    rl_heap_unmap(p, n);
    rl_heap_unmap(NULL, 0); /* nothing to do */
    rl_heap_advise_huge(NULL, 1 << 22);       /* advice on nothing: no effect, no crash */
    rl_heap_advise_huge((void *)(uintptr_t)4096, 4096); /* shorter than a huge page: left alone */
}

int main(void) {
    test_map();
#ifdef HEAP_TEST_SKIP
    rl_heap_keep();
    SKIP("rl_heap_keep: %s", HEAP_TEST_SKIP);
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
