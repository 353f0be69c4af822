#include "coord.h"
#include "../base/json.h"
#include "../base/clock.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cJSON.h>
#include <sodium.h>
#include <zmq.h>

#include "../gen/emit.h"
#include "../gguf/file_hash.h"
#include "../model/k3_memory.h"
#include "audit.h"
#include "../trust/manifest.h"
#include "ggml.h"
#include "gguf.h"

#include "coord_int.h"
#include "../plan/plan_model.h"
#include "../plan/predict.h"

int ring_opts_check_taps(const ring_opts *o, const uint32_t *layers, int n, rl_err *err) {
    if (n != o->n_taps || (n > 0 && memcmp(layers, o->taps, (size_t)n * sizeof *layers) != 0)) {
        return rl_errf(err, "the ring was opened without this draft's taps (ring_opts.taps)");
    }
    return 0;
}

ring_opts ring_opts_default(void) {
    /* A dead process or a dropped network is noticed by the link itself: a closed connection at once, and
     * ZeroMQ's transport heartbeats (answered by its I/O thread even while a node computes) close a silent
     * link within 5 s. dead_s only bounds a node that is connected but makes no progress: a node working
     * through a queue of prefill chunks answers no application ping until it is done, so it is generous. */
    return (ring_opts){.n_ctx = 4096, .wire = 0, .connect_s = 5, .load_s = 600, .dead_s = 60, .step_s = 300};
}


int ring_prediction(const ring_coord *rc, uint32_t prompt, uint32_t chunk, const predict_opts *spec, predict_result *r) {
    if (!rc->have_delays) return -1;
    predict_node nodes[PLAN_MAX_NODES];
    double hop_s[PLAN_MAX_NODES + 1];
    int prev = -1;
    for (int s = 0; s < rc->plan.n_stages; s++) {
        int nd = rc->plan.stages[s].node;
        nodes[s] = (predict_node){.speed = rc->nodes[nd].speed, .flops = rc->nodes[nd].flops > 0 ? rc->nodes[nd].flops : INFINITY,
                             .net = INFINITY, .disk = rc->nodes[nd].disk_bps, .col_reads = PREDICT_CPU_COL_READS};
        if (rc->pnodes[nd].ram_bytes > 0) { /* the device's figures, and the CPU's for the part in RAM */
            nodes[s].two_tier = true;
            nodes[s].col_reads = 1;
            nodes[s].ram_speed = nodes[s].speed;
            nodes[s].ram_flops = nodes[s].flops;
            nodes[s].speed = rc->nodes[nd].dev_speed;
            nodes[s].flops = rc->nodes[nd].dev_flops > 0 ? rc->nodes[nd].dev_flops : INFINITY;
        }
        const ring_node_state *ns = &rc->nodes[nd];
        if (ns->n_steps > 0 && ns->step_a == rc->plan.stages[s].a && ns->step_b == rc->plan.stages[s].b) {
            (void)predict_stage_calibrate(rc->m, &rc->hp, &rc->plan.stages[s], &nodes[s], ns->step_tok, ns->step_s, ns->n_steps);
        }
        hop_s[s] = prev < 0 ? rc->coord_delay_s[nd] : rc->delay_s[prev][nd];
        prev = nd;
    }
    hop_s[rc->plan.n_stages] = prev >= 0 ? rc->coord_delay_s[prev] : 0;
    predict_opts po = {.prompt = prompt ? prompt : 1, .chunk = chunk ? chunk : 512, .parallel = 1};
    if (spec) { /* speculation's figures: the caller's (measured, after a run) */
        po.acceptance = spec->acceptance, po.draft_k = spec->draft_k, po.draft_depth = spec->draft_depth;
        po.draft = spec->draft, po.draft_block_s = spec->draft_block_s, po.gen = spec->gen;
    }
    rl_err e2;
    return predict_predict(rc->m, &rc->hp, &rc->plan, nodes, hop_s, &po, r, &e2);
}

/* ---- ring_open, in phases --------------------------------------------------------------------------------
 * ring_open runs them in order; the first to fail stops it (err says why, naming the node), and ring_close
 * then lets go of whatever the phases before it took. */

/* The ring's state before anything is sent: the options, a fresh ring id and the audits' draws. */
static void ring_open_init(ring_coord *rc, const ring_conf *conf, const keys_identity *id, const mf_model *m,
                           const k3_hparams *hp, const ring_opts *o) {
    memset(rc, 0, sizeof *rc);
    rc->conf = *conf;
    rc->id = id;
    rc->o = *o;
    rc->hp = *hp;
    rc->m = m;
    if (o->audit_rate > 0) rc->o.receipts = true; /* an audit checks a node's frames against its receipts */
    audit_draws_init(&rc->audit, o->audit_seed);
    randombytes_buf(&rc->ring_id, sizeof rc->ring_id);
    rc->next_step = 1;
    rc->next_seq = 1;
}

/* The id the nodes know the model by: its manifest's hash (a manifest ring), else the whole file's. */
static int ring_open_model_id(ring_coord *rc, rl_err *err) {
    return rc->o.manifest ? coord_manifest_begin(rc, err) : fh_model_hash(rc->m, rc->model_hash, err);
}

static int ring_node_connect(ring_coord *rc, int i, double link_s, const char *rid, rl_err *err);

/* A routing id for a new set of the coordinator's connections: "coord-<key>-<session>-<connection>" (a node
 * serves one session at a time: node.c, node_admit; each set's id is new, so no node's ROUTER sees two
 * connections claim one id). */
static void ring_conn_rid(const ring_coord *rc, char *rid, size_t n) {
    snprintf(rid, n, "coord-%.16s-%016" PRIx64 "-%08x", rc->id->pk_hex, rc->o.session, randombytes_random());
}

/* A CURVE socket to every node of ring.conf, each with a monitor of its link. */
static int ring_open_connect(ring_coord *rc, rl_err *err) {
    const ring_conf *conf = &rc->conf;
    rc->zctx = zmq_ctx_new();
    if (!rc->zctx) return rl_errf(err, "cannot create a ZeroMQ context");
    if (!(rc->tn = tn_connector_new(err))) return -1; /* for nodes behind NATs (relay: in ring.conf) */
    /* "coord-<key>-<session>-<connection>": a node serves one session at a time (node.c: node_admit), and
     * each connection's id is new, so no node's ROUTER ever sees two connections claim one id. */
    if (rc->o.session == 0) randombytes_buf(&rc->o.session, sizeof rc->o.session);
    char rid[80];
    ring_conn_rid(rc, rid, sizeof rid);
    for (int i = 0; i < conf->n; i++) {
        /* generous until the round trips are known (ring_links_fit) */
        if (ring_node_connect(rc, i, ZS_LINK_SLOW_S, rid, err) != 0) return -1;
    }
    return 0;
}

/* Node i's socket, with a link bound of link_s (zs_client), replacing the one it had. */
static int ring_node_connect(ring_coord *rc, int i, double link_s, const char *rid, rl_err *err) {
    const ring_conf *conf = &rc->conf;
    if (rc->nodes[i].sock) {
        zmq_socket_monitor(rc->nodes[i].sock, NULL, 0);
        zs_monitor_stop(&rc->nodes[i].mon);
        zmq_close(rc->nodes[i].sock);
    }
    char addr[160];
    ring_dial_addr(conf, i, rc->o.relay_addr, addr, sizeof addr);
    rc->nodes[i].sock = zs_client(rc->zctx, rc->tn, addr, rc->id, conf->nodes[i].key.curve_pk_z85, rid, link_s, err);
    if (!rc->nodes[i].sock) {
        rl_err_prefix(err, "node %s", conf->nodes[i].addr);
        return -1;
    }
    rc->nodes[i].link_s = link_s;
    char name[16];
    snprintf(name, sizeof name, "n%d", i);
    zs_monitor_start(&rc->nodes[i].mon, rc->zctx, rc->nodes[i].sock, name, err);
    return 0;
}

/* Once the round trips are known (measured for the order, else a few PINGs now): every link is opened again
 * with its bound (3 round trips, at least --link-timeout), so a silent node is noticed that soon, and a
 * healthy slow link is never cut. Until then the links had the generous ZS_LINK_SLOW_S. A node serves the
 * connection its coordinator last spoke on and is freed when that one closes (node.c, node_admit), so the
 * new link carries a PING and its PONG before the old one closes. */
