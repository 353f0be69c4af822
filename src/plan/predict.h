/* predict.h - what a planned ring will do, from its plan, the model's sizes and the nodes' figures
 * (`ringlm plan --nodes`; docs/plan.md states the model and its assumptions).
 *
 * A traversal carrying t tokens per sequence costs, per stage, bytes(t) / speed + flops(t) / compute (reads
 * and arithmetic do not overlap: what CPU nodes measure, bench/bench_plan.sh; on a GPU the second term is
 * small at decode): bytes(t) reads the dense weights and the routed experts that t tokens touch,
 * E * (1 - (1 - k/E)^t) of E (each token picks k, independently), and flops(t) = 2 * t * the weights a
 * token multiplies; per hop, the one-way delay plus the boundary state's bytes over the slower of the two
 * links. A product of c columns (c = t for a dense matrix, t k / touched experts for an expert's) reads its
 * weights min(c, col_reads) times: on a GPU once (col_reads 1), on a CPU up to PREDICT_CPU_COL_READS times -
 * ggml's CPU kernels multiply fewer than 4 columns one at a time, each a matrix-vector product streaming
 * the weights again, and share a read among 4 columns only from 4 on (a 4-stream step costs about 4
 * decode steps there: bench/results/plan-sweep.md). Then
 *   decode (greedy)       1 / (sum of hops + sum of stages(1) + transfers)
 *   speculative           g / T, T the same at t = k + 1 (a verified block: each column computed as a
 *                          one-token step computes it, for the same bits, so on a CPU reading the weights
 *                          k + 1 times) plus drafting k, g = (1 - a^(k+1)) / (1 - a) tokens
 *                          per block at acceptance a, k drafted (chosen to maximize it when not given), one
 *                          block in flight; with D > 1 blocks in flight (run's --draft-depth), once a block
 *                          is likely to stand whole (q = a^(k+1) >= 0.25, as spec_gen.c decides), the next
 *                          is already on its way: g / ((1 - q) T + q I), I = max(T / D', the slowest stage,
 *                          drafting k + 1) the interval between pipelined blocks, D' <= D the blocks in
 *                          flight run's adaptive depth keeps: one more goes ahead only while every block in
 *                          flight is likely to stand, q^n >= 0.25 for n of them; over a reply of N tokens
 *                          (predict_opts.gen) the first block costs T, the N / g - 1 after it (1 - q) T + q I
 *   time to first token   the prompt in chunks, pipelined: one trip at the chunk size plus (chunks - 1) times
 *                          the slowest stage; stages on one host (predict_node.host) compute at most host_slots
 *                          chunks at once, the others waiting for a slot
 *   aggregate, N streams  N / (one traversal at t = N): every step one frame carrying every stream
 *   network floor         1 / sum of hop delays (g / that with speculation): no compute at all
 * On a node with a device and RAM, a stage's time is its device part's (at the device's figures) plus its
 * RAM part's (at the CPU's): the two run one after the other within a traversal.
 */
#ifndef RINGLM_PREDICT_H
#define RINGLM_PREDICT_H

#include <stdbool.h>
#include <stdint.h>

#include "../base/err.h"
#include "../gguf/model_file.h"
#include "../model/k3_hparams.h"
#include "plan.h"

/* ggml's CPU matrix kernels: below 4 columns, one matrix-vector product per column (predict.c). */
#define PREDICT_CPU_COL_READS 4.0

typedef struct predict_node {
    double speed;  /* bytes of weights read per second in a decode step (effective) */
    double flops;  /* FLOP/s in a prefill chunk (effective) */
    double net;    /* link bytes per second */
    double disk;   /* bytes per second of routed experts read from disk (stages whose experts do not all fit) */
    double col_reads; /* a product of c columns reads its weights min(c, col_reads) times (0: once, a GPU;
                       * PREDICT_CPU_COL_READS on a CPU); the RAM part of a two-tier node is a CPU's */
    /* A node with a device and RAM (plan_node.ram_bytes): the above are the device's, these the CPU's over
     * what its stage keeps in RAM (plan_stage.dev_layers, cpu_moe). */
    bool two_tier;
    double ram_speed, ram_flops;
    /* Nodes on one machine (nodes.conf host=): host > 0 numbers it, and host_slots is how many of its nodes
     * can compute at once at their own figures (its cores over their threads). Only a pipelined prompt runs
     * several stages at once, so only the time to first token depends on it. host 0: a machine of its own. */
    int host, host_slots;
} predict_node;

