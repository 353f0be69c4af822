#include "inspect.h"

#include <math.h>
#include <string.h>

#include "ggml.h"
#include "gguf.h"

#include "../model/k3_memory.h"
#include "../model/k3_weights.h"

static void inspect_mib(char *buf, size_t n, size_t bytes) {
    if (bytes >= (size_t)1 << 30) snprintf(buf, n, "%.2f GiB", (double)bytes / (1 << 30));
    else if (bytes >= (size_t)1 << 20) snprintf(buf, n, "%.2f MiB", (double)bytes / (1 << 20));
    else snprintf(buf, n, "%.1f KiB", (double)bytes / 1024.0);
}

static int64_t inspect_n_params(const mf_model *m) {
    int64_t n = 0;
    for (int i = 0; i < m->n_tensor; i++) n += m->tensors[i].ne[0] * m->tensors[i].ne[1] * m->tensors[i].ne[2] * m->tensors[i].ne[3];
    return n;
}

static void inspect_kv(FILE *out, const mf_model *m, const k3_hparams *hp) {
    fprintf(out, "arch %s\n", K3_ARCH);
    fprintf(out, "n_layer %u\nn_embd %u\nn_head %u\nn_vocab %u\nn_ctx_train %u\n", hp->n_layer, hp->n_embd,
            hp->n_head, hp->n_vocab, hp->n_ctx_train);
    fprintf(out, "n_params %lld\nn_tensors %d\nn_kv %lld\n", (long long)inspect_n_params(m), m->n_tensor,
            (long long)gguf_get_n_kv(m->meta));
    fprintf(out, "n_expert %u\nn_expert_used %u\nn_expert_shared %u\nn_ff_exp %u\nn_expert_latent %u\n",
            hp->n_expert, hp->n_expert_used, hp->n_expert_shared, hp->n_ff_exp, hp->n_expert_latent);
    fprintf(out, "n_dense_lead %u\nattn_res_block %u\nq_lora_rank %u\nkv_lora_rank %u\n", hp->n_dense_lead,
            hp->attn_res_block, hp->q_lora_rank, hp->kv_lora_rank);
    fprintf(out, "kda_head_dim %u\nconv_kernel %u\n", hp->kda_head_dim, hp->conv_kernel);
    fprintf(out, "weight_bytes %zu\nactive_bytes_per_token %zu\n", m->tensor_bytes,
            k3_range_active_bytes(m, hp, 0, hp->n_layer));
    fprintf(out, "mla_layers");
    for (uint32_t i = 0; i < hp->n_layer; i++) {
        if (hp->is_mla[i]) fprintf(out, " %u", i);
    }
    fprintf(out, "\n");
}

