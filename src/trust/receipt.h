/* Folder src/trust/: identities (Ed25519 keys; CURVE keys derived), receipts, the coordinator's ledger of them
 * (gathered, checked, kept for audits), the offline verifier of a receipts log, model manifest hashes (the
 * audits that recompute a stage are the coordinator's: src/coord/audit.h). May include: base, gguf, model,
 * wire. (README "Layout"; tests/t_layout.sh checks both.)
 */
/* receipt.h - signed receipts: each stage of a ring traversal signs what it computed (docs/receipts.md).
 *
 * A receipt says "the holder of key P ran layers [layer_start, layer_end) of the model with manifest
 * hash M over the input whose bytes hash to I and produced the output whose bytes hash to O, for these
 * sequence positions, in traversal (ring_id, request_id, nonce)". The coordinator checks the receipts of
 * every traversal against what it assigned (receipt_check_traversal); anyone holding the model file and
 * ring.conf can check a stored log later (`ringlm receipts verify`).
 *
 * Canonical encoding (the bytes that are signed; all integers little-endian, no padding):
 *
 *   offset  size  field
 *        0     4  magic "RCP1"                      (also separates receipts from anything else a key signs)
 *        4     2  u16 version (RECEIPT_VERSION = 1)
 *        6     8  u64 ring_id
 *       14     8  u64 request_id                    (the FORWARD frame's step id)
 *       22    32  nonce                             (fresh from the coordinator, one per traversal)
 *       54    32  manifest hash                     (manifest_range_hash of this stage's layers, manifest.h)
 *       86     4  u32 layer_start
 *       90     4  u32 layer_end                     (exclusive; layer_start < layer_end)
 *       94    32  input hash                        (BLAKE2b-256 of the input's wire bytes)
 *      126    32  output hash                       (BLAKE2b-256 of the output's wire bytes)
 *      158    32  signer public key                 (Ed25519)
 *      190     4  u32 n_seqs                        (1 .. RECEIPT_MAX_SEQS: the length prefix of the list)
 *      194  16*n  n_seqs x { u64 seq_id, u32 first position, u32 n_tokens }, strictly ascending seq_id
 *
 * RECEIPT_FIXED_BYTES = 194; a receipt encodes to 194 + 16 * n_seqs bytes. The signature is Ed25519
 * (crypto_sign_detached) over exactly those bytes. The wire form (receipt_pack / receipt_unpack) is the
 * encoding followed by the 64-byte signature. A receipt that cannot be encoded canonically (unsorted or
 * duplicate seq ids, an empty range, zero tokens, a wrong version) is refused, never signed or verified.
 *
 * Input and output: stage 0's input is the FORWARD payload (int32 token ids, little-endian); a later
 * stage's input is the boundary state as received (k3_boundary wire form, header included); a stage's
 * output is the bytes it sends on (boundary state), and the last stage's output is the RESULT payload
 * (int32 sampled tokens, then any f32 logits). Hash them with receipt_hash.
 *
 * JSON lines form (storage): one receipt per line, one object with exactly these keys:
 *   {"v":1,"ring_id":"<u64 decimal>","request_id":"<u64 decimal>","nonce":"<64 hex>","manifest":"<64 hex>",
 *    "layer_start":N,"layer_end":N,"seqs":[{"id":"<u64 decimal>","pos":N,"n":N},...],
 *    "in":"<64 hex>","out":"<64 hex>","signer":"<64 hex>","sig":"<128 hex>"}
 * u64 values are decimal strings because JSON numbers lose precision above 2^53; hex is lowercase on
 * output (either case is read). receipt_from_json(receipt_to_json(r)) == r, field for field. */
#ifndef RINGLM_RECEIPT_H
#define RINGLM_RECEIPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/err.h"
#include "keys.h"

#define RECEIPT_VERSION 1
#define RECEIPT_MAX_SEQS 256   /* == FRAME_MAX_SEQS: one receipt per FORWARD frame */
#define RECEIPT_MAX_STAGES 256 /* receipts in one traversal (>= PLAN_MAX_NODES) */
#define RECEIPT_HASH_BYTES 32
#define RECEIPT_SIG_BYTES 64
#define RECEIPT_FIXED_BYTES 194
#define RECEIPT_SEQ_BYTES 16
#define RECEIPT_MAX_ENCODED (RECEIPT_FIXED_BYTES + RECEIPT_SEQ_BYTES * RECEIPT_MAX_SEQS)
#define RECEIPT_MAX_PACKED (RECEIPT_MAX_ENCODED + RECEIPT_SIG_BYTES)

typedef struct receipt_seq {
    uint64_t seq_id;
    uint32_t pos; /* position of the first token */
    uint32_t n_tokens;
} receipt_seq;

typedef struct receipt_rec {
    uint16_t version;
    uint64_t ring_id, request_id;
    uint8_t nonce[32];
    uint8_t manifest[32];
    uint32_t layer_start, layer_end;
    uint8_t in_hash[32], out_hash[32];
    uint8_t signer[32];
    uint32_t n_seqs;
    receipt_seq seqs[RECEIPT_MAX_SEQS];
    uint8_t sig[64];
} receipt_rec;

/* BLAKE2b-256 of len bytes (the input and output hashes). */
void receipt_hash(const void *data, size_t len, uint8_t out[32]);

/* Sets r's sequence list from n entries and sorts it by seq id (the canonical order). Refuses more than
 * RECEIPT_MAX_SEQS entries or a repeated seq id. */
int receipt_set_seqs(receipt_rec *r, const receipt_seq *seqs, uint32_t n, rl_err *err);

