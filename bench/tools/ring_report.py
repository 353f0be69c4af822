"""Aggregates the runs of bench/bench_ring.sh into PREFIX.json and PREFIX.md (standard library only).

Reads its settings from RB_* environment variables and the per-run files in RB_WORK:
  ringlm-dD-decode-rR.json       ringlm run --metrics-json of a decode run (1-token prompt)
  ringlm-dD-ttft-cC-rR.json      the same for a prefill run of the whole prompt in chunks of C
  llama-dD-rR.json               llama-bench -r 1 -o json, paired with ringlm's runs of repetition R
"""
import json
import os
import platform
import statistics
import sys
import time


def env(name):
    v = os.environ.get("RB_" + name)
    if v is None:
        sys.exit("ring_report.py: RB_%s is not set (run bench/bench_ring.sh)" % name)
    return v


def fnum(s):
    x = float(s)
    return int(x) if x == int(x) else x


work, out = env("WORK"), env("OUT")
delays = [fnum(d) for d in env("DELAYS").split()]
chunks = [int(c) for c in env("CHUNKS").split()]
nodes, threads = int(env("NODES")), int(env("THREADS"))
prompt, gen = int(env("PROMPT")), int(env("GEN"))
reps = int(env("REPS"))
med = statistics.median


def load(path):
    with open(path) as f:
        return json.load(f)


def dname(d):
    return ("%g" % d)


results = []
for d in delays:
    dec = [load("%s/ringlm-d%s-decode-r%d.json" % (work, dname(d), r)) for r in range(1, reps + 1)]
    n_stages = len(dec[0]["ring"]["stages"])
    if any(len(m["ring"]["stages"]) != n_stages for m in dec):
        sys.exit("ring_report.py: the plan changed between runs at delay %s ms" % dname(d))
    stages = []
    for s in range(n_stages):
        st = [m["ring"]["stages"][s] for m in dec]
        stages.append({
            "node": st[0]["node"], "layers": [st[0]["layer_start"], st[0]["layer_end"]],
            "compute_ms": med(x["compute_ms"] for x in st),
            "queue_ms": med(x["queue_ms"] for x in st),
            "wire_ms": med(x["wire_ms"] for x in st),
        })
    compute_ms = sum(s["compute_ms"] for s in stages)
    hop_delay_ms = (n_stages + 1) * d
    floor = 1000.0 / (hop_delay_ms + compute_ms)
    decode = med(m["decode_tok_s"] for m in dec)
    ring = {
        "decode_tok_s": decode,
        "decode_tok_s_runs": [m["decode_tok_s"] for m in dec],
        "n_stages": n_stages,
        "stages": stages,
        "return_wire_ms": med(m["ring"]["return_wire_ms"] for m in dec),
        "traversal_ms": med(m["ring"]["traversal_ms"] for m in dec),
        "prefill": {},
    }
    # what a traversal costs beyond the emulated delays and the stages' compute (wakeups, framing,
    # encryption, the coordinator's own work)
    ring["traversal_overhead_ms"] = ring["traversal_ms"] - hop_delay_ms - compute_ms
    for c in chunks:
        failed = "%s/ringlm-d%s-ttft-c%d.failed" % (work, dname(d), c)
        runs = []
        for r in range(1, reps + 1):
            f = "%s/ringlm-d%s-ttft-c%d-r%d.json" % (work, dname(d), c, r)
            if os.path.exists(f):
                runs.append(load(f))
        e = {"runs_ok": len(runs), "runs": reps}
        if os.path.exists(failed):
            with open(failed) as fh:
                e["failed"] = fh.read().strip()
        if runs:
            e.update({"ttft_s": med(m["ttft_s"] for m in runs), "ttft_s_runs": [m["ttft_s"] for m in runs],
                      "prefill_tok_s": med(m["prefill_tok_s"] for m in runs)})
        ring["prefill"][str(c)] = e
    ok = [c for c in chunks if "ttft_s" in ring["prefill"][str(c)]]
    best = min(ok, key=lambda c: ring["prefill"][str(c)]["ttft_s"]) if ok else None
    ring["best_chunk"] = best
    ring["ttft_s"] = ring["prefill"][str(best)]["ttft_s"] if ok else None

    pps, tgs = [], []
    for r in range(1, reps + 1):
        lb = load("%s/llama-d%s-r%d.json" % (work, dname(d), r))
        pps.append(next(t for t in lb if t["n_prompt"] > 0 and t["n_gen"] == 0)["avg_ts"])
        tgs.append(next(t for t in lb if t["n_gen"] > 0 and t["n_prompt"] == 0)["avg_ts"])
    llama = {
        "pp_tok_s": med(pps), "pp_tok_s_runs": pps, "decode_tok_s": med(tgs), "decode_tok_s_runs": tgs,
        "ttft_s": prompt / med(pps), "reps": reps,
    }
    # Per pair: ringlm's run of a repetition against llama-bench's of the same one (run back to back).
    dec_pairs = [m["decode_tok_s"] / t for m, t in zip(dec, tgs)]
    ttft_pairs = []
    for r in range(1, reps + 1):
        best_r = [ring["prefill"][str(c)]["ttft_s_runs"][r - 1] for c in ok
                  if ring["prefill"][str(c)]["runs_ok"] == reps]
        if best_r:
            ttft_pairs.append((prompt / pps[r - 1]) / min(best_r))
    results.append({
        "delay_ms": d,
        "ringlm": ring,
        "llama_cpp_rpc": llama,
        "decode_ratio": med(dec_pairs),
        "decode_ratio_pairs": dec_pairs,
        "ttft_ratio": med(ttft_pairs) if ttft_pairs else None,
        "ttft_ratio_pairs": ttft_pairs,
        "network_floor": {"hop_delays": n_stages + 1, "hop_delay_ms": hop_delay_ms,
                          "stage_compute_ms": compute_ms, "tok_s": floor},
        "decode_fraction_of_floor": decode / floor,
    })

