/* json.c - JSON field getters (json.h). */
#include "json.h"

#include <cJSON.h>
#include <math.h>

const char *rl_json_str(const cJSON *o, const char *key) {
    const cJSON *v = o ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

double rl_json_num(const cJSON *o, const char *key, double dflt) {
    const cJSON *v = o ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
    return cJSON_IsNumber(v) ? v->valuedouble : dflt;
}

/* The field, or NULL: absent is fine unless required (then -1 in *rc with err set). */
static const cJSON *field(const cJSON *o, const char *key, bool required, int *rc, rl_err *err) {
    const cJSON *v = o ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
    *rc = !v && required ? rl_errf(err, "field \"%s\" is missing", key) : 0;
    return v;
}

int rl_json_u32(const cJSON *o, const char *key, bool required, uint32_t *out, rl_err *err) {
    int rc;
    const cJSON *v = field(o, key, required, &rc, err);
    if (!v) return rc;
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble <= 4294967295.0) ||
        v->valuedouble != floor(v->valuedouble)) {
        return rl_errf(err, "field \"%s\" must be a non-negative integer below 2^32", key);
    }
    *out = (uint32_t)v->valuedouble;
    return 0;
}

int rl_json_bool(const cJSON *o, const char *key, bool required, bool *out, rl_err *err) {
    int rc;
    const cJSON *v = field(o, key, required, &rc, err);
    if (!v) return rc;
    if (!cJSON_IsBool(v)) return rl_errf(err, "field \"%s\" must be true or false", key);
    *out = cJSON_IsTrue(v);
    return 0;
}