static int ring_links_fit(ring_coord *rc, rl_err *err) {
    bool use[PLAN_MAX_NODES];
    for (int i = 0; i < rc->conf.n; i++) use[i] = !(rc->o.exclude && rc->o.exclude[i]);
    if (!rc->have_delays && ring_coord_rtts(rc, use, err) != 0) return -1;
    char rid[80];
    ring_conn_rid(rc, rid, sizeof rid);
    for (int i = 0; i < rc->conf.n; i++) {
        if (!use[i]) continue;
        void *old = rc->nodes[i].sock;
        zs_monitor old_mon = rc->nodes[i].mon;
        rc->nodes[i].sock = NULL;
        const double bound = zs_link_bound(rc->o.link_s, 2 * rc->coord_delay_s[i]);
        if (bound > zs_link_bound(rc->o.link_s, 0) * 1.001 && !rc->o.quiet) {
            fprintf(stderr, "link to %s: round trip %.0f ms, declared down after %.2f s of silence\n",
                    rc->conf.nodes[i].addr, 2000 * rc->coord_delay_s[i], bound);
        }
        int r = ring_node_connect(rc, i, bound, rid, err);
        if (r == 0 && !zs_wait_writable(rc->nodes[i].sock, 10000)) {
            r = rl_errf(err, "node %s: the link opened again for its %.0f ms round trip did not come up in 10 s",
                        rc->conf.nodes[i].addr, 2000 * rc->coord_delay_s[i]);
        }
        if (r == 0) r = ring_ping(rc, i, 0x6c696e6b00000000ull /* "link" */, err);
        zmq_socket_monitor(old, NULL, 0);
        zs_monitor_stop(&old_mon);
        zmq_close(old);
        if (r != 0) return -1;
    }
    return 0;
}

/* A node's INFO into its state: memory, speed, FLOPs and disk; the device it computes on, with each part's
 * room when it names several; how its engine computes (audits of it compute the same way); and which of the
 * model it holds (the whole file, ranges streamed before, or a manifest ring's split files). */
static void ring_info_read(ring_coord *rc, int from, const cJSON *j) {
    const cJSON *mem = j ? cJSON_GetObjectItemCaseSensitive(j, "mem_bytes") : NULL;
    const cJSON *sp = j ? cJSON_GetObjectItemCaseSensitive(j, "speed_bps") : NULL;
    const cJSON *models = j ? cJSON_GetObjectItemCaseSensitive(j, "models") : NULL;
    rc->nodes[from].mem_bytes = cJSON_IsNumber(mem) ? (uint64_t)mem->valuedouble : 0;
    rc->nodes[from].speed = cJSON_IsNumber(sp) && sp->valuedouble > 0 ? sp->valuedouble : 1e9;
    const cJSON *dk = j ? cJSON_GetObjectItemCaseSensitive(j, "disk_bps") : NULL;
    rc->nodes[from].disk_bps = cJSON_IsNumber(dk) && dk->valuedouble > 0 ? dk->valuedouble : 0;
    const cJSON *fl = j ? cJSON_GetObjectItemCaseSensitive(j, "flops") : NULL;
    rc->nodes[from].flops = cJSON_IsNumber(fl) && fl->valuedouble > 0 ? fl->valuedouble : 0;
    /* The backend of the device it computes on ("backend" names the device; "devices" its backend). */
    const char *bk = j ? rl_json_str(j, "backend") : NULL;
    char first[64] = "";
    if (bk) snprintf(first, sizeof first, "%.*s", (int)strcspn(bk, ","), bk);
    const cJSON *dl = j ? cJSON_GetObjectItemCaseSensitive(j, "devices") : NULL, *de;
    cJSON_ArrayForEach(de, dl) {
        const char *nm = rl_json_str(de, "name"), *br = rl_json_str(de, "backend");
        if (nm && br && first[0] && strcmp(first, "CPU") != 0 && strcmp(nm, first) == 0) {
            snprintf(rc->nodes[from].dev_reg, sizeof rc->nodes[from].dev_reg, "%s", br);
        }
    }
    const char *ar = j ? rl_json_str(j, "arch") : NULL;
    snprintf(rc->nodes[from].arch, sizeof rc->nodes[from].arch, "%s", ar ? ar : "");
    const cJSON *dv = j ? cJSON_GetObjectItemCaseSensitive(j, "device") : NULL;
    const char *dn = rl_json_str(dv, "name");
    const double db = rl_json_num(dv, "mem_bytes", 0), dsp = rl_json_num(dv, "speed_bps", 0), dfl = rl_json_num(dv, "flops", 0);
    if (dn && db > 0 && db < 1e19 && dsp > 0 && isfinite(dsp)) {
        snprintf(rc->nodes[from].dev_name, sizeof rc->nodes[from].dev_name, "%s", dn);
        rc->nodes[from].dev_bytes = (uint64_t)db;
        rc->nodes[from].dev_speed = dsp;
        rc->nodes[from].dev_flops = dfl > 0 && isfinite(dfl) ? dfl : 0;
        /* Several devices: each one's room from the "devices" list, to print the node's split. */
        rc->nodes[from].n_parts = 0;
        for (const char *p = dn; *p && rc->nodes[from].n_parts < PLAN_MAX_PARTS;) {
            const size_t len = strcspn(p, ",");
            const int k = rc->nodes[from].n_parts;
            snprintf(rc->nodes[from].part_name[k], sizeof rc->nodes[from].part_name[k], "%.*s", (int)len, p);
            double fr = -1;
            cJSON_ArrayForEach(de, dl) {
                const char *nm = rl_json_str(de, "name");
                if (nm && strcmp(nm, rc->nodes[from].part_name[k]) == 0) fr = rl_json_num(de, "free_bytes", -1);
            }
            if (!(fr >= 0 && fr < 1e19)) { /* a device the list does not have: no split to print */
                rc->nodes[from].n_parts = 0;
                break;
            }
            rc->nodes[from].part_room[k] = k3_dev_room((size_t)fr);
            rc->nodes[from].n_parts++;
            p += len + (p[len] == ',');
        }
    }
    k3_engine_opts *eng = &rc->nodes[from].eng;
    eng->no_repack = cJSON_IsFalse(j ? cJSON_GetObjectItemCaseSensitive(j, "repack") : NULL);
    eng->no_flash_attn = !cJSON_IsTrue(j ? cJSON_GetObjectItemCaseSensitive(j, "flash_attn") : NULL);
    const char *ct = j ? rl_json_str(j, "cache_type") : NULL;
    eng->cache_f32 = !(ct && strcmp(ct, "f16") == 0);
    const cJSON *it;
    if (rc->o.manifest) coord_manifest_info(rc, from, j ? cJSON_GetObjectItemCaseSensitive(j, "files") : NULL);
    cJSON_ArrayForEach(it, models) {
        if (rc->o.manifest) break; /* held by files (above), not by whole-file hash */
        const char *hsh = rl_json_str(it, "hash");
        if (!hsh || strcmp(hsh, rc->model_hash) != 0) continue;
        const cJSON *ra = cJSON_GetObjectItemCaseSensitive(it, "a"), *rb = cJSON_GetObjectItemCaseSensitive(it, "b");
        if (cJSON_IsNumber(ra) && cJSON_IsNumber(rb)) {
            ring_node_state *ns = &rc->nodes[from];
            if (ns->n_ranges < 16) {
                ns->range_a[ns->n_ranges] = (uint32_t)ra->valuedouble;
                ns->range_b[ns->n_ranges++] = (uint32_t)rb->valuedouble;
            }
        } else {
            rc->nodes[from].has_model = true;
        }
    }
}

/* INFO from every node (but those left out), asked again every 0.1 s until connect_s: ZeroMQ connects in the
 * background, and IMMEDIATE sockets drop what they cannot deliver yet. */
