#include "synth_config.h"

#include "../base/json.h"

#include <ctype.h>
#include <errno.h>
#include <fnmatch.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>

#include "ggml.h"

/* MLA at every 4th layer (0-based 3, 7, ...) plus the last one, KDA elsewhere: K3's own pattern. */
static void synth_k3_pattern(k3_hparams *hp) {
    for (uint32_t i = 0; i < hp->n_layer; i++) hp->is_mla[i] = (i % 4 == 3) || (i + 1 == hp->n_layer);
}

/* Fields common to every preset: K3's real choices where they are size-independent. */
static void synth_defaults(synth_config *c) {
    memset(c, 0, sizeof *c);
    k3_hparams *hp = &c->hp;
    hp->n_ctx_train = 4096;
    hp->rms_eps = 1e-5f;
    hp->conv_kernel = 4;
    hp->kda_gate_lb = -5.0f;
    hp->n_dense_lead = 1;
    hp->gating_func = 2;
    hp->expert_weights_norm = true;
    hp->expert_weights_scale = 1.0f;
    hp->situ_beta = 4.0f;
    hp->situ_linear_beta = 25.0f;
    hp->has_mla_gate = true;
    hp->has_shexp = true;
    hp->has_routed_norm = true;
    c->type = GGML_TYPE_F32;
    c->type_k_b = GGML_TYPE_F32;
    c->logit_scale = 5.0f;
    c->router_bias = 0.03f;
}

static int synth_preset(synth_config *c, const char *name) {
    synth_defaults(c);
    k3_hparams *hp = &c->hp;
    snprintf(c->name, sizeof c->name, "%s", name);
    if (strcmp(name, "tiny") == 0) {
        /* Every layer type in 6 layers: KDA+dense, KDA+MoE, MLA+MoE; banking every 2 layers. */
        hp->n_layer = 6;
        hp->n_embd = 256;
        hp->n_vocab = 1024;
        hp->n_head = 4;
        hp->kda_head_dim = 64;
        hp->q_lora_rank = 128;
        hp->kv_lora_rank = 128;
        hp->mla_k_dim = 64 + 32;
        hp->rope_dim = 32;
        hp->mla_v_dim = 64;
        hp->n_ff = 512;
        hp->n_ff_exp = 256;
        hp->n_expert = 8;
        hp->n_expert_used = 2;
        hp->n_expert_shared = 2;
        hp->n_expert_latent = 128;
        hp->attn_res_block = 2;
    } else if (strcmp(name, "small") == 0) {
        /* K3's routing shape at small width: 64 experts, top-8, residual block of 12 (banks at 0 and 12). */
        hp->n_layer = 14;
        hp->n_embd = 256;
        hp->n_vocab = 2048;
        hp->n_head = 4;
        hp->kda_head_dim = 64;
        hp->q_lora_rank = 128;
        hp->kv_lora_rank = 128;
        hp->mla_k_dim = 64 + 32;
        hp->rope_dim = 32;
        hp->mla_v_dim = 64;
        hp->n_ff = 768;
        hp->n_ff_exp = 128;
        hp->n_expert = 64;
        hp->n_expert_used = 8;
        hp->n_expert_shared = 2;
        hp->n_expert_latent = 128;
        hp->attn_res_block = 12;
    } else if (strcmp(name, "medium") == 0) {
        /* Benchmark size: > 1 GB with Q4_K experts, Q8_0 elsewhere (a community "UD"-style mix). */
        hp->n_layer = 24;
        hp->n_embd = 1024;
        hp->n_vocab = 32768;
        hp->n_head = 8;
        hp->kda_head_dim = 128;
        hp->q_lora_rank = 384;
        hp->kv_lora_rank = 256;
        hp->mla_k_dim = 128 + 64;
        hp->rope_dim = 64;
        hp->mla_v_dim = 128;
        hp->n_ff = 2816;
        hp->n_ff_exp = 512;
        hp->n_expert = 128;
        hp->n_expert_used = 8;
        hp->n_expert_shared = 2;
        hp->n_expert_latent = 512;
        hp->attn_res_block = 12;
        c->type = GGML_TYPE_Q8_0;
        snprintf(c->over[0].glob, sizeof c->over[0].glob, "blk.*.ffn_*_exps.weight");
        c->over[0].type = GGML_TYPE_Q4_K;
        snprintf(c->over[1].glob, sizeof c->over[1].glob, "output.weight");
        c->over[1].type = GGML_TYPE_Q6_K;
        c->n_over = 2;
    } else if (strcmp(name, "draft") == 0) {
        /* A small K3-architecture draft model: same vocabulary as tiny, far fewer weights. */
        hp->n_layer = 2;
        hp->n_embd = 128;
        hp->n_vocab = 1024;
        hp->n_head = 2;
        hp->kda_head_dim = 64;
        hp->q_lora_rank = 0;
        hp->kv_lora_rank = 64;
        hp->mla_k_dim = 32 + 32;
        hp->rope_dim = 32;
        hp->mla_v_dim = 32;
        hp->n_ff = 256;
        hp->n_ff_exp = 128;
        hp->n_expert = 4;
        hp->n_expert_used = 2;
        hp->n_expert_shared = 1;
        hp->n_expert_latent = 0;
        hp->attn_res_block = 0;
        hp->has_routed_norm = false;
    } else {
        return -1;
    }
    synth_k3_pattern(hp);
    return 0;
}

