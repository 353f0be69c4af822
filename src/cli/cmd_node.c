#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "../base/heap.h"
#include "../model/k3_forward.h"
#include "../node/node.h"
#include "../trust/join_token.h"
#include "cli.h"

static void node_usage(FILE *f) {
    fprintf(f, "usage: ringlm node (--listen HOST:PORT | --dial RELAY_HOST:PORT) --key node.key --allow COORD_PUBKEY_HEX[,...]\n"
               "       ringlm node --join TOKEN   (the token from the coordinator's `ringlm join-token` gives all three)\n"
               "                   [--relay-listen HOST:PORT]\n"
               "                   [--models DIR] [--cache DIR] [--mem GB [--disk GB/s] [--expert-copy DIR]] [--speed GB/s] [--tflops T] [--threads N]\n"
               "                   [--audit-keep MB] [--no-repack] [--flash-attn on|off|auto] [--cache-type f32|f16]\n"
               "                   [--device NAME[,NAME...]] [--vram GB] [--device-speed GB/s] [--gpu-layers N] [--n-cpu-moe N | --cpu-moe]\n"
               "                   [--verbose]\n\n"
               "Serves its share of a model to the coordinators it trusts. Links are encrypted and mutually\n"
               "authenticated (ZeroMQ CURVE); a key not on the list is refused and logged. Layers of a model\n"
               "it does not hold are streamed by the coordinator and kept in --cache (default\n"
               "~/.cache/ringlm/node-<key>) by content hash for next time. When the coordinator asks for\n"
               "receipts, the node keeps what it received and sent for the last --audit-keep MB (default 256)\n"
               "of frames, for audits. Quantized matmul weights are copied into the CPU's repacked layouts where\n"
               "llama.cpp would repack them; --no-repack keeps every weight in the file mapping (less RAM).\n"
               "--flash-attn on and --cache-type f16 compute MLA attention as llama.cpp's -fa on over an f16\n"
               "cache (the defaults, as llama.cpp's); the node's INFO says which it runs, and audits of its stage\n"
               "do the same. --speed and --tflops declare what the node reports as its decode (GB/s of weights)\n"
               "and prefill (TFLOPS) speed instead of measuring them at start. --mem GB is what the node offers\n"
               "the planner and a hard budget for its weights: a range larger than it keeps its dense part\n"
               "resident and reads routed experts from the file through a cache (docs/experts.md); the node\n"
               "reports its disk read speed (--disk, or measured on its largest model file) so that the planner\n"
               "may give it more layers than its memory holds; --expert-copy DIR keeps the experts it re-lays\n"
               "for the CPU's repacked kernels there, each re-laid once instead of at every read.\n"
               "A node computing on a GPU (--device, default the first GPU; docs/devices.md) offers the planner\n"
               "that device's memory (--vram GB, default its free memory less 256 MiB) at its speed (--device-speed,\n"
               "or measured at start) before its RAM: the plan then says which layers, and which layers' routed\n"
               "experts, sit on the device and which in RAM. --gpu-layers / --n-cpu-moe given here fix that split\n"
               "for this node whatever the plan says.\n"
               "Behind a home router (NAT), --dial RELAY_HOST:PORT keeps connections open to a relay instead of\n"
               "listening (the coordinator's --relay-listen, or a public node's); ring.conf then writes the node\n"
               "relay:RELAY_HOST:PORT PUBKEY. --relay-listen runs such a relay on a node with a public address:\n"
               "it copies encrypted bytes and sees nothing else (docs/ring.md, \"Behind a NAT\"). --join TOKEN\n"
               "(from `ringlm join-token` on the coordinator) is --key, --dial and --allow in one: the node's key,\n"
               "its relay and its coordinator; an expired token is refused.\n");
}

