// gguf_quants.cpp — see gguf_quants.h. The arithmetic order inside each fit matters for bit
// agreement with ggml (f32 throughout, no FMA contraction: quant/CMakeLists.txt).
#include "larder/quant/gguf_quants.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "larder/kernels/gguf_blocks.h"

namespace larder::quant {

namespace {

using namespace larder::kernels;

constexpr float kGroupEps = 1e-15f;  // below this a (sub-)block is all zero

// Round half away from... ggml rounds with the 1.5·2^23 trick: round-to-nearest-even of f32.
inline int round_nearest(float v) {
  float t = v + 12582912.f;
  int32_t i;
  std::memcpy(&i, &t, 4);
  return (i & 0x007fffff) - 0x00400000;
}

inline uint16_t h(float f) { return f32_to_f16(f); }
inline float fh(uint16_t v) { return f16_to_f32(v); }

// Symmetric codes in [-nmax, nmax-1] for one group, scale by (weighted) least squares over a
// sweep of ±0.9 around nmax/max. `w` null: the weights are `mode` (1: x², 2: 1). Returns the
// scale; L gets codes + nmax. `early`: the half-way estimate Q3_K's reference path uses.
float fit_symmetric(int n, int nmax, const float* x, int8_t* L, int mode, const float* w) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupEps) {
    std::memset(L, 0, static_cast<size_t>(n));
    return 0.f;
  }
  auto weight = [&](int i) { return w ? w[i] : mode == 1 ? x[i] * x[i] : 1.f; };
  auto code = [&](float is, int i) { return std::max(-nmax, std::min(nmax - 1, round_nearest(is * x[i]))); };
  float iscale = -nmax / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = code(iscale, i);
    L[i] = static_cast<int8_t>(l + nmax);
    const float wi = weight(i);
    sumlx += wi * x[i] * l;
    suml2 += wi * l * l;
  }
  float scale = suml2 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(nmax + 0.1f * is) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = code(iscale, i);
      const float wi = weight(i);
      sumlx += wi * x[i] * l;
      suml2 += wi * l * l;
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(nmax + code(iscale, i));
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// Q3_K's reference fit: x²-weighted, then coordinate descent moving single codes while the
// weighted correlation improves. Returns the scale; L gets codes + nmax.
float fit_symmetric_descent(int n, int nmax, const float* x, int8_t* L) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupEps) {
    std::memset(L, 0, static_cast<size_t>(n));
    return 0.f;
  }
  const float iscale = -nmax / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = std::max(-nmax, std::min(nmax - 1, round_nearest(iscale * x[i])));
    L[i] = static_cast<int8_t>(l);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  for (int pass = 0; pass < 5; ++pass) {
    int changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i];
      float slx = sumlx - w * x[i] * L[i];
      if (slx > 0) {
        float sl2 = suml2 - w * L[i] * L[i];
        const int nl = std::max(-nmax, std::min(nmax - 1, round_nearest(x[i] * sl2 / slx)));
        if (nl != L[i]) {
          slx += w * x[i] * nl;
          sl2 += w * nl * nl;
          if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
            L[i] = static_cast<int8_t>(nl);
            sumlx = slx;
            suml2 = sl2;
            ++changed;
          }
        }
      }
    }
    if (!changed) break;
  }
  for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(L[i] + nmax);
  return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

// Codes in [0, nmax] with scale and min (value = scale·l − min, min >= 0) by weighted least
// squares over nstep+1 candidate inverse scales (rmin + rdelta·k + nmax)/(max − min). `w` null:
// x² weights. `mad`: the error is |diff| instead of diff². Returns the scale, *the_min = min.
float fit_scale_min(int n, int nmax, const float* x, const float* w, uint8_t* L, float* the_min, float rmin,
                    float rdelta, int nstep, bool mad, bool strict_range) {
  auto weight = [&](int i) { return w ? w[i] : x[i] * x[i]; };
  float min = x[0], max = x[0];
  float sum_w = weight(0);
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float wi = weight(i);
    sum_w += wi;
    sum_x += wi * x[i];
  }
  if (min > 0) min = 0;
  if (strict_range ? max <= min : max == min) {
    std::memset(L, 0, static_cast<size_t>(n));
    *the_min = -min;
    return 0.f;
  }
  float iscale = nmax / (max - min);
  float scale = 1 / iscale;
  float best = 0;
  for (int i = 0; i < n; ++i) {
    const int l = round_nearest(iscale * (x[i] - min));
    L[i] = static_cast<uint8_t>(std::max(0, std::min(nmax, l)));
    float diff = scale * L[i] + min - x[i];
    diff = mad ? std::fabs(diff) : diff * diff;
    best += weight(i) * diff;
  }
  if (nstep < 1) {
    *the_min = -min;
    return scale;
  }
  uint8_t aux[32];
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * is + nmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::max(0, std::min(nmax, round_nearest(iscale * (x[i] - min))));
      aux[i] = static_cast<uint8_t>(l);
      const float wi = weight(i);
      sum_l += wi * l;
      sum_l2 += wi * l * l;
      sum_xl += wi * l * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float err = 0;
      for (int i = 0; i < n; ++i) {
        float diff = this_scale * aux[i] + this_min - x[i];
        diff = mad ? std::fabs(diff) : diff * diff;
        err += weight(i) * diff;
      }
      if (err < best) {
        std::memcpy(L, aux, static_cast<size_t>(n));
        best = err;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}

