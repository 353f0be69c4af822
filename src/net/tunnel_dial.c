/* tunnel_dial.c - a node behind a NAT keeps TN_POOL connections waiting at its relay (tunnel.h).
 *
 * One manager thread opens connections while fewer than TN_POOL wait (backing off after failures); each
 * connection has a thread that registers it, pings while it waits, and once the relay hands it to a client
 * connects to the node's own ZeroMQ endpoint and pumps bytes until either side ends. */
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

struct tn_dialout {
    tn_threads th;
    char relay[128], local[128];
    keys_identity id;
    uint8_t token[TN_TOKEN_MAX];
    size_t token_len;
    bool log;
    pthread_mutex_t mu;
    int idle, connecting;
    double next_try, backoff;
    char why[300];
    bool said_ok; /* "registered" was logged since the last failure */
};

/* A relay that refused us is asked again every 10 s at most; one that is not there (yet: a coordinator
 * between runs) every 2 s, which costs one connection attempt. */
static void tn_dial_failed(tn_dialout *d, const char *why) {
    pthread_mutex_lock(&d->mu);
    d->connecting--;
    bool fresh = strcmp(d->why, why) != 0 || d->said_ok;
    snprintf(d->why, sizeof d->why, "%s", why);
    d->said_ok = false;
    d->next_try = tn_now() + d->backoff;
    double cap = strstr(why, "the relay refused") ? 10 : 2;
    d->backoff = d->backoff * 2 > cap ? cap : d->backoff * 2;
    pthread_mutex_unlock(&d->mu);
    if (d->log && fresh) fprintf(stderr, "ringlm node: dial-out to relay %s: %s (trying again)\n", d->relay, why);
}

/* Registers fd: greeting read, key proven, reply read. */
static int tn_dial_register(tn_dialout *d, int fd, rl_err *err) {
    uint8_t hello[4 + 32];
    if (tn_read_greeting(fd, hello, &d->th, err) != 0) return -1;
    uint8_t msg[sizeof TN_SIGN_CTX - 1 + 32];
    memcpy(msg, TN_SIGN_CTX, sizeof TN_SIGN_CTX - 1);
    memcpy(msg + sizeof TN_SIGN_CTX - 1, hello + 4, 32);
    uint8_t out[1 + 32 + 64 + 2 + TN_TOKEN_MAX];
    out[0] = 'R';
    memcpy(out + 1, d->id.sign_pk, 32);
    crypto_sign_detached(out + 33, NULL, msg, sizeof msg, d->id.sign_sk);
    out[97] = (uint8_t)(d->token_len >> 8), out[98] = (uint8_t)d->token_len;
    memcpy(out + 99, d->token, d->token_len);
    if (tn_write_full(fd, out, 99 + d->token_len, TN_HANDSHAKE_S, &d->th, err) != 0) return -1;
    return tn_read_reply(fd, &d->th, err);
}

/* Waits for the relay's 'G' while pinging. 1: handed over; 0: lost; -1: stopping. */
static int tn_dial_wait(tn_dialout *d, int fd) {
    double seen = tn_now(), pinged = seen;
    while (!atomic_load(&d->th.stop)) {
        struct pollfd p = {fd, POLLIN, 0};
        poll(&p, 1, TN_TICK_MS);
        double now = tn_now();
        if (p.revents) {
            uint8_t b[16];
            ssize_t k = recv(fd, b, sizeof b, 0);
            if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR)) return 0;
            for (ssize_t i = 0; i < k; i++) {
                if (b[i] == 'G') return 1; /* the relay sends nothing after 'G' until our 'A' */
                if (b[i] != 'p') return 0;
            }
            if (k > 0) seen = now;
        }
        if (now - seen > TN_SILENT_S) return 0;
        if (now - pinged > TN_PING_S) {
            if (send(fd, "P", 1, MSG_NOSIGNAL | MSG_DONTWAIT) != 1) return 0;
            pinged = now;
        }
    }
    return -1;
}