static int ring_open_info(ring_coord *rc, rl_err *err) {
    const ring_conf *conf = &rc->conf;
    const ring_opts *o = &rc->o;
    for (int i = 0; i < conf->n; i++) {
        rl_err e2;
        ring_send(rc, i, FRAME_INFO_REQ, 0, NULL, NULL, 0, NULL, 0, &e2); /* may fail until connected: retried below */
    }
    bool got[PLAN_MAX_NODES] = {0};
    rl_err busy = {{0}};
    double t0 = rl_clock_now(), last_send = t0;
    int n_got = 0;
    for (int i = 0; o->exclude && i < conf->n; i++) { /* left out: not asked, planned with no memory */
        if (o->exclude[i]) got[i] = true, n_got++, rc->nodes[i].speed = 1e9;
    }
    while (n_got < conf->n) {
        if (ring_aborted(rc) || gen_sigint_pending()) return rl_errf(err, "interrupted");
        if (rl_clock_now() - t0 > o->connect_s) {
            if (busy.msg[0]) {
                *err = busy;
                return -1;
            }
            for (int i = 0; i < conf->n; i++) {
                if (got[i]) continue;
                zs_monitor_poll(&rc->nodes[i].mon);
                bool refused = strstr(rc->nodes[i].mon.last, "refused our key") != NULL;
                char why[300]; /* a relayed node: what its relay said (no node with that key has dialled it) */
                tn_connector_why(rc->tn, conf->nodes[i].key.curve_pk, why, sizeof why);
                /* (the relay's refusal first: our connector closing the local connection looks to ZeroMQ
                 * like a failed handshake) */
                rl_errf(err, "node %s did not answer within %.0f s: %s%s%s", conf->nodes[i].addr, o->connect_s,
                        why[0] ? why : rc->nodes[i].mon.last[0] ? rc->nodes[i].mon.last : "unreachable",
                        refused ? ": start it with --allow " : "", refused ? rc->id->pk_hex : "");
                break;
            }
            return -1;
        }
        if (rl_clock_now() - last_send > 0.1) { /* IMMEDIATE sockets drop what they cannot deliver yet: resend */
            last_send = rl_clock_now();
            for (int i = 0; i < conf->n; i++) {
                rl_err e2;
                if (!got[i]) ring_send(rc, i, FRAME_INFO_REQ, 0, NULL, NULL, 0, NULL, 0, &e2);
            }
        }
        zs_parts p;
        frame_header h;
        int from;
        rl_err e2;
        rc->busy_node = -1;
        if (ring_wait(rc, FRAME_INFO, -1, 0.2, NULL, &from, &p, &h, &e2) != 0) {
            if (strncmp(e2.msg, "no ", 3) == 0) continue; /* just the short timeout */
            if (rc->busy_node >= 0 && !got[rc->busy_node]) {
                /* Held by another coordinator. It may be letting go right now (its connection closing as we
                 * connect): ask again until connect_s, then say who holds it. */
                busy = e2;
                continue;
            }
            *err = e2;
            return -1;
        }
        if (!got[from]) {
            cJSON *j = cJSON_ParseWithLength(p.data[1], p.len[1]);
            ring_info_read(rc, from, j);
            cJSON_Delete(j);
            got[from] = true;
            rc->nodes[from].last_seen = rl_clock_now();
            n_got++;
        }
        zs_parts_free(&p);
    }
    return 0;
}

/* The order the ring runs in: perm[k] is the ring.conf index of the k-th node; the n_use nodes planned come
 * first, those left out (exclude) last, where the plan ignores them. cycle_s: its measured round trip, and
 * conf_cycle_s that of ring.conf's order (both 0 unless have_delays). */
typedef struct ring_ordering {
    int perm[PLAN_MAX_NODES];
    int n_use;
    double cycle_s, conf_cycle_s;
} ring_ordering;

/* The order: measured (coord_probe.c) unless ring.conf's is to be kept; ring.conf's, said so, when the
 * delays cannot be measured. */
static int ring_open_order_pick(ring_coord *rc, ring_ordering *ord, rl_err *err);
static int ring_open_order(ring_coord *rc, ring_ordering *ord, rl_err *err) {
    if (ring_open_order_pick(rc, ord, err) != 0) return -1;
    return ring_links_fit(rc, err);
}

static int ring_open_order_pick(ring_coord *rc, ring_ordering *ord, rl_err *err) {
    const ring_conf *conf = &rc->conf;
    const ring_opts *o = &rc->o;
    bool use[PLAN_MAX_NODES];
    ord->n_use = 0;
    ord->cycle_s = ord->conf_cycle_s = 0;
    for (int i = 0; i < conf->n; i++) {
        use[i] = !(o->exclude && o->exclude[i]);
        ord->n_use += use[i];
        ord->perm[i] = i;
    }
    if (o->keep_order || ord->n_use < 2) return 0;
    rl_err pe = {{0}};
    int m_use = 0;
    if (ring_probe(rc, use, &pe) != 0 ||
        ring_order_measured(rc, use, ord->perm, &m_use, &ord->cycle_s, &ord->conf_cycle_s, &pe) != 0) {
        if (ring_aborted(rc) || gen_sigint_pending()) return rl_errf(err, "interrupted");
        rc->have_delays = false;
        for (int i = 0; i < conf->n; i++) ord->perm[i] = i;
        if (!o->quiet) fprintf(stderr, "ring order: ring.conf's (the delays could not be measured: %s)\n", pe.msg);
        return 0;
    }
    for (int i = 0; i < conf->n; i++) {
        if (!use[i]) ord->perm[m_use++] = i;
    }
    return 0;
}

/* The cut (plan.h) over the nodes in that order: each node's memory (capped by ring.conf's mem=, none for a
 * node left out or one that lacks the model under --no-fetch), a GPU as a tier before its RAM, and in a
 * manifest ring what each would be streamed; stages then name ring.conf indices. */
static int ring_open_plan(ring_coord *rc, const ring_ordering *ord, rl_err *err) {
    const ring_conf *conf = &rc->conf;
    const ring_opts *o = &rc->o;
    /* The MLA cache as the nodes keep it: f16 (the default), f32 if any node runs --cache-type f32 (the
     * plan's per-layer figure must hold wherever the layer lands). */
    size_t cache_elem = 2;
    for (int i = 0; i < conf->n; i++) {
        if (rc->nodes[i].eng.cache_f32) cache_elem = 4;
    }
    plan_model pm;
    plan_model_read(&pm, rc->m, &rc->hp, o->n_seqs > 0 ? (uint32_t)o->n_seqs : 1, o->n_ctx, cache_elem, o->spec_block,
                    o->spec_block ? o->spec_depth : 0, o->ctx_checkpoints);
    uint64_t (*lack)[PLAN_MAX_LAYERS + 2] = o->manifest ? calloc((size_t)conf->n, sizeof *lack) : NULL;
    if (o->manifest && !lack) return rl_errf(err, "out of memory");
    for (int i = 0; i < conf->n; i++) {
        plan_node *pn = &rc->pnodes[i];
        if (lack) coord_manifest_lack(rc, i, lack[i]), pn->lack = lack[i];
        snprintf(pn->name, sizeof pn->name, "%s", conf->nodes[i].addr);
        pn->mem_bytes = rc->nodes[i].mem_bytes;
        if (conf->nodes[i].mem_gb > 0 && (uint64_t)(conf->nodes[i].mem_gb * 1073741824.0) < pn->mem_bytes) {
            pn->mem_bytes = (uint64_t)(conf->nodes[i].mem_gb * 1073741824.0);
        }
        if (!rc->nodes[i].has_model && o->no_fetch && !o->manifest) pn->mem_bytes = 0; /* cannot serve without the file */
        if (o->exclude && o->exclude[i]) pn->mem_bytes = 0;
        pn->speed = rc->nodes[i].speed;
        pn->disk_bps = rc->nodes[i].disk_bps;
        if (rc->nodes[i].dev_bytes > 0 && pn->mem_bytes > 0) { /* a GPU first, RAM after */
            pn->ram_bytes = pn->mem_bytes;
            pn->ram_speed = pn->speed;
            pn->mem_bytes = rc->nodes[i].dev_bytes;
            pn->speed = rc->nodes[i].dev_speed;
            _Static_assert(sizeof pn->device == sizeof rc->nodes[i].dev_name, "device names: one size");
            memcpy(pn->device, rc->nodes[i].dev_name, sizeof pn->device);
            pn->n_parts = rc->nodes[i].n_parts;
            memcpy(pn->part_name, rc->nodes[i].part_name, sizeof pn->part_name);
            memcpy(pn->part_room, rc->nodes[i].part_room, sizeof pn->part_room);
        }
    }
    plan_node in_order[PLAN_MAX_NODES];
    for (int k = 0; k < conf->n; k++) in_order[k] = rc->pnodes[ord->perm[k]];
    int prc = plan_make(&pm, in_order, conf->n, 0.10, &rc->plan, err);
    for (int s = 0; prc == 0 && s < rc->plan.n_stages; s++) {
        rc->plan.stages[s].node = ord->perm[rc->plan.stages[s].node];
    }
    for (int i = 0; i < conf->n; i++) rc->pnodes[i].lack = NULL; /* (lack is freed now) */
    free(lack);
    return prc != 0 ? -1 : 0;
}

