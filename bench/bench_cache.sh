#!/usr/bin/env bash
# The prompt cache (issue #51): multi-turn conversations on loopback, time to first token (TTFT) of turns 2
# and 3, `ringlm serve` on one machine against llama.cpp's `llama-server` (from scripts/llama-tools.sh) at
# its shipped defaults (cache_prompt on, its context checkpoints, its host-RAM prompt cache), same model
# file, same threads, same context.
#
#   bench/bench_cache.sh [--model FILE] [--sizes "1024 4096 16384"] [--convs N] [--turns N] [--reply N]
#                        [--new N] [--think S] [--uncached-convs N] [--threads N] [--ctx N] [--servers "ringlm llama-server"]
#                        [--timeout S] [--out PREFIX] [--keep] [--no-build]
#
# --think S: a pause of S seconds between a turn's last token and the next turn (a person reading the reply,
# an agent running a tool; default 0, turns back to back). ringlm re-reads a finished reply while idle
# (docs/serve.md, "Prompt cache"), which a pause lets finish before the next turn arrives.
#
# Defaults: build/bench/small-32k.gguf, synthesized once: the `small` preset at seed 1, as bench_serve.sh
# makes build/bench/small.gguf, with a trained context of 32768 tokens in place of 4096 (llama-server caps
# its context at the model's trained context and refuses longer prompts); conversations of 1024, 4096 and 16384 tokens, 3 per size, 3 turns each. Turn 1 sends SIZE seeded token ids
# (a seed of its own per conversation, so no turn 1 is ever cached); the server generates --reply 32 tokens
# greedily (temperature 0, ignore_eos, streamed); turn k+1 sends turn k's prompt, the exact ids the server
# generated in turn k (each server continues its own conversation, as a chat client does) and --new 32
# new seeded ids. TTFT = request sent to the first streamed chunk carrying tokens; the total time of each
# turn too, and the prompt tokens each server says it read. Both servers get `-np 1` / `--parallel 1`, 2
# threads and a context of the largest size + turns x (reply + new), rounded up to 256 (--ctx to override).
# 300 s per conversation. Writes PREFIX.json and PREFIX.md (default bench/results/cache). --keep keeps the
# work folder (logs) under build/bench/; it is kept anyway when the run fails.
#
# Pairs: both servers are up side by side (one idle while the other works); each conversation runs on one
# and then, with the same seeds, on the other, the first of the pair alternating from one conversation to
# the next. The goal (one machine: TTFT of turns 2 and 3 at least 1.0x llama-server's speed, i.e. ringlm's
# TTFT <= llama-server's) is judged per size and turn on the median of the per-pair ratios
# (llama-server TTFT / ringlm TTFT): a 2-core VM's speed drifts by 10-20% over minutes.
#
# What the cache saves: in the first --uncached-convs conversations of each size (default 1; 0: none), each
# server is sent turns 2.. once more right after the cached turns, the same prompts with `cache_prompt:
# false` (both servers take that field), and must give the same reply.
#
# Memory: each server's VmRSS after each size and its peak (VmHWM) at the end; ringlm's /metrics lines
# starting `ringlm_prompt_cache` after each size, as they are.
#
# The client is bench/tools/load_turns.py (Python stdlib). ringlm gets POST /v1/completions with
# `return_token_ids: true` (every chunk's choices[0].token_ids) and `cache_prompt`; a ringlm serve without
# them (before issue #51) fails with a message saying so: `--servers llama-server` runs the peer's half alone.
# llama-server gets its native POST /completion with `return_tokens: true`. This random-weight model's byte
# tokens whose text alone is not valid UTF-8 end llama-server's streams with a 500 (see load_serve.py), so
# they are banned with logit_bias on BOTH servers (found with llama-server's /detokenize): the same
# candidates on both sides, replies of the same length.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
argv=; [ $# -eq 0 ] || argv=$(printf ' %q' "$@")
model=build/bench/small-32k.gguf sizes="1024 4096 16384" convs=3 turns=3 reply=32 new=32 uncached_convs=1 think=0
threads=2 ctx=0 servers="ringlm llama-server" timeout_s=300 out=bench/results/cache keep=0 build=1
while [ $# -gt 0 ]; do
    case $1 in
        --model) model=$2; shift 2 ;;
        --sizes) sizes=$2; shift 2 ;;
        --convs) convs=$2; shift 2 ;;
        --turns) turns=$2; shift 2 ;;
        --reply) reply=$2; shift 2 ;;
        --think) think=$2; shift 2 ;;
        --new) new=$2; shift 2 ;;
        --uncached-convs) uncached_convs=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        --ctx) ctx=$2; shift 2 ;;
        --servers) servers=$2; shift 2 ;;
        --timeout) timeout_s=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --keep) keep=1; shift ;;
        --no-build) build=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "bench_cache: unknown option $1 (--help lists them)" >&2; exit 2 ;;
    esac
