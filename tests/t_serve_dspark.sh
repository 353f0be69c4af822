#!/usr/bin/env bash
# ringlm serve --draft dspark:FILE: DSpark drafts per request, from the target's hidden states that every
# step returns (on one machine, and from the stages of a 3-node ring that hold the tap layers). Greedy text
# equals plain decoding; each request's drafts are the ones `ringlm run` makes for the same prompt (the
# same kept and rejected counts, reported in usage.completion_tokens_details), alone and 4 at once; a
# request may choose another drafter or none; a server without DSpark refuses "draft": "dspark"; a file
# that is not a DSpark draft stops the server at start, naming the problem.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ring_lib.sh"
. "$(dirname "$0")/serve_lib.sh"
f=$(model full-f32 k3-full f32)
ds=$WORK/dspark.gguf
"$RINGLM" synth --no-progress --config "$ROOT/tests/configs/k3-full.json" --draft dspark -o "$ds" --seed 5 >/dev/null
mkdir -p "$RING/models"
ln -sf "$f" "$RING/models/full-f32.gguf"
trap 'serve_stop_all; ring_stop || true; [ -n "${KEEP_WORK:-}" ] || rm -rf "$WORK"' EXIT
CT=(--max-time 120 -s)

prompts=("The quick brown fox" "Once upon a time" "In the beginning" "Hello world, this is a longer prompt")
N=40
greedy() { echo "{\"prompt\":\"$1\",\"max_tokens\":$N,\"temperature\":0,\"ignore_eos\":true${2:-}}"; }
post() { # post NAME JSON: body to $WORK/NAME.json, status to $WORK/NAME.code
    curl "${CT[@]}" -o "$WORK/$1.json" -w '%{http_code}' -H 'Content-Type: application/json' --data-binary "$2" \
        "$URL/v1/completions" >"$WORK/$1.code" || true
}
# What `ringlm run` gives for prompt i: the text (as a JSON string) and "accepted rejected" of its drafts,
# each block drafted from the committed tokens alone (--draft-depth 1) at the server's length (--draft-fixed).
for i in 0 1 2 3; do
    "$RINGLM" run -m "$f" -p "${prompts[$i]}" -n $N --temp 0 --ignore-eos --threads 1 2>/dev/null |
        python3 -c 'import sys, json; json.dump(sys.stdin.buffer.read().decode("utf-8", "replace"), sys.stdout)' >"$WORK/want$i.exp"
    "$RINGLM" run -m "$f" -p "${prompts[$i]}" -n $N --temp 0 --ignore-eos --threads 1 --draft "dspark:$ds" --draft-fixed \
        --draft-depth 1 --draft-n 7 --draft-fallback off --metrics-json "$WORK/run$i.json" >/dev/null 2>"$WORK/run$i.err" || cat "$WORK/run$i.err"
    python3 -c 'import json, sys; m = json.load(open(sys.argv[1])); print(m["accepted"], m["drafted"] - m["accepted"])' \
        "$WORK/run$i.json" >"$WORK/want$i.cnt"
