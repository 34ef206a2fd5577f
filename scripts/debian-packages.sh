# Sourced by the scripts that need Debian packages (setup.sh, fuzz.sh):
#   ensure_debian_packages PKG...   installs, via apt-get, those of PKG not installed yet (sudo
#                                   when not root); returns 1 when all were present already.
# Uses the caller's log() for its message.
ensure_debian_packages() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  ((${#missing[@]})) || return 1
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  log "installing Debian packages: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
}