/* What the plan is, on stderr (unless quiet): the order with its round trip, the cut, what the planner
 * predicts of it, and in a manifest ring which split files each stage holds. */
static void ring_open_print(const ring_coord *rc, const ring_ordering *ord) {
    const ring_conf *conf = &rc->conf;
    if (rc->o.quiet) return;
    if (rc->have_delays) {
        bool moved = false;
        for (int k = 0; k < ord->n_use; k++) moved |= ord->perm[k] != k;
        fprintf(stderr, "ring order (delays measured; round trip %.1f ms%s):", ord->cycle_s * 1e3,
                moved ? "" : ", ring.conf's");
        for (int k = 0; k < ord->n_use; k++) fprintf(stderr, " %s", conf->nodes[ord->perm[k]].addr);
        if (moved) {
            fprintf(stderr, "\n  (reordered: ring.conf's order takes %.1f ms; --keep-order keeps it)",
                    ord->conf_cycle_s * 1e3);
        }
        fprintf(stderr, "\n");
    }
    plan_print(&rc->plan, rc->pnodes, stderr);
    for (int s = 0; s < rc->plan.n_stages; s++) { /* the stages behind NATs, and what reaching them costs */
        int i = rc->plan.stages[s].node, by, up = s > 0 ? rc->plan.stages[s - 1].node : -1;
        char via[128];
        ring_reach_kind k = ring_reach(conf, i, rc->o.relay_addr, via, sizeof via, &by);
        if (k == RING_REACH_DIRECT) continue;
        char who[200] = "";
        if (by >= 0) snprintf(who, sizeof who, ", run by %s", conf->nodes[by].addr);
        bool up_runs = up >= 0 && by == up; /* its upstream runs that relay: its hop is a connection it holds */
        const char *coord_hop = k == RING_REACH_DIALOUT ? "our link to it is its own connection (no extra hop)"
                                                        : "our link to it crosses the relay (+1 hop)";
        const char *up_hop = s == 0 ? "" : up_runs ? "; its upstream runs that relay (no extra hop)"
                                                   : "; its upstream's link to it crosses the relay (+1 hop)";
        fprintf(stderr, "reach: stage %d (%s) dialled out to %s %s%s: %s%s\n", s, conf->nodes[i].addr,
                k == RING_REACH_DIALOUT ? "this coordinator's relay" : "relay", via, who, coord_hop, up_hop);
    }
    predict_result pred;
    if (ring_prediction(rc, 1, 1, NULL, &pred) == 0) {
        fprintf(stderr, "predicted (ringlm plan's model, docs/plan.md): decode %.2f tok/s greedy = 1 / (hops %.1f ms measured + "
                        "compute %.1f ms at the nodes' speeds and FLOPs)\n", pred.greedy_tok_s, pred.hops_s * 1e3,
                pred.compute_s * 1e3);
    }
    if (rc->o.manifest) coord_manifest_print(rc, stderr);
}

/* A manifest ring: every stage's missing split files lent to it by nodes that hold them (holders[s], for
 * stage s's ASSIGN); under --no-fetch a stage may miss none. */
static int ring_open_lend(ring_coord *rc, cJSON **holders, rl_err *err) {
    const ring_opts *o = &rc->o;
    if (!o->manifest) return 0;
    for (int s = 0; o->no_fetch && s < rc->plan.n_stages; s++) {
        if (rc->plan.stages[s].lack_bytes) {
            const plan_stage *st = &rc->plan.stages[s];
            return rl_errf(err, "--no-fetch: no cut gives every stage only layers its node holds (%s lacks some of "
                           "[%u, %u))", rc->conf.nodes[st->node].addr, st->a, st->b);
        }
    }
    return coord_manifest_lend(rc, holders, err);
}

/* With receipts, the ledger that checks them: what every receipt must say, from our own copy of the model
 * (or its manifest) and the plan, never from receipts. */
static int ring_open_ledger(ring_coord *rc, rl_err *err) {
    const ring_conf *conf = &rc->conf;
    const ring_opts *o = &rc->o;
    if (!o->receipts) return 0;
    receipt_stage_expect rexp[PLAN_MAX_NODES];
    const char *names[PLAN_MAX_NODES];
    for (int s = 0; s < rc->plan.n_stages; s++) {
        receipt_stage_expect *x = &rexp[s];
        memcpy(x->node_pk, conf->nodes[rc->plan.stages[s].node].key.sign_pk, 32);
        x->layer_start = rc->plan.stages[s].a;
        x->layer_end = rc->plan.stages[s].b;
        names[s] = conf->nodes[rc->plan.stages[s].node].addr;
        if ((o->manifest ? manifest_file_range_hash(o->manifest, x->layer_start, x->layer_end, x->manifest, err)
                         : manifest_range_hash(rc->m, &rc->hp, x->layer_start, x->layer_end, x->manifest, err)) != 0) {
            return -1;
        }
    }
    ledger_config lc = {.ring_id = rc->ring_id, .n_layer = rc->hp.n_layer, .n_stages = rc->plan.n_stages, .stages = rexp,
                    .names = names, .out = o->receipts_out, .on_receipts = o->on_receipts,
                    .user = o->on_receipts_user,
                    .keep = o->audit_rate > 0 ? (o->audit_keep > 0 ? o->audit_keep : 4096) : 0};
    if (ledger_init(&rc->ledger, &lc, err) != 0) return -1;
    rc->have_ledger = true;
    return 0;
}

/* Stage s's ASSIGN (node.c: node_assign): its range, the ring's shape and options, its neighbours, and in a
 * manifest ring who lends it what it lacks (holders, taken over). NULL: out of memory. */
static char *ring_assign_json(const ring_coord *rc, int s, cJSON **holders) {
    const ring_conf *conf = &rc->conf;
    const ring_opts *o = &rc->o;
    const plan_stage *st = &rc->plan.stages[s];
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "model_hash", rc->model_hash);
    if (o->manifest) {
        cJSON_AddBoolToObject(j, "manifest", true);
        cJSON_AddItemToObject(j, "holders", holders[s]);
        holders[s] = NULL;
    }
    cJSON_AddNumberToObject(j, "a", st->a);
    cJSON_AddNumberToObject(j, "b", st->b);
    cJSON_AddNumberToObject(j, "stage", s);
    cJSON_AddNumberToObject(j, "n_stages", rc->plan.n_stages);
    cJSON_AddNumberToObject(j, "n_ctx", o->n_ctx);
    cJSON_AddNumberToObject(j, "n_seqs", o->n_seqs > 0 ? o->n_seqs : 1); /* the node pools their states */
    cJSON_AddStringToObject(j, "wire", o->wire == 1 ? "f16" : o->wire == 2 ? "bf16" : "f32");
    if (o->spec_block > 0 && o->spec_depth > 0) cJSON_AddNumberToObject(j, "rollback_blocks", o->spec_depth);
    if (o->ctx_checkpoints > 0) cJSON_AddNumberToObject(j, "ctx_checkpoints", o->ctx_checkpoints);
    if (o->n_taps > 0) {
        cJSON *ta = cJSON_AddArrayToObject(j, "taps");
        for (int k = 0; k < o->n_taps; k++) cJSON_AddItemToArray(ta, cJSON_CreateNumber(o->taps[k]));
    }
    if (rc->pnodes[st->node].ram_bytes > 0) { /* how the stage splits between the node's GPU and RAM */
        cJSON_AddNumberToObject(j, "gpu_layers", st->dev_layers);
        cJSON_AddNumberToObject(j, "n_cpu_moe", st->cpu_moe ? st->a + st->cpu_moe : 0);
    }
    if (s > 0) cJSON_AddStringToObject(j, "upstream", conf->nodes[rc->plan.stages[s - 1].node].key.pk_hex);
    if (s + 1 < rc->plan.n_stages) {
        const ring_node_conf *nx = &conf->nodes[rc->plan.stages[s + 1].node];
        cJSON *nj = cJSON_AddObjectToObject(j, "next");
        cJSON_AddStringToObject(nj, "addr", nx->addr);
        cJSON_AddStringToObject(nj, "pubkey", nx->key.pk_hex);
        /* how soon the stage must call that link down when it goes silent: 3 of its measured round trips */
        const int a = st->node, b = rc->plan.stages[s + 1].node;
        /* measured; else at most the way through the coordinator (its own round trips are always known) */
        double rtt = rc->have_delays && rc->delay_s[a][b] < 100 ? 2 * rc->delay_s[a][b] : 0;
        if (rtt <= 0) rtt = 2 * (rc->coord_delay_s[a] + rc->coord_delay_s[b]);
        cJSON_AddNumberToObject(nj, "link_s", zs_link_bound(o->link_s, rtt));
    }
    char *js = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    return js;
}

