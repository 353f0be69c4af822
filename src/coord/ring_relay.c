/* ring_relay.c - the relay a coordinator runs for its ring's nodes behind NATs (`--relay-listen`; coord.h,
 * net/tunnel.h): it admits the keys ring.conf names, and only those. */
#include "coord.h"

#include <stdio.h>
#include <string.h>

#include <sodium.h>

#include "../trust/join_token.h"

/* A key may wait at our relay if ring.conf lists it (whatever its address there: a node moved behind a relay
 * keeps its line's key). A node started with a join token presents it: one another coordinator signed is
 * refused by name (its key is no key of ours either, but "foreign token" says what to do). Its expiry was the
 * node's to check at start: a node keeps registering its waiting connections long after. */
static bool ring_relay_admit(void *ctx, const uint8_t sign_pk[32], const uint8_t *token, size_t token_len, char *why,
                             size_t why_n) {
    const ring_relay *r = ctx;
    if (token_len > 0) {
        char text[TN_TOKEN_MAX + 1];
        jt_token t;
        rl_err err = {{0}};
        memcpy(text, token, token_len);
        text[token_len] = 0;
        if (jt_parse(text, &t, &err) != 0) {
            snprintf(why, why_n, "its join token: %s", err.msg);
            return false;
        }
        if (memcmp(t.coord_pk, r->coord_pk, 32) != 0) {
            char hex[65];
            sodium_bin2hex(hex, sizeof hex, t.coord_pk, 32);
            snprintf(why, why_n, "its join token was issued by another coordinator (key %.16s...), not this one", hex);
            return false;
        }
    }
    for (int i = 0; i < r->conf->n; i++)
        if (memcmp(r->conf->nodes[i].key.sign_pk, sign_pk, 32) == 0) return true;
    snprintf(why, why_n, "this coordinator's ring.conf does not list that key");
    return false;
}

int ring_relay_start(ring_relay *r, const char *listen, const ring_conf *conf, const keys_identity *id, rl_err *err) {
    r->relay = NULL;
    r->conf = conf;
    memcpy(r->coord_pk, id->sign_pk, 32);
    if (!listen) return 0;
    r->relay = tn_relay_start(listen, ring_relay_admit, r, true, err);
    if (!r->relay) return -1;
    fprintf(stderr, "ringlm: relay for nodes behind NATs: listening on %s\n", tn_relay_addr(r->relay));
    return 0;
}

const char *ring_relay_addr(const ring_relay *r) { return r->relay ? tn_relay_addr(r->relay) : NULL; }

int ring_relay_query(const ring_node_conf *nc, double timeout_s, rl_err *err) {
    char relay[128];
    if (!tn_addr_relay(nc->addr, relay, sizeof relay)) return 1;
    return tn_query(relay, nc->key.curve_pk, timeout_s, err);
}

void ring_relay_stop(ring_relay *r) {
    tn_relay_stop(r->relay);
    r->relay = NULL;
}
