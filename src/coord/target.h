/* target.h - the model a coordinator works on (`ringlm run`, `serve`, `logits`, `plan`): its file (-m), or,
 * for a ring whose coordinator holds no weights, its manifest (--manifest; docs/ring.md, "Manifest rings"),
 * whose view without weights stands in for the file. */
#ifndef RINGLM_TARGET_H
#define RINGLM_TARGET_H

#include "../base/err.h"
#include "../gguf/model_file.h"
#include "../model/k3_hparams.h"
#include "../trust/manifest_file.h"

/* Exactly one of model / manifest. With a manifest, *mf is filled and m is its view without weights (what
 * ring_opts.manifest points to); with a file, *mf stays empty. Close with ring_target_close. */
int ring_target_open(const char *model, const char *manifest, mf_model *m, k3_hparams *hp, manifest_file *mf,
                     rl_err *err);
void ring_target_close(mf_model *m, manifest_file *mf);

#endif
