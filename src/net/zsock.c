#include "zsock.h"
#include "../base/clock.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <zmq.h>


/* ---- ZAP: the ZeroMQ authentication protocol (RFC 27), one handler per context -------------------- */

/* "refused a connection from ADDR: key ... is not allowed", naming the key the way keygen printed it (the
 * two keys the CURVE key can come from: trust/keys.h); once per key per 10 s. */
static void zs_auth_log_refusal(zs_auth *a, const char *addr, const uint8_t key[32]) {
    double now = rl_clock_now();
    if (memcmp(a->last_refused, key, 32) == 0 && now - a->last_refused_t < 10) {
        a->refused_quiet++;
        return;
    }
    memcpy(a->last_refused, key, 32);
    a->last_refused_t = now;
    char names[2][65];
    int n = keys_curve_to_names(key, names);
    char more[64] = "";
    if (a->refused_quiet) snprintf(more, sizeof more, " (%ld more refusals before this one)", a->refused_quiet);
    a->refused_quiet = 0;
    if (n == 2) {
        fprintf(stderr, "ringlm: refused a connection from %s: its key %s is not in --allow (or %.62s%s: the "
                        "handshake cannot tell these two apart)%s\n", addr, names[0], names[1], names[1] + 62, more);
    } else {
        char z85[41];
        zmq_z85_encode(z85, key, 32);
        fprintf(stderr, "ringlm: refused a connection from %s: its CURVE key %s is no ringlm key%s\n", addr, z85, more);
    }
}

static void *zs_auth_main(void *arg) {
    zs_auth *a = arg;
    for (;;) {
        zs_parts p;
        zmq_pollitem_t it = {a->rep, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 200) < 0) {
            if (errno == ETERM) break;
            continue;
        }
        if (!a->running) break;
        if (!(it.revents & ZMQ_POLLIN)) continue;
        /* Request: version, request_id, domain, address, identity, mechanism, credentials... */
        zmq_msg_t f[7];
        int n = 0, more = 1;
        while (more && n < 7) {
            zmq_msg_init(&f[n]);
            if (zmq_msg_recv(&f[n], a->rep, 0) < 0) break;
            more = zmq_msg_more(&f[n]);
            n++;
        }
        while (more) { /* drain anything unexpected */
            zmq_msg_t x;
            zmq_msg_init(&x);
            if (zmq_msg_recv(&x, a->rep, 0) < 0) more = 0;
            else more = zmq_msg_more(&x);
            zmq_msg_close(&x);
        }
        (void)p;
        const char *status = "400", *text = "unknown key";
        char addr[64] = "?", user[65] = "";
        if (n >= 7 && zmq_msg_size(&f[5]) == 5 && memcmp(zmq_msg_data(&f[5]), "CURVE", 5) == 0 &&
            zmq_msg_size(&f[6]) == 32) {
            const uint8_t *key = zmq_msg_data(&f[6]);
            pthread_mutex_lock(&a->allow.mu);
            for (int i = 0; i < a->allow.n; i++) {
                if (memcmp(a->allow.curve_pk[i], key, 32) == 0) {
                    status = "200", text = "OK";
                    snprintf(user, sizeof user, "%s", a->allow.name[i]);
                }
            }
            pthread_mutex_unlock(&a->allow.mu);
            size_t al = zmq_msg_size(&f[3]) < sizeof addr - 1 ? zmq_msg_size(&f[3]) : sizeof addr - 1;
            memcpy(addr, zmq_msg_data(&f[3]), al);
            addr[al] = 0;
            if (status[0] != '2' && a->log) zs_auth_log_refusal(a, addr, key);
        } else if (a->log) {
            fprintf(stderr, "ringlm: refused a connection that did not use CURVE\n");
        }
        /* Reply: version, request_id, status code, status text, user id, metadata. */
        const void *parts[6] = {"1.0", n >= 2 ? zmq_msg_data(&f[1]) : "", status, text, user, ""};
        size_t lens[6] = {3, n >= 2 ? zmq_msg_size(&f[1]) : 0, 3, strlen(text), strlen(user), 0};
        for (int i = 0; i < 6; i++) zmq_send(a->rep, parts[i], lens[i], i < 5 ? ZMQ_SNDMORE : 0);
        for (int i = 0; i < n; i++) zmq_msg_close(&f[i]);
    }
    return NULL;
}

