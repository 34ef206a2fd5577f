#!/usr/bin/env bash
# Trains the ReDrafter head for Qwen2.5-Coder-1.5B-Instruct (Q4_K_M) that heads/README.md
# measures, into $SPECDEC_CACHE/heads/ where `--spec redrafter` finds it without --drafter (the
# head is 28 MB, over the repository's limit for model files, so it is not committed).
#
# Data: the first turns of ShareGPT conversations (never the benchmark sets), answered greedily
# by the 1.5B itself, in two dataset shards (prompts 0-352 of the file: 300 usable; then 900
# usable from index 353). A shard already in $SPECDEC_CACHE/distill is reused, not rebuilt.
#
#   scripts/train-head-qwen15.sh [BUILD_DIR]     (default: build)
#
# Times on a 2-vCPU AMD EPYC Zen 4 (session 29, hidden states still in separate passes then):
# shards ~15 and ~40 minutes (~40% less now: the engine records them while answering),
# training 13 minutes.
set -euo pipefail

BUILD="${1:-build}"
CACHE="${SPECDEC_CACHE:-$HOME/.cache/specdec}"
D="$CACHE/distill"
OUT="$CACHE/heads/redrafter-qwen2.5-coder-1.5b-instruct.safetensors"

scripts/fetch-model.sh qwen2.5-coder-1.5b >/dev/null
scripts/fetch-prompts.sh sharegpt
Q="$CACHE/Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf"
mkdir -p "$CACHE/heads"

"$BUILD/specdec" train-drafter -m "$Q" --max-prompts 300 \
    --dataset "$D/qwen15-sharegpt-300.sdds" --dataset-only -t 2
"$BUILD/specdec" train-drafter -m "$Q" --first-prompt 353 --max-prompts 900 \
    --dataset "$D/qwen15-sharegpt-from353-900.sdds" --dataset-only -t 2
"$BUILD/specdec" train-drafter -m "$Q" \
    --dataset "$D/qwen15-sharegpt-300.sdds" --dataset "$D/qwen15-sharegpt-from353-900.sdds" \
    --init-out target --soft-labels 0.9 --lr 0.002 --epochs 2 --out "$OUT" -t 2
echo "head: $OUT"
