// Fast matmul tiers (kernels/cpu) vs the scalar reference (kernels/ref, double accumulation).
//
// Error bounds, per output y[t, r] (S = Σ_i |w_i·x_i|, u = 2^-24):
// - F32 / F16 / BF16 on AVX2: weights widen to f32 exactly, so only f32 accumulation error:
//   each of 8 lanes sums cols/8 FMAs, then a 3-add tree; |err| <= γ_k·S with k = cols/8 + 3.
//   We allow 2·(cols/8 + 8)·u·S.
// - BF16 on AVX-512 (vdpbf16ps): the activation is rounded to bf16 (relative error <= 2^-9 per
//   element) ⇒ + 2^-9·S, plus f32 accumulation as above; we allow 2^-8·S + 2·(cols/16 + 8)·2u·S.
// - F16 on AVX-512, decode (n <= 8): the activation is rounded to f16 (as llama.cpp does for F16
//   weights; relative error <= 2^-11 per element in f16's normal range) ⇒ + 2^-11·S; we allow
//   2^-10·S + the f32 accumulation term. Activations past f16's range keep f32 (FastF16Decode).
// - Q8_0 / Q4_0: the weight values are exact, but the kernels quantize activations to int8 blocks
//   (act_quant.h: d = amax/127, |x − d·q| <= d/2). Hence
//     |err| <= Q = Σ_blocks (d_x/2)·Σ_{i∈block} |w_i|   (+ f32 accumulation of nb block terms)
//   which is an exact, data-dependent bound; relative to S it is typically ~0.5–1 %
//   (d_x/2 ≈ amax/254, and amax is ≈ 2–3× the mean |x| of a block of Gaussian values).
//   A second, tight check replays the quantizer (quantize_acts_ref) and computes the integer
//   dot products exactly in double: the kernel must then agree to f32 rounding, which catches
//   lane/layout bugs the loose bound could hide.
// - MLX affine (FastAffine below): value ŵ = s·u + b per group. The kernel computes
//   Σ_g [s_g·Σ u_i·x̂_i + b_g·Σ x̂_i] = Σ ŵ_i·x̂_i (x̂ int8-quantized as above), so vs the reference
//   |err| <= Σ_blocks (d_x/2)·Σ_{i∈block} |ŵ_i|  (+ the reference's f32 rounding of ŵ, and f32
//   accumulation); the tight check replays the quantizer and evaluates that sum in double.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "larder/core/cpuid.h"
#include "larder/core/dtype.h"
#include "larder/core/threadpool.h"
#include "larder/kernels/cpu/common/act_quant.h"
#include "larder/kernels/cpu/common/cpu_kernels.h"
#include "larder/kernels/dispatch.h"
#include "larder/kernels/ref/ref_ops.h"

namespace larder::kernels {
namespace {

constexpr double kU = 1.0 / (1 << 24);

struct Weights {
  WeightView view;
  std::vector<uint8_t> bytes;
  std::vector<float> deq;  // [rows][cols] dequantized (exact)
};

void put_u16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }

Weights make_weights(DType dt, int64_t rows, int64_t cols, std::mt19937& rng) {
  Weights w;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> scale(0.002f, 0.05f);
  const uint64_t row_bytes = dtype_bytes(dt, static_cast<uint64_t>(cols));
  w.bytes.assign(row_bytes * rows, 0);
  const int64_t nb = cols / 32;
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = w.bytes.data() + r * row_bytes;
    for (int64_t c = 0; c < cols; ++c) {
      switch (dt) {
        case DType::kF32: {
          float f = nd(rng);
          std::memcpy(row + 4 * c, &f, 4);
          break;
        }
        case DType::kF16: put_u16(row + 2 * c, f32_to_f16(nd(rng))); break;
        case DType::kBF16: put_u16(row + 2 * c, f32_to_bf16(nd(rng))); break;
        default: break;
      }
    }
    if (dt == DType::kQ8_0) {
      for (int64_t b = 0; b < nb; ++b) {
        uint8_t* blk = row + b * 34;
        put_u16(blk, f32_to_f16(scale(rng)));
        // Full int8 range including −128 (ggml's quantizer never writes it, a file may).
        for (int j = 0; j < 32; ++j) blk[2 + j] = static_cast<uint8_t>(rng() & 0xff);
      }
    } else if (dt == DType::kQ4_0) {
      for (int64_t b = 0; b < nb; ++b) {
        uint8_t* blk = row + b * 18;
        put_u16(blk, f32_to_f16(scale(rng)));
        for (int j = 0; j < 16; ++j) blk[2 + j] = static_cast<uint8_t>(rng() & 0xff);
      }
    }
  }
  w.view.dtype = dt;
  w.view.rows = rows;
  w.view.cols = cols;
  w.view.data = w.bytes.data();
  w.deq.resize(rows * cols);
  const KernelTable& ref = ref_table();
  for (int64_t r = 0; r < rows; ++r) ref.dequant_row[static_cast<int>(dt)](w.view, r, w.deq.data() + r * cols);
  return w;
}

