#!/usr/bin/env bash
# Nodes behind home routers (issue #53): a node that cannot be dialled dials out to a relay (the coordinator's
# --relay-listen, or a public node's) and is reached through it; the ring's text is greedy's.
#   Loopback part (any user): a node that dialled out, and one started with nothing but a join token
#   (`ringlm join-token`, `ringlm node --join`), serve stages with greedy's text; what is refused, by name: a
#   ring.conf key nobody dialled in with, a node the coordinator's ring.conf does not list, an expired, an
#   altered and a foreign (another coordinator's) join token, a --dial to something that is no relay.
#   Namespace part (root): two "home routers" (network namespaces doing iptables MASQUERADE, no port forwarded,
#   both homes on 192.168.1.0/24), 3 nodes behind them (two in one home, one in the other) and 1 public node
#   here, the server here with its relay; the public node runs a relay too. Greedy text over the ring equals one
#   machine's; /health and /metrics say how each node is reached; then one router drops everything (iptables
#   DROP: no reset) mid-stream: the node behind it is called down and the request completes over the others.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ring_lib.sh"
. "$(dirname "$0")/serve_lib.sh"
P=rln$$
net_down() {
    for k in 1 2; do
        ip link del "${P}w$k" 2>/dev/null || true
        ip netns del "${P}r$k" 2>/dev/null || true
        ip netns del "${P}h$k" 2>/dev/null || true
    done
}
trap 'serve_stop_all; ring_stop; net_down; [ -n "${KEEP_WORK:-}" ] || rm -rf "$WORK"' EXIT
f=$(model small-f32 small f32)
mkdir -p "$RING/models"
ln -sf "$f" "$RING/models/small-f32.gguf"
ring_keys 5
N=160
prompt="the home router test"
"$RINGLM" run -m "$f" -p "$prompt" -n $N --temp 0 --ignore-eos --threads 1 2>/dev/null |
    python3 -c 'import sys, json; json.dump(sys.stdin.buffer.read().decode("utf-8", "replace"), sys.stdout)' >"$WORK/want.exp"
"$RINGLM" run -m "$f" -p "$prompt" -n 8 --temp 0 --ignore-eos --threads 1 2>/dev/null >"$WORK/want8.txt"

# node_up I NETNS ARGS...: node I (inside NETNS, "" for here) with ARGS (--listen or --dial, ...); waits for "ready:"
node_up() {
    local i=$1 ns=$2 pre=(); shift 2
    [ -n "$ns" ] && pre=(ip netns exec "$ns")
    "${pre[@]}" "$RINGLM" node "$@" --key "$RING/n$i.key" --allow "$(cat "$RING/coord.pub")" \
        --models "$RING/models" --threads 1 --speed 10 --cache "$RING/node-cache$i" >"$RING/n$i.log" 2>&1 &
    RING_PID[$i]=$!
    for _ in $(seq 100); do
        grep -qs "ready:" "$RING/n$i.log" && return 0
        kill -0 "${RING_PID[$i]}" 2>/dev/null || break
        sleep 0.1
    done
    echo "node $i did not start:"; cat "$RING/n$i.log"; exit 1
}
# wait_log FILE PATTERN: up to 10 s for PATTERN in FILE
wait_log() { for _ in $(seq 100); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done; return 1; }

# ---- loopback: what is refused, by name -------------------------------------------------------------------
rp=$(ring_free_port)
pp=$(ring_free_port)
node_up 1 "" --dial "127.0.0.1:$rp"
node_up 2 "" --listen "127.0.0.1:$pp"
node_up 3 "" --dial "127.0.0.1:$rp"
{
    echo "relay:127.0.0.1:$rp $(cat "$RING/n1.pub")"
    echo "127.0.0.1:$pp $(cat "$RING/n2.pub")"
} >"$WORK/lo.conf"
cp "$WORK/lo.conf" "$WORK/lo-missing.conf"
echo "relay:127.0.0.1:$rp $(cat "$RING/n4.pub")" >>"$WORK/lo-missing.conf" # n4 never starts
rc=0
timeout 120 "$RINGLM" run -m "$f" -p "$prompt" -n 8 --temp 0 --ignore-eos --threads 1 --ring "$WORK/lo.conf" \
    --key "$RING/coord.key" --relay-listen "127.0.0.1:$rp" >"$WORK/lo.txt" 2>"$WORK/lo.err" || rc=$?
