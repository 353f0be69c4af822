/* json_schema.c - JSON schema -> byte grammar (json_schema.h).
 *
 * Every value rule ends with the blank space allowed after a token (SP), so callers only ever put
 * structure around values. Rules shared by all schemas (strings, numbers, any value) are made once per
 * compilation, on first use. */
#include "json_schema.h"

#include <cJSON.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JS_MAX_DEPTH 64    /* nested schemas (not values: $ref recursion is a rule, not depth) */
#define JS_MAX_REPEAT 4096 /* minItems / maxItems / minLength / maxLength written out at most */
#define JS_MAX_REFS 256

typedef struct js_ctx {
    gr_builder *b;
    const cJSON *root;
    rl_err *err;
    int failed;
    bool lenient; /* keywords it cannot enforce are ignored (a wider grammar), not refused */
    /* shared rules, -1 until made */
    int sp, value, str, str_body, chr, num, integer, digits;
    struct {
        char *ref;
        int rule;
    } refs[JS_MAX_REFS];
    int n_refs;
} js_ctx;

/* ---- item shorthands --------------------------------------------------------------------------------- */

static gr_item R(int r) { return (gr_item){.kind = GR_RULE, .rule = r}; }
static gr_item L(const char *s) { return (gr_item){.kind = GR_LIT, .lit = s}; }
static gr_item S(const uint8_t *set) { return (gr_item){.kind = GR_SET, .set = set}; }

static int fail(js_ctx *c, const char *path, const char *fmt, const char *what) {
    if (!c->failed) {
        char m[512];
        snprintf(m, sizeof m, fmt, what);
        rl_errf(c->err, "json_schema: %s (at %s)", m, *path ? path : "the top level");
    }
    c->failed = 1;
    return -1;
}

static int rule(js_ctx *c) { return gr_rule_new(c->b); }

static void alt(js_ctx *c, int r, const gr_item *it, int n) { gr_alt_add(c->b, r, it, n); }

/* A set of bytes lo..hi. */
static const uint8_t *range(uint8_t set[32], unsigned char lo, unsigned char hi) {
    gr_set_clear(set);
    gr_set_add(set, lo, hi);
    return set;
}

/* ---- shared rules ------------------------------------------------------------------------------------ */

/* SP: nothing, a space, or a newline and up to 4 spaces */
static int sp(js_ctx *c) {
    if (c->sp >= 0) return c->sp;
    int r = c->sp = rule(c), ind = -1;
    for (int k = 0; k < 4; k++) { /* ind_k: up to k + 1 spaces */
        int n = rule(c);
        alt(c, n, NULL, 0);
        if (ind < 0) alt(c, n, (gr_item[]){L(" ")}, 1);
        else alt(c, n, (gr_item[]){L(" "), R(ind)}, 2);
        ind = n;
    }
    alt(c, r, NULL, 0);
    alt(c, r, (gr_item[]){L(" ")}, 1);
    alt(c, r, (gr_item[]){L("\n"), R(ind)}, 2);
    return r;
}

/* one character of a JSON string: printable ASCII but " and \, an escape, or a well-formed UTF-8 sequence
 * (RFC 3629's table: no overlong forms, no surrogates, nothing past U+10FFFF; so never 0xF8-0xFF, the
 * special-token bytes) */
