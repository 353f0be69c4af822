#!/usr/bin/env bash
# Computing on a GPU through ggml's Vulkan backend, on Mesa's software Vulkan device (lavapipe), which CI
# machines have (issue: every ggml backend on every node, with partial offload).
#
# The Vulkan backend is llama.cpp's own prebuilt module of the pinned release, loaded by ringlm at run time
# (scripts/ggml-backends.sh); lavapipe runs its shaders on the CPU, so these check placement and numbers,
# not speed. The GPU's kernels are not the CPU's: logits are compared within a stated relative bound, and
# the worst difference is printed.
#   - `ringlm devices` lists the Vulkan device, and the CPU.
#   - For f32, f16, q8_0, q4_K and IQ2_XXS files: a 16-token prefill and 4 decode steps on Vulkan0 against
#     llama.cpp's Vulkan build (tests/oracle/oracle-gpu, all layers on the GPU, flash attention off as
#     ringlm's default on Vulkan) on the same device: relative
#     difference <= 1e-2 (x max|logit|), the worst printed; against ringlm on the CPU: <= 1e-2 on the f32
#     and f16 files, and on every file no farther than llama.cpp's Vulkan logits are from llama.cpp's CPU
#     logits (both printed; see below why).
#   - 32 greedy tokens on Vulkan0 equal the CPU's, on the f32 and f16 files; and (16 tokens) equal with the
#     layers split between the GPU and the CPU (--gpu-layers), and with routed experts kept on the CPU
#     (--n-cpu-moe, --cpu-moe).
#   - A 2-node ring, one node on Vulkan0 and one on the CPU: the one-machine tokens; the coordinator prints
#     where each stage computes. A Vulkan node offering less device memory than its range (--vram) gets a
#     plan that keeps routed experts, or whole layers, in RAM; it computes that split, with the same tokens.
#     Audits of its stage recompute on the coordinator's CPU within --audit-tol, or on the coordinator's own
#     Vulkan device with the same split, bit for bit; the summary says which.
#   - Two devices (lavapipe twice): --device A,B (and no --device: every GPU) split the layers, logits within
#     1e-2 of one device's, tokens the CPU's; a node on both is planned as one tier, its plan line naming each
#     device's layers as the node splits them; a device named
#     twice or the CPU in a list are refused.
#   - VRAM -> RAM -> disk: --mem with a device (run --vram: a smaller device): the dense parts on Vulkan0, the
#     routed experts it cannot hold in RAM through the expert cache: the CPU's tokens, and logits equal to the
#     same split without --mem (fusion off); a node offering a device, RAM and a disk gets that plan.
#   - Errors: --vram above the free memory, an unknown device on a node; `devices --measure` gives a speed.
#   - Speculative decoding (a DSpark draft on taps read from the device, rollback of the KDA state on the
#     device) gives the plain tokens.
#   - Errors: an unknown device name; a device too small for the weights; --mem below the least with a device;
#     a forced split larger than --vram.
. "$(dirname "$0")/lib.sh"
export GGML_VK_VISIBLE_DEVICES=0 # lavapipe is a CPU-type Vulkan device, which ggml skips unless named
# llama.cpp's Vulkan build, run as ringlm runs Vulkan (docs/devices.md): without the backend's node reordering
# and without flash attention, both of which crash lavapipe now and then (llama.cpp's build as well as ours).
export GGML_VK_DISABLE_GRAPH_OPTIMIZE=1
ORACLE_GPU=$ROOT/tests/oracle/oracle-gpu

"$RINGLM" devices >"$WORK/devices" 2>&1 || true
check "ringlm devices lists the Vulkan device as a GPU" grep -Eq '^Vulkan0 +Vulkan +GPU ' "$WORK/devices"
check "ringlm devices lists the CPU" grep -Eq '^CPU +CPU +CPU ' "$WORK/devices"
if ! grep -q '^Vulkan0' "$WORK/devices"; then
    echo "no Vulkan device (needs libvulkan1 and mesa-vulkan-drivers, scripts/install-deps.sh):"; cat "$WORK/devices"
    finish
fi

