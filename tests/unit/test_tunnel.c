/* test_tunnel.c - the relay for nodes behind NATs (net/tunnel.h), on loopback: relayed addresses parsed; a
 * node's dial-out and a client's connector carry bytes both ways through the relay, for several connections
 * one after another and at once, a half close passed on; the relay's refusals by name: a registration
 * whose signature does not prove its key, a key the admission refuses (the node's dial-out then says why), a
 * client or a query for a key nobody registered; a query for a registered node answers yes. */
#include <poll.h>
#include <pthread.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "net/addr.h"
#include "net/tunnel.h"
#include "net/tunnel_int.h"

/* An echo server standing in for a node's ZeroMQ endpoint: every connection gets its bytes back, and its
 * half close answered by a close. */
typedef struct echo {
    int lfd;
    char addr[80];
    tn_threads th;
} echo;

typedef struct echo_conn {
    echo *e;
    int fd;
} echo_conn;

static void *echo_conn_main(void *arg) {
    echo_conn *c = arg;
    uint8_t b[4096];
    for (;;) {
        struct pollfd p = {c->fd, POLLIN, 0};
        if (poll(&p, 1, 200) == 0) {
            if (atomic_load(&c->e->th.stop)) break;
            continue;
        }
        ssize_t k = recv(c->fd, b, sizeof b, 0);
        if (k <= 0) break;
        if (tn_write_full(c->fd, b, (size_t)k, 5, NULL, NULL) != 0) break;
    }
    close(c->fd);
    tn_threads_exit(&c->e->th);
    free(c);
    return NULL;
}

