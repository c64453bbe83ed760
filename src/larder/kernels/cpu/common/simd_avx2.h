// simd_avx2.h — small AVX2/FMA/F16C helpers shared by the CPU kernels (header-only, inlined into
// each tier's translation unit; the AVX-512 tier may use them too since it implies AVX2).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

// Fully unroll the tiny constant loops over tile rows/tokens *early*: GCC's scalar replacement of
// the accumulator arrays (acc[R][T]) runs before its late unroller, and without this it keeps the
// arrays in memory and stores every accumulator to the stack once per block (seen in objdump).
#define LARDER_UNROLL _Pragma("GCC unroll 16")

namespace larder::kernels::cpu::simd {

// f16 → f32 for all 65536 codes (256 KiB, built once). Block scales go through it: a scalar load +
// vbroadcastss costs no vector ALU op, where vpbroadcastw + vcvtph2ps costs 3 per block, and the
// few hundred distinct scales a real checkpoint uses stay L1/L2-resident.
const float* f16_table();

// Lanes [0, k) set (a mask for the ragged tail of a row).
inline __m256i first_lanes(int k) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// A decode tile's R×T accumulators (row r, token t): zeroed at its start, and at its end each
// one's lane sum stored to y[t0 + t][r0 + r] (y is [tokens][rows]).
template <int R, int T>
__attribute__((always_inline)) inline void zero_acc(__m256 (&acc)[R][T]) {
  LARDER_UNROLL
  for (int r = 0; r < R; ++r)
    LARDER_UNROLL
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
}
template <int R, int T>
__attribute__((always_inline)) inline void store_acc(const __m256 (&acc)[R][T], float* y, int64_t rows, int64_t r0,
                                                     int64_t t0) {
  LARDER_UNROLL
  for (int t = 0; t < T; ++t)
    LARDER_UNROLL
    for (int r = 0; r < R; ++r) y[(t0 + t) * rows + r0 + r] = hsum(acc[r][t]);
}

inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// f16 → f32 broadcast into all 4 lanes (F16C; one scale per GGUF block).
inline __m128 f16_bcast4(const uint8_t* p) {
  return _mm_cvtph_ps(_mm_set1_epi16(static_cast<short>(load_u16(p))));
}

inline float f16_scalar(const uint8_t* p) { return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(load_u16(p)))); }