static int chr(js_ctx *c) {
    if (c->chr >= 0) return c->chr;
    int r = c->chr = rule(c);
    uint8_t plain[32], esc[32], hex[32];
    gr_set_clear(plain);
    gr_set_add(plain, 0x20, 0x21);
    gr_set_add(plain, 0x23, 0x5b);
    gr_set_add(plain, 0x5d, 0x7f);
    gr_set_clear(esc);
    for (const char *e = "\"\\/bfnrt"; *e; e++) gr_set_add(esc, (unsigned char)*e, (unsigned char)*e);
    gr_set_clear(hex);
    gr_set_add(hex, '0', '9');
    gr_set_add(hex, 'a', 'f');
    gr_set_add(hex, 'A', 'F');
    alt(c, r, (gr_item[]){S(plain)}, 1);
    alt(c, r, (gr_item[]){L("\\"), S(esc)}, 2);
    alt(c, r, (gr_item[]){L("\\u"), S(hex), S(hex), S(hex), S(hex)}, 5);
    static const unsigned char seq[][4][2] = { /* per form: each byte's range; {0,0} ends it */
        {{0xc2, 0xdf}, {0x80, 0xbf}},
        {{0xe0, 0xe0}, {0xa0, 0xbf}, {0x80, 0xbf}},
        {{0xe1, 0xec}, {0x80, 0xbf}, {0x80, 0xbf}},
        {{0xed, 0xed}, {0x80, 0x9f}, {0x80, 0xbf}},
        {{0xee, 0xef}, {0x80, 0xbf}, {0x80, 0xbf}},
        {{0xf0, 0xf0}, {0x90, 0xbf}, {0x80, 0xbf}, {0x80, 0xbf}},
        {{0xf1, 0xf3}, {0x80, 0xbf}, {0x80, 0xbf}, {0x80, 0xbf}},
        {{0xf4, 0xf4}, {0x80, 0x8f}, {0x80, 0xbf}, {0x80, 0xbf}},
    };
    for (size_t f = 0; f < sizeof seq / sizeof *seq; f++) {
        uint8_t sets[4][32];
        gr_item it[4];
        int n = 0;
        for (; n < 4 && seq[f][n][0]; n++) it[n] = S(range(sets[n], seq[f][n][0], seq[f][n][1]));
        alt(c, r, it, n);
    }
    return r;
}

static int str_body(js_ctx *c) { /* any number of characters */
    if (c->str_body >= 0) return c->str_body;
    int r = c->str_body = rule(c);
    alt(c, r, NULL, 0);
    alt(c, r, (gr_item[]){R(chr(c)), R(r)}, 2);
    return r;
}

static int str(js_ctx *c) {
    if (c->str >= 0) return c->str;
    int r = c->str = rule(c);
    alt(c, r, (gr_item[]){L("\""), R(str_body(c)), L("\""), R(sp(c))}, 4);
    return r;
}

static int repeat(js_ctx *c, int item, const char *sep, int min, int max);

/* [0-9]{0,max} */
static int digits_upto(js_ctx *c, int max) {
    uint8_t d[32];
    int one = rule(c);
    alt(c, one, (gr_item[]){S(range(d, '0', '9'))}, 1);
    return repeat(c, one, NULL, 0, max);
}

static int digits(js_ctx *c) { /* [0-9]{0,15}: what follows a fraction's or an exponent's first digit */
    if (c->digits >= 0) return c->digits;
    return c->digits = digits_upto(c, 15);
}

/* -?(0|[1-9][0-9]{0,14}), without SP: at most 15 digits, so every integer is exact in a double (a
 * JavaScript client's number), as llama.cpp bounds them too; random weights would otherwise write digits
 * for as long as the budget lets them */
static int int_part(js_ctx *c) {
    if (c->integer >= 0) return c->integer;
    int r = c->integer = rule(c), mag = rule(c);
    uint8_t d19[32];
    alt(c, mag, (gr_item[]){L("0")}, 1);
    alt(c, mag, (gr_item[]){S(range(d19, '1', '9')), R(digits_upto(c, 14))}, 2);
    alt(c, r, (gr_item[]){R(mag)}, 1);
    alt(c, r, (gr_item[]){L("-"), R(mag)}, 2);
    return r;
}

static int integer(js_ctx *c) {
    int r = rule(c);
    alt(c, r, (gr_item[]){R(int_part(c)), R(sp(c))}, 2);
    return r;
}

static int number(js_ctx *c) {
    if (c->num >= 0) return c->num;
    int r = c->num = rule(c), frac = rule(c), ex = rule(c), sign = rule(c);
    uint8_t d[32], e[32], pm[32];
    range(d, '0', '9');
    gr_set_clear(e);
    gr_set_add(e, 'e', 'e');
    gr_set_add(e, 'E', 'E');
    gr_set_clear(pm);
    gr_set_add(pm, '+', '+');
    gr_set_add(pm, '-', '-');
    alt(c, frac, NULL, 0);
    alt(c, frac, (gr_item[]){L("."), S(d), R(digits(c))}, 3);
    alt(c, sign, NULL, 0);
    alt(c, sign, (gr_item[]){S(pm)}, 1);
    alt(c, ex, NULL, 0);
    alt(c, ex, (gr_item[]){S(e), R(sign), S(d), R(digits_upto(c, 2))}, 4); /* exponents of at most 3 digits */
    alt(c, r, (gr_item[]){R(int_part(c)), R(frac), R(ex), R(sp(c))}, 4);
    return r;
}

