/* prompt_cache.h - the server's host-RAM prompt cache (`--cache-ram`): the states of prompt prefixes,
 * kept after the slot that computed them moved on, so that a later request starting with the same tokens
 * reads only what follows (docs/serve.md, "Prompt cache").
 *
 * An entry is a token prefix and an opaque state blob (the backend's format: for one machine, the KDA
 * snapshot and MLA cache rows after those tokens). Entries are evicted least recently used first to stay
 * within the byte budget. Each entry carries a checksum of its tokens and blob, checked before it is used:
 * memory that changed under it (a bug, a bit flip) makes it a miss, never wrong state.
 *
 * One owner, one thread (the scheduler thread, through its backend); nothing here locks. */
#ifndef RINGLM_PROMPT_CACHE_H
#define RINGLM_PROMPT_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/err.h"

typedef struct pc_entry {
    int32_t *tokens; /* the prefix */
    uint32_t n;
    uint8_t *blob;   /* the state after it */
    size_t len;
    uint64_t sum;    /* pc_sum of tokens and blob when stored */
    uint64_t used;   /* the cache's clock when last stored or found */
} pc_entry;

typedef struct pc_cache {
    pc_entry *e;
    int n, cap;
    size_t budget;   /* bytes the entries may hold in all (tokens and blobs) */
    size_t bytes;    /* what they hold */
    uint64_t clock;
    uint64_t stored, evicted, corrupt; /* entries stored, evicted for room, and dropped as corrupt */
} pc_cache;

void pc_init(pc_cache *c, size_t budget);
void pc_free(pc_cache *c);

/* Bytes an entry of n tokens and a len-byte blob counts against the budget. */
size_t pc_entry_bytes(uint32_t n, size_t len);

/* The entry whose tokens are the longest prefix of tokens[0 .. n) that is at most max tokens long, checked
 * against its checksum (a corrupt one is dropped and counted); -1 when none. Marks it used. */
int pc_find(pc_cache *c, const int32_t *tokens, size_t n, uint32_t max);

/* Stores the prefix tokens[0 .. n) with its state, taking the blob over (freed here on failure too).
 * An entry for the same tokens is replaced; least recently used entries are evicted until it fits.
 * Returns 0, or -1 with err set when it cannot fit in the budget at all or memory runs out. */
int pc_put(pc_cache *c, const int32_t *tokens, uint32_t n, uint8_t *blob, size_t len, rl_err *err);

/* Whether an entry for exactly these tokens is stored. */
bool pc_has(const pc_cache *c, const int32_t *tokens, uint32_t n);

/* A 64-bit checksum of the tokens and the blob (not cryptographic: it catches memory that changed). */
uint64_t pc_sum(const int32_t *tokens, uint32_t n, const uint8_t *blob, size_t len);

#endif