int zs_auth_start(zs_auth *a, void *zctx, rl_err *err) {
    memset(a, 0, sizeof *a);
    a->zctx = zctx;
    a->log = true;
    pthread_mutex_init(&a->allow.mu, NULL);
    a->rep = zmq_socket(zctx, ZMQ_REP);
    if (!a->rep || zmq_bind(a->rep, "inproc://zeromq.zap.01") != 0) {
        return rl_errf(err, "cannot start the authentication handler: %s", zmq_strerror(errno));
    }
    a->running = true;
    if (pthread_create(&a->thread, NULL, zs_auth_main, a) != 0) {
        a->running = false;
        zmq_close(a->rep);
        return rl_errf(err, "cannot start the authentication thread");
    }
    return 0;
}

void zs_auth_stop(zs_auth *a) {
    if (!a->running) return;
    a->running = false;
    pthread_join(a->thread, NULL);
    zmq_close(a->rep);
    pthread_mutex_destroy(&a->allow.mu);
}

void zs_auth_allow(zs_auth *a, const uint8_t curve_pk[32], const char *label, const char *name) {
    pthread_mutex_lock(&a->allow.mu);
    bool have = false;
    for (int i = 0; i < a->allow.n; i++) have |= memcmp(a->allow.curve_pk[i], curve_pk, 32) == 0;
    if (!have && a->allow.n < ZS_MAX_ALLOW) {
        memcpy(a->allow.curve_pk[a->allow.n], curve_pk, 32);
        snprintf(a->allow.label[a->allow.n], sizeof a->allow.label[0], "%s", label);
        snprintf(a->allow.name[a->allow.n], sizeof a->allow.name[0], "%s", name ? name : "");
        a->allow.n++;
    }
    pthread_mutex_unlock(&a->allow.mu);
}

void zs_auth_forget(zs_auth *a, const char *label) {
    pthread_mutex_lock(&a->allow.mu);
    int k = 0;
    for (int i = 0; i < a->allow.n; i++) {
        if (strcmp(a->allow.label[i], label) == 0) continue;
        memmove(a->allow.curve_pk[k], a->allow.curve_pk[i], 32);
        memmove(a->allow.label[k], a->allow.label[i], sizeof a->allow.label[0]);
        memmove(a->allow.name[k], a->allow.name[i], sizeof a->allow.name[0]);
        k++;
    }
    a->allow.n = k;
    pthread_mutex_unlock(&a->allow.mu);
}

/* ---- sockets ----------------------------------------------------------------------------------- */

/* ZMTP heartbeats: a link whose peer went silent (a process stopped, a cable pulled, a router that drops: no
 * RST ever comes) is closed by the side that pings. A server pings every second and gives up after 5 s: the
 * dialling side (the coordinator, the upstream stage) is the one that must notice fast, and a server that
 * gave up early on a slow link would cut a healthy one. A client pings every link_s / 5 and gives up link_s *
 * 0.6 after a ping that got no traffic back, so a silent peer is noticed within link_s of its last word
 * (with the 0.1 s polls of the waits that watch the monitor); its TTL asks the server to wait 10 s. */
static void zs_common(void *s, double link_s) {
    int zero = 0, ivl = 1000, ttl = 10000, tmo = 5000;
    if (link_s > 0) {
        ivl = (int)(link_s * 1000 / 5 + 0.5);
        tmo = (int)(link_s * 1000 * 0.6 + 0.5);
        if (ivl < 10) ivl = 10;
        if (tmo < 30) tmo = 30;
    }
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_HEARTBEAT_IVL, &ivl, sizeof ivl);
    zmq_setsockopt(s, ZMQ_HEARTBEAT_TTL, &ttl, sizeof ttl);
    zmq_setsockopt(s, ZMQ_HEARTBEAT_TIMEOUT, &tmo, sizeof tmo);
}

double zs_link_bound(double floor_s, double rtt_s) {
    double b = floor_s > 0 ? floor_s : ZS_LINK_S;
    return 3 * rtt_s > b ? 3 * rtt_s : b;
}

void *zs_server(void *zctx, const char *host_port, const keys_identity *id, rl_err *err) {
    void *s = zmq_socket(zctx, ZMQ_ROUTER);
    if (!s) {
        rl_errf(err, "cannot create a socket: %s", zmq_strerror(errno));
        return NULL;
    }
    zs_common(s, 0);
    int one = 1;
    int64_t max = (int64_t)2 << 30; /* frames above 2 GiB are refused before they are read */
    zmq_setsockopt(s, ZMQ_CURVE_SERVER, &one, sizeof one);
    zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, id->curve_sk_z85, 40);
    zmq_setsockopt(s, ZMQ_ZAP_DOMAIN, "ringlm", 6);
    zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &max, sizeof max);
    zmq_setsockopt(s, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
    /* No ZMQ_ROUTER_HANDOVER: every client socket has a routing id of its own (zs_client's callers make
     * them unique), so no connection ever takes over another's. Handing a live pipe to a new connection is
     * what aborted nodes inside libzmq 4.3.4 (stream_engine_base.cpp:331, !_io_error) when two coordinator
     * processes with one key took turns on the same routing id (docs/ring.md). */
    char ep[300];
    snprintf(ep, sizeof ep, "tcp://%s", host_port);
    if (zmq_bind(s, ep) != 0) {
        rl_errf(err, "cannot listen on %s: %s", host_port, zmq_strerror(errno));
        zmq_close(s);
        return NULL;
    }
    return s;
}