std::vector<float> make_acts(int64_t n, int64_t cols, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(n * cols);
  for (auto& v : x) v = nd(rng);
  // Some structure real activations have: an all-zero block (d = 0) and a large outlier.
  if (cols >= 64 && x.size() >= 64) {
    for (int j = 32; j < 64; ++j) x[j] = 0.0f;
  }
  if (n * cols > 7) x[7] = 40.0f;
  return x;
}

struct Case {
  int64_t rows, cols, n;
};

// Shapes around every tile edge: rows not a multiple of R (1, 2, 4, 8) or the 8-row block,
// n = 1..9 (decode groups of 4 + tails), 17 and 33 (prefill token blocks + tails), cols of
// 1..65 blocks.
std::vector<Case> cases(bool float_format) {
  std::vector<Case> cs;
  std::mt19937 rng(1234);
  const int64_t rows_set[] = {1, 2, 3, 5, 7, 8, 9, 13, 17, 31, 64, 67, 130};
  const int64_t n_set[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 17, 33};
  const int64_t cols_set[] = {32, 64, 96, 160, 256, 544, 1024, 2080};
  for (int64_t n : n_set) {
    for (int i = 0; i < 6; ++i) {
      Case c;
      c.n = n;
      c.rows = rows_set[rng() % std::size(rows_set)];
      c.cols = cols_set[rng() % std::size(cols_set)];
      if (float_format && i % 3 == 2) c.cols = 8 * (1 + rng() % 40) + rng() % 8;  // any width
      cs.push_back(c);
    }
  }
  cs.push_back({2048 / 8, 2048, 1});
  cs.push_back({96, 4096, 2});
  // 8192 columns: Q4_0 and Q8_0 rows past simd::long_rows' 4 KiB per row of a 2-row tile, where
  // Zen's decode tiles take one row (matmul_driver.h rows1).
  cs.push_back({37, 8192, 1});
  cs.push_back({40, 256, 64});  // several prefill token blocks
  // The integer GEMMs: 530 tokens = two chunks of token groups; 2080 columns = K slices with a
  // ragged last one (32 blocks in the AVX-512 gemm16, 16 in the AVX2 run_gemm_sliced); 21 rows =
  // 8-, 4- and 1-row tiles.
  cs.push_back({21, 2080, 530});
  // Its chunks of up to 64 rows (gemm_block_rows: 64 at 1 thread, 24 at 3) and a 5-row remainder.
  cs.push_back({581, 512, 40});
  // Its AMX path where usable: a 32-row chunk, then 13 rows on the 8-, 4- and 1-row tiles.
  cs.push_back({45, 2080, 530});
  if (float_format) {
    // The AVX-512 BF16 GEMM (n >= 16): several 512-pair K slices with a ragged last one and
    // ragged rows (8/4/1-row tiles); 19 token groups = two chunks of groups, the last ragged.
    cs.push_back({29, 2 * 1100 + 6, 37});
    cs.push_back({13, 2 * 600, 300});
    // Its AMX path (Bf16Amx, where AMX-BF16 is usable): two 32-row blocks + 6 rows on the
    // AVX-512 tiles; 1040 pairs = two 512-pair slices + 16 (partial sums through tile loads);
    // 35 token groups = a chunk of 32 (16 pairs) and one of 3 (a lone group).
    cs.push_back({70, 2080, 530});
    cs.push_back({64, 1024, 17});
  }
  return cs;
}

struct TierFormat {
  const char* tier;
  DType dtype;
};

std::string name_of(const testing::TestParamInfo<TierFormat>& p) {
  return std::string(p.param.tier) + "_" + dtype_name(p.param.dtype);
}

class FastMatmul : public testing::TestWithParam<TierFormat> {
 protected:
  void SetUp() override {
    if (std::string(GetParam().tier) == "avx512" && !cpu_features().has_avx512_tier()) {
      GTEST_SKIP() << "CPU lacks the AVX-512 F/BW/VL/DQ/VNNI/BF16 tier (" << cpu_features().describe()
                   << "); the avx512 kernels are compiled but cannot run here";
    }
  }
};

