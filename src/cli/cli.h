/* cli.h - `ringlm` subcommands. Each takes argc/argv after the subcommand name and returns the exit code.
 * This folder parses arguments and wires the layers below together; it holds no logic of its own. */
#ifndef RINGLM_CLI_H
#define RINGLM_CLI_H

int cmd_synth(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_compare(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_keygen(int argc, char **argv);
int cmd_node(int argc, char **argv);
int cmd_relay(int argc, char **argv);
int cmd_receipts(int argc, char **argv);

/* Helpers shared by the commands. */
int cli_parse_u64(const char *s, unsigned long long *out); /* 0 on success */
int cli_parse_int(const char *s, int *out);

#endif
