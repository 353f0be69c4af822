#!/usr/bin/env bash
# Larger than memory (#20): decode of a model several times a memory cap, in a cgroup v1 memory group,
# ringlm with --mem (dense part resident, routed experts through its cache, docs/experts.md) against
# llama.cpp under the same cap, same file, same threads, the page cache dropped before every run,
# alternating runs. The peer is llama.cpp's released library (node-llama-cpp 3.21.1's prebuilt libllama,
# tests/oracle's `bench`: a prompt, then greedy decode steps): at its defaults (the file mapped, quantized
# weights repacked into anonymous memory, which a cap smaller than the model cannot hold) and with
# --no-repack (everything left to the mapping and the page cache: how llama.cpp runs a model larger than
# memory, and the peer the goal is judged on when the defaults cannot run; the table says which).
# Also the unconstrained case: --mem large enough that everything fits against no --mem at all.
#
#   bench/bench_experts.sh [--mem GB] [--cap GB] [--gen N] [--prompt N] [--reps N] [--threads N]
#                          [--model FILE] [--no-peer] [--expert-copy DIR] [--out PREFIX]
#
# --mem: ringlm's weight budget (default 0.45 GiB for the 1.51 GiB medium model: 3.4x); --cap: the memory
# group's limit for every run (default --mem + 0.4 GiB: compute buffers, state, the process itself).
# Writes bench/results/experts.json and experts.md: tok/s, time to first token, hit rate, bytes read per
# token against the bytes of the experts the tokens chose, and the disk floor (the file's measured read
# speed / bytes read per token). --expert-copy DIR: every rep also runs ringlm with its repacked copy of
# the experts kept there (docs/experts.md; filled by one uncounted run first, as on a machine that has run
# the model before), alternating with the run without, and the table adds that row and the median of the
# paired ratios; the floor is then judged on it. --out PREFIX writes PREFIX.json / .md instead (default
# bench/results/experts). Needs root (cgroup, drop_caches).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
mem=0.45 cap= gen=32 prompt=16 reps=3 threads=2 model=bench/models/medium.gguf peer=1 copy= out=bench/results/experts
while [ $# -gt 0 ]; do
    case $1 in
        --mem) mem=$2; shift 2 ;;
        --cap) cap=$2; shift 2 ;;
        --gen) gen=$2; shift 2 ;;
        --prompt) prompt=$2; shift 2 ;;
        --reps) reps=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        --model) model=$2; shift 2 ;;
        --no-peer) peer=0; shift ;;
        --expert-copy) copy=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        *) echo "bench_experts: unknown option $1" >&2; exit 2 ;;
    esac
done
[ -n "$cap" ] || cap=$(awk -v m="$mem" 'BEGIN { printf "%.3f", m + 0.4 }')
make -s ringlm
mkdir -p bench/models bench/results build/bench
if [ ! -f "$model" ]; then
    echo "bench_experts: synthesizing $model (medium, once)" >&2
    ./ringlm synth --config medium --seed 1 -o "$model.tmp" --progress && mv "$model.tmp" "$model"
fi
[ $peer = 0 ] || make -s -C tests/oracle >/dev/null
CG=/sys/fs/cgroup/memory/ringlm-bench-$$
[ -d /sys/fs/cgroup/memory ] || { echo "bench_experts: no cgroup v1 memory controller" >&2; exit 1; }
mkdir "$CG"
trap 'rmdir "$CG" 2>/dev/null || true' EXIT
cap_bytes=$(awk -v g="$cap" 'BEGIN { printf "%d", g * 1073741824 }')
echo "$cap_bytes" >"$CG/memory.limit_in_bytes"
drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }
capped() { bash -c 'echo $$ >"$0/cgroup.procs"; exec "$@"' "$CG" "$@"; }

