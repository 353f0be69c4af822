#include "keys.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <sodium.h>
#include <zmq.h>

static int keys_derive(keys_identity *id, rl_err *err) {
    if (crypto_sign_ed25519_pk_to_curve25519(id->curve_pk, id->sign_pk) != 0 ||
        crypto_sign_ed25519_sk_to_curve25519(id->curve_sk, id->sign_sk) != 0) {
        return rl_errf(err, "cannot derive the CURVE key from this Ed25519 key");
    }
    sodium_bin2hex(id->pk_hex, sizeof id->pk_hex, id->sign_pk, 32);
    if (!zmq_z85_encode(id->curve_pk_z85, id->curve_pk, 32) || !zmq_z85_encode(id->curve_sk_z85, id->curve_sk, 32)) {
        return rl_errf(err, "cannot encode the CURVE key");
    }
    return 0;
}

int keys_generate(keys_identity *id, rl_err *err) {
    if (sodium_init() < 0) return rl_errf(err, "libsodium failed to initialise");
    memset(id, 0, sizeof *id);
    crypto_sign_keypair(id->sign_pk, id->sign_sk);
    return keys_derive(id, err);
}

int keys_from_seed(keys_identity *id, const uint8_t seed[32], rl_err *err) {
    if (sodium_init() < 0) return rl_errf(err, "libsodium failed to initialise");
    memset(id, 0, sizeof *id);
    crypto_sign_seed_keypair(id->sign_pk, id->sign_sk, seed);
    return keys_derive(id, err);
}

int keys_save(const keys_identity *id, const char *path, rl_err *err) {
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    if (fd < 0) {
        return rl_errf(err, "cannot create %s: %s%s", path, strerror(errno),
                       errno == EEXIST ? " (a key is never overwritten; remove it first)" : "");
    }
    char hex[129];
    sodium_bin2hex(hex, sizeof hex, id->sign_sk, 64);
    char buf[160];
    int n = snprintf(buf, sizeof buf, "ringlm-key 1\n%s\n", hex);
    sodium_memzero(hex, sizeof hex);
    int ok = write(fd, buf, (size_t)n) == n;
    sodium_memzero(buf, sizeof buf);
    ok &= close(fd) == 0;
    if (!ok) {
        unlink(path);
        return rl_errf(err, "cannot write %s", path);
    }
    return 0;
}

int keys_load(keys_identity *id, const char *path, rl_err *err) {
    if (sodium_init() < 0) return rl_errf(err, "libsodium failed to initialise");
    memset(id, 0, sizeof *id);
    FILE *f = fopen(path, "r");
    if (!f) return rl_errf(err, "cannot open key %s: %s", path, strerror(errno));
    char line1[32] = {0}, hex[160] = {0};
    int ok = fgets(line1, sizeof line1, f) && fgets(hex, sizeof hex, f);
    fclose(f);
    if (!ok || strcmp(line1, "ringlm-key 1\n") != 0) return rl_errf(err, "%s is not a ringlm key file", path);
    hex[strcspn(hex, "\r\n")] = 0;
    size_t bin_len = 0;
    if (strlen(hex) != 128 || sodium_hex2bin(id->sign_sk, 64, hex, 128, NULL, &bin_len, NULL) != 0 || bin_len != 64) {
        sodium_memzero(hex, sizeof hex);
        return rl_errf(err, "%s: the secret key is not 128 hex characters", path);
    }
    sodium_memzero(hex, sizeof hex);
    crypto_sign_ed25519_sk_to_pk(id->sign_pk, id->sign_sk);
    return keys_derive(id, err);
}

int keys_peer_parse(keys_peer *p, const char *hex, rl_err *err) {
    if (sodium_init() < 0) return rl_errf(err, "libsodium failed to initialise");
    memset(p, 0, sizeof *p);
    size_t n = 0;
    if (strlen(hex) != 64 || sodium_hex2bin(p->sign_pk, 32, hex, 64, NULL, &n, NULL) != 0 || n != 32) {
        return rl_errf(err, "public key '%.70s' is not 64 hex characters", hex);
    }
    if (crypto_sign_ed25519_pk_to_curve25519(p->curve_pk, p->sign_pk) != 0) {
        return rl_errf(err, "public key %.16s... is not a valid Ed25519 key", hex);
    }
    sodium_bin2hex(p->pk_hex, sizeof p->pk_hex, p->sign_pk, 32);
    if (!zmq_z85_encode(p->curve_pk_z85, p->curve_pk, 32)) return rl_errf(err, "cannot encode a CURVE key");
    return 0;
}

