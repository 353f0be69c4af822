/* `ringlm run`'s generation (prompt_run.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "prompt_int.h"
#include "target.h"

int prompt_on_token(void *user, int32_t id, const char *text, size_t len) {
    prompt_out *o = user;
    if (!o->got_first && o->xc) o->xc_prefill = *o->xc;
    o->got_first = true;
    if (o->ids) {
        if (id >= 0) printf("%s%d", o->n++ ? "," : "", id);
    } else {
        /* id -1: text held back for a whole UTF-8 sequence, flushed at the end: the channel printed last */
        chat_chan ch = !o->split_on ? CHAT_CH_CONTENT : id >= 0 ? chat_split_push(&o->split, o->tok, id) : o->shown;
        if (ch != CHAT_CH_NONE && len) {
            if (ch == CHAT_CH_CONTENT && o->shown == CHAT_CH_REASONING) fputs("\n\n", stdout);
            fwrite(text, 1, len, stdout);
            o->shown = ch;
        }
    }
    fflush(stdout);
    return 0;
}

/* The generation on this machine: a whole-model engine (*have_engine once it exists, the caller frees it),
 * verifying drafter's drafts when it is not NULL. */
static int prompt_local_generate(const prompt_opts *o, mf_model *m, k3_hparams *hp, const tok_tokenizer *tok,
                                 spec_drafter *drafter, const spec_params *spp, const int32_t *toks, size_t n_toks,
                                 prompt_out *po, k3_engine *e, bool *have_engine, gen_metrics *gm, spec_metrics *smx,
                                 rl_err *err) {
    k3_engine_opts eo = o->eo;
    eo.n_threads = o->threads;
    eo.progress = o->progress;
    if (k3_engine_init(e, m, hp, 0, hp->n_layer, &eo, err) != 0) return -1;
    *have_engine = true;
    if (e->hp.n_dev > 0) {
        char where[512];
        k3_engine_describe(e, where, sizeof where);
        fprintf(stderr, "[ringlm] computing on %s\n", where);
    }
    po->xc = k3_engine_cache_stats(e);
    k3_weights_prefault(&e->w, o->progress && m->tensor_bytes > (64u << 20));
    if (!drafter) return gen_run(e, tok, toks, n_toks, &o->gp, prompt_on_token, po, gm, err);
    spec_local sl = {.e = e, .n_ctx = (uint32_t)o->ctx, .chunk = (uint32_t)o->chunk};
    spec_verifier v = spec_verifier_local(&sl);
    return spec_run(&v, drafter, tok, toks, n_toks, &o->gp, spp, prompt_on_token, po, gm, smx, err);
}

int prompt_run(const prompt_opts *o, rl_err *err) {
    mf_model m;
    k3_hparams hp;
    manifest_file mf;
    k3_engine e;
    tok_tokenizer tok;
    int32_t *toks = NULL;
    size_t n_toks = 0;
    char *text = NULL;
    int rc = -1;
    bool have_tok = false, have_engine = false;
    if (ring_target_open(o->model, o->manifest, &m, &hp, &mf, err) != 0) return -1;
    if (tok_load(&tok, &m, err) != 0) goto out;
    have_tok = true;
    for (int i = 0; i < o->gp.smp.n_bias; i++) {
        if ((uint32_t)o->gp.smp.bias[i].id >= hp.n_vocab) {
            rl_errf(err, "--logit-bias: token id %d out of range (vocabulary %u)", o->gp.smp.bias[i].id, hp.n_vocab);
            goto out;
        }
    }
    prompt_out po = {.ids = o->ids, .shown = CHAT_CH_NONE};
    if (prompt_input_encode(o, &m, &hp, &tok, &toks, &n_toks, &text, &po, err) != 0) goto out;
    gen_metrics gm;
    cJSON *ring_json = NULL;
    spec_metrics smx;
    bool spec = o->draft && strcmp(o->draft, "none") != 0;
    spec_drafter drafter;
    memset(&drafter, 0, sizeof drafter);
    if (spec && spec_drafter_open(&drafter, o->draft, &m, &hp, (uint32_t)o->ctx, o->threads, &o->gp.smp, err) != 0) goto out;
    drafter.min_conf = o->draft_p_min;
    spec_params spp = {.k_max = o->draft_n, .adaptive = !o->draft_fixed, .depth = o->draft_depth,
                       .no_fallback = o->draft_no_fallback};
    int grc;
    if (o->ring_path) {
        grc = prompt_ring_generate(o, &m, &hp, o->manifest ? &mf : NULL, &tok, spec ? &drafter : NULL, &spp, toks,
                                   n_toks, &po, &gm, &smx, &ring_json, err);
    } else {
        grc = prompt_local_generate(o, &m, &hp, &tok, spec ? &drafter : NULL, &spp, toks, n_toks, &po, &e,
                                    &have_engine, &gm, &smx, err);
    }
    if (spec) spec_drafter_close(&drafter);
    if (grc != 0) goto out;
    printf(o->ids ? "\n" : "");
    fflush(stdout);
    prompt_report_print(o, &gm, spec ? &smx : NULL, &po, &m, &e);
    if (o->metrics && prompt_report_write(o->metrics, &gm, ring_json, spec ? &smx : NULL, &po, err) != 0) goto out;
    if (!o->metrics) cJSON_Delete(ring_json);
    rc = 0;
out:
    if (have_engine) k3_engine_free(&e);
    if (have_tok) tok_free(&tok);
    ring_target_close(&m, &mf);
    free(toks);
    free(text);
    return rc;
}
