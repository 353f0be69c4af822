/* k3_forward_int.h - what the files behind k3_forward.h share, and nothing outside them includes:
 *   k3_engine.c      the engine's life, and the memory it keeps from one batch to the next
 *   k3_forward.c     running a batch: check, build, allocate, inputs, compute, outputs; the kept graph
 */
#ifndef RINGLM_K3_FORWARD_INT_H
#define RINGLM_K3_FORWARD_INT_H

#include <stddef.h>

#include "../base/err.h"
#include "k3_forward.h"

/* ---- k3_engine.c: memory an engine keeps between batches ---------------------------------------- */

/* At least need bytes for a graph's tensor and node structs in e->graph_buf (k3_engine.graph_buf: why kept). */
int k3_engine_graph_mem(k3_engine *e, size_t need, rl_err *err);
/* At least need bytes of mask memory in e->mask_buf (k3_engine.mask_buf: why not the compute buffer): twice
 * what it had, up to full (what the same sequences' masks need at full context), or need if that is more. */
int k3_engine_mask_mem(k3_engine *e, size_t need, size_t full, rl_err *err);
/* e->sched, made anew when there is none or its hash set is smaller than size (a graph's nodes and leafs). */
int k3_engine_sched(k3_engine *e, size_t size, rl_err *err);

/* ---- k3_forward.c ------------------------------------------------------------------------------------ */

/* Frees e->kept, the last decode step's graph, if there is one. */
void k3_kept_drop(k3_engine *e);

#endif
