#!/usr/bin/env bash
# Speculative decoding through the ring: for 20 prompts, each drafter (n-gram; a draft model that agrees
# often: the target's own q8_0 copy; a DSpark draft, fed the target's taps by the stages that hold them)
# and rings of 1 and 3 nodes, greedy output equals plain greedy decoding on one machine. Also: metrics keys,
# DSpark taps through the ring equal the taps on one machine, drafts that never agree fall back to plain steps
# (greedy's tokens still), and bad drafts are refused with a message. Runs that check what verified blocks do
# draft every step (--draft-fallback off): adaptive drafting may pause a draft that costs more than it
# commits on these loopback rings (the cost model, spec_gen.c), which would leave less to check.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ring_lib.sh"

mkdir -p "$RING/models"
target=$(model full-f32 k3-full f32)
self8=$(model full-q8_0 k3-full q8_0)
"$RINGLM" synth --no-progress --config "$ROOT/tests/configs/k3-full.json" --draft dspark -o "$WORK/dspark.gguf" --seed 5
ln -sf "$target" "$RING/models/target.gguf"
ring_keys 3
for i in 1 2 3; do ring_start $i "$RING/models" || exit 1; done
ring_conf "$WORK/ring1.conf" 1
ring_conf "$WORK/ring3.conf" 1 2 3
K=(--key "$RING/coord.key")

prompt() { # 24 ids whose second half repeats part of the first, so prompt lookup has matches
    awk -v s="$1" 'BEGIN { x = s * 7919 + 17; for (i = 0; i < 12; i++) { x = (x * 1103515245 + 12345) % 2147483648;
        t[i] = int(x / 65536) % 700 } for (i = 12; i < 24; i++) t[i] = t[i - 12 + s % 3];
        for (i = 0; i < 24; i++) printf "%s%d", (i ? "," : ""), t[i] }'
}

# plain PR: the plain greedy tokens of prompt PR into $WORK/plain, computed once per prompt (every loop
# below compares against the same 20).
plain() {
    [ -f "$WORK/plain-$1" ] ||
        "$RINGLM" run -m "$target" --tokens "$(prompt "$1")" -n 20 --temp 0 --ignore-eos --ids >"$WORK/plain-$1" 2>/dev/null
    cp "$WORK/plain-$1" "$WORK/plain"
}

for d in ngram "$self8" "dspark:$WORK/dspark.gguf"; do
    case $d in ngram) name=n-gram ;; dspark:*) name=DSpark ;; *) name="q8_0 self-draft" ;; esac
    for n in 1 3; do
        same=0
        for pr in $(seq 20); do
            p=$(prompt "$pr")
            plain "$pr"
            "$RINGLM" run -m "$target" --tokens "$p" -n 20 --temp 0 --ignore-eos --ids --draft "$d" --draft-fallback off \
                --ring "$WORK/ring$n.conf" "${K[@]}" --metrics-json "$WORK/m.json" >"$WORK/spec" 2>"$WORK/err" || cat "$WORK/err"
            same_files "$WORK/plain" "$WORK/spec" && same=$((same + 1))
        done
        check "$name through a $n-node ring: 20/20 prompts give the plain greedy tokens ($same/20)" test $same = 20
    done
