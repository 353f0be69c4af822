/* relay.c - TCP relay with a one-way delay and a bandwidth cap (see relay.h, docs/relay.md).
 *
 * One epoll loop (edge-triggered) over the listening socket, a signalfd, one timerfd and both sockets of
 * every connection. Each connection has two directions; a direction reads its source socket into a queue of
 * chunks stamped with the time they were read, and writes a chunk's bytes to its destination once
 * now >= stamp + delay and the direction's rate cap lets them go. The single timerfd is armed at the
 * earliest time any direction waits for (scanned linearly over the connections, as Redis's ae.c does with
 * its time events): no sleeping, no thread per connection.
 *
 * Edge-triggered, because a level-triggered loop must keep re-registering interest as queues fill and drain,
 * and EPOLLHUP/EPOLLERR cannot be masked: a socket we are not reading from would wake the loop forever.
 * With edges we keep "readable"/"writable" flags per socket, set by events and cleared by EAGAIN, and any
 * code that stops before EAGAIN (queue full, fairness cap) arranges to come back by itself. */
#include "relay.h"
#include "../net/addr.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#define RELAY_READ_MAX (64 * 1024)      /* one recv() */
#define RELAY_QUEUE_MIN (4u << 20)      /* per direction; more when delay x rate needs it */
#define RELAY_PUMP_ROUNDS 64            /* read/write rounds for one connection before serving others */
#define RELAY_LAG_NS 50000000        /* rate cap: most link time made up after the relay fell behind */
#define RELAY_ACCEPT_PAUSE_NS 100000000 /* out of file descriptors: retry accepting after 100 ms */
#define RELAY_MAX_TO 16                 /* target addresses kept from the resolver */

typedef enum { RELAY_H_LISTEN, RELAY_H_SIGNAL, RELAY_H_TIMER, RELAY_H_END } relay_kind;

typedef struct relay_chunk {
    struct relay_chunk *next;
    int64_t t_ns; /* when it was read */
    size_t len, off;
    unsigned char data[];
} relay_chunk;

struct relay_conn;

/* One socket of a connection. epoll's data.ptr points at it; `kind` is first so the loop can tell it from
 * the listen/signal/timer tags, which are bare relay_kind values. */
typedef struct relay_end {
    relay_kind kind;
    int fd; /* -1 once closed */
    bool readable, writable;
    struct relay_conn *conn;
} relay_end;

/* dir[d] reads end[d] and writes end[1 - d]. */
typedef struct relay_dir {
    relay_chunk *head, *tail;
    size_t queued;     /* payload + chunk headers, against the memory bound */
    uint64_t written;  /* bytes delivered, for the log */
    int64_t eof_ns;    /* when the source's EOF (or reset) was read */
    bool eof;          /* the source gave EOF or an error: read no more */
    bool eof_reset;    /* ... and it was an error: deliver it as a reset, not a FIN */
    bool shut;         /* EOF delivered: shutdown(dst, SHUT_WR) done */
    bool dst_dead;     /* the destination never connected: discard what the source sends */
    double link_ns;    /* rate cap: when the emulated link finishes sending what was released so far */
    int64_t wake_ns;   /* when this direction can move next; 0 = waits for an event, not for time */
} relay_dir;

typedef struct relay_conn {
    struct relay_conn *prev, *next; /* live list; `next` also links the to-free list */
    relay_end end[2];               /* 0: the accepted client, 1: the target */
    relay_dir dir[2];               /* 0: client -> target, 1: target -> client */
    bool connecting;                /* end[1] has a connect() in flight */
    bool again;                     /* stopped for fairness with work left: pump at the next turn */
    bool closed;                    /* closed; freed after the current batch of events */
    size_t addr_i;                  /* target address being tried */
    unsigned long id;
    int64_t open_ns;
    char peer[64];
} relay_conn;

typedef struct relay_addr {
    struct sockaddr_storage sa;
    socklen_t len;
    int family;
} relay_addr;

