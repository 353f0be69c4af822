/* test_join_token.c - join tokens (trust/join_token.h): a token made for a relay parses back to the same
 * coordinator key, relay, seed and expiry, and its seed is a working node identity; every byte altered (any
 * position of the text) is refused, as are a truncated token, another prefix, a relay that is no HOST:PORT
 * or too long, and a zero lifetime; the expiry is checked to the second and named in UTC. */
#include <sodium.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "trust/join_token.h"

int main(void) {
    keys_identity coord, node;
    rl_err err = {{0}};
    if (keys_generate(&coord, &err) != 0) return 1;
    jt_token t, u;
    char text[600];
    uint64_t now = (uint64_t)time(NULL);
    CHECK(jt_make(&coord, "203.0.113.5:7700", 3600, &t, text, sizeof text, &err) == 0 && strncmp(text, "rlj1-", 5) == 0,
          "a token for a relay (%zu characters)", strlen(text));
    CHECK(jt_parse(text, &u, &err) == 0 && memcmp(u.coord_pk, coord.sign_pk, 32) == 0 &&
              strcmp(u.relay, "203.0.113.5:7700") == 0 && memcmp(u.seed, t.seed, 32) == 0 && u.expires == t.expires &&
              u.expires >= now + 3599 && u.expires <= now + 3601,
          "it parses back: the coordinator's key, the relay, the node's seed, an expiry an hour on");
    CHECK(keys_from_seed(&node, u.seed, &err) == 0 && memcmp(node.sign_pk, coord.sign_pk, 32) != 0,
          "its seed is a node identity of its own (%.16s...)", node.pk_hex);
    int refused = 0, n = (int)strlen(text);
    for (int i = 0; i < n; i++) { /* every character changed to another base64url one */
        char bad[600];
        memcpy(bad, text, (size_t)n + 1);
        bad[i] = bad[i] == 'A' ? 'B' : 'A';
        if (i == 4) bad[i] = '_'; /* the prefix's '-' */
        rl_err e = {{0}};
        refused += jt_parse(bad, &u, &e) != 0 && (strstr(e.msg, "join token") != NULL);
    }
    CHECK(refused == n, "every one of its %d characters altered: refused, naming the join token (%d)", n, refused);
    char cut[600];
    snprintf(cut, sizeof cut, "%.*s", n - 10, text);
    CHECK(jt_parse(cut, &u, &err) != 0 && strstr(err.msg, "damaged"), "a truncated token: %s", err.msg);
    CHECK(jt_parse("hello", &u, &err) != 0 && strstr(err.msg, "not a ringlm join token"), "no prefix: %s", err.msg);
    CHECK(jt_make(&coord, "noport", 60, &t, text, sizeof text, &err) != 0 && strstr(err.msg, "bad relay address"),
          "a relay that is no HOST:PORT: %s", err.msg);
    char longr[200];
    memset(longr, 'a', sizeof longr);
    memcpy(longr + 150, ":7700", 6);
    CHECK(jt_make(&coord, longr, 60, &t, text, sizeof text, &err) != 0, "a relay address too long: %s", err.msg);
    CHECK(jt_make(&coord, "h:1", 0, &t, text, sizeof text, &err) != 0, "no lifetime: %s", err.msg);
    jt_token e = {.expires = 1800000000};
    CHECK(jt_check_expiry(&e, 1799999999, &err) == 0, "good until its last second");
    CHECK(jt_check_expiry(&e, 1800000000, &err) != 0 && strstr(err.msg, "expired at 2027-01-15 08:00:00 UTC"),
          "then expired, named in UTC: %s", err.msg);
    return check_done();
}
