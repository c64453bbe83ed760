// hadamard.h — randomized Hadamard rotations for the rotation fold (design/quantization.md §6.7).
//
// A rotation of size n = m·2^k (m ∈ {1, 12, 20, 28}) is R = diag(s)·Mᵀ with
// M = (H_m ⊗ H_{2^k}) / √n, s a ±1 sign vector from splitmix64. Every fold (reader, writer, bias,
// embedding) is expressed with the single row primitive rowT(x) = x·R, so one code path serves
// symmetric (Sylvester, H_28) and non-symmetric (H_12, H_20) bases alike.
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

// Splits n = m·2^k with m in {1, 12, 20, 28} (m = 1 when n is a power of two). Error (naming n
// and the allowed form) otherwise, including n <= 0.
Status hadamard_factor(int64_t n, int* m, int64_t* pow2);

// The ±1 base matrix H_m, row-major m×m, for m in {1, 12, 20, 28}: Paley I from q = 11 and
// q = 19, Paley II from q = 13. H_m·H_mᵀ = m·I. Aborts for any other m (programmer error).
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
