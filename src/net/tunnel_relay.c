/* tunnel_relay.c - the relay a public ring member runs for nodes that dial out (tunnel.h).
 *
 * Threads: one accepts; one per new connection does the handshake (a registration then leaves its socket
 * in the table and ends; a client's thread claims a waiting socket of the node it named and pumps bytes
 * between the two until either side ends); one keeper answers the waiting sockets' pings and drops the
 * silent or closed ones. The table is the only shared state, under one mutex. */
#include "tunnel.h"
#include "tunnel_int.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#define TN_RELAY_KEYS 256 /* nodes one relay serves */
#define TN_RELAY_POOL 8   /* waiting connections kept per node (a node keeps TN_POOL; more after reconnects) */

typedef struct tn_reg {
    uint8_t curve_pk[32], sign_pk[32];
    int n;
    int fd[TN_RELAY_POOL];
    double seen[TN_RELAY_POOL];
} tn_reg;

struct tn_relay {
    tn_threads th;
    int lfd;
    char addr[80];
    tn_admit_fn admit;
    void *admit_ctx;
    bool log;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* a registration arrived */
    tn_reg reg[TN_RELAY_KEYS];
    int nreg;
    tn_relay_stats st;
};

typedef struct tn_conn {
    tn_relay *r;
    int fd;
    char peer[64];
} tn_conn;

static tn_reg *tn_reg_find(tn_relay *r, const uint8_t curve_pk[32]) {
    for (int i = 0; i < r->nreg; i++)
        if (memcmp(r->reg[i].curve_pk, curve_pk, 32) == 0) return &r->reg[i];
    return NULL;
}

/* Removes waiting socket j of e (closing it when close_it). A node's entry stays when its last socket goes
 * (it is one claim away from dialling again); only a full table reuses such entries. Under mu. */
static void tn_reg_take(tn_relay *r, tn_reg *e, int j, bool close_it) {
    if (close_it) close(e->fd[j]);
    e->fd[j] = e->fd[e->n - 1];
    e->seen[j] = e->seen[e->n - 1];
    e->n--;
    r->st.waiting--;
    if (e->n == 0) r->st.nodes--;
}

/* ---- registration ---- */

static int tn_relay_register(tn_conn *c, const uint8_t nonce[32], rl_err *err) {
    tn_relay *r = c->r;
    uint8_t hdr[32 + 64 + 2];
    if (tn_read_full(c->fd, hdr, sizeof hdr, TN_HANDSHAKE_S, &r->th, err) != 0) return -1;
    size_t tl = (size_t)hdr[96] << 8 | hdr[97];
    uint8_t token[TN_TOKEN_MAX];
    if (tl > TN_TOKEN_MAX) {
        tn_send_refusal(c->fd, "join token too long", &r->th);
        return rl_errf(err, "a join token of %zu bytes", tl);
    }
    if (tn_read_full(c->fd, token, tl, TN_HANDSHAKE_S, &r->th, err) != 0) return -1;
    uint8_t msg[sizeof TN_SIGN_CTX - 1 + 32];
    memcpy(msg, TN_SIGN_CTX, sizeof TN_SIGN_CTX - 1);
    memcpy(msg + sizeof TN_SIGN_CTX - 1, nonce, 32);
    uint8_t curve[32];
    if (crypto_sign_verify_detached(hdr + 32, msg, sizeof msg, hdr) != 0 ||
        crypto_sign_ed25519_pk_to_curve25519(curve, hdr) != 0) {
        tn_send_refusal(c->fd, "the signature does not prove the key", &r->th);
        return rl_errf(err, "a registration whose signature does not prove its key");
    }
    char why[200] = "";
    if (r->admit && !r->admit(r->admit_ctx, hdr, token, tl, why, sizeof why)) {
        pthread_mutex_lock(&r->mu);
        r->st.refused++;
        pthread_mutex_unlock(&r->mu);
        tn_send_refusal(c->fd, why[0] ? why : "this relay does not serve that key", &r->th);
        return rl_errf(err, "refused: %s", why);
    }
    if (tn_write_full(c->fd, "K", 1, TN_HANDSHAKE_S, &r->th, err) != 0) return -1;
    pthread_mutex_lock(&r->mu);
    tn_reg *e = tn_reg_find(r, curve);
    for (int i = 0; !e && r->nreg == TN_RELAY_KEYS && i < r->nreg; i++) {
        if (r->reg[i].n == 0) { /* a node with nothing waiting gives way */
            r->reg[i] = r->reg[--r->nreg];
            break;
        }
    }
    if (!e && r->nreg == TN_RELAY_KEYS) {
        pthread_mutex_unlock(&r->mu);
        return rl_errf(err, "the relay serves %d nodes already", TN_RELAY_KEYS);
    }
    if (!e) {
        e = &r->reg[r->nreg++];
        memset(e, 0, sizeof *e);
        memcpy(e->curve_pk, curve, 32);
        memcpy(e->sign_pk, hdr, 32);
        if (r->log) {
            char hex[65];
            sodium_bin2hex(hex, sizeof hex, hdr, 32);
            fprintf(stderr, "relay: node %.16s... dialled in from %s\n", hex, c->peer);
        }
    }
    if (e->n == TN_RELAY_POOL) tn_reg_take(r, e, 0, true); /* the oldest goes */
    if (e->n == 0) r->st.nodes++;
    e->fd[e->n] = c->fd;
    e->seen[e->n] = tn_now();
    e->n++;
    r->st.waiting++;
    c->fd = -1; /* the table's now */
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return 0;
}

