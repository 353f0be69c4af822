#!/usr/bin/env bash
# `ringlm receipts verify`: honest logs of 1-, 2- and 3-stage rings verify; every kind of tampering
# (tests/tools/make_receipts.c) is reported with a message naming the traversal, stage and field, exit 1;
# the wrong model, an empty log and bad arguments are refused.
. "$(dirname "$0")/lib.sh"
f=$(model full-q8_0 k3-full q8_0)
other=$(model full-f32 k3-full f32) # the same architecture and layers, other weights' bytes
MK=$TOOLS/make_receipts
D=$WORK/r
mkdir -p "$D"

# verify_ok LOG N_TRAVERSALS N_RECEIPTS [args]: exit 0 and the ok line.
verify_ok() {
    local log=$1 nt=$2 nr=$3; shift 3
    "$RINGLM" receipts verify "$log" --model "$f" --ring "$D/ring.conf" "$@" >"$WORK/vout" &&
        grep -qx "ok: $nt traversals, $nr receipts verified" "$WORK/vout"
}

# bad KIND DESC STRING...: the log with that defect fails with exit 1 and every STRING (fixed) on stderr.
bad() {
    local kind=$1 desc=$2; shift 2
    "$MK" --model "$f" --dir "$D" --stages 3 --traversals 3 --tamper "$kind" >"$D/$kind.jsonl"
    local rc=0 ok=1
    "$RINGLM" receipts verify "$D/$kind.jsonl" --model "$f" --ring "$D/ring.conf" --key "$D/coord.pub" \
        >"$WORK/out" 2>"$WORK/err" || rc=$?
    [ $rc = 1 ] || ok=0
    for s in "$@"; do grep -Fq -- "$s" "$WORK/err" || ok=0; done
    grep -q '^ok:' "$WORK/out" && ok=0
    if [ $ok = 1 ]; then
        T_PASS=$((T_PASS + 1)); echo "ok - $desc:"; grep -v '^ringlm receipts:' "$WORK/err" | sed 's/^/    /'
    else
        T_FAIL=$((T_FAIL + 1)); echo "not ok - $desc (exit $rc, want 1 and: $*)"; sed 's/^/    /' "$WORK/err" | tail -20
    fi
}

for n in 1 2 3; do
    "$MK" --model "$f" --dir "$D" --stages $n --traversals 4 >"$D/good$n.jsonl"
    check "an honest log of a $n-stage ring verifies (4 traversals, $((4 * n)) receipts)" verify_ok "$D/good$n.jsonl" 4 $((4 * n))
done
check "--key as a public key file" verify_ok "$D/good3.jsonl" 4 12 --key "$D/coord.pub"
check "--key as a public key in hex" verify_ok "$D/good3.jsonl" 4 12 --key "$(cat "$D/coord.pub")"
"$RINGLM" keygen -o "$D/coord.key" >/dev/null
check "--key as a key file" verify_ok "$D/good3.jsonl" 4 12 --key "$D/coord.key"
shuf --random-source=<(yes) "$D/good3.jsonl" >"$D/shuffled.jsonl"
check "receipts in any line order verify (grouped by request and nonce, ordered by layers)" \
    verify_ok "$D/shuffled.jsonl" 4 12
{ echo; cat "$D/good3.jsonl"; echo; } | sed 's/$/\r/' >"$D/crlf.jsonl"
check "blank lines and CRLF line ends are fine" verify_ok "$D/crlf.jsonl" 4 12

bad gap "skipped layers" "traversal 2 (request 1002" "coverage: layers [2, 3) are skipped between stage 0 and stage 1"
bad overlap "overlapping stages" "coverage: layers [1, 2) run twice: stage 1 (layers [1, 4)) overlaps stage 0 (layers [0, 2))"
bad order "stages against ring.conf order" \
    "order: stage 1 (layers [2, 4), line 5) is node 127.0.0.1:7701 (ring.conf entry 1), which comes before node 127.0.0.1:7702 (entry 2)"
