// lora.h — the low-rank product of a LoRA delta, u = B·(A·x), for a few rows at a time (issue 45).
//
// A LoRA adapter's factors are tiny next to the base (rank·(in + out) per projection) but read on
// every decode step, once per adapter, for the 1–8 rows that carry it. Layout, chosen so both
// products stream over contiguous memory in the adapter's own dtype (F32, BF16 or F16 — a 16-bit
// adapter is never widened in RAM):
//   A   [rank, in] row-major: t_k = A_k · x is a dot product over a contiguous row;
//   B   in panels of kLoraPanel outputs: panel p holds B[16p + l][k] at (p·rank + k)·16 + l,
//       the last panel zero-padded — u = Σ_k t_k · panel row k is a vertical multiply-add over
//       one contiguous block, no horizontal sums (pack_lora_b builds it from either orientation).
//
// Arithmetic (one order, so every tier gives the reference's bits, and a row the same bits
// whatever rows run beside it):
//   t_k: 16 lane sums over c < in & ~15 (lane c mod 16, fma in c order), reduced as
//        s8[l] = s[l] + s[l+8], s4[l] = s8[l] + s8[l+4], s2[l] = s4[l] + s4[l+2], s2[0] + s2[1],
//        then the column tail by fma in order;
//   u_o: 0, then fma(t_k, B[o][k], u_o) for k = 0 .. rank−1.
// ref::lora_delta writes that order out in scalar code; the AVX2 tier runs 16 lanes as two 8-lane
// halves, the AVX-512 tier as one zmm (kernels/cpu/*/lora_*.cpp); tests/unit/kernels_fast/
// lora_fast_test.cpp checks them bit for bit against it.
#pragma once

#include <cstdint>
#include <vector>

#include "larder/core/dtype.h"

namespace larder::kernels {

inline constexpr int64_t kLoraPanel = 16;

// One projection's factors as lora_delta reads them; the memory belongs to the caller.
struct LoraFactors {
  DType dtype = DType::kF32;  // kF32, kBF16 or kF16, both factors
  const void* a = nullptr;    // [rank, in] row-major (2-byte or 4-byte elements, any alignment)
  const void* bp = nullptr;   // B [out, rank] in panels (see above), lora_panel_elems(rank, out) elements
  int64_t rank = 0, in = 0, out = 0;

  // Element values as f32 (exact for every dtype): A[k][j], B[o][k].
  float a_at(int64_t k, int64_t j) const;
  float b_at(int64_t o, int64_t k) const;
};

// Elements of B's panelled form: ⌈out / 16⌉ · 16 · rank.
inline int64_t lora_panel_elems(int64_t rank, int64_t out) {
  return (out + kLoraPanel - 1) / kLoraPanel * kLoraPanel * rank;
}

// Packs B into panels at `dst` (lora_panel_elems elements of `dtype`, padding zeroed). `b` holds
// B's elements in `dtype`, [out, rank] row-major (PEFT, GGUF), or [rank, out] with `rank_major`
// (mlx-lm's lora_b). No alignment needed.
void pack_lora_b(DType dtype, const void* b, bool rank_major, int64_t rank, int64_t out, void* dst);

// us[i][0 .. out) = B·(A·xs[i]) for i < nx (xs[i]: `in` floats). t: scratch of nx·rank floats.
// Runs on the calling thread (a decode call's few rows are too small for a pool job).
void lora_delta(const LoraFactors& f, const float* const* xs, int64_t nx, float* t, float* const* us);

// Factors owning their memory, packed for lora_delta (tests, tools): from f32/16-bit A [rank, in]
// and B [out, rank] given as raw elements of `dtype`.
struct OwnedLoraFactors {
  std::vector<uint8_t> a, bp;
  LoraFactors view;  // into a and bp: moving keeps it valid, copying would not
  OwnedLoraFactors() = default;
  OwnedLoraFactors(OwnedLoraFactors&&) = default;
  OwnedLoraFactors& operator=(OwnedLoraFactors&&) = default;
  OwnedLoraFactors(const OwnedLoraFactors&) = delete;
};
OwnedLoraFactors own_lora_factors(DType dtype, const void* a, const void* b, int64_t rank, int64_t in, int64_t out);

}  // namespace larder::kernels
