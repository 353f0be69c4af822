/* probe.h - the delays between a ring's nodes, measured by the nodes themselves (issue #21: "the delay to
 * their ring neighbours, measured, not assumed").
 *
 * The coordinator asks every node, one at a time, to time a few round trips to each of the others (PROBE);
 * the others answer PROBE_PING with PROBE_PONG only for keys the coordinator named to them first (PEERS).
 * A node pings every peer at once, a few rounds, and keeps each peer's fastest round trip: the first round
 * also pays the CURVE handshake. The coordinator times its own PINGs to each node. Half a round trip is
 * taken as the one-way delay of messages from the pinger to the pinged (ring_order.h then orders the ring
 * with the directed figures: the exact solver follows the direction of travel). */
#ifndef RINGLM_PROBE_H
#define RINGLM_PROBE_H

#include "../base/err.h"
#include "../trust/keys.h"
#include "tunnel.h"

#define PB_ROUNDS 4
/* A ring's other nodes: as many as a plan has (PLAN_MAX_NODES, src/plan/plan.h; coord_probe.c checks the
 * two agree), written out so the transport need not include the planner. */
#define PB_MAX_PEERS 64

typedef struct probe_peer {
    char addr[128];
    keys_peer key;
} probe_peer;

/* Times PB_ROUNDS round trips to each of peers[0..n) (DEALER sockets under id, on zctx; relayed peers through tn); rtt_s[i] the
 * fastest, or -1 if peer i did not answer within timeout_s. Fails only on a local error (a socket). */
int probe_measure(void *zctx, tn_connector *tn, const keys_identity *id, const probe_peer *peers, int n, double timeout_s, double *rtt_s,
               rl_err *err);

#endif
