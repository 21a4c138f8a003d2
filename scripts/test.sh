#!/usr/bin/env bash
# The test command: install packages, build, run the whole suite under ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
ctest --preset default -j 2 "$@"
