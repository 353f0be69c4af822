#!/usr/bin/env bash
# No lost request (docs/serve.md "When a node fails"): `ringlm serve --ring` over 3 nodes and a standby,
# 8 concurrent streamed requests (greedy and seeded sampling; no drafts, n-gram drafts, a draft model).
#   - two stages killed (kill -9) one after the other while they stream: every request completes, its text
#     exactly the undisturbed run's (sampled ones too: the sampler resumes; only a sampled request with
#     drafts may differ, its drafts in flight being dropped - it completes);
#   - the killed nodes restarted: taken back in while idle (/health: roles, generation);
#   - a stage stopped (SIGSTOP: its heartbeats stop, the coordinator calls its link down within --link-timeout, 0.5 s): the same;
#   - a stage killed and restarted at once (back while the server recovers from its death): the same;
#   - two nodes killed 0.3 s apart (the second during the first recovery): the same;
#   - the ring shrunk below the model's memory (ring.conf mem= caps): clean 503s naming what is short and
#     the nodes out; the nodes back: served again, the same text;
#   - receipts of the whole run verify (ringlm receipts verify), every sequence audited, none faulty.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ring_lib.sh"
. "$(dirname "$0")/serve_lib.sh"
f=$(model full-f32 k3-full f32)
mkdir -p "$RING/models"
ln -sf "$f" "$RING/models/full-f32.gguf"
CT=(--max-time 120 -s)
trap 'serve_stop_all; kill -CONT "${RING_PID[@]}" 2>/dev/null; ring_stop || true
      [ -n "${KEEP_WORK:-}" ] || rm -rf "$WORK"' EXIT

ring_keys 4
for i in 1 2 3 4; do ring_start $i "$RING/models" || exit 1; done
# mem=: 2 nodes hold the model and 8 sequences of 1024 tokens (with the rollback copies of their drafted
# blocks and the prompt cache's 8 checkpoints each), 1 does not (the shrink below)
: >"$WORK/ring.conf"
for i in 1 2 3 4; do
    echo "127.0.0.1:${RING_PORT[$i]} $(cat "$RING/n$i.pub") mem=0.07$([ $i = 4 ] && echo ' standby')" >>"$WORK/ring.conf"
done
serve_start srv -m "$f" --ring "$WORK/ring.conf" --key "$RING/coord.key" --parallel 8 --chunk 16 --ctx 1024 \
    --draft "$f" --threads 1 --receipts "$WORK/rcpt.jsonl" --audit-rate 1 --audit-seed 5
URL=${SRV_URL[srv]}
health() { curl "${CT[@]}" "$URL/health" >"$WORK/$1.json"; }
metric() { curl "${CT[@]}" "$URL/metrics" | awk -v k="$1" '$1 == k { print $2 }'; }
health h0
check "a ring of 3 stages; the 4th node (standby) holds none" py "$WORK/h0.json" \
    "[n['role'] for n in d['nodes']] == ['stage', 'stage', 'stage', 'standby'] and d['ring']['generation'] == 1"

