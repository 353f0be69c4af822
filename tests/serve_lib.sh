# tests/serve_lib.sh - `ringlm serve` in end-to-end tests. Source it after lib.sh.
#
#   serve_start NAME SERVE-ARGS...   starts `ringlm serve SERVE-ARGS --port 0` (it prints the port it got),
#                                    logging to $WORK/NAME.log; waits for /health; sets SRV_PID[NAME] and
#                                    SRV_URL[NAME]; exits the test with the log if it does not come up
#   serve_stop_all                   kill -9 every server started (for the EXIT trap)
#   sse_completed SSE WANT           a streamed completion gave WANT's text (a JSON string) and finished for length
#   py FILE EXPR                     tests/serve_check.py: EXPR over d (FILE's JSON) and raw (its bytes);
#                                    also at $WORK/check.py, for `bash -c` strings
declare -A SRV_PID SRV_URL
cp "$(dirname "${BASH_SOURCE[0]}")/serve_check.py" "$WORK/check.py"

serve_stop_all() { for k in "${!SRV_PID[@]}"; do kill -9 "${SRV_PID[$k]}" 2>/dev/null || true; done; }

serve_start() {
    local name=$1; shift
    "$RINGLM" serve "$@" --port 0 2>"$WORK/$name.log" &
    SRV_PID[$name]=$!
    for _ in $(seq 600); do
        local url; url=$(grep -so 'http://127\.0\.0\.1:[0-9]*' "$WORK/$name.log" | head -1 || true)
        if [ -n "$url" ] && curl -s --max-time 2 -o /dev/null "$url/health"; then SRV_URL[$name]=$url; return 0; fi
        kill -0 "${SRV_PID[$name]}" 2>/dev/null || break
        sleep 0.1
    done
    echo "server $name did not start:"; cat "$WORK/$name.log"; exit 1
}

py() { python3 "$WORK/check.py" "$@"; }

# sse_completed SSE WANT: a streamed completion (SSE) whose text is WANT's (a JSON string) and that finished
# for its length (the requests tests cut a node under, t_partition and t_nat)
sse_completed() {
    python3 -c '
import json, sys
text, fin = "", None
for line in open(sys.argv[1], encoding="utf-8"):
    if line.startswith("data: {"):
        d = json.loads(line[6:])
        for c in d.get("choices", []):
            text += c.get("text", "")
            fin = c.get("finish_reason") or fin
want = json.load(open(sys.argv[2]))
sys.exit(0 if text == want and fin == "length" else 1)' "$1" "$2"
}
