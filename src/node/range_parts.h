/* range_parts.h - a node's layer range put together from parts, under a manifest (docs/ring.md, "Manifest
 * rings"): the split files it holds in --models, the tensors it was streamed before (its store), and the rest
 * pulled from nodes that hold their split files. Every tensor is checked against the manifest's BLAKE2b
 * before it is used: a local one once (the result is remembered, keyed by the file's size and mtime), a
 * streamed one as it arrives (the store keeps only what matched, named by its hash).
 *
 * The holder's side is parts_read: bytes of one of its split files, which it lends to the keys a coordinator
 * names (FRAME_LEND); the fetcher asks for them in pieces (FRAME_PULL), several at a time. */
#ifndef RINGLM_RANGE_PARTS_H
#define RINGLM_RANGE_PARTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/err.h"
#include "../gguf/model_file.h"
#include "../trust/keys.h"
#include "../trust/manifest_file.h"
#include "../net/tunnel.h"

#define PARTS_MAX_HOLDERS 64

typedef struct parts_holder {
    char addr[128];    /* HOST:PORT */
    keys_peer key;
    bool *files;       /* [manifest_file_n_files]: the split files it lends */
} parts_holder;

typedef struct parts_opts {
    const char *models_dir; /* the node's split files (NULL: none) */
    const char *cache_dir;  /* its store (tensors/) and what it verified (verified-tensors) */
    const keys_identity *id;  /* the fetcher's identity, for the links to holders */
    void *zctx;
    tn_connector *tn; /* relayed holders (net/tunnel.h) */
    const parts_holder *holders;
    int n_holders;
    uint64_t ring_id;       /* carried by the PULLs (a holder's errors name it) */
    double timeout_s;       /* a holder silent this long fails the load (0: 60 s) */
    int n_threads;          /* hashing (0: online CPUs, at most 8) */
    const char *log_name;   /* progress lines on stderr start "ringlm node <log_name>: " */
} parts_opts;

typedef struct parts_stats {
    int local, local_checked, stored, pulled; /* tensors: from own split files (checked now), store, pulled */
    uint64_t local_bytes, checked_bytes, pulled_bytes;
} parts_stats;

/* The tensors of layers [a, b) of f's model as a model (gguf/model_file.h mf_compose: the manifest's metadata,
 * each tensor mapped where it was found). Errors name the file and tensor: a local tensor whose bytes differ
 * from the manifest, a tensor no holder lends, a holder that fails or falls silent. */
int parts_assemble(const manifest_file *f, uint32_t a, uint32_t b, const parts_opts *o, mf_model *out, parts_stats *st,
                rl_err *err);

/* Holder: len bytes at offset off of the split file `name` in models_dir into buf. Refuses a name that is not a
 * plain *.gguf file name there, and a read past its end. */
int parts_read(const char *models_dir, const char *name, uint64_t off, size_t len, void *buf, rl_err *err);

#endif
