/* backend_ring.c - the scheduler's backend on a ring of nodes (see backend_ring.h). */
#include "backend_ring.h"
#include "../base/clock.h"
#include "../model/k3_ckpt.h"
#include "../model/k3_memory.h"
#include "../net/addr.h"

#include <ctype.h>
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <sodium.h>

/* A scheduler slot's sequence on the ring. */
typedef struct ring_slot {
    uint64_t seq_id;   /* 0: nothing on the ring */
    uint64_t gen;      /* the ring (B->gen) that holds its state */
    uint32_t pos;      /* tokens that ring holds for it */
    frame_sampling smp;
    smp_bias *bias;    /* the request's logit biases (sent with every FRAME_SEQ_NEW frame: a replay needs them too) */
    uint32_t n_bias;
    uint8_t *gram;     /* constrained output: the grammar's wire form (also sent with every FRAME_SEQ_NEW frame) */
    size_t gram_len;
    int32_t budget;
    bool sampled;      /* it returned a token: hist[gen0 ..] are generated (a replay resumes its sampler there) */
    uint32_t gen0;
    int32_t *hist;     /* every token the ring holds for it (prompt and committed output): a replay on a re-formed
                        * ring sends them again, which rebuilds its state exactly (docs/serve.md) */
    uint32_t n_hist, cap_hist;
    bool want_receipts; /* the request asked for its receipts: kept here as JSON objects, comma-separated */
    char *rcpt;
    size_t receipt_len, receipt_cap;
    /* The prompt cache (B->cache): the checkpoints every stage holds for seq_id, positions only (k3_ckpt.h
     * places them as the stages do); hist[0 .. n_hist) are the tokens its state has read. */
    k3_ckpts ck;
    bool restore;      /* the next frame begins seq_id again from its checkpoint at n_hist (a resumed request) */
    bool running;      /* a request holds the slot (from its begin to end()) */
    double ended;      /* when its last request ended (rl_clock_now) */
    uint32_t reread;   /* idle re-read of what it generated: where it ends (0: none under way) */
    bool drawn;        /* its audit was drawn when its last request ended (kept by the cache): none at its free */
} ring_slot;

typedef struct sch_ring {
    sch_ring_config cfg;
    ring_coord *rc;
    bool open;
    uint64_t gen;                 /* bumped at every successful ring_open */
    uint64_t next_seq;            /* ring sequence ids: never reused, across re-opens too */
    char broke[512];              /* why the ring broke (empty while it is whole) */
    char why_down[512];           /* why the last re-open failed */
    double retry_at;              /* after a slow failed re-open: fail at once until then */
    plan_result plan;             /* the last plan that opened */
    bool up[PLAN_MAX_NODES];      /* per ring.conf node: the coordinator's view */
    bool lost[PLAN_MAX_NODES];    /* per ring.conf node: a ring failed naming it; plans leave it out until it is
                                   * seen whole again (ring_idle_probe), even if it accepts connections (a hung
                                   * process does) */
    bool excl[PLAN_MAX_NODES];    /* per ring.conf node: left out of the ring that is open (or being opened) */
    double better_at, better_wait; /* while idle with nodes left out: when to try a plan with them again */
    double compute_s[PLAN_MAX_NODES]; /* per ring.conf node: totals of rings already closed */
    uint64_t steps[PLAN_MAX_NODES];
    uint64_t audits[PLAN_MAX_NODES];
    double audit_s[PLAN_MAX_NODES];
    bool faulty[PLAN_MAX_NODES];  /* per ring.conf node: caught lying; every later plan leaves it out */
    char fault[PLAN_MAX_NODES][256];
    ring_slot *slots;             /* [n_slots] */
    ring_seq_req *reqs;           /* [n_slots]: a step has at most one entry per slot */
    ring_seq_req *reqs0;          /* [n_slots]: the prompts of sequences rebuilt at this step (a frame before it) */
    uint64_t *to_free;            /* [n_slots]: finished sequences whose FREE waits for the next step */
    int n_to_free;
    double next_probe;            /* while idle: when to look at the nodes again (ring_idle_probe) */
    bool taps;                    /* set_taps: entries with `taps` travel with FRAME_SEQ_TAPS */
    float *feat;                  /* the step's features, token-major per entry (sch_step.feat) */
    size_t feat_cap;              /* floats */
    _Atomic bool abort;           /* set by ring_be_abort (another thread): every ring wait fails at once */
    uint64_t recoveries;          /* rings re-formed under a running step, the seconds that took, and the */
    double recovery_s;
    uint64_t replayed;            /* ... tokens replayed to rebuild sequences on them */
    bool cache;                   /* the prompt cache (cfg.opts.ctx_checkpoints > 0; backend_ring.h) */
} sch_ring;

/* How long the TCP probe waits for a node that neither accepts nor refuses (a host that is off). */
#define RING_PROBE_S 2.0
/* While the server is idle it looks at the nodes this often, and waits this long for a probe's answer. */
#define RING_IDLE_PROBE_S 2.0
#define RING_IDLE_WAIT_S 0.5
/* After a re-open that failed slowly (such a host, or a node that connected but never answered), requests
 * fail at once for this long instead of each waiting as long again, one behind the other. */
#define RING_BACKOFF_S 2.0
/* A failed step is run again on a re-formed ring this many times (each failure names a node, left out). */
#define RING_MAX_RETRIES 4

static void ring_drop_seq(sch_ring *B, ring_slot *S);

/* ---- which node a message names -------------------------------------------------------------------- */

/* Marks down every ring.conf node the coordinator's message names; returns how many. */
static int ring_blame(sch_ring *B, const char *msg) {
    int k = 0;
    for (int i = 0; i < B->cfg.conf->n; i++) {
        if (ring_names(msg, B->cfg.conf->nodes[i].addr)) {
            B->up[i] = false;
            B->lost[i] = true;
            k++;
        }
    }
    return k;
}

/* ---- open, break, re-open --------------------------------------------------------------------------- */

/* Folds the closing ring's per-stage figures into the per-node totals (Prometheus counters only grow). */
static void ring_fold_stats(sch_ring *B) {
    const plan_result *plan = ring_plan_get(B->rc);
    for (int s = 0; s < plan->n_stages; s++) {
        int node = plan->stages[s].node;
        ring_stage_stats st = ring_stage_stats_get(B->rc, s);
        B->compute_s[node] += st.compute_s;
        B->steps[node] += (uint64_t)st.n;
    }
    for (int i = 0; i < B->cfg.conf->n; i++) {
        long n;
        double secs;
        ring_node_audits_get(B->rc, i, &n, &secs);
        B->audits[i] += (uint64_t)n;
        B->audit_s[i] += secs;
        ring_node_audits_clear(B->rc, i);
    }
}

