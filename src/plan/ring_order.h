/* ring_order.h - the order of a ring's nodes: the cycle coordinator -> nodes -> coordinator with the least sum
 * of one-way delays (every token crosses each of those hops once per traversal).
 *
 * Exact (dynamic programming over subsets, O(2^n n^2)) up to ORDER_EXACT_MAX nodes; beyond, nearest neighbour
 * from the coordinator improved by 2-opt until no move helps (a local optimum; said so by *exact). Ties keep
 * the lower node index first, so a plan is reproducible. */
#ifndef RINGLM_RING_ORDER_H
#define RINGLM_RING_ORDER_H

#include <stdbool.h>

#include "../base/err.h"

#define ORDER_EXACT_MAX 16

/* d(user, a, b): one-way delay in seconds between nodes a and b (-1: the coordinator), symmetric. */
typedef double (*order_delay_fn)(const void *user, int a, int b);

/* order[0..n) gets the node indices in ring order; *total the cycle's delay. */
int order_best_order(int n, order_delay_fn d, const void *user, int *order, double *total, bool *exact, rl_err *err);
/* The delay of the cycle through order[0..n) (and the coordinator). */
double order_cycle(int n, order_delay_fn d, const void *user, const int *order);

#endif
