/* keys.h - node and coordinator identities.
 *
 * One Ed25519 key pair per machine (libsodium). Its public key, 64 hex characters, is the name other
 * machines know it by (ring.conf, --allow, receipts). The CURVE key pair ZeroMQ uses for encryption and
 * mutual authentication is derived from it (Ed25519 -> X25519), so one file and one public key serve both.
 *
 * Key file: two lines, "ringlm-key 1" and the 64-byte secret key in hex; created with mode 0600. */
#ifndef RINGLM_KEYS_H
#define RINGLM_KEYS_H

#include <stdint.h>

#include "../base/err.h"

typedef struct keys_identity {
    uint8_t sign_pk[32], sign_sk[64];   /* Ed25519 */
    uint8_t curve_pk[32], curve_sk[32]; /* X25519, for ZeroMQ CURVE */
    char pk_hex[65];                    /* sign_pk in hex */
    char curve_pk_z85[41], curve_sk_z85[41];
} keys_identity;

int keys_generate(keys_identity *id, rl_err *err);
/* The identity whose Ed25519 seed is seed (a join token's node key: trust/join_token.h). */
int keys_from_seed(keys_identity *id, const uint8_t seed[32], rl_err *err);
int keys_save(const keys_identity *id, const char *path, rl_err *err); /* refuses to overwrite */
int keys_load(keys_identity *id, const char *path, rl_err *err);

/* A peer known by its public key: parses 64 hex chars and derives its CURVE public key (Z85). */
typedef struct keys_peer {
    uint8_t sign_pk[32];
    uint8_t curve_pk[32];
    char pk_hex[65];
    char curve_pk_z85[41];
} keys_peer;

int keys_peer_parse(keys_peer *p, const char *hex, rl_err *err);

/* The public keys, as users write them (Ed25519 hex), whose CURVE key is curve_pk: what a node can say of a
 * peer it refused, since the handshake carries only the CURVE key. Ed25519 -> X25519 keeps the point's y
 * and drops the sign of its x, so there are two such keys, equal but for the top bit of the last byte;
 * the handshake cannot tell which one the peer holds. Fills hex[0..n) with those that are valid keys and
 * returns n (0 for a CURVE key no Ed25519 key maps to). */
int keys_curve_to_names(const uint8_t curve_pk[32], char hex[2][65]);

#endif
