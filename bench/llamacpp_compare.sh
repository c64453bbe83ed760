#!/usr/bin/env bash
# larder vs llama.cpp, side by side in one run (issue 3, deliverable 4).
#
#   bench/llamacpp_compare.sh [--build-only] [--server] [--models-only] [--rounds R] [--threads "1 2"] [--models "llama1b"]
#                             [--cases "gguf-Q4_0 mlx-q4g64 gguf-Q8_0 mlx-q8g64 bf16"] [--larder BIN] [--out DIR]
#                             [--nice N (default 10; 0 = not niced)] [--wait-load L] [-p 512] [-n 128]
#                             [--busy N] [--profile] [-d DEPTH] [--lock FILE] [--gate FILE] [--isa avx2]
#
#   --server    also build llama-server (bench/concurrency_bench.py's peer; with --build-only: just that)
#   --busy N    keep N busy-loop processes running during every engine run (a core taken by
#               another process; both engines under the same load)
#   --isa avx2  both engines on their AVX2 code only — the side by side of an AVX2-only CPU (Zen 3)
#               run on this one: llama.cpp built for AVX2/FMA/F16C/BMI2 without AVX-512 or
#               AVX-VNNI (GGML_NATIVE=OFF, in build-avx2/), larder under LARDER_ISA=avx2
#   --profile   larder bench --profile: its per-op decode timeline lands in raw.jsonl
#   -p 0        decode only (llama-bench -p 0; larder bench -p 0 skips pp); -n 0 prefill only
#   --models    also .gguf paths (real models): that file in both engines
#   -d DEPTH    both engines' tests after DEPTH tokens of context (llama-bench -d), default KV (f16)
#   --lock F / --gate F   flock -x F around each engine run, holding the gate while waiting, e.g.
#               --cases gguf-Q4_0 --threads 2 -p 0 -n 32 -d 4096 --lock /work/notes/cpu.lock --gate /work/notes/cpu.gate
#
# 1. Test models: bench/make_models.py (random-weight Llama-shaped checkpoints, cached under
#    ~/.cache/larder-bench/models; skipped when already there).
# 2. llama.cpp: the source distribution of the PyPI package llama-cpp-python bundles llama.cpp under
#    vendor/llama.cpp. `pip download llama-cpp-python --no-binary :all: --no-deps`, unpack, build only
#    the llama-bench target (Release, GGML_NATIVE=ON = llama.cpp's default, static, no server/examples/
#    tests/curl/openssl) into ~/.cache/larder-bench/llama.cpp-<version>; reused when present.
#    LLAMA_CPP_PYTHON_VERSION=0.3.36 pins the version (default: the newest pip finds, then whatever is
#    cached).
# 3. bench/llamacpp_compare.py runs `larder bench MODEL -p 512 -n 128 -t T -r 1 --json` and
#    `llama-bench -m GGUF -p 512 -n 128 -t T -r 1 -o json` alternately (larder, llama.cpp, larder, ...),
#    for R rounds (default 3), every case x thread count in each round, and prints medians, spread
#    (min..max over rounds) and larder/llama.cpp ratios; raw JSON lines go to --out.
#
# Cases (larder weights vs llama.cpp weights; all the same random bf16 weights):
#   gguf-Q4_0  the same Q4_0 GGUF file in both          gguf-Q8_0  the same Q8_0 GGUF file in both
#   mlx-q4g64  larder MLX affine 4-bit g64 vs llama.cpp Q4_0 (both 4.5 bits/weight)
#   mlx-q8g64  larder MLX affine 8-bit g64 vs llama.cpp Q8_0 (both 8.5 bits/weight)
#   bf16       larder HF bf16 safetensors vs llama.cpp BF16 GGUF
#   gguf-Q4_K_M the same Q4_K_M GGUF in both (made by llama.cpp's llama-quantize from the BF16 GGUF);
#               likewise gguf-Q4_1 gguf-Q5_0 gguf-Q5_1 gguf-Q2_K gguf-Q3_K_M gguf-Q5_K_M gguf-Q6_K
#               gguf-IQ4_NL gguf-IQ4_XS gguf-F16. `--cases formats` = all GGUF types + mlx-q4g64 + bf16 (issue 12's
#               per-format table in one command); --models-only makes the files and stops.
# Heavy steps run under `nice -n 10` (shared machine). Check `uptime` first: the host is noisy.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
CACHE="${LARDER_BENCH_CACHE:-$HOME/.cache/larder-bench}"
PY="${PYTHON:-$REPO/.venv/bin/python}"
PIP="${PIP:-$REPO/.venv/bin/pip}"
LARDER="${LARDER:-$REPO/build/bin/larder}"
ROUNDS=3
THREADS="1 2"
MODELS="llama1b"
CASES="gguf-Q4_0 mlx-q4g64 gguf-Q8_0 mlx-q8g64 bf16"
# --cases formats: every GGUF type side by side (issue 12) plus the MLX 4-bit and bf16 cases
FORMAT_CASES="gguf-Q4_0 gguf-Q4_1 gguf-Q5_0 gguf-Q5_1 gguf-Q8_0 gguf-Q2_K gguf-Q3_K_M gguf-Q4_K_M gguf-Q5_K_M gguf-Q6_K gguf-IQ4_NL gguf-IQ4_XS gguf-F16 mlx-q4g64 bf16"
OUT=""
NICE="${NICE:-10}"
WAIT_LOAD=0
BUILD_ONLY=0
SERVER=0
MODELS_ONLY=0
EXTRA=()