done
positive_ints convs:convs turns:turns reply:reply new:new threads:threads timeout_s:timeout
[[ $think =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "--think wants seconds, got '$think'"
[[ $uncached_convs =~ ^[0-9]+$ ]] || die "--uncached-convs must be a count, got '$uncached_convs'"
[[ $ctx =~ ^[0-9]+$ ]] || die "--ctx must be a count, got '$ctx'"
[ "$turns" -ge 2 ] || die "--turns must be at least 2 (turn 1 is never cached)"
[ -n "$sizes" ] || die "--sizes is empty"
smax=0
for s in $sizes; do [[ $s =~ ^[1-9][0-9]*$ ]] || die "--sizes: '$s' is not a count"; [ "$s" -gt $smax ] && smax=$s; done
run_ringlm=0 run_llama=0
for s in $servers; do
    case $s in ringlm) run_ringlm=1 ;; llama-server) run_llama=1 ;; *) die "--servers: '$s' is neither ringlm nor llama-server" ;; esac
done
[ $((run_ringlm + run_llama)) -gt 0 ] || die "--servers names no server"
need=$((smax + turns * (reply + new)))
[ "$ctx" -gt 0 ] || ctx=$(( (need + 255) / 256 * 256 ))
[ "$ctx" -ge "$need" ] || die "--ctx $ctx cannot hold the largest conversation ($need tokens)"

# ---- tools -------------------------------------------------------------------------------------------
need_tools python3 timeout make curl
if [ $build = 1 ]; then make -s ringlm || die "building ringlm failed (--no-build uses ./ringlm as it is)"; fi
RINGLM=$PWD/ringlm
[ -x "$RINGLM" ] || die "no ./ringlm after make"
need_subcommands serve inspect
B=$(scripts/llama-tools.sh) || die "scripts/llama-tools.sh could not build llama.cpp's tools"
[ -x "$B/llama-server" ] || die "missing $B/llama-server (scripts/llama-tools.sh)"

mkdir -p "$(dirname "$out")" build/bench
if [ ! -f "$model" ]; then
    [ "$model" = build/bench/small-32k.gguf ] || die "no model file $model"
    echo "bench_cache: synthesizing $model (small preset, seed 1, trained context 32768; once)" >&2
    echo '{"base": "small", "n_ctx_train": 32768}' >build/bench/small-32k.json
    "$RINGLM" synth --config build/bench/small-32k.json --seed 1 -o "$model.tmp" && mv "$model.tmp" "$model"
fi
model=$(cd "$(dirname "$model")" && pwd)/$(basename "$model")
kv=$("$RINGLM" inspect --kv "$model")
V=$(echo "$kv" | awk '$1 == "n_vocab" { print $2 }')
weights=$(echo "$kv" | awk '$1 == "weight_bytes" { print $2 }')
n_ctx_train=$(echo "$kv" | awk '$1 == "n_ctx_train" { print $2 }')
[ -n "$V" ] || die "ringlm inspect could not read $model"
[ "${n_ctx_train:-0}" -ge "$ctx" ] || die "the context needed ($ctx) exceeds $model's trained context (${n_ctx_train:-?}), \
at which llama-server caps its slots (it would refuse the longest prompts): use a model trained longer"

