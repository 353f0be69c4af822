/* test_order - the ring order (src/plan/ring_order): the exact solver against a brute force over every
 * permutation on random symmetric delays (1 to 8 nodes), a hand-made case whose answer is known, and the
 * heuristic beyond ORDER_EXACT_MAX nodes: a permutation that no 2-opt move shortens. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "plan/ring_order.h"

#include "check.h"

#define N_MAX 40
typedef struct dm {
    int n;
    double d[N_MAX + 1][N_MAX + 1]; /* [0] the coordinator, [i + 1] node i */
} dm;

static double dm_delay(const void *user, int a, int b) {
    const dm *m = user;
    return m->d[a + 1][b + 1];
}

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;
static double rnd(void) {
    rng_state ^= rng_state >> 12, rng_state ^= rng_state << 25, rng_state ^= rng_state >> 27;
    return (double)((rng_state * 0x2545F4914F6CDD1Dull) >> 11) / 9007199254740992.0;
}

/* Random points in a plane, some in clusters (places), delays = distances: a metric, like real ones. */
static void random_dm(dm *m, int n) {
    double x[N_MAX + 1], y[N_MAX + 1];
    for (int i = 0; i <= n; i++) {
        int cl = (int)(rnd() * 4);
        x[i] = cl * 10 + rnd(), y[i] = (cl % 2) * 10 + rnd();
    }
    m->n = n;
    for (int i = 0; i <= n; i++)
        for (int j = 0; j <= n; j++) m->d[i][j] = i == j ? 0 : hypot(x[i] - x[j], y[i] - y[j]) * 1e-3;
}

static double brute(const dm *m, int *perm, int k, int n, double best) {
    if (k == n) {
        double c = order_cycle(n, dm_delay, m, perm);
        return c < best ? c : best;
    }
    for (int i = k; i < n; i++) {
        int t = perm[k];
        perm[k] = perm[i], perm[i] = t;
        best = brute(m, perm, k + 1, n, best);
        t = perm[k], perm[k] = perm[i], perm[i] = t;
    }
    return best;
}

static bool is_perm(const int *o, int n) {
    bool seen[N_MAX] = {0};
    for (int i = 0; i < n; i++) {
        if (o[i] < 0 || o[i] >= n || seen[o[i]]) return false;
        seen[o[i]] = true;
    }
    return true;
}

int main(void) {
    static dm m;
    int order[N_MAX];
    double total;
    bool exact;
    rl_err err;

    /* two places 20 ms apart, nodes alternating between them in the given order: the best ring visits each
     * place once (two long hops), not four times */
    m.n = 4;
    const int place[5] = {0, 0, 1, 0, 1}; /* coordinator, nodes 0..3 */
    for (int i = 0; i <= 4; i++)
        for (int j = 0; j <= 4; j++) m.d[i][j] = i == j ? 0 : place[i] == place[j] ? 0.0001 : 0.020;
    int rc = order_best_order(4, dm_delay, &m, order, &total, &exact, &err);
    int changes = 0; /* place changes around the cycle, coordinator included */
    for (int i = 0; i <= 4; i++) changes += place[i == 0 ? 0 : order[i - 1] + 1] != place[i == 4 ? 0 : order[i] + 1];
    CHECK(rc == 0 && exact && fabs(total - (2 * 0.020 + 3 * 0.0001)) < 1e-12 && changes == 2,
          "two places: each visited once (round trip %.4f s: %d %d %d %d)", total, order[0], order[1], order[2], order[3]);
    CHECK(order_best_order(0, dm_delay, &m, order, &total, &exact, &err) != 0, "no nodes: an error (%s)", err.msg);

    int bad = 0, cases = 0;
    for (int it = 0; it < 200; it++) {
        int n = 1 + it % 8;
        random_dm(&m, n);
        int perm[N_MAX];
        for (int i = 0; i < n; i++) perm[i] = i;
        double want = brute(&m, perm, 0, n, INFINITY);
        if (order_best_order(n, dm_delay, &m, order, &total, &exact, &err) != 0 || !exact || !is_perm(order, n) ||
            fabs(total - want) > 1e-12 || fabs(order_cycle(n, dm_delay, &m, order) - total) > 1e-15) {
            if (bad++ < 3) printf("# case %d (%d nodes): %.6f, brute force %.6f\n", it, n, total, want);
        }
        cases++;
    }
    CHECK(bad == 0, "exact order equals the brute force over every permutation (%d cases, 1-8 nodes, %d wrong)", cases, bad);

    random_dm(&m, 16);
    clock_t t0 = clock();
    rc = order_best_order(16, dm_delay, &m, order, &total, &exact, &err);
    CHECK(rc == 0 && exact && is_perm(order, 16), "16 nodes: exact, in %.2f s", (double)(clock() - t0) / CLOCKS_PER_SEC);

    int not_local = 0;
    for (int it = 0; it < 20; it++) {
        random_dm(&m, N_MAX);
        if (order_best_order(N_MAX, dm_delay, &m, order, &total, &exact, &err) != 0 || exact || !is_perm(order, N_MAX)) {
            not_local++;
            continue;
        }
        for (int i = 0; i < N_MAX; i++) /* no reversal of order[i..j] shortens it */
            for (int j = i + 1; j < N_MAX; j++) {
                int o2[N_MAX];
                memcpy(o2, order, sizeof o2);
                for (int a = i, b = j; a < b; a++, b--) {
                    int t = o2[a];
                    o2[a] = o2[b], o2[b] = t;
                }
                if (order_cycle(N_MAX, dm_delay, &m, o2) < total - 1e-9) not_local++, i = j = N_MAX;
            }
    }
    CHECK(not_local == 0, "%d nodes (beyond exact): a permutation no 2-opt move shortens (%d of 20 not)", N_MAX, not_local);
    return check_done();
}