worst=0
rel_of() { "$RINGLM" compare "$1" "$2" --tol 1e9 | grep -o 'rel [^ ]*' | head -1 | cut -d' ' -f2; }
toks=$(seq -s, 7 3 66) # 20 ids (lavapipe runs a tiny K3 step in ~0.4 s: the checks stay short)
cases=("full-f32 k3-full f32" "lean-f16 k3-lean f16" "full-q8_0 k3-full q8_0" "lean-q4_K k3-lean q4_K"
       "lean-iq2_xxs k3-lean iq2_xxs")
for c in "${cases[@]}"; do
    read -r name config type <<<"$c"
    f=$(model "$name" "$config" "$type" 2)
    "$RINGLM" logits -m "$f" --tokens "$toks" --prefill 16 -o "$WORK/cpu.bin" --device CPU --threads 2
    "$RINGLM" logits -m "$f" --tokens "$toks" --prefill 16 -o "$WORK/vk.bin" --device Vulkan0 --threads 2
    "$ORACLE_GPU" logits -m "$f" --tokens "$toks" --prefill 16 -o "$WORK/ovk.bin" --gpu-layers 99 --fa off
    "$ORACLE" logits -m "$f" --tokens "$toks" --prefill 16 -o "$WORK/ocpu.bin"
    cp "$WORK/vk.bin" "$WORK/vk-$name.bin"
    rel=$(rel_of "$WORK/ovk.bin" "$WORK/vk.bin")
    check "$name: Vulkan0 logits (16-token prefill, 4 steps) within 1e-2 of llama.cpp's Vulkan build on the same device ($rel)" \
        "$RINGLM" compare "$WORK/ovk.bin" "$WORK/vk.bin" --tol 1e-2
    worst=$(awk -v a="$worst" -v b="${rel:-1}" 'BEGIN { print (b + 0 > a + 0) ? b : a }')
    # Against the CPU: a random-weight K3 routes on near ties, so a GPU's other rounding can flip an expert
    # (and then a row's logits) - llama.cpp's own Vulkan build against its CPU build does the same. So the
    # bound is: no farther from ringlm's CPU logits than llama.cpp's Vulkan logits are from its CPU's (its
    # CPU build, tests/oracle/oracle: with a GPU present llama.cpp keeps CPU weights in the GPU's pinned
    # host memory instead of the CPU's repacked layouts, so its Vulkan build's CPU path is not its default).
    ours=$(rel_of "$WORK/cpu.bin" "$WORK/vk.bin") theirs=$(rel_of "$WORK/ocpu.bin" "$WORK/ovk.bin")
    echo "$name: Vulkan0 vs CPU: ringlm $ours, llama.cpp $theirs (relative to max|logit|)"
    check "$name: ringlm's Vulkan0 logits are as close to its CPU logits as llama.cpp's are ($ours vs $theirs)" \
        awk -v a="$ours" -v b="$theirs" 'BEGIN { exit !(a + 0 <= b + 1e-2) }'
    # Unquantized files flip no expert over these 20 tokens: there the bound is the plain one.
    case $type in f32|f16) check "$name: Vulkan0 logits within 1e-2 of ringlm on the CPU ($ours)" \
        awk -v a="$ours" 'BEGIN { exit !(a + 0 <= 1e-2) }' ;; esac
    check "$name: the CPU logits equal llama.cpp's CPU logits bit for bit (the baseline of that comparison)" \
        "$RINGLM" compare "$WORK/ocpu.bin" "$WORK/cpu.bin" --tol 0
done
echo "worst relative difference of Vulkan0 logits from llama.cpp's Vulkan build: $worst"

# Greedy text: all on the GPU, split, experts on the CPU, all on the CPU (32 tokens whole, 16 or 8 for the rest).
gen() { "$RINGLM" run -m "$1" --tokens 5,6,7,8 -n "$2" --temp 0 --ignore-eos --ids --threads 2 "${@:3}" 2>"$WORK/gen.err"; }
for c in "lean-f16 k3-lean f16" "full-f32 k3-full f32"; do
    read -r name config type <<<"$c"
    f=$(model "$name" "$config" "$type" 2)
    gen "$f" 32 --device CPU >"$WORK/cpu.ids"
    gen "$f" 32 --device Vulkan0 >"$WORK/vk.ids"
    check_same "$name: 32 greedy tokens on Vulkan0 equal the CPU's" "$WORK/cpu.ids" "$WORK/vk.ids"