/* ---- a client ---- */

/* A waiting socket of the node with this key, handed over ('G', then 'A' back), or -1 after TN_HANDSHAKE_S. */
static int tn_relay_claim(tn_relay *r, const uint8_t curve_pk[32]) {
    double end = tn_now() + TN_CLAIM_S;
    while (!atomic_load(&r->th.stop) && tn_now() < end) {
        pthread_mutex_lock(&r->mu);
        tn_reg *e = tn_reg_find(r, curve_pk);
        int fd = -1;
        if (e && e->n > 0) {
            fd = e->fd[e->n - 1];
            tn_reg_take(r, e, e->n - 1, false);
        } else {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += TN_TICK_MS * 1000000L;
            if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
            pthread_cond_timedwait(&r->cv, &r->mu, &ts);
        }
        pthread_mutex_unlock(&r->mu);
        if (fd < 0) continue;
        bool ok = tn_write_full(fd, "G", 1, TN_HANDSHAKE_S, &r->th, NULL) == 0;
        for (uint8_t b = 0; ok && b != 'A';) ok = tn_read_full(fd, &b, 1, TN_CLAIM_S, &r->th, NULL) == 0 && (b == 'A' || b == 'P');
        if (ok) return fd;
        close(fd); /* that one had died while it waited: try the next */
    }
    return -1;
}

static void tn_relay_client(tn_conn *c) {
    tn_relay *r = c->r;
    uint8_t curve[32];
    if (tn_read_full(c->fd, curve, 32, TN_HANDSHAKE_S, &r->th, NULL) != 0) return;
    int nfd = tn_relay_claim(r, curve);
    if (nfd < 0) {
        pthread_mutex_lock(&r->mu);
        r->st.unknown++;
        pthread_mutex_unlock(&r->mu);
        tn_send_refusal(c->fd, "no node with that key has dialled this relay (not started, or it was refused)", &r->th);
        return;
    }
    pthread_mutex_lock(&r->mu);
    r->st.spliced++;
    pthread_mutex_unlock(&r->mu);
    if (tn_write_full(c->fd, "K", 1, TN_HANDSHAKE_S, &r->th, NULL) == 0) tn_splice(c->fd, nfd, &r->th);
    close(nfd);
}

/* 'Q': is that node there? No claim: a prober's question costs the node nothing. */
static void tn_relay_query(tn_conn *c) {
    tn_relay *r = c->r;
    uint8_t curve[32];
    if (tn_read_full(c->fd, curve, 32, TN_HANDSHAKE_S, &r->th, NULL) != 0) return;
    pthread_mutex_lock(&r->mu);
    const tn_reg *e = tn_reg_find(r, curve);
    double last = -1, now = tn_now();
    for (int j = 0; e && j < e->n; j++)
        if (e->seen[j] > last) last = e->seen[j];
    pthread_mutex_unlock(&r->mu);
    char msg[160];
    if (last >= 0 && now - last <= TN_ALIVE_S) {
        tn_write_full(c->fd, "K", 1, TN_HANDSHAKE_S, &r->th, NULL);
        return;
    }
    if (last >= 0) snprintf(msg, sizeof msg, "that node's connections here have been silent for %.0f s", now - last);
    else snprintf(msg, sizeof msg, "no node with that key has dialled this relay (not started, or it was refused)");
    tn_send_refusal(c->fd, msg, &r->th);
}

static void *tn_relay_conn_main(void *arg) {
    tn_conn *c = arg;
    tn_relay *r = c->r;
    uint8_t hello[4 + 32], kind = 0;
    memcpy(hello, TN_MAGIC, 4);
    randombytes_buf(hello + 4, 32);
    rl_err err = {{0}};
    if (tn_write_full(c->fd, hello, sizeof hello, TN_HANDSHAKE_S, &r->th, &err) == 0 &&
        tn_read_full(c->fd, &kind, 1, TN_HANDSHAKE_S, &r->th, &err) == 0) {
        if (kind == 'R') {
            if (tn_relay_register(c, hello + 4, &err) != 0 && r->log)
                fprintf(stderr, "relay: a registration from %s failed: %s\n", c->peer, err.msg);
        } else if (kind == 'C') {
            tn_relay_client(c);
        } else if (kind == 'Q') {
            tn_relay_query(c);
        }
    }
    if (c->fd >= 0) close(c->fd);
    free(c);
    tn_threads_exit(&r->th);
    return NULL;
}

