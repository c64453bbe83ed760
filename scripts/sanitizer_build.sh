#!/usr/bin/env bash
# Configures and builds a clang tree with sanitizers (shared by scripts/sanitize.sh and
# scripts/fuzz.sh; see tests/fuzz/README.md):
#   scripts/sanitizer_build.sh DIR SANITIZERS FUZZ [TARGET...]
# e.g. `scripts/sanitizer_build.sh build-asan address,undefined ON fuzz_targets`. -O1 with line
# tables: fast enough to run the tests, stack traces with file:line. Assertions stay on.
# LARDER_SAN_JOBS sets ninja's -j (default: ninja's own); LARDER_SAN_CCACHE=0 leaves ccache out
# (changing the launcher of an existing tree rebuilds it).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$1 san=$2 fuzz=$3
shift 3
if ! command -v clang++ > /dev/null; then
  echo "sanitizer_build: clang++ not found (scripts/setup.sh installs clang and libclang-rt-14-dev)" >&2
  exit 1
fi
scripts/build_xgrammar.sh  # a no-op once built
launcher=()
if [[ "${LARDER_SAN_CCACHE:-1}" != 0 ]] && command -v ccache > /dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
cmake -S . -B "$dir" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only" \
  -DLARDER_SANITIZE="$san" -DLARDER_FUZZ="$fuzz" "${launcher[@]}" > /dev/null
jobs=()
if [[ -n "${LARDER_SAN_JOBS:-}" ]]; then jobs=(-j "$LARDER_SAN_JOBS"); fi
ninja -C "$dir" "${jobs[@]}" "$@"