static void *tn_dial_conn_main(void *arg) {
    tn_dialout *d = arg;
    rl_err err = {{0}};
    int fd = tn_dial(d->relay, TN_HANDSHAKE_S, &d->th, &err);
    if (fd < 0 || tn_dial_register(d, fd, &err) != 0) {
        if (fd >= 0) close(fd);
        if (!atomic_load(&d->th.stop)) tn_dial_failed(d, err.msg);
        else {
            pthread_mutex_lock(&d->mu);
            d->connecting--;
            pthread_mutex_unlock(&d->mu);
        }
        tn_threads_exit(&d->th);
        return NULL;
    }
    pthread_mutex_lock(&d->mu);
    d->connecting--, d->idle++;
    d->backoff = 0.5;
    d->why[0] = 0;
    bool say = !d->said_ok;
    d->said_ok = true;
    pthread_mutex_unlock(&d->mu);
    if (d->log && say) fprintf(stderr, "ringlm node: dialled out to relay %s: reachable through it\n", d->relay);
    int w = tn_dial_wait(d, fd);
    pthread_mutex_lock(&d->mu);
    d->idle--;
    pthread_mutex_unlock(&d->mu);
    if (w == 1 && tn_write_full(fd, "A", 1, TN_HANDSHAKE_S, &d->th, NULL) == 0) {
        int lfd = tn_dial(d->local, TN_HANDSHAKE_S, &d->th, &err);
        if (lfd >= 0) {
            tn_splice(fd, lfd, &d->th);
            close(lfd);
        } else if (d->log) {
            fprintf(stderr, "ringlm node: dial-out: cannot reach our own endpoint %s: %s\n", d->local, err.msg);
        }
    }
    close(fd);
    tn_threads_exit(&d->th);
    return NULL;
}

static void *tn_dial_manager_main(void *arg) {
    tn_dialout *d = arg;
    while (!atomic_load(&d->th.stop)) {
        pthread_mutex_lock(&d->mu);
        bool open = d->idle + d->connecting < TN_POOL && tn_now() >= d->next_try;
        if (open) d->connecting++;
        pthread_mutex_unlock(&d->mu);
        if (open && tn_threads_spawn(&d->th, tn_dial_conn_main, d, NULL) != 0) {
            pthread_mutex_lock(&d->mu);
            d->connecting--;
            pthread_mutex_unlock(&d->mu);
        }
        if (!open) {
            struct timespec ts = {0, 20 * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
    tn_threads_exit(&d->th);
    return NULL;
}

tn_dialout *tn_dialout_start(const char *relay, const keys_identity *id, const char *local, const char *token,
                             bool log, rl_err *err) {
    tn_dialout *d = calloc(1, sizeof *d);
    if (!d) {
        rl_errf(err, "out of memory");
        return NULL;
    }
    size_t tl = token ? strlen(token) : 0;
    if (strlen(relay) >= sizeof d->relay || strlen(local) >= sizeof d->local || tl > TN_TOKEN_MAX) {
        free(d);
        rl_errf(err, "dial-out: address or token too long");
        return NULL;
    }
    snprintf(d->relay, sizeof d->relay, "%s", relay);
    snprintf(d->local, sizeof d->local, "%s", local);
    d->id = *id;
    memcpy(d->token, token ? token : "", tl);
    d->token_len = tl;
    d->log = log;
    d->backoff = 0.5;
    snprintf(d->why, sizeof d->why, "not registered yet");
    pthread_mutex_init(&d->mu, NULL);
    tn_threads_init(&d->th);
    if (tn_threads_spawn(&d->th, tn_dial_manager_main, d, err) != 0) {
        tn_dialout_stop(d);
        return NULL;
    }
    return d;
}

bool tn_dialout_state(tn_dialout *d, char *why, size_t n) {
    pthread_mutex_lock(&d->mu);
    bool ok = d->idle > 0 || d->said_ok;
    if (why) snprintf(why, n, "%s", d->why);
    pthread_mutex_unlock(&d->mu);
    return ok;
}

void tn_dialout_stop(tn_dialout *d) {
    if (!d) return;
    tn_threads_stop(&d->th);
    pthread_mutex_destroy(&d->mu);
    sodium_memzero(&d->id, sizeof d->id);
    free(d);
}
