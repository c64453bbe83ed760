// kernels::matmul_multi (q/k/v and gate/up as one job) against one matmul per weight.
//
// The fused paths run the same tiles on the same quantized activations, so each output must equal
// the tier's own single matmul up to f32 summation order (a tile straddling two matrices runs row
// by row, and the AVX2 Q4_0 kernel pairs rows differently): we allow 1e-5 of the output's scale.
// A lane, offset or part-boundary bug is off by the order of the output itself. The single
// matmuls are checked against the scalar reference in matmul_fast_test / kquant_fast_test.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "larder/core/cpuid.h"
#include "larder/core/dtype.h"
#include "larder/core/threadpool.h"
#include "larder/kernels/cpu/common/cpu_kernels.h"
#include "larder/kernels/dispatch.h"
#include "larder/kernels/gguf_blocks.h"
#include "larder/kernels/ops.h"

namespace larder::kernels {
namespace {

// Random codes with valid f16 scale fields (~0.001–0.02: outputs of order 1).
std::vector<uint8_t> random_weights(DType dt, int64_t rows, int64_t cols, std::mt19937& rng) {
  std::vector<uint8_t> w(dtype_bytes(dt, static_cast<uint64_t>(rows * cols)));
  if (dt == DType::kBF16 || dt == DType::kF16) {  // random bytes would be NaN/Inf: values of order 1/sqrt(cols)
    std::normal_distribution<float> nd(0.0f, 0.03f);
    for (size_t i = 0; i + 1 < w.size(); i += 2) {
      const uint16_t h = dt == DType::kF16 ? f32_to_f16(nd(rng)) : f32_to_bf16(nd(rng));
      std::memcpy(&w[i], &h, 2);
    }
    return w;
  }
  for (auto& b : w) b = static_cast<uint8_t>(rng());
  std::vector<size_t> f16_at;
  switch (dt) {
    case DType::kQ4_K: f16_at = {offsetof(BlockQ4_K, d), offsetof(BlockQ4_K, dmin)}; break;
    case DType::kQ5_K: f16_at = {offsetof(BlockQ5_K, d), offsetof(BlockQ5_K, dmin)}; break;
    case DType::kQ6_K: f16_at = {offsetof(BlockQ6_K, d)}; break;
    case DType::kQ3_K: f16_at = {offsetof(BlockQ3_K, d)}; break;
    case DType::kQ2_K: f16_at = {offsetof(BlockQ2_K, d), offsetof(BlockQ2_K, dmin)}; break;
    default: f16_at = {0}; break;  // Q8_0, Q4_0
  }
  const size_t bb = dtype_info(dt).block_bytes;
  std::uniform_real_distribution<float> sc(0.001f, 0.02f);
  for (size_t b = 0; b < w.size(); b += bb)
    for (size_t off : f16_at) {
      const uint16_t h = f32_to_f16(sc(rng));
      std::memcpy(&w[b + off], &h, 2);
    }
  return w;
}

WeightView view_of(DType dt, int64_t rows, int64_t cols, const std::vector<uint8_t>& bytes) {
  WeightView v;
  v.dtype = dt;
  v.rows = rows;
  v.cols = cols;
  v.data = bytes.data();
  return v;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  double scale = 1e-3;
  for (float v : want) scale = std::max(scale, std::fabs(static_cast<double>(v)));
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_LE(std::fabs(static_cast<double>(got[i]) - want[i]), 1e-5 * scale)
        << what << " at " << i << ": fused " << got[i] << " single " << want[i];
}

struct TierFormat {
  const char* tier;
  DType dtype;
};

class FastMatmulMulti : public testing::TestWithParam<TierFormat> {};

TEST_P(FastMatmulMulti, EqualsOneMatmulPerWeight) {
  const TierFormat tf = GetParam();
  if (std::string(tf.tier) == "avx512" && !cpu_features().has_avx512_tier()) GTEST_SKIP() << "no AVX-512 tier";
  const MatmulMultiFn multi = cpu::fast_matmul_multi(tf.tier, tf.dtype);
  const MatmulFn single = cpu::fast_matmul(tf.tier, tf.dtype);
  ASSERT_NE(multi, nullptr);
  ASSERT_NE(single, nullptr);
  const bool kq = dtype_info(tf.dtype).block_elems == 256;
  std::mt19937 rng(99 + static_cast<unsigned>(tf.dtype));
  const int64_t rows_set[] = {1, 3, 5, 8, 13, 64, 67, 130};
  const int64_t cols_set[] = {32, 96, 160, 544, 2080};
  const int64_t kcols_set[] = {256, 512, 1280};
  for (int threads : {1, 2, 3}) {
    default_pool().set_threads(threads);
    // BF16 fuses its decode kernel below 16 tokens and its prefill GEMM from 16: 17 and 40 are 2
    // and 3 token groups, ragged.
    for (int64_t n : {1, 2, 3, 4, 5, 7, 8, 9, 17, 40}) {
      for (int count : {2, 3}) {
        const int64_t cols = kq ? kcols_set[rng() % 3] : cols_set[rng() % 5];
        std::vector<std::vector<uint8_t>> bytes;
        std::vector<WeightView> ws;
        for (int i = 0; i < count; ++i) {
          const int64_t rows = rows_set[rng() % std::size(rows_set)];
          bytes.push_back(random_weights(tf.dtype, rows, cols, rng));
        }
        for (int i = 0; i < count; ++i)
          ws.push_back(view_of(tf.dtype, static_cast<int64_t>(bytes[i].size() / dtype_bytes(tf.dtype, cols)), cols, bytes[i]));
        std::normal_distribution<float> nd(0.0f, 1.0f);
        std::vector<float> x(static_cast<size_t>(n * cols));
        for (auto& v : x) v = nd(rng);
        std::vector<std::vector<float>> fused(count), alone(count);
        float* ys[kMaxMultiMatmul];
        for (int i = 0; i < count; ++i) {
          fused[i].assign(static_cast<size_t>(n * ws[i].rows), -777.0f);
          alone[i].assign(fused[i].size(), 0.0f);
          ys[i] = fused[i].data();
          single(ws[i], x.data(), n, alone[i].data());
        }
        multi(ws.data(), ys, count, x.data(), n);
        for (int i = 0; i < count; ++i)
          expect_close(fused[i], alone[i],
                       std::string(tf.tier) + " " + dtype_name(tf.dtype) + " weight " + std::to_string(i) + " of " +
                           std::to_string(count) + ", rows " + std::to_string(ws[i].rows) + ", cols " +
                           std::to_string(cols) + ", n " + std::to_string(n) + ", threads " + std::to_string(threads));
      }
    }
  }
  default_pool().set_threads(0);
}

INSTANTIATE_TEST_SUITE_P(Tiers, FastMatmulMulti,
                         testing::Values(TierFormat{"avx2", DType::kQ8_0}, TierFormat{"avx2", DType::kQ4_0},
                                         TierFormat{"avx2", DType::kQ4_K}, TierFormat{"avx2", DType::kQ5_K},
                                         TierFormat{"avx512", DType::kQ8_0}, TierFormat{"avx512", DType::kQ4_0},
                                         TierFormat{"avx512", DType::kQ4_K}, TierFormat{"avx512", DType::kQ5_K},
                                         TierFormat{"avx512", DType::kQ6_K}, TierFormat{"avx512", DType::kBF16},
                                         TierFormat{"avx512", DType::kQ3_K}, TierFormat{"avx512", DType::kQ2_K},
                                         TierFormat{"avx512", DType::kF16}),
                         [](const testing::TestParamInfo<TierFormat>& p) {
                           return std::string(p.param.tier) + "_" + dtype_name(p.param.dtype);
                         });

// MLX affine weights: codes, and per-group scales/biases in `sdt` (mlx's quantizer centres the codes).
struct AffineWeights {
  std::vector<uint8_t> codes, scales, biases;
  WeightView view;
};

AffineWeights random_affine(int bits, int64_t gs, DType sdt, int64_t rows, int64_t cols, std::mt19937& rng) {
  AffineWeights a;
  a.codes.resize(static_cast<size_t>(rows * cols * bits / 8));
  for (auto& c : a.codes) c = static_cast<uint8_t>(rng());
  const int64_t ng = cols / gs;
  const size_t esz = sdt == DType::kF32 ? 4 : 2;
  a.scales.resize(static_cast<size_t>(rows * ng) * esz);
  a.biases.resize(a.scales.size());
  std::uniform_real_distribution<float> sc(0.002f, 0.02f);
  auto put = [&](uint8_t* p, float f) {
    if (sdt == DType::kF32) {
      std::memcpy(p, &f, 4);
    } else {
      const uint16_t h = sdt == DType::kF16 ? f32_to_f16(f) : f32_to_bf16(f);
      std::memcpy(p, &h, 2);
    }
  };
  for (size_t i = 0; i < static_cast<size_t>(rows * ng); ++i) {
    const float s = sc(rng);
    put(&a.scales[i * esz], s);
    put(&a.biases[i * esz], -s * static_cast<float>(1 << (bits - 1)));
  }
  a.view.dtype = DType::kU32;
  a.view.rows = rows;
  a.view.cols = cols;
  a.view.bits = bits;
  a.view.group_size = static_cast<int>(gs);
  a.view.scale_dtype = sdt;
  a.view.data = a.codes.data();
  a.view.scales = a.scales.data();
  a.view.biases = a.biases.data();
  return a;
}

// The AVX-512 fused affine decode (q/k/v, gate/up of an MLX 4/8-bit model) against one
// matmul_affine per weight, over widths, group sizes, scale dtypes, ragged rows, token counts
// (prefill — n >= 8, on AVX-512 n >= 9 for the formats with a decode kernel — and the widths
// without a fused kernel take the per-weight path) and thread counts.
class FastMatmulMultiAffine : public testing::TestWithParam<const char*> {};

TEST_P(FastMatmulMultiAffine, EqualsOneMatmulPerWeight) {
  const bool avx512 = std::string(GetParam()) == "avx512";
  if (avx512 && !cpu_features().has_avx512_tier()) GTEST_SKIP() << "no AVX-512 tier";
  const MatmulFn single = avx512 ? cpu::avx512::matmul_affine : cpu::avx2::matmul_affine;
  const MatmulMultiFn multi = avx512 ? cpu::avx512::matmul_multi_affine : cpu::avx2::matmul_multi_affine;
  std::mt19937 rng(4242);
  const int64_t rows_set[] = {1, 5, 8, 13, 67, 130};
  for (int threads : {1, 2}) {
    default_pool().set_threads(threads);
    for (int bits : {4, 8, 3, 2, 5, 6}) {
      for (int64_t gs : {64, 128, 32}) {
        if (bits != 4 && bits != 8 && gs != 64) continue;  // the other widths: one kernel per tier
        for (DType sdt : {DType::kBF16, DType::kF16, DType::kF32}) {
          for (int64_t n : {1, 3, 4, 7, 9}) {
            const int64_t cols = 512;
            const int count = 2 + static_cast<int>(rng() % 2);
            std::vector<AffineWeights> ws;
            WeightView views[3];
            for (int i = 0; i < count; ++i) {
              ws.push_back(random_affine(bits, gs, sdt, rows_set[rng() % std::size(rows_set)], cols, rng));
            }
            for (int i = 0; i < count; ++i) views[i] = ws[i].view;
            std::normal_distribution<float> nd(0.0f, 1.0f);
            std::vector<float> x(static_cast<size_t>(n * cols));
            for (auto& v : x) v = nd(rng);
            std::vector<float> fused[3], alone[3];
            float* ys[3];
            for (int i = 0; i < count; ++i) {
              fused[i].assign(static_cast<size_t>(n * views[i].rows), -777.0f);
              alone[i].assign(fused[i].size(), 0.0f);
              ys[i] = fused[i].data();
              single(views[i], x.data(), n, alone[i].data());
            }
            multi(views, ys, count, x.data(), n);
            for (int i = 0; i < count; ++i)
              expect_close(fused[i], alone[i],
                           std::string(GetParam()) + " affine bits " + std::to_string(bits) + " gs " + std::to_string(gs) + " " + dtype_name(sdt) +
                               " weight " + std::to_string(i) + " n " + std::to_string(n) + " threads " +
                               std::to_string(threads));
          }
        }
      }
    }
  }
  default_pool().set_threads(0);
}

INSTANTIATE_TEST_SUITE_P(Tiers, FastMatmulMultiAffine, testing::Values("avx2", "avx512"),
                         [](const testing::TestParamInfo<const char*>& p) { return std::string(p.param); });
// The IQ4 codebook formats' fused decode (decode_iq4_avx512.cpp).
INSTANTIATE_TEST_SUITE_P(Iq4, FastMatmulMulti,
                         testing::Values(TierFormat{"avx2", DType::kIQ4_XS}, TierFormat{"avx2", DType::kIQ4_NL},
                                         TierFormat{"avx512", DType::kIQ4_NL},
                                         TierFormat{"avx512", DType::kIQ4_XS}),
                         [](const testing::TestParamInfo<TierFormat>& p) {
                           return std::string(p.param.tier) + "_" + dtype_name(p.param.dtype);
                         });

// The ops.h entry point groups a mixed q/k/v (Q4_K_M: Q4_K q/k, Q6_K v) by format and keeps each
// output in its place, whatever the active table.
TEST(MatmulMulti, MixedFormatsKeepTheirOutputs) {
  std::mt19937 rng(7);
  const int64_t cols = 512;
  const DType dts[3] = {DType::kQ4_K, DType::kQ6_K, DType::kQ4_K};
  const int64_t rows[3] = {40, 24, 24};
  std::vector<std::vector<uint8_t>> bytes;
  WeightView ws[3];
  for (int i = 0; i < 3; ++i) bytes.push_back(random_weights(dts[i], rows[i], cols, rng));
  for (int i = 0; i < 3; ++i) ws[i] = view_of(dts[i], rows[i], cols, bytes[i]);
  for (int64_t n : {1, 3, 12}) {
    std::vector<float> x(static_cast<size_t>(n * cols));
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (auto& v : x) v = nd(rng);
    std::vector<float> fused[3], alone[3];
    float* ys[3];
    for (int i = 0; i < 3; ++i) {
      fused[i].assign(static_cast<size_t>(n * rows[i]), -777.0f);
      alone[i].assign(fused[i].size(), 0.0f);
      ys[i] = fused[i].data();
      matmul(ws[i], x.data(), n, alone[i].data());
    }
    matmul_multi(ws, ys, 3, x.data(), n);
    for (int i = 0; i < 3; ++i) expect_close(fused[i], alone[i], "weight " + std::to_string(i) + " n " + std::to_string(n));
  }
}

// ops.h's matmul_multi groups affine weights only with their own width, group size and scale
// dtype (a mixed-precision MLX file can give q/k/v different ones): each output stays in place.
TEST(MatmulMulti, MixedAffineShapesKeepTheirOutputs) {
  std::mt19937 rng(17);
  const int64_t cols = 512;
  AffineWeights a[4] = {random_affine(4, 64, DType::kBF16, 40, cols, rng), random_affine(4, 128, DType::kBF16, 24, cols, rng),
                        random_affine(8, 64, DType::kBF16, 24, cols, rng), random_affine(4, 64, DType::kF16, 16, cols, rng)};
  WeightView ws[4];
  for (int i = 0; i < 4; ++i) ws[i] = a[i].view;
  for (int64_t n : {1, 3, 12}) {
    std::vector<float> x(static_cast<size_t>(n * cols));
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (auto& v : x) v = nd(rng);
    std::vector<float> fused[4], alone[4];
    float* ys[4];
    for (int i = 0; i < 4; ++i) {
      fused[i].assign(static_cast<size_t>(n * ws[i].rows), -777.0f);
      alone[i].assign(fused[i].size(), 0.0f);
      ys[i] = fused[i].data();
      matmul(ws[i], x.data(), n, alone[i].data());
    }
    matmul_multi(ws, ys, 4, x.data(), n);
    for (int i = 0; i < 4; ++i) expect_close(fused[i], alone[i], "affine weight " + std::to_string(i) + " n " + std::to_string(n));
  }
}

}  // namespace
}  // namespace larder::kernels
