/* k3_ckpt.c - a sequence's checkpoints (k3_ckpt.h). */
#include "k3_ckpt.h"

#include <stdlib.h>
#include <string.h>

int k3_ckpts_init(k3_ckpts *l, int max, rl_err *err) {
    memset(l, 0, sizeof *l);
    if (max < 1) return rl_errf(err, "a checkpoint list of %d entries", max);
    if (!(l->c = calloc((size_t)max, sizeof *l->c))) return rl_errf(err, "out of memory for %d checkpoints", max);
    l->max = max;
    return 0;
}

void k3_ckpts_drop(k3_ckpts *l, int i) {
    if (i < 0) i = 0;
    for (int k = i; k < l->n; k++) k3_snapshot_free(&l->c[k].snap);
    if (i < l->n) l->n = i;
}

void k3_ckpts_free(k3_ckpts *l) {
    k3_ckpts_drop(l, 0);
    free(l->c);
    memset(l, 0, sizeof *l);
}

int k3_ckpts_place(k3_ckpts *l, uint32_t pos) {
    if (l->max < 1) return -1;
    k3_ckpt *c = l->c;
    int at = l->n;
    while (at > 0 && c[at - 1].pos >= pos) at--;
    if (at < l->n && c[at].pos == pos) { /* the same position: a fresh one in its place */
        k3_snapshot_free(&c[at].snap);
        memmove(c + at, c + at + 1, (size_t)(l->n - at - 1) * sizeof *c);
        l->n--;
    }
    if (l->n == l->max) {
        if (at == 0) return -1; /* older than every one kept */
        k3_snapshot_free(&c[0].snap);
        memmove(c, c + 1, (size_t)(l->max - 1) * sizeof *c);
        l->n--;
        at--;
    }
    memmove(c + at + 1, c + at, (size_t)(l->n - at) * sizeof *c);
    memset(&c[at], 0, sizeof c[at]);
    c[at].pos = pos;
    l->n++;
    return at;
}

int k3_ckpts_take(k3_ckpts *l, const k3_state *st, rl_err *err) {
    const int at = k3_ckpts_place(l, st->n_past);
    if (at < 0) return 0;
    if (k3_state_snapshot(st, &l->c[at].snap, err) != 0) {
        k3_ckpts_drop(l, at);
        return -1;
    }
    return 0;
}

int k3_ckpts_best(const k3_ckpts *l, uint32_t max) {
    for (int k = l->n - 1; k >= 0; k--) {
        if (l->c[k].pos > 0 && l->c[k].pos <= max) return k;
    }
    return -1;
}

int k3_ckpts_at(const k3_ckpts *l, uint32_t pos) {
    for (int k = 0; k < l->n; k++) {
        if (l->c[k].pos == pos) return k;
    }
    return -1;
}

size_t k3_ckpts_bytes(const k3_ckpts *l) {
    size_t b = 0;
    for (int k = 0; k < l->n; k++) b += l->c[k].snap.n_bytes;
    return b;
}
