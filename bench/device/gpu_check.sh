#!/usr/bin/env bash
# The GPU issue's check on a real NVIDIA GPU (the H200 this project may borrow: CUDA 13 with nvcc, 16 cores,
# nothing fetchable there). NOT RUN YET: no GPU has been lent to a session since it was written.
#
#   bench/device/gpu_check.sh --prepare     here: stage what the device machine cannot fetch under build/gpu-carry
#                                           (the pinned llama.cpp source, without docs, models and tests; the
#                                           Debian packages ringlm builds with, as .debs)
#   bench/device/gpu_check.sh --run OUTDIR  there (the device tool's `run`, carry build/gpu-carry): builds ggml with
#                                           CUDA for one architecture (sm_90) as shared libraries with the CUDA backend
#                                           linked in, ringlm against it (GGML_PREFIX), llama.cpp's CUDA build of
#                                           the same source as the oracle (tests/oracle) and llama-bench; then
#                                           1. ringlm devices shows CUDA0;
#                                           2. fidelity: ringlm logits on CUDA0 vs llama.cpp's CUDA build, f32/f16/q8_0/q4_K
#                                              files (worst relative difference), 32 greedy tokens vs llama.cpp;
#                                           3. speed: ringlm run on CUDA0 vs llama-bench -ngl 99 (defaults otherwise),
#                                              same file, alternating, medians of paired ratios (prefill pp512, decode tg128);
#                                           4. DSpark on CUDA0: 5 runs give the plain greedy tokens, none crashes;
#                                           5. a 2-node ring, both nodes on CUDA0: the one-machine tokens, the plan printed.
#                                           Writes OUTDIR/gpu.md (copy it to bench/results/gpu.md with the command used).
#                                           If the device's time limit stops it during the build, run it again: the
#                                           build in build/gpu-work is kept and resumes.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
CARRY=$ROOT/build/gpu-carry
case "${1:-}" in
--prepare)
    src=$(scripts/ggml.sh | sed -n 's/^LLAMA_SRC := //p')
    [ -d "$src" ] || { echo "gpu_check: no pinned llama.cpp source (run make first)"; exit 1; }
    mkdir -p "$CARRY/debs"
    tar czf "$CARRY/llama.cpp.tgz" -C "$src" CMakeLists.txt cmake ggml src include common vendor tools app
    (cd "$CARRY/debs" && apt-get download libsodium-dev libsodium23 libzmq3-dev libzmq5 libmicrohttpd-dev \
        libmicrohttpd12 libcjson-dev libcjson1 libpcre2-dev libpcre2-8-0 libpgm-5.3-0 libnorm1 libgnutls30 \
        libbsd0 2>&1 | tail -1)
    du -sh "$CARRY"
    ;;
