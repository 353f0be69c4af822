/* node_int.h - what the files of the node daemon share (node.c: the loop, replies, the one coordinator it
 * serves; node_start.c: what it holds and measures at start; node_assign.c: an ASSIGN and the messages
 * around it; node_forward.c: FORWARD frames, receipts, the audit log; node_fetch.c: layers streamed to
 * it). Not for users of the node: they include node.h. The struct's adversary fields (RINGLM_ADVERSARY)
 * change its layout, so a test build compiles every file of this folder with that flag (Makefile). */
#ifndef RINGLM_NODE_INT_H
#define RINGLM_NODE_INT_H

#include "node.h"
#include "../base/json.h"
#include "../base/file.h"
#include "../base/clock.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cJSON.h>
#include <sodium.h>
#include <sys/stat.h>
#include <zmq.h>

#include "ggml-cpu.h"
#include "ggml.h"

#include "../device/devices.h"
#include "../gen/emit.h"
#include "../gguf/file_hash.h"
#include "../model/expert_cache.h"
#include "../model/k3_forward.h"
#include "../model/k3_memory.h"
#include "../speculate/accept.h"
#include "../text/chat_gram.h"
#include "../text/sampler.h"
#include "../text/tokenizer.h"
#include "../trust/manifest.h"
#include "../trust/receipt.h"
#include "../wire/frame.h"
#include "../exec/stage.h"
#include "../net/probe.h"
#include "range_parts.h"
#include "../net/zsock.h"

#define NODE_MAX_MODELS 32

typedef struct node_model {
    char path[1024];
    char hash[65];      /* content hash of the whole model this file holds (or holds a range of) */
    uint64_t bytes;
    bool range;         /* a streamed range file: layers [a, b) only */
    uint32_t a, b;
} node_model;

/* A range file being received (FETCH_BEGIN .. FETCH_END). */
typedef struct node_fetch {
    bool active;
    FILE *f;
    char tmp[1100], final[1100];
    char hash[65];
    uint32_t a, b;
    uint64_t expect, written;
    crypto_generichash_state h;
    int last_pct;
} node_fetch;


typedef struct node {
    const node_opts *o;
    void *zctx;
    char name[200];    /* how its log lines and errors name it: --listen, or "dial-out to relay HOST:PORT" */
    tn_connector *tn;  /* reaches relayed nodes (next stage, probes, pulls): net/tunnel.h */
    tn_dialout *dial;  /* --dial: our connections waiting at a relay (NULL: we listen where we are reachable) */
    tn_relay *relay;   /* --relay-listen: the relay we run for others (NULL: none) */
    zs_auth auth;
    void *router, *next;
    zs_monitor next_mon; /* the downstream link's events, while next is open: a forward stops waiting once it closed */
    char next_addr[128]; /* where next goes */
    /* The coordinator this node serves: one at a time (docs/ring.md, "One coordinator per ring"). coord_id is
     * the routing id its latest message came from (replies go there); the owner is that id without its last
     * "-" field, which is per connection, so one coordinator process that re-opens its ring stays the owner.
     * The owner lets go when its connection closes (the router's monitor names the fd), and only then may
     * another coordinator, whatever its key, take the node. */
    char coord_id[256];
    size_t coord_id_len;
    bool owned;
    char owner[256];      /* "coord-<key16>-<session>" (bytes, owner_len of them) */
    size_t owner_len;
    int owner_fd;         /* the connection its latest message came in on */
    char owner_key[72];   /* its key as users write it, and where it connects from */
    char owner_peer[64];
    double owner_since;
    double busy_logged;   /* the last refusal logged (one per 10 s) */
    zs_monitor router_mon;
    uint64_t cur_ring; /* ring_id of the frame being handled; replies carry it, so a coordinator can tell an
                        * error about an earlier ring's frame (sent late) from one about its own */
    node_model models[NODE_MAX_MODELS];
    int n_models;
    char cache_dir[1024];
    node_fetch fetch;
    double speed; /* bytes of weights per second in a matrix-vector product */
    double flops; /* FLOP/s in a 128-column matrix product (a prefill chunk's shape) */
    double disk;  /* bytes per second read from disk (0: no --mem, so experts are never read from disk) */
    /* The GPU its engines compute on (docs/devices.md), offered to the planner as a tier before RAM (and,
     * under --mem, RAM before disk): dev_name empty when it computes on the CPU. */
    char dev_name[64]; /* "Vulkan0", or "CUDA0,CUDA1" for several */
    char arch[32];         /* its CPU architecture (uname; "" if unknown), said in INFO and the ready line */
    uint64_t dev_bytes;
    double dev_speed, dev_flops;
    uint32_t gpu_layers, n_cpu_moe; /* the split the coordinator assigned (ASSIGN), or UINT32_MAX: none */
    /* the assignment */
    bool loaded;
    char hash[65];
    mf_model m;
    k3_hparams hp;
    k3_engine e;
    uint32_t a, b, n_ctx;
    int n_seqs; /* sequences the ring holds at once (ASSIGN): the stage pools their states */
    /* Its stage's own timed frames (stage_time at ASSIGN; READY "steps"), from which the coordinator fits
     * this node's figures for its prediction (predict.h, predict_stage_calibrate); kept for the assignment they
     * timed (step_key), so an ASSIGN of the same range and shape does not time it again. */
    int n_steps;
    uint32_t step_tok[3];
    double step_s[3];
    char step_key[200];
    int stage, n_stages, wire;
    ring_stage stage_rt; /* the sequences' state and the compute of this stage (stage.h) */
    tok_tokenizer tok;   /* last stage: the model's vocabulary, so it can sample constrained output */
    smp_vocab *vocab;    /* ... (tok's bytes per token; NULL: not the last stage, or the file has no vocabulary) */
    int rb_blocks;       /* ASSIGN "rollback_blocks": blocks a sequence keeps for rollback (0: K3_RB_BLOCKS) */
    int max_ck;          /* ASSIGN "ctx_checkpoints": prompt-cache checkpoints a sequence keeps (0: none) */
    uint32_t taps[16];   /* the ring's DSpark tap layers (ASSIGN "taps"); the stage keeps those it holds */
    int n_taps;
    /* A manifest ring (docs/ring.md, "Manifest rings"): the range was put together from parts under the
     * coordinator's manifest, kept here; and the fetchers' keys this node lends its split files to. */
    manifest_file mf;
    bool have_mf;
    char lent[PARTS_MAX_HOLDERS][65];
    int n_lent;
    /* The ring's other nodes, which may time round trips to this one (PEERS; probe.h). */
    char probers[PB_MAX_PEERS][65];
    int n_probers;
    uint8_t manifest[32]; /* manifest_range_hash of the assigned range: hashed by a thread from load on, so that
                           * the first receipt does not wait for a pass over every weight byte */
    bool have_manifest;
    struct node_mfst_job {
        pthread_t thread;
        bool running;
        const mf_model *m;
        k3_hparams hp;
        uint32_t a, b;
        uint8_t out[32];
        int rc;
        rl_err err;
    } mfst;
    /* What this stage received and sent for the steps it signed receipts for, oldest first, at most
     * o->audit_keep_bytes: an auditor asks for them (AUDIT_REQ) and checks them against the receipts. */
    struct node_audit_rec {
        uint64_t ring_id, step_id;
        uint8_t *in, *out;
        size_t in_len, out_len;
    } *alog;
    size_t alog_n, alog_cap, alog_head, alog_bytes;
    /* Receipts still to sign: the frames already went on; they are hashed and signed once the node has
     * been quiet for a millisecond, or before it handles its next message (node_flush_receipts). */
    struct node_rjob {
        frame_header *h;
        uint8_t nonce[32];
        uint8_t *in, *out;
        size_t in_len, out_len;
    } *rjobs;
    int n_rjobs, cap_rjobs;
#ifdef RINGLM_ADVERSARY
    long adv_forwards;  /* FORWARD frames run so far */
    bool adv_dropped;   /* drop: the one frame it loses is lost */
    uint8_t *adv_old;   /* replay: the first receipt this node signed (packed) */
    size_t adv_old_len;
    keys_identity adv_other; /* wrongkey: a key of its own making */
    bool adv_have_other;
#endif
} node;