TEST_P(FastMatmul, MatchesReferenceWithinBound) {
  const TierFormat tf = GetParam();
  const MatmulFn fast = cpu::fast_matmul(tf.tier, tf.dtype);
  ASSERT_NE(fast, nullptr);
  const bool is_int = tf.dtype == DType::kQ8_0 || tf.dtype == DType::kQ4_0;
  const bool bf16_dot = std::string(tf.tier) == "avx512" && tf.dtype == DType::kBF16;
  const bool f16_half = std::string(tf.tier) == "avx512" && tf.dtype == DType::kF16;
  std::mt19937 rng(static_cast<unsigned>(static_cast<int>(tf.dtype) * 7919 + (bf16_dot ? 1 : 0)));
  double worst_rel = 0;  // max |err| / S, reported for the error-bound discussion
  double worst_ratio = 0;  // max |err| / allowed
  for (int threads : {1, 2, 3}) {
    default_pool().set_threads(threads);
    for (const Case& c : cases(!is_int)) {
      SCOPED_TRACE(testing::Message() << "rows " << c.rows << " cols " << c.cols << " n " << c.n
                                      << " threads " << threads);
      Weights w = make_weights(tf.dtype, c.rows, c.cols, rng);
      std::vector<float> x = make_acts(c.n, c.cols, rng);
      std::vector<float> y(c.n * c.rows, -1234.0f), yref(c.n * c.rows);
      fast(w.view, x.data(), c.n, y.data());
      ref::matmul(w.view, x.data(), c.n, yref.data());

      // Integer oracle: the same activation quantization, exact integer dots.
      std::vector<uint8_t> qbuf;
      cpu::QuantizedActs qa;
      if (is_int) {
        qbuf.resize(cpu::quantized_acts_bytes(c.n, c.cols) + 64);
        qa = cpu::quantized_acts_view(qbuf.data(), c.n, c.cols);
        cpu::quantize_acts_ref(x.data(), c.n, c.cols, false, qa);
      }
      const int64_t nb = c.cols / 32;
      for (int64_t t = 0; t < c.n; ++t) {
        for (int64_t r = 0; r < c.rows; ++r) {
          const float* wr = w.deq.data() + r * c.cols;
          const float* xt = x.data() + t * c.cols;
          double S = 0;
          for (int64_t i = 0; i < c.cols; ++i) S += std::fabs(static_cast<double>(wr[i]) * xt[i]);
          const double got = y[t * c.rows + r], want = yref[t * c.rows + r];
          double tol;
          if (is_int) {
            double Q = 0, exact = 0, Sq = 0;
            for (int64_t b = 0; b < nb; ++b) {
              const double dx = qa.d[b * qa.n_pad + t];
              double sw = 0;
              for (int j = 0; j < 32; ++j) sw += std::fabs(wr[b * 32 + j]);
              Q += dx / 2 * sw;
              // Weight value = d_w·q_w exactly representable; x̂ = d_x·q_x.
              double dot = 0, adot = 0;
              for (int j = 0; j < 32; ++j) {
                const double xq = qa.qs[(t * nb + b) * 32 + j];
                dot += static_cast<double>(wr[b * 32 + j]) * xq;
                adot += std::fabs(static_cast<double>(wr[b * 32 + j]) * xq);
              }
              exact += dx * dot;
              Sq += dx * adot;
              if (tf.dtype == DType::kQ4_0) {
                // The fold Σ u·x − 8·Σ x computes terms up to |u| <= 15 = |q − 8| + 8: rounding
                // scales with Σ (|w| + 16·d_w)·|x̂| instead of Σ |w·x̂|.
                const double dwb = f16_to_f32(static_cast<uint16_t>(w.bytes[r * (nb * 18) + b * 18] |
                                                                    (w.bytes[r * (nb * 18) + b * 18 + 1] << 8)));
                double sx = 0;
                for (int j = 0; j < 32; ++j) sx += std::fabs(static_cast<double>(qa.qs[(t * nb + b) * 32 + j]));
                Sq += dx * 16 * dwb * sx;
              }
              if (tf.dtype == DType::kQ8_0 && std::string(tf.tier) == "avx512") {
                // The AVX-512 prefill GEMM flips Q8_0 to u = q + 128 and folds Σ u·x − 128·Σ x:
                // terms up to 255 = |q| + 128 (+127), so rounding scales with Σ (|w| + 256·d_w)·|x̂|.
                const double dwb = f16_to_f32(static_cast<uint16_t>(w.bytes[r * (nb * 34) + b * 34] |
                                                                    (w.bytes[r * (nb * 34) + b * 34 + 1] << 8)));
                double sx = 0;
                for (int j = 0; j < 32; ++j) sx += std::fabs(static_cast<double>(qa.qs[(t * nb + b) * 32 + j]));
                Sq += dx * 256 * dwb * sx;
              }
            }
            // Tight: kernel vs exact integer result, only f32 scale product + accumulation.
            const double tight = 2 * (nb + 8) * kU * Sq + 1e-30;
            ASSERT_LE(std::fabs(got - exact), tight) << "t " << t << " r " << r << " exact " << exact;
            tol = Q * (1 + 1e-6) + tight + 2 * kU * std::fabs(want);
          } else if (bf16_dot) {
            tol = std::ldexp(1.0, -8) * S + 2 * (c.cols / 16.0 + 8) * 2 * kU * S + 1e-30;
          } else if (f16_half && c.n <= 8) {
            tol = std::ldexp(1.0, -10) * S + 2 * (c.cols / 16.0 + 8) * 2 * kU * S + 1e-30;
          } else {
            tol = 2 * (c.cols / 8.0 + 8) * kU * S + 1e-30;
          }
          const double err = std::fabs(got - want);
          ASSERT_LE(err, tol) << "t " << t << " r " << r << " got " << got << " want " << want << " S " << S;
          if (S > 0) worst_rel = std::max(worst_rel, err / S);
          worst_ratio = std::max(worst_ratio, err / tol);
        }
      }
    }
  }
  default_pool().set_threads(0);
  std::printf("[ %s %s ] max |err|/sum|w*x| = %.3g, max |err|/bound = %.3g\n", tf.tier,
              dtype_name(tf.dtype), worst_rel, worst_ratio);
}

