/* Folder src/wire/: the ring's wire format: frame headers, sequence entries, stamps, the receipts extension.
 * May include: base. (README "Layout"; tests/t_layout.sh checks both.)
 */
/* frame.h - the messages between coordinator and nodes, and between neighbouring nodes.
 *
 * A message is a ZeroMQ multipart message: [header][payload][stamps]. The header is a fixed
 * little-endian struct followed by one entry per sequence; the payload depends on the type; the stamps
 * frame carries per-hop timings (FORWARD and RESULT only). Every field is checked on receipt: a frame
 * of the wrong size, magic, version, type or counts is refused with a message, never trusted.
 *
 *   header: "RLM1" | u16 version | u16 type | u64 ring_id | u64 step_id | u32 flags | u32 n_seqs
 *           | u64 payload_bytes | u32 budget_ms | then n_seqs x frame_seq (below)
 *
 * budget_ms (FORWARD, RESULT): the deadline every hop carries, in milliseconds from the coordinator's send
 * (0: none). The coordinator gives the traversal up when it is not back by then (coord.c ring_collect), so a
 * stage that receives it later, by the time its stamps show was spent before it (queue, compute and send at
 * each earlier stage: links not counted, so never an overestimate), refuses it instead of computing a step
 * nobody waits for (node_forward: an ERROR saying so).
 *
 * Types and payloads:
 *   INFO_REQ   coord -> node    (empty)
 *   INFO       node -> coord    JSON: mem_bytes, threads, backend, speed_bps, flops, models [{name, hash, bytes}]
 *   ASSIGN     coord -> node    JSON: model hash, layer range, next hop, allowed upstream key, n_ctx, ...
 *   READY      node -> coord    JSON: what was loaded, resident bytes, where it computes, and "steps": its stage's
 *                               own timed frames [{tokens, s}] (node.c node_time_stage; predict.h)
 *   FORWARD    prev -> node     stage 0: int32 tokens; later stages: boundary state (k3_boundary wire form)
 *   RESULT     last -> coord    int32 per sequence (the token; for VERIFY the number committed), then f32
 *                               logits when asked, then the committed tokens of every VERIFY sequence,
 *                               then per sequence, in frame order, FRAME_LOGPROB_BYTES entries (i32 id, f32
 *                               logprob, 20 x i32 top ids, 20 x f32 their logprobs: text/sampler.h): with
 *                               FRAME_SEQ_PROMPT_LP one for each of its tokens after the first (token t + 1
 *                               at row t), then with FRAME_SEQ_LOGPROBS one per token it returned (the
 *                               sampled one, or each committed one)
 *
 * A FORWARD whose sequence position is behind the node's rolls that sequence back first (speculation:
 * the rejected part of the last verified block). FORWARD may carry a 4th part for the last stage's
 * sampler: first, per FRAME_SEQ_HAS_BIAS sequence (only with FRAME_SEQ_NEW: the sampler is made then), u32 n
 * then n x (i32 id, f32 bias), its logit biases; then per FRAME_SEQ_HAS_GRAMMAR sequence (also only with
 * FRAME_SEQ_NEW) i32 token budget, u32 n, then n bytes: the grammar its output must follow (text/grammar.h's
 * wire form; text/sampler.h: grammar, budget); then per FRAME_SEQ_RESUME sequence u32 g, the index of its first
 * generated token in the frame (the sampler replays tokens g.. as its output: smp_take); then the drafts'
 * distributions (FRAME_SEQ_HAS_Q): per
 * VERIFY sequence, per draft, u32 n then n x (i32 id, f32 p). Every stage passes it on unchanged.
 *   PING/PONG  coord <-> node   liveness (empty); the coordinator also times them (net/probe.h)
 *   PEERS      coord -> node    JSON {peers: [key]}: the nodes that may probe this one; PEERS_OK answers
 *   PROBE      coord -> node    JSON {peers: [{addr, key}]}: time round trips to each (PROBE_PING/PONG,
 *                               node -> node, step_id the round); PROBE_RESULT {rtt_s: [...]} answers
 *   ERROR      node -> coord    JSON: msg
 *   FREE       coord -> node    forget the listed sequences (forwarded down the ring)
 *   FETCH_BEGIN coord -> node   JSON {model_hash, a, b, file_bytes} then a second payload part: the GGUF
 *                               header of a range file (the model's metadata, only layers [a, b)'s tensors)
 *   FETCH_DATA coord -> node    the next bytes of that file's data section (step_id = chunk index)
 *   FETCH_ACK  node -> coord    chunk step_id is written (flow control: the coordinator keeps few in flight)
 *   FETCH_END  coord -> node    JSON {blake2b}: the node checks the whole file's hash, keeps it, says READY
 *   RECEIPT    node -> coord    this stage's signed receipt for step_id (below)
 *   AUDIT_REQ  coord -> node    u32 n | n x u64 step id: send back the frames of these steps (audits)
 *   AUDIT_DATA node -> coord    u32 n | n x { u64 step id | u8 kept | u64 in_len | u64 out_len | in | out }:
 *                               the FORWARD payload it received and the payload it sent on, for every
 *                               step it signed a receipt for and still keeps (--audit-keep)
 *   TAPS       node -> coord    for a FORWARD with FRAME_SEQ_TAPS sequences, sent right after forwarding it
 *                               (step_id = its step): u32 n_taps | n_taps x u32 layer | u32 n_rows | then
 *                               f32 rows [tap][row][n_embd], the stream entering each of those layers (the
 *                               ones this stage holds: a < layer <= b) for the flagged sequences' tokens in
 *                               frame order. Draft input only: a wrong tap costs acceptance, never output.
 *   ROUTES     node -> coord    for a FORWARD with FRAME_SEQ_ROUTES sequences, from every stage holding MoE
 *                               layers, right after forwarding it (step_id = its step): u32 layer0 | u32
 *                               n_layers | u32 k | u32 n_rows | i32 expert ids [layer][row][k] | f32 gate
 *                               weights [same] | f32 expert output norms [same] - what each of its MoE
 *                               layers' routers did to the flagged sequences' tokens (k3_routes; REAP scores
 *                               over the ring). Unlike taps these are data: a malformed one fails the step.
 */