check "a node that dialled out to the coordinator's relay serves its stage: greedy's text" \
    bash -c "test $rc = 0 && cmp -s '$WORK/want8.txt' '$WORK/lo.txt' || { tail -5 '$WORK/lo.err'; exit 1; }"
rc=0
# (listening on every address: its own nodes are reached through its loopback, ring_dial_addr)
timeout 60 "$RINGLM" plan -m "$f" --ring "$WORK/lo.conf" --key "$RING/coord.key" --relay-listen "0.0.0.0:$rp" \
    >"$WORK/plan.out" 2>&1 || rc=$?
check "ringlm plan reaches it through its relay too, and says how" bash -c \
    "test $rc = 0 && grep -q 'reach: stage [01] (relay:127.0.0.1:$rp/$(head -c 8 "$RING/n1.pub")) dialled out to this coordinator.s relay' '$WORK/plan.out' || { tail -5 '$WORK/plan.out'; exit 1; }"
check "... and the plan says how it is reached" grep -q "reach: stage [01] (relay:127.0.0.1:$rp/$(head -c 8 "$RING/n1.pub")) dialled out to this coordinator's relay" "$WORK/lo.err"
# ---- join tokens: one line for the node ----
"$RINGLM" keygen -o "$WORK/other.key" >/dev/null
cp "$WORK/lo.conf" "$WORK/join.conf"
tok=$("$RINGLM" join-token --key "$RING/coord.key" --relay "127.0.0.1:$rp" --append "$WORK/join.conf" 2>"$WORK/jt.err")
check "join-token prints a token and appends the node's line to ring.conf" bash -c \
    "[[ '$tok' == rlj1-* ]] && test \$(wc -l <'$WORK/join.conf') = 3 && grep -q '^relay:127.0.0.1:$rp [0-9a-f]\{64\}\$' '$WORK/join.conf'"
# node_join I TOKEN: node I started with nothing but the token (and where its models are)
node_join() {
    "$RINGLM" node --join "$2" --models "$RING/models" --threads 1 --speed 10 --cache "$RING/node-cache$1" >"$RING/n$1.log" 2>&1 &
    RING_PID[$1]=$!
}
node_join 6 "$tok"
wait_log "$RING/n6.log" "ready:" || { cat "$RING/n6.log"; exit 1; }
rc=0
timeout 120 "$RINGLM" run -m "$f" -p "$prompt" -n 8 --temp 0 --ignore-eos --threads 1 --ring "$WORK/join.conf" \
    --key "$RING/coord.key" --relay-listen "127.0.0.1:$rp" >"$WORK/join.txt" 2>"$WORK/join.err" || rc=$?
check "a node started with only --join TOKEN serves a stage: greedy's text" \
    bash -c "test $rc = 0 && cmp -s '$WORK/want8.txt' '$WORK/join.txt' && test \$(grep -c '^reach: stage' '$WORK/join.err') = 2 || { tail -5 '$WORK/join.err'; exit 1; }"
short=$("$RINGLM" join-token --key "$RING/coord.key" --relay "127.0.0.1:$rp" --ttl 0.0001 2>/dev/null)
sleep 1
rc=0; "$RINGLM" node --join "$short" --models "$RING/models" 2>"$WORK/expired.err" || rc=$?
check "an expired join token is refused by name" bash -c "test $rc = 1 && grep -q 'the join token expired at' '$WORK/expired.err'"
bad=${tok:0:40}$([ "${tok:40:1}" = A ] && echo B || echo A)${tok:41}
rc=0; "$RINGLM" node --join "$bad" --models "$RING/models" 2>"$WORK/altered.err" || rc=$?
check "an altered join token is refused by name" bash -c "test $rc = 1 && grep -q 'join token' '$WORK/altered.err' && cat '$WORK/altered.err'"
foreign=$("$RINGLM" join-token --key "$WORK/other.key" --relay "127.0.0.1:$rp" 2>/dev/null)
node_join 7 "$foreign" # dials our relay with another coordinator's token: refused during the run below
rc=0
timeout 120 "$RINGLM" run -m "$f" -p "$prompt" -n 8 --temp 0 --ignore-eos --threads 1 --ring "$WORK/lo-missing.conf" \
    --key "$RING/coord.key" --relay-listen "127.0.0.1:$rp" >/dev/null 2>"$WORK/lo-missing.err" || rc=$?