/* A draft model's cost on the coordinator. A K3 draft drafts k tokens in k steps of one token, and one more
 * when the whole block was accepted (the last drafted token is fed before the bonus token: src/speculate/
 * drafter.c), k + a^k steps on average; a DSpark or DFlash draft (`dflash`) drafts the block in one pass of
 * k tokens. */
typedef struct predict_draft {
    double bytes;  /* weights one step reads (a K3 draft's experts at k/E) */
    double elems;  /* weights one token multiplies */
    bool block;    /* one pass drafts the block */
    predict_node node;  /* the coordinator's figures (speed, flops; net unused) */
} predict_draft;

typedef struct predict_opts {
    uint32_t prompt, chunk, parallel;
    int draft_k;       /* drafted tokens per traversal (0: choose 1..16) */
    double acceptance; /* per drafted token, 0..1 (0: no speculation figures) */
    int draft_depth;   /* blocks in flight (0 or 1: one) */
    predict_draft draft;    /* bytes == 0: drafting is free (an n-gram drafter, or not known) */
    double draft_block_s;   /* > 0: drafting a block takes this long (measured: run's prediction after the
                             * fact), whatever draft says */
    uint32_t gen;           /* > 0: a reply of this many tokens: the pipeline of blocks fills once, the first
                             * block costs its whole traversal (0: the steady state, a long reply) */
} predict_opts;

/* A draft file's predict_draft bytes and elems (node left zero): architecture `k3` (a K3 draft) or `dflash`,
 * whose LM head is the target's (`target`, may be NULL when the draft holds its own). */
int predict_draft_read(predict_draft *d, const mf_model *draft, const mf_model *target, rl_err *err);
/* Seconds the coordinator drafts k tokens in at acceptance a, on average (0 when d->bytes == 0). */
double predict_draft_time(const predict_draft *d, int k, double a);

typedef struct predict_result {
    double hops_s, compute_s, xfer_s;  /* one greedy traversal's parts */
    double disk_s;                     /* ... and its experts read from disk (stages that do not fit) */
    double greedy_tok_s;
    int draft_k;
    double g, spec_tok_s;
    double draft_s;                   /* drafting those draft_k tokens */
    double block_s;                   /* T: one block's traversal plus its drafting */
    double interval_s;                /* I: between pipelined blocks (0: not pipelined) */
    double ttft_s, prefill_tok_s;
    double parallel_tok_s;
    double floor_tok_s, spec_floor_tok_s;
    const char *dominant;             /* "hops", "compute" or "bandwidth" */
    double stage_s[PLAN_MAX_NODES];   /* per stage, one token */
} predict_result;

/* Fits a node's figures (nd: speed and flops, and ram_speed / ram_flops on a two-tier node) to its stage's
 * own timed traversals: sec[i] seconds for tokens[i] tokens (n of them, at most 8; node.c times a scratch
 * sequence at ASSIGN). The stage's predicted time is reading R / speed plus multiplying M / flops; the fit
 * scales the two by factors alpha and beta (least squares on relative errors), or by one factor for both
 * when the frames cannot tell them apart. -1 (nd unchanged) for a stage reading experts from disk, or
 * times that are not positive. Why: the nodes' probes time one q8_0 product, not the model's ops, and a
 * ring's printed prediction from them was 37-49% fast (docs/plan.md). */
int predict_stage_calibrate(const mf_model *m, const k3_hparams *hp, const plan_stage *st, predict_node *nd, const double *tokens,
                       const double *sec, int n);

/* nodes[] and hop_s[] in plan order: hop_s[0] coordinator -> stage 0, hop_s[s] stage s-1 -> s, hop_s[n_stages]
 * last stage -> coordinator; nodes[s] the node running stage s. */
int predict_predict(const mf_model *m, const k3_hparams *hp, const plan_result *plan, const predict_node *nodes,
               const double *hop_s, const predict_opts *o, predict_result *r, rl_err *err);

#endif