/* Stage s's READY: where the node computes its layers (a GPU, split with its CPU: docs/devices.md), and its
 * stage's own timed frames for the prediction (a malformed entry leaves them all out). */
static void ring_ready_read(ring_coord *rc, int s, const zs_parts *p) {
    const plan_stage *st = &rc->plan.stages[s];
    cJSON *rj = p->n >= 2 ? cJSON_ParseWithLength(p->data[1], p->len[1]) : NULL;
    const cJSON *wh = rj ? cJSON_GetObjectItemCaseSensitive(rj, "where") : NULL;
    if (!rc->o.quiet && cJSON_IsString(wh)) {
        const char *arch = rc->nodes[st->node].arch; /* a ring may mix CPU architectures (docs/numerics.md) */
        fprintf(stderr, "stage %d (%s%s%s) computes on %s\n", s + 1, rc->conf.nodes[st->node].addr, arch[0] ? ", " : "",
                arch, wh->valuestring);
    }
    ring_node_state *ns = &rc->nodes[st->node];
    ns->n_steps = 0;
    const cJSON *steps = rj ? cJSON_GetObjectItemCaseSensitive(rj, "steps") : NULL, *sv;
    cJSON_ArrayForEach(sv, steps) {
        const double tk = rl_json_num(sv, "tokens", 0), sec = rl_json_num(sv, "s", 0);
        if (ns->n_steps < 0 || ns->n_steps == 8 || !(tk >= 1 && tk <= rc->o.n_ctx && sec > 0 && sec < 3600)) {
            ns->n_steps = -1;
            continue;
        }
        ns->step_tok[ns->n_steps] = tk;
        ns->step_s[ns->n_steps++] = sec;
    }
    if (ns->n_steps < 0) ns->n_steps = 0;
    ns->step_a = st->a, ns->step_b = st->b;
    for (int i = 0; i < ns->n_steps; i++) { /* the deadlines' first figures for this stage */
        if (ns->step_tok[i] <= RING_DL_SMALL) rc->dl_step[s] = fmax(rc->dl_step[s], ns->step_s[i]);
        else rc->dl_tok[s] = fmax(rc->dl_tok[s], ns->step_s[i] / ns->step_tok[i]);
    }
    cJSON_Delete(rj);
}

/* Every stage assigned, last stage first, so every downstream neighbour trusts its upstream before it
 * connects: its range streamed first if its node holds no file that covers it, then ASSIGN, then READY
 * once it has loaded. */
static int ring_open_assign(ring_coord *rc, cJSON **holders, rl_err *err) {
    const ring_conf *conf = &rc->conf;
    const ring_opts *o = &rc->o;
    for (int s = rc->plan.n_stages - 1; s >= 0; s--) {
        const plan_stage *st = &rc->plan.stages[s];
        const ring_node_state *ns = &rc->nodes[st->node];
        bool covered = ns->has_model || o->manifest; /* (a manifest ring's stages pull what they lack) */
        for (int r = 0; r < ns->n_ranges && !covered; r++) covered = ns->range_a[r] <= st->a && ns->range_b[r] >= st->b;
        if (!covered && ring_stream(rc, st->node, rc->m, st->a, st->b, err) != 0) {
            rl_err_prefix(err, "streaming layers [%u, %u) to %s", st->a, st->b, conf->nodes[st->node].addr);
            return -1;
        }
        char *js = ring_assign_json(rc, s, holders);
        int r = js ? ring_send(rc, st->node, FRAME_ASSIGN, 0, NULL, js, strlen(js), rc->mf_bytes, rc->mf_len, err)
                   : rl_errf(err, "out of memory");
        free(js);
        if (r != 0) return -1;
        zs_parts p;
        frame_header h;
        int from;
        if (ring_wait(rc, FRAME_READY, st->node, o->load_s, NULL, &from, &p, &h, err) != 0) {
            rl_err_prefix(err, "loading layers [%u, %u) on %s", st->a, st->b, conf->nodes[st->node].addr);
            return -1;
        }
        ring_ready_read(rc, s, &p);
        zs_parts_free(&p);
    }
    return 0;
}

/* The prediction again, from the stages' own timed frames (READY "steps"), when any stage sent them. */
static void ring_open_print_timed(const ring_coord *rc) {
    bool timed = false;
    for (int s = 0; s < rc->plan.n_stages; s++) timed |= rc->nodes[rc->plan.stages[s].node].n_steps > 0;
    predict_result pred;
    if (!rc->o.quiet && timed && ring_prediction(rc, 1, 1, NULL, &pred) == 0) {
        fprintf(stderr, "predicted from the stages' own timed frames: decode %.2f tok/s greedy = 1 / (hops %.1f ms + "
                        "compute %.1f ms)\n", pred.greedy_tok_s, pred.hops_s * 1e3, pred.compute_s * 1e3);
    }
}

int ring_open(ring_coord *rc, const ring_conf *conf, const keys_identity *id, const mf_model *m, const k3_hparams *hp,
              const ring_opts *o, rl_err *err) {
    ring_open_init(rc, conf, id, m, hp, o);
    ring_ordering ord;
    int r = ring_open_model_id(rc, err);
    if (r == 0) r = ring_open_connect(rc, err);
    if (r == 0) r = ring_open_info(rc, err);
    if (r == 0) r = ring_open_order(rc, &ord, err);
    if (r == 0) r = ring_open_plan(rc, &ord, err);
    if (r == 0) ring_open_print(rc, &ord);
    if (r == 0 && o->plan_only) return 0; /* `ringlm plan`: rc->plan holds it; the caller closes the ring */
    cJSON *holders[PLAN_MAX_NODES] = {0}; /* a manifest ring: each stage's lenders, until its ASSIGN takes them */
    if (r == 0) r = ring_open_lend(rc, holders, err);
    if (r == 0) r = ring_open_ledger(rc, err);
    if (r == 0) r = ring_open_assign(rc, holders, err);
    for (int s = 0; s < PLAN_MAX_NODES; s++) cJSON_Delete(holders[s]);
    if (r != 0) {
        ring_close(rc);
        return -1;
    }
    ring_open_print_timed(rc);
    return 0;
}

void ring_close(ring_coord *rc) {
    ring_audit_free(rc);
    if (rc->have_ledger) ledger_free(&rc->ledger);
    rc->have_ledger = false;
    /* Results that arrived but were never collected (a step abandoned on failure) own their buffers. */
    for (int i = 0; i < rc->n_pending; i++) {
        if (rc->pending[i].done) zs_parts_free(&rc->pending[i].parts);
        free(rc->pending[i].taps);
    }
    rc->n_pending = 0;
    free(rc->mf_bytes);
    rc->mf_bytes = NULL;
    for (int i = 0; i < rc->conf.n; i++) {
        free(rc->nodes[i].files);
        rc->nodes[i].files = NULL;
        if (rc->nodes[i].sock) {
            zmq_socket_monitor(rc->nodes[i].sock, NULL, 0);
            zs_monitor_stop(&rc->nodes[i].mon);
            zmq_close(rc->nodes[i].sock);
            rc->nodes[i].sock = NULL; /* ring_close may be called again (a server re-opening its ring) */
        }
    }
    if (rc->zctx) zmq_ctx_term(rc->zctx);
    rc->zctx = NULL;
    tn_connector_free(rc->tn);
    rc->tn = NULL;
}