while [ $# -gt 0 ]; do
  case "$1" in
    --build-only) BUILD_ONLY=1 ;;
    --server) SERVER=1 ;;
    --models-only) MODELS_ONLY=1 ;;
    --cases) CASES="$2"; [ "$CASES" = formats ] && CASES="$FORMAT_CASES"; shift ;;
    --rounds) ROUNDS="$2"; shift ;;
    --threads) THREADS="$2"; shift ;;
    --models) MODELS="$2"; shift ;;
    --larder) LARDER="$2"; shift ;;
    --out) OUT="$2"; shift ;;
    --nice) NICE="$2"; shift ;;
    --wait-load) WAIT_LOAD="$2"; shift ;;
    -p|-n|--busy|-d|--lock|--gate) EXTRA+=("$1" "$2"); shift ;;
    --profile) EXTRA+=("$1") ;;
    --isa) ISA="$2"; shift ;;
    -h|--help) sed -n '2,42p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
  shift
done

log() { echo "[llamacpp_compare $(date -u +%H:%M:%S)] $*" >&2; }

# ---------------------------------------------------------------------------------------------
# llama.cpp from the llama-cpp-python sdist
mkdir -p "$CACHE/dl"
SDIST=""
if [ -n "${LLAMA_CPP_PYTHON_VERSION:-}" ]; then
  SDIST="$(ls "$CACHE"/dl/llama_cpp_python-"$LLAMA_CPP_PYTHON_VERSION".tar.gz 2>/dev/null || true)"
  [ -n "$SDIST" ] || "$PIP" download "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" --no-binary :all: --no-deps -d "$CACHE/dl" >&2
  SDIST="$CACHE/dl/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz"
else
  if ! ls "$CACHE"/dl/llama_cpp_python-*.tar.gz >/dev/null 2>&1; then
    log "downloading the llama-cpp-python source distribution"
    "$PIP" download llama-cpp-python --no-binary :all: --no-deps -d "$CACHE/dl" >&2
  fi
  SDIST="$(ls -v "$CACHE"/dl/llama_cpp_python-*.tar.gz | tail -1)"
fi
VER="$(basename "$SDIST" .tar.gz)"; VER="${VER#llama_cpp_python-}"
LCPP="$CACHE/llama.cpp-$VER"
# the llama.cpp commit the sdist vendors: first "update llama.cpp to ggml-org/llama.cpp@<sha>" in its CHANGELOG
LCPP_COMMIT="$(tar xzOf "$SDIST" "llama_cpp_python-$VER/CHANGELOG.md" 2>/dev/null \
  | grep -m1 -o 'llama.cpp@[0-9a-f]*' | cut -d@ -f2 || true)"
LCPP_COMMIT="${LCPP_COMMIT:-unknown}"
BUILD="$LCPP/build"
ISA_FLAGS=(-DGGML_NATIVE=ON)
case "${ISA:-native}" in
  native) ;;
  avx2)
    BUILD="$LCPP/build-avx2"
    ISA_FLAGS=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
               -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF
               -DGGML_AVX_VNNI=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
    export LARDER_ISA=avx2  # larder bench's kernels: the AVX2 tier (core/cpuid.cpp)
    ;;
  *) echo "--isa: native or avx2, not '$ISA'" >&2; exit 2 ;;
