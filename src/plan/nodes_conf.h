/* nodes_conf.h - machines described by their figures, for `ringlm plan --nodes` (planning a ring before it
 * exists): a small catalog of common devices, and nodes.conf.
 *
 * nodes.conf, one statement per line, '#' starts a comment:
 *
 *   node NAME device=DEV [count=N] [mem=GB] [bw=GB/s] [tflops=T] [col_reads=N] [eff=F] [net=Mbit/s] [loc=PLACE]
 *             [disk=GB/s] [ram=GB [ram_bw=GB/s] [ram_tflops=T]] [host=MACHINE [threads=N]]
 *   host MACHINE cores=N  nodes with host=MACHINE run on one machine of N cores, each with threads= of them
 *                         (default 1): at most N / threads of them compute at once (a pipelined prompt)
 *   delay A B MS          one-way delay in ms between A and B: node names or places (symmetric)
 *   coordinator at=NAME | loc=PLACE [device=DEV [figures as node]]
 *                         where the coordinator runs (default: beside the first node), and its machine's
 *                         figures for a draft model (default: those of the node at=, else of the first node)
 *
 * DEV is a catalog name (nodes_conf_catalog; `ringlm plan --devices` lists them) or `custom` (then mem= and bw= are
 * required). count multiplies a device's memory and bandwidth (a box with 2 GPUs splitting its layers).
 * col_reads: a product of c columns (a step of c streams) reads its weights min(c, N) times - 1 on a GPU,
 * 4 on a CPU (ggml's CPU kernels: predict.h); the catalog says which, custom defaults to 1.
 * eff: the fraction of the memory bandwidth (and of tflops) a decode step achieves, default 0.5. net: the
 * node's link bandwidth (default 1000 Mbit/s). ram: the host RAM of a GPU node, which holds what its devices
 * cannot (partial offload: routed experts of the first layers, or the last layers whole; plan.h), read at
 * ram_bw (default 80 GB/s, two channels of DDR5) and computed at ram_tflops (default 1.5), eff applying;
 * such a node does not read experts from disk (disk= is then ignored). Nodes in the same place are 0.1 ms apart unless a delay says
 * otherwise; any other pair needs a delay (of the two nodes, or of their places). Errors name the line. */
#ifndef RINGLM_NODES_CONF_H
#define RINGLM_NODES_CONF_H

#include <stdbool.h>
#include <stdio.h>

#include "../base/err.h"
#include "plan.h"

typedef struct nodes_conf_device {
    const char *name, *what;
    double mem_gb;  /* per device */
    double bw_gbs;  /* memory bandwidth */
    double tflops;  /* dense f16 compute (for prefill) */
    double col_reads; /* a product of c columns reads the weights min(c, col_reads) times (predict.h) */
} nodes_conf_device;

/* The catalog (NULL-named entry ends it). */
const nodes_conf_device *nodes_conf_catalog(void);
const nodes_conf_device *nodes_conf_find_device(const char *name);

typedef struct nodes_conf_node {
    char name[64], device[32];
    int count;
    double mem_gb, bw_gbs, tflops, eff, net_mbit, col_reads;
    double disk_gbs; /* > 0: routed experts past mem= are read from disk at this speed (docs/experts.md) */
    double ram_gb, ram_bw_gbs, ram_tflops; /* ram > 0: the host's RAM, a second tier after the device's mem=
                                            * (plan_node.ram_bytes); bandwidth and compute of its CPU */
    int place;       /* index into nodes_conf_file.places */
    int host;        /* 0: a machine of its own; k > 0: nodes_conf_file.hosts[k - 1], shared with other nodes */
    int threads;     /* of the host's cores, with host= (default 1) */
    int line;
} nodes_conf_node;

#define NODES_CONF_MAX_PLACES (2 * PLAN_MAX_NODES + 1)

typedef struct nodes_conf_file {
    int n;
    nodes_conf_node nodes[PLAN_MAX_NODES];
    int n_places;
    char places[NODES_CONF_MAX_PLACES][64];
    double delay_ms[NODES_CONF_MAX_PLACES][NODES_CONF_MAX_PLACES]; /* one-way; < 0: not given */
    int coord_place;
    nodes_conf_node coord;           /* the coordinator's machine (its name "coordinator" unless copied from a node) */
    int coord_figures_from;  /* the node whose figures coord copies, -1: its own line's */
    int n_hosts;
    char hosts[PLAN_MAX_NODES][64]; /* machines that nodes share (host=), each with its 'host' line's cores */
    int host_cores[PLAN_MAX_NODES];
} nodes_conf_file;

/* How many of host k's nodes (nodes_conf_node.host, k > 0) compute at once: its cores over the most threads one of
 * them uses, at least 1. */
int nodes_conf_host_slots(const nodes_conf_file *c, int k);

int nodes_conf_load(nodes_conf_file *c, const char *path, rl_err *err);
/* One-way delay between two nodes (index -1: the coordinator), in seconds; -1 if nodes.conf gives none. */
double nodes_conf_delay_s(const nodes_conf_file *c, int a, int b);
/* Every pair the plan may use has a delay (coordinator included), else an error naming the first missing. */
int nodes_conf_check_delays(const nodes_conf_file *c, rl_err *err);
void nodes_conf_print_catalog(FILE *f);

#endif
