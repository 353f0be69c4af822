#include "reap.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>

#include "../base/file.h"
#include "../base/json.h"

int reap_stats_init(reap_stats *s, const k3_hparams *hp, uint32_t a, uint32_t b, rl_err *err) {
    memset(s, 0, sizeof *s);
    s->n_expert = hp->n_expert;
    s->k = hp->n_expert_used;
    s->layer0 = a > hp->n_dense_lead ? a : hp->n_dense_lead;
    s->n_layers = b > s->layer0 ? b - s->layer0 : 0;
    size_t n = (size_t)s->n_layers * s->n_expert;
    if (n == 0) return 0;
    s->count = calloc(n, sizeof *s->count);
    s->sum_gn = calloc(n, sizeof *s->sum_gn);
    s->sum_g = calloc(n, sizeof *s->sum_g);
    s->sum_n = calloc(n, sizeof *s->sum_n);
    if (!s->count || !s->sum_gn || !s->sum_g || !s->sum_n) {
        reap_stats_free(s);
        return rl_errf(err, "out of memory for expert statistics");
    }
    return 0;
}

void reap_stats_free(reap_stats *s) {
    free(s->count);
    free(s->sum_gn);
    free(s->sum_g);
    free(s->sum_n);
    memset(s, 0, sizeof *s);
}

int reap_stats_add(reap_stats *s, const k3_routes *r, rl_err *err) {
    if (r->n_layers == 0) return 0;
    if (r->layer0 < s->layer0 || r->layer0 + r->n_layers > s->layer0 + s->n_layers || r->k != s->k) {
        return rl_errf(err, "routing of layers %u+%u (top-%u) does not fit the statistics' %u+%u (top-%u)", r->layer0,
                       r->n_layers, r->k, s->layer0, s->n_layers, s->k);
    }
    const size_t per = (size_t)r->n_tokens * r->k;
    for (uint32_t l = 0; l < r->n_layers; l++) {
        const size_t base = (size_t)(r->layer0 - s->layer0 + l) * s->n_expert;
        for (size_t i = 0; i < per; i++) {
            const int32_t j = r->ids[l * per + i];
            if (j < 0 || (uint32_t)j >= s->n_expert) return rl_errf(err, "routing names expert %d of %u", j, s->n_expert);
            const double g = r->weight[l * per + i], nrm = r->norm[l * per + i];
            s->count[base + (uint32_t)j]++;
            s->sum_gn[base + (uint32_t)j] += g * nrm;
            s->sum_g[base + (uint32_t)j] += g;
            s->sum_n[base + (uint32_t)j] += nrm;
        }
    }
    if (r->layer0 == s->layer0) s->tokens += r->n_tokens; /* counted once: by the first MoE layer's range */
    return 0;
}

double reap_score(const reap_stats *s, uint32_t l, uint32_t j, bool freq) {
    const size_t i = (size_t)l * s->n_expert + j;
    if (freq) return s->sum_gn[i];
    return s->count[i] ? s->sum_gn[i] / (double)s->count[i] : 0.0;
}

/* ---- the scores file ----------------------------------------------------------------------------- */

static cJSON *reap_json_doubles(const double *v, uint32_t n) {
    cJSON *a = cJSON_CreateArray();
    for (uint32_t i = 0; a && i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(v[i]));
    return a;
}