esac
BENCH_BIN="$BUILD/bin/llama-bench"
if [ ! -x "$BENCH_BIN" ]; then
  if [ ! -f "$LCPP/src/CMakeLists.txt" ]; then
    log "unpacking llama.cpp from $SDIST"
    rm -rf "$LCPP/src" "$LCPP/unpack"; mkdir -p "$LCPP/unpack"
    tar xzf "$SDIST" -C "$LCPP/unpack" "llama_cpp_python-$VER/vendor/llama.cpp"
    mv "$LCPP/unpack/llama_cpp_python-$VER/vendor/llama.cpp" "$LCPP/src"
    rm -rf "$LCPP/unpack"
  fi
  # On CPUs with AMX, GGML_NATIVE compiles ggml's AMX matmul in, and the one this sdist vendors
  # dies with SIGILL at its first tile instruction (tilezero in ggml_backend_amx_mul_mat: its tile
  # config is built on the stack and the compiler drops it, so the tiles are never configured;
  # upstream llama.cpp PR 26954). The peer on such a CPU is therefore llama.cpp's AVX-512 build:
  # -mno-amx-* wins over -march=native's defaults (GCC lets explicit -m options override -march).
  NO_AMX=()
  if [ "${ISA:-native}" = native ] && grep -qw amx_tile /proc/cpuinfo; then
    NO_AMX=(-DCMAKE_C_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" -DCMAKE_CXX_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16")
    log "this CPU has AMX: building llama.cpp without it (its AMX path crashes in this version)"
  fi
  log "building llama-bench (llama-cpp-python $VER) in $BUILD"
  nice -n 10 cmake -S "$LCPP/src" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release "${NO_AMX[@]}" \
    -DBUILD_SHARED_LIBS=OFF "${ISA_FLAGS[@]}" -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_COMMIT="$LCPP_COMMIT" >"$BUILD.configure.log" 2>&1 \
    || { tail -30 "$BUILD.configure.log" >&2; exit 1; }
  nice -n 10 cmake --build "$BUILD" -j2 --target llama-bench >"$BUILD.log" 2>&1 \
    || { tail -30 "$BUILD.log" >&2; exit 1; }
fi
log "llama-bench: $BENCH_BIN (llama-cpp-python $VER, llama.cpp $LCPP_COMMIT, ISA ${ISA:-native})"
# llama-server for bench/concurrency_bench.py: the same build, its server target switched on.
if [ "$SERVER" = 1 ] && [ ! -x "$BUILD/bin/llama-server" ]; then
  log "building llama-server in $BUILD"
  nice -n 10 cmake "$BUILD" -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON >>"$LCPP/configure.log" 2>&1 \
    || { tail -30 "$LCPP/configure.log" >&2; exit 1; }
  nice -n 10 cmake --build "$BUILD" -j2 --target llama-server >"$LCPP/build-server.log" 2>&1 \
    || { tail -30 "$LCPP/build-server.log" >&2; exit 1; }
fi
[ "$SERVER" = 1 ] && log "llama-server: $BUILD/bin/llama-server"
[ "$BUILD_ONLY" = 1 ] && exit 0

# ---------------------------------------------------------------------------------------------
# models, then the alternating run
log "models (bench/make_models.py; cached)"
SYNTH=""
for m in $MODELS; do [[ "$m" == *.gguf ]] || SYNTH="$SYNTH $m"; done
SYNTH="${SYNTH# }"
[ -z "$SYNTH" ] || nice -n 10 "$PY" "$HERE/make_models.py" --models "${SYNTH// /,}" >&2

# The llama-quantize cases (every gguf-* case but Q4_0/Q8_0/BF16, which make_models.py writes with
# gguf-py): llama.cpp's own llama-quantize (built from the same source) turns the BF16 GGUF into the
# type or mix people download; cached beside the other formats.
QUANT_TYPES=""
for c in $CASES; do
  case "$c" in
    gguf-Q4_0|gguf-Q8_0|gguf-BF16) ;;
    gguf-*) QUANT_TYPES="$QUANT_TYPES ${c#gguf-}" ;;
  esac
done
if [ -n "$QUANT_TYPES" ]; then
  QUANT_BIN="$BUILD/bin/llama-quantize"
  if [ ! -x "$QUANT_BIN" ]; then
    log "building llama-quantize"
    nice -n 10 cmake --build "$BUILD" -j2 --target llama-quantize >"$LCPP/build-quantize.log" 2>&1 \
      || { tail -30 "$LCPP/build-quantize.log" >&2; exit 1; }
  fi
  for m in $SYNTH; do
    dir="$HOME/.cache/larder-bench/models/$m"  # make_models.py's and llamacpp_compare.py's default root
    for q in $QUANT_TYPES; do
      [ -f "$dir/$m-$q.gguf" ] && continue
      log "llama-quantize $m BF16 -> $q"
      nice -n 10 "$QUANT_BIN" "$dir/$m-BF16.gguf" "$dir/$m-$q.gguf.partial" "$q" 2 >"$dir/quantize-$q.log" 2>&1 \
        || { tail -20 "$dir/quantize-$q.log" >&2; exit 1; }
      mv "$dir/$m-$q.gguf.partial" "$dir/$m-$q.gguf"
    done
  done
fi
[ "$MODELS_ONLY" = 1 ] && exit 0

[ -n "$OUT" ] || OUT="$CACHE/runs/$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$OUT"
exec "$PY" "$HERE/llamacpp_compare.py" --larder "$LARDER" --llama-bench "$BENCH_BIN" \
  --llama-cpp-version "$VER, llama.cpp $LCPP_COMMIT" --rounds "$ROUNDS" --threads "$THREADS" --models "$MODELS" --cases "$CASES" \
  --out "$OUT" --nice "$NICE" --wait-load "$WAIT_LOAD" ${EXTRA[@]+"${EXTRA[@]}"}
