#include "receipt.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>
#include <sodium.h>

/* ---- little-endian fields (explicit, so the encoding does not depend on the host) ---- */

static void put_u16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint16_t get_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t get_u32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

void receipt_hash(const void *data, size_t len, uint8_t out[32]) { crypto_generichash(out, 32, data, len, NULL, 0); }

static int seq_cmp(const void *a, const void *b) {
    const receipt_seq *x = a, *y = b;
    return x->seq_id < y->seq_id ? -1 : x->seq_id > y->seq_id;
}

int receipt_set_seqs(receipt_rec *r, const receipt_seq *seqs, uint32_t n, rl_err *err) {
    if (n < 1 || n > RECEIPT_MAX_SEQS) return rl_errf(err, "%u sequences in one receipt (1 to %d)", n, RECEIPT_MAX_SEQS);
    memcpy(r->seqs, seqs, n * sizeof *seqs);
    qsort(r->seqs, n, sizeof *seqs, seq_cmp);
    r->n_seqs = n;
    for (uint32_t i = 1; i < n; i++) {
        if (r->seqs[i].seq_id == r->seqs[i - 1].seq_id) {
            return rl_errf(err, "sequence %" PRIu64 " appears twice in one receipt", r->seqs[i].seq_id);
        }
    }
    return 0;
}

size_t receipt_encoded_size(const receipt_rec *r) {
    uint32_t n = r->n_seqs > RECEIPT_MAX_SEQS ? RECEIPT_MAX_SEQS : r->n_seqs;
    return RECEIPT_FIXED_BYTES + (size_t)RECEIPT_SEQ_BYTES * n;
}

/* The conditions for a canonical encoding, shared by encode and unpack so both refuse the same things. */
static int receipt_canonical(const receipt_rec *r, rl_err *err) {
    if (r->version != RECEIPT_VERSION)
        return rl_errf(err, "receipt version %u (this build reads %d)", r->version, RECEIPT_VERSION);
    if (r->layer_start >= r->layer_end) {
        return rl_errf(err, "empty or reversed layer range [%u, %u)", r->layer_start, r->layer_end);
    }
    if (r->n_seqs < 1 || r->n_seqs > RECEIPT_MAX_SEQS) {
        return rl_errf(err, "%u sequences (1 to %d)", r->n_seqs, RECEIPT_MAX_SEQS);
    }
    for (uint32_t i = 0; i < r->n_seqs; i++) {
        if (r->seqs[i].n_tokens == 0) return rl_errf(err, "sequence %" PRIu64 " has 0 tokens", r->seqs[i].seq_id);
        if ((uint64_t)r->seqs[i].pos + r->seqs[i].n_tokens > UINT32_MAX) {
            return rl_errf(err, "sequence %" PRIu64 ": positions %u + %u overflow", r->seqs[i].seq_id, r->seqs[i].pos,
                           r->seqs[i].n_tokens);
        }
        if (i > 0 && r->seqs[i].seq_id <= r->seqs[i - 1].seq_id) {
            return rl_errf(err, "sequences not in strictly ascending seq id order (%" PRIu64 " after %" PRIu64 ")",
                           r->seqs[i].seq_id, r->seqs[i - 1].seq_id);
        }
    }
    return 0;
}

int receipt_encode(const receipt_rec *r, uint8_t *buf, size_t cap, size_t *len, rl_err *err) {
    if (receipt_canonical(r, err) != 0) return rl_err_prefix(err, "cannot encode the receipt");
    size_t need = receipt_encoded_size(r);
    if (cap < need) return rl_errf(err, "receipt buffer of %zu bytes, %zu needed", cap, need);
    memcpy(buf, "RCP1", 4);
    put_u16(buf + 4, r->version);
    put_u64(buf + 6, r->ring_id);
    put_u64(buf + 14, r->request_id);
    memcpy(buf + 22, r->nonce, 32);
    memcpy(buf + 54, r->manifest, 32);
    put_u32(buf + 86, r->layer_start);
    put_u32(buf + 90, r->layer_end);
    memcpy(buf + 94, r->in_hash, 32);
    memcpy(buf + 126, r->out_hash, 32);
    memcpy(buf + 158, r->signer, 32);
    put_u32(buf + 190, r->n_seqs);
    uint8_t *p = buf + RECEIPT_FIXED_BYTES;
    for (uint32_t i = 0; i < r->n_seqs; i++, p += RECEIPT_SEQ_BYTES) {
        put_u64(p, r->seqs[i].seq_id);
        put_u32(p + 8, r->seqs[i].pos);
        put_u32(p + 12, r->seqs[i].n_tokens);
    }
    if (len) *len = need;
    return 0;
}

