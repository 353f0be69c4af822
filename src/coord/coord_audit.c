/* coord_audit.c - audits: the coordinator asks a stage's node for the bytes of a finished sequence's
 * traversals, checks them against its signed receipts, and recomputes the stage (coord/audit.h). */
#include "coord_int.h"
#include "../base/clock.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>

#include <cJSON.h>
#include <sodium.h>
#include <zmq.h>

#include "ggml-backend.h"

#include "../device/devices.h"
#include "../gen/emit.h"
#include "../text/chat_gram.h"
#include "audit.h"

/* ---- audits: recompute a stage for a finished sequence (coord/audit.h) --------------------------- */

/* A uniform draw in [0, 1) from the audit seed (splitmix64): the same seed picks the same audits. */
static int ring_audit_fail(ring_coord *rc, int stage, rl_err *err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int ring_audit_fail(ring_coord *rc, int stage, rl_err *err, const char *fmt, ...) {
    int node = rc->plan.stages[stage].node;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rc->fault[node], sizeof rc->fault[node], fmt, ap);
    va_end(ap);
    rc->faulty[node] = true;
    rc->audit_failures++;
    return rl_errf(err, "audit: node %s (stage %d, layers [%u, %u)) is faulty: %s", rc->conf.nodes[node].addr, stage,
                   rc->plan.stages[stage].a, rc->plan.stages[stage].b, rc->fault[node]);
}

static int ring_hist_cmp(const void *a, const void *b) {
    const ledger_hist *x = *(const ledger_hist *const *)a, *y = *(const ledger_hist *const *)b;
    return x->step_id < y->step_id ? -1 : x->step_id > y->step_id;
}

