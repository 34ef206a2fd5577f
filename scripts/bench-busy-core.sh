#!/usr/bin/env bash
# Decode speed with one core taken by another busy process, against the quiet machine, in one
# run (issue 28: "sharing the machine"; llama.cpp keeps 0.27-0.37x on a 2-core VM, specdec
# ~0.45x). Runs `specdec bench` decode (-p 0) quiet, with a busy process (a shell loop), and
# quiet again, and prints each and the ratio of the busy run to the mean of the quiet ones.
# Usage: scripts/bench-busy-core.sh [build dir, default build] [extra bench options...]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${1:-$ROOT/build}"
shift || true
BIN="$BUILD/specdec"
[ -x "$BIN" ] || { echo "no $BIN: build first" >&2; exit 1; }
decode() {
  "$BIN" bench -p 0 -n 128 -t 2 --repetitions 3 --output-format json "$@" 2>/dev/null |
    python3 -c "import json, sys; print(json.load(sys.stdin)['decode_tok_s'])"
}
quiet1=$(decode "$@")
( while :; do :; done ) &
busy_pid=$!
trap 'kill $busy_pid 2>/dev/null || true' EXIT
sleep 0.5
busy=$(decode "$@")
kill $busy_pid 2>/dev/null || true
wait $busy_pid 2>/dev/null || true
trap - EXIT
quiet2=$(decode "$@")
python3 - "$quiet1" "$busy" "$quiet2" <<'PY'
import sys
q1, b, q2 = map(float, sys.argv[1:])
print(f"decode tok/s: quiet {q1:.1f}, one core busy {b:.1f}, quiet again {q2:.1f}; "
      f"busy / quiet = {b / ((q1 + q2) / 2):.3f} (target >= 0.45)")
PY
