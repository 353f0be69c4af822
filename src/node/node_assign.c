/* node_assign.c - an ASSIGN (a layer range of a model, its neighbours) in named steps, and the messages
 * around it: lending split files, peers and probes, pulls. */
#include "node_int.h"

/* ---- assignment -------------------------------------------------------------------------------- */

static void node_drop_seqs(node *n) {
    stage_free(&n->stage_rt);
    stage_init(&n->stage_rt, &n->e, n->n_ctx, n->n_seqs, n->wire);
    stage_set_taps(&n->stage_rt, n->taps, n->n_taps);
    n->stage_rt.rb_blocks = n->rb_blocks;
    n->stage_rt.max_ck = n->max_ck;
    n->stage_rt.vocab = n->vocab;
}

static void *node_mfst_main(void *arg) {
    struct node_mfst_job *j = arg;
    j->rc = manifest_range_hash_threads(j->m, &j->hp, j->a, j->b, 1, j->out, &j->err);
    return NULL;
}

/* The manifest hash of the loaded range: the background hash's result (waiting for it if need be). */
int node_manifest(node *n, rl_err *err) {
    if (n->mfst.running) {
        pthread_join(n->mfst.thread, NULL);
        n->mfst.running = false;
        if (n->mfst.rc == 0) memcpy(n->manifest, n->mfst.out, 32), n->have_manifest = true;
    }
    if (!n->have_manifest) n->have_manifest = manifest_range_hash(&n->m, &n->hp, n->a, n->b, n->manifest, err) == 0;
    return n->have_manifest ? 0 : -1;
}

void node_unload(node *n) {
    node_drop_seqs(n);
    if (n->mfst.running) { /* it reads the mapping about to go */
        pthread_join(n->mfst.thread, NULL);
        n->mfst.running = false;
    }
    if (n->loaded) {
        k3_engine_free(&n->e);
        mf_close(&n->m);
    }
    if (n->have_mf) manifest_file_free(&n->mf);
    n->have_mf = false;
    if (n->vocab) {
        tok_vocab_free(n->vocab);
        tok_free(&n->tok);
        n->vocab = NULL;
    }
    n->loaded = false;
}

/* Closes the link downstream, and its monitor. */
void node_close_next(node *n) {
    if (!n->next) return;
    if (n->next_mon.pair) {
        zmq_socket_monitor(n->next, NULL, 0);
        zs_monitor_stop(&n->next_mon);
    }
    zmq_close(n->next);
    n->next = NULL;
}

/* Forwards a frame downstream, waiting up to 5 s for the link to take it - but no longer than the link
 * lives: once the next stage's connection closed (its process died) the frame cannot arrive, and a node
 * stuck waiting would not answer the coordinator's INFO when it re-opens the ring around the restarted
 * node (ring_open waits 5 s for it too, so a re-open right after a death could fail for this node). */
int node_send_next(node *n, const void *const *parts, const size_t *lens, int np, rl_err *err) {
    for (int waited = 0;; waited += 50) {
        if (zs_wait_writable(n->next, 50)) return zs_send(n->next, parts, lens, np, true, err);
        if (n->next_mon.pair) zs_monitor_poll(&n->next_mon);
        if (n->next_mon.disconnected) return rl_errf(err, "the link closed: %s", n->next_mon.last);
        if (waited >= 5000) return rl_errf(err, "send failed: no connected peer after 5000 ms");
    }
}

/* A manifest ring's range (ASSIGN "manifest": true, the manifest in the message's last part): the manifest is
 * checked against the model id and kept in the cache, then the range is put together from this node's split
 * files, its store and the holders ASSIGN names (range_parts.h). Fills n->mf, n->m and n->hp. */