# body I: request I of the set (i % 4: 0 greedy, 1 sampled, 2 greedy n-gram, 3 greedy draft model; i >= 4:
# the same kinds, 6 sampled with n-gram drafts)
body() {
    local i=$1 t=0 d=none
    case $((i % 4)) in 1) t=1 ;; 2) d=ngram ;; 3) d=model ;; esac
    [ "$i" = 6 ] && t=1
    echo "{\"prompt\":\"Request $i: one two three one two three\",\"max_tokens\":120,\"temperature\":$t,\"seed\":$i,\"ignore_eos\":true,\"draft\":\"$d\",\"stream\":true}"
}
# round NAME [ACTION]: the 8 requests at once; ACTION (a function) runs once they stream
round() {
    local name=$1 action=${2:-} pids=() i
    for i in 0 1 2 3 4 5 6 7; do
        curl "${CT[@]}" -N -o "$WORK/$name$i.sse" -H 'Content-Type: application/json' --data-binary "$(body $i)" \
            "$URL/v1/completions" &
        pids+=($!)
    done
    if [ -n "$action" ]; then
        local g0; g0=$(metric ringlm_generated_tokens_total)
        for _ in $(seq 400); do [ $(( $(metric ringlm_generated_tokens_total) - g0 )) -ge 150 ] && break; sleep 0.02; done
        $action
    fi
    wait "${pids[@]}" || true
}
# same NAME: every stream of round NAME ended with [DONE]; the greedy ones' text = the undisturbed one's. (The
# sampled ones, 1 and 6, need only complete here: among concurrent requests a token's numbers depend on
# what shares its batch - docs/numerics.md - so even an undisturbed rerun may draw otherwise. A sampled
# request alone resumes exactly: the last check below.)
same() {
    python3 - "$WORK" "$1" <<'PY'
import json, sys
w, name = sys.argv[1], sys.argv[2]
def text(path):
    raw = open(path, 'rb').read()
    ev = [json.loads(l[6:]) for l in raw.split(b'\n') if l.startswith(b'data: {')]
    assert raw.rstrip().endswith(b'data: [DONE]') and not any('error' in e for e in ev), raw[-300:]
    return ''.join(c['text'] for e in ev for c in e['choices'])
bad = 0
for i in range(8):
    try:
        t = text('%s/%s%d.sse' % (w, name, i))
        if i not in (1, 6) and t != text('%s/base%d.sse' % (w, i)):
            raise AssertionError('text differs from the undisturbed run')
    except Exception as e:
        bad += 1
        print('info: request %d: %s' % (i, str(e)[:300]))
sys.exit(1 if bad else 0)
PY
}
stage_pid() { # the pid of the node serving stage $1 now
    local a
    a=$(python3 -c "import json,sys; d=json.load(open('$WORK/hs.json')); print([n['addr'] for n in d['nodes'] if n.get('stage') == $1][0])")
    for i in "${!RING_PORT[@]}"; do [ "127.0.0.1:${RING_PORT[$i]}" != "$a" ] || echo "$i"; done
}
wait_whole() { # until /health shows 3 stages of up nodes and no node down (the idle server took them back)
    for _ in $(seq 300); do
        health hw
        py "$WORK/hw.json" "sum(n['role'] == 'stage' for n in d['nodes']) == 3 and all(n['role'] != 'down' for n in d['nodes'])" \
            >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    cat "$WORK/hw.json"; return 1
}

round base
check "undisturbed: 8 streams complete" bash -c "for i in 0 1 2 3 4 5 6 7; do grep -q 'data: \[DONE\]' '$WORK/base'\$i.sse || exit 1; done"

# ---- two stages killed in turn -------------------------------------------------------------------------------
health hs
K1=$(stage_pid 1)
kill_two() {
    kill -9 "${RING_PID[$K1]}"
    local g0; g0=$(metric ringlm_generated_tokens_total)
    for _ in $(seq 400); do [ $(( $(metric ringlm_generated_tokens_total) - g0 )) -ge 150 ] && break; sleep 0.02; done
    health hs
    K2=$(stage_pid 0)
    kill -9 "${RING_PID[$K2]}"
    echo "$K2" >"$WORK/k2"
}
round kill kill_two
K2=$(cat "$WORK/k2")
check "two stages killed (node $K1, then node $K2): all 8 requests complete with the undisturbed text" same kill
health h1
check "/health: both down, the standby in a stage, 2 recoveries" py "$WORK/h1.json" \
    "sorted(n['role'] for n in d['nodes']) == ['down', 'down', 'stage', 'stage'] and node(d, '127.0.0.1:${RING_PORT[4]}')['role'] == 'stage' and d['ring']['recoveries'] >= 2"
check "/metrics: recoveries (counted and in the pause histogram), replayed tokens, the nodes' roles" bash -c \
    "curl -s --max-time 10 '$URL/metrics' >'$WORK/m1.txt' && awk '/^ringlm_ring_recoveries_total/ { r = \$2 } /^ringlm_ring_replayed_tokens_total/ { t = \$2 }
       /^ringlm_ring_recovery_seconds_count/ { c = \$2 } /^ringlm_node_role.*role=\"down\"} 1/ { d++ } /^ringlm_node_role.*role=\"stage\"} 1/ { s++ }
       END { exit !(r >= 2 && t > 0 && c == r && d == 2 && s == 2) }' '$WORK/m1.txt'"