/* Nodes the coordinator caught lying (receipts or an audit) are out of every later plan. */
static void ring_take_faults(sch_ring *B) {
    for (int i = 0; i < B->cfg.conf->n; i++) {
        const char *fault = ring_node_fault_get(B->rc, i);
        if (!fault || B->faulty[i]) continue;
        B->faulty[i] = true;
        snprintf(B->fault[i], sizeof B->fault[i], "%s", fault);
        fprintf(stderr, "ringlm serve: ring: node %s is faulty (%s); it is left out of the ring from now on\n",
                B->cfg.conf->nodes[i].addr, B->fault[i]);
    }
}

static void ring_shut(sch_ring *B) {
    if (!B->open) return;
    ring_fold_stats(B);
    ring_close(B->rc);
    B->open = false;
    B->n_to_free = 0; /* the next ring_open's ASSIGN drops every sequence on every node */
}

/* The ring failed: remember why, mark the node the message names, close it (the next step re-opens). */
static void ring_break(sch_ring *B, const char *msg) {
    if (B->open) ring_take_faults(B);
    if (!B->broke[0]) snprintf(B->broke, sizeof B->broke, "%s", msg);
    /* A message may name a survivor too ("stage 1 cannot reach the next stage ADDR"): of the nodes it
     * names, blame those whose link closed, when there are any. */
    int closed = 0;
    bool was_up[PLAN_MAX_NODES];
    memcpy(was_up, B->up, sizeof was_up);
    bool was_lost[PLAN_MAX_NODES];
    memcpy(was_lost, B->lost, sizeof was_lost);
    int named = ring_blame(B, msg);
    bool gone[PLAN_MAX_NODES] = {0};
    for (int i = 0; B->open && named > 1 && i < B->cfg.conf->n; i++) {
        gone[i] = ring_node_link_poll(B->rc, i, NULL);
        if (B->lost[i] && !was_lost[i] && gone[i]) closed++;
    }
    for (int i = 0; closed > 0 && i < B->cfg.conf->n; i++) {
        if (B->lost[i] && !was_lost[i] && !gone[i]) B->lost[i] = false, B->up[i] = was_up[i];
    }
    fprintf(stderr, "ringlm serve: ring: %s; the ring is broken, re-opened at the next request\n", msg);
    ring_shut(B);
}

/* ring_open, recording the plan and the coordinator's view. */
static int ring_try_open(sch_ring *B, rl_err *err) {
    B->cfg.opts.exclude = B->excl;
    B->cfg.opts.n_seqs = B->cfg.n_slots; /* every slot's state on every node, reserved by the plan */
    if (ring_open(B->rc, B->cfg.conf, B->cfg.id, B->cfg.m, B->cfg.hp, &B->cfg.opts, err) != 0) {
        ring_blame(B, err->msg);
        return -1; /* ring_open cleaned up after itself */
    }
    B->open = true;
    B->gen++;
    B->plan = *ring_plan_get(B->rc);
    for (int i = 0; i < B->cfg.conf->n; i++) {
        if (!B->excl[i]) B->up[i] = true, B->lost[i] = false;
    }
    return 0;
}

/* Which nodes a plan may use now: not faulty, not down or lost; standbys (ring.conf `standby`) only while a
 * node that is not one is out. with_lost: try the lost ones again (they accept connections). Returns how
 * many are left in. */
static int ring_choose(sch_ring *B, bool with_lost) {
    const ring_conf *c = B->cfg.conf;
    bool primary_out = false;
    for (int i = 0; i < c->n; i++) {
        bool out = B->faulty[i] || !B->up[i] || (B->lost[i] && !with_lost);
        if (out && !c->nodes[i].standby) primary_out = true;
    }
    int n = 0;
    for (int i = 0; i < c->n; i++) {
        B->excl[i] = B->faulty[i] || !B->up[i] || (B->lost[i] && !with_lost) || (c->nodes[i].standby && !primary_out);
        n += !B->excl[i];
    }
    return n;
}

/* The nodes out of the ring, for a message: "a:1 (down), b:2 (faulty)". */
static void ring_outs(const sch_ring *B, char *buf, size_t cap) {
    size_t k = 0;
    buf[0] = 0;
    for (int i = 0; i < B->cfg.conf->n && k + 1 < cap; i++) {
        const char *why = B->faulty[i] ? "faulty" : !B->up[i] ? "down" : B->lost[i] ? "lost" : NULL;
        if (!why) continue;
        int w = snprintf(buf + k, cap - k, "%s%s (%s)", k ? ", " : "", B->cfg.conf->nodes[i].addr, why);
        if (w < 0 || (size_t)w >= cap - k) break;
        k += (size_t)w;
    }
}

/* A plain TCP connection to every ring.conf node at once, for at most timeout_s. ring_open waits its whole
 * connect_s (5 s) for a node that is not there; this answers "connection refused" at once, so requests
 * while a node is down get their 503 quickly. A node behind a relay is asked of its relay instead (one
 * after another, each within timeout_s: ring_relay_query). Marks B->up; returns 0 when every node accepted,
 * else -1 with a message naming the first that did not. */