static int node_open_parts(node *n, const zs_parts *p, const cJSON *j, const char *hash, uint32_t a, uint32_t b,
                           rl_err *err) {
    if (p->n < 4 || p->len[3] < 8) return rl_errf(err, "ASSIGN says manifest but carries none");
    if (strlen(hash) != 64 || strspn(hash, "0123456789abcdef") != 64) return rl_errf(err, "ASSIGN: bad model_hash");
    char path[1200], tmp[1300];
    snprintf(path, sizeof path, "%s/manifest-%s.gguf", n->cache_dir, hash);
    snprintf(tmp, sizeof tmp, "%s.part", path);
    if (rl_mkdirs(n->cache_dir) != 0) return rl_errf(err, "cannot create %s: %s", n->cache_dir, strerror(errno));
    FILE *f = fopen(tmp, "wb");
    if (!f) return rl_errf(err, "cannot create %s: %s", tmp, strerror(errno));
    bool ok = fwrite(p->data[3], 1, p->len[3], f) == p->len[3];
    if (fclose(f) != 0 || !ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return rl_errf(err, "cannot write %s", path);
    }
    if (manifest_file_read(&n->mf, path, err) != 0) return -1;
    n->have_mf = true;
    uint8_t id[32];
    char hex[65];
    if (manifest_file_range_hash(&n->mf, 0, n->mf.n_layer, id, err) != 0) return -1;
    sodium_bin2hex(hex, sizeof hex, id, 32);
    if (strcmp(hex, hash) != 0) return rl_errf(err, "the manifest sent is not that of model %.16s...", hash);
    if (b > n->mf.n_layer) return rl_errf(err, "layer range [%u, %u) beyond the model's %u layers", a, b, n->mf.n_layer);
    parts_holder hold[PARTS_MAX_HOLDERS];
    int n_hold = 0, rc = -1;
    const uint32_t n_files = manifest_file_n_files(&n->mf);
    const cJSON *hs = cJSON_GetObjectItemCaseSensitive(j, "holders"), *it;
    cJSON_ArrayForEach(it, hs) {
        if (n_hold == PARTS_MAX_HOLDERS) break;
        parts_holder *h = &hold[n_hold];
        const char *addr = rl_json_str(it, "addr"), *pk = rl_json_str(it, "pubkey");
        if (!addr || !pk || keys_peer_parse(&h->key, pk, err) != 0) {
            rl_errf(err, "ASSIGN: a holder without addr or a valid pubkey");
            goto out;
        }
        snprintf(h->addr, sizeof h->addr, "%s", addr);
        if (!(h->files = calloc(n_files + 1, 1))) {
            rl_errf(err, "out of memory");
            goto out;
        }
        n_hold++;
        const cJSON *fv;
        cJSON_ArrayForEach(fv, cJSON_GetObjectItemCaseSensitive(it, "files")) {
            if (cJSON_IsNumber(fv) && fv->valuedouble >= 0 && fv->valuedouble < n_files) h->files[(uint32_t)fv->valuedouble] = true;
        }
    }
    parts_opts ro = {.models_dir = n->o->models_dir, .cache_dir = n->cache_dir, .id = &n->o->id, .zctx = n->zctx, .tn = n->tn,
                  .holders = hold, .n_holders = n_hold, .ring_id = n->cur_ring, .n_threads = n->o->threads,
                  .log_name = n->name};
    parts_stats st;
    double t0 = rl_clock_now();
    if (parts_assemble(&n->mf, a, b, &ro, &n->m, &st, err) != 0) goto out;
    if (k3_hparams_read(&n->hp, &n->m, err) != 0 || k3_check_tensors_range(&n->hp, &n->m, a, b, false, err) != 0) {
        mf_close(&n->m);
        goto out;
    }
    node_log(n, "layers [%u, %u) from parts in %.1f s: %d tensors (%.1f MiB) from its split files (%d checked now, "
                "%d checked before), %d from its store, %d (%.1f MiB) pulled from other nodes",
             a, b, rl_clock_now() - t0, st.local, (double)st.local_bytes / 1048576.0, st.local_checked,
             st.local - st.local_checked, st.stored, st.pulled, (double)st.pulled_bytes / 1048576.0);
    rc = 0;
out:
    for (int k = 0; k < n_hold; k++) free(hold[k].files);
    return rc;
}

/* The keys a coordinator's message names in its JSON array `field` (LEND's fetchers, PEERS' peers) replace
 * the node's keys of that label, on its allowlist and in keys[0..*n_keys). 0, or -1 after an ERROR naming
 * what was wrong (the old keys are gone then too). */