done
cut -d, -f1-16 "$WORK/cpu.ids" >"$WORK/cpu16.ids" # full-f32's
cut -d, -f1-8 "$WORK/cpu.ids" >"$WORK/cpu8.ids" # (8 tokens for the variants below: lavapipe decodes ~2 tok/s)
gen "$f" 16 --device Vulkan0 --gpu-layers 3 --progress >"$WORK/split.ids"
check_same "--gpu-layers 3 (3 of 6 layers on Vulkan0, the rest and the head on the CPU): the same tokens" \
    "$WORK/cpu16.ids" "$WORK/split.ids"
check "--progress draws a bar while the weights are copied into Vulkan0" grep -q "copying to Vulkan0.*100%" "$WORK/gen.err"
gen "$f" 16 --device Vulkan0 --gpu-layers 0 >"$WORK/zero.ids"
check_same "--gpu-layers 0: the same tokens" "$WORK/cpu16.ids" "$WORK/zero.ids"
RINGLM_DEVICE=Vulkan0 gen "$f" 8 --n-cpu-moe 3 >"$WORK/moe.ids"
check "RINGLM_DEVICE is the default --device (the suite sets CPU, tests/lib.sh)" grep -q "computing on Vulkan0" "$WORK/gen.err"
check_same "--n-cpu-moe 3 (routed experts of layers 0-2 in RAM): the same tokens" "$WORK/cpu8.ids" "$WORK/moe.ids"
gen "$f" 8 --device Vulkan0 --cpu-moe >"$WORK/moe.ids"
check_same "--cpu-moe (every routed expert in RAM): the same tokens" "$WORK/cpu8.ids" "$WORK/moe.ids"
# VRAM -> RAM -> disk: --mem with a device. With --vram 0.025 GB the full-f32 file's dense parts fit Vulkan0
# and one layer's experts beside them; the default under --mem puts every layer there with the experts of the
# first ones in RAM, read through the expert cache (--mem 0.004: room for a few). Logits equal the same split
# without --mem (--n-cpu-moe, the split read from the run's line) bit for bit with ggml-vulkan's op fusion off
# (on, a chunked prefill moved the last bits: docs/devices.md); greedy tokens with it on equal the CPU's. At
# --vram 0.012 the dense parts alone do not fit: the first layers on the device, every expert in RAM.
gen "$f" 8 --device Vulkan0 --vram 0.025 --mem 0.004 >"$WORK/xc.ids"
cp "$WORK/gen.err" "$WORK/xc.err"
ncm=$(sed -n 's/.*layers \[0, 6) and the output head.*routed experts of layers \[0, \([0-9]*\)) in RAM.*/\1/p' "$WORK/xc.err")
check "--mem with Vulkan0 (--vram 0.025): dense parts on the device, the first layers' experts ($ncm) through the cache" \
    bash -c "[ -n '$ncm' ] && [ '$ncm' -gt 1 ] && [ '$ncm' -lt 6 ] && grep -q 'expert cache: ' '$WORK/xc.err'"
check_same "... the CPU's greedy tokens" "$WORK/cpu8.ids" "$WORK/xc.ids"
check_fails "--mem below the least with a device: the error names the RAM it needs" \
    "too small for layers \[0, 6\): they keep .* resident in RAM.*the least that runs is --mem [0-9.]+" \
    "$RINGLM" run -m "$f" --tokens 5,6 -n 2 --device Vulkan0 --vram 0.025 --mem 0.0001
least=$(sed -n 's/.*the least that runs is --mem \([0-9.]*\).*/\1/p' "$WORK/err")
# At the least budget (two slots of each kind) a chunk's layer runs in passes: the gathered rows and slot ids
# the host writes at each stop are read on the CPU.
GGML_VK_DISABLE_FUSION=1 "$RINGLM" logits -m "$f" --tokens "$toks" --chunk 7 --device Vulkan0 --n-cpu-moe "${ncm:-1}" -o "$WORK/xa.bin" --threads 2 2>/dev/null
GGML_VK_DISABLE_FUSION=1 "$RINGLM" logits -m "$f" --tokens "$toks" --chunk 7 --device Vulkan0 --vram 0.025 --mem "${least:-1}" -o "$WORK/xb.bin" --threads 2 2>/dev/null
check_same "... logits (chunks of 7, --mem $least: in passes) = --n-cpu-moe $ncm without --mem, bit for bit (fusion off)" "$WORK/xa.bin" "$WORK/xb.bin"
gen "$f" 8 --device Vulkan0 --vram 0.012 --mem 0.012 >"$WORK/xc.ids"
check "--mem with Vulkan0 (--vram 0.012): the first layers on the device, all experts through the cache, the CPU's tokens" \
    bash -c "same_files '$WORK/cpu8.ids' '$WORK/xc.ids' && grep -q 'layers \[0, [1-5]), .*on the CPU; routed experts of layers \[0, [1-5]) in RAM' '$WORK/gen.err' &&
             grep -q 'expert cache: ' '$WORK/gen.err'"