static int ring_probe(sch_ring *B, double timeout_s, rl_err *err) {
    const ring_conf *c = B->cfg.conf;
    int fd[PLAN_MAX_NODES];
    char why[PLAN_MAX_NODES][200];
    for (int i = 0; i < c->n; i++) {
        fd[i] = -1;
        why[i][0] = 0;
        if (B->faulty[i]) { /* left out of the ring: whether it answers does not matter */
            snprintf(why[i], sizeof why[i], "ok");
            continue;
        }
        rl_err qe = {{0}};
        int q = ring_relay_query(&c->nodes[i], timeout_s, &qe); /* behind a relay: does the relay have it? */
        if (q <= 0) {
            snprintf(why[i], sizeof why[i], "%s", q == 0 ? "ok" : qe.msg);
            continue;
        }
        char host[128], port[16];
        struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
        rl_err ae;
        const bool bad = net_addr_split(c->nodes[i].addr, host, sizeof host, port, sizeof port, &ae) != 0;
        if (bad || !host[0]) {
            snprintf(why[i], sizeof why[i], "%s", bad ? ae.msg : "no host");
            continue;
        }
        int g = getaddrinfo(host, port, &hints, &ai);
        if (g != 0) {
            snprintf(why[i], sizeof why[i], "cannot resolve %s: %s", host, gai_strerror(g));
            continue;
        }
        fd[i] = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd[i] >= 0 && connect(fd[i], ai->ai_addr, ai->ai_addrlen) != 0 && errno != EINPROGRESS) {
            snprintf(why[i], sizeof why[i], "%s", strerror(errno));
            close(fd[i]);
            fd[i] = -1;
        } else if (fd[i] < 0) {
            snprintf(why[i], sizeof why[i], "cannot create a socket: %s", strerror(errno));
        }
        freeaddrinfo(ai);
    }
    double deadline = rl_clock_now() + timeout_s;
    for (;;) {
        struct pollfd p[PLAN_MAX_NODES];
        int map[PLAN_MAX_NODES], np = 0;
        for (int i = 0; i < c->n; i++) {
            if (fd[i] >= 0 && !why[i][0]) p[np] = (struct pollfd){.fd = fd[i], .events = POLLOUT}, map[np++] = i;
        }
        double left = deadline - rl_clock_now();
        if (np == 0 || left <= 0) break;
        if (poll(p, (nfds_t)np, (int)(left * 1000) + 1) < 0 && errno != EINTR) break;
        for (int k = 0; k < np; k++) {
            if (!p[k].revents) continue;
            int i = map[k], e = 0;
            socklen_t el = sizeof e;
            getsockopt(fd[i], SOL_SOCKET, SO_ERROR, &e, &el);
            snprintf(why[i], sizeof why[i], "%s", e ? strerror(e) : "ok");
        }
    }
    int bad = -1;
    for (int i = 0; i < c->n; i++) {
        if (fd[i] >= 0) close(fd[i]);
        if (!why[i][0]) snprintf(why[i], sizeof why[i], "no answer within %.0f s", timeout_s);
        if (B->faulty[i]) continue;
        B->up[i] = strcmp(why[i], "ok") == 0;
        if (!B->up[i] && bad < 0) bad = i;
    }
    if (bad < 0) return 0;
    return rl_errf(err, "node %s does not accept connections: %s", c->nodes[bad].addr, why[bad]);
}

/* The ring is broken: make it whole again, or say why not. backoff: a slow failure makes requests fail at
 * once for a while (a request is waiting on it); an attempt made while idle sets none, so a node caught
 * half started by the idle probe does not turn away the first request after it is up. */
static int ring_reopen(sch_ring *B, bool backoff, rl_err *err) {
    double t0 = rl_clock_now();
    if (t0 < B->retry_at) {
        return rl_errf(err, "the ring is unavailable: %s (the ring broke: %s)", B->why_down, B->broke);
    }
    rl_err e = {{0}};
    ring_probe(B, RING_PROBE_S, &e); /* marks who accepts connections */
    /* Over the nodes still there: each failed open names the node it could not use, which is left out of
     * the next try, until one opens or no plan fits (the planner says what is short). */
    bool with_lost = false;
    for (int k = 0; k <= B->cfg.conf->n + 1; k++) {
        if (ring_choose(B, with_lost) == 0) {
            bool lost_up = false;
            for (int i = 0; i < B->cfg.conf->n; i++) lost_up = lost_up || (B->lost[i] && B->up[i] && !B->faulty[i]);
            if (!with_lost && lost_up) {
                with_lost = true;
                continue;
            }
            rl_errf(&e, "no node is left to plan over");
            break;
        }
        bool named = false;
        rl_err oe = {{0}};
        if (ring_try_open(B, &oe) == 0) {
            char outs[400];
            ring_outs(B, outs, sizeof outs);
            fprintf(stderr, "ringlm serve: ring: re-formed (%d stages, re-planned and re-assigned%s%s)\n", B->plan.n_stages,
                    outs[0] ? "; left out: " : "", outs);
            B->broke[0] = B->why_down[0] = 0;
            B->retry_at = 0;
            B->better_wait = RING_IDLE_PROBE_S;
            B->better_at = rl_clock_now() + B->better_wait;
            return 0;
        }
        bool lost_up = false;
        for (int i = 0; i < B->cfg.conf->n; i++) {
            named = named || (!B->excl[i] && B->lost[i]);
            lost_up = lost_up || (B->lost[i] && B->up[i] && !B->faulty[i]);
        }
        e = oe;
        if (named) continue;
        /* Not a node's fault: the plan does not fit what is left. A node that was only named in a failure
         * (a survivor reporting its dead neighbour is named too) may be fine: once, try with those. */
        if (with_lost || !lost_up) break;
        with_lost = true;
    }
    char outs[400];
    ring_outs(B, outs, sizeof outs);
    if (outs[0]) rl_err_prefix(&e, "out of the ring: %s", outs);
    snprintf(B->why_down, sizeof B->why_down, "%s", e.msg);
    if (backoff && rl_clock_now() - t0 > 0.2) B->retry_at = rl_clock_now() + RING_BACKOFF_S;
    return rl_errf(err, "the ring is unavailable: %s (the ring broke: %s)", e.msg, B->broke);
}

/* A node the coordinator lost since the last step (its monitor saw the connection close): the ring is
 * broken before anything is sent. And stage 0 must take a frame now: ring_submit would wait dead_s (60 s)
 * for a link that its monitor has not yet reported closed. */
static void ring_check_links(sch_ring *B) {
    if (!B->open) return;
    char msg[400];
    const plan_result *plan = ring_plan_get(B->rc);
    const char *why;
    for (int s = 0; s < plan->n_stages; s++) {
        int node = plan->stages[s].node;
        if (ring_node_link_poll(B->rc, node, &why)) {
            snprintf(msg, sizeof msg, "lost node %s: %s", B->cfg.conf->nodes[node].addr, why);
            ring_break(B, msg);
            return;
        }
    }
    int first = plan->stages[0].node;
    if (!ring_node_writable_wait(B->rc, first, 2000)) {
        ring_node_link_poll(B->rc, first, &why);
        snprintf(msg, sizeof msg, "cannot reach node %s (stage 0) for 2 s%s%s", B->cfg.conf->nodes[first].addr,
                 why[0] ? ": " : "", why);
        ring_break(B, msg);
    }
}

/* Sends the FREEs that end() could not send at once. */
static void ring_flush_frees(sch_ring *B) {
    if (!B->open || B->n_to_free == 0) return;
    rl_err e;
    if (ring_forget_seqs(B->rc, B->to_free, B->n_to_free, &e) != 0) { /* their audits were drawn (ring_drop_seq) */
        fprintf(stderr, "ringlm serve: ring: cannot free %d finished sequences: %s\n", B->n_to_free, e.msg);
    }
    B->n_to_free = 0;
}

/* Runs the audits drawn for finished sequences (a quiet ring: no step is in flight between steps) - when
 * the server is idle, else before the next step. A failed one marks the node faulty and breaks the ring,
 * which the next step re-opens without it. Returns 1 if there was anything to audit. */