INSTANTIATE_TEST_SUITE_P(Tiers, FastMatmul,
                         testing::Values(TierFormat{"avx2", DType::kQ8_0}, TierFormat{"avx2", DType::kQ4_0},
                                         TierFormat{"avx2", DType::kBF16}, TierFormat{"avx2", DType::kF16},
                                         TierFormat{"avx2", DType::kF32}, TierFormat{"avx512", DType::kQ8_0},
                                         TierFormat{"avx512", DType::kQ4_0},
                                         TierFormat{"avx512", DType::kBF16}, TierFormat{"avx512", DType::kF16}),
                         name_of);

// AVX-512 F16 decode rounds the activations to f16 unless one is past f16's range (|x| > 65504
// would become inf): that call keeps f32 activations, so it meets the f32 bound — which the f16
// path, 2^-11 relative per activation, does not at these sizes — matmul and matmul_multi alike.
TEST(FastF16Decode, ActivationsPastHalfRangeKeepF32) {
  if (!cpu_features().has_avx512_tier()) GTEST_SKIP() << "no AVX-512 tier: " << cpu_features().describe();
  const MatmulFn fast = cpu::fast_matmul("avx512", DType::kF16);
  const MatmulMultiFn multi = cpu::fast_matmul_multi("avx512", DType::kF16);
  ASSERT_NE(fast, nullptr);
  ASSERT_NE(multi, nullptr);
  std::mt19937 rng(4242);
  for (int64_t n : {1, 3, 8}) {
    const int64_t rows = 37, cols = 200;
    SCOPED_TRACE(testing::Message() << "n " << n);
    Weights w = make_weights(DType::kF16, rows, cols, rng);
    std::vector<float> x = make_acts(n, cols, rng);
    x[(n - 1) * cols + 5] = -1.0e5f;  // one activation of the last token past the range
    std::vector<float> y(n * rows, -1234.0f), ym(n * rows, -1234.0f), ym2(n * rows), yref(n * rows);
    fast(w.view, x.data(), n, y.data());
    const WeightView ws[2] = {w.view, w.view};
    float* ys[2] = {ym.data(), ym2.data()};
    multi(ws, ys, 2, x.data(), n);
    ref::matmul(w.view, x.data(), n, yref.data());
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t r = 0; r < rows; ++r) {
        double S = 0;
        for (int64_t i = 0; i < cols; ++i) S += std::fabs(static_cast<double>(w.deq[r * cols + i]) * x[t * cols + i]);
        const double tol = 2 * (cols / 8.0 + 8) * kU * S + 1e-30;
        const double want = yref[t * rows + r];
        ASSERT_LE(std::fabs(y[t * rows + r] - want), tol) << "t " << t << " r " << r << " got " << y[t * rows + r];
        ASSERT_LE(std::fabs(ym[t * rows + r] - want), tol) << "multi t " << t << " r " << r;
      }
    }
  }
}

// ---- MLX affine -------------------------------------------------------------------------------

struct AffineWeights {
  WeightView view;
  std::vector<uint8_t> codes, scales, biases;
  std::vector<float> deq;
};

void put_scale(uint8_t* p, float v, DType dt) {
  if (dt == DType::kF32) std::memcpy(p, &v, 4);
  else put_u16(p, dt == DType::kF16 ? f32_to_f16(v) : f32_to_bf16(v));
}

