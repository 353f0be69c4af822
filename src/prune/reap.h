/* Folder src/prune/: expert pruning (REAP): routing statistics and saliency scores, the choice of experts
 * to keep, the expert-slicing GGUF writer, calibration text, scoring runs and the quality report. May
 * include: base, gguf, model, text. (README "Layout"; tests/t_layout.sh checks both.)
 */
/* reap.h - REAP saliency ("Router-weighted Expert Activation Pruning", Cerebras) from what K3's routers do.
 *
 * For each routed expert j of each MoE layer, over the calibration tokens routed to j:
 *   S_j = mean over those tokens of g_j(x) * ||f_j(x)||_2
 * g_j the gate weight the layer gives j (K3's own: sigmoid scores, top-k chosen with exp_probs_b, weights
 * unbiased, renormalized and scaled), f_j(x) the expert's output in the space it writes: the latent space
 * of the latent MoE (r_e of docs/k3-spec.md §5.5, before the weighted sum, the routed norm and the up-projection).
 * Only the experts the router chose are run: the statistics come from an ordinary forward pass
 * (k3_batch.routes). The reference code (CerebrasResearch/reap, observer.py) instead runs every expert on
 * every token and keeps the chosen ones, takes its gate values as a softmax of the router logits and
 * chooses the top-k without a selection bias: for K3's sigmoid router with exp_probs_b those would be
 * other experts and other weights than the model uses, so the scores here are the model's.
 *
 * The frequency-weighted variant sums instead of averaging (an expert used rarely scores low). Statistics
 * are sums, so stages that score disjoint layer ranges add up to one machine's (reap_stats_add). */
#ifndef RINGLM_REAP_H
#define RINGLM_REAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/err.h"
#include "../model/k3_forward.h"
#include "../model/k3_hparams.h"

typedef struct reap_stats {
    uint32_t n_expert, k;
    uint32_t layer0, n_layers; /* the MoE layers covered: layer0 .. layer0 + n_layers - 1 */
    uint64_t tokens;           /* calibration tokens seen (per layer: every token passes every layer) */
    uint64_t *count;           /* [n_layers][n_expert]: tokens routed to the expert */
    double *sum_gn;            /* sum of g * ||f|| */
    double *sum_g;             /* sum of g (weighted frequency) */
    double *sum_n;             /* sum of ||f|| */
} reap_stats;

/* Statistics for the MoE layers of [a, b) (none if the range has no MoE layer). */
int reap_stats_init(reap_stats *s, const k3_hparams *hp, uint32_t a, uint32_t b, rl_err *err);
void reap_stats_free(reap_stats *s);
/* Adds a batch's routing (k3_output.routes of the same range, or of a part of it: a ring stage's layers;
 * the tokens are counted by the part that starts at layer0). */
int reap_stats_add(reap_stats *s, const k3_routes *r, rl_err *err);
/* S_j of layer index l (0-based from layer0): the mean, or with freq the sum; 0 for an expert never routed. */
double reap_score(const reap_stats *s, uint32_t l, uint32_t j, bool freq);

/* The scores file (JSON): every layer's per-expert saliency, counts and sums, enough to prune again
 * without calibrating (the sums are written with round-trip precision). */
int reap_stats_write_json(const reap_stats *s, const char *model_name, const char *path, rl_err *err);
int reap_stats_read_json(reap_stats *s, const char *path, rl_err *err);

/* Which experts each MoE layer keeps: n_keep ids per layer, ascending (the order they keep in the file). */
typedef struct reap_plan {
    uint32_t n_expert, n_keep;
    uint32_t layer0, n_layers;
    uint32_t *keep; /* [n_layers][n_keep] */
} reap_plan;

/* Keeps the n_keep highest-scoring experts of every layer (ties: the more often routed, then the lower
 * id); protect (NULL or [n_layers][n_expert] flags) experts are kept whatever their score. Errors: fewer
 * than the router's k, more than there are, more protected than kept. */
int reap_plan_make(reap_plan *p, const reap_stats *s, uint32_t n_keep, bool freq, const uint8_t *protect,
                   rl_err *err);
/* Keeps every expert of every MoE layer of the model (0% pruned): for comparisons and checks. */
int reap_plan_all(reap_plan *p, const k3_hparams *hp, rl_err *err);
void reap_plan_free(reap_plan *p);

/* Parses --protect: comma-separated "E" (expert E of every MoE layer) or "L:E" (of layer L) into the flags
 * reap_plan_make takes (malloc'ed, [n_layers][n_expert]). */
int reap_protect_parse(const char *list, const reap_stats *s, uint8_t **flags, rl_err *err);

#endif
