/* json_gram.c - the JSON prefix recognizer of json_gram.h. */
#include "json_gram.h"

#include <string.h>

/* Modes: where in the grammar the next byte falls. */
enum {
    M_START,     /* before the top-level object: whitespace or '{' */
    M_VALUE,     /* a value must start (after ':' or ',' in an array, or '[') */
    M_VALUE_OR_CLOSE, /* just after '[': a value or ']' */
    M_KEY_OR_CLOSE,   /* just after '{': a key or '}' */
    M_KEY,       /* after ',' in an object: a key */
    M_COLON,     /* after a key */
    M_AFTER,     /* after a value: ',' or the container's closer */
    M_STRING,    /* inside a string (sub: 0 plain, 1 after '\', 2..5 reading \u hex digits) */
    M_NUMBER,    /* inside a number (sub: the number's state below) */
    M_LITERAL,   /* inside true / false / null (sub: the literal's index << 3 | bytes read) */
    M_DONE,      /* the top-level object is closed */
};
/* Number states: after '-', after a leading 0, in int digits, after '.', in frac digits, after e/E,
 * after the exponent's sign, in exp digits. Complete (may end) in ZERO, INT, FRAC, EXP. */
enum { N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };

static const char *const lits[3] = {"true", "false", "null"};

void jg_init(jg_state *s) { memset(s, 0, sizeof *s); }

static bool is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static bool is_hex(unsigned char c) { return (c >= '0' && c <= '9') || ((c | 32) >= 'a' && (c | 32) <= 'f'); }

/* A value ended: the container's next part. */
static void value_end(jg_state *s) { s->mode = s->depth == 0 ? M_DONE : M_AFTER; }

static bool start_value(jg_state *s, unsigned char c) {
    s->ws = 0;
    if (c == '{' || c == '[') {
        if (s->depth == JG_MAX_DEPTH) return false;
        s->stack[s->depth++] = c;
        s->mode = c == '{' ? M_KEY_OR_CLOSE : M_VALUE_OR_CLOSE;
        return true;
    }
    if (c == '"') {
        s->mode = M_STRING, s->sub = 0, s->key = 0;
        return true;
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        s->mode = M_NUMBER;
        s->sub = c == '-' ? N_MINUS : c == '0' ? N_ZERO : N_INT;
        return true;
    }
    for (int k = 0; k < 3; k++) {
        if (c == (unsigned char)lits[k][0]) {
            s->mode = M_LITERAL, s->sub = (uint8_t)(k << 3 | 1);
            return true;
        }
    }
    return false;
}

static bool close_container(jg_state *s, unsigned char c) {
    if (s->depth == 0 || s->stack[s->depth - 1] != (c == '}' ? '{' : '[')) return false;
    s->depth--;
    s->ws = 0;
    value_end(s);
    return true;
}

static bool ws_ok(jg_state *s, unsigned char c) {
    if (!is_ws(c)) return false;
    return ++s->ws <= JG_MAX_WS;
}

