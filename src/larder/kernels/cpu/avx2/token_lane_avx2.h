// token_lane_avx2.h — the inner steps of the AVX2 token-lane prefill GEMMs, one place for every
// format. Included only by AVX2-tier translation units (internal linkage, like gemm_super_avx2.h).
//
// Layout (act_quant.h build_act8, matmul_driver.h run_gemm_sliced): per 32-block, step k4 (0..7)
// broadcasts 4 code bytes of a row against 32 activation bytes that hold 4 bytes for each of 8
// tokens, so lane t of a vpmaddubsw result sums token t's 4 products (pairs in int16). A tile's
// unpacked codes are [R][32] bytes per block, 4 per step.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "larder/kernels/cpu/common/simd_avx2.h"

namespace larder::kernels::cpu::avx2 {
namespace {

inline __m256i code_step(const uint8_t* codes, int r, int k4) {
  int32_t u4;
  std::memcpy(&u4, codes + r * 32 + 4 * k4, 4);
  return _mm256_set1_epi32(u4);
}

// Unsigned codes: p[r] = Σ over the kSteps steps from codes/act on of maddubs(u, x), an int16
// chain (a later part of a block: codes + 4·k0, act + 32·k0).
// The caller bounds kSteps so no lane can saturate: kSteps · 2 · max(u) · 127 < 2^15 (8 steps for
// u <= 15, 4 for u <= 31). Its first step initializes the chain (no add of a zero register, which
// the asm barrier below would keep).
template <int R, int kSteps>
__attribute__((always_inline)) inline void u8_chain(const uint8_t* codes, const uint8_t* act, __m256i (&p)[R]) {
  LARDER_UNROLL
  for (int k4 = 0; k4 < kSteps; ++k4) {
    const __m256i xa = _mm256_load_si256(reinterpret_cast<const __m256i*>(act + 32 * k4));
    LARDER_UNROLL
    for (int r = 0; r < R; ++r) {
      const __m256i m = _mm256_maddubs_epi16(code_step(codes, r, k4), xa);
      p[r] = k4 == 0 ? m : _mm256_add_epi16(p[r], m);
      // Keep the chain sequential: GCC reassociates integer adds into a tree, which keeps all the
      // maddubs results of a block live and spills them (seen in objdump).
      __asm__("" : "+x"(p[r]));
    }
  }
}

// Signed codes, stored as magnitudes |w| (mags) and the codes themselves for their signs: per step
// maddubs(|w|, sign(x, w)). A pair sum reaches 2·128·127, so int16 cannot carry two steps: each is
// widened by vpmaddwd with mul[r] (int16 pairs: ones, or a sub-block scale) into the int32 sum p[r]
// over the block's 8 steps (4 ops per 32 MACs, where unsigned codes take 2).
template <int R>
__attribute__((always_inline)) inline void s8_block(const uint8_t* codes, const uint8_t* mags, const uint8_t* act,
                                                    __m256i (&p)[R], const __m256i (&mul)[R]) {
  LARDER_UNROLL
  for (int k4 = 0; k4 < 8; ++k4) {
    const __m256i xa = _mm256_load_si256(reinterpret_cast<const __m256i*>(act + 32 * k4));
    LARDER_UNROLL
    for (int r = 0; r < R; ++r) {
      const __m256i m = _mm256_madd_epi16(
          _mm256_maddubs_epi16(code_step(mags, r, k4), _mm256_sign_epi8(xa, code_step(codes, r, k4))), mul[r]);
      p[r] = k4 == 0 ? m : _mm256_add_epi32(p[r], m);
      __asm__("" : "+x"(p[r]));  // sequential, as in u8_chain
    }
  }
}
template <int R>
__attribute__((always_inline)) inline void s8_block(const uint8_t* codes, const uint8_t* mags, const uint8_t* act,
                                                    __m256i (&p)[R]) {
  __m256i ones[R];
  LARDER_UNROLL
  for (int r = 0; r < R; ++r) ones[r] = _mm256_set1_epi16(1);
  s8_block<R>(codes, mags, act, p, ones);
}

}  // namespace
}  // namespace larder::kernels::cpu::avx2