int reap_stats_write_json(const reap_stats *s, const char *model_name, const char *path, rl_err *err) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "format", "ringlm-reap-scores-1");
    cJSON_AddStringToObject(root, "model", model_name ? model_name : "");
    cJSON_AddStringToObject(root, "score", "mean over routed tokens of gate weight x ||expert output||_2 (latent space)");
    cJSON_AddNumberToObject(root, "n_expert", s->n_expert);
    cJSON_AddNumberToObject(root, "n_expert_used", s->k);
    cJSON_AddNumberToObject(root, "tokens", (double)s->tokens);
    cJSON *layers = cJSON_AddArrayToObject(root, "layers");
    double *tmp = malloc((s->n_expert ? s->n_expert : 1) * sizeof *tmp);
    if (!root || !layers || !tmp) {
        cJSON_Delete(root);
        free(tmp);
        return rl_errf(err, "out of memory");
    }
    for (uint32_t l = 0; l < s->n_layers; l++) {
        cJSON *o = cJSON_CreateObject();
        const size_t base = (size_t)l * s->n_expert;
        cJSON_AddNumberToObject(o, "layer", s->layer0 + l);
        for (uint32_t j = 0; j < s->n_expert; j++) tmp[j] = reap_score(s, l, j, false);
        cJSON_AddItemToObject(o, "saliency", reap_json_doubles(tmp, s->n_expert));
        for (uint32_t j = 0; j < s->n_expert; j++) tmp[j] = (double)s->count[base + j];
        cJSON_AddItemToObject(o, "count", reap_json_doubles(tmp, s->n_expert));
        cJSON_AddItemToObject(o, "sum_gate_norm", reap_json_doubles(s->sum_gn + base, s->n_expert));
        cJSON_AddItemToObject(o, "sum_gate", reap_json_doubles(s->sum_g + base, s->n_expert));
        cJSON_AddItemToObject(o, "sum_norm", reap_json_doubles(s->sum_n + base, s->n_expert));
        cJSON_AddItemToArray(layers, o);
    }
    free(tmp);
    char *txt = cJSON_Print(root);
    cJSON_Delete(root);
    if (!txt) return rl_errf(err, "out of memory");
    FILE *f = fopen(path, "w");
    int rc = 0;
    if (!f) {
        rc = rl_errf(err, "cannot create %s: %s", path, strerror(errno));
    } else {
        if (fputs(txt, f) == EOF || fputc('\n', f) == EOF) rc = rl_errf(err, "cannot write %s", path);
        if (fclose(f) != 0 && rc == 0) rc = rl_errf(err, "cannot write %s: %s", path, strerror(errno));
    }
    free(txt);
    return rc;
}

static int reap_json_u32(const cJSON *o, const char *key, uint32_t *v) { return rl_json_u32(o, key, true, v, NULL); }

/* An array of exactly n finite numbers >= 0 into v. */
static int reap_json_vec(const cJSON *o, const char *key, uint32_t n, double *v) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != (int)n) return -1;
    uint32_t i = 0;
    for (const cJSON *x = a->child; x; x = x->next, i++) {
        if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble) || x->valuedouble < 0) return -1;
        v[i] = x->valuedouble;
    }
    return 0;
}

