/* tunnel_io.c - threads, TCP sockets with timeouts and the byte pump that the relay, the dial-out and the
 * connector share (tunnel_int.h). */
#include "tunnel_int.h"
#include "tunnel.h"
#include "addr.h"
#include "../base/clock.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

double tn_now(void) { return rl_clock_now(); }

bool tn_addr_relay(const char *addr, char *relay, size_t n) {
    if (strncmp(addr, "relay:", 6) != 0) return false;
    const char *s = addr + 6, *e = strchr(s, '/');
    size_t len = e ? (size_t)(e - s) : strlen(s);
    if (len == 0 || len >= n || !memchr(s, ':', len)) return false;
    memcpy(relay, s, len);
    relay[len] = 0;
    return true;
}

/* ---- threads ---- */

void tn_threads_init(tn_threads *t) {
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    t->live = 0;
    atomic_store(&t->stop, false);
}

int tn_threads_spawn(tn_threads *t, void *(*fn)(void *), void *arg, rl_err *err) {
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    pthread_mutex_lock(&t->mu);
    t->live++;
    pthread_mutex_unlock(&t->mu);
    pthread_t th;
    int e = pthread_create(&th, &at, fn, arg);
    pthread_attr_destroy(&at);
    if (e != 0) {
        pthread_mutex_lock(&t->mu);
        t->live--;
        pthread_cond_broadcast(&t->cv);
        pthread_mutex_unlock(&t->mu);
        return rl_errf(err, "cannot start a thread: %s", strerror(e));
    }
    return 0;
}

void tn_threads_exit(tn_threads *t) {
    pthread_mutex_lock(&t->mu);
    t->live--;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

void tn_threads_stop(tn_threads *t) {
    atomic_store(&t->stop, true);
    pthread_mutex_lock(&t->mu);
    while (t->live > 0) pthread_cond_wait(&t->cv, &t->mu);
    pthread_mutex_unlock(&t->mu);
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv);
}

static bool tn_stopping(const tn_threads *t) { return t && atomic_load(&((tn_threads *)t)->stop); }

/* ---- sockets ---- */

void tn_sock_setup(int fd) {
    int one = 1, idle = 10, intvl = 5, cnt = 3;
    unsigned tmo = 20000;
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* a ring's frames are latency-bound */
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &tmo, sizeof tmo);
}

static struct addrinfo *tn_resolve(const char *host_port, bool passive, rl_err *err) {
    char host[256], port[16];
    if (net_addr_split(host_port, host, sizeof host, port, sizeof port, err) != 0) return NULL;
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = passive ? AI_PASSIVE : 0;
    int e = getaddrinfo(host[0] && strcmp(host, "*") != 0 ? host : NULL, port, &hints, &res);
    if (e != 0 || !res) {
        rl_errf(err, "cannot resolve '%s': %s", host_port, gai_strerror(e));
        return NULL;
    }
    return res;
}

static void tn_name(const struct sockaddr *sa, char *out, size_t n) {
    char h[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *s4 = (const struct sockaddr_in *)sa;
        inet_ntop(AF_INET, &s4->sin_addr, h, sizeof h);
        port = ntohs(s4->sin_port);
        snprintf(out, n, "%s:%d", h, port);
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)sa;
        inet_ntop(AF_INET6, &s6->sin6_addr, h, sizeof h);
        port = ntohs(s6->sin6_port);
        snprintf(out, n, "[%s]:%d", h, port);
    } else {
        snprintf(out, n, "?");
    }
}

int tn_listen(const char *host_port, char *bound, size_t bound_n, rl_err *err) {
    struct addrinfo *res = tn_resolve(host_port, true, err);
    if (!res) return -1;
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    if (fd < 0) {
        freeaddrinfo(res);
        return rl_errf(err, "cannot listen on %s: %s", host_port, strerror(errno));
    }
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, res->ai_addr, res->ai_addrlen) != 0 || listen(fd, 64) != 0) {
        int e = errno;
        close(fd);
        freeaddrinfo(res);
        return rl_errf(err, "cannot listen on %s: %s", host_port, strerror(e));
    }
    freeaddrinfo(res);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    if (bound) tn_name((struct sockaddr *)&ss, bound, bound_n);
    return fd;
}

