// gguf_unpack.h — the GGUF formats Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q5_K, IQ4_XS reduced to
// one shape: signed byte weights with a scale and a bias per 16-element half,
//   value_e = s[e/16]·w_e + c[e/16],   w_e ∈ [−127, 127] (int8, natural element order).
// Every fast kernel of these formats (AVX2 decode/prefill, AVX-512 decode, the AVX-512 VNNI
// prefill GEMM) runs on this shape, so a format is only its unpacker; the bit layouts are in
// kernels/gguf_blocks.h and the scalar references (ref/quant32.cpp, ref/kquant.cpp).
//
// s and c are computed in f32 exactly as the reference forms its factors (d·sc, dmin·m), so the
// kernels' only differences from the reference are the int8 activations and f32 summation order.
// Ranges: Q4_1 0..15, Q5_0 −16..15, Q5_1 0..31, IQ4 codebook −127..113, Q2_K 0..3, Q3_K −4..3,
// Q5_K 0..31 — never −128, so |w| fits the unsigned operand of maddubs (AVX2), and w ^ 0x80 =
// w + 128 is the unsigned code vpdpbusd wants (AVX-512, with c − 128·s as the bias).
//
// Internal linkage: compiled into each tier's translation unit with that tier's flags (see
// kquant_scales.h for why).
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "larder/kernels/cpu/common/act_quant.h"
#include "larder/kernels/cpu/common/kquant_scales.h"
#include "larder/kernels/cpu/common/simd_avx2.h"
#include "larder/kernels/gguf_blocks.h"

namespace larder::kernels::cpu {
namespace {

namespace gu {

inline float f16(const uint8_t* p) { return simd::f16_table()[simd::load_u16(p)]; }

// 16 bytes of packed nibbles → 32 bytes: low nibbles (elements 0..15), then high (16..31).
inline __m256i nibbles32(const uint8_t* qs) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i m = _mm_set1_epi8(0x0f);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m));
}

// The 32 bits of a little-endian uint32 spread to bytes: 0x10 where bit j is set, else 0.
inline __m256i fifth_bits(const uint8_t* qh) {
  uint32_t h;
  std::memcpy(&h, qh, 4);
  const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(h)),
                                             _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,  //
                                                              2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
  return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

inline __m256i iq4_lookup(__m256i codes) {
  const __m128i kv = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4Values));
  return _mm256_shuffle_epi8(_mm256_set_m128i(kv, kv), codes);
}

inline void store32(int8_t* w, __m256i v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(w), v); }

inline void fill2(float* a, float v) { a[0] = a[1] = v; }

// The super-block header Q4_K and Q5_K share (d, dmin, 12 bytes of 6-bit scales and mins) as
// the super-block GEMMs take it: f32 d and dmin, sub-block j's sc_j and m_j as integers.
template <class Block>
inline void k_super_header(const uint8_t* blk, int16_t* sc, int16_t* mn, float& d, float& dmin) {
  static_assert(offsetof(Block, d) == 0 && offsetof(Block, dmin) == 2 && offsetof(Block, scales) == 4);
  d = f16(blk + offsetof(Block, d));
  dmin = f16(blk + offsetof(Block, dmin));
  const Q4KScaleBytes sb = q4k_scale_bytes(blk + offsetof(Block, scales));
  for (int j = 0; j < 8; ++j) {
    sc[j] = static_cast<int16_t>(sb.sc(j));
    mn[j] = static_cast<int16_t>(sb.m(j));
  }
}

}  // namespace gu

// Each unpacker: kElems weights per unit (one block / super-block of kBytes), kBias (whether c
// can be nonzero), and unpack(blk, w[kElems], s[kElems/16], c[kElems/16]).
// For the AVX2 token-lane GEMM (matmul_gguf_avx2.cpp), which feeds weights to maddubs' unsigned
// operand: kCodeOffset makes the codes unsigned (u = w + kCodeOffset ∈ [0, kMaxCode], bias
// c − kCodeOffset·s), or is −1 for the signed codebook formats (|w| and the sign go separately);
// kScaleElems is 32 where both halves of every 32-block share s and c, else 16.
struct UnpackQ4_1 {
  static constexpr int kElems = 32;
  static constexpr size_t kBytes = sizeof(BlockQ4_1);
  static constexpr bool kBias = true;
  static constexpr int kCodeOffset = 0, kMaxCode = 15, kScaleElems = 32;
  static void unpack(const uint8_t* blk, int8_t* w, float* s, float* c) {
    gu::store32(w, gu::nibbles32(blk + offsetof(BlockQ4_1, qs)));
    gu::fill2(s, gu::f16(blk + offsetof(BlockQ4_1, d)));
    gu::fill2(c, gu::f16(blk + offsetof(BlockQ4_1, m)));
  }
};