/* ---- X25519 -> Ed25519: y = (u - 1) / (u + 1) mod p, p = 2^255 - 19 ------------------------------------
 * libsodium converts only the other way, so this is a small field implementation of our own: 16 limbs of
 * 16 bits in int64, kept non-negative (subtraction adds 4p first), products folded with 2^256 = 38 mod p.
 * It handles public data only, so it need not run in constant time. */
typedef int64_t keys_fe[16];

static void keys_fe_carry(keys_fe o) {
    for (int pass = 0; pass < 3; pass++) {
        for (int i = 0; i < 16; i++) {
            int64_t c = o[i] >> 16; /* limbs are non-negative here */
            o[i] &= 0xffff;
            if (i < 15) o[i + 1] += c;
            else o[0] += 38 * c;
        }
    }
}

static void keys_fe_add(keys_fe o, const keys_fe a, const keys_fe b) {
    for (int i = 0; i < 16; i++) o[i] = a[i] + b[i];
    keys_fe_carry(o);
}

static void keys_fe_sub(keys_fe o, const keys_fe a, const keys_fe b) { /* a, b carried: limbs in [0, 0xffff] */
    for (int i = 0; i < 16; i++) o[i] = a[i] + (i == 0 ? 0x3ffb4 : i == 15 ? 0x1fffc : 0x3fffc) - b[i]; /* + 4p */
    keys_fe_carry(o);
}

static void keys_fe_mul(keys_fe o, const keys_fe a, const keys_fe b) {
    int64_t t[31] = {0};
    for (int i = 0; i < 16; i++) {
        for (int j = 0; j < 16; j++) t[i + j] += a[i] * b[j];
    }
    for (int i = 0; i < 15; i++) t[i] += 38 * t[i + 16];
    for (int i = 0; i < 16; i++) o[i] = t[i];
    keys_fe_carry(o);
}

static void keys_fe_invert(keys_fe o, const keys_fe a) { /* a^(p-2); p-2 = 2^255 - 21: bits 254..5 set, then 01011 */
    keys_fe c = {1};
    for (int i = 254; i >= 0; i--) {
        keys_fe_mul(c, c, c);
        if (i >= 5 || ((11 >> i) & 1)) keys_fe_mul(c, c, a);
    }
    memcpy(o, c, sizeof c);
}

static void keys_fe_pack(uint8_t out[32], const keys_fe a) { /* the canonical value, below p */
    keys_fe t;
    memcpy(t, a, sizeof t);
    keys_fe_carry(t);
    keys_fe_carry(t); /* a carry out of the top limb can leave limb 0 a little above 16 bits: settle it */
    for (int k = 0; k < 2; k++) {
        keys_fe m;
        int64_t borrow = 0;
        for (int i = 0; i < 16; i++) {
            m[i] = t[i] - (i == 0 ? 0xffed : i == 15 ? 0x7fff : 0xffff) - borrow;
            borrow = m[i] < 0;
            if (borrow) m[i] += 0x10000;
        }
        if (!borrow) memcpy(t, m, sizeof t); /* t >= p: take t - p */
    }
    for (int i = 0; i < 16; i++) out[2 * i] = (uint8_t)t[i], out[2 * i + 1] = (uint8_t)(t[i] >> 8);
}

int keys_curve_to_names(const uint8_t curve_pk[32], char hex[2][65]) {
    keys_fe u, one = {1}, num, den, inv, y;
    for (int i = 0; i < 16; i++) u[i] = curve_pk[2 * i] | (int64_t)curve_pk[2 * i + 1] << 8;
    u[15] &= 0x7fff; /* X25519 ignores the top bit */
    keys_fe_carry(u);
    keys_fe_sub(num, u, one);
    keys_fe_add(den, u, one);
    keys_fe_invert(inv, den); /* u = -1 has no Ed25519 key: inv = 0, y = 0, and the check below fails */
    keys_fe_mul(y, num, inv);
    uint8_t ed[32], back[32];
    keys_fe_pack(ed, y);
    int n = 0;
    for (int sign = 0; sign < 2; sign++) {
        ed[31] = (uint8_t)((ed[31] & 0x7f) | (sign << 7));
        if (crypto_sign_ed25519_pk_to_curve25519(back, ed) != 0) continue; /* not a point */
        uint8_t want[32];
        memcpy(want, curve_pk, 32);
        want[31] &= 0x7f;
        if (memcmp(back, want, 32) != 0) continue;
        sodium_bin2hex(hex[n++], 65, ed, 32);
    }
    return n;
}