bad chain "a broken chain" "chain: broken between stage 1 and stage 2: stage 1's output hash"
bad nonce "a reused nonce" "traversal 2 (request 1002" "was already used by an earlier traversal"
bad request "a receipt of another request replayed into a traversal" \
    "traversal 1 (request 1001" "line 5 repeats line 2 (a replayed receipt)" \
    "traversal 2 (request 1002" "coverage: layers [2, 4) are skipped between stage 0 and stage 1"
bad foreign "a receipt signed by a key not in ring.conf" "stage 1 (layers [2, 4), line 5): signer " "is not a node in ring.conf"
bad coord "a receipt signed by the coordinator" "it is the coordinator's own key, and the coordinator runs no layers"
bad badsig "a receipt altered after signing" "stage 1 (layers [2, 4), node " "signature: the signature does not verify"
bad manifest "a wrong manifest hash" "stage 0 (layers [0, 2), node " "manifest: hash " "but the model's layers [0, 2) hash to"
bad ringid "a receipt of another ring" "ring id 81985529216486896, but this traversal ran on ring 81985529216486895"
bad twice "one node signing two stages" "also signed stage 0 (layers [0, 2)): one node, two stages"
bad positions "other positions in one stage" "positions: sequence entry 1 is (seq 2, pos 7, 1 tokens), but stage 0 has (seq 2, pos 6, 1 tokens)"
bad garbage "a line that is not a receipt" "line 5: the receipt has an unknown key \"not\"" "some lines are not receipts"
bad missing "a missing last stage" "coverage: layers [4, 6) are skipped: the last stage ends at layer 4 of the model's 6" \
    "ringlm receipts: 1 problem: 1 of 3 traversals fail"

check_fails "the log checked against another model" "stage 0 \(layers \[0, 2\).*manifest: hash" \
    "$RINGLM" receipts verify "$D/good3.jsonl" --model "$other" --ring "$D/ring.conf"
: >"$D/empty.jsonl"
check_fails "an empty log" "no receipts" "$RINGLM" receipts verify "$D/empty.jsonl" --model "$f" --ring "$D/ring.conf"
check_fails "a bad --key" "neither a file nor a public key" \
    "$RINGLM" receipts verify "$D/good3.jsonl" --model "$f" --ring "$D/ring.conf" --key nothex
check_fails "a missing log" "cannot open" "$RINGLM" receipts verify "$D/none.jsonl" --model "$f" --ring "$D/ring.conf"
# With the model's manifest instead of the model (ringlm manifest): the same verdicts, no weights read.
"$RINGLM" manifest "$f" -o "$D/f.manifest" >/dev/null
"$RINGLM" manifest "$other" -o "$D/other.manifest" >/dev/null
check "the honest 3-stage log verifies against the model's manifest" sh -c \
    '"$1" receipts verify "$2" --manifest "$3" --ring "$4" | grep -qx "ok: 4 traversals, 12 receipts verified"' \
    _ "$RINGLM" "$D/good3.jsonl" "$D/f.manifest" "$D/ring.conf"
check_fails "... and fails against another model's manifest, naming the stage" "stage 0 \(layers \[0, 2\).*manifest: hash" \
    "$RINGLM" receipts verify "$D/good3.jsonl" --manifest "$D/other.manifest" --ring "$D/ring.conf"
check_fails "a tampered manifest hash is caught against the manifest too" "manifest: hash " \
    "$RINGLM" receipts verify "$D/manifest.jsonl" --manifest "$D/f.manifest" --ring "$D/ring.conf"
check_fails "a missing manifest" "cannot open manifest .*none.manifest" \
    "$RINGLM" receipts verify "$D/good3.jsonl" --manifest "$D/none.manifest" --ring "$D/ring.conf"
rc=0; "$RINGLM" receipts verify "$D/good3.jsonl" --ring "$D/ring.conf" 2>/dev/null || rc=$?
check "no --model is a usage error (exit 2)" test $rc = 2
rc=0; "$RINGLM" receipts verify "$D/good3.jsonl" --model "$f" --manifest "$D/f.manifest" --ring "$D/ring.conf" 2>/dev/null || rc=$?
check "both --model and --manifest is a usage error (exit 2)" test $rc = 2
rc=0; "$RINGLM" receipts 2>/dev/null || rc=$?
check "no subcommand is a usage error (exit 2)" test $rc = 2
finish