# ---- processes: every one is recorded, and stopped on exit ---------------------------------------------
work=$(mktemp -d "$PWD/build/bench/cache.XXXXXX")
cp "$RINGLM" "$work/ringlm" && RINGLM=$work/ringlm
life=$((3 * 3600))
pids=()
STOP_WAIT_S=10 # stop_pids: a server gets 10 s after TERM before KILL
harness_traps # (bench/lib.sh) every process is stopped on exit; the work folder is kept on failure or --keep
cat "$model" >/dev/null # page the model in once

# Both servers side by side, each with one sequence slot and the same context; nothing else is set.
lport=$(free_port)
timeout -k 5 $life "$B/llama-server" -m "$model" --host 127.0.0.1 --port "$lport" -np 1 -c "$ctx" -t "$threads" \
    >"$work/llama-server.log" 2>&1 &
lpid=$!; pids+=("$lpid")
wait_health "$lport" "$lpid" 300 || { tail -20 "$work/llama-server.log" >&2; die "llama-server did not start"; }
# the byte tokens to ban on both servers (load_turns.py bans: llama-server's /detokenize)
timeout -k 5 120 python3 bench/tools/load_turns.py bans --port "$lport" --n-vocab "$V" >"$work/bans.json" \
    || die "finding the byte tokens with llama-server's /detokenize failed"
if [ $run_llama = 0 ]; then stop_pids "$lpid"; pids=(); fi
if [ $run_ringlm = 1 ]; then
    rport=$(free_port)
    timeout -k 5 $life "$RINGLM" serve -m "$model" --port "$rport" --parallel 1 --ctx "$ctx" --threads "$threads" \
        >"$work/ringlm.log" 2>&1 &
    rpid=$!; pids+=("$rpid")
    wait_health "$rport" "$rpid" 300 || { tail -20 "$work/ringlm.log" >&2; die "ringlm serve did not start"; }
fi

# conv SERVER SIZE CONV_INDEX UNCACHED: one conversation into $work/SERVER-sSIZE-cI.json; dies on failure
conv() {
    local name=$1 s=$2 i=$3 api port spid rc=0 extra=()
    if [ "$name" = ringlm ]; then api=openai port=$rport spid=$rpid; else api=llama port=$lport spid=$lpid; fi
    [ "$4" = 1 ] && extra=(--uncached)
    local f=$work/$name-s$s-c$i
    timeout -k 5 $((timeout_s + 30)) python3 bench/tools/load_turns.py conv --api "$api" --port "$port" \
        --prompt-file "$work/ids-s$s-c$i-t1" --new-files "$newfiles" --reply "$reply" --think "$think" --ban-file "$work/bans.json" \
        --timeout "$timeout_s" "${extra[@]+"${extra[@]}"}" >"$f.json" 2>"$f.err" || rc=$?
    if [ $rc != 0 ]; then
        cat "$f.err" >&2
        kill -0 "$spid" 2>/dev/null || echo "bench_cache: the $name server died" >&2
        die "$name, size $s, conversation $i failed (exit $rc): $(python3 -c 'import json, sys
try: print(json.load(open(sys.argv[1])).get("error"))
except Exception as x: print("no result:", x)' "$f.json")"
    fi
    echo "bench_cache: $name size $s conversation $i: $(python3 -c 'import json, sys; d = json.load(open(sys.argv[1]))
print(", ".join("turn %d TTFT %.0f ms (read %s)" % (t["turn"], t["ttft_ms"], t["read"]) for t in d["turns"])
      + "".join("; uncached turn %d %.0f ms (read %s)" % (t["turn"], t["ttft_ms"], t["read"]) for t in d["uncached"]))' "$f.json")" >&2
}
# snapshot NAME: each server's VmRSS (and VmHWM) and ringlm's prompt-cache metrics into $work/mem-NAME.json
snapshot() {
    local p k
    {
        echo "{"
        for k in ringlm llama-server; do
            if [ $k = ringlm ]; then [ $run_ringlm = 1 ] || continue; p=$rpid; else [ $run_llama = 1 ] || continue; p=$lpid; fi
            # the process under `timeout`: its only child
            p=$(pgrep -P "$p" | head -1 || true)
            printf '"%s": {"rss_kib": %s, "hwm_kib": %s},\n' "$k" \
                "$(awk '/^VmRSS/ { print $2 }' "/proc/$p/status" 2>/dev/null || echo null)" \
                "$(awk '/^VmHWM/ { print $2 }' "/proc/$p/status" 2>/dev/null || echo null)"
        done
        printf '"ringlm_prompt_cache_metrics": '
        if [ $run_ringlm = 1 ]; then
            { curl -sf "http://127.0.0.1:$rport/metrics" || true; } | { grep '^ringlm_prompt_cache' || true; } \
                | python3 -c 'import json, sys; print(json.dumps([l.rstrip("\n") for l in sys.stdin]))'
        else echo '[]'; fi
        echo "}"
    } >"$work/mem-$1.json"
}

