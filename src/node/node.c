/* node.c - `ringlm node` (node.h): the loop over its socket, replies and INFO, and the one coordinator it
 * serves at a time. */
#include "node_int.h"

#include <sys/utsname.h>

void node_log(const node *n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "ringlm node %s: ", n->name);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* ---- replies ----------------------------------------------------------------------------------- */

/* A reply (header + payload) to the peer with routing id `to` (the coordinator, or one it refuses). */
int node_reply_to(node *n, const void *to, size_t to_len, int type, uint64_t step, const void *payload,
                         size_t len, rl_err *err) {
    frame_header h = {.type = (uint16_t)type, .ring_id = n->cur_ring, .step_id = step, .payload_bytes = len};
    uint8_t hb[64];
    frame_header_encode(&h, hb);
    const void *parts[3] = {to, hb, payload ? payload : ""};
    size_t lens[3] = {to_len, frame_header_size(0), len};
    return zs_send(n->router, parts, lens, 3, true, err);
}

int node_reply(node *n, int type, uint64_t step, const void *payload, size_t len) {
    rl_err err;
    if (node_reply_to(n, n->coord_id, n->coord_id_len, type, step, payload, len, &err) != 0) {
        node_log(n, "cannot reach the coordinator: %s", err.msg);
        return -1;
    }
    return 0;
}

/* ERROR to the coordinator. lost: the address of another node this one saw die (its link closed), which
 * the coordinator then names as the cause instead of this node; NULL otherwise. */
void node_error_at(node *n, uint64_t step, const char *lost, const char *msg) {
    node_log(n, "error: %s", msg);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "msg", msg);
    cJSON_AddStringToObject(j, "node", n->name);
    if (lost) cJSON_AddStringToObject(j, "lost", lost);
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (s && n->coord_id_len) node_reply(n, FRAME_ERROR, step, s, strlen(s));
    free(s);
}

void node_error(node *n, uint64_t step, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    node_error_at(n, step, NULL, msg);
}

