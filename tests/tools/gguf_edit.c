/* gguf_edit - rewrites a GGUF file with one deliberate defect, for the loader's error-path tests.
 *
 *   gguf_edit IN OUT [--drop-tensor NAME] [--reshape NAME NE0,NE1,NE2] [--retype NAME TYPE]
 *                    [--set-str KEY VAL] [--set-u32 KEY VAL] [--set-u16 KEY VAL] [--set-f64 KEY VAL]
 *                    [--set-i32 KEY VAL] [--del-key KEY] [--rename-token OLD NEW]
 *
 * --rename-token respells one entry of tokenizer.ggml.tokens (a vocabulary without K3's markers, say).
 * Reshaped or retyped tensors get zero data of the new size. Everything else is copied as it is. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml.h"
#include "gguf.h"

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: gguf_edit IN OUT [ops]\n");
        return 2;
    }
    struct ggml_context *data = NULL;
    struct gguf_init_params ip = {.no_alloc = false, .ctx = &data};
    struct gguf_context *in = gguf_init_from_file(argv[1], ip);
    if (!in) {
        fprintf(stderr, "gguf_edit: cannot read %s\n", argv[1]);
        return 1;
    }
    struct gguf_context *out = gguf_init_empty();
    gguf_set_kv(out, in);
    const char *drop = NULL, *reshape = NULL, *retype = NULL;
    int64_t new_ne[4] = {1, 1, 1, 1};
    int new_type = -1;
    for (int i = 3; i < argc; i++) {
        const char *op = argv[i], *a = i + 1 < argc ? argv[i + 1] : NULL, *b = i + 2 < argc ? argv[i + 2] : NULL;
        if (!a) goto usage;
        if (strcmp(op, "--drop-tensor") == 0) {
            drop = a, i++;
        } else if (strcmp(op, "--del-key") == 0) {
            gguf_remove_key(out, a), i++;
        } else if (!b) {
            goto usage;
        } else if (strcmp(op, "--reshape") == 0) {
            reshape = a;
            sscanf(b, "%ld,%ld,%ld", &new_ne[0], &new_ne[1], &new_ne[2]);
            i += 2;
        } else if (strcmp(op, "--retype") == 0) {
            retype = a;
            for (int t = 0; t < GGML_TYPE_COUNT; t++) {
                const char *n = ggml_type_name((enum ggml_type)t);
                if (n && strcasecmp(n, b) == 0) new_type = t;
            }
            if (new_type < 0) goto usage;
            i += 2;
        } else if (strcmp(op, "--set-str") == 0) {
            gguf_set_val_str(out, a, b), i += 2;
        } else if (strcmp(op, "--set-u32") == 0) {
            gguf_set_val_u32(out, a, (uint32_t)strtoul(b, NULL, 0)), i += 2;
        } else if (strcmp(op, "--set-u16") == 0) {
            gguf_set_val_u16(out, a, (uint16_t)strtoul(b, NULL, 0)), i += 2;
        } else if (strcmp(op, "--set-i32") == 0) {
            gguf_set_val_i32(out, a, (int32_t)strtol(b, NULL, 0)), i += 2;
        } else if (strcmp(op, "--rename-token") == 0) {
            int64_t k = gguf_find_key(out, "tokenizer.ggml.tokens");
            size_t n = k >= 0 ? gguf_get_arr_n(out, k) : 0;
            /* copies: gguf_set_arr_str drops the old array before it reads the new one */
            char **tok = calloc(n ? n : 1, sizeof *tok);
            int hit = 0;
            for (size_t t = 0; t < n && tok; t++) {
                const char *w = gguf_get_arr_str(out, k, t);
                hit |= strcmp(w, a) == 0;
                tok[t] = strdup(strcmp(w, a) == 0 ? b : w);
            }
            if (hit) gguf_set_arr_str(out, "tokenizer.ggml.tokens", (const char **)tok, n);
            for (size_t t = 0; t < n && tok; t++) free(tok[t]);
            free(tok);
            if (!hit) {
                fprintf(stderr, "gguf_edit: no token '%s'\n", a);
                return 1;
            }
            i += 2;
        } else if (strcmp(op, "--set-f64") == 0) {
            gguf_set_val_f64(out, a, strtod(b, NULL)), i += 2;
        } else {
            goto usage;
        }
    }
    struct ggml_init_params gp = {.mem_size = 64 << 20, .mem_buffer = NULL, .no_alloc = false};
    struct ggml_context *fresh = ggml_init(gp);
    for (int64_t i = 0; i < gguf_get_n_tensors(in); i++) {
        const char *name = gguf_get_tensor_name(in, i);
        struct ggml_tensor *t = ggml_get_tensor(data, name);
        if (drop && strcmp(name, drop) == 0) continue;
        if ((reshape && strcmp(name, reshape) == 0) || (retype && strcmp(name, retype) == 0)) {
            int64_t ne[4] = {t->ne[0], t->ne[1], t->ne[2], t->ne[3]};
            if (reshape && strcmp(name, reshape) == 0) memcpy(ne, new_ne, sizeof ne);
            enum ggml_type type = retype && strcmp(name, retype) == 0 ? (enum ggml_type)new_type : t->type;
            struct ggml_tensor *n = ggml_new_tensor(fresh, type, 4, ne);
            memset(n->data, 0, ggml_nbytes(n));
            ggml_set_name(n, name);
            t = n;
        }
        gguf_add_tensor(out, t);
    }
    int ok = gguf_write_to_file(out, argv[2], false);
    gguf_free(out);
    gguf_free(in);
    ggml_free(data);
    ggml_free(fresh);
    return ok ? 0 : 1;
usage:
    fprintf(stderr, "gguf_edit: bad or incomplete operation\n");
    return 2;
}