check "a relayed node that never dialled in: the run fails naming it and what the relay said" bash -c \
    "test $rc != 0 && grep -q 'node relay:127.0.0.1:$rp/$(head -c 8 "$RING/n4.pub") did not answer within .*no node with that key has dialled this relay' '$WORK/lo-missing.err' || { cat '$WORK/lo-missing.err'; exit 1; }"

check "a node ring.conf does not list is refused by the coordinator's relay, and says so" \
    wait_log "$RING/n3.log" "relay 127.0.0.1:$rp: the relay refused: this coordinator's ring.conf does not list that key"
check "a foreign join token is refused by the coordinator's relay, by name" \
    wait_log "$RING/n7.log" "the relay refused: its join token was issued by another coordinator"
node_up 5 "" --dial "127.0.0.1:$pp" # node 2's ZeroMQ port: no relay
check "a --dial to something that is no relay is named so" wait_log "$RING/n5.log" "dial-out to relay 127.0.0.1:$pp: .*not a ringlm relay"
rc=0
"$RINGLM" run -m "$f" -p x -n 1 --relay-listen "127.0.0.1:0" >/dev/null 2>"$WORK/norelay.err" || rc=$?
check "--relay-listen without a ring is refused" bash -c "test $rc = 2 && grep -q 'relay-listen is for a ring' '$WORK/norelay.err'"
ring_stop

if [ "$(id -u)" != 0 ] || ! command -v iptables >/dev/null || ! ip netns add "${P}r1" 2>/dev/null; then
    echo "ok - skipped: the home routers need root, iptables and network namespaces"
    finish
fi

# ---- two home routers ------------------------------------------------------------------------------------
# Here (the internet): 10.A.B.1 faces router 1, 10.A.B+1.1 router 2; each router MASQUERADEs its home's
# 192.168.1.0/24 behind its WAN address and forwards nothing that comes in unasked.
A=$((100 + $$ % 100)); B=$(($$ / 100 % 120 * 2))
s1="10.$A.$B"; s2="10.$A.$((B + 1))"
home() { # home K SUBNET
    local k=$1 s=$2 r=${P}r$1 h=${P}h$1
    { [ "$k" = 1 ] || ip netns add "$r"; } && ip netns add "$h" &&
        ip link add "${P}w$k" type veth peer name "${P}W$k" && ip link set "${P}W$k" netns "$r" &&
        ip addr add "$s.1/24" dev "${P}w$k" && ip link set "${P}w$k" up &&
        ip -n "$r" addr add "$s.2/24" dev "${P}W$k" && ip -n "$r" link set "${P}W$k" up && ip -n "$r" link set lo up &&
        ip -n "$r" route add default via "$s.1" &&
        ip -n "$r" link add "${P}l$k" type veth peer name "${P}L$k" netns "$h" &&
        ip -n "$r" addr add 192.168.1.1/24 dev "${P}l$k" && ip -n "$r" link set "${P}l$k" up &&
        ip -n "$h" addr add 192.168.1.2/24 dev "${P}L$k" && ip -n "$h" link set "${P}L$k" up && ip -n "$h" link set lo up &&
        ip -n "$h" route add default via 192.168.1.1 &&
        ip netns exec "$r" sysctl -qw net.ipv4.ip_forward=1 &&
        ip netns exec "$r" iptables -t nat -A POSTROUTING -o "${P}W$k" -j MASQUERADE &&
        ip netns exec "$r" iptables -A FORWARD -i "${P}W$k" -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT &&
        ip netns exec "$r" iptables -A FORWARD -i "${P}W$k" -j DROP
}
home 1 "$s1" && home 2 "$s2" || { echo "not ok - could not build the home routers"; exit 1; }

rp=$(ring_free_port)
dp=$(ring_free_port)
drp=$(ring_free_port)
# node 4: public, here, also a relay; nodes 1 and 2 in home 1 dial the server's relay; node 3 in home 2 dials node 4's
node_up 4 "" --listen "$s1.1:$dp" --relay-listen "$s1.1:$drp"
node_up 1 "${P}h1" --dial "$s1.1:$rp"
node_up 2 "${P}h1" --dial "$s1.1:$rp"
node_up 3 "${P}h2" --dial "$s1.1:$drp"
check "the homes cannot be dialled: nothing answers at home 1's address from here" \
    bash -c "! timeout 3 bash -c 'exec 3<>/dev/tcp/192.168.1.2/$dp' 2>/dev/null"
{
    echo "relay:$s1.1:$rp $(cat "$RING/n1.pub")"
    echo "relay:$s1.1:$rp $(cat "$RING/n2.pub")"
    echo "relay:$s1.1:$drp $(cat "$RING/n3.pub")"
    echo "$s1.1:$dp $(cat "$RING/n4.pub")"
} >"$WORK/nat.conf"

