#!/usr/bin/env bash
# Decode against llama.cpp and the read bandwidth, every number of the issue-14 decode table
# (bench/RESULTS.md "Decode vs llama.cpp on Zen 4") from a clean checkout:
#
#   bench/decode_vs_llamacpp.sh [--step kernels|idle|busy|real|profile|all] [--rounds 3] [--out DIR]
#
#   kernels  tools/kernel_bench at n = 1, Q4_0/Q8_0/Q4_K/Q6_K, tiers avx2 and avx512, 1 and 2 threads,
#            the 1B layer shapes, against the read probe measured in the same process
#   idle     llama1b Q4_0 tg128, larder bench vs llama-bench alternating, 2 and 1 threads
#   busy     the same at 2 threads with one busy-loop process running through every run
#   real     SmolLM2-135M-Instruct Q4_1 and gemma-3-270m Q4_K_M (.cache/models), pp512 + tg128, 2 threads
#   profile  larder bench --profile (per-op decode timeline) on the three models, 2 threads
#
# Each step is one `flock -x /work/notes/cpu.lock` hold when that lock file exists (the shared
# 2-core development host: builds take it shared, timings exclusive); `uptime` is printed with every step.
# Build first: LARDER_BUILD_DIR=build ./scripts/build.sh (the llama.cpp tools come from
# bench/llamacpp_compare.sh --build-only; the 1B models from bench/make_models.py, both cached).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
BUILD="${LARDER_BUILD_DIR:-build}"
STEP=all
ROUNDS=3
OUT="${HOME}/.cache/larder-bench/runs/decode-$(date -u +%Y%m%dT%H%M%SZ)"
while [ $# -gt 0 ]; do
  case "$1" in
    --step) STEP="$2"; shift ;;
    --rounds) ROUNDS="$2"; shift ;;
    --out) OUT="$2"; shift ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$OUT"
LOCK=/work/notes/cpu.lock
locked() { if [ -e "$LOCK" ]; then flock -x "$LOCK" "$@"; else "$@"; fi; }
MODELS_DIR="$REPO/.cache/models"
Q4_0="$HOME/.cache/larder-bench/models/llama1b/llama1b-Q4_0.gguf"
CMP=("$HERE/llamacpp_compare.sh" --larder "$REPO/$BUILD/bin/larder" --nice 0 --rounds "$ROUNDS")

run_step() {
  local s="$1"
  echo "== step $s  $(date -u +%H:%M:%S)  $(uptime)" | tee -a "$OUT/steps.log"
  case "$s" in
    kernels)
      locked "$REPO/$BUILD/bin/kernel_bench" --formats Q4_0,Q8_0,Q4_K,Q6_K --tiers avx2,avx512 --threads 1,2 \
        --no-prefill --no-attention --reps 9 --decode-n 1 --shapes 2048x2048,8192x2048,2048x8192 | tee "$OUT/kernels.txt" ;;
    idle)
      locked "${CMP[@]}" --models llama1b --cases gguf-Q4_0 --threads "2 1" -p 0 -n 128 --out "$OUT/idle" ;;
    busy)
      locked "${CMP[@]}" --models llama1b --cases gguf-Q4_0 --threads 2 -p 0 -n 128 --busy 1 --out "$OUT/busy" ;;
    real)
      locked "${CMP[@]}" --models "$MODELS_DIR/SmolLM2-135M-Instruct.Q4_1.gguf $MODELS_DIR/gemma-3-270m-q4_k_m.gguf" \
        --threads 2 -p 512 -n 128 --out "$OUT/real" ;;
    profile)
      for m in "$Q4_0" "$MODELS_DIR/SmolLM2-135M-Instruct.Q4_1.gguf" "$MODELS_DIR/gemma-3-270m-q4_k_m.gguf"; do
        locked "$REPO/$BUILD/bin/larder" bench "$m" -p 0 -n 128 -t 2 -r 1 --profile | tee -a "$OUT/profile.txt"
      done ;;
    *) echo "unknown step $s" >&2; exit 2 ;;
  esac
}

if [ "$STEP" = all ]; then
  for s in kernels idle busy real profile; do run_step "$s"; done
else
  run_step "$STEP"
fi
echo "results in $OUT"