typedef struct relay {
    const relay_opts *o;
    int ep, lfd, sfd, tfd;
    relay_kind tag_listen, tag_signal, tag_timer;
    relay_addr to[RELAY_MAX_TO];
    size_t n_to;
    int64_t delay_ns;
    double bps;       /* bytes per second; 0 = unlimited */
    double quantum;   /* smallest write the rate cap waits for (about 1 ms of rate) */
    size_t qlimit;    /* stop reading a source while its queue holds this much */
    relay_conn *conns, *dead;
    int64_t armed_ns; /* timerfd's expiry, 0 = disarmed */
    int64_t accept_pause_ns;
    bool stop;
    unsigned long next_id;
    unsigned char buf[RELAY_READ_MAX];
} relay;

/* In integer nanoseconds on CLOCK_MONOTONIC rather than base/clock.h's seconds: the deadlines it computes are
 * armed as absolute timerfd times on that clock, which take whole nanoseconds. */
static int64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* cannot fail for CLOCK_MONOTONIC with a valid pointer */
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void addr_str(const struct sockaddr *sa, socklen_t len, char *out, size_t cap) {
    char h[NI_MAXHOST], p[NI_MAXSERV];
    if (getnameinfo(sa, len, h, sizeof h, p, sizeof p, NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
        snprintf(out, cap, "?");
        return;
    }
    snprintf(out, cap, sa->sa_family == AF_INET6 ? "[%s]:%s" : "%s:%s", h, p);
}

static int resolve(const char *s, bool passive, struct addrinfo **out, rl_err *err) {
    char host[256], port[8];
    if (net_addr_split(s, host, sizeof host, port, sizeof port, err)) return -1;
    struct addrinfo hints = {0};
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
    int rc = getaddrinfo(host[0] && strcmp(host, "*") != 0 ? host : NULL, port, &hints, out);
    if (rc != 0) return rl_errf(err, "cannot resolve '%s': %s", s, gai_strerror(rc));
    return 0;
}

static int ep_add(relay *r, int fd, uint32_t events, void *ptr) {
    struct epoll_event ev = {.events = events, .data.ptr = ptr};
    return epoll_ctl(r->ep, EPOLL_CTL_ADD, fd, &ev);
}

/* Latency matters more than packet count here: our writes must go out when released, not after Nagle's
 * wait for an ACK (which with delayed ACKs adds up to 40 ms and ruins the delay we emulate). */
static void set_nodelay(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* best effort: only a latency tweak */
}

/* ---- connections ------------------------------------------------------------------------------------- */

static void dir_free_queue(relay_dir *q) {
    while (q->head) {
        relay_chunk *c = q->head;
        q->head = c->next;
        free(c);
    }
    q->tail = NULL;
    q->queued = 0;
}

static void conn_close(relay *r, relay_conn *c, bool reset, const char *why) {
    if (c->closed) return;
    for (int s = 0; s < 2; s++) {
        if (c->end[s].fd < 0) continue;
        if (reset) {
            /* Carry a reset through as a reset: close with a zero linger sends RST, not FIN. */
            struct linger lg = {.l_onoff = 1, .l_linger = 0};
            setsockopt(c->end[s].fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
        }
        close(c->end[s].fd); /* also leaves the epoll set */
        c->end[s].fd = -1;
    }
    dir_free_queue(&c->dir[0]);
    dir_free_queue(&c->dir[1]);
    if (r->o->log || reset)
        fprintf(stderr, "relay: #%lu closed (%s): %llu bytes ->, %llu bytes <-, %.3f s\n", c->id, why,
                (unsigned long long)c->dir[0].written, (unsigned long long)c->dir[1].written,
                (double)(mono_ns() - c->open_ns) / 1e9);
    if (c->prev) c->prev->next = c->next;
    else r->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    /* Events later in this batch may still point at c: free it only after the batch. */
    c->closed = true;
    c->next = r->dead;
    r->dead = c;
}

/* The target cannot be reached: the client gets a clean EOF (after the delay, as a refusal would take a
 * trip over the link), and what it sends is read and dropped until it closes, so its close sends no RST. */
static void conn_target_failed(relay *r, relay_conn *c, int64_t now, int e) {
    fprintf(stderr, "relay: #%lu cannot connect to %s: %s\n", c->id, r->o->to, strerror(e));
    c->connecting = false;
    c->dir[0].dst_dead = true;
    dir_free_queue(&c->dir[0]);
    c->dir[1].eof = true;
    c->dir[1].eof_ns = now;
}

/* Starts a non-blocking connect to the target, trying addresses from c->addr_i on. */
static void conn_connect(relay *r, relay_conn *c, int64_t now, int last_err) {
    relay_end *e = &c->end[1];
    for (; c->addr_i < r->n_to; c->addr_i++) {
        const relay_addr *a = &r->to[c->addr_i];
        int fd = socket(a->family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            last_err = errno;
            continue;
        }
        set_nodelay(fd);
        e->fd = fd;
        /* Registered before connect() so the completion edge cannot be missed. */
        if (ep_add(r, fd, EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET, e) < 0) {
            last_err = errno;
            close(fd);
            e->fd = -1;
            continue;
        }
        if (connect(fd, (const struct sockaddr *)&a->sa, a->len) == 0) {
            c->connecting = false;
            e->readable = e->writable = true;
            return;
        }
        if (errno == EINPROGRESS) {
            c->connecting = true;
            return;
        }
        last_err = errno;
        close(fd);
        e->fd = -1;
    }
    conn_target_failed(r, c, now, last_err);
}

/* Reads the source of direction d into its queue until EAGAIN, EOF or the memory bound.
 * Returns the bytes read, or -1 when the connection had to be closed. */
static long dir_read(relay *r, relay_conn *c, int d) {
    relay_end *src = &c->end[d];
    relay_dir *q = &c->dir[d];
    long total = 0;
    while (!q->eof && src->fd >= 0 && src->readable && (q->dst_dead || q->queued < r->qlimit)) {
        ssize_t n = recv(src->fd, r->buf, sizeof r->buf, 0);
        /* Stamped when read, not with the loop's `now`: bytes that arrived while the events before them were
         * handled would otherwise be dated before they came, and leave early (a 30 ms hop measured 29.9 ms
         * under a sanitizer's slower loop). */
        const int64_t t = mono_ns();
        if (n > 0) {
            total += n;
            if (q->dst_dead) continue;
            relay_chunk *ch = malloc(sizeof *ch + (size_t)n);
            if (!ch) {
                conn_close(r, c, true, "out of memory");
                return -1;
            }
            memcpy(ch->data, r->buf, (size_t)n);
            ch->next = NULL;
            ch->t_ns = t;
            ch->len = (size_t)n;
            ch->off = 0;
            if (q->tail) q->tail->next = ch;
            else q->head = ch;
            q->tail = ch;
            q->queued += sizeof *ch + (size_t)n;
        } else if (n == 0) {
            q->eof = true;
            q->eof_ns = t;
        } else if (errno == EINTR) {
            continue;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            src->readable = false;
        } else {
            /* A reset: deliver what came before it, then reset the other side (after the delay). */
            if (r->o->log) fprintf(stderr, "relay: #%lu %s: %s\n", c->id, d ? "target" : "client", strerror(errno));
            q->eof = q->eof_reset = true;
            q->eof_ns = t;
        }
    }
    return total;
}

/* Writes what direction d may release now (delay passed, rate cap allows) and delivers its EOF when due.
 * Sets q->wake_ns to when it can move next. Returns the bytes written, or -1 when the connection closed. */
static long dir_write(relay *r, relay_conn *c, int d, int64_t now) {
    relay_end *dst = &c->end[1 - d];
    relay_dir *q = &c->dir[d];
    long total = 0;
    q->wake_ns = 0;
    if (q->dst_dead || q->shut || (d == 0 && c->connecting)) return 0;
    while (q->head) {
        relay_chunk *ch = q->head;
        int64_t due = ch->t_ns + r->delay_ns;
        if (now < due) {
            q->wake_ns = due;
            return total;
        }
        size_t n = ch->len - ch->off;
        double per_byte_ns = 0;
        if (r->bps > 0) {
            /* The rate cap as a link's send clock (a token bucket whose credit accrues only while data
             * waits): a byte leaves when the link has finished the bytes before it and it is due. So an
             * idle link banks no burst (a message always takes len/rate), while time lost to a late
             * wakeup or a blocked receiver is made up, up to RELAY_LAG_NS. */
            per_byte_ns = 1e9 / r->bps;
            if (q->link_ns < (double)due) q->link_ns = (double)due;
            if (q->link_ns < (double)(now - RELAY_LAG_NS)) q->link_ns = (double)(now - RELAY_LAG_NS);
            double sent = ((double)now - q->link_ns) / per_byte_ns; /* bytes the link has sent by now */
            /* Wait for about a millisecond's worth rather than trickling out single bytes. */
            double want = (double)n < r->quantum ? (double)n : r->quantum;
            if (sent < want) {
                q->wake_ns = (int64_t)(q->link_ns + want * per_byte_ns) + 1000;
                return total;
            }
            if ((double)n > sent) n = (size_t)sent;
        }
        if (!dst->writable) return total; /* EPOLLOUT brings us back */
        ssize_t w = send(dst->fd, ch->data + ch->off, n, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                dst->writable = false;
                return total;
            }
            char why[128];
            snprintf(why, sizeof why, "%s: %s", d ? "client" : "target", strerror(errno));
            conn_close(r, c, true, why);
            return -1;
        }
        q->link_ns += (double)w * per_byte_ns;
        ch->off += (size_t)w;
        q->written += (uint64_t)w;
        total += w;
        if (ch->off == ch->len) {
            q->head = ch->next;
            if (!q->head) q->tail = NULL;
            q->queued -= sizeof *ch + ch->len;
            free(ch);
        }
    }
    if (q->eof) {
        int64_t due = q->eof_ns + r->delay_ns;
        if (now < due) {
            q->wake_ns = due;
            return total;
        }
        if (q->eof_reset) {
            conn_close(r, c, true, d ? "target reset" : "client reset");
            return -1;
        }
        if (shutdown(dst->fd, SHUT_WR) < 0) {
            char why[128];
            snprintf(why, sizeof why, "shutdown %s: %s", d ? "client" : "target", strerror(errno));
            conn_close(r, c, true, why);
            return -1;
        }
        q->shut = true;
    }
    return total;
}

static bool dir_done(const relay_dir *q) { return q->eof && (q->shut || q->dst_dead); }

/* Moves whatever can move on connection c, and closes it once both directions delivered their EOF. */
static void conn_pump(relay *r, relay_conn *c, int64_t now) {
    c->again = false;
    for (int round = 0;; round++) {
        long moved = 0;
        for (int d = 0; d < 2; d++) {
            long a = dir_read(r, c, d);
            if (a < 0) return;
            long b = dir_write(r, c, d, now);
            if (b < 0) return;
            moved += a + b;
        }
        if (!moved) break;
        if (round + 1 == RELAY_PUMP_ROUNDS) {
            /* A fast pair can keep this busy forever: let the others (and signals) have a turn. */
            c->again = true;
            return;
        }
    }
    if (dir_done(&c->dir[0]) && dir_done(&c->dir[1])) conn_close(r, c, false, "done");
}

static void conn_open(relay *r, int fd, const struct sockaddr *sa, socklen_t salen, int64_t now) {
    relay_conn *c = calloc(1, sizeof *c);
    if (!c) {
        fprintf(stderr, "relay: out of memory for a new connection, closing it\n");
        close(fd);
        return;
    }
    c->id = ++r->next_id;
    c->open_ns = now;
    addr_str(sa, salen, c->peer, sizeof c->peer);
    for (int s = 0; s < 2; s++) {
        c->end[s].kind = RELAY_H_END;
        c->end[s].fd = -1;
        c->end[s].conn = c;
    }
    c->end[0].fd = fd;
    c->end[0].readable = c->end[0].writable = true;
    set_nodelay(fd);
    c->next = r->conns;
    if (r->conns) r->conns->prev = c;
    r->conns = c;
    if (r->o->log) fprintf(stderr, "relay: #%lu open from %s\n", c->id, c->peer);
    if (ep_add(r, fd, EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET, &c->end[0]) < 0) {
        char why[128];
        snprintf(why, sizeof why, "epoll_ctl: %s", strerror(errno));
        conn_close(r, c, true, why);
        return;
    }
    conn_connect(r, c, now, 0);
    conn_pump(r, c, now);
}

static void end_event(relay *r, relay_end *e, uint32_t ev, int64_t now) {
    relay_conn *c = e->conn;
    if (c->closed || e->fd < 0) return;
    if (c->connecting && e == &c->end[1]) {
        int soerr = 0;
        socklen_t l = sizeof soerr;
        if (getsockopt(e->fd, SOL_SOCKET, SO_ERROR, &soerr, &l) < 0) soerr = errno;
        if (soerr) {
            close(e->fd);
            e->fd = -1;
            c->addr_i++;
            conn_connect(r, c, now, soerr);
        } else if (ev & EPOLLOUT) {
            c->connecting = false;
            e->readable = e->writable = true;
            if (r->o->log) fprintf(stderr, "relay: #%lu connected to %s\n", c->id, r->o->to);
        } else {
            return;
        }
    } else {
        if (ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) e->readable = true;
        if (ev & (EPOLLOUT | EPOLLHUP | EPOLLERR)) e->writable = true;
    }
    conn_pump(r, c, now);
}

/* ---- the loop ---------------------------------------------------------------------------------------- */

static int do_accept(relay *r, int64_t now, rl_err *err) {
    for (;;) {
        struct sockaddr_storage sa;
        socklen_t len = sizeof sa;
        int fd = accept4(r->lfd, (struct sockaddr *)&sa, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            conn_open(r, fd, (struct sockaddr *)&sa, len, now);
            continue;
        }
        switch (errno) {
        case EAGAIN:
#if EWOULDBLOCK != EAGAIN
        case EWOULDBLOCK:
#endif
            return 0;
        case EMFILE:
        case ENFILE:
        case ENOBUFS:
        case ENOMEM:
            /* The pending connection stays queued; the edge will not come again, so retry on a timer. */
            fprintf(stderr, "relay: accept: %s; retrying in 100 ms\n", strerror(errno));
            r->accept_pause_ns = now + RELAY_ACCEPT_PAUSE_NS;
            return 0;
        case EINTR:
        case ECONNABORTED:
        case EPROTO:
        case EPERM:
        case ENETDOWN:
        case ENOPROTOOPT:
        case EHOSTDOWN:
        case ENONET:
        case EHOSTUNREACH:
        case EOPNOTSUPP:
        case ENETUNREACH:
            continue; /* that one connection failed (accept(2) says: treat like EAGAIN and retry) */
        default:
            return rl_errf(err, "accept on %s: %s", r->o->listen, strerror(errno));
        }
    }
}

static int arm_timer(relay *r, int64_t at, rl_err *err) {
    if (at == r->armed_ns) return 0;
    struct itimerspec its = {0};
    if (at) {
        if (at < 1) at = 1; /* 0 would disarm */
        its.it_value.tv_sec = at / 1000000000;
        its.it_value.tv_nsec = at % 1000000000;
    }
    if (timerfd_settime(r->tfd, TFD_TIMER_ABSTIME, &its, NULL) < 0)
        return rl_errf(err, "timerfd_settime: %s", strerror(errno));
    r->armed_ns = at;
    return 0;
}

/* Pumps the connections whose time has come and returns the earliest time any of them waits for. */
static int64_t run_timers(relay *r, int64_t now, rl_err *err, int *rc) {
    int64_t next = 0;
    if (r->accept_pause_ns) {
        if (now >= r->accept_pause_ns) {
            r->accept_pause_ns = 0;
            if (do_accept(r, now, err)) *rc = -1;
        }
        if (r->accept_pause_ns) next = r->accept_pause_ns;
    }
    for (relay_conn *c = r->conns, *nx; c; c = nx) {
        nx = c->next; /* c may close (and leave the list) while pumped */
        for (int pass = 0; pass < 2 && !c->closed; pass++) {
            int64_t w = c->again ? now : 0;
            for (int d = 0; d < 2; d++)
                if (c->dir[d].wake_ns && (!w || c->dir[d].wake_ns < w)) w = c->dir[d].wake_ns;
            if (!w) break;
            if (pass == 0 && w <= now) {
                conn_pump(r, c, now);
                continue;
            }
            if (!next || w < next) next = w;
            break;
        }
    }
    return next;
}

static int setup(relay *r, rl_err *err) {
    struct addrinfo *ai;
    if (resolve(r->o->to, false, &ai, err)) return rl_err_prefix(err, "--to");
    for (struct addrinfo *a = ai; a && r->n_to < RELAY_MAX_TO; a = a->ai_next) {
        if (a->ai_addrlen > sizeof r->to[0].sa) continue;
        memcpy(&r->to[r->n_to].sa, a->ai_addr, a->ai_addrlen);
        r->to[r->n_to].len = a->ai_addrlen;
        r->to[r->n_to].family = a->ai_family;
        r->n_to++;
    }
    freeaddrinfo(ai);
    if (!r->n_to) return rl_errf(err, "--to %s: no usable address", r->o->to);

    if (resolve(r->o->listen, true, &ai, err)) return rl_err_prefix(err, "--listen");
    int last = 0;
    for (struct addrinfo *a = ai; a && r->lfd < 0; a = a->ai_next) {
        int fd = socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            last = errno;
            continue;
        }
        int one = 1;
        /* Tests restart relays on the same port; TIME_WAIT from the last run must not block the bind. */
        if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
            bind(fd, a->ai_addr, a->ai_addrlen) < 0 || listen(fd, SOMAXCONN) < 0) {
            last = errno;
            close(fd);
            continue;
        }
        r->lfd = fd;
    }
    freeaddrinfo(ai);
    if (r->lfd < 0) return rl_errf(err, "cannot listen on %s: %s", r->o->listen, strerror(last));

    r->ep = epoll_create1(EPOLL_CLOEXEC);
    if (r->ep < 0) return rl_errf(err, "epoll_create1: %s", strerror(errno));
    r->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (r->tfd < 0) return rl_errf(err, "timerfd_create: %s", strerror(errno));
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    r->sfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    if (r->sfd < 0) return rl_errf(err, "signalfd: %s", strerror(errno));
    if (ep_add(r, r->lfd, EPOLLIN | EPOLLET, &r->tag_listen) < 0 || ep_add(r, r->sfd, EPOLLIN, &r->tag_signal) < 0 ||
        ep_add(r, r->tfd, EPOLLIN, &r->tag_timer) < 0)
        return rl_errf(err, "epoll_ctl: %s", strerror(errno));
    return 0;
}

