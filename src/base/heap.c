/* heap.c - the allocator's thresholds for computing processes (heap.h). */
#include "heap.h"

/* <stdlib.h> brings <features.h>, which defines __GLIBC__: without a C library header first, the test below
 * is always false and this function compiles to nothing (as it did when it was first written). */
#include <stdlib.h>

#ifdef __GLIBC__
#include <malloc.h>
#endif

void rl_heap_keep(void) {
#ifdef __GLIBC__
    (void)mallopt(M_MMAP_THRESHOLD, 32 << 20);
    (void)mallopt(M_TRIM_THRESHOLD, 512 << 20);
#endif
}
