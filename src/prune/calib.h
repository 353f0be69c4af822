/* calib.h - text for calibration and evaluation, as token sequences.
 *
 * A file is plain text, or JSONL when its first non-blank character is '{': one JSON object per line,
 * {"messages": [{"role": ..., "content": ...}, ...]} rendered with the model's chat template (as a whole
 * conversation, no generation prompt) or {"text": "..."} taken as it is. Plain text is one document; each
 * JSONL line is one. A document is cut into sequences of at most ctx tokens, each run from an empty state. */
#ifndef RINGLM_CALIB_H
#define RINGLM_CALIB_H

#include <stddef.h>
#include <stdint.h>

#include "../base/err.h"
#include "../text/chat.h"
#include "../text/tokenizer.h"

typedef struct calib_set {
    int32_t *ids;   /* every sequence's tokens, one after another */
    size_t n_ids;
    size_t *start;  /* [n_seq] offsets into ids */
    uint32_t *len;  /* [n_seq] */
    int n_seq;
} calib_set;

/* Reads files[0..n_files) (`what` names them in errors: "calibration", "held-out") into sequences of at most ctx tokens (>= 2), stopping at max_tokens (0: no
 * limit). fmt: the model's chat format (NULL: its template is not one ringlm renders, and chat lines are
 * refused). A missing or unreadable file, a malformed JSONL line (named by line number) or no tokens at all
 * is an error. */
int calib_load(calib_set *c, const char *what, const char *const *files, int n_files, const tok_tokenizer *tok,
               const chat_format *fmt, uint32_t ctx, size_t max_tokens, rl_err *err);
void calib_free(calib_set *c);

#endif
