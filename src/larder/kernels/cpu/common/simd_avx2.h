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

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
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
// DRAM reads ahead of them. Two regimes, by the tile's size (a kernel picks one per tile, outside
// its loop: tile<R, T> dispatches to tile_rows<R, T, kLong>; with the choice made inside the step
// the short-row loops ran 20 % slower on Zen 4):
// - Short rows (R·row_bytes <= 8 KiB; Q4_0 at 2048 columns is 1152 B, 18 cache lines): each
//   stream ends before the hardware stream prefetcher has ramped up, so a tile prefetches the tile
//   two ahead (the rows after ours are contiguous) at the rate it consumes its own bytes, in one
//   linear sweep. Measured on 2048×2048 Q4_0, 1 thread, weights rotated through 128 MiB: 790 →
//   330 µs of CPU time per call (one tile ahead: 490 µs; four: no better than two; per-row
//   prefetches instead of the sweep: 2.5× slower).
// - Long rows (the down projection: 4608 B per Q4_0 row at 8192 columns): two tiles ahead is 36 KiB,
//   past L1, and the down projection streamed at 12–13 GB/s against 28 GB/s for gate/up (1 thread,
//   same bytes, session 15; a sweep 4–16 KiB ahead was no better). Instead each row's stream is
//   prefetched 1 KiB ahead of where the tile reads it, continuing at the same offset in the next
//   tile's row past the end: down 2048×8192 Q4_0 740–900 → 600–650 µs (1 thread, Zen 4,
//   alternating runs; 512–3072 B tried, 1 KiB best).
// `done` and `step` count bytes per row: consumed before this step, and consumed by it.
inline bool long_rows(int R, uint64_t row_bytes) { return static_cast<uint64_t>(R) * row_bytes > 8192; }

template <bool kLong>
__attribute__((always_inline)) inline void prefetch_rows(const uint8_t* tile, int R, uint64_t row_bytes, uint64_t done,
                                                         uint64_t step) {
  const uint64_t tile_bytes = static_cast<uint64_t>(R) * row_bytes;
  if constexpr (!kLong) {
    const uint8_t* p = tile + 2 * tile_bytes + done * R;
    for (uint64_t off = 0; off < step * R; off += 64) _mm_prefetch(reinterpret_cast<const char*>(p + off), _MM_HINT_T0);
  } else {
    const uint64_t q = done + 1024;
    const uint8_t* p = tile + q + (q >= row_bytes ? tile_bytes - row_bytes : 0);
    for (int r = 0; r < R; ++r)
      for (uint64_t off = 0; off < step; off += 64)
        _mm_prefetch(reinterpret_cast<const char*>(p + r * row_bytes + off), _MM_HINT_T0);
  }
}

// The short-row sweep with whole-tile byte counts (the float kernels, whose rows are long at any
// width but were measured with it; and kernels not yet moved to prefetch_rows).
__attribute__((always_inline)) inline void prefetch_ahead(const uint8_t* tile, uint64_t tile_bytes, uint64_t consumed,
                                                          int step_bytes) {
  const uint8_t* p = tile + 2 * tile_bytes + consumed;
  for (int off = 0; off < step_bytes; off += 64) _mm_prefetch(reinterpret_cast<const char*>(p + off), _MM_HINT_T0);
}

}  // namespace larder::kernels::cpu::simd
