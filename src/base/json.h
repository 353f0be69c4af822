/* json.h - the one family of JSON field getters (over cJSON), for configs, manifests, score files and
 * the ring's control messages.
 *
 * Lookups (rl_json_str, rl_json_num) answer what is there or a default: for messages between our own
 * processes, where a missing field has a meaning. Readers (rl_json_u32, rl_json_bool) are strict, for
 * files people write: a field of the wrong type or range is an error naming it; an absent one is an error
 * only when required (otherwise *out is left as it was, holding the default). */
#ifndef RINGLM_JSON_H
#define RINGLM_JSON_H

#include <stdbool.h>
#include <stdint.h>

#include "err.h"

struct cJSON;

/* o's string field key, or NULL when absent or not a string (o may be NULL). */
const char *rl_json_str(const struct cJSON *o, const char *key);
/* o's number field key, or dflt when absent or not a number (o may be NULL). */
double rl_json_num(const struct cJSON *o, const char *key, double dflt);
/* An integer in [0, 2^32). 0, or -1 with err saying 'field "KEY" must be ...' / 'field "KEY" is missing'. */
int rl_json_u32(const struct cJSON *o, const char *key, bool required, uint32_t *out, rl_err *err);
/* true or false. 0, or -1 as rl_json_u32. */
int rl_json_bool(const struct cJSON *o, const char *key, bool required, bool *out, rl_err *err);

#endif