int synth_type_parse(const char *s) {
    for (int t = 0; t < GGML_TYPE_COUNT; t++) {
        const char *n = ggml_type_name((enum ggml_type)t);
        if (n && ggml_type_size((enum ggml_type)t) > 0 && strcasecmp(n, s) == 0) return t;
    }
    return -1;
}

/* Reads a whole file into a NUL-terminated buffer. */
static char *synth_slurp(const char *path, rl_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        rl_errf(err, "cannot open config %s: %s", path, strerror(errno));
        return NULL;
    }
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 8192;
            if (cap > (1u << 24)) {
                rl_errf(err, "config %s is larger than 16 MiB", path);
                goto fail;
            }
            char *nb = realloc(buf, cap);
            if (!nb) {
                rl_errf(err, "out of memory");
                goto fail;
            }
            buf = nb;
        }
        size_t r = fread(buf + n, 1, 4096, f);
        n += r;
        if (r < 4096) break;
    }
    fclose(f);
    buf[n] = 0;
    return buf;
fail:
    free(buf);
    fclose(f);
    return NULL;
}

/* Optional fields (base/json.h), their errors said as the config's. */
static int synth_json_u32(const cJSON *o, const char *key, uint32_t *out, rl_err *err) {
    return rl_json_u32(o, key, false, out, err) ? rl_err_prefix(err, "config") : 0;
}

static int synth_json_f32(const cJSON *o, const char *key, float *out, rl_err *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v) return 0;
    if (cJSON_IsNull(v)) {
        *out = -INFINITY; /* "kda_gate_lb": null removes the key (softplus gate) */
        return 0;
    }
    if (!cJSON_IsNumber(v)) return rl_errf(err, "config field \"%s\" must be a number", key);
    *out = (float)v->valuedouble;
    return 0;
}

static int synth_json_bool(const cJSON *o, const char *key, bool *out, rl_err *err) {
    return rl_json_bool(o, key, false, out, err) ? rl_err_prefix(err, "config") : 0;
}

static int synth_json_type(const cJSON *v, const char *what, int *out, rl_err *err) {
    if (!cJSON_IsString(v)) return rl_errf(err, "config: %s must be a type name string", what);
    int t = synth_type_parse(v->valuestring);
    if (t < 0) return rl_errf(err, "config: %s: unknown type \"%s\"", what, v->valuestring);
    *out = t;
    return 0;
}

static const char *synth_known_keys[] = {
    "base", "name", "n_layer", "n_embd", "n_vocab", "n_ctx_train", "n_head", "rms_eps", "kda_head_dim",
    "conv_kernel", "kda_gate_lb", "q_lora_rank", "kv_lora_rank", "mla_nope_dim", "rope_dim", "mla_v_dim",
    "n_ff", "n_ff_exp", "n_expert", "n_expert_used", "n_expert_shared", "n_dense_lead", "n_expert_latent",
    "expert_weights_norm", "expert_weights_scale", "situ_beta", "situ_linear_beta", "attn_res_block",
    "mla_gate", "shared_experts", "routed_norm", "pattern", "type", "type_k_b", "types", "logit_scale", "router_bias",
    "dead_experts",
    NULL};