struct UnpackQ5_0 {
  static constexpr int kElems = 32;
  static constexpr size_t kBytes = sizeof(BlockQ5_0);
  static constexpr bool kBias = false;
  static constexpr int kCodeOffset = 16, kMaxCode = 31, kScaleElems = 32;
  static void unpack(const uint8_t* blk, int8_t* w, float* s, float* c) {
    const __m256i q = _mm256_or_si256(gu::nibbles32(blk + offsetof(BlockQ5_0, qs)), gu::fifth_bits(blk + offsetof(BlockQ5_0, qh)));
    gu::store32(w, _mm256_sub_epi8(q, _mm256_set1_epi8(16)));
    gu::fill2(s, gu::f16(blk + offsetof(BlockQ5_0, d)));
    gu::fill2(c, 0.0f);
  }
};

struct UnpackQ5_1 {
  static constexpr int kElems = 32;
  static constexpr size_t kBytes = sizeof(BlockQ5_1);
  static constexpr bool kBias = true;
  static constexpr int kCodeOffset = 0, kMaxCode = 31, kScaleElems = 32;
  static void unpack(const uint8_t* blk, int8_t* w, float* s, float* c) {
    gu::store32(w, _mm256_or_si256(gu::nibbles32(blk + offsetof(BlockQ5_1, qs)), gu::fifth_bits(blk + offsetof(BlockQ5_1, qh))));
    gu::fill2(s, gu::f16(blk + offsetof(BlockQ5_1, d)));
    gu::fill2(c, gu::f16(blk + offsetof(BlockQ5_1, m)));
  }
};

struct UnpackIQ4_NL {
  static constexpr int kElems = 32;
  static constexpr size_t kBytes = sizeof(BlockIQ4_NL);
  static constexpr bool kBias = false;
  static constexpr int kCodeOffset = -1, kMaxCode = 127, kScaleElems = 32;
  static void unpack(const uint8_t* blk, int8_t* w, float* s, float* c) {
    gu::store32(w, gu::iq4_lookup(gu::nibbles32(blk + offsetof(BlockIQ4_NL, qs))));
    gu::fill2(s, gu::f16(blk + offsetof(BlockIQ4_NL, d)));
    gu::fill2(c, 0.0f);
  }
};

// Q2_K: element 128h + 32k + l is bits 2k..2k+1 of qs[32h + l]; half i has scale d·(sc_i & 15)
// and bias −dmin·(sc_i >> 4).
struct UnpackQ2_K {
  static constexpr int kElems = 256;
  static constexpr size_t kBytes = sizeof(BlockQ2_K);
  static constexpr bool kBias = true;
  static constexpr int kCodeOffset = 0, kMaxCode = 3, kScaleElems = 16;
  static void unpack(const uint8_t* blk, int8_t* w, float* s, float* c) {
    const __m256i m2 = _mm256_set1_epi8(3);
    for (int h = 0; h < 2; ++h) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + offsetof(BlockQ2_K, qs) + 32 * h));
      gu::store32(w + 128 * h, _mm256_and_si256(q, m2));
      gu::store32(w + 128 * h + 32, _mm256_and_si256(_mm256_srli_epi16(q, 2), m2));
      gu::store32(w + 128 * h + 64, _mm256_and_si256(_mm256_srli_epi16(q, 4), m2));
      gu::store32(w + 128 * h + 96, _mm256_and_si256(_mm256_srli_epi16(q, 6), m2));
    }
    const float d = gu::f16(blk + offsetof(BlockQ2_K, d)), dmin = gu::f16(blk + offsetof(BlockQ2_K, dmin));
    const uint8_t* sc = blk + offsetof(BlockQ2_K, scales);
    for (int i = 0; i < 16; ++i) {
      s[i] = d * static_cast<float>(sc[i] & 15);
      c[i] = -(dmin * static_cast<float>(sc[i] >> 4));
    }
  }
};

