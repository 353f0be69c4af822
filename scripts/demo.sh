#!/usr/bin/env bash
# The local demo ring: starts three nodes on loopback, runs a chat prompt across them with speculative
# decoding (and, with the trained model, a sampled plain-text continuation), prints the plan, the per-stage table, acceptance and tok/s, verifies the receipts, and shuts
# everything down. Exits 0 when all of it worked.
#
# The model: the trained small K3 and its trained DSpark draft when tools/train/build.sh has built them on
# this machine (learned weights, real acceptance); otherwise a synthesized small K3 with random weights and
# its q4_0 copy as the draft (once, with a progress bar), and a line saying how to train the real pair.
set -euo pipefail
cd "$(dirname "$0")/.."
R=./ringlm
D=build/demo
mkdir -p "$D/models"
if trained=$(tools/train/build.sh --where 2>/dev/null); then
    echo "demo: the trained small K3 and its DSpark draft ($trained)"
    mkdir -p "$D/trained"
    ln -sfn "$(readlink -f "$trained/target.gguf")" "$D/trained/trained-k3.gguf"
    model=$D/trained/trained-k3.gguf models=$D/trained draft=dspark:$trained/draft.gguf
    prompt='What does "harbor" mean?' temp=(--temp 0) random=0
else
    if [ ! -f "$D/models/demo.gguf" ]; then
        echo "demo: synthesizing the demo model (small K3: 14 layers, 64 experts, top-8)"
        $R synth --config small --type q8_0 --seed 1 -o "$D/models/demo.gguf.tmp" --progress && mv "$D/models/demo.gguf.tmp" "$D/models/demo.gguf"
    fi
    if [ ! -f "$D/draft.gguf" ]; then
        echo "demo: synthesizing the draft (the same model at q4_0: it agrees often)"
        $R synth --config small --type q4_0 --seed 1 -o "$D/draft.gguf.tmp" --progress && mv "$D/draft.gguf.tmp" "$D/draft.gguf"
    fi
    model=$D/models/demo.gguf models=$D/models draft=$D/draft.gguf
    prompt="Write one sentence about rings." temp=(--temp 0 --ignore-eos) random=1
fi
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
$R keygen -o "$work/coord.key" >"$work/coord.pub"
: >"$work/ring.conf"
for i in 1 2 3; do
    $R keygen -o "$work/n$i.key" >"$work/n$i.pub"
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    $R node --listen "127.0.0.1:$port" --key "$work/n$i.key" --allow "$(cat "$work/coord.pub")" --models "$models" \
        --threads 1 --cache "$work/cache$i" >"$work/n$i.log" 2>&1 &
    pids+=($!)
    echo "127.0.0.1:$port $(cat "$work/n$i.pub")" >>"$work/ring.conf"
done
for i in 1 2 3; do
    for _ in $(seq 100); do grep -q "ready:" "$work/n$i.log" && break; sleep 0.1; done
    grep -q "ready:" "$work/n$i.log" || { echo "demo: node $i did not start"; cat "$work/n$i.log"; exit 1; }
done
echo "demo: 3 nodes up on loopback; running a chat prompt across them with speculative decoding"
echo
$R run -m "$model" --ring "$work/ring.conf" --key "$work/coord.key" --chat \
    -p "$prompt" -n 48 "${temp[@]}" --draft "$draft" \
    --metrics-json "$work/metrics.json" --receipts "$work/receipts.jsonl"
echo
$R receipts verify "$work/receipts.jsonl" --model "$model" --ring "$work/ring.conf"
echo
if [ $random = 1 ]; then
    echo "demo: done (the weights are random, so the text is too; the numbers above are real)"
    echo "demo: tools/train/build.sh trains a small K3 and its DSpark draft on this machine (python3-torch,"
    echo "      about 30 minutes on 2 cores, once); the demo then runs them: learned weights, real acceptance"
else # the trained model's prose is fluent where its answers are not (docs/trained.md)
    echo "demo: and plain text across the same ring, sampled (--temp 0.8): the model continues \"And the king said\""
    echo
    $R run -m "$model" --ring "$work/ring.conf" --key "$work/coord.key" -p "And the king said" -n 40 --temp 0.8 --seed 1
    echo
    echo "demo: done (a 6M-parameter K3 trained for 23 minutes on WordNet, fortunes and the King James Bible:"
    echo "      it writes English, but it does not yet answer what it is asked; docs/trained.md says why)"
fi