#ifndef RINGLM_FRAME_H
#define RINGLM_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "../base/err.h"

#define FRAME_VERSION 2 /* 2: budget_ms */
#define FRAME_MAX_SEQS 256
#define FRAME_MAX_STAMPS 64

enum frame_type {
    FRAME_INFO_REQ = 1,
    FRAME_INFO = 2,
    FRAME_ASSIGN = 3,
    FRAME_READY = 4,
    FRAME_FORWARD = 5,
    FRAME_RESULT = 6,
    FRAME_PING = 7,
    FRAME_PONG = 8,
    FRAME_ERROR = 9,
    FRAME_FREE = 10,
    FRAME_FETCH_BEGIN = 11,
    FRAME_FETCH_DATA = 12,
    FRAME_FETCH_ACK = 13,
    FRAME_FETCH_END = 14,
    FRAME_RECEIPT = 15, /* node -> coord: this stage's signed receipt for step_id (out of band) */
    FRAME_AUDIT_REQ = 16,  /* coord -> node: send back what you received and sent for these steps */
    FRAME_AUDIT_DATA = 17, /* node -> coord: the answer (coord/audit.h) */
    FRAME_TAPS = 18,       /* node -> coord: DSpark taps of a FORWARD's flagged sequences (out of band) */
    FRAME_ROUTES = 19,     /* node -> coord: MoE routing of a FORWARD's flagged sequences (out of band, REAP) */
    FRAME_LEND = 20,       /* coord -> node: let these keys read your split files (a manifest ring's fetchers) */
    FRAME_LENT = 21,       /* node -> coord: done */
    FRAME_PULL = 22,       /* node -> node: bytes of one of your split files (JSON: file, offset, len) */
    FRAME_PULL_DATA = 23,  /* node -> node: those bytes (step_id: the PULL's) */
    FRAME_PEERS = 24,      /* coord -> node: JSON {peers: [key]}: these nodes may PROBE_PING you (until the next) */
    FRAME_PEERS_OK = 25,   /* node -> coord: done */
    FRAME_PROBE = 26,      /* coord -> node: JSON {peers: [{addr, key}]}: time round trips to them (net/probe.h) */
    FRAME_PROBE_RESULT = 27, /* node -> coord: JSON {rtt_s: [per peer, seconds; -1 no answer]} */
    FRAME_PROBE_PING = 28, /* node -> node: step_id a round */
    FRAME_PROBE_PONG = 29, /* node -> node: the answer (its step_id) */
    FRAME_TYPE_MAX = 29
};

