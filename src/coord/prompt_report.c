/* prompt_run's summary on stderr and its metrics file (prompt_int.h). */
#include <stdio.h>
#include <stdlib.h>

#include "../model/k3_memory.h"
#include "prompt_int.h"

static cJSON *prompt_xc_json(const xc_stats *s) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "tokens", (double)s->tokens);
    cJSON_AddNumberToObject(j, "hit_rate", s->needed ? (double)s->hits / (double)s->needed : 0);
    cJSON_AddNumberToObject(j, "bytes_read", (double)s->bytes_read);
    cJSON_AddNumberToObject(j, "bytes_read_per_token", s->tokens ? (double)s->bytes_read / (double)s->tokens : 0);
    cJSON_AddNumberToObject(j, "bytes_used_per_token", s->tokens ? (double)s->bytes_used / (double)s->tokens : 0);
    cJSON_AddNumberToObject(j, "prefetched", (double)s->prefetched);
    cJSON_AddNumberToObject(j, "prefetch_accuracy", s->prefetched ? (double)s->prefetch_used / (double)s->prefetched : 0);
    cJSON_AddNumberToObject(j, "loads", (double)s->loads);
    cJSON_AddNumberToObject(j, "passes", (double)s->passes);
    cJSON_AddNumberToObject(j, "wait_s", s->wait_s);
    cJSON_AddNumberToObject(j, "from_copy", (double)s->from_copy);
    cJSON_AddNumberToObject(j, "copied", (double)s->copied);
    return j;
}

/* The summary line of an expert cache: hit rate, bytes read per token against what the tokens used, how
 * often the look-ahead was right, and how long the compute waited for the disk. */
static void prompt_xc_print(const char *phase, const xc_stats *s) {
    fprintf(stderr, "[ringlm] experts (%s): hit rate %.1f%%, read %.2f MiB/token (the chosen experts: %.2f MiB/token), "
                    "look-ahead %.0f%% of %llu used, waited %.3f s\n", phase,
            s->needed ? 100.0 * (double)s->hits / (double)s->needed : 0.0,
            s->tokens ? (double)s->bytes_read / (double)s->tokens / 1048576.0 : 0.0,
            s->tokens ? (double)s->bytes_used / (double)s->tokens / 1048576.0 : 0.0,
            s->prefetched ? 100.0 * (double)s->prefetch_used / (double)s->prefetched : 0.0,
            (unsigned long long)s->prefetched, s->wait_s);
}

void prompt_report_print(const prompt_opts *o, const gen_metrics *gm, const spec_metrics *smx, const prompt_out *po,
                         const mf_model *m, const k3_engine *e) {
    fprintf(stderr,
            "\n[ringlm] prompt %d tokens, prefill %.1f tok/s, ttft %.3f s, generated %d tokens, decode %.2f tok/s, "
            "peak rss %.1f MiB, stop: %s\n",
            gm->prompt_tokens, gm->prefill_tok_s, gm->ttft_s, gm->generated_tokens, gm->decode_tok_s,
            (double)gm->peak_rss_bytes / 1048576.0, gm->stop_reason);
    if (smx) {
        fprintf(stderr, "[ringlm] speculative (%s): acceptance %.1f%%, %.2f tokens per target pass (%ld passes), "
                        "draft %.3f s, verify %.3f s, fallbacks %ld (%ld steps without drafts); blocks of %.2f drafts, "
                        "%.2f in flight on average (at most %d, %ld stale)\n",
                o->draft, 100 * smx->acceptance_rate, smx->tokens_per_traversal, smx->traversals, smx->draft_s,
                smx->verify_s, smx->fallbacks, smx->paused_steps,
                smx->blocks ? (double)smx->sent_drafts / (double)smx->blocks : 0.0,
                smx->blocks ? (double)smx->depth_sum / (double)smx->blocks : 0.0, smx->depth_max, smx->cancelled);
    }
    if (po->xc) {
        xc_stats d = xc_stats_sub(po->xc, &po->xc_prefill);
        size_t ram_dense = 0, ram_experts = 0; /* (the experts in RAM: a device holds the others) */
        k3_range_ram_bytes(m, &e->hp, 0, e->hp.n_layer, &ram_dense, &ram_experts);
        fprintf(stderr, "[ringlm] expert cache: %.1f MiB for routed experts of %.1f MiB in RAM, the rest read from the file\n",
                (double)e->xc->cache_bytes / 1048576.0, (double)ram_experts / 1048576.0);
        prompt_xc_print("prefill", &po->xc_prefill);
        prompt_xc_print("decode", &d);
        if (e->xc->copy_layer) {
            fprintf(stderr, "[ringlm] repacked copy %s: %llu experts there when opened, %llu read from it, %llu added\n",
                    e->xc->copy.path, (unsigned long long)e->xc->copy.n_have, (unsigned long long)po->xc->from_copy,
                    (unsigned long long)po->xc->copied);
        }
    }
}

