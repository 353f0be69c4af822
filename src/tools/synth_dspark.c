#include "synth_dspark.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml.h"
#include "gguf.h"
#include "synth_vocab.h"

/* ---- shape ----------------------------------------------------------------------------------------
 *
 * The draft is a small Qwen3-style transformer whose width must be the target's (llama.cpp sizes fc with
 * the draft's n_embd while its driver packs target-width taps, docs/k3-spec.md §10.1.2). Everything else is scaled
 * from K3's own DSpark where that makes sense (FFN width 2d, block 7, rope theta 50000, R = 256 at d = 7168)
 * and kept small otherwise (2 layers, head size 64). */

#define DSPARK_HEAD_DIM 64
#define DSPARK_ROPE_BASE 50000.0f
/* Markov rank: d/8, at least 32 (so a tiny target still gets a real low-rank table) and at most K3's 256. */
#define DSPARK_RANK_MIN 32u
#define DSPARK_RANK_MAX 256u
/* Salt for the weight streams: the draft has tensors named like the target's (blk.0.ffn_norm.weight, ...),
 * and with the same seed they would get the same values; a draft is an independent model. */
#define DSPARK_SEED_SALT 0x44537061726b0000ULL /* "DSpark" */

int dspark_shape_for(const synth_config *target, dspark_shape *s, rl_err *err) {
    const k3_hparams *hp = &target->hp;
    memset(s, 0, sizeof *s);
    if (hp->n_layer < 1 || hp->n_embd == 0 || hp->n_vocab == 0) {
        return rl_errf(err, "dspark: target config '%s' has no layers, width or vocabulary", target->name);
    }
    s->n_embd = hp->n_embd;
    s->n_vocab = hp->n_vocab;
    s->n_layer = DSPARK_N_LAYER;
    /* Head size 64, halved until it divides d (a JSON config may pick any width). */
    uint32_t hd = DSPARK_HEAD_DIM;
    while (hd > 8 && s->n_embd % hd != 0) hd /= 2;
    if (s->n_embd % hd != 0) {
        return rl_errf(err, "dspark: target n_embd %u is not a multiple of 8, no head size fits", s->n_embd);
    }
    s->head_dim = hd;
    s->n_head = s->n_embd / hd;
    /* Grouped-query attention 2:1 where the head count allows, so the draft graph exercises K/V sharing. */
    s->n_head_kv = s->n_head % 2 == 0 ? s->n_head / 2 : s->n_head;
    s->n_ff = 2 * s->n_embd;
    uint32_t r = s->n_embd / 8;
    s->markov_rank = r < DSPARK_RANK_MIN ? DSPARK_RANK_MIN : r > DSPARK_RANK_MAX ? DSPARK_RANK_MAX : r;
    s->n_ctx_train = hp->n_ctx_train;
    s->rms_eps = hp->rms_eps;
    s->rope_freq_base = DSPARK_ROPE_BASE;

    /* Taps: K3's DSpark taps 5 of 93 layers from early to late ([2, 23, 47, 71, 89]); scaled down, up to 3
     * distinct ids from layer 1 to the last layer, evenly spread. Layer 0's input would be the raw token
     * embedding, which the draft already sees through its own input, so it is skipped when there is a
     * choice. Ids follow llama.cpp's "input of layer i" convention and stay < n_layer. */
    const int L = (int)hp->n_layer;
    if (L == 1) {
        s->n_taps = 1;
        s->taps[0] = 0;
    } else {
        s->n_taps = L - 1 < DSPARK_SYNTH_TAPS ? L - 1 : DSPARK_SYNTH_TAPS;
        for (int k = 0; k < s->n_taps; k++) {
            s->taps[k] = s->n_taps == 1 ? 1 : 1 + (int32_t)((int64_t)k * (L - 2) / (s->n_taps - 1));
        }
    }
    return 0;
}

/* ---- plan ----------------------------------------------------------------------------------------- */

typedef struct dspark_plan {
    const synth_config *c;
    synth_tensor *t;
    int n, cap;
} dspark_plan;

/* Adds one tensor. `kind` picks the storage type through the target config's rules (K3_KIND_F32 = always
 * f32; anything else = the config's matrix type or a glob override, with the usual block-size fallback). */
static int dspark_add(dspark_plan *p, enum k3_tensor_kind kind, enum synth_init init, float scale, int n_dims,
                      int64_t ne0, int64_t ne1, rl_err *err, const char *fmt, ...)
    __attribute__((format(printf, 9, 10)));