check_fails "a split that --vram cannot hold: a clear error naming both" "layers \[0, 6\) put .* MiB of weights on Vulkan0, more than --vram 0.0100 GB" \
    "$RINGLM" run -m "$f" --tokens 5,6 -n 2 --device Vulkan0 --gpu-layers 6 --vram 0.01
# A DSpark draft reads the target's tapped hidden states, which come back from the device; its blocks are
# verified with rollback of the KDA state on the device. 8 tokens: lavapipe verifies a block in ~1 s. Every
# layer and the head on the device (taps: inputs of layers 1, 3 and 5), then layers 0-4 there and layer 5
# with the head on the CPU. Both with ggml-vulkan's op fusion off: with it on, lavapipe's queue thread
# corrupted the heap in most DSpark runs, with it off never (docs/devices.md).
# With fusion off a DSpark run on lavapipe still died once in this suite's runs (a segfault in a split run):
# a run killed by a signal is run once more, and the log says so; wrong tokens still fail.
gen_once_more() { # OUT gen-args...: gen into OUT; again if a signal killed it
    local out=$1 rc=0; shift
    gen "$@" >"$out" || rc=$?
    if [ $rc -ge 128 ]; then
        echo "# lavapipe: the run died of signal $((rc - 128)); once more (docs/devices.md)"
        rc=0; gen "$@" >"$out" || rc=$?
    fi
    return $rc
}
"$RINGLM" synth --no-progress -o "$WORK/dspark.gguf" --config "$ROOT/tests/configs/k3-full.json" --draft dspark --seed 3 >/dev/null
# Every step drafts whole blocks (--draft-fixed --draft-fallback off): what is checked is the device's taps and
# rollback, so every block should carry drafts; adaptive drafting would pause this random draft after its first
# block on a device this slow (its cost model, docs/spec.md).
DS=(--draft-fixed --draft-fallback off)
GGML_VK_DISABLE_FUSION=1 gen_once_more "$WORK/spec.ids" "$f" 8 --device Vulkan0 --draft "dspark:$WORK/dspark.gguf" "${DS[@]}"
check_same "speculative decoding (DSpark: taps from Vulkan0, KDA rollback and the head on the device) gives the plain tokens" \
    "$WORK/cpu8.ids" "$WORK/spec.ids"
check "... and it ran speculatively, every layer and the head on the device" \
    bash -c "grep -q 'speculative (dspark:' '$WORK/gen.err' && grep -q 'layers \[0, 6) and the output head' '$WORK/gen.err'"
GGML_VK_DISABLE_FUSION=1 gen_once_more "$WORK/spec.ids" "$f" 8 --device Vulkan0 --gpu-layers 5 --draft "dspark:$WORK/dspark.gguf" "${DS[@]}"
check_same "... and with layers 0-4 on Vulkan0, the last and the head on the CPU" "$WORK/cpu8.ids" "$WORK/spec.ids"
check "... and it ran speculatively" grep -q "speculative (dspark:" "$WORK/gen.err"

# A 2-node ring, one node on Vulkan0 and one on the CPU: the same greedy tokens as one machine.
. "$(dirname "$0")/ring_lib.sh"
mkdir -p "$RING/models"
ln -sf "$f" "$RING/models/full-f32.gguf"
ring_keys 4
# (a declared device speed: lavapipe measures ~1 GB/s, below the CPU's, and the planner would leave it idle)
ring_start 1 "$RING/models" --device Vulkan0 --device-speed 20 && ring_start 2 "$RING/models" --device CPU
ring_conf "$WORK/ring.conf" 1 2
"$RINGLM" run -m "$f" --tokens 5,6,7,8 -n 16 --temp 0 --ignore-eos --ids --ring "$WORK/ring.conf" \
    --key "$RING/coord.key" >"$WORK/ring.ids" 2>"$WORK/ring.err" || cat "$WORK/ring.err"