static int ring_audit_now(sch_ring *B) {
    rl_err e;
    int before = B->open ? ring_audit_pending_count(B->rc) : 0;
    if (before == 0) return 0;
    if (ring_audit_pending(B->rc, &e) != 0) {
        ring_break(B, e.msg);
        return 1;
    }
    return ring_audit_pending_count(B->rc) < before; /* 0 when it had to wait (steps in flight): no busy loop */
}
/* While the server is idle, every RING_IDLE_PROBE_S: an open ring's links are looked at, so a node that
 * went away breaks it now and /health says so without waiting for a request; a broken ring's nodes are
 * probed, so /health sees them come back, and once they all answer the ring is re-opened (nothing runs,
 * so nothing is lost), so the next request finds it whole instead of paying the re-plan. */
static void ring_idle_probe(sch_ring *B) {
    double now = rl_clock_now();
    if (now < B->next_probe) return;
    B->next_probe = now + RING_IDLE_PROBE_S;
    if (B->open) {
        ring_check_links(B);
        if (!B->open) return;
        /* Nodes left out (down, lost, or standbys standing in): once a left-out node that is not a standby
         * accepts connections again, and nothing runs, try the plan with it (a failure costs nothing but the
         * try, and tries back off). */
        bool back = false;
        rl_err e = {{0}};
        ring_probe(B, RING_IDLE_WAIT_S, &e);
        for (int i = 0; i < B->cfg.conf->n; i++) {
            back = back || (B->excl[i] && !B->faulty[i] && B->up[i] && !B->cfg.conf->nodes[i].standby);
        }
        if (!back || now < B->better_at) return;
        B->better_wait = B->better_wait < 60 ? 2 * B->better_wait : 60;
        B->better_at = now + B->better_wait;
        bool ex[PLAN_MAX_NODES];
        memcpy(ex, B->excl, sizeof ex);
        ring_choose(B, true);
        if (memcmp(ex, B->excl, sizeof ex) == 0) return;
        ring_shut(B);
        if (ring_try_open(B, &e) == 0) {
            fprintf(stderr, "ringlm serve: ring: re-formed with the nodes that came back (%d stages)\n", B->plan.n_stages);
            B->better_wait = RING_IDLE_PROBE_S;
            return;
        }
        fprintf(stderr, "ringlm serve: ring: a plan with the nodes that came back failed (%s); without them again\n", e.msg);
        if (ring_reopen(B, false, &e) != 0) fprintf(stderr, "ringlm serve: ring: still broken: %s\n", e.msg);
        return;
    }
    rl_err e = {{0}};
    if (ring_reopen(B, false, &e) != 0) fprintf(stderr, "ringlm serve: ring: still broken: %s\n", e.msg);
}

/* ---- the prompt cache (backend_ring.h) ---------------------------------------------------------------- */

/* A client that sends its next turn at once comes within this many seconds of the end of its last; the idle
 * re-read waits that long first (as on one machine: backend_local.c, BL_REREAD_GRACE_S). */
#define RING_REREAD_GRACE_S 0.1

/* The most a resume may restore of an n-token prompt: what follows must be a piece of two or more tokens. */
static uint32_t ring_limit(size_t n) { return n >= 3 ? (uint32_t)(n - 2) : 0; }

static uint32_t ring_be_match(void *impl, int slot, const int32_t *tokens, size_t n) {
    sch_ring *B = impl;
    if (!B->cache || slot < 0 || slot >= B->cfg.n_slots) return 0;
    const ring_slot *S = &B->slots[slot];
    if (!S->seq_id || !B->open || S->gen != B->gen || S->running) return 0; /* nothing of it on this ring */
    uint32_t lcp = 0;
    while (lcp < S->n_hist && lcp < n && S->hist[lcp] == tokens[lcp]) lcp++;
    const uint32_t lim = ring_limit(n);
    const int k = k3_ckpts_best(&S->ck, lcp < lim ? lcp : lim);
    return k < 0 ? 0 : S->ck.c[k].pos;
}

/* Nothing moves here: the request's first frame restores the checkpoint on every stage (FRAME_SEQ_RESTORE), so
 * a stage that lost it fails that frame and the step runs again on a re-formed ring, from the whole prompt. */
static int ring_be_resume(void *impl, int slot, const int32_t *tokens, size_t n, bool reuse, uint32_t *n_cached,
                          rl_err *err) {
    sch_ring *B = impl;
    *n_cached = 0;
    if (slot < 0 || slot >= B->cfg.n_slots) return rl_errf(err, "slot %d out of range", slot);
    B->slots[slot].reread = 0; /* what a re-read reached is checkpointed; the rest is not needed now */
    if (reuse) *n_cached = ring_be_match(impl, slot, tokens, n);
    return 0;
}

static void ring_be_cache_stats(void *impl, sch_cache_stat *out) {
    sch_ring *B = impl;
    memset(out, 0, sizeof *out);
    for (int i = 0; i < B->cfg.n_slots; i++) {
        const ring_slot *S = &B->slots[i];
        if (S->seq_id && B->open && S->gen == B->gen) out->ckpts += (uint64_t)S->ck.n;
    }
    /* Held on the nodes, each stage its layers' share: the whole model's KDA state per checkpoint. */
    out->ckpt_bytes = (size_t)out->ckpts * k3_range_kda_state_bytes(B->cfg.hp, 0, B->cfg.hp->n_layer);
    out->exact = B->cfg.exact;
}

/* Idle work: a sequence that ends in tokens it generated holds state no fresh read reproduces (decode steps
 * round differently from a prompt piece), so a next turn could resume only from its prompt's checkpoint and
 * read the reply again. While the server is idle the reply is read again here, as prompt pieces from the
 * latest checkpoint (restored on every stage), a checkpoint after each. One piece per call. Returns 1 when
 * it sent one, 0 when there is none to do, -ms when one will be due after the grace. */
static int ring_reread(sch_ring *B) {
    if (!B->cache || !B->open) return 0;
    const uint32_t chunk = B->cfg.reread_chunk >= 4 ? B->cfg.reread_chunk : 256;
    double due = -1;
    const double now = rl_clock_now();
    for (int i = 0; i < B->cfg.n_slots; i++) {
        ring_slot *S = &B->slots[i];
        if (S->running || !S->seq_id || S->gen != B->gen || S->ck.n == 0) continue;
        const uint32_t from = S->ck.c[S->ck.n - 1].pos, end = S->reread ? S->reread : S->n_hist;
        if (from + 2 > end) {
            S->reread = 0;
            continue;
        }
        if (!S->reread) {
            const double wait = S->ended + RING_REREAD_GRACE_S - now;
            if (wait > 0) {
                if (due < 0 || wait < due) due = wait;
                continue;
            }
            S->reread = end;
        }
        uint32_t m = end - from < chunk ? end - from : chunk;
        if (end - from - m == 1) m--; /* never leave one token (scheduler.c, sch_piece) */
        ring_seq_req q = {.seq_id = S->seq_id, .pos = from, .n = m, .tokens = S->hist + from, .smp = S->smp, .token = -1,
                          .flags = FRAME_SEQ_RESTORE | FRAME_SEQ_NO_SAMPLE | FRAME_SEQ_SPLIT_INV | FRAME_SEQ_CKPT};
        rl_err e;
        if (ring_step(B->rc, &q, 1, &e) != 0) {
            fprintf(stderr, "ringlm serve: re-reading a finished sequence failed: %s\n", e.msg);
            ring_break(B, e.msg);
            return 1;
        }
        k3_ckpts_place(&S->ck, from + m);
        if (from + m >= end) S->reread = 0;
        return 1;
    }
    return due < 0 ? 0 : -(int)(due * 1000.0 + 1.0);
}

