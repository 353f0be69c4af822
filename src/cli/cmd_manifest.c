#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../model/k3_hparams.h"
#include "../trust/manifest.h"
#include "../trust/manifest_file.h"
#include "cli.h"

static void manifest_usage(FILE *f) {
    fprintf(f, "usage: ringlm manifest MODEL.gguf -o MODEL.manifest [--threads N] [--progress | --no-progress]\n"
               "       ringlm manifest --range-hash A:B (MODEL.gguf | MODEL.manifest)\n"
               "       ringlm manifest --check MODEL.manifest SPLIT.gguf...\n"
               "       ringlm manifest --range-files A:B MODEL.manifest\n\n"
               "Writes a model's manifest: its metadata and, per tensor, name, type, shape, split file, offset and\n"
               "BLAKE2b (src/trust/manifest_file.h). --range-hash prints the manifest hash of layers [A, B) (what\n"
               "receipts carry), from a model or from its manifest: the two are equal. --check verifies the split\n"
               "files given (any subset of the model's) against the manifest, tensor by tensor, and lists the\n"
               "model's files not given. --range-files lists the split files that hold layers [A, B) (what a node\n"
               "given that range downloads into its --models folder), one per line with the bytes of it used.\n");
}

static void manifest_hex(const uint8_t h[32]) {
    for (int i = 0; i < 32; i++) printf("%02x", h[i]);
    printf("\n");
}

int cmd_manifest(int argc, char **argv) {
    const char *in = NULL, *out = NULL, *range = NULL, *check = NULL, *range_files = NULL;
    const char *files[256];
    int n_files = 0;
    int threads = 0;
    bool progress = isatty(2);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            manifest_usage(stdout);
            return 0;
        } else if ((strcmp(a, "-o") == 0 || strcmp(a, "--range-hash") == 0 || strcmp(a, "--threads") == 0 ||
                    strcmp(a, "--range-files") == 0) && !v) {
            return cli_bad_option("manifest", a, NULL, true, NULL);
        } else if (strcmp(a, "-o") == 0) {
            out = argv[++i];
        } else if (strcmp(a, "--check") == 0 && v) {
            check = argv[++i];
        } else if (strcmp(a, "--range-hash") == 0) {
            range = argv[++i];
        } else if (strcmp(a, "--range-files") == 0) {
            range = range_files = argv[++i];
        } else if (strcmp(a, "--progress") == 0 || strcmp(a, "--no-progress") == 0) {
            progress = a[2] == 'p';
        } else if (strcmp(a, "--threads") == 0) {
            if (cli_parse_int(v, &threads) != 0 || threads < 1) return cli_bad_option("manifest", a, v, true, "a thread count");
            i++;
        } else if (a[0] == '-') {
            return cli_bad_option("manifest", a, v, false, NULL);
        } else if (check) {
            if (n_files == 256) return cli_bad_option("manifest", "--check", a, true, "at most 256 files");
            files[n_files++] = a;
        } else {
            in = a;
        }
    }
    if (check) {
        if (n_files == 0 || in || out || range) {
            manifest_usage(stderr);
            return 2;
        }
        rl_err err = {0};
        manifest_file f;
        if (manifest_file_read(&f, check, &err) != 0) {
            fprintf(stderr, "ringlm manifest: %s\n", err.msg);
            return 1;
        }
        if (manifest_file_need_hashes(&f, "check files", &err) != 0) {
            fprintf(stderr, "ringlm manifest: %s\n", err.msg);
            manifest_file_free(&f);
            return 1;
        }
        long bad = 0;
        char *abs_txt = NULL;
        size_t abs_len = 0;
        FILE *abs = open_memstream(&abs_txt, &abs_len);
        int rc = manifest_file_check(&f, files, n_files, stderr, abs, &bad, &err);
        if (abs) fclose(abs);
        if (rc != 0) fprintf(stderr, "ringlm manifest: %s\n", err.msg);
        else if (bad) fprintf(stderr, "ringlm manifest: %ld problem%s in the files checked\n", bad, bad == 1 ? "" : "s");
        else printf("ok: %d file%s match the manifest\n", n_files, n_files == 1 ? "" : "s");
        if (rc == 0 && abs_txt && abs_len) {
            printf("not checked (not given), to fetch for a whole set:");
            for (char *p = strtok(abs_txt, "\n"); p; p = strtok(NULL, "\n")) printf(" %s", p);
            printf("\n");
        }
        free(abs_txt);
        manifest_file_free(&f);
        return rc != 0 || bad ? 1 : 0;
    }
    unsigned ra = 0, rb = 0;
    int nch = 0;
    if (!in || (!out && !range) || (out && range) ||
        (range && (sscanf(range, "%u:%u%n", &ra, &rb, &nch) != 2 || range[nch] != 0))) {
        manifest_usage(stderr);
        return 2;
    }
    rl_err err = {0};
    int rc = 1;
    if (range_files) {
        manifest_file f;
        if (manifest_file_read(&f, in, &err) == 0) {
            const uint32_t nf = manifest_file_n_files(&f);
            bool *need = calloc(nf + 1, 1);
            if (!need) {
                rl_errf(&err, "out of memory");
            } else if (rb <= ra || rb > f.n_layer) {
                rl_errf(&err, "layer range [%u, %u) outside the model's %u layers", ra, rb, f.n_layer);
            } else {
                manifest_file_range_files(&f, ra, rb, need);
                for (uint32_t k = 0; k < nf; k++) {
                    uint64_t used = 0;
                    for (int i = 0; i < f.n; i++) {
                        if (f.t[i].file == k && manifest_tensor_in_range(f.t[i].name, ra, rb, f.n_layer)) used += f.t[i].nbytes;
                    }
                    if (need[k]) printf("%s %llu\n", manifest_file_name(&f, k), (unsigned long long)used);
                }
                rc = 0;
            }
            free(need);
            manifest_file_free(&f);
        }
    } else if (range) {
        uint8_t h[32];
        /* A manifest, or anything not named .gguf (so a damaged manifest gets a manifest's error). */
        size_t len = strlen(in);
        if (manifest_file_is(in) || len < 5 || strcmp(in + len - 5, ".gguf") != 0) {
            manifest_file f;
            if (manifest_file_read(&f, in, &err) == 0) {
                if (manifest_file_need_hashes(&f, "give range hashes", &err) == 0 &&
                    manifest_file_range_hash(&f, ra, rb, h, &err) == 0) manifest_hex(h), rc = 0;
                manifest_file_free(&f);
            }
        } else {
            mf_model m;
            k3_hparams hp;
            if (k3_open(&m, &hp, in, &err) == 0) {
                if (manifest_range_hash_threads(&m, &hp, ra, rb, threads, h, &err) == 0) manifest_hex(h), rc = 0;
                mf_close(&m);
            }
        }
    } else {
        mf_model m;
        k3_hparams hp;
        manifest_file f;
        if (k3_open(&m, &hp, in, &err) == 0) {
            if (manifest_file_build(&f, &m, threads, progress, &err) == 0) {
                if (manifest_file_write(&f, out, &err) == 0) {
                    printf("manifest of %s: %d tensors, %.1f MiB of weights in %d file(s), written to %s\n", in, f.n,
                           (double)m.tensor_bytes / 1048576.0, m.n_split, out);
                    rc = 0;
                }
                manifest_file_free(&f);
            }
            mf_close(&m);
        }
    }
    if (rc != 0) fprintf(stderr, "ringlm manifest: %s\n", err.msg);
    return rc;
}
