#include "keys.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <sodium.h>
#include <zmq.h>

static int rk_derive(rk_identity *id, rl_err *err) {
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

int rk_generate(rk_identity *id, rl_err *err) {
    if (sodium_init() < 0) return rl_errf(err, "libsodium failed to initialise");
    memset(id, 0, sizeof *id);
    crypto_sign_keypair(id->sign_pk, id->sign_sk);
    return rk_derive(id, err);
}

int rk_save(const rk_identity *id, const char *path, rl_err *err) {
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

int rk_load(rk_identity *id, const char *path, rl_err *err) {
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
    return rk_derive(id, err);
}

int rk_peer_parse(rk_peer *p, const char *hex, rl_err *err) {
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