done
kept_total=$(awk '{ s += $1 } END { print s + 0 }' "$WORK"/want?.cnt)
# usage's counts of request NAME, as "accepted rejected"
counts() { python3 -c 'import json, sys; d = json.load(open(sys.argv[1]))["usage"].get("completion_tokens_details") or {}
print(d.get("accepted_prediction_tokens", "-"), d.get("rejected_prediction_tokens", "-"))' "$WORK/$1.json" 2>/dev/null; }

# serve_stop NAME: SIGTERM, and wait for it
serve_stop() { kill -TERM "${SRV_PID[$1]}"; wait "${SRV_PID[$1]}" || true; unset "SRV_PID[$1]"; }
# same_as_run TAG WHERE: requests TAG0..3 have the plain text and run's draft counts
same_as_run() {
    local tag=$1 where=$2 text=0 cnt=0 got="" want=""
    for i in 0 1 2 3; do
        py "$WORK/$tag$i.json" "d['choices'][0]['text'] == load('want$i.exp')" >/dev/null 2>&1 && text=$((text + 1))
        # counts is empty when the request's JSON is not there, and so is a want file whose run failed
        [ -n "$(counts "$tag$i")" ] && [ "$(counts "$tag$i")" = "$(cat "$WORK/want$i.cnt")" ] && cnt=$((cnt + 1))
        got="$got$(counts "$tag$i" | tr ' ' /) "; want="$want$(tr ' ' / <"$WORK/want$i.cnt") "
    done
    check "$where: greedy text = plain decoding ($text/4)" test $text = 4
    check "$where: each request's drafts kept/rejected = ringlm run's for its prompt ($cnt/4: $got; run: $want)" test $cnt = 4
}
# alone_and_together TAG WHERE: the 4 prompts to $URL one at a time, then all at once; both as ringlm run
alone_and_together() {
    local i pids=()
    for i in 0 1 2 3; do post "$1$i" "$(greedy "${prompts[$i]}")"; done
    same_as_run "$1" "$2, one request at a time"
    for i in 0 1 2 3; do post "$1par$i" "$(greedy "${prompts[$i]}")" & pids+=($!); done
    wait "${pids[@]}"
    same_as_run "$1par" "$2, 4 requests at once"
}

check "the reference drafts keep some tokens, so a wrong feature would show ($kept_total kept over 4 prompts)" \
    test "$kept_total" -gt 0

# ---- one machine ----------------------------------------------------------------------------------------
# (--draft-fallback off: every step drafts, as run does, so that the drafts can be compared with run's)
serve_start local -m "$f" --draft "dspark:$ds" --parallel 4 --threads 1 --draft-fallback off
URL=${SRV_URL[local]}
check "the server names its DSpark draft" grep -q "drafts: dspark:" "$WORK/local.log"
alone_and_together local "one machine"
post none "$(greedy "${prompts[0]}" ',"draft":"none"')"
check "a request may say \"draft\": \"none\": the same text, no drafts" py "$WORK/none.json" \
    "d['choices'][0]['text'] == load('want0.exp') and 'completion_tokens_details' not in d['usage']"
post ngram "$(greedy "${prompts[3]}" ',"draft":"ngram"')"
check "a request may say \"draft\": \"ngram\" on a DSpark server: the same text" py "$WORK/ngram.json" \
    "d['choices'][0]['text'] == load('want3.exp')"
post sse "$(greedy "${prompts[1]}" ',"stream":true,"stream_options":{"include_usage":true}')"
check "streamed with DSpark drafts: the same text, and the usage chunk counts the drafts" py "$WORK/sse.json" \
    "text(sse(raw)) == load('want1.exp') and [c for c in sse(raw) if c.get('usage')][-1]['usage']['completion_tokens_details']['accepted_prediction_tokens'] == $(cut -d' ' -f1 "$WORK/want1.cnt")"
post samp "{\"prompt\":\"${prompts[2]}\",\"max_tokens\":$N,\"temperature\":0.9,\"seed\":3,\"ignore_eos\":true}"
check "a sampled request with DSpark drafts (temperature 0.9): 200, every token, its drafts counted" py "$WORK/samp.json" \
    "d['usage']['completion_tokens'] == $N and sum(d['usage']['completion_tokens_details'].values()) > 0"
check "/metrics counts the DSpark drafts" bash -c "curl -s '$URL/metrics' | awk '\$1 == \"ringlm_spec_drafted_tokens_total\" && \$2 > 0 { ok = 1 } END { exit !ok }'"
serve_stop local

# ---- a 3-node ring: the stages that hold the tap layers send them back with each frame ---------------------
ring_keys 3
for i in 1 2 3; do ring_start $i "$RING/models" || exit 1; done
ring_conf "$WORK/ring.conf" 1 2 3
serve_start ring -m "$f" --ring "$WORK/ring.conf" --key "$RING/coord.key" --draft "dspark:$ds" --parallel 4 --threads 1 --draft-fallback off
URL=${SRV_URL[ring]}
alone_and_together ring "3-node ring"

# A stage killed under a streamed DSpark request (issue: no lost request): the ring is re-formed over the two
# nodes left, the sequence rebuilt, its drafts in flight dropped and drafting resumed from the new ring's taps;
# the text is still plain greedy decoding's.
"$RINGLM" run -m "$f" -p "${prompts[1]}" -n 160 --temp 0 --ignore-eos --threads 1 2>/dev/null |
    python3 -c 'import sys, json; json.dump(sys.stdin.buffer.read().decode("utf-8", "replace"), sys.stdout)' >"$WORK/long.exp"
metric() { curl "${CT[@]}" "$URL/metrics" | awk -v k="$1" '$1 == k { print $2 }'; }
curl "${CT[@]}" -N -o "$WORK/long.sse" -H 'Content-Type: application/json' --data-binary \
    "{\"prompt\":\"${prompts[1]}\",\"max_tokens\":160,\"temperature\":0,\"ignore_eos\":true,\"stream\":true,\"draft\":\"dspark\"}" \
    "$URL/v1/completions" &
cpid=$!
for _ in $(seq 500); do [ "$(grep -c '^data: {' "$WORK/long.sse" 2>/dev/null || true)" -ge 12 ] && break; sleep 0.02; done
d0=$(metric ringlm_spec_drafted_tokens_total)
kill -9 "${RING_PID[2]}"; wait "${RING_PID[2]}" 2>/dev/null || true; unset 'RING_PID[2]'
wait $cpid || true
d1=$(metric ringlm_spec_drafted_tokens_total)
check "a stage killed under a streamed DSpark request: it completes with plain greedy's text" \
    py "$WORK/long.sse" "raw.rstrip().endswith(b'data: [DONE]') and text(sse(raw)) == load('long.exp')"
check "... over a re-formed ring (1 recovery), drafting on after it ($d0 drafted tokens at the kill, $d1 at the end)" \
    bash -c "test \"\$(curl -s '$URL/metrics' | awk '\$1 == \"ringlm_ring_recoveries_total\" { print \$2 }')\" -ge 1 && test ${d1:-0} -gt ${d0:-0}"
serve_stop ring

# ---- refusals ---------------------------------------------------------------------------------------------
serve_start plain -m "$f" --parallel 1 --threads 1
URL=${SRV_URL[plain]}
post nods "$(greedy hi ',"draft":"dspark"')"
check "a server without DSpark answers \"draft\": \"dspark\" with 400 naming the option" bash -c \
    "test \"\$(cat '$WORK/nods.code')\" = 400 && grep -q 'dspark:' '$WORK/nods.json'"
serve_stop plain
check_fails "--draft dspark: with a file that is no DSpark draft: the server does not start, naming it" "DSpark draft" \
    timeout 60 "$RINGLM" serve -m "$f" --draft "dspark:$f" --port 0 --threads 1
check_fails "--draft dspark: with a missing file: the server does not start, naming it" "nope.gguf" \
    timeout 60 "$RINGLM" serve -m "$f" --draft "dspark:$WORK/nope.gguf" --port 0 --threads 1
finish
