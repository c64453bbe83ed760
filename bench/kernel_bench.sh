#!/usr/bin/env bash
# Kernel benchmark campaign (bench/RESULTS.md): build kernel_bench in its own build dir and run it
# with provenance. Usage: bench/kernel_bench.sh [extra kernel_bench args]
# Shared host: run it when `uptime` load is low, and compare only numbers from one run.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${LARDER_BENCH_BUILD:-$root/build-fast}"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C "$build" -j2 kernel_bench >/dev/null
echo "commit $(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet -- src tools || echo ' (dirty)')"
echo "date $(date -u +%FT%TZ)"
echo "compiler $(g++ --version | head -1); flags -O3 -mavx2 -mfma -mf16c -mbmi2 (AVX-512 TUs: +avx512f/bw/vl/dq/vnni/bf16)"
echo "cpu $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-) | $(nproc) cpus"
echo "load $(cut -d' ' -f1-3 /proc/loadavg) | cpu pressure: $(head -1 /proc/pressure/cpu 2>/dev/null || echo n/a)"
"$build/bin/kernel_bench" "$@"
echo "load after $(cut -d' ' -f1-3 /proc/loadavg)"
