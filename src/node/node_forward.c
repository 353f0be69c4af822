/* node_forward.c - FORWARD frames through this stage: the run, the receipts it signs, the DSpark taps it
 * returns, the log an auditor replays, and (test builds only) the ways a node can lie. */
#include "node_int.h"

/* ---- forward ----------------------------------------------------------------------------------- */

/* ---- audit log: what this stage received and sent, for an auditor to check --------------------- */

static void node_alog_drop_oldest(node *n) {
    struct node_audit_rec *r = &n->alog[n->alog_head];
    n->alog_bytes -= r->in_len + r->out_len;
    free(r->in);
    free(r->out);
    memset(r, 0, sizeof *r);
    n->alog_head = (n->alog_head + 1) % n->alog_cap;
    n->alog_n--;
}

void node_alog_clear(node *n) {
    while (n->alog_n) node_alog_drop_oldest(n);
    free(n->alog);
    n->alog = NULL;
    n->alog_cap = n->alog_head = n->alog_bytes = 0;
}

/* Keeps one step's input and output (malloc'ed; taken over), forgetting the oldest steps beyond the byte
 * budget. A failure to keep them is not an error of the step: an audit of it then finds nothing and says so. */
static void node_alog_add(node *n, const frame_header *h, uint8_t *in, size_t in_len, uint8_t *out, size_t out_len) {
    size_t keep = n->o->audit_keep_bytes ? n->o->audit_keep_bytes : (size_t)256 << 20;
    if (in_len + out_len > keep) {
        free(in);
        free(out);
        return;
    }
    while (n->alog_n && n->alog_bytes + in_len + out_len > keep) node_alog_drop_oldest(n);
    if (n->alog_n == n->alog_cap) { /* grow, unwrapping the ring so the oldest is at 0 again */
        size_t cap = n->alog_cap ? n->alog_cap * 2 : 64;
        struct node_audit_rec *a = calloc(cap, sizeof *a);
        if (!a) {
            free(in);
            free(out);
            return;
        }
        for (size_t i = 0; i < n->alog_n; i++) a[i] = n->alog[(n->alog_head + i) % n->alog_cap];
        free(n->alog);
        n->alog = a;
        n->alog_cap = cap;
        n->alog_head = 0;
    }
    struct node_audit_rec r = {.ring_id = h->ring_id, .step_id = h->step_id, .in = in, .out = out,
                               .in_len = in_len, .out_len = out_len};
    n->alog[(n->alog_head + n->alog_n) % n->alog_cap] = r;
    n->alog_n++;
    n->alog_bytes += in_len + out_len;
}

static const struct node_audit_rec *node_alog_find(const node *n, uint64_t ring_id, uint64_t step) {
    for (size_t i = 0; i < n->alog_n; i++) {
        const struct node_audit_rec *r = &n->alog[(n->alog_head + i) % n->alog_cap];
        if (r->ring_id == ring_id && r->step_id == step) return r;
    }
    return NULL;
}

#ifdef RINGLM_ADVERSARY
/* ---- test builds only: a node that lies (tests/t_trust.sh) --------------------------------------- */

static bool node_adv_is(const node *n, const char *mode) {
    const char *m = n->o->misbehave;
    if (!m) return false;
    size_t l = strlen(mode);
    if (strncmp(m, mode, l) != 0 || (m[l] && m[l] != '@')) return false;
    long from = m[l] == '@' ? atol(m + l + 1) : 0;
    return n->adv_forwards > from;
}

