/* prompt_run on a ring (prompt_int.h): this machine is the coordinator. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../plan/predict.h"
#include "prompt_int.h"
#include "verify_ring.h"

/* The ring's options for this run: context, wire, order, receipts into rf (or none), DSpark's taps, audits,
 * the manifest, and the blocks a speculative run keeps in flight. */
static ring_opts prompt_ring_opts(const prompt_opts *o, const manifest_file *mf, FILE *rf, spec_drafter *drafter,
                                  const spec_params *spp) {
    ring_opts ro = ring_opts_default();
    ro.n_ctx = (uint32_t)o->ctx;
    ro.wire = o->wire;
    ro.keep_order = o->keep_order;
    if (rf) {
        ro.receipts = true;
        ro.receipts_out = rf;
    }
    const uint32_t *taps;
    ro.n_taps = drafter ? spec_drafter_taps(drafter, &taps) : 0;
    if (ro.n_taps > 0) memcpy(ro.taps, taps, (size_t)ro.n_taps * sizeof *taps);
    ro.audit_rate = o->trust.audit_rate;
    if (o->trust.node_timeout > 0) ro.dead_s = o->trust.node_timeout;
    ro.link_s = o->trust.link_timeout;
    ro.audit_seed = o->trust.audit_seed;
    ro.audit_tol = o->trust.audit_tol;
    ro.audit_tol_arch = o->trust.audit_tol_arch;
    ro.manifest = mf;
    ro.manifest_path = o->manifest;
    if (drafter) { /* blocks of up to k_max drafts and the token before them, depth of them in flight */
        ro.spec_block = (uint32_t)spp->k_max + 1;
        ro.spec_depth = spp->depth < 1 ? 1 : spp->depth > SPEC_MAX_DEPTH ? SPEC_MAX_DEPTH : spp->depth;
    }
    return ro;
}

/* After a good run: the per-stage table, what ran next to what the planner predicted, the receipts checked
 * and the audits run. */
/* What the plan's model predicts for this speculative run from what it measured (predict.h): its acceptance,
 * mean block, depth and drafting time per block, the ring's measured delays and calibrated stages. Judges
 * the model (issue #54: within 25%), not the drafter. -1 when there is nothing to judge. */
static int prompt_ring_spec_prediction(const ring_coord *rc, const spec_params *spp, const spec_metrics *smx,
                                       const gen_metrics *gm, const prompt_opts *o, predict_result *pr, double *acceptance) {
    if (!smx || smx->blocks <= 0 || smx->drafted <= 0) return -1;
    predict_opts po = {.draft_k = (int)((double)smx->sent_drafts / (double)smx->blocks + 0.5),
                       .draft_depth = spp->depth, .draft_block_s = smx->draft_s / (double)smx->blocks,
                       .gen = (uint32_t)gm->generated_tokens};
    if (po.draft_k < 1) po.draft_k = 1;
    /* The model's acceptance is per drafted token, independent; real drafts are not (a block stands whole or
     * breaks at a hard token, and a reply's end rejects the drafts past it). So it is fed the acceptance
     * that gives the tokens a kept traversal committed, g(a, k) = (1 - a^(k+1)) / (1 - a): what `ringlm plan
     * --acceptance` means to a user who measured tokens per traversal. */
    long kept = smx->traversals - smx->cancelled;
    double g = kept > 0 ? (double)smx->committed / (double)kept : 1, lo = 0, hi = 0.999999;
    for (int i = 0; i < 60; i++) {
        double a = (lo + hi) / 2, ga = (1 - pow(a, po.draft_k + 1)) / (1 - a);
        if (ga < g) lo = a;
        else hi = a;
    }
    po.acceptance = lo > 1e-6 ? lo : 1e-6;
    *acceptance = po.acceptance;
    return ring_prediction(rc, (uint32_t)gm->prompt_tokens, (uint32_t)o->chunk, &po, pr);
}