/* Per-sequence flags. */
enum {
    FRAME_SEQ_NEW = 1,        /* the sequence starts here (pos must be 0): allocate fresh state */
    FRAME_SEQ_ALL_LOGITS = 2, /* return the logits of every position of this sequence, not a token */
    FRAME_SEQ_NO_SAMPLE = 4,  /* prefill chunk: no token wanted */
    FRAME_SEQ_VERIFY = 8,     /* the tokens are [last, drafts...]: keep rollback copies; the last stage accepts
                            * the longest matching prefix and returns the committed tokens. A block of one token
                            * (no drafts: speculation paused) commits that token whatever is sampled, so it keeps
                            * no copies and runs as a plain step (its graph kept for the next); it must not be
                            * sent behind another block in flight (it could then be stale and need rolling back) */
    FRAME_SEQ_HAS_Q = 16,     /* the drafts' distributions travel in an extra part (speculative sampling) */
    FRAME_SEQ_TAPS = 32,      /* stages holding DSpark tap layers (ASSIGN "taps") send this sequence's rows */
    FRAME_SEQ_HAS_BIAS = 64,  /* with FRAME_SEQ_NEW: the sampler's logit biases travel in the 4th part */
    FRAME_SEQ_LOGPROBS = 128, /* the RESULT carries the returned tokens' log-probabilities and top alternatives */
    FRAME_SEQ_PROMPT_LP = 256, /* ... and those of the frame's own tokens after the first (echo of a prompt) */
    FRAME_SEQ_HAS_GRAMMAR = 512, /* with FRAME_SEQ_NEW: constrained output; the sampler's grammar travels in the 4th part */
    FRAME_SEQ_RESUME = 1024,  /* a sequence rebuilt on a re-formed ring: its tokens from an index given in the 4th
                            * part on were generated (the last stage's sampler takes them as output again) */
    FRAME_SEQ_STEP = 2048,    /* compute the frame with step kernels (k3_batch.step_kernels): each token's numbers
                            * what a one-token step gives - how a rebuilt sequence replays its decoded tokens */
    FRAME_SEQ_ROUTES = 4096,  /* stages holding MoE layers send this sequence's routing (ROUTES) */
    FRAME_SEQ_SPLIT_INV = 8192, /* a prompt piece on the split-invariant path (k3_batch.split_invariant): serve reads
                            * every prompt so, on one machine and through the ring alike (docs/numerics.md) */
    FRAME_SEQ_CKPT = 16384,   /* after this entry, keep a checkpoint of the sequence's state (its layers' KDA state;
                            * the MLA rows stay): serve's prompt cache. Up to ASSIGN's ctx_checkpoints per sequence,
                            * which ones as model/k3_ckpt.h places them, so the coordinator knows without asking */
    FRAME_SEQ_RESTORE = 32768, /* before this entry, return the sequence to its checkpoint at pos (exactly; the later
                            * ones are dropped). With FRAME_SEQ_NEW the sequence begins again from there: the last
                            * stage makes a fresh sampler whose penalty history is the sequence's tokens before pos
                            * (a next request resuming a cached prefix). A stage without that checkpoint fails */
};