static void node_info(node *n) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "version", FRAME_VERSION);
    cJSON_AddStringToObject(j, "pubkey", n->o->id.pk_hex);
    uint64_t mem = n->o->mem_gb > 0 ? (uint64_t)(n->o->mem_gb * 1073741824.0) : node_mem_available();
    cJSON_AddNumberToObject(j, "mem_bytes", (double)mem);
    cJSON_AddNumberToObject(j, "threads", n->o->threads);
    /* How it is reached: where it listens, or the relay it dialled out to (net/tunnel.h); and a relay it runs. */
    cJSON_AddStringToObject(j, "reach", n->dial ? "dial-out" : "listen");
    if (n->relay) cJSON_AddStringToObject(j, "relay", tn_relay_addr(n->relay));
    /* The devices this machine has and the one its engine computes on (docs/devices.md): that one's memory
     * and speed are offered as a tier before the RAM above (plan.h). */
    cJSON *ds = cJSON_AddArrayToObject(j, "devices");
    for (size_t i = 0; i < dv_count(); i++) {
        dv_info d;
        dv_get(i, &d);
        cJSON *dj = cJSON_CreateObject();
        cJSON_AddStringToObject(dj, "name", d.name);
        cJSON_AddStringToObject(dj, "backend", d.backend);
        cJSON_AddBoolToObject(dj, "gpu", d.gpu);
        cJSON_AddNumberToObject(dj, "free_bytes", (double)d.free);
        cJSON_AddNumberToObject(dj, "total_bytes", (double)d.total);
        cJSON_AddItemToArray(ds, dj);
    }
    cJSON_AddStringToObject(j, "backend", n->dev_name[0] ? n->dev_name : "CPU");
    /* Its CPU architecture: an auditor on another one recomputes with other kernels (docs/numerics.md). */
    if (n->arch[0]) cJSON_AddStringToObject(j, "arch", n->arch);
    if (n->dev_name[0]) {
        cJSON *dj = cJSON_AddObjectToObject(j, "device");
        cJSON_AddStringToObject(dj, "name", n->dev_name);
        cJSON_AddNumberToObject(dj, "mem_bytes", (double)n->dev_bytes);
        cJSON_AddNumberToObject(dj, "speed_bps", n->dev_speed);
        if (n->dev_flops > 0) cJSON_AddNumberToObject(dj, "flops", n->dev_flops);
    }
    cJSON_AddBoolToObject(j, "repack", !n->o->eng.no_repack);
    cJSON_AddBoolToObject(j, "flash_attn", !n->o->eng.no_flash_attn);
    cJSON_AddStringToObject(j, "cache_type", n->o->eng.cache_f32 ? "f32" : "f16");
    cJSON_AddNumberToObject(j, "speed_bps", n->speed);
    cJSON_AddNumberToObject(j, "flops", n->flops);
    if (n->disk > 0) cJSON_AddNumberToObject(j, "disk_bps", n->disk);
    cJSON *ms = cJSON_AddArrayToObject(j, "models");
    for (int i = 0; i < n->n_models; i++) {
        cJSON *m = cJSON_CreateObject();
        const char *base = strrchr(n->models[i].path, '/');
        cJSON_AddStringToObject(m, "name", base ? base + 1 : n->models[i].path);
        cJSON_AddStringToObject(m, "hash", n->models[i].hash);
        cJSON_AddNumberToObject(m, "bytes", (double)n->models[i].bytes);
        if (n->models[i].range) {
            cJSON_AddNumberToObject(m, "a", n->models[i].a);
            cJSON_AddNumberToObject(m, "b", n->models[i].b);
        }
        cJSON_AddItemToArray(ms, m);
    }
    /* Every GGUF file in --models by name and size, split set members too, whole or not: a coordinator with a
     * manifest plans from these (the tensors are checked against it when they are mapped). */
    cJSON *fs = cJSON_AddArrayToObject(j, "files");
    DIR *d = n->o->models_dir ? opendir(n->o->models_dir) : NULL;
    for (struct dirent *de; d && (de = readdir(d));) {
        size_t len = strlen(de->d_name);
        char path[1400];
        struct stat st;
        if (len < 6 || de->d_name[0] == '.' || strcmp(de->d_name + len - 5, ".gguf") != 0) continue;
        snprintf(path, sizeof path, "%s/%s", n->o->models_dir, de->d_name);
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) continue;
        cJSON *fe = cJSON_CreateObject();
        cJSON_AddStringToObject(fe, "name", de->d_name);
        cJSON_AddNumberToObject(fe, "bytes", (double)st.st_size);
        cJSON_AddItemToArray(fs, fe);
    }
    if (d) closedir(d);
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (s) node_reply(n, FRAME_INFO, 0, s, strlen(s));
    free(s);
}

/* ---- one coordinator at a time ------------------------------------------------------------------ */

/* The owner part of a coordinator's routing id: all but its last "-" field (coord.c: ring_open_connect). */
static size_t node_owner_len(const char *id, size_t len) {
    for (size_t i = len; i > 0; i--) {
        if (id[i - 1] == '-') return i - 1;
    }
    return len;
}

/* Connections that closed: the owner's closing frees the node. Drained before every coordinator message,
 * so a successor that connects right after the owner's exit finds the node free. */
static void node_watch_owner(node *n) {
    if (!n->router_mon.pair) return;
    zs_monitor_poll(&n->router_mon);
    if (n->owned && n->router_mon.watch_gone) {
        node_log(n, "coordinator %.16s... (%s) disconnected; another may take this node now", n->owner_key,
                 n->owner_peer);
        n->owned = false;
        zs_auth_forget(&n->auth, "fetcher"); /* what it lent, it lent for that coordinator's ring */
        n->n_lent = 0;
        zs_auth_forget(&n->auth, "peer");
        n->n_probers = 0;
    }
    n->router_mon.watch_gone = false;
    if (!n->owned) n->router_mon.watch_fd = -1;
}

/* Message types only a coordinator sends. FORWARD and FREE come from the coordinator too when this is
 * stage 0, else from the upstream node: those are told apart by their routing id (coordinators' start
 * "coord-", upstream nodes' "node-"). */
static bool node_from_coordinator(const zs_parts *p, const frame_header *h) {
    switch (h->type) {
    case FRAME_INFO_REQ: case FRAME_ASSIGN: case FRAME_PING: case FRAME_AUDIT_REQ: case FRAME_LEND: case FRAME_PEERS: case FRAME_PROBE:
    case FRAME_FETCH_BEGIN: case FRAME_FETCH_DATA: case FRAME_FETCH_END: return true;
    default: return p->len[0] >= 6 && memcmp(p->data[0], "coord-", 6) == 0;
    }
}

