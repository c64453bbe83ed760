// AVX2 GGUF Q4_K / Q6_K matmuls (kernels/cpu/avx2/matmul_kquant_avx2.cpp) vs the scalar reference.
//
// Error bound, per output y[t, r] (u = 2^-24). Like Q8_0/Q4_0 (matmul_fast_test.cpp) the kernels
// quantize activations to int8 blocks of 32 (act_quant.h: |x − d_x·q_x| <= d_x/2), and the weight
// values are exact, so versus the reference (double over the f32-decoded weights)
//   |err| <= Q = Σ_blocks (d_x/2)·Σ_{i∈block} |w_i|    + rounding.
// Rounding: the kernel evaluates each weight as integer parts (d·sc·u − dmin·m for Q4_K,
// d·sc·(u − 32) for Q6_K) whose magnitudes A_i = |d·sc|·(u_i + z) + |dmin·m| (z = 0 / 32) exceed
// |w_i|; the per-block integer dots are exact (int32, far from overflow) and converted exactly, so
// what is left is f32 scaling and accumulation: 8 sub-block FMAs per super-block, nb/8
// super-blocks, a lane tree, and the reference's own f32 decoding of w (one rounding each):
//   tight = 2·(nb + 16)·u·Σ A_i·|x̂_i|.
// The integer super-block kernels (AVX-512 Q4_K decode, and its prefill GEMM's super-block path
// where gemm_super_blocks says so) quantize per 256-element super-block instead (act_quant.h QuantizedActsK: |x − d_x·q_x| <= d_x/2 with d_x from the amax of
// 256 values), so there Q sums d_x/2 of the super-block; their super-block dot is one exact int32
// (lanes < 2^22) scaled by one f32 FMA per super-block plus one for the mins: fewer roundings
// than the bound above allows.
// A second, tight check replays the quantizer the kernel used (tests/support/act_replay.h) and
// computes Σ w_i·x̂_i exactly in double: the kernel must agree within `tight`, which catches lane/layout bugs the loose bound
// could hide. Weights are random bytes (every code, scale and min pattern) with f16 super-scales
// of realistic size.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "larder/core/cpuid.h"
#include "larder/core/dtype.h"
#include "larder/core/threadpool.h"
#include "larder/kernels/cpu/common/act_quant.h"
#include "larder/kernels/cpu/common/cpu_kernels.h"
#include "larder/kernels/dispatch.h"
#include "larder/kernels/ref/ref_ops.h"
#include "../../support/act_replay.h"

namespace larder::kernels {
namespace {

constexpr double kU = 1.0 / (1 << 24);


void put_u16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }
uint16_t get_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

struct KWeights {
  WeightView view;
  std::vector<uint8_t> bytes;
  std::vector<float> deq;  // [rows][cols]
  std::vector<double> mag;  // A_i (see the header)
};

KWeights make(DType dt, int64_t rows, int64_t cols, std::mt19937& rng) {
  KWeights w;
  const uint32_t bb = dtype_info(dt).block_bytes;
  const int64_t nsb = cols / 256;
  w.bytes.resize(static_cast<size_t>(rows * nsb) * bb);
  for (auto& b : w.bytes) b = static_cast<uint8_t>(rng() & 0xff);
  std::uniform_real_distribution<float> ds(0.0002f, 0.004f);
  for (int64_t i = 0; i < rows * nsb; ++i) {
    uint8_t* blk = w.bytes.data() + i * bb;
    if (dt == DType::kQ6_K) {
      put_u16(blk + 208, f32_to_f16((rng() & 1 ? 1 : -1) * ds(rng)));
    } else {
      put_u16(blk, f32_to_f16(ds(rng)));
      put_u16(blk + 2, f32_to_f16(ds(rng)));
    }
  }
  w.view = WeightView{dt, rows, cols, w.bytes.data()};
  w.deq.resize(static_cast<size_t>(rows * cols));
  w.mag.resize(w.deq.size());
  for (int64_t r = 0; r < rows; ++r) {
    ref_table().dequant_row[static_cast<int>(dt)](w.view, r, w.deq.data() + r * cols);
    for (int64_t c = 0; c < cols; ++c) {
      const uint8_t* blk = w.bytes.data() + (r * nsb + c / 256) * bb;
      const int e = static_cast<int>(c % 256);
      double a;
      if (dt == DType::kQ6_K) {
        const double dsc = std::fabs(double(f16_to_f32(get_u16(blk + 208))) * static_cast<int8_t>(blk[192 + e / 16]));
        a = std::fabs(double(w.deq[r * cols + c])) + 64 * dsc;  // >= |d·sc|·(u + 32)
      } else {
        int sc, m;
        ref::kquant_scale_min(blk + 4, e / 32, &sc, &m);
        const double dm = double(f16_to_f32(get_u16(blk + 2))) * m;
        a = std::fabs(double(w.deq[r * cols + c])) + 2 * dm;  // >= |d·sc·u| + |dmin·m|
      }
      w.mag[r * cols + c] = a;
    }
  }
  return w;
}

std::vector<float> acts(int64_t n, int64_t cols, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n * cols));
  for (auto& v : x) v = nd(rng);
  for (int j = 32; j < 64 && j < cols; ++j) x[j] = 0.0f;  // an all-zero activation block
  if (x.size() > 7) x[7] = 40.0f;                         // an outlier
  return x;
}

