/* tunnel_int.h - what the relay, the dial-out and the connector share (tunnel_io.c): their threads, TCP
 * sockets with timeouts, and the byte pump. Not a contract outside src/net/tunnel*.c. */
#ifndef RINGLM_TUNNEL_INT_H
#define RINGLM_TUNNEL_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/err.h"

#define TN_MAGIC "RLT1"
#define TN_SIGN_CTX "ringlm tunnel v1"

/* Every thread of one relay, dial-out or connector: started detached, counted, and told to stop; the
 * owner's stop waits until the count is back to zero (each thread polls at most TN_TICK_MS at a time). */
#define TN_TICK_MS 200
typedef struct tn_threads {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int live;
    atomic_bool stop;
} tn_threads;
void tn_threads_init(tn_threads *t);
int tn_threads_spawn(tn_threads *t, void *(*fn)(void *), void *arg, rl_err *err);
void tn_threads_exit(tn_threads *t); /* the last thing a spawned thread does */
void tn_threads_stop(tn_threads *t); /* sets stop, waits for every thread */

/* TCP: non-blocking sockets with TCP_NODELAY, keepalives and a user timeout (a dead peer surfaces as an
 * error within ~20 s even with bytes unacknowledged). */
int tn_listen(const char *host_port, char *bound, size_t bound_n, rl_err *err);
int tn_dial(const char *host_port, double timeout_s, const tn_threads *t, rl_err *err);
int tn_accept(int lfd, char *peer, size_t peer_n);
void tn_sock_setup(int fd);
/* All n bytes within timeout_s (or until stop): 0, else -1 with err. */
int tn_read_full(int fd, void *buf, size_t n, double timeout_s, const tn_threads *t, rl_err *err);
int tn_write_full(int fd, const void *buf, size_t n, double timeout_s, const tn_threads *t, rl_err *err);
/* The relay's greeting: "RLT1" (else "it is not a ringlm relay", at once) and its nonce. */
int tn_read_greeting(int fd, uint8_t hello[36], const tn_threads *t, rl_err *err);
/* Sends 'E', a length and msg (best effort). */
void tn_send_refusal(int fd, const char *msg, const tn_threads *t);
/* Reads the relay's reply: 0 on 'K'; -1 with err "the relay refused: MSG" on 'E' (or what went wrong). */
int tn_read_reply(int fd, const tn_threads *t, rl_err *err);

/* Copies bytes both ways until both directions have ended (each end's EOF passed on as a half close), an
 * error, or stop; closes neither fd. */
void tn_splice(int a, int b, const tn_threads *t);

double tn_now(void);

#endif