// 8 bf16 → 8 f32: bf16 is the top half of an f32, so widen to 32 bits and shift left by 16.
inline __m256 bf16x8_to_f32(const uint8_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

inline __m256 f16x8_to_f32(const uint8_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Decode tiles read R consecutive rows as R interleaved streams, and software prefetch keeps the
// DRAM reads ahead of them. Two regimes, by the tile's size (chosen once per tile, outside the
// kernel's loop: matmul_driver.h run_tile calls its tile_rows<R, T, kPf>; with the choice made
// inside the step the short-row loops ran 20 % slower on Zen 4):
// - Short rows (R·row_bytes <= 8 KiB; Q4_0 at 2048 columns is 1152 B, 18 cache lines): each
//   stream ends before the hardware stream prefetcher has ramped up, so a tile prefetches the tile
//   four ahead (the rows after ours are contiguous) at the rate it consumes its own bytes, in one
//   linear sweep. Measured on 2048×2048 Q4_0, 1 thread, weights rotated through 128 MiB: 790 →
//   330 µs of CPU time per call with two tiles ahead into L1 (one ahead: 490 µs; per-row
//   prefetches instead of the sweep: 2.5× slower).
// - Long rows (the down projection: 4608 B per Q4_0 row at 8192 columns): two tiles ahead is 36 KiB,
//   past L1, and the down projection streamed at 12–13 GB/s against 28 GB/s for gate/up (1 thread,
//   same bytes, session 15). Instead each row's stream is prefetched 6 KiB ahead of where the tile
//   reads it, continuing in the next tile's rows past the end (for rows shorter than 6 KiB that
//   is, in effect, one contiguous sweep tile_bytes − row_bytes + 6 KiB ahead).
// Where to: into L1 (prefetcht0) on cores whose L1D holds 48 KiB or more, else into L2
// (prefetcht1) — the policy's kPfL1 bit, from cpu_features().decode_prefetch_l1.
// - L1, Zen 5 (48 KiB L1D; session 28, 1B decode at 2 threads, idle host, alternating builds, the
//   same distances): Q4_0 122–126 → 133–135 tok/s (82 → 89–90 % of the read probe beside each
//   run), IQ4_XS +5–8 %, Q5_K_M +1–5 %, Q4_K_M +0–3 %, Q8_0 +2–4 %, MLX q4 +0–2 %, BF16 +1 %.
//   The demand loads then hit L1 instead of waiting on the L2→L1 fill; 4 tiles of 2 rows are
//   ~9 KiB, which 48 KiB holds beside the activations.
// - L2 elsewhere. On Zen 4 (32 KiB L1D) the distance into L1 could not grow past ~1 KiB per
//   stream without evicting the activations the tile reuses (and with it the down projection
//   stayed at 12 GB/s); into L2 it can, and the L1 streamer pulls from there. Zen 4,
// session 17, alternating runs: Q6_K 2048×8192 n = 1, 1 thread 1030–1080 → 660–680 µs (L1 1 KiB:
// 1060; L2 3/4/8/12 KiB: 810/790/720/680), 8192×2048 640–660 → 580–600 µs (L2, four tiles ahead;
// three: 640); 1B decode tg64, 2 threads, medians: Q6_K 35.7 → 43.3 tok/s, Q4_K_M 40.7 → 49.4,
// Q5_K_M 40.1 → 47.8, Q3_K_M 44.9 → 56.7, Q8_0 21.8 → 24.3; Q4_0, MLX q4, IQ4_XS and the AVX2
// tier (Q4_0) unchanged within the host's noise.
// Why every line, and why prefetch instructions (Zen 4, session 34, bench/RESULTS.md: 1B Q4_0 decode
// at 2 threads with test builds of the tile): the hardware prefetchers keep only one linear stream
// per core near the idle read probe, and only while its demand loads come densely — pure loads
// 78–90 %, BF16's one weight and one activation load per 64 bytes 88 % — so with no software
// prefetch a one-row tile doing the Q4_0 step's arithmetic read ~40 % and a two-row tile ~43 %
// with no arithmetic at all. Prefetching every other line read 41 % (the neighbour line does not
// come with it), and loads in place of the prefetches 30–34 % (each miss holds retirement).
// `done` and `step` count bytes per row: consumed before this step, and consumed by it.
inline bool long_rows(int R, uint64_t row_bytes) { return static_cast<uint64_t>(R) * row_bytes > 8192; }

// A tile's prefetch policy (the kPf template argument of tile_rows and prefetch_rows): bit kPfLong
// selects the long-row regime, bit kPfL1 prefetches into L1 instead of L2.
enum : int { kPfLong = 1, kPfL1 = 2 };
constexpr bool pf_long(int pf) { return (pf & kPfLong) != 0; }

template <int kPf>
__attribute__((always_inline)) inline void prefetch_rows(const uint8_t* tile, int R, uint64_t row_bytes, uint64_t done,
                                                         uint64_t step) {
  constexpr auto kHint = (kPf & kPfL1) ? _MM_HINT_T0 : _MM_HINT_T1;
  const uint64_t tile_bytes = static_cast<uint64_t>(R) * row_bytes;
  if constexpr (!pf_long(kPf)) {
    const uint8_t* p = tile + 4 * tile_bytes + done * R;
    for (uint64_t off = 0; off < step * R; off += 64) _mm_prefetch(reinterpret_cast<const char*>(p + off), kHint);
  } else {
    const uint64_t q = done + 6144;
    const uint8_t* p = tile + q + (q >= row_bytes ? tile_bytes - row_bytes : 0);
    for (int r = 0; r < R; ++r)
      for (uint64_t off = 0; off < step; off += 64)
        _mm_prefetch(reinterpret_cast<const char*>(p + r * row_bytes + off), kHint);
  }
}


}  // namespace larder::kernels::cpu::simd
