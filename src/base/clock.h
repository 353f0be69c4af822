/* clock.h - the one monotonic clock: seconds since some fixed point, for durations, deadlines and rates
 * (never wall time: frames and receipts stamp CLOCK_REALTIME themselves, wire/frame.h). */
#ifndef RINGLM_CLOCK_H
#define RINGLM_CLOCK_H

/* CLOCK_MONOTONIC in seconds (nanosecond resolution). */
double rl_clock_now(void);

#endif
