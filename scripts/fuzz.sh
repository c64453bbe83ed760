#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz (clang, -fsanitize=fuzzer,address,undefined) into
# build-asan/ and runs each for SECONDS_PER_TARGET (default 20) over its committed seed corpus
# (tests/fuzz/corpus/<target>/, which also holds the reproducers of every crash found so far:
# they are replayed first). Fails on any crash, sanitizer report, leak, timeout or out-of-memory;
# the reproducer is left in $LARDER_FUZZ_ARTIFACTS (default build-asan/fuzz-artifacts/).
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]     e.g. scripts/fuzz.sh 60 http api
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-20}
shift || true
dir=${LARDER_ASAN_BUILD_DIR:-build-asan}
all=(http api gguf safetensors chat_template tokenizer lkv grammar output)
targets=("${@:-${all[@]}}")
# Longest input per target: a little over the largest seed. Grammar text stays small: its
# compile time grows with its size (the compile's own limits are the grammar code's business).
declare -A max_len=([http]=16384 [api]=16384 [gguf]=16384 [safetensors]=8192 [chat_template]=16384
                    [tokenizer]=4096 [lkv]=49152 [grammar]=2048 [output]=4096)
scripts/sanitizer_build.sh "$dir" address,undefined ON "${targets[@]/#/fuzz_}"
artifacts=${LARDER_FUZZ_ARTIFACTS:-$dir/fuzz-artifacts}
mkdir -p "$artifacts"
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/tests/fuzz/lsan.supp}
failed=()
for t in "${targets[@]}"; do
  work=$(mktemp -d "${TMPDIR:-/tmp}/larder-fuzz-$t-XXXXXX")  # new inputs go here, not into the repo
  mkdir "$work/new" "$work/tmp"
  echo "== fuzz_$t: ${secs}s over tests/fuzz/corpus/$t ($(ls tests/fuzz/corpus/$t | wc -l) seeds)"
  # TMPDIR: the scratch files the targets write (fuzz_util.h) go away with the work folder.
  if ! TMPDIR="$work/tmp" "$dir/fuzz/fuzz_$t" -max_total_time="$secs" -max_len="${max_len[$t]}" -rss_limit_mb=2560 -timeout=30 \
      -print_final_stats=1 -artifact_prefix="$artifacts/$t-" "$work/new" "tests/fuzz/corpus/$t" \
      > "$artifacts/$t.log" 2>&1; then
    failed+=("$t")
    grep -a -v "^larder: " "$artifacts/$t.log" | tail -n 60
  else
    grep -a -E "^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)|DONE " "$artifacts/$t.log" | tail -n 4
  fi
  rm -rf "$work"
done
if ((${#failed[@]})); then
  echo "fuzz: FAILED: ${failed[*]} (logs and reproducers in $artifacts)" >&2
  exit 1
fi
echo "fuzz: ${#targets[@]} targets, ${secs}s each, no findings"