static int literal(js_ctx *c, const char *text) {
    int r = rule(c);
    alt(c, r, (gr_item[]){L(text), R(sp(c))}, 2);
    return r;
}

/* { SP (KV ("," SP KV)*)? } SP with KV = string SP ":" SP value */
static int any_object(js_ctx *c, int value) {
    int r = rule(c), kv = rule(c), more = rule(c);
    alt(c, kv, (gr_item[]){R(str(c)), L(":"), R(sp(c)), R(value)}, 4);
    alt(c, more, NULL, 0);
    alt(c, more, (gr_item[]){L(","), R(sp(c)), R(kv), R(more)}, 4);
    alt(c, r, (gr_item[]){L("{"), R(sp(c)), L("}"), R(sp(c))}, 4);
    alt(c, r, (gr_item[]){L("{"), R(sp(c)), R(kv), R(more), L("}"), R(sp(c))}, 6);
    return r;
}

static int any_value(js_ctx *c) {
    if (c->value >= 0) return c->value;
    int r = c->value = rule(c), arr = rule(c), more = rule(c);
    alt(c, more, NULL, 0);
    alt(c, more, (gr_item[]){L(","), R(sp(c)), R(r), R(more)}, 4);
    alt(c, arr, (gr_item[]){L("["), R(sp(c)), L("]"), R(sp(c))}, 4);
    alt(c, arr, (gr_item[]){L("["), R(sp(c)), R(r), R(more), L("]"), R(sp(c))}, 6);
    alt(c, r, (gr_item[]){R(any_object(c, r))}, 1);
    alt(c, r, (gr_item[]){R(arr)}, 1);
    alt(c, r, (gr_item[]){R(str(c))}, 1);
    alt(c, r, (gr_item[]){R(number(c))}, 1);
    alt(c, r, (gr_item[]){R(literal(c, "true"))}, 1);
    alt(c, r, (gr_item[]){R(literal(c, "false"))}, 1);
    alt(c, r, (gr_item[]){R(literal(c, "null"))}, 1);
    return r;
}

/* ---- schemas ----------------------------------------------------------------------------------------- */

static int schema(js_ctx *c, const cJSON *s, const char *path, int depth);

static int get_count(js_ctx *c, const cJSON *s, const char *key, const char *path, int dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, key);
    if (!v) return dflt;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble != (double)(int)v->valuedouble)
        return fail(c, path, "'%s' must be a non-negative integer", key), -2;
    if (v->valuedouble > JS_MAX_REPEAT) return fail(c, path, "'%s' is larger than 4096, which is not supported", key), -2;
    return (int)v->valuedouble;
}

/* OPEN (ITEM (SEP ITEM){min-1..max-1})? CLOSE, or with min > 0 the list not optional; max < 0 unbounded */
static int repeat(js_ctx *c, int item, const char *sep, int min, int max) {
    /* rest[k]: what may follow the k-th item */
    int rest_inf = -1;
    if (max < 0) {
        rest_inf = rule(c);
        alt(c, rest_inf, NULL, 0);
        if (sep) alt(c, rest_inf, (gr_item[]){L(sep), R(sp(c)), R(item), R(rest_inf)}, 4);
        else alt(c, rest_inf, (gr_item[]){R(item), R(rest_inf)}, 2);
    }
    int top = max < 0 ? (min > 1 ? min : 1) : max; /* rest rules written out: rest[1..top] */
    int next = max < 0 ? rest_inf : -1;            /* rest[top + 1] */
    for (int k = top; k >= 1; k--) {
        int r = rule(c);
        if (max >= 0 && k == max) {
            alt(c, r, NULL, 0);
        } else {
            if (k >= min) alt(c, r, NULL, 0);
            if (sep) alt(c, r, (gr_item[]){L(sep), R(sp(c)), R(item), R(next)}, 4);
            else alt(c, r, (gr_item[]){R(item), R(next)}, 2);
        }
        next = r;
    }
    int list = rule(c);
    if (min == 0) alt(c, list, NULL, 0);
    if (max != 0) alt(c, list, (gr_item[]){R(item), R(next)}, 2);
    return list;
}

