#!/usr/bin/env bash
# Installs those of the Debian packages named as arguments that are not installed yet (as root, or
# through sudo), quietly; scripts/setup.sh and scripts/fuzz.sh call it.
#   bash scripts/apt_install.sh PACKAGE...
set -euo pipefail
missing=()
for p in "$@"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
((${#missing[@]})) || exit 0
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
echo "installing ${#missing[@]} Debian packages (apt-get; minutes the first time): ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" \
  >/dev/null 2> >(grep -v "^debconf: delaying package configuration" >&2)