int tn_accept(int lfd, char *peer, size_t peer_n) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    int fd = accept4(lfd, (struct sockaddr *)&ss, &sl, SOCK_CLOEXEC);
    if (fd < 0) return -1;
    if (peer) tn_name((struct sockaddr *)&ss, peer, peer_n);
    tn_sock_setup(fd);
    return fd;
}

int tn_dial(const char *host_port, double timeout_s, const tn_threads *t, rl_err *err) {
    struct addrinfo *res = tn_resolve(host_port, false, err);
    if (!res) return -1;
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        freeaddrinfo(res);
        return rl_errf(err, "cannot connect to %s: %s", host_port, strerror(errno));
    }
    tn_sock_setup(fd);
    int rc = connect(fd, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    if (rc != 0 && errno != EINPROGRESS) {
        int e = errno;
        close(fd);
        return rl_errf(err, "cannot connect to %s: %s", host_port, strerror(e));
    }
    double end = tn_now() + timeout_s;
    while (rc != 0) {
        struct pollfd p = {fd, POLLOUT, 0};
        int w = poll(&p, 1, TN_TICK_MS);
        if (w > 0) {
            int e = 0;
            socklen_t el = sizeof e;
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el);
            if (e != 0) {
                close(fd);
                return rl_errf(err, "cannot connect to %s: %s", host_port, strerror(e));
            }
            break;
        }
        if (tn_stopping(t) || tn_now() > end) {
            close(fd);
            return rl_errf(err, "cannot connect to %s: no answer within %.0f s", host_port, timeout_s);
        }
    }
    return fd;
}

static int tn_io_full(int fd, void *buf, size_t n, bool wr, double timeout_s, const tn_threads *t, rl_err *err) {
    double end = tn_now() + timeout_s;
    size_t k = 0;
    while (k < n) {
        ssize_t r = wr ? send(fd, (const char *)buf + k, n - k, MSG_NOSIGNAL) : recv(fd, (char *)buf + k, n - k, 0);
        if (r > 0) {
            k += (size_t)r;
            continue;
        }
        if (r == 0) return rl_errf(err, "the connection closed");
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return rl_errf(err, "%s", strerror(errno));
        if (tn_stopping(t)) return rl_errf(err, "stopping");
        double left = end - tn_now();
        if (left <= 0) return rl_errf(err, "no answer within %.0f s", timeout_s);
        struct pollfd p = {fd, wr ? POLLOUT : POLLIN, 0};
        int ms = (int)(left * 1000) + 1;
        poll(&p, 1, ms < TN_TICK_MS ? ms : TN_TICK_MS);
    }
    return 0;
}

int tn_read_full(int fd, void *buf, size_t n, double timeout_s, const tn_threads *t, rl_err *err) {
    return tn_io_full(fd, buf, n, false, timeout_s, t, err);
}

int tn_write_full(int fd, const void *buf, size_t n, double timeout_s, const tn_threads *t, rl_err *err) {
    return tn_io_full(fd, (void *)buf, n, true, timeout_s, t, err);
}

int tn_read_greeting(int fd, uint8_t hello[36], const tn_threads *t, rl_err *err) {
    if (tn_read_full(fd, hello, 4, TN_HANDSHAKE_S, t, err) != 0) return rl_err_prefix(err, "its greeting");
    if (memcmp(hello, TN_MAGIC, 4) != 0) return rl_errf(err, "it is not a ringlm relay (its greeting is not \"" TN_MAGIC "\")");
    if (tn_read_full(fd, hello + 4, 32, TN_HANDSHAKE_S, t, err) != 0) return rl_err_prefix(err, "its greeting");
    return 0;
}