int prompt_report_write(const char *path, const gen_metrics *m, cJSON *ring, const spec_metrics *sm,
                        const prompt_out *po, rl_err *err) {
    cJSON *j = cJSON_CreateObject();
    if (po->xc) {
        cJSON *x = prompt_xc_json(po->xc);
        xc_stats d = xc_stats_sub(po->xc, &po->xc_prefill);
        cJSON_AddItemToObject(x, "prefill", prompt_xc_json(&po->xc_prefill));
        cJSON_AddItemToObject(x, "decode", prompt_xc_json(&d));
        cJSON_AddItemToObject(j, "expert_cache", x);
    }
    if (sm) {
        cJSON_AddNumberToObject(j, "acceptance_rate", sm->acceptance_rate);
        cJSON_AddNumberToObject(j, "tokens_per_traversal", sm->tokens_per_traversal);
        cJSON_AddNumberToObject(j, "draft_s", sm->draft_s);
        cJSON_AddNumberToObject(j, "verify_s", sm->verify_s);
        cJSON_AddNumberToObject(j, "traversals", (double)sm->traversals);
        cJSON_AddNumberToObject(j, "drafted", (double)sm->drafted);
        cJSON_AddNumberToObject(j, "accepted", (double)sm->accepted);
        cJSON_AddNumberToObject(j, "cancelled", (double)sm->cancelled);
        cJSON_AddNumberToObject(j, "fallbacks", (double)sm->fallbacks);
        cJSON_AddNumberToObject(j, "paused_steps", (double)sm->paused_steps);
        cJSON_AddNumberToObject(j, "blocks", (double)sm->blocks);
        cJSON_AddNumberToObject(j, "mean_block_drafts", sm->blocks ? (double)sm->sent_drafts / (double)sm->blocks : 0.0);
        cJSON_AddNumberToObject(j, "mean_depth", sm->blocks ? (double)sm->depth_sum / (double)sm->blocks : 0.0);
        cJSON_AddNumberToObject(j, "max_depth", sm->depth_max);
        char dg[17];
        snprintf(dg, sizeof dg, "%016llx", (unsigned long long)sm->draft_digest);
        cJSON_AddStringToObject(j, "draft_digest", dg);
    }
    if (ring) cJSON_AddItemToObject(j, "ring", ring);
    cJSON_AddNumberToObject(j, "prompt_tokens", m->prompt_tokens);
    cJSON_AddNumberToObject(j, "generated_tokens", m->generated_tokens);
    cJSON_AddNumberToObject(j, "prefill_tok_s", m->prefill_tok_s);
    cJSON_AddNumberToObject(j, "ttft_s", m->ttft_s);
    cJSON_AddNumberToObject(j, "decode_tok_s", m->decode_tok_s);
    cJSON_AddNumberToObject(j, "peak_rss_bytes", (double)m->peak_rss_bytes);
    if (m->compute_bytes) cJSON_AddNumberToObject(j, "compute_bytes", (double)m->compute_bytes);
    cJSON_AddStringToObject(j, "stop_reason", m->stop_reason ? m->stop_reason : "");
    char *s = cJSON_Print(j);
    cJSON_Delete(j);
    FILE *f = s ? fopen(path, "w") : NULL;
    int rc = 0;
    if (!f || fputs(s, f) < 0 || fputc('\n', f) == EOF) rc = rl_errf(err, "cannot write %s", path);
    if (f && fclose(f) != 0) rc = rl_errf(err, "cannot write %s", path);
    free(s);
    return rc;
}