static int dspark_add(dspark_plan *p, enum k3_tensor_kind kind, enum synth_init init, float scale, int n_dims,
                      int64_t ne0, int64_t ne1, rl_err *err, const char *fmt, ...) {
    if (p->n == p->cap) {
        int cap = p->cap ? p->cap * 2 : 32;
        synth_tensor *t = realloc(p->t, (size_t)cap * sizeof *t);
        if (!t) return rl_errf(err, "dspark: out of memory building the tensor plan");
        p->t = t;
        p->cap = cap;
    }
    k3_tensor_spec spec;
    memset(&spec, 0, sizeof spec);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(spec.name, sizeof spec.name, fmt, ap);
    va_end(ap);
    spec.n_dims = n_dims;
    spec.ne[0] = ne0;
    spec.ne[1] = ne1;
    spec.ne[2] = spec.ne[3] = 1;
    spec.layer = -1;
    spec.kind = kind;

    synth_tensor *t = &p->t[p->n++];
    memset(t, 0, sizeof *t);
    memcpy(t->name, spec.name, sizeof t->name);
    t->n_dims = n_dims;
    memcpy(t->ne, spec.ne, sizeof t->ne);
    t->type = synth_tensor_type(p->c, &spec);
    t->init = init;
    t->scale = scale;
    return 0;
}

/* A matrix W {K, N} reading K inputs: std gain/sqrt(K), as synth.c does (docs/synth.md). */
static float dspark_w(float gain, int64_t fan_in) { return gain / sqrtf((float)fan_in); }

static int dspark_build_plan(dspark_plan *p, const dspark_shape *s, rl_err *err) {
    const int64_t d = s->n_embd, V = s->n_vocab, R = s->markov_rank, F = s->n_ff, hd = s->head_dim;
    const int64_t q = (int64_t)s->n_head * hd, kv = (int64_t)s->n_head_kv * hd;
    const int64_t n_enc = (int64_t)s->n_taps * d;
    int rc = 0;

    /* Context path: fc fuses the concatenated taps; its output is RMS-normed, so its scale only matters
     * for rounding. */
    rc |= dspark_add(p, K3_KIND_ATTN, SYNTH_INIT_MATRIX, dspark_w(1.0f, n_enc), 2, n_enc, d, err, "fc.weight");
    rc |= dspark_add(p, K3_KIND_F32, SYNTH_INIT_NORM, 1.0f, 1, d, 1, err, "enc.output_norm.weight");

    /* Backbone: standard pre-norm Qwen3 blocks; the layers that write into the residual stream use gain 0.5
     * like the target's. */
    for (uint32_t il = 0; il < s->n_layer && rc == 0; il++) {
        rc |= dspark_add(p, K3_KIND_F32, SYNTH_INIT_NORM, 1.0f, 1, d, 1, err, "blk.%u.attn_norm.weight", il);
        rc |= dspark_add(p, K3_KIND_ATTN, SYNTH_INIT_MATRIX, dspark_w(1.0f, d), 2, d, q, err, "blk.%u.attn_q.weight", il);
        rc |= dspark_add(p, K3_KIND_ATTN, SYNTH_INIT_MATRIX, dspark_w(1.0f, d), 2, d, kv, err, "blk.%u.attn_k.weight", il);
        rc |= dspark_add(p, K3_KIND_ATTN, SYNTH_INIT_MATRIX, dspark_w(1.0f, d), 2, d, kv, err, "blk.%u.attn_v.weight", il);
        rc |= dspark_add(p, K3_KIND_ATTN, SYNTH_INIT_MATRIX, dspark_w(0.5f, q), 2, q, d, err,
                         "blk.%u.attn_output.weight", il);
        rc |= dspark_add(p, K3_KIND_F32, SYNTH_INIT_NORM, 1.0f, 1, hd, 1, err, "blk.%u.attn_q_norm.weight", il);
        rc |= dspark_add(p, K3_KIND_F32, SYNTH_INIT_NORM, 1.0f, 1, hd, 1, err, "blk.%u.attn_k_norm.weight", il);
        rc |= dspark_add(p, K3_KIND_F32, SYNTH_INIT_NORM, 1.0f, 1, d, 1, err, "blk.%u.ffn_norm.weight", il);
        rc |= dspark_add(p, K3_KIND_FFN, SYNTH_INIT_MATRIX, dspark_w(1.0f, d), 2, d, F, err, "blk.%u.ffn_gate.weight", il);
        rc |= dspark_add(p, K3_KIND_FFN, SYNTH_INIT_MATRIX, dspark_w(1.0f, d), 2, d, F, err, "blk.%u.ffn_up.weight", il);
        rc |= dspark_add(p, K3_KIND_FFN, SYNTH_INIT_MATRIX, dspark_w(0.5f, F), 2, F, d, err, "blk.%u.ffn_down.weight", il);
    }
    rc |= dspark_add(p, K3_KIND_F32, SYNTH_INIT_NORM, 1.0f, 1, d, 1, err, "output_norm.weight");

    /* Markov head: bias = markov_w2 . markov_w1[prev]. Rows of w1 have std 1 and w2 has std 1/sqrt(R), so
     * the bias has std ~1 on logits whose own std is the target's logit_scale (5): it reorders close
     * candidates without swamping the backbone's prediction. */
    rc |= dspark_add(p, K3_KIND_EMBD, SYNTH_INIT_MATRIX, 1.0f, 2, R, V, err, "markov_w1.weight");
    rc |= dspark_add(p, K3_KIND_OUTPUT, SYNTH_INIT_MATRIX, dspark_w(1.0f, R), 2, R, V, err, "markov_w2.weight");

    /* Confidence head: sigmoid(conf_proj . [hid ; markov_w1[prev]] + b). Both inputs are O(1), so the dot
     * has std ~1; the bias is ~1 (drawn like a norm weight, 1 +- 0.1), which puts most confidences around
     * 0.7: a p_min near 0.5 then cuts some drafts short but not all. One output row: stored f32. */
    rc |= dspark_add(p, K3_KIND_F32, SYNTH_INIT_MATRIX, dspark_w(1.0f, d + R), 2, d + R, 1, err, "conf_proj.weight");
    rc |= dspark_add(p, K3_KIND_F32, SYNTH_INIT_NORM, 1.0f, 1, 1, 1, err, "conf_proj.bias");
    return rc ? -1 : 0;
}