# run, with the order measured through the relays
rc=0
timeout 120 "$RINGLM" run -m "$f" -p "$prompt" -n 8 --temp 0 --ignore-eos --threads 1 --ring "$WORK/nat.conf" \
    --key "$RING/coord.key" --relay-listen "$s1.1:$rp" >"$WORK/nat8.txt" 2>"$WORK/nat8.err" || rc=$?
check "run over 3 nodes behind 2 NATs + 1 public: greedy's text" \
    bash -c "test $rc = 0 && cmp -s '$WORK/want8.txt' '$WORK/nat8.txt' || { tail -5 '$WORK/nat8.err'; exit 1; }"
check "... the nodes came through their routers (the relay saw the routers' addresses)" \
    bash -c "grep -q 'dialled in from $s1.2:' '$WORK/nat8.err'"
check "... and the plan says how each relayed stage is reached" \
    bash -c "test \$(grep -c '^reach: stage' '$WORK/nat8.err') = 3 && grep -q 'dialled out to relay $s1.1:$drp, run by $s1.1:$dp' '$WORK/nat8.err'"

serve_start srv -m "$f" --ring "$WORK/nat.conf" --key "$RING/coord.key" --relay-listen "$s1.1:$rp" --keep-order \
    --parallel 1 --threads 1
URL=${SRV_URL[srv]}
check "/health: 4 stages up, reached dial-out, dial-out, relayed, direct" py <(curl -s --max-time 10 "$URL/health") \
    "[(n['status'], n['reach']) for n in d['nodes']] == [('up', 'dial-out'), ('up', 'dial-out'), ('up', 'relayed'), ('up', 'direct')] and d['nodes'][2]['relay'] == '$s1.1:$drp'"
check "/metrics: ringlm_node_reach per node" bash -c \
    "curl -s --max-time 10 '$URL/metrics' | grep -c '^ringlm_node_reach{.*reach=\"\\(dial-out\\|relayed\\|direct\\)\"' | grep -qx 4"

# A streamed greedy request; once it has streamed some tokens, home 2's router drops everything.
curl -s -N --max-time 300 -H 'Content-Type: application/json' \
    --data-binary "{\"prompt\":\"$prompt\",\"max_tokens\":$N,\"temperature\":0,\"ignore_eos\":true,\"stream\":true}" \
    "$URL/v1/completions" >"$WORK/s.sse" &
cpid=$!
for _ in $(seq 300); do [ "$(grep -c '^data: {' "$WORK/s.sse" 2>/dev/null)" -ge 8 ] && break; sleep 0.05; done
before=$(grep -c '^data: {' "$WORK/s.sse")
n3="relay:$s1.1:$drp/$(head -c 8 "$RING/n3.pub")"
t0=$(date +%s.%N)
ip netns exec "${P}r2" iptables -I FORWARD 1 -j DROP
t1=""
for _ in $(seq 600); do
    if grep -q "lost node $n3\|$n3.*\(gone\|down\|lost\|closed\)" "$WORK/srv.log"; then t1=$(date +%s.%N); break; fi
    sleep 0.02
done
wait $cpid || true
[ -n "$t1" ] && echo "    the link was called down $(python3 -c "print(f'{$t1 - $t0:.2f}')") s after the router dropped"
check "the drop came mid-stream ($before chunks before it)" test "$before" -ge 8 -a "$before" -lt $N
check "the server called the node behind the dropping router down, naming it" test -n "$t1"
check "the streamed request completed over the nodes left, with greedy's text" sse_completed "$WORK/s.sse" "$WORK/want.exp"
# (its relay heard from it within TN_ALIVE_S before the drop: the server's probes see it down once that passed)
health_down() {
    for _ in $(seq 40); do
        curl -s --max-time 10 "$URL/health" >"$WORK/h.json"
        py "$WORK/h.json" "[n['status'] for n in d['nodes'] if n['name'] == 'n3'] == ['down']" >/dev/null 2>&1 && break
        sleep 0.5
    done
    py "$WORK/h.json" "d['ring']['recoveries'] >= 1 and [n['status'] for n in d['nodes'] if n['name'] == 'n3'] == ['down']"
}
check "/health: the ring re-formed without it, and its relay says it is gone" health_down
finish
