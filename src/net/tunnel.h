/* tunnel.h - reaching a node behind a home router (NAT) through a relay that a public ring member runs.
 *
 * A node that cannot accept connections dials out instead: it keeps a few TCP connections open to a relay
 * (the coordinator's `--relay-listen`, or a public node's), proving its key on each. Whoever wants to reach
 * that node (the coordinator, its upstream stage, a prober, a fetcher) connects to the relay and names the
 * node's key; the relay hands over one of the node's waiting connections and from then on copies bytes both
 * ways. The ZeroMQ CURVE session runs end to end inside that pipe: the relay sees ciphertext only, and the
 * node's allowlist decides, as on a direct link, who may talk to it. When the relay is the coordinator
 * itself, its link to the node is the node's own outgoing connection used the other way round (no extra
 * hop); an edge between two nodes that both dialled out goes through the relay (+1 hop).
 *
 * Addresses: ring.conf writes such a node `relay:HOST:PORT PUBKEY`; the ring calls it
 * "relay:HOST:PORT/<first 8 hex of its key>" (unique per node, so messages can name it), and zs_client turns
 * that into a loopback port of this process's connector (tn_connector), which does the relay's handshake.
 *
 * The wire (TCP, all integers big-endian): the relay greets every connection with "RLT1" + a 32-byte
 * nonce. A node registering answers 'R', its Ed25519 key, its signature of "ringlm tunnel v1" + nonce, a
 * u16 token length and the token (a join token, docs/ring.md; may be empty); a client answers 'C' and the
 * CURVE key of the node it wants; a query ('Q' and a CURVE key) asks only whether that node is there. The relay replies 'K' (accepted) or 'E', a u8 length and a message. A
 * waiting registration carries 'P' (node, every TN_PING_S) and 'p' (the relay's answer) until the relay
 * sends 'G'; the node answers 'A' and both sides copy bytes from then on. Pings in flight before 'G' or
 * 'A' are skipped by whoever reads them, so no ping byte ever reaches a ZeroMQ stream. */
#ifndef RINGLM_TUNNEL_H
#define RINGLM_TUNNEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/err.h"
#include "../trust/keys.h"

#define TN_TOKEN_MAX 1024 /* a join token a node presents, at most */
#define TN_POOL 2          /* connections a node keeps waiting at its relay */
#define TN_PING_S 2.0      /* a waiting connection pings this often (home routers forget idle mappings; and
                            * the relay can tell a live node from one gone silent: tn_query) */
#define TN_SILENT_S 10.0   /* ... and is dropped (both ends) after this long without a word */
#define TN_ALIVE_S 5.0     /* tn_query: a node heard from this recently is there */
#define TN_HANDSHAKE_S 5.0 /* the relay's greeting and the answers to it */
#define TN_RELAY_CONNS 512 /* a relay's connections in a handshake or carried at once: past it new ones are
                           * closed at once (a flood of connections must not become a flood of threads) */
#define TN_CLAIM_S 2.0     /* a client waits this long for a waiting connection of its node (and for its 'A') */

/* Is addr a relayed node address ("relay:HOST:PORT" or "relay:HOST:PORT/TAG")? Fills relay with HOST:PORT. */
bool tn_addr_relay(const char *addr, char *relay, size_t n);

/* ---- the relay (a public ring member) ---- */
/* Decides whether a node may register: its Ed25519 key and the join token it sent (may be empty). Returns
 * true, or false with why filled (sent back to the node). Called on the relay's threads. */
typedef bool (*tn_admit_fn)(void *ctx, const uint8_t sign_pk[32], const uint8_t *token, size_t token_len, char *why,
                            size_t why_n);
typedef struct tn_relay tn_relay;
typedef struct tn_relay_stats {
    int nodes;        /* keys with a connection waiting */
    int waiting;      /* connections waiting */
    long spliced;     /* connections handed to a client */
    long refused;     /* registrations refused */
    long unknown;     /* clients that asked for a key nobody registered */
} tn_relay_stats;
/* Listens on HOST:PORT (port 0: any; tn_relay_addr says which). admit NULL admits every key that proves it. */
tn_relay *tn_relay_start(const char *listen, tn_admit_fn admit, void *admit_ctx, bool log, rl_err *err);
const char *tn_relay_addr(const tn_relay *r);
void tn_relay_stats_get(tn_relay *r, tn_relay_stats *s);
/* Is a node with this CURVE key registered (a connection waiting)? */
bool tn_relay_has(tn_relay *r, const uint8_t curve_pk[32]);
void tn_relay_stop(tn_relay *r); /* closes every connection, joins every thread */

/* ---- a node's dial-out ---- */
typedef struct tn_dialout tn_dialout;
/* Keeps TN_POOL connections registered at relay (HOST:PORT) under id, each handed-over one spliced to local
 * (this node's own ZeroMQ endpoint, HOST:PORT). token: a join token to present (NULL: none). */
tn_dialout *tn_dialout_start(const char *relay, const keys_identity *id, const char *local, const char *token,
                             bool log, rl_err *err);
/* Registered now? why: the relay's last refusal or the last connection error ("" if none). */
bool tn_dialout_state(tn_dialout *d, char *why, size_t n);
void tn_dialout_stop(tn_dialout *d);

/* ---- a client's connector ---- */
typedef struct tn_connector tn_connector;
tn_connector *tn_connector_new(rl_err *err);
/* A loopback HOST:PORT that reaches the node with CURVE key curve_pk through relay (HOST:PORT): each TCP
 * connection made to it is carried through the relay. The same (relay, key) gives the same port. */
int tn_connector_endpoint(tn_connector *c, const char *relay, const uint8_t curve_pk[32], char *out, size_t n,
                          rl_err *err);
/* Asks relay whether the node with CURVE key curve_pk is there (a connection of it waiting, heard from within
 * TN_ALIVE_S): 0, or -1 with err saying why not (the relay's answer, or that the relay does not answer). */
int tn_query(const char *relay, const uint8_t curve_pk[32], double timeout_s, rl_err *err);
/* The relay's last refusal for that key ("" if none): why a relayed node does not answer. */
void tn_connector_why(tn_connector *c, const uint8_t curve_pk[32], char *out, size_t n);
void tn_connector_free(tn_connector *c);

#endif
