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
 * every traversal against what it assigned (rcpt_check_traversal); anyone holding the model file and
 * ring.conf can check a stored log later (`ringlm receipts verify`).
 *
 * Canonical encoding (the bytes that are signed; all integers little-endian, no padding):
 *
 *   offset  size  field
 *        0     4  magic "RCP1"                      (also separates receipts from anything else a key signs)
 *        4     2  u16 version (RCPT_VERSION = 1)
 *        6     8  u64 ring_id
 *       14     8  u64 request_id                    (the FORWARD frame's step id)
 *       22    32  nonce                             (fresh from the coordinator, one per traversal)
 *       54    32  manifest hash                     (mfst_range_hash of this stage's layers, manifest.h)
 *       86     4  u32 layer_start
 *       90     4  u32 layer_end                     (exclusive; layer_start < layer_end)
 *       94    32  input hash                        (BLAKE2b-256 of the input's wire bytes)
 *      126    32  output hash                       (BLAKE2b-256 of the output's wire bytes)
 *      158    32  signer public key                 (Ed25519)
 *      190     4  u32 n_seqs                        (1 .. RCPT_MAX_SEQS: the length prefix of the list)
 *      194  16*n  n_seqs x { u64 seq_id, u32 first position, u32 n_tokens }, strictly ascending seq_id
 *
 * RCPT_FIXED_BYTES = 194; a receipt encodes to 194 + 16 * n_seqs bytes. The signature is Ed25519
 * (crypto_sign_detached) over exactly those bytes. The wire form (rcpt_pack / rcpt_unpack) is the
 * encoding followed by the 64-byte signature. A receipt that cannot be encoded canonically (unsorted or
 * duplicate seq ids, an empty range, zero tokens, a wrong version) is refused, never signed or verified.
 *
 * Input and output: stage 0's input is the FORWARD payload (int32 token ids, little-endian); a later
 * stage's input is the boundary state as received (k3_boundary wire form, header included); a stage's
 * output is the bytes it sends on (boundary state), and the last stage's output is the RESULT payload
 * (int32 sampled tokens, then any f32 logits). Hash them with rcpt_hash.
 *
 * JSON lines form (storage): one receipt per line, one object with exactly these keys:
 *   {"v":1,"ring_id":"<u64 decimal>","request_id":"<u64 decimal>","nonce":"<64 hex>","manifest":"<64 hex>",
 *    "layer_start":N,"layer_end":N,"seqs":[{"id":"<u64 decimal>","pos":N,"n":N},...],
 *    "in":"<64 hex>","out":"<64 hex>","signer":"<64 hex>","sig":"<128 hex>"}
 * u64 values are decimal strings because JSON numbers lose precision above 2^53; hex is lowercase on
 * output (either case is read). rcpt_from_json(rcpt_to_json(r)) == r, field for field. */
#ifndef RINGLM_RECEIPT_H
#define RINGLM_RECEIPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/err.h"
#include "keys.h"

#define RCPT_VERSION 1
#define RCPT_MAX_SEQS 256   /* == RF_MAX_SEQS: one receipt per FORWARD frame */
#define RCPT_MAX_STAGES 256 /* receipts in one traversal (>= PLAN_MAX_NODES) */
#define RCPT_HASH_BYTES 32
#define RCPT_SIG_BYTES 64
#define RCPT_FIXED_BYTES 194
#define RCPT_SEQ_BYTES 16
#define RCPT_MAX_ENCODED (RCPT_FIXED_BYTES + RCPT_SEQ_BYTES * RCPT_MAX_SEQS)
#define RCPT_MAX_PACKED (RCPT_MAX_ENCODED + RCPT_SIG_BYTES)

typedef struct rcpt_seq {
    uint64_t seq_id;
    uint32_t pos; /* position of the first token */
    uint32_t n_tokens;
} rcpt_seq;

typedef struct rcpt_receipt {
    uint16_t version;
    uint64_t ring_id, request_id;
    uint8_t nonce[32];
    uint8_t manifest[32];
    uint32_t layer_start, layer_end;
    uint8_t in_hash[32], out_hash[32];
    uint8_t signer[32];
    uint32_t n_seqs;
    rcpt_seq seqs[RCPT_MAX_SEQS];
    uint8_t sig[64];
} rcpt_receipt;

/* BLAKE2b-256 of len bytes (the input and output hashes). */
void rcpt_hash(const void *data, size_t len, uint8_t out[32]);

/* Sets r's sequence list from n entries and sorts it by seq id (the canonical order). Refuses more than
 * RCPT_MAX_SEQS entries or a repeated seq id. */
int rcpt_set_seqs(rcpt_receipt *r, const rcpt_seq *seqs, uint32_t n, rl_err *err);

/* Size of r's canonical encoding (r->n_seqs is clamped to RCPT_MAX_SEQS here; rcpt_encode refuses it). */
size_t rcpt_encoded_size(const rcpt_receipt *r);

/* Writes the canonical encoding (the signed bytes) into buf, which holds cap bytes; *len = bytes written.
 * Refuses a receipt that has no canonical encoding (see above) with a message naming the field. */
int rcpt_encode(const rcpt_receipt *r, uint8_t *buf, size_t cap, size_t *len, rl_err *err);

/* Sets r->version and r->signer from id, then signs the encoding with id's Ed25519 secret key. */
int rcpt_sign(rcpt_receipt *r, const rk_identity *id, rl_err *err);

/* Checks r->sig against r's own encoding and r->signer. Whether r->signer is the right key is the
 * caller's question (rcpt_check_traversal asks it). */
int rcpt_verify_sig(const rcpt_receipt *r, rl_err *err);

/* Wire form: encoding || signature, for sending a receipt in a frame. rcpt_unpack checks the magic,
 * version, every length and the canonical order, but not the signature. */
int rcpt_pack(const rcpt_receipt *r, uint8_t *buf, size_t cap, size_t *len, rl_err *err);
int rcpt_unpack(rcpt_receipt *r, const uint8_t *buf, size_t len, rl_err *err);

/* JSON lines form. rcpt_to_json: *out is one line without a newline, malloc'ed (free()). */
int rcpt_to_json(const rcpt_receipt *r, char **out, rl_err *err);
int rcpt_from_json(rcpt_receipt *r, const char *line, rl_err *err);

/* Field-by-field equality (signature included). */
bool rcpt_equal(const rcpt_receipt *a, const rcpt_receipt *b);

/* A nonce book: the nonces of traversals already checked, so a reused nonce is caught.
 *
 * Bounded: it holds the last `cap` nonces added; adding one more forgets the oldest (first in, first
 * out). A nonce older than that is no longer recognized - which is why a live coordinator also requires
 * every receipt to carry the nonce it has just issued (rcpt_expect.nonce), and why the offline verifier
 * sizes its book to the whole log so that nothing is forgotten. Lookups hash the nonce with SipHash
 * under a key drawn per book, so nonces chosen by an adversary cannot force collisions. Not thread-safe;
 * no global state. */
typedef struct rcpt_nonce_book {
    uint32_t cap;  /* nonces remembered at most */
    uint32_t n;    /* nonces remembered now */
    uint32_t head; /* ring slot the next nonce goes to (the oldest when full) */
    uint32_t mask; /* table slots - 1 (table has a power of two >= 2 * cap slots) */
    uint8_t (*ring)[32];
    uint32_t *table; /* ring index + 1, 0 = empty; linear probing */
    uint8_t key[16]; /* SipHash key */
} rcpt_nonce_book;

int rcpt_book_init(rcpt_nonce_book *b, uint32_t cap, rl_err *err);
void rcpt_book_free(rcpt_nonce_book *b);
bool rcpt_book_has(const rcpt_nonce_book *b, const uint8_t nonce[32]);
/* Returns 1 if the nonce was new (now remembered), 0 if it was already there. */
int rcpt_book_add(rcpt_nonce_book *b, const uint8_t nonce[32]);

/* What the checker of one traversal knows independently of the receipts. */
typedef struct rcpt_stage_expect {
    uint8_t node_pk[32]; /* the key assigned this stage */
    uint32_t layer_start, layer_end;
    uint8_t manifest[32]; /* mfst_range_hash of [layer_start, layer_end) of the coordinator's model */
} rcpt_stage_expect;

typedef struct rcpt_expect {
    uint64_t ring_id, request_id;
    uint8_t nonce[32];
    uint32_t n_layer; /* from the model file, never from receipts */
    int n_stages;
    const rcpt_stage_expect *stages; /* the assignment, in ring order */
    rcpt_nonce_book *seen;           /* NULL: no freshness check. Otherwise the traversal's nonce must not
                                        be in it, and is added to it (even when another check fails, so a
                                        nonce is never accepted twice) */
    /* Optional, NULL when unknown: what the coordinator itself sent and received. */
    const uint8_t *first_in; /* hash of the tokens sent to stage 0 */
    const uint8_t *last_out; /* hash of the RESULT payload received */
    const rcpt_seq *seqs;    /* the positions sent (sorted by seq id), n_seqs of them */
    uint32_t n_seqs;
} rcpt_expect;

/* Called once per problem found; stage is the receipt's index in rs (-1: the traversal as a whole). */
typedef void (*rcpt_problem_fn)(void *user, int stage, const char *msg);

/* Checks the n receipts of one traversal, in ring order (rs[i] from stage i), against e:
 *   every signature is valid; rs[i] is signed by the key assigned stage i and covers exactly the layers
 *   assigned to it; the ranges are in order and cover [0, e->n_layer) with no gap or overlap (and so
 *   does the assignment); rs[i].out_hash == rs[i+1].in_hash; every receipt carries e's ring id, request
 *   id and nonce and the same positions; the nonce is fresh; every manifest hash is the expected one.
 * Reports every problem found to fn (may be NULL) with a message naming the stage, node, field and both
 * values, and returns their number (0 = the traversal verifies). */
int rcpt_check_traversal_all(const rcpt_receipt *rs, int n, const rcpt_expect *e, rcpt_problem_fn fn, void *user);

/* The same, returning 0, or -1 with the first problem in err (and how many more there were). */
int rcpt_check_traversal(const rcpt_receipt *rs, int n, const rcpt_expect *e, rl_err *err);

#endif