void tn_send_refusal(int fd, const char *msg, const tn_threads *t) {
    uint8_t b[258];
    size_t n = strlen(msg);
    if (n > 255) n = 255;
    b[0] = 'E';
    b[1] = (uint8_t)n;
    memcpy(b + 2, msg, n);
    tn_write_full(fd, b, n + 2, 1.0, t, NULL);
}

int tn_read_reply(int fd, const tn_threads *t, rl_err *err) {
    uint8_t c;
    if (tn_read_full(fd, &c, 1, TN_HANDSHAKE_S, t, err) != 0) return rl_err_prefix(err, "the relay's answer");
    if (c == 'K') return 0;
    uint8_t len;
    char msg[256];
    if (c != 'E' || tn_read_full(fd, &len, 1, TN_HANDSHAKE_S, t, NULL) != 0 ||
        tn_read_full(fd, msg, len, TN_HANDSHAKE_S, t, NULL) != 0)
        return rl_errf(err, "the relay answered something else than a ringlm relay would");
    msg[len] = 0;
    for (int i = 0; i < len; i++)
        if ((unsigned char)msg[i] < 32 || (unsigned char)msg[i] > 126) msg[i] = '?';
    return rl_errf(err, "the relay refused: %s", msg);
}

/* ---- the pump ---- */

typedef struct tn_dir {
    int from, to;
    uint8_t *buf;
    size_t len, off;
    bool eof;   /* from has ended and what it sent has been passed on (to is half closed) */
    bool ended; /* from said EOF */
} tn_dir;

#define TN_BUF (64 * 1024)
/* One direction ended (a half close), the other silent this long: the far side is gone without a word. */
#define TN_HALF_S 30.0

void tn_splice(int a, int b, const tn_threads *t) {
    uint8_t *mem = malloc(2 * TN_BUF);
    if (!mem) return;
    tn_dir d[2] = {{a, b, mem, 0, 0, false, false}, {b, a, mem + TN_BUF, 0, 0, false, false}};
    double last = tn_now();
    while (!tn_stopping(t) && !(d[0].eof && d[1].eof)) {
        struct pollfd p[4];
        int np = 0, idx[4];
        for (int k = 0; k < 2; k++) {
            if (d[k].len > d[k].off) {
                p[np] = (struct pollfd){d[k].to, POLLOUT, 0};
                idx[np++] = k * 2 + 1;
            } else if (!d[k].ended) {
                p[np] = (struct pollfd){d[k].from, POLLIN, 0};
                idx[np++] = k * 2;
            }
        }
        if (np == 0) break;
        int w = poll(p, (nfds_t)np, TN_TICK_MS);
        if (w < 0 && errno != EINTR) break;
        bool fail = false;
        for (int j = 0; j < np && w > 0 && !fail; j++) {
            if (!p[j].revents) continue;
            tn_dir *x = &d[idx[j] / 2];
            if (idx[j] % 2 == 0) {
                ssize_t r = recv(x->from, x->buf, TN_BUF, 0);
                if (r > 0) {
                    x->len = (size_t)r, x->off = 0, last = tn_now();
                } else if (r == 0) {
                    x->ended = true;
                } else if (errno != EAGAIN && errno != EINTR) {
                    fail = true;
                }
            } else {
                ssize_t r = send(x->to, x->buf + x->off, x->len - x->off, MSG_NOSIGNAL);
                if (r > 0) {
                    x->off += (size_t)r, last = tn_now();
                    if (x->off == x->len) x->len = x->off = 0;
                } else if (r < 0 && errno != EAGAIN && errno != EINTR) {
                    fail = true;
                }
            }
        }
        if (fail) break;
        for (int k = 0; k < 2; k++) {
            if (d[k].ended && !d[k].eof && d[k].len == d[k].off) {
                shutdown(d[k].to, SHUT_WR);
                d[k].eof = true;
            }
        }
        if ((d[0].eof || d[1].eof) && tn_now() - last > TN_HALF_S) break;
    }
    free(mem);
}
