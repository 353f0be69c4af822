#!/usr/bin/env bash
# Where the time goes: ringlm run and llama-bench (its defaults) doing the same work on one machine, each
# sampled by `perf record -e cpu-clock` (a software clock: it works in VMs without hardware counters), and
# the samples compared function by function. Wall-clock ratios on a shared VM move by 10% between runs
# (bench_single.sh's per-pair ratios); the samples per kernel say whether one engine does more work.
#
#   bench/profile_single.sh [--model FILE] [--threads N] [--prefill N | --decode N [--depth N]] [--out NAME]
#
# --prefill N: a prompt of N tokens (ringlm: then one token; llama-bench: -p N -n 0). --decode N: N decode
# steps after a --depth-token prompt (ringlm: that prompt then N tokens; llama-bench: -p 0 -n N -d DEPTH,
# whose depth is filled untimed but sampled here too). llama-bench runs with --no-warmup, so both sides
# compute the same tokens once; both load (and repack) the model, and those functions show as such.
# Writes bench/results/NAME.md (default profile-prefill or profile-decode).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
threads=2 model=bench/models/medium.gguf mode=prefill n=512 depth=0 out=
while [ $# -gt 0 ]; do
    case $1 in
        --model) model=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        --prefill) mode=prefill n=$2; shift 2 ;;
        --decode) mode=decode n=$2; shift 2 ;;
        --depth) depth=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        *) echo "profile_single: unknown option $1" >&2; exit 2 ;;
    esac
done
[ -n "$out" ] || out=profile-$mode
command -v perf >/dev/null || { echo "profile_single: needs perf (Debian's linux-perf)" >&2; exit 1; }
[ -f "$model" ] || { echo "profile_single: no $model (bench/bench_single.sh makes it)" >&2; exit 1; }
make -s ringlm
B=$(scripts/llama-tools.sh)
mkdir -p build/bench bench/results
V=$(./ringlm inspect --kv "$model" | awk '$1 == "n_vocab" { print $2 }')
if [ "$mode" = prefill ]; then np=$n ng=1 lb=(-p "$n" -n 0); else np=$((depth > 0 ? depth : 1)) ng=$n lb=(-p 0 -n "$n" -d "$depth"); fi
seeded_ids "$np" >build/bench/profile.ids
cat "$model" >/dev/null
ours=(./ringlm run -m "$model" --tokens @build/bench/profile.ids -n "$ng" --temp 0 --ignore-eos --ids --threads "$threads"
      --ctx $((np + ng + 8)) --chunk 512)
ref=("$B/llama-bench" -m "$model" -t "$threads" -r 1 --no-warmup "${lb[@]}")
perf record -q -e cpu-clock -F 1999 -o build/bench/perf-ours.data -- "${ours[@]}" >/dev/null 2>&1
perf record -q -e cpu-clock -F 1999 -o build/bench/perf-ref.data -- "${ref[@]}" >/dev/null 2>&1
for w in ours ref; do
    perf report -i "build/bench/perf-$w.data" -n --sort dso,sym --stdio 2>/dev/null | grep -v '^#' | grep -v '^$' \
        >"build/bench/perf-$w.txt" || true
done
python3 - "$model" "$out" "$mode" "$n" "$depth" "$threads" "${ours[*]}" "${ref[*]}" <<'PY'
import re, sys, datetime
model, out, mode, n, depth, threads, ours_cmd, ref_cmd = sys.argv[1:]
def load(path):
    d = {}
    for line in open(path):
        # "  12.34%  1234  dso  [.] symbol"
        m = re.match(r'\s*([\d.]+)%\s+(\d+)\s+(\S+)\s+\[(.)\]\s+(.*\S)', line)
        if not m: continue
        dso, kind, sym = m.group(3), m.group(4), m.group(5)
        if kind == 'k': key = 'kernel: ' + sym
        elif sym.startswith('0x'): key = dso + ' (unresolved)' # libgomp's spin-waits, mostly
        else: key = sym
        d[key] = d.get(key, 0) + int(m.group(2))
    return d
a, b = load('build/bench/perf-ours.txt'), load('build/bench/perf-ref.txt')
ta, tb = sum(a.values()), sum(b.values())
keys = sorted(set(a) | set(b), key=lambda k: -(a.get(k, 0) + b.get(k, 0)))
what = f"prefill of {n} tokens" if mode == 'prefill' else f"{n} decode steps after {depth} tokens"
L = [f"# Where the time goes: ringlm and llama-bench, {what}", "",
     f"`bench/profile_single.sh --model {model} --threads {threads} --{mode} {n}" + (f" --depth {depth}" if mode == 'decode' else '') + f"`, "
     f"{datetime.date.today()}, samples of `perf record -e cpu-clock -F 1999` (one per 0.5 ms of a thread's CPU time).", "",
     f"- ringlm (its defaults: repacked weights where llama.cpp repacks them, flash attention, f16 cache): `{ours_cmd.replace('./ringlm', 'ringlm')}`",
     f"- llama-bench (its defaults: repacked weights, flash attention auto, f16 cache; no warm-up run, so both sides compute the same tokens once): `llama-bench {ref_cmd.split('llama-bench ', 1)[1]}`", "",
     f"Samples in all: ringlm {ta}, llama-bench {tb} (ratio {ta / tb:.3f}); both include loading and repacking the model.", "",
     "How to read it: the two runs are minutes apart on a VM whose speed moves by 10-20% between minutes, so the",
     "samples of a function that does the same work on both sides (`__tanhf`, `ggml_compute_forward_dsv4_hc_pre`,",
     "`ggml_compute_forward_ssm_conv`: the same ops on the same shapes) move together with the machine. A function",
     "whose ratio stands apart from theirs is where one engine does more or less work.", "",
     "| function | ringlm | llama-bench | ringlm / llama-bench |", "|---|---|---|---|"]
for k in keys[:30]:
    x, y = a.get(k, 0), b.get(k, 0)
    L.append(f"| `{k[:80]}` | {x} | {y} | {x / y:.2f} |" if y else f"| `{k[:80]}` | {x} | {y} | - |")
open(f"bench/results/{out}.md", "w").write("\n".join(L) + "\n")
print("\n".join(L))
PY