done
# Pipelined speculation: 2 (every drafter) and 3 (n-gram) blocks in flight through the 3-node ring, each
# drafted assuming the ones before it are accepted (--draft-fixed: always, not only once acceptance is
# high); stale ones are cancelled and every stage rolls back
# past them. The output is still plain greedy decoding.
# "2 dspark ... 5": blocks of 5 drafts and a guess leave a DSpark block (7: anchor + 6) no room behind them,
# so the block behind is a one-token one, which keeps no rollback copies: it must never be sent behind another.
for dd in "2 ngram" "2 $self8" "2 dspark:$WORK/dspark.gguf" "2 dspark:$WORK/dspark.gguf 5" "3 ngram" "8 ngram" "8 $self8"; do
    read -r depth d dn <<<"$dd"
    dn_args=(); [ -n "$dn" ] && dn_args=(--draft-n "$dn")
    case $d in ngram) name=n-gram ;; dspark:*) name=DSpark ;; *) name="q8_0 self-draft" ;; esac
    same=0 cancelled=0 reformed=0
    for pr in $(seq 20); do
        p=$(prompt "$pr")
        plain "$pr"
        "$RINGLM" run -m "$target" --tokens "$p" -n 20 --temp 0 --ignore-eos --ids --draft "$d" --draft-depth "$depth" --draft-fixed \
            "${dn_args[@]}" --ring "$WORK/ring3.conf" "${K[@]}" --metrics-json "$WORK/m.json" >"$WORK/spec" 2>"$WORK/err" || cat "$WORK/err"
        same_files "$WORK/plain" "$WORK/spec" && same=$((same + 1))
        grep -q "re-forming" "$WORK/err" && { reformed=$((reformed + 1)); grep -m1 "re-forming" "$WORK/err"; }
        c=$(grep -o '"cancelled":[^,}]*' "$WORK/m.json" | tr -dc 0-9)
        cancelled=$((cancelled + ${c:-0}))
    done
    [ -n "$dn" ] && name="$name (blocks of $dn drafts)"
    check "$name, $depth blocks in flight through a 3-node ring: 20/20 prompts give the plain greedy tokens ($same/20, $cancelled stale blocks cancelled)" \
        test $same = 20
    # (a ring that failed under a block - a stage that could not roll back past a stale one - is re-formed and
    # the output is still greedy's: only the run's log shows it)
    check "... no ring was re-formed: every stage could roll back what was stale ($reformed/20 runs re-formed it)" test $reformed = 0
    # Each stage kept only the blocks in flight for rollback (ASSIGN's rollback_blocks), and that was enough.
    kept=0
    for i in 1 2 3; do
        grep "stage . of 3" "$RING/n$i.log" | tail -1 | grep -q "; $depth speculative blocks\{0,1\} in flight kept for rollback" &&
            kept=$((kept + 1))
    done
    check "... every stage kept $depth block(s) for rollback, as many as were in flight ($kept/3)" test $kept = 3
    [ "$d" = ngram ] && [ "$depth" = 2 ] && check "... and stale blocks were exercised ($cancelled)" test "$cancelled" -gt 0
done
# Receipts on verify traversals: drafted blocks and rollbacks still chain, and the file verifies offline.
p=$(prompt 3)
plain 3
"$RINGLM" run -m "$target" --tokens "$p" -n 20 --temp 0 --ignore-eos --ids --draft "$self8" --draft-fallback off \
    --ring "$WORK/ring3.conf" "${K[@]}" --receipts "$WORK/rc.jsonl" --metrics-json "$WORK/m.json" >"$WORK/spec" 2>"$WORK/err" ||
    cat "$WORK/err"
check_same "speculation with receipts through a 3-node ring: the plain greedy tokens" "$WORK/plain" "$WORK/spec"
check "... every traversal's receipts checked live" grep -q "receipts: [1-9][0-9]* checked" "$WORK/err"
check "... and the file verifies offline" bash -c "'$RINGLM' receipts verify '$WORK/rc.jsonl' --model '$target' \
    --ring '$WORK/ring3.conf' 2>&1 | grep -q '^ok: [1-9][0-9]* traversals'"
# Pipelined blocks under receipts and audits of every stage: stale blocks are signed and replayed like the
# others (the auditor's last stage cancels them the same way), so an honest ring passes.
ok=0
for seed in 1 2 3; do
    "$RINGLM" run -m "$target" --tokens "$p" -n 20 --temp 0 --ignore-eos --ids --draft ngram --draft-depth 2 \
        --ring "$WORK/ring3.conf" "${K[@]}" --receipts "$WORK/rc2.jsonl" --audit-rate 1 --audit-seed $seed >"$WORK/spec" \
        2>"$WORK/err" && same_files "$WORK/plain" "$WORK/spec" && ok=$((ok + 1))
done
check "pipelined blocks with receipts and audits: the plain greedy tokens, no false alarm ($ok/3 audit seeds)" test $ok = 3
for k in acceptance_rate tokens_per_traversal draft_s verify_s; do
    check "metrics JSON has $k" grep -q "\"$k\"" "$WORK/m.json"
done
check "a partly accepting draft was exercised (0 < acceptance < 1)" \
    awk -F'[:,]' '/acceptance_rate/ { v = $2 + 0 } END { exit !(v > 0 && v < 1) }' "$WORK/m.json"
