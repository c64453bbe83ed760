#!/usr/bin/env bash
# Configures and builds larder (Release) into build/ (or $LARDER_BUILD_DIR). Extra args go to
# cmake configure. ccache is used when it is installed (several checkouts of one machine then
# share compiled objects); it is never required.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${LARDER_BUILD_DIR:-build}
scripts/build_xgrammar.sh  # a no-op once built (stamp file)
launcher=()
if command -v ccache > /dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" "$@" > /dev/null
ninja -C "$dir"