// Non-negative values (sub-block scales or mins) as codes in [0, nmax] times one scale, weighted
// by `w` (the sub-blocks' weight sums): a sweep of 8 scales then coordinate descent.
float fit_positive(int n, int nmax, const float* x, uint8_t* L, const float* w) {
  float max = 0;
  for (int i = 0; i < n; ++i) max = std::max(max, x[i]);
  if (max < kGroupEps) {
    std::memset(L, 0, static_cast<size_t>(n));
    return 0.f;
  }
  float iscale = nmax / max;
  for (int i = 0; i < n; ++i) L[i] = static_cast<uint8_t>(round_nearest(iscale * x[i]));
  const float scale = 1 / iscale;
  float best = 0;
  for (int i = 0; i < n; ++i) {
    const float diff = x[i] - scale * L[i];
    best += w[i] * diff * diff;
  }
  for (int is = -4; is <= 4; ++is) {
    if (is == 0) continue;
    const float iscale_is = (0.1f * is + nmax) / max;
    const float scale_is = 1 / iscale_is;
    float mse = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::min(nmax, round_nearest(iscale_is * x[i]));
      const float diff = x[i] - scale_is * l;
      mse += w[i] * diff * diff;
    }
    if (mse < best) {
      best = mse;
      iscale = iscale_is;
    }
  }
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = std::min(nmax, round_nearest(iscale * x[i]));
    L[i] = static_cast<uint8_t>(l);
    sumlx += w[i] * x[i] * l;
    suml2 += w[i] * l * l;
  }
  for (int pass = 0; pass < 5; ++pass) {
    int changed = 0;
    for (int i = 0; i < n; ++i) {
      float slx = sumlx - w[i] * x[i] * L[i];
      float sl2 = suml2 - w[i] * L[i] * L[i];
      if (slx > 0 && sl2 > 0) {
        const int nl = std::min(nmax, round_nearest(x[i] * sl2 / slx));
        if (nl != L[i]) {
          slx += w[i] * x[i] * nl;
          sl2 += w[i] * nl * nl;
          if (slx * slx * suml2 > sumlx * sumlx * sl2) {
            L[i] = static_cast<uint8_t>(nl);
            sumlx = slx;
            suml2 = sl2;
            ++changed;
          }
        }
      }
    }
    if (!changed) break;
  }
  return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

// ------------------------------------------------------------------ 32-element legacy formats

void q8_0_block(const float* x, BlockQ8_0* y) {
  float amax = 0;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127;
  const float id = d ? 1.0f / d : 0.0f;
  y->d = h(d);
  for (int j = 0; j < 32; ++j) y->qs[j] = static_cast<int8_t>(std::round(x[j] * id));
}

// Q4_0 / Q5_0: value = d·(q − 2^(b−1)), d = max/−2^(b−1) with max the signed extreme.
template <int kBits>
void sym_block(const float* x, uint16_t* d_out, uint8_t* qs, uint8_t* qh) {
  float amax = 0, max = 0;
  for (int j = 0; j < 32; ++j)
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  constexpr int half = 1 << (kBits - 1);
  const float d = max / -half;
  const float id = d ? 1.0f / d : 0.0f;
  *d_out = h(d);
  uint32_t high = 0;
  for (int j = 0; j < 16; ++j) {
    // Truncation of value + half + 0.5 as int8, as ggml's reference does.
    const uint8_t a = static_cast<uint8_t>(std::min(2 * half - 1, static_cast<int>(static_cast<int8_t>(x[j] * id + (half + 0.5f)))));
    const uint8_t b = static_cast<uint8_t>(std::min(2 * half - 1, static_cast<int>(static_cast<int8_t>(x[j + 16] * id + (half + 0.5f)))));
    qs[j] = static_cast<uint8_t>((a & 0x0F) | ((b & 0x0F) << 4));
    high |= static_cast<uint32_t>((a >> 4) & 1) << j;
    high |= static_cast<uint32_t>((b >> 4) & 1) << (j + 16);
  }
  if (qh) std::memcpy(qh, &high, 4);
}