AffineWeights make_affine(int bits, int gs, DType sdt, int64_t rows, int64_t cols, std::mt19937& rng) {
  AffineWeights w;
  WeightView& v = w.view;
  v.dtype = DType::kU32;
  v.rows = rows;
  v.cols = cols;
  v.bits = bits;
  v.group_size = gs;
  v.scale_dtype = sdt;
  w.codes.resize(static_cast<size_t>(rows) * v.row_bytes());
  for (auto& b : w.codes) b = static_cast<uint8_t>(rng() & 0xff);  // every bit pattern is a valid code row
  const int64_t ng = cols / gs;
  const size_t esz = dtype_info(sdt).block_bytes;
  w.scales.resize(static_cast<size_t>(rows * ng) * esz);
  w.biases.resize(w.scales.size());
  std::uniform_real_distribution<float> mag(0.002f, 0.05f);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const float half = static_cast<float>(1 << (bits - 1));
  for (int64_t i = 0; i < rows * ng; ++i) {
    const float s = (rng() & 1 ? 1.0f : -1.0f) * mag(rng);  // mlx scales can be negative
    put_scale(w.scales.data() + i * esz, s, sdt);
    put_scale(w.biases.data() + i * esz, -s * half + 0.01f * nd(rng), sdt);
  }
  v.data = w.codes.data();
  v.scales = w.scales.data();
  v.biases = w.biases.data();
  w.deq.resize(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) ref::dequant_row_affine(v, r, w.deq.data() + r * cols);
  return w;
}

struct AffineFormat {
  int bits;
  int group_size;
};

class FastAffine : public testing::TestWithParam<AffineFormat> {};