// Q3_K: low two bits as Q2_K, minus 4 where the hmask bit (bit e/32 of hmask[e % 32]) is clear.
struct UnpackQ3_K {
  static constexpr int kElems = 256;
  static constexpr size_t kBytes = sizeof(BlockQ3_K);
  static constexpr bool kBias = false;
  static constexpr int kCodeOffset = 4, kMaxCode = 7, kScaleElems = 16;
  static void unpack(const uint8_t* blk, int8_t* w, float* s, float* c) {
    const __m256i m2 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1), four = _mm256_set1_epi8(4);
    const __m256i hm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + offsetof(BlockQ3_K, hmask)));
    for (int h = 0; h < 2; ++h) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + offsetof(BlockQ3_K, qs) + 32 * h));
      for (int k = 0; k < 4; ++k) {
        const int j = 4 * h + k;  // 32-element chunk = hmask bit
        const __m256i lo = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * k)), m2);
        const __m256i bit = _mm256_and_si256(_mm256_srl_epi16(hm, _mm_cvtsi32_si128(j)), one);
        // lo − 4 + 4·bit
        gu::store32(w + 32 * j, _mm256_add_epi8(_mm256_sub_epi8(lo, four), _mm256_slli_epi16(bit, 2)));
      }
    }
    const float d = gu::f16(blk + offsetof(BlockQ3_K, d));
    const uint8_t* sc = blk + offsetof(BlockQ3_K, scales);
    for (int i = 0; i < 16; ++i) {
      const int lo = i < 8 ? (sc[i] & 15) : (sc[i - 8] >> 4);
      const int hi = (sc[8 + i % 4] >> (2 * (i / 4))) & 3;
      s[i] = d * static_cast<float>((lo | (hi << 4)) - 32);
      c[i] = 0.0f;
    }
  }
};

// Q5_K: Q4_K's nibbles and 6-bit scales/mins plus a fifth bit per element (bit j of qh[l] for
// element 32j + l).
struct UnpackQ5_K {
  static constexpr int kElems = 256;
  static constexpr size_t kBytes = sizeof(BlockQ5_K);
  static constexpr bool kBias = true;
  static constexpr int kCodeOffset = 0, kMaxCode = 31, kScaleElems = 32;
  static void unpack(const uint8_t* blk, int8_t* w, float* s, float* c) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi8(1);
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + offsetof(BlockQ5_K, qh)));
    for (int c4 = 0; c4 < 4; ++c4) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + offsetof(BlockQ5_K, qs) + 32 * c4));
      const int j0 = 2 * c4, j1 = 2 * c4 + 1;
      const __m256i h0 = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(j0)), one);
      const __m256i h1 = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(j1)), one);
      gu::store32(w + 32 * j0, _mm256_or_si256(_mm256_and_si256(q, m4), _mm256_slli_epi16(h0, 4)));
      gu::store32(w + 32 * j1, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), _mm256_slli_epi16(h1, 4)));
    }
    const float d = gu::f16(blk + offsetof(BlockQ5_K, d)), dmin = gu::f16(blk + offsetof(BlockQ5_K, dmin));
    const Q4KScaleBytes sb = q4k_scale_bytes(blk + offsetof(BlockQ5_K, scales));
    uint8_t sc[8], m[8];
    std::memcpy(sc, &sb.sc_lo, 4);
    std::memcpy(sc + 4, &sb.sc_hi, 4);
    std::memcpy(m, &sb.m_lo, 4);
    std::memcpy(m + 4, &sb.m_hi, 4);
    for (int j = 0; j < 8; ++j) {
      gu::fill2(s + 2 * j, d * static_cast<float>(sc[j]));
      gu::fill2(c + 2 * j, -(dmin * static_cast<float>(m[j])));
    }
  }
  // The AVX-512 GEMM's super-block form (gemm16_avx512.h kSuperBlocks): value = d·sc_j·u − dmin·m_j
  // with u = w (0..31) and the 6-bit sc_j, m_j as integers.
  static constexpr int kSuperCodeOffset = 0;
  static void unpack_super(const uint8_t* blk, int8_t* w, int16_t* sc, int16_t* mn, float& d, float& dmin) {
    float s[16], c[16];
    unpack(blk, w, s, c);
    gu::k_super_header<BlockQ5_K>(blk, sc, mn, d, dmin);
  }
};

// Q4_K for the super-block GEMMs only (its other kernels read the block themselves): codes u =
// the 4-bit values (chunk c's 32 bytes: sub-block 2c from the low nibbles, 2c + 1 from the high
// ones), value = d·sc_j·u − dmin·m_j.
struct UnpackQ4_K {
  static constexpr int kElems = 256;
  static constexpr size_t kBytes = sizeof(BlockQ4_K);
  static constexpr int kMaxCode = 15;
  static constexpr int kSuperCodeOffset = 0;
  static void unpack_super(const uint8_t* blk, int8_t* w, int16_t* sc, int16_t* mn, float& d, float& dmin) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    for (int c = 0; c < 4; ++c) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + offsetof(BlockQ4_K, qs) + 32 * c));
      gu::store32(w + 64 * c, _mm256_and_si256(v, m4));
      gu::store32(w + 64 * c + 32, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
    }
    gu::k_super_header<BlockQ4_K>(blk, sc, mn, d, dmin);
  }
};