check_same "a 2-node ring, node 1 on Vulkan0 and node 2 on the CPU: the tokens of one machine" \
    "$WORK/cpu16.ids" "$WORK/ring.ids"
check "the Vulkan node says it computes there" grep -q "computing on Vulkan0" "$RING/n1.log"
check "the coordinator prints where each stage computes" \
    grep -q "stage .* computes on Vulkan0 (.*): layers \[" "$WORK/ring.err"
ring_stop

# The planner's device tier (plan.h): a Vulkan node offering less device memory than its range needs
# (--vram) keeps the rest in RAM, as the plan says: with 30 MB the routed experts of the first layers, with
# 10 MB the last layers whole (their dense parts alone exceed it). The node computes the plan's split, and
# the tokens stay those of one machine.
for v in "0.03 experts" "0.01 layers"; do
    read -r vram how <<<"$v"
    ring_start 3 "$RING/models" --device Vulkan0 --device-speed 20 --vram "$vram"
    ring_conf "$WORK/ring1.conf" 3
    # Audits of the Vulkan stage: recomputed on the coordinator's CPU (RINGLM_DEVICE=CPU, the suite's) within
    # --audit-tol, or on its own Vulkan device with the node's split, where they match bit for bit.
    cdev=CPU; [ "$how" = layers ] && cdev=Vulkan0
    RINGLM_DEVICE=$cdev "$RINGLM" run -m "$f" --tokens 5,6,7,8 -n 8 --temp 0 --ignore-eos --ids --ring "$WORK/ring1.conf" \
        --key "$RING/coord.key" --receipts "$WORK/rc.jsonl" --audit-rate 1 >"$WORK/ring1.ids" 2>"$WORK/ring1.err" || cat "$WORK/ring1.err"
    ring_stop
    check_same "--vram $vram: the tokens of one machine" "$WORK/cpu8.ids" "$WORK/ring1.ids"
    grep -A1 '^audits:' "$WORK/ring1.err" || true
    if [ "$cdev" = CPU ]; then
        check "audits of a Vulkan stage from a CPU coordinator: on the CPU within the tolerance, and say so" \
            sh -c "grep -q 'none failed' '$WORK/ring1.err' && grep -q 'stage 1 recomputed on the CPU (the node computes on Vulkan' '$WORK/ring1.err'"
    else
        check "audits of a Vulkan stage from a Vulkan coordinator: on Vulkan0 with the node's split, bit for bit" \
            sh -c "grep -q 'largest difference 0 (tolerance 0.01); none failed' '$WORK/ring1.err' &&
                   grep -q 'stage 1 recomputed on Vulkan0 (the node.s backend, Vulkan)' '$WORK/ring1.err'"
    fi
    plan=$(grep -o '(Vulkan0: layers [^)]*)' "$WORK/ring1.err" | head -1)
    where=$(grep -o 'computes on Vulkan0 .*' "$WORK/ring1.err" | head -1)
    echo "--vram $vram: plan $plan; node $where"
    if [ "$how" = experts ]; then
        n=$(sed -n 's/.*their routed experts of 0-\([0-9]*\) in RAM.*/\1/p' <<<"$plan")
        check "--vram $vram: the plan keeps all 6 layers on Vulkan0 and the routed experts of the first ones in RAM" \
            grep -q "layers 0-5, their routed experts of 0-[0-4] in RAM; .* on Vulkan0, .* in RAM" <<<"$plan"
        check "... and the node computes that split" grep -q "routed experts of layers \[0, $((n + 1))) in RAM" <<<"$where"
    else
        n=$(sed -n 's/^(Vulkan0: layers 0-\([0-9]*\); CPU: layers .*/\1/p' <<<"$plan")
        check "--vram $vram: the plan puts the first layers on Vulkan0 and the rest on the CPU" \
            grep -q "^(Vulkan0: layers 0-[0-4]; CPU: layers [1-5]-5; .* on Vulkan0, .* in RAM)" <<<"$plan"
        check "... and the node computes that split" grep -q "layers \[0, $((n + 1))),.*layers \[$((n + 1)), 6) on the CPU" <<<"$where"
    fi