int receipt_sign(receipt_rec *r, const keys_identity *id, rl_err *err) {
    if (sodium_init() < 0) return rl_errf(err, "libsodium failed to initialise");
    r->version = RECEIPT_VERSION;
    memcpy(r->signer, id->sign_pk, 32);
    uint8_t buf[RECEIPT_MAX_ENCODED];
    size_t len;
    if (receipt_encode(r, buf, sizeof buf, &len, err) != 0) return -1;
    crypto_sign_detached(r->sig, NULL, buf, len, id->sign_sk);
    return 0;
}

int receipt_verify_sig(const receipt_rec *r, rl_err *err) {
    if (sodium_init() < 0) return rl_errf(err, "libsodium failed to initialise");
    uint8_t buf[RECEIPT_MAX_ENCODED];
    size_t len;
    if (receipt_encode(r, buf, sizeof buf, &len, err) != 0) return -1;
    if (crypto_sign_verify_detached(r->sig, buf, len, r->signer) != 0) {
        char pk[65];
        sodium_bin2hex(pk, sizeof pk, r->signer, 32);
        return rl_errf(err,
                       "the signature does not verify under the receipt's key %s (altered after signing, or "
                       "signed by another key)",
                       pk);
    }
    return 0;
}

int receipt_pack(const receipt_rec *r, uint8_t *buf, size_t cap, size_t *len, rl_err *err) {
    size_t n;
    if (cap < RECEIPT_SIG_BYTES) return rl_errf(err, "receipt buffer of %zu bytes is too small", cap);
    if (receipt_encode(r, buf, cap - RECEIPT_SIG_BYTES, &n, err) != 0) return -1;
    memcpy(buf + n, r->sig, RECEIPT_SIG_BYTES);
    if (len) *len = n + RECEIPT_SIG_BYTES;
    return 0;
}

int receipt_unpack(receipt_rec *r, const uint8_t *buf, size_t len, rl_err *err) {
    memset(r, 0, sizeof *r);
    if (len < RECEIPT_FIXED_BYTES + RECEIPT_SIG_BYTES) return rl_errf(err, "receipt of %zu bytes is too short", len);
    if (memcmp(buf, "RCP1", 4) != 0) return rl_errf(err, "not a receipt (bad magic)");
    r->version = get_u16(buf + 4);
    if (r->version != RECEIPT_VERSION)
        return rl_errf(err, "receipt version %u (this build reads %d)", r->version, RECEIPT_VERSION);
    r->n_seqs = get_u32(buf + 190);
    if (r->n_seqs < 1 || r->n_seqs > RECEIPT_MAX_SEQS)
        return rl_errf(err, "receipt lists %u sequences (1 to %d)", r->n_seqs, RECEIPT_MAX_SEQS);
    size_t want = RECEIPT_FIXED_BYTES + (size_t)RECEIPT_SEQ_BYTES * r->n_seqs + RECEIPT_SIG_BYTES;
    if (len != want) return rl_errf(err, "receipt of %zu bytes, %zu expected for %u sequences", len, want, r->n_seqs);
    r->ring_id = get_u64(buf + 6);
    r->request_id = get_u64(buf + 14);
    memcpy(r->nonce, buf + 22, 32);
    memcpy(r->manifest, buf + 54, 32);
    r->layer_start = get_u32(buf + 86);
    r->layer_end = get_u32(buf + 90);
    memcpy(r->in_hash, buf + 94, 32);
    memcpy(r->out_hash, buf + 126, 32);
    memcpy(r->signer, buf + 158, 32);
    const uint8_t *p = buf + RECEIPT_FIXED_BYTES;
    for (uint32_t i = 0; i < r->n_seqs; i++, p += RECEIPT_SEQ_BYTES) {
        r->seqs[i].seq_id = get_u64(p);
        r->seqs[i].pos = get_u32(p + 8);
        r->seqs[i].n_tokens = get_u32(p + 12);
    }
    memcpy(r->sig, p, RECEIPT_SIG_BYTES);
    return receipt_canonical(r, err) == 0 ? 0 : rl_err_prefix(err, "receipt is not canonical");
}

