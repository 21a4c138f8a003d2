#!/usr/bin/env bash
# Builds with a sanitizer preset and runs the whole test suite under it (README "Under
# sanitizers"):
#   scripts/sanitize.sh asan [ctest args]   # AddressSanitizer + UndefinedBehaviorSanitizer, build-asan/
#   scripts/sanitize.sh tsan [ctest args]   # ThreadSanitizer, build-tsan/
#   JOBS=1 scripts/sanitize.sh asan -R worker_runner    # build with 1 job; ctest args as usual
# Suppressions (each with the reason it is not ours) are in tests/sanitizers/. The options
# below reach every process the tests start, the sandboxed recal-worker included (a
# sanitizer build passes them on: server/jobs/worker_runner.cc). Prints the wall time of
# the build and of the tests.
set -euo pipefail
preset="${1:?usage: scripts/sanitize.sh asan|tsan [ctest args]}"
shift
case "$preset" in
  asan|tsan) ;;
  *) echo "sanitize.sh: the preset is asan or tsan, not '$preset'" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
jobs="${JOBS:-$(nproc)}"
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.ccache}" CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
start=$(date +%s)
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" -j "$jobs"
built=$(date +%s)

supp="$PWD/tests/sanitizers"
# halt_on_error / exitcode: a finding fails the process, hence its test; a server's report
# lands in its log, which the end-to-end tests print when they fail.
export ASAN_OPTIONS="detect_leaks=1:strict_string_checks=1:check_initialization_order=1:detect_stack_use_after_return=1:halt_on_error=1"
export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$supp/ubsan.supp"
# ignore_noninstrumented_modules: TSan does not see the synchronisation inside Debian's
# uninstrumented gRPC, LibTorch, libcurl (absl::Mutex, OpenMP, atomics), so the accesses their
# calls into the runtime report (file descriptors, memcpy, free) would race with nothing real
# (seen: gRPC's epoll fd, made on the main thread and waited on by gRPC's own). Accesses
# by our instrumented code are all still checked.
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:ignore_noninstrumented_modules=1:suppressions=$supp/tsan.supp:print_suppressions=0"
# Scales the tests' own TIMEOUT properties (tests/CMakeLists.txt): sanitized code runs 2-15x slower.
export RECAL_TEST_TIMEOUT_SCALE="${RECAL_TEST_TIMEOUT_SCALE:-$([ "$preset" = tsan ] && echo 5 || echo 3)}"

run=()
# TSan's shadow layout (GCC 12) assumes mmap_rnd_bits <= 28; with more randomisation (e.g.
# Ubuntu 24.04's 32) it dies "FATAL: ThreadSanitizer: unexpected memory mapping". Without
# ASLR (setarch -R, inherited by every child) the layout fits.
if [ "$preset" = tsan ] && [ "$(cat /proc/sys/vm/mmap_rnd_bits 2>/dev/null || echo 28)" -gt 28 ]; then
  run=(setarch "$(uname -m)" -R)
fi
status=0
"${run[@]}" ctest --preset "$preset" -j 2 "$@" || status=$?
echo "sanitize.sh $preset: build $((built - start)) s, tests $(($(date +%s) - built)) s" >&2
exit $status
