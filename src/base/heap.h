/* heap.h - how the C library's allocator keeps freed memory, for the processes that compute.
 *
 * A forward pass allocates buffers of a few MB to a few hundred MB that live for one step (outputs,
 * rollback staging, the graph's host copies) and frees them at its end. glibc's defaults hand memory above
 * 128 KiB back to the kernel as soon as it is freed at the top of the heap (and map larger blocks of their
 * own), so the next step faults every page in again, zeroed. On a paravirtualized VM a page fault costs
 * several microseconds (16 on this project's 2-vCPU VM): a ring node's 5-token verification frames took
 * 130-230 ms instead of 65-90 while a sequence's rollback buffers (30 MB a block there) were first touched,
 * and again for every sequence, since freeing them handed the pages back. rl_heap_keep raises both
 * thresholds so that a step's buffers stay in the process for the next one: resident memory then stays at
 * its peak instead of falling between steps, which is why a memory-capped run (--mem) does not call it. */
#ifndef RINGLM_HEAP_H
#define RINGLM_HEAP_H

#include <stddef.h>

/* Keep up to 512 MiB of freed memory at the top of the heap and map only blocks of 32 MiB and more
 * separately (glibc's largest threshold); does nothing on another C library. */
void rl_heap_keep(void);

/* Asks the kernel to back the 2 MiB-aligned part of [p, p + n) with transparent huge pages when it is first
 * touched (madvise MADV_HUGEPAGE; Debian's default THP mode, "madvise", gives them only where asked). Why:
 * a page fault costs 16 us on this project's VM, and a buffer of weights repacked at load, a sequence's
 * state or a step's compute memory is touched page by page the first time: 4 KiB pages made loading
 * `medium` with its twin draft take 13 s instead of 7, and a speculative run's first passes twice as long
 * as later ones. One fault per 2 MiB instead of 512. The buffers given are written whole, so no memory
 * is wasted; a region shorter than 2 MiB is left alone. Advice only: nothing happens where the kernel or
 * the C library cannot, and nothing fails. */
void rl_heap_advise_huge(void *p, size_t n);

/* A zeroed block of n bytes in a mapping of its own, advised as above; NULL when out of memory. Why not
 * malloc and advise: a block carved from the heap lands on 2 MiB ranges that earlier allocations touched
 * in part, and a range with any page present faults its other pages in one by one, advised or not
 * (measured: rollback buffers from the heap took 4 KiB faults throughout). The cost: unmapped when freed,
 * so a ring node's next sequence has its rollback blocks zeroed again by the kernel (16-20 ms for 48 MiB on
 * this VM, where a reused heap block cost ~2 ms), against the 4 KiB faults of the process's first
 * sequence (580 ms for the same 48 MiB of fresh memory here). Free with rl_heap_unmap. */
void *rl_heap_map(size_t n);
void rl_heap_unmap(void *p, size_t n);

#endif
