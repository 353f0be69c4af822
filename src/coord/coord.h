/* Folder src/coord/: the coordinator: a ring opened over its nodes, sequences driven through it, receipts
 * checked, audits (recomputing a stage: audit.c), the ring's speculative verifier, REAP scoring through the
 * ring, the model a coordinator works on (its file or manifest), `ringlm run`'s generation (prompt_run). May
 * include: base, device, gguf, model, text, gen, speculate, wire, exec, trust, prune, net, plan. (README
 * "Layout"; tests/t_layout.sh checks both.)
 */
/* coord.h - the coordinator: plans the ring, assigns layer ranges, drives sequences through it.
 *
 * Data path: coordinator -> stage 0 -> ... -> last stage -> coordinator (the last stage answers directly,
 * over the coordinator's own connection to it). Liveness: every node is pinged each second while a
 * request waits; a node silent for `dead_s` fails the request with its name, and any node's ERROR fails
 * it with the node's message. Nothing waits forever. */
#ifndef RINGLM_COORD_H
#define RINGLM_COORD_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "../base/err.h"
#include "../gen/generate.h"
#include "../gguf/model_file.h"
#include "../model/k3_hparams.h"
#include "../text/tokenizer.h"
#include "../prune/calib.h"
#include "../prune/reap.h"
#include "audit.h"
#include "../trust/keys.h"
#include "../trust/ledger.h"
#include "../trust/manifest_file.h"
#include "../trust/receipt.h"
#include "../wire/frame.h"
#include "../plan/plan.h"
#include "../net/zsock.h"

typedef struct ring_node_conf {
    char addr[128];  /* HOST:PORT, or "relay:HOST:PORT/<key's first 8 hex>" for a node reached through a relay */
    keys_peer key;
    double mem_gb;   /* optional cap from ring.conf (0 = what the node reports) */
    bool standby;    /* `standby`: kept out of plans while every other node is there; stands in for one lost */
} ring_node_conf;

typedef struct ring_conf {
    int n;
    ring_node_conf nodes[PLAN_MAX_NODES];
} ring_conf;

/* The relay a coordinator runs for ring.conf's nodes behind NATs (run/serve --relay-listen HOST:PORT): they
 * dial out to it (`ringlm node --dial`), ring.conf writes them relay:HOST:PORT, and it admits ring.conf's keys
 * only. listen NULL: none (0). conf must outlive it. */
typedef struct ring_relay {
    tn_relay *relay;
    const ring_conf *conf;
    uint8_t coord_pk[32]; /* a join token a node presents must be this coordinator's (trust/join_token.h) */
} ring_relay;
/* r must stay where it is until ring_relay_stop (the relay's threads read it). */
int ring_relay_start(ring_relay *r, const char *listen, const ring_conf *conf, const keys_identity *id, rl_err *err);
void ring_relay_stop(ring_relay *r);
const char *ring_relay_addr(const ring_relay *r); /* where it listens (NULL: none) */
/* A node behind a relay (its ring.conf address relay:...): asks the relay whether the node is there (a
 * connection of it waiting, heard from lately): 0, or -1 with err saying why not. 1: not a relayed node. */
int ring_relay_query(const ring_node_conf *nc, double timeout_s, rl_err *err);

/* How ring.conf's node i is reached (docs/ring.md, "Behind a NAT"): listening where it is (direct); dialled out to
 * this coordinator's relay (own_relay: its address, or NULL), whose link to it is then the node's own
 * connection; or dialled out to another relay (a public node's: by = that node's index in conf, else -1),
 * which every link to it crosses (+1 hop). via: the relay's HOST:PORT ("" when direct). */
