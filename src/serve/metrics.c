/* metrics.c - GET /health (the served model, its slots and every node) and GET /metrics (Prometheus text:
 * requests by endpoint and status, tokens, latencies, speculation, the expert cache, nodes, audits). */
#include "http_int.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum MHD_Result http_health(http_conn *hc, struct MHD_Connection *c) {
    http_server *h = hc->h;
    sch_metrics m;
    sch_metrics_get(h->s, &m);
    pthread_mutex_lock(&h->mu);
    bool closing = h->closing;
    pthread_mutex_unlock(&h->mu);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "status", closing ? "shutting_down" : "ok");
    cJSON_AddStringToObject(j, "model", h->names[0]);
    cJSON_AddStringToObject(j, "backend", m.backend ? m.backend : "");
    cJSON *sl = cJSON_AddObjectToObject(j, "slots");
    cJSON_AddNumberToObject(sl, "total", m.n_slots);
    cJSON_AddNumberToObject(sl, "active", m.active);
    cJSON_AddNumberToObject(sl, "queued", m.queued);
    cJSON_AddNumberToObject(sl, "queue_capacity", m.queue_cap);
    cJSON_AddNumberToObject(sl, "context", h->n_ctx);
    if (m.backend && strcmp(m.backend, "ring") == 0) {
        cJSON *r = cJSON_AddObjectToObject(j, "ring");
        cJSON_AddNumberToObject(r, "generation", (double)m.ring.generation);
        cJSON_AddNumberToObject(r, "recoveries", (double)m.ring.recoveries);
    }
    cJSON *nodes = cJSON_AddArrayToObject(j, "nodes");
    for (int i = 0; i < m.n_nodes; i++) {
        cJSON *n = cJSON_CreateObject();
        cJSON_AddStringToObject(n, "name", m.nodes[i].name);
        cJSON_AddStringToObject(n, "addr", m.nodes[i].addr);
        cJSON *l = cJSON_AddArrayToObject(n, "layers");
        cJSON_AddItemToArray(l, cJSON_CreateNumber(m.nodes[i].layer_a));
        cJSON_AddItemToArray(l, cJSON_CreateNumber(m.nodes[i].layer_b));
        cJSON_AddStringToObject(n, "status", m.nodes[i].faulty ? "faulty" : m.nodes[i].up ? "up" : "down");
        /* its part: a stage of the ring that is open, or a standby (up, in no stage), or down / faulty */
        const sch_node_stat *ns = &m.nodes[i];
        cJSON_AddStringToObject(n, "role", ns->faulty ? "faulty" : !ns->up ? "down" : ns->stage >= 0 ? "stage" : "standby");
        if (ns->up && !ns->faulty && ns->stage >= 0) cJSON_AddNumberToObject(n, "stage", ns->stage);
        cJSON_AddStringToObject(n, "reach", ns->reach); /* direct, dial-out, relayed (docs/ring.md, "Behind a NAT") */
        if (ns->relay[0]) cJSON_AddStringToObject(n, "relay", ns->relay);
        if (m.nodes[i].faulty) cJSON_AddStringToObject(n, "fault", m.nodes[i].fault);
        if (m.nodes[i].audits) cJSON_AddNumberToObject(n, "audits", (double)m.nodes[i].audits);
        cJSON_AddItemToArray(nodes, n);
    }
    return http_send_json(hc, c, closing ? 503 : 200, j);
}

/* Prometheus label values escape backslash, quote and newline. */
static void http_label(rl_buf *b, const char *s) {
    for (; *s; s++) {
        if (*s == '\\' || *s == '"') rl_buf_printf(b, "\\%c", *s);
        else if (*s == '\n') rl_buf_add(b, "\\n", 2);
        else rl_buf_add(b, s, 1);
    }
}

/* The start of one node's series: NAME{node="..."[,addr="..."] - the caller adds more labels, "}" and the value. */
static void http_node_series(rl_buf *b, const char *name, const sch_node_stat *n, bool with_addr) {
    rl_buf_printf(b, "%s{node=\"", name);
    http_label(b, n->name);
    if (with_addr) {
        rl_buf_add(b, "\",addr=\"", 8);
        http_label(b, n->addr);
    }
    rl_buf_add(b, "\"", 1);
}