static int ring_be_idle(void *impl) {
    sch_ring *B = impl;
    ring_flush_frees(B);
    if (ring_audit_now(B)) return 1;
    ring_idle_probe(B);
    return ring_reread(B);
}

/* Every checked traversal: its receipts go to each slot whose sequence it carried and that wants them. */
static void ring_on_receipts(void *user, const receipt_rec *rs, int n_stages) {
    sch_ring *B = user;
    for (int i = 0; i < B->cfg.n_slots; i++) {
        ring_slot *S = &B->slots[i];
        if (!S->want_receipts || !S->seq_id) continue;
        bool carried = false;
        for (uint32_t k = 0; k < rs[0].n_seqs && !carried; k++) carried = rs[0].seqs[k].seq_id == S->seq_id;
        for (int st = 0; carried && st < n_stages; st++) {
            char *line = NULL;
            rl_err e;
            if (receipt_to_json(&rs[st], &line, &e) != 0) continue;
            size_t l = strlen(line);
            if (S->receipt_len + l + 2 > S->receipt_cap) {
                size_t cap = S->receipt_cap ? S->receipt_cap * 2 : 4096;
                while (cap < S->receipt_len + l + 2) cap *= 2;
                char *nb = realloc(S->rcpt, cap);
                if (!nb) {
                    free(line);
                    continue;
                }
                S->rcpt = nb;
                S->receipt_cap = cap;
            }
            if (S->receipt_len) S->rcpt[S->receipt_len++] = ',';
            memcpy(S->rcpt + S->receipt_len, line, l);
            S->receipt_len += l;
            free(line);
        }
    }
}

/* The slot's receipts as a JSON array, once its last traversal's receipts are in (they trail its result). */
static char *ring_be_receipts(void *impl, int slot) {
    sch_ring *B = impl;
    if (slot < 0 || slot >= B->cfg.n_slots) return NULL;
    ring_slot *S = &B->slots[slot];
    rl_err e;
    if (B->open && S->gen == B->gen && ring_pending_count(B->rc) == 0 && ring_receipts_finish(B->rc, 5.0, &e) != 0) {
        fprintf(stderr, "ringlm serve: ring: %s\n", e.msg);
    }
    char *out = malloc(S->receipt_len + 3);
    if (out) {
        out[0] = '[';
        if (S->receipt_len) memcpy(out + 1, S->rcpt, S->receipt_len);
        out[S->receipt_len + 1] = ']';
        out[S->receipt_len + 2] = 0;
    }
    S->receipt_len = 0;
    return out;
}

/* ---- the backend contract ----------------------------------------------------------------------------- */

static int ring_hist_add(ring_slot *S, const int32_t *t, uint32_t n) {
    if (S->n_hist + n > S->cap_hist) {
        uint32_t nc = S->cap_hist ? S->cap_hist : 256;
        while (nc < S->n_hist + n) nc *= 2;
        int32_t *h = realloc(S->hist, (size_t)nc * sizeof *h);
        if (!h) return -1;
        S->hist = h;
        S->cap_hist = nc;
    }
    memcpy(S->hist + S->n_hist, t, (size_t)n * sizeof *t); /* n_hist moves only once the step succeeded */
    return 0;
}

/* The features the stages sent for the step's FRAME_SEQ_TAPS sequences, into B->feat (each entry's own tokens:
 * a replayed sequence's frame also carried its history first); frees them. */
static int ring_take_feat(sch_ring *B, sch_step *steps, int n, rl_err *err) {
    const size_t row = (size_t)B->cfg.opts.n_taps * B->cfg.hp->n_embd;
    size_t total = 0;
    for (int i = 0; i < n; i++) total += (B->reqs[i].flags & FRAME_SEQ_TAPS) ? steps[i].n_tokens : 0;
    int rc = 0;
    if (total * row > B->feat_cap) {
        float *f = realloc(B->feat, total * row * sizeof *f);
        if (f) B->feat = f, B->feat_cap = total * row;
        else rc = rl_errf(err, "out of memory for the DSpark features of %zu tokens", total);
    }
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        ring_seq_req *q = &B->reqs[i];
        steps[i].feat = NULL;
        if (rc == 0 && (q->flags & FRAME_SEQ_TAPS) && q->taps) {
            memcpy(B->feat + at * row, q->taps + (size_t)(q->n - steps[i].n_tokens) * row, steps[i].n_tokens * row * sizeof(float));
            steps[i].feat = B->feat + at * row;
            at += steps[i].n_tokens;
        }
        free(q->taps);
        q->taps = NULL;
    }
    return rc;
}

/* One FORWARD frame for the whole batch on the open ring. Returns 0, -1 (a local problem: err), or
 * SCH_RING_UNAVAILABLE (the step cannot run on this ring: err; the ring is broken). */