static int node_set_keys(node *n, uint64_t step, const zs_parts *p, const char *type, const char *field,
                         const char *label, char (*keys)[65], int max, int *n_keys) {
    cJSON *j = p->n >= 3 ? cJSON_ParseWithLength(p->data[2], p->len[2]) : NULL;
    const cJSON *arr = j ? cJSON_GetObjectItemCaseSensitive(j, field) : NULL, *it;
    int rc = 0;
    zs_auth_forget(&n->auth, label);
    *n_keys = 0;
    if (!cJSON_IsArray(arr)) {
        node_error(n, step, "%s lacks its %s", type, field);
        cJSON_Delete(j);
        return -1;
    }
    cJSON_ArrayForEach(it, arr) {
        keys_peer pk;
        rl_err e2;
        if (!cJSON_IsString(it) || keys_peer_parse(&pk, it->valuestring, &e2) != 0) {
            node_error(n, step, "%s: a %s key is not valid", type, label);
            rc = -1;
            break;
        }
        if (*n_keys == max) break;
        zs_auth_allow(&n->auth, pk.curve_pk, label, pk.pk_hex);
        snprintf(keys[(*n_keys)++], sizeof keys[0], "%s", pk.pk_hex);
    }
    cJSON_Delete(j);
    return rc;
}

static bool node_key_in(char (*keys)[65], int n_keys, const char *key) {
    for (int i = 0; i < n_keys; i++) {
        if (strcmp(keys[i], key) == 0) return true;
    }
    return false;
}

/* LEND: the coordinator names the nodes that will pull from this one's split files (a manifest ring); only
 * those keys may, until the next LEND. */
void node_lend(node *n, uint64_t step, const zs_parts *p) {
    if (node_set_keys(n, step, p, "LEND", "fetchers", "fetcher", n->lent, PARTS_MAX_HOLDERS, &n->n_lent) == 0) {
        node_reply(n, FRAME_LENT, step, NULL, 0);
    }
}

/* PEERS: the coordinator names the ring's other nodes, which may then time round trips to this one (PROBE_PING)
 * until the next PEERS or until that coordinator leaves. */
void node_peers(node *n, uint64_t step, const zs_parts *p) {
    if (node_set_keys(n, step, p, "PEERS", "peers", "peer", n->probers, PB_MAX_PEERS, &n->n_probers) == 0) {
        node_reply(n, FRAME_PEERS_OK, step, NULL, 0);
    }
}

/* PROBE: time round trips to the peers the coordinator lists (probe.h) and tell it. The node answers nothing
 * else meanwhile; the coordinator probes one node at a time, so no peer waits on this one. */
void node_probe(node *n, uint64_t step, const zs_parts *p) {
    cJSON *j = p->n >= 3 ? cJSON_ParseWithLength(p->data[2], p->len[2]) : NULL;
    const cJSON *ps = j ? cJSON_GetObjectItemCaseSensitive(j, "peers") : NULL, *it;
    probe_peer peers[PB_MAX_PEERS];
    double rtt[PB_MAX_PEERS];
    int np = 0;
    rl_err err = {{0}};
    if (!cJSON_IsArray(ps) || cJSON_GetArraySize(ps) > PB_MAX_PEERS) {
        node_error(n, step, "PROBE lacks its peers, or names more than %d", PB_MAX_PEERS);
        cJSON_Delete(j);
        return;
    }
    cJSON_ArrayForEach(it, ps) {
        const char *addr = rl_json_str(it, "addr"), *key = rl_json_str(it, "key");
        if (!addr || !key || strlen(addr) >= sizeof peers[0].addr || keys_peer_parse(&peers[np].key, key, &err) != 0) {
            node_error(n, step, "PROBE: a peer lacks a valid addr or key");
            cJSON_Delete(j);
            return;
        }
        snprintf(peers[np++].addr, sizeof peers[0].addr, "%s", addr);
    }
    cJSON_Delete(j);
    if (probe_measure(n->zctx, n->tn, &n->o->id, peers, np, 5.0, rtt, &err) != 0) {
        node_error(n, step, "%s", err.msg);
        return;
    }
    cJSON *r = cJSON_CreateObject();
    cJSON *a = r ? cJSON_AddArrayToObject(r, "rtt_s") : NULL;
    for (int i = 0; a && i < np; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(rtt[i]));
    char *js = a ? cJSON_PrintUnformatted(r) : NULL;
    cJSON_Delete(r);
    if (!js) {
        node_error(n, step, "out of memory");
        return;
    }
    node_reply(n, FRAME_PROBE_RESULT, step, js, strlen(js));
    free(js);
}

