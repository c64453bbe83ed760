// Fast microscaling-float matmuls (cpu/avx2/matmul_mx_avx2.cpp, cpu/avx512/matmul_mx_avx512.cpp;
// formats in kernels/microscaling.h) vs the scalar reference, on every tier the CPU has, over random
// shapes, token counts (decode and prefill) and thread counts.
//
// fp4 (GGUF MXFP4, MLX mxfp4 / nvfp4): the kernels run value = s·w with w the doubled e2m1 value
// (an int8) and s the group's scale, against int8 activation blocks of 32 (act_quant.h), so as for
// the GGUF integer formats (gguf_fast_test.cpp) the error against the exact-decoding reference is
// at most Q = Σ_blocks (d_x/2)·Σ|w_i| plus f32 rounding, and a tight check replays the activation
// quantizer (tests/support/act_replay.h) and computes Σ w_i·x̂_i exactly: the kernel must agree within
// 2·(nb + 16)·u·Σ A_i·|x̂_i|, A_i = |w_i| + 256|s_i| (AVX-512 feeds w + 128 with bias −128·s).
// mxfp8 runs in f32 (no activation quantization): within 2·(cols/8 + 16)·u·Σ|w_i·x_i| of the
// reference. Weights: every code pattern, scales over several octaves.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "larder/core/cpuid.h"
#include "larder/core/threadpool.h"
#include "larder/kernels/cpu/common/cpu_kernels.h"
#include "larder/kernels/dispatch.h"
#include "larder/kernels/microscaling.h"
#include "larder/kernels/ref/ref_ops.h"
#include "../../support/act_replay.h"

namespace larder::kernels {
namespace {

constexpr double kU = 1.0 / (1 << 24);

struct MxWeights {
  std::vector<uint8_t> data, scales;
  WeightView view;
  std::vector<float> deq;    // the reference's decoding
  std::vector<double> gscale;  // the kernel's per-element scale s (fp4: value = s·int8)
};

MxWeights make(DType dt, int64_t rows, int64_t cols, std::mt19937& rng) {
  MxWeights w;
  w.view.dtype = dt;
  w.view.rows = rows;
  w.view.cols = cols;
  w.data.resize(dtype_bytes(dt, static_cast<uint64_t>(rows * cols)));
  for (auto& b : w.data) b = static_cast<uint8_t>(rng());
  if (dt == DType::kMXFP4)
    for (size_t b = 0; b < w.data.size(); b += 17) w.data[b] = static_cast<uint8_t>(112 + rng() % 16);
  if (dt == DType::kMlxMXFP8)
    for (auto& b : w.data)
      if ((b & 0x7f) == 0x7f) b ^= 1;
  if (const int g = mlx_microscaling_group(dt)) {
    w.scales.resize(static_cast<size_t>(rows * (cols / g)));
    for (auto& s : w.scales) s = static_cast<uint8_t>(dt == DType::kMlxNVFP4 ? 0x08 + rng() % 48 : 112 + rng() % 16);
    w.view.scales = w.scales.data();
    w.view.scale_dtype = DType::kU8;
    w.view.group_size = g;
  }
  w.view.data = w.data.data();
  w.deq.resize(static_cast<size_t>(rows * cols));
  w.gscale.resize(w.deq.size());
  for (int64_t r = 0; r < rows; ++r) {
    ref_table().dequant_row[static_cast<int>(dt)](w.view, r, w.deq.data() + r * cols);
    for (int64_t c = 0; c < cols; ++c) {
      double s = 0;
      switch (dt) {
        case DType::kMXFP4: s = e8m0_half_to_f32(w.data[static_cast<size_t>(r * (cols / 32) + c / 32) * 17]); break;
        case DType::kMlxMXFP4: s = 0.5 * e8m0_to_f32(w.scales[static_cast<size_t>(r * (cols / 32) + c / 32)]); break;
        case DType::kMlxNVFP4: s = 0.5 * e4m3_to_f32(w.scales[static_cast<size_t>(r * (cols / 16) + c / 16)]); break;
        default: break;
      }
      w.gscale[static_cast<size_t>(r * cols + c)] = std::fabs(s);
    }
  }
  return w;
}

std::vector<float> acts(int64_t n, int64_t cols, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n * cols));
  for (auto& v : x) v = nd(rng);
  for (int64_t t = 0; t < n; ++t) x[static_cast<size_t>(t * cols + rng() % cols)] *= 30.0f;  // an outlier per token
  return x;
}

