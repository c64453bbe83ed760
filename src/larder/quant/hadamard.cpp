// hadamard.cpp — see hadamard.h.
#include "larder/quant/hadamard.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <algorithm>

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

namespace {

bool is_prime(int64_t q) {
  if (q < 2) return false;
  for (int64_t d = 2; d * d <= q; ++d)
    if (q % d == 0) return false;
  return true;
}

// q = p^k with p prime and k >= 1.
bool prime_power(int64_t q, int* p, int* k) {
  if (q < 2) return false;
  int64_t d = 2;
  while (d * d <= q && q % d != 0) ++d;
  if (q % d != 0) d = q;  // q is prime
  int64_t r = q;
  int e = 0;
  while (r % d == 0) r /= d, ++e;
  if (r != 1) return false;
  *p = static_cast<int>(d);
  *k = e;
  return true;
}

// GF(q), q = p^k: an element is the base-p digit string of the coefficients of a polynomial in x
// of degree < k, so 0..q-1 enumerate the field and for k = 1 the digits are the residues mod p
// (which keeps the prime-order bases identical to the plain Legendre construction).
class FiniteField {
 public:
  FiniteField(int p, int k) : p_(p), k_(k), q_(1) {
    for (int i = 0; i < k; ++i) q_ *= p;
    if (k > 1) modulus_ = irreducible();
  }
  int size() const { return q_; }

  int sub(int a, int b) const {
    int out = 0, place = 1;
    for (int i = 0; i < k_; ++i, a /= p_, b /= p_, place *= p_) out += ((a % p_ - b % p_ + p_) % p_) * place;
    return out;
  }

  int mul(int a, int b) const {
    if (k_ == 1) return static_cast<int>((int64_t{a} * b) % p_);
    std::vector<int> prod(static_cast<size_t>(2 * k_ - 1), 0);
    const std::vector<int> x = digits(a), y = digits(b);
    for (int i = 0; i < k_; ++i)
      for (int j = 0; j < k_; ++j) prod[static_cast<size_t>(i + j)] = (prod[static_cast<size_t>(i + j)] + x[i] * y[j]) % p_;
    reduce(&prod, modulus_);
    int out = 0;
    for (int i = k_ - 1; i >= 0; --i) out = out * p_ + prod[static_cast<size_t>(i)];
    return out;
  }

  // χ(a) for every element: 0 for 0, +1 for a non-zero square, -1 otherwise.
  std::vector<int> quadratic_character() const {
    std::vector<int> chi(static_cast<size_t>(q_), -1);
    chi[0] = 0;
    for (int x = 1; x < q_; ++x) chi[static_cast<size_t>(mul(x, x))] = 1;
    return chi;
  }

 private:
  std::vector<int> digits(int a) const {
    std::vector<int> d(static_cast<size_t>(k_));
    for (int i = 0; i < k_; ++i, a /= p_) d[static_cast<size_t>(i)] = a % p_;
    return d;
  }

  // poly ← poly mod m (m monic, coefficients low to high); poly keeps deg(m) coefficients.
  void reduce(std::vector<int>* poly, const std::vector<int>& m) const {
    std::vector<int>& a = *poly;
    const int dm = static_cast<int>(m.size()) - 1;
    for (int i = static_cast<int>(a.size()) - 1; i >= dm; --i) {
      const int c = a[static_cast<size_t>(i)];
      if (c == 0) continue;
      for (int j = 0; j <= dm; ++j) {
        int& t = a[static_cast<size_t>(i - dm + j)];
        t = ((t - c * m[static_cast<size_t>(j)]) % p_ + p_) % p_;
      }
    }
    a.resize(static_cast<size_t>(dm));
  }

  // The first monic polynomial of degree k (coefficients counted up in base p) with no monic
  // factor of degree 1..k/2 — found in O(q^{1/2}) trial divisions.
  std::vector<int> irreducible() const {
    for (int low = 0; low < q_; ++low) {
      std::vector<int> f = digits(low);
      f.push_back(1);
      bool reducible = false;
      for (int d = 1; d <= k_ / 2 && !reducible; ++d) {
        int count = 1;
        for (int i = 0; i < d; ++i) count *= p_;
        for (int g = 0; g < count && !reducible; ++g) {
          std::vector<int> div(static_cast<size_t>(d + 1), 0);
          for (int i = 0, v = g; i < d; ++i, v /= p_) div[static_cast<size_t>(i)] = v % p_;
          div[static_cast<size_t>(d)] = 1;
          std::vector<int> r = f;
          reduce(&r, div);
          reducible = std::all_of(r.begin(), r.end(), [](int c) { return c == 0; });
        }
      }
      if (!reducible) return f;
    }
    LARDER_CHECK(false, "no irreducible polynomial of degree %d over GF(%d)", k_, p_);
    std::abort();
  }