/* skip / perturb: change what is sent on, then sign it honestly (only an audit can catch this). */
static void node_adv_output(node *n, const frame_header *h, const uint8_t *in, uint8_t *out, size_t out_len) {
    bool skip = node_adv_is(n, "skip"), perturb = node_adv_is(n, "perturb");
    if (!skip && !perturb) return;
    uint64_t total = 0;
    for (uint32_t i = 0; i < h->n_seqs; i++) total += h->seqs[i].n_tokens;
    if (n->b == n->hp.n_layer) { /* the last stage: another token than the model's */
        for (uint32_t i = 0; i < h->n_seqs; i++) {
            int32_t t;
            memcpy(&t, out + i * 4, 4);
            if (t < 0 || (h->seqs[i].flags & FRAME_SEQ_VERIFY)) continue;
            t = (int32_t)(((uint32_t)t + 1) % n->hp.n_vocab);
            memcpy(out + i * 4, &t, 4);
        }
        return;
    }
    rl_err err;
    k3_boundary bo = {0}, bi = {0};
    if (k3_boundary_decode(&bo, out + total * 4, out_len - total * 4, (uint32_t)total, n->hp.n_embd, &err) != 0) return;
    size_t nh = (size_t)bo.n_tokens * bo.n_embd;
    float mx = 0;
    for (size_t i = 0; i < nh; i++) mx = fmaxf(mx, fabsf(bo.h[i]));
    if (skip && n->a > 0 && k3_boundary_decode(&bi, in + total * 4, h->payload_bytes - total * 4, (uint32_t)total,
                                               n->hp.n_embd, &err) == 0) {
        memcpy(bo.h, bi.h, nh * sizeof *bo.h); /* as if these layers added nothing */
    } else {
        for (size_t i = 0; i < nh; i += 7) bo.h[i] += (skip ? -1.0f : 0.05f) * mx;
    }
    k3_boundary_encode(&bo, (enum k3_wire_dtype)n->wire, out + total * 4);
    k3_boundary_free(&bo);
    k3_boundary_free(&bi);
}

/* wrongkey / claim: a receipt signed by another key, or for a layer range the node was not given. */
static void node_adv_receipt(node *n, receipt_rec *r) {
    if (node_adv_is(n, "claim")) {
        if (r->layer_end < n->hp.n_layer) r->layer_end++;
        else r->layer_start--;
    }
}
static const keys_identity *node_adv_signer(node *n) {
    if (!node_adv_is(n, "wrongkey")) return &n->o->id;
    rl_err err;
    if (!n->adv_have_other) n->adv_have_other = keys_generate(&n->adv_other, &err) == 0;
    return n->adv_have_other ? &n->adv_other : &n->o->id;
}
/* replay: keeps its first receipt and sends that one again instead of a fresh one. */
static void node_adv_replay(node *n, const uint8_t **packed, size_t *len) {
    if (!n->adv_old) {
        n->adv_old = malloc(*len);
        if (n->adv_old) memcpy(n->adv_old, *packed, *len), n->adv_old_len = *len;
        return;
    }
    if (node_adv_is(n, "replay")) *packed = n->adv_old, *len = n->adv_old_len;
}
#endif

/* AUDIT_REQ: u32 n | n x u64 step id -> AUDIT_DATA (frame.h). */
void node_audit(node *n, const zs_parts *p, const frame_header *h) {
    uint32_t cnt = 0;
    if (p->len[2] >= 4) memcpy(&cnt, p->data[2], 4);
    if (p->len[2] < 4 || cnt > 65536 || p->len[2] != 4 + (size_t)cnt * 8) {
        node_error(n, h->step_id, "AUDIT_REQ of %zu bytes is malformed", p->len[2]);
        return;
    }
    const uint8_t *ids = (const uint8_t *)p->data[2] + 4;
    size_t len = 4;
    for (uint32_t i = 0; i < cnt; i++) {
        uint64_t step;
        memcpy(&step, ids + i * 8, 8);
        const struct node_audit_rec *r = node_alog_find(n, h->ring_id, step);
        len += 25 + (r ? r->in_len + r->out_len : 0);
    }
    uint8_t *buf = malloc(len), *w = buf;
    if (!buf) {
        node_error(n, h->step_id, "out of memory for AUDIT_DATA (%zu bytes)", len);
        return;
    }
    memcpy(w, &cnt, 4);
    w += 4;
    for (uint32_t i = 0; i < cnt; i++) {
        uint64_t step, il = 0, ol = 0;
        memcpy(&step, ids + i * 8, 8);
        const struct node_audit_rec *r = node_alog_find(n, h->ring_id, step);
        uint8_t kept = r != NULL;
        if (r) il = r->in_len, ol = r->out_len;
        memcpy(w, &step, 8), memcpy(w + 8, &kept, 1), memcpy(w + 9, &il, 8), memcpy(w + 17, &ol, 8);
        w += 25;
        if (r) {
            memcpy(w, r->in, il);
            memcpy(w + il, r->out, ol);
#ifdef RINGLM_ADVERSARY
            if (ol && node_adv_is(n, "auditlie")) w[il + ol - 1] ^= 1; /* hands the auditor other bytes */
#endif
            w += il + ol;
        }
    }
    node_reply(n, FRAME_AUDIT_DATA, h->step_id, buf, len);
    free(buf);
}


