#!/usr/bin/env bash
# Runs on the lent GPU machine, in the repository root, over what scripts/cuda_device_pack.sh
# made: unpacks it, joins the default model when both halves have arrived (the first is kept
# in /root between calls), runs the CUDA tests and benchmarks, and writes logs under $OUT.
# Steps can be chosen: STEPS="info ops model drafter cli spec shapes sweep attn tile" (default: all
# but sweep, attn and tile); QUICK=1 leaves out the A/B benches without graphs / fusion and the slowest spec runs.
# Every log goes into $OUT/logs.tgz (a call brings back 8 files at most); stdout shows their tails
# and, for the speculative benches, a one-line summary.
set -uo pipefail
ROOT="$(pwd)"
OUT="${OUT:-/tmp/specdec-out}"
mkdir -p "$OUT" /root/specdec-dev
STEPS="${STEPS:-info ops model drafter cli spec shapes}"
D=/root/specdec-dev
rm -rf "$D/bin" "$D/lib" "$D/shared"
if command -v xz > /dev/null; then
  tar -C "$D" -xJf .devcarry/payload.tar.xz
else  # the image may lack xz; Python has lzma
  python3 -c "import tarfile, sys; tarfile.open(sys.argv[1], 'r:xz').extractall(sys.argv[2])" \
      .devcarry/payload.tar.xz "$D"
fi
export LD_LIBRARY_PATH="$D/lib:${LD_LIBRARY_PATH:-}"
export SPECDEC_SHARED_DIR="$D/shared"
export SPECDEC_CACHE="$D/cache"
export SPECDEC_HEADS="$ROOT/heads"  # the shipped drafter heads (found by the model's fingerprint)
LOGS=/tmp/specdec-logs
rm -rf "$LOGS"
mkdir -p "$LOGS"
mkdir -p "$SPECDEC_CACHE"
for h in a b; do [ -f ".devmodel_$h/part" ] && cp ".devmodel_$h/part" "$D/model.$h"; done
model="$SPECDEC_CACHE/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ ! -f "$model" ] && [ -f "$D/model.a" ] && [ -f "$D/model.b" ]; then
  cat "$D/model.a" "$D/model.b" > "$model"
  if [ "$(sha256sum "$model" | awk '{print $1}')" != "$(cat .devcarry/model.sha256)" ]; then
    echo "[check] joined model has the wrong checksum; removed"; rm -f "$model"
  fi
