/* heap.c - the allocator's thresholds for computing processes (heap.h). */
#include "heap.h"

#ifdef __GLIBC__
#include <malloc.h>
#endif

void rl_heap_keep(void) {
#ifdef __GLIBC__
    (void)mallopt(M_MMAP_THRESHOLD, 32 << 20);
    (void)mallopt(M_TRIM_THRESHOLD, 512 << 20);
#endif
}
