/* ringlm - run Kimi K3 across a ring of machines. git-style subcommands. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml.h"

#include "cli.h"

#define RINGLM_VERSION "0.1.0"

typedef struct cli_cmd {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
} cli_cmd;

static const cli_cmd cli_cmds[] = {
    {"run", cmd_run, "generate text from a prompt on this machine"},
    {"serve", cmd_serve, "serve an OpenAI-compatible HTTP API (continuous batching)"},
    {"node", cmd_node, "serve a share of a model to a trusted coordinator"},
    {"keygen", cmd_keygen, "make a node or coordinator identity"},
    {"join-token", cmd_join_token, "make a one-line join for a node behind a NAT"},
    {"devices", cmd_devices, "list the devices this machine can compute on (CPU, GPUs) with their memory"},
    {"synth", cmd_synth, "write a kimi-k3 GGUF with seeded random weights"},
    {"inspect", cmd_inspect, "print a model file's architecture, sizes and memory needs"},
    {"compare", cmd_compare, "compare two logits files (ours and llama.cpp's)"},
    {"logits", cmd_logits, "write the logits of a token sequence (same format as the oracle)"},
    {"tokenize", cmd_tokenize, "print the token ids of a text"},
    {"relay", cmd_relay, "forward TCP with added delay and a bandwidth cap (tests, benchmarks)"},
    {"reap", cmd_reap, "prune routed experts by REAP saliency (router-weighted expert activation)"},
    {"plan", cmd_plan, "ask a ring's nodes what they offer and print the plan (and the split files each stage needs)"},
    {"manifest", cmd_manifest, "write a model's manifest (metadata, tensor table, hashes) or print a range hash"},
    {"receipts", cmd_receipts, "verify a log of signed receipts against the model and ring.conf"},
};

/* ggml's own log: warnings and errors reach stderr, its debug and info chatter (one line per repacked
 * tensor, for instance) does not. CONT lines continue the previous line at its level. */
static void ggml_log_filter(enum ggml_log_level level, const char *text, void *user) {
    enum ggml_log_level *last = user;
    if (level != GGML_LOG_LEVEL_CONT) *last = level;
    if (*last == GGML_LOG_LEVEL_WARN || *last == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

/* RINGLM_GGML_LOG=all: every line of ggml's log (the scheduler's splits with GGML_SCHED_DEBUG, say). */
static void ggml_log_all(enum ggml_log_level level, const char *text, void *user) {
    (void)level, (void)user;
    fputs(text, stderr);
}

static void usage(FILE *f) {
    fprintf(f, "ringlm %s - Kimi K3 across a ring of machines\n\nusage: ringlm <command> [options]\n\n", RINGLM_VERSION);
    for (size_t i = 0; i < sizeof cli_cmds / sizeof cli_cmds[0]; i++) {
        fprintf(f, "  %-10s %s\n", cli_cmds[i].name, cli_cmds[i].help);
    }
    fprintf(f, "\n`ringlm <command> --help` describes each command.\n");
}

int main(int argc, char **argv) {
    enum ggml_log_level ggml_last = GGML_LOG_LEVEL_NONE;
    const char *lg = getenv("RINGLM_GGML_LOG");
    if (lg && strcmp(lg, "all") == 0) ggml_log_set(ggml_log_all, NULL);
    else ggml_log_set(ggml_log_filter, &ggml_last);
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "version") == 0) {
        printf("ringlm %s\n", RINGLM_VERSION);
        return 0;
    }
    for (size_t i = 0; i < sizeof cli_cmds / sizeof cli_cmds[0]; i++) {
        if (strcmp(argv[1], cli_cmds[i].name) == 0) return cli_cmds[i].run(argc - 1, argv + 1);
    }
    fprintf(stderr, "ringlm: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
