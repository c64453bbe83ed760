// peak_avx512.cpp — the compute ceilings of the instructions the AVX-512 tier's prefill kernels
// issue (zmm vpdpbusd for every integer format, zmm vdpbf16ps for BF16), measured like
// core/roofline.cpp's AVX2 probes: independent accumulator chains on every pool thread, best of
// three. Benchmarks print prefill rates against these when the AVX-512 tier is active; against
// the AVX2 probe (maddubs + madd + add per 32 MACs) a VNNI kernel would read as > 100 %.
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "larder/core/threadpool.h"
#include "larder/kernels/cpu/common/cpu_kernels.h"

namespace larder::kernels::cpu::avx512 {

namespace {

template <class Body>
double best_of_three(ThreadPool& pool, double ops_per_thread, Body body) {
  const int nt = pool.n_threads();
  std::vector<float> out(static_cast<size_t>(nt) * 16);
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.parallel_for(nt, [&](int64_t c, int) { out[static_cast<size_t>(c) * 16] = body(); });
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, ops_per_thread * nt / dt / 1e9);
  }
  volatile float sink = out[0];
  (void)sink;
  return best;
}

constexpr int64_t kIters = 4'000'000;
constexpr int kChains = 12;  // > latency (≈ 4–5 cycles) × issue width (2 per cycle)

}  // namespace

double int8_dot_peak(ThreadPool& pool) {
  return best_of_three(pool, static_cast<double>(kIters) * kChains * 64 * 2, [] {
    __m512i acc[kChains];
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_epi32(i);
    __m512i u = _mm512_set1_epi8(3), s = _mm512_set1_epi8(-2);
    for (int64_t it = 0; it < kIters; ++it) {
      __asm__ volatile("" : "+v"(u), "+v"(s));  // keeps the operands opaque (no hoisting)
      for (int i = 0; i < kChains; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], u, s);
    }
    __m512i t = acc[0];
    for (int i = 1; i < kChains; ++i) t = _mm512_add_epi32(t, acc[i]);
    alignas(64) int32_t lanes[16];
    _mm512_store_si512(lanes, t);
    return static_cast<float>(lanes[0]);
  });
}

// zmm f32 FMA (the Gated DeltaNet kernels' ceiling): 2 FLOP per lane per vfmadd.
double f32_fma_peak(ThreadPool& pool) {
  return best_of_three(pool, static_cast<double>(kIters) * kChains * 16 * 2, [] {
    __m512 acc[kChains];
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(1.0f + 1e-7f * static_cast<float>(i));
    __m512 m = _mm512_set1_ps(0.9999999f), k = _mm512_set1_ps(1e-7f);
    for (int64_t it = 0; it < kIters; ++it) {
      __asm__ volatile("" : "+v"(m), "+v"(k));
      for (int i = 0; i < kChains; ++i) acc[i] = _mm512_fmadd_ps(acc[i], m, k);
    }
    __m512 t = acc[0];
    for (int i = 1; i < kChains; ++i) t = _mm512_add_ps(t, acc[i]);
    return _mm512_cvtss_f32(t);
  });
}

// In the shape gemm16 issues it (A 16 × 32 B, B 8 × 64 B: 8192 MACs), on its two C tiles.
double amx_int8_peak(ThreadPool& pool) {
  constexpr int64_t kAmxIters = kIters / 16;
  return best_of_three(pool, static_cast<double>(kAmxIters) * 2 * 16 * 16 * 32 * 2, [] {
    amx_configure_thread(AmxTiles::kBlocks);
    alignas(64) uint8_t a[16 * 32];
    alignas(64) int8_t b[8 * 64];
    for (int i = 0; i < 16 * 32; ++i) a[i] = 3;
    for (int i = 0; i < 8 * 64; ++i) b[i] = -2;
    _tile_loadd(1, a, 32);
    _tile_loadd(2, b, 64);
    _tile_zero(0);
    _tile_zero(3);
    for (int64_t it = 0; it < kAmxIters; ++it) {
      _tile_dpbusd(0, 1, 2);
      _tile_dpbusd(3, 1, 2);
    }
    alignas(64) int32_t c[16 * 16];
    _tile_stored(0, c, 64);
    return static_cast<float>(c[0]);
  });
}

// TDPBF16PS in Bf16Amx's shape (16 × 32 bf16 by 32 × 16: 8192 multiply-adds), four C tiles.
double amx_bf16_peak(ThreadPool& pool) {
  constexpr int64_t kAmxIters = kIters / 32;
  return best_of_three(pool, static_cast<double>(kAmxIters) * 4 * 16 * 16 * 32 * 2, [] {
    amx_configure_thread(AmxTiles::kBf16);
    alignas(64) uint16_t a[16 * 32];
    for (auto& v : a) v = 0x3f80;  // 1.0
    _tile_loadd(1, a, 64);
    _tile_loadd(2, a, 64);
    _tile_zero(0);
    _tile_zero(3);
    _tile_zero(6);
    _tile_zero(7);
    for (int64_t it = 0; it < kAmxIters; ++it) {
      _tile_dpbf16ps(0, 1, 2);
      _tile_dpbf16ps(3, 1, 2);
      _tile_dpbf16ps(6, 1, 2);
      _tile_dpbf16ps(7, 1, 2);
    }
    alignas(64) float c[16 * 16];
    _tile_stored(0, c, 64);
    return c[0];
  });
}

double bf16_dot_peak(ThreadPool& pool) {
  return best_of_three(pool, static_cast<double>(kIters) * kChains * 32 * 2, [] {
    __m512 acc[kChains];
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
    __m512i a = _mm512_set1_epi16(0x3f80), b = _mm512_set1_epi16(0x3c00);  // bf16 1.0, 2^-7
    for (int64_t it = 0; it < kIters; ++it) {
      __asm__ volatile("" : "+v"(a), "+v"(b));
      for (int i = 0; i < kChains; ++i) {
        acc[i] = _mm512_dpbf16_ps(acc[i], reinterpret_cast<__m512bh&>(a), reinterpret_cast<__m512bh&>(b));
      }
    }
    __m512 t = acc[0];
    for (int i = 1; i < kChains; ++i) t = _mm512_add_ps(t, acc[i]);
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, t);
    return lanes[0];
  });
}

}  // namespace larder::kernels::cpu::avx512