bool receipt_equal(const receipt_rec *a, const receipt_rec *b) {
    if (a->version != b->version || a->ring_id != b->ring_id || a->request_id != b->request_id ||
        a->layer_start != b->layer_start || a->layer_end != b->layer_end || a->n_seqs != b->n_seqs ||
        memcmp(a->nonce, b->nonce, 32) || memcmp(a->manifest, b->manifest, 32) || memcmp(a->in_hash, b->in_hash, 32) ||
        memcmp(a->out_hash, b->out_hash, 32) || memcmp(a->signer, b->signer, 32) || memcmp(a->sig, b->sig, 64)) {
        return false;
    }
    for (uint32_t i = 0; i < a->n_seqs && i < RECEIPT_MAX_SEQS; i++) {
        if (a->seqs[i].seq_id != b->seqs[i].seq_id || a->seqs[i].pos != b->seqs[i].pos ||
            a->seqs[i].n_tokens != b->seqs[i].n_tokens) {
            return false;
        }
    }
    return true;
}

/* ---- JSON lines ---- */

static void add_hex(cJSON *o, const char *key, const uint8_t *bin, size_t n) {
    char hex[2 * RECEIPT_SIG_BYTES + 1];
    sodium_bin2hex(hex, sizeof hex, bin, n);
    cJSON_AddStringToObject(o, key, hex);
}

static void add_u64(cJSON *o, const char *key, uint64_t v) {
    char s[24];
    snprintf(s, sizeof s, "%" PRIu64, v);
    cJSON_AddStringToObject(o, key, s);
}

int receipt_to_json(const receipt_rec *r, char **out, rl_err *err) {
    *out = NULL;
    if (r->n_seqs > RECEIPT_MAX_SEQS) return rl_errf(err, "%u sequences (at most %d)", r->n_seqs, RECEIPT_MAX_SEQS);
    cJSON *o = cJSON_CreateObject();
    if (!o) return rl_errf(err, "out of memory");
    cJSON_AddNumberToObject(o, "v", r->version);
    add_u64(o, "ring_id", r->ring_id);
    add_u64(o, "request_id", r->request_id);
    add_hex(o, "nonce", r->nonce, 32);
    add_hex(o, "manifest", r->manifest, 32);
    cJSON_AddNumberToObject(o, "layer_start", r->layer_start);
    cJSON_AddNumberToObject(o, "layer_end", r->layer_end);
    cJSON *a = cJSON_AddArrayToObject(o, "seqs");
    for (uint32_t i = 0; a && i < r->n_seqs; i++) {
        cJSON *s = cJSON_CreateObject();
        if (!s) break;
        add_u64(s, "id", r->seqs[i].seq_id);
        cJSON_AddNumberToObject(s, "pos", r->seqs[i].pos);
        cJSON_AddNumberToObject(s, "n", r->seqs[i].n_tokens);
        cJSON_AddItemToArray(a, s);
    }
    add_hex(o, "in", r->in_hash, 32);
    add_hex(o, "out", r->out_hash, 32);
    add_hex(o, "signer", r->signer, 32);
    add_hex(o, "sig", r->sig, 64);
    *out = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return *out ? 0 : rl_errf(err, "out of memory");
}