/* Signs this stage's receipt for one traversal and sends it to the coordinator (out of band). */
static void node_send_receipt(node *n, const frame_header *h, const uint8_t nonce[32], const void *in, size_t in_len,
                              const void *out_bytes, size_t out_len) {
    rl_err err;
    receipt_rec *r = calloc(1, sizeof *r);
    receipt_seq sq[FRAME_MAX_SEQS];
    uint8_t packed[RECEIPT_MAX_PACKED];
    size_t packed_len = 0;
    for (uint32_t i = 0; i < h->n_seqs; i++) {
        sq[i] = (receipt_seq){.seq_id = h->seqs[i].seq_id, .pos = h->seqs[i].pos, .n_tokens = h->seqs[i].n_tokens};
    }
    int ok = r != NULL;
    if (ok) ok = node_manifest(n, &err) == 0;
    if (ok) {
        r->ring_id = h->ring_id;
        r->request_id = h->step_id;
        memcpy(r->nonce, nonce, 32);
        memcpy(r->manifest, n->manifest, 32);
        r->layer_start = n->a;
        r->layer_end = n->b;
        receipt_hash(in, in_len, r->in_hash);
        receipt_hash(out_bytes, out_len, r->out_hash);
        const keys_identity *signer = &n->o->id;
#ifdef RINGLM_ADVERSARY
        node_adv_receipt(n, r);
        signer = node_adv_signer(n);
#endif
        ok = receipt_set_seqs(r, sq, h->n_seqs, &err) == 0 && receipt_sign(r, signer, &err) == 0 &&
             receipt_pack(r, packed, sizeof packed, &packed_len, &err) == 0;
    }
    free(r);
    if (!ok) {
        node_error(n, h->step_id, "cannot sign a receipt: %s", err.msg);
        return;
    }
    const uint8_t *send = packed;
#ifdef RINGLM_ADVERSARY
    node_adv_replay(n, &send, &packed_len);
#endif
    /* The header names the receipt's own ring, not the frame being handled now: a receipt flushed as the
     * next coordinator's first message arrives belongs to the ring that sent the frame. */
    uint64_t cur = n->cur_ring;
    n->cur_ring = h->ring_id;
    node_reply(n, FRAME_RECEIPT, h->step_id, send, packed_len);
    n->cur_ring = cur;
}

/* Signs and sends every pending receipt, oldest first, and files the frames in the audit log.
 *
 * Why not at once: a stage's frame is handed to the next one by ZeroMQ's I/O threads after zs_send
 * returns; hashing and signing right then competes with that hand-off (and with the next stage's compute,
 * when nodes share a machine) and lengthens every traversal. A millisecond later the hand-off is done and
 * the work overlaps the next stage's compute instead. Receipts travel out of band, so a little late is
 * fine; they are always sent before the node handles anything else. */
void node_flush_receipts(node *n) {
    for (int i = 0; i < n->n_rjobs; i++) {
        struct node_rjob *j = &n->rjobs[i];
        node_send_receipt(n, j->h, j->nonce, j->in, j->in_len, j->out, j->out_len);
        node_alog_add(n, j->h, j->in, j->in_len, j->out, j->out_len);
        free(j->h);
    }
    n->n_rjobs = 0;
}

void node_free_rjobs(node *n) {
    for (int i = 0; i < n->n_rjobs; i++) free(n->rjobs[i].h), free(n->rjobs[i].in), free(n->rjobs[i].out);
    free(n->rjobs);
    n->rjobs = NULL;
    n->n_rjobs = n->cap_rjobs = 0;
}

/* Queues this frame's receipt (takes out; copies the input). Signs at once if it cannot queue. */
static void node_queue_receipt(node *n, const frame_header *h, const uint8_t nonce[32], const void *in, size_t in_len,
                               uint8_t *out, size_t out_len) {
    if (n->n_rjobs == n->cap_rjobs) {
        int cap = n->cap_rjobs ? n->cap_rjobs * 2 : 8;
        struct node_rjob *nj = realloc(n->rjobs, (size_t)cap * sizeof *nj);
        if (nj) n->rjobs = nj, n->cap_rjobs = cap;
    }
    struct node_rjob j = {.h = malloc(sizeof *h), .in = malloc(in_len + 1), .out = out, .in_len = in_len,
                          .out_len = out_len};
    if (n->n_rjobs == n->cap_rjobs || !j.h || !j.in) {
        free(j.h), free(j.in);
        node_send_receipt(n, h, nonce, in, in_len, out, out_len);
        free(out);
        return;
    }
    *j.h = *h;
    memcpy(j.nonce, nonce, 32);
    memcpy(j.in, in, in_len);
    n->rjobs[n->n_rjobs++] = j;
}

