// hadamard.h — randomized Hadamard rotations for the rotation fold (design/quantization.md §6.7).
//
// A rotation of size n = m·2^k is R = diag(s)·Mᵀ with M = (H_m ⊗ H_{2^k}) / √n, s a ±1 sign
// vector from splitmix64, and H_m a base built by a Paley construction (m = q + 1 for a prime power
// q ≡ 3 mod 4, m = 2(q + 1) for q ≡ 1 mod 4) — the smallest such m that divides n with a power-of-two
// quotient. That covers every hidden and intermediate size of the families larder runs (a table
// in tests/unit/quant/hadamard_test.cpp). Every fold (reader, writer, bias, embedding) is
// expressed with the single row primitive rowT(x) = x·R, so one code path serves symmetric and
// non-symmetric bases alike.
//
// Index convention (as MLX hadamard_transform): x is viewed as [m][2^k] row-major; each
// contiguous chunk of 2^k gets a natural-order fast Walsh–Hadamard transform, then the m chunks
// are mixed with H_m, then everything is scaled by 1/√n. Arithmetic is f32.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "larder/core/status.h"

namespace larder::quant {

// The splitmix64 finalizer (Steele et al.), used as a counter-based hash: deterministic and
// independent of thread count or visiting order.
uint64_t splitmix64(uint64_t x);

// s_i = +1 if the top bit of splitmix64(seed ^ (lane << 32) ^ i) is 0, else -1 (i in [0, n)).
// R1 uses lane 0, layer i's R2 lane i + 1.
std::vector<float> rotation_signs(uint64_t seed, uint64_t lane, int64_t n);

// Largest base order tried: a dense m×m mix costs m multiply-adds per element, so bases stay small
// next to the sizes they rotate (released hidden sizes need m <= 180; two intermediate sizes need
// more: Qwen2.5-3B's 11008 = 43·2^8 H_344, Qwen2.5-72B's 29568 = 231·2^7 H_924).
inline constexpr int kMaxHadamardBase = 1024;

// How H_m is built ("Paley I, q = 11", "Paley II, q = 25", "1" for m = 1), or "" when larder
// cannot build a Hadamard matrix of order m (m odd > 1, m ≡ 2 mod 4 > 2, or no Paley prime power).
std::string hadamard_base_construction(int m);

// Splits n = m·2^k with the smallest constructible base m (m = 1 when n is a power of two). Error
// naming n, its odd part and the nearest rotatable sizes otherwise, including n <= 0.
Status hadamard_factor(int64_t n, int* m, int64_t* pow2);

// The ±1 base matrix H_m, row-major m×m, with H_m·H_mᵀ = m·I; built once per m (thread-safe) and
// kept for the life of the process. Aborts when hadamard_base_construction(m) is "" (programmer
// error: callers go through hadamard_factor).
const std::vector<int8_t>& hadamard_base(int m);

class Rotation {
 public:
  // Identity of size 0: rowT is a no-op (a disabled rotation).
  Rotation() = default;
  static Result<Rotation> make(int64_t n, uint64_t seed, uint64_t lane);

  int64_t size() const { return n_; }
  bool identity() const { return n_ == 0; }
  int base() const { return m_; }
  const std::vector<float>& signs() const { return signs_; }
  // "H_64", "H_12", "H_12 (x) H_256"; "none" for the identity.
  std::string construction() const;

  // x ← x·R in place (size() elements). `scratch` holds size() floats; it is only touched when
  // base() > 1 and may be null otherwise.
  void rowT(float* x, float* scratch) const;

 private:
  int64_t n_ = 0, p_ = 0;  // p_ = 2^k
  int m_ = 1;
  float scale_ = 1.0f;
  std::vector<float> signs_;
  const std::vector<int8_t>* hm_ = nullptr;
};

}  // namespace larder::quant
