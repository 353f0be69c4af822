/* fuzz_loader - a seeded mutation fuzzer for the model loader (k3_open), run in the test suite.
 *
 * Writes one small valid K3 file with synth, then for N iterations mutates a copy (bit flips, random and
 * "interesting" integers in the header, truncation, chunk deletion and duplication), writes it out and
 * opens it. Every open must either succeed or fail with a message: no crash, no hang (alarm), no leak
 * (under the sanitizer build LeakSanitizer checks at exit).
 *
 *   fuzz_loader [ITERATIONS] [SEED]     (defaults: $RINGLM_FUZZ_ITERS or 3000, seed 1) */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf.h"
#include "gguf/model_file.h"
#include "model/k3_hparams.h"
#include "tools/synth.h"
#include "tools/synth_config.h"

static uint64_t rng_state;
static uint64_t rng(void) { /* xorshift64*: plenty for picking mutations */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1DULL;
}
static size_t rng_below(size_t n) { return n ? (size_t)(rng() % n) : 0; }

static volatile sig_atomic_t cur_iter;
static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "fuzz_loader: HANG: k3_open did not return within 20 s\n";
    ssize_t w = write(2, msg, sizeof msg - 1);
    (void)w;
    _exit(3);
}

static int read_file(const char *path, unsigned char **buf, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    *buf = malloc(*n + 1);
    size_t r = *buf ? fread(*buf, 1, *n, f) : 0;
    fclose(f);
    return r == *n ? 0 : -1;
}

int main(int argc, char **argv) {
    const char *env = getenv("RINGLM_FUZZ_ITERS");
    long iters = argc > 1 ? atol(argv[1]) : env ? atol(env) : 3000;
    rng_state = argc > 2 ? strtoull(argv[2], NULL, 0) : 1;
    if (rng_state == 0) rng_state = 1;
    char dir[] = "/tmp/ringlm-fuzz-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    char base_path[64], mut_path[64];
    snprintf(base_path, sizeof base_path, "%s/base.gguf", dir);
    snprintf(mut_path, sizeof mut_path, "%s/mut.gguf", dir);

    /* A micro K3: two layers (one KDA, one MLA), small vocabulary, so each iteration is cheap. */
    synth_config c;
    rl_err err = {{0}};
    if (synth_config_load(&c, "tiny", &err) != 0) {
        fprintf(stderr, "config: %s\n", err.msg);
        return 1;
    }
    k3_hparams *hp = &c.hp;
    hp->n_layer = 2;
    hp->is_mla[0] = false;
    hp->is_mla[1] = true;
    hp->n_embd = 64;
    hp->n_vocab = 768;
    hp->n_head = 2;
    hp->kda_head_dim = 32;
    hp->q_lora_rank = 32;
    hp->kv_lora_rank = 32;
    hp->mla_k_dim = 32;
    hp->rope_dim = 16;
    hp->mla_v_dim = 16;
    hp->n_ff = 64;
    hp->n_ff_exp = 32;
    hp->n_expert = 4;
    hp->n_expert_used = 2;
    hp->n_expert_latent = 32;
    hp->attn_res_block = 1;
    c.type = synth_type_parse("q8_0");
    synth_opts o = {.out = base_path, .seed = 7, .n_split = 1, .n_threads = 1, .progress = false};
    if (synth_write(&c, &o, &err) != 0) {
        fprintf(stderr, "synth: %s\n", err.msg);
        return 1;
    }
    unsigned char *base, *buf;
    size_t n_base;
    if (read_file(base_path, &base, &n_base) != 0) {
        fprintf(stderr, "cannot read %s\n", base_path);
        return 1;
    }
    /* The base must load: otherwise every iteration would "pass" by failing. */
    mf_model m;
    k3_hparams h;
    if (k3_open(&m, &h, base_path, &err) != 0) {
        fprintf(stderr, "base file does not load: %s\n", err.msg);
        return 1;
    }
    size_t header = m.splits[0].data_offset; /* most interesting mutations land in the metadata */
    mf_close(&m);
    buf = malloc(n_base * 2 + 64);
    signal(SIGALRM, on_alarm);

    long n_ok = 0, n_err = 0;
    for (long it = 0; it < iters; it++) {
        cur_iter = (sig_atomic_t)it;
        size_t n = n_base;
        memcpy(buf, base, n);
        int n_mut = 1 + (int)rng_below(4);
        for (int k = 0; k < n_mut && n > 0; k++) {
            size_t region = rng_below(10) < 8 ? (header < n ? header : n) : n;
            size_t pos = rng_below(region);
            switch (rng_below(7)) {
            case 0: buf[pos] ^= (unsigned char)(1u << rng_below(8)); break;
            case 1: buf[pos] = (unsigned char)rng(); break;
            case 2: { /* an interesting 32-bit value */
                static const uint32_t v[] = {0, 1, 2, 0xff, 0xffff, 0x7fffffff, 0x80000000, 0xffffffff, 31, 1024};
                uint32_t x = v[rng_below(sizeof v / sizeof v[0])];
                if (pos + 4 <= n) memcpy(buf + pos, &x, 4);
                break;
            }
            case 3: { /* an interesting 64-bit value (lengths and counts are u64 in GGUF) */
                static const uint64_t v[] = {0, 1, 0xffffffffffffffffULL, 0x7fffffffffffffffULL, 1ULL << 32,
                                             1ULL << 40, 65536};
                uint64_t x = v[rng_below(sizeof v / sizeof v[0])];
                if (pos + 8 <= n) memcpy(buf + pos, &x, 8);
                break;
            }
            case 4: n = rng_below(n + 1); break; /* truncate */
            case 5: { /* delete a chunk */
                size_t len = 1 + rng_below(64);
                if (pos + len <= n) {
                    memmove(buf + pos, buf + pos + len, n - pos - len);
                    n -= len;
                }
                break;
            }
            default: { /* duplicate a chunk */
                size_t len = 1 + rng_below(64);
                if (pos + len <= n && n + len <= n_base * 2) {
                    memmove(buf + pos + len, buf + pos, n - pos);
                    n += len;
                }
                break;
            }
            }
        }
        FILE *f = fopen(mut_path, "wb");
        if (!f || fwrite(buf, 1, n, f) != n || fclose(f) != 0) {
            fprintf(stderr, "cannot write %s\n", mut_path);
            return 1;
        }
        alarm(20);
        rl_err e = {{0}};
        int rc = k3_open(&m, &h, mut_path, &e);
        alarm(0);
        if (rc == 0) {
            n_ok++;
            mf_close(&m);
        } else {
            if (e.msg[0] == 0) {
                fprintf(stderr, "iteration %ld: failed without a message\n", it);
                return 1;
            }
            n_err++;
        }
    }
    printf("ok - %ld mutated files: %ld loaded, %ld refused with a message, no crash or hang\n", iters, n_ok, n_err);
    unlink(mut_path);
    unlink(base_path);
    rmdir(dir);
    free(base);
    free(buf);
    return 0;
}