typedef enum { RING_REACH_DIRECT, RING_REACH_DIALOUT, RING_REACH_RELAYED } ring_reach_kind;
ring_reach_kind ring_reach(const ring_conf *conf, int i, const char *own_relay, char *via, size_t via_n, int *by);
const char *ring_reach_name(ring_reach_kind k); /* "direct", "dial-out", "relayed" */
/* The address this coordinator dials node i at: ring.conf's, except for a node that dialled out to our own
 * relay, reached at that relay's own socket (loopback when it listens on every address), not through the
 * public address ring.conf names, which a coordinator behind a forwarded port may not reach from inside. */
void ring_dial_addr(const ring_conf *conf, int i, const char *own_relay, char *out, size_t n);

/* Does a coordinator's message name node address addr, as a whole token ("127.0.0.1:80" is not named by
 * "127.0.0.1:8080")? Which node a failure is blamed on (serve's ring backend, run --ring's recovery). */
bool ring_names(const char *msg, const char *addr);

/* ring.conf: one node per line, "HOST:PORT PUBLIC_KEY_HEX [mem=GB] [standby]"; '#' starts a comment. A node
 * behind a NAT that dials out to a relay is "relay:RELAY_HOST:PORT PUBLIC_KEY_HEX ..." (docs/ring.md). */
int ring_conf_load(ring_conf *c, const char *path, rl_err *err);

/* Deadlines (frame.h budget_ms): a traversal has max(RING_DL_MIN_S, RING_DL_MULT x the compute the frames in
 * flight, itself included, are expected to cost the stages, + twice the hops' measured delays). A stage that
 * makes no progress while its link stays up (a hung GPU, a swap storm: its heartbeats still answer) is then
 * called out within seconds, not after --node-timeout (default 60 s): the coordinator names the node that has
 * not answered its pings the longest. No deadline while a stage's costs are unknown (before its first frame)
 * or when the budget would reach --node-timeout. */
#define RING_DL_MIN_S 5.0
#define RING_DL_MULT 8.0
#define RING_DL_SMALL 8 /* a frame of at most this many tokens costs a stage about a decode step */

/* Audits' default tolerances (relative): a stage recomputed with the node's kernels, and a CPU stage of a
 * node on another CPU architecture, whose kernels round otherwise (docs/numerics.md). */
#define RING_AUDIT_TOL 1e-2
#define RING_AUDIT_TOL_ARCH 5e-2
/* ring_opts' tolerances with their defaults filled in. */
#define RING_AUDIT_TOL_OF(o) ((o)->audit_tol > 0 ? (o)->audit_tol : RING_AUDIT_TOL)
#define RING_AUDIT_TOL_ARCH_OF(o) ((o)->audit_tol_arch > 0 ? (o)->audit_tol_arch : RING_AUDIT_TOL_ARCH)