# warm-up: a short prompt on each server (its own seed, never reused), so that the first measured turn does
# not pay for buffers faulted in
seeded_ids 64 99991 >"$work/ids-warm"; seeded_ids "$new" 99992 >"$work/ids-warm-t2"
newfiles=$work/ids-warm-t2
for s in $servers; do
    f=$work/warm-$s
    python3 bench/tools/load_turns.py conv --api "$([ "$s" = ringlm ] && echo openai || echo llama)" \
        --port "$([ "$s" = ringlm ] && echo "${rport:-0}" || echo "$lport")" --prompt-file "$work/ids-warm" \
        --new-files "$newfiles" --reply "$reply" --ban-file "$work/bans.json" --timeout 120 >"$f.json" 2>"$f.err" \
        || die "$s: warm-up conversation failed: $(python3 -c 'import json, sys
try: print(json.load(open(sys.argv[1])).get("error"))
except Exception as x: print("no result:", x)' "$f.json")"
done
snapshot start

# ---- the conversations: pairs, the first of each pair alternating ---------------------------------------
g=0
for s in $sizes; do
    for i in $(seq "$convs"); do
        base=$((1000 + 100 * g)) # the seeds of this conversation: turn 1, then one per new message
        seeded_ids "$s" "$base" >"$work/ids-s$s-c$i-t1"
        newfiles=
        for k in $(seq 2 "$turns"); do
            seeded_ids "$new" $((base + k)) >"$work/ids-s$s-c$i-t$k"
            newfiles=$newfiles${newfiles:+,}$work/ids-s$s-c$i-t$k
        done
        unc=0; [ "$i" -le "$uncached_convs" ] && unc=1
        if [ $((g % 2)) = 0 ]; then order="ringlm llama-server"; else order="llama-server ringlm"; fi
        for name in $order; do
            case " $servers " in *" $name "*) conv "$name" "$s" "$i" "$unc" ;; esac
        done
        g=$((g + 1))
    done
    snapshot "s$s"
done
snapshot end
stop_pids "${pids[@]}"; pids=()

