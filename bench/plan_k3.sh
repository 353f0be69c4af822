#!/usr/bin/env bash
# What `ringlm plan` predicts for Kimi K3 at its real shapes (issue #21): shape-only manifests (synth
# --shape-only; no weights) of the release's quantization (MXFP4 experts) and community quants, on the rings
# people run it on (bench/rings/*.conf, every assumption written there), greedy and with speculation at an
# acceptance of 0.7 (DSpark's typical ~5 of 7; the draft depth chosen by the planner), a 4096-token prompt,
# 32k context. Writes bench/results/plan-k3.md. Runs in seconds: nothing is loaded.
set -euo pipefail
cd "$(dirname "$0")/.."
make -s ringlm
mkdir -p build/bench bench/results
out=bench/results/plan-k3.md
{
    echo "# ringlm plan: Kimi K3 (real shapes) on common rings"
    echo
    echo "\`bench/plan_k3.sh\`: \`ringlm plan --manifest (synth --shape-only of bench/configs/CONFIG.json) --nodes"
    echo "bench/rings/RING.conf --ctx 32768 --prompt 4096 --acceptance 0.7\`. Every figure is a prediction from"
    echo "spec-sheet numbers and the assumptions in docs/plan.md (decode at half the memory bandwidth, the"
    echo "delays written in each ring file), not a measurement. The two-cluster ring offloads partially (VRAM"
    echo "first, then RAM: plan.h). The one-desktop rings read routed experts from NVMe"
    echo "past their RAM (the expert cache, docs/experts.md; hit rate = the share cached). Speculation: two blocks in flight"
    echo "(plan's default, as run --ring's), drafting not counted (no DSpark file of K3's shapes is given). The plan"
    echo "holds speculation's rollback copies (every KDA layer's state after each token of the blocks in flight and"
    echo "the one being computed: 3 x (k + 1) copies of 443 MiB per sequence over the ring; docs/plan.md): the"
    echo "speculative column gives k and their size."
    echo
    echo "| ring | model | weights | fits | stages | greedy tok/s | speculative tok/s (k drafted; rollback copies) | TTFT 4k s | floor tok/s | dominant |"
    echo "|---|---|---|---|---|---|---|---|---|---|"
    for ring in eu-16x5090 eu-6xpro6000 switch-16xgb10 wan-2clusters one-64gb-nvme one-192gb-nvme; do
        for cfg in k3-real k3-real-q2_k k3-real-iq1_s k3-real-iq1_s-reap50; do
            m=build/bench/$cfg.manifest
            [ -f "$m" ] || ./ringlm synth --config "bench/configs/$cfg.json" --shape-only -o "$m" >/dev/null
            gib=$(./ringlm synth --config "bench/configs/$cfg.json" --dry-run | awk '/bytes of tensor data/ { gsub(/[()]/, ""); print $(NF-1) }')
            if ./ringlm plan --manifest "$m" --nodes "bench/rings/$ring.conf" --ctx 32768 --prompt 4096 --acceptance 0.7 \
                --json >build/bench/plan.json 2>build/bench/plan.err; then
                python3 - "$ring" "$cfg" "$gib" build/bench/plan.json <<'PY'
import json, sys
ring, cfg, gib, path = sys.argv[1:]
j = json.load(open(path)); p = j['predict']
print('| %s | %s | %s GiB | yes | %d | %.2f | %.2f (%d; %.1f GiB) | %.1f | %.0f | %s |' % (ring, cfg, gib, len(j['stages']),
      p['greedy_tok_s'], p['spec_tok_s'], p['draft_k'], p['rollback_bytes'] / 2**30, p['ttft_s'], p['floor_tok_s'],
      p['dominant']))
PY
            elif ./ringlm plan --manifest "$m" --nodes "bench/rings/$ring.conf" --ctx 32768 --prompt 4096 \
                --json >build/bench/plan.json 2>/dev/null; then # greedy fits, speculation's copies do not
                python3 - "$ring" "$cfg" "$gib" build/bench/plan.json <<'PY'
import json, sys
ring, cfg, gib, path = sys.argv[1:]
j = json.load(open(path)); p = j['predict']
print('| %s | %s | %s GiB | greedy only | %d | %.2f | no room for the rollback copies | %.1f | %.0f | %s |' % (ring, cfg, gib,
      len(j['stages']), p['greedy_tok_s'], p['ttft_s'], p['floor_tok_s'], p['dominant']))
PY
            else
                why=$(sed 's/^ringlm plan: //; s/|/\\|/g' build/bench/plan.err | head -1)
                echo "| $ring | $cfg | $gib GiB | no: $why | | | | | | |"
            fi
        done
    done
} >"$out"
cat "$out"