static int loop(relay *r, rl_err *err) {
    struct epoll_event evs[64];
    int rc = 0;
    while (!r->stop && rc == 0) {
        int n = epoll_wait(r->ep, evs, (int)(sizeof evs / sizeof evs[0]), -1);
        if (n < 0) {
            if (errno == EINTR) continue;
            return rl_errf(err, "epoll_wait: %s", strerror(errno));
        }
        int64_t now = mono_ns();
        for (int i = 0; i < n && rc == 0; i++) {
            relay_kind k = *(relay_kind *)evs[i].data.ptr;
            if (k == RELAY_H_END) {
                end_event(r, evs[i].data.ptr, evs[i].events, now);
            } else if (k == RELAY_H_LISTEN) {
                if (!r->accept_pause_ns) rc = do_accept(r, now, err);
            } else if (k == RELAY_H_TIMER) {
                uint64_t ticks;
                if (read(r->tfd, &ticks, sizeof ticks) < 0 && errno != EAGAIN)
                    rc = rl_errf(err, "reading the timerfd: %s", strerror(errno));
                r->armed_ns = 0; /* expired: the next arm must reprogram it even for the same time */
            } else {
                struct signalfd_siginfo si;
                ssize_t got = read(r->sfd, &si, sizeof si);
                if (got == (ssize_t)sizeof si) r->stop = true;
                else if (got < 0 && errno != EAGAIN) rc = rl_errf(err, "reading the signalfd: %s", strerror(errno));
            }
        }
        if (rc == 0 && !r->stop) {
            int64_t next = run_timers(r, now, err, &rc);
            if (rc == 0) rc = arm_timer(r, next, err);
        }
        while (r->dead) {
            relay_conn *c = r->dead;
            r->dead = c->next;
            free(c);
        }
    }
    return rc;
}

