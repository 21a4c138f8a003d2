#!/usr/bin/env bash
# The test command: install packages, build, run the whole suite under ctest, then the short
# fuzz pass.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
ctest --preset default -j 2 "$@"
# The short fuzz pass (README "Fuzzing"): builds build-fuzz/ (clang, ASan + UBSan) and runs
# every fuzz target for RECAL_FUZZ_SECONDS (default 30), two at a time; a finding fails.
scripts/fuzz.sh --seconds "${RECAL_FUZZ_SECONDS:-30}" --jobs 2