static int ring_run(sch_ring *B, sch_step *steps, int n, rl_err *err) {
    int n0 = 0;
    for (int i = 0; i < n; i++) {
        sch_step *e = &steps[i];
        ring_slot *S = &B->slots[e->slot];
        ring_seq_req *q = &B->reqs[i];
        bool fresh = S->seq_id == 0 || S->gen != B->gen; /* nothing of it on this ring */
        if (fresh && S->sampled && e->n_draft > 0) {
            /* A rebuilt sequence starts with its history, not a VERIFY block: its drafts are dropped (the
             * scheduler drafts again next step). */
            e->n_draft = 0;
            e->n_tokens = 1;
        }
        if (ring_hist_add(S, e->tokens, e->n_tokens) != 0) {
            return rl_errf(err, "out of memory for the tokens of slot %d", e->slot);
        }
        if (fresh) {
            /* A new ring sequence: the request's first frame, or a replay of everything the lost ring held
             * for it, which rebuilds its state exactly; one that had generated resumes its sampler there. */
            if (S->seq_id != 0) B->replayed += S->n_hist;
            S->seq_id = B->next_seq++;
            S->gen = B->gen;
            S->pos = 0;
            S->restore = false; /* (a cached prefix on a lost ring: it is in hist, replayed with the rest) */
            k3_ckpts_drop(&S->ck, 0);
            const uint32_t fl = FRAME_SEQ_NEW | (S->n_bias ? FRAME_SEQ_HAS_BIAS : 0) | (S->gram ? FRAME_SEQ_HAS_GRAMMAR : 0);
            *q = (ring_seq_req){.seq_id = S->seq_id, .pos = 0, .n = S->n_hist + e->n_tokens, .tokens = S->hist,
                                .flags = fl, .smp = S->smp, .bias = S->bias, .n_bias = S->n_bias, .gram = S->gram,
                                .gram_len = (uint32_t)S->gram_len, .budget = S->budget};
            if (S->sampled) {
                /* Rebuilt as it was built: its prompt as a prefill (a frame of its own, sent first), then what it
                 * generated with step kernels, as its decode steps computed it (docs/numerics.md: the two
                 * round differently), the sampler taking those tokens as its output again. */
                ring_seq_req *q0 = &B->reqs0[n0++];
                *q0 = *q;
                q0->n = S->gen0;
                q0->flags |= FRAME_SEQ_NO_SAMPLE;
                *q = (ring_seq_req){.seq_id = S->seq_id, .pos = S->gen0, .n = S->n_hist - S->gen0 + e->n_tokens,
                                    .tokens = S->hist + S->gen0, .flags = FRAME_SEQ_RESUME | FRAME_SEQ_STEP, .smp = S->smp,
                                    .gen_start = 0};
            }
        } else if (S->restore) {
            /* A request resuming a cached prefix: the slot's sequence begins again from its checkpoint at pos,
             * with this request's sampler (its penalty history the prefix, as the stage keeps it). */
            const uint32_t fl = FRAME_SEQ_NEW | FRAME_SEQ_RESTORE | (S->n_bias ? FRAME_SEQ_HAS_BIAS : 0) |
                                (S->gram ? FRAME_SEQ_HAS_GRAMMAR : 0);
            *q = (ring_seq_req){.seq_id = S->seq_id, .pos = S->pos, .n = e->n_tokens, .tokens = e->tokens, .flags = fl,
                                .smp = S->smp, .bias = S->bias, .n_bias = S->n_bias, .gram = S->gram,
                                .gram_len = (uint32_t)S->gram_len, .budget = S->budget};
        } else {
            *q = (ring_seq_req){.seq_id = S->seq_id, .pos = S->pos, .n = e->n_tokens, .tokens = e->tokens,
                                .smp = S->smp};
        }
        if (!e->sample) q->flags |= FRAME_SEQ_NO_SAMPLE;
        if (steps[i].prompt_lp && q->n > 1) {
            /* (the scheduler gives such a prompt whole, in a begin entry: the frame holds just its tokens) */
            q->flags |= FRAME_SEQ_PROMPT_LP;
            q->plp = steps[i].plp;
        }
        if (e->sample && e->logprobs) {
            q->flags |= FRAME_SEQ_LOGPROBS;
            q->lp = steps[i].lp; /* (e is the read-only view of the same entry) */
            q->lp_cap = SCH_MAX_DRAFT + 1;
        }
        if (e->n_draft > 0) q->flags |= FRAME_SEQ_VERIFY; /* the last stage accepts; the stages roll back after */
        /* Prompt pieces read as the one-machine backend reads them, so that the ring's text is its text. */
        if (!(q->flags & (FRAME_SEQ_VERIFY | FRAME_SEQ_STEP)) && q->n >= 2) q->flags |= FRAME_SEQ_SPLIT_INV;
        if (n0 > 0 && B->reqs0[n0 - 1].seq_id == q->seq_id && B->reqs0[n0 - 1].n >= 2) B->reqs0[n0 - 1].flags |= FRAME_SEQ_SPLIT_INV;
        if (B->taps && e->taps) q->flags |= FRAME_SEQ_TAPS;
        /* A checkpoint where the scheduler asks (prompt ends, every --checkpoint-every tokens): a prompt piece. */
        if (B->cache && e->ckpt && !(q->flags & (FRAME_SEQ_VERIFY | FRAME_SEQ_STEP)) && q->n >= 2) q->flags |= FRAME_SEQ_CKPT;
        q->token = -1;
    }
    uint64_t step_id, step0 = 0;
    if ((n0 > 0 && ring_submit(B->rc, B->reqs0, n0, &step0, err) != 0) || ring_submit(B->rc, B->reqs, n, &step_id, err) != 0 ||
        (n0 > 0 && ring_collect(B->rc, step0, B->reqs0, n0, err) != 0) || ring_collect(B->rc, step_id, B->reqs, n, err) != 0) {
        for (int i = 0; i < n; i++) free(B->reqs[i].taps);
        ring_break(B, err->msg);
        rl_err_prefix(err, "the ring failed");
        return SCH_RING_UNAVAILABLE;
    }
    if (ring_take_feat(B, steps, n, err) != 0) return -1;
    for (int i = 0; i < n; i++) {
        sch_step *e = &steps[i];
        const ring_seq_req *q = &B->reqs[i];
        bool bad = false;
        if (e->n_draft > 0) { /* token = how many were committed, then the committed ids */
            bad = q->token < 1 || q->token > (int)e->n_tokens;
            for (int t = 0; !bad && t < q->token; t++) bad = q->committed[t] < 0 || (uint32_t)q->committed[t] >= B->cfg.hp->n_vocab;
            if (bad) {
                char msg[200];
                snprintf(msg, sizeof msg, "the last stage committed %d tokens (or an id out of range) of a %u-token block for sequence %llu",
                         q->token, e->n_tokens, (unsigned long long)q->seq_id);
                rl_errf(err, "the ring failed: %s", msg);
                ring_break(B, msg);
                return SCH_RING_UNAVAILABLE;
            }
            continue;
        }
        if (e->sample && (B->reqs[i].token < 0 || (uint32_t)B->reqs[i].token >= B->cfg.hp->n_vocab)) {
            char msg[200];
            snprintf(msg, sizeof msg, "the last stage returned token %d for sequence %llu (vocabulary %u)",
                     B->reqs[i].token, (unsigned long long)B->reqs[i].seq_id, B->cfg.hp->n_vocab);
            rl_errf(err, "the ring failed: %s", msg);
            ring_break(B, msg);
            return SCH_RING_UNAVAILABLE;
        }
    }
    for (int i = 0; i < n; i++) {
        sch_step *e = &steps[i];
        ring_slot *S = &B->slots[e->slot];
        S->pos = B->reqs[i].pos + B->reqs[i].n;
        S->restore = false;
        if (B->reqs[i].flags & FRAME_SEQ_CKPT) k3_ckpts_place(&S->ck, S->pos); /* where every stage now has one */
        if (e->n_draft > 0) { /* valid up to the committed tokens: the next frame starts there */
            e->n_out = B->reqs[i].token;
            memcpy(e->out, B->reqs[i].committed, (size_t)e->n_out * sizeof *e->out);
            e->token = e->out[e->n_out - 1];
            S->pos = B->reqs[i].pos + (uint32_t)e->n_out;
            S->n_hist += (uint32_t)e->n_out; /* [last, the kept drafts]; the correction comes next step */
            continue;
        }
        S->n_hist += e->n_tokens;
        if (e->sample) {
            e->token = B->reqs[i].token;
            if (!S->sampled) S->gen0 = S->n_hist; /* what follows is generated */
            S->sampled = true;
        }
    }
    return 0;
}

