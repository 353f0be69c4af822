#include "synth.h"
#include "../gguf/model_file.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml.h"
#include "gguf.h"
#include "../gguf/gguf_write.h"
#include "synth_vocab.h"
#include "../base/file.h"

/* ---- weights ------------------------------------------------------------------------------------
 *
 * Scales (documented in docs/synth.md): a matrix W {K, N} (K inputs) gets uniform values with standard
 * deviation gain/sqrt(K), so each output of a matmul on an O(1) input is O(1). Layers that write into the
 * residual stream use gain 0.5, so the stream grows slowly with depth; ResMix restarts it at every bank.
 * Norm weights are 1 +- 0.1. The LM head has std logit_scale/sqrt(d): logits of a normed state then have
 * std logit_scale (5), which makes the output distribution peaked - greedy decoding has clear winners and
 * is stable against rounding. KDA's decay parameters follow Kimi-Linear's initialisation ranges. */

static uint64_t synth_mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static uint64_t synth_name_hash(const char *s) {
    uint64_t h = 0xcbf29ce484222325ULL; /* FNV-1a */
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ULL;
    return h;
}

/* Uniform in [-1, 1) from (stream, index). */
static inline float synth_u(uint64_t stream, int64_t i) {
    uint64_t r = synth_mix(stream ^ synth_mix((uint64_t)i));
    return (float)((double)(r >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0);
}

static bool synth_ends(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* The init recipe of a K3 tensor, from its name and kind. */
static void synth_k3_init(const synth_config *c, const k3_tensor_spec *t, synth_tensor *out) {
    const float d = (float)c->hp.n_embd;
    const char *n = t->name;
    out->init = SYNTH_INIT_MATRIX;
    out->scale = 1.0f;
    if (strstr(n, "norm.weight")) {
        out->init = SYNTH_INIT_NORM;
    } else if (strstr(n, "res_score")) {
        out->init = SYNTH_INIT_UNIFORM;
        out->scale = 1.0f / sqrtf(d);
    } else if (synth_ends(n, "ssm_a")) {
        out->init = SYNTH_INIT_SSM_A;
    } else if (strstr(n, "ssm_dt.bias")) {
        out->init = SYNTH_INIT_DT_BIAS;
    } else if (strstr(n, "conv1d")) {
        out->init = SYNTH_INIT_UNIFORM;
        out->scale = 0.35f;
    } else if (strstr(n, "exp_probs_b")) {
        out->init = c->dead_experts ? SYNTH_INIT_PROBS_B : SYNTH_INIT_UNIFORM;
        out->scale = c->router_bias;
        out->dead_from = (int64_t)c->hp.n_expert - c->dead_experts;
    } else if (strcmp(n, "token_embd.weight") == 0) {
        out->scale = 1.0f;
    } else if (strcmp(n, "output.weight") == 0) {
        out->scale = c->logit_scale / sqrtf(d);
    } else {
        bool writes_residual = strstr(n, "attn_output") || strstr(n, "ffn_down") || strstr(n, "ffn_routed_up");
        out->scale = (writes_residual ? 0.5f : 1.0f) / sqrtf((float)t->ne[0]);
    }
}

/* Fills dst with elements [start, start+n) of a tensor whose values come from `stream`. */
static void synth_fill(const synth_tensor *t, uint64_t stream, int64_t start, int64_t n, float *dst) {
    const float sq3 = 1.7320508f; /* uniform [-1,1) has std 1/sqrt(3) */
    for (int64_t i = 0; i < n; i++) {
        float u = synth_u(stream, start + i);
        float v;
        switch (t->init) {
        case SYNTH_INIT_NORM: v = 1.0f + 0.1f * u; break;
        case SYNTH_INIT_SSM_A: v = -(1.0f + 7.5f * (u + 1.0f)); break; /* A = -exp(A_log), A in (-16, -1) */
        case SYNTH_INIT_DT_BIAS: v = -1.0f + u; break;                 /* (-2, 0): mostly slow decay */
        case SYNTH_INIT_ZERO: v = 0.0f; break;
        case SYNTH_INIT_PROBS_B: v = start + i >= t->dead_from ? -1000.0f : t->scale * sq3 * u; break;
        default: v = t->scale * sq3 * u; break;                         /* MATRIX, UNIFORM: std = scale */
        }
        dst[i] = v;
    }
}

/* ---- writing ----------------------------------------------------------------------------------- */

typedef struct synth_job {
    const synth_tensor *t;
    uint64_t stream;
    int type;
    int64_t ne0;
    int64_t row0, nrows;
    float *src;
    uint8_t *dst;
    const float *imatrix; /* uniform importance, for the types ggml quantizes only with one (IQ2_XXS ...) */
} synth_job;

static void *synth_job_run(void *arg) {
    synth_job *j = arg;
    synth_fill(j->t, j->stream, j->row0 * j->ne0, j->nrows * j->ne0, j->src);
    ggml_quantize_chunk((enum ggml_type)j->type, j->src, j->dst, 0, j->nrows, j->ne0, j->imatrix);
    return NULL;
}

/* Generates and writes one tensor in chunks of rows, split across threads. */
static int synth_tensor_data(FILE *f, const synth_tensor *t, uint64_t seed, int n_threads, rl_err *err) {
    const int type = t->type;
    const uint64_t stream = synth_mix(seed ^ synth_name_hash(t->name));
    const int64_t ne0 = t->ne[0];
    const int64_t nrows = t->ne[1] * t->ne[2] * t->ne[3];
    const size_t row_size = ggml_row_size((enum ggml_type)type, ne0);
    int64_t chunk = (1 << 20) / ne0; /* about 4 MiB of f32 per thread */
    if (chunk < 1) chunk = 1;
    if (n_threads < 1) n_threads = 1;
    if (n_threads > 16) n_threads = 16;
    float *src = malloc((size_t)(chunk * ne0) * sizeof(float) * (size_t)n_threads);
    uint8_t *dst = malloc((size_t)chunk * row_size * (size_t)n_threads);
    /* IQ2_XXS, IQ2_XS and IQ1_S are quantized only against an importance matrix (ggml asserts one): a
     * uniform one, every column as important as the others. llama-quantize would ask for a calibrated one;
     * for random weights there is nothing to calibrate, and the file's format is the same. */
    const bool need_im = ggml_quantize_requires_imatrix((enum ggml_type)type);
    float *imatrix = need_im ? malloc((size_t)ne0 * sizeof(float)) : NULL;
    if (!src || !dst || (need_im && !imatrix)) {
        free(src);
        free(dst);
        free(imatrix);
        return rl_errf(err, "out of memory generating %s", t->name);
    }
    for (int64_t i = 0; imatrix && i < ne0; i++) imatrix[i] = 1.0f;
    int rc = 0;
    for (int64_t r = 0; r < nrows && rc == 0; r += chunk * n_threads) {
        synth_job jobs[16];
        pthread_t th[16];
        int nj = 0;
        for (int k = 0; k < n_threads; k++) {
            int64_t r0 = r + k * chunk;
            if (r0 >= nrows) break;
            jobs[nj] = (synth_job){t, stream, type, ne0, r0, nrows - r0 < chunk ? nrows - r0 : chunk,
                                   src + (size_t)(k * chunk * ne0), dst + (size_t)k * (size_t)chunk * row_size,
                                   imatrix};
            nj++;
        }
        int started = 0;
        for (int k = 1; k < nj; k++) {
            if (pthread_create(&th[k], NULL, synth_job_run, &jobs[k]) != 0) break;
            started = k;
        }
        synth_job_run(&jobs[0]);
        for (int k = started + 1; k < nj; k++) synth_job_run(&jobs[k]); /* threads that failed to start */
        for (int k = 1; k <= started; k++) pthread_join(th[k], NULL);
        for (int k = 0; k < nj && rc == 0; k++) {
            size_t bytes = (size_t)jobs[k].nrows * row_size;
            if (fwrite(jobs[k].dst, 1, bytes, f) != bytes) rc = rl_errf(err, "write failed: %s", strerror(errno));
        }
    }
    free(src);
    free(dst);
    free(imatrix);
    return rc;
}

typedef struct synth_emit_ctx {
    const synth_tensor *tensors;
    uint64_t seed;
    int n_threads;
} synth_emit_ctx;

static int synth_emit_data(void *ctx, int i, FILE *f, rl_err *err) {
    const synth_emit_ctx *e = ctx;
    return synth_tensor_data(f, &e->tensors[i], e->seed, e->n_threads, err);
}

int synth_emit(struct gguf_context *meta, const synth_tensor *tensors, int n_tensors, const synth_opts *o,
               rl_err *err) {
    if (o->dry_run) {
        size_t total = 0;
        for (int i = 0; i < n_tensors; i++) {
            total += ggml_row_size((enum ggml_type)tensors[i].type, tensors[i].ne[0]) *
                     (size_t)(tensors[i].ne[1] * tensors[i].ne[2] * tensors[i].ne[3]);
        }
        printf("%d tensors, %zu bytes of tensor data (%.2f GiB)\n", n_tensors, total, (double)total / (1 << 30));
        for (int t = 0; t < GGML_TYPE_COUNT; t++) {
            size_t bytes = 0;
            int n = 0;
            for (int i = 0; i < n_tensors; i++) {
                if (tensors[i].type != t) continue;
                n++;
                bytes += ggml_row_size((enum ggml_type)t, tensors[i].ne[0]) *
                         (size_t)(tensors[i].ne[1] * tensors[i].ne[2] * tensors[i].ne[3]);
            }
            if (n) printf("  %-8s %5d tensors %14zu bytes\n", ggml_type_name((enum ggml_type)t), n, bytes);
        }
        return 0;
    }
    if (o->shapes) { /* K3 at its real size is planned, never synthesized: shapes and types only */
        struct gguf_context *g = gguf_init_empty();
        if (!g) return rl_errf(err, "out of memory");
        gguf_set_kv(g, meta);
        if (mf_compose(o->shapes, g, n_tensors, err) != 0) return -1;
        for (int i = 0; i < n_tensors; i++) {
            mf_tensor t = {.name = tensors[i].name, .type = tensors[i].type, .n_dims = tensors[i].n_dims,
                           .nbytes = ggml_row_size((enum ggml_type)tensors[i].type, tensors[i].ne[0]) *
                                     (size_t)(tensors[i].ne[1] * tensors[i].ne[2] * tensors[i].ne[3])};
            memcpy(t.ne, tensors[i].ne, sizeof t.ne);
            if (mf_compose_tensor(o->shapes, &t, err) != 0) {
                mf_close(o->shapes);
                return -1;
            }
        }
        return 0;
    }
    gw_tensor *gt = calloc((size_t)(n_tensors > 0 ? n_tensors : 1), sizeof *gt);
    if (!gt) return rl_errf(err, "out of memory");
    for (int i = 0; i < n_tensors; i++) {
        gt[i] = (gw_tensor){.name = tensors[i].name, .type = tensors[i].type, .n_dims = tensors[i].n_dims};
        memcpy(gt[i].ne, tensors[i].ne, sizeof gt[i].ne);
    }
    synth_emit_ctx ec = {tensors, o->seed, o->n_threads};
    gw_opts go = {.out = o->out, .n_split = o->n_split, .progress = o->progress ? "synth" : NULL};
    int rc = gw_write(meta, gt, n_tensors, &go, synth_emit_data, &ec, err);
    free(gt);
    return rc;
}

int synth_vocab_build(sv_vocab *v, int32_t n_vocab, const synth_opts *o, rl_err *err) {
    if (!o->corpus) return sv_build(v, n_vocab, err);
    char *text = NULL;
    size_t len = 0;
    if (rl_read_file(o->corpus, "corpus file", &text, &len, err) != 0) {
        memset(v, 0, sizeof *v);
        return -1;
    }
    if (len == 0) {
        free(text);
        memset(v, 0, sizeof *v);
        return rl_errf(err, "corpus file %s is empty", o->corpus);
    }
    sv_text t = {.name = o->corpus, .data = text, .len = len};
    int rc = sv_build_from(v, n_vocab, &t, 1, err);
    free(text);
    return rc;
}

int synth_write(const synth_config *c, const synth_opts *o, rl_err *err) {
    k3_tensor_spec *spec = NULL;
    int n_spec = 0;
    sv_vocab vocab;
    memset(&vocab, 0, sizeof vocab);
    synth_tensor *plan = NULL;
    struct gguf_context *meta = NULL;
    int rc = -1;

    if (k3_manifest(&c->hp, &spec, &n_spec, err) != 0) return -1;
    if (synth_vocab_build(&vocab, (int32_t)c->hp.n_vocab, o, err) != 0) goto done;
    meta = gguf_init_empty();
    k3_hparams_write(&c->hp, meta);
    char desc[160];
    snprintf(desc, sizeof desc, "ringlm synth --config %s --seed %llu", c->name, (unsigned long long)o->seed);
    gguf_set_val_str(meta, "general.name", "ringlm synthetic K3");
    gguf_set_val_str(meta, "general.description", desc);
    gguf_set_val_u32(meta, "general.quantization_version", GGML_QNT_VERSION);
    if (sv_write_gguf(&vocab, meta, err) != 0) goto done;

    plan = calloc((size_t)n_spec, sizeof *plan);
    if (!plan) {
        rl_errf(err, "out of memory");
        goto done;
    }
    for (int i = 0; i < n_spec; i++) {
        synth_tensor *t = &plan[i];
        snprintf(t->name, sizeof t->name, "%s", spec[i].name);
        t->n_dims = spec[i].n_dims;
        memcpy(t->ne, spec[i].ne, sizeof t->ne);
        t->type = synth_tensor_type(c, &spec[i]);
        synth_k3_init(c, &spec[i], t);
    }
    if (o->dry_run) printf("config %s: ", c->name);
    rc = synth_emit(meta, plan, n_spec, o, err);
done:
    if (meta) gguf_free(meta);
    free(plan);
    sv_free(&vocab);
    free(spec);
    return rc;
}