static int string_schema(js_ctx *c, const cJSON *s, const char *path) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(s, "format");
    int min = get_count(c, s, "minLength", path, 0), max = get_count(c, s, "maxLength", path, -1);
    if (min < -1 || max < -1) return -1;
    if (max >= 0 && max < min) return fail(c, path, "%s", "maxLength is below minLength: no string matches");
    const char *fmt = cJSON_IsString(f) ? f->valuestring : NULL;
    bool dated = fmt && (!strcmp(fmt, "date") || !strcmp(fmt, "time") || !strcmp(fmt, "date-time") || !strcmp(fmt, "uuid"));
    if (!dated) {
        int r = rule(c);
        int body = min == 0 && max < 0 ? str_body(c) : repeat(c, chr(c), NULL, min, max);
        alt(c, r, (gr_item[]){L("\""), R(body), L("\""), R(sp(c))}, 4);
        return r;
    }
    if (min > 0 || max >= 0) return fail(c, path, "%s", "minLength / maxLength with a format is not supported");
    uint8_t d[32], d01[32], d03[32], d19[32], d02[32], d05[32], d12[32], hex[32];
    range(d, '0', '9'), range(d01, '0', '1'), range(d03, '0', '3'), range(d19, '1', '9');
    range(d02, '0', '2'), range(d05, '0', '5'), range(d12, '1', '2');
    gr_set_clear(hex);
    gr_set_add(hex, '0', '9');
    gr_set_add(hex, 'a', 'f');
    /* date: YYYY-MM-DD with month 01-12 and day 01-31; time: HH:MM:SS[.frac] then Z or +HH:MM / -HH:MM */
    int date = rule(c), month = rule(c), day = rule(c), time = rule(c), hour = rule(c), frac = rule(c),
        zone = rule(c), r = rule(c);
    alt(c, month, (gr_item[]){L("0"), S(d19)}, 2);
    alt(c, month, (gr_item[]){L("1"), S(d02)}, 2);
    alt(c, day, (gr_item[]){L("0"), S(d19)}, 2);
    alt(c, day, (gr_item[]){S(d12), S(d)}, 2);
    alt(c, day, (gr_item[]){L("3"), S(d01)}, 2);
    alt(c, date, (gr_item[]){S(d), S(d), S(d), S(d), L("-"), R(month), L("-"), R(day)}, 8);
    alt(c, hour, (gr_item[]){S(d01), S(d)}, 2);
    alt(c, hour, (gr_item[]){L("2"), S(d03)}, 2);
    alt(c, frac, NULL, 0);
    alt(c, frac, (gr_item[]){L("."), S(d), R(digits(c))}, 3);
    uint8_t pm[32];
    gr_set_clear(pm);
    gr_set_add(pm, '+', '+');
    gr_set_add(pm, '-', '-');
    alt(c, zone, (gr_item[]){L("Z")}, 1);
    alt(c, zone, (gr_item[]){S(pm), R(hour), L(":"), S(d05), S(d)}, 5);
    alt(c, time, (gr_item[]){R(hour), L(":"), S(d05), S(d), L(":"), S(d05), S(d), R(frac), R(zone)}, 9);
    if (!strcmp(fmt, "date")) {
        alt(c, r, (gr_item[]){L("\""), R(date), L("\""), R(sp(c))}, 4);
    } else if (!strcmp(fmt, "time")) {
        alt(c, r, (gr_item[]){L("\""), R(time), L("\""), R(sp(c))}, 4);
    } else if (!strcmp(fmt, "date-time")) {
        alt(c, r, (gr_item[]){L("\""), R(date), L("T"), R(time), L("\""), R(sp(c))}, 6);
    } else { /* uuid: 8-4-4-4-12 lowercase hex */
        gr_item it[40];
        int n = 0;
        it[n++] = L("\"");
        static const int groups[5] = {8, 4, 4, 4, 12};
        for (int g = 0; g < 5; g++) {
            if (g) it[n++] = L("-");
            for (int k = 0; k < groups[g]; k++) it[n++] = S(hex);
        }
        it[n++] = L("\"");
        it[n++] = R(sp(c));
        alt(c, r, it, n);
    }
    return r;
}

static int array_schema(js_ctx *c, const cJSON *s, const char *path, int depth) {
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
    int min = get_count(c, s, "minItems", path, 0), max = get_count(c, s, "maxItems", path, -1);
    if (min < -1 || max < -1) return -1;
    if (max >= 0 && max < min) return fail(c, path, "%s", "maxItems is below minItems: no array matches");
    char sub[512];
    snprintf(sub, sizeof sub, "%s/items", path);
    int item = items ? schema(c, items, sub, depth + 1) : any_value(c);
    if (item < 0) return -1;
    int r = rule(c);
    alt(c, r, (gr_item[]){L("["), R(sp(c)), R(repeat(c, item, ",", min, max)), L("]"), R(sp(c))}, 5);
    return r;
}