void *zs_client(void *zctx, tn_connector *tn, const char *host_port, const keys_identity *id,
                const char *server_curve_z85, const char *routing_id, double link_s, rl_err *err) {
    char relay[128], local[80];
    if (tn_addr_relay(host_port, relay, sizeof relay)) { /* a node behind a NAT: through our connector */
        uint8_t pk[32];
        if (!tn) {
            rl_errf(err, "%s is reached through a relay, and this process has no relay connector", host_port);
            return NULL;
        }
        if (!zmq_z85_decode(pk, server_curve_z85) || tn_connector_endpoint(tn, relay, pk, local, sizeof local, err) != 0)
            return NULL;
        host_port = local;
    }
    void *s = zmq_socket(zctx, ZMQ_DEALER);
    if (!s) {
        rl_errf(err, "cannot create a socket: %s", zmq_strerror(errno));
        return NULL;
    }
    zs_common(s, link_s > 0 ? link_s : ZS_LINK_S);
    int one = 1;
    zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, server_curve_z85, 40);
    zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, id->curve_pk_z85, 40);
    zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, id->curve_sk_z85, 40);
    zmq_setsockopt(s, ZMQ_IMMEDIATE, &one, sizeof one); /* queue nothing for a peer that is not there */
    if (routing_id) zmq_setsockopt(s, ZMQ_ROUTING_ID, routing_id, strlen(routing_id));
    char ep[300];
    snprintf(ep, sizeof ep, "tcp://%s", host_port);
    if (zmq_connect(s, ep) != 0) {
        rl_errf(err, "bad address %s: %s", host_port, zmq_strerror(errno));
        zmq_close(s);
        return NULL;
    }
    return s;
}

int zs_send(void *sock, const void *const *data, const size_t *len, int n, bool dontwait, rl_err *err) {
    for (int i = 0; i < n; i++) {
        int flags = (i < n - 1 ? ZMQ_SNDMORE : 0) | (dontwait ? ZMQ_DONTWAIT : 0);
        if (zmq_send(sock, data[i], len[i], flags) < 0) {
            return rl_errf(err, "send failed (part %d of %d, %zu bytes): %s", i + 1, n, len[i],
                           errno == EHOSTUNREACH ? "peer not connected" : zmq_strerror(errno));
        }
    }
    return 0;
}

bool zs_wait_writable(void *sock, int timeout_ms) {
    zmq_pollitem_t it = {sock, 0, ZMQ_POLLOUT, 0};
    return zmq_poll(&it, 1, timeout_ms) > 0 && (it.revents & ZMQ_POLLOUT);
}

int zs_recv(void *sock, zs_parts *p, rl_err *err) {
    memset(p, 0, sizeof *p);
    p->fd = -1;
    int more = 1;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, sock, p->n == 0 ? ZMQ_DONTWAIT : 0) < 0) {
            zmq_msg_close(&m);
            if (p->n == 0 && errno == EAGAIN) return 1;
            zs_parts_free(p);
            return rl_errf(err, "receive failed: %s", zmq_strerror(errno));
        }
        more = zmq_msg_more(&m);
        /* A ROUTER's routing id part is made locally: the connection's metadata comes with the parts after it. */
        if (p->fd < 0) p->fd = zmq_msg_get(&m, ZMQ_SRCFD);
        if (!p->user[0] || !p->peer[0]) {
            const char *u = zmq_msg_gets(&m, "User-Id"), *a = zmq_msg_gets(&m, "Peer-Address");
            if (u && !p->user[0]) snprintf(p->user, sizeof p->user, "%s", u);
            if (a && !p->peer[0]) snprintf(p->peer, sizeof p->peer, "%s", a);
        }
        if (p->n < 5) {
            p->len[p->n] = zmq_msg_size(&m);
            p->data[p->n] = malloc(p->len[p->n] + 1);
            if (p->data[p->n]) memcpy(p->data[p->n], zmq_msg_data(&m), p->len[p->n]);
            p->n++;
        } else {
            p->n = 6; /* too many parts: mark, keep draining */
        }
        zmq_msg_close(&m);
    }
    if (p->n > 5) {
        p->n = 5;
        zs_parts_free(p);
        return rl_errf(err, "message has too many parts");
    }
    for (int i = 0; i < p->n; i++) {
        if (!p->data[i]) {
            zs_parts_free(p);
            return rl_errf(err, "out of memory receiving a message");
        }
    }
    return 0;
}

