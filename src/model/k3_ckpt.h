/* k3_ckpt.h - a sequence's checkpoints: its KDA state at a few positions, so that a later request sharing a
 * prefix with it resumes there (serve's prompt cache, on one machine and on every stage of a ring).
 *
 * Why checkpoints: the MLA cache is per position (a prefix of it is truncation), but the KDA state is a
 * recurrence (one state after all tokens), so returning to position p needs the state as it was at p. A
 * list holds up to `max` of them in position order; which ones it keeps is decided here only, because a ring's
 * coordinator keeps a list of positions alone (no state: k3_ckpts_place) beside every stage's list of states
 * (k3_ckpts_take) and must know, without asking, which positions the stages hold. Same calls in the same
 * order give the same positions, whatever the state is. */
#ifndef RINGLM_K3_CKPT_H
#define RINGLM_K3_CKPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/err.h"
#include "k3_state.h"

typedef struct k3_ckpt {
    uint32_t pos;     /* the state after pos tokens */
    bool end;         /* taken where a prompt ended (serve's idle work looks for them) */
    k3_snapshot snap; /* empty in a list of positions only */
} k3_ckpt;

typedef struct k3_ckpts {
    k3_ckpt *c; /* [max], c[0 .. n) in ascending position */
    int n, max;
} k3_ckpts;

int k3_ckpts_init(k3_ckpts *l, int max, rl_err *err); /* max >= 1 */
void k3_ckpts_free(k3_ckpts *l);
/* Forgets checkpoints from index i on (their states are freed). */
void k3_ckpts_drop(k3_ckpts *l, int i);
/* Makes room for a checkpoint at pos and returns its index, its snapshot empty: one at the same position is
 * replaced; when the list is full the oldest goes, unless pos is older than every one kept (then -1: not
 * worth a place, nothing changed). */
int k3_ckpts_place(k3_ckpts *l, uint32_t pos);
/* k3_ckpts_place at st's position, then the snapshot of st there. 0 also when it was not worth a place; -1
 * (err) when the snapshot failed: that entry and the ones after it are dropped (their order is in doubt). */
int k3_ckpts_take(k3_ckpts *l, const k3_state *st, rl_err *err);
/* Index of the latest checkpoint with 0 < pos <= max, or -1. */
int k3_ckpts_best(const k3_ckpts *l, uint32_t max);
/* Index of the checkpoint at exactly pos, or -1. */
int k3_ckpts_at(const k3_ckpts *l, uint32_t pos);
/* Bytes of the states held. */
size_t k3_ckpts_bytes(const k3_ckpts *l);

#endif
