#include "reap_job.h"
#include "../base/clock.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../gguf/gguf_write.h"
#include "../text/chat.h"
#include "../text/tokenizer.h"
#include "reap_run.h"
#include "reap_write.h"

/* Experts kept when a fraction of E is pruned: E minus the nearest whole number of experts. */
static uint32_t rj_keep_for(uint32_t E, double frac) {
    long pruned = lround(frac * (double)E);
    return (uint32_t)((long)E - pruned);
}

static int rj_same_file(const char *a, const char *b) {
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

/* A model with its engine, for the report. */
typedef struct rj_model {
    mf_model m;
    k3_hparams hp;
    k3_engine e;
    bool open, eng;
} rj_model;

static int rj_model_open(rj_model *r, const char *path, const k3_engine_opts *eo, rl_err *err) {
    memset(r, 0, sizeof *r);
    if (k3_open(&r->m, &r->hp, path, err) != 0) return -1;
    r->open = true;
    if (k3_engine_init(&r->e, &r->m, &r->hp, 0, r->hp.n_layer, eo, err) != 0) return -1;
    r->eng = true;
    return 0;
}

static void rj_model_close(rj_model *r) {
    if (r->eng) k3_engine_free(&r->e);
    if (r->open) mf_close(&r->m);
    memset(r, 0, sizeof *r);
}

/* The quality report: the reference against pruned copies at the chosen count and at 0/25/50/75%. */
static int rj_report(const reap_job *j, const mf_model *m, const k3_hparams *hp, const reap_stats *s,
                     const uint8_t *prot, uint32_t keep, const tok_tokenizer *tok, const chat_format *fmt, rl_err *err) {
    calib_set h;
    if (calib_load(&h, "held-out", j->eval, j->n_eval, tok, fmt, j->ctx, 0, err) != 0) return -1;
    const double fracs[] = {0.0, 0.25, 0.5, 0.75};
    uint32_t keeps[5];
    int nk = 0;
    keeps[nk++] = keep;
    for (int i = 0; i < 4; i++) {
        uint32_t k = rj_keep_for(hp->n_expert, fracs[i]);
        bool dup = false;
        for (int q = 0; q < nk; q++) dup |= keeps[q] == k;
        if (!dup && k >= hp->n_expert_used) keeps[nk++] = k;
    }
    /* The pruned copies are whole model files: $TMPDIR names a disk with room for them. */
    const char *td = getenv("TMPDIR");
    char dir[512];
    snprintf(dir, sizeof dir, "%s/ringlm-reap-XXXXXX", td && *td ? td : "/tmp");
    if (!mkdtemp(dir)) {
        calib_free(&h);
        return rl_errf(err, "cannot make a temporary directory: %s", strerror(errno));
    }
    rj_model ref, cand[5];
    memset(cand, 0, sizeof cand);
    k3_engine *ce[5];
    reap_quality q[5], rq;
    char paths[5][600];
    memset(paths, 0, sizeof paths);
    int rc = rj_model_open(&ref, j->model, &j->eng, err), n_open = 0;
    for (int i = 0; i < nk && rc == 0; i++) {
        reap_plan p;
        snprintf(paths[i], sizeof paths[i], "%s/keep%u.gguf", dir, keeps[i]);
        rc = reap_plan_make(&p, s, keeps[i], j->freq, keeps[i] == keep ? prot : NULL, err);
        reap_write_opts wo = {.out = paths[i], .n_split = 1};
        if (rc == 0) rc = reap_write(m, hp, &p, &wo, err);
        reap_plan_free(&p);
        if (rc == 0) rc = rj_model_open(&cand[i], paths[i], &j->eng, err);
        if (rc == 0) ce[n_open++] = &cand[i].e;
    }
    if (rc == 0) rc = reap_eval(&ref.e, ce, n_open, &h, j->chunk < 128 ? j->chunk : 128, q, &rq, j->progress, err);
    if (rc == 0) {
        FILE *f = fopen(j->report, "w");
        if (!f) {
            rc = rl_errf(err, "cannot create %s: %s", j->report, strerror(errno));
        } else {
            fprintf(f, "# REAP pruning report\n\n");
            fprintf(f, "Model `%s`: %u routed experts per MoE layer, %u chosen per token, %u MoE layers.\n", j->model,
                    hp->n_expert, hp->n_expert_used, s->n_layers);
            fprintf(f, "Saliency: %s, from %llu calibration tokens%s.\n",
                    j->freq ? "frequency-weighted (sum over routed tokens of gate weight x ||expert output||)"
                            : "REAP (mean over routed tokens of gate weight x ||expert output||)",
                    (unsigned long long)s->tokens, j->scores_in ? " (read from the scores file)" : "");
            fprintf(f, "Held-out text: %llu predicted positions in %d sequences of at most %u tokens",
                    (unsigned long long)rq.n, h.n_seq, j->ctx);
            fprintf(f, " (%d file%s, not the calibration text).\n\n", j->n_eval, j->n_eval > 1 ? "s" : "");
            fprintf(f, "Each row is a pruned model written to disk and run: top-1 agreement of its next-token argmax with "
                       "the unpruned model's, mean KL divergence KL(unpruned || pruned) in nats, and perplexity of the "
                       "held-out tokens (unpruned: %.4f).\n\n", rq.ppl);
            fprintf(f, "| pruned | experts kept | top-1 agreement | mean KL (nats) | perplexity | perplexity / unpruned |\n");
            fprintf(f, "|---|---|---|---|---|---|\n");
            /* Rows by experts kept, most first. */
            int order[5];
            for (int i = 0; i < n_open; i++) order[i] = i;
            for (int a = 0; a < n_open; a++) {
                for (int b = a + 1; b < n_open; b++) {
                    if (keeps[order[b]] > keeps[order[a]]) {
                        int t = order[a];
                        order[a] = order[b];
                        order[b] = t;
                    }
                }
            }
            for (int oi = 0; oi < n_open; oi++) {
                int i = order[oi];
                fprintf(f, "| %.1f%%%s | %u of %u | %.4f | %.6f | %.4f | %.4f |\n",
                        100.0 * (double)(hp->n_expert - keeps[i]) / (double)hp->n_expert, i == 0 ? " (chosen)" : "",
                        keeps[i], hp->n_expert, q[i].agree, q[i].kl, q[i].ppl, q[i].ppl / rq.ppl);
            }
            if (fclose(f) != 0) rc = rl_errf(err, "cannot write %s", j->report);
        }
    }
    for (int i = 0; i < nk; i++) {
        rj_model_close(&cand[i]);
        if (paths[i][0]) remove(paths[i]);
    }
    rj_model_close(&ref);
    rmdir(dir);
    calib_free(&h);
    return rc;
}

int reap_job_run(const reap_job *j, rl_err *err) {
    /* The request itself. */
    if ((j->n_calib > 0) == (j->scores_in != NULL)) {
        return rl_errf(err, "give calibration text (--calib) or a scores file to prune from (--scores without --calib)");
    }
    const bool want_plan = j->out || j->report;
    if (want_plan && (j->keep > 0) == (j->prune > 0)) return rl_errf(err, "give one of --keep N and --prune FRACTION");
    if (j->prune != 0 && !(j->prune > 0 && j->prune < 1)) {
        return rl_errf(err, "--prune %g: the fraction pruned must be in (0, 1)", j->prune);
    }
    if (!want_plan && !j->scores_out) return rl_errf(err, "nothing to do: give -o, --report or --scores");
    if (j->report && j->n_eval < 1) return rl_errf(err, "--report needs held-out text (--eval FILE)");
    if (j->out && rj_same_file(j->out, j->model)) return rl_errf(err, "-o %s is the input model", j->out);
    /* Outputs whose folder cannot take them fail now, not after the calibration. */
    const char *outs[3] = {j->out, j->scores_out, j->report};
    for (int i = 0; i < 3; i++) {
        if (!outs[i]) continue;
        char dir[4096];
        snprintf(dir, sizeof dir, "%s", outs[i]);
        char *slash = strrchr(dir, '/');
        if (slash) *(slash == dir ? slash + 1 : slash) = 0;
        else snprintf(dir, sizeof dir, ".");
        if (access(dir, W_OK) != 0) return rl_errf(err, "cannot write %s: %s: %s", outs[i], dir, strerror(errno));
    }

    mf_model m;
    k3_hparams hp;
    tok_tokenizer tok;
    memset(&tok, 0, sizeof tok);
    bool tok_ok = false;
    calib_set c;
    memset(&c, 0, sizeof c);
    reap_stats s;
    memset(&s, 0, sizeof s);
    reap_plan plan;
    memset(&plan, 0, sizeof plan);
    uint8_t *prot = NULL;
    if (k3_open(&m, &hp, j->model, err) != 0) return -1;
    int rc = -1;
    chat_format fmt = CHAT_FMT_K3;
    if (hp.n_layer <= hp.n_dense_lead) {
        rl_errf(err, "%s has no MoE layer (%u dense layers of %u): nothing to prune", j->model, hp.n_dense_lead, hp.n_layer);
        goto done;
    }
    uint32_t keep = j->keep ? j->keep : rj_keep_for(hp.n_expert, j->prune);
    if (want_plan && keep < hp.n_expert_used) {
        rl_errf(err, "keeping %u of %u experts: fewer than the %u the router uses per token", keep, hp.n_expert,
                hp.n_expert_used);
        goto done;
    }
    if (want_plan && keep > hp.n_expert) {
        rl_errf(err, "keeping %u experts: the model has %u", keep, hp.n_expert);
        goto done;
    }
    {
        reap_plan all;
        if (reap_plan_all(&all, &hp, err) != 0) goto done;
        reap_write_opts wo = {.out = "-", .check_only = true};
        int crc = reap_write(&m, &hp, &all, &wo, err);
        reap_plan_free(&all);
        if (crc != 0) goto done;
    }
    if (tok_load(&tok, &m, err) != 0) goto done;
    tok_ok = true;
    /* The template matters only for JSONL chats (calib.h): a model whose template ringlm does not render can
     * still be calibrated on text. */
    rl_err tmpl_err;
    const bool have_fmt = chat_detect_model(&m, &fmt, &tmpl_err) == 0;
    const chat_format *fmtp = have_fmt ? &fmt : NULL;

    if (j->report) { /* the held-out files are read again for the report; fail on them now, not after */
        calib_set h;
        if (calib_load(&h, "held-out", j->eval, j->n_eval, &tok, fmtp, j->ctx, 1, err) != 0) goto done;
        calib_free(&h);
    }
    /* Scores: calibrate, or read them. */
    double t0 = rl_clock_now(), secs = 0;
    if (j->scores_in) {
        if (reap_stats_read_json(&s, j->scores_in, err) != 0) goto done;
        if (s.n_expert != hp.n_expert || s.k != hp.n_expert_used || s.layer0 != hp.n_dense_lead ||
            s.layer0 + s.n_layers != hp.n_layer) {
            rl_errf(err, "%s: scores for %u experts (top-%u) over layers %u..%u do not fit %s (%u, top-%u, %u..%u)",
                    j->scores_in, s.n_expert, s.k, s.layer0, s.layer0 + s.n_layers - 1, j->model, hp.n_expert,
                    hp.n_expert_used, hp.n_dense_lead, hp.n_layer - 1);
            goto done;
        }
    } else {
        if (calib_load(&c, "calibration", j->calib, j->n_calib, &tok, fmtp, j->ctx, j->max_tokens, err) != 0) goto done;
        if (reap_stats_init(&s, &hp, 0, hp.n_layer, err) != 0) goto done;
        if (j->score) {
            if (j->score(j->score_ctx, &c, j->chunk, &s, err) != 0) goto done;
        } else {
            k3_engine e;
            if (k3_engine_init(&e, &m, &hp, 0, hp.n_layer, &j->eng, err) != 0) goto done;
            int src = reap_score_local(&e, &c, j->chunk, &s, j->progress, err);
            k3_engine_free(&e);
            if (src != 0) goto done;
        }
        secs = rl_clock_now() - t0;
        printf("reap: scored %llu tokens (%d sequences) on %s in %.2f s: %.1f tokens/s\n", (unsigned long long)s.tokens,
               c.n_seq, j->where ? j->where : "this machine", secs, secs > 0 ? (double)s.tokens / secs : 0.0);
    }
    if (j->scores_out) {
        if (reap_stats_write_json(&s, j->model, j->scores_out, err) != 0) goto done;
        printf("reap: scores of %u layers x %u experts written to %s\n", s.n_layers, s.n_expert, j->scores_out);
    }
    if (want_plan) {
        if (j->protect && reap_protect_parse(j->protect, &s, &prot, err) != 0) goto done;
        if (reap_plan_make(&plan, &s, keep, j->freq, prot, err) != 0) goto done;
    }
    if (j->out) {
        reap_write_opts wo = {.out = j->out, .n_split = j->n_split, .progress = j->progress};
        if (reap_write(&m, &hp, &plan, &wo, err) != 0) goto done;
        size_t pruned_bytes = 0;
        for (int i = 0; i < m.n_tensor; i++) {
            const mf_tensor *t = &m.tensors[i];
            pruned_bytes += strstr(t->name, "_exps.weight") ? t->nbytes / hp.n_expert * keep : t->nbytes;
        }
        int ns = wo.n_split > 0 ? wo.n_split : m.n_split;
        printf("reap: kept %u of %u experts in each of %u MoE layers; wrote %s%s (%.1f MiB of tensors, was %.1f MiB)\n",
               keep, hp.n_expert, plan.n_layers, j->out, ns > 1 ? " as a split set" : "",
               (double)pruned_bytes / 1048576.0, (double)m.tensor_bytes / 1048576.0);
    }
    if (j->report) {
        if (rj_report(j, &m, &hp, &s, prot, keep, &tok, fmtp, err) != 0) goto done;
        printf("reap: report written to %s\n", j->report);
    }
    rc = 0;
done:
    free(prot);
    reap_plan_free(&plan);
    reap_stats_free(&s);
    calib_free(&c);
    if (tok_ok) tok_free(&tok);
    mf_close(&m);
    return rc;
}