  int p_, k_, q_;
  std::vector<int> modulus_;
};

// Paley I (q ≡ 3 mod 4): H = I + [[0, 1ᵀ], [-1, Q]] with the Jacobsthal matrix Q[i][j] = χ(j − i),
// of order q + 1. Q is antisymmetric for such q, which is what makes H·Hᵀ = (q+1)·I.
std::vector<int8_t> paley1(const FiniteField& f) {
  const int q = f.size(), n = q + 1;
  const std::vector<int> chi = f.quadratic_character();
  std::vector<int8_t> h(static_cast<size_t>(n * n), 0);
  auto at = [&](int i, int j) -> int8_t& { return h[static_cast<size_t>(i * n + j)]; };
  for (int j = 1; j < n; ++j) at(0, j) = 1, at(j, 0) = -1;
  for (int i = 0; i < q; ++i)
    for (int j = 0; j < q; ++j) at(1 + i, 1 + j) = static_cast<int8_t>(chi[static_cast<size_t>(f.sub(j, i))]);
  for (int i = 0; i < n; ++i) at(i, i) = static_cast<int8_t>(at(i, i) + 1);
  return h;
}

// Paley II (q ≡ 1 mod 4): the symmetric conference matrix C = [[0, 1ᵀ], [1, Q]] of order q + 1,
// with each 0 replaced by [[1, -1], [-1, -1]] and each ±1 by ±[[1, 1], [1, -1]]; order 2(q + 1).
std::vector<int8_t> paley2(const FiniteField& f) {
  const int q = f.size(), c = q + 1, n = 2 * c;
  const std::vector<int> chi = f.quadratic_character();
  std::vector<int> cm(static_cast<size_t>(c * c), 0);
  for (int j = 1; j < c; ++j) cm[static_cast<size_t>(j)] = cm[static_cast<size_t>(j * c)] = 1;
  for (int i = 0; i < q; ++i)
    for (int j = 0; j < q; ++j) cm[static_cast<size_t>((1 + i) * c + 1 + j)] = chi[static_cast<size_t>(f.sub(j, i))];
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

// How to build H_m: Paley I or II, over GF(q). Prime q before prime powers, Paley I before II, so
// the long-standing bases (12 = Paley I of 11, 20 = of 19, 28 = Paley II of 13) stay what they were.
struct BasePlan {
  int paley = 0;  // 0: none; 1 or 2
  int q = 0, p = 0, k = 0;
};

BasePlan plan_base(int m) {
  BasePlan b;
  if (m < 4 || m % 4 != 0 || m > kMaxHadamardBase) return b;
  for (bool want_prime : {true, false}) {
    int p = 0, k = 0;
    if (prime_power(m - 1, &p, &k) && (k == 1) == want_prime && (m - 1) % 4 == 3) return {1, m - 1, p, k};
    if (m % 8 == 4 && prime_power(m / 2 - 1, &p, &k) && (k == 1) == want_prime) return {2, m / 2 - 1, p, k};
  }
  return b;
}

bool constructible(int64_t m) { return m == 1 || (m <= kMaxHadamardBase && plan_base(static_cast<int>(m)).paley != 0); }

// The smallest constructible m with n = m·2^k, or 0.
int64_t smallest_base(int64_t n) {
  if (n <= 0) return 0;
  int64_t odd = n;
  while (odd % 2 == 0) odd /= 2;
  for (int64_t m = odd; m <= n; m *= 2)
    if (constructible(m)) return m;
  return 0;
}

}  // namespace

std::string hadamard_base_construction(int m) {
  if (m == 1) return "1";
  const BasePlan b = plan_base(m);
  if (b.paley == 0) return "";
  return b.k == 1 ? strfmt("Paley %s, q = %d", b.paley == 1 ? "I" : "II", b.q)
                  : strfmt("Paley %s, q = %d = %d^%d", b.paley == 1 ? "I" : "II", b.q, b.p, b.k);
}

Status hadamard_factor(int64_t n, int* m, int64_t* pow2) {
  const int64_t b = smallest_base(n);
  if (b != 0) {
    *m = static_cast<int>(b);
    *pow2 = n / b;
    return Status::ok();
  }
  if (n <= 0) return unsupported(strfmt("[hadamard] size %lld is not supported: a rotation size must be positive",
                                        static_cast<long long>(n)));
  int64_t odd = n;
  while (odd % 2 == 0) odd /= 2;
  int64_t below = n - 1, above = n + 1;
  while (below > 0 && smallest_base(below) == 0) --below;
  while (smallest_base(above) == 0) ++above;
  return unsupported(strfmt(
      "[hadamard] size %lld is not supported: a rotation size must be m*2^k with a Hadamard base H_m larder can build "
      "(m = q+1 for a prime power q = 3 mod 4, or 2(q+1) for q = 1 mod 4, m <= %d), and %lld = %lld*2^k has none; "
      "the nearest rotatable sizes are %lld and %lld",
      static_cast<long long>(n), kMaxHadamardBase, static_cast<long long>(n), static_cast<long long>(odd),
      static_cast<long long>(below), static_cast<long long>(above)));
}

namespace {

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
  static std::mutex mu;
  static std::map<int, std::vector<int8_t>> built;  // node-based: references stay valid
  std::lock_guard<std::mutex> lock(mu);
  auto it = built.find(m);
  if (it != built.end()) return it->second;
  if (m == 1) return built.emplace(1, std::vector<int8_t>{1}).first->second;
  const BasePlan b = plan_base(m);
  LARDER_CHECK(b.paley != 0, "hadamard_base(%d): no construction (see hadamard_base_construction)", m);
  const FiniteField f(b.p, b.k);
  return built.emplace(m, b.paley == 1 ? paley1(f) : paley2(f)).first->second;
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
