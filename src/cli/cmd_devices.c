#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../device/devices.h"
#include "cli.h"

int cmd_devices(int argc, char **argv) {
    const char *dir = NULL;
    bool measure = false;
    int threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--backends") == 0 && i + 1 < argc) {
            dir = argv[++i];
        } else if (strcmp(argv[i], "--measure") == 0) {
            measure = true;
        } else if ((strcmp(argv[i], "-t") == 0 || strcmp(argv[i], "--threads") == 0) && i + 1 < argc) {
            threads = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf("usage: ringlm devices [--backends DIR] [--measure [-t N]]\n\n"
                   "Lists every device ggml sees on this machine: its name (what --device takes), backend, kind,\n"
                   "free and total memory, and the hardware. GPU backends are modules loaded from DIR, else from\n"
                   "$RINGLM_BACKEND_DIR, else from where the build put them; a module that cannot load is named\n"
                   "with the reason. Software Vulkan devices (Mesa's lavapipe) appear with GGML_VK_VISIBLE_DEVICES=0.\n"
                   "--measure times a matrix-vector and a matrix-matrix product on each device: the speed a node\n"
                   "reports to the planner (GB/s of weights read in a decode step, TFLOPS in prefill; -t: CPU threads).\n");
            return 0;
        } else {
            fprintf(stderr, "ringlm devices: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    rl_err err = {{0}};
    char why[2048];
    if (dv_load(dir, why, sizeof why, &err) != 0) {
        fprintf(stderr, "ringlm devices: %s\n", err.msg);
        return 1;
    }
    printf("%-10s %-8s %-4s %12s %12s  %s%s\n", "name", "backend", "kind", "free MiB", "total MiB",
           measure ? "    GB/s   TFLOPS  " : "", "description");
    int rc = 0;
    for (size_t i = 0; i < dv_count(); i++) {
        dv_info d;
        dv_get(i, &d);
        printf("%-10s %-8s %-4s %12.0f %12.0f  ", d.name, d.backend, d.gpu ? "GPU" : "CPU", (double)d.free / 1048576.0,
               (double)d.total / 1048576.0);
        double bps = 0, fl = 0;
        struct ggml_backend_device *dev = NULL;
        if (measure && (dv_find(d.name, &dev, &err) != 0 || dv_measure(dev, threads, &bps, &fl, &err) != 0)) {
            printf("%8s %8s  %s\n", "-", "-", d.description);
            fprintf(stderr, "ringlm devices: %s\n", err.msg);
            rc = 1;
            continue;
        }
        if (measure) printf("%8.2f %8.3f  ", bps / 1e9, fl / 1e12);
        printf("%s\n", d.description);
    }
    if (why[0]) fprintf(stderr, "not loaded: %s", why);
    return rc;
}
