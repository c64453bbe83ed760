// simd_transpose_avx512.h — the 16×16 transpose of 32-bit elements in zmm registers, for the
// AVX-512 kernels that turn rows into lanes (the BF16 GEMM's token-lane activations, the
// attention's transposed K block). Included only by AVX-512 translation units.
#pragma once

#include <immintrin.h>

namespace larder::kernels::cpu::avx512 {

// Lane j of r[i] → lane i of r[j]: 64 shuffles (unpack 32-bit, unpack 64-bit, two 128-bit lane
// shuffles).
inline __attribute__((always_inline)) void transpose16x16(__m512i (&r)[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  // Per 128-bit lane L: r[4b + c] = column 4L + c of rows 4b..4b+3.
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i u0 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x44), u1 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xEE);
    const __m512i v0 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x44), v1 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xEE);
    t[c] = _mm512_shuffle_i32x4(u0, v0, 0x88);
    t[4 + c] = _mm512_shuffle_i32x4(u0, v0, 0xDD);
    t[8 + c] = _mm512_shuffle_i32x4(u1, v1, 0x88);
    t[12 + c] = _mm512_shuffle_i32x4(u1, v1, 0xDD);
  }
  for (int i = 0; i < 16; ++i) r[i] = t[i];
}

}  // namespace larder::kernels::cpu::avx512
