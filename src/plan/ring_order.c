/* ring_order.c - the shortest round trip through a ring's nodes (ring_order.h). */
#include "ring_order.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

double order_cycle(int n, order_delay_fn d, const void *user, const int *order) {
    if (n == 0) return 0;
    double t = d(user, -1, order[0]) + d(user, order[n - 1], -1);
    for (int i = 0; i + 1 < n; i++) t += d(user, order[i], order[i + 1]);
    return t;
}

static int order_exact(int n, order_delay_fn d, const void *user, int *order, rl_err *err) {
    const size_t states = (size_t)1 << n;
    double *cost = malloc(states * (size_t)n * sizeof *cost);
    signed char *prev = malloc(states * (size_t)n);
    if (!cost || !prev) {
        free(cost);
        free(prev);
        return rl_errf(err, "out of memory ordering %d nodes", n);
    }
    for (size_t i = 0; i < states * (size_t)n; i++) cost[i] = INFINITY;
    for (int j = 0; j < n; j++) cost[((size_t)1 << j) * n + j] = d(user, -1, j), prev[((size_t)1 << j) * n + j] = -1;
    for (size_t mask = 1; mask < states; mask++) {
        for (int j = 0; j < n; j++) {
            double c = cost[mask * n + j];
            if (!(mask & ((size_t)1 << j)) || isinf(c)) continue;
            for (int k = 0; k < n; k++) {
                if (mask & ((size_t)1 << k)) continue;
                size_t m2 = mask | ((size_t)1 << k);
                double c2 = c + d(user, j, k);
                if (c2 < cost[m2 * n + k]) cost[m2 * n + k] = c2, prev[m2 * n + k] = (signed char)j;
            }
        }
    }
    size_t full = states - 1;
    int last = 0;
    double best = INFINITY;
    for (int j = 0; j < n; j++) {
        double c = cost[full * n + j] + d(user, j, -1);
        if (c < best) best = c, last = j;
    }
    for (int i = n - 1; i >= 0; i--) {
        order[i] = last;
        int p = prev[full * n + last];
        full &= ~((size_t)1 << last);
        last = p;
    }
    free(cost);
    free(prev);
    return 0;
}

static void order_heuristic(int n, order_delay_fn d, const void *user, int *order) {
    for (int k = 0; k < n; k++) order[k] = k; /* (the given order, if there is no memory for better) */
    bool *used = calloc((size_t)n, 1);
    if (!used) return;
    for (int i = 0, at = -1; i < n; i++) { /* nearest neighbour from the coordinator */
        int best = -1;
        for (int k = 0; k < n; k++) {
            if (!used[k] && (best < 0 || d(user, at, k) < d(user, at, best))) best = k;
        }
        used[best] = true;
        order[i] = at = best;
    }
    free(used);
    /* 2-opt: reverse order[i..j] while that shortens the cycle (the coordinator is a fixed end of both). */
    for (bool better = true; better;) {
        better = false;
        for (int i = 0; i < n; i++) {
            for (int j = i + 1; j < n; j++) {
                int before = i > 0 ? order[i - 1] : -1, after = j + 1 < n ? order[j + 1] : -1;
                double delta = d(user, before, order[j]) + d(user, order[i], after) - d(user, before, order[i]) -
                               d(user, order[j], after);
                if (delta < -1e-12) {
                    for (int a = i, b = j; a < b; a++, b--) {
                        int t = order[a];
                        order[a] = order[b];
                        order[b] = t;
                    }
                    better = true;
                }
            }
        }
    }
}

int order_best_order(int n, order_delay_fn d, const void *user, int *order, double *total, bool *exact, rl_err *err) {
    if (n < 1) return rl_errf(err, "no nodes to order");
    *exact = n <= ORDER_EXACT_MAX;
    if (*exact) {
        if (order_exact(n, d, user, order, err) != 0) return -1;
    } else {
        order_heuristic(n, d, user, order);
    }
    *total = order_cycle(n, d, user, order);
    return 0;
}