static void *echo_main(void *arg) {
    echo *e = arg;
    while (!atomic_load(&e->th.stop)) {
        struct pollfd p = {e->lfd, POLLIN, 0};
        if (poll(&p, 1, 200) <= 0) continue;
        echo_conn *c = malloc(sizeof *c);
        c->e = e;
        c->fd = tn_accept(e->lfd, NULL, 0);
        if (c->fd < 0 || tn_threads_spawn(&e->th, echo_conn_main, c, NULL) != 0) {
            if (c->fd >= 0) close(c->fd);
            free(c);
        }
    }
    tn_threads_exit(&e->th);
    return NULL;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Connects to a connector's loopback port, sends msg, reads it back: through the relay to the echo. */
static bool round_trip(const char *ep, const char *msg) {
    int fd = tn_dial(ep, 5, NULL, NULL);
    if (fd < 0) return false;
    size_t n = strlen(msg);
    char back[256] = {0};
    bool ok = tn_write_full(fd, msg, n, 5, NULL, NULL) == 0 && tn_read_full(fd, back, n, 5, NULL, NULL) == 0 &&
              memcmp(back, msg, n) == 0;
    /* our half close travels to the echo, which closes: that comes back as EOF */
    shutdown(fd, SHUT_WR);
    char x;
    rl_err err = {{0}};
    ok = ok && tn_read_full(fd, &x, 1, 5, NULL, &err) != 0 && strstr(err.msg, "closed");
    close(fd);
    return ok;
}

typedef struct par {
    const char *ep;
    int i;
    bool ok;
} par;

static void *par_main(void *arg) {
    par *p = arg;
    char msg[64];
    snprintf(msg, sizeof msg, "connection %d says hello", p->i);
    p->ok = round_trip(p->ep, msg);
    return NULL;
}

static bool refuse_b(void *ctx, const uint8_t sign_pk[32], const uint8_t *token, size_t token_len, char *why, size_t n) {
    (void)token, (void)token_len;
    if (memcmp(ctx, sign_pk, 32) == 0) {
        snprintf(why, n, "not this one");
        return false;
    }
    return true;
}

int main(void) {
    if (sodium_init() < 0) return 1;
    char relay[128];
    /* HOST:PORT, as every address is split (net/addr.h) */
    {
        char h[64], pt[8];
        rl_err ae;
        CHECK(net_addr_split("10.0.0.1:7700", h, sizeof h, pt, sizeof pt, &ae) == 0 && strcmp(h, "10.0.0.1") == 0 &&
                  strcmp(pt, "7700") == 0, "HOST:PORT split");
        CHECK(net_addr_split("[::1]:9", h, sizeof h, pt, sizeof pt, &ae) == 0 && strcmp(h, "::1") == 0 && strcmp(pt, "9") == 0,
              "[V6]:PORT split, brackets dropped");
        CHECK(net_addr_split("::1:80", h, sizeof h, pt, sizeof pt, &ae) == 0 && strcmp(h, "::1") == 0 && strcmp(pt, "80") == 0,
              "an unbracketed V6 address: the port after the last colon");
        CHECK(net_addr_split(":7", h, sizeof h, pt, sizeof pt, &ae) == 0 && h[0] == 0 && strcmp(pt, "7") == 0,
              ":PORT: the host empty (every address)");
        const char *bad[][2] = {{"example.org", "want HOST:PORT"}, {"h:", "port must be"}, {"h:65536", "port must be"},
                                {"h:8x", "port must be"}, {"h:-1", "port must be"}, {"[::1", "want [HOST]:PORT"},
                                {"[::1]80", "want [HOST]:PORT"}};
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            CHECK(net_addr_split(bad[i][0], h, sizeof h, pt, sizeof pt, &ae) != 0 && strstr(ae.msg, bad[i][1]) &&
                      strstr(ae.msg, bad[i][0]), "'%s' refused: %s", bad[i][0], ae.msg);
        }
        char tiny[4];
        CHECK(net_addr_split("abcd:1", tiny, sizeof tiny, pt, sizeof pt, &ae) != 0 && strstr(ae.msg, "too long"),
              "a host longer than its buffer refused");
    }
    CHECK(tn_addr_relay("relay:10.0.0.1:7700/ab12cd34", relay, sizeof relay) && strcmp(relay, "10.0.0.1:7700") == 0,
          "relay:HOST:PORT/TAG names its relay");
    CHECK(tn_addr_relay("relay:[::1]:7700", relay, sizeof relay) && strcmp(relay, "[::1]:7700") == 0, "... and without a tag, IPv6");
    CHECK(!tn_addr_relay("10.0.0.1:7700", relay, sizeof relay) && !tn_addr_relay("relay:", relay, sizeof relay) &&
              !tn_addr_relay("relay:nohostport", relay, sizeof relay),
          "a plain address, an empty or portless relay are not relayed addresses");

    keys_identity a, b;
    rl_err err = {{0}};
    if (keys_generate(&a, &err) != 0 || keys_generate(&b, &err) != 0) return 1;
    echo e = {0};
    e.lfd = tn_listen("127.0.0.1:0", e.addr, sizeof e.addr, &err);
    tn_threads_init(&e.th);
    if (e.lfd < 0 || tn_threads_spawn(&e.th, echo_main, &e, &err) != 0) return 1;

    tn_relay *r = tn_relay_start("127.0.0.1:0", refuse_b, b.sign_pk, false, &err);
    CHECK(r != NULL, "a relay listens on a free port (%s)", r ? tn_relay_addr(r) : err.msg);
    if (!r) return check_done();
    const char *ra = tn_relay_addr(r);
    tn_dialout *da = tn_dialout_start(ra, &a, e.addr, NULL, false, &err);
    tn_dialout *db = tn_dialout_start(ra, &b, e.addr, NULL, false, &err);
    bool up = false;
    char why[300] = "";
    for (int k = 0; k < 100 && !up; k++, sleep_ms(50)) up = tn_relay_has(r, a.curve_pk);
    CHECK(up, "a node's dial-out registers at the relay");
    for (int k = 0; k < 100 && !strstr(why, "not this one"); k++, sleep_ms(50)) tn_dialout_state(db, why, sizeof why);
    CHECK(strstr(why, "the relay refused: not this one") && !tn_relay_has(r, b.curve_pk),
          "a key the relay's admission refuses is not registered, and its dial-out says why (%s)", why);

    tn_connector *c = tn_connector_new(&err);
    char ep[80], ep2[80];
    CHECK(c && tn_connector_endpoint(c, ra, a.curve_pk, ep, sizeof ep, &err) == 0 &&
              tn_connector_endpoint(c, ra, a.curve_pk, ep2, sizeof ep2, &err) == 0 && strcmp(ep, ep2) == 0,
          "the connector gives one loopback port per relayed node (%s)", ep);
    bool seq = true;
    for (int k = 0; k < 5; k++) seq = seq && round_trip(ep, "hello through the relay");
    CHECK(seq, "5 connections one after another: bytes both ways, half closes passed on");
    par ps[6];
    pthread_t th[6];
    for (int k = 0; k < 6; k++) {
        ps[k] = (par){ep, k, false};
        pthread_create(&th[k], NULL, par_main, &ps[k]);
    }
    bool all = true;
    for (int k = 0; k < 6; k++) {
        pthread_join(th[k], NULL);
        all = all && ps[k].ok;
    }
    CHECK(all, "6 connections at once (more than the %d a node keeps waiting): all carried", TN_POOL);
    tn_relay_stats st;
    tn_relay_stats_get(r, &st);
    CHECK(st.spliced == 11 && st.refused >= 1, "the relay counts what it handed over (%ld) and refused (%ld)", st.spliced, st.refused);

    /* (its waiting connections were just used: there once its dial-out has put one back, at once here, a
     * while under emulation) */
    bool there = false;
    for (int k = 0; k < 100 && !there; k++) {
        there = tn_query(ra, a.curve_pk, 2, &err) == 0;
        if (!there) sleep_ms(100);
    }
    CHECK(there, "a query for a registered node: there");
    CHECK(tn_query(ra, b.curve_pk, 2, &err) != 0 && strstr(err.msg, "no node with that key has dialled this relay"),
          "a query for a refused key: not there, by name (%s)", err.msg);
    char ep3[80], cwhy[300] = "";
    tn_connector_endpoint(c, ra, b.curve_pk, ep3, sizeof ep3, &err);
    int fd = tn_dial(ep3, 5, NULL, NULL);
    char x;
    bool closed = fd >= 0 && tn_read_full(fd, &x, 1, 5, NULL, NULL) != 0;
    if (fd >= 0) close(fd);
    for (int k = 0; k < 100 && !cwhy[0]; k++, sleep_ms(20)) tn_connector_why(c, b.curve_pk, cwhy, sizeof cwhy);
    CHECK(closed && strstr(cwhy, "no node with that key"), "a connection to an unregistered key is closed, and the connector says why (%s)", cwhy);

    /* A registration whose signature is not the key's: read the greeting, claim a's key, sign with b's. */
    int rfd = tn_dial(ra, 5, NULL, &err);
    uint8_t hello[36], out[99] = {'R'};
    bool got = rfd >= 0 && tn_read_greeting(rfd, hello, NULL, &err) == 0;
    memcpy(out + 1, a.sign_pk, 32);
    crypto_sign_detached(out + 33, NULL, hello + 4, 32, b.sign_sk);
    got = got && tn_write_full(rfd, out, sizeof out, 5, NULL, &err) == 0;
    rl_err rerr = {{0}};
    CHECK(got && tn_read_reply(rfd, NULL, &rerr) != 0 && strstr(rerr.msg, "the signature does not prove the key"),
          "a registration signed by another key is refused by name (%s)", rerr.msg);
    if (rfd >= 0) close(rfd);
    int zfd = tn_dial(e.addr, 5, NULL, &err);
    tn_write_full(zfd, "not a relay at all, this echo server", 36, 5, NULL, NULL);
    rl_err gerr = {{0}};
    CHECK(tn_read_greeting(zfd, hello, NULL, &gerr) != 0 && strstr(gerr.msg, "not a ringlm relay"),
          "something that is no relay is named so (%s)", gerr.msg);
    close(zfd);

    /* A flood: connections that read the greeting and say nothing, each holding one of the relay's threads for
     * up to TN_HANDSHAKE_S. Past TN_RELAY_CONNS the relay closes new ones at once; once the flood closes,
     * the relayed node is reached again. The test holds both ends of every connection: it needs the fds. */
    struct rlimit rl;
    const rlim_t want = 2 * TN_RELAY_CONNS + 256;
    bool fds = getrlimit(RLIMIT_NOFILE, &rl) == 0 &&
               (rl.rlim_cur >= want || (rl.rlim_max >= want && (rl.rlim_cur = want, setrlimit(RLIMIT_NOFILE, &rl) == 0)));
    if (!fds) {
        SKIP("a flood of %d connections at the relay: this process may open only %ld files", TN_RELAY_CONNS + 1,
             (long)rl.rlim_max);
    } else {
        int *flood = malloc((TN_RELAY_CONNS + 8) * sizeof *flood);
        int n_greeted = 0, refused_at = -1;
        rl_err ferr = {{0}};
        for (int k = 0; flood && k < TN_RELAY_CONNS + 8; k++) {
            flood[k] = tn_dial(ra, 5, NULL, &ferr);
            if (flood[k] < 0) break;
            if (tn_read_greeting(flood[k], hello, NULL, &ferr) != 0) {
                refused_at = k;
                close(flood[k]);
                break;
            }
            n_greeted++;
        }
        /* a few threads of the connections carried above may still be ending: at most TN_POOL + 6 */
        CHECK(refused_at >= 0 && n_greeted <= TN_RELAY_CONNS && n_greeted >= TN_RELAY_CONNS - 8,
              "a flood of silent connections: %d greeted, the next closed at once (%s; at most %d at a time)", n_greeted,
              ferr.msg, TN_RELAY_CONNS);
        for (int k = 0; k < n_greeted; k++) close(flood[k]);
        free(flood);
        bool back = false;
        for (int k = 0; k < 100 && !back; k++, sleep_ms(50)) back = round_trip(ep, "after the flood");
        CHECK(back, "... and once it closes, the relayed node is reached again");
    }

    tn_connector_free(c);
    tn_dialout_stop(da);
    tn_dialout_stop(db);
    tn_relay_stop(r);
    tn_threads_stop(&e.th);
    close(e.lfd);
    return check_done();
}