static int json_hex(const cJSON *v, const char *key, uint8_t *bin, size_t n, rl_err *err) {
    if (!cJSON_IsString(v)) return rl_errf(err, "\"%s\" is not a string", key);
    const char *s = v->valuestring, *end = NULL;
    size_t got = 0;
    if (strlen(s) != 2 * n || sodium_hex2bin(bin, n, s, 2 * n, NULL, &got, &end) != 0 || got != n || *end) {
        return rl_errf(err, "\"%s\" is not %zu hex digits", key, 2 * n);
    }
    return 0;
}

/* A u64 as a decimal string, canonical (no sign, no leading zeros), so the round trip is exact. */
static int json_u64(const cJSON *v, const char *key, uint64_t *out, rl_err *err) {
    if (!cJSON_IsString(v)) return rl_errf(err, "\"%s\" is not a string (u64 values are decimal strings)", key);
    const char *s = v->valuestring;
    size_t n = strlen(s);
    bool ok = n >= 1 && n <= 20 && !(n > 1 && s[0] == '0');
    for (size_t i = 0; ok && i < n; i++) ok = s[i] >= '0' && s[i] <= '9';
    if (ok) {
        errno = 0;
        unsigned long long x = strtoull(s, NULL, 10);
        ok = errno == 0;
        *out = x;
    }
    return ok ? 0 : rl_errf(err, "\"%s\" is not a decimal u64 (\"%.40s\")", key, s);
}

static int json_u32(const cJSON *v, const char *key, uint32_t *out, rl_err *err) {
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) || v->valuedouble > 4294967295.0 ||
        v->valuedouble != floor(v->valuedouble)) {
        return rl_errf(err, "\"%s\" is not an integer from 0 to 2^32-1", key);
    }
    *out = (uint32_t)v->valuedouble;
    return 0;
}

/* Every key of an object exactly once, and no other: `names` lists them, `items` receives them. */
static int json_fields(const cJSON *o, const char *what, const char *const *names, const cJSON **items, int n,
                       rl_err *err) {
    if (!cJSON_IsObject(o)) return rl_errf(err, "%s is not a JSON object", what);
    for (int i = 0; i < n; i++) items[i] = NULL;
    for (const cJSON *c = o->child; c; c = c->next) {
        int k = 0;
        while (k < n && strcmp(c->string, names[k]) != 0) k++;
        if (k == n) return rl_errf(err, "%s has an unknown key \"%.40s\"", what, c->string);
        if (items[k]) return rl_errf(err, "%s has the key \"%s\" twice", what, names[k]);
        items[k] = c;
    }
    for (int i = 0; i < n; i++) {
        if (!items[i]) return rl_errf(err, "%s lacks the key \"%s\"", what, names[i]);
    }
    return 0;
}

