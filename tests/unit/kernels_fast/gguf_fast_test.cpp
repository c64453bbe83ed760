// Fast GGUF Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q5_K, IQ4_XS matmuls (cpu/avx2/matmul_gguf_avx2.cpp,
// cpu/avx512/matmul_gguf_avx512.cpp) vs the scalar reference, on every tier the CPU has.
//
// Error bound, per output y[t, r] (u = 2^-24), derived like kquant_fast_test.cpp's. The kernels
// quantize activations to int8 blocks of 32 (act_quant.h: |x − d_x·q_x| <= d_x/2) and evaluate
// every weight as s·w + c (a scale and a bias per 16-element half, s and c formed in f32 exactly
// as the reference forms them), so versus the reference (double over the f32-decoded weights)
//   |err| <= Q = Σ_blocks (d_x/2)·Σ_{i∈block} |w_i|    + rounding.
// Rounding: the integer dots are exact (int32) and converted exactly; what is left is f32 scaling
// and accumulation over magnitudes A_i >= |s·w_i| + |c| — AVX2 decode: A_i = |w_i| + 2|c|; the AVX2
// prefill GEMM feeds u = w + o (o = 16 for Q5_0, 4 for Q3_K, else 0) with bias c − o·s, so
// A_i <= |w_i| + 2|c| + 32|s|; AVX-512 feeds w + 128 to vpdpbusd with bias c − 128·s, so
// A_i = |w_i| + 2|c| + 256|s| — over nb blocks, a lane
// tree, and the reference's own f32 decoding: tight = 2·(nb + 16)·u·Σ A_i·|x̂_i|.
// The integer super-block decode kernels (AVX-512 Q2_K, Q3_K, Q5_K, IQ4_XS, n <= 8) quantize per 256-element
// super-block instead (act_quant.h QuantizedActsK), so there Q sums d_x/2 of the super-block;
// their super-block dot is one exact int32 scaled by one f32 FMA per super-block (plus one for the
// mins), within the same rounding bound. AVX-512 IQ4_XS (same activations) keeps one exact int32
// per 4-element lane of a sub-block and scales it by d·ls_j, then by d_x (2 f32 roundings per lane,
// inside the per-block allowance of the bound).
// A second, tight check replays the quantizer the kernel used (tests/support/act_replay.h) and
// computes Σ w_i·x̂_i exactly in double: the kernel must agree within `tight`, which catches lane/layout bugs the loose bound
// could hide. Weights are random bytes (every code, high bit and packed scale pattern) with f16
// scales of realistic size; column counts include odd numbers of 32-blocks.
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
#include "larder/kernels/gguf_blocks.h"
#include "larder/kernels/ref/ref_ops.h"
#include "../../support/act_replay.h"