done
# VRAM -> RAM -> disk on a node: Vulkan0 offering 25 MB, RAM 6 MB (--mem) and a disk. The planner puts the
# dense parts on the device and the routed experts it cannot hold in RAM, of which it caches what fits and
# reads the rest from disk; the node computes that split through its expert cache; one machine's tokens.
ring_start 3 "$RING/models" --device Vulkan0 --device-speed 20 --vram 0.025 --mem 0.006 --disk 1
ring_conf "$WORK/ring1.conf" 3
"$RINGLM" run -m "$f" --tokens 5,6,7,8 -n 8 --temp 0 --ignore-eos --ids --ring "$WORK/ring1.conf" \
    --key "$RING/coord.key" >"$WORK/ring1.ids" 2>"$WORK/ring1.err" || cat "$WORK/ring1.err"
ring_stop
grep -o '(Vulkan0: layers .*' "$WORK/ring1.err" | head -1
check_same "--vram 0.025 --mem 0.006 on a node: the tokens of one machine" "$WORK/cpu8.ids" "$WORK/ring1.ids"
check "... the plan: every layer on Vulkan0, experts of the first in RAM, part of them read from disk" \
    grep -q "(Vulkan0: layers 0-5, their routed experts of 0-[0-5] in RAM; .*(experts in RAM [0-9]*% in memory, the rest from disk" "$WORK/ring1.err"
check "... and the node computes it through its expert cache" \
    sh -c "grep -q 'computing on Vulkan0 .*routed experts of layers \[0, [1-6]) in RAM' '$RING/n3.log' && grep -q 'expert cache of' '$RING/n3.log'"
# Two devices (lavapipe listed twice: GGML_VK_VISIBLE_DEVICES=0,0 makes Vulkan0 and Vulkan1): --device A,B splits
# the device layers between them in proportion to free memory, as llama.cpp's default split does; with no
# --device (and no RINGLM_DEVICE) every GPU is used. The same kernels run either way, but not always fused
# alike (ggml-vulkan fuses neighbouring ops within a split, and a second device moves the splits), so the
# logits are held within 1e-2 of one device's and the tokens to the CPU's. A node on both offers their
# memory as one tier.
export GGML_VK_VISIBLE_DEVICES=0,0
"$RINGLM" logits -m "$f" --tokens "$toks" --prefill 16 -o "$WORK/vk2.bin" --device Vulkan0,Vulkan1 --threads 2 2>"$WORK/l2.err"
check "--device Vulkan0,Vulkan1: logits within 1e-2 of one device's ($(rel_of "$WORK/vk-full-f32.bin" "$WORK/vk2.bin"))" \
    "$RINGLM" compare "$WORK/vk-full-f32.bin" "$WORK/vk2.bin" --tol 1e-2
RINGLM_DEVICE= gen "$f" 8 >"$WORK/two.ids"
check "no --device with two GPUs: both used, the CPU's tokens" \
    bash -c "same_files '$WORK/cpu8.ids' '$WORK/two.ids' && grep -q 'computing on Vulkan0 .*layers \[0, 3).*; Vulkan1 .*layers \[3, 6) and the output head' '$WORK/gen.err'"
gen "$f" 8 --device Vulkan1,Vulkan0 --gpu-layers 4 --n-cpu-moe 2 >"$WORK/two.ids"
check "--device Vulkan1,Vulkan0 --gpu-layers 4 --n-cpu-moe 2: in that order, the rest on the CPU, the CPU's tokens" \
    bash -c "same_files '$WORK/cpu8.ids' '$WORK/two.ids' && grep -q 'Vulkan1 .*layers \[0, 2).*; Vulkan0 .*layers \[2, 4).*layers \[4, 6) on the CPU; routed experts of layers \[0, 2) in RAM' '$WORK/gen.err'"
check_fails "a device named twice: refused" "--device Vulkan0,Vulkan0 names Vulkan0 twice" \
    "$RINGLM" run -m "$f" --tokens 5,6 -n 2 --device Vulkan0,Vulkan0
check_fails "the CPU in a device list: refused, saying why" "the CPU is not a device to split layers onto" \
    "$RINGLM" run -m "$f" --tokens 5,6 -n 2 --device Vulkan0,CPU