/* PROBE_PING from a peer the coordinator named (PEERS): answered at once. */
void node_probe_ping(node *n, const zs_parts *p, const frame_header *h) {
    bool known = node_key_in(n->probers, n->n_probers, p->user);
    rl_err e2;
    if (known) node_reply_to(n, p->data[0], p->len[0], FRAME_PROBE_PONG, h->step_id, NULL, 0, &e2);
    else node_log(n, "dropped a PROBE_PING from %.16s..., which its coordinator did not name", p->user[0] ? p->user : "?");
}

/* PULL: bytes of one of this node's split files, for a node the coordinator lent them to. Answered at once
 * from the file (nothing is kept between pulls), errors to the puller. */
void node_pull(node *n, const zs_parts *p, const frame_header *h) {
    bool lent = node_key_in(n->lent, n->n_lent, p->user);
    cJSON *j = p->n >= 3 ? cJSON_ParseWithLength(p->data[2], p->len[2]) : NULL;
    const char *file = j ? rl_json_str(j, "file") : NULL;
    double off = j ? rl_json_num(j, "offset", -1) : -1, len = j ? rl_json_num(j, "len", -1) : -1;
    rl_err err = {{0}};
    uint8_t *buf = NULL;
    int rc;
    if (!lent) {
        rc = rl_errf(&err, "this node lends its files only to nodes its coordinator names");
    } else if (!file || off < 0 || len < 1 || len > (64 << 20)) {
        rc = rl_errf(&err, "malformed PULL");
    } else if (!(buf = malloc((size_t)len))) {
        rc = rl_errf(&err, "out of memory");
    } else {
        rc = parts_read(n->o->models_dir, file, (uint64_t)off, (size_t)len, buf, &err);
    }
    rl_err e2;
    if (rc == 0) {
        node_reply_to(n, p->data[0], p->len[0], FRAME_PULL_DATA, h->step_id, buf, (size_t)len, &e2);
    } else {
        node_log(n, "refused a PULL from %.16s...: %s", p->user[0] ? p->user : "?", err.msg);
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "msg", err.msg);
        char *es = cJSON_PrintUnformatted(e);
        cJSON_Delete(e);
        if (es) node_reply_to(n, p->data[0], p->len[0], FRAME_ERROR, h->step_id, es, strlen(es), &e2);
        free(es);
    }
    free(buf);
    cJSON_Delete(j);
}

/* Times the assigned stage on a scratch sequence: two one-token frames (a decode step, sampled twice: both
 * go to the fit, which weighs each frame relative to its own time) and one chunk of up to 64
 * tokens, for the coordinator's prediction (READY "steps"; docs/plan.md). Not under --mem (the frames
 * would time the disk and fill the expert cache with the scratch's experts), not on a GPU, and not for a
 * context too small to hold them. A failure only leaves the steps out: the probe's figures then stand. */
static void node_time_stage(node *n) {
    char key[sizeof n->step_key];
    snprintf(key, sizeof key, "%s %u %u %u %d %u %u %d", n->hash, n->a, n->b, n->n_ctx, n->n_seqs, n->gpu_layers,
             n->n_cpu_moe, n->wire);
    if (n->n_steps > 0 && strcmp(key, n->step_key) == 0) return;
    n->n_steps = 0;
    n->step_key[0] = 0;
    /* Nor on a GPU node: its devices keep their probe's figures (on lavapipe the node crashed in these
     * frames at ASSIGN, in tests/t_gpu.sh's Vulkan ring, not yet understood; docs/plan.md). */
    if (n->disk > 0 || n->n_ctx < 16 || n->dev_name[0]) return;
    const uint32_t chunk = n->n_ctx - 4 < 64 ? n->n_ctx - 4 : 64; /* with the three one-token frames, below n_ctx */
    uint32_t tok[3] = {1, 1, chunk};
    double sec[3];
    rl_err err;
    if (stage_time(&n->stage_rt, tok, 3, sec, &err) != 0) {
        node_log(n, "timing the stage failed (%s); the coordinator predicts from the probe's figures", err.msg);
        return;
    }
    memcpy(n->step_tok, tok, sizeof tok);
    memcpy(n->step_s, sec, sizeof sec);
    n->n_steps = 3;
    snprintf(n->step_key, sizeof n->step_key, "%s", key);
    node_log(n, "stage timed: a 1-token frame %.1f / %.1f ms, %u tokens %.1f ms", sec[0] * 1e3, sec[1] * 1e3, chunk,
             sec[2] * 1e3);
}