/* The declared properties in order, the required ones always, then (unless additionalProperties is
 * false) any others. with[i]: the properties from i on, after at least one written (so with a comma
 * first); none[i]: the same before any. */
static int object_schema(js_ctx *c, const cJSON *s, const char *path, int depth) {
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *add = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    if (props && !cJSON_IsObject(props)) return fail(c, path, "%s", "'properties' must be an object");
    if (req && !cJSON_IsArray(req)) return fail(c, path, "%s", "'required' must be an array of names");
    for (const cJSON *q = req ? req->child : NULL; q; q = q->next) {
        if (!cJSON_IsString(q)) return fail(c, path, "%s", "'required' must be an array of names");
        if (!cJSON_GetObjectItemCaseSensitive(props, q->valuestring) && cJSON_IsFalse(add))
            return fail(c, path, "required property '%s' is not among the properties, and no others are allowed",
                        q->valuestring);
    }
    int n = cJSON_GetArraySize(props);
    /* additional: a key-value pair whose value matches additionalProperties (any value when absent / true) */
    int extra = -1;
    if (!cJSON_IsFalse(add)) {
        char sub[512];
        snprintf(sub, sizeof sub, "%s/additionalProperties", path);
        int v = add && !cJSON_IsTrue(add) ? schema(c, add, sub, depth + 1) : any_value(c);
        if (v < 0) return -1;
        extra = rule(c);
        alt(c, extra, (gr_item[]){R(str(c)), L(":"), R(sp(c)), R(v)}, 4);
    }
    /* tails after the declared ones */
    int with_end = rule(c), none_end = rule(c);
    alt(c, with_end, NULL, 0);
    alt(c, none_end, NULL, 0);
    if (extra >= 0) {
        alt(c, with_end, (gr_item[]){L(","), R(sp(c)), R(extra), R(with_end)}, 4);
        alt(c, none_end, (gr_item[]){R(extra), R(with_end)}, 2);
    }
    int with = with_end, none = none_end;
    const cJSON **list = n ? malloc((size_t)n * sizeof *list) : NULL;
    if (n && !list) return fail(c, path, "%s", "out of memory");
    int i = 0;
    for (const cJSON *p = props ? props->child : NULL; p; p = p->next) list[i++] = p;
    for (i = n - 1; i >= 0; i--) {
        const cJSON *p = list[i];
        char sub[512];
        snprintf(sub, sizeof sub, "%s/properties/%s", path, p->string);
        int v = schema(c, p, sub, depth + 1);
        if (v < 0) {
            free(list);
            return -1;
        }
        int kv = rule(c);
        cJSON *ks = cJSON_CreateString(p->string);
        char *kt = ks ? cJSON_PrintUnformatted(ks) : NULL;
        cJSON_Delete(ks);
        if (!kt) {
            free(list);
            return fail(c, path, "%s", "out of memory");
        }
        alt(c, kv, (gr_item[]){L(kt), R(sp(c)), L(":"), R(sp(c)), R(v)}, 5);
        cJSON_free(kt);
        bool required = false;
        for (const cJSON *q = req ? req->child : NULL; q; q = q->next)
            required = required || (cJSON_IsString(q) && strcmp(q->valuestring, p->string) == 0);
        int w = rule(c), o = rule(c);
        alt(c, w, (gr_item[]){L(","), R(sp(c)), R(kv), R(with)}, 4);
        alt(c, o, (gr_item[]){R(kv), R(with)}, 2);
        if (!required) {
            alt(c, w, (gr_item[]){R(with)}, 1);
            alt(c, o, (gr_item[]){R(none)}, 1);
        }
        with = w, none = o;
    }
    free(list);
    int r = rule(c);
    alt(c, r, (gr_item[]){L("{"), R(sp(c)), R(none), L("}"), R(sp(c))}, 5);
    return r;
}