void zs_parts_free(zs_parts *p) {
    for (int i = 0; i < p->n && i < 5; i++) free(p->data[i]);
    memset(p, 0, sizeof *p);
}

/* ---- monitors ---------------------------------------------------------------------------------- */

static int zs_monitor_start_events(zs_monitor *m, void *zctx, void *sock, const char *name, int events, rl_err *err) {
    memset(m, 0, sizeof *m);
    m->watch_fd = -1;
    char ep[96];
    snprintf(ep, sizeof ep, "inproc://mon-%s-%p", name, sock);
    if (zmq_socket_monitor(sock, ep, events) != 0) return rl_errf(err, "cannot monitor a socket");
    m->pair = zmq_socket(zctx, ZMQ_PAIR);
    if (!m->pair) return rl_errf(err, "cannot monitor a socket");
    int zero = 0;
    zmq_setsockopt(m->pair, ZMQ_LINGER, &zero, sizeof zero);
    /* Unbounded: libzmq sends monitor events with a blocking send from its I/O thread, so a full queue
     * would stop every socket of the context (set before connecting: inproc takes the HWM at connect). */
    zmq_setsockopt(m->pair, ZMQ_RCVHWM, &zero, sizeof zero);
    if (zmq_connect(m->pair, ep) != 0) {
        zmq_close(m->pair);
        m->pair = NULL;
        return rl_errf(err, "cannot monitor a socket");
    }
    return 0;
}

int zs_monitor_start(zs_monitor *m, void *zctx, void *sock, const char *name, rl_err *err) {
    return zs_monitor_start_events(m, zctx, sock, name, ZMQ_EVENT_ALL, err);
}

int zs_monitor_start_gone(zs_monitor *m, void *zctx, void *sock, const char *name, rl_err *err) {
    return zs_monitor_start_events(m, zctx, sock, name, ZMQ_EVENT_DISCONNECTED, err);
}

void zs_monitor_poll(zs_monitor *m) {
    for (;;) {
        zmq_msg_t a, b;
        zmq_msg_init(&a);
        if (zmq_msg_recv(&a, m->pair, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&a);
            return;
        }
        zmq_msg_init(&b);
        zmq_msg_recv(&b, m->pair, 0);
        uint16_t ev = 0;
        uint32_t val = 0;
        if (zmq_msg_size(&a) >= 6) {
            memcpy(&ev, zmq_msg_data(&a), 2);
            memcpy(&val, (char *)zmq_msg_data(&a) + 2, 4);
        }
        switch (ev) {
        case ZMQ_EVENT_CONNECTED:
            m->tcp_up = true;
            m->shaken = false;
            break;
        case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
            m->failed = true, m->hs_failures++;
            snprintf(m->last, sizeof m->last, "it refused our key (status %u)", val);
            break;
        case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
        case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
            m->failed = true, m->hs_failures++;
            /* CURVE reports a message that fails authentication (altered on the way) the same way. */
            snprintf(m->last, sizeof m->last,
                     "the encrypted link failed (its key is not the one in ring.conf, or the stream was altered)");
            break;
        case ZMQ_EVENT_CONNECT_RETRIED:
            if (!m->last[0]) snprintf(m->last, sizeof m->last, "connection refused (nothing listening there?)");
            break;
        case ZMQ_EVENT_HANDSHAKE_SUCCEEDED:
            m->last[0] = 0;
            m->disconnected = m->failed = false;
            m->shaken = true;
            break;
        case ZMQ_EVENT_DISCONNECTED:
            if (m->watch_fd >= 0 && (int)val == m->watch_fd) m->watch_gone = true;
            if (m->failed) {
                /* keep the handshake's own reason */
            } else if (m->tcp_up && !m->shaken) {
                /* The server dropped us mid-handshake without an ERROR: CURVE servers do that to a client
                 * whose HELLO is not sealed for their key. */
                m->failed = true;
                snprintf(m->last, sizeof m->last,
                         "it closed the connection during the encrypted handshake: the key ring.conf gives for it is "
                         "not its key (`ringlm node` prints its key at start), or it is no ringlm node");
            } else {
                m->disconnected = true;
                snprintf(m->last, sizeof m->last, "its connection closed (the process died or the network dropped)");
            }
            m->tcp_up = m->shaken = false;
            break;
        default:
            break;
        }
        zmq_msg_close(&a);
        zmq_msg_close(&b);
    }
}

void zs_monitor_stop(zs_monitor *m) {
    if (m->pair) zmq_close(m->pair);
    m->pair = NULL;
}