void inspect_print(FILE *out, const mf_model *m, const k3_hparams *hp, const inspect_opts *o) {
    uint32_t ra = 0, rb = hp->n_layer;
    if (o->range_b >= 0) {
        ra = (uint32_t)o->range_a;
        rb = (uint32_t)o->range_b;
    }
    const size_t ce = o->cache_f32 ? 4 : 2;
    const uint32_t chunk = o->chunk ? o->chunk : 512;
    const size_t r_weights = k3_range_weight_bytes(m, hp, ra, rb),
                 r_state = k3_range_state_bytes(hp, ra, rb, o->n_seq, o->n_ctx, ce),
                 r_compute = k3_range_compute_bytes(hp, ra, rb, o->n_ctx, chunk);
    if (o->kv_format) {
        inspect_kv(out, m, hp);
        fprintf(out, "range %u %u\nrange_weight_bytes %zu\nrange_state_bytes %zu\nrange_compute_bytes %zu\n"
                     "range_total_bytes %zu\n", ra, rb, r_weights, r_state, r_compute, r_weights + r_state + r_compute);
        return;
    }
    char a[32], b[32], c[32];
    size_t file_bytes = 0;
    for (int s = 0; s < m->n_split; s++) file_bytes += m->splits[s].size;
    inspect_mib(a, sizeof a, file_bytes);
    fprintf(out, "file          %s%s (%d file%s, %s, GGUF v%u)\n", m->splits[0].path, m->n_split > 1 ? " ..." : "",
            m->n_split, m->n_split > 1 ? "s" : "", a, gguf_get_version(m->meta));
    fprintf(out, "architecture  %s\n", K3_ARCH);
    fprintf(out, "tensors       %d (%lld parameters), metadata keys %lld\n", m->n_tensor,
            (long long)inspect_n_params(m), (long long)gguf_get_n_kv(m->meta));

    int n_mla = 0;
    for (uint32_t i = 0; i < hp->n_layer; i++) n_mla += hp->is_mla[i];
    fprintf(out, "\nhyperparameters\n");
    fprintf(out, "  layers %u (%u KDA, %d MLA; %u dense leading), d %u, vocab %u, context %u, rms eps %g\n",
            hp->n_layer, hp->n_layer - (uint32_t)n_mla, n_mla, hp->n_dense_lead, hp->n_embd, hp->n_vocab,
            hp->n_ctx_train, hp->rms_eps);
    fprintf(out, "  heads %u; KDA head dim %u (inner %u), conv kernel %u, gate %s", hp->n_head, hp->kda_head_dim,
            k3_d_inner(hp), hp->conv_kernel, isfinite(hp->kda_gate_lb) ? "bounded" : "softplus");
    if (isfinite(hp->kda_gate_lb)) fprintf(out, " (lower bound %g)", hp->kda_gate_lb);
    fprintf(out, "\n  MLA: q lora %u%s, kv lora %u, nope %u + rope %u (unrotated), v %u, output gate %s\n",
            hp->q_lora_rank, hp->q_lora_rank ? "" : " (none)", hp->kv_lora_rank, hp->mla_k_dim - hp->rope_dim,
            hp->rope_dim, hp->mla_v_dim, hp->has_mla_gate ? "yes" : "no");
    fprintf(out, "  FFN: dense %u; experts %u, top-%u, width %u, latent %u%s, shared %u%s, routed norm %s\n",
            hp->n_ff, hp->n_expert, hp->n_expert_used, hp->n_ff_exp, hp->n_expert_latent,
            hp->n_expert_latent ? "" : " (none)", hp->n_expert_shared, hp->has_shexp ? "" : " (absent)",
            hp->has_routed_norm ? "yes" : "no");
    fprintf(out, "  routing: sigmoid, renormalize %s, scale %g; SiTU beta %g, linear beta %g\n",
            hp->expert_weights_norm ? "yes" : "no", hp->expert_weights_scale, hp->situ_beta, hp->situ_linear_beta);
    fprintf(out, "  residual attention block %u%s\n", hp->attn_res_block, hp->attn_res_block ? "" : " (off)");

    /* Bytes per quant type. */
    fprintf(out, "\nbytes per type\n");
    for (int t = 0; t < GGML_TYPE_COUNT; t++) {
        size_t bytes = 0;
        int n = 0;
        for (int i = 0; i < m->n_tensor; i++) {
            if (m->tensors[i].type == t) {
                bytes += m->tensors[i].nbytes;
                n++;
            }
        }
        if (n) {
            inspect_mib(a, sizeof a, bytes);
            fprintf(out, "  %-8s %5d tensors %12s\n", ggml_type_name((enum ggml_type)t), n, a);
        }
    }

    fprintf(out, "\nper layer (boundary = f32 values per token entering the layer)\n");
    fprintf(out, "  %5s %-4s %-5s %-6s %12s %10s\n", "layer", "mix", "ffn", "banks", "weights", "boundary");
    for (uint32_t il = 0; il < hp->n_layer; il++) {
        inspect_mib(a, sizeof a, k3_layer_weight_bytes(m, il));
        bool bank = hp->attn_res_block && il % hp->attn_res_block == 0;
        fprintf(out, "  %5u %-4s %-5s %-6s %12s %10zu\n", il, hp->is_mla[il] ? "MLA" : "KDA",
                k3_is_moe(hp, il) ? "MoE" : "dense", bank ? "yes" : "", a, k3_boundary_floats(hp, il));
    }
    inspect_mib(a, sizeof a, k3_range_weight_bytes(m, hp, 0, 0) );
    inspect_mib(b, sizeof b, k3_range_weight_bytes(m, hp, hp->n_layer, hp->n_layer));
    fprintf(out, "  globals: embedding %s (first stage), output %s (last stage)\n", a, b);

    inspect_mib(a, sizeof a, k3_range_active_bytes(m, hp, 0, hp->n_layer));
    fprintf(out, "  active weights per token: %s (experts counted at top-%u of %u)\n", a, hp->n_expert_used, hp->n_expert);
    fprintf(out, "\nper-sequence state\n");
    inspect_mib(a, sizeof a, k3_range_kda_state_bytes(hp, 0, hp->n_layer));
    fprintf(out, "  KDA conv + recurrent state: %s per sequence (constant in length)\n", a);
    fprintf(out, "  MLA latent cache: %zu bytes per token (f32), %zu (f16)\n",
            k3_range_mla_bytes_per_token(hp, 0, hp->n_layer, 4), k3_range_mla_bytes_per_token(hp, 0, hp->n_layer, 2));

    inspect_mib(a, sizeof a, r_weights);
    inspect_mib(b, sizeof b, r_state);
    inspect_mib(c, sizeof c, r_weights + r_state);
    fprintf(out, "\nlayers [%u, %u): weights %s + state %s (%u seq x %u tokens, %s cache) = %s\n", ra, rb, a, b,
            o->n_seq, o->n_ctx, o->cache_f32 ? "f32" : "f16", c);
    inspect_mib(a, sizeof a, r_compute);
    inspect_mib(b, sizeof b, r_weights + r_state + r_compute);
    fprintf(out, "  + compute buffer about %s (prefill chunks of %u tokens: the f16 attention mask over the\n"
                 "  whole context, and activations) = %s to run it\n", a, chunk, b);
    /* What repacking changes is not the total but its kind: copied weights are resident RAM, mapped ones
     * are file pages the kernel may drop and read again. */
    inspect_mib(a, sizeof a, k3_range_repack_bytes(m, hp, ra, rb));
    fprintf(out, "  of the weights, %s are repacked on this CPU (copied out of the mapping at load, as llama.cpp\n"
                 "  does by default; --no-repack keeps them mapped)\n", a);
}