int reap_stats_read_json(reap_stats *s, const char *path, rl_err *err) {
    memset(s, 0, sizeof *s);
    char *buf = NULL;
    size_t len = 0;
    if (rl_read_file(path, "scores file", &buf, &len, err) != 0) return -1;
    cJSON *root = cJSON_ParseWithLength(buf, len);
    free(buf);
    int rc = 0;
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    const cJSON *layers = cJSON_GetObjectItemCaseSensitive(root, "layers");
    uint32_t E = 0, k = 0;
    const cJSON *tok = cJSON_GetObjectItemCaseSensitive(root, "tokens");
    if (!root || !cJSON_IsString(fmt) || strcmp(fmt->valuestring, "ringlm-reap-scores-1") != 0) {
        rc = rl_errf(err, "%s: not a ringlm reap scores file (format ringlm-reap-scores-1)", path);
    } else if (reap_json_u32(root, "n_expert", &E) != 0 || E == 0 || reap_json_u32(root, "n_expert_used", &k) != 0 ||
               k == 0 || k > E || !cJSON_IsNumber(tok) || tok->valuedouble < 0 || !cJSON_IsArray(layers) ||
               cJSON_GetArraySize(layers) < 1) {
        rc = rl_errf(err, "%s: bad n_expert, n_expert_used, tokens or layers", path);
    }
    if (rc == 0) {
        const int nl = cJSON_GetArraySize(layers);
        s->n_expert = E;
        s->k = k;
        s->tokens = (uint64_t)tok->valuedouble;
        s->n_layers = (uint32_t)nl;
        const size_t n = (size_t)nl * E;
        s->count = calloc(n, sizeof *s->count);
        s->sum_gn = calloc(n, sizeof *s->sum_gn);
        s->sum_g = calloc(n, sizeof *s->sum_g);
        s->sum_n = calloc(n, sizeof *s->sum_n);
        double *cnt = malloc(E * sizeof *cnt);
        if (!s->count || !s->sum_gn || !s->sum_g || !s->sum_n || !cnt) rc = rl_errf(err, "out of memory");
        uint32_t l = 0;
        for (const cJSON *o = layers->child; o && rc == 0; o = o->next, l++) {
            uint32_t il;
            const size_t base = (size_t)l * E;
            if (reap_json_u32(o, "layer", &il) != 0 || (l == 0 ? (s->layer0 = il, 0) : il != s->layer0 + l)) {
                rc = rl_errf(err, "%s: layer entry %u: its \"layer\" is not %u more than the first's", path, l, l);
            } else if (reap_json_vec(o, "count", E, cnt) != 0 || reap_json_vec(o, "sum_gate_norm", E, s->sum_gn + base) ||
                       reap_json_vec(o, "sum_gate", E, s->sum_g + base) || reap_json_vec(o, "sum_norm", E, s->sum_n + base)) {
                rc = rl_errf(err, "%s: layer %u: count, sum_gate_norm, sum_gate and sum_norm must be %u numbers >= 0",
                             path, il, E);
            }
            for (uint32_t j = 0; rc == 0 && j < E; j++) {
                if (cnt[j] != floor(cnt[j]) || cnt[j] > (double)s->tokens * k) {
                    rc = rl_errf(err, "%s: layer %u expert %u: count %g is not a whole number of routed tokens", path,
                                 il, j, cnt[j]);
                }
                s->count[base + j] = (uint64_t)cnt[j];
            }
        }
        free(cnt);
    }
    cJSON_Delete(root);
    if (rc != 0) reap_stats_free(s);
    return rc;
}

/* ---- choosing ------------------------------------------------------------------------------------ */

typedef struct reap_rank {
    double score;
    uint64_t count;
    uint32_t id;
    uint8_t protect;
} reap_rank;

/* Best first: protected, then higher score, then more often routed, then the lower id. */
static int reap_rank_cmp(const void *pa, const void *pb) {
    const reap_rank *a = pa, *b = pb;
    if (a->protect != b->protect) return a->protect ? -1 : 1;
    if (a->score != b->score) return a->score > b->score ? -1 : 1;
    if (a->count != b->count) return a->count > b->count ? -1 : 1;
    return a->id < b->id ? -1 : 1;
}

static int reap_u32_cmp(const void *pa, const void *pb) {
    uint32_t a = *(const uint32_t *)pa, b = *(const uint32_t *)pb;
    return a < b ? -1 : a > b;
}