static void http_family(rl_buf *b, const char *name, const char *type, const char *help) {
    rl_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void http_hist(rl_buf *b, const char *name, const char *help, const sch_hist *hs) {
    http_family(b, name, "histogram", help);
    uint64_t cum = 0;
    for (int i = 0; i < hs->n; i++) {
        cum += hs->count[i];
        rl_buf_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, hs->le[i], (unsigned long long)cum);
    }
    cum += hs->count[hs->n];
    rl_buf_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name, (unsigned long long)cum, name,
              hs->sum, name, (unsigned long long)hs->total);
}

enum MHD_Result http_metrics(http_conn *hc, struct MHD_Connection *c) {
    static const char *const ep_names[HTTP_EP_COUNT] = {"/v1/chat/completions", "/v1/completions", "/v1/models",
                                                        "/health", "/metrics", "/", "other"};
    http_server *h = hc->h;
    sch_metrics m;
    sch_metrics_get(h->s, &m);
    int codes[HTTP_MAX_CODES];
    uint64_t counts[HTTP_EP_COUNT][HTTP_MAX_CODES];
    pthread_mutex_lock(&h->mu);
    memcpy(codes, h->codes, sizeof codes);
    memcpy(counts, h->counts, sizeof counts);
    uint64_t header_timeouts = h->header_timeouts;
    pthread_mutex_unlock(&h->mu);

