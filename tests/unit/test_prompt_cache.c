/* test_prompt_cache - serve's host-RAM prompt cache (src/serve/prompt_cache.h):
 * - the longest stored prefix of a prompt is found, within a length bound, and only a real prefix;
 * - an entry for the same tokens replaces the old one; the least recently used is evicted for room, and one
 *   found (used) survives an older one; an entry over the whole budget is refused by name;
 * - a corrupted entry (a blob or token byte changed after it was stored) is never returned: it is dropped,
 *   counted, and the next longest prefix is found instead.
 * The ASan build runs it too. */
#include <stdlib.h>
#include <string.h>

#include "serve/prompt_cache.h"

#include "check.h"

static uint8_t *blob_of(size_t len, uint8_t v) {
    uint8_t *b = malloc(len);
    memset(b, v, len);
    return b;
}

int main(void) {
    int32_t toks[64];
    for (int i = 0; i < 64; i++) toks[i] = 100 + i;
    const size_t one = pc_entry_bytes(32, 1000);
    pc_cache c;
    pc_init(&c, 3 * one);
    rl_err err;

    CHECK(pc_find(&c, toks, 64, 62) == -1, "an empty cache finds nothing");
    CHECK(pc_put(&c, toks, 16, blob_of(1000, 1), 1000, &err) == 0 && pc_put(&c, toks, 32, blob_of(1000, 2), 1000, &err) == 0,
          "two prefixes of one prompt stored");
    int i = pc_find(&c, toks, 64, 62);
    CHECK(i >= 0 && c.e[i].n == 32 && c.e[i].blob[0] == 2, "the longest stored prefix is found");
    i = pc_find(&c, toks, 64, 20);
    CHECK(i >= 0 && c.e[i].n == 16, "... within the bound asked for (20 tokens: the 16-token one)");
    CHECK(pc_find(&c, toks, 10, 62) == -1, "a prompt shorter than every entry finds none");
    int32_t other[64];
    memcpy(other, toks, sizeof other);
    other[20] = 7; /* shares 20 tokens with the prompt */
    i = pc_find(&c, other, 64, 62);
    CHECK(i >= 0 && c.e[i].n == 16, "a prompt that differs at token 20 finds the 16-token prefix, not the 32");
    CHECK(pc_has(&c, toks, 16) && !pc_has(&c, toks, 17), "pc_has: exactly the stored lengths");

    CHECK(pc_put(&c, toks, 32, blob_of(1000, 9), 1000, &err) == 0 && c.n == 2, "the same tokens again replace the entry");
    i = pc_find(&c, toks, 64, 62);
    CHECK(i >= 0 && c.e[i].blob[0] == 9, "... with the new state");

    /* Budget of three: 16, 32 stored; touch 16, add two more: the LRU (32) goes first. */
    pc_find(&c, toks, 64, 20);
    CHECK(pc_put(&c, toks, 20, blob_of(1000, 3), 1000, &err) == 0, "a third entry fits");
    CHECK(pc_put(&c, toks, 24, blob_of(1000, 4), 1000, &err) == 0 && c.n == 3 && c.evicted == 1, "a fourth evicts one");
    CHECK(!pc_has(&c, toks, 32) && pc_has(&c, toks, 16), "the least recently used went (32), the one just found stayed (16)");
    CHECK(c.bytes <= c.budget, "the entries stay within the budget (%zu of %zu bytes)", c.bytes, c.budget);
    CHECK(pc_put(&c, toks, 8, blob_of(4 * one, 5), 4 * one, &err) == -1 && strstr(err.msg, "over the prompt cache's"),
          "an entry larger than the budget is refused by name: %s", err.msg);

    /* Corruption: a changed byte makes the entry a miss; the next longest serves instead. */
    i = pc_find(&c, toks, 64, 62);
    CHECK(i >= 0 && c.e[i].n == 24, "before: the 24-token prefix is the longest");
    c.e[i].blob[500] ^= 0x10;
    i = pc_find(&c, toks, 64, 62);
    CHECK(i >= 0 && c.e[i].n == 20 && c.corrupt == 1 && !pc_has(&c, toks, 24),
          "a blob changed after storing: dropped and counted, the 20-token prefix found instead");
    c.e[i].tokens[3] ^= 1; /* a token changed: no longer this prompt's prefix, and its sum fails too */
    i = pc_find(&c, toks, 64, 62);
    CHECK(i >= 0 && c.e[i].n == 16, "a changed token: that entry no longer matches (the 16-token one does)");
    CHECK(pc_sum(toks, 4, (const uint8_t *)"abcd", 4) != pc_sum(toks, 4, (const uint8_t *)"abce", 4) &&
              pc_sum(toks, 4, (const uint8_t *)"abcd", 4) == pc_sum(toks, 4, (const uint8_t *)"abcd", 4),
          "pc_sum: equal inputs agree, a changed byte differs");
    pc_free(&c);
    CHECK(c.n == 0 && c.bytes == 0, "freed");
    return check_done();
}