int receipt_from_json(receipt_rec *r, const char *line, rl_err *err) {
    memset(r, 0, sizeof *r);
    const char *end = NULL;
    cJSON *o = cJSON_ParseWithOpts(line, &end, 1);
    if (!o) {
        const char *at = cJSON_GetErrorPtr();
        at = at ? at : "";
        size_t n = strcspn(at, "\r\n"); /* the line end is not part of the quote */
        if (n == 0) return rl_errf(err, "not valid JSON (the line ends inside it)");
        return rl_errf(err, "not valid JSON (near \"%.*s\")", (int)(n < 20 ? n : 20), at);
    }
    enum { V, RING, REQ, NONCE, MAN, LS, LE, SEQS, IN, OUT, SIGNER, SIG, NF };
    static const char *const names[NF] = {"v",         "ring_id", "request_id", "nonce", "manifest", "layer_start",
                                          "layer_end", "seqs",    "in",         "out",   "signer",   "sig"};
    const cJSON *f[NF];
    uint32_t v = 0;
    int rc = -1;
    if (json_fields(o, "the receipt", names, f, NF, err) != 0 || json_u32(f[V], "v", &v, err) != 0) goto done;
    if (v != RECEIPT_VERSION) {
        rl_errf(err, "receipt version %u (this build reads %d)", v, RECEIPT_VERSION);
        goto done;
    }
    r->version = (uint16_t)v;
    if (json_u64(f[RING], "ring_id", &r->ring_id, err) != 0 ||
        json_u64(f[REQ], "request_id", &r->request_id, err) != 0 ||
        json_hex(f[NONCE], "nonce", r->nonce, 32, err) != 0 ||
        json_hex(f[MAN], "manifest", r->manifest, 32, err) != 0 ||
        json_u32(f[LS], "layer_start", &r->layer_start, err) != 0 ||
        json_u32(f[LE], "layer_end", &r->layer_end, err) != 0 || json_hex(f[IN], "in", r->in_hash, 32, err) != 0 ||
        json_hex(f[OUT], "out", r->out_hash, 32, err) != 0 || json_hex(f[SIGNER], "signer", r->signer, 32, err) != 0 ||
        json_hex(f[SIG], "sig", r->sig, 64, err) != 0) {
        goto done;
    }
    if (!cJSON_IsArray(f[SEQS])) {
        rl_errf(err, "\"seqs\" is not an array");
        goto done;
    }
    int n = cJSON_GetArraySize(f[SEQS]);
    if (n < 1 || n > RECEIPT_MAX_SEQS) {
        rl_errf(err, "\"seqs\" has %d entries (1 to %d)", n, RECEIPT_MAX_SEQS);
        goto done;
    }
    static const char *const snames[3] = {"id", "pos", "n"};
    int i = 0;
    for (const cJSON *s = f[SEQS]->child; s; s = s->next, i++) {
        const cJSON *sf[3];
        if (json_fields(s, "the entry", snames, sf, 3, err) != 0 ||
            json_u64(sf[0], "id", &r->seqs[i].seq_id, err) != 0 || json_u32(sf[1], "pos", &r->seqs[i].pos, err) != 0 ||
            json_u32(sf[2], "n", &r->seqs[i].n_tokens, err) != 0) {
            rl_err_prefix(err, "seqs[%d]", i);
            goto done;
        }
    }
    r->n_seqs = (uint32_t)n;
    rc = 0;
done:
    cJSON_Delete(o);
    return rc;
}

/* ---- nonce book ---- */

int receipt_book_init(receipt_nonce_book *b, uint32_t cap, rl_err *err) {
    memset(b, 0, sizeof *b);
    if (cap < 1 || cap > (1u << 28)) return rl_errf(err, "nonce book of %u entries (1 to 2^28)", cap);
    if (sodium_init() < 0) return rl_errf(err, "libsodium failed to initialise");
    size_t slots = 2;
    while (slots < 2 * (size_t)cap) slots <<= 1; /* load factor <= 1/2: short probes */
    b->ring = calloc(cap, sizeof *b->ring);
    b->table = calloc(slots, sizeof *b->table);
    if (!b->ring || !b->table) {
        receipt_book_free(b);
        return rl_errf(err, "out of memory for a nonce book of %u entries", cap);
    }
    b->cap = cap;
    b->mask = (uint32_t)(slots - 1);
    randombytes_buf(b->key, sizeof b->key);
    return 0;
}

void receipt_book_free(receipt_nonce_book *b) {
    free(b->ring);
    free(b->table);
    memset(b, 0, sizeof *b);
}

static uint32_t book_home(const receipt_nonce_book *b, const uint8_t nonce[32]) {
    uint8_t h[crypto_shorthash_BYTES];
    crypto_shorthash(h, nonce, 32, b->key);
    return (uint32_t)get_u64(h) & b->mask;
}

/* Table slot holding the nonce, or -1. */
static int64_t book_find(const receipt_nonce_book *b, const uint8_t nonce[32]) {
    if (!b->table) return -1;
    for (uint32_t i = book_home(b, nonce);; i = (i + 1) & b->mask) {
        if (!b->table[i]) return -1;
        if (memcmp(b->ring[b->table[i] - 1], nonce, 32) == 0) return i;
    }
}

