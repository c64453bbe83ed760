// hadamard.cpp — see hadamard.h.
#include "larder/quant/hadamard.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace larder::quant {

uint64_t splitmix64(uint64_t x) {
  uint64_t z = x + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

std::vector<float> rotation_signs(uint64_t seed, uint64_t lane, int64_t n) {
  std::vector<float> s(static_cast<size_t>(n > 0 ? n : 0));
  for (int64_t i = 0; i < n; ++i)
    s[static_cast<size_t>(i)] = (splitmix64(seed ^ (lane << 32) ^ static_cast<uint64_t>(i)) >> 63) ? -1.0f : 1.0f;
  return s;
}

Status hadamard_factor(int64_t n, int* m, int64_t* pow2) {
  static const int kBases[] = {1, 12, 20, 28};
  if (n > 0) {
    for (int b : kBases) {
      if (n % b != 0) continue;
      const int64_t p = n / b;
      if ((p & (p - 1)) == 0) {
        *m = b;
        *pow2 = p;
        return Status::ok();
      }
    }
  }
  return unsupported(strfmt("[hadamard] size %lld is not supported: a rotation size must be m*2^k with m in "
                            "{1, 12, 20, 28} (e.g. 4096, 96 = 12*8, 5120 = 20*256, 3584 = 28*128)",
                            static_cast<long long>(n)));
}

namespace {

// Legendre symbol of a modulo the prime q: 0, +1 (non-zero square) or -1.
int legendre(int64_t a, int q) {
  a %= q;
  if (a < 0) a += q;
  if (a == 0) return 0;
  for (int x = 1; x < q; ++x)
    if ((int64_t{x} * x) % q == a) return 1;
  return -1;
}

// Paley I (q ≡ 3 mod 4): H = I + [[0, 1ᵀ], [-1, Q]] with the Jacobsthal matrix Q[i][j] = χ(j − i),
// of order q + 1. Q is antisymmetric for such q, which is what makes H·Hᵀ = (q+1)·I.
std::vector<int8_t> paley1(int q) {
  const int n = q + 1;
  std::vector<int8_t> h(static_cast<size_t>(n * n), 0);
  auto at = [&](int i, int j) -> int8_t& { return h[static_cast<size_t>(i * n + j)]; };
  for (int j = 1; j < n; ++j) at(0, j) = 1, at(j, 0) = -1;
  for (int i = 0; i < q; ++i)
    for (int j = 0; j < q; ++j) at(1 + i, 1 + j) = static_cast<int8_t>(legendre(j - i, q));
  for (int i = 0; i < n; ++i) at(i, i) = static_cast<int8_t>(at(i, i) + 1);
  return h;
}

// Paley II (q ≡ 1 mod 4): the symmetric conference matrix C = [[0, 1ᵀ], [1, Q]] of order q + 1,
// with each 0 replaced by [[1, -1], [-1, -1]] and each ±1 by ±[[1, 1], [1, -1]]; order 2(q + 1).
std::vector<int8_t> paley2(int q) {
  const int c = q + 1, n = 2 * c;
  std::vector<int> cm(static_cast<size_t>(c * c), 0);
  for (int j = 1; j < c; ++j) cm[static_cast<size_t>(j)] = cm[static_cast<size_t>(j * c)] = 1;
  for (int i = 0; i < q; ++i)
    for (int j = 0; j < q; ++j) cm[static_cast<size_t>((1 + i) * c + 1 + j)] = legendre(j - i, q);
  static const int kZero[2][2] = {{1, -1}, {-1, -1}}, kOne[2][2] = {{1, 1}, {1, -1}};
  std::vector<int8_t> h(static_cast<size_t>(n * n), 0);
  for (int i = 0; i < c; ++i)
    for (int j = 0; j < c; ++j) {
      const int v = cm[static_cast<size_t>(i * c + j)];
      for (int a = 0; a < 2; ++a)
        for (int b = 0; b < 2; ++b)
          h[static_cast<size_t>((2 * i + a) * n + 2 * j + b)] = static_cast<int8_t>(v == 0 ? kZero[a][b] : v * kOne[a][b]);
    }
  return h;
}

// Natural-order Sylvester transform of p = 2^k contiguous values (H_p symmetric).
void fwht(float* x, int64_t p) {
  for (int64_t h = 1; h < p; h <<= 1)
    for (int64_t i = 0; i < p; i += 2 * h)
      for (int64_t j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
}

}  // namespace

const std::vector<int8_t>& hadamard_base(int m) {
  static const std::vector<int8_t> h1{1};
  static const std::vector<int8_t> h12 = paley1(11);
  static const std::vector<int8_t> h20 = paley1(19);
  static const std::vector<int8_t> h28 = paley2(13);
  switch (m) {
    case 1: return h1;
    case 12: return h12;
    case 20: return h20;
    case 28: return h28;
    default: break;
  }
  LARDER_CHECK(false, "hadamard_base(%d): only 1, 12, 20, 28 exist", m);
  std::abort();
}

Result<Rotation> Rotation::make(int64_t n, uint64_t seed, uint64_t lane) {
  Rotation r;
  LARDER_RETURN_IF_ERROR(hadamard_factor(n, &r.m_, &r.p_));
  r.n_ = n;
  r.scale_ = static_cast<float>(1.0 / std::sqrt(static_cast<double>(n)));
  r.signs_ = rotation_signs(seed, lane, n);
  r.hm_ = &hadamard_base(r.m_);
  return r;
}

std::string Rotation::construction() const {
  if (identity()) return "none";
  if (m_ == 1) return strfmt("H_%lld", static_cast<long long>(n_));
  if (p_ == 1) return strfmt("H_%d", m_);
  return strfmt("H_%d (x) H_%lld", m_, static_cast<long long>(p_));
}

void Rotation::rowT(float* x, float* scratch) const {
  if (identity()) return;
  for (int64_t i = 0; i < n_; ++i) x[i] *= signs_[static_cast<size_t>(i)];
  for (int64_t c = 0; c < m_; ++c) fwht(x + c * p_, p_);
  if (m_ > 1) {
    // out[a][b] = Σ_a' H_m[a][a'] · x[a'][b]: whole rows of p at a time, so the inner loop is
    // contiguous.
    std::memcpy(scratch, x, static_cast<size_t>(n_) * sizeof(float));
    const int8_t* h = hm_->data();
    for (int a = 0; a < m_; ++a) {
      float* out = x + a * p_;
      for (int64_t b = 0; b < p_; ++b) out[b] = 0.0f;
      for (int a2 = 0; a2 < m_; ++a2) {
        const float* in = scratch + a2 * p_;
        if (h[a * m_ + a2] > 0)
          for (int64_t b = 0; b < p_; ++b) out[b] += in[b];
        else
          for (int64_t b = 0; b < p_; ++b) out[b] -= in[b];
      }
    }
  }
  for (int64_t i = 0; i < n_; ++i) x[i] *= scale_;
}

}  // namespace larder::quant