typedef struct ring_opts {
    uint32_t n_ctx;       /* per-sequence context on every node */
    int n_seqs;           /* sequences every node must hold state for at once (a server's --parallel; 0 = 1):
                           * the plan reserves their state, so a ring that cannot hold them fails to open */
    int wire;             /* enum k3_wire_dtype for boundary states */
    double connect_s;     /* how long to wait for INFO from every node */
    double load_s;        /* how long to wait for every node to load its range */
    double dead_s;        /* a node silent this long is declared dead */
    double link_s;        /* a silent link (no RST: a cable pulled) is declared down within max(link_s, 3 round
                           * trips) (0: ZS_LINK_S); the coordinator's links and each stage's to the next */
    double step_s;        /* no result for this long fails the request */
    bool no_fetch;        /* refuse to stream layers to nodes that lack the model */
    bool receipts;        /* every stage signs a receipt per traversal; each traversal is checked */
    FILE *receipts_out;   /* and written here as JSON lines (may be NULL) */
    bool quiet;           /* do not print the plan */
    /* Audits (coord/audit.h; they need receipts, which they turn on): each finished sequence is audited
     * with probability audit_rate (0 = never, 1 = all), drawn from audit_seed, at one stage drawn likewise;
     * the coordinator recomputes that stage's layers for the sequence and compares within audit_tol. */
    double audit_rate;
    uint64_t audit_seed;
    double audit_tol;     /* 0 = RING_AUDIT_TOL */
    double audit_tol_arch; /* for a CPU stage on another CPU architecture than this one's (0 = RING_AUDIT_TOL_ARCH) */
    int audit_keep;       /* traversals remembered for audits (0 = 4096) */
    int audit_threads;    /* threads of the auditing engine (0 = 1) */
    const bool *exclude;  /* per ring.conf node (or NULL): leave it out of the plan (a node found faulty) */
    int n_taps;           /* DSpark: the target layers whose input stream the stages holding them send back */
    uint32_t taps[16];    /* for FRAME_SEQ_TAPS sequences (out of band, frame.h TAPS) */
    /* This coordinator process: nodes serve one coordinator at a time and know it by this (its routing ids
     * carry it). A server keeps one across re-opens, so its nodes stay its own; 0 = draw one at ring_open. */
    uint64_t session;
    /* Set (by another thread) to stop whatever the coordinator waits for: every wait then fails at once with
     * "interrupted". A server sets it when it stops, so no ring wait outlives it. May be NULL. */
    const _Atomic bool *abort;
    /* Called with every traversal's receipts once they are checked (receipts on; may be NULL). */
    void (*on_receipts)(void *user, const receipt_rec *rs, int n_stages);
    void *on_receipts_user;
    /* A manifest ring (docs/ring.md, "Manifest rings"): the coordinator holds only the model's manifest, and
     * ring_open's m is its view without weights (manifest_file_model). Nodes map their ranges from the split files
     * they hold and pull what they lack from nodes that hold it; the plan prefers cuts that match what they
     * hold. The model id is the manifest hash of all layers. Audits need weights, so they are refused.
     * NULL: the coordinator holds the model (m), its whole-file hash is the id, and it streams ranges. */
    const struct manifest_file *manifest;
    const char *manifest_path; /* its file, sent to every stage */
    /* ring_open stops once the plan is made and printed (`ringlm plan`): nothing is lent or assigned, rc->plan
     * holds it; ring_close it as usual. */
    bool plan_only;
    /* Keep ring.conf's order. Otherwise, with 3 or more nodes, ring_open has the nodes time round trips to
     * each other (probe.h), times its own to each, and runs them in the order with the shortest round trip
     * (ring_order.h); the plan printed says both orders and what the planner predicts (predict.h). */
    bool keep_order;
    /* Speculation through this ring (spec_block 0: none): the most tokens a verified block carries (the drafts
     * and the token before them) and the blocks in flight at once. Every stage keeps spec_depth blocks of
     * each sequence for rollback (ASSIGN's rollback_blocks), and the plan counts their copies of the KDA state
     * in each sequence's state (k3_range_rollback_bytes). */
    uint32_t spec_block;
    int spec_depth;
    /* serve's prompt cache through this ring: the checkpoints every stage keeps per sequence (ASSIGN's
     * ctx_checkpoints, FRAME_SEQ_CKPT; the plan counts their KDA state in each sequence's). 0: none. */
    int ctx_checkpoints;
    /* The coordinator's own relay (ring_relay_start; NULL: none), for telling ring.conf's relayed nodes that
     * dialled out to it from those behind another relay (ring_reach). */
    const char *relay_addr;
} ring_opts;

ring_opts ring_opts_default(void);
/* A DSpark draft's taps can travel only on a ring opened with exactly them (every ASSIGN names them): 0, or -1
 * with err saying so. */
int ring_opts_check_taps(const ring_opts *o, const uint32_t *layers, int n, rl_err *err);

/* What run and serve are told of a ring's trust on their command lines (--receipts FILE, --audit-rate R,
 * --audit-seed S, --audit-tol T, --node-timeout S), before it becomes ring_opts: the receipts file is opened
 * by each as it needs (run writes a new one, serve appends), so it is a path here. */