# goals (from the issue)
at30 = [r for r in results if r["delay_ms"] == 30]
g1_row = at30[0] if at30 else max(results, key=lambda r: r["delay_ms"])
goal_ratio = {"goal": "ringlm decode >= 3x llama.cpp RPC decode at 30 ms one-way delay",
              "delay_ms": g1_row["delay_ms"], "ratio": g1_row["decode_ratio"],
              "met": g1_row["decode_ratio"] >= 3.0, "measured_at_30ms": bool(at30)}
worst = min(results, key=lambda r: r["decode_fraction_of_floor"])
goal_floor = {"goal": "greedy decode within 10% of the network floor (>= 0.90 of it) at every delay",
              "worst_delay_ms": worst["delay_ms"], "worst_fraction": worst["decode_fraction_of_floor"],
              "met": worst["decode_fraction_of_floor"] >= 0.9}

date = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
doc = {
    "benchmark": "ring over emulated internet links: ringlm ring vs llama.cpp RPC",
    "command": env("COMMAND"),
    "date": date,
    "machine": {"cpu": env("CPU"), "cores": int(env("CORES")), "kernel": platform.release(),
                "load_avg_at_end": float(env("LOAD")),
                "note": "all nodes, servers and relays are local processes on this one machine"},
    "setup": {"nodes": nodes, "threads_per_node": threads, "llama_bench_client_threads": threads,
              "ringlm_coordinator_threads": threads, "delays_ms": delays,
              "link": "ringlm relay per node: one-way delay in each direction, no rate cap",
              "prompt_tokens": prompt, "gen_tokens": gen, "chunks": chunks, "ringlm_reps": reps,
              "ringlm_decode": "1-token prompt, then %d greedy steps (--temp 0 --ignore-eos); median of %d runs"
                               % (gen, reps),
              "ringlm_ttft": "%d-token prompt of seeded ids, -n 1, per chunk size; median of %d runs" % (prompt, reps),
              "llama_cpp": "llama-bench --rpc (%d ggml-rpc-server -t %d) -ngl 99 -p %d -n %d -t %d -r 1 per "
                           "repetition, at its defaults otherwise (repacked CPU weights, -fa auto, f16 cache); tg from "
                           "an empty context; TTFT = %d / pp t/s" % (nodes, threads, prompt, gen, threads, prompt),
              "pairs": "each repetition: ringlm's runs and one llama-bench, alternating which goes first; ratios are "
                       "medians of per-pair ratios",
              "network_floor": "1 / ((stages + 1) x delay + sum of per-stage decode compute_ms)",
              "llama_bin": env("LLAMA_BIN")},
    "model": {"file": env("MODEL"), "weight_bytes": int(env("WEIGHTS")), "n_layer": int(env("NLAYER"))},
    "results": results,
    "goals": [goal_ratio, goal_floor],
}
with open(out + ".json.tmp", "w") as f:
    json.dump(doc, f, indent=2)
    f.write("\n")