static void *tn_relay_accept_main(void *arg) {
    tn_relay *r = arg;
    while (!atomic_load(&r->th.stop)) {
        struct pollfd p = {r->lfd, POLLIN, 0};
        if (poll(&p, 1, TN_TICK_MS) <= 0) continue;
        tn_conn *c = calloc(1, sizeof *c);
        if (!c) continue;
        c->r = r;
        c->fd = tn_accept(r->lfd, c->peer, sizeof c->peer);
        pthread_mutex_lock(&r->th.mu);
        bool full = r->th.live >= TN_RELAY_CONNS;
        pthread_mutex_unlock(&r->th.mu);
        if (c->fd < 0 || full || tn_threads_spawn(&r->th, tn_relay_conn_main, c, NULL) != 0) {
            if (c->fd >= 0) close(c->fd);
            free(c);
        }
    }
    tn_threads_exit(&r->th);
    return NULL;
}

/* The waiting sockets: pings answered, closed or silent ones dropped. Reads under mu, never blocking, so a
 * claim (also under mu) takes a socket whose pending pings it then skips itself. */
static void *tn_relay_keeper_main(void *arg) {
    tn_relay *r = arg;
    while (!atomic_load(&r->th.stop)) {
        struct timespec ts = {0, TN_TICK_MS * 1000000L};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&r->mu);
        double now = tn_now();
        for (int i = 0; i < r->nreg; i++) {
            tn_reg *e = &r->reg[i];
            for (int j = 0; j < e->n; j++) {
                uint8_t b[64];
                ssize_t k = recv(e->fd[j], b, sizeof b, MSG_DONTWAIT);
                bool gone = k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
                if (k > 0) {
                    e->seen[j] = now;
                    gone = send(e->fd[j], "p", 1, MSG_NOSIGNAL | MSG_DONTWAIT) != 1;
                }
                if (gone || now - e->seen[j] > TN_SILENT_S) { /* dropped: the node dials again if it lives */
                    if (r->log && e->n == 1) {
                        char hex[65];
                        sodium_bin2hex(hex, sizeof hex, e->sign_pk, 32);
                        fprintf(stderr, "relay: node %.16s...: its last waiting connection %s\n", hex,
                                gone ? "closed" : "went silent");
                    }
                    tn_reg_take(r, e, j, true);
                    j--;
                }
            }
        }
        pthread_mutex_unlock(&r->mu);
    }
    tn_threads_exit(&r->th);
    return NULL;
}

tn_relay *tn_relay_start(const char *listen, tn_admit_fn admit, void *admit_ctx, bool log, rl_err *err) {
    tn_relay *r = calloc(1, sizeof *r);
    if (!r) {
        rl_errf(err, "out of memory");
        return NULL;
    }
    r->lfd = tn_listen(listen, r->addr, sizeof r->addr, err);
    if (r->lfd < 0) {
        rl_err_prefix(err, "relay");
        free(r);
        return NULL;
    }
    r->admit = admit, r->admit_ctx = admit_ctx, r->log = log;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    tn_threads_init(&r->th);
    if (tn_threads_spawn(&r->th, tn_relay_accept_main, r, err) != 0 ||
        tn_threads_spawn(&r->th, tn_relay_keeper_main, r, err) != 0) {
        tn_relay_stop(r);
        return NULL;
    }
    return r;
}

const char *tn_relay_addr(const tn_relay *r) { return r->addr; }

void tn_relay_stats_get(tn_relay *r, tn_relay_stats *s) {
    pthread_mutex_lock(&r->mu);
    *s = r->st;
    pthread_mutex_unlock(&r->mu);
}

bool tn_relay_has(tn_relay *r, const uint8_t curve_pk[32]) {
    pthread_mutex_lock(&r->mu);
    const tn_reg *e = tn_reg_find(r, curve_pk);
    bool has = e && e->n > 0;
    pthread_mutex_unlock(&r->mu);
    return has;
}

void tn_relay_stop(tn_relay *r) {
    if (!r) return;
    tn_threads_stop(&r->th);
    for (int i = 0; i < r->nreg; i++)
        for (int j = 0; j < r->reg[i].n; j++) close(r->reg[i].fd[j]);
    close(r->lfd);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
}