/* TAPS (frame.h): this stage's DSpark taps of the frame just forwarded, straight to the coordinator. */
static void node_send_taps(node *n, uint64_t step) {
    const ring_stage *s = &n->stage_rt;
    size_t rows = (size_t)s->n_taps * s->n_tap_rows * n->hp.n_embd * sizeof(float);
    size_t len = 4 + 4 * (size_t)s->n_taps + 4 + rows;
    uint8_t *buf = malloc(len);
    if (!buf) {
        node_log(n, "out of memory for %zu bytes of taps", len);
        return;
    }
    uint32_t nt = (uint32_t)s->n_taps;
    memcpy(buf, &nt, 4);
    memcpy(buf + 4, s->taps, 4 * (size_t)nt);
    memcpy(buf + 4 + 4 * (size_t)nt, &s->n_tap_rows, 4);
    memcpy(buf + 8 + 4 * (size_t)nt, s->tap_rows, rows);
#ifdef RINGLM_ADVERSARY
    if (node_adv_is(n, "badtaps")) len -= 4; /* one float short */
    if (node_adv_is(n, "duptaps")) {         /* the real taps, then a second message of other rows */
        node_reply(n, FRAME_TAPS, step, buf, len);
        for (size_t i = 0; i < rows / sizeof(float); i++) ((float *)(buf + 8 + 4 * (size_t)nt))[i] = 1.0f;
    }
#endif
    node_reply(n, FRAME_TAPS, step, buf, len);
    free(buf);
}

