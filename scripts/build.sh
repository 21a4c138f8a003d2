#!/usr/bin/env bash
# Makes the project venv (LibTorch's wheel, the Python side: scripts/venv.sh), then configures
# and builds with the default preset (build/, executables in build/bin/).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/venv.sh
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.ccache}"
# Relative paths in the cache keys: a fresh clone elsewhere (CI) reuses earlier builds.
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
cmake --preset default >/dev/null
cmake --build --preset default -j "$(nproc)"