static int ring_be_set_taps(void *impl, const uint32_t *layers, int n, rl_err *err) {
    sch_ring *B = impl;
    if (ring_opts_check_taps(&B->cfg.opts, layers, n, err) != 0) return -1;
    B->taps = n > 0;
    return 0;
}

static int ring_be_step(void *impl, sch_step *steps, int n, rl_err *err) {
    sch_ring *B = impl;
    if (n < 1 || n > B->cfg.n_slots) return rl_errf(err, "bad batch of %d sequences", n);
    for (int i = 0; i < n; i++) {
        const sch_step *e = &steps[i];
        if (e->slot < 0 || e->slot >= B->cfg.n_slots) return rl_errf(err, "slot %d out of range", e->slot);
        ring_slot *S = &B->slots[e->slot];
        if (e->begin) {
            S->running = true;
            S->reread = 0;
            if (e->n_cached > 0) { /* resume() found the prefix: the slot's sequence continues from there */
                const int k = B->cache && S->seq_id ? k3_ckpts_at(&S->ck, e->n_cached) : -1;
                if (k < 0 || S->n_hist < e->n_cached) {
                    return rl_errf(err, "slot %d begins after %u cached tokens it does not hold", e->slot, e->n_cached);
                }
                k3_ckpts_drop(&S->ck, k + 1);
                S->n_hist = S->pos = e->n_cached;
                S->restore = true;
            } else {
                ring_drop_seq(B, S);
            }
            S->drawn = false; /* this request's traversals are not drawn yet */
            S->sampled = false;
            S->smp = ring_sampling(e->smp);
            free(S->bias);
            S->bias = NULL;
            S->n_bias = 0;
            if (e->smp->n_bias > 0) {
                if (!(S->bias = malloc((size_t)e->smp->n_bias * sizeof *S->bias))) {
                    return rl_errf(err, "out of memory for the logit biases of slot %d", e->slot);
                }
                memcpy(S->bias, e->smp->bias, (size_t)e->smp->n_bias * sizeof *S->bias);
                S->n_bias = (uint32_t)e->smp->n_bias;
            }
            free(S->gram);
            S->gram = NULL;
            S->gram_len = 0;
            S->budget = e->smp->budget;
            if (e->smp->grammar) { /* the last stage samples, so it gets the grammar (once per ring sequence) */
                if (gr_encode(e->smp->grammar, &S->gram, &S->gram_len) != 0) {
                    return rl_errf(err, "out of memory for the grammar of slot %d", e->slot);
                }
                if (S->gram_len > UINT32_MAX / 2) return rl_errf(err, "slot %d: a grammar of %zu bytes", e->slot, S->gram_len);
            }
            S->want_receipts = e->receipts;
            S->receipt_len = 0;
        } else if (S->seq_id == 0 && S->n_hist == 0) {
            return rl_errf(err, "slot %d continues a sequence that never began", e->slot);
        }
    }
    ring_check_links(B);
    ring_flush_frees(B);
    ring_audit_now(B);
    /* Every sequence can be rebuilt on a re-formed ring from the tokens it holds (ring_run), so a step the
     * ring failed is run again on a ring re-planned over the nodes still there (and standbys), a few times:
     * each failure takes the node it names out. Only when no plan fits what is left does the step fail. */
    double reform_s = -1;
    for (int attempt = 0;; attempt++) {
        if (!B->open) {
            double t0 = rl_clock_now();
            if (ring_reopen(B, true, err) != 0) return SCH_RING_UNAVAILABLE;
            reform_s = (reform_s < 0 ? 0 : reform_s) + rl_clock_now() - t0;
        }
        uint64_t replayed = B->replayed;
        int rc = ring_run(B, steps, n, err);
        if (reform_s >= 0 && B->replayed > replayed) { /* a ring re-formed under sequences it carried */
            B->recoveries++;
            B->recovery_s += reform_s;
            reform_s = -1;
        }
        if (rc != SCH_RING_UNAVAILABLE || attempt >= RING_MAX_RETRIES) return rc;
        fprintf(stderr, "ringlm serve: ring: the step runs again on a re-formed ring\n");
    }
}

/* The slot's sequence is no longer wanted: free it on the nodes when it lives on the ring that is open (now if
 * stage 0 takes the frame at once, else at the next step: a FREE waits for its link, and this may run under
 * the scheduler's mutex, which /health and every request need; a ring that closes meanwhile drops it anyway). */
static void ring_drop_seq(sch_ring *B, ring_slot *S) {
    if (S->seq_id && B->open && S->gen == B->gen) {
        rl_err e;
        if (!S->drawn) ring_audit_finished(B->rc, &S->seq_id, 1); /* else drawn when its last request ended */
        if (!ring_node_writable_wait(B->rc, ring_plan_get(B->rc)->stages[0].node, 0)) {
            if (B->n_to_free < B->cfg.n_slots) B->to_free[B->n_to_free++] = S->seq_id;
        } else if (ring_forget_seqs(B->rc, &S->seq_id, 1, &e) != 0) {
            fprintf(stderr, "ringlm serve: ring: cannot free sequence %llu: %s\n", (unsigned long long)S->seq_id, e.msg);
        }
    }
    S->seq_id = 0;
    S->n_hist = 0;
    S->restore = false;
    S->reread = 0;
    S->drawn = false;
    k3_ckpts_drop(&S->ck, 0);
}

static void ring_be_end(void *impl, int slot) {
    sch_ring *B = impl;
    if (slot < 0 || slot >= B->cfg.n_slots) return;
    ring_slot *S = &B->slots[slot];
    S->running = false;
    S->ended = rl_clock_now();
    S->want_receipts = false;
    S->receipt_len = 0;
    /* With the prompt cache a sequence with a checkpoint on the open ring stays there for the slot's next
     * request (resume, match); it is freed when the slot takes another conversation. */
    if (!(B->cache && S->seq_id && B->open && S->gen == B->gen && S->ck.n > 0)) {
        ring_drop_seq(B, S);
    } else {
        /* Its audit is drawn now, as a freed sequence's is: the request's traversals were all it holds. A later
         * request that resumes it is drawn again at its end (an audit replays the whole sequence from its
         * start); what the idle re-read adds before it is dropped delivered nothing, so nothing is drawn then. */
        ring_audit_finished(B->rc, &S->seq_id, 1);
        S->drawn = true;
    }
    S->sampled = false;
}

