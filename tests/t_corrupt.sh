#!/usr/bin/env bash
# Bad model files get a clear message naming the problem and exit 1: never a crash, never a hang.
. "$(dirname "$0")/lib.sh"
f=$(model full-f32 k3-full f32)
E=$TOOLS/gguf_edit
bad() { # bad NAME PATTERN FILE: `ringlm inspect FILE` must fail with PATTERN
    check_fails "$1" "$2" "$RINGLM" inspect "$3"
}

bad "missing file" "cannot open .*nope.gguf" "$WORK/nope.gguf"
bad "directory" "not a regular file" "$WORK"
: >"$WORK/empty.gguf"
bad "empty file" "truncated" "$WORK/empty.gguf"
{ printf 'GGML'; tail -c +5 "$f"; } >"$WORK/magic.gguf"
bad "bad magic" "bad magic" "$WORK/magic.gguf"
{ head -c 4 "$f"; printf '\x63\x00\x00\x00'; tail -c +9 "$f"; } >"$WORK/version.gguf"
bad "bad version" "unsupported GGUF version 99" "$WORK/version.gguf"
head -c 3000 "$f" >"$WORK/cut-header.gguf"
bad "truncated header" "invalid GGUF" "$WORK/cut-header.gguf"
size=$(stat -c %s "$f")
head -c $((size - 4096)) "$f" >"$WORK/cut-data.gguf"
bad "truncated data" "truncated: tensor '.*' needs bytes up to" "$WORK/cut-data.gguf"

"$E" "$f" "$WORK/arch.gguf" --set-str general.architecture llama
bad "unknown architecture" "unsupported architecture 'llama'" "$WORK/arch.gguf"
"$E" "$f" "$WORK/tensor.gguf" --drop-tensor blk.1.ssm_g.weight
bad "missing tensor" "missing tensor 'blk.1.ssm_g.weight'" "$WORK/tensor.gguf"
"$E" "$f" "$WORK/shape.gguf" --reshape blk.0.ssm_beta.weight 256,5,1
bad "wrong shape" "tensor 'blk.0.ssm_beta.weight' has shape \{256, 5, 1, 1\}, expected \{256, 4, 1, 1\}" "$WORK/shape.gguf"
"$E" "$f" "$WORK/type.gguf" --retype blk.0.ssm_conv1d_q.weight f16
bad "wrong type" "blk.0.ssm_conv1d_q.weight' is f16, must be f32" "$WORK/type.gguf"
"$E" "$f" "$WORK/key.gguf" --del-key kimi-k3.kda.head_dim
bad "missing key" "missing metadata key kimi-k3.kda.head_dim" "$WORK/key.gguf"
"$E" "$f" "$WORK/keytype.gguf" --set-f64 kimi-k3.attention.layer_norm_rms_epsilon 1e-5
bad "wrong key type" "layer_norm_rms_epsilon has wrong type f64" "$WORK/keytype.gguf"
"$E" "$f" "$WORK/nomla.gguf" --set-u32 kimi-k3.attention.head_count_kv 0
bad "no MLA layer" "at least one KDA and one MLA layer" "$WORK/nomla.gguf"
"$E" "$f" "$WORK/topk.gguf" --set-u32 kimi-k3.expert_used_count 99
bad "top-k above expert count" "expert_used_count 99" "$WORK/topk.gguf"

# Split sets.
"$RINGLM_SYNTH" synth --no-progress --config "$ROOT/tests/configs/k3-full.json" --type q8_0 --split 3 -o "$WORK/s.gguf"
check "split set reads as one model" "$RINGLM" inspect "$WORK/s-00002-of-00003.gguf"
cp "$WORK/s-00001-of-00003.gguf" "$WORK/lone.gguf"
bad "split member under a plain name" "part 1 of a 3-file split set" "$WORK/lone.gguf"
mv "$WORK/s-00003-of-00003.gguf" "$WORK/s3.bak"
bad "split member missing" "split set member 3 of 3: cannot open" "$WORK/s-00001-of-00003.gguf"
"$E" "$WORK/s3.bak" "$WORK/s-00003-of-00003.gguf" --set-u16 split.count 4
bad "split count mismatch" "inconsistent split set" "$WORK/s-00001-of-00003.gguf"
"$E" "$WORK/s3.bak" "$WORK/s-00003-of-00003.gguf" --set-u16 split.no 1
bad "split number mismatch" "inconsistent split set: file says it is part 2 of 3, its name says 3 of 3" "$WORK/s-00001-of-00003.gguf"
cp "$WORK/s3.bak" "$WORK/s-00003-of-00003.gguf"
"$E" "$WORK/s-00001-of-00003.gguf" "$WORK/t1.gguf" --set-i32 split.tensors.count 7
mv "$WORK/t1.gguf" "$WORK/s-00001-of-00003.gguf"
bad "split tensor count mismatch" "split.tensors.count says 7" "$WORK/s-00001-of-00003.gguf"
finish
