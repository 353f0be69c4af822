#!/usr/bin/env bash
# The CUDA module on a machine without an NVIDIA driver (CI's, and this one: the module is built ahead here by
# scripts/ggml-cuda.sh, and only runs where a GPU is lent; bench/device/gpu_check.sh).
#   - stand-in modules that need libcuda.so.1 (the driver) or libcudart.so (the runtime; an unreleased version, so that no installed toolkit has it), which this
#     machine lacks: `ringlm devices` still lists the CPU, exits 0, and says which library is missing and
#     what it is; `--device CUDA0` fails naming the device and why it is not there; the CPU still computes.
#   - the real module, where scripts/ggml-cuda.sh has built it: the same, or CUDA0 listed where a driver is.
#   - RINGLM_BACKEND_DIR takes several directories separated by ':'; a named one that cannot be read fails.
. "$(dirname "$0")/lib.sh"
f=$(model full-f32 k3-full f32)
if ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1'; then
    skip "stand-in CUDA modules: this machine has an NVIDIA driver (libcuda.so.1)"
else
    # A driver stand-in to link against, removed before the module is loaded: the module then needs a
    # libcuda.so.1 that is not there, as the real one does on a machine without the driver.
    mkdir -p "$WORK/lib" "$WORK/nodrv" "$WORK/nort"
    echo 'void cuInit(void) {}' >"$WORK/c.c"
    cc -shared -fPIC -o "$WORK/lib/libcuda.so" -Wl,-soname,libcuda.so.1 "$WORK/c.c"
    cc -shared -fPIC -o "$WORK/lib/libcudart.so" -Wl,-soname,libcudart.so.99 "$WORK/c.c"
    echo 'extern void cuInit(void); void *ggml_backend_init(void) { cuInit(); return 0; }' >"$WORK/m.c"
    cc -shared -fPIC -o "$WORK/nodrv/libggml-cuda.so" "$WORK/m.c" -L"$WORK/lib" -l:libcuda.so
    cc -shared -fPIC -o "$WORK/nort/libggml-cuda.so" "$WORK/m.c" -L"$WORK/lib" -l:libcudart.so
    rm -rf "$WORK/lib"
    RINGLM_BACKEND_DIR=$WORK/nodrv "$RINGLM" devices >"$WORK/dev.out" 2>"$WORK/dev.err" && rc=0 || rc=$?
    check "no driver: ringlm devices exits 0 and lists the CPU" bash -c "[ $rc = 0 ] && grep -Eq '^CPU +CPU +CPU ' '$WORK/dev.out'"
    check "no driver: it says so, naming the library" \
        grep -q "cuda: no NVIDIA driver on this machine (libcuda.so.1 not found); the CUDA module .*libggml-cuda.so needs one" \
        "$WORK/dev.err"
    RINGLM_BACKEND_DIR=$WORK/nort "$RINGLM" devices >/dev/null 2>"$WORK/rt.err" || true
    check "no CUDA runtime: it says so, naming the library" \
        grep -q "cuda: the CUDA runtime is not installed (libcudart.so.99 not found)" "$WORK/rt.err"
    RINGLM_BACKEND_DIR=$WORK/nodrv check_fails "no driver: --device CUDA0 names the device and why it is missing" \
        "no device named 'CUDA0' \(this machine has: CPU.*not loaded: cuda: no NVIDIA driver" \
        "$RINGLM" run -m "$f" -p hi -n 2 --device CUDA0
    RINGLM_BACKEND_DIR=$WORK/nodrv check "no driver: the CPU still computes" "$RINGLM" run -m "$f" -p hi -n 2 --temp 0
    RINGLM_BACKEND_DIR=/nonexistent:$WORK/nodrv "$RINGLM" devices >"$WORK/two.out" 2>"$WORK/two.err" || true
    check "two directories: an unreadable default one is noted, the other's module is tried" bash -c \
        "grep -q 'cannot read /nonexistent' '$WORK/two.err' && grep -q 'no NVIDIA driver' '$WORK/two.err'"
    check_fails "a named directory that cannot be read fails" "cannot read the backend module directory /nonexistent" \
        "$RINGLM" devices --backends "$WORK/nodrv:/nonexistent"
fi

# The real module, when built here (scripts/ggml-cuda.sh; hours on 2 cores, so CI does not build it).
if cuda=$("$ROOT/scripts/ggml-cuda.sh" --where 2>/dev/null); then
    RINGLM_BACKEND_DIR=$cuda/modules "$RINGLM" devices >"$WORK/real.out" 2>"$WORK/real.err" && rc=0 || rc=$?
    if ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1'; then
        check "the built CUDA module lists a CUDA device" grep -Eq '^CUDA0 +CUDA +GPU ' "$WORK/real.out"
    else
        check "the built CUDA module, no driver: exit 0, the CPU listed, the missing driver named" bash -c \
            "[ $rc = 0 ] && grep -Eq '^CPU ' '$WORK/real.out' && grep -q 'no NVIDIA driver on this machine (libcuda.so.1 not found)' '$WORK/real.err'"
    fi
else
    skip "the real CUDA module: not built on this machine (scripts/ggml-cuda.sh)"
fi
finish