// Q4_1 / Q5_1: value = d·q + m, m the block minimum.
template <int kBits>
void asym_block(const float* x, uint16_t* d_out, uint16_t* m_out, uint8_t* qs, uint8_t* qh) {
  float min = FLT_MAX, max = -FLT_MAX;
  for (int j = 0; j < 32; ++j) {
    min = std::min(min, x[j]);
    max = std::max(max, x[j]);
  }
  constexpr int top = (1 << kBits) - 1;
  const float d = (max - min) / top;
  const float id = d ? 1.0f / d : 0.0f;
  *d_out = h(d);
  *m_out = h(min);
  uint32_t high = 0;
  for (int j = 0; j < 16; ++j) {
    uint8_t a = static_cast<uint8_t>((x[j] - min) * id + 0.5f);
    uint8_t b = static_cast<uint8_t>((x[j + 16] - min) * id + 0.5f);
    if (kBits == 4) {
      a = std::min<uint8_t>(15, static_cast<uint8_t>(static_cast<int8_t>((x[j] - min) * id + 0.5f)));
      b = std::min<uint8_t>(15, static_cast<uint8_t>(static_cast<int8_t>((x[j + 16] - min) * id + 0.5f)));
    }
    qs[j] = static_cast<uint8_t>((a & 0x0F) | ((b & 0x0F) << 4));
    high |= static_cast<uint32_t>((a >> 4) & 1) << j;
    high |= static_cast<uint32_t>((b >> 4) & 1) << (j + 16);
  }
  if (qh) std::memcpy(qh, &high, 4);
}

// The importance-weighted legacy formats: weights imatrix·sqrt(σ² + x²) with σ² the mean square
// of the whole row; symmetric formats fit like Q6_K's sub-blocks, min formats like Q4_K's.
void legacy_weighted_block(DType t, const float* x, const float* qw, float sigma2, uint8_t* ob) {
  float weight[32];
  for (int j = 0; j < 32; ++j) weight[j] = qw[j] * std::sqrt(sigma2 + x[j] * x[j]);
  uint8_t L[32];
  uint16_t* d = reinterpret_cast<uint16_t*>(ob);
  uint8_t* qs = nullptr;
  uint8_t* qh = nullptr;
  if (t == DType::kQ4_0 || t == DType::kQ5_0) {
    int8_t Ls[32];
    *d = h(fit_symmetric(32, t == DType::kQ4_0 ? 8 : 16, x, Ls, 1, weight));
    for (int j = 0; j < 32; ++j) L[j] = static_cast<uint8_t>(Ls[j]);
    qs = t == DType::kQ4_0 ? reinterpret_cast<BlockQ4_0*>(ob)->qs : reinterpret_cast<BlockQ5_0*>(ob)->qs;
    if (t == DType::kQ5_0) qh = reinterpret_cast<BlockQ5_0*>(ob)->qh;
  } else {
    float min;
    *d = h(fit_scale_min(32, t == DType::kQ4_1 ? 15 : 31, x, weight, L, &min, -0.9f, 0.05f, 36, false, true));
    d[1] = h(-min);
    qs = t == DType::kQ4_1 ? reinterpret_cast<BlockQ4_1*>(ob)->qs : reinterpret_cast<BlockQ5_1*>(ob)->qs;
    if (t == DType::kQ5_1) qh = reinterpret_cast<BlockQ5_1*>(ob)->qh;
  }
  uint32_t high = 0;
  for (int j = 0; j < 16; ++j) {
    qs[j] = static_cast<uint8_t>((L[j] & 0x0F) | ((L[j + 16] & 0x0F) << 4));
    high |= static_cast<uint32_t>((L[j] >> 4) & 1) << j;
    high |= static_cast<uint32_t>((L[j + 16] >> 4) & 1) << (j + 16);
  }
  if (qh) std::memcpy(qh, &high, 4);
}