class FastKQuant : public testing::TestWithParam<DType> {};

// decode: a decode kernel called directly (any n, super-block activations) instead of the tier's
// registered matmul.
void check_kquant_tier(const char* tier, DType dt, MatmulFn decode = nullptr) {
  const MatmulFn fast = decode ? decode : cpu::fast_matmul(tier, dt);
  ASSERT_NE(fast, nullptr);
  std::mt19937 rng(static_cast<unsigned>(static_cast<int>(dt) * 31 + 5));
  const int64_t rows_set[] = {1, 2, 3, 4, 5, 7, 8, 9, 13, 31, 67};
  // 530 tokens: two chunks of token groups in the prefill GEMM, and (with 2304 columns) K slices
  // with a ragged last one: 32 blocks in gemm16_avx512.h's run_gemm16, 16 in the AVX2 Q6_K GEMM's
  // run_gemm_sliced (matmul_driver.h).
  const int64_t n_set[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 17, 33, 530};
  const int64_t cols_set[] = {256, 512, 768, 1280, 2048};
  double worst_rel = 0, worst_ratio = 0;
  for (int threads : {1, 3}) {
    default_pool().set_threads(threads);
    for (int64_t n : n_set) {
      for (int i = 0; i < (n > 64 ? 1 : 4); ++i) {
        const int64_t drawn_rows = rows_set[rng() % std::size(rows_set)];
        const int64_t drawn = cols_set[rng() % std::size(cols_set)];
        // The first decode case of each n runs 8192 columns: rows past simd::long_rows' 8 KiB per
        // tile take the per-row prefetch regime (the down projection's), a separate instantiation.
        // The long prompt takes 21 rows (8-, 4- and 1-row tiles).
        const int64_t rows = n > 64 ? 21 : drawn_rows;
        const int64_t cols = n > 64 ? 2304 : (i == 0 && n <= 3) ? 8192 : drawn;
        SCOPED_TRACE(testing::Message() << dtype_name(dt) << " rows " << rows << " cols " << cols << " n " << n
                                        << " threads " << threads);
        KWeights w = make(dt, rows, cols, rng);
        std::vector<float> x = acts(n, cols, rng);
        std::vector<float> y(static_cast<size_t>(n * rows), -1234.0f), yref(y.size());
        fast(w.view, x.data(), n, y.data());
        ref::matmul(w.view, x.data(), n, yref.data());
        const test::ActReplay qa = test::replay_acts(x.data(), n, cols, decode || test::super_block_acts(tier, dt, n));
        const int64_t nb = cols / 32;
        for (int64_t t = 0; t < n; ++t) {
          for (int64_t r = 0; r < rows; ++r) {
            double Q = 0, exact = 0, Sa = 0, S = 0;
            for (int64_t c = 0; c < cols; ++c) {
              const double dx = qa.dv(t, c), xq = qa.qv(t, c);
              const double wv = w.deq[r * cols + c];
              Q += dx / 2 * std::fabs(wv);
              exact += dx * wv * xq;
              Sa += dx * w.mag[r * cols + c] * std::fabs(xq);
              S += std::fabs(wv * x[t * cols + c]);
            }
            const double got = y[t * rows + r], want = yref[t * rows + r];
            const double tight = 2 * (nb + 16) * kU * Sa + 1e-30;
            ASSERT_LE(std::fabs(got - exact), tight) << "t " << t << " r " << r << " exact " << exact;
            const double tol = Q * (1 + 1e-6) + tight + 2 * kU * std::fabs(want);
            const double err = std::fabs(got - want);
            ASSERT_LE(err, tol) << "t " << t << " r " << r << " got " << got << " want " << want;
            if (S > 0) worst_rel = std::max(worst_rel, err / S);
            worst_ratio = std::max(worst_ratio, err / tol);
          }
        }
      }
    }
  }
  default_pool().set_threads(0);
  std::printf("[ %s %s ] max |err|/sum|w*x| = %.3g, max |err|/bound = %.3g\n", tier, dtype_name(dt), worst_rel,
              worst_ratio);
}