int reap_plan_make(reap_plan *p, const reap_stats *s, uint32_t n_keep, bool freq, const uint8_t *protect,
                   rl_err *err) {
    memset(p, 0, sizeof *p);
    if (s->n_layers == 0) return rl_errf(err, "the model has no MoE layer: nothing to prune");
    if (n_keep < s->k) {
        return rl_errf(err, "keeping %u experts: fewer than the %u the router uses per token", n_keep, s->k);
    }
    if (n_keep > s->n_expert) return rl_errf(err, "keeping %u experts: the model has %u", n_keep, s->n_expert);
    reap_rank *r = malloc(s->n_expert * sizeof *r);
    p->keep = malloc((size_t)s->n_layers * n_keep * sizeof *p->keep);
    if (!r || !p->keep) {
        free(r);
        reap_plan_free(p);
        return rl_errf(err, "out of memory");
    }
    p->n_expert = s->n_expert;
    p->n_keep = n_keep;
    p->layer0 = s->layer0;
    p->n_layers = s->n_layers;
    for (uint32_t l = 0; l < s->n_layers; l++) {
        uint32_t n_prot = 0;
        for (uint32_t j = 0; j < s->n_expert; j++) {
            const uint8_t pr = protect ? protect[(size_t)l * s->n_expert + j] : 0;
            r[j] = (reap_rank){reap_score(s, l, j, freq), s->count[(size_t)l * s->n_expert + j], j, pr};
            n_prot += pr != 0;
        }
        if (n_prot > n_keep) {
            free(r);
            reap_plan_free(p);
            return rl_errf(err, "layer %u: %u experts protected, more than the %u kept", s->layer0 + l, n_prot, n_keep);
        }
        qsort(r, s->n_expert, sizeof *r, reap_rank_cmp);
        uint32_t *k = p->keep + (size_t)l * n_keep;
        for (uint32_t i = 0; i < n_keep; i++) k[i] = r[i].id;
        qsort(k, n_keep, sizeof *k, reap_u32_cmp);
    }
    free(r);
    return 0;
}

int reap_plan_all(reap_plan *p, const k3_hparams *hp, rl_err *err) {
    memset(p, 0, sizeof *p);
    p->n_expert = p->n_keep = hp->n_expert;
    p->layer0 = hp->n_dense_lead;
    p->n_layers = hp->n_layer > hp->n_dense_lead ? hp->n_layer - hp->n_dense_lead : 0;
    if (p->n_layers == 0) return rl_errf(err, "the model has no MoE layer: nothing to prune");
    p->keep = malloc((size_t)p->n_layers * p->n_keep * sizeof *p->keep);
    if (!p->keep) return rl_errf(err, "out of memory");
    for (size_t i = 0; i < (size_t)p->n_layers * p->n_keep; i++) p->keep[i] = (uint32_t)(i % p->n_keep);
    return 0;
}

void reap_plan_free(reap_plan *p) {
    free(p->keep);
    memset(p, 0, sizeof *p);
}

int reap_protect_parse(const char *list, const reap_stats *s, uint8_t **flags, rl_err *err) {
    *flags = calloc((size_t)s->n_layers * s->n_expert + 1, 1);
    if (!*flags) return rl_errf(err, "out of memory");
    const char *p = list;
    while (*p) {
        char *end;
        errno = 0;
        long a = strtol(p, &end, 10), layer = -1, ex = a;
        if (end == p || errno) goto bad;
        if (*end == ':') {
            layer = a;
            p = end + 1;
            ex = strtol(p, &end, 10);
            if (end == p || errno) goto bad;
        }
        if (ex < 0 || (unsigned long)ex >= s->n_expert) {
            free(*flags);
            *flags = NULL;
            return rl_errf(err, "--protect: expert %ld: the model has experts 0..%u", ex, s->n_expert - 1);
        }
        if (layer >= 0 && ((unsigned long)layer < s->layer0 || (unsigned long)layer >= s->layer0 + s->n_layers)) {
            free(*flags);
            *flags = NULL;
            return rl_errf(err, "--protect: layer %ld is not a MoE layer (%u..%u)", layer, s->layer0,
                           s->layer0 + s->n_layers - 1);
        }
        for (uint32_t l = 0; l < s->n_layers; l++) {
            if (layer < 0 || (uint32_t)layer == s->layer0 + l) (*flags)[(size_t)l * s->n_expert + (uint32_t)ex] = 1;
        }
        p = end;
        if (*p == ',' && p[1]) p++;
        else if (*p) goto bad;
    }
    return 0;
bad:
    free(*flags);
    *flags = NULL;
    return rl_errf(err, "--protect: bad list '%s' (comma-separated EXPERT or LAYER:EXPERT)", list);
}