/* One audit: sequence seq at stage `stage`. */
static int ring_audit_one(ring_coord *rc, uint64_t seq, int stage, rl_err *err) {
    const plan_stage *ps = &rc->plan.stages[stage];
    int node = ps->node;
    /* The remembered traversals that carried the sequence, in step order. */
    const ledger_hist **hs = malloc((size_t)(rc->ledger.n_hist + 1) * sizeof *hs);
    if (!hs) return rl_errf(err, "out of memory");
    int n = 0;
    for (int i = 0; i < rc->ledger.n_hist; i++) {
        const ledger_hist *r = ledger_hist_at(&rc->ledger, i);
        for (uint32_t k = 0; k < r->n_seqs; k++) {
            if (r->seqs[k].seq_id == seq) {
                hs[n++] = r;
                break;
            }
        }
    }
    qsort(hs, (size_t)n, sizeof *hs, ring_hist_cmp);
    if (n == 0 || n > 65536) {
        free(hs);
        rc->audits_skipped++;
        return 0; /* nothing remembered (or too much): nothing to check */
    }
    /* Ask the node for what it received and sent in those steps. */
    size_t ql = 4 + (size_t)n * 8;
    uint8_t *qb = malloc(ql);
    frame_header *h = calloc(1, sizeof *h);
    if (!qb || !h) {
        free(qb), free(h), free(hs);
        return rl_errf(err, "out of memory");
    }
    uint32_t cnt = (uint32_t)n;
    memcpy(qb, &cnt, 4);
    for (int i = 0; i < n; i++) memcpy(qb + 4 + (size_t)i * 8, &hs[i]->step_id, 8);
    h->type = FRAME_AUDIT_REQ;
    h->ring_id = rc->ring_id;
    h->step_id = rc->next_step++;
    uint64_t req_step = h->step_id;
    uint8_t sb[8];
    frame_stamps_encode(NULL, 0, sb);
    int r = ring_send(rc, node, FRAME_AUDIT_REQ, h->step_id, h, qb, ql, sb, frame_stamps_size(0), err);
    free(qb);
    zs_parts p = {0};
    bool watch[PLAN_MAX_NODES] = {0};
    watch[node] = true;
    int from;
    while (r == 0) {
        r = ring_wait(rc, FRAME_AUDIT_DATA, node, rc->o.step_s, watch, &from, &p, h, err);
        if (r == 0 && h->step_id == req_step) break;
        if (r == 0) zs_parts_free(&p); /* an answer to an earlier request */
    }
    if (r != 0) {
        free(h), free(hs);
        return ring_audit_fail(rc, stage, err, "it did not answer the audit: %s", err->msg);
    }
    /* Parse, and check every step's bytes against the hashes it signed. */
    audit_frame *fr = calloc((size_t)n, sizeof *fr);
    frame_header *hdrs = calloc((size_t)n, sizeof *hdrs);
    const uint8_t *d = p.data[1], *end = d + p.len[1];
    int rc_ = 0;
    if (!fr || !hdrs) rc_ = rl_errf(err, "out of memory");
    uint32_t got = 0;
    if (rc_ == 0 && (end - d < 4 || (memcpy(&got, d, 4), got != cnt))) {
        rc_ = ring_audit_fail(rc, stage, err, "its audit answer is malformed");
    }
    d += 4;
    for (int i = 0; rc_ == 0 && i < n; i++) {
        uint64_t step, il, ol;
        uint8_t kept;
        if (end - d < 25) {
            rc_ = ring_audit_fail(rc, stage, err, "its audit answer is malformed");
            break;
        }
        memcpy(&step, d, 8), memcpy(&kept, d + 8, 1), memcpy(&il, d + 9, 8), memcpy(&ol, d + 17, 8);
        d += 25;
        if (step != hs[i]->step_id || !kept) {
            rc_ = ring_audit_fail(rc, stage, err, "it kept nothing of step %" PRIu64 ", which it signed a receipt for",
                                  hs[i]->step_id);
            break;
        }
        if (il > (uint64_t)(end - d) || ol > (uint64_t)(end - d) - il) {
            rc_ = ring_audit_fail(rc, stage, err, "its audit answer is malformed");
            break;
        }
        uint8_t hi[32], ho[32];
        receipt_hash(d, il, hi);
        receipt_hash(d + il, ol, ho);
        if (memcmp(hi, hs[i]->hash[stage][0], 32) != 0 || memcmp(ho, hs[i]->hash[stage][1], 32) != 0) {
            rc_ = ring_audit_fail(rc, stage, err, "what it says it %s in step %" PRIu64 " is not what its receipt signed",
                                  memcmp(hi, hs[i]->hash[stage][0], 32) ? "received" : "sent", hs[i]->step_id);
            break;
        }
        frame_header *fh = &hdrs[i];
        fh->type = FRAME_FORWARD;
        fh->ring_id = rc->ring_id;
        fh->step_id = hs[i]->step_id;
        fh->n_seqs = hs[i]->n_seqs;
        fh->payload_bytes = il;
        memcpy(fh->seqs, hs[i]->seqs, hs[i]->n_seqs * sizeof *fh->seqs);
        bool last = stage == rc->plan.n_stages - 1;
        fr[i] = (audit_frame){.h = fh, .in = d, .in_len = il, .out = d + il, .out_len = ol,
                              .q = last ? hs[i]->q : NULL, .q_len = last ? hs[i]->q_len : 0};
        d += il + ol;
    }
    /* Recompute. */
    if (rc_ == 0 && !rc->aud_eng[stage]) {
        k3_engine *e = calloc(1, sizeof *e);
        /* One thread by default: audits are background work, and ggml's OpenMP threads spin at their
         * barriers - on a machine that is also running nodes or serving, more threads than free cores make
         * an audit hundreds of times slower, not faster. */
        int th = rc->o.audit_threads > 0 ? rc->o.audit_threads : 1;
        /* The node's own weight layout, attention and cache type: each rounds differently. And its backend: a
         * CPU stage is recomputed on the CPU (whatever GPUs this machine has), a GPU stage on a device of the
         * same backend here with the same split, when there is one, else on the CPU, where only --audit-tol
         * stands between a GPU's rounding (or a near-tied expert it flipped) and a verdict (docs/receipts.md). */
        k3_engine_opts eo = rc->nodes[ps->node].eng;
        eo.n_threads = th;
        char same[64] = "";
        const ring_node_state *ns = &rc->nodes[ps->node];
        rl_err de;
        struct ggml_backend_device *devs[K3_MAX_DEV];
        int nd = 0;
        if (ns->dev_reg[0] && dv_pick(NULL, devs, K3_MAX_DEV, &nd, &de) == 0) { /* (this machine's GPUs) */
            for (int k = 0; k < nd && !same[0]; k++) {
                const char *reg = ggml_backend_reg_name(ggml_backend_dev_backend_reg(devs[k]));
                if (strcmp(reg, ns->dev_reg) == 0) snprintf(same, sizeof same, "%s", ggml_backend_dev_name(devs[k]));
            }
        }
        eo.device = same[0] ? same : "CPU";
        if (same[0] && rc->pnodes[ps->node].ram_bytes > 0) { /* the split the plan gave the node */
            eo.gpu_layers_set = true;
            eo.gpu_layers = ps->dev_layers;
            eo.n_cpu_moe = ps->cpu_moe ? ps->a + ps->cpu_moe : 0;
        }
        rc->aud_arch[stage] = false;
        char reg[sizeof ns->dev_reg], *where = rc->aud_where[stage]; /* (a copy: both live in rc) */
        memcpy(reg, ns->dev_reg, sizeof reg);
        if (same[0]) {
            snprintf(where, sizeof rc->aud_where[stage], "on %s (the node's backend, %s)", same, reg);
        } else if (reg[0]) {
            snprintf(where, sizeof rc->aud_where[stage], "on the CPU (the node computes on %s: no such device here)", reg);
        } else {
            /* Another CPU architecture computes with other kernels: close on float weights, but on quantized
             * ones a last-bit difference can flip a rounding and a routing choice (docs/numerics.md). */
            struct utsname un;
            const char *here = uname(&un) == 0 ? un.machine : "";
            char arch[sizeof ns->arch]; /* (a copy: it and `where` both live in rc) */
            memcpy(arch, ns->arch, sizeof arch);
            if (arch[0] && here[0] && strcmp(arch, here) != 0) {
                snprintf(where, sizeof rc->aud_where[stage],
                         "on the CPU (the node's is %s, this one %s: other kernels, within --audit-tol-arch %.2g)",
                         arch, here, RING_AUDIT_TOL_ARCH_OF(&rc->o));
                rc->aud_arch[stage] = true;
            } else {
                snprintf(where, sizeof rc->aud_where[stage], "on the CPU (as the node)");
            }
        }
        if (!e || k3_engine_init(e, rc->m, &rc->hp, ps->a, ps->b, &eo, err) != 0) {
            free(e);
            rc_ = e ? rl_errf(err, "audit: cannot run layers [%u, %u) here: %s", ps->a, ps->b, err->msg)
                    : rl_errf(err, "out of memory");
        } else {
            rc->aud_eng[stage] = e;
        }
    }
    if (rc_ == 0 && stage == rc->plan.n_stages - 1 && !rc->aud_vocab) {
        /* The last stage samples, constrained output too: its audit follows the same grammar over the same
         * vocabulary (chat_gram.h), from the coordinator's own copy of the model. */
        if (tok_load(&rc->aud_tok, rc->m, err) != 0) {
            rc_ = rl_errf(err, "audit: the model's vocabulary: %s", err->msg);
        } else if (!(rc->aud_vocab = chat_gram_vocab_new(&rc->aud_tok))) {
            tok_free(&rc->aud_tok);
            rc_ = rl_errf(err, "out of memory");
        }
    }
    if (rc_ == 0) {
        audit_report rep;
        double tol = RING_AUDIT_TOL_OF(&rc->o);
        /* A CPU stage of a node on another CPU architecture: its kernels round otherwise, and on quantized
         * weights a last-bit difference now and then crosses the 8-bit requantization's rounding: an honest
         * aarch64 stage of 2-3 layers measured 0.0115 from x86's recomputation on q8_0 and q4_0 files
         * (2.5e-6 on f32; docs/numerics.md). Such an audit catches gross lies, not the last percent. */
        if (rc->aud_arch[stage]) tol = fmax(tol, RING_AUDIT_TOL_ARCH_OF(&rc->o));
        if (audit_replay_seq(rc->aud_eng[stage], rc->o.n_ctx, rc->o.wire, rc->o.ctx_checkpoints, rc->aud_vocab, seq, fr, n, tol, &rep, err) != 0) {
            rc_ = -1;
        } else {
            rc->audit_frames += rep.frames;
            rc->audit_max_diff = fmax(rc->audit_max_diff, rep.max_diff);
            if (!rep.match) {
                rc_ = ring_audit_fail(rc, stage, err, "sequence %" PRIu64 ", step %" PRIu64 ": %s", seq,
                                      fr[rep.bad_frame].h->step_id, rep.what);
            }
        }
    }
    zs_parts_free(&p);
    free(fr), free(hdrs), free(h), free(hs);
    return rc_;
}