/* What an ASSIGN asks of this node (ring_open's JSON), read by node_assign_parse and node_assign_find; the
 * JSON it came in owns the strings. */
typedef struct node_assignment {
    const char *hash;                /* the model's id: whole-file hash, or the manifest's */
    double a, b, n_ctx;              /* the layer range [a, b) and each sequence's context */
    const cJSON *next;               /* the next stage's {addr, pubkey} (absent: this is the last stage) */
    const char *upstream;            /* the previous stage's key (absent: stage 0, fed by the coordinator) */
    bool by_manifest;                /* a manifest ring: the range is put together from parts */
    const char *path;                /* the file holding the range ("the manifest" for a manifest ring) */
    bool range_file;                 /* path is a streamed range file, not the whole model */
    uint32_t gpu_layers, n_cpu_moe;  /* the plan's split between device and RAM (UINT32_MAX: none) */
} node_assignment;

/* Step 1: the range, the model and the neighbours the ASSIGN names, checked for sense. */
static int node_assign_parse(node *n, uint64_t step, const cJSON *j, node_assignment *as) {
    as->hash = rl_json_str(j, "model_hash");
    as->a = rl_json_num(j, "a", -1), as->b = rl_json_num(j, "b", -1), as->n_ctx = rl_json_num(j, "n_ctx", 4096);
    as->next = cJSON_GetObjectItemCaseSensitive(j, "next");
    as->upstream = rl_json_str(j, "upstream");
    if (!as->hash || as->a < 0 || as->b <= as->a || as->n_ctx < 1 || as->n_ctx > (1 << 24)) {
        node_error(n, step, "ASSIGN lacks model_hash or a valid layer range / n_ctx");
        return -1;
    }
    as->by_manifest = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "manifest"));
    /* The plan's split of the range between the device and RAM (plan_stage.dev_layers, cpu_moe), unless this
     * node's own --gpu-layers / --n-cpu-moe fix it. */
    const double gl = rl_json_num(j, "gpu_layers", -1), ncm = rl_json_num(j, "n_cpu_moe", -1);
    as->gpu_layers = gl >= 0 && gl <= as->b - as->a ? (uint32_t)gl : UINT32_MAX;
    as->n_cpu_moe = ncm >= 0 && ncm <= as->b ? (uint32_t)ncm : UINT32_MAX;
    return 0;
}

/* Step 2: the file this node maps the range from: the whole model if it holds it, else a range file that
 * covers the range (a manifest ring's parts are found when they are put together). */
static int node_assign_find(node *n, uint64_t step, node_assignment *as) {
    const uint32_t a = (uint32_t)as->a, b = (uint32_t)as->b;
    as->path = as->by_manifest ? "the manifest" : NULL;
    as->range_file = false;
    for (int i = 0; i < n->n_models && !as->path; i++) {
        if (strcmp(n->models[i].hash, as->hash) == 0 && !n->models[i].range) as->path = n->models[i].path;
    }
    for (int i = 0; i < n->n_models && !as->path; i++) {
        const node_model *nm = &n->models[i];
        if (nm->range && strcmp(nm->hash, as->hash) == 0 && nm->a <= a && nm->b >= b) {
            as->path = nm->path;
            as->range_file = true;
        }
    }
    if (!as->path) {
        node_error(n, step, "model %.16s... is not among this node's models (--models %s)", as->hash,
                   n->o->models_dir ? n->o->models_dir : "not given");
        return -1;
    }
    return 0;
}