/* What a frame of t tokens is expected to cost stage s (ring_coord.dl_*): 0 when not known. */
static double ring_stage_expect(const ring_coord *rc, int s, uint32_t t) {
    const double step = rc->dl_step[s], tok = rc->dl_tok[s];
    if (t <= RING_DL_SMALL) return fmax(step > 0 ? step : tok * RING_DL_SMALL, tok * t);
    return fmax(step, tok > 0 ? tok * t : step * t);
}

/* The deadline of frame pd, about to be sent behind the frames in flight (frame.h budget_ms, RING_DL_*): the
 * compute every stage is expected to spend on all of them, then this one, times RING_DL_MULT, plus twice the
 * hops' delays, at least RING_DL_MIN_S. 0 (none) while any stage's costs are unknown, or when it would reach
 * dead_s, which bounds a silent node anyway. */
static double ring_frame_budget(const ring_coord *rc, const struct ring_pending *pd) {
    double work = 0, hops = 0;
    int prev = -1;
    for (int s = 0; s < rc->plan.n_stages; s++) {
        double e = ring_stage_expect(rc, s, pd->tokens);
        if (!(e > 0)) return 0;
        for (int i = 0; i < rc->n_pending; i++) e += ring_stage_expect(rc, s, rc->pending[i].tokens);
        work += e;
        const int nd = rc->plan.stages[s].node;
        if (rc->have_delays) hops += prev < 0 ? rc->coord_delay_s[nd] : rc->delay_s[prev][nd];
        prev = nd;
    }
    if (rc->have_delays && prev >= 0) hops += rc->coord_delay_s[prev];
    const double b = fmax(RING_DL_MIN_S, RING_DL_MULT * work + 2 * hops);
    return b < rc->o.dead_s && b < 4e6 ? b : 0;
}

int ring_submit(ring_coord *rc, const ring_seq_req *reqs, int n_reqs, uint64_t *step_id, rl_err *err) {
    if (n_reqs < 1 || n_reqs > FRAME_MAX_SEQS) return rl_errf(err, "bad number of sequences %d", n_reqs);
    if (rc->n_pending == (int)(sizeof rc->pending / sizeof rc->pending[0])) {
        return rl_errf(err, "too many frames in flight (%d)", rc->n_pending);
    }
    frame_header *h = calloc(1, sizeof *h);
    if (!h) return rl_errf(err, "out of memory");
    h->type = FRAME_FORWARD;
    h->ring_id = rc->ring_id;
    h->step_id = rc->next_step++;
    h->n_seqs = (uint32_t)n_reqs;
    size_t total = 0;
    for (int i = 0; i < n_reqs; i++) {
        h->seqs[i] = (frame_seq){.seq_id = reqs[i].seq_id, .pos = reqs[i].pos, .n_tokens = reqs[i].n,
                              .flags = reqs[i].flags, .smp = reqs[i].smp};
        total += reqs[i].n;
    }
    int32_t *toks = malloc(total * 4 + 1);
    if (!toks) {
        free(h);
        return rl_errf(err, "out of memory");
    }
    size_t off = 0;
    for (int i = 0; i < n_reqs; i++) {
        memcpy(toks + off, reqs[i].tokens, reqs[i].n * 4);
        off += reqs[i].n;
    }
    h->payload_bytes = total * 4;
    struct ring_pending *pd = &rc->pending[rc->n_pending];
    memset(pd, 0, sizeof *pd);
    /* The stamps part; with receipts, the extension that carries this traversal's fresh nonce. */
    uint8_t sb[8 + 40];
    size_t sbl = frame_stamps_size(0);
    frame_stamps_encode(NULL, 0, sb);
    if (rc->o.receipts) {
        frame_receipts rx;
        memset(&rx, 0, sizeof rx);
        randombytes_buf(rx.nonce, 32);
        frame_receipts_encode(&rx, NULL, 0, sb + sbl);
        sbl += frame_receipts_size(&rx, 0);
        if (rc->ledger.failed) {
            free(toks);
            free(h);
            return rl_errf(err, "%s", rc->ledger.error);
        }
        uint8_t first_in[32];
        receipt_hash(toks, total * 4, first_in);
        if (ledger_begin(&rc->ledger, h->step_id, rx.nonce, first_in, h->seqs, (uint32_t)n_reqs, err) != 0) {
            free(toks);
            free(h);
            return -1;
        }
    }
    pd->step_id = h->step_id;
    pd->tokens = (uint32_t)total;
    pd->budget_s = ring_frame_budget(rc, pd);
    h->budget_ms = (uint32_t)ceil(pd->budget_s * 1e3);
    pd->t_send_real = frame_now();
    pd->t_send_mono = rl_clock_now();
    for (int i = 0; rc->o.n_taps > 0 && i < n_reqs; i++) pd->tap_rows += (reqs[i].flags & FRAME_SEQ_TAPS) ? reqs[i].n : 0;
    if (pd->tap_rows > 0) {
        pd->taps = calloc((size_t)pd->tap_rows * (size_t)rc->o.n_taps * rc->hp.n_embd, sizeof(float));
        if (!pd->taps) {
            free(toks);
            free(h);
            return rl_errf(err, "out of memory for taps");
        }
        for (int s = 0; s < rc->plan.n_stages; s++) pd->taps_need += ring_stage_taps(rc, s) > 0;
    }
    for (int i = 0; i < n_reqs; i++) pd->route_rows += (reqs[i].flags & FRAME_SEQ_ROUTES) ? reqs[i].n : 0;
    if (pd->route_rows > 0) {
        if (!rc->routes) {
            free(toks);
            free(h);
            return rl_errf(err, "routing statistics asked for with nowhere to keep them");
        }
        pd->routes_need = ring_routes_need(rc);
    }
    /* The last stage's sampler inputs, if any sequence carries them, ride in a 4th part (frame.h): the new
     * sequences' logit biases, their grammars, then the drafts' distributions. */
    size_t qlen = 0;
    for (int i = 0; i < n_reqs; i++) {
        if (reqs[i].flags & FRAME_SEQ_HAS_BIAS) qlen += 4 + (size_t)reqs[i].n_bias * sizeof(smp_bias);
        if (reqs[i].flags & FRAME_SEQ_HAS_GRAMMAR) qlen += 8 + (size_t)reqs[i].gram_len;
        if (reqs[i].flags & FRAME_SEQ_RESUME) qlen += 4;
        qlen += (reqs[i].flags & FRAME_SEQ_HAS_Q) ? reqs[i].q_len : 0;
    }
    uint8_t *qb = qlen ? malloc(qlen) : NULL;
    size_t qo = 0;
    for (int i = 0; qb && i < n_reqs; i++) {
        if (!(reqs[i].flags & FRAME_SEQ_HAS_BIAS)) continue;
        memcpy(qb + qo, &reqs[i].n_bias, 4);
        if (reqs[i].n_bias) memcpy(qb + qo + 4, reqs[i].bias, (size_t)reqs[i].n_bias * sizeof(smp_bias));
        qo += 4 + (size_t)reqs[i].n_bias * sizeof(smp_bias);
    }
    for (int i = 0; qb && i < n_reqs; i++) {
        if (!(reqs[i].flags & FRAME_SEQ_HAS_GRAMMAR)) continue;
        memcpy(qb + qo, &reqs[i].budget, 4);
        memcpy(qb + qo + 4, &reqs[i].gram_len, 4);
        if (reqs[i].gram_len) memcpy(qb + qo + 8, reqs[i].gram, reqs[i].gram_len);
        qo += 8 + (size_t)reqs[i].gram_len;
    }
    for (int i = 0; qb && i < n_reqs; i++) {
        if (!(reqs[i].flags & FRAME_SEQ_RESUME)) continue;
        memcpy(qb + qo, &reqs[i].gen_start, 4);
        qo += 4;
    }
    for (int i = 0; qb && i < n_reqs; i++) {
        if (!(reqs[i].flags & FRAME_SEQ_HAS_Q)) continue;
        memcpy(qb + qo, reqs[i].q, reqs[i].q_len);
        qo += reqs[i].q_len;
    }
    if (rc->have_ledger && qb) ledger_set_q(&rc->ledger, h->step_id, qb, qlen);
    int r = qlen && !qb ? rl_errf(err, "out of memory")
                        : ring_send4(rc, rc->plan.stages[0].node, FRAME_FORWARD, h->step_id, h, toks, total * 4, sb,
                                     sbl, qb, qlen, err);
    free(qb);
    free(toks);
    if (r == 0) {
        rc->n_pending++;
        *step_id = h->step_id;
    } else {
        free(pd->taps);
        pd->taps = NULL;
    }
    free(h);
    return r;
}