/* #/a/b~1c: a JSON pointer into the root */
static const cJSON *resolve(const cJSON *root, const char *ref) {
    if (strncmp(ref, "#", 1) != 0) return NULL;
    const cJSON *at = root;
    const char *p = ref + 1;
    while (*p == '/') {
        p++;
        char tok[256];
        size_t n = 0;
        for (; *p && *p != '/' && n + 1 < sizeof tok; p++) {
            if (p[0] == '~' && p[1] == '1') tok[n++] = '/', p++;
            else if (p[0] == '~' && p[1] == '0') tok[n++] = '~', p++;
            else tok[n++] = *p;
        }
        tok[n] = 0;
        at = cJSON_IsArray(at) ? cJSON_GetArrayItem(at, atoi(tok)) : cJSON_GetObjectItemCaseSensitive(at, tok);
        if (!at) return NULL;
    }
    return *p ? NULL : at;
}

static int ref_schema(js_ctx *c, const char *ref, const char *path, int depth) {
    for (int i = 0; i < c->n_refs; i++)
        if (strcmp(c->refs[i].ref, ref) == 0) return c->refs[i].rule;
    const cJSON *t = resolve(c->root, ref);
    if (!t) return fail(c, path, "$ref '%s' does not resolve (only local references, #/...)", ref);
    if (c->n_refs == JS_MAX_REFS) return fail(c, path, "%s", "more than 256 distinct $ref targets");
    int r = rule(c);
    if (!(c->refs[c->n_refs].ref = strdup(ref))) return fail(c, path, "%s", "out of memory");
    c->refs[c->n_refs++].rule = r;
    int v = schema(c, t, ref + 1, depth + 1);
    if (v < 0) return -1;
    alt(c, r, (gr_item[]){R(v)}, 1);
    return r;
}

static const char *const refused[] = {
    "pattern",  "patternProperties", "minimum",          "maximum",       "exclusiveMinimum", "exclusiveMaximum",
    "multipleOf", "uniqueItems",     "not",              "if",            "then",             "else",
    "contains", "minContains",       "maxContains",      "propertyNames", "dependentRequired",
    "dependentSchemas", "dependencies", "minProperties", "maxProperties", "prefixItems",      "unevaluatedProperties",
    "unevaluatedItems", "contentSchema",
};

static int typed(js_ctx *c, const cJSON *s, const char *type, const char *path, int depth) {
    if (!strcmp(type, "string")) return string_schema(c, s, path);
    if (!strcmp(type, "number")) return number(c);
    if (!strcmp(type, "integer")) return integer(c);
    if (!strcmp(type, "boolean")) {
        int r = rule(c);
        alt(c, r, (gr_item[]){R(literal(c, "true"))}, 1);
        alt(c, r, (gr_item[]){R(literal(c, "false"))}, 1);
        return r;
    }
    if (!strcmp(type, "null")) return literal(c, "null");
    if (!strcmp(type, "object")) return object_schema(c, s, path, depth);
    if (!strcmp(type, "array")) return array_schema(c, s, path, depth);
    return fail(c, path, "unknown type '%s' (string, number, integer, boolean, null, object or array)", type);
}

/* A JSON value as literal text (enum / const members). */
static int value_literal(js_ctx *c, const cJSON *v, const char *path) {
    char *t = cJSON_PrintUnformatted(v);
    if (!t) return fail(c, path, "%s", "out of memory");
    int r = literal(c, t);
    cJSON_free(t);
    return r;
}