static bool feed1(jg_state *s, unsigned char c) {
    switch (s->mode) {
    case M_START:
        if (ws_ok(s, c)) return true;
        return c == '{' && start_value(s, c);
    case M_VALUE:
        return ws_ok(s, c) || start_value(s, c);
    case M_VALUE_OR_CLOSE:
        return ws_ok(s, c) || (c == ']' ? close_container(s, c) : start_value(s, c));
    case M_KEY_OR_CLOSE:
    case M_KEY:
        if (ws_ok(s, c)) return true;
        if (c == '}' && s->mode == M_KEY_OR_CLOSE) return close_container(s, c);
        if (c != '"') return false;
        s->mode = M_STRING, s->sub = 0, s->key = 1, s->ws = 0;
        return true;
    case M_COLON:
        if (ws_ok(s, c)) return true;
        if (c != ':') return false;
        s->mode = M_VALUE, s->ws = 0;
        return true;
    case M_AFTER:
        if (ws_ok(s, c)) return true;
        if (c == ',') {
            s->mode = s->stack[s->depth - 1] == '{' ? M_KEY : M_VALUE, s->ws = 0;
            return true;
        }
        return (c == '}' || c == ']') && close_container(s, c);
    case M_STRING:
        if (s->sub == 0) {
            if (c == '"') {
                if (s->key) s->mode = M_COLON, s->ws = 0;
                else value_end(s), s->ws = 0;
                return true;
            }
            if (c == '\\') s->sub = 1;
            return c >= 0x20; /* control characters must be escaped; other bytes pass (UTF-8 is the tokenizer's) */
        }
        if (s->sub == 1) {
            if (c == 'u') return s->sub = 2, true;
            if (!strchr("\"\\/bfnrt", c) || !c) return false;
            s->sub = 0;
            return true;
        }
        if (!is_hex(c)) return false;
        s->sub = s->sub == 5 ? 0 : s->sub + 1;
        return true;
    case M_NUMBER: {
        bool digit = c >= '0' && c <= '9';
        switch (s->sub) {
        case N_MINUS: if (!digit) return false; s->sub = c == '0' ? N_ZERO : N_INT; return true;
        case N_ZERO:
        case N_INT:
            if (digit && s->sub == N_INT) return true;
            if (c == '.') return s->sub = N_DOT, true;
            if (c == 'e' || c == 'E') return s->sub = N_E, true;
            break;
        case N_DOT: if (!digit) return false; s->sub = N_FRAC; return true;
        case N_FRAC:
            if (digit) return true;
            if (c == 'e' || c == 'E') return s->sub = N_E, true;
            break;
        case N_E:
            if (c == '+' || c == '-') return s->sub = N_ESIGN, true;
            if (!digit) return false;
            s->sub = N_EXP;
            return true;
        case N_ESIGN: if (!digit) return false; s->sub = N_EXP; return true;
        case N_EXP: if (digit) return true; break;
        }
        /* the number ends here: the byte belongs to what follows it */
        value_end(s);
        s->ws = 0;
        return feed1(s, c);
    }
    case M_LITERAL: {
        const char *l = lits[s->sub >> 3];
        size_t at = s->sub & 7;
        if (c != (unsigned char)l[at]) return false;
        if (!l[at + 1]) value_end(s), s->ws = 0;
        else s->sub++;
        return true;
    }
    case M_DONE:
    default:
        return false;
    }
}

bool jg_feed(jg_state *s, const char *bytes, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (!feed1(s, (unsigned char)bytes[i])) return false;
    }
    return true;
}

bool jg_done(const jg_state *s) { return s->mode == M_DONE; }

size_t jg_close(const jg_state *s, char *out) {
    size_t n = 0;
    int depth = s->depth;
    switch (s->mode) {
    case M_START: out[n++] = '{', depth = 1; break; /* then '}' below */
    case M_VALUE: out[n++] = '0'; break;
    case M_VALUE_OR_CLOSE:
    case M_KEY_OR_CLOSE:
    case M_AFTER: break;
    case M_KEY: memcpy(out + n, "\"\":0", 4), n += 4; break;
    case M_COLON: memcpy(out + n, ":0", 2), n += 2; break;
    case M_STRING:
        if (s->sub == 1) out[n++] = 'n';
        for (int k = s->sub; s->sub >= 2 && k <= 5; k++) out[n++] = '0';
        out[n++] = '"';
        if (s->key) memcpy(out + n, ":0", 2), n += 2;
        break;
    case M_NUMBER:
        if (s->sub == N_MINUS || s->sub == N_DOT || s->sub == N_E || s->sub == N_ESIGN) out[n++] = '0';
        break;
    case M_LITERAL: {
        const char *l = lits[s->sub >> 3] + (s->sub & 7);
        size_t k = strlen(l);
        memcpy(out + n, l, k);
        n += k;
        break;
    }
    case M_DONE: break;
    }
    for (int d = depth - 1; d >= 0; d--) out[n++] = s->mode == M_START ? '}' : s->stack[d] == '{' ? '}' : ']';
    out[n] = 0;
    return n;
}
