/* coord_int.h - the coordinator's own functions shared by its files. Not for users of the ring: they
 * include coord.h. coord_io.c (messages to and from nodes) is the bottom: every other file may call it and
 * it calls none of them; coord.c (open, close, submit, collect) calls the rest (stream.c, coord_manifest.c,
 * coord_probe.c, coord_receipts.c, coord_audit.c), which call only coord_io.c and each other; ring_generate.c,
 * verify_ring.c and ring_reap.c drive steps through coord.h. */
#ifndef RINGLM_COORD_INT_H
#define RINGLM_COORD_INT_H

#include <cJSON.h>

#include "coord.h"

/* coord_io.c: messages to and from nodes. */
bool ring_aborted(const ring_coord *rc);
int ring_send4(ring_coord *rc, int node, int type, uint64_t step, const frame_header *hh, const void *payload,
               size_t plen, const void *stamps, size_t slen, const void *extra, size_t elen, rl_err *err);
int ring_send(ring_coord *rc, int node, int type, uint64_t step, const frame_header *hh, const void *payload,
              size_t plen, const void *stamps, size_t slen, rl_err *err);
/* Waits for one message of `want` type (from any node, or from `only` if >= 0). Answers nothing itself,
 * but notes PONGs, pings every watched node each second and fails on ERROR, on a watched node silent for
 * dead_s, or after timeout_s. *from is the node index the message came from. */
int ring_wait(ring_coord *rc, int want, int only, double timeout_s, const bool *watch, int *from, zs_parts *out,
              frame_header *h, rl_err *err);
/* coord_io.c: what arrives out of band while the coordinator waits (ring_wait hands it over): the step in
 * flight with an id (NULL: none); a TAPS message into its step, and how many tap layers stage s holds (the
 * TAPS it owes a FRAME_SEQ_TAPS step: one if any); a RECEIPT into the ledger, and the node a failed check blames
 * marked faulty; a ROUTES message into rc->routes, and how many stages owe one. */
struct ring_pending *ring_find_pending(ring_coord *rc, uint64_t step);
int ring_stage_taps(const ring_coord *rc, int s);
void ring_take_taps(ring_coord *rc, int from, const zs_parts *p, const frame_header *h);
void ring_take_receipt(ring_coord *rc, int from, const zs_parts *p, const frame_header *h);
void ring_rcpt_blame(ring_coord *rc);
void ring_take_routes(ring_coord *rc, int from, const zs_parts *p, const frame_header *h);
int ring_routes_need(const ring_coord *rc);

/* ring_generate.c: the ring failed (err): close it and open one over the nodes the failures did not name
 * (ex, kept across recoveries); a node that fails the open is left out too. 0 when a ring is open again; -1
 * with err saying why not (rc is closed then). A node caught lying fails it (what was printed may carry its
 * lie). `run --ring` uses it, plain (ring_generate) and speculative (verify_ring.c). */
int ring_reform(ring_coord *rc, bool *ex, rl_err *err);

/* stream.c: streams node the range file for layers [a, b) and waits until it has kept it. */
int ring_stream(ring_coord *rc, int node, const mf_model *m, uint32_t a, uint32_t b, rl_err *err);

/* coord_manifest.c: a manifest ring (ring_opts.manifest). begin: checks the options, reads the manifest's
 * file and sets the model id; info: a node's INFO "files" into its state; lack: what a node would be streamed
 * of each layer (plan_node.lack, PLAN_MAX_LAYERS + 2 entries); lend: the holders of every stage's missing
 * files into holders[s] (cJSON arrays, the caller frees them, also on failure), each holder told to lend. */
int coord_manifest_begin(ring_coord *rc, rl_err *err);
void coord_manifest_info(ring_coord *rc, int from, const cJSON *files);
void coord_manifest_lack(const ring_coord *rc, int node, uint64_t *lack);
int coord_manifest_lend(ring_coord *rc, cJSON **holders, rl_err *err);
/* The split files each stage's range needs, and how many its node holds (printed after the plan). */
void coord_manifest_print(const ring_coord *rc, FILE *out);

/* coord_audit.c: frees the auditing engines. */
void ring_audit_free(ring_coord *rc);

/* coord_probe.c: the delays between the coordinator and the nodes use[] marks, and between those nodes,
 * measured (probe.h) into rc->delay_s / coord_delay_s; -1 with err when a node cannot be asked (an older
 * node, a node that does not answer): the caller keeps ring.conf's order. */
int ring_probe(ring_coord *rc, const bool *use, rl_err *err);
/* The coordinator's own round trips to the nodes in use (coord_delay_s: half of each), a few PINGs each; part
 * of ring_probe. */
int ring_coord_rtts(ring_coord *rc, const bool *use, rl_err *err);
/* A PING to a node with this step id, and the wait (10 s at most) for its PONG; other PONGs are dropped. */
int ring_ping(ring_coord *rc, int node, uint64_t step, rl_err *err);
/* Orders the nodes use[] marks by the measured delays (ring_order.h) into order[0..*n); *cycle_s its round
 * trip, *conf_cycle_s that of ring.conf's order. */
int ring_order_measured(const ring_coord *rc, const bool *use, int *order, int *n, double *cycle_s,
                        double *conf_cycle_s, rl_err *err);

#endif