int relay_run(const relay_opts *o, rl_err *err) {
    if (!(o->delay_ms >= 0 && o->delay_ms <= 3600e3)) return rl_errf(err, "the delay must be 0 to 3600000 ms");
    if (!(o->rate_mbit >= 0 && o->rate_mbit <= 1e6)) return rl_errf(err, "the rate must be 0 to 1000000 Mbit/s");
    relay *r = calloc(1, sizeof *r);
    if (!r) return rl_errf(err, "out of memory");
    r->o = o;
    r->ep = r->lfd = r->sfd = r->tfd = -1;
    r->tag_listen = RELAY_H_LISTEN;
    r->tag_signal = RELAY_H_SIGNAL;
    r->tag_timer = RELAY_H_TIMER;
    r->delay_ns = (int64_t)(o->delay_ms * 1e6 + 0.5);
    r->bps = o->rate_mbit * 1e6 / 8;
    r->quantum = r->bps / 1000;
    if (r->quantum < 1024) r->quantum = 1024;
    if (r->quantum > RELAY_READ_MAX) r->quantum = RELAY_READ_MAX;
    /* Enough for twice the bytes in flight on the emulated link, so the cap, not our bound, limits rate. */
    double bdp = 2 * r->bps * o->delay_ms / 1e3;
    r->qlimit = bdp > RELAY_QUEUE_MIN ? (bdp < (double)(SIZE_MAX / 2) ? (size_t)bdp : SIZE_MAX / 2) : RELAY_QUEUE_MIN;

    /* SIGINT/SIGTERM are read from a signalfd in the loop, so they must not be delivered the usual way. */
    sigset_t set, old;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    int rc = sigprocmask(SIG_BLOCK, &set, &old) < 0 ? rl_errf(err, "sigprocmask: %s", strerror(errno)) : 0;
    bool masked = rc == 0;
    if (rc == 0) rc = setup(r, err);
    if (rc == 0) {
        struct sockaddr_storage sa;
        socklen_t len = sizeof sa;
        char where[96] = "?";
        if (getsockname(r->lfd, (struct sockaddr *)&sa, &len) == 0) addr_str((struct sockaddr *)&sa, len, where, sizeof where);
        fprintf(stderr, "relay: listening on %s -> %s, delay %g ms, rate %g Mbit/s%s\n", where, o->to, o->delay_ms,
                o->rate_mbit, o->rate_mbit > 0 ? "" : " (unlimited)");
        rc = loop(r, err);
    }
    while (r->conns) conn_close(r, r->conns, false, "relay stopped");
    while (r->dead) {
        relay_conn *c = r->dead;
        r->dead = c->next;
        free(c);
    }
    if (r->lfd >= 0) close(r->lfd);
    if (r->sfd >= 0) close(r->sfd);
    if (r->tfd >= 0) close(r->tfd);
    if (r->ep >= 0) close(r->ep);
    free(r);
    if (masked) sigprocmask(SIG_SETMASK, &old, NULL);
    return rc;
}