/* Takes the timings out of a result's stamps. */
void ring_account(ring_coord *rc, const zs_parts *p, const struct ring_pending *pd, double t_recv_real) {
    frame_stamp st[FRAME_MAX_STAMPS];
    uint32_t ns = 0;
    rl_err e2;
    if (p->n < 3 || frame_stamps_decode(st, &ns, p->data[2], p->len[2], &e2) != 0 || ns != (uint32_t)rc->plan.n_stages) return;
    double prev_send = pd->t_send_real;
    for (uint32_t s = 0; s < ns; s++) {
        ring_stage_stats *ss = &rc->stats[s];
        ss->queue_s += st[s].t_start - st[s].t_recv;
        ss->compute_s += st[s].t_end - st[s].t_start;
        /* the deadlines' figures: the slowest lately, decaying (a first frame's page faults fade) */
        const double c = st[s].t_end - st[s].t_start;
        if (c > 0 && c < 3600 && st[s].n_tokens > 0) {
            if (st[s].n_tokens <= RING_DL_SMALL) rc->dl_step[s] = fmax(0.98 * rc->dl_step[s], c);
            else rc->dl_tok[s] = fmax(0.98 * rc->dl_tok[s], c / st[s].n_tokens);
        }
        ss->wire_s += fmax(0.0, st[s].t_recv - prev_send);
        ss->n++;
        prev_send = st[s].t_send;
    }
    rc->stats[ns].wire_s += fmax(0.0, t_recv_real - prev_send);
    rc->stats[ns].n++;
}

/* A traversal not back by its deadline: which node is it stuck at? The one that has left the coordinator's
 * pings (ring_wait sends one a second) unanswered the longest: a stage that is working answers when its
 * frame is done, one that is stuck never. The message names it, so a server leaves it out of the next ring. */
static int ring_deadline_err(ring_coord *rc, const struct ring_pending *pd, const bool *watch, rl_err *err) {
    const double now = rl_clock_now();
    int worst = -1;
    double silent = 1.0; /* at least a ping's interval unanswered */
    for (int i = 0; i < rc->conf.n; i++) {
        const ring_node_state *ns = &rc->nodes[i];
        if (watch[i] && ns->ping_since > ns->last_seen && now - ns->ping_since >= silent) silent = now - ns->ping_since, worst = i;
    }
    if (worst < 0) {
        return rl_errf(err, "step %" PRIu64 " missed its deadline of %.1f s, yet every node answers: the frame was lost on "
                       "the way", pd->step_id, pd->budget_s);
    }
    return rl_errf(err, "step %" PRIu64 " missed its deadline of %.1f s: node %s has not answered for %.1f s (stuck, "
                   "its link up)", pd->step_id, pd->budget_s, rc->conf.nodes[worst].addr, silent);
}

int ring_collect(ring_coord *rc, uint64_t step_id, ring_seq_req *reqs, int n_reqs, rl_err *err) {
    struct ring_pending *pd = ring_find_pending(rc, step_id);
    if (!pd) return rl_errf(err, "step %" PRIu64 " is not in flight", step_id);
    bool watch[PLAN_MAX_NODES] = {0};
    for (int s = 0; s < rc->plan.n_stages; s++) watch[rc->plan.stages[s].node] = true;
    int last = rc->plan.stages[rc->plan.n_stages - 1].node, from;
    frame_header *rh = calloc(1, sizeof *rh);
    if (!rh) return rl_errf(err, "out of memory");
    while (!pd->done) {
        zs_parts p;
        /* Until the traversal's deadline; one past it is still read once (its result may be waiting: the
         * coordinator may have been busy drafting or auditing) before it is called late. */
        double wait_s = rc->o.step_s;
        if (pd->budget_s > 0) wait_s = fmax(0.05, fmin(wait_s, pd->t_send_mono + pd->budget_s - rl_clock_now()));
        if (ring_wait(rc, FRAME_RESULT, last, wait_s, watch, &from, &p, rh, err) != 0) {
            if (pd->budget_s > 0 && rc->wait_timed_out) ring_deadline_err(rc, pd, watch, err);
            free(rh);
            return -1;
        }
        struct ring_pending *other = ring_find_pending(rc, rh->step_id);
        if (!other || other->done) { /* an answer to a step nobody waits for */
            zs_parts_free(&p);
            continue;
        }
        other->done = true;
        other->parts = p;
        rc->traversal_s += rl_clock_now() - other->t_send_mono;
        rc->traversals++;
        ring_account(rc, &p, other, frame_now());
    }
    while (pd->taps_got < pd->taps_need) { /* the taps of stages that have not sent theirs yet */
        zs_parts p;
        if (ring_wait(rc, FRAME_TAPS, -1, rc->o.step_s, watch, &from, &p, rh, err) != 0) {
            free(rh);
            return rl_err_prefix(err, "waiting for DSpark taps");
        }
        ring_take_taps(rc, from, &p, rh);
        zs_parts_free(&p);
    }
    while (pd->routes_got < pd->routes_need && !pd->routes_err[0]) { /* REAP: every MoE stage's routing */
        zs_parts p;
        if (ring_wait(rc, FRAME_ROUTES, -1, rc->o.step_s, watch, &from, &p, rh, err) != 0) {
            free(rh);
            return rl_err_prefix(err, "waiting for routing statistics");
        }
        ring_take_routes(rc, from, &p, rh);
        zs_parts_free(&p);
    }
    free(rh);
    if (pd->routes_err[0]) {
        rl_errf(err, "%s", pd->routes_err);
        zs_parts_free(&pd->parts);
        free(pd->taps);
        *pd = rc->pending[--rc->n_pending];
        return -1;
    }
    zs_parts *p = &pd->parts;
    int rc_ = 0;
    size_t want = (size_t)n_reqs * 4;
    for (int i = 0; i < n_reqs; i++) {
        if (reqs[i].flags & FRAME_SEQ_ALL_LOGITS) want += (size_t)reqs[i].n * rc->hp.n_vocab * 4;
    }
    size_t n_committed = 0;
    if (p->len[1] >= (size_t)n_reqs * 4) {
        for (int i = 0; i < n_reqs; i++) {
            int32_t c;
            memcpy(&c, (const uint8_t *)p->data[1] + i * 4, 4);
            if (reqs[i].flags & FRAME_SEQ_VERIFY) n_committed += c >= 0 && c <= 32 ? (size_t)c : 1000000; /* 0: stale */
        }
    }
    want += n_committed * 4;
    size_t n_lp = 0; /* log-probability entries: one per token returned to a FRAME_SEQ_LOGPROBS sequence */
    for (int i = 0; i < n_reqs && p->len[1] >= (size_t)n_reqs * 4; i++) {
        if (reqs[i].flags & FRAME_SEQ_PROMPT_LP) n_lp += reqs[i].n - 1;
        if (!(reqs[i].flags & FRAME_SEQ_LOGPROBS)) continue;
        int32_t c;
        memcpy(&c, (const uint8_t *)p->data[1] + i * 4, 4);
        n_lp += (reqs[i].flags & FRAME_SEQ_VERIFY) ? (c >= 0 && c <= 32 ? (size_t)c : 1000000)
                : (reqs[i].flags & FRAME_SEQ_NO_SAMPLE) ? 0 : 1;
    }
    want += n_lp * FRAME_LOGPROB_BYTES;
    frame_header *h2 = calloc(1, sizeof *h2);
    rl_err e2;
    if (!h2 || frame_header_decode(h2, p->data[0], p->len[0], &e2) != 0 || h2->n_seqs != (uint32_t)n_reqs ||
        p->len[1] != want) {
        rc_ = rl_errf(err, "last stage returned %zu bytes, expected %zu for %d sequences", p->len[1], want, n_reqs);
    } else {
        const uint8_t *pl = p->data[1];
        size_t lo = (size_t)n_reqs * 4;
        for (int i = 0; i < n_reqs; i++) {
            memcpy(&reqs[i].token, pl + i * 4, 4);
            if (reqs[i].flags & FRAME_SEQ_ALL_LOGITS) {
                size_t nb = (size_t)reqs[i].n * rc->hp.n_vocab * 4;
                if (reqs[i].logits) memcpy(reqs[i].logits, pl + lo, nb);
                lo += nb;
            }
        }
        for (int i = 0; i < n_reqs; i++) { /* committed tokens of VERIFY sequences, after the logits */
            if (!(reqs[i].flags & FRAME_SEQ_VERIFY)) continue;
            memcpy(reqs[i].committed, pl + lo, (size_t)reqs[i].token * 4);
            lo += (size_t)reqs[i].token * 4;
        }
        for (int i = 0; i < n_reqs; i++) { /* then the log-probabilities: its own tokens', what it got back */
            if (reqs[i].flags & FRAME_SEQ_PROMPT_LP) {
                if (reqs[i].plp) memcpy(reqs[i].plp, pl + lo, (size_t)(reqs[i].n - 1) * FRAME_LOGPROB_BYTES);
                lo += (size_t)(reqs[i].n - 1) * FRAME_LOGPROB_BYTES;
            }
            if (!(reqs[i].flags & FRAME_SEQ_LOGPROBS)) continue;
            size_t nt = (reqs[i].flags & FRAME_SEQ_VERIFY) ? (size_t)reqs[i].token : (reqs[i].flags & FRAME_SEQ_NO_SAMPLE) ? 0 : 1;
            if (reqs[i].lp) memcpy(reqs[i].lp, pl + lo, (nt < reqs[i].lp_cap ? nt : reqs[i].lp_cap) * FRAME_LOGPROB_BYTES);
            lo += nt * FRAME_LOGPROB_BYTES;
        }
        size_t row = (size_t)rc->o.n_taps * rc->hp.n_embd, r0 = 0;
        for (int i = 0; pd->taps && i < n_reqs; i++) { /* each flagged sequence's tap rows */
            if (!(reqs[i].flags & FRAME_SEQ_TAPS)) continue;
            reqs[i].taps = malloc((size_t)reqs[i].n * row * sizeof(float));
            if (!reqs[i].taps) {
                rc_ = rl_errf(err, "out of memory for taps");
                break;
            }
            memcpy(reqs[i].taps, pd->taps + r0 * row, (size_t)reqs[i].n * row * sizeof(float));
            r0 += reqs[i].n;
        }
    }
    free(h2);
    if (rc_ == 0 && rc->have_ledger) {
        uint8_t last_out[32];
        receipt_hash(p->data[1], p->len[1], last_out);
        ledger_result(&rc->ledger, pd->step_id, last_out);
        ring_rcpt_blame(rc);
        if (rc->ledger.failed) rc_ = rl_errf(err, "%s", rc->ledger.error);
    }
    zs_parts_free(p);
    free(pd->taps);
    *pd = rc->pending[--rc->n_pending]; /* unordered removal */
    return rc_;
}

