/* receipt_log.c - the offline verifier of a receipts log (receipt_log.h). */
#include "receipt_log.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include <sodium.h>

#include "manifest.h"
#include "manifest_file.h"

typedef struct entry {
    uint64_t request_id;
    uint8_t nonce[32];
    off_t offset;
    long line;
} entry;

static int entry_cmp(const void *a, const void *b) {
    const entry *x = a, *y = b;
    if (x->request_id != y->request_id) return x->request_id < y->request_id ? -1 : 1;
    int c = memcmp(x->nonce, y->nonce, 32);
    if (c) return c;
    return x->line < y->line ? -1 : x->line > y->line;
}

typedef struct group {
    size_t first; /* index into the sorted entries */
    size_t n;
    long first_line;
} group;

static int group_cmp(const void *a, const void *b) {
    const group *x = a, *y = b;
    return x->first_line < y->first_line ? -1 : x->first_line > y->first_line;
}

typedef struct mcache {
    uint32_t a, b;
    uint8_t hash[32];
} mcache;

typedef struct verifier {
    const char *path;
    FILE *f;
    const mf_model *m;
    const k3_hparams *hp;
    uint32_t n_layer; /* the model's, from its file or its manifest */
    const receipt_log_opts *o;
    mcache cache[256];
    int n_cache;
    long problems;
    char where[192]; /* the traversal being checked, prefixed to its problems */
    int bad;         /* problems in the traversal being checked */
} verifier;

