#!/usr/bin/env bash
# Speculation that does not pay falls back to plain decoding, per request (scheduler.h SCH_SPEC_*): a server
# whose draft model never agrees with the target (another seed of the same shapes and vocabulary) pauses the
# drafts of a long greedy request, probes again, and still writes exactly the text of a server without
# drafts; a draft that always agrees (the target itself) is never paused; --draft-fallback off never pauses.
# /metrics counts the fallbacks and the steps decoded without drafts.
. "$(dirname "$0")/lib.sh"
f=$(model full-f32 k3-full f32)
g=$(model full-f32 k3-full f32 2) # the same shapes and vocabulary, other weights: its drafts are rejected
. "$(dirname "$0")/serve_lib.sh"
trap 'serve_stop_all; [ -n "${KEEP_WORK:-}" ] || rm -rf "$WORK"' EXIT
metric() { curl -s --max-time 10 "$1/metrics" | awk -v k="$2" '$1 == k { print $2 }'; }
body='{"prompt":"Once upon a time there was","max_tokens":160,"temperature":0,"ignore_eos":true}'
post() { curl -s --max-time 120 -H 'Content-Type: application/json' --data-binary "$body" "$1/v1/completions" >"$2"; }

serve_start plain -m "$f" --threads 1 --parallel 1 --ctx 512
serve_start bad -m "$f" --threads 1 --parallel 1 --ctx 512 --draft "$g"
serve_start self -m "$f" --threads 1 --parallel 1 --ctx 512 --draft "$f"
post "${SRV_URL[plain]}" "$WORK/plain.json"
post "${SRV_URL[bad]}" "$WORK/bad.json"
post "${SRV_URL[self]}" "$WORK/self.json"
text() { python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['choices'][0]['text'])" "$1"; }
check_eq "a draft that never agrees: the same greedy text as no drafts" "$(text "$WORK/bad.json")" "$(text "$WORK/plain.json")"
check_eq "a draft that always agrees: the same greedy text" "$(text "$WORK/self.json")" "$(text "$WORK/plain.json")"
fb=$(metric "${SRV_URL[bad]}" ringlm_spec_fallbacks_total); ps=$(metric "${SRV_URL[bad]}" ringlm_spec_paused_steps_total)
dr=$(metric "${SRV_URL[bad]}" ringlm_spec_drafted_tokens_total); ac=$(metric "${SRV_URL[bad]}" ringlm_spec_accepted_tokens_total)
echo "info: the disagreeing draft: $dr drafted, $ac kept, $fb fallbacks, $ps steps without drafts"
check "... its drafts were paused (fallbacks $fb) and probed again (more than one window drafted: $dr)" \
    bash -c "test '${fb:-0}' -ge 2 && test '${dr:-0}' -gt 16"
check "... most of its 160 steps ran without drafts ($ps)" test "${ps:-0}" -ge 80
check_eq "the agreeing draft was never paused" "$(metric "${SRV_URL[self]}" ringlm_spec_fallbacks_total)" 0
check "... and drafted throughout (kept $(metric "${SRV_URL[self]}" ringlm_spec_accepted_tokens_total))" \
    test "$(metric "${SRV_URL[self]}" ringlm_spec_accepted_tokens_total)" -ge 100
serve_start off -m "$f" --threads 1 --parallel 1 --ctx 512 --draft "$g" --draft-fallback off
post "${SRV_URL[off]}" "$WORK/off.json"
check_eq "--draft-fallback off: the same text" "$(text "$WORK/off.json")" "$(text "$WORK/plain.json")"
check_eq "--draft-fallback off: never paused" "$(metric "${SRV_URL[off]}" ringlm_spec_fallbacks_total)" 0
check "--draft-fallback off: every step drafted (more than 100 drafted)" test "$(metric "${SRV_URL[off]}" ringlm_spec_drafted_tokens_total)" -gt 100
rc=0; "$RINGLM" serve -m "$f" --draft-fallback maybe >/dev/null 2>"$WORK/opt.err" || rc=$?
check "--draft-fallback maybe: exit 2, saying it wants on or off" bash -c "test $rc = 2 && grep -q \"bad value 'maybe' for --draft-fallback: want on or off\" '$WORK/opt.err'"
finish