// ------------------------------------------------------------------ K-quants

// The 12-byte packing of eight 6-bit scales and mins (Q4_K, Q5_K).
void pack_scale_min(uint8_t* s, int j, uint8_t ls, uint8_t lm) {
  if (j < 4) {
    s[j] = ls;
    s[j + 4] = lm;
  } else {
    s[j + 4] = static_cast<uint8_t>((ls & 0xF) | ((lm & 0xF) << 4));
    s[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
    s[j] |= static_cast<uint8_t>((lm >> 4) << 6);
  }
}
void unpack_scale_min(const uint8_t* q, int j, uint8_t* d, uint8_t* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// Q4_K (kBits 4) and Q5_K (5): eight 32-element sub-blocks, 6-bit scales and mins.
template <int kBits, typename Block>
void k45_block(const float* x, const float* qw, Block* y) {
  constexpr int nmax = (1 << kBits) - 1;
  uint8_t L[256];
  float scales[8], mins[8], weights[32];
  std::memset(y->scales, 0, 12);
  if (!qw) {
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; ++j) {
      float sum_x2 = 0;
      for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
      const float av_x = std::sqrt(sum_x2 / 32);
      for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[32 * j + l]);
      scales[j] = kBits == 4 ? fit_scale_min(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], -1.f, 0.1f, 20, false, false)
                             : fit_scale_min(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], -0.5f, 0.1f, 15, false, false);
      max_scale = std::max(max_scale, scales[j]);
      max_min = std::max(max_min, mins[j]);
    }
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    for (int j = 0; j < 8; ++j) {
      const uint8_t ls = std::min<uint8_t>(63, static_cast<uint8_t>(round_nearest(inv_scale * scales[j])));
      const uint8_t lm = std::min<uint8_t>(63, static_cast<uint8_t>(round_nearest(inv_min * mins[j])));
      pack_scale_min(y->scales, j, ls, lm);
    }
    y->d = h(max_scale / 63.f);
    y->dmin = h(max_min / 63.f);
  } else {
    float sum_x2 = 0;
    for (int l = 0; l < 256; ++l) sum_x2 += x[l] * x[l];
    const float sigma2 = 2 * sum_x2 / 256;
    float sw[8];
    uint8_t Ls[8], Lm[8];
    for (int j = 0; j < 8; ++j) {
      for (int l = 0; l < 32; ++l) weights[l] = qw[32 * j + l] * std::sqrt(sigma2 + x[32 * j + l] * x[32 * j + l]);
      float sumw = 0;
      for (int l = 0; l < 32; ++l) sumw += weights[l];
      sw[j] = sumw;
      scales[j] = fit_scale_min(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], -0.9f, 0.05f, 36, false, true);
    }
    const float d_block = fit_positive(8, 63, scales, Ls, sw);
    const float m_block = fit_positive(8, 63, mins, Lm, sw);
    for (int j = 0; j < 8; ++j) pack_scale_min(y->scales, j, std::min<uint8_t>(63, Ls[j]), std::min<uint8_t>(63, Lm[j]));
    y->d = h(d_block);
    y->dmin = h(m_block);
  }
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    unpack_scale_min(y->scales, j, &sc, &m);
    const float d = fh(y->d) * sc;
    if (!d) continue;
    const float dm = fh(y->dmin) * m;
    for (int i = 0; i < 32; ++i)
      L[32 * j + i] = static_cast<uint8_t>(std::max(0, std::min(nmax, round_nearest((x[32 * j + i] + dm) / d))));
  }
  if constexpr (kBits == 4) {
    uint8_t* q = y->qs;
    for (int j = 0; j < 256; j += 64, q += 32)
      for (int l = 0; l < 32; ++l) q[l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 4));
  } else {
    std::memset(y->qh, 0, 32);
    uint8_t* ql = y->qs;
    uint8_t m1 = 1, m2 = 2;
    for (int n = 0; n < 256; n += 64, ql += 32, m1 = static_cast<uint8_t>(m1 << 2), m2 = static_cast<uint8_t>(m2 << 2))
      for (int j = 0; j < 32; ++j) {
        int l1 = L[n + j], l2 = L[n + j + 32];
        if (l1 > 15) {
          l1 -= 16;
          y->qh[j] |= m1;
        }
        if (l2 > 15) {
          l2 -= 16;
          y->qh[j] |= m2;
        }
        ql[j] = static_cast<uint8_t>(l1 | (l2 << 4));
      }
  }
}

