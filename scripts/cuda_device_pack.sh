#!/usr/bin/env bash
# Prepares what a lent GPU machine (the `device` tool's) needs to test the CUDA build, since it
# has neither our Debian libraries nor the models, and a call carries at most 64 MiB:
#   .devcarry/payload.tar.xz   the CUDA build's binaries (stripped), the shared libraries they
#                              load that a CUDA image may lack, ../shared's tiny models and goldens
#   .devmodel_a/, .devmodel_b/ the default model in two parts (one per call: the machine keeps
#                              them in /root between calls made back to back)
# Usage: scripts/cuda_device_pack.sh [build dir, default build-cuda]. Then, with the device tool,
# three calls back to back (a call carries 64 MiB with the working tree, ~12 MB since the shipped
# drafter head, so the model's halves and the payload travel apart):
#   run(command="mkdir -p /root/specdec-dev && cp .devmodel_a/part /root/specdec-dev/model.a",
#       carry=[".devmodel_a"]);
#   run(command="cp .devmodel_b/part /root/specdec-dev/model.b", carry=[".devmodel_b"]);
#   run(command="bash scripts/cuda_device_check.sh", carry=[".devcarry"]);
#   the folders are git-ignored.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${1:-$ROOT/build-cuda}"
CACHE="${SPECDEC_CACHE:-$HOME/.cache/specdec}"
SHARED="${SPECDEC_SHARED_DIR:-$ROOT/../shared}"
cd "$ROOT"
rm -rf .devcarry .devmodel_a .devmodel_b
stage=$(mktemp -d)
mkdir -p "$stage/bin" "$stage/lib" "$stage/shared/models" .devcarry
for b in specdec cuda_test_cuda_ops cuda_test_cuda_model cuda_test_cuda_drafter bench_cuda_shapes; do
  if [ -x "$BUILD/$b" ]; then strip -o "$stage/bin/$b" "$BUILD/$b"; else echo "[pack] missing $b" >&2; fi
done
# Every shared library the binaries load except glibc's own (libc, libm, ld-linux, vdso).
for b in "$stage"/bin/*; do
  ldd "$b" | awk '$3 ~ /^\// {print $3}'
done | sort -u | grep -vE '/(libc|libm|ld-linux[^/]*|libdl|libpthread|librt)\.so' |
  while read -r lib; do cp -L "$lib" "$stage/lib/"; done
cp -r "$SHARED/models/tiny" "$stage/shared/models/"
cp -r "$SHARED/golden" "$stage/shared/"
# The held-out chat prompts of the speculative benches (fetched data: never committed).
if [ -f "$CACHE/prompts/mtbench-20.jsonl" ]; then cp "$CACHE/prompts/mtbench-20.jsonl" .devcarry/; fi
tar -C "$stage" -cf - . | xz -9e -T2 > .devcarry/payload.tar.xz  # fatbins: xz 11 MB, gzip 30
rm -rf "$stage"
model="$CACHE/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ -f "$model" ]; then
  mkdir -p .devmodel_a .devmodel_b
  head -c 50000000 "$model" > .devmodel_a/part
  tail -c +50000001 "$model" > .devmodel_b/part
  sha256sum "$model" | awk '{print $1}' > .devcarry/model.sha256
fi
du -sh .devcarry .devmodel_a .devmodel_b 2>/dev/null
