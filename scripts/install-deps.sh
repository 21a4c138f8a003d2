#!/usr/bin/env bash
# Installs the Debian packages of a list: scripts/debian-packages.txt (everything the project
# needs: build, tests, benchmarks) unless another list is given, e.g.
# scripts/debian-packages-server.txt (the Dockerfile's build stage: the shipped binaries only).
# Idempotent and non-interactive: does nothing when all are already installed.
# usage: install-deps.sh [LIST]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
list=${1:-$here/debian-packages.txt}
[ -r "$list" ] || { echo "install-deps: cannot read $list" >&2; exit 2; }
mapfile -t packages < <(grep -v '^\s*#' "$list" | grep -v '^\s*$')
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages of $(basename "$list") present"
  exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
