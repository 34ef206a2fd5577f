#!/usr/bin/env bash
# The whole test suite on a fresh machine: set-up (packages, default model, build), then ctest.
# Extra arguments go to ctest (e.g. scripts/test.sh -R golden).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${SPECDEC_BUILD_DIR:-$ROOT/build}"
"$ROOT/scripts/setup.sh"
cd "$BUILD_DIR"
ctest --output-on-failure -j"$(nproc)" "$@"
