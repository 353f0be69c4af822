/* test_reap - REAP's statistics, choice and scores file (src/prune/reap.h) on hand-made routing, with a
 * known answer for each, and every error path of the scores file's reader and of --protect. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../src/prune/reap.h"
#include "check.h"

/* 4 experts, top-2, layers 1..2 MoE (layer 0 dense). */
static k3_hparams hp4(void) {
    k3_hparams hp;
    memset(&hp, 0, sizeof hp);
    hp.n_layer = 3;
    hp.n_dense_lead = 1;
    hp.n_expert = 4;
    hp.n_expert_used = 2;
    return hp;
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
}

/* Reads a scores file written from `text`; returns the reader's status and its message in msg. */
static int read_text(const char *dir, const char *text, char *msg, size_t cap) {
    char path[512];
    snprintf(path, sizeof path, "%s/s.json", dir);
    write_file(path, text);
    reap_stats s;
    rl_err err = {0};
    int rc = reap_stats_read_json(&s, path, &err);
    snprintf(msg, cap, "%s", rc ? err.msg : "");
    if (rc == 0) reap_stats_free(&s);
    return rc;
}

int main(void) {
    k3_hparams hp = hp4();
    reap_stats s;
    rl_err err = {0};
    CHECK(reap_stats_init(&s, &hp, 0, 3, &err) == 0 && s.layer0 == 1 && s.n_layers == 2, "stats cover the MoE layers 1..2");

    /* Two tokens through both layers: layer 1 routes to (0, 1) then (0, 2); layer 2 to (3, 1) twice. */
    int32_t ids[8] = {0, 1, 0, 2, 3, 1, 3, 1};
    float w[8] = {0.5f, 0.5f, 0.25f, 0.75f, 1.0f, 0.0f, 0.5f, 0.5f};
    float nm[8] = {2, 4, 8, 1, 3, 5, 1, 1};
    k3_routes r = {.n_layers = 2, .layer0 = 1, .n_tokens = 2, .k = 2, .ids = ids, .weight = w, .norm = nm};
    CHECK(reap_stats_add(&s, &r, &err) == 0 && s.tokens == 2, "a batch's routing is added");
    /* S = mean of g * ||f||: layer 1 expert 0: (0.5*2 + 0.25*8) / 2 = 1.5; expert 1: 0.5*4 = 2; expert 2:
     * 0.75; expert 3: never routed, 0. Layer 2 expert 3: (3 + 0.5) / 2 = 1.75; expert 1: (0 + 0.5) / 2. */
    CHECK(reap_score(&s, 0, 0, false) == 1.5 && reap_score(&s, 0, 1, false) == 2.0 && reap_score(&s, 0, 2, false) == 0.75 &&
              reap_score(&s, 0, 3, false) == 0.0, "layer 1's means: 1.5, 2, 0.75, 0");
    CHECK(reap_score(&s, 1, 3, false) == 1.75 && reap_score(&s, 1, 1, false) == 0.25 && reap_score(&s, 1, 3, true) == 3.5,
          "layer 2's mean and (--frequency) sum");

    /* A ring stage's part (layer 2 only) adds its layer and does not count the tokens again. */
    k3_routes part = {.n_layers = 1, .layer0 = 2, .n_tokens = 2, .k = 2, .ids = ids + 4, .weight = w + 4, .norm = nm + 4};
    CHECK(reap_stats_add(&s, &part, &err) == 0 && s.tokens == 2 && s.count[1 * 4 + 3] == 4, "a stage's layers add alone");
    k3_routes out = {.n_layers = 1, .layer0 = 3, .n_tokens = 2, .k = 2, .ids = ids, .weight = w, .norm = nm};
    CHECK(reap_stats_add(&s, &out, &err) != 0 && strstr(err.msg, "does not fit"), "routing of a layer outside: %s", err.msg);
    int32_t bad_ids[4] = {0, 9, 0, 1};
    k3_routes bad = {.n_layers = 1, .layer0 = 1, .n_tokens = 2, .k = 2, .ids = bad_ids, .weight = w, .norm = nm};
    CHECK(reap_stats_add(&s, &bad, &err) != 0 && strstr(err.msg, "expert 9"), "an expert id out of range: %s", err.msg);
    reap_stats_free(&s);

    /* Choice: fresh statistics of the first batch only. */
    reap_stats_init(&s, &hp, 0, 3, &err);
    reap_stats_add(&s, &r, &err);
    reap_plan p;
    CHECK(reap_plan_make(&p, &s, 2, false, NULL, &err) == 0 && p.keep[0] == 0 && p.keep[1] == 1 && p.keep[2] == 1 &&
              p.keep[3] == 3, "keep 2: layer 1 {0, 1}, layer 2 {1, 3} (kept ids ascending)");
    reap_plan_free(&p);
    /* Layer 2's experts 0 and 2 tie at 0 with count 0: with 3 kept the lower id stays. */
    CHECK(reap_plan_make(&p, &s, 3, false, NULL, &err) == 0 && p.keep[3] == 0 && p.keep[4] == 1 && p.keep[5] == 3,
          "ties at score 0 and count 0 keep the lower id");
    reap_plan_free(&p);
    uint8_t prot[8] = {0, 0, 0, 1, 0, 0, 0, 0}; /* layer 1 expert 3 */
    CHECK(reap_plan_make(&p, &s, 2, false, prot, &err) == 0 && p.keep[0] == 1 && p.keep[1] == 3,
          "a protected expert is kept over a better one");
    reap_plan_free(&p);
    CHECK(reap_plan_make(&p, &s, 1, false, NULL, &err) != 0 && strstr(err.msg, "fewer than the 2"), "keep < k: %s", err.msg);
    CHECK(reap_plan_make(&p, &s, 5, false, NULL, &err) != 0 && strstr(err.msg, "the model has 4"), "keep > E: %s", err.msg);
    uint8_t prot3[8] = {1, 1, 1, 0, 0, 0, 0, 0};
    CHECK(reap_plan_make(&p, &s, 2, false, prot3, &err) != 0 && strstr(err.msg, "3 experts protected"), "%s", err.msg);
    CHECK(reap_plan_all(&p, &hp, &err) == 0 && p.n_keep == 4 && p.keep[7] == 3, "keep all: every id of every layer");
    reap_plan_free(&p);

    /* --protect */
    uint8_t *fl = NULL;
    CHECK(reap_protect_parse("3,2:1", &s, &fl, &err) == 0 && fl[3] && fl[4 + 3] && fl[4 + 1] && !fl[1], "--protect 3,2:1");
    free(fl);
    const char *bad_lists[][2] = {{"x", "bad list"}, {"1,", "bad list"}, {"4", "experts 0..3"}, {"0:1", "not a MoE layer"},
                                  {"3:1", "not a MoE layer"}, {"1:-1", "expert -1"}, {"1;2", "bad list"}};
    for (size_t i = 0; i < sizeof bad_lists / sizeof *bad_lists; i++) {
        int rc = reap_protect_parse(bad_lists[i][0], &s, &fl, &err);
        CHECK(rc != 0 && fl == NULL && strstr(err.msg, bad_lists[i][1]), "--protect '%s': %s", bad_lists[i][0], err.msg);
    }

    /* The scores file: written and read back exactly, then every way a file can be wrong. */
    char dir[] = "/tmp/test_reap_XXXXXX", path[600];
    if (!mkdtemp(dir)) return 1;
    snprintf(path, sizeof path, "%s/scores.json", dir);
    s.sum_gn[1] = 1.0 / 3.0; /* a value that needs all 17 digits */
    CHECK(reap_stats_write_json(&s, "m.gguf", path, &err) == 0, "scores written");
    reap_stats t;
    CHECK(reap_stats_read_json(&t, path, &err) == 0 && t.layer0 == 1 && t.n_layers == 2 && t.tokens == 2 && t.k == 2 &&
              memcmp(t.sum_gn, s.sum_gn, 8 * sizeof(double)) == 0 && memcmp(t.count, s.count, 8 * sizeof(uint64_t)) == 0 &&
              memcmp(t.sum_g, s.sum_g, 8 * sizeof(double)) == 0 && memcmp(t.sum_n, s.sum_n, 8 * sizeof(double)) == 0,
          "read back bit for bit (sums, counts, layers, tokens)");
    reap_stats_free(&t);
    char msg[600];
    const char *L = "{\"layer\": 1, \"count\": [1,1,0,0], \"sum_gate_norm\": [1,1,0,0], \"sum_gate\": [1,1,0,0], \"sum_norm\": [1,1,0,0]}";
    char good[1024];
    snprintf(good, sizeof good, "{\"format\": \"ringlm-reap-scores-1\", \"n_expert\": 4, \"n_expert_used\": 2, \"tokens\": 1, \"layers\": [%s]}", L);
    CHECK(read_text(dir, good, msg, sizeof msg) == 0, "a minimal hand-written file reads");
    struct { const char *text, *want; } cases[] = {
        {"not json", "not a ringlm reap scores file"},
        {"{\"format\": \"other\"}", "not a ringlm reap scores file"},
        {"{\"format\": \"ringlm-reap-scores-1\", \"n_expert\": 0, \"n_expert_used\": 2, \"tokens\": 1, \"layers\": [1]}", "bad n_expert"},
        {"{\"format\": \"ringlm-reap-scores-1\", \"n_expert\": 4, \"n_expert_used\": 5, \"tokens\": 1, \"layers\": [1]}", "bad n_expert"},
        {"{\"format\": \"ringlm-reap-scores-1\", \"n_expert\": 4, \"n_expert_used\": 2, \"tokens\": 1, \"layers\": []}", "bad n_expert"},
        {"{\"format\": \"ringlm-reap-scores-1\", \"n_expert\": 4, \"n_expert_used\": 2, \"tokens\": 1, \"layers\": "
         "[{\"layer\": 1, \"count\": [1,1,0], \"sum_gate_norm\": [1,1,0,0], \"sum_gate\": [1,1,0,0], \"sum_norm\": [1,1,0,0]}]}",
         "must be 4 numbers"},
        {"{\"format\": \"ringlm-reap-scores-1\", \"n_expert\": 4, \"n_expert_used\": 2, \"tokens\": 1, \"layers\": "
         "[{\"layer\": 1, \"count\": [1,1,0,0], \"sum_gate_norm\": [1,-1,0,0], \"sum_gate\": [1,1,0,0], \"sum_norm\": [1,1,0,0]}]}",
         "must be 4 numbers >= 0"},
        {"{\"format\": \"ringlm-reap-scores-1\", \"n_expert\": 4, \"n_expert_used\": 2, \"tokens\": 1, \"layers\": "
         "[{\"layer\": 1, \"count\": [1.5,1,0,0], \"sum_gate_norm\": [1,1,0,0], \"sum_gate\": [1,1,0,0], \"sum_norm\": [1,1,0,0]}]}",
         "not a whole number"},
        {"{\"format\": \"ringlm-reap-scores-1\", \"n_expert\": 4, \"n_expert_used\": 2, \"tokens\": 1, \"layers\": "
         "[{\"layer\": 1, \"count\": [3,1,0,0], \"sum_gate_norm\": [1,1,0,0], \"sum_gate\": [1,1,0,0], \"sum_norm\": [1,1,0,0]}]}",
         "not a whole number of routed tokens"},
        {"{\"format\": \"ringlm-reap-scores-1\", \"n_expert\": 4, \"n_expert_used\": 2, \"tokens\": 1, \"layers\": "
         "[{\"layer\": 1, \"count\": [1,1,0,0], \"sum_gate_norm\": [1,1,0,0], \"sum_gate\": [1,1,0,0], \"sum_norm\": [1,1,0,0]},"
         " {\"layer\": 3, \"count\": [1,1,0,0], \"sum_gate_norm\": [1,1,0,0], \"sum_gate\": [1,1,0,0], \"sum_norm\": [1,1,0,0]}]}",
         "is not 1 more than the first"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int rc = read_text(dir, cases[i].text, msg, sizeof msg);
        CHECK(rc != 0 && strstr(msg, cases[i].want), "bad scores file %zu refused: %s", i, msg);
    }
    snprintf(path, sizeof path, "%s/none.json", dir);
    CHECK(reap_stats_read_json(&t, path, &err) != 0 && strstr(err.msg, "cannot open scores file"), "%s", err.msg);
    snprintf(path, sizeof path, "%s/no/such/dir.json", dir);
    CHECK(reap_stats_write_json(&s, "m", path, &err) != 0 && strstr(err.msg, "cannot create"), "%s", err.msg);
    reap_stats_free(&s);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) return 1;

    /* A range without MoE layers has no statistics and nothing to prune. */
    CHECK(reap_stats_init(&s, &hp, 0, 1, &err) == 0 && s.n_layers == 0, "a dense range: no layers");
    CHECK(reap_plan_make(&p, &s, 2, false, NULL, &err) != 0 && strstr(err.msg, "no MoE layer"), "%s", err.msg);
    reap_stats_free(&s);
    return check_done();
}
