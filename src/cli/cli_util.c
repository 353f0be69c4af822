#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <limits.h>
#include <stdlib.h>

#include "../model/k3_forward.h"
#include "../coord/coord.h"
#include "cli.h"

int cli_parse_u64(const char *s, unsigned long long *out) {
    if (!s || !*s || *s == '-') return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || *end) return -1;
    *out = v;
    return 0;
}

int cli_parse_int(const char *s, int *out) {
    if (!s || !*s) return -1;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < INT_MIN || v > INT_MAX) return -1;
    *out = (int)v;
    return 0;
}

int cli_parse_double(const char *s, double *out) {
    if (!s || !*s) return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end) return -1;
    *out = v;
    return 0;
}

int cli_engine_flag(const char *a, k3_engine_opts *eo) {
    if (strcmp(a, "--no-repack") == 0) {
        eo->no_repack = true;
    } else if (strcmp(a, "--cpu-moe") == 0 || strcmp(a, "-cmoe") == 0) {
        eo->n_cpu_moe = UINT32_MAX; /* every layer's routed experts in RAM */
    } else {
        return 0;
    }
    return 1;
}

int cli_parse_engine(const char *a, const char *v, k3_engine_opts *eo, int *bad, const char **want) {
    if (strcmp(a, "--flash-attn") == 0) {
        /* auto: llama.cpp's default, flash attention wherever the device runs it - every CPU does. */
        *bad = strcmp(v, "on") && strcmp(v, "off") && strcmp(v, "auto"), *want = "on, off or auto";
        eo->no_flash_attn = strcmp(v, "off") == 0;
        eo->flash_attn_on = strcmp(v, "on") == 0;
    } else if (strcmp(a, "--mem") == 0) {
        /* A budget for resident weights; past it routed experts are read from the file (expert_cache.h). */
        double gb = 0;
        *bad = cli_parse_double(v, &gb) || !(gb > 0 && gb < 1e6), *want = "gigabytes above 0";
        eo->mem_bytes = *bad ? 0 : (size_t)(gb * 1073741824.0);
    } else if (strcmp(a, "--expert-copy") == 0) {
        /* A folder for the repacked copy of the experts the cache reads (expert_copy.h). */
        *bad = !*v, *want = "a folder";
        eo->expert_copy = v;
    } else if (strcmp(a, "--vram") == 0) {
        /* The device memory the weights may take (less than the device has free: room for other programs). */
        double gb = 0;
        *bad = cli_parse_double(v, &gb) || !(gb > 0 && gb < 1e6), *want = "gigabytes above 0";
        eo->vram_bytes = *bad ? 0 : (size_t)(gb * 1073741824.0);
    } else if (strcmp(a, "--device") == 0) {
        /* By ggml's names (`ringlm devices`), comma-separated; checked when the engine starts, which lists them. */
        *bad = !*v || v[0] == ',' || v[strlen(v) - 1] == ',' || strstr(v, ",,") != NULL,
        *want = "device names, comma-separated (ringlm devices lists them)";
        eo->device = v;
    } else if (strcmp(a, "--gpu-layers") == 0 || strcmp(a, "-ngl") == 0) {
        int n = -1;
        *bad = cli_parse_int(v, &n) || n < 0, *want = "a number of layers, 0 or more";
        eo->gpu_layers_set = !*bad;
        eo->gpu_layers = *bad ? 0 : (uint32_t)n;
    } else if (strcmp(a, "--n-cpu-moe") == 0 || strcmp(a, "-ncmoe") == 0) {
        int n = -1;
        *bad = cli_parse_int(v, &n) || n < 0, *want = "a number of layers, 0 or more";
        eo->n_cpu_moe = *bad ? 0 : (uint32_t)n;
    } else if (strcmp(a, "--cache-type") == 0) {
        *bad = strcmp(v, "f32") && strcmp(v, "f16"), *want = "f32 or f16";
        eo->cache_f32 = strcmp(v, "f32") == 0;
    } else {
        return 0;
    }
    return 1;
}

static const char *cli_trust_want(const char *a) {
    if (strcmp(a, "--audit-rate") == 0) return "a probability, 0 to 1";
    if (strcmp(a, "--audit-tol") == 0 || strcmp(a, "--audit-tol-arch") == 0) return "a relative tolerance above 0";
    if (strcmp(a, "--audit-seed") == 0) return "a non-negative integer";
    if (strcmp(a, "--node-timeout") == 0) return "seconds, 0.5 to 86400";
    if (strcmp(a, "--link-timeout") == 0) return "seconds, 0.1 to 600";
    return NULL;
}

int cli_bad_option(const char *cmd, const char *opt, const char *v, bool known, const char *want) {
    if (!known) {
        fprintf(stderr, "ringlm %s: unknown option '%s' (ringlm %s --help lists them)\n", cmd, opt, cmd);
    } else if (!v) {
        fprintf(stderr, "ringlm %s: option %s needs a value\n", cmd, opt);
    } else {
        if (!want) want = cli_trust_want(opt);
        fprintf(stderr, "ringlm %s: bad value '%s' for %s%s%s\n", cmd, v, opt, want ? ": want " : "", want ? want : "");
    }
    return 2;
}

int cli_parse_trust(const char *a, const char *v, ring_trust *t, int *bad) {
    if (strcmp(a, "--receipts") == 0) {
        t->receipts = v;
    } else if (strcmp(a, "--audit-rate") == 0) {
        *bad = cli_parse_double(v, &t->audit_rate) || !(t->audit_rate >= 0 && t->audit_rate <= 1);
    } else if (strcmp(a, "--audit-tol") == 0) {
        *bad = cli_parse_double(v, &t->audit_tol) || !(t->audit_tol > 0);
    } else if (strcmp(a, "--audit-tol-arch") == 0) {
        *bad = cli_parse_double(v, &t->audit_tol_arch) || !(t->audit_tol_arch > 0);
    } else if (strcmp(a, "--audit-seed") == 0) {
        *bad = cli_parse_u64(v, &t->audit_seed) != 0;
    } else if (strcmp(a, "--node-timeout") == 0) {
        *bad = cli_parse_double(v, &t->node_timeout) || !(t->node_timeout >= 0.5 && t->node_timeout <= 86400);
    } else if (strcmp(a, "--relay-listen") == 0) {
        t->relay_listen = v;
    } else if (strcmp(a, "--link-timeout") == 0) {
        *bad = cli_parse_double(v, &t->link_timeout) || !(t->link_timeout >= 0.1 && t->link_timeout <= 600);
    } else {
        return 0;
    }
    return 1;
}

int cli_trust_check(const ring_trust *t, int have_ring, const char *cmd) {
    if (have_ring || (!t->receipts && t->audit_rate <= 0 && t->node_timeout <= 0 && t->link_timeout <= 0 && !t->relay_listen)) return 0;
    if (t->relay_listen) {
        fprintf(stderr, "ringlm %s: --relay-listen is for a ring (--ring): its nodes behind NATs dial out to it\n", cmd);
    } else if (t->node_timeout > 0 || t->link_timeout > 0) {
        fprintf(stderr, "ringlm %s: --%s-timeout is for a ring (--ring): one machine waits on no node\n", cmd,
                t->node_timeout > 0 ? "node" : "link");
    } else {
        fprintf(stderr, "ringlm %s: --receipts and --audit-rate are for a ring (--ring): one machine signs nothing\n", cmd);
    }
    return 2;
}