/* Step 3's end: the range just loaded, kept: its vocabulary on the last stage, what it is (so that the same
 * ASSIGN again keeps it loaded), and its manifest hash for receipts - from the manifest when its parts were
 * checked against it, else hashed by a thread. */
static void node_assign_keep(node *n, const node_assignment *as) {
    const uint32_t b = (uint32_t)as->b;
    rl_err err;
    /* The last stage samples: constrained output needs each token's bytes. A file without a vocabulary
     * still serves everything else (a grammar is then refused, naming why). */
    if (b == n->hp.n_layer) {
        rl_err te;
        if (tok_load(&n->tok, &n->m, &te) != 0) {
            node_log(n, "no vocabulary in %s, so no constrained output: %s", as->path, te.msg);
        } else if (!(n->vocab = chat_gram_vocab_new(&n->tok))) {
            tok_free(&n->tok);
        }
    }
    n->have_manifest = false;
    snprintf(n->hash, sizeof n->hash, "%s", as->hash);
    n->a = (uint32_t)as->a;
    n->b = b;
    n->gpu_layers = as->gpu_layers;
    n->n_cpu_moe = as->n_cpu_moe;
    /* (field by field: a compound literal of this struct, hparams inside, is a large stack temporary) */
    n->mfst.m = &n->m;
    n->mfst.hp = n->hp;
    n->mfst.a = n->a;
    n->mfst.b = n->b;
    n->mfst.rc = -1;
    if (n->have_mf) { /* every tensor matched the manifest: its range hash is the range's */
        n->have_manifest = manifest_file_range_hash(&n->mf, n->a, n->b, n->manifest, &err) == 0;
    } else {
        n->mfst.running = pthread_create(&n->mfst.thread, NULL, node_mfst_main, &n->mfst) == 0;
    }
}

/* Step 3: every sequence of the last assignment dropped, and the range mapped and its engine built - unless
 * this node holds that very range, split the same way, already (a ring re-opened over the same plan). */
static int node_assign_load(node *n, uint64_t step, const zs_parts *p, const cJSON *j, const node_assignment *as) {
    const double a = as->a, b = as->b;
    const char *hash = as->hash, *path = as->path;
    bool same = n->loaded && strcmp(n->hash, hash) == 0 && n->a == (uint32_t)a && n->b == (uint32_t)b &&
                n->gpu_layers == as->gpu_layers && n->n_cpu_moe == as->n_cpu_moe;
    node_drop_seqs(n);
    node_alog_clear(n); /* a new assignment is a new ring: its step ids start again */
    if (same) return 0;
    rl_err err;
    node_unload(n);
    if ((as->by_manifest  ? node_open_parts(n, p, j, hash, (uint32_t)a, (uint32_t)b, &err)
         : as->range_file ? k3_open_range(&n->m, &n->hp, path, (uint32_t)a, (uint32_t)b, &err)
                          : k3_open(&n->m, &n->hp, path, &err)) != 0) {
        node_error(n, step, "%s", err.msg);
        if (n->have_mf) manifest_file_free(&n->mf), n->have_mf = false;
        return -1;
    }
    if ((uint32_t)b > n->hp.n_layer) {
        node_error(n, step, "layer range [%g, %g) beyond the model's %u layers", a, b, n->hp.n_layer);
        mf_close(&n->m);
        return -1;
    }
    k3_engine_opts eo = n->o->eng;
    eo.n_threads = n->o->threads;
    if (as->gpu_layers != UINT32_MAX && !eo.gpu_layers_set) eo.gpu_layers_set = true, eo.gpu_layers = as->gpu_layers;
    if (as->n_cpu_moe != UINT32_MAX && eo.n_cpu_moe == 0) eo.n_cpu_moe = as->n_cpu_moe;
    if (k3_engine_init(&n->e, &n->m, &n->hp, (uint32_t)a, (uint32_t)b, &eo, &err) != 0) {
        node_error(n, step, "%s", err.msg);
        mf_close(&n->m);
        return -1;
    }
    k3_weights_prefault(&n->e.w, false);
    if (n->e.hp.n_dev > 0) {
        char where[512];
        k3_engine_describe(&n->e, where, sizeof where);
        node_log(n, "layers [%g, %g) computing on %s", a, b, where);
    }
    if (n->e.xc) {
        node_log(n, "layers [%g, %g) exceed --mem: routed experts read from the file through an expert cache of "
                    "%.1f MiB", a, b, (double)n->e.xc->cache_bytes / 1048576.0);
    }
    n->loaded = true;
    node_assign_keep(n, as);
    return 0;
}