void q6_k_block(const float* x, const float* qw, BlockQ6_K* y) {
  int8_t L[256];
  float scales[16];
  float max_scale = 0, max_abs = 0;
  for (int ib = 0; ib < 16; ++ib) {
    scales[ib] = fit_symmetric(16, 32, x + 16 * ib, L + 16 * ib, 1, qw ? qw + 16 * ib : nullptr);
    if (std::fabs(scales[ib]) > max_abs) {
      max_abs = std::fabs(scales[ib]);
      max_scale = scales[ib];
    }
  }
  std::memset(y, 0, sizeof(*y));
  if (max_abs < kGroupEps) {
    y->d = h(0.f);
    return;
  }
  const float iscale = -128.f / max_scale;
  y->d = h(1 / iscale);
  for (int ib = 0; ib < 16; ++ib) y->scales[ib] = static_cast<int8_t>(std::min(127, round_nearest(iscale * scales[ib])));
  for (int j = 0; j < 16; ++j) {
    const float d = fh(y->d) * y->scales[j];
    if (!d) continue;
    for (int i = 0; i < 16; ++i)
      L[16 * j + i] = static_cast<int8_t>(std::max(-32, std::min(31, round_nearest(x[16 * j + i] / d))) + 32);
  }
  uint8_t* ql = y->ql;
  uint8_t* qh = y->qh;
  for (int j = 0; j < 256; j += 128, ql += 64, qh += 32)
    for (int l = 0; l < 32; ++l) {
      const int a = L[j + l], b = L[j + l + 32], c = L[j + l + 64], e = L[j + l + 96];
      ql[l] = static_cast<uint8_t>((a & 0xF) | ((c & 0xF) << 4));
      ql[l + 32] = static_cast<uint8_t>((b & 0xF) | ((e & 0xF) << 4));
      qh[l] = static_cast<uint8_t>((a >> 4) | ((b >> 4) << 2) | ((c >> 4) << 4) | ((e >> 4) << 6));
    }
}

void pack_q3_scale(uint8_t* s, int j, int l) {
  if (j < 8)
    s[j] = static_cast<uint8_t>(l & 0xF);
  else
    s[j - 8] |= static_cast<uint8_t>((l & 0xF) << 4);
  s[j % 4 + 8] |= static_cast<uint8_t>((l >> 4) << (2 * (j / 4)));
}

