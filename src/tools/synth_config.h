/* synth_config.h - what `ringlm synth` builds: K3 hyperparameters, per-tensor storage types, weight scales.
 *
 * Presets (tiny, small, medium, draft) or a JSON file; a JSON file may start from a preset with
 * "base": "tiny" and override any field. Field names are those of k3_hparams plus the switches below. */
#ifndef RINGLM_SYNTH_CONFIG_H
#define RINGLM_SYNTH_CONFIG_H

#include <stdint.h>

#include "../base/err.h"
#include "../model/k3_hparams.h"

#define SYNTH_MAX_OVERRIDES 32

typedef struct synth_type_override {
    char glob[64]; /* fnmatch pattern on the tensor name, e.g. "blk.*.ffn_*_exps.weight" */
    int type;      /* enum ggml_type */
} synth_type_override;

typedef struct synth_config {
    char name[64];
    k3_hparams hp;            /* has_mla_gate / has_shexp / has_routed_norm are the switches */
    int type;                 /* enum ggml_type for matrices (embedding, LM head, projections, experts) */
    int type_k_b;             /* attn_k_b: f32 unless asked (llama.cpp's CPU backend aborts on some f16) */
    synth_type_override over[SYNTH_MAX_OVERRIDES];
    int n_over;
    float logit_scale; /* std of the logits: larger = more peaked output distribution */
    float router_bias; /* std of the selection bias exp_probs_b: larger = fewer near-ties in top-k */
    uint32_t dead_experts; /* the last N experts of every MoE layer get a selection bias of -1000: sigmoid
                            * scores are in (0, 1), so top-k never picks them (a REAP test's known answer) */
} synth_config;

/* Loads a preset by name, or a JSON file by path (anything containing '/' or ending in .json). */
int synth_config_load(synth_config *c, const char *name_or_path, rl_err *err);

/* Parses a type name as ggml spells it ("f32", "q4_K", "iq4_nl", case-insensitive). -1 if unknown. */
int synth_type_parse(const char *s);

/* The type a tensor is stored as: overrides first, then kind defaults, then a fallback for rows whose
 * length the type's block size does not divide (q8_0, then f16), as llama-quantize does. */
int synth_tensor_type(const synth_config *c, const k3_tensor_spec *t);

#endif
