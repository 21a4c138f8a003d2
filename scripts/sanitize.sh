#!/usr/bin/env bash
# Builds with a sanitizer preset and runs the test suite under it:
#   scripts/sanitize.sh asan [ctest args]   # AddressSanitizer + UndefinedBehaviorSanitizer, build-asan/
#   scripts/sanitize.sh tsan [ctest args]   # ThreadSanitizer, build-tsan/
# Suppressions (each with the reason it is not ours) are in tests/sanitizers/.
set -euo pipefail
preset="${1:?usage: scripts/sanitize.sh asan|tsan [ctest args]}"
shift
cd "$(dirname "$0")/.."
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.ccache}" CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" -j "$(nproc)"
supp="$PWD/tests/sanitizers"
export ASAN_OPTIONS="detect_leaks=1:strict_string_checks=1:check_initialization_order=1"
export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$supp/ubsan.supp"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$supp/tsan.supp"
ctest --preset "$preset" -j 2 "$@"