ring_start "$K1" "$RING/models" || exit 1
ring_start "$K2" "$RING/models" || exit 1
check "both restarted: the idle server takes them back (3 stages, no node down)" wait_whole

# ---- a stage stopped (SIGSTOP), then continued -------------------------------------------------------------
health hs
S1=$(stage_pid 2)
stop_one() { kill -STOP "${RING_PID[$S1]}"; }
round stop stop_one
kill -CONT "${RING_PID[$S1]}"
check "a stage stopped (node $S1): all 8 complete with the undisturbed text" same stop
check "... the server saw its link close and re-formed the ring" grep -q "re-formed (" "$WORK/srv.log"
check "continued: taken back in" wait_whole

# ---- the dead node restarted while the server recovers from its death -------------------------------------------
health hs
R=$(stage_pid 1)
kill_restart() { kill -9 "${RING_PID[$R]}"; sleep 0.2; ring_start "$R" "$RING/models"; }
round restart kill_restart
check "a stage killed and restarted at once (node $R, back during the recovery): all 8 complete with the undisturbed text" \
    same restart
check "... and the ring is whole again (3 stages, no node down)" wait_whole

# ---- a node killed during the recovery from another -----------------------------------------------------------
health hs
A=$(stage_pid 0) B=$(stage_pid 2)
kill_close() { kill -9 "${RING_PID[$A]}"; sleep 0.3; kill -9 "${RING_PID[$B]}"; }
round close kill_close
check "two nodes killed 0.3 s apart (nodes $A, $B): all 8 complete with the undisturbed text" same close

# ---- shrunk below the model's memory: 503s; the nodes back: served again --------------------------------------
health hs
C=$(python3 -c "import json; d=json.load(open('$WORK/hs.json')); print([n['addr'] for n in d['nodes'] if n['role'] == 'stage'][0])")
CK=
for i in "${!RING_PORT[@]}"; do [ "127.0.0.1:${RING_PORT[$i]}" != "$C" ] || CK=$i; done
kill -9 "${RING_PID[$CK]}"
sleep 0.5
curl "${CT[@]}" -o "$WORK/short.json" -w '%{http_code}' -H 'Content-Type: application/json' \
    --data-binary '{"prompt":"hi","max_tokens":4}' "$URL/v1/completions" >"$WORK/short.code" || true
check "one node left, too small for the model: 503 saying what is short and naming the nodes out" bash -c \
    "test \"\$(cat '$WORK/short.code')\" = 503 && python3 '$WORK/check.py' '$WORK/short.json' \
     \"'out of the ring' in d['error']['message'] and '$C' in d['error']['message'] and 'memory' in d['error']['message'].lower()\" || cat '$WORK/short.json'"
for i in "$A" "$B" "$CK"; do ring_start "$i" "$RING/models" || exit 1; done
check "the nodes back: taken in again" wait_whole
round back
check "... and the 8 requests get the undisturbed text again" same back

# ---- one sampled request alone, a stage killed under it: the sampler resumes, the text is exactly the same -----
solo() { # solo NAME: a sampled stream, 160 tokens
    curl "${CT[@]}" -N -o "$WORK/$1.sse" -H 'Content-Type: application/json' --data-binary \
        '{"prompt":"Alone: one two three","max_tokens":160,"temperature":1,"seed":42,"ignore_eos":true,"draft":"none","stream":true}' \
        "$URL/v1/completions"
}
solo solo_base
health hs
SK=$(stage_pid 1)
solo solo_kill &
spid=$!
g0=$(metric ringlm_generated_tokens_total)
for _ in $(seq 400); do [ $(( $(metric ringlm_generated_tokens_total) - g0 )) -ge 40 ] && break; sleep 0.02; done
kill -9 "${RING_PID[$SK]}"
wait $spid || true
check "a sampled request alone, a stage (node $SK) killed after ~40 of its 160 tokens: the same text as undisturbed" \
    py "$WORK/solo_kill.sse" "raw.rstrip().endswith(b'data: [DONE]') and text(sse(raw)) == text(sse(open('$WORK/solo_base.sse', 'rb').read()))"