void check(const char* tier, DType dt) {
  const MatmulFn fast = cpu::fast_matmul(tier, dt);
  ASSERT_NE(fast, nullptr) << tier << " " << dtype_name(dt);
  const bool fp8 = dt == DType::kMlxMXFP8;
  std::mt19937 rng(static_cast<unsigned>(static_cast<int>(dt) * 31 + tier[3]));
  const int64_t rows_set[] = {1, 3, 7, 13, 31, 67};
  const int64_t cols_set[] = {32, 96, 352, 1024, 2336};
  double worst = 0;
  for (int threads : {1, 3}) {
    default_pool().set_threads(threads);
    for (int64_t n : {1, 2, 3, 8, 9, 17, 33, 130}) {
      for (int i = 0; i < 3; ++i) {
        const int64_t rows = rows_set[rng() % std::size(rows_set)], cols = cols_set[rng() % std::size(cols_set)];
        SCOPED_TRACE(testing::Message() << tier << " " << dtype_name(dt) << " rows " << rows << " cols " << cols << " n "
                                        << n << " threads " << threads);
        const MxWeights w = make(dt, rows, cols, rng);
        const std::vector<float> x = acts(n, cols, rng);
        std::vector<float> y(static_cast<size_t>(n * rows), -1234.0f), yref(y.size());
        fast(w.view, x.data(), n, y.data());
        ref::matmul(w.view, x.data(), n, yref.data());
        const test::ActReplay qa = test::replay_acts(x.data(), n, cols, false);
        for (int64_t t = 0; t < n; ++t)
          for (int64_t r = 0; r < rows; ++r) {
            double Q = 0, exact = 0, Sa = 0, S = 0;
            for (int64_t c = 0; c < cols; ++c) {
              const double wv = w.deq[static_cast<size_t>(r * cols + c)], xv = x[static_cast<size_t>(t * cols + c)];
              S += std::fabs(wv * xv);
              if (fp8) continue;
              const double dx = qa.dv(t, c), xq = qa.qv(t, c);
              Q += dx / 2 * std::fabs(wv);
              exact += dx * wv * xq;
              Sa += dx * (std::fabs(wv) + 256 * w.gscale[static_cast<size_t>(r * cols + c)]) * std::fabs(xq);
            }
            const double got = y[static_cast<size_t>(t * rows + r)], want = yref[static_cast<size_t>(t * rows + r)];
            double tol;
            if (fp8) {
              tol = 2 * (cols / 8 + 16) * kU * S + 1e-30;
            } else {
              const double tight = 2 * (cols / 32 + 16) * kU * Sa + 1e-30;
              ASSERT_LE(std::fabs(got - exact), tight) << "t " << t << " r " << r << " exact " << exact;
              tol = Q * (1 + 1e-6) + tight + 2 * kU * std::fabs(want);
            }
            ASSERT_LE(std::fabs(got - want), tol) << "t " << t << " r " << r << " got " << got << " want " << want;
            worst = std::max(worst, std::fabs(got - want) / tol);
          }
      }
    }
  }
  default_pool().set_threads(0);
  std::printf("[ %s %s ] max |err|/bound = %.3g\n", tier, dtype_name(dt), worst);
}

class FastMicroscaling : public testing::TestWithParam<DType> {};

TEST_P(FastMicroscaling, Avx2MatchesReferenceWithinBound) { check("avx2", GetParam()); }

TEST_P(FastMicroscaling, Avx512MatchesReferenceWithinBound) {
  if (!cpu_features().has_avx512_tier()) GTEST_SKIP() << "CPU lacks the AVX-512 tier";
  check("avx512", GetParam());
}

// The fused path (q/k/v, gate/up) is the single matmul's bits.
TEST_P(FastMicroscaling, MultiEqualsSingle) {
  const DType dt = GetParam();
  std::mt19937 rng(99);
  for (int64_t n : {1, 4, 9, 40}) {
    const MxWeights a = make(dt, 37, 352, rng), b = make(dt, 19, 352, rng);
    const std::vector<float> x = acts(n, 352, rng);
    std::vector<float> ya(static_cast<size_t>(n * 37)), yb(static_cast<size_t>(n * 19)), sa(ya.size()), sb(yb.size());
    const WeightView ws[2] = {a.view, b.view};
    float* ys[2] = {ya.data(), yb.data()};
    kernels::matmul_multi(ws, ys, 2, x.data(), n);
    kernels::matmul(a.view, x.data(), n, sa.data());
    kernels::matmul(b.view, x.data(), n, sb.data());
    EXPECT_EQ(0, std::memcmp(ya.data(), sa.data(), ya.size() * 4)) << "n " << n;
    EXPECT_EQ(0, std::memcmp(yb.data(), sb.data(), yb.size() * 4)) << "n " << n;
  }
}

// The active table runs every one of them fast (no silent fall-back to the reference).
TEST_P(FastMicroscaling, ActiveTableHasAFastKernel) {
  if (std::string(active_table().name) == "ref") GTEST_SKIP() << "LARDER_ISA=ref";
  EXPECT_NE(active_table().matmul[static_cast<int>(GetParam())], ref_table().matmul[static_cast<int>(GetParam())]);
}

INSTANTIATE_TEST_SUITE_P(Formats, FastMicroscaling,
                         testing::Values(DType::kMXFP4, DType::kMlxMXFP4, DType::kMlxNVFP4, DType::kMlxMXFP8),
                         [](const testing::TestParamInfo<DType>& p) { return std::string(dtype_name(p.param)); });

}  // namespace
}  // namespace larder::kernels