os.replace(out + ".json.tmp", out + ".json")


def f2(x):
    return "%.2f" % x


L = []
L.append("# A ring over emulated internet links: ringlm vs llama.cpp RPC\n")
L.append("`%s`, %s, %s (%s cores). Model: `%s` (%.2f GiB, %d layers). %d nodes as local processes, %d thread(s) "
         "each (the machine has %s cores), every link through a `ringlm relay` with the one-way delay below "
         "(each direction, no rate cap). %d pairs per delay: ringlm's runs and one llama-bench `-r 1`, alternating "
         "which goes first; figures are medians, ratios medians of the per-pair ratios.\n"
         % (env("COMMAND"), date[:10], env("CPU"), env("CORES"), os.path.basename(env("MODEL")),
            int(env("WEIGHTS")) / 2**30, int(env("NLAYER")), nodes, threads, env("CORES"), reps))
L.append("| one-way delay | ringlm decode tok/s | llama.cpp RPC decode tok/s | ratio | ringlm TTFT | llama.cpp TTFT "
         "| network floor tok/s | ringlm / floor |")
L.append("|---:|---:|---:|---:|---:|---:|---:|---:|")
for r in results:
    g, l, nf = r["ringlm"], r["llama_cpp_rpc"], r["network_floor"]
    ttft = "%.3f s (chunk %d)" % (g["ttft_s"], g["best_chunk"]) if g["ttft_s"] else "failed"
    L.append("| %s ms | %s | %s | %.2fx | %s | %.3f s | %s | %.0f%% |"
             % (dname(r["delay_ms"]), f2(g["decode_tok_s"]), f2(l["decode_tok_s"]), r["decode_ratio"], ttft,
                l["ttft_s"], f2(nf["tok_s"]), 100 * r["decode_fraction_of_floor"]))
L.append("")
L.append("Goals (from the issue):\n")
L.append("- **at least 3x llama.cpp RPC decode at 30 ms**: %.2fx at %s ms%s: **%s**"
         % (goal_ratio["ratio"], dname(goal_ratio["delay_ms"]),
            "" if goal_ratio["measured_at_30ms"] else " (30 ms was not measured; largest delay shown)",
            "met" if goal_ratio["met"] else "not met"))
L.append("- **greedy decode within 10%% of the network floor**: worst %.0f%% of the floor (at %s ms): **%s**\n"
         % (100 * goal_floor["worst_fraction"], dname(goal_floor["worst_delay_ms"]),
            "met" if goal_floor["met"] else "not met"))
L.append("How each figure is made:\n")
L.append("- *ringlm decode*: a 1-token prompt, then %d greedy steps (`--temp 0 --ignore-eos`); tok/s as `ringlm run` "
         "reports it. *llama.cpp decode*: llama-bench `tg%d` (also from an empty context), `-ngl 99` over %d "
         "`ggml-rpc-server -t %d`.\n- *Settings*: ringlm at its defaults (repacked weights where llama.cpp repacks them, flash attention, "
         "f16 cache); llama.cpp at its defaults too (repacked weights on the CPU, `-fa auto`, f16 cache), with only "
         "`--rpc`, `-ngl 99`, `-t`, `-p`, `-n`, `-r` given." % (gen, gen, nodes, threads))
