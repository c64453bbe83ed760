// lora_tiles.h — the loops of kernels::lora_delta over a tier's 16-lane vector type (lora.h fixes
// the arithmetic; lora_avx2.cpp and lora_avx512.cpp supply the vector operations).
//
// O provides: V (16 f32 lanes), kKA (rows of A per tile), kXA / kXB (xs per tile of the first /
// second product), zero(), loadx(const float*), load<D>(const void* base, int64_t elem) (16
// elements of dtype D widened), fma(a, b, c) = a·b + c per lane, bcast(float), reduce(V) in
// lora.h's order, store(float*, V), store_n(float*, V, n).
// Included only by those two translation units, each inside its tier's namespace.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>

#include "larder/core/dtype.h"
#include "larder/kernels/lora.h"

namespace larder::kernels::lora_tiles {

template <class O, DType D>
float elem(const void* base, int64_t i) {
  const auto* b = static_cast<const uint8_t*>(base);
  if constexpr (D == DType::kF32) {
    float v;
    std::memcpy(&v, b + i * 4, 4);
    return v;
  } else {
    uint16_t h;
    std::memcpy(&h, b + i * 2, 2);
    if constexpr (D == DType::kF16) return f16_to_f32(h);
    else return bf16_to_f32(h);
  }
}

// t[(i0 + i)·rank + k0 + r] = A_{k0+r} · xs[i0 + i] for r < KN, i < XN.
template <class O, DType D, int KN, int XN>
void a_tile(const LoraFactors& f, const float* const* xs, int64_t i0, int64_t k0, float* t) {
  using V = typename O::V;
  const int64_t in = f.in, in16 = in & ~int64_t{15};
  V acc[KN][XN];
  for (int r = 0; r < KN; ++r)
    for (int i = 0; i < XN; ++i) acc[r][i] = O::zero();
  for (int64_t c = 0; c < in16; c += 16) {
    V xv[XN];
    for (int i = 0; i < XN; ++i) xv[i] = O::loadx(xs[i0 + i] + c);
    for (int r = 0; r < KN; ++r) {
      const V av = O::template load<D>(f.a, (k0 + r) * in + c);
      for (int i = 0; i < XN; ++i) acc[r][i] = O::fma(av, xv[i], acc[r][i]);
    }
  }
  for (int r = 0; r < KN; ++r)
    for (int i = 0; i < XN; ++i) {
      float v = O::reduce(acc[r][i]);
      const float* x = xs[i0 + i];
      for (int64_t c = in16; c < in; ++c) v = std::fma(elem<O, D>(f.a, (k0 + r) * in + c), x[c], v);
      t[(i0 + i) * f.rank + k0 + r] = v;
    }
}

template <class O, DType D, int XN>
void a_rows(const LoraFactors& f, const float* const* xs, int64_t i0, float* t) {
  int64_t k = 0;
  for (; k + O::kKA <= f.rank; k += O::kKA) a_tile<O, D, O::kKA, XN>(f, xs, i0, k, t);
  for (; k < f.rank; ++k) a_tile<O, D, 1, XN>(f, xs, i0, k, t);
}

// us[i0 + i][panel p] = Σ_k t[i0 + i][k] · panel row k, for i < XN.
template <class O, DType D, int XN>
void b_tile(const LoraFactors& f, const float* t, int64_t i0, int64_t p, float* const* us) {
  using V = typename O::V;
  const int64_t rank = f.rank;
  V acc[XN];
  for (int i = 0; i < XN; ++i) acc[i] = O::zero();
  const float* ti = t + i0 * rank;
  for (int64_t k = 0; k < rank; ++k) {
    const V bv = O::template load<D>(f.bp, (p * rank + k) * kLoraPanel);
    for (int i = 0; i < XN; ++i) acc[i] = O::fma(O::bcast(ti[i * rank + k]), bv, acc[i]);
  }
  const int64_t o0 = p * kLoraPanel, n = std::min(kLoraPanel, f.out - o0);
  for (int i = 0; i < XN; ++i) {
    if (n == kLoraPanel) O::store(us[i0 + i] + o0, acc[i]);
    else O::store_n(us[i0 + i] + o0, acc[i], static_cast<int>(n));
  }
}

template <class O, DType D>
void run(const LoraFactors& f, const float* const* xs, int64_t nx, float* t, float* const* us) {
  for (int64_t i0 = 0; i0 < nx; i0 += O::kXA) {
    switch (std::min<int64_t>(O::kXA, nx - i0)) {
      case 1: a_rows<O, D, 1>(f, xs, i0, t); break;
      case 2: a_rows<O, D, 2>(f, xs, i0, t); break;
      case 3: a_rows<O, D, 3>(f, xs, i0, t); break;
      default: a_rows<O, D, 4>(f, xs, i0, t); break;
    }
  }
  static_assert(O::kXA <= 4 && O::kXB <= 8);
  const int64_t panels = (f.out + kLoraPanel - 1) / kLoraPanel;
  for (int64_t p = 0; p < panels; ++p) {
    for (int64_t i0 = 0; i0 < nx; i0 += O::kXB) {
      switch (std::min<int64_t>(O::kXB, nx - i0)) {
        case 1: b_tile<O, D, 1>(f, t, i0, p, us); break;
        case 2: b_tile<O, D, 2>(f, t, i0, p, us); break;
        case 3: b_tile<O, D, 3>(f, t, i0, p, us); break;
        case 4: b_tile<O, D, 4>(f, t, i0, p, us); break;
        case 5: if constexpr (O::kXB >= 5) b_tile<O, D, 5>(f, t, i0, p, us); break;
        case 6: if constexpr (O::kXB >= 6) b_tile<O, D, 6>(f, t, i0, p, us); break;
        case 7: if constexpr (O::kXB >= 7) b_tile<O, D, 7>(f, t, i0, p, us); break;
        default: if constexpr (O::kXB >= 8) b_tile<O, D, 8>(f, t, i0, p, us); break;
      }
    }
  }
}

template <class O>
void lora_delta(const LoraFactors& f, const float* const* xs, int64_t nx, float* t, float* const* us) {
  switch (f.dtype) {
    case DType::kBF16: run<O, DType::kBF16>(f, xs, nx, t, us); break;
    case DType::kF16: run<O, DType::kF16>(f, xs, nx, t, us); break;
    default: run<O, DType::kF32>(f, xs, nx, t, us); break;
  }
}

}  // namespace larder::kernels::lora_tiles
