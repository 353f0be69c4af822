/* test_keys.c - naming a peer by the key users write, from the CURVE key its handshake shows
 * (keys_curve_to_names): for 200 fresh identities, the Ed25519 public key is among the names found for its
 * CURVE key, and both names map back to that CURVE key; the other name differs in the top bit only. A
 * CURVE key no Ed25519 key maps to (u = p - 1, i.e. -1) gives no name. */
#include <sodium.h>
#include <string.h>

#include "check.h"
#include "trust/keys.h"

int main(void) {
    int found = 0, both_back = 0, pairs = 0;
    const int N = 200;
    for (int k = 0; k < N; k++) {
        keys_identity id;
        rl_err err;
        if (keys_generate(&id, &err) != 0) return 1;
        char hex[2][65];
        int n = keys_curve_to_names(id.curve_pk, hex);
        int hit = 0, back = n == 2;
        for (int i = 0; i < n; i++) {
            hit |= strcmp(hex[i], id.pk_hex) == 0;
            keys_peer p;
            back &= keys_peer_parse(&p, hex[i], &err) == 0 && memcmp(p.curve_pk, id.curve_pk, 32) == 0;
        }
        found += hit;
        both_back += back;
        /* The two names: equal but for bit 7 of the last byte (hex digits 62..63). */
        uint8_t a[32], b[32];
        if (n == 2 && sodium_hex2bin(a, 32, hex[0], 64, NULL, NULL, NULL) == 0 &&
            sodium_hex2bin(b, 32, hex[1], 64, NULL, NULL, NULL) == 0) {
            pairs += memcmp(a, b, 31) == 0 && (a[31] ^ b[31]) == 0x80;
        }
    }
    CHECK(found == N, "the Ed25519 key is among the names of its CURVE key (%d of %d)", found, N);
    CHECK(both_back == N, "both names map back to the same CURVE key (%d of %d)", both_back, N);
    CHECK(pairs == N, "the two names differ in the sign bit only (%d of %d)", pairs, N);
    uint8_t minus_one[32];
    memset(minus_one, 0xff, 32);
    minus_one[0] = 0xec; /* p - 1 = 2^255 - 20 */
    minus_one[31] = 0x7f;
    char hex[2][65];
    CHECK(keys_curve_to_names(minus_one, hex) == 0, "u = -1 has no Ed25519 name");
    return check_done();
}