typedef struct ring_trust {
    const char *receipts;   /* NULL: no receipts */
    double audit_rate, audit_tol, audit_tol_arch;
    unsigned long long audit_seed;
    double node_timeout;    /* ring_opts.dead_s; 0 = the default */
    double link_timeout;    /* ring_opts.link_s; 0 = the default */
    const char *relay_listen; /* --relay-listen HOST:PORT: a relay for nodes behind NATs (ring_relay_start) */
} ring_trust;

typedef struct ring_stage_stats {
    double compute_s, queue_s, wire_s; /* sums over traversals */
    long n;
} ring_stage_stats;

typedef struct ring_node_state {
    void *sock;
    zs_monitor mon;
    double link_s;     /* the silence after which sock's link is declared down (zs_client) */
    uint64_t mem_bytes;
    double speed;
    double flops;      /* INFO "flops" (0: not reported) */
    double disk_bps;   /* INFO "disk_bps": reads routed experts from disk at this rate under its --mem (0: never) */
    /* INFO "device": the GPU it computes on, planned as a tier before its RAM (plan_node.ram_bytes); dev_bytes
     * 0: none, it computes on its CPU */
    char dev_name[64];
    char dev_reg[16];  /* the backend (ggml registry) of the device it computes on, "" for the CPU: its audits
                        * recompute on a device of that backend here if there is one (coord_audit.c) */
    uint64_t dev_bytes;
    double dev_speed, dev_flops;
    char arch[16]; /* INFO "arch": its CPU architecture (uname's machine), "" if it did not say */
    /* READY "steps": its stage's own timed frames at the last ASSIGN (node.c), for the prediction
     * (predict.h predict_stage_calibrate); n_steps 0: none (the probe's figures stand) */
    int n_steps;
    double step_tok[8], step_s[8];
    uint32_t step_a, step_b; /* the range they timed */
    int n_parts;                       /* dev_name lists several devices: each one's name and room */
    char part_name[PLAN_MAX_PARTS][24];
    uint64_t part_room[PLAN_MAX_PARTS];
    double last_seen;  /* when its last message arrived */
    double ping_since; /* when the first ping it has not answered was sent (<= last_seen: none outstanding).
                        * Silence is measured from here, not from last_seen: an idle ring sends nothing for
                        * minutes, and a node that said nothing because nobody asked is not dead. */
    bool has_model;   /* holds the whole model file */
    k3_engine_opts eng; /* how it computes, from INFO "repack", "flash_attn", "cache_type": audits of it
                         * compute the same way (repacked kernels, FA and cache types round differently) */
    bool *files;      /* a manifest ring: which of the manifest's split files the node holds (INFO "files") */
    int n_ranges;     /* layer ranges of it the node was streamed before */
    uint32_t range_a[16], range_b[16];
} ring_node_state;