TEST_P(FastKQuant, Avx2MatchesReferenceWithinBound) { check_kquant_tier("avx2", GetParam()); }

// AVX-512: Q4_K and Q6_K prefill (n >= 9) on the VNNI GEMM, decode on the tier's own kernels (Q4_K
// over super-block activations) — same bound (exact integer dots, f32 scaling).
TEST_P(FastKQuant, Avx512MatchesReferenceWithinBound) {
  if (!cpu_features().has_avx512_tier()) GTEST_SKIP() << "CPU lacks the AVX-512 tier";
  if (!cpu::fast_matmul("avx512", GetParam())) GTEST_SKIP() << "no AVX-512 kernel for " << dtype_name(GetParam());
  check_kquant_tier("avx512", GetParam());
}

// The AVX-512 Q6_K super-block decode kernel, not registered yet (register.cpp says why).
TEST(FastKQuantDecode, Avx512Q6KSuperBlockMatchesReferenceWithinBound) {
  if (!cpu_features().has_avx512_tier()) GTEST_SKIP() << "CPU lacks the AVX-512 tier";
  check_kquant_tier("avx512", DType::kQ6_K, cpu::avx512::decode_q6_k_superblock);
}

// The active table routes Q4_K / Q6_K to the fast kernels of the CPU's tier (AVX-512 where it has
// one, else AVX2; unless LARDER_ISA / LARDER_QUANT_ACT say otherwise) and row lookup stays on the
// reference.
TEST(FastKQuantTable, Registered) {
  const char* isa = std::getenv("LARDER_ISA");
  const char* qa = std::getenv("LARDER_QUANT_ACT");
  if ((isa && std::strcmp(isa, "ref") == 0) || (qa && std::strcmp(qa, "0") == 0)) GTEST_SKIP();
  for (DType d : {DType::kQ4_K, DType::kQ6_K}) {
    const bool avx512 = cpu_features().has_avx512_tier() && cpu::fast_matmul("avx512", d) &&
                        !(isa && std::strcmp(isa, "avx2") == 0);
    EXPECT_EQ(active_table().matmul[static_cast<int>(d)], cpu::fast_matmul(avx512 ? "avx512" : "avx2", d))
        << dtype_name(d);
    EXPECT_EQ(active_table().dequant_row[static_cast<int>(d)], ref_table().dequant_row[static_cast<int>(d)]);
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, FastKQuant, testing::Values(DType::kQ4_K, DType::kQ6_K),
                         [](const testing::TestParamInfo<DType>& p) { return std::string(dtype_name(p.param)); });

}  // namespace
}  // namespace larder::kernels