bool receipt_book_has(const receipt_nonce_book *b, const uint8_t nonce[32]) { return book_find(b, nonce) >= 0; }

int receipt_book_add(receipt_nonce_book *b, const uint8_t nonce[32]) {
    if (book_find(b, nonce) >= 0) return 0;
    if (b->n == b->cap) {
        /* Forget the oldest (ring[head]) with backward-shift deletion, which keeps every remaining entry
         * reachable from its home slot without tombstones. */
        uint32_t j = (uint32_t)book_find(b, b->ring[b->head]);
        b->table[j] = 0;
        for (uint32_t k = (j + 1) & b->mask; b->table[k]; k = (k + 1) & b->mask) {
            uint32_t home = book_home(b, b->ring[b->table[k] - 1]);
            if (((k - home) & b->mask) >= ((k - j) & b->mask)) {
                b->table[j] = b->table[k];
                b->table[k] = 0;
                j = k;
            }
        }
        b->n--;
    }
    memcpy(b->ring[b->head], nonce, 32);
    uint32_t i = book_home(b, nonce);
    while (b->table[i]) i = (i + 1) & b->mask;
    b->table[i] = b->head + 1;
    b->head = (b->head + 1) % b->cap;
    b->n++;
    return 1;
}

/* ---- traversal checks ---- */

typedef struct chk {
    receipt_problem_fn fn;
    void *user;
    int n;
} chk;

