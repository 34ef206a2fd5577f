#!/usr/bin/env bash
# Runs on the lent GPU machine, in the repository root, over what scripts/cuda_device_pack.sh
# made: unpacks it, joins the default model when both halves have arrived (the first is kept
# in /root between calls), runs the CUDA tests and benchmarks, and writes logs under $OUT.
# Steps can be chosen: STEPS="info ops model cli shapes" (default: all).
set -uo pipefail
ROOT="$(pwd)"
OUT="${OUT:-/tmp/specdec-out}"
mkdir -p "$OUT" /root/specdec-dev
STEPS="${STEPS:-info ops model cli shapes}"
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
run() {  # name, command...: runs it with a log under $OUT, prints its tail
  local name=$1; shift
  echo "=== $name: $*"
  local t0=$SECONDS dir="$OUT"
  case $name in gen_*|*_no*) dir=/tmp/specdec-logs; mkdir -p "$dir" ;; esac  # 8 files come back
  "$@" > "$dir/$name.log" 2>&1
  local rc=$?
  echo "=== $name rc=$rc, $((SECONDS - t0)) s"
  tail -n 25 "$dir/$name.log"
}
for step in $STEPS; do
  case $step in
    info)
      nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
      ldd "$B/specdec" | grep "not found" || echo "[check] all libraries found"
      ;;
    ops) run ops "$B/cuda_test_cuda_ops" --gtest_brief=1 ;;
    model) run model "$B/cuda_test_cuda_model" --gtest_brief=1 ;;
    cli)
      tiny="$SPECDEC_SHARED_DIR/models/tiny/stories260K.gguf"
      run gen_tiny "$B/specdec" generate --device cuda -m "$tiny" -n 64 -p "Once upon a time" --temp 0
      if [ -f "$model" ]; then
        run gen_smol "$B/specdec" generate --device cuda --chat --spec ngram -n 128 -p "Repeat the following text exactly, word for word: The river runs through the middle of the old town. Every morning, fishermen set out in small wooden boats, and by noon the market near the bridge is full of fresh fish, bread and vegetables."
        run bench_smol "$B/specdec" bench --device cuda -p 512 -n 128 --output-format json
        SPECDEC_CUDA_GRAPHS=0 run bench_smol_nographs "$B/specdec" bench --device cuda -p 512 -n 128 --output-format json
        SPECDEC_CUDA_FUSE=0 run bench_smol_nofuse "$B/specdec" bench --device cuda -p 512 -n 128 --output-format json
        run spec_grounded "$B/specdec" bench --device cuda --spec ngram --prompts bench/prompts/grounded.jsonl -n 128 --output-format json
      fi
      ;;
    shapes)
      run shapes "$B/bench_cuda_shapes" --all
      run sweep "$B/bench_cuda_shapes" --sweep
      ;;
  esac
done
