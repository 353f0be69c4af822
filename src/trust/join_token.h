/* join_token.h - one line for a home user to join a ring (issue #53; docs/ring.md, "Joining with a token").
 *
 * The coordinator makes a token (`ringlm join-token`): a fresh node identity (its Ed25519 seed), the relay the
 * node dials out to, the coordinator's public key, an expiry, all signed by the coordinator. It appends the
 * node's line (relay:HOST:PORT PUBKEY) to its ring.conf, so its relay admits that key like any other it lists.
 * On the node, `ringlm node --join TOKEN --models DIR` is the whole command line: the token gives its key,
 * the relay to dial and the coordinator to allow. A token is a secret (it carries the node's key): send it as
 * you would a password.
 *
 * Text: "rlj1-" and base64url (no padding) of: the coordinator's Ed25519 key (32) | expiry, Unix seconds (u64,
 * big-endian) | the node's seed (32) | relay length (u8) | relay HOST:PORT | the coordinator's signature (64)
 * of "ringlm join v1" + everything before it. */
#ifndef RINGLM_JOIN_TOKEN_H
#define RINGLM_JOIN_TOKEN_H

#include <stdint.h>

#include "../base/err.h"
#include "keys.h"

#define JT_PREFIX "rlj1-"

typedef struct jt_token {
    uint8_t coord_pk[32];
    uint64_t expires;  /* Unix seconds */
    uint8_t seed[32];  /* the node's identity */
    char relay[128];
} jt_token;

/* A token for a new node (seed drawn here) that dials relay, good for ttl_s seconds from now; out gets its
 * text (out_n >= 512). */
int jt_make(const keys_identity *coord, const char *relay, double ttl_s, jt_token *t, char *out, size_t out_n,
            rl_err *err);
/* Parses text and checks its signature by the coordinator key it names (not that it has not expired:
 * jt_check_expiry). Errors name what is wrong: not a token, damaged, not signed by its coordinator. */
int jt_parse(const char *text, jt_token *t, rl_err *err);
/* 0 while now (Unix seconds) is before t's expiry; else -1 with "the join token expired at <UTC time>". */
int jt_check_expiry(const jt_token *t, uint64_t now, rl_err *err);

#endif
