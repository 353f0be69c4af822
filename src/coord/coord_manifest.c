/* coord_manifest.c - the coordinator's side of a manifest ring (coord.h ring_opts.manifest; docs/ring.md,
 * "Manifest rings"): which split files each node holds, what each would have to be streamed for a range,
 * which nodes lend what to whom. */
#include "coord_int.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>
#include <sodium.h>

#include "../base/json.h"
#include "../base/file.h"
#include "../trust/manifest.h"

int coord_manifest_begin(ring_coord *rc, rl_err *err) {
    const manifest_file *f = rc->o.manifest;
    if (rc->o.audit_rate > 0) {
        return rl_errf(err, "audits recompute a stage from the coordinator's own copy of its weights, and with a "
                            "manifest it holds none: receipts are still checked (drop the audit option, or give -m)");
    }
    if (manifest_file_need_hashes(f, "run one", err) != 0) return -1;
    if (f->n_layer != rc->hp.n_layer) return rl_errf(err, "the manifest's model has %u layers, not %u", f->n_layer, rc->hp.n_layer);
    if (!rc->o.manifest_path || rl_read_file(rc->o.manifest_path, "manifest", &rc->mf_bytes, &rc->mf_len, err) != 0) {
        return rc->o.manifest_path ? -1 : rl_errf(err, "ring_opts.manifest without its file");
    }
    uint8_t id[32];
    if (manifest_file_range_hash(f, 0, f->n_layer, id, err) != 0) return -1;
    sodium_bin2hex(rc->model_hash, sizeof rc->model_hash, id, 32);
    return 0;
}

/* INFO "files" [{name, bytes}]: a node holds a split file of the manifest if it has one of that name at least as
 * long as the manifest's last tensor in it needs (a download still under way is not held). Its bytes are
 * checked against the manifest when the node maps them. */
void coord_manifest_info(ring_coord *rc, int from, const cJSON *files) {
    const manifest_file *f = rc->o.manifest;
    const uint32_t nf = manifest_file_n_files(f);
    ring_node_state *ns = &rc->nodes[from];
    free(ns->files);
    ns->files = calloc(nf + 1, 1);
    if (!ns->files) return;
    const cJSON *it;
    cJSON_ArrayForEach(it, files) {
        const char *name = rl_json_str(it, "name");
        const cJSON *by = cJSON_GetObjectItemCaseSensitive(it, "bytes");
        if (!name || !cJSON_IsNumber(by)) continue;
        for (uint32_t k = 0; k < nf; k++) {
            if (strcmp(manifest_file_name(f, k), name) != 0) continue;
            uint64_t need = 0;
            for (int i = 0; i < f->n; i++) {
                if (f->t[i].file == k && f->t[i].offset + f->t[i].nbytes > need) need = f->t[i].offset + f->t[i].nbytes;
            }
            ns->files[k] = by->valuedouble >= (double)need;
        }
    }
    bool all = true;
    for (uint32_t k = 0; k < nf; k++) all &= ns->files[k];
    ns->has_model = all;
}

/* Where tensor `name` goes in plan_node.lack: its layer, n_layer for the embedding, n_layer + 1 for the head. */
static uint32_t coord_manifest_slot(const char *name, uint32_t n_layer) {
    unsigned il;
    if (sscanf(name, "blk.%u.", &il) == 1 && il < n_layer) return il;
    return strcmp(name, "token_embd.weight") == 0 ? n_layer : n_layer + 1;
}

void coord_manifest_lack(const ring_coord *rc, int node, uint64_t *lack) {
    const manifest_file *f = rc->o.manifest;
    memset(lack, 0, (PLAN_MAX_LAYERS + 2) * sizeof *lack);
    const bool *held = rc->nodes[node].files;
    for (int i = 0; i < f->n; i++) {
        if (!held || !held[f->t[i].file]) lack[coord_manifest_slot(f->t[i].name, f->n_layer)] += f->t[i].nbytes;
    }
}

void coord_manifest_print(const ring_coord *rc, FILE *out) {
    const manifest_file *f = rc->o.manifest;
    const uint32_t nf = manifest_file_n_files(f);
    bool *need = calloc(nf + 1, 1);
    if (!need) return;
    for (int s = 0; s < rc->plan.n_stages; s++) {
        const plan_stage *st = &rc->plan.stages[s];
        const bool *held = rc->nodes[st->node].files;
        manifest_file_range_files(f, st->a, st->b, need);
        int n_need = 0, n_held = 0;
        fprintf(out, "stage %d needs", s);
        for (uint32_t k = 0; k < nf; k++) {
            if (!need[k]) continue;
            fprintf(out, "%s %s", n_need ? "," : "", manifest_file_name(f, k));
            n_need++;
            n_held += held && held[k];
        }
        fprintf(out, " (%s holds %d of %d", rc->conf.nodes[st->node].addr, n_held, n_need);
        for (uint32_t k = 0, n = 0; n_held < n_need && k < nf; k++) {
            if (need[k] && !(held && held[k])) fprintf(out, "%s%s", n++ ? ", " : "; it lacks ", manifest_file_name(f, k));
        }
        fprintf(out, "%s)\n", n_held < n_need ? ": streamed from nodes that hold them, or put in its --models" : "");
    }
    free(need);
}

