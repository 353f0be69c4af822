/* Folder src/cli/: the ringlm subcommands: argument parsing and wiring only. May include: any folder. (README
 * "Layout"; tests/t_layout.sh checks both.)
 */
/* cli.h - `ringlm` subcommands. Each takes argc/argv after the subcommand name and returns the exit code.
 * This folder parses arguments and wires the layers below together; it holds no logic of its own. */
#ifndef RINGLM_CLI_H
#define RINGLM_CLI_H

#include <stdbool.h>
#include <stddef.h>

#include "../base/err.h"

int cmd_synth(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_compare(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_keygen(int argc, char **argv);
int cmd_join_token(int argc, char **argv);
int cmd_devices(int argc, char **argv);
int cmd_node(int argc, char **argv);
int cmd_relay(int argc, char **argv);
int cmd_receipts(int argc, char **argv);
int cmd_reap(int argc, char **argv);
int cmd_manifest(int argc, char **argv);
int cmd_plan(int argc, char **argv);

/* Helpers shared by the commands. */
int cli_parse_u64(const char *s, unsigned long long *out); /* 0 on success */
int cli_parse_int(const char *s, int *out);
int cli_parse_double(const char *s, double *out);

struct ring_trust;
/* Options of run and serve that only a ring has (ring_trust, coord/coord.h): --receipts FILE, --audit-rate R,
 * --audit-seed S, --audit-tol T, and --node-timeout S. 1 when option a is one of them (its value v parsed into
 * t; *bad set if v is invalid), else 0. */
int cli_parse_trust(const char *a, const char *v, struct ring_trust *t, int *bad);

struct k3_engine_opts;
/* The engine's options with a value, shared by run, serve, node and logits: --flash-attn on|off|auto,
 * --cache-type f32|f16, --mem GB, --device NAME, --gpu-layers N (-ngl N).
 * Returns 1 if `a` is one of them (*bad and *want then say whether v was good and what it should be). */
int cli_parse_engine(const char *a, const char *v, struct k3_engine_opts *eo, int *bad, const char **want);
/* The engine's flags (no value): --no-repack, --cpu-moe. Returns 1 if `a` is one of them (and sets it). */
int cli_engine_flag(const char *a, struct k3_engine_opts *eo);

/* Says on stderr what is wrong with an option, in one line, and returns 2 (bad usage): an unknown
 * option, a missing value, or a value that is not `want` (NULL: the trust options' own expectations). */
int cli_bad_option(const char *cmd, const char *opt, const char *v, bool known, const char *want);
/* 0, or 2 after saying on stderr that they need a ring (cmd names the command). */
int cli_trust_check(const struct ring_trust *t, int have_ring, const char *cmd);

#endif