void node_forward(node *n, const zs_parts *p, const frame_header *h) {
    rl_err err;
    double t_recv = frame_now();
    if (!n->loaded) {
        node_error(n, h->step_id, "FORWARD before ASSIGN");
        return;
    }
    if (p->n < 4) {
        node_error(n, h->step_id, "FORWARD with %d parts, expected 4", p->n - 1);
        return;
    }
    frame_stamp stamps[FRAME_MAX_STAMPS + 1];
    uint32_t n_stamps = 0;
    if (frame_stamps_decode(stamps, &n_stamps, p->data[3], p->len[3], &err) != 0 || n_stamps >= FRAME_MAX_STAMPS) {
        node_error(n, h->step_id, "FORWARD: %s", n_stamps >= FRAME_MAX_STAMPS ? "too many hops" : err.msg);
        return;
    }
    /* Receipts: when the coordinator asks (the extension with its nonce), this stage signs what it ran. */
    frame_receipts rx;
    int want_receipt = frame_receipts_decode(&rx, p->data[3], p->len[3], &err);
    if (want_receipt < 0 || (want_receipt == 0 && rx.n >= FRAME_MAX_RECEIPTS)) {
        node_error(n, h->step_id, "FORWARD: %s", want_receipt < 0 ? err.msg : "too many receipts");
        return;
    }
    want_receipt = want_receipt == 0;
#ifdef RINGLM_ADVERSARY
    if (node_adv_is(n, "stall")) { /* computes nothing from here on, yet its link stays up (heartbeats) */
        node_log(n, "stalling (--misbehave stall)");
        while (!node_stop_pending()) {
            struct timespec ts = {0, 50 * 1000000L};
            nanosleep(&ts, NULL);
        }
        return;
    }
    if (node_adv_is(n, "drop") && !n->adv_dropped) { /* loses this one frame (and only it): nothing runs or is sent */
        n->adv_dropped = true;
        node_log(n, "dropping step %" PRIu64 " (--misbehave drop)", h->step_id);
        return;
    }
#endif
    /* The traversal's deadline (frame.h budget_ms): what its stamps show was spent before this stage, and
     * here, already used it up? Then the coordinator has given it up (its own clock counts the links too):
     * say so instead of computing it. */
    double t_start = frame_now();
    if (h->budget_ms > 0) {
        const double spent = frame_budget_spent(stamps, n_stamps, t_recv, t_start);
        if (spent * 1e3 >= h->budget_ms) {
            node_error(n, h->step_id, "step %" PRIu64 " reached stage %d past its deadline: %.0f ms of its %u ms spent "
                       "before it could run (%.0f ms waiting here)", h->step_id, n->stage + 1, spent * 1e3, h->budget_ms,
                       (t_start - t_recv) * 1e3);
            return;
        }
    }
    uint8_t *payload = NULL;
    size_t plen = 0;
    if (stage_run(&n->stage_rt, h, p->data[2], p->len[2], p->n > 4 ? p->data[4] : NULL, p->n > 4 ? p->len[4] : 0,
                  &payload, &plen, &err) != 0) {
        node_error(n, h->step_id, "%s", err.msg);
        return;
    }
    bool last = n->b == n->hp.n_layer;
#ifdef RINGLM_ADVERSARY
    n->adv_forwards++;
    node_adv_output(n, h, p->data[2], payload, plen);
#endif
    double t_end = frame_now();
    uint64_t total = 0;
    for (uint32_t i = 0; i < h->n_seqs; i++) total += h->seqs[i].n_tokens;
    stamps[n_stamps++] = (frame_stamp){.stage = (uint32_t)n->stage, .n_tokens = (uint32_t)total, .t_recv = t_recv,
                                    .t_start = t_start, .t_end = t_end};
    frame_header oh = *h;
    if (last) oh.type = FRAME_RESULT;
    oh.payload_bytes = plen;
    stamps[n_stamps - 1].t_send = frame_now();
    size_t hl = frame_header_size(oh.n_seqs), sl = frame_stamps_size(n_stamps);
    size_t xl = want_receipt ? frame_receipts_size(&rx, 0) : 0;
    uint8_t *hb = malloc(hl), *sb = malloc(sl + xl);
    sl += xl;
    if (hb && sb) {
        frame_header_encode(&oh, hb);
        frame_stamps_encode(stamps, n_stamps, sb);
        if (want_receipt) frame_receipts_encode(&rx, NULL, 0, sb + frame_stamps_size(n_stamps));
        if (!last) {
            const void *parts[4] = {hb, payload, sb, p->n > 4 ? p->data[4] : NULL};
            size_t lens[4] = {hl, plen, sl, p->n > 4 ? p->len[4] : 0};
            if (node_send_next(n, parts, lens, p->n > 4 ? 4 : 3, &err) != 0) {
                char msg[1024];
                snprintf(msg, sizeof msg, "stage %d cannot reach the next stage: %s", n->stage + 1, err.msg);
                node_error_at(n, h->step_id, n->next_mon.disconnected ? n->next_addr : NULL, msg);
            }
        } else {
            const void *parts[4] = {n->coord_id, hb, payload, sb};
            size_t lens[4] = {n->coord_id_len, hl, plen, sl};
            if (zs_send(n->router, parts, lens, 4, true, &err) != 0) node_log(n, "cannot return a result: %s", err.msg);
        }
    }
    free(hb);
    free(sb);
    if (n->stage_rt.n_tap_rows > 0) node_send_taps(n, h->step_id);
    if (n->stage_rt.routes) {
        size_t rl = n->stage_rt.routes_len;
#ifdef RINGLM_ADVERSARY
        if (node_adv_is(n, "badroutes")) rl -= 4; /* one value short */
        if (node_adv_is(n, "duproutes")) node_reply(n, FRAME_ROUTES, h->step_id, n->stage_rt.routes, rl);
#endif
        node_reply(n, FRAME_ROUTES, h->step_id, n->stage_rt.routes, rl);
    }
    /* The frame is on its way: now hash what came in and what went out, sign, and tell the coordinator
     * directly. The next stage hashes the same bytes as its input, so the coordinator can check the chain. */
    if (want_receipt) node_queue_receipt(n, h, rx.nonce, p->data[2], p->len[2], payload, plen);
    else free(payload);
}

void node_free(node *n, const zs_parts *p, const frame_header *h) {
    for (uint32_t i = 0; i < h->n_seqs; i++) stage_forget(&n->stage_rt, h->seqs[i].seq_id);
    if (n->next) { /* pass it down the ring so every stage forgets the sequence */
        const void *parts[3] = {p->data[1], p->data[2], p->n > 3 ? p->data[3] : ""};
        size_t lens[3] = {p->len[1], p->len[2], p->n > 3 ? p->len[3] : 0};
        rl_err err;
        zs_send(n->next, parts, lens, 3, true, &err);
    }
}