static void prompt_ring_print(const prompt_opts *o, const ring_coord *rc, bool spec, const gen_metrics *gm,
                              const spec_params *spp, const predict_result *ps, double a) {
    fprintf(stderr, "\n");
    ring_print_stats(rc, stderr);
    predict_result pr;
    if (ring_prediction(rc, (uint32_t)gm->prompt_tokens, (uint32_t)o->chunk, NULL, &pr) == 0) {
        /* What ran next to what the planner predicted for it (docs/plan.md). */
        fprintf(stderr, "time to first token: %.3f s; the plan predicted %.3f (%+.0f%%)\n", gm->ttft_s, pr.ttft_s,
                100 * (pr.ttft_s / gm->ttft_s - 1));
        if (!spec && gm->generated_tokens > 1) {
            fprintf(stderr, "decode: %.2f tok/s greedy; the plan predicted %.2f (%+.0f%%)\n", gm->decode_tok_s,
                    pr.greedy_tok_s, 100 * (pr.greedy_tok_s / gm->decode_tok_s - 1));
        }
        if (ps) {
            fprintf(stderr, "decode: %.2f tok/s speculative; the plan predicted %.2f (%+.0f%%) at what ran: %.2f tokens "
                            "a kept traversal (acceptance %.3f in the plan's terms), %d drafts a block, up to %d in flight, "
                            "%.1f ms drafting a block\n", gm->decode_tok_s, ps->spec_tok_s,
                    100 * (ps->spec_tok_s / gm->decode_tok_s - 1), ps->g, a, ps->draft_k, spp->depth, ps->draft_s * 1e3);
        }
    }
    if (o->trust.receipts) {
        fprintf(stderr, "receipts: %ld checked (signatures, signers, ranges, chain, nonces), written to %s\n",
                rc->ledger.checked, o->trust.receipts);
    }
    if (o->trust.audit_rate > 0) {
        bool arch = false;
        for (int s = 0; s < rc->plan.n_stages; s++) arch = arch || rc->aud_arch[s];
        char other[64] = "";
        if (arch) snprintf(other, sizeof other, ", %.2g for another architecture's stage",
                           RING_AUDIT_TOL_ARCH_OF(&rc->o));
        fprintf(stderr, "audits: %ld sequence(s) audited, %ld frame(s) recomputed in %.0f ms, largest difference "
                "%.2g (tolerance %.2g%s); none failed\n", rc->audits, rc->audit_frames, rc->audit_s * 1e3,
                rc->audit_max_diff, RING_AUDIT_TOL_OF(&rc->o), other);
        for (int s = 0; s < rc->plan.n_stages; s++) {
            if (rc->aud_where[s][0]) fprintf(stderr, "  stage %d recomputed %s\n", s + 1, rc->aud_where[s]);
        }
    }
}

int prompt_ring_generate(const prompt_opts *o, mf_model *m, k3_hparams *hp, const manifest_file *mf,
                         const tok_tokenizer *tok, spec_drafter *drafter, const spec_params *spp, const int32_t *toks,
                         size_t n_toks, prompt_out *po, gen_metrics *gm, spec_metrics *smx, cJSON **ring_json,
                         rl_err *err) {
    ring_conf conf;
    keys_identity id;
    ring_coord rc;
    if (ring_conf_load(&conf, o->ring_path, err) != 0 || keys_load(&id, o->key_path, err) != 0) return -1;
    ring_relay relay; /* before the ring opens: its nodes behind NATs wait there */
    if (ring_relay_start(&relay, o->trust.relay_listen, &conf, &id, err) != 0) return -1;
    FILE *rf = NULL;
    if (o->trust.receipts) {
        rf = fopen(o->trust.receipts, "w");
        if (!rf) {
            rl_errf(err, "cannot create %s", o->trust.receipts);
            ring_relay_stop(&relay);
            return -1;
        }
    }
    ring_opts ro = prompt_ring_opts(o, mf, rf, drafter, spp);
    ro.relay_addr = ring_relay_addr(&relay);
    if (ring_open(&rc, &conf, &id, m, hp, &ro, err) != 0) {
        if (rf) fclose(rf);
        ring_relay_stop(&relay);
        return -1;
    }
    int grc;
    if (drafter) {
        spec_ring sr = {.rc = &rc, .chunk = (uint32_t)o->chunk};
        spec_verifier v = spec_verifier_ring(&sr);
        grc = spec_run(&v, drafter, tok, toks, n_toks, &o->gp, spp, prompt_on_token, po, gm, smx, err);
    } else {
        grc = ring_generate(&rc, tok, toks, n_toks, &o->gp, prompt_on_token, po, gm, err);
    }
    if (grc == 0 && rc.o.receipts) grc = ring_receipts_finish(&rc, 10.0, err); /* the last steps' receipts */
    if (grc == 0 && o->trust.audit_rate > 0) grc = ring_audit_pending(&rc, err);
    if (grc == 0) {
        /* The speculative prediction at what ran: printed, and in --metrics-json beside it (bench_spec.sh). */
        predict_result ps;
        double a = 0;
        bool have_ps = drafter && gm->generated_tokens > 1 && prompt_ring_spec_prediction(&rc, spp, smx, gm, o, &ps, &a) == 0;
        prompt_ring_print(o, &rc, drafter != NULL, gm, spp, have_ps ? &ps : NULL, a);
        *ring_json = ring_stats_json(&rc);
        if (*ring_json && have_ps) cJSON_AddNumberToObject(*ring_json, "predicted_spec_tok_s", ps.spec_tok_s);
    }
    ring_close(&rc);
    ring_relay_stop(&relay);
    if (rf && fclose(rf) != 0 && grc == 0) grc = rl_errf(err, "cannot write %s", o->trust.receipts);
    return grc;
}