// IQ4_XS: eight IQ4_NL-shaped sub-blocks of 32 with 6-bit signed scales.
struct UnpackIQ4_XS {
  static constexpr int kElems = 256;
  static constexpr size_t kBytes = sizeof(BlockIQ4_XS);
  static constexpr bool kBias = false;
  static constexpr int kCodeOffset = -1, kMaxCode = 127, kScaleElems = 32;
  static void unpack(const uint8_t* blk, int8_t* w, float* s, float* c) {
    for (int j = 0; j < 8; ++j)
      gu::store32(w + 32 * j, gu::iq4_lookup(gu::nibbles32(blk + offsetof(BlockIQ4_XS, qs) + 16 * j)));
    const float d = gu::f16(blk + offsetof(BlockIQ4_XS, d));
    for (int j = 0; j < 8; ++j) {
      const int ls = scale(blk, j);
      gu::fill2(s + 2 * j, d * static_cast<float>(ls));
      gu::fill2(c + 2 * j, 0.0f);
    }
  }
  // Sub-block j's signed scale, −32..31.
  static int scale(const uint8_t* blk, int j) {
    const int sh = simd::load_u16(blk + offsetof(BlockIQ4_XS, scales_h));
    const uint8_t* sl = blk + offsetof(BlockIQ4_XS, scales_l);
    return (((sl[j / 2] >> (4 * (j % 2))) & 15) | (((sh >> (2 * j)) & 3) << 4)) - 32;
  }
  // The AVX-512 GEMM's super-block form (gemm16_avx512.h kSuperBlocks): codes u = w + 128 (the
  // codebook values made unsigned), so value = d·ls_j·w = d·ls_j·u − d·(128·ls_j): sc_j = ls_j,
  // m_j = 128·ls_j (|m_j| <= 4096, an int16), dmin = d.
  static constexpr int kSuperCodeOffset = 128;
  static void unpack_super(const uint8_t* blk, int8_t* w, int16_t* sc, int16_t* mn, float& d, float& dmin) {
    for (int j = 0; j < 8; ++j)
      gu::store32(w + 32 * j, gu::iq4_lookup(gu::nibbles32(blk + offsetof(BlockIQ4_XS, qs) + 16 * j)));
    d = dmin = gu::f16(blk + offsetof(BlockIQ4_XS, d));
    for (int j = 0; j < 8; ++j) {
      const int ls = scale(blk, j);
      sc[j] = static_cast<int16_t>(ls);
      mn[j] = static_cast<int16_t>(128 * ls);
    }
  }
};

// The activation side of these kernels: int8 blocks of 32 (act_quant.h, quantized by AVX2 so both
// tiers see identical bytes) plus, per int32 lane of 4 elements, token-major: the block's d_x and
// (need_h) the lane's share of its 16-element half sum, d_x·Σ_half q_x / 4 — the four lanes of a
// half then add up to the half's bias term. Slot 0 holds the blocks, slot 3 the lane arrays.
struct LaneActs {
  QuantizedActs a;
  int64_t nl = 0;             // lanes per token = cols / 4
  const float* dx = nullptr;  // [n][nl]: d_x of the lane's block
  const float* h = nullptr;   // [n][nl]: d_x·Σ_half q_x / 4 of the lane's 16-element half
};

inline LaneActs prepare_lane_acts(const float* x, int64_t n, int64_t cols, bool need_h) {
  LaneActs la;
  la.a = quantize_acts_scratch(x, n, cols);
  la.nl = cols / 4;
  const int64_t nb = cols / 32;
  const size_t per = static_cast<size_t>(n * la.nl);
  auto* buf = static_cast<float*>(thread_scratch((need_h ? 2 : 1) * per * sizeof(float) + 64, 3));
  float* dx = buf;
  float* h = need_h ? buf + per : nullptr;
  for (int64_t t = 0; t < n; ++t) {
    const int8_t* q = la.a.token_blocks(t);
    for (int64_t b = 0; b < nb; ++b) {
      const float d = la.a.scales(b)[t];
      const __m256 dv = _mm256_set1_ps(d);
      _mm256_storeu_ps(dx + t * la.nl + 8 * b, dv);
      if (h) {
        int s0 = 0, s1 = 0;
        for (int j = 0; j < 16; ++j) {
          s0 += q[32 * b + j];
          s1 += q[32 * b + 16 + j];
        }
        const float h0 = d * static_cast<float>(s0) * 0.25f, h1 = d * static_cast<float>(s1) * 0.25f;
        _mm256_storeu_ps(h + t * la.nl + 8 * b, _mm256_set_m128(_mm_set1_ps(h1), _mm_set1_ps(h0)));
      }
    }
  }
  la.dx = dx;
  la.h = h;
  return la;
}

}  // namespace
}  // namespace larder::kernels::cpu
