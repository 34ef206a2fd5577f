#!/usr/bin/env bash
# The sanitizer runs (scripts/test.sh --sanitize runs this after its shared-data check):
#   1. ASan + UBSan (build-asan, -DSPECDEC_SANITIZE=address): the whole ctest suite; a leak, an
#      out-of-bounds access or undefined behaviour fails the test it happens in.
#   2. TSan (build-tsan, -DSPECDEC_SANITIZE=thread): the tests labelled *_threads in
#      CMakeLists.txt (thread pool, parallel kernels, engine submit/cancel), `ctest -L threads`,
#      but those on SmolLM2 (the same code as the tiny models', too slow under TSan).
#   3. TSan over the HTTP server: the pytest server tests against build-tsan/specdec (httplib's
#      worker threads, the engine loop, streaming, disconnects, shutdown), those that finish in a
#      few minutes (not the ReDrafter ones on SmolLM2 nor the slow or wall-clock ones named
#      below); a ThreadSanitizer report fails the test it happened in (tests/server/conftest.py,
#      suppressions with their reasons in tests/server/tsan.supp). SPECDEC_SKIP_SERVER_TESTS=1
#      skips it, as it skips scripts/test.sh's pytest.
#   4. The libFuzzer targets, 60 s each (scripts/fuzz.sh; SPECDEC_FUZZ_SECONDS to change,
#      SPECDEC_SKIP_FUZZ=1 to skip).
# Each build lives in its own folder (SPECDEC_ASAN_DIR, SPECDEC_TSAN_DIR), so the normal build/
# is never touched and a second run rebuilds only what changed. Extra arguments go to both ctest
# runs. Tests built with a sanitizer see SPECDEC_SANITIZER_BUILD and give their slowest cases
# smaller inputs (tests/common/sanitizer.h). The exit status is non-zero when any part failed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ASAN_DIR="${SPECDEC_ASAN_DIR:-$ROOT/build-asan}"
TSAN_DIR="${SPECDEC_TSAN_DIR:-$ROOT/build-tsan}"
JOBS="$(nproc)"
log() { echo "[sanitize] $*" >&2; }

SPECDEC_SETUP_NO_BUILD=1 "$ROOT/scripts/setup.sh"

configure() {  # dir, sanitizer
  if [ ! -f "$1/CMakeCache.txt" ]; then
    cmake -S "$ROOT" -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPECDEC_SANITIZE="$2" >/dev/null
  fi
}

status=0
t0=$SECONDS
log "ASan+UBSan: building in $ASAN_DIR"
configure "$ASAN_DIR" address
cmake --build "$ASAN_DIR" -j"$JOBS"
log "ASan+UBSan: the whole suite"
(cd "$ASAN_DIR" &&
  ASAN_OPTIONS="detect_leaks=1:strict_string_checks=1:check_initialization_order=1" \
  UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
  ctest --output-on-failure -j"$JOBS" "$@") || status=1
log "ASan+UBSan: $((SECONDS - t0)) s"

t1=$SECONDS
log "TSan: building the threaded tests in $TSAN_DIR"
configure "$TSAN_DIR" thread
cmake --build "$TSAN_DIR" -j"$JOBS" --target specdec_threaded_tests specdec
# The tests on SmolLM2 (named so, and PrefixReuse1000Tokens) run the same threaded code as the
# tiny models' with 500x larger matrices, which TSan makes 50x slower (minutes each): they are
# left to the ASan run, named here.
log "TSan: ctest -L threads, except the SmolLM2 tests (in the ASan run)"
(cd "$TSAN_DIR" &&
  TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1" \
  ctest --output-on-failure -j"$JOBS" -L threads -E "SmolLM2|PrefixReuse1000Tokens" "$@") || status=1
log "TSan: $((SECONDS - t1)) s"

if [ "${SPECDEC_SKIP_SERVER_TESTS:-0}" != "1" ]; then
  t3=$SECONDS
  # Left out: the ReDrafter tests (SmolLM2 with its head: minutes under TSan), the tests that
  # only load SmolLM2, run `specdec generate` on it or send the tiny model many sequential
  # requests (the same code as the others, slower), and the one that compares wall times
  # (bench --url's Poisson arrivals). The rest takes ~4 min on 2 cores.
  SERVER_TSAN_SKIP="not seeded_sampling_replays and not default_max_tokens"
  SERVER_TSAN_SKIP+=" and not health_is_503 and not poisson_arrivals"
  SERVER_TSAN_SKIP+=" and not chat_greedy_equals_generate_chat"
  log "TSan: the server tests against $TSAN_DIR/specdec"
  SPECDEC_BUILD_DIR="$TSAN_DIR" SPECDEC_SERVER_SANITIZER=thread PYTHONDONTWRITEBYTECODE=1 \
    python3 -m pytest -q -p no:cacheprovider "$ROOT/tests/server" \
    --ignore "$ROOT/tests/server/test_redrafter.py" -k "$SERVER_TSAN_SKIP" || status=1
  log "TSan server tests: $((SECONDS - t3)) s"
fi

if [ "${SPECDEC_SKIP_FUZZ:-0}" != "1" ]; then
  t2=$SECONDS
  "$ROOT/scripts/fuzz.sh" || status=1
  log "fuzzing: $((SECONDS - t2)) s"
fi

exit "$status"