/* Step 4: the stage over the loaded range: context, sequences held at once, the wire's type, rollback
 * blocks, the DSpark taps it holds. */
static void node_assign_stage(node *n, const cJSON *j, const node_assignment *as) {
    n->n_ctx = (uint32_t)as->n_ctx;
    const double n_seqs = rl_json_num(j, "n_seqs", 1);
    n->n_seqs = n_seqs >= 1 && n_seqs <= FRAME_MAX_SEQS ? (int)n_seqs : 1;
    n->stage = (int)rl_json_num(j, "stage", 0);
    n->n_stages = (int)rl_json_num(j, "n_stages", 1);
    const char *wire = rl_json_str(j, "wire");
    n->wire = wire && strcmp(wire, "f16") == 0 ? K3_WIRE_F16 : wire && strcmp(wire, "bf16") == 0 ? K3_WIRE_BF16 : K3_WIRE_F32;
    const double rb = rl_json_num(j, "rollback_blocks", 0);
    n->rb_blocks = rb >= 1 && rb <= K3_RB_MAX ? (int)rb : 0;
    const double ck = rl_json_num(j, "ctx_checkpoints", 0);
    n->max_ck = ck >= 1 && ck <= 1024 ? (int)ck : 0;
    stage_init(&n->stage_rt, &n->e, n->n_ctx, n->n_seqs, n->wire); /* no sequence: node_drop_seqs above */
    n->stage_rt.rb_blocks = n->rb_blocks;
    n->stage_rt.max_ck = n->max_ck;
    n->stage_rt.vocab = n->vocab;
    n->n_taps = 0;
    const cJSON *taps = cJSON_GetObjectItemCaseSensitive(j, "taps"), *tv;
    cJSON_ArrayForEach(tv, taps) {
        if (n->n_taps < 16 && cJSON_IsNumber(tv) && tv->valuedouble >= 1 && tv->valuedouble <= n->hp.n_layer) {
            n->taps[n->n_taps++] = (uint32_t)tv->valuedouble;
        }
    }
    stage_set_taps(&n->stage_rt, n->taps, n->n_taps);
}

/* Step 5: the neighbours: trust exactly the upstream key we were given; connect to the downstream one, and
 * wait until that encrypted link is up, so a broken ring shows now rather than at the first frame. */
static int node_assign_links(node *n, uint64_t step, const node_assignment *as) {
    rl_err err;
    zs_auth_forget(&n->auth, "upstream");
    if (as->upstream) {
        keys_peer up;
        if (keys_peer_parse(&up, as->upstream, &err) != 0) {
            node_error(n, step, "upstream key: %s", err.msg);
            return -1;
        }
        zs_auth_allow(&n->auth, up.curve_pk, "upstream", up.pk_hex);
    }
    node_close_next(n);
    if (!cJSON_IsObject(as->next)) return 0;
    const char *addr = rl_json_str(as->next, "addr"), *pk = rl_json_str(as->next, "pubkey");
    keys_peer down;
    if (!addr || !pk || keys_peer_parse(&down, pk, &err) != 0) {
        node_error(n, step, "ASSIGN's next hop lacks addr or a valid pubkey");
        return -1;
    }
    /* A routing id of this connection's own: the next stage's ROUTER then never sees two connections
     * claim one id (a re-assigned ring connects again while the old link may still be registered). */
    char rid[80];
    snprintf(rid, sizeof rid, "node-%.16s-%08x", n->o->id.pk_hex, randombytes_random());
    const cJSON *ls = cJSON_GetObjectItemCaseSensitive(as->next, "link_s"); /* 3 round trips of this hop */
    n->next = zs_client(n->zctx, n->tn, addr, &n->o->id, down.curve_pk_z85, rid,
                        cJSON_IsNumber(ls) && ls->valuedouble > 0 && ls->valuedouble < 3600 ? ls->valuedouble : 0, &err);
    snprintf(n->next_addr, sizeof n->next_addr, "%s", addr);
    if (!n->next) {
        node_error(n, step, "next hop %s: %s", addr, err.msg);
        return -1;
    }
    /* Answer READY only once the encrypted link downstream is up: a broken ring shows now. */
    rl_err me;
    if (zs_monitor_start(&n->next_mon, n->zctx, n->next, "next", &me) != 0) zs_monitor_stop(&n->next_mon);
    bool up = zs_wait_writable(n->next, 10000);
    if (!up) {
        if (n->next_mon.pair) zs_monitor_poll(&n->next_mon);
        node_error(n, step, "cannot connect to the next stage %s within 10 s%s%s", addr,
                   n->next_mon.last[0] ? ": " : "", n->next_mon.last);
        node_close_next(n);
        return -1;
    }
    return 0;
}