--run)
    out=${2:?bench/device/gpu_check.sh --run OUTDIR}
    # GPU_CHECK_DEVICE=CPU: a dry run on a machine without CUDA (ggml and llama.cpp built without it, the CPU
    # in CUDA0's place), to catch the script's own faults before the few minutes a GPU is lent for.
    dev=${GPU_CHECK_DEVICE:-CUDA0}
    if [ "$dev" = CUDA0 ]; then cuda=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90); cuda_t=(ggml-cuda); else cuda=(-DGGML_CUDA=OFF); cuda_t=(); fi
    mkdir -p "$out"
    log=$out/gpu_check.log
    exec > >(tee "$log") 2>&1
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
    nvcc --version | tail -1 || true
    work=$ROOT/build/gpu-work
    # Kept between runs: a run stopped by the device's time limit during the CUDA build (ggml-cuda is the
    # long part) resumes it when started again; only the results are made afresh.
    mkdir -p "$work/src" "$work/sys"
    [ -f "$work/src/CMakeLists.txt" ] || tar xzf "$CARRY/llama.cpp.tgz" -C "$work/src"
    rm -rf "$work/ring"
    # The Debian packages ringlm builds with, unpacked into a prefix when the machine lacks them.
    if ! pkg-config --exists libsodium libzmq libmicrohttpd libcjson libpcre2-8 2>/dev/null; then
        for d in "$CARRY"/debs/*.deb; do dpkg-deb -x "$d" "$work/sys"; done
        export PKG_CONFIG_PATH=$work/sys/usr/lib/x86_64-linux-gnu/pkgconfig:$work/sys/usr/share/pkgconfig
        export PKG_CONFIG_SYSROOT_DIR=$work/sys
        export LIBRARY_PATH=$work/sys/usr/lib/x86_64-linux-gnu LD_LIBRARY_PATH=$work/sys/usr/lib/x86_64-linux-gnu
        export C_INCLUDE_PATH=$work/sys/usr/include
    fi
    # ggml + llama.cpp with CUDA (sm_90 only, to keep the build short) as shared libraries, the CUDA backend
    # linked into libggml (ggml refuses GGML_NATIVE with backends as modules: GGML_BACKEND_DL).
    cmake -S "$work/src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release "${cuda[@]}" \
        -DGGML_BACKEND_DL=OFF -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=ON \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF \
        -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
        -DCMAKE_INSTALL_PREFIX="$work/prefix" >"$out/cmake.log" 2>&1
    cmake --build "$work/build" -j"$(nproc)" --target ggml "${cuda_t[@]}" ggml-cpu llama llama-bench >>"$out/cmake.log" 2>&1
    mkdir -p "$work/prefix/lib" "$work/prefix/include"
    cp "$work"/src/ggml/include/*.h "$work/prefix/include/"
    find "$work/build" -name 'libggml*.so*' -exec cp -P {} "$work/prefix/lib/" \;
    make -j"$(nproc)" GGML_PREFIX="$work/prefix" ringlm >"$out/make.log" 2>&1
    cc -std=c11 -D_GNU_SOURCE -O2 -I"$work/src/include" -I"$work/src/ggml/include" -o "$work/oracle-cuda" \
        tests/oracle/oracle.c src/model/logits_file.c src/base/err.c \
        "$(find "$work/build" -name 'libllama.so' | head -1)" -L"$work/prefix/lib" -lggml -lggml-base \
        -Wl,-rpath,"$work/prefix/lib:$(dirname "$(find "$work/build" -name 'libllama.so' | head -1)")" -ldl -lm
    export RINGLM_BACKEND_DIR=$work/prefix/lib
    ./ringlm devices | tee "$out/devices.txt"
    grep -q "^$dev " "$out/devices.txt" || { echo "gpu_check: no $dev"; exit 1; }
    {
        echo "# ringlm on a GPU (bench/device/gpu_check.sh --run)"
        echo
        echo "GPU: $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null); $(nvcc --version | tail -1)"
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
        ./ringlm synth -o "$f" --config "$config" --type "$type" --seed 2 --no-progress
        ./ringlm logits -m "$f" --tokens "$toks" --prefill 64 -o "$work/r.bin" --device "$dev"
        "$work/oracle-cuda" logits -m "$f" --tokens "$toks" --prefill 64 -o "$work/o.bin" --gpu-layers 99
        rel=$(./ringlm compare "$work/o.bin" "$work/r.bin" --tol 1e9 | grep -o 'rel [^ ]*' | cut -d' ' -f2)
        ./ringlm run -m "$f" --tokens 5,6,7,8 -n 32 --temp 0 --ignore-eos --ids --device "$dev" >"$work/r.ids" 2>/dev/null
        "$work/oracle-cuda" generate -m "$f" --tokens 5,6,7,8 -n 32 --gpu-layers 99 >"$work/o.ids"
        same=$(diff -q "$work/r.ids" "$work/o.ids" >/dev/null && echo identical || echo differ)
        echo "| $name | $rel | $same |" >>"$out/gpu.md"
    done
    # DSpark on the GPU (taps read back from the device, KDA rollback there), 5 runs of 20 tokens: on lavapipe
    # with ggml-vulkan's op fusion on, such runs corrupted the heap (docs/devices.md); does a real GPU?
    f=$work/full-f32.gguf
    ./ringlm synth -o "$work/dspark.gguf" --config tests/configs/k3-full.json --draft dspark --seed 3 --no-progress
    ./ringlm run -m "$f" --tokens 5,6,7,8 -n 20 --temp 0 --ignore-eos --ids --device "$dev" >"$work/plain.ids" 2>/dev/null
    ds_ok=0 ds_crash=0
    for r in 1 2 3 4 5; do
        ./ringlm run -m "$f" --tokens 5,6,7,8 -n 20 --temp 0 --ignore-eos --ids --device "$dev" \
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
    ./ringlm keygen -o "$rdir/coord.key" >"$rdir/coord.pub"
    : >"$rdir/ring.conf"
    pids=()
    for i in 1 2; do
        ./ringlm keygen -o "$rdir/n$i.key" >"$rdir/n$i.pub"
        port=$((47810 + i))
        ./ringlm node --listen "127.0.0.1:$port" --key "$rdir/n$i.key" --allow "$(cat "$rdir/coord.pub")" \
            --models "$rdir/models" --device "$dev" --vram 0.025 --cache "$rdir/cache$i" >"$rdir/n$i.log" 2>&1 &
        pids+=($!)
        echo "127.0.0.1:$port $(cat "$rdir/n$i.pub")" >>"$rdir/ring.conf"
    done
    for _ in $(seq 300); do grep -qs "ready:" "$rdir/n1.log" && grep -qs "ready:" "$rdir/n2.log" && break; sleep 0.1; done
    ./ringlm run -m "$f" --tokens 5,6,7,8 -n 32 --temp 0 --ignore-eos --ids --ring "$rdir/ring.conf" \
        --key "$rdir/coord.key" >"$work/ring.ids" 2>"$work/ring.err" && rc=0 || rc=$?
    ./ringlm run -m "$f" --tokens 5,6,7,8 -n 32 --temp 0 --ignore-eos --ids --device "$dev" >"$work/one.ids" 2>/dev/null || true
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
    ./ringlm synth -o "$med" --config medium --seed 1 --no-progress
    bench=$(find "$work/build" -name llama-bench -type f | head -1)
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
        ./ringlm run -m "$med" --tokens "$p512" -n 128 --temp 0 --ignore-eos --ids --device "$dev" \
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
