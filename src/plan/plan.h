/* Folder src/plan/: the planner: the layer cut, a model as the planner sees it, nodes.conf, the ring order
 * with the shortest round trip, and what a ring will do (predictions; `ringlm plan`). May include: base,
 * gguf, model. (README "Layout"; tests/t_layout.sh checks both.)
 */
/* plan.h - cutting a model into contiguous layer ranges, one per node of the ring.
 *
 * Minimizes the slowest stage's time per token under every node's memory limit (with headroom for
 * per-sequence state), keeping the ring order as given (stage i runs on node i, or a node is skipped when
 * the plan does not need it). A ring too small for the model is an error that names the shortfall. */
#ifndef RINGLM_PLAN_H
#define RINGLM_PLAN_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#include "../base/err.h"

#define PLAN_MAX_NODES 64
#define PLAN_MAX_LAYERS 256
#define PLAN_MAX_PARTS 8 /* devices of one node (K3_MAX_DEV) */

typedef struct plan_model {
    uint32_t n_layer;
    uint64_t layer_bytes[PLAN_MAX_LAYERS];  /* weights of each layer (k3_layer_weight_bytes) */
    uint64_t layer_active[PLAN_MAX_LAYERS]; /* weight bytes one token reads in each layer (cost model) */
    uint64_t layer_state[PLAN_MAX_LAYERS];  /* per-sequence state of each layer at the planned context */
    /* Of layer_state, what sits in host memory wherever the layer computes: speculation's rollback copies,
     * read back from a device after each verified block. A node with two tiers holds it in RAM. */
    uint64_t layer_host[PLAN_MAX_LAYERS];
    uint64_t first_bytes, last_bytes;       /* extra on the first stage (embedding) / last (LM head, norms) */
    uint64_t last_active;                   /* LM head bytes read per token on the last stage */
    uint64_t layer_exps[PLAN_MAX_LAYERS];        /* of layer_bytes, the routed experts (may come from disk) */
    uint64_t layer_exps_active[PLAN_MAX_LAYERS]; /* of layer_active, the routed experts' */
    uint64_t expert_min;                    /* the least expert cache a stage runs with (two experts) */
    uint32_t n_seq;                         /* sequences to hold state for */
} plan_model;

typedef struct plan_node {
    char name[64];        /* for messages: "host:port" */
    uint64_t mem_bytes;   /* memory the node offers for weights + state */
    double speed;         /* relative throughput (bytes of weights processed per second); > 0 */
    double disk_bps;      /* > 0: the node reads routed experts from disk at this rate when a range does not fit
                           * its memory (expert cache, docs/experts.md); 0: every stage must fit */
    /* Bytes of each layer the node does not hold and would be streamed ([i] for layer i, [n_layer] the
     * embedding, [n_layer + 1] the output head), or NULL: it holds everything (or it does not matter). */
    const uint64_t *lack;
    /* A node computing on a GPU (docs/devices.md): mem_bytes and speed are then the device's (the memory it
     * offers, its measured speed), and the host's RAM takes what the device cannot hold, at the CPU's speed:
     * the routed experts of a stage's first layers (llama.cpp's --n-cpu-moe), or its last layers whole (what
     * --gpu-layers leaves), whichever is faster; the embedding (a row lookup) stays in RAM. 0: one tier. With
     * disk_bps too, the routed experts in RAM may exceed it: cached there, the rest read from disk (VRAM ->
     * RAM -> disk). */
    uint64_t ram_bytes;
    double ram_speed;     /* > 0 with ram_bytes */
    char device[64];      /* the device's name, for the printed plan ("Vulkan0"); may be empty */
    /* A node on several devices ("Vulkan0,Vulkan1"): each one's name and room (k3_dev_room of its free
     * memory). The plan treats them as one tier; the node splits the stage's device layers between them in
     * proportion to their room (k3_dev_split), and the printed plan says which layers go where. */
    int n_parts;
    char part_name[PLAN_MAX_PARTS][24];
    uint64_t part_room[PLAN_MAX_PARTS];
} plan_node;

typedef struct plan_stage {
    int node;             /* index into the nodes array */
    uint32_t a, b;        /* layer range [a, b) */
    uint64_t mem_bytes;   /* weights + state + headroom this stage needs */
    double time;          /* estimated seconds per token */
    uint64_t lack_bytes;  /* of its weights, those the node lacks (plan_node.lack) */
    double cached;        /* share of its routed experts in memory (on a node of two tiers: of those in RAM): 1,
                           * or less when the rest comes from disk */
    double disk_time;     /* of time, seconds per token reading experts from disk (misses at hit rate = cached) */
    /* On a node with two tiers (plan_node.ram_bytes): layers [a, a + dev_layers) on the device, of which the
     * first cpu_moe keep their routed experts in RAM; the rest of the range in RAM. dev_bytes: of mem_bytes,
     * the device's part (the rest is RAM's). All 0 on a node with one tier. */
    uint32_t dev_layers, cpu_moe;
    uint64_t dev_bytes;
} plan_stage;

typedef struct plan_result {
    int n_stages;
    plan_stage stages[PLAN_MAX_NODES];
    double max_time;      /* the slowest stage */
    int n_nodes;          /* nodes the plan chose from (added: lets plan_print name the ones left out) */
} plan_result;

/* headroom: fraction of extra memory kept free on every stage (e.g. 0.10 for compute buffers).
 *
 * A stage's need is raw + ceil(raw * headroom) bytes (a product within 1e-12 of a whole number counts as
 * that number, so 10% of 10 GiB is exactly 1 GiB despite 0.1's binary error), where raw = its layers'
 * weights + n_seq * their state (+ first_bytes on the first stage, + last_bytes on the last); it fits when
 * need <= node.mem_bytes, or, on a node with a disk speed, when its dense part and the least expert cache fit:
 * the rest of its memory caches routed experts, a token misses (1 - cached) of the experts it reads (the hit
 * rate of uniform routing), and the misses cost their bytes / disk_bps on top of the stage's time. On a node
 * with two tiers each tier's need (its part of raw, plus headroom) must fit that tier, and the stage takes
 * the fastest of: the experts of its first N layers in RAM, N the least that lets the rest fit the device
 * (N = 0: all on the device); its first g layers whole on the device, g the most that fit, the rest in
 * RAM; and, when the CPU is the faster, g = 0; time = bytes read on the device / speed + bytes read in RAM /
 * ram_speed (a tie keeps the first of those). When nodes say what they lack (plan_node.lack), the plans that stream the fewest
 * bytes come first: a cut that matches what the nodes hold beats a faster one that moves weights. Among the
 * plans with the smallest max_time it picks the fewest stages, then the
 * smallest largest share of a node's memory in use (need / mem_bytes), then the largest smallest share
 * (so the memory, and with uniform layers the time, is spread evenly). Returns -1 with a message for bad
 * input or when the ring cannot hold the model. */
int plan_make(const plan_model *m, const plan_node *nodes, int n_nodes, double headroom, plan_result *out,
              rl_err *err);

/* Human-readable table: one line per stage with node, layers, memory and estimated time, a total line and
 * (when r->n_nodes says there were more) the nodes left out. */
void plan_print(const plan_result *r, const plan_node *nodes, FILE *f);

#endif
