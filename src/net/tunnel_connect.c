/* tunnel_connect.c - a client's side of the relay (tunnel.h): a loopback port per relayed node; ZeroMQ
 * connects there as to any node, and each connection is carried to the relay, which is told the node's key.
 *
 * One thread accepts on every loopback port (started with the first port); one per connection does the
 * relay's handshake and pumps bytes. */
#include "tunnel.h"
#include "tunnel_int.h"

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TN_TARGETS 64 /* relayed nodes one process reaches: a ring's */

typedef struct tn_target {
    char relay[128];
    uint8_t curve_pk[32];
    int lfd;
    char ep[80];
    char why[300]; /* the relay's last refusal */
} tn_target;

struct tn_connector {
    tn_threads th;
    pthread_mutex_t mu;
    tn_target t[TN_TARGETS];
    int n;
    bool accepting; /* the accept thread runs */
};

typedef struct tn_cconn {
    tn_connector *c;
    int i, fd;
} tn_cconn;

static void tn_connect_why(tn_connector *c, int i, const char *why) {
    pthread_mutex_lock(&c->mu);
    snprintf(c->t[i].why, sizeof c->t[i].why, "%s", why);
    pthread_mutex_unlock(&c->mu);
}

static void *tn_connect_conn_main(void *arg) {
    tn_cconn *cc = arg;
    tn_connector *c = cc->c;
    pthread_mutex_lock(&c->mu);
    char relay[128];
    uint8_t req[33] = {'C'};
    snprintf(relay, sizeof relay, "%s", c->t[cc->i].relay);
    memcpy(req + 1, c->t[cc->i].curve_pk, 32);
    pthread_mutex_unlock(&c->mu);
    rl_err err = {{0}};
    uint8_t hello[4 + 32];
    int fd = tn_dial(relay, TN_HANDSHAKE_S, &c->th, &err);
    if (fd >= 0 && tn_read_greeting(fd, hello, &c->th, &err) == 0 &&
        tn_write_full(fd, req, sizeof req, TN_HANDSHAKE_S, &c->th, &err) == 0 && tn_read_reply(fd, &c->th, &err) == 0) {
        tn_connect_why(c, cc->i, "");
        tn_splice(cc->fd, fd, &c->th);
    } else if (!atomic_load(&c->th.stop)) {
        rl_err_prefix(&err, "relay %s", relay);
        tn_connect_why(c, cc->i, err.msg);
    }
    if (fd >= 0) close(fd);
    close(cc->fd);
    free(cc);
    tn_threads_exit(&c->th);
    return NULL;
}

static void *tn_connect_accept_main(void *arg) {
    tn_connector *c = arg;
    while (!atomic_load(&c->th.stop)) {
        struct pollfd p[TN_TARGETS];
        pthread_mutex_lock(&c->mu);
        int n = c->n;
        for (int i = 0; i < n; i++) p[i] = (struct pollfd){c->t[i].lfd, POLLIN, 0};
        pthread_mutex_unlock(&c->mu);
        if (poll(p, (nfds_t)n, TN_TICK_MS) <= 0) continue;
        for (int i = 0; i < n; i++) {
            if (!p[i].revents) continue;
            int fd = tn_accept(p[i].fd, NULL, 0);
            if (fd < 0) continue;
            tn_cconn *cc = malloc(sizeof *cc);
            if (!cc || (*cc = (tn_cconn){c, i, fd}, tn_threads_spawn(&c->th, tn_connect_conn_main, cc, NULL) != 0)) {
                close(fd);
                free(cc);
            }
        }
    }
    tn_threads_exit(&c->th);
    return NULL;
}

tn_connector *tn_connector_new(rl_err *err) {
    tn_connector *c = calloc(1, sizeof *c);
    if (!c) {
        rl_errf(err, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&c->mu, NULL);
    tn_threads_init(&c->th);
    return c;
}

int tn_connector_endpoint(tn_connector *c, const char *relay, const uint8_t curve_pk[32], char *out, size_t n,
                          rl_err *err) {
    pthread_mutex_lock(&c->mu);
    int rc = 0;
    int i = 0;
    while (i < c->n && !(strcmp(c->t[i].relay, relay) == 0 && memcmp(c->t[i].curve_pk, curve_pk, 32) == 0)) i++;
    if (i == c->n) {
        tn_target *t = &c->t[i];
        if (i == TN_TARGETS) {
            rc = rl_errf(err, "more than %d relayed nodes", TN_TARGETS);
        } else if (strlen(relay) >= sizeof t->relay) {
            rc = rl_errf(err, "relay address too long");
        } else if ((t->lfd = tn_listen("127.0.0.1:0", t->ep, sizeof t->ep, err)) < 0) {
            rc = -1;
        } else {
            snprintf(t->relay, sizeof t->relay, "%s", relay);
            memcpy(t->curve_pk, curve_pk, 32);
            t->why[0] = 0;
            c->n++;
            /* The accept thread polls a copy of the table each tick: a port added now is seen within one. */
            if (!c->accepting && tn_threads_spawn(&c->th, tn_connect_accept_main, c, err) == 0) c->accepting = true;
            else if (!c->accepting) rc = -1;
        }
    }
    if (rc == 0) snprintf(out, n, "%s", c->t[i].ep);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int tn_query(const char *relay, const uint8_t curve_pk[32], double timeout_s, rl_err *err) {
    uint8_t hello[4 + 32], req[33] = {'Q'};
    memcpy(req + 1, curve_pk, 32);
    int fd = tn_dial(relay, timeout_s, NULL, err);
    if (fd < 0) return -1;
    /* the question goes out at once: the relay reads it after its greeting */
    int rc = tn_write_full(fd, req, sizeof req, timeout_s, NULL, err) == 0 && tn_read_greeting(fd, hello, NULL, err) == 0 &&
                     tn_read_reply(fd, NULL, err) == 0
                 ? 0
                 : -1;
    close(fd);
    if (rc != 0) rl_err_prefix(err, "relay %s", relay);
    return rc;
}

void tn_connector_why(tn_connector *c, const uint8_t curve_pk[32], char *out, size_t n) {
    out[0] = 0;
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->n; i++)
        if (memcmp(c->t[i].curve_pk, curve_pk, 32) == 0 && c->t[i].why[0]) snprintf(out, n, "%s", c->t[i].why);
    pthread_mutex_unlock(&c->mu);
}

void tn_connector_free(tn_connector *c) {
    if (!c) return;
    tn_threads_stop(&c->th);
    for (int i = 0; i < c->n; i++) close(c->t[i].lfd);
    pthread_mutex_destroy(&c->mu);
    free(c);
}