#define FRAME_LOGPROB_BYTES 168 /* one token's entry in a RESULT (smp_logprob's layout: 2 + 2 x 20 four-byte fields) */

/* Sampling parameters travel with every sequence entry; the last stage samples. */
typedef struct frame_sampling {
    float temperature, top_p, min_p, repeat_penalty, presence_penalty, frequency_penalty;
    int32_t top_k, penalty_last_n;
    uint64_t seed;
} frame_sampling;

typedef struct frame_seq {
    uint64_t seq_id;
    uint32_t pos;      /* position of the first token in this message */
    uint32_t n_tokens;
    uint32_t flags;
    frame_sampling smp;
} frame_seq;

typedef struct frame_header {
    uint16_t version, type;
    uint64_t ring_id, step_id;
    uint32_t flags;
    uint32_t n_seqs;
    uint64_t payload_bytes;
    uint32_t budget_ms; /* FORWARD: the traversal's deadline, ms from the coordinator's send; 0 none (above) */
    frame_seq seqs[FRAME_MAX_SEQS];
} frame_header;

/* One hop's timing, CLOCK_REALTIME seconds (comparable across machines only with synced clocks; the
 * durations queue = start - recv, compute = end - start are local and always meaningful). */
typedef struct frame_stamp {
    uint32_t stage;
    uint32_t n_tokens;
    double t_recv, t_start, t_end, t_send;
} frame_stamp;

size_t frame_header_size(uint32_t n_seqs);
void frame_header_encode(const frame_header *h, uint8_t *buf); /* buf: frame_header_size(h->n_seqs) bytes */
int frame_header_decode(frame_header *h, const uint8_t *buf, size_t len, rl_err *err);

size_t frame_stamps_size(uint32_t n);
void frame_stamps_encode(const frame_stamp *s, uint32_t n, uint8_t *buf);
int frame_stamps_decode(frame_stamp *s, uint32_t *n, const uint8_t *buf, size_t len, rl_err *err);
/* Seconds of a traversal's budget (budget_ms) spent by the time a stage starts on it: queue, compute and send
 * at each earlier stage (its n stamps: local durations, comparable across machines), then its own wait since
 * t_recv (now - t_recv). The links are not counted: never more than the coordinator's own clock says. */
double frame_budget_spent(const frame_stamp *s, uint32_t n, double t_recv, double now);

/* The stamps part may carry an extension after the stamps, asking for receipts (trust/receipt.h):
 *   "RCX1" | 32-byte nonce (fresh from the coordinator) | u32 n | n x (u32 len | packed receipt)
 * A coordinator that wants receipts sends it with n = 0 and every stage passes it on unchanged; each
 * stage sends its own receipt to the coordinator in a RECEIPT message AFTER forwarding the frame, so
 * hashing and signing stay off the ring's critical path. (n > 0 is still read, for in-band use.) */
#define FRAME_MAX_RECEIPTS 64
typedef struct frame_receipts {
    uint8_t nonce[32];
    uint32_t n;
    const uint8_t *data[FRAME_MAX_RECEIPTS]; /* into the decoded buffer */
    uint32_t len[FRAME_MAX_RECEIPTS];
} frame_receipts;

/* Finds and checks the extension after the stamps in a stamps part. Returns 1 if there is none. */
int frame_receipts_decode(frame_receipts *r, const uint8_t *part, size_t len, rl_err *err);
size_t frame_receipts_size(const frame_receipts *r, size_t extra_len);
/* Writes the extension with r's receipts plus (if extra) one more. */
void frame_receipts_encode(const frame_receipts *r, const uint8_t *extra, size_t extra_len, uint8_t *buf);

const char *frame_type_name(int type);
double frame_now(void); /* CLOCK_REALTIME in seconds */

#endif
