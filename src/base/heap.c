/* heap.c - the allocator's thresholds for computing processes (heap.h). */
#include "heap.h"

/* <stdlib.h> brings <features.h>, which defines __GLIBC__: without a C library header first, the test below
 * is always false and this function compiles to nothing (as it did when it was first written). */
#include <stdlib.h>

#ifdef __GLIBC__
#include <malloc.h>
#endif
#ifdef __linux__
#include <stdint.h>
#include <sys/mman.h>
#endif

void rl_heap_keep(void) {
#ifdef __GLIBC__
    (void)mallopt(M_MMAP_THRESHOLD, 32 << 20);
    (void)mallopt(M_TRIM_THRESHOLD, 512 << 20);
#endif
}

void rl_heap_advise_huge(void *p, size_t n) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    const uintptr_t huge = (uintptr_t)2 << 20, lo = ((uintptr_t)p + huge - 1) & ~(huge - 1),
                    hi = ((uintptr_t)p + n) & ~(huge - 1);
    if (p && hi > lo) (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE); /* advice: a refusal changes nothing */
#else
    (void)p;
    (void)n;
#endif
}

/* Mappings of 2 MiB and more are made a whole number of 2 MiB long: the kernel then places them on a 2 MiB
 * boundary (Linux 6.7 on), so all of one can be huge pages, not just its aligned middle. */
static size_t rl_heap_map_len(size_t n) {
    const size_t huge = (size_t)2 << 20;
    return n == 0 ? 1 : n < huge ? n : (n + huge - 1) / huge * huge;
}

void *rl_heap_map(size_t n) {
#if defined(__linux__)
    const size_t len = rl_heap_map_len(n);
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    rl_heap_advise_huge(p, len);
    return p;
#else
    return calloc(1, n ? n : 1);
#endif
}

void rl_heap_unmap(void *p, size_t n) {
    if (!p) return;
#if defined(__linux__)
    (void)munmap(p, rl_heap_map_len(n));
#else
    (void)n;
    free(p);
#endif
}