namespace larder::kernels {
namespace {

constexpr double kU = 1.0 / (1 << 24);


void put_u16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }
float f16_at(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return f16_to_f32(v);
}

// The scale s and bias c of element e of a block, from the format description (gguf_blocks.h).
void scale_bias(DType dt, const uint8_t* blk, int e, double* s, double* c) {
  *s = 0;
  *c = 0;
  switch (dt) {
    case DType::kQ4_1: *s = f16_at(blk); *c = f16_at(blk + 2); break;
    case DType::kQ5_1: *s = f16_at(blk); *c = f16_at(blk + 2); break;
    case DType::kQ5_0:
    case DType::kIQ4_NL: *s = f16_at(blk); break;
    case DType::kQ2_K: {
      const uint8_t sc = blk[offsetof(BlockQ2_K, scales) + e / 16];
      *s = double(f16_at(blk + offsetof(BlockQ2_K, d))) * (sc & 15);
      *c = double(f16_at(blk + offsetof(BlockQ2_K, dmin))) * (sc >> 4);
      break;
    }
    case DType::kQ3_K: {
      int sc;
      ref::q3_k_scale(blk + offsetof(BlockQ3_K, scales), e / 16, &sc);
      *s = double(f16_at(blk + offsetof(BlockQ3_K, d))) * sc;
      break;
    }
    case DType::kQ5_K: {
      int sc, m;
      ref::kquant_scale_min(blk + offsetof(BlockQ5_K, scales), e / 32, &sc, &m);
      *s = double(f16_at(blk)) * sc;
      *c = double(f16_at(blk + 2)) * m;
      break;
    }
    case DType::kIQ4_XS: {
      const int j = e / 32;
      const int sh = blk[2] | blk[3] << 8;
      const int ls = (((blk[4 + j / 2] >> (4 * (j % 2))) & 15) | (((sh >> (2 * j)) & 3) << 4)) - 32;
      *s = double(f16_at(blk)) * ls;
      break;
    }
    default: FAIL() << dtype_name(dt);
  }
  *s = std::fabs(*s);
  *c = std::fabs(*c);
}

std::vector<uint32_t> f16_fields(DType dt) {
  switch (dt) {
    case DType::kQ4_1:
    case DType::kQ5_1:
    case DType::kQ5_K: return {0, 2};
    case DType::kQ2_K: return {offsetof(BlockQ2_K, d), offsetof(BlockQ2_K, dmin)};
    case DType::kQ3_K: return {offsetof(BlockQ3_K, d)};
    default: return {0};
  }
}

struct GWeights {
  WeightView view;
  std::vector<uint8_t> bytes;
  std::vector<float> deq;   // [rows][cols]
  std::vector<double> mag;  // A_i (see the header)
};

GWeights make(DType dt, int64_t rows, int64_t cols, bool avx512, std::mt19937& rng) {
  GWeights w;
  const uint32_t bb = dtype_info(dt).block_bytes, be = dtype_info(dt).block_elems;
  const int64_t nblk = cols / be;
  w.bytes.resize(static_cast<size_t>(rows * nblk) * bb);
  for (auto& b : w.bytes) b = static_cast<uint8_t>(rng() & 0xff);
  std::uniform_real_distribution<float> ds(0.0002f, 0.004f);
  for (int64_t i = 0; i < rows * nblk; ++i) {
    for (uint32_t off : f16_fields(dt)) put_u16(w.bytes.data() + i * bb + off, f32_to_f16((rng() & 1 ? 1 : -1) * ds(rng)));
  }
  w.view = WeightView{dt, rows, cols, w.bytes.data()};
  w.deq.resize(static_cast<size_t>(rows * cols));
  w.mag.resize(w.deq.size());
  for (int64_t r = 0; r < rows; ++r) {
    ref_table().dequant_row[static_cast<int>(dt)](w.view, r, w.deq.data() + r * cols);
    for (int64_t c = 0; c < cols; ++c) {
      double s, b;
      scale_bias(dt, w.bytes.data() + (r * nblk + c / be) * bb, static_cast<int>(c % be), &s, &b);
      w.mag[r * cols + c] = std::fabs(double(w.deq[r * cols + c])) + 2 * b + (avx512 ? 256 * s : 32 * s);
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

void check_tier(const char* tier, DType dt) {
  const MatmulFn fast = cpu::fast_matmul(tier, dt);
  ASSERT_NE(fast, nullptr) << tier << " " << dtype_name(dt);
  const bool avx512 = std::strcmp(tier, "avx512") == 0;
  std::mt19937 rng(static_cast<unsigned>(static_cast<int>(dt) * 37 + (avx512 ? 11 : 3)));
  const int64_t rows_set[] = {1, 2, 3, 4, 5, 7, 8, 9, 13, 31, 67};
  // 530 tokens: two chunks of token groups in the prefill GEMMs, and (with 2304/2336 columns) K
  // slices with a ragged last one: of 32 blocks in the AVX-512 GEMM (gemm16_avx512.h run_gemm16),
  // of 16 in the AVX2 one (matmul_driver.h run_gemm_sliced, which slices above 2048 columns).
  const int64_t n_set[] = {1, 2, 3, 4, 5, 7, 8, 9, 17, 33, 530};
  const bool k256 = dtype_info(dt).block_elems == 256;
  const std::vector<int64_t> cols_set = k256 ? std::vector<int64_t>{256, 512, 768, 1280}
                                             : std::vector<int64_t>{32, 64, 96, 160, 352, 1024, 1312};
  double worst_rel = 0, worst_ratio = 0;
  for (int threads : {1, 3}) {
    default_pool().set_threads(threads);
    for (int64_t n : n_set) {
      for (int i = 0; i < (n > 64 ? 1 : 3); ++i) {
        const int64_t drawn_rows = rows_set[rng() % std::size(rows_set)];
        const int64_t drawn = cols_set[rng() % cols_set.size()];
        // The first decode case of each n runs 8192 columns: rows past simd::long_rows' 8 KiB per
        // tile take the per-row prefetch regime (the down projection's), a separate instantiation.
        // The long prompt takes 21 rows (8-, 4- and 1-row tiles).
        const int64_t rows = n > 64 ? 21 : drawn_rows;
        const int64_t cols = n > 64 ? (k256 ? 2304 : 2336) : (i == 0 && n <= 3) ? 8192 : drawn;
        SCOPED_TRACE(testing::Message() << tier << " " << dtype_name(dt) << " rows " << rows << " cols " << cols
                                        << " n " << n << " threads " << threads);
        GWeights w = make(dt, rows, cols, avx512, rng);
        std::vector<float> x = acts(n, cols, rng);
        std::vector<float> y(static_cast<size_t>(n * rows), -1234.0f), yref(y.size());
        fast(w.view, x.data(), n, y.data());
        ref::matmul(w.view, x.data(), n, yref.data());
        const test::ActReplay qa = test::replay_acts(x.data(), n, cols, test::super_block_acts(tier, dt, n));
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

class FastGguf : public testing::TestWithParam<DType> {};

TEST_P(FastGguf, Avx2MatchesReferenceWithinBound) { check_tier("avx2", GetParam()); }

TEST_P(FastGguf, Avx512MatchesReferenceWithinBound) {
  if (!cpu_features().has_avx512_tier()) GTEST_SKIP() << "CPU lacks the AVX-512 tier";
  check_tier("avx512", GetParam());
}

// The AVX-512 kernels pass the startup self-check against AVX2 that guards the tier on machines
// the tests never ran on.
TEST_P(FastGguf, Avx512PassesStartupSelfCheck) {
  if (!cpu_features().has_avx512_tier()) GTEST_SKIP() << "CPU lacks the AVX-512 tier";
  EXPECT_TRUE(cpu::fast_matmul_agrees(GetParam(), cpu::fast_matmul("avx512", GetParam()),
                                      cpu::fast_matmul("avx2", GetParam())));
}

// The active table routes each format to the fast kernel of the CPU's tier (unless LARDER_ISA /
// LARDER_QUANT_ACT say otherwise); row lookup stays on the reference.
TEST_P(FastGguf, Registered) {
  const DType d = GetParam();
  const char* isa = std::getenv("LARDER_ISA");
  const char* qa = std::getenv("LARDER_QUANT_ACT");
  if ((isa && std::strcmp(isa, "ref") == 0) || (qa && std::strcmp(qa, "0") == 0)) GTEST_SKIP();
  const bool avx512 = cpu_features().has_avx512_tier() && !(isa && std::strcmp(isa, "avx2") == 0);
  EXPECT_EQ(active_table().matmul[static_cast<int>(d)], cpu::fast_matmul(avx512 ? "avx512" : "avx2", d));
  EXPECT_EQ(active_table().dequant_row[static_cast<int>(d)], ref_table().dequant_row[static_cast<int>(d)]);
}

INSTANTIATE_TEST_SUITE_P(Formats, FastGguf,
                         testing::Values(DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kIQ4_NL, DType::kQ2_K,
                                         DType::kQ3_K, DType::kQ5_K, DType::kIQ4_XS),
                         [](const testing::TestParamInfo<DType>& p) { return std::string(dtype_name(p.param)); });

}  // namespace
}  // namespace larder::kernels