ring_start "$SK" "$RING/models" || exit 1

# ---- receipts and audits across the re-formed rings -----------------------------------------------------------
sleep 1 # audits run once the server is idle
health ha
curl "${CT[@]}" "$URL/metrics" >"$WORK/ma.txt"
check "sequences audited across the re-formed rings, no node found faulty" bash -c \
    "python3 '$WORK/check.py' '$WORK/ha.json' \"all(n['role'] != 'faulty' for n in d['nodes'])\" &&
     awk '/^ringlm_audits_total/ { s += \$2 } END { exit !(s >= 8) }' '$WORK/ma.txt'"
kill -TERM "${SRV_PID[srv]}"; wait "${SRV_PID[srv]}" || true; unset 'SRV_PID[srv]'
check "the receipts of every ring verify" "$RINGLM" receipts verify "$WORK/rcpt.jsonl" --model "$f" --ring "$WORK/ring.conf" \
    --key "$RING/coord.pub"
# ---- ringlm run --ring (one request): a stage killed under it, the run goes on ------------------------------
# Sampled (seed 7), alone on the ring: the text is exactly the undisturbed run's.
rrun() { "$RINGLM" run -m "$f" --ring "$WORK/ring.conf" --key "$RING/coord.key" -p "Run: one two three" -n 200 \
             --temp 1 --seed 7 --ignore-eos --ctx 1024 "$@"; }
rrun >"$WORK/run_base.txt" 2>"$WORK/run_base.err"
rrun >"$WORK/run_kill.txt" 2>"$WORK/run_kill.err" &
rpid=$!
for _ in $(seq 400); do [ "$(wc -c <"$WORK/run_kill.txt")" -gt 40 ] && break; sleep 0.02; done
kill -9 "${RING_PID[1]}"
rc=0; wait $rpid || rc=$?
check "run --ring: node 1 killed mid-run: exit 0, the same text as undisturbed, the ring re-formed" bash -c \
    "test $rc = 0 && same_files '$WORK/run_base.txt' '$WORK/run_kill.txt' && grep -q 're-forming it over the' '$WORK/run_kill.err' ||
     { echo rc=$rc; tail -5 '$WORK/run_kill.err'; exit 1; }"
ring_start 1 "$RING/models" || exit 1
# ... and speculating (run --ring --draft): the block in flight is dropped, the sequence rebuilt up to its
# last committed token, and speculation goes on (DSpark from the new ring's taps). Greedy: the text is plain
# greedy decoding's.
"$RINGLM" run -m "$f" -p "Run: one two three" -n 200 --temp 0 --ignore-eos --ctx 1024 >"$WORK/greedy.txt" 2>/dev/null
"$RINGLM" synth --no-progress --config "$ROOT/tests/configs/k3-full.json" --draft dspark -o "$WORK/ds.gguf" --seed 5
for d in ngram "$f" "dspark:$WORK/ds.gguf"; do
    case $d in ngram) name=n-gram ;; dspark:*) name=DSpark ;; *) name="draft model" ;; esac
    rrun_d() { "$RINGLM" run -m "$f" --ring "$WORK/ring.conf" --key "$RING/coord.key" -p "Run: one two three" -n 200 \
                   --temp 0 --ignore-eos --ctx 1024 --draft "$d" --draft-depth 2; }
    rrun_d >"$WORK/spec_kill.txt" 2>"$WORK/spec_kill.err" &
    rpid=$!
    for _ in $(seq 400); do [ "$(wc -c <"$WORK/spec_kill.txt")" -gt 40 ] && break; sleep 0.02; done
    kill -9 "${RING_PID[2]}"
    rc=0; wait $rpid || rc=$?
    check "run --ring --draft ($name): node 2 killed mid-run: exit 0, plain greedy's text, the ring re-formed" bash -c \
        "test $rc = 0 && same_files '$WORK/greedy.txt' '$WORK/spec_kill.txt' && grep -q 're-forming it over the' '$WORK/spec_kill.err' ||
         { echo rc=$rc; tail -5 '$WORK/spec_kill.err'; exit 1; }"
    ring_start 2 "$RING/models" || exit 1
done
finish