void q3_k_block(const float* x, const float* qw, BlockQ3_K* y) {
  int8_t L[256];
  float scales[16];
  std::memset(y->scales, 0, 12);
  if (!qw) {
    float max_scale = 0, amax = 0;
    for (int j = 0; j < 16; ++j) {
      scales[j] = fit_symmetric_descent(16, 4, x + 16 * j, L + 16 * j);
      if (std::fabs(scales[j]) > amax) {
        amax = std::fabs(scales[j]);
        max_scale = scales[j];
      }
    }
    if (max_scale) {
      const float iscale = -32.f / max_scale;
      for (int j = 0; j < 16; ++j) {
        const int8_t l = static_cast<int8_t>(round_nearest(iscale * scales[j]));
        pack_q3_scale(y->scales, j, std::max(-32, std::min(31, static_cast<int>(l))) + 32);
      }
      y->d = h(1 / iscale);
    } else {
      y->d = h(0.f);
    }
  } else {
    float sumx2 = 0;
    for (int j = 0; j < 256; ++j) sumx2 += x[j] * x[j];
    const float sigma2 = 2 * sumx2 / 256;
    float weight[16], sw[16];
    int8_t Ls[16];
    for (int j = 0; j < 16; ++j) {
      for (int l = 0; l < 16; ++l) weight[l] = qw[16 * j + l] * std::sqrt(sigma2 + x[16 * j + l] * x[16 * j + l]);
      float sumw = 0;
      for (int l = 0; l < 16; ++l) sumw += weight[l];
      sw[j] = sumw;
      scales[j] = fit_symmetric(16, 4, x + 16 * j, L + 16 * j, 1, weight);
    }
    const float d_block = fit_symmetric(16, 32, scales, Ls, 1, sw);
    for (int j = 0; j < 16; ++j) pack_q3_scale(y->scales, j, Ls[j]);
    y->d = h(d_block);
  }
  for (int j = 0; j < 16; ++j) {
    int sc = j < 8 ? y->scales[j] & 0xF : y->scales[j - 8] >> 4;
    sc = (sc | (((y->scales[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32;
    const float d = fh(y->d) * static_cast<float>(sc);
    if (!d) continue;
    for (int i = 0; i < 16; ++i)
      L[16 * j + i] = static_cast<int8_t>(std::max(-4, std::min(3, round_nearest(x[16 * j + i] / d))) + 4);
  }
  std::memset(y->hmask, 0, 32);
  int m = 0;
  uint8_t hm = 1;
  for (int j = 0; j < 256; ++j) {
    if (L[j] > 3) {
      y->hmask[m] |= hm;
      L[j] = static_cast<int8_t>(L[j] - 4);
    }
    if (++m == 32) {
      m = 0;
      hm = static_cast<uint8_t>(hm << 1);
    }
  }
  for (int j = 0; j < 256; j += 128)
    for (int l = 0; l < 32; ++l)
      y->qs[j / 4 + l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
}

void q2_k_block(const float* x, const float* qw, BlockQ2_K* y) {
  uint8_t L[256];
  float scales[16], mins[16], weights[16];
  if (!qw) {
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 16; ++j) {
      for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * j + l]);
      scales[j] = fit_scale_min(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], -0.5f, 0.1f, 15, true, false);
      max_scale = std::max(max_scale, scales[j]);
      max_min = std::max(max_min, mins[j]);
    }
    if (max_scale > 0) {
      const float iscale = 15.f / max_scale;
      for (int j = 0; j < 16; ++j) y->scales[j] = static_cast<uint8_t>(round_nearest(iscale * scales[j]));
      y->d = h(max_scale / 15.f);
    } else {
      std::memset(y->scales, 0, 16);
      y->d = h(0.f);
    }
    if (max_min > 0) {
      const float iscale = 15.f / max_min;
      for (int j = 0; j < 16; ++j) y->scales[j] |= static_cast<uint8_t>(round_nearest(iscale * mins[j]) << 4);
      y->dmin = h(max_min / 15.f);
    } else {
      y->dmin = h(0.f);
    }
  } else {
    float sw[16] = {};
    float sumx2 = 0;
    for (int j = 0; j < 256; ++j) sumx2 += x[j] * x[j];
    const float sigma2 = sumx2 / 256;
    for (int j = 0; j < 16; ++j) {
      for (int l = 0; l < 16; ++l) weights[l] = qw[16 * j + l] * std::sqrt(sigma2 + x[16 * j + l] * x[16 * j + l]);
      for (int l = 0; l < 16; ++l) sw[j] += weights[l];
      scales[j] = fit_scale_min(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], -0.9f, 0.05f, 36, false, true);
    }
    uint8_t Ls[16], Lm[16];
    const float dm = fit_positive(16, 15, scales, Ls, sw);
    const float mm = fit_positive(16, 15, mins, Lm, sw);
    y->d = h(dm);
    y->dmin = h(mm);
    for (int j = 0; j < 16; ++j) y->scales[j] = static_cast<uint8_t>(Ls[j] | (Lm[j] << 4));
  }
  for (int j = 0; j < 16; ++j) {
    const float d = fh(y->d) * (y->scales[j] & 0xF);
    if (!d) continue;
    const float dm = fh(y->dmin) * (y->scales[j] >> 4);
    for (int i = 0; i < 16; ++i)
      L[16 * j + i] = static_cast<uint8_t>(std::max(0, std::min(3, round_nearest((x[16 * j + i] + dm) / d))));
  }
  for (int j = 0; j < 256; j += 128)
    for (int l = 0; l < 32; ++l)
      y->qs[j / 4 + l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
}

// ------------------------------------------------------------------ IQ4_NL / IQ4_XS

int nearest_code(float v) {
  const int8_t* val = kIq4Values;
  if (v <= val[0]) return 0;
  if (v >= val[15]) return 15;
  int lo = 0, hi = 15;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (v < val[mid])
      hi = mid;
    else
      lo = mid;
  }
  return v - val[hi - 1] < val[hi] - v ? hi - 1 : hi;
}

// One super-block of `sb` elements in 32-element blocks (sb 32: IQ4_NL, 256: IQ4_XS), the
// codebook scale of each block fit by a ±7 sweep; IQ4_XS then stores 6-bit block scales.
void iq4_superblock(int sb, const float* x, const float* qw, uint16_t* dh, uint8_t* q4, uint16_t* scales_h,
                    uint8_t* scales_l) {
  const int ntry = 7;
  const int8_t* values = kIq4Values;
  float sigma2 = 0;
  for (int j = 0; j < sb; ++j) sigma2 += x[j] * x[j];
  sigma2 *= 2.f / static_cast<float>(sb);
  uint8_t L[256];
  float scales[8], weight[32];
  std::memset(q4, 0, static_cast<size_t>(sb / 2));
  *dh = h(0.f);
  float max_scale = 0, amax_scale = 0;
  for (int ib = 0; ib < sb / 32; ++ib) {
    const float* xb = x + ib * 32;
    uint8_t* Lb = L + ib * 32;
    for (int j = 0; j < 32; ++j) weight[j] = qw ? qw[ib * 32 + j] * std::sqrt(sigma2 + xb[j] * xb[j]) : xb[j] * xb[j];
    float amax = 0, max = 0;
    for (int j = 0; j < 32; ++j)
      if (std::fabs(xb[j]) > amax) {
        amax = std::fabs(xb[j]);
        max = xb[j];
      }
    if (amax < kGroupEps) {
      scales[ib] = 0;
      continue;
    }
    float d = -max / values[0];
    float id = 1 / d;
    float sumqx = 0, sumq2 = 0;
    for (int j = 0; j < 32; ++j) {
      const int l = nearest_code(id * xb[j]);
      Lb[j] = static_cast<uint8_t>(l);
      const float q = values[l];
      sumqx += weight[j] * q * xb[j];
      sumq2 += weight[j] * q * q;
    }
    d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
    float best = d * sumqx;
    for (int t = -ntry; t <= ntry; ++t) {
      id = (t + values[0]) / max;
      sumqx = sumq2 = 0;
      for (int j = 0; j < 32; ++j) {
        const float q = values[nearest_code(id * xb[j])];
        sumqx += weight[j] * q * xb[j];
        sumq2 += weight[j] * q * q;
      }
      if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
        d = sumqx / sumq2;
        best = d * sumqx;
      }
    }
    scales[ib] = d;
    if (std::fabs(d) > amax_scale) {
      amax_scale = std::fabs(d);
      max_scale = d;
    }
  }
  if (sb > 32) {
    *scales_h = 0;
    const float d = -max_scale / 32;
    *dh = h(d);
    const float id = d ? 1 / d : 0.f;
    for (int ib = 0; ib < sb / 32; ++ib) {
      int l = std::max(-32, std::min(31, round_nearest(id * scales[ib])));
      const float dl = d * l;
      const float idl = dl ? 1 / dl : 0.f;
      for (int j = 0; j < 32; ++j) L[ib * 32 + j] = static_cast<uint8_t>(nearest_code(idl * x[ib * 32 + j]));
      l += 32;
      if (ib % 2 == 0)
        scales_l[ib / 2] = static_cast<uint8_t>(l & 0xF);
      else
        scales_l[ib / 2] |= static_cast<uint8_t>((l & 0xF) << 4);
      *scales_h = static_cast<uint16_t>(*scales_h | ((l >> 4) << (2 * (ib % 8))));
    }
  } else {
    *dh = h(scales[0]);
    const float id = scales[0] ? 1 / scales[0] : 0;
    for (int j = 0; j < sb; ++j) L[j] = static_cast<uint8_t>(nearest_code(id * x[j]));
  }
  for (int i = 0; i < sb / 32; ++i)
    for (int j = 0; j < 16; ++j) q4[16 * i + j] = static_cast<uint8_t>(L[32 * i + j] | (L[32 * i + 16 + j] << 4));
}

}  // namespace

