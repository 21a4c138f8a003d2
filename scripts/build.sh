#!/usr/bin/env bash
# Makes the project venv (LibTorch's wheel, the Python side: scripts/venv.sh), then configures
# and builds with the default preset (build/, executables in build/bin/).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/venv.sh
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.ccache}"
# Relative paths in the cache keys: a fresh clone elsewhere (CI) reuses earlier builds.
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
# LibTorch's precompiled header (cmake/TorchPrecompiledHeader.cmake) is cached only with these.
export CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}"
cmake --preset default >/dev/null
# Targets given (scripts/demo.sh: what the demo runs): only those; none: everything.
cmake --build --preset default -j "$(nproc)" ${1:+--target "$@"}
