/* Folder src/node/: the node daemon (`ringlm node`), and a node's range put together from split files and
 * pulls (manifest rings). May include: base, device, gguf, model, text, gen, speculate, wire, exec, trust,
 * net. (README "Layout"; tests/t_layout.sh checks both.)
 */
/* node.h - `ringlm node`: one machine of the ring.
 *
 * Listens (ZeroMQ ROUTER, CURVE) for its coordinator(s) and its upstream neighbour. Answers INFO with its
 * memory, a measured speed and the models it holds (by content hash); on ASSIGN maps its layer range of
 * the named model and connects to its downstream neighbour; then runs FORWARD frames: the sequences'
 * tokens or boundary state in, its layers, boundary state out to the next node (or, on the last stage,
 * sampled tokens / logits straight back to the coordinator). Keeps each sequence's state for its layers.
 * Never trusts a frame: a malformed one is answered with ERROR and dropped. */
#ifndef RINGLM_NODE_H
#define RINGLM_NODE_H

#include <stdbool.h>

#include "../base/err.h"
#include "../model/k3_forward.h"
#include "../trust/keys.h"

#define NODE_MAX_ALLOW 16

typedef struct node_opts {
    const char *listen;      /* HOST:PORT (NULL with dial: a loopback port of its own) */
    const char *dial;        /* --dial HOST:PORT: behind a NAT, keep connections waiting at this relay (net/tunnel.h) */
    const char *join_token;  /* --join: presented to the relay (its coordinator admits the keys it issued tokens to) */
    const char *relay_listen; /* --relay-listen HOST:PORT: run a relay for nodes that dial out */
    keys_identity id;
    keys_peer allow[NODE_MAX_ALLOW];
    int n_allow;
    const char *models_dir;  /* GGUF files this node holds (may be NULL) */
    const char *cache_dir;   /* where streamed layer ranges are kept (NULL: ~/.cache/ringlm/node-<key>) */
    double mem_gb;           /* memory offered; 0 = what the OS reports available */
    double speed_gbs;        /* matrix-vector speed to report; 0 = measure it (a short probe) */
    double tflops;           /* matrix-matrix speed to report (TFLOPS); 0 = measure it */
    double disk_gbs;         /* with --mem (eng.mem_bytes): disk read speed to report; 0 = measure it */
    double vram_gb;          /* device memory offered (computing on a GPU); 0 = its free memory less 256 MiB */
    double device_speed_gbs; /* the device's matrix-vector speed to report; 0 = measure it (dv_measure) */
    int threads;
    k3_engine_opts eng;      /* how its engines compute (repack, flash attention, cache type); n_threads unused */
    bool verbose;
    size_t audit_keep_bytes; /* frames kept for audits (0 = 256 MiB) */
    /* Test builds only (make adversary, -DRINGLM_ADVERSARY): how this node lies, "MODE[@N]" (from its
     * N-th FORWARD on). skip | perturb | replay | wrongkey | claim | auditlie - see tests/t_trust.sh. Ignored otherwise. */
    const char *misbehave;
} node_opts;

/* Runs until SIGINT or SIGTERM (the caller blocks both; they are polled). */
int node_run(const node_opts *o, rl_err *err);

#endif
