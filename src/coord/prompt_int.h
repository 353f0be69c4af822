/* prompt_int.h - prompt_run's own functions shared by its files (prompt_run.c: the run; prompt_input.c: the
 * prompt as ids; prompt_ring.c: the run on a ring; prompt_report.c: the summary and the metrics file). Not
 * for its callers: they include prompt_run.h. */
#ifndef RINGLM_PROMPT_INT_H
#define RINGLM_PROMPT_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cJSON.h>

#include "../model/expert_cache.h"
#include "../speculate/spec_gen.h"
#include "../text/chat_out.h"
#include "../trust/manifest_file.h"
#include "prompt_run.h"

/* What the token callback needs and keeps while the text streams out. */
typedef struct prompt_out {
    bool ids;
    int n;
    /* --chat on a K3 model: the reply's channels (chat_out.h), so that the framing's section names
     * ("think", "response") are not printed as text; what is printed is serve's reasoning_content, then
     * "\n\n" where the answer begins, then its content */
    bool split_on;
    chat_split split;
    const tok_tokenizer *tok;
    chat_chan shown; /* the channel of the text printed last */
    const xc_stats *xc;  /* the engine's expert cache, if it has one */
    xc_stats xc_prefill; /* its counters when the first token came out: what prefill read */
    bool got_first;
} prompt_out;

/* prompt_run.c: the gen_token_cb that prints each token (user: a prompt_out). */
int prompt_on_token(void *user, int32_t id, const char *text, size_t len);

/* prompt_input.c: the prompt as token ids: o->tokens as given (checked against the vocabulary), or o->prompt
 * encoded, wrapped in the model's chat format with o->chat (*text: the rendered chat, the caller frees it;
 * po's channel split is set up for it). */
int prompt_input_encode(const prompt_opts *o, const mf_model *m, const k3_hparams *hp, const tok_tokenizer *tok,
                        int32_t **toks, size_t *n_toks, char **text, prompt_out *po, rl_err *err);

/* prompt_ring.c: the generation over the ring: open it, generate (speculating when drafter is not NULL),
 * check the last receipts and run the audits drawn, print its per-stage table, close it. mf: the manifest
 * (o->manifest) or NULL; *ring_json: its statistics for the metrics file (the caller owns them). */
int prompt_ring_generate(const prompt_opts *o, mf_model *m, k3_hparams *hp, const manifest_file *mf,
                         const tok_tokenizer *tok, spec_drafter *drafter, const spec_params *spp, const int32_t *toks,
                         size_t n_toks, prompt_out *po, gen_metrics *gm, spec_metrics *smx, cJSON **ring_json,
                         rl_err *err);

/* prompt_report.c: the summary lines on stderr after the text: timings, speculation (smx, or NULL), the
 * expert cache (po->xc; e and m then describe it). */
void prompt_report_print(const prompt_opts *o, const gen_metrics *gm, const spec_metrics *smx, const prompt_out *po,
                         const mf_model *m, const k3_engine *e);
/* The metrics file (--metrics-json): ring (its statistics, or NULL) is taken over whatever happens. */
int prompt_report_write(const char *path, const gen_metrics *m, cJSON *ring, const spec_metrics *sm,
                        const prompt_out *po, rl_err *err);

#endif