# ---- report ------------------------------------------------------------------------------------------
# llama-server's own lines on its cache (at its default verbosity), and ringlm's error lines
grep -aE 'checkpoint|cache|n_past|selected slot|prompt eval' "$work/llama-server.log" >"$work/llama-cache-lines.txt" 2>/dev/null || true
grep -aiE 'error|fail|abort|panic' "$work/ringlm.log" >"$work/ringlm-errors.txt" 2>/dev/null || true
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
SB_WORK=$work SB_OUT=$out SB_MODEL=$model SB_WEIGHTS=$weights SB_CTX_TRAIN=${n_ctx_train:-0} SB_SIZES=$sizes \
SB_CONVS=$convs SB_TURNS=$turns SB_REPLY=$reply SB_NEW=$new SB_UNCACHED=$uncached_convs SB_THREADS=$threads SB_THINK=$think \
SB_CTX=$ctx SB_SERVERS=$servers SB_COMMAND="bench/bench_cache.sh$argv" SB_CPU=$cpu SB_CORES=$(nproc) \
SB_LOAD=$(cut -d' ' -f1 /proc/loadavg) SB_LLAMA_BIN=$B python3 - <<'PY'
import json, os, time
e = os.environ; w = e["SB_WORK"]
sizes = [int(s) for s in e["SB_SIZES"].split()]; convs = int(e["SB_CONVS"]); turns = int(e["SB_TURNS"])
servers = e["SB_SERVERS"].split()
names = {"ringlm": "ringlm serve, one machine", "llama-server": "llama-server"}
med = lambda xs: None if not xs else (sorted(xs)[len(xs) // 2] + sorted(xs)[(len(xs) - 1) // 2]) / 2
def load(p):
    try: return json.load(open(p))
    except Exception as x: return {"error": "no result: %s" % x}
res = {str(s): {k: [load("%s/%s-s%d-c%d.json" % (w, k, s, i)) for i in range(1, convs + 1)] for k in servers} for s in sizes}
mem = {n: load("%s/mem-%s.json" % (w, n)) for n in ["start"] + ["s%d" % s for s in sizes] + ["end"]}
bans = load(w + "/bans.json")
both = "ringlm" in servers and "llama-server" in servers
t_of = lambda d, k: (d.get("turns") or [{}] * turns)[k - 1] if len(d.get("turns") or []) >= k else {}
summary = {}
for s in sizes:
    S = summary[str(s)] = {"turns": {}}
    for k in range(1, turns + 1):
        T = S["turns"][str(k)] = {}
        for name in servers:
            ts = [t_of(d, k) for d in res[str(s)][name]]
            T[name] = {"ttft_ms": [t.get("ttft_ms") for t in ts], "total_ms": [t.get("total_ms") for t in ts],
                       "read": [t.get("read") for t in ts], "cached": [t.get("cached") for t in ts],
                       "prompt_tokens": [t.get("prompt_tokens") for t in ts],
                       "ttft_ms_median": med([t["ttft_ms"] for t in ts if t.get("ttft_ms") is not None])}
            unc = [u for d in res[str(s)][name] for u in d.get("uncached") or [] if u.get("turn") == k]
            if unc:
                T[name]["uncached_ttft_ms"] = [u["ttft_ms"] for u in unc]
                T[name]["uncached_read"] = [u.get("read") for u in unc]
                T[name]["uncached_same_reply"] = all(u.get("same_reply_as_cached") for u in unc)
        if both:
            a, b = T["ringlm"]["ttft_ms"], T["llama-server"]["ttft_ms"]
            pr = [y / x for x, y in zip(a, b) if x and y]
            T["pair_ratios"] = pr # llama-server TTFT / ringlm TTFT: >= 1 is ringlm at least as fast
            T["ratio_median"] = med(pr)
            T["same_reply"] = [t_of(x, k).get("generated") == t_of(y, k).get("generated")
                               for x, y in zip(res[str(s)]["ringlm"], res[str(s)]["llama-server"])]
errs = ["%s, size %d, conversation %d: %s" % (n, s, i + 1, d["error"]) for s in sizes for n in servers
        for i, d in enumerate(res[str(s)][n]) if d.get("error")]
goal = None
if both:
    per = {str(s): {str(k): summary[str(s)]["turns"][str(k)]["ratio_median"] for k in range(2, turns + 1)} for s in sizes}
    met = not errs and all(v is not None and v >= 1.0 for d in per.values() for v in d.values())
    goal = {"statement": "one machine: TTFT of turns 2..%d at least 1.0x llama-server's speed (ringlm TTFT <= "
                         "llama-server TTFT), per size and turn, on the median of the per-pair ratios" % turns,
            "ratio_medians": per, "met": met}
errlog = open(w + "/ringlm-errors.txt").read().strip().splitlines() if os.path.exists(w + "/ringlm-errors.txt") else []
llama_lines = open(w + "/llama-cache-lines.txt").read().strip().splitlines() if os.path.exists(w + "/llama-cache-lines.txt") else []
doc = {"benchmark": "prompt cache: multi-turn TTFT, ringlm serve (one machine) vs llama-server at its defaults",
       "command": e["SB_COMMAND"], "think_s": float(e["SB_THINK"]), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
       "machine": {"cpu": e["SB_CPU"], "cores": int(e["SB_CORES"]), "load_avg_at_end": float(e["SB_LOAD"])},
       "model": {"file": e["SB_MODEL"], "weight_bytes": int(e["SB_WEIGHTS"]), "n_ctx_train": int(e["SB_CTX_TRAIN"])},
       "settings": {"sizes": sizes, "conversations_per_size": convs, "turns": turns, "reply_tokens": int(e["SB_REPLY"]),
                    "new_tokens_per_turn": int(e["SB_NEW"]), "uncached_conversations_per_size": int(e["SB_UNCACHED"]),
                    "threads": int(e["SB_THREADS"]), "ctx": int(e["SB_CTX"]), "servers": servers,
                    "banned_byte_tokens": len(bans) if isinstance(bans, list) else None,
                    "llama_server": e["SB_LLAMA_BIN"] + "/llama-server"},
       "summary": summary, "goal": goal, "memory": mem, "results": res, "errors": errs,
       "llama_server_cache_log": llama_lines[:400], "ringlm_log_errors": errlog[:50]}
json.dump(doc, open(e["SB_OUT"] + ".json", "w"), indent=1)

f = lambda v, p=0: "-" if v is None else ("%.*f" % (p, v))
fl = lambda xs, p=0: " / ".join(f(x, p) for x in xs) if xs else "-"
L = ["# Prompt cache: multi-turn time to first token, `ringlm serve` vs llama-server", "",
     "`%s`, %s, %s (%s cores), load avg at end %s." % (e["SB_COMMAND"], doc["date"], e["SB_CPU"], e["SB_CORES"], e["SB_LOAD"]), "",
     "Model `%s` (%.0f MiB, random weights, trained context %s). %d conversations per size, %d turns: turn 1 is SIZE "
     "seeded token ids (a seed per conversation), each server generates %s tokens greedily (temperature 0, "
     "ignore_eos, streamed), turn k+1 = turn k's prompt + the ids that server generated + %s new seeded ids. "
     "One sequence slot each (`--parallel 1` / `-np 1`), context %s, %s threads; both servers up side by side, "
     "one idle while the other works; each conversation runs on both, the first of the pair alternating. "
     "Pause between turns: %s s%s." % (
     os.path.basename(e["SB_MODEL"]), int(e["SB_WEIGHTS"]) / 1048576, e["SB_CTX_TRAIN"], convs, turns,
     e["SB_REPLY"], e["SB_NEW"], e["SB_CTX"], e["SB_THREADS"], e["SB_THINK"],
     " (turns back to back)" if float(e["SB_THINK"]) == 0 else ""), "",
     "Settings: ringlm serve at its defaults; llama-server as shipped (`cache_prompt` on, its context checkpoints, "
     "its host-RAM prompt cache, `-fa auto`, f16 cache), given only `-m`, `--host`, `--port`, `-np`, `-c`, `-t`.", "",
     "TTFT in ms per conversation (c1 / c2 / ...), median; *read* = prompt tokens the server says it read "
     "(llama-server: `timings.prompt_n`; ringlm: `prompt_tokens - prompt_tokens_details.cached_tokens`).", ""]
short = {"ringlm": "ringlm", "llama-server": "llama-server"}
hdr = "| size | turn | prompt tokens |" + "".join(" %s TTFT ms | median | %s read |" % (short[n], short[n]) for n in servers)
L += [hdr + (" ratio per pair | **median ratio** |" if both else ""),
      "|---|---|---|" + "---|---|---|" * len(servers) + ("---|---|" if both else "")]
for s in sizes:
    for k in range(1, turns + 1):
        T = summary[str(s)]["turns"][str(k)]
        pt = next((x for n in servers for x in T[n]["prompt_tokens"] if x), None)
        row = "| %d | %d | %s |" % (s, k, f(pt))
        for n in servers:
            row += " %s | %s | %s |" % (fl(T[n]["ttft_ms"]), f(T[n]["ttft_ms_median"]), fl(T[n]["read"]))
        if both:
            r = "-" if T["ratio_median"] is None else "%.2fx" % T["ratio_median"]
            row += " %s | %s |" % (fl(T["pair_ratios"], 2), "**%s**" % r if k > 1 else r)
        L.append(row)
unc_rows = [(s, k, n, summary[str(s)]["turns"][str(k)][n]) for s in sizes for k in range(2, turns + 1) for n in servers
            if "uncached_ttft_ms" in summary[str(s)]["turns"][str(k)][n]]
if unc_rows:
    L += ["", "What the cache saves: the same turns sent again at once with `cache_prompt: false` (first %s "
          "conversation(s) of each size):" % e["SB_UNCACHED"], "",
          "| size | turn | server | cached TTFT ms | uncached TTFT ms | uncached read | saved | reply equal to the cached turn's |", "|---|---|---|---|---|---|---|---|"]
    for s, k, n, T in unc_rows:
        c = T["ttft_ms"][:len(T["uncached_ttft_ms"])]
        sv = [u / x for x, u in zip(c, T["uncached_ttft_ms"]) if x]
        L.append("| %d | %d | %s | %s | %s | %s | %s | %s |" % (s, k, names[n], fl(c), fl(T["uncached_ttft_ms"]),
                 fl(T["uncached_read"]), " / ".join("%.1fx" % x for x in sv), "yes" if T["uncached_same_reply"] else "no"))
L += ["", "Memory (KiB of VmRSS after each size; VmHWM at the end):", "", "| after | " + " | ".join(names[n] for n in servers) + " |",
      "|---|" + "---|" * len(servers)]
for nm in ["start"] + ["s%d" % s for s in sizes] + ["end"]:
    m = mem[nm]
    L.append("| %s | %s |" % ("warm-up" if nm == "start" else "the end (peak)" if nm == "end" else "size " + nm[1:],
             " | ".join(f((m.get(n) or {}).get("hwm_kib" if nm == "end" else "rss_kib")) for n in servers)))
pc = mem.get("end", {}).get("ringlm_prompt_cache_metrics") or []
if "ringlm" in servers:
    L += ["", "ringlm's `/metrics` lines starting `ringlm_prompt_cache` at the end:", ""]
    L += ["    " + l for l in pc] if pc else ["    (none: this ringlm serve exports no prompt-cache metrics)"]
if goal:
    L += ["", "**Goal** (%s): %s." % (goal["statement"], "met" if goal["met"] else "NOT met")]
    L += ["", "| size | " + " | ".join("turn %d" % k for k in range(2, turns + 1)) + " |", "|---|" + "---|" * (turns - 1)]
    for s in sizes:
        L.append("| %d | %s |" % (s, " | ".join(f(goal["ratio_medians"][str(s)][str(k)], 2) + "x" for k in range(2, turns + 1))))
    same = [x for s in sizes for k in range(1, turns + 1) for x in summary[str(s)]["turns"][str(k)]["same_reply"]]
    L += ["", "Replies equal between the servers, turn by turn: %d of %d." % (sum(same), len(same))]
else:
    L += ["", "**Goal**: not judged (one server only: `--servers %s`)." % e["SB_SERVERS"]]
if errs: L += ["", "Failures:", ""] + ["- " + x for x in errs]
if errlog: L += ["", "Error lines in the ringlm log:", ""] + ["    " + l for l in errlog[:20]]
L += ["", "Notes:", "",
      "- TTFT = request sent to the first streamed chunk carrying token ids (ringlm: `choices[0].token_ids`, "
      "`return_token_ids: true`; llama-server: `tokens`, `return_tokens: true`); the ids are what turn k+1 resends.",
      "- %s byte tokens whose text alone is not valid UTF-8 are banned on both servers with `logit_bias` (found with "
      "llama-server's `/detokenize`): llama-server ends a stream with a 500 when this random-weight model emits one; "
      "ringlm would not, but gets the same ban so that both choose from the same tokens and reply alike." % doc["settings"]["banned_byte_tokens"],
      "- The reply's last token is sampled but never run through the model, so a server that resumes from its live "
      "state reads it with the new tokens: %s + 1 tokens read is full reuse." % e["SB_NEW"],
      "- A reply that differs between a cached turn and the same turn uncached, or between the servers, is not an "
      "error in itself: a resumed turn's earlier tokens went through the model one at a time (decode kernels, the "
      "KDA recurrence step by step) where an uncached turn prefills them in batches (other kernels, KDA's chunked "
      "form), and this random-weight model's greedy choices flip on ties that close. Both servers resend their "
      "own replies, so their conversations may part after the first turn.", ""]
if llama_lines:
    L += ["llama-server's log lines on its cache, at its default verbosity (first 30; all in the JSON):", ""]
    L += ["    " + l for l in llama_lines[:30]] + [""]
open(e["SB_OUT"] + ".md", "w").write("\n".join(L))
PY
cat "$out.md"
