/* coord_access.c - an open ring, read from outside (coord.h): small getters, so a user of the ring (serve's
 * ring backend) depends on what they promise rather than on ring_coord's layout. */
#include "coord.h"

const plan_result *ring_plan_get(const ring_coord *rc) { return &rc->plan; }

ring_stage_stats ring_stage_stats_get(const ring_coord *rc, int stage) { return rc->stats[stage]; }

void ring_node_audits_get(const ring_coord *rc, int node, long *n, double *secs) {
    *n = rc->node_audits[node];
    *secs = rc->node_audit_s[node];
}

void ring_node_audits_clear(ring_coord *rc, int node) {
    rc->node_audits[node] = 0;
    rc->node_audit_s[node] = 0;
}

const char *ring_node_fault_get(const ring_coord *rc, int node) { return rc->faulty[node] ? rc->fault[node] : NULL; }

bool ring_node_link_poll(ring_coord *rc, int node, const char **why) {
    zs_monitor *mon = &rc->nodes[node].mon;
    zs_monitor_poll(mon);
    if (why) *why = mon->last;
    return mon->disconnected;
}

bool ring_node_writable_wait(ring_coord *rc, int node, int timeout_ms) {
    return zs_wait_writable(rc->nodes[node].sock, timeout_ms);
}

int ring_audit_pending_count(const ring_coord *rc) { return rc->audit.n; }

int ring_pending_count(const ring_coord *rc) { return rc->n_pending; }