fi
[ -f "$model" ] && echo "[check] default model present" || echo "[check] default model absent (its tests skip)"
B="$D/bin"
run() {  # name, command...: runs it with a log in $LOGS, prints its tail
  local name=$1; shift
  echo "=== $name: $*"
  local t0=$SECONDS
  "$@" > "$LOGS/$name.log" 2>&1
  local rc=$?
  echo "=== $name rc=$rc, $((SECONDS - t0)) s"
  tail -n "${TAIL:-25}" "$LOGS/$name.log"
}
spec_run() {  # name, bench arguments...: a speculative bench (JSON), summarized on one line
  local name=$1; shift
  echo "=== $name: specdec bench $*"
  local t0=$SECONDS
  "$B/specdec" bench "$@" --output-format json > "$LOGS/$name.json" 2> "$LOGS/$name.log"
  local rc=$?
  echo "=== $name rc=$rc, $((SECONDS - t0)) s"
  [ $rc -eq 0 ] || tail -n 5 "$LOGS/$name.log"
  python3 - "$LOGS/$name.json" <<'PY' || true
import json, sys
j = json.load(open(sys.argv[1]))
keys = ["spec", "device", "speedup", "plain_tok_s", "spec_tok_s", "tokens_per_pass",
        "min_prompt_speedup", "identical_outputs", "prompts", "draft_time_fraction",
        "verify_cost_ratio", "acceptance_at_position"]
print(json.dumps({k: (round(j[k], 3) if isinstance(j.get(k), float) else j.get(k)) for k in keys}))
PY
}
for step in $STEPS; do
  case $step in
    info)
      nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
      ldd "$B/specdec" | grep "not found" || echo "[check] all libraries found"
      ;;
    ops) run ops "$B/cuda_test_cuda_ops" --gtest_brief=1 ;;
    model) run model "$B/cuda_test_cuda_model" --gtest_brief=1 ;;
    drafter) run drafter "$B/cuda_test_cuda_drafter" --gtest_brief=1 ;;
    cli)
      tiny="$SPECDEC_SHARED_DIR/models/tiny/stories260K.gguf"
      run gen_tiny "$B/specdec" generate --device cuda -m "$tiny" -n 64 -p "Once upon a time" --temp 0
      if [ -f "$model" ]; then
        run gen_smol "$B/specdec" generate --device cuda --chat --spec ngram -n 128 -p "Repeat the following text exactly, word for word: The river runs through the middle of the old town. Every morning, fishermen set out in small wooden boats, and by noon the market near the bridge is full of fresh fish, bread and vegetables."
        run bench_smol "$B/specdec" bench --device cuda -p 512 -n 128 --output-format json
        [ "${QUICK:-0}" = 1 ] && continue  # QUICK=1: not the A/B runs without graphs or fusion
        SPECDEC_CUDA_GRAPHS=0 run bench_smol_nographs "$B/specdec" bench --device cuda -p 512 -n 128 --output-format json
        SPECDEC_CUDA_FUSE=0 run bench_smol_nofuse "$B/specdec" bench --device cuda -p 512 -n 128 --output-format json
      fi
      ;;
    spec)
      if [ -f "$model" ]; then
        MT=.devcarry/mtbench-20.jsonl
        run calibrate "$B/specdec" bench --device cuda --calibrate -p 256
        spec_run ngram_grounded --device cuda --spec ngram --prompts bench/prompts/grounded.jsonl -n 128
        spec_run rd_2x2 --device cuda --spec redrafter --chat --prompts $MT -n 128 --repeats 2 --interleave
        SPECDEC_HEAD_DEVICE=cpu spec_run rd_2x2_hosthead --device cuda --spec redrafter --chat --prompts $MT -n 128 --repeats 2 --interleave
        spec_run rd_4x4 --device cuda --spec redrafter --beams 4 --beam-length 4 --chat --prompts $MT -n 128 --repeats 2 --interleave
        spec_run ngram_chat --device cuda --spec ngram --chat --prompts $MT -n 128 --repeats 2 --interleave
        [ "${QUICK:-0}" = 1 ] && continue  # QUICK=1: not the fixed 4x4 tree nor the CPU's run
        spec_run rd_4x4_fixed --device cuda --spec redrafter --beams 4 --beam-length 4 --num-draft 16 --chat --prompts $MT -n 128 --repeats 2 --interleave
        spec_run rd_2x2_cpu16 --spec redrafter --chat --prompts $MT -n 128 -t 16
      fi
      ;;
    tile)  # the split attention's tile (SPECDEC_CUDA_ATTN_TILE), each value's runs together
      if [ -f "$model" ]; then
        MT=.devcarry/mtbench-20.jsonl
        for tile in ${TILES:-128 256 64}; do
          export SPECDEC_CUDA_ATTN_TILE=$tile
          TAIL=3 run "bench_tile$tile" "$B/specdec" bench --device cuda -p 512 -n 128 --output-format json
          for reps in 60 240; do
            long=$(python3 -c "print(' '.join(['The river runs through the old town, and every morning the fishermen set out.'] * $reps))")
            TAIL=1 run "plain_long${reps}_tile$tile" "$B/specdec" generate --device cuda -n 256 --ignore-eos -p "$long"
          done
          run "calibrate_tile$tile" "$B/specdec" bench --device cuda --calibrate -p 256
          spec_run "ngram_grounded_tile$tile" --device cuda --spec ngram --prompts bench/prompts/grounded.jsonl -n 128
          spec_run "rd_2x2_tile$tile" --device cuda --spec redrafter --chat --prompts $MT -n 128 --repeats 2 --interleave
          unset SPECDEC_CUDA_ATTN_TILE
        done
      fi
      ;;
    shapes)
      run shapes "$B/bench_cuda_shapes" --all --layout both
      ;;
    sweep) run sweep "$B/bench_cuda_shapes" --sweep ;;
    attn)  # plain decoding after long prompts: the attention kernels (split, fast, legacy), same run
      if [ -f "$model" ]; then
        for reps in 60 240; do  # ~960 and ~3,800 prompt tokens
          long=$(python3 -c "print(' '.join(['The river runs through the old town, and every morning the fishermen set out.'] * $reps))")
          for mode in split fast legacy split; do
            [ $reps = 240 ] && [ $mode = legacy ] && continue
            a=$mode; [ $mode = split ] && a=""
            SPECDEC_CUDA_ATTN=$a TAIL=1 run "plain_long${reps}_$mode" "$B/specdec" generate --device cuda -n 256 --ignore-eos -p "$long"
          done
        done
      fi
      ;;
  esac
done
tar -C "$LOGS" -czf "$OUT/logs.tgz" . && echo "[check] logs: logs.tgz ($(du -k "$OUT/logs.tgz" | cut -f1) KiB)"
