#!/usr/bin/env bash
# The GPU issue's check on a real NVIDIA GPU (the H100/H200 this project may borrow: CUDA 13, 16 cores,
# nothing fetchable there, minutes of time). NOT RUN YET: no GPU has been lent to a session since it was written.
#
#   bench/device/gpu_check.sh --prepare     here: everything the check runs, built here, into build/gpu-carry/
#                                           carry.tar.xz (under the device tool's 64 MiB): the pinned ggml's CUDA
#                                           module (scripts/ggml-cuda.sh, built ahead: hours on 2 cores), llama.cpp's
#                                           CUDA build of the same source from the same tree (libllama, the oracle
#                                           tests/oracle linked with it, llama-bench), and a ringlm built for any
#                                           x86-64 with AVX2 (ggml's haswell variant, as that tree's CPU backend), with
#                                           the shared libraries it needs beside it. Nothing is compiled there.
#   bench/device/gpu_check.sh --run OUTDIR  there (the device tool's `run`, carry build/gpu-carry), in about 5 minutes:
#                                           1. ringlm devices shows CUDA0;
#                                           2. fidelity: ringlm logits on CUDA0 vs llama.cpp's CUDA build, f32/f16/q8_0/q4_K
#                                              files (worst relative difference), 32 greedy tokens vs llama.cpp;
#                                           3. speed: ringlm run on CUDA0 vs llama-bench -ngl 99 (defaults otherwise),
#                                              same file, alternating, medians of paired ratios (prefill pp512, decode tg128);
#                                           4. DSpark on CUDA0: 5 runs give the plain greedy tokens, none crashes;
#                                           5. a 2-node ring, both nodes on CUDA0: the one-machine tokens, the plan printed.
#                                           Writes OUTDIR/gpu.md (copy it to bench/results/gpu.md with the command used).
#   GPU_CHECK_DEVICE=CPU bench/device/gpu_check.sh --run OUTDIR
#                                           a dry run here (the CPU in CUDA0's place, the CUDA module not loading for
#                                           want of a driver), to catch the script's own faults before the device's time.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
CARRY=$ROOT/build/gpu-carry
case "${1:-}" in
--prepare)
    cuda=$(scripts/ggml-cuda.sh --where) || { echo "gpu_check: the CUDA module is not built: run scripts/ggml-cuda.sh first (hours on 2 cores)"; exit 1; }
    stage=$ROOT/build/gpu-stage
    rm -rf "$stage" && mkdir -p "$stage/lib" "$stage/modules"
    # ringlm for another x86-64: ggml's haswell kernels (AVX2, FMA, F16C), no -march=native.
    RINGLM_X86_VARIANT=haswell make -j"$(nproc)" B=build/gpu GGML_MK=build/ggml-gpu-haswell.mk CFLAGS_release="-O2 -g" \
        build/gpu/release/ringlm >/dev/null
    strip --strip-debug -o "$stage/ringlm" build/gpu/release/ringlm
    cp -P "$cuda"/oracle/lib*.so* "$cuda/oracle/llama-bench" "$stage/lib/"
    cp "$cuda"/modules/*.so "$stage/modules/"
    # One copy of the CUDA module (80 MB, its kernels already compressed): llama.cpp's build loads it through
    # a link.
    ln -sf ../modules/libggml-cuda.so "$stage/lib/libggml-cuda.so"
    src=$(scripts/ggml.sh | sed -n 's/^LLAMA_SRC := //p')
    cc -std=c11 -D_GNU_SOURCE -O2 -I"$src/include" -I"$src/ggml/include" -o "$stage/oracle-cuda" \
        tests/oracle/oracle.c src/model/logits_file.c src/base/err.c -L"$stage/lib" -l:libllama.so -l:libggml.so \
        -l:libggml-base.so -Wl,-rpath,'$ORIGIN/lib' -ldl -lm
    # The shared libraries ringlm and the oracle need that a bare machine may lack (not glibc's own).
    for b in "$stage/ringlm" "$stage/oracle-cuda" "$stage/lib/llama-bench"; do
        LD_LIBRARY_PATH=$stage/lib ldd "$b" | awk '$3 ~ /^\// { print $3 }'
    done | sort -u | grep -Ev '/(libc|libm|libdl|libpthread|librt|libresolv|ld-linux[^/]*)\.so' | grep -v "^$stage/" |
        grep -Ev '/libcuda|/libcudart|/libcublas' | while read -r l; do cp -L "$l" "$stage/lib/"; done
    # The C++ runtime: the machine's own (any CUDA image has one), this one's only if that is too old
    # (--run tries), since Debian's needs glibc 2.36.
    mkdir -p "$stage/lib/extra" && mv "$stage"/lib/libstdc++.so.6 "$stage"/lib/libgcc_s.so.1 "$stage/lib/extra/" 2>/dev/null || true
    need=$(objdump -T "$stage/ringlm" "$stage/oracle-cuda" "$stage"/lib/*.so* "$stage"/modules/*.so 2>/dev/null |
           grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)
    echo "$need" >"$stage/GLIBC"
    mkdir -p "$CARRY" && rm -f "$CARRY"/*
    XZ_OPT="-6 -T$(nproc)" tar cJf "$CARRY/carry.tar.xz" -C "$stage" .
    echo "gpu_check: $(du -h "$CARRY/carry.tar.xz" | cut -f1) in $CARRY/carry.tar.xz; it needs $need or newer there"
    ;;
--run)
    out=${2:?bench/device/gpu_check.sh --run OUTDIR}
    dev=${GPU_CHECK_DEVICE:-CUDA0}
    mkdir -p "$out"
    log=$out/gpu_check.log
    exec > >(tee "$log") 2>&1
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
    work=$ROOT/build/gpu-work
    rm -rf "$work" && mkdir -p "$work/bin"
    [ -f "$CARRY/carry.tar.xz" ] || { echo "gpu_check: no $CARRY/carry.tar.xz (run --prepare here first)"; exit 1; }
    tar xJf "$CARRY/carry.tar.xz" -C "$work/bin"
    echo "gpu_check: the carried binaries need $(cat "$work/bin/GLIBC"); this machine has $(ldd --version | head -1)"
    R=$work/bin/ringlm O=$work/bin/oracle-cuda bench=$work/bin/lib/llama-bench
    export LD_LIBRARY_PATH=$work/bin/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export RINGLM_BACKEND_DIR=$work/bin/modules
    if ! "$R" --help >/dev/null 2>&1; then # the machine's C++ runtime too old (or none): the carried one
        export LD_LIBRARY_PATH=$work/bin/lib/extra:$LD_LIBRARY_PATH
        echo "gpu_check: with the carried C++ runtime"
    fi
    "$R" devices | tee "$out/devices.txt"
    grep -q "^$dev " "$out/devices.txt" || { echo "gpu_check: no $dev"; exit 1; }
    {
        echo "# ringlm on a GPU (bench/device/gpu_check.sh --run)"
        echo
        echo "GPU: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo none); ggml-cuda built ahead by scripts/ggml-cuda.sh (nvcc 13.0)"
        echo
        echo "## Fidelity: ringlm on $dev vs llama.cpp's CUDA build (same source, -ngl 99), 64-token prefill + 16 steps"
        echo
        echo "| file | worst relative difference | greedy 32 tokens |"
        echo "|---|---|---|"
    } >"$out/gpu.md"
    toks=$(seq -s, 7 3 246)
    for c in "full-f32 tests/configs/k3-full.json f32" "lean-f16 tests/configs/k3-lean.json f16" \
             "full-q8_0 tests/configs/k3-full.json q8_0" "small-q4_K small q4_K"; do
        read -r name config type <<<"$c"
        f=$work/$name.gguf
        "$R" synth -o "$f" --config "$config" --type "$type" --seed 2 --no-progress
        "$R" logits -m "$f" --tokens "$toks" --prefill 64 -o "$work/r.bin" --device "$dev"
        "$O" logits -m "$f" --tokens "$toks" --prefill 64 -o "$work/o.bin" --gpu-layers 99
        rel=$("$R" compare "$work/o.bin" "$work/r.bin" --tol 1e9 | grep -o 'rel [^ ]*' | cut -d' ' -f2)
        "$R" run -m "$f" --tokens 5,6,7,8 -n 32 --temp 0 --ignore-eos --ids --device "$dev" >"$work/r.ids" 2>/dev/null
        "$O" generate -m "$f" --tokens 5,6,7,8 -n 32 --gpu-layers 99 >"$work/o.ids"
        same=$(diff -q "$work/r.ids" "$work/o.ids" >/dev/null && echo identical || echo differ)
        echo "| $name | $rel | $same |" >>"$out/gpu.md"
    done
    # DSpark on the GPU (taps read back from the device, KDA rollback there), 5 runs of 20 tokens: on lavapipe
    # with ggml-vulkan's op fusion on, such runs corrupted the heap (docs/devices.md); does a real GPU?
    f=$work/full-f32.gguf
    "$R" synth -o "$work/dspark.gguf" --config tests/configs/k3-full.json --draft dspark --seed 3 --no-progress
    "$R" run -m "$f" --tokens 5,6,7,8 -n 20 --temp 0 --ignore-eos --ids --device "$dev" >"$work/plain.ids" 2>/dev/null
    ds_ok=0 ds_crash=0
    for r in 1 2 3 4 5; do
        "$R" run -m "$f" --tokens 5,6,7,8 -n 20 --temp 0 --ignore-eos --ids --device "$dev" \
            --draft "dspark:$work/dspark.gguf" >"$work/ds.ids" 2>"$work/ds.err" && rc=0 || rc=$?
        [ $rc -ge 128 ] && ds_crash=$((ds_crash + 1))
        [ $rc = 0 ] && cmp -s "$work/plain.ids" "$work/ds.ids" && ds_ok=$((ds_ok + 1))
    done
    echo "" >>"$out/gpu.md"
    echo "DSpark on $dev (full-f32, 20 tokens, 5 runs): $ds_ok gave the plain greedy tokens, $ds_crash died of a signal." >>"$out/gpu.md"
    # A 2-node ring on the GPU: two nodes on loopback, both on the one GPU, each offering 25 MB of
    # it (--vram: less than the 35 MiB file, so the planner needs both); greedy tokens against one
    # machine's, and the plan's per-stage placement.
    rdir=$work/ring && mkdir -p "$rdir/models" && ln -sf "$f" "$rdir/models/full-f32.gguf"
    "$R" keygen -o "$rdir/coord.key" >"$rdir/coord.pub"
    : >"$rdir/ring.conf"
    pids=()
    for i in 1 2; do
        "$R" keygen -o "$rdir/n$i.key" >"$rdir/n$i.pub"
        port=$((47810 + i))
        "$R" node --listen "127.0.0.1:$port" --key "$rdir/n$i.key" --allow "$(cat "$rdir/coord.pub")" \
            --models "$rdir/models" --device "$dev" --vram 0.025 --cache "$rdir/cache$i" >"$rdir/n$i.log" 2>&1 &
        pids+=($!)
        echo "127.0.0.1:$port $(cat "$rdir/n$i.pub")" >>"$rdir/ring.conf"
    done
    for _ in $(seq 300); do grep -qs "ready:" "$rdir/n1.log" && grep -qs "ready:" "$rdir/n2.log" && break; sleep 0.1; done
    "$R" run -m "$f" --tokens 5,6,7,8 -n 32 --temp 0 --ignore-eos --ids --ring "$rdir/ring.conf" \
        --key "$rdir/coord.key" >"$work/ring.ids" 2>"$work/ring.err" && rc=0 || rc=$?
    "$R" run -m "$f" --tokens 5,6,7,8 -n 32 --temp 0 --ignore-eos --ids --device "$dev" >"$work/one.ids" 2>/dev/null || true
    kill "${pids[@]}" 2>/dev/null || true
    wait "${pids[@]}" 2>/dev/null || true
    same=$( [ $rc = 0 ] && cmp -s "$work/ring.ids" "$work/one.ids" && echo "the same 32 greedy tokens as one machine" ||
            echo "NOT the same tokens as one machine (exit $rc)")
    {
        echo
        echo "## A 2-node ring, both nodes on $dev (full-f32): $same"
        echo
        echo '```'
        sed -n '/^stage  node  /,/^decode:/p' "$work/ring.err" | grep -v '^$' || tail -5 "$work/ring.err"
        echo '```'
    } >>"$out/gpu.md"
    # Speed: the medium file, ringlm vs llama-bench at its defaults with every layer on the GPU.
    med=$work/medium.gguf
    "$R" synth -o "$med" --config medium --seed 1 --no-progress
    {
        echo
        echo "## Speed: medium file, 3 alternating runs"
        echo
        echo "ringlm: \`run --device $dev\` at its defaults (flash attention auto, f16 cache). llama-bench: \`-ngl 99\`,"
        echo "its defaults otherwise (flash attention auto, f16 cache; on the CPU, repacked weights)."
        echo
        echo "| run | ringlm prefill tok/s | llama-bench pp512 | ringlm decode tok/s | llama-bench tg128 |"
        echo "|---|---|---|---|---|"
    } >>"$out/gpu.md"
    p512=$(seq -s, 10 1 521)
    rm -f "$work/speed.txt"
    for r in 1 2 3; do
        "$R" run -m "$med" --tokens "$p512" -n 128 --temp 0 --ignore-eos --ids --device "$dev" \
            --metrics-json "$work/m.json" >/dev/null 2>&1
        rp=$(python3 -c "import json; m=json.load(open('$work/m.json')); print(round(m['prefill_tok_s'],1))")
        rd=$(python3 -c "import json; m=json.load(open('$work/m.json')); print(round(m['decode_tok_s'],1))")
        lb=$("$bench" -m "$med" -ngl 99 -p 512 -n 128 -r 1 -o csv 2>/dev/null | tail -2)
        lp=$(echo "$lb" | sed -n 1p | awk -F, '{print $(NF-1)}' | tr -d '"')
        ld=$(echo "$lb" | sed -n 2p | awk -F, '{print $(NF-1)}' | tr -d '"')
        echo "| $r | $rp | $lp | $rd | $ld |" >>"$out/gpu.md"
        echo "$rp $lp $rd $ld" >>"$work/speed.txt"
    done
    python3 - "$work/speed.txt" >>"$out/gpu.md" <<'PY'
import statistics, sys
rows = [[float(x) for x in l.split()] for l in open(sys.argv[1]) if l.strip()]
pp = statistics.median(r[0] / r[1] for r in rows)
tg = statistics.median(r[2] / r[3] for r in rows)
print("\nMedian of per-run ratios, ringlm / llama-bench: prefill %.2fx, decode %.2fx (goal: at least 1.0x)" % (pp, tg))
PY
    echo "gpu_check: done; $out/gpu.md"
    ;;
*)
    sed -n 2,20p "$0"; exit 2 ;;
esac