int cmd_node(int argc, char **argv) {
    node_opts o;
    memset(&o, 0, sizeof o);
    o.threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    int bad = 0; /* o.eng all zero: llama.cpp's defaults */
    const char *want = NULL;
    const char *key = NULL, *allow = NULL;
    rl_err err = {{0}};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            node_usage(stdout);
            return 0;
        } else if (strcmp(a, "--verbose") == 0) {
            o.verbose = true;
            continue;
        } else if (cli_engine_flag(a, &o.eng)) {
            continue;
        }
        if (!v) {
            fprintf(stderr, "ringlm node: option '%s' needs a value\n", a);
            return 2;
        }
        i++;
        if (strcmp(a, "--listen") == 0) o.listen = v;
        else if (strcmp(a, "--dial") == 0) o.dial = v;
        else if (strcmp(a, "--join") == 0) o.join_token = v;
        else if (strcmp(a, "--relay-listen") == 0) o.relay_listen = v;
        else if (strcmp(a, "--key") == 0) key = v;
        else if (strcmp(a, "--allow") == 0) allow = v;
        else if (strcmp(a, "--models") == 0) o.models_dir = v;
        else if (strcmp(a, "--cache") == 0) o.cache_dir = v;
        else if (strcmp(a, "--mem") == 0 && cli_parse_engine(a, v, &o.eng, &bad, &want)) {
            if (bad) return cli_bad_option("node", a, v, true, want);
            o.mem_gb = (double)o.eng.mem_bytes / 1073741824.0; /* offered to the planner, and a hard budget */
        }
        else if (strcmp(a, "--speed") == 0) o.speed_gbs = atof(v);
        else if (strcmp(a, "--tflops") == 0) o.tflops = atof(v);
        else if (strcmp(a, "--vram") == 0 && cli_parse_double(v, &o.vram_gb) == 0 && o.vram_gb > 0) {
        }
        else if (strcmp(a, "--device-speed") == 0 && cli_parse_double(v, &o.device_speed_gbs) == 0 && o.device_speed_gbs > 0) {
        }
        else if (strcmp(a, "--disk") == 0 && cli_parse_double(v, &o.disk_gbs) == 0 && o.disk_gbs > 0) {
        }
        else if (strcmp(a, "--audit-keep") == 0 && atof(v) > 0) o.audit_keep_bytes = (size_t)(atof(v) * 1048576.0);
#ifdef RINGLM_ADVERSARY
        else if (strcmp(a, "--misbehave") == 0) o.misbehave = v; /* test builds only (make adversary) */
#endif
        else if (cli_parse_engine(a, v, &o.eng, &bad, &want)) {
            if (bad) return cli_bad_option("node", a, v, true, want);
        } else if (strcmp(a, "--threads") == 0 && cli_parse_int(v, &o.threads) == 0 && o.threads > 0) {
        } else {
            fprintf(stderr, "ringlm node: unknown or bad option '%s'\n", a);
            node_usage(stderr);
            return 2;
        }
    }
    jt_token jt;
    if (o.join_token) { /* the token is the key, the relay and the coordinator */
        if (key || o.dial) {
            fprintf(stderr, "ringlm node: --join gives the node its key and relay: no --key or --dial with it\n");
            return 2;
        }
        if (jt_parse(o.join_token, &jt, &err) != 0 || jt_check_expiry(&jt, (uint64_t)time(NULL), &err) != 0 ||
            keys_from_seed(&o.id, jt.seed, &err) != 0) {
            fprintf(stderr, "ringlm node: --join: %s\n", err.msg);
            return 1;
        }
    }
    if ((!o.listen && !o.dial && !o.join_token) || (!key && !o.join_token) || (!allow && !o.join_token)) {
        node_usage(stderr);
        return 2;
    }
    if (!o.join_token && keys_load(&o.id, key, &err) != 0) {
        fprintf(stderr, "ringlm node: %s\n", err.msg);
        return 1;
    }
    char list[4096];
    if (o.join_token) { /* its coordinator first, then any --allow */
        char hex[65];
        sodium_bin2hex(hex, sizeof hex, jt.coord_pk, 32);
        snprintf(list, sizeof list, "%s%s%s", hex, allow ? "," : "", allow ? allow : "");
        o.dial = jt.relay;
        fprintf(stderr, "ringlm node: joining with a token: key %s, dialling out to relay %s, serving coordinator %.16s...\n",
                o.id.pk_hex, jt.relay, hex);
    } else {
        snprintf(list, sizeof list, "%s", allow);
    }
    for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (o.n_allow == NODE_MAX_ALLOW || keys_peer_parse(&o.allow[o.n_allow], tok, &err) != 0) {
            fprintf(stderr, "ringlm node: --allow: %s\n", o.n_allow == NODE_MAX_ALLOW ? "too many keys" : err.msg);
            return 1;
        }
        o.n_allow++;
    }
    /* SIGINT/SIGTERM are polled by the loop, so it stops between frames. */
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGINT);
    sigaddset(&s, SIGTERM);
    sigprocmask(SIG_BLOCK, &s, NULL);
    if (!o.eng.mem_bytes) rl_heap_keep(); /* a frame's buffers stay for the next (base/heap.h) */
    if (node_run(&o, &err) != 0) {
        fprintf(stderr, "ringlm node: %s\n", err.msg);
        return 1;
    }
    return 0;
}