/* After the plan: for every stage, the nodes that lend it the split files of its range it lacks (a holder
 * in ring.conf order, the stage's own node never), into holders[s] (a cJSON array for its ASSIGN); each
 * holder is told whom it lends to (LEND) and answers before anyone pulls. Files no node holds fail the
 * open, listed. */
int coord_manifest_lend(ring_coord *rc, cJSON **holders, rl_err *err) {
    const manifest_file *f = rc->o.manifest;
    const uint32_t nf = manifest_file_n_files(f);
    const int n = rc->conf.n;
    bool *need = calloc(nf + 1, 1), *missing = calloc(nf + 1, 1);
    bool (*lends)[PLAN_MAX_NODES] = calloc((size_t)n, sizeof *lends); /* [holder][fetcher] */
    int rc_ = -1;
    if (!need || !missing || !lends) {
        rl_errf(err, "out of memory");
        goto done;
    }
    char first_need[300] = "";
    for (int s = 0; s < rc->plan.n_stages; s++) {
        const plan_stage *st = &rc->plan.stages[s];
        const bool *held = rc->nodes[st->node].files;
        holders[s] = cJSON_CreateArray();
        memset(need, 0, nf);
        for (int i = 0; i < f->n; i++) {
            if (manifest_tensor_in_range(f->t[i].name, st->a, st->b, f->n_layer) && !(held && held[f->t[i].file])) need[f->t[i].file] = true;
        }
        for (int h = 0; h < n; h++) {
            if (h == st->node || !rc->nodes[h].files || (rc->o.exclude && rc->o.exclude[h])) continue;
            cJSON *files = NULL;
            for (uint32_t k = 0; k < nf; k++) {
                if (!need[k] || !rc->nodes[h].files[k]) continue;
                if (!files) files = cJSON_CreateArray();
                cJSON_AddItemToArray(files, cJSON_CreateNumber(k));
                need[k] = false;
            }
            if (!files) continue;
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "addr", rc->conf.nodes[h].addr);
            cJSON_AddStringToObject(o, "pubkey", rc->conf.nodes[h].key.pk_hex);
            cJSON_AddItemToObject(o, "files", files);
            cJSON_AddItemToArray(holders[s], o);
            lends[h][st->node] = true;
        }
        for (uint32_t k = 0; k < nf; k++) {
            if (!need[k]) continue;
            if (!first_need[0]) {
                snprintf(first_need, sizeof first_need, "layers [%u, %u) on %s", st->a, st->b,
                         rc->conf.nodes[st->node].addr);
            }
            missing[k] = true;
        }
    }
    if (first_need[0]) {
        char list[1200] = "";
        size_t len = 0;
        for (uint32_t k = 0; k < nf && len < sizeof list - 1; k++) {
            if (missing[k]) len += (size_t)snprintf(list + len, sizeof list - len, "%s%s", len ? ", " : "", manifest_file_name(f, k));
        }
        rl_errf(err, "no node holds the split file%s %s (needed for %s%s): put %s in some node's --models folder",
                strchr(list, ',') ? "s" : "", list, first_need, strchr(list, ',') ? " and more" : "",
                strchr(list, ',') ? "them" : "it");
        goto done;
    }
    for (int h = 0; h < n; h++) {
        cJSON *j = cJSON_CreateObject(), *fa = cJSON_AddArrayToObject(j, "fetchers");
        int nl = 0;
        for (int k = 0; k < n; k++) {
            if (lends[h][k]) cJSON_AddItemToArray(fa, cJSON_CreateString(rc->conf.nodes[k].key.pk_hex)), nl++;
        }
        char *js = nl ? cJSON_PrintUnformatted(j) : NULL;
        cJSON_Delete(j);
        if (!nl) continue;
        int r = js ? ring_send(rc, h, FRAME_LEND, 0, NULL, js, strlen(js), NULL, 0, err) : rl_errf(err, "out of memory");
        free(js);
        zs_parts p;
        frame_header hh;
        int from;
        if (r != 0 || ring_wait(rc, FRAME_LENT, h, rc->o.connect_s + 5, NULL, &from, &p, &hh, err) != 0) {
            rl_err_prefix(err, "lending split files from %s", rc->conf.nodes[h].addr);
            goto done;
        }
        zs_parts_free(&p);
    }
    rc_ = 0;
done:
    free(need);
    free(missing);
    free(lends);
    return rc_;
}
