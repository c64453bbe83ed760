// quad18_avx512.h — four 18-byte GGUF blocks per AVX-512 decode step (Q4_0 and IQ4_NL: an f16
// scale and 16 code bytes each). Four blocks are 72 contiguous bytes with every field 16-bit
// aligned (block k's scale is word 9k, its code bytes words 9k+1..9k+8), so two AVX-512BW word
// permutes cut them apart without VBMI. Included only by AVX-512 translation units.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace larder::kernels::cpu::avx512 {

struct Quad18 {
  __m512i codes;  // [b0 codes | b1 | b2 | b3], 16 bytes each, nibbles as stored
  __m512 d;       // lane l: block l/4's scale
};

// The group at p: whole (tail false) or the last `left` (1..3) blocks of a row, whose missing bytes
// load as zeros (codes 0, scale 0: with zero activations they add exactly 0).
__attribute__((always_inline)) inline Quad18 load_quad18(const uint8_t* p, bool tail, int64_t left) {
  alignas(64) static constexpr uint16_t kCodeIdx[32] = {1,  2,  3,  4,  5,  6,  7,  8,  10, 11, 12, 13, 14, 15, 16, 17,
                                                        19, 20, 21, 22, 23, 24, 25, 26, 28, 29, 30, 31, 32, 33, 34, 35};
  alignas(64) static constexpr uint16_t kScaleIdx[32] = {0, 0, 0, 0, 9, 9, 9, 9, 18, 18, 18, 18, 27, 27, 27, 27};
  __m512i z0, z1;
  if (!tail) {
    z0 = _mm512_loadu_si512(p);
    z1 = _mm512_castsi128_si512(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 64)));
  } else {
    z0 = _mm512_maskz_loadu_epi8((uint64_t{1} << (18 * left)) - 1, p);
    z1 = _mm512_setzero_si512();
  }
  // GCC folds a second 64-byte load of the group into the scale permute's memory operand; the
  // empty asm pins z0 to a register, so the group is loaded once. Hot Q4_0 decode, 1 thread, Zen 4
  // (kernel_bench --hot, n = 1, 2048x8192, alternating): 339 → 312–322 µs.
  __asm__("" : "+v"(z0));
  return {_mm512_permutex2var_epi16(z0, _mm512_load_si512(kCodeIdx), z1),
          _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi16(_mm512_load_si512(kScaleIdx), z0)))};
}

}  // namespace larder::kernels::cpu::avx512