/* A coordinator's message: true if this node serves it (taking the node if it is free), else false after
 * answering it with an ERROR that names the coordinator the node serves. */
static bool node_admit(node *n, const zs_parts *p, const frame_header *h) {
    node_watch_owner(n);
    size_t ol = node_owner_len(p->data[0], p->len[0]);
    /* The session in the routing id, and the key the handshake proved: one allowed coordinator cannot pass
     * for another by choosing its routing id. */
    bool mine = n->owned && ol == n->owner_len && memcmp(p->data[0], n->owner, ol) == 0 &&
                strcmp(p->user, n->owner_key) == 0;
    /* Only an INFO request takes a free node: every ring_open starts with one. Anything else from a
     * coordinator that is not the owner may be a message its connection delivered just before it closed,
     * read after the close freed the node: taking the node on it would hold it for a dead coordinator. */
    if (!n->owned && h->type == FRAME_INFO_REQ) {
        n->owned = true;
        n->owner_len = ol < sizeof n->owner ? ol : sizeof n->owner; /* bytes: a routing id may hold NULs */
        memcpy(n->owner, p->data[0], n->owner_len);
        snprintf(n->owner_key, sizeof n->owner_key, "%s", p->user);
        snprintf(n->owner_peer, sizeof n->owner_peer, "%s", p->peer[0] ? p->peer : "?");
        n->owner_since = rl_clock_now();
        node_log(n, "serving coordinator %.16s... from %s", n->owner_key[0] ? n->owner_key : "(unknown key)",
                 n->owner_peer);
        mine = true;
    }
    if (mine) {
        n->owner_fd = p->fd;
        n->router_mon.watch_fd = p->fd; /* its latest connection: the one whose close frees the node */
        n->coord_id_len = p->len[0] < sizeof n->coord_id ? p->len[0] : sizeof n->coord_id; /* replies go there */
        memcpy(n->coord_id, p->data[0], n->coord_id_len);
        return true;
    }
    char msg[600];
    bool same_key = strcmp(p->user, n->owner_key) == 0;
    if (!n->owned) {
        snprintf(msg, sizeof msg, "serves no coordinator now (its coordinator's connection closed): open the ring again");
    } else {
        snprintf(msg, sizeof msg,
                 "in use by another coordinator%s (key %.16s..., from %s, for %.0f s): a ring serves one coordinator at "
                 "a time; stop that one, or wait until it closes its ring",
                 same_key ? " process with the same key" : "", n->owner_key, n->owner_peer, rl_clock_now() - n->owner_since);
    }
    double now = rl_clock_now();
    if (n->owned && now - n->busy_logged >= 10) {
        n->busy_logged = now;
        node_log(n, "refused coordinator %.16s... from %s: %s", p->user[0] ? p->user : "?", p->peer, msg);
    }
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "msg", msg);
    cJSON_AddStringToObject(j, "node", n->name);
    if (n->owned) cJSON_AddBoolToObject(j, "busy", true);
    char *js = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    rl_err e2; /* a refused peer that already left: nothing to do (cur_ring is this message's ring) */
    node_reply_to(n, p->data[0], p->len[0], FRAME_ERROR, h->step_id, js, js ? strlen(js) : 0, &e2);
    free(js);
    return false;
}

/* ---- how it is reached ------------------------------------------------------------------------- */

/* The connector for relayed peers; with --dial, our connections waiting at the relay, spliced to the
 * router's loopback port; with --relay-listen, the relay we run for others (any key that proves itself may
 * wait there: what reaches it is a CURVE stream the relayed node's own allowlist judges). */
static int node_reach_start(node *n, rl_err *err) {
    const node_opts *o = n->o;
    snprintf(n->name, sizeof n->name, "%s", o->listen ? o->listen : "");
    if (!(n->tn = tn_connector_new(err))) return -1;
    if (o->dial) {
        char ep[256];
        size_t len = sizeof ep;
        if (zmq_getsockopt(n->router, ZMQ_LAST_ENDPOINT, ep, &len) != 0 || strncmp(ep, "tcp://", 6) != 0)
            return rl_errf(err, "cannot tell where our router listens");
        if (!(n->dial = tn_dialout_start(o->dial, &o->id, ep + 6, o->join_token, true, err))) return -1;
        if (!o->listen) snprintf(n->name, sizeof n->name, "dial-out to %s", o->dial);
    }
    if (o->relay_listen) {
        if (!(n->relay = tn_relay_start(o->relay_listen, NULL, NULL, o->verbose, err))) return -1;
        node_log(n, "relay for nodes that dial out: listening on %s", tn_relay_addr(n->relay));
    }
    return 0;
}