int ring_audit_pending(ring_coord *rc, rl_err *err) {
    if (rc->audit.n == 0 || rc->n_pending > 0) return 0; /* nothing drawn, or not a quiet moment */
    /* The receipts of the sequences' last traversals may still be on their way. */
    if (ring_receipts_finish(rc, 10.0, err) != 0) return -1;
    uint64_t seq;
    int stage;
    while (audit_draws_next(&rc->audit, rc->plan.n_stages, &seq, &stage)) {
        double t0 = rl_clock_now();
        int r = ring_audit_one(rc, seq, stage, err);
        int node = rc->plan.stages[stage].node;
        rc->audit_s += rl_clock_now() - t0;
        rc->node_audit_s[node] += rl_clock_now() - t0;
        rc->audits++;
        rc->node_audits[node]++;
        if (r != 0) return -1;
    }
    return 0;
}

void ring_audit_free(ring_coord *rc) {
    for (int i = 0; i < PLAN_MAX_NODES; i++) {
        if (rc->aud_eng[i]) k3_engine_free(rc->aud_eng[i]);
        free(rc->aud_eng[i]);
        rc->aud_eng[i] = NULL;
    }
    if (rc->aud_vocab) {
        tok_vocab_free(rc->aud_vocab);
        tok_free(&rc->aud_tok);
        rc->aud_vocab = NULL;
    }
}