# The file's read speed from a cold cache (direct reads of 256 MiB), for the disk floor.
drop
disk=$(dd if="$model" of=/dev/null bs=4M count=64 iflag=direct 2>&1 | awk '/copied/ { print $(NF-1), $NF }')
disk_gbs=$(echo "$disk" | awk '{ v = $1; if ($2 ~ /^MB/) v /= 1000; if ($2 ~ /^kB/) v /= 1e6; print v }')
echo "disk: $disk" >&2
# ... and for reads the size of one expert projection, at random places, four at once (the expert cache's
# pattern: its four reader threads), direct: the floor for what ringlm actually asks of the disk.
drop
rand_gbs=$(python3 - "$model" <<'PY'
import mmap, os, random, sys, threading, time
path = sys.argv[1]
size = os.path.getsize(path)
chunk, total, nthreads = 160 * 1024, 256 << 20, 4  # ~ one Q4_K 512x512 projection
fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
rng = random.Random(7)
offs = [rng.randrange(0, (size - chunk) // 4096) * 4096 for _ in range(total // chunk)]
def work(part):
    buf = mmap.mmap(-1, chunk)  # page-aligned, as O_DIRECT wants
    for o in part:
        os.preadv(fd, [buf], o)
t0 = time.time()
ts = [threading.Thread(target=work, args=(offs[i::nthreads],)) for i in range(nthreads)]
[t.start() for t in ts]
[t.join() for t in ts]
print(len(offs) * chunk / (time.time() - t0) / 1e9)
PY
)
echo "disk, 160 KiB random reads x4: $rand_gbs GB/s" >&2

V=$(./ringlm inspect --kv "$model" | awk '$1 == "n_vocab" { print $2 }')
toks=$(seeded_ids "$prompt")
j() { python3 -c 'import json, sys; d = json.load(open(sys.argv[1]))
for k in sys.argv[2].split("."): d = d[k]
print(d)' "$@"; }

ours=() ours_ttft=() hit=() rd=() used=() ahead=() ref=() ref_nr=() free_=() free_mem=() cp=() cp_rd=() cp_ttft=() cp_hit=() cp_ahead=()
if [ -n "$copy" ]; then
    capped ./ringlm run -m "$model" --tokens "$toks" -n "$gen" --temp 0 --ignore-eos --threads "$threads" \
        --mem "$mem" --expert-copy "$copy" >/dev/null 2>build/bench/xc_fill.err
    grep 'repacked copy' build/bench/xc_fill.err >&2 || true
fi
# llama.cpp's decode tok/s under the cap, or 0 when it was killed (out of memory) or failed.
peer_run() {
    local rc=0
    capped tests/oracle/oracle bench -m "$model" --tokens "$toks" -n "$gen" --threads "$threads" "$@" \
        >build/bench/xc_ref.json 2>build/bench/xc_ref.err || rc=$?
    if [ $rc = 0 ]; then python3 -c 'import json; print(json.load(open("build/bench/xc_ref.json"))["decode_tok_s"])'; else echo 0; fi
}
for r in $(seq "$reps"); do
    drop
    capped ./ringlm run -m "$model" --tokens "$toks" -n "$gen" --temp 0 --ignore-eos --threads "$threads" \
        --mem "$mem" --metrics-json build/bench/xc.json >/dev/null 2>build/bench/xc.err
    ours+=("$(j build/bench/xc.json decode_tok_s)") ours_ttft+=("$(j build/bench/xc.json ttft_s)")
    hit+=("$(j build/bench/xc.json expert_cache.decode.hit_rate)")
    rd+=("$(j build/bench/xc.json expert_cache.decode.bytes_read_per_token)")
    used+=("$(j build/bench/xc.json expert_cache.decode.bytes_used_per_token)")
    ahead+=("$(j build/bench/xc.json expert_cache.decode.prefetch_accuracy)")
    if [ -n "$copy" ]; then
        drop
        capped ./ringlm run -m "$model" --tokens "$toks" -n "$gen" --temp 0 --ignore-eos --threads "$threads" \
            --mem "$mem" --expert-copy "$copy" --metrics-json build/bench/xc_cp.json >/dev/null 2>build/bench/xc_cp.err
        cp+=("$(j build/bench/xc_cp.json decode_tok_s)") cp_rd+=("$(j build/bench/xc_cp.json expert_cache.decode.bytes_read_per_token)")
        cp_ttft+=("$(j build/bench/xc_cp.json ttft_s)") cp_hit+=("$(j build/bench/xc_cp.json expert_cache.decode.hit_rate)")
        cp_ahead+=("$(j build/bench/xc_cp.json expert_cache.decode.prefetch_accuracy)")
        echo "run $r: ringlm --mem $mem --expert-copy: ${cp[-1]} tok/s" >&2
    fi
    if [ $peer = 1 ]; then
        drop
        ref+=("$(peer_run)")
        drop
        ref_nr+=("$(peer_run --no-repack)")
    fi
    # Unconstrained: no cap, page cache warm, --mem large enough against no --mem.
    cat "$model" >/dev/null
    ./ringlm run -m "$model" --tokens "$toks" -n "$gen" --temp 0 --ignore-eos --threads "$threads" \
        --metrics-json build/bench/xc_free.json >/dev/null 2>&1
    ./ringlm run -m "$model" --tokens "$toks" -n "$gen" --temp 0 --ignore-eos --threads "$threads" --mem 64 \
        --metrics-json build/bench/xc_free_mem.json >/dev/null 2>&1
    free_+=("$(j build/bench/xc_free.json decode_tok_s)") free_mem+=("$(j build/bench/xc_free_mem.json decode_tok_s)")
    echo "run $r: ringlm --mem $mem: ${ours[-1]} tok/s (hit ${hit[-1]}), llama.cpp: ${ref[-1]:-skipped} (defaults)" \
         "${ref_nr[-1]:-skipped} (--no-repack), unconstrained ${free_[-1]} / --mem 64 ${free_mem[-1]}" >&2
done

XC_COPY=$copy XC_OUT=$out python3 - "$model" "$mem" "$cap" "$gen" "$prompt" "$threads" "$disk_gbs" "$peer" "$rand_gbs" \
    "${ours[*]}" "${ours_ttft[*]}" "${hit[*]}" "${rd[*]}" "${used[*]}" "${ahead[*]}" "${ref[*]:-}" "${ref_nr[*]:-}" \
    "${free_[*]}" "${free_mem[*]}" "${cp[*]:-}" "${cp_rd[*]:-}" "${cp_ttft[*]:-}" "${cp_hit[*]:-}" "${cp_ahead[*]:-}" <<'EOF'
import json, os, statistics as st, sys
model, mem, cap, gen, prompt, threads, disk, peer, rand = sys.argv[1:10]
rand = float(rand) * 1e9
f = lambda s: [float(x) for x in s.split()]
ours, ttft, hit, rd, used, ahead, ref, ref_nr, free, free_mem, cp, cp_rd, cp_ttft, cp_hit, cp_ahead = (f(s) for s in sys.argv[10:25])
disk = float(disk) * 1e9
med = st.median
size = os.path.getsize(model)
# The goal is judged against llama.cpp at its defaults when they run under the cap, else against its
# --no-repack (mapping only) run, and the table says which.
judged = ref if any(r > 0 for r in ref) else ref_nr
judged_name = "defaults" if judged is ref else "--no-repack (its defaults were killed under the cap)"
pairs = [o / r for o, r in zip(ours, judged) if r > 0] if peer == "1" else []
res = {
    "benchmark": "larger than memory: decode under a memory cgroup cap, ringlm --mem vs llama.cpp",
    "median_ratio_judged_against": judged_name if peer == "1" else None,
    "model": model, "model_bytes": size, "mem_gib": float(mem), "cap_gib": float(cap), "gen": int(gen),
    "prompt": int(prompt), "threads": int(threads), "disk_read_gb_s": disk / 1e9,
    "ringlm": {"decode_tok_s": ours, "ttft_s": ttft, "hit_rate": hit, "bytes_read_per_token": rd,
               "bytes_used_per_token": used, "prefetch_accuracy": ahead},
    "llama_cpp": {"engine": "node-llama-cpp 3.21.1 prebuilt libllama (tests/oracle bench)",
                  "defaults_decode_tok_s": ref, "defaults_killed_or_failed": sum(1 for r in ref if r == 0),
                  "no_repack_decode_tok_s": ref_nr, "no_repack_killed_or_failed": sum(1 for r in ref_nr if r == 0),
                  "judged_against": judged_name} if peer == "1" else None,
    "unconstrained": {"no_mem": free, "mem_64": free_mem},
    "median_ratio_vs_llama": med(pairs) if pairs else None,
    "disk_floor_tok_s": disk / med(rd) if med(rd) > 0 else None,
    "disk_random_read_gb_s": rand / 1e9,
    "disk_floor_random_tok_s": rand / med(rd) if med(rd) > 0 else None,
}
copy, out = os.environ["XC_COPY"], os.environ["XC_OUT"]
res["expert_copy"] = {"decode_tok_s": cp, "bytes_read_per_token": cp_rd, "ttft_s": cp_ttft, "hit_rate": cp_hit,
                      "prefetch_accuracy": cp_ahead,
                      "median_ratio_vs_no_copy": med([c / o for c, o in zip(cp, ours)])} if cp else None
json.dump(res, open(out + ".json", "w"), indent=1)
MiB = 1048576
lines = [
    "# Larger than memory: ringlm --mem against llama.cpp under a memory cap", "",
    f"`bench/bench_experts.sh --mem {mem} --cap {cap} --gen {gen}{' --expert-copy DIR' if cp else ''}`: {model} ({size / 2**30:.2f} GiB, "
    f"{size / 2**30 / float(mem):.1f}x the budget), every run in a cgroup v1 memory group of {cap} GiB, page cache "
    f"dropped before each, {threads} threads, {len(ours)} alternating runs, medians.", "",
    "| | decode tok/s | TTFT s | hit rate | read MiB/token | chosen experts MiB/token | look-ahead right |",
    "|---|---|---|---|---|---|---|",
    f"| ringlm --mem {mem} (otherwise its defaults: repacked weights, flash attention, f16 cache) | {med(ours):.2f} | {med(ttft):.2f} | {100 * med(hit):.1f}% | {med(rd) / MiB:.2f} | "
    f"{med(used) / MiB:.2f} | {100 * med(ahead):.0f}% |",
]
if cp:
    lines.append(f"| ringlm --mem {mem} --expert-copy (its copy filled by one run before; runs alternating with the row above) | "
                 f"{med(cp):.2f} | {med(cp_ttft):.2f} | {100 * med(cp_hit):.1f}% | {med(cp_rd) / MiB:.2f} | {med(used) / MiB:.2f} | "
                 f"{100 * med(cp_ahead):.0f}% |")
if peer == "1":
    for name, xs in (("at its defaults (repacked weights, flash attention auto: on, f16 cache)", ref),
                     ("--no-repack (mapping only; flash attention on, f16 cache)", ref_nr)):
        ok = [r for r in xs if r > 0]
        lines.append(f"| llama.cpp {name} | {med(ok):.2f} ({len(xs) - len(ok)} of {len(xs)} runs killed) | | | | | |" if ok
                     else f"| llama.cpp {name} | killed under the cap in every run | | | | | |")
lines += ["", f"Disk floor: {disk / 1e9:.2f} GB/s cold direct read (4 MiB sequential) / {med(rd) / MiB:.2f} MiB read "
          f"per token = {disk / med(rd):.2f} tok/s; ringlm is at {med(ours) / (disk / med(rd)):.2f} of it. With the disk's "
          f"speed for reads like the cache's (160 KiB at random places, four at once, direct: {rand / 1e9:.2f} GB/s) the "
          f"floor is {rand / med(rd):.2f} tok/s and ringlm is at {med(ours) / (rand / med(rd)):.2f} of it." if med(rd) > 0 else "",
          (f"With --expert-copy: {med(cp):.2f} tok/s, the median of per-run ratios to the run without it {med([c / o for c, o in zip(cp, ours)]):.2f}x "
           f"(runs {' '.join('%.2f' % x for x in cp)} against {' '.join('%.2f' % x for x in ours)}); at {med(cp) / (disk / med(cp_rd)):.2f} of the "
           f"sequential floor and {med(cp) / (rand / med(cp_rd)):.2f} of the random-read floor." if cp else ""),
          f"Median of per-run ratios against llama.cpp {judged_name}: {med(pairs):.2f}x (goal: 3x)." if pairs else
          ("llama.cpp did not finish under the cap: no ratio." if peer == "1" else "llama.cpp not run (--no-peer)."),
          "", f"Unconstrained (no cap, warm page cache): no --mem {med(free):.2f} tok/s, --mem 64 (everything fits, no "
          f"cache) {med(free_mem):.2f} tok/s."]
open(out + ".md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