typedef struct ring_coord {
    void *zctx;
    tn_connector *tn;         /* carries the links to relayed nodes ("relay:" in ring.conf; net/tunnel.h) */
    const keys_identity *id;
    ring_conf conf;
    ring_opts o;
    ring_node_state nodes[PLAN_MAX_NODES];
    plan_node pnodes[PLAN_MAX_NODES];
    plan_result plan;
    k3_hparams hp;
    char model_hash[65];
    char *mf_bytes;           /* a manifest ring: the manifest file, sent with every ASSIGN */
    size_t mf_len;
    uint64_t ring_id, next_step, next_seq;
    double last_ping;
    ring_stage_stats stats[PLAN_MAX_NODES + 1]; /* [n_stages] = the return hop */
    /* Deadlines (frame.h budget_ms; coord.c ring_frame_budget): per stage, what a frame costs it, learnt from
     * the stamps of returned frames (seeded by its timed frames at ASSIGN): dl_step the slowest frame of at
     * most RING_DL_SMALL tokens lately, dl_tok the most per token of a larger one (a decaying maximum; 0 not
     * known). wait_timed_out: ring_wait's last return was its timeout. */
    double dl_step[PLAN_MAX_NODES], dl_tok[PLAN_MAX_NODES];
    bool wait_timed_out;
    /* Receipts (trust/ledger.h): traversals whose receipts are still arriving (each stage sends its own
     * after forwarding), checked when complete while the coordinator waits for the ring anyway; a failure
     * is kept there and fails the next step (or ring_receipts_finish), and the node it blames is marked
     * faulty (receipt_blamed: done). Checked traversals are remembered there for audits. */
    ledger_book ledger;
    bool have_ledger, receipt_blamed;
    /* Steps in flight: submit time, and results that arrived before their collect. */
    struct ring_pending {
        uint64_t step_id;
        double t_send_real, t_send_mono;
        double budget_s;       /* its deadline (t_send_mono + budget_s), 0: none */
        uint32_t tokens;       /* tokens it carries (every sequence's) */
        bool done;
        zs_parts parts;
        float *taps;           /* FRAME_SEQ_TAPS rows of the frame, [row][tap][n_embd], as they arrive */
        uint32_t tap_rows;
        int taps_need, taps_got; /* TAPS messages expected (stages holding tap layers) and received */
        uint64_t taps_from;    /* stages whose TAPS counted (one each; plan stages <= 64) */
        uint32_t route_rows;   /* FRAME_SEQ_ROUTES tokens of the frame */
        int routes_need, routes_got; /* ROUTES messages expected (stages holding MoE layers) and received */
        uint64_t routes_from;
        char routes_err[400];  /* a malformed ROUTES message: the step fails with this, naming the node */
    } pending[64];
    int n_pending;
    double traversal_s;
    long traversals;
    int busy_node;            /* the node whose last ERROR said it serves another coordinator (or -1) */
    long stale_msgs;          /* messages about an earlier ring's frames, dropped (ring_wait) */
    long taps_dropped;        /* TAPS messages dropped: malformed, duplicated, or from a stage without taps */
    reap_stats *routes;       /* where FRAME_SEQ_ROUTES frames' ROUTES are added (REAP scoring; ring_reap.c) */
    /* Audits: the sequences waiting to be audited, an engine per audited stage (on the coordinator's model
     * file), and what was found (the evidence: the ledger's remembered traversals). */
    const mf_model *m;
    audit_draws audit;             /* which finished sequences are audited, and where (coord/audit.h) */
    void *aud_eng[PLAN_MAX_NODES]; /* k3_engine *, per stage, made at its first audit */
    char aud_where[PLAN_MAX_NODES][128]; /* where each stage's audits recompute, and so how they compare */
    bool aud_arch[PLAN_MAX_NODES];       /* ... on another CPU architecture than the node's: --audit-tol-arch */
    tok_tokenizer aud_tok;         /* the last stage's audits: the vocabulary its constrained sampling follows */
    smp_vocab *aud_vocab;          /* (made at the first such audit; NULL before) */
    bool faulty[PLAN_MAX_NODES];   /* per ring.conf node: caught by a receipt check or an audit */
    char fault[PLAN_MAX_NODES][600];
    long audits, audit_failures, audit_frames, audits_skipped;
    double audit_s, audit_max_diff;
    long node_audits[PLAN_MAX_NODES]; /* per ring.conf node: audits of it, and their time */
    double node_audit_s[PLAN_MAX_NODES];
    /* Measured one-way delays (half the fastest of PB_ROUNDS round trips; coord_probe.c), per ring.conf
     * node: delay_s[a][b] of a message a sends to b, coord_delay_s[a] between the coordinator and a. */
    bool have_delays;
    double delay_s[PLAN_MAX_NODES][PLAN_MAX_NODES];
    double coord_delay_s[PLAN_MAX_NODES];
} ring_coord;