static void problem(verifier *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void problem(verifier *v, const char *fmt, ...) {
    char msg[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (v->o->problems) fprintf(v->o->problems, "%s%s\n", v->where, msg);
    v->problems++;
    v->bad++;
}

static void on_problem(void *user, int stage, const char *msg) { problem(user, "%s", msg); }

static int manifest_for(verifier *v, uint32_t a, uint32_t b, uint8_t out[32], rl_err *err) {
    for (int i = 0; i < v->n_cache; i++) {
        if (v->cache[i].a == a && v->cache[i].b == b) {
            memcpy(out, v->cache[i].hash, 32);
            return 0;
        }
    }
    if (v->o->manifest ? manifest_file_range_hash(v->o->manifest, a, b, out, err) != 0
                       : manifest_range_hash(v->m, v->hp, a, b, out, err) != 0) {
        return -1;
    }
    if (v->n_cache < (int)(sizeof v->cache / sizeof v->cache[0])) {
        v->cache[v->n_cache++] = (mcache){.a = a, .b = b};
        memcpy(v->cache[v->n_cache - 1].hash, out, 32);
    }
    return 0;
}

static int read_line_at(verifier *v, off_t off, char **buf, size_t *cap) {
    if (fseeko(v->f, off, SEEK_SET) != 0) return -1;
    return getline(buf, cap, v->f) < 0 ? -1 : 0;
}

static int range_order(const void *a, const void *b) {
    const receipt_rec *x = a, *y = b;
    if (x->layer_start != y->layer_start) return x->layer_start < y->layer_start ? -1 : 1;
    if (x->layer_end != y->layer_end) return x->layer_end < y->layer_end ? -1 : 1;
    return 0;
}

/* The ring.conf entry a signer is, or -1. `after`: the first entry after that index with this key. */
static int conf_index(const receipt_log_opts *o, const uint8_t pk[32], int after) {
    for (int i = after + 1; i < o->n_nodes; i++) {
        if (memcmp(o->nodes[i].sign_pk, pk, 32) == 0) return i;
    }
    return -1;
}

/* Checks one traversal: the receipts of lines ents[0..n), all with the same (request id, nonce). */
static void verify_traversal(verifier *v, int t, const entry *ents, size_t n, receipt_nonce_book *book, char **buf,
                             size_t *cap) {
    char nonce_hex[65];
    sodium_bin2hex(nonce_hex, sizeof nonce_hex, ents[0].nonce, 32);
    snprintf(v->where, sizeof v->where, "traversal %d (request %" PRIu64 ", nonce %.16s.., line %ld): ", t,
             ents[0].request_id, nonce_hex, ents[0].line);
    v->bad = 0;
    if (n > RECEIPT_MAX_STAGES) {
        problem(v, "%zu receipts, more than any ring has stages (%d)", n, RECEIPT_MAX_STAGES);
        return;
    }
    receipt_rec *rs = calloc(n, sizeof *rs);
    long *lines = calloc(n, sizeof *lines);
    receipt_stage_expect *st = calloc(n, sizeof *st);
    if (!rs || !lines || !st) {
        problem(v, "out of memory");
        goto done;
    }
    int k = 0;
    for (size_t i = 0; i < n; i++) {
        rl_err err = {{0}};
        if (read_line_at(v, ents[i].offset, buf, cap) != 0 || receipt_from_json(&rs[k], *buf, &err) != 0) {
            problem(v, "line %ld: cannot be read again (%s)", ents[i].line, err.msg[0] ? err.msg : "file changed?");
            continue;
        }
        /* A receipt twice in one traversal: a replayed copy. Reported, then left out so it does not also
         * read as an overlap. */
        int dup = -1;
        for (int j = 0; j < k && dup < 0; j++) {
            if (receipt_equal(&rs[j], &rs[k])) dup = j;
        }
        if (dup >= 0) {
            problem(v, "line %ld repeats line %ld (a replayed receipt)", ents[i].line, lines[dup]);
            continue;
        }
        lines[k++] = ents[i].line;
    }
    if (k == 0) goto done;
    /* Stage order = layer order (the check that it is also ring.conf order follows). Insertion sort keeps
     * lines paired with their receipts. */
    for (int i = 1; i < k; i++) {
        for (int j = i; j > 0 && range_order(&rs[j], &rs[j - 1]) < 0; j--) {
            receipt_rec tmp = rs[j];
            rs[j] = rs[j - 1];
            rs[j - 1] = tmp;
            long tl = lines[j];
            lines[j] = lines[j - 1];
            lines[j - 1] = tl;
        }
    }
    int prev = -1;
    for (int i = 0; i < k; i++) {
        const receipt_rec *r = &rs[i];
        char pk[65];
        sodium_bin2hex(pk, sizeof pk, r->signer, 32);
        int ci = conf_index(v->o, r->signer, prev);
        if (ci >= 0) {
            prev = ci;
        } else if (conf_index(v->o, r->signer, -1) < 0) {
            bool coord = v->o->coord_pk && memcmp(r->signer, v->o->coord_pk, 32) == 0;
            problem(v, "stage %d (layers [%u, %u), line %ld): signer %s is not a node in ring.conf%s", i,
                    r->layer_start, r->layer_end, lines[i], pk,
                    coord ? " (it is the coordinator's own key, and the coordinator runs no layers)" : "");
        } else if (i > 0 && memcmp(rs[i - 1].signer, r->signer, 32) == 0) {
            problem(v,
                    "stage %d (layers [%u, %u), line %ld): node %s also signed stage %d (layers [%u, %u)): one node, "
                    "two stages",
                    i, r->layer_start, r->layer_end, lines[i], pk, i - 1, rs[i - 1].layer_start, rs[i - 1].layer_end);
        } else {
            int first = conf_index(v->o, r->signer, -1);
            problem(v,
                    "order: stage %d (layers [%u, %u), line %ld) is node %s (ring.conf entry %d), which comes before "
                    "node %s (entry %d) in ring.conf but runs later layers",
                    i, r->layer_start, r->layer_end, lines[i], v->o->nodes[first].addr, first + 1,
                    v->o->nodes[prev].addr, prev + 1);
        }
        memcpy(st[i].node_pk, r->signer, 32);
        st[i].layer_start = r->layer_start;
        st[i].layer_end = r->layer_end;
        rl_err err = {{0}};
        if (r->layer_start < r->layer_end && r->layer_end <= v->n_layer) {
            if (manifest_for(v, r->layer_start, r->layer_end, st[i].manifest, &err) != 0) {
                problem(v, "stage %d: cannot hash the model's layers [%u, %u): %s", i, r->layer_start, r->layer_end,
                        err.msg);
                memcpy(st[i].manifest, r->manifest, 32);
            }
        } else {
            memcpy(st[i].manifest, r->manifest, 32); /* the range itself is reported by the coverage check */
        }
    }
    receipt_expect e = {.ring_id = rs[0].ring_id,
                     .request_id = ents[0].request_id,
                     .n_layer = v->n_layer,
                     .n_stages = k,
                     .stages = st,
                     .seen = book};
    memcpy(e.nonce, ents[0].nonce, 32);
    receipt_check_traversal_all(rs, k, &e, on_problem, v);
done:
    free(rs);
    free(lines);
    free(st);
}

int receipt_log_verify(const char *file, const receipt_log_opts *o, receipt_log_result *res, rl_err *err) {
    memset(res, 0, sizeof *res);
    verifier *v = calloc(1, sizeof *v);
    if (!v) return rl_errf(err, "out of memory");
    v->path = file;
    v->o = o;
    v->m = o->m;
    v->hp = o->hp;
    v->n_layer = o->manifest ? o->manifest->n_layer : o->hp->n_layer;
    int rc = -1;
    entry *ents = NULL;
    group *groups = NULL;
    char *buf = NULL;
    size_t cap = 0, n_ent = 0, ent_cap = 0, n_group = 0;
    receipt_nonce_book book = {0};
    rl_err le = {{0}}; /* a line's own problem: reported, the check goes on */
    v->f = fopen(file, "r");
    if (!v->f) {
        rl_errf(err, "cannot open %s", file);
        goto out;
    }
    rc = 1;

    /* Pass 1: parse every line, keep where each receipt is and which traversal it names. */
    snprintf(v->where, sizeof v->where, "%s: ", file);
    long line = 0;
    for (;;) {
        off_t off = ftello(v->f);
        ssize_t len = getline(&buf, &cap, v->f);
        if (len < 0) break;
        line++;
        if (strspn(buf, " \t\r\n") == (size_t)len) continue;
        receipt_rec *r = malloc(sizeof *r);
        if (!r) {
            problem(v, "out of memory");
            goto out;
        }
        if (receipt_from_json(r, buf, &le) != 0) {
            problem(v, "line %ld: %s", line, le.msg);
        } else {
            if (n_ent == ent_cap) {
                ent_cap = ent_cap ? 2 * ent_cap : 1024;
                entry *ne = realloc(ents, ent_cap * sizeof *ents);
                if (!ne) {
                    free(r);
                    problem(v, "out of memory");
                    goto out;
                }
                ents = ne;
            }
            entry *e = &ents[n_ent++];
            e->request_id = r->request_id;
            memcpy(e->nonce, r->nonce, 32);
            e->offset = off;
            e->line = line;
        }
        free(r);
    }
    if (n_ent == 0) {
        if (!v->problems) problem(v, "no receipts");
        goto out;
    }

    /* Group by (request id, nonce), checked in the order each traversal first appears in the log. */
    qsort(ents, n_ent, sizeof *ents, entry_cmp);
    groups = calloc(n_ent, sizeof *groups);
    if (!groups) {
        problem(v, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n_ent; i++) {
        if (i == 0 || ents[i].request_id != ents[i - 1].request_id || memcmp(ents[i].nonce, ents[i - 1].nonce, 32)) {
            groups[n_group++] = (group){.first = i, .n = 0, .first_line = ents[i].line};
        }
        groups[n_group - 1].n++;
    }
    qsort(groups, n_group, sizeof *groups, group_cmp);
    /* The book holds every traversal of the log, so nothing is evicted and any reuse is seen. */
    if (receipt_book_init(&book, (uint32_t)(n_group < (1u << 28) ? n_group : (1u << 28)), &le) != 0) {
        problem(v, "%s", le.msg);
        goto out;
    }
    long bad_traversals = 0, file_problems = v->problems;
    for (size_t g = 0; g < n_group; g++) {
        verify_traversal(v, (int)g + 1, &ents[groups[g].first], groups[g].n, &book, &buf, &cap);
        if (v->bad) bad_traversals++;
    }
    res->traversals = n_group;
    res->receipts = n_ent;
    res->bad_traversals = bad_traversals;
    res->bad_lines = file_problems > 0;
    rc = v->problems == 0 ? 0 : 1;
out:
    res->problems = v->problems;
    receipt_book_free(&book);
    free(groups);
    free(ents);
    free(buf);
    if (v->f) fclose(v->f);
    free(v);
    return rc;
}