static int synth_config_json(synth_config *c, const char *path, rl_err *err) {
    char *text = synth_slurp(path, err);
    if (!text) return -1;
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return rl_errf(err, "config %s is not a JSON object", path);
    }
    int rc = 0;
    for (const cJSON *it = root->child; it && rc == 0; it = it->next) {
        bool known = it->string[0] == '_'; /* "_comment" and friends */
        for (int i = 0; synth_known_keys[i] && !known; i++) known = strcmp(it->string, synth_known_keys[i]) == 0;
        if (!known) rc = rl_errf(err, "config %s: unknown field \"%s\"", path, it->string);
    }
    const cJSON *base = cJSON_GetObjectItemCaseSensitive(root, "base");
    if (rc == 0) {
        const char *b = cJSON_IsString(base) ? base->valuestring : "tiny";
        if (synth_preset(c, b) != 0) rc = rl_errf(err, "config %s: unknown base preset \"%s\"", path, b);
    }
    k3_hparams *hp = &c->hp;
    uint32_t nope = hp->mla_k_dim - hp->rope_dim;
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(root, "name");
    if (rc == 0) {
        const char *p = strrchr(path, '/');
        snprintf(c->name, sizeof c->name, "%s", cJSON_IsString(name) ? name->valuestring : (p ? p + 1 : path));
    }
#define U32(k, f) if (rc == 0) rc = synth_json_u32(root, k, &hp->f, err)
#define F32(k, f) if (rc == 0) rc = synth_json_f32(root, k, &hp->f, err)
#define BOOL(k, f) if (rc == 0) rc = synth_json_bool(root, k, &hp->f, err)
    U32("n_layer", n_layer);
    U32("n_embd", n_embd);
    U32("n_vocab", n_vocab);
    U32("n_ctx_train", n_ctx_train);
    U32("n_head", n_head);
    F32("rms_eps", rms_eps);
    U32("kda_head_dim", kda_head_dim);
    U32("conv_kernel", conv_kernel);
    F32("kda_gate_lb", kda_gate_lb);
    U32("q_lora_rank", q_lora_rank);
    U32("kv_lora_rank", kv_lora_rank);
    U32("rope_dim", rope_dim);
    U32("mla_v_dim", mla_v_dim);
    U32("n_ff", n_ff);
    U32("n_ff_exp", n_ff_exp);
    U32("n_expert", n_expert);
    U32("n_expert_used", n_expert_used);
    U32("n_expert_shared", n_expert_shared);
    U32("n_dense_lead", n_dense_lead);
    U32("n_expert_latent", n_expert_latent);
    BOOL("expert_weights_norm", expert_weights_norm);
    F32("expert_weights_scale", expert_weights_scale);
    F32("situ_beta", situ_beta);
    F32("situ_linear_beta", situ_linear_beta);
    U32("attn_res_block", attn_res_block);
    BOOL("mla_gate", has_mla_gate);
    BOOL("shared_experts", has_shexp);
    BOOL("routed_norm", has_routed_norm);
