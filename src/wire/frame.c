#include "frame.h"

#include <string.h>
#include <time.h>

/* Little-endian writers and readers: the wire format never depends on the host. */
static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8); }
static void put32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static void put64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t get32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = v << 8 | p[i];
    return v;
}
static uint64_t get64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}
static void putf(uint8_t *p, float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    put32(p, u);
}
static float getf(const uint8_t *p) {
    uint32_t u = get32(p);
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static void putd(uint8_t *p, double d) {
    uint64_t u;
    memcpy(&u, &d, 8);
    put64(p, u);
}
static double getd(const uint8_t *p) {
    uint64_t u = get64(p);
    double d;
    memcpy(&d, &u, 8);
    return d;
}

#define FRAME_FIXED 44   /* magic .. budget_ms */
#define FRAME_SEQ_SIZE 60

size_t frame_header_size(uint32_t n_seqs) { return FRAME_FIXED + (size_t)n_seqs * FRAME_SEQ_SIZE; }

void frame_header_encode(const frame_header *h, uint8_t *b) {
    memcpy(b, "RLM1", 4);
    put16(b + 4, FRAME_VERSION);
    put16(b + 6, h->type);
    put64(b + 8, h->ring_id);
    put64(b + 16, h->step_id);
    put32(b + 24, h->flags);
    put32(b + 28, h->n_seqs);
    put64(b + 32, h->payload_bytes);
    put32(b + 40, h->budget_ms);
    for (uint32_t i = 0; i < h->n_seqs; i++) {
        uint8_t *p = b + FRAME_FIXED + (size_t)i * FRAME_SEQ_SIZE;
        const frame_seq *s = &h->seqs[i];
        put64(p, s->seq_id);
        put32(p + 8, s->pos);
        put32(p + 12, s->n_tokens);
        put32(p + 16, s->flags);
        putf(p + 20, s->smp.temperature);
        putf(p + 24, s->smp.top_p);
        putf(p + 28, s->smp.min_p);
        putf(p + 32, s->smp.repeat_penalty);
        putf(p + 36, s->smp.presence_penalty);
        putf(p + 40, s->smp.frequency_penalty);
        put32(p + 44, (uint32_t)s->smp.top_k);
        put32(p + 48, (uint32_t)s->smp.penalty_last_n);
        put64(p + 52, s->smp.seed);
    }
}

int frame_header_decode(frame_header *h, const uint8_t *b, size_t len, rl_err *err) {
    memset(h, 0, offsetof(frame_header, seqs));
    if (len < FRAME_FIXED) return rl_errf(err, "frame header of %zu bytes is too short", len);
    if (memcmp(b, "RLM1", 4) != 0) return rl_errf(err, "frame has bad magic (not a ringlm peer?)");
    h->version = get16(b + 4);
    if (h->version != FRAME_VERSION) {
        return rl_errf(err, "protocol version mismatch: peer speaks %u, we speak %u", h->version, FRAME_VERSION);
    }
    h->type = get16(b + 6);
    if (h->type < 1 || h->type > FRAME_TYPE_MAX) return rl_errf(err, "unknown frame type %u", h->type);
    h->ring_id = get64(b + 8);
    h->step_id = get64(b + 16);
    h->flags = get32(b + 24);
    h->n_seqs = get32(b + 28);
    h->payload_bytes = get64(b + 32);
    h->budget_ms = get32(b + 40);
    if (h->n_seqs > FRAME_MAX_SEQS) return rl_errf(err, "frame lists %u sequences (limit %d)", h->n_seqs, FRAME_MAX_SEQS);
    if (len != frame_header_size(h->n_seqs)) {
        return rl_errf(err, "frame header is %zu bytes, %u sequences need %zu", len, h->n_seqs, frame_header_size(h->n_seqs));
    }
    for (uint32_t i = 0; i < h->n_seqs; i++) {
        const uint8_t *p = b + FRAME_FIXED + (size_t)i * FRAME_SEQ_SIZE;
        frame_seq *s = &h->seqs[i];
        s->seq_id = get64(p);
        s->pos = get32(p + 8);
        s->n_tokens = get32(p + 12);
        s->flags = get32(p + 16);
        s->smp.temperature = getf(p + 20);
        s->smp.top_p = getf(p + 24);
        s->smp.min_p = getf(p + 28);
        s->smp.repeat_penalty = getf(p + 32);
        s->smp.presence_penalty = getf(p + 36);
        s->smp.frequency_penalty = getf(p + 40);
        s->smp.top_k = (int32_t)get32(p + 44);
        s->smp.penalty_last_n = (int32_t)get32(p + 48);
        s->smp.seed = get64(p + 52);
    }
    return 0;
}

#define FRAME_STAMP_SIZE 40

size_t frame_stamps_size(uint32_t n) { return 4 + (size_t)n * FRAME_STAMP_SIZE; }

void frame_stamps_encode(const frame_stamp *s, uint32_t n, uint8_t *b) {
    put32(b, n);
    for (uint32_t i = 0; i < n; i++) {
        uint8_t *p = b + 4 + (size_t)i * FRAME_STAMP_SIZE;
        put32(p, s[i].stage);
        put32(p + 4, s[i].n_tokens);
        putd(p + 8, s[i].t_recv);
        putd(p + 16, s[i].t_start);
        putd(p + 24, s[i].t_end);
        putd(p + 32, s[i].t_send);
    }
}

int frame_stamps_decode(frame_stamp *s, uint32_t *n, const uint8_t *b, size_t len, rl_err *err) {
    if (len < 4) return rl_errf(err, "stamps frame too short");
    *n = get32(b);
    /* The receipts extension may follow the stamps (frame_receipts_decode reads it). */
    if (*n > FRAME_MAX_STAMPS || len < frame_stamps_size(*n)) return rl_errf(err, "stamps frame malformed");
    for (uint32_t i = 0; i < *n; i++) {
        const uint8_t *p = b + 4 + (size_t)i * FRAME_STAMP_SIZE;
        s[i].stage = get32(p);
        s[i].n_tokens = get32(p + 4);
        s[i].t_recv = getd(p + 8);
        s[i].t_start = getd(p + 16);
        s[i].t_end = getd(p + 24);
        s[i].t_send = getd(p + 32);
    }
    return 0;
}

const char *frame_type_name(int type) {
    static const char *names[] = {"?", "INFO_REQ", "INFO", "ASSIGN", "READY", "FORWARD", "RESULT", "PING",
                                  "PONG", "ERROR", "FREE", "FETCH_BEGIN", "FETCH_DATA", "FETCH_ACK", "FETCH_END", "RECEIPT", "AUDIT_REQ", "AUDIT_DATA", "TAPS", "ROUTES", "LEND", "LENT", "PULL", "PULL_DATA", "PEERS", "PEERS_OK", "PROBE", "PROBE_RESULT", "PROBE_PING", "PROBE_PONG"};
    return type >= 1 && type <= FRAME_TYPE_MAX ? names[type] : "?";
}

double frame_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int frame_receipts_decode(frame_receipts *r, const uint8_t *part, size_t len, rl_err *err) {
    memset(r, 0, sizeof *r);
    if (len < 4) return rl_errf(err, "stamps frame too short");
    size_t off = frame_stamps_size(get32(part));
    if (off > len) return rl_errf(err, "stamps frame malformed");
    if (off == len) return 1;
    if (len - off < 40 || memcmp(part + off, "RCX1", 4) != 0) return rl_errf(err, "receipts extension malformed");
    memcpy(r->nonce, part + off + 4, 32);
    r->n = get32(part + off + 36);
    off += 40;
    if (r->n > FRAME_MAX_RECEIPTS) return rl_errf(err, "receipts extension lists %u receipts", r->n);
    for (uint32_t i = 0; i < r->n; i++) {
        if (len - off < 4) return rl_errf(err, "receipts extension truncated");
        r->len[i] = get32(part + off);
        off += 4;
        if (r->len[i] > len - off) return rl_errf(err, "receipts extension truncated");
        r->data[i] = part + off;
        off += r->len[i];
    }
    if (off != len) return rl_errf(err, "bytes after the receipts extension");
    return 0;
}

size_t frame_receipts_size(const frame_receipts *r, size_t extra_len) {
    size_t n = 40;
    for (uint32_t i = 0; i < r->n; i++) n += 4 + r->len[i];
    return n + (extra_len ? 4 + extra_len : 0);
}

void frame_receipts_encode(const frame_receipts *r, const uint8_t *extra, size_t extra_len, uint8_t *b) {
    memcpy(b, "RCX1", 4);
    memcpy(b + 4, r->nonce, 32);
    put32(b + 36, r->n + (extra_len ? 1 : 0));
    size_t off = 40;
    for (uint32_t i = 0; i < r->n; i++) {
        put32(b + off, r->len[i]);
        memcpy(b + off + 4, r->data[i], r->len[i]);
        off += 4 + r->len[i];
    }
    if (extra_len) {
        put32(b + off, (uint32_t)extra_len);
        memcpy(b + off + 4, extra, extra_len);
    }
}

double frame_budget_spent(const frame_stamp *s, uint32_t n, double t_recv, double now) {
    double spent = now > t_recv ? now - t_recv : 0;
    for (uint32_t i = 0; i < n; i++) spent += s[i].t_send > s[i].t_recv ? s[i].t_send - s[i].t_recv : 0;
    return spent;
}
