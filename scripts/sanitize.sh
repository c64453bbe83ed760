#!/usr/bin/env bash
# Sanitizer jobs (tests/fuzz/README.md, "Sanitizer builds"):
#   asan  build-asan/ (clang, AddressSanitizer + UndefinedBehaviorSanitizer, UB findings fatal):
#         the unit tests of the parsing and serving layers and the fast server tests against the
#         instrumented binary;
#   tsan  build-tsan/ (clang, ThreadSanitizer): the server's concurrency tests (queueing, 429,
#         disconnects, shutdown under load, slow clients and pipelining on the transport).
#   scripts/sanitize.sh [asan|tsan|all]     (default all)
# Which tests run, and why only these: tests/fuzz/README.md. The kernel, model, quantization and
# runtime tests are left out: numerics over large buffers and Python reference fixtures that take
# minutes even uninstrumented; the server tests and fuzz_http still run the forward pass.
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:detect_stack_use_after_return=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/tests/fuzz/lsan.supp}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/fuzz/tsan.supp}

# GoogleTest binaries run under ASan+UBSan (tests/unit/<layer>/), and the reference fixtures they need.
ASAN_UNIT=(core/core_tests formats/formats_tests chat_template/chat_template_tests tokenizer/tokenizer_tests
           memory/memory_tests runtime/grammar_tests server/server_unit_tests)
ASAN_FIXTURES='^fixture_(chat_template|tokenizer)_golden$'
# Server tests (Python, a live server on loopback) against the ASan binary: CTest gives them the
# tree's own larder (LARDER_BIN).
ASAN_SERVER='^(server_tests|server_robustness|chat_template_flag_tests)$'
# Concurrency tests against the TSan binary (unittest names in tests/server).
TSAN_SERVER=(server_test.QueueFullTest server_test.QueueAndDisconnectTest server_test.ShutdownTest
             robustness_test.TransportTest ops_test.QueueMaxZeroTest)

run_asan() {
  local t0=$SECONDS
  scripts/sanitizer_build.sh build-asan address,undefined ON larder_cli "${ASAN_UNIT[@]##*/}"
  echo "sanitize: asan build $((SECONDS - t0)) s"
  t0=$SECONDS
  (cd build-asan && ctest --output-on-failure -R "$ASAN_FIXTURES")
  for t in "${ASAN_UNIT[@]}"; do
    echo "== $t"
    build-asan/tests/unit/$t --gtest_brief=1
  done
  echo "sanitize: asan unit tests $((SECONDS - t0)) s"
  t0=$SECONDS
  (cd build-asan && ctest --output-on-failure -j2 --timeout 900 -R "$ASAN_SERVER")
  echo "sanitize: asan server tests $((SECONDS - t0)) s"
}

run_tsan() {
  local t0=$SECONDS
  scripts/sanitizer_build.sh build-tsan thread OFF larder_cli
  echo "sanitize: tsan build $((SECONDS - t0)) s"
  t0=$SECONDS
  local data
  data=$(mktemp -d "${TMPDIR:-/tmp}/larder-tsan-XXXXXX")
  (cd tests/server && LARDER_BIN="$PWD/../../build-tsan/bin/larder" LARDER_SOURCE_DIR="$PWD/../.." \
     LARDER_SHARED_DIR="${LARDER_SHARED_DIR:-$PWD/../../../shared}" LARDER_TEST_DATA_DIR="$data" \
     timeout 1200 ../../.venv/bin/python -m unittest -v "${TSAN_SERVER[@]}")
  rm -rf "$data"
  echo "sanitize: tsan tests $((SECONDS - t0)) s"
}

case $what in
  asan) run_asan ;;
  tsan) run_tsan ;;
  all) run_asan; run_tsan ;;
  *) echo "usage: scripts/sanitize.sh [asan|tsan|all]" >&2; exit 2 ;;
esac