# Step kernels: a q8_0 model drafting for itself is accepted in full (its verify batches give the bits of its
# single-step drafts; ggml's batched GEMM would not), locally and through 3 nodes, and the output is greedy's.
p=$(prompt 11)
"$RINGLM" run -m "$self8" --tokens "$p" -n 40 --temp 0 --ignore-eos --ids >"$WORK/plain8" 2>/dev/null
for where in local 3; do
    ra=(); [ $where = local ] || ra=(--ring "$WORK/ring$where.conf" "${K[@]}")
    [ $where = local ] || ln -sf "$self8" "$RING/models/self8.gguf"
    "$RINGLM" run -m "$self8" --tokens "$p" -n 40 --temp 0 --ignore-eos --ids --draft "$self8" "${ra[@]}" \
        --metrics-json "$WORK/twin-$where.json" >"$WORK/twin" 2>"$WORK/err" || cat "$WORK/err"
    check "q8_0 target as its own draft ($where): the greedy tokens, every draft accepted ($(grep -o '"acceptance_rate":[^,]*' "$WORK/twin-$where.json"))" \
        bash -c "same_files '$WORK/plain8' '$WORK/twin' && grep -Eq '\"acceptance_rate\":[[:space:]]*1([,}]|$)' '$WORK/twin-$where.json'"
done
# Drafts that never agree (another seed of the same shapes: every draft rejected) pause, are probed again, and
# the text stays greedy's, on one machine and through 3 nodes (speculate/spec_gen.h SPEC_FALLBACK_*); the
# target drafting for itself never pauses; --draft-fallback off drafts every step.
other=$(model full-f32 k3-full f32 2)
ln -sf "$other" "$RING/models/other.gguf"
p=$(prompt 12)
"$RINGLM" run -m "$target" --tokens "$p" -n 160 --temp 0 --ignore-eos --ids >"$WORK/plain160" 2>/dev/null
fb() { python3 -c "import json, sys; d = json.load(open(sys.argv[1])); print(d['fallbacks'], d['paused_steps'], d['traversals'])" "$1"; }
for where in local 3; do
    ra=(); [ $where = local ] || ra=(--ring "$WORK/ring$where.conf" "${K[@]}")
    "$RINGLM" run -m "$target" --tokens "$p" -n 160 --temp 0 --ignore-eos --ids --draft "$other" "${ra[@]}" \
        --metrics-json "$WORK/fb-$where.json" >"$WORK/fb" 2>"$WORK/err" || cat "$WORK/err"
    read -r nf np nt <<<"$(fb "$WORK/fb-$where.json")"
    check "a draft that never agrees ($where): greedy's tokens; paused $nf times, $np of $nt steps without drafts" \
        bash -c "same_files '$WORK/plain160' '$WORK/fb' && test $nf -ge 2 && test $np -ge 80"
done
"$RINGLM" run -m "$target" --tokens "$p" -n 160 --temp 0 --ignore-eos --ids --draft "$other" --draft-fallback off \
    --metrics-json "$WORK/fb-off.json" >"$WORK/fb" 2>"$WORK/err" || cat "$WORK/err"
read -r nf np nt <<<"$(fb "$WORK/fb-off.json")"
check "--draft-fallback off: drafts every step (no pause), greedy's tokens" bash -c "same_files '$WORK/plain160' '$WORK/fb' && test $nf = 0 && test $np = 0"
"$RINGLM" run -m "$target" --tokens "$p" -n 160 --temp 0 --ignore-eos --ids --draft "$target" --draft-fixed \
    --metrics-json "$WORK/fb-self.json" >"$WORK/fb" 2>"$WORK/err" || cat "$WORK/err"
read -r nf np nt <<<"$(fb "$WORK/fb-self.json")"
check "the target as its own draft (--draft-fixed: the count alone judges): never paused, greedy's tokens" bash -c "same_files '$WORK/plain160' '$WORK/fb' && test $nf = 0"

# A draft model reads the prompt as the target does, in one batch, its last token too (speculate/drafter.c):
# the target drafting for itself then agrees on every draft, also on quantized weights, where a last prompt
# token read as a separate step took other matmul kernels and the twin disagreed with itself (q8_0: 19 of 26).
# (prompts 1 and 2 below: the old way kept 18 of 25 and 19 of 21 drafts)
for sd in 1 2 3; do
    q100=$(awk -v s=$sd 'BEGIN { x = s; for (i = 0; i < 100; i++) { x = (x * 1103515245 + 12345) % 2147483648; printf "%s%d", (i ? "," : ""), int(x / 65536) % 700 } }')
    "$RINGLM" run -m "$self8" --tokens "$q100" -n 24 --temp 0 --ignore-eos --ids --draft "$self8" --metrics-json "$WORK/twin$sd.json" \
        >/dev/null 2>"$WORK/err" || cat "$WORK/err"
done
check "the q8_0 target as its own draft after 100-token prompts: every draft kept (3/3 prompts)" python3 -c "import json, sys
for f in sys.argv[1:]:
    d = json.load(open(f))
    if not (d['drafted'] > 0 and d['accepted'] == d['drafted']): sys.exit(f + ': %d of %d kept' % (d['accepted'], d['drafted']))" \
    "$WORK/twin1.json" "$WORK/twin2.json" "$WORK/twin3.json"