struct predict_result;
struct predict_opts;
/* What `ringlm plan`'s model predicts for this ring as planned (predict.h): from the nodes' INFO speeds and
 * FLOPs and the measured delays, for a prompt of `prompt` tokens in `chunk`-token chunks; transfers are
 * not counted (link bandwidths are not measured). -1 when the delays were not measured. */
int ring_prediction(const ring_coord *rc, uint32_t prompt, uint32_t chunk, const struct predict_opts *spec,
                    struct predict_result *r);

/* Connects, asks every node for INFO, plans, prints the plan, assigns ranges and waits until all are
 * loaded. Fails with a message naming the node and the reason (unreachable, refused our key, lacks the
 * model, too little memory for the plan, ...). */
int ring_open(ring_coord *rc, const ring_conf *conf, const keys_identity *id, const mf_model *m,
              const k3_hparams *hp, const ring_opts *o, rl_err *err);
void ring_close(ring_coord *rc);

/* One sequence's turn through the ring: sends `n` tokens of sequence `seq` at position `pos` and waits
 * for the result. flags: FRAME_SEQ_*. On return *token is the sampled token (or -1) and, with
 * FRAME_SEQ_ALL_LOGITS, logits holds n rows of n_vocab (caller's buffer). */
typedef struct ring_seq_req {
    uint64_t seq_id;
    uint32_t pos, n;
    uint32_t flags;
    const int32_t *tokens;
    frame_sampling smp;
    int32_t token;  /* out */
    float *logits;  /* out, optional */
    const void *q;  /* FRAME_SEQ_HAS_Q: this sequence's share of the q part */
    size_t q_len;
    const smp_bias *bias; /* FRAME_SEQ_HAS_BIAS (a FRAME_SEQ_NEW entry): the last stage's sampler adds these */
    uint32_t n_bias;
    const uint8_t *gram;  /* FRAME_SEQ_HAS_GRAMMAR (a FRAME_SEQ_NEW entry): the grammar's wire form, gram_len bytes, and */
    uint32_t gram_len;
    int32_t budget;       /* ... the tokens it may sample at most (sampler.h) */
    uint32_t gen_start;   /* FRAME_SEQ_RESUME (a FRAME_SEQ_NEW entry): index of its first generated token */
    smp_logprob *lp;      /* out, optional, FRAME_SEQ_LOGPROBS: one entry per token returned, at most lp_cap kept */
    uint32_t lp_cap;
    smp_logprob *plp;     /* out, optional, FRAME_SEQ_PROMPT_LP: n - 1 entries (token t + 1 at row t; n >= 1) */
    int32_t committed[32]; /* out, FRAME_SEQ_VERIFY: accepted drafts + correction (token = count) */
    float *taps;    /* out, FRAME_SEQ_TAPS: n rows of o.n_taps * n_embd floats, token-major (malloc'ed; the caller frees
                     * it, also after a failed collect: set it to NULL before) */
} ring_seq_req;

/* Sampling parameters for the wire (the last stage samples). */
frame_sampling ring_sampling(const smp_params *p);

/* Several sequences in one FORWARD frame (batched through every stage): submit, then collect.
 * Frames in flight are processed by every stage in the order they were submitted, so a sequence may
 * have several frames in the ring at once (a chunked prefill fills the pipeline) and frames of other
 * sequences overlap in different stages. ring_step = submit + collect. */
int ring_submit(ring_coord *rc, const ring_seq_req *reqs, int n_reqs, uint64_t *step_id, rl_err *err);
/* Waits for that step's result and fills reqs[].token / .logits (the same reqs as submitted). Results
 * of other steps that arrive meanwhile are kept for their own collect. */
int ring_collect(ring_coord *rc, uint64_t step_id, ring_seq_req *reqs, int n_reqs, rl_err *err);
int ring_step(ring_coord *rc, ring_seq_req *reqs, int n_reqs, rl_err *err);