for v in "Vulkan0," ",Vulkan0" "Vulkan0,,Vulkan1"; do
    rc=0
    "$RINGLM" run -m "$f" --tokens 5 -n 1 --device "$v" >/dev/null 2>"$WORK/err" || rc=$?
    check "--device '$v' (an empty name in the list): a usage error naming the option" \
        sh -c "[ $rc = 2 ] && grep -q \"bad value '$v' for --device\" '$WORK/err'"
done
ring_start 3 "$RING/models" --device Vulkan0,Vulkan1 --device-speed 20 --vram 0.03
ring_conf "$WORK/ring1.conf" 3
"$RINGLM" run -m "$f" --tokens 5,6,7,8 -n 8 --temp 0 --ignore-eos --ids --ring "$WORK/ring1.conf" \
    --key "$RING/coord.key" >"$WORK/ring1.ids" 2>"$WORK/ring1.err" || cat "$WORK/ring1.err"
ring_stop
check "a node on two devices: planned as one tier (Vulkan0,Vulkan1), computes on both, the one-machine tokens" \
    bash -c "same_files '$WORK/cpu8.ids' '$WORK/ring1.ids' && grep -q 'on Vulkan0,Vulkan1, .* in RAM)' '$WORK/ring1.err' &&
           grep -q 'computes on Vulkan0 .*; Vulkan1 ' '$WORK/ring1.err'"
# The printed plan says which layers each of the node's devices gets (split by their free memory, as the
# node's engine splits them), and the node computes exactly that split.
cut0=$(sed -n 's/.*(Vulkan0: layers 0-\([0-9]*\), Vulkan1: layers [0-9]*-5[,;].*/\1/p' "$WORK/ring1.err" | head -1)
check "... the plan names each device's layers (Vulkan0: 0-$cut0), and the node computes that split" \
    sh -c "[ -n '$cut0' ] && grep -q 'Vulkan1: layers $((${cut0:-0} + 1))-5' '$WORK/ring1.err' &&
           grep -q 'computes on Vulkan0 (.*): layers \[0, $((${cut0:-0} + 1))),.*; Vulkan1 (.*): layers \[$((${cut0:-0} + 1)), 6)' '$WORK/ring1.err'"
export GGML_VK_VISIBLE_DEVICES=0

check_fails "a node offering more device memory than is free: a clear error" "--vram 1000.00 GB is more than Vulkan0 has free" \
    "$RINGLM" node --listen 127.0.0.1:1 --key "$RING/n4.key" --allow "$(cat "$RING/coord.pub")" --device Vulkan0 --vram 1000
check_fails "a node on an unknown device: refused at start, naming the devices" "no device named 'Vulkan7'.*Vulkan0" \
    "$RINGLM" node --listen 127.0.0.1:1 --key "$RING/n4.key" --allow "$(cat "$RING/coord.pub")" --device Vulkan7
"$RINGLM" devices --measure --threads 2 >"$WORK/measure" 2>&1
check "ringlm devices --measure: a speed for Vulkan0 (what a node reports)" \
    grep -Eq '^Vulkan0 .* [0-9]+\.[0-9]+ +[0-9]+\.[0-9]+ +llvmpipe' "$WORK/measure"

check_fails "an unknown device is refused, naming the devices there are" "no device named 'Vulkan7'.*Vulkan0" \
    "$RINGLM" run -m "$f" --tokens 5,6 -n 2 --device Vulkan7
check_fails "ringlm devices --backends DIR that cannot be read: a clear error" "cannot read the backend module directory" \
    "$RINGLM" devices --backends "$WORK/no-such-dir"
RINGLM_BACKEND_DIR=$WORK/no-such-dir "$RINGLM" devices >"$WORK/nodev.out" 2>"$WORK/nodev.err"
check "without its module directory: the CPU alone, and why" \
    sh -c "grep -q '^CPU ' '$WORK/nodev.out' && ! grep -q Vulkan0 '$WORK/nodev.out' && grep -q 'cannot read' '$WORK/nodev.err'"
# A device whose buffers may be at most 64 KiB cannot hold a 256 KiB weight.
GGML_VK_FORCE_MAX_BUFFER_SIZE=65536 GGML_VK_FORCE_MAX_ALLOCATION_SIZE=65536 \
    check_fails "weights that do not fit the device: a clear error naming it and the numbers" \
    "Vulkan0.*MiB.*--gpu-layers" "$RINGLM" run -m "$f" --tokens 5,6 -n 2 --device Vulkan0
finish