# Adaptive depth (--draft-depth 8, the most; adaptive by default): a block goes ahead only while the chain of
# blocks in flight it assumes is likely (spec_gen.c SPEC_AHEAD_MIN). The target drafting for itself agrees
# always, so its chain runs deeper than the old limit of 3; a draft that never agrees sends nothing ahead.
dep() { python3 -c "import json, sys; d = json.load(open(sys.argv[1])); print(d['max_depth'], round(d['mean_depth'], 2), round(d['mean_block_drafts'], 2))" "$1"; }
for dd in "self $target" "other $other"; do
    read -r who d <<<"$dd"
    "$RINGLM" run -m "$target" --tokens "$p" -n 160 --temp 0 --ignore-eos --ids --draft "$d" --draft-depth 8 \
        --ring "$WORK/ring3.conf" "${K[@]}" --metrics-json "$WORK/dep-$who.json" >"$WORK/dep" 2>"$WORK/err" || cat "$WORK/err"
    read -r mx mean blk <<<"$(dep "$WORK/dep-$who.json")"
    if [ $who = self ]; then
        check "--draft-depth 8, a draft that always agrees: greedy's tokens, up to $mx blocks in flight (mean $mean, $blk drafts a block)" \
            bash -c "same_files '$WORK/plain160' '$WORK/dep' && test $mx -ge 4"
    else
        check "--draft-depth 8, a draft that never agrees: greedy's tokens, never a block ahead (at most $mx in flight)" \
            bash -c "same_files '$WORK/plain160' '$WORK/dep' && test $mx = 1"
    fi
done
rc=0; "$RINGLM" run -m "$target" -p hi -n 4 --draft ngram --draft-fallback maybe 2>"$WORK/err" >/dev/null || rc=$?
check "--draft-fallback maybe: exit 2, saying what it wants" bash -c "test $rc = 2 && grep -q \"bad value 'maybe' for --draft-fallback: want on or off\" '$WORK/err'"
# DSpark drafts depend on every tap: the same drafts (so the same acceptance and traversal count) on one
# machine, through 1 node, and through 3 nodes whose stages each send some of the taps (one block at a time,
# as on one machine).
for where in local 1 3; do
    ra=(); [ $where = local ] || ra=(--ring "$WORK/ring$where.conf" "${K[@]}")
    "$RINGLM" run -m "$target" --tokens "$(prompt 7)" -n 40 --temp 0 --ignore-eos --ids --draft "dspark:$WORK/dspark.gguf" \
        --draft-fixed --draft-depth 1 "${ra[@]}" --metrics-json "$WORK/ds-$where.json" >/dev/null 2>"$WORK/err" || cat "$WORK/err"
    grep -o '"\(drafted\|accepted\|traversals\|draft_digest\)":[^,}]*' "$WORK/ds-$where.json" | head -4 | tr -d ' \t' | tr '\n' ' ' \
        >"$WORK/ds-$where.sum"
done
check "DSpark drafts the same on one machine and through 1- and 3-node rings ($(cat "$WORK/ds-local.sum"))" \
    bash -c "same_files '$WORK/ds-local.sum' '$WORK/ds-1.sum' && same_files '$WORK/ds-local.sum' '$WORK/ds-3.sum'"
"$RINGLM" synth --no-progress --config small --draft dspark -o "$WORK/other-ds.gguf"
check_fails "a DSpark draft for another target is refused" "differs from the target" \
    "$RINGLM" run -m "$target" -p hi -n 4 --draft "dspark:$WORK/other-ds.gguf"
check_fails "a plain model given as a DSpark draft is refused" "dflash" \
    "$RINGLM" run -m "$target" -p hi -n 4 --draft "dspark:$self8"
check_fails "a DSpark draft given as a plain draft model is refused with a hint" "dspark:" \
    "$RINGLM" run -m "$target" -p hi -n 4 --draft "$WORK/dspark.gguf"
"$RINGLM" synth --no-progress --config '{"base":"tiny","n_vocab":2048}' -o "$WORK/other.gguf" 2>/dev/null ||
    "$RINGLM" synth --no-progress --config small --draft k3 -o "$WORK/other.gguf"
check_fails "a draft model with another vocabulary is refused" "vocabulary" \
    "$RINGLM" run -m "$target" -p hi -n 4 --draft "$WORK/other.gguf"
finish