L.append("- *ratio*: the median over the pairs of ringlm's decode tok/s over llama-bench's in the same pair; "
         "per pair: " + "; ".join("%s ms: %s" % (dname(r["delay_ms"]), ", ".join("%.2f" % x for x in r["decode_ratio_pairs"]))
                                   for r in results) + ".")
L.append("- *ringlm TTFT*: the %d-token prompt (seeded ids) sent in chunks of %s (one chunk = no pipelining); the "
         "table shows the fastest. *llama.cpp TTFT* = %d / llama-bench `pp%d` t/s (llama-bench has no TTFT; "
         "its pp test is the prompt in one batch, without sampling)." % (prompt, ", ".join(map(str, chunks)),
                                                                          prompt, prompt))
L.append("- *network floor* = 1 / ((stages + 1) x delay + sum of the stages' decode compute_ms): the one-way delays "
         "coordinator -> stage 0 -> ... -> last stage -> coordinator, plus each stage's own compute, with nothing "
         "else. Stage compute is ringlm's own per-stage figure from the decode runs.")
L.append("- Every 'machine' here is a process on one %s-core machine, so stages never compute at the same time in "
         "decode (a ring is sequential per token) but chunked prefill can overlap at most %s stages at once.\n"
         % (env("CORES"), env("CORES")))
def chunk_cell(c, v):
    t = "chunk %s %.3f" % (c, v["ttft_s"]) if "ttft_s" in v else "chunk %s failed" % c
    if "failed" in v:
        t += " (%d of %d runs ok; %s)" % (v["runs_ok"], v["runs"], v["failed"])
    return t


L.append("Prefill (ringlm TTFT per chunk size, s): " + "; ".join(
    "%s ms: " % dname(r["delay_ms"]) + ", ".join(chunk_cell(c, v) for c, v in r["ringlm"]["prefill"].items())
    for r in results) + ".\n")
L.append("ringlm decode, per stage (median ms per traversal; wire = from the previous sender's send to this "
         "stage's receive, ideally the one-way delay):\n")
L.append("| delay | stage | layers | compute ms | queue ms | wire ms | wire - delay |")
L.append("|---:|---:|---|---:|---:|---:|---:|")
for r in results:
    g, d = r["ringlm"], r["delay_ms"]
    for i, s in enumerate(g["stages"]):
        L.append("| %s ms | %d | %d-%d | %.3f | %.3f | %.3f | %+.3f |"
                 % (dname(d), i, s["layers"][0], s["layers"][1] - 1, s["compute_ms"], s["queue_ms"], s["wire_ms"],
                    s["wire_ms"] - d))
    L.append("| %s ms | return | | | | %.3f | %+.3f |" % (dname(d), g["return_wire_ms"], g["return_wire_ms"] - d))
    L.append("| %s ms | traversal | | %.3f total compute | | %.3f | overhead %+.3f |"
             % (dname(d), r["network_floor"]["stage_compute_ms"], g["traversal_ms"], g["traversal_overhead_ms"]))
L.append("\nllama.cpp RPC, per pair: " + "; ".join(
    "%s ms: pp%d %s t/s, tg%d %s t/s" % (dname(r["delay_ms"]), prompt,
                                         " / ".join("%.2f" % x for x in r["llama_cpp_rpc"]["pp_tok_s_runs"]), gen,
                                         " / ".join("%.2f" % x for x in r["llama_cpp_rpc"]["decode_tok_s_runs"]))
    for r in results) + ".")
with open(out + ".md.tmp", "w") as f:
    f.write("\n".join(L) + "\n")
os.replace(out + ".md.tmp", out + ".md")
