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

/* Keep up to 512 MiB of freed memory at the top of the heap and map only blocks of 32 MiB and more
 * separately (glibc's largest threshold); does nothing on another C library. */
void rl_heap_keep(void);

#endif