/* Step 6: READY, with the range, where it computes, and the stage's own timed frames (node_time_stage). */
static void node_assign_ready(node *n, uint64_t step) {
    char spec[96] = "", ck[128] = "";
    if (n->rb_blocks > 0) { /* what a sequence's rollback copies come to, at most (k3_memory.h) */
        snprintf(spec, sizeof spec, "; %d speculative block%s in flight kept for rollback", n->rb_blocks,
                 n->rb_blocks > 1 ? "s" : "");
    }
    if (n->max_ck > 0) { /* serve's prompt cache: each a copy of the range's KDA state */
        snprintf(ck, sizeof ck, "; up to %d prompt-cache checkpoints per sequence (%.2f MiB each)", n->max_ck,
                 (double)k3_range_kda_state_bytes(&n->hp, n->a, n->b) / 1048576.0);
    }
    node_log(n, "stage %d of %d: layers [%u, %u) of %.12s..., %s%s%s", n->stage + 1, n->n_stages, n->a, n->b, n->hash,
             n->next ? "forwarding downstream" : "last stage, returning to the coordinator", spec, ck);
    node_time_stage(n);
    cJSON *r = cJSON_CreateObject();
    cJSON_AddNumberToObject(r, "a", n->a);
    cJSON_AddNumberToObject(r, "b", n->b);
    cJSON_AddNumberToObject(r, "weight_bytes", (double)k3_range_weight_bytes(&n->m, &n->hp, n->a, n->b));
    char where[512];
    k3_engine_describe(&n->e, where, sizeof where);
    cJSON_AddStringToObject(r, "where", where);
    if (n->n_steps > 0) {
        cJSON *sa = cJSON_AddArrayToObject(r, "steps");
        for (int i = 0; i < n->n_steps; i++) {
            cJSON *st = cJSON_CreateObject();
            cJSON_AddNumberToObject(st, "tokens", n->step_tok[i]);
            cJSON_AddNumberToObject(st, "s", n->step_s[i]);
            cJSON_AddItemToArray(sa, st);
        }
#ifdef RINGLM_ADVERSARY
        if (n->o->misbehave && strcmp(n->o->misbehave, "badsteps") == 0) { /* a frame that took no time */
            cJSON *st = cJSON_CreateObject();
            cJSON_AddNumberToObject(st, "tokens", 1);
            cJSON_AddNumberToObject(st, "s", -1);
            cJSON_AddItemToArray(sa, st);
        }
#endif
    }
    char *s = cJSON_PrintUnformatted(r);
    cJSON_Delete(r);
    if (s) node_reply(n, FRAME_READY, step, s, strlen(s));
    free(s);
}

/* ASSIGN: this node's stage of a ring, in the steps above; the first that fails has answered ERROR, and the
 * rest are not taken. */
void node_assign(node *n, uint64_t step, const zs_parts *p) {
    cJSON *j = cJSON_ParseWithLength(p->data[2], p->len[2]);
    if (!j) {
        node_error(n, step, "ASSIGN is not valid JSON");
        return;
    }
    node_assignment as;
    if (node_assign_parse(n, step, j, &as) == 0 && node_assign_find(n, step, &as) == 0 &&
        node_assign_load(n, step, p, j, &as) == 0) {
        node_assign_stage(n, j, &as);
        if (node_assign_links(n, step, &as) == 0) node_assign_ready(n, step);
    }
    cJSON_Delete(j);
}