// Runs one tier's affine kernel over random shapes against the reference and the exact replay.
void check_affine_tier(const char* tier, const AffineFormat af) {
  const MatmulFn fast = cpu::fast_matmul_affine(tier, af.bits);
  ASSERT_NE(fast, nullptr);
  std::mt19937 rng(static_cast<unsigned>(af.bits * 131 + af.group_size));
  const int64_t rows_set[] = {1, 2, 3, 5, 7, 8, 9, 13, 31, 67};
  // 530 tokens, 21 rows, 2304 columns: the GEMMs' chunks of token groups and K slices (whole
  // scale groups, ragged last: 32 blocks in the AVX-512 gemm16, 16 in the AVX2 run_gemm_sliced).
  const int64_t n_set[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 17, 33, 530};
  // 96 and 160: odd block counts at group size 32 (the AVX-512 4-bit unpacking's one-block tail).
  const int64_t cols_set[] = {96, 128, 160, 256, 384, 640, 1024};
  const DType sdts[] = {DType::kBF16, DType::kF16, DType::kF32};
  double worst_rel = 0, worst_ratio = 0;
  int iter = 0;
  for (int threads : {1, 3}) {
    default_pool().set_threads(threads);
    for (int64_t n : n_set) {
      for (int i = 0; i < (n > 64 ? 1 : 3); ++i, ++iter) {
        const int64_t drawn_rows = rows_set[rng() % std::size(rows_set)];
        int64_t cols = cols_set[rng() % std::size(cols_set)];
        cols = std::max<int64_t>(af.group_size, cols / af.group_size * af.group_size);
        // n = 33: 581 rows, the AVX-512 GEMM's chunks of up to 64 rows (gemm_block_rows).
        const int64_t rows = n > 64 ? 21 : n == 33 ? 581 : drawn_rows;
        if (n > 64) cols = 2304;
        const DType sdt = sdts[iter % 3];
        SCOPED_TRACE(testing::Message() << "bits " << af.bits << " g " << af.group_size << " " << dtype_name(sdt)
                                        << " rows " << rows << " cols " << cols << " n " << n << " threads "
                                        << threads);
        AffineWeights w = make_affine(af.bits, af.group_size, sdt, rows, cols, rng);
        std::vector<float> x = make_acts(n, cols, rng);
        std::vector<float> y(n * rows, -1234.0f), yref(n * rows);
        fast(w.view, x.data(), n, y.data());
        ref::matmul_affine(w.view, x.data(), n, yref.data());
        std::vector<uint8_t> qbuf(cpu::quantized_acts_bytes(n, cols) + 64);
        cpu::QuantizedActs qa = cpu::quantized_acts_view(qbuf.data(), n, cols);
        cpu::quantize_acts_ref(x.data(), n, cols, false, qa);
        const int64_t nb = cols / 32, gs = af.group_size;
        for (int64_t t = 0; t < n; ++t) {
          for (int64_t r = 0; r < rows; ++r) {
            const uint8_t* crow = w.codes.data() + r * w.view.row_bytes();
            const float* xt = x.data() + t * cols;
            double exact = 0, Sq = 0, Q = 0, S = 0, Sw = 0;
            for (int64_t g = 0; g < cols / gs; ++g) {
              const double s = ref::affine_scale(w.view, r, g, false), b = ref::affine_scale(w.view, r, g, true);
              double sax = 0;
              for (int64_t i = g * gs; i < (g + 1) * gs; ++i) {
                const double u = ref::affine_code(crow, i, af.bits);
                const int64_t blk = i / 32;
                const double dx = qa.d[blk * qa.n_pad + t];
                const double xh = dx * qa.qs[(t * nb + blk) * 32 + i % 32];
                exact += (s * u + b) * xh;
                Sq += std::fabs(s) * (u + (af.bits == 8 ? 128 : 0)) * std::fabs(xh);
                Q += std::fabs(s * u + b) * dx / 2;
                sax += std::fabs(xh);
                const double wv = w.deq[r * cols + i];
                S += std::fabs(wv * xt[i]);
                Sw += (std::fabs(s * u) + std::fabs(wv)) * std::fabs(xt[i]);
              }
              Sq += (std::fabs(b) + (af.bits == 8 ? 128 * std::fabs(s) : 0)) * sax;
            }
            const double got = y[t * rows + r], want = yref[t * rows + r];
            const double tight = 2 * (cols / 8.0 + 16) * kU * Sq + 1e-30;
            ASSERT_LE(std::fabs(got - exact), tight) << "t " << t << " r " << r << " exact " << exact;
            const double tol = Q * (1 + 1e-6) + tight + 2 * kU * Sw + 2 * kU * std::fabs(want);
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
  std::printf("[ %s affine q%d g%d ] max |err|/sum|w*x| = %.3g, max |err|/bound = %.3g\n", tier, af.bits,
              af.group_size, worst_rel, worst_ratio);
}

TEST_P(FastAffine, Avx2MatchesReferenceWithinBound) { check_affine_tier("avx2", GetParam()); }

// The AVX-512 kernel: prefill (n >= 9) on the 16-token VNNI GEMM, decode on its own 4/8-bit
// kernels (group sizes a multiple of 64) and the AVX2 kernel otherwise (up to 7 tokens); the
// same bound holds (same activation quantizer, exact integer dots, f32 scaling).
TEST_P(FastAffine, Avx512MatchesReferenceWithinBound) {
  if (!cpu_features().has_avx512_tier()) {
    GTEST_SKIP() << "CPU lacks the AVX-512 tier (" << cpu_features().describe() << ")";
  }
  check_affine_tier("avx512", GetParam());
}

INSTANTIATE_TEST_SUITE_P(Widths, FastAffine,
                         testing::Values(AffineFormat{2, 32}, AffineFormat{2, 128}, AffineFormat{3, 32},
                                         AffineFormat{3, 64}, AffineFormat{4, 32}, AffineFormat{4, 64},
                                         AffineFormat{4, 128}, AffineFormat{4, 192}, AffineFormat{5, 64}, AffineFormat{5, 128},
                                         AffineFormat{6, 32}, AffineFormat{6, 64}, AffineFormat{8, 32},
                                         AffineFormat{8, 64}, AffineFormat{8, 128}),
                         [](const testing::TestParamInfo<AffineFormat>& p) {
                           char buf[32];
                           std::snprintf(buf, sizeof buf, "q%dg%d", p.param.bits, p.param.group_size);
                           return std::string(buf);
                         });

TEST(FastAffine, LargeDecodeShape) {
  // A real-model shape (2048 x 2048, q4 g64, bf16 scales), n = 1 and 4, against the reference.
  std::mt19937 rng(99);
  for (int bits : {4, 8}) {
    AffineWeights w = make_affine(bits, 64, DType::kBF16, 2048, 2048, rng);
    for (int64_t n : {1, 4}) {
      std::vector<float> x = make_acts(n, 2048, rng);
      std::vector<float> y(n * 2048), yref(n * 2048);
      cpu::fast_matmul_affine("avx2", bits)(w.view, x.data(), n, y.data());
      ref::matmul_affine(w.view, x.data(), n, yref.data());
      double num = 0, den = 0;
      for (size_t i = 0; i < y.size(); ++i) {
        num += (y[i] - yref[i]) * double(y[i] - yref[i]);
        den += double(yref[i]) * yref[i];
      }
      // int8 activations: relative RMS error ≈ 0.5–1 % (see the bound above); a layout bug is ≈ 100 %.
      EXPECT_LT(std::sqrt(num / den), 0.03) << "bits " << bits << " n " << n;
    }
  }
}

TEST(ActQuant, Avx2MatchesScalarBytes) {
  std::mt19937 rng(7);
  for (int64_t cols : {32, 96, 2048}) {
    for (int64_t n : {1, 3, 9}) {
      std::vector<float> x = make_acts(n, cols, rng);
      x[3] = 0.5f / 127.0f * 3;  // near a rounding tie after scaling
      for (bool off : {false, true}) {
        std::vector<uint8_t> b1(cpu::quantized_acts_bytes(n, cols)), b2(b1.size());
        cpu::QuantizedActs a1 = cpu::quantized_acts_view(b1.data(), n, cols);
        cpu::QuantizedActs a2 = cpu::quantized_acts_view(b2.data(), n, cols);
        cpu::quantize_acts_ref(x.data(), n, cols, off, a1);
        cpu::quantize_acts_avx2(x.data(), n, cols, off, a2);
        ASSERT_EQ(0, std::memcmp(a1.qs, a2.qs, n * cols)) << "cols " << cols << " n " << n;
        for (int64_t i = 0; i < a1.nb * a1.n_pad; ++i) {
          ASSERT_EQ(a1.d[i], a2.d[i]);
          ASSERT_EQ(a1.bsum[i], a2.bsum[i]);
        }
      }
    }
  }
}

// The super-block quantizer (QuantizedActsK): AVX2 byte-identical to the reference, and the
// reference itself checked against its definition (d = amax/127 per 256, |x − d·q| <= d/2, the
// 16-value sums) so neither can drift alone.
TEST(ActQuantK, Avx2MatchesScalarBytesAndDefinition) {
  std::mt19937 rng(11);
  for (int64_t cols : {256, 512, 2048}) {
    for (int64_t n : {1, 3, 5}) {
      std::vector<float> x = make_acts(n, cols, rng);
      x[5] = 0.0f;
      if (cols >= 512) std::fill(x.begin() + 256, x.begin() + 512, 0.0f);  // an all-zero super-block
      std::vector<uint8_t> b1(cpu::quantized_acts_k_bytes(n, cols)), b2(b1.size());
      cpu::QuantizedActsK a1 = cpu::quantized_acts_k_view(b1.data(), n, cols);
      cpu::QuantizedActsK a2 = cpu::quantized_acts_k_view(b2.data(), n, cols);
      cpu::quantize_acts_k_ref(x.data(), n, cols, a1);
      cpu::quantize_acts_k_avx2(x.data(), n, cols, a2);
      ASSERT_EQ(0, std::memcmp(a1.qs, a2.qs, n * cols)) << "cols " << cols << " n " << n;
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t sb = 0; sb < cols / 256; ++sb) {
          ASSERT_EQ(a1.scales(t)[sb], a2.scales(t)[sb]);
          float amax = 0;
          for (int j = 0; j < 256; ++j) amax = std::max(amax, std::fabs(x[t * cols + sb * 256 + j]));
          const float d = a1.scales(t)[sb];
          EXPECT_FLOAT_EQ(d, amax / 127.0f);
          for (int g = 0; g < 16; ++g) {
            int sum = 0;
            for (int j = 16 * g; j < 16 * g + 16; ++j) {
              const int q = a1.token(t)[sb * 256 + j];
              sum += q;
              EXPECT_LE(std::fabs(x[t * cols + sb * 256 + j] - d * q), d / 2 * 1.0001f + 1e-30f);
            }
            ASSERT_EQ(a1.sums16(t)[sb * 16 + g], sum);
            ASSERT_EQ(a2.sums16(t)[sb * 16 + g], sum);
          }
        }
      }
    }
  }
}

TEST(Registration, FastTierOverwritesMatmulEntries) {
  KernelTable t = ref_table();
  cpu::register_fast_kernels(t);
  setenv("LARDER_QUANT_ACT", "0", 1);  // opt-out: int8-activation formats stay on the reference
  KernelTable exact = ref_table();
  cpu::register_fast_kernels(exact);
  unsetenv("LARDER_QUANT_ACT");
  EXPECT_EQ(exact.matmul[static_cast<int>(DType::kQ4_0)], ref_table().matmul[static_cast<int>(DType::kQ4_0)]);
  EXPECT_EQ(exact.matmul[static_cast<int>(DType::kBF16)], t.matmul[static_cast<int>(DType::kBF16)]);
  const bool avx512 = cpu_features().has_avx512_tier();
  EXPECT_STREQ(t.name, avx512 ? "avx512" : "avx2");
  EXPECT_EQ(t.matmul[static_cast<int>(DType::kF16)], cpu::fast_matmul(avx512 ? "avx512" : "avx2", DType::kF16));
  EXPECT_EQ(t.matmul[static_cast<int>(DType::kQ4_0)], cpu::fast_matmul(avx512 ? "avx512" : "avx2", DType::kQ4_0));
  EXPECT_EQ(t.matmul_affine[4], cpu::fast_matmul_affine(avx512 ? "avx512" : "avx2", 4));
  EXPECT_EQ(t.matmul_affine[3], cpu::fast_matmul_affine(avx512 ? "avx512" : "avx2", 3));
  EXPECT_EQ(exact.matmul_affine[4], ref_table().matmul_affine[4]);  // int8 activations: opt-out too
  EXPECT_EQ(cpu::fast_matmul_affine("avx2", 7), nullptr);
  // Row lookup (embeddings) stays on the reference.
  EXPECT_EQ(t.dequant_row[static_cast<int>(DType::kQ4_0)], ref_table().dequant_row[static_cast<int>(DType::kQ4_0)]);
}


// The prefill GEMM's AMX path (gemm16_avx512.h tile_amx: TDPBUSD block sums, then the same f32
// fold) against its vpdpbusd path in one process: exact integer sums and the same fold order, so
// the outputs must be the same bits. 37 rows = a 32-row AMX chunk and a 5-row remainder on the
// vpdpbusd tiles; 530 tokens = a chunk of 32 token groups (16 pairs) and one of 2, 72 tokens = two
// pairs and a lone group; 1280 columns = K slices of 32 blocks and a ragged one. Random bytes are
// valid codes in every format; the f16 scale fields are overwritten with finite values. (Q6_K,
// Q2_K, Q3_K stay on vpdpbusd either way: their cases check that the switch leaves them alone.)
// Skips where AMX is not usable.

// Byte offsets of the f16 scale fields in one block of each GGUF format.
std::vector<int> f16_fields(DType dt) {
  switch (dt) {
    case DType::kQ4_0: case DType::kQ8_0: case DType::kQ5_0: case DType::kIQ4_NL: case DType::kIQ4_XS: return {0};
    case DType::kQ4_1: case DType::kQ5_1: case DType::kQ4_K: case DType::kQ5_K: return {0, 2};
    case DType::kQ6_K: return {208};
    case DType::kQ2_K: return {80, 82};
    case DType::kQ3_K: return {108};
    default: return {};
  }
}

TEST(GemmAmx, BitIdenticalToVnniPath) {
  if (!cpu_features().has_avx512_tier() || !cpu_features().amx) GTEST_SKIP() << "AMX is not usable here";
  std::mt19937 rng(77);
  std::uniform_real_distribution<float> mag(0.0005f, 0.01f);
  const int64_t rows = 37, cols = 1280;
  auto run_both = [&](MatmulFn fn, const WeightView& w, const std::string& what) {
    for (int64_t n : {72, 530}) {
      const std::vector<float> x = make_acts(n, cols, rng);
      std::vector<float> y_amx(static_cast<size_t>(n * rows)), y_vnni(y_amx.size());
      cpu::avx512::set_gemm_amx(true);
      ASSERT_TRUE(cpu::avx512::gemm_uses_amx());
      fn(w, x.data(), n, y_amx.data());
      cpu::avx512::set_gemm_amx(false);
      fn(w, x.data(), n, y_vnni.data());
      cpu::avx512::set_gemm_amx(true);
      double norm = 0;
      for (float v : y_amx) {
        ASSERT_TRUE(std::isfinite(v)) << what;
        norm += std::fabs(v);
      }
      EXPECT_GT(norm, 0.0) << what;
      EXPECT_EQ(0, std::memcmp(y_amx.data(), y_vnni.data(), y_amx.size() * sizeof(float))) << what << " n=" << n;
    }
  };
  for (DType dt : {DType::kQ4_0, DType::kQ8_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kIQ4_NL, DType::kQ4_K,
                   DType::kQ5_K, DType::kQ6_K, DType::kIQ4_XS, DType::kQ2_K, DType::kQ3_K}) {
    const MatmulFn fn = cpu::fast_matmul("avx512", dt);
    ASSERT_NE(fn, nullptr) << dtype_info(dt).name;
    const uint64_t row_bytes = dtype_bytes(dt, static_cast<uint64_t>(cols));
    const uint32_t bb = dtype_info(dt).block_bytes;
    std::vector<uint8_t> bytes(row_bytes * rows);
    for (auto& b : bytes) b = static_cast<uint8_t>(rng() & 0xff);
    for (size_t blk = 0; blk + bb <= bytes.size(); blk += bb)
      for (int off : f16_fields(dt)) put_u16(bytes.data() + blk + off, f32_to_f16((rng() & 1 ? 1 : -1) * mag(rng)));
    WeightView w;
    w.dtype = dt;
    w.rows = rows;
    w.cols = cols;
    w.data = bytes.data();
    run_both(fn, w, dtype_info(dt).name);
  }
  for (auto [bits, gs] : {std::pair{4, 32}, std::pair{4, 64}, std::pair{4, 128}, std::pair{8, 64}, std::pair{3, 64}}) {
    const AffineWeights aw = make_affine(bits, gs, DType::kBF16, rows, cols, rng);
    run_both(cpu::fast_matmul_affine("avx512", bits), aw.view, "mlx affine " + std::to_string(bits) + "-bit g" + std::to_string(gs));
  }
}

}  // namespace
}  // namespace larder::kernels