int ring_step(ring_coord *rc, ring_seq_req *reqs, int n_reqs, rl_err *err) {
    uint64_t step;
    if (ring_submit(rc, reqs, n_reqs, &step, err) != 0) return -1;
    return ring_collect(rc, step, reqs, n_reqs, err);
}

int ring_free_seqs(ring_coord *rc, const uint64_t *ids, int n, rl_err *err) {
    int r = ring_forget_seqs(rc, ids, n, err);
    ring_audit_finished(rc, ids, n);
    return r;
}

void ring_audit_finished(ring_coord *rc, const uint64_t *ids, int n) {
    rc->audits_skipped += audit_draws_finished(&rc->audit, rc->o.audit_rate, ids, n); /* which get audited */
}

int ring_forget_seqs(ring_coord *rc, const uint64_t *ids, int n, rl_err *err) {
    frame_header *h = calloc(1, sizeof *h);
    if (!h) return rl_errf(err, "out of memory");
    h->type = FRAME_FREE;
    h->ring_id = rc->ring_id;
    h->step_id = rc->next_step++;
    h->n_seqs = (uint32_t)(n > FRAME_MAX_SEQS ? FRAME_MAX_SEQS : n);
    for (uint32_t i = 0; i < h->n_seqs; i++) h->seqs[i].seq_id = ids[i];
    uint8_t sb[8];
    frame_stamps_encode(NULL, 0, sb);
    int r = ring_send(rc, rc->plan.stages[0].node, FRAME_FREE, h->step_id, h, NULL, 0, sb, frame_stamps_size(0), err);
    free(h);
    return r;
}

frame_sampling ring_sampling(const smp_params *p) {
    return (frame_sampling){.temperature = p->temperature, .top_p = p->top_p, .min_p = p->min_p,
                         .repeat_penalty = p->repeat_penalty, .presence_penalty = p->presence_penalty,
                         .frequency_penalty = p->frequency_penalty, .top_k = p->top_k,
                         .penalty_last_n = p->penalty_last_n, .seed = p->seed};
}

void ring_print_stats(const ring_coord *rc, FILE *f) {
    fprintf(f, "%-6s %-22s %-10s %10s %10s %10s\n", "stage", "node", "layers", "queue ms", "compute ms", "wire ms");
    for (int s = 0; s < rc->plan.n_stages; s++) {
        const ring_stage_stats *ss = &rc->stats[s];
        double n = ss->n ? (double)ss->n : 1;
        char layers[32];
        snprintf(layers, sizeof layers, "%u-%u", rc->plan.stages[s].a, rc->plan.stages[s].b - 1);
        fprintf(f, "%-6d %-22s %-10s %10.3f %10.3f %10.3f\n", s, rc->conf.nodes[rc->plan.stages[s].node].addr, layers,
                1e3 * ss->queue_s / n, 1e3 * ss->compute_s / n, 1e3 * ss->wire_s / n);
    }
    const ring_stage_stats *ret = &rc->stats[rc->plan.n_stages];
    fprintf(f, "%-6s %-22s %-10s %10s %10s %10.3f\n", "return", "coordinator", "", "", "",
            ret->n ? 1e3 * ret->wire_s / (double)ret->n : 0.0);
    fprintf(f, "traversal: %.3f ms on average over %ld traversals\n",
            rc->traversals ? 1e3 * rc->traversal_s / (double)rc->traversals : 0.0, rc->traversals);
}

cJSON *ring_stats_json(const ring_coord *rc) {
    cJSON *o = cJSON_CreateObject();
    cJSON *a = cJSON_AddArrayToObject(o, "stages");
    for (int s = 0; s < rc->plan.n_stages; s++) {
        const ring_stage_stats *ss = &rc->stats[s];
        double n = ss->n ? (double)ss->n : 1;
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "node", rc->conf.nodes[rc->plan.stages[s].node].addr);
        cJSON_AddNumberToObject(j, "layer_start", rc->plan.stages[s].a);
        cJSON_AddNumberToObject(j, "layer_end", rc->plan.stages[s].b);
        cJSON_AddNumberToObject(j, "queue_ms", 1e3 * ss->queue_s / n);
        cJSON_AddNumberToObject(j, "compute_ms", 1e3 * ss->compute_s / n);
        cJSON_AddNumberToObject(j, "wire_ms", 1e3 * ss->wire_s / n);
        cJSON_AddItemToArray(a, j);
    }
    const ring_stage_stats *ret = &rc->stats[rc->plan.n_stages];
    cJSON_AddNumberToObject(o, "return_wire_ms", ret->n ? 1e3 * ret->wire_s / (double)ret->n : 0.0);
    cJSON_AddNumberToObject(o, "traversal_ms", rc->traversals ? 1e3 * rc->traversal_s / (double)rc->traversals : 0.0);
    cJSON_AddNumberToObject(o, "traversals", (double)rc->traversals);
    cJSON_AddNumberToObject(o, "taps_dropped", (double)rc->taps_dropped);
    cJSON_AddBoolToObject(o, "delays_measured", rc->have_delays);
    predict_result pred;
    if (ring_prediction(rc, 1, 1, NULL, &pred) == 0) {
        cJSON *pj = cJSON_AddObjectToObject(o, "predicted");
        cJSON_AddNumberToObject(pj, "greedy_tok_s", pred.greedy_tok_s);
        cJSON_AddNumberToObject(pj, "hops_ms", 1e3 * pred.hops_s);
        cJSON_AddNumberToObject(pj, "compute_ms", 1e3 * pred.compute_s);
    }
    return o;
}