/* Size of r's canonical encoding (r->n_seqs is clamped to RECEIPT_MAX_SEQS here; receipt_encode refuses it). */
size_t receipt_encoded_size(const receipt_rec *r);

/* Writes the canonical encoding (the signed bytes) into buf, which holds cap bytes; *len = bytes written.
 * Refuses a receipt that has no canonical encoding (see above) with a message naming the field. */
int receipt_encode(const receipt_rec *r, uint8_t *buf, size_t cap, size_t *len, rl_err *err);

/* Sets r->version and r->signer from id, then signs the encoding with id's Ed25519 secret key. */
int receipt_sign(receipt_rec *r, const keys_identity *id, rl_err *err);

/* Checks r->sig against r's own encoding and r->signer. Whether r->signer is the right key is the
 * caller's question (receipt_check_traversal asks it). */
int receipt_verify_sig(const receipt_rec *r, rl_err *err);

/* Wire form: encoding || signature, for sending a receipt in a frame. receipt_unpack checks the magic,
 * version, every length and the canonical order, but not the signature. */
int receipt_pack(const receipt_rec *r, uint8_t *buf, size_t cap, size_t *len, rl_err *err);
int receipt_unpack(receipt_rec *r, const uint8_t *buf, size_t len, rl_err *err);

/* JSON lines form. receipt_to_json: *out is one line without a newline, malloc'ed (free()). */
int receipt_to_json(const receipt_rec *r, char **out, rl_err *err);
int receipt_from_json(receipt_rec *r, const char *line, rl_err *err);

/* Field-by-field equality (signature included). */
bool receipt_equal(const receipt_rec *a, const receipt_rec *b);

/* A nonce book: the nonces of traversals already checked, so a reused nonce is caught.
 *
 * Bounded: it holds the last `cap` nonces added; adding one more forgets the oldest (first in, first
 * out). A nonce older than that is no longer recognized - which is why a live coordinator also requires
 * every receipt to carry the nonce it has just issued (receipt_expect.nonce), and why the offline verifier
 * sizes its book to the whole log so that nothing is forgotten. Lookups hash the nonce with SipHash
 * under a key drawn per book, so nonces chosen by an adversary cannot force collisions. Not thread-safe;
 * no global state. */
typedef struct receipt_nonce_book {
    uint32_t cap;  /* nonces remembered at most */
    uint32_t n;    /* nonces remembered now */
    uint32_t head; /* ring slot the next nonce goes to (the oldest when full) */
    uint32_t mask; /* table slots - 1 (table has a power of two >= 2 * cap slots) */
    uint8_t (*ring)[32];
    uint32_t *table; /* ring index + 1, 0 = empty; linear probing */
    uint8_t key[16]; /* SipHash key */
} receipt_nonce_book;

int receipt_book_init(receipt_nonce_book *b, uint32_t cap, rl_err *err);
void receipt_book_free(receipt_nonce_book *b);
bool receipt_book_has(const receipt_nonce_book *b, const uint8_t nonce[32]);
/* Returns 1 if the nonce was new (now remembered), 0 if it was already there. */
int receipt_book_add(receipt_nonce_book *b, const uint8_t nonce[32]);

/* What the checker of one traversal knows independently of the receipts. */
typedef struct receipt_stage_expect {
    uint8_t node_pk[32]; /* the key assigned this stage */
    uint32_t layer_start, layer_end;
    uint8_t manifest[32]; /* manifest_range_hash of [layer_start, layer_end) of the coordinator's model */
} receipt_stage_expect;

typedef struct receipt_expect {
    uint64_t ring_id, request_id;
    uint8_t nonce[32];
    uint32_t n_layer; /* from the model file, never from receipts */
    int n_stages;
    const receipt_stage_expect *stages; /* the assignment, in ring order */
    receipt_nonce_book *seen;           /* NULL: no freshness check. Otherwise the traversal's nonce must not
                                        be in it, and is added to it (even when another check fails, so a
                                        nonce is never accepted twice) */
    /* Optional, NULL when unknown: what the coordinator itself sent and received. */
    const uint8_t *first_in; /* hash of the tokens sent to stage 0 */
    const uint8_t *last_out; /* hash of the RESULT payload received */
    const receipt_seq *seqs;    /* the positions sent (sorted by seq id), n_seqs of them */
    uint32_t n_seqs;
} receipt_expect;

/* Called once per problem found; stage is the receipt's index in rs (-1: the traversal as a whole). */
typedef void (*receipt_problem_fn)(void *user, int stage, const char *msg);

/* Checks the n receipts of one traversal, in ring order (rs[i] from stage i), against e:
 *   every signature is valid; rs[i] is signed by the key assigned stage i and covers exactly the layers
 *   assigned to it; the ranges are in order and cover [0, e->n_layer) with no gap or overlap (and so
 *   does the assignment); rs[i].out_hash == rs[i+1].in_hash; every receipt carries e's ring id, request
 *   id and nonce and the same positions; the nonce is fresh; every manifest hash is the expected one.
 * Reports every problem found to fn (may be NULL) with a message naming the stage, node, field and both
 * values, and returns their number (0 = the traversal verifies). */
int receipt_check_traversal_all(const receipt_rec *rs, int n, const receipt_expect *e, receipt_problem_fn fn, void *user);

/* The same, returning 0, or -1 with the first problem in err (and how many more there were). */
int receipt_check_traversal(const receipt_rec *rs, int n, const receipt_expect *e, rl_err *err);

#endif
