/* join_token.c - join tokens (join_token.h). */
#include "join_token.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include <sodium.h>

#define JT_CTX "ringlm join v1"
#define JT_MAX (32 + 8 + 32 + 1 + 127 + 64)

/* The bytes the coordinator signs: everything before the signature. Returns their length. */
static size_t jt_body(const jt_token *t, uint8_t *b) {
    size_t n = 0, rl = strlen(t->relay);
    memcpy(b, t->coord_pk, 32), n += 32;
    for (int i = 7; i >= 0; i--) b[n++] = (uint8_t)(t->expires >> (8 * i));
    memcpy(b + n, t->seed, 32), n += 32;
    b[n++] = (uint8_t)rl;
    memcpy(b + n, t->relay, rl), n += rl;
    return n;
}

static void jt_signed_msg(const uint8_t *body, size_t n, uint8_t *msg) {
    memcpy(msg, JT_CTX, sizeof JT_CTX - 1);
    memcpy(msg + sizeof JT_CTX - 1, body, n);
}

int jt_make(const keys_identity *coord, const char *relay, double ttl_s, jt_token *t, char *out, size_t out_n,
            rl_err *err) {
    if (sodium_init() < 0) return rl_errf(err, "libsodium failed to initialise");
    if (strlen(relay) == 0 || strlen(relay) >= sizeof t->relay || !strchr(relay, ':'))
        return rl_errf(err, "bad relay address '%s' (HOST:PORT, under %zu characters)", relay, sizeof t->relay);
    if (!(ttl_s > 0)) return rl_errf(err, "a token must be good for some time (ttl > 0)");
    memset(t, 0, sizeof *t);
    memcpy(t->coord_pk, coord->sign_pk, 32);
    t->expires = (uint64_t)time(NULL) + (uint64_t)(ttl_s + 0.5);
    randombytes_buf(t->seed, 32);
    snprintf(t->relay, sizeof t->relay, "%s", relay);
    uint8_t b[JT_MAX], msg[sizeof JT_CTX + JT_MAX];
    size_t n = jt_body(t, b);
    jt_signed_msg(b, n, msg);
    crypto_sign_detached(b + n, NULL, msg, sizeof JT_CTX - 1 + n, coord->sign_sk);
    n += 64;
    size_t need = strlen(JT_PREFIX) + sodium_base64_ENCODED_LEN(n, sodium_base64_VARIANT_URLSAFE_NO_PADDING);
    if (out_n < need) return rl_errf(err, "token buffer too small");
    memcpy(out, JT_PREFIX, strlen(JT_PREFIX));
    sodium_bin2base64(out + strlen(JT_PREFIX), out_n - strlen(JT_PREFIX), b, n, sodium_base64_VARIANT_URLSAFE_NO_PADDING);
    sodium_memzero(b, sizeof b);
    sodium_memzero(msg, sizeof msg);
    return 0;
}

int jt_parse(const char *text, jt_token *t, rl_err *err) {
    if (sodium_init() < 0) return rl_errf(err, "libsodium failed to initialise");
    memset(t, 0, sizeof *t);
    if (strncmp(text, JT_PREFIX, strlen(JT_PREFIX)) != 0)
        return rl_errf(err, "not a ringlm join token (it does not start with \"" JT_PREFIX "\")");
    uint8_t b[JT_MAX + 1];
    size_t n = 0;
    const char *b64 = text + strlen(JT_PREFIX);
    if (sodium_base642bin(b, sizeof b, b64, strlen(b64), NULL, &n, NULL, sodium_base64_VARIANT_URLSAFE_NO_PADDING) != 0 ||
        n < 32 + 8 + 32 + 1 + 64 || n != 32 + 8 + 32 + 1 + (size_t)b[72] + 64 || b[72] >= sizeof t->relay)
        return rl_errf(err, "the join token is damaged (copied incompletely?)");
    memcpy(t->coord_pk, b, 32);
    for (int i = 0; i < 8; i++) t->expires = t->expires << 8 | b[32 + i];
    memcpy(t->seed, b + 40, 32);
    memcpy(t->relay, b + 73, b[72]);
    t->relay[b[72]] = 0;
    size_t body = n - 64;
    uint8_t msg[sizeof JT_CTX + JT_MAX];
    jt_signed_msg(b, body, msg);
    int bad = crypto_sign_verify_detached(b + body, msg, sizeof JT_CTX - 1 + body, t->coord_pk);
    sodium_memzero(b, sizeof b);
    sodium_memzero(msg, sizeof msg);
    if (bad) {
        sodium_memzero(t, sizeof *t);
        return rl_errf(err, "the join token's signature is not its coordinator's (altered?)");
    }
    return 0;
}

int jt_check_expiry(const jt_token *t, uint64_t now, rl_err *err) {
    if (now < t->expires) return 0;
    time_t e = (time_t)t->expires;
    struct tm tm;
    char when[64];
    strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", gmtime_r(&e, &tm));
    return rl_errf(err, "the join token expired at %s: ask the coordinator for a new one", when);
}
