#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, -DSPECDEC_FUZZ=ON) in build-fuzz and runs each for a
# bounded time, starting from its seed corpus in fuzz/corpus/<target>/. scripts/sanitize.sh runs
# it (so scripts/test.sh --sanitize and CI do).
#   scripts/fuzz.sh [TARGET...]         default: every target (gguf tokenizer chat_template request)
#   SPECDEC_FUZZ_SECONDS=600 scripts/fuzz.sh gguf    longer runs by hand
# What a run discovers stays in build-fuzz/corpus-<target>/ (the repository's corpus is only
# read). A finding stops its run, is saved as build-fuzz/findings/<target>/crash-*, and makes
# the script exit 1: fix it, then copy the file into fuzz/corpus/<target>/, where the suite's
# replay test (tests/unit/test_fuzz_corpus.cpp) keeps checking it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
FUZZ_DIR="${SPECDEC_FUZZ_DIR:-$ROOT/build-fuzz}"
SECONDS_EACH="${SPECDEC_FUZZ_SECONDS:-60}"
TARGETS=("$@")
((${#TARGETS[@]})) || TARGETS=(gguf tokenizer chat_template request)
log() { echo "[fuzz] $*" >&2; }

# clang and its runtime libraries (libFuzzer, ASan, UBSan) from Debian, when missing.
# shellcheck source=scripts/debian-packages.sh
source "$ROOT/scripts/debian-packages.sh"
ensure_debian_packages clang libclang-rt-dev || true

if [ ! -f "$FUZZ_DIR/CMakeCache.txt" ]; then
  cmake -S "$ROOT" -B "$FUZZ_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CXX_COMPILER=clang++ -DSPECDEC_FUZZ=ON -DSPECDEC_BUILD_TESTS=OFF >/dev/null
fi
cmake --build "$FUZZ_DIR" -j"$(nproc)" --target "${TARGETS[@]/#/fuzz_}"

status=0
for t in "${TARGETS[@]}"; do
  work="$FUZZ_DIR/corpus-$t"
  findings="$FUZZ_DIR/findings/$t"
  mkdir -p "$work" "$findings"
  log "$t: ${SECONDS_EACH} s from fuzz/corpus/$t"
  # -timeout: an input that takes 25 s is a finding too (a hang); the rss limit catches runaway
  # allocations that a size check should have refused.
  if ! "$FUZZ_DIR/fuzz/fuzz_$t" -max_total_time="$SECONDS_EACH" -timeout=25 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$findings/" "$work" "$ROOT/fuzz/corpus/$t" \
      2> "$FUZZ_DIR/fuzz-$t.log"; then
    status=1
    tail -n 60 "$FUZZ_DIR/fuzz-$t.log" >&2
    log "$t: FINDING, saved in $findings/ (log: $FUZZ_DIR/fuzz-$t.log)"
  else
    log "$t: $(grep -m1 -o 'stat::number_of_executed_units: [0-9]*' "$FUZZ_DIR/fuzz-$t.log" |
               sed 's/.*: //') executions, no finding"
  fi
done
exit "$status"