    rl_buf b = {0};
    http_family(&b, "ringlm_http_header_timeouts_total", "counter",
                "Connections closed for sending no complete request headers in time (--header-timeout).");
    rl_buf_printf(&b, "ringlm_http_header_timeouts_total %llu\n", (unsigned long long)header_timeouts);
    http_family(&b, "ringlm_http_requests_total", "counter", "HTTP requests answered, by endpoint and status code.");
    for (int e = 0; e < HTTP_EP_COUNT; e++) {
        for (int i = 0; i < HTTP_MAX_CODES && codes[i]; i++) {
            if (counts[e][i]) {
                rl_buf_printf(&b, "ringlm_http_requests_total{endpoint=\"%s\",status=\"%d\"} %llu\n", ep_names[e], codes[i],
                          (unsigned long long)counts[e][i]);
            }
        }
    }
    http_family(&b, "ringlm_requests_finished_total", "counter", "Generation requests ended, by reason.");
    for (int f = SCH_FIN_STOP; f <= SCH_FIN_ERROR; f++) {
        rl_buf_printf(&b, "ringlm_requests_finished_total{reason=\"%s\"} %llu\n", sch_finish_name((sch_finish)f),
                  (unsigned long long)m.finished[f]);
    }
    http_family(&b, "ringlm_prompt_tokens_total", "counter", "Prompt tokens processed.");
    rl_buf_printf(&b, "ringlm_prompt_tokens_total %llu\n", (unsigned long long)m.prompt_tokens);
    if (m.has_xc) { /* routed experts through a cache (--mem, docs/experts.md) */
        const struct {
            const char *name, *help;
            uint64_t v;
        } xc[] = {
            {"ringlm_expert_needed_total", "Routed experts the routers chose (distinct per layer and step).", m.xc.needed},
            {"ringlm_expert_hits_total", "Of them, resident when their layer asked (read ahead included).", m.xc.hits},
            {"ringlm_expert_loads_total", "Experts read from the file on demand.", m.xc.loads},
            {"ringlm_expert_prefetched_total", "Experts read ahead by the look-ahead router.", m.xc.prefetched},
            {"ringlm_expert_prefetch_used_total", "Of them, chosen by their layer before being evicted.", m.xc.prefetch_used},
            {"ringlm_expert_read_bytes_total", "Bytes of experts read from the file.", m.xc.bytes_read},
            {"ringlm_expert_used_bytes_total", "Bytes of the experts the routers chose.", m.xc.bytes_used},
            {"ringlm_expert_tokens_total", "Tokens run through the layers over the cache.", m.xc.tokens},
        };
        for (size_t i = 0; i < sizeof xc / sizeof xc[0]; i++) {
            http_family(&b, xc[i].name, "counter", xc[i].help);
            rl_buf_printf(&b, "%s %llu\n", xc[i].name, (unsigned long long)xc[i].v);
        }
        http_family(&b, "ringlm_expert_wait_seconds_total", "counter", "Seconds the compute waited for expert reads.");
        rl_buf_printf(&b, "ringlm_expert_wait_seconds_total %.6f\n", m.xc.wait_s);
    }
    http_family(&b, "ringlm_prompt_tokens_shared_total", "counter",
                "Prompt tokens not read again: the choices of an n > 1 request share one reading of the prompt.");
    rl_buf_printf(&b, "ringlm_prompt_tokens_shared_total %llu\n", (unsigned long long)m.prompt_shared);
    if (m.has_cache) { /* the prompt cache (docs/serve.md, "Prompt cache") */
        http_family(&b, "ringlm_prompt_tokens_cached_total", "counter",
                    "Prompt tokens not read again: restored from the prompt cache (usage.prompt_tokens_details.cached_tokens).");
        rl_buf_printf(&b, "ringlm_prompt_tokens_cached_total %llu\n", (unsigned long long)m.prompt_cached);
        const struct { const char *name, *type, *help; double v; } pc[] = {
            {"ringlm_prompt_cache_hits_total", "counter", "Requests that started from a cached prefix.", (double)m.cache_hits},
            {"ringlm_prompt_cache_misses_total", "counter", "Requests that looked for a cached prefix and found none.",
             (double)m.cache_misses},
            {"ringlm_prompt_cache_checkpoints", "gauge", "Checkpoints of recurrent state held in the slots.", (double)m.cache.ckpts},
            {"ringlm_prompt_cache_checkpoint_bytes", "gauge", "Bytes of those checkpoints.", (double)m.cache.ckpt_bytes},
            {"ringlm_prompt_cache_entries", "gauge", "Prefixes held in the host-RAM cache (--cache-ram).", (double)m.cache.entries},
            {"ringlm_prompt_cache_bytes", "gauge", "Bytes the host-RAM cache holds.", (double)m.cache.host_bytes},
            {"ringlm_prompt_cache_budget_bytes", "gauge", "Bytes the host-RAM cache may hold.", (double)m.cache.host_budget},
            {"ringlm_prompt_cache_stored_total", "counter", "Prefixes stored in the host-RAM cache.", (double)m.cache.stored},
            {"ringlm_prompt_cache_evicted_total", "counter", "Prefixes evicted from it for room.", (double)m.cache.evicted},
            {"ringlm_prompt_cache_corrupt_total", "counter", "Prefixes dropped because their checksum failed.", (double)m.cache.corrupt},
            {"ringlm_prompt_cache_exact", "gauge", "1 when a resumed prompt gives the bits of a fresh read (docs/numerics.md).",
             m.cache.exact ? 1.0 : 0.0},
        };
        for (size_t i = 0; i < sizeof pc / sizeof pc[0]; i++) {
            http_family(&b, pc[i].name, pc[i].type, pc[i].help);
            rl_buf_printf(&b, "%s %.0f\n", pc[i].name, pc[i].v);
        }
    }
    http_family(&b, "ringlm_generated_tokens_total", "counter", "Tokens generated.");
    rl_buf_printf(&b, "ringlm_generated_tokens_total %llu\n", (unsigned long long)m.gen_tokens);
    http_hist(&b, "ringlm_time_to_first_token_seconds", "From a request's arrival to its first generated token.",
              &m.ttft);
    http_hist(&b, "ringlm_inter_token_latency_seconds", "Between consecutive generated tokens of one request.", &m.itl);
    http_hist(&b, "ringlm_step_duration_seconds", "One batched forward step (all sequences together).", &m.step_s);
    http_family(&b, "ringlm_spec_draft_seconds_total", "counter", "Seconds the draft model spent drafting.");
    rl_buf_printf(&b, "ringlm_spec_draft_seconds_total %.6f\n", m.draft_s);
    http_family(&b, "ringlm_spec_drafted_tokens_total", "counter", "Speculative draft tokens verified.");
    rl_buf_printf(&b, "ringlm_spec_drafted_tokens_total %llu\n", (unsigned long long)m.drafted);
    http_family(&b, "ringlm_spec_accepted_tokens_total", "counter", "Speculative draft tokens the model kept.");
    rl_buf_printf(&b, "ringlm_spec_accepted_tokens_total %llu\n", (unsigned long long)m.accepted);
    http_family(&b, "ringlm_spec_acceptance_ratio", "gauge", "Accepted / drafted tokens so far (0 without drafts).");
    rl_buf_printf(&b, "ringlm_spec_acceptance_ratio %.6f\n", m.drafted ? (double)m.accepted / (double)m.drafted : 0.0);
    http_family(&b, "ringlm_spec_fallbacks_total", "counter",
                "Times a request's drafts were paused for plain decoding: fewer than 1 in 10 kept over 16 drafted.");
    rl_buf_printf(&b, "ringlm_spec_fallbacks_total %llu\n", (unsigned long long)m.spec_fallbacks);
    http_family(&b, "ringlm_spec_paused_steps_total", "counter", "Decode steps requests took without drafts while paused.");
    rl_buf_printf(&b, "ringlm_spec_paused_steps_total %llu\n", (unsigned long long)m.spec_paused_steps);
    http_family(&b, "ringlm_spec_grammar_refused_tokens_total", "counter",
                "Draft tokens cut before verification because the request's grammar refused them.");
    rl_buf_printf(&b, "ringlm_spec_grammar_refused_tokens_total %llu\n", (unsigned long long)m.draft_refused);
    http_family(&b, "ringlm_steps_total", "counter", "Batched forward steps.");
    rl_buf_printf(&b, "ringlm_steps_total %llu\n", (unsigned long long)m.steps);
    http_family(&b, "ringlm_step_tokens_total", "counter", "Tokens carried by all steps (decode and prefill).");
    rl_buf_printf(&b, "ringlm_step_tokens_total %llu\n", (unsigned long long)m.step_tokens);
    http_family(&b, "ringlm_busy_seconds_total", "counter", "Seconds spent inside forward steps.");
    rl_buf_printf(&b, "ringlm_busy_seconds_total %.6f\n", m.busy_s);
    http_family(&b, "ringlm_sequences_active", "gauge", "Sequences holding a slot (prefilling or generating).");
    rl_buf_printf(&b, "ringlm_sequences_active %d\n", m.active);
    http_family(&b, "ringlm_sequences_queued", "gauge", "Requests waiting for a slot.");
    rl_buf_printf(&b, "ringlm_sequences_queued %d\n", m.queued);
    http_family(&b, "ringlm_sequence_slots", "gauge", "Sequences that can run at once (--parallel).");
    rl_buf_printf(&b, "ringlm_sequence_slots %d\n", m.n_slots);
    http_family(&b, "ringlm_queue_capacity", "gauge", "Requests that may wait for a slot (--queue).");
    rl_buf_printf(&b, "ringlm_queue_capacity %d\n", m.queue_cap);
    http_family(&b, "ringlm_context_tokens", "gauge", "Context capacity of each sequence (--ctx).");
    rl_buf_printf(&b, "ringlm_context_tokens %u\n", h->n_ctx);
    /* Per node / per stage: one machine is one node running stage 0 with every layer; a ring fills in more. */
    int up = 0;
    for (int i = 0; i < m.n_nodes; i++) up += m.nodes[i].up;
    http_family(&b, "ringlm_nodes_up", "gauge", "Nodes answering.");
    rl_buf_printf(&b, "ringlm_nodes_up %d\n", up);
    http_family(&b, "ringlm_nodes_down", "gauge", "Nodes not answering.");
    rl_buf_printf(&b, "ringlm_nodes_down %d\n", m.n_nodes - up);
    if (m.backend && strcmp(m.backend, "ring") == 0) {
        http_family(&b, "ringlm_ring_generation", "gauge", "Rings opened so far (the first, and each one re-formed).");
        rl_buf_printf(&b, "ringlm_ring_generation %llu\n", (unsigned long long)m.ring.generation);
        http_family(&b, "ringlm_ring_recoveries_total", "counter", "Rings re-formed under running requests after a node was lost.");
        rl_buf_printf(&b, "ringlm_ring_recoveries_total %llu\n", (unsigned long long)m.ring.recoveries);
        http_family(&b, "ringlm_ring_recovery_seconds_total", "counter", "Seconds spent re-forming them (re-plan, re-assign).");
        rl_buf_printf(&b, "ringlm_ring_recovery_seconds_total %.6f\n", m.ring.recovery_s);
        http_hist(&b, "ringlm_ring_recovery_seconds", "Each recovery: from the failed step to a re-formed ring.", &m.recovery);
        http_family(&b, "ringlm_ring_replayed_tokens_total", "counter", "Tokens sent again to rebuild sequences on re-formed rings.");
        rl_buf_printf(&b, "ringlm_ring_replayed_tokens_total %llu\n", (unsigned long long)m.ring.replayed);
    }
    http_family(&b, "ringlm_node_up", "gauge", "1 when the node answers, by node.");
    for (int i = 0; i < m.n_nodes; i++) {
        http_node_series(&b, "ringlm_node_up", &m.nodes[i], true);
        rl_buf_printf(&b, ",stage=\"%d\",layers=\"%u-%u\"} %d\n", i, m.nodes[i].layer_a, m.nodes[i].layer_b, m.nodes[i].up);
    }
    http_family(&b, "ringlm_node_reach", "gauge", "1 for how the node is reached (direct, dial-out to this server's relay, relayed by another).");
    for (int i = 0; i < m.n_nodes; i++) {
        http_node_series(&b, "ringlm_node_reach", &m.nodes[i], true);
        rl_buf_add(&b, ",reach=\"", 8);
        http_label(&b, m.nodes[i].reach);
        rl_buf_add(&b, "\",relay=\"", 9);
        http_label(&b, m.nodes[i].relay);
        rl_buf_add(&b, "\"} 1\n", 5);
    }
    http_family(&b, "ringlm_node_role", "gauge", "1 for the node's part now (/health's role: stage, standby, down, faulty).");
    for (int i = 0; i < m.n_nodes; i++) {
        static const char *const roles[4] = {"stage", "standby", "down", "faulty"};
        const sch_node_stat *ns = &m.nodes[i];
        int r = ns->faulty ? 3 : !ns->up ? 2 : ns->stage >= 0 ? 0 : 1;
        for (int k = 0; k < 4; k++) {
            http_node_series(&b, "ringlm_node_role", ns, true);
            rl_buf_printf(&b, ",role=\"%s\"} %d\n", roles[k], k == r);
        }
    }
    http_family(&b, "ringlm_node_faulty", "gauge", "1 when the node was caught lying (receipts or an audit) and left out.");
    for (int i = 0; i < m.n_nodes; i++) {
        http_node_series(&b, "ringlm_node_faulty", &m.nodes[i], true);
        rl_buf_printf(&b, "} %d\n", m.nodes[i].faulty);
    }
    http_family(&b, "ringlm_audits_total", "counter", "Audits of each node (a sequence's frames recomputed).");
    for (int i = 0; i < m.n_nodes; i++) {
        http_node_series(&b, "ringlm_audits_total", &m.nodes[i], false);
        rl_buf_printf(&b, "} %llu\n", (unsigned long long)m.nodes[i].audits);
    }
    http_family(&b, "ringlm_audit_seconds_total", "counter", "Seconds the coordinator spent auditing each node.");
    for (int i = 0; i < m.n_nodes; i++) {
        http_node_series(&b, "ringlm_audit_seconds_total", &m.nodes[i], false);
        rl_buf_printf(&b, "} %.6f\n", m.nodes[i].audit_s);
    }
    http_family(&b, "ringlm_stage_compute_seconds_total", "counter", "Seconds each stage spent computing.");
    for (int i = 0; i < m.n_nodes; i++) {
        rl_buf_printf(&b, "ringlm_stage_compute_seconds_total{stage=\"%d\",node=\"", i);
        http_label(&b, m.nodes[i].name);
        rl_buf_printf(&b, "\"} %.6f\n", m.nodes[i].compute_s);
    }
    http_family(&b, "ringlm_stage_steps_total", "counter", "Forward passes each stage ran.");
    for (int i = 0; i < m.n_nodes; i++) {
        rl_buf_printf(&b, "ringlm_stage_steps_total{stage=\"%d\",node=\"", i);
        http_label(&b, m.nodes[i].name);
        rl_buf_printf(&b, "\"} %llu\n", (unsigned long long)m.nodes[i].steps);
    }
    http_family(&b, "ringlm_info", "gauge", "The served model and backend.");
    rl_buf_add(&b, "ringlm_info{model=\"", 19);
    http_label(&b, h->names[0]);
    rl_buf_printf(&b, "\",backend=\"%s\"} 1\n", m.backend ? m.backend : "");
    if (!b.p) return MHD_NO;
    return http_send(hc, c, 200, "text/plain; version=0.0.4; charset=utf-8", b.p, b.len);
}