/* ---- node.c ---- */

/* SIGINT or SIGTERM is pending (blocked in the node's threads, read at each pass of its loop). */
bool node_stop_pending(void);
void node_error(node *n, uint64_t step, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void node_error_at(node *n, uint64_t step, const char *lost, const char *msg);
void node_log(const node *n, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int node_reply(node *n, int type, uint64_t step, const void *payload, size_t len);
int node_reply_to(node *n, const void *to, size_t to_len, int type, uint64_t step, const void *payload, size_t len, rl_err *err);

/* ---- node_start.c ---- */

uint64_t node_mem_available(void);
int node_probe_device(node *n, rl_err *err);
double node_probe_disk(const char *dir);
double node_probe_flops(int threads);
double node_probe_speed(int threads);
void node_scan_cache(node *n);
void node_scan_models(node *n);

/* ---- node_assign.c ---- */

void node_assign(node *n, uint64_t step, const zs_parts *p);
void node_close_next(node *n);
void node_lend(node *n, uint64_t step, const zs_parts *p);
int node_manifest(node *n, rl_err *err);
void node_peers(node *n, uint64_t step, const zs_parts *p);
void node_probe(node *n, uint64_t step, const zs_parts *p);
void node_probe_ping(node *n, const zs_parts *p, const frame_header *h);
void node_pull(node *n, const zs_parts *p, const frame_header *h);
int node_send_next(node *n, const void *const *parts, const size_t *lens, int np, rl_err *err);
void node_unload(node *n);

/* ---- node_forward.c ---- */

void node_alog_clear(node *n);
void node_audit(node *n, const zs_parts *p, const frame_header *h);
void node_flush_receipts(node *n);
void node_forward(node *n, const zs_parts *p, const frame_header *h);
void node_free(node *n, const zs_parts *p, const frame_header *h);
void node_free_rjobs(node *n);

/* ---- node_fetch.c ---- */

void node_fetch_abort(node *n);
void node_fetch_begin(node *n, uint64_t step, const zs_parts *p);
void node_fetch_data(node *n, uint64_t step, const zs_parts *p);
void node_fetch_end(node *n, uint64_t step, const zs_parts *p);

#endif