static void report(chk *c, int stage, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void report(chk *c, int stage, const char *fmt, ...) {
    c->n++;
    if (!c->fn) return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->fn(c->user, stage, msg);
}

/* Short hex of a hash for messages (16 digits identify it; the full value is in the log). */
typedef struct hx {
    char s[20];
} hx;
static hx short_hex(const uint8_t *h) {
    hx x;
    sodium_bin2hex(x.s, 17, h, 8);
    strcat(x.s, "..");
    return x;
}

/* "stage 1 (layers [3, 6), node 1a2b..)": which receipt a message is about. */
typedef struct lbl {
    char s[96];
} lbl;
static lbl stage_label(const receipt_rec *r, int i) {
    lbl l;
    snprintf(l.s, sizeof l.s, "stage %d (layers [%u, %u), node %s)", i, r->layer_start, r->layer_end,
             short_hex(r->signer).s);
    return l;
}

static int range_cmp_idx(const receipt_rec *rs, int a, int b) {
    if (rs[a].layer_start != rs[b].layer_start) return rs[a].layer_start < rs[b].layer_start ? -1 : 1;
    if (rs[a].layer_end != rs[b].layer_end) return rs[a].layer_end < rs[b].layer_end ? -1 : 1;
    return a < b ? -1 : a > b;
}

static void check_positions(chk *c, const receipt_rec *r, int i, const receipt_seq *ref, uint32_t n_ref,
                            const char *whose) {
    lbl l = stage_label(r, i);
    if (r->n_seqs != n_ref) {
        report(c, i, "%s: positions: %u sequences, but %s %u", l.s, r->n_seqs, whose, n_ref);
        return;
    }
    for (uint32_t k = 0; k < n_ref && k < RECEIPT_MAX_SEQS; k++) {
        const receipt_seq *a = &r->seqs[k], *b = &ref[k];
        if (a->seq_id != b->seq_id || a->pos != b->pos || a->n_tokens != b->n_tokens) {
            report(c, i,
                   "%s: positions: sequence entry %u is (seq %" PRIu64 ", pos %u, %u tokens), but %s (seq %" PRIu64
                   ", pos %u, %u tokens)",
                   l.s, k, a->seq_id, a->pos, a->n_tokens, whose, b->seq_id, b->pos, b->n_tokens);
            return;
        }
    }
}

int receipt_check_traversal_all(const receipt_rec *rs, int n, const receipt_expect *e, receipt_problem_fn fn, void *user) {
    chk c = {.fn = fn, .user = user};
    char nonce_hex[65];
    sodium_bin2hex(nonce_hex, sizeof nonce_hex, e->nonce, 32);

    /* Freshness first, and unconditionally: the nonce is spent even when the traversal fails. */
    if (e->seen && !receipt_book_add(e->seen, e->nonce)) {
        report(&c, -1, "nonce %s was already used by an earlier traversal (a replayed or reused nonce)", nonce_hex);
    }
    if (n <= 0 || n > RECEIPT_MAX_STAGES) {
        report(&c, -1, "%d receipts (1 to %d), for a traversal of %d stages", n, RECEIPT_MAX_STAGES, e->n_stages);
        return c.n;
    }
    if (n != e->n_stages) report(&c, -1, "%d receipts, but the traversal was assigned %d stages", n, e->n_stages);

    for (int i = 0; i < n; i++) {
        const receipt_rec *r = &rs[i];
        lbl l = stage_label(r, i);
        rl_err err = {{0}};
        if (receipt_verify_sig(r, &err) != 0) report(&c, i, "%s: signature: %s", l.s, err.msg);
        if (i < e->n_stages) {
            const receipt_stage_expect *s = &e->stages[i];
            if (memcmp(r->signer, s->node_pk, 32) != 0) {
                char got[65], want[65];
                sodium_bin2hex(got, sizeof got, r->signer, 32);
                sodium_bin2hex(want, sizeof want, s->node_pk, 32);
                report(&c, i, "%s: signer: signed by %s, but stage %d (layers [%u, %u)) was assigned to %s", l.s, got,
                       i, s->layer_start, s->layer_end, want);
            }
            if (r->layer_start != s->layer_start || r->layer_end != s->layer_end) {
                report(&c, i, "%s: layers: claims layers [%u, %u), but stage %d was assigned [%u, %u)", l.s,
                       r->layer_start, r->layer_end, i, s->layer_start, s->layer_end);
            } else if (memcmp(r->manifest, s->manifest, 32) != 0) {
                report(&c, i,
                       "%s: manifest: hash %s, but the model's layers [%u, %u) hash to %s (another model, or other "
                       "weights or metadata)",
                       l.s, short_hex(r->manifest).s, s->layer_start, s->layer_end, short_hex(s->manifest).s);
            }
        } else {
            report(&c, i, "%s: no stage %d was assigned", l.s, i);
        }
        if (r->ring_id != e->ring_id) {
            report(&c, i, "%s: ring id %" PRIu64 ", but this traversal ran on ring %" PRIu64, l.s, r->ring_id,
                   e->ring_id);
        }
        if (r->request_id != e->request_id) {
            report(&c, i,
                   "%s: request id %" PRIu64 ", but this traversal is request %" PRIu64
                   " (a receipt of another request)",
                   l.s, r->request_id, e->request_id);
        }
        if (memcmp(r->nonce, e->nonce, 32) != 0) {
            report(&c, i, "%s: nonce %s, but this traversal's nonce is %s (a receipt of another traversal)", l.s,
                   short_hex(r->nonce).s, short_hex(e->nonce).s);
        }
        if (e->seqs)
            check_positions(&c, r, i, e->seqs, e->n_seqs, "the coordinator sent");
        else if (i > 0)
            check_positions(&c, r, i, rs[0].seqs, rs[0].n_seqs, "stage 0 has");
    }

    /* Order: ranges must rise with the stage index. */
    for (int i = 1; i < n; i++) {
        if (range_cmp_idx(rs, i, i - 1) < 0) {
            report(&c, i, "order: stage %d's layers [%u, %u) come before stage %d's [%u, %u) (stages out of order)", i,
                   rs[i].layer_start, rs[i].layer_end, i - 1, rs[i - 1].layer_start, rs[i - 1].layer_end);
        }
    }

    /* Coverage of [0, n_layer), n_layer from the model: walk the ranges sorted by start so an order problem
     * (reported above) does not also read as a gap and an overlap. */
    int idx[RECEIPT_MAX_STAGES];
    for (int i = 0; i < n; i++) idx[i] = i;
    for (int i = 1; i < n; i++) {
        for (int j = i; j > 0 && range_cmp_idx(rs, idx[j], idx[j - 1]) < 0; j--) {
            int t = idx[j];
            idx[j] = idx[j - 1];
            idx[j - 1] = t;
        }
    }
    uint32_t cursor = 0;
    int prev = -1;
    for (int k = 0; k < n; k++) {
        int i = idx[k];
        const receipt_rec *r = &rs[i];
        lbl l = stage_label(r, i);
        if (r->layer_start >= r->layer_end) {
            report(&c, i, "%s: layers: the range is empty or reversed", l.s);
            continue;
        }
        if (r->layer_end > e->n_layer) {
            report(&c, i, "%s: layers: the model has only %u layers", l.s, e->n_layer);
        }
        if (r->layer_start > cursor) {
            if (prev < 0)
                report(&c, i,
                       "coverage: layers [%u, %u) are skipped: no stage runs them (the first stage starts at layer %u)",
                       cursor, r->layer_start, r->layer_start);
            else
                report(&c, i, "coverage: layers [%u, %u) are skipped between stage %d and stage %d", cursor,
                       r->layer_start, prev, i);
        } else if (r->layer_start < cursor) {
            uint32_t ov_end = r->layer_end < cursor ? r->layer_end : cursor;
            report(
                &c, i,
                "coverage: layers [%u, %u) run twice: stage %d (layers [%u, %u)) overlaps stage %d (layers [%u, %u))",
                r->layer_start, ov_end, i, r->layer_start, r->layer_end, prev, rs[prev].layer_start,
                rs[prev].layer_end);
        }
        if (r->layer_end > cursor) {
            cursor = r->layer_end;
            prev = i;
        }
    }
    if (cursor < e->n_layer) {
        report(&c, -1, "coverage: layers [%u, %u) are skipped: the last stage ends at layer %u of the model's %u",
               cursor, e->n_layer, cursor, e->n_layer);
    }

    /* Chain: what stage i sent is what stage i+1 received. */
    for (int i = 0; i + 1 < n; i++) {
        if (memcmp(rs[i].out_hash, rs[i + 1].in_hash, 32) != 0) {
            report(&c, i + 1,
                   "chain: broken between stage %d and stage %d: stage %d's output hash %s is not stage %d's input "
                   "hash %s",
                   i, i + 1, i, short_hex(rs[i].out_hash).s, i + 1, short_hex(rs[i + 1].in_hash).s);
        }
    }
    if (e->first_in && memcmp(rs[0].in_hash, e->first_in, 32) != 0) {
        report(&c, 0, "%s: input hash %s, but the tokens the coordinator sent hash to %s", stage_label(&rs[0], 0).s,
               short_hex(rs[0].in_hash).s, short_hex(e->first_in).s);
    }
    if (e->last_out && memcmp(rs[n - 1].out_hash, e->last_out, 32) != 0) {
        report(&c, n - 1, "%s: output hash %s, but the result the coordinator received hashes to %s",
               stage_label(&rs[n - 1], n - 1).s, short_hex(rs[n - 1].out_hash).s, short_hex(e->last_out).s);
    }
    return c.n;
}

typedef struct first_problem {
    rl_err *err;
    int n;
} first_problem;

static void keep_first(void *user, int stage, const char *msg) {
    first_problem *f = user;
    if (f->n++ == 0) rl_errf(f->err, "%s", msg);
}

int receipt_check_traversal(const receipt_rec *rs, int n, const receipt_expect *e, rl_err *err) {
    first_problem f = {.err = err};
    int k = receipt_check_traversal_all(rs, n, e, keep_first, &f);
    if (k == 0) return 0;
    if (k > 1 && err) {
        size_t len = strlen(err->msg);
        snprintf(err->msg + len, sizeof err->msg - len, " (and %d more problem%s)", k - 1, k > 2 ? "s" : "");
    }
    return -1;
}