/* ---- metadata ------------------------------------------------------------------------------------- */

#define DKEY(k) (DSPARK_ARCH "." k)

static void dspark_write_keys(const dspark_shape *s, struct gguf_context *g) {
    gguf_set_val_str(g, "general.architecture", DSPARK_ARCH);
    gguf_set_val_u32(g, DKEY("context_length"), s->n_ctx_train);
    gguf_set_val_u32(g, DKEY("embedding_length"), s->n_embd);
    gguf_set_val_u32(g, DKEY("block_count"), s->n_layer);
    gguf_set_val_u32(g, DKEY("feed_forward_length"), s->n_ff);
    gguf_set_val_u32(g, DKEY("attention.head_count"), s->n_head);
    gguf_set_val_u32(g, DKEY("attention.head_count_kv"), s->n_head_kv);
    gguf_set_val_u32(g, DKEY("attention.key_length"), s->head_dim);
    gguf_set_val_u32(g, DKEY("attention.value_length"), s->head_dim);
    gguf_set_val_f32(g, DKEY("attention.layer_norm_rms_epsilon"), s->rms_eps);
    gguf_set_val_f32(g, DKEY("rope.freq_base"), s->rope_freq_base);
    gguf_set_val_u32(g, DKEY("rope.dimension_count"), s->head_dim); /* full NeoX rotation, as Qwen3 */
    gguf_set_val_u32(g, DKEY("vocab_size"), s->n_vocab);
    /* INT32, as gguf-py writes a Python int list; llama.cpp reads it into int32_t (uint32 is accepted too). */
    gguf_set_arr_data(g, DKEY("target_layers"), GGUF_TYPE_INT32, s->taps, (size_t)s->n_taps);
    gguf_set_val_u32(g, DKEY("block_size"), DSPARK_BLOCK_SIZE);
    /* Anchor-first block (K3's DSpark): slot 0, the last committed token, already predicts the next one. */
    gguf_set_val_bool(g, DKEY("sample_from_anchor"), true);
    gguf_set_val_bool(g, DKEY("has_confidence_head"), true);
    /* No dflash.attention.causal: absent means non-causal inside the block, as vLLM's K3 reference runs. */
}

int synth_dspark_write(const synth_config *target, const synth_opts *o, rl_err *err) {
    dspark_shape s;
    dspark_plan plan = {.c = target};
    sv_vocab vocab;
    memset(&vocab, 0, sizeof vocab);
    struct gguf_context *meta = NULL;
    int rc = -1;

    if (dspark_shape_for(target, &s, err) != 0) return -1;
    if (synth_vocab_build(&vocab, (int32_t)s.n_vocab, o, err) != 0) goto done;
    meta = gguf_init_empty();
    if (!meta) {
        rl_errf(err, "dspark: out of memory");
        goto done;
    }
    dspark_write_keys(&s, meta);
    char desc[192];
    snprintf(desc, sizeof desc, "ringlm synth --config %s --draft dspark --seed %llu", target->name,
             (unsigned long long)o->seed);
    gguf_set_val_str(meta, "general.name", "ringlm synthetic K3 DSpark draft");
    gguf_set_val_str(meta, "general.description", desc);
    gguf_set_val_u32(meta, "general.quantization_version", GGML_QNT_VERSION);
    /* The target's tokenizer exactly (same builder, same n_vocab), plus the one key a draft adds. */
    if (sv_write_gguf(&vocab, meta, err) != 0) goto done;
    gguf_set_val_u32(meta, "tokenizer.ggml.mask_token_id", (uint32_t)vocab.mask_id);

    if (dspark_build_plan(&plan, &s, err) != 0) goto done;
    synth_opts so = *o;
    so.seed = o->seed ^ DSPARK_SEED_SALT;
    if (o->dry_run) printf("dspark draft for config %s: ", target->name);
    rc = synth_emit(meta, plan.t, plan.n, &so, err);
done:
    if (meta) gguf_free(meta);
    free(plan.t);
    sv_free(&vocab);
    return rc;
}