/* ---- main loop --------------------------------------------------------------------------------- */

bool node_stop_pending(void) {
    sigset_t pend;
    return sigpending(&pend) == 0 && (sigismember(&pend, SIGINT) || sigismember(&pend, SIGTERM));
}

int node_run(const node_opts *o, rl_err *err) {
    /* aligned_alloc, not calloc: node holds libsodium's hash state, which is declared 64-byte aligned, so
     * the compiler may copy its fields with aligned vector moves that fault on calloc's 16-byte alignment. */
    node *n = aligned_alloc(_Alignof(node), sizeof *n);
    if (!n) return rl_errf(err, "out of memory");
    memset(n, 0, sizeof *n);
    n->o = o;
    n->zctx = zmq_ctx_new();
    int rc = -1;
    if (!n->zctx) {
        rl_errf(err, "cannot create a ZeroMQ context");
        goto done_free;
    }
    if (zs_auth_start(&n->auth, n->zctx, err) != 0) goto done_ctx;
    for (int i = 0; i < o->n_allow; i++) zs_auth_allow(&n->auth, o->allow[i].curve_pk, "coordinator", o->allow[i].pk_hex);
    n->router = zs_server(n->zctx, o->listen ? o->listen : "127.0.0.1:*", &o->id, err);
    if (!n->router) goto done_auth;
    if (node_reach_start(n, err) != 0) goto done_reach;
    if (zs_monitor_start_gone(&n->router_mon, n->zctx, n->router, "router", err) != 0) goto done_reach;
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (o->cache_dir) snprintf(n->cache_dir, sizeof n->cache_dir, "%s", o->cache_dir);
    else if (xdg) snprintf(n->cache_dir, sizeof n->cache_dir, "%s/ringlm/node-%.16s", xdg, o->id.pk_hex);
    else snprintf(n->cache_dir, sizeof n->cache_dir, "%s/.cache/ringlm/node-%.16s", home ? home : "/tmp", o->id.pk_hex);
    node_scan_models(n);
    node_scan_cache(n);
    n->speed = o->speed_gbs > 0 ? o->speed_gbs * 1e9 : node_probe_speed(o->threads);
    n->flops = o->tflops > 0 ? o->tflops * 1e12 : node_probe_flops(o->threads);
    /* Only a node with a budget reads experts from disk (without --mem its weights are not capped). */
    if (o->eng.mem_bytes > 0) n->disk = o->disk_gbs > 0 ? o->disk_gbs * 1e9 : node_probe_disk(o->models_dir);
    if (node_probe_device(n, err) != 0) goto done_sock;
    /* The CPU architecture: a ring may mix them, and their kernels round differently (docs/numerics.md). */
    struct utsname un;
    snprintf(n->arch, sizeof n->arch, "%s", uname(&un) == 0 ? un.machine : "");
    node_log(n, "ready: key %s, %d model(s), %.1f GB/s matrix-vector, %.3f TFLOPS matrix-matrix, %d threads, %s%s", o->id.pk_hex,
             n->n_models, n->speed / 1e9, n->flops / 1e12, o->threads, n->arch[0] ? n->arch : "architecture unknown",
             n->disk > 0 ? ", experts from disk past --mem" : "");
    while (!node_stop_pending()) {
        /* The router's monitor is drained on every pass, messages or not: its events queue up otherwise. */
        zmq_pollitem_t items[3] = {{n->router, 0, ZMQ_POLLIN, 0}, {n->next, 0, ZMQ_POLLIN, 0},
                                   {n->router_mon.pair, 0, ZMQ_POLLIN, 0}};
        if (!n->next) items[1] = items[2];
        int np = n->next ? 3 : 2;
        if (zmq_poll(items, np, n->n_rjobs ? 1 : 250) < 0) {
            if (errno == EINTR) continue;
            rl_errf(err, "poll failed: %s", zmq_strerror(errno));
            goto done_sock;
        }
        node_watch_owner(n);
        if (n->next && (items[1].revents & ZMQ_POLLIN)) { /* downstream never talks back: drain */
            zs_parts junk;
            rl_err e2;
            while (zs_recv(n->next, &junk, &e2) == 0) zs_parts_free(&junk);
        }
        if (!(items[0].revents & ZMQ_POLLIN)) {
            node_flush_receipts(n); /* a quiet millisecond */
            continue;
        }
        for (;;) {
            zs_parts p;
            rl_err e2;
            if (node_stop_pending()) break; /* a queue of frames must not delay a stop */
            int r = zs_recv(n->router, &p, &e2);
            if (r != 0) break;
            node_flush_receipts(n);
            frame_header *h = malloc(sizeof *h);
            if (!h || p.n < 3) {
                if (o->verbose) node_log(n, "dropped a message of %d parts", p.n);
                free(h);
                zs_parts_free(&p);
                continue;
            }
            n->cur_ring = 0;
            if (frame_header_decode(h, p.data[1], p.len[1], &e2) != 0) {
                /* An authenticated peer sent garbage: say so (if it is our coordinator) and go on. */
                if (p.len[0] == n->coord_id_len && memcmp(p.data[0], n->coord_id, p.len[0]) == 0) {
                    node_error(n, 0, "malformed frame: %s", e2.msg);
                } else {
                    node_log(n, "dropped a malformed frame: %s", e2.msg);
                }
                free(h);
                zs_parts_free(&p);
                continue;
            }
            n->cur_ring = h->ring_id;
            if (node_from_coordinator(&p, h) && !node_admit(n, &p, h)) { /* another coordinator's: refused */
                free(h);
                zs_parts_free(&p);
                continue;
            }
            switch (h->type) {
            case FRAME_INFO_REQ: node_info(n); break;
            case FRAME_ASSIGN: node_assign(n, h->step_id, &p); break;
            case FRAME_LEND: node_lend(n, h->step_id, &p); break;
            case FRAME_PULL: node_pull(n, &p, h); break;
            case FRAME_PEERS:
#ifdef RINGLM_ADVERSARY
                if (n->o->misbehave && strcmp(n->o->misbehave, "noprobe") == 0) { /* knows no probes (an older node) */
                    node_error(n, h->step_id, "unexpected %s frame", frame_type_name(h->type));
                    break;
                }
#endif
                node_peers(n, h->step_id, &p);
                break;
            case FRAME_PROBE: node_probe(n, h->step_id, &p); break;
            case FRAME_PROBE_PING: node_probe_ping(n, &p, h); break;
            case FRAME_PING: node_reply(n, FRAME_PONG, h->step_id, NULL, 0); break;
            case FRAME_FORWARD: node_forward(n, &p, h); break;
            case FRAME_FREE: node_free(n, &p, h); break;
            case FRAME_AUDIT_REQ: /* only the coordinator audits; the answer goes to it */
                if (p.len[0] == n->coord_id_len && memcmp(p.data[0], n->coord_id, p.len[0]) == 0) node_audit(n, &p, h);
                else node_log(n, "dropped an AUDIT_REQ that did not come from the coordinator");
                break;
            case FRAME_FETCH_BEGIN: node_fetch_begin(n, h->step_id, &p); break;
            case FRAME_FETCH_DATA: node_fetch_data(n, h->step_id, &p); break;
            case FRAME_FETCH_END: node_fetch_end(n, h->step_id, &p); break;
            default: node_error(n, h->step_id, "unexpected %s frame", frame_type_name(h->type)); break;
            }
            free(h);
            zs_parts_free(&p);
        }
    }
    node_log(n, "stopping");
    rc = 0;
done_sock:
    node_fetch_abort(n);
    node_unload(n);
    node_free_rjobs(n);
    node_alog_clear(n);
#ifdef RINGLM_ADVERSARY
    free(n->adv_old);
#endif
    node_close_next(n);
    zmq_socket_monitor(n->router, NULL, 0);
    zs_monitor_stop(&n->router_mon);
done_reach:
    tn_dialout_stop(n->dial);
    tn_relay_stop(n->relay);
    tn_connector_free(n->tn);
    zmq_close(n->router);
done_auth:
    zs_auth_stop(&n->auth);
done_ctx:
    zmq_ctx_term(n->zctx);
done_free:
    free(n);
    return rc;
}