static void ring_be_node(const sch_ring *B, int node, uint32_t a, uint32_t b, int stage, sch_node_stat *o) {
    memset(o, 0, sizeof *o);
    snprintf(o->name, sizeof o->name, "n%d", node + 1); /* its line in ring.conf */
    snprintf(o->addr, sizeof o->addr, "%s", B->cfg.conf->nodes[node].addr);
    o->layer_a = a;
    o->layer_b = b;
    o->up = B->up[node] && !B->faulty[node];
    o->compute_s = B->compute_s[node];
    o->steps = B->steps[node];
    o->faulty = B->faulty[node];
    o->stage = B->open ? stage : -1;
    o->standby = B->cfg.conf->nodes[node].standby;
    int by;
    snprintf(o->reach, sizeof o->reach, "%s",
             ring_reach_name(ring_reach(B->cfg.conf, node, B->cfg.opts.relay_addr, o->relay, sizeof o->relay, &by)));
    snprintf(o->fault, sizeof o->fault, "%s", B->fault[node]);
    o->audits = B->audits[node];
    o->audit_s = B->audit_s[node];
    if (B->open) {
        long n;
        double secs;
        ring_node_audits_get(B->rc, node, &n, &secs);
        o->audits += (uint64_t)n;
        o->audit_s += secs;
    }
    if (B->open && stage >= 0) {
        ring_stage_stats st = ring_stage_stats_get(B->rc, stage);
        o->compute_s += st.compute_s;
        o->steps += (uint64_t)st.n;
    }
}

/* The plan's stages in ring order, then the ring.conf nodes the plan leaves out (layers 0-0). */
static int ring_be_nodes(void *impl, sch_node_stat *out, int max) {
    sch_ring *B = impl;
    int k = 0;
    bool listed[PLAN_MAX_NODES] = {0};
    for (int s = 0; s < B->plan.n_stages && k < max; s++) {
        const plan_stage *st = &B->plan.stages[s];
        ring_be_node(B, st->node, st->a, st->b, s, &out[k++]);
        listed[st->node] = true;
    }
    for (int i = 0; i < B->cfg.conf->n && k < max; i++) {
        if (!listed[i]) ring_be_node(B, i, 0, 0, -1, &out[k++]);
    }
    return k;
}

static void ring_be_ring_stats(void *impl, sch_ring_stat *o) {
    const sch_ring *B = impl;
    *o = (sch_ring_stat){.recoveries = B->recoveries, .replayed = B->replayed, .generation = B->gen,
                         .recovery_s = B->recovery_s};
}

static void ring_be_abort(void *impl) {
    sch_ring *B = impl;
    atomic_store(&B->abort, true);
}

static void ring_be_free(void *impl) {
    sch_ring *B = impl;
    if (!B) return;
    if (B->rc) ring_shut(B);
    for (int i = 0; B->slots && i < B->cfg.n_slots; i++) {
        ring_slot *S = &B->slots[i];
        free(S->hist), free(S->rcpt), free(S->bias), free(S->gram);
        k3_ckpts_free(&S->ck);
    }
    free(B->slots);
    free(B->reqs);
    free(B->reqs0);
    free(B->to_free);
    free(B->feat);
    free(B->rc);
    free(B);
}

int sch_backend_ring(sch_backend *be, const sch_ring_config *cfg, rl_err *err) {
    memset(be, 0, sizeof *be);
    if (cfg->n_slots < 1 || cfg->n_slots > FRAME_MAX_SEQS) {
        return rl_errf(err, "a ring carries 1 to %d sequences at once, not %d", FRAME_MAX_SEQS, cfg->n_slots);
    }
    if (cfg->conf->n < 1 || cfg->conf->n > PLAN_MAX_NODES) return rl_errf(err, "the ring has no nodes");
    sch_ring *B = calloc(1, sizeof *B);
    if (!B) return rl_errf(err, "out of memory");
    B->cfg = *cfg;
    B->cfg.opts.on_receipts = ring_on_receipts;
    B->cfg.opts.on_receipts_user = B;
    B->cfg.opts.abort = &B->abort;
    /* One session for the server's life: its nodes stay its own across re-opens (coord.h, session). */
    if (B->cfg.opts.session == 0) randombytes_buf(&B->cfg.opts.session, sizeof B->cfg.opts.session);
    B->next_seq = 1;
    B->rc = calloc(1, sizeof *B->rc);
    B->slots = calloc((size_t)cfg->n_slots, sizeof *B->slots);
    B->reqs = calloc((size_t)cfg->n_slots, sizeof *B->reqs);
    B->reqs0 = calloc((size_t)cfg->n_slots, sizeof *B->reqs0);
    B->to_free = calloc((size_t)cfg->n_slots, sizeof *B->to_free);
    if (!B->rc || !B->slots || !B->reqs || !B->reqs0 || !B->to_free) {
        ring_be_free(B);
        return rl_errf(err, "out of memory");
    }
    for (int i = 0; i < cfg->conf->n; i++) B->up[i] = true;
    B->cache = cfg->opts.ctx_checkpoints > 0;
    for (int i = 0; B->cache && i < cfg->n_slots; i++) {
        if (k3_ckpts_init(&B->slots[i].ck, cfg->opts.ctx_checkpoints, err) != 0) {
            ring_be_free(B);
            return -1;
        }
    }
    ring_choose(B, false); /* standbys stand by */
    if (ring_try_open(B, err) != 0) {
        ring_be_free(B);
        return -1;
    }
    B->better_wait = RING_IDLE_PROBE_S;
    be->impl = B;
    be->n_slots = cfg->n_slots;
    be->n_ctx = cfg->opts.n_ctx;
    be->n_vocab = cfg->hp->n_vocab;
    be->kind = "ring";
    be->step = ring_be_step;
    be->end = ring_be_end;
    be->nodes = ring_be_nodes;
    be->ring_stats = ring_be_ring_stats;
    be->free = ring_be_free;
    be->idle = ring_be_idle;
    be->set_taps = ring_be_set_taps;
    be->abort = ring_be_abort;
    if (cfg->opts.receipts || cfg->opts.audit_rate > 0) be->receipts = ring_be_receipts;
    if (B->cache) {
        be->resume = ring_be_resume;
        be->match = ring_be_match;
        be->cache_stats = ring_be_cache_stats;
    }
    return 0;
}