/* Waits (at most timeout_s) for the receipts of every traversal so far and checks them. Fails if any
 * failed a check or never came. */
int ring_receipts_finish(ring_coord *rc, double timeout_s, rl_err *err);

/* Forgets sequences on every node (and, with audits on, draws which of them to audit). */
int ring_free_seqs(ring_coord *rc, const uint64_t *ids, int n, rl_err *err);
/* The two halves of ring_free_seqs, for a caller that keeps a sequence on the ring after its request ended
 * (serve's prompt cache): its audit is drawn when the request ends, not when the sequence is forgotten later
 * (which may be never, or after many requests), and forgetting it then draws nothing. */
void ring_audit_finished(ring_coord *rc, const uint64_t *ids, int n);
int ring_forget_seqs(ring_coord *rc, const uint64_t *ids, int n, rl_err *err);

/* Runs the audits drawn so far (ring_free_seqs, ring_audit_finished): for each, asks the audited stage's node for what it
 * received and sent in that sequence's traversals, checks those bytes against its signed receipts, and
 * recomputes them. Returns 0 when all pass (or when steps are still in flight: it waits for a quiet
 * ring), -1 on a failed audit: the node is marked in rc->faulty / rc->fault and err names it. */
int ring_audit_pending(ring_coord *rc, rl_err *err);

/* The same contract as gen_run, over the ring. */
int ring_generate(ring_coord *rc, const tok_tokenizer *tok, const int32_t *prompt, size_t n_prompt,
                  const gen_params *p, gen_token_cb cb, void *user, gen_metrics *m, rl_err *err);

/* REAP scores over the ring (prune/reap_run.h's reap_score_local, distributed): every sequence of c in
 * chunks of `chunk` tokens, one traversal at a time, each stage holding MoE layers returning its layers'
 * routing (ROUTES) into s (covering the whole model). Same chunking, same kernels: the same scores as one
 * machine, bit for bit. */
int ring_reap_score(ring_coord *rc, const calib_set *c, uint32_t chunk, reap_stats *s, bool progress, rl_err *err);

/* Per-stage figures so far: a table on f, and a JSON array (cJSON *) for --metrics-json. */
void ring_print_stats(const ring_coord *rc, FILE *f);
struct cJSON;
struct cJSON *ring_stats_json(const ring_coord *rc);

/* ---- an open ring, read from outside (coord_access.c) ----------------------------------------------------
 * What a server's ring backend (src/serve/backend_ring.c) needs of the ring it keeps open, without knowing
 * ring_coord's fields. node: a ring.conf index; stage: an index into the plan. */

/* The plan the ring was opened with (its stages' nodes and layer ranges). */
const plan_result *ring_plan_get(const ring_coord *rc);
/* Stage s's figures so far (sums over its traversals). */
ring_stage_stats ring_stage_stats_get(const ring_coord *rc, int stage);
/* The audits of node so far and the seconds they took; clear starts both from 0 again (a server adds them to
 * totals of its own, which outlive the ring). */
void ring_node_audits_get(const ring_coord *rc, int node, long *n, double *secs);
void ring_node_audits_clear(ring_coord *rc, int node);
/* Why node was found faulty (a failed receipt check or audit), or NULL if it was not. */
const char *ring_node_fault_get(const ring_coord *rc, int node);
/* Polls node's link: true when it closed after its handshake (the node died or the network dropped). *why
 * (may be NULL): the link's last event, "" if none, valid until the next poll of that node. */
bool ring_node_link_poll(ring_coord *rc, int node, const char **why);
/* Whether node's link takes a message within timeout_ms (0: at once). */
bool ring_node_writable_wait(ring_coord *rc, int node, int timeout_ms);
/* Audits drawn for finished sequences and not yet run (ring_audit_pending runs them). */
int ring_audit_pending_count(const ring_coord *rc);
/* Steps submitted and not yet collected. */
int ring_pending_count(const ring_coord *rc);

#endif
