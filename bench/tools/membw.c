/* membw - measures this machine's memory read bandwidth, the ceiling for decoding (every active weight
 * byte is read once per token). Streams a buffer much larger than the caches with N threads, best of R.
 *   membw [THREADS] [MIB] [REPS]   -> prints {"read_gb_s": X, "threads": N} */
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    size_t mib = argc > 2 ? (size_t)atol(argv[2]) : 1024;
    int reps = argc > 3 ? atoi(argv[3]) : 5;
    size_t n = mib * 1048576 / sizeof(uint64_t);
    uint64_t *buf = malloc(n * sizeof *buf);
    if (!buf) return 1;
    memset(buf, 1, n * sizeof *buf); /* fault every page in before timing */
    double best = 0;
    uint64_t sink = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        uint64_t s = 0;
#pragma omp parallel for num_threads(threads) reduction(+ : s) schedule(static)
        for (size_t i = 0; i < n; i++) s += buf[i];
        double dt = now_s() - t0;
        sink += s;
        double gbs = (double)(n * sizeof *buf) / dt / 1e9;
        if (gbs > best) best = gbs;
    }
    printf("{\"read_gb_s\": %.2f, \"threads\": %d, \"mib\": %zu, \"checksum\": %llu}\n", best, threads, mib,
           (unsigned long long)(sink & 0xff));
    free(buf);
    return 0;
}