static int schema(js_ctx *c, const cJSON *s, const char *path, int depth) {
    if (c->failed) return -1;
    if (depth > JS_MAX_DEPTH) return fail(c, path, "%s", "schemas nested more than 64 deep");
    if (cJSON_IsTrue(s)) return any_value(c);
    if (cJSON_IsFalse(s)) return fail(c, path, "%s", "the schema false matches nothing");
    if (!cJSON_IsObject(s)) return fail(c, path, "%s", "a schema must be an object or a boolean");
    for (size_t k = 0; k < sizeof refused / sizeof *refused && !c->lenient; k++)
        if (cJSON_GetObjectItemCaseSensitive(s, refused[k]))
            return fail(c, path, "'%s' is not supported by constrained decoding", refused[k]);
    const cJSON *v;
    if ((v = cJSON_GetObjectItemCaseSensitive(s, "$ref"))) {
        if (!cJSON_IsString(v)) return fail(c, path, "%s", "'$ref' must be a string");
        return ref_schema(c, v->valuestring, path, depth);
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(s, "const"))) return value_literal(c, v, path);
    if ((v = cJSON_GetObjectItemCaseSensitive(s, "enum"))) {
        if (!cJSON_IsArray(v) || !v->child) return fail(c, path, "%s", "'enum' must be a non-empty array");
        int r = rule(c);
        for (const cJSON *e = v->child; e; e = e->next) {
            int l = value_literal(c, e, path);
            if (l < 0) return -1;
            alt(c, r, (gr_item[]){R(l)}, 1);
        }
        return r;
    }
    const char *combo = cJSON_GetObjectItemCaseSensitive(s, "anyOf") ? "anyOf"
                        : cJSON_GetObjectItemCaseSensitive(s, "oneOf") ? "oneOf" : NULL;
    if (combo) { /* oneOf as anyOf: exclusivity is not enforced (the members clients write rarely overlap) */
        v = cJSON_GetObjectItemCaseSensitive(s, combo);
        if (!cJSON_IsArray(v) || !v->child) return fail(c, path, "'%s' must be a non-empty array", combo);
        int r = rule(c), i = 0;
        for (const cJSON *e = v->child; e; e = e->next, i++) {
            char sub[512];
            snprintf(sub, sizeof sub, "%s/%s/%d", path, combo, i);
            int m = schema(c, e, sub, depth + 1);
            if (m < 0) return -1;
            alt(c, r, (gr_item[]){R(m)}, 1);
        }
        return r;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(s, "allOf"))) {
        if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != 1)
            return fail(c, path, "%s", "'allOf' with other than one member is not supported");
        char sub[512];
        snprintf(sub, sizeof sub, "%s/allOf/0", path);
        return schema(c, v->child, sub, depth + 1);
    }
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (cJSON_IsString(type)) return typed(c, s, type->valuestring, path, depth);
    if (cJSON_IsArray(type)) {
        if (!type->child) return fail(c, path, "%s", "'type' is an empty list");
        int r = rule(c);
        for (const cJSON *t = type->child; t; t = t->next) {
            if (!cJSON_IsString(t)) return fail(c, path, "%s", "'type' must name types");
            int m = typed(c, s, t->valuestring, path, depth);
            if (m < 0) return -1;
            alt(c, r, (gr_item[]){R(m)}, 1);
        }
        return r;
    }
    if (type) return fail(c, path, "%s", "'type' must be a string or a list of strings");
    /* no type: what the keywords imply */
    if (cJSON_GetObjectItemCaseSensitive(s, "properties") || cJSON_GetObjectItemCaseSensitive(s, "required") ||
        cJSON_GetObjectItemCaseSensitive(s, "additionalProperties"))
        return object_schema(c, s, path, depth);
    if (cJSON_GetObjectItemCaseSensitive(s, "items") || cJSON_GetObjectItemCaseSensitive(s, "minItems") ||
        cJSON_GetObjectItemCaseSensitive(s, "maxItems"))
        return array_schema(c, s, path, depth);
    if (cJSON_GetObjectItemCaseSensitive(s, "minLength") || cJSON_GetObjectItemCaseSensitive(s, "maxLength") ||
        cJSON_GetObjectItemCaseSensitive(s, "format"))
        return string_schema(c, s, path);
    return any_value(c);
}

int js_rule_add(gr_builder *b, const cJSON *s, bool lenient, rl_err *err) {
    js_ctx c = {.b = b, .root = s, .err = err, .lenient = lenient, .sp = -1, .value = -1, .str = -1, .str_body = -1, .chr = -1,
                .num = -1, .integer = -1, .digits = -1};
    int root = schema(&c, s, "", 0);
    for (int i = 0; i < c.n_refs; i++) free(c.refs[i].ref);
    return root;
}

gr_grammar *js_grammar_new(const cJSON *s, bool lenient, rl_err *err) {
    gr_builder *b = gr_builder_new();
    if (!b) return rl_errf(err, "json_schema: out of memory"), NULL;
    int root = js_rule_add(b, s, lenient, err);
    gr_grammar *g = root >= 0 ? gr_build(b, root, err) : NULL;
    gr_builder_free(b);
    return g;
}

gr_grammar *js_object_grammar_new(rl_err *err) {
    cJSON *s = cJSON_Parse("{\"type\":\"object\"}");
    if (!s) return rl_errf(err, "json_schema: out of memory"), NULL;
    gr_grammar *g = js_grammar_new(s, false, err);
    cJSON_Delete(s);
    return g;
}
