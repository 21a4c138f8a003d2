#!/usr/bin/env bash
# Builds the libFuzzer targets (the preset `fuzz`: clang-14, ASan + UBSan, build-fuzz/) and
# runs each for a bounded time on its corpus plus fresh inputs (README "Fuzzing"):
#   scripts/fuzz.sh                                 # every target, 30 s each, one at a time
#   scripts/fuzz.sh --seconds 600 [TARGET...]       # TARGET: npy, image, ... (fuzz/TARGET_fuzzer.cc)
#   scripts/fuzz.sh --jobs 2 ...                    # two targets at a time
#   scripts/fuzz.sh --seconds 0 ...                 # only replay the corpus and regressions
# Corpus: build-fuzz/corpus/TARGET/ (seeds from fuzz/make_corpus.py, and what libFuzzer
# finds; kept between runs) plus the committed fuzz/corpus/TARGET/ and fuzz/regressions/TARGET/.
# A crash, hang (-timeout=10) or memory blow-up (-rss_limit_mb=2048) fails the script and
# leaves the input under build-fuzz/crashes/TARGET/; once fixed, keep it as a regression
# input in fuzz/regressions/TARGET/ (replayed by ctest in the default build: TARGET_replay).
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
seconds=30
jobs=1
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds=${2:?--seconds needs a number}; shift 2 ;;
    --seconds=*) seconds=${1#*=}; shift ;;
    --jobs) jobs=${2:?--jobs needs a number}; shift 2 ;;
    --jobs=*) jobs=${1#*=}; shift ;;
    -h|--help) usage 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; usage 2 ;;
    *) t=${1%_fuzzer}; targets+=("${t%_fuzzer.cc}"); shift ;;
  esac
done
[[ "$seconds" =~ ^[0-9]+$ && "$jobs" =~ ^[1-9][0-9]*$ ]] || { echo "fuzz.sh: --seconds N (>= 0), --jobs N (>= 1)" >&2; exit 2; }
all=()
for f in fuzz/*_fuzzer.cc; do
  f=${f#fuzz/}
  all+=("${f%_fuzzer.cc}")
done
[ ${#targets[@]} -gt 0 ] || targets=("${all[@]}")
for t in "${targets[@]}"; do
  [ -f "fuzz/${t}_fuzzer.cc" ] || { echo "fuzz.sh: no target '$t'; targets: ${all[*]}" >&2; exit 2; }
done

export CCACHE_DIR="${CCACHE_DIR:-$HOME/.ccache}" CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz -j "$(nproc)"

out=build-fuzz
python=.venv/bin/python  # scripts/venv.sh (build.sh makes it): numpy and PIL
if "$python" -c 'import numpy, PIL' 2>/dev/null; then
  "$python" fuzz/make_corpus.py "$out/corpus" "${targets[@]}" >/dev/null
else
  echo "fuzz.sh: no numpy/PIL for $python: seeds from fuzz/corpus/ only"
fi

# Reports with file:line; leaks are findings too (but LibTorch's own: the suppressions
# scripts/sanitize.sh uses). UBSan stops at the first report (the build has
# -fno-sanitize-recover=all), which libFuzzer counts as a crash.
if [ -x /usr/lib/llvm-14/bin/llvm-symbolizer ]; then export ASAN_SYMBOLIZER_PATH=/usr/lib/llvm-14/bin/llvm-symbolizer; fi
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1}"
export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$PWD/tests/sanitizers/lsan.supp:print_suppressions=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

run_one() {
  local t=$1
  local corpus="$out/corpus/$t" crashes="$out/crashes/$t" log="$out/fuzz-logs/$t.log"
  mkdir -p "$corpus" "$crashes" "$out/fuzz-logs"
  local args=(-timeout=10 -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$crashes/")
  if [ "$seconds" -gt 0 ]; then args+=(-max_total_time="$seconds"); else args+=(-runs=0); fi
  [ -f "fuzz/$t.dict" ] && args+=(-dict="fuzz/$t.dict")
  local dirs=("$corpus")
  for d in "fuzz/corpus/$t" "fuzz/regressions/$t"; do [ -d "$d" ] && dirs+=("$d"); done
  local rc=0
  "$out/bin/${t}_fuzzer" "${args[@]}" "${dirs[@]}" >"$log" 2>&1 || rc=$?
  # The last status line ("#N DONE cov: .. ft: .. corp: .."), and the run count.
  local last runs
  last=$(grep -E '^#[0-9]+' "$log" | tail -n 1 | sed -E 's/ +/ /g' || true)
  runs=$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+)/\1/p' "$log" | tail -n 1)
  if [ "$rc" -eq 0 ]; then
    echo "fuzz $t: ok, ${runs:-?} runs in ${seconds} s; ${last:-no status line}"
  else
    echo "fuzz $t: FAILED (exit $rc) after ${runs:-?} runs; log: $log"
    grep -E 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:|contract violated|SUMMARY:' "$log" |
      head -n 5 | sed 's/^/    /'
    sed -nE 's/.*Test unit written to (.*)$/    input: \1/p' "$log"
    echo "    reproduce: $out/bin/${t}_fuzzer <input>; once fixed: cp <input> fuzz/regressions/$t/"
  fi
  return "$rc"
}

# Up to --jobs targets at a time; each leaves ok/failed in build-fuzz/fuzz-logs/TARGET.result.
mkdir -p "$out/fuzz-logs"
running=0
for t in "${targets[@]}"; do
  rm -f "$out/fuzz-logs/$t.result"
  if [ "$running" -ge "$jobs" ]; then
    wait -n || true
    running=$((running - 1))
  fi
  { if run_one "$t"; then r=ok; else r=failed; fi; echo "$r" >"$out/fuzz-logs/$t.result"; } &
  running=$((running + 1))
done
wait
failed=()
for t in "${targets[@]}"; do
  [ "$(cat "$out/fuzz-logs/$t.result" 2>/dev/null)" = ok ] || failed+=("$t")
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz.sh: ${#failed[@]} target(s) failed: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz.sh: ${#targets[@]} target(s), ${seconds} s each, no finding"