bool gguf_quantizer_exists(DType t) {
  switch (t) {
    case DType::kF32: case DType::kF16: case DType::kBF16: case DType::kQ8_0: case DType::kQ4_0:
    case DType::kQ4_1: case DType::kQ5_0: case DType::kQ5_1: case DType::kQ2_K: case DType::kQ3_K:
    case DType::kQ4_K: case DType::kQ5_K: case DType::kQ6_K: case DType::kIQ4_NL: case DType::kIQ4_XS:
      return true;
    default:
      return false;
  }
}

DType gguf_type_from_name(const std::string& name) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0,
                  DType::kQ5_1, DType::kQ2_K, DType::kQ3_K, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K, DType::kIQ4_NL,
                  DType::kIQ4_XS})
    if (name == dtype_name(t)) return t;
  return DType::kUnknown;
}

Status quantize_gguf_rows(DType t, const float* x, int64_t rows, int64_t cols, const float* imatrix, uint8_t* out) {
  if (!gguf_quantizer_exists(t)) return invalid_argument(std::string("[gguf] no quantizer for type ") + dtype_name(t));
  const int64_t be = dtype_info(t).block_elems;
  if (cols % be != 0)
    return invalid_argument(std::string("[gguf] ") + dtype_name(t) + " needs rows of a multiple of " + std::to_string(be) +
                            " values, got " + std::to_string(cols));
  const uint64_t row_bytes = dtype_bytes(t, static_cast<uint64_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    uint8_t* o = out + static_cast<uint64_t>(r) * row_bytes;
    switch (t) {
      case DType::kF32:
        std::memcpy(o, xr, static_cast<size_t>(cols) * 4);
        continue;
      case DType::kF16:
        for (int64_t i = 0; i < cols; ++i) {
          const uint16_t v = f32_to_f16(xr[i]);
          std::memcpy(o + 2 * i, &v, 2);
        }
        continue;
      case DType::kBF16:
        for (int64_t i = 0; i < cols; ++i) {
          const uint16_t v = f32_to_bf16(xr[i]);
          std::memcpy(o + 2 * i, &v, 2);
        }
        continue;
      default:
        break;
    }
    const bool legacy = t == DType::kQ4_0 || t == DType::kQ4_1 || t == DType::kQ5_0 || t == DType::kQ5_1;
    float row_sigma2 = 0;
    if (legacy && imatrix) {
      float sum_x2 = 0;
      for (int64_t j = 0; j < cols; ++j) sum_x2 += xr[j] * xr[j];
      row_sigma2 = sum_x2 / static_cast<float>(cols);
    }
    for (int64_t b = 0; b < cols / be; ++b) {
      const float* xb = xr + b * be;
      const float* qw = imatrix ? imatrix + b * be : nullptr;
      uint8_t* ob = o + static_cast<uint64_t>(b) * dtype_info(t).block_bytes;
      if (legacy && qw) {
        legacy_weighted_block(t, xb, qw, row_sigma2, ob);
        continue;
      }
      switch (t) {
        case DType::kQ8_0: q8_0_block(xb, reinterpret_cast<BlockQ8_0*>(ob)); break;
        case DType::kQ4_0: {
          auto* y = reinterpret_cast<BlockQ4_0*>(ob);
          sym_block<4>(xb, &y->d, y->qs, nullptr);
          break;
        }
        case DType::kQ5_0: {
          auto* y = reinterpret_cast<BlockQ5_0*>(ob);
          sym_block<5>(xb, &y->d, y->qs, y->qh);
          break;
        }
        case DType::kQ4_1: {
          auto* y = reinterpret_cast<BlockQ4_1*>(ob);
          asym_block<4>(xb, &y->d, &y->m, y->qs, nullptr);
          break;
        }
        case DType::kQ5_1: {
          auto* y = reinterpret_cast<BlockQ5_1*>(ob);
          asym_block<5>(xb, &y->d, &y->m, y->qs, y->qh);
          break;
        }
        case DType::kQ2_K: q2_k_block(xb, qw, reinterpret_cast<BlockQ2_K*>(ob)); break;
        case DType::kQ3_K: q3_k_block(xb, qw, reinterpret_cast<BlockQ3_K*>(ob)); break;
        case DType::kQ4_K: k45_block<4>(xb, qw, reinterpret_cast<BlockQ4_K*>(ob)); break;
        case DType::kQ5_K: k45_block<5>(xb, qw, reinterpret_cast<BlockQ5_K*>(ob)); break;
        case DType::kQ6_K: q6_k_block(xb, qw, reinterpret_cast<BlockQ6_K*>(ob)); break;
        case DType::kIQ4_NL: {
          auto* y = reinterpret_cast<BlockIQ4_NL*>(ob);
          iq4_superblock(32, xb, qw, &y->d, y->qs, nullptr, nullptr);
          break;
        }
        case DType::kIQ4_XS: {
          auto* y = reinterpret_cast<BlockIQ4_XS*>(ob);
          iq4_superblock(256, xb, qw, &y->d, y->qs, &y->scales_h, y->scales_l);
          break;
        }
        default: break;
      }
    }
  }
  return Status::ok();
}

}  // namespace larder::quant
