#include "logits_compare.h"

#include <math.h>
#include <string.h>

#include "../model/logits_file.h"

int lc_compare_files(const char *pa, const char *pb, lc_result *r, rl_err *err) {
    memset(r, 0, sizeof *r);
    lf_header ha, hb;
    float *la = NULL, *lb = NULL;
    if (lf_read(pa, &ha, &la, err) != 0) return -1;
    if (lf_read(pb, &hb, &lb, err) != 0) {
        lf_free(&ha, la);
        return -1;
    }
    int rc = 0;
    if (ha.n_rows != hb.n_rows || ha.n_vocab != hb.n_vocab) {
        rc = rl_errf(err, "shape differs: %s is %d x %d, %s is %d x %d", pa, ha.n_rows, ha.n_vocab, pb, hb.n_rows,
                     hb.n_vocab);
    } else if (memcmp(ha.tokens, hb.tokens, (size_t)ha.n_rows * sizeof(int32_t)) != 0) {
        rc = rl_errf(err, "the two files were computed from different input tokens");
    }
    if (rc == 0) {
        r->n_rows = ha.n_rows;
        r->n_vocab = ha.n_vocab;
        for (int i = 0; i < ha.n_rows; i++) {
            const float *ra = la + (size_t)i * (size_t)ha.n_vocab, *rb = lb + (size_t)i * (size_t)ha.n_vocab;
            int am = 0, bm = 0;
            for (int j = 0; j < ha.n_vocab; j++) {
                if (!isfinite(ra[j]) || !isfinite(rb[j])) {
                    r->nonfinite++;
                    continue;
                }
                double d = fabs((double)ra[j] - (double)rb[j]);
                if (d > r->max_abs_diff) {
                    r->max_abs_diff = d;
                    r->worst_row = i;
                }
                if (fabs(ra[j]) > r->max_abs_logit) r->max_abs_logit = fabs(ra[j]);
                if (ra[j] > ra[am]) am = j;
                if (rb[j] > rb[bm]) bm = j;
            }
            r->argmax_agree += am == bm;
        }
        r->rel = r->max_abs_logit > 0 ? r->max_abs_diff / r->max_abs_logit : r->max_abs_diff;
    }
    lf_free(&ha, la);
    lf_free(&hb, lb);
    return rc;
}
