/* clock.c - the monotonic clock (clock.h). */
#include "clock.h"

#include <time.h>

double rl_clock_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* cannot fail for CLOCK_MONOTONIC with a valid pointer */
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