#undef U32
#undef F32
#undef BOOL
    if (rc == 0) rc = synth_json_u32(root, "mla_nope_dim", &nope, err);
    hp->mla_k_dim = nope + hp->rope_dim;
    if (rc == 0 && hp->n_layer > K3_MAX_LAYERS) rc = rl_errf(err, "n_layer %u > %d", hp->n_layer, K3_MAX_LAYERS);
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(root, "pattern");
    if (rc == 0 && pat) {
        /* "KKKM KKKM ...": one letter per layer, K = KDA, M = MLA; spaces ignored. */
        uint32_t n = 0;
        for (const char *p = cJSON_IsString(pat) ? pat->valuestring : ""; *p && rc == 0; p++) {
            if (*p == ' ') continue;
            if ((*p != 'K' && *p != 'M') || n >= K3_MAX_LAYERS) rc = rl_errf(err, "config: bad layer pattern");
            else hp->is_mla[n++] = *p == 'M';
        }
        if (rc == 0 && n != hp->n_layer) rc = rl_errf(err, "config: pattern has %u layers, n_layer is %u", n, hp->n_layer);
    } else if (rc == 0) {
        synth_k3_pattern(hp);
    }
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "type");
    if (rc == 0 && t) rc = synth_json_type(t, "\"type\"", &c->type, err);
    t = cJSON_GetObjectItemCaseSensitive(root, "type_k_b");
    if (rc == 0 && t) rc = synth_json_type(t, "\"type_k_b\"", &c->type_k_b, err);
    const cJSON *types = cJSON_GetObjectItemCaseSensitive(root, "types");
    if (rc == 0 && types) {
        if (!cJSON_IsObject(types)) rc = rl_errf(err, "config: \"types\" must map name patterns to types");
        c->n_over = 0; /* a file's overrides replace the preset's */
        for (const cJSON *it = types ? types->child : NULL; it && rc == 0; it = it->next) {
            if (c->n_over == SYNTH_MAX_OVERRIDES) {
                rc = rl_errf(err, "config: more than %d type overrides", SYNTH_MAX_OVERRIDES);
                break;
            }
            synth_type_override *o = &c->over[c->n_over];
            snprintf(o->glob, sizeof o->glob, "%s", it->string);
            rc = synth_json_type(it, it->string, &o->type, err);
            c->n_over++;
        }
    }
    const cJSON *rb = cJSON_GetObjectItemCaseSensitive(root, "router_bias");
    if (rc == 0 && rb) {
        if (!cJSON_IsNumber(rb) || rb->valuedouble < 0) rc = rl_errf(err, "config: router_bias must be >= 0");
        else c->router_bias = (float)rb->valuedouble;
    }
    const cJSON *de = cJSON_GetObjectItemCaseSensitive(root, "dead_experts");
    if (rc == 0 && de) {
        if (!cJSON_IsNumber(de) || de->valuedouble < 0 || de->valuedouble != (double)(uint32_t)de->valuedouble ||
            (uint32_t)de->valuedouble + c->hp.n_expert_used > c->hp.n_expert) {
            rc = rl_errf(err, "config: dead_experts must be an integer from 0 to n_expert - n_expert_used (%u)",
                         c->hp.n_expert - c->hp.n_expert_used);
        } else {
            c->dead_experts = (uint32_t)de->valuedouble;
        }
    }
    const cJSON *ls = cJSON_GetObjectItemCaseSensitive(root, "logit_scale");
    if (rc == 0 && ls) {
        if (!cJSON_IsNumber(ls) || ls->valuedouble <= 0) rc = rl_errf(err, "config: logit_scale must be > 0");
        else c->logit_scale = (float)ls->valuedouble;
    }
    cJSON_Delete(root);
    return rc;
}

int synth_config_load(synth_config *c, const char *name_or_path, rl_err *err) {
    size_t n = strlen(name_or_path);
    bool is_path = strchr(name_or_path, '/') || (n > 5 && strcmp(name_or_path + n - 5, ".json") == 0);
    if (!is_path) {
        if (synth_preset(c, name_or_path) != 0) {
            return rl_errf(err, "unknown config '%s' (presets: tiny, small, medium, draft; or a .json file)",
                           name_or_path);
        }
    } else if (synth_config_json(c, name_or_path, err) != 0) {
        return -1;
    }
    if (c->hp.n_vocab < 768) return rl_errf(err, "config: n_vocab %u < 768 (256 bytes + 256 specials + merges)", c->hp.n_vocab);
    if (c->hp.n_expert_latent == 0) c->hp.has_routed_norm = false;
    return k3_hparams_validate(&c->hp, err);
}

static bool synth_fits(int type, int64_t ne0) { return ne0 % ggml_blck_size((enum ggml_type)type) == 0; }

int synth_tensor_type(const synth_config *c, const k3_tensor_spec *t) {
    int type;
    if (t->kind == K3_KIND_F32) return GGML_TYPE_F32; /* norms, biases, router, conv: as the converter writes */
    type = t->kind == K3_KIND_ATTN_KB ? c->type_k_b : c->type;
    for (int i = 0; i < c->n_over; i++) {
        if (fnmatch(c->over[i].glob, t->name, 0) == 0) {
            type = c->over[i].type;
            break;
        }
    }
    if (!synth_fits(type, t->ne[0])) type = synth_fits(GGML_TYPE_Q8_0, t->ne[0]) ? GGML_TYPE_Q8_0 : GGML_TYPE_F16;
    return type;
}
