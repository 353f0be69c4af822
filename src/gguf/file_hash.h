/* file_hash.h - content hashes of model files, so a node can prove it holds the coordinator's model.
 *
 * BLAKE2b-256 of the whole file (of every member, in order, for a split set), in hex. Hashing a large
 * file takes seconds, so the result is cached beside it in FILE.ringlm-hash, keyed by size and mtime. */
#ifndef RINGLM_FILE_HASH_H
#define RINGLM_FILE_HASH_H

#include "../base/err.h"
#include "model_file.h"

int fh_model_hash(const mf_model *m, char hex[65], rl_err *err);

#endif
