#include <string.h>

#include "target.h"

int ring_target_open(const char *model, const char *manifest, mf_model *m, k3_hparams *hp, manifest_file *mf,
                     rl_err *err) {
    memset(mf, 0, sizeof *mf);
    memset(m, 0, sizeof *m);
    if (!manifest) return k3_open(m, hp, model, err);
    if (manifest_file_read(mf, manifest, err) != 0) return -1;
    if (manifest_file_model(mf, m, err) != 0 || k3_hparams_read(hp, m, err) != 0 || k3_check_tensors(hp, m, err) != 0) {
        rl_err_prefix(err, "%s", manifest);
        mf_close(m);
        manifest_file_free(mf);
        return -1;
    }
    return 0;
}

void ring_target_close(mf_model *m, manifest_file *mf) {
    mf_close(m);
    manifest_file_free(mf);
}
