/* Folder src/net/: the ring's transport: ZeroMQ sockets with CURVE and the allowlist that decides who may
 * connect, and the delays measured between nodes (probes). May include: base, trust, wire. (README "Layout";
 * tests/t_layout.sh checks both.)
 */
/* zsock.h - ZeroMQ sockets with CURVE, and the allowlist that decides who may connect.
 *
 * Every link is encrypted and mutually authenticated (ZeroMQ CURVE): a client must know the server's
 * public key, and the server accepts a client only if its key is on the allowlist, which a ZAP handler
 * thread checks for every handshake. Refused keys are logged with the peer's address. */
#ifndef RINGLM_ZSOCK_H
#define RINGLM_ZSOCK_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/err.h"
#include "../trust/keys.h"
#include "tunnel.h"

#define ZS_MAX_ALLOW 192 /* a coordinator, an upstream, a ring's fetchers and its probers */

typedef struct zs_allowlist {
    pthread_mutex_t mu;
    int n;
    uint8_t curve_pk[ZS_MAX_ALLOW][32];
    char label[ZS_MAX_ALLOW][24]; /* "coordinator", "upstream", "fetcher", "peer" */
    char name[ZS_MAX_ALLOW][65];  /* the key as users write it (Ed25519 hex): a message's "User-Id" */
} zs_allowlist;

/* The ZAP handler thread for one ZeroMQ context. */
typedef struct zs_auth {
    void *zctx;
    zs_allowlist allow;
    pthread_t thread;
    void *rep;
    bool running;
    bool log;
    /* Refusals are logged once per key per 10 s (a refused peer retries every 100 ms); the rest counted. */
    uint8_t last_refused[32];
    double last_refused_t;
    long refused_quiet;
} zs_auth;

int zs_auth_start(zs_auth *a, void *zctx, rl_err *err);
void zs_auth_stop(zs_auth *a);
/* name: the key's Ed25519 hex, which the peer's messages then carry (zs_parts.user). */
void zs_auth_allow(zs_auth *a, const uint8_t curve_pk[32], const char *label, const char *name);
/* Removes every key with this label (e.g. the previous upstream neighbour). */
void zs_auth_forget(zs_auth *a, const char *label);

/* A ROUTER bound to "tcp://HOST:PORT", CURVE server with the given identity. */
void *zs_server(void *zctx, const char *host_port, const keys_identity *id, rl_err *err);
/* A DEALER connected to "tcp://HOST:PORT" (a relayed node's "relay:HOST:PORT/TAG" through tn: tunnel.h), CURVE client that expects server_curve_z85. Its peer going silent
 * (no RST: a cable pulled) closes the link within link_s seconds (ZMTP heartbeats; <= 0: ZS_LINK_S), which the
 * link's monitor reports (zs_monitor). */
void *zs_client(void *zctx, tn_connector *tn, const char *host_port, const keys_identity *id,
                const char *server_curve_z85, const char *routing_id, double link_s, rl_err *err);

/* A silent link is declared down within this many seconds by default (issue #53: max(0.5 s, 3 round trips)). */
#define ZS_LINK_S 0.5
/* ... and before a link's round trip is known (and for bulk transfers): the heartbeats' old 5 s. */
#define ZS_LINK_SLOW_S 5.0
/* The bound for a link of round trip rtt_s: 3 round trips, at least floor_s (<= 0: ZS_LINK_S): a ping's answer
 * must have time to come back, with room for a busy peer. */
double zs_link_bound(double floor_s, double rtt_s);

/* Multipart send/receive of up to 4 frames. zs_recv allocates each part (free with zs_parts_free). */
typedef struct zs_parts {
    int n;
    void *data[5];
    size_t len[5];
    int fd;          /* the connection it came in on (ZMQ_SRCFD; -1 if unknown): a monitor's DISCONNECTED names it */
    char user[72];   /* the sender's key as users write it (zs_auth_allow's name), or "" */
    char peer[64];   /* the sender's IP address, or "" */
} zs_parts;

int zs_send(void *sock, const void *const *data, const size_t *len, int n, bool dontwait, rl_err *err);
/* Waits up to timeout_ms until the socket can send (a peer is connected and handshaken). */
bool zs_wait_writable(void *sock, int timeout_ms);
int zs_recv(void *sock, zs_parts *p, rl_err *err); /* non-blocking: returns 1 when nothing is waiting */
void zs_parts_free(zs_parts *p);

/* Describes why a client socket's connection failed, if a monitor event says so (else ""). A handshake's
 * failure stays the reason through the disconnect and retries that follow it, until a handshake succeeds:
 * "it refused our key" must not turn into "its connection closed". On a server socket (zs_monitor_start_gone)
 * it watches one connection: watch_gone turns true once the connection on fd watch_fd has closed. */
typedef struct zs_monitor {
    void *pair;
    char last[200];
    bool disconnected; /* the peer's connection closed since the last successful handshake */
    bool tcp_up;       /* a TCP connection is up (its handshake may not be done) */
    bool shaken;       /* the current connection's handshake succeeded */
    bool failed;       /* a handshake failed since the last one that succeeded: last says how */
    int watch_fd;      /* server sockets: the connection the caller watches (-1: none) */
    bool watch_gone;   /* ... and it has closed */
    long hs_failures;  /* handshakes that failed */
} zs_monitor;
/* The monitor's queue is unbounded (libzmq's I/O thread blocks on a full one, which would stall every
 * socket of the context), so drain it often: zs_monitor_fd gives a socket to poll. */
int zs_monitor_start(zs_monitor *m, void *zctx, void *sock, const char *name, rl_err *err);
/* A server socket's monitor that reports closed connections only (a port scan then costs one small event
 * per connection, drained by the caller's loop). */
int zs_monitor_start_gone(zs_monitor *m, void *zctx, void *sock, const char *name, rl_err *err);
void zs_monitor_poll(zs_monitor *m); /* drains events, keeps a description of the last failure */
void zs_monitor_stop(zs_monitor *m);

#endif
