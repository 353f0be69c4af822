/* probe.c - a node times round trips to its ring peers (probe.h). */
#include "probe.h"
#include "../base/clock.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include <sodium.h>
#include <zmq.h>

#include "../wire/frame.h"
#include "zsock.h"

static int probe_send_ping(void *sock, uint64_t step, rl_err *err) {
    frame_header h = {.type = FRAME_PROBE_PING, .step_id = step};
    uint8_t hb[64];
    frame_header_encode(&h, hb);
    const void *parts[2] = {hb, ""};
    size_t lens[2] = {frame_header_size(0), 0};
    return zs_send(sock, parts, lens, 2, true, err);
}

int probe_measure(void *zctx, tn_connector *tn, const keys_identity *id, const probe_peer *peers, int n, double timeout_s, double *rtt_s,
               rl_err *err) {
    void *socks[PB_MAX_PEERS] = {0};
    double sent[PB_MAX_PEERS];
    int round[PB_MAX_PEERS]; /* the round whose PONG peer i owes; PB_ROUNDS: done */
    if (n > PB_MAX_PEERS) return rl_errf(err, "probe: %d peers, at most %d", n, PB_MAX_PEERS);
    int rc = 0;
    char rid[80];
    snprintf(rid, sizeof rid, "probe-%.16s-%08x", id->pk_hex, randombytes_random());
    for (int i = 0; i < n && rc == 0; i++) {
        rtt_s[i] = -1;
        round[i] = 0;
        socks[i] = zs_client(zctx, tn, peers[i].addr, id, peers[i].key.curve_pk_z85, rid, ZS_LINK_SLOW_S, err); /* round trips unknown yet */
        if (!socks[i]) rc = rl_err_prefix(err, "probe: node %s", peers[i].addr);
    }
    /* Every peer at once: the first ping is queued until its handshake is done, so the first round trip
     * includes the handshake; the later ones do not, and the fastest is kept. */
    const double t0 = rl_clock_now();
    for (int i = 0; i < n && rc == 0; i++) {
        sent[i] = rl_clock_now();
        rl_err e2;
        if (probe_send_ping(socks[i], 0, &e2) != 0) sent[i] = -1; /* not connected yet: resent below */
    }
    int left = n;
    while (rc == 0 && left > 0 && rl_clock_now() - t0 < timeout_s) {
        zmq_pollitem_t items[PB_MAX_PEERS];
        for (int i = 0; i < n; i++) items[i] = (zmq_pollitem_t){socks[i], 0, ZMQ_POLLIN, 0};
        if (zmq_poll(items, n, 20) < 0 && errno != EINTR) {
            rc = rl_errf(err, "probe: poll failed: %s", zmq_strerror(errno));
            break;
        }
        for (int i = 0; i < n; i++) {
            if (round[i] < PB_ROUNDS && sent[i] < 0) { /* IMMEDIATE sockets drop what they cannot deliver yet */
                rl_err e2;
                if (probe_send_ping(socks[i], (uint64_t)round[i], &e2) == 0) sent[i] = rl_clock_now();
            }
            if (!(items[i].revents & ZMQ_POLLIN)) continue;
            for (;;) {
                zs_parts p;
                rl_err e2;
                int r = zs_recv(socks[i], &p, &e2);
                if (r != 0) break;
                frame_header h;
                double now = rl_clock_now();
                if (p.n >= 2 && frame_header_decode(&h, p.data[0], p.len[0], &e2) == 0 && h.type == FRAME_PROBE_PONG &&
                    round[i] < PB_ROUNDS && h.step_id == (uint64_t)round[i] && sent[i] >= 0) {
                    double rtt = now - sent[i];
                    if (rtt_s[i] < 0 || rtt < rtt_s[i]) rtt_s[i] = rtt;
                    if (++round[i] == PB_ROUNDS) {
                        left--;
                    } else {
                        sent[i] = rl_clock_now();
                        if (probe_send_ping(socks[i], (uint64_t)round[i], &e2) != 0) sent[i] = -1;
                    }
                }
                zs_parts_free(&p);
            }
        }
    }
    for (int i = 0; i < n; i++) {
        if (!socks[i]) continue;
        int zero = 0;
        zmq_setsockopt(socks[i], ZMQ_LINGER, &zero, sizeof zero);
        zmq_close(socks[i]);
    }
    return rc;
}
