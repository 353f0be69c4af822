/* logits_file.h - the logits file shared by `ringlm logits` and the llama.cpp oracle (tests/oracle).
 *
 * One format for both, so one comparison (`ringlm compare`) serves every test. Layout:
 *
 *   RINGLM-LOGITS 1\n
 *   source <word>\n            who wrote it: "ringlm" or "llama.cpp"
 *   mode <batch|step>\n        all positions in one decode call, or one token per decode call
 *   n_vocab <V>\n
 *   n_rows <R>\n               one row per input position, in order
 *   tokens <t0,t1,...>\n       the R input token ids
 *   end\n
 *   <R * V little-endian f32>  row r = logits after the token at position r
 *
 * Text lines are at most 1 MiB in all; the payload size must be exactly R*V*4 bytes. */
#ifndef RINGLM_LOGITS_FILE_H
#define RINGLM_LOGITS_FILE_H

#include <stdint.h>

#include "../base/err.h"

typedef struct lf_header {
    char source[32];
    char mode[16];
    int32_t n_vocab;
    int32_t n_rows;
    int32_t *tokens; /* n_rows ids; owned by the header after lf_read */
} lf_header;

int lf_write(const char *path, const lf_header *h, const float *logits, rl_err *err);

/* Reads a whole file. On success *logits is malloc'ed (n_rows*n_vocab floats) and h->tokens too;
 * free both with lf_free. */
int lf_read(const char *path, lf_header *h, float **logits, rl_err *err);
void lf_free(lf_header *h, float *logits);

#endif
