// Batch invariance (issue 41 item 1): a token's output row must not depend on how many tokens share
// the call or where the token sits in it. For every weight format and every ISA tier this CPU runs,
// y = x·Wᵀ is computed for one pool of 64 activation rows in calls of 1, 2, 3, 8, 9, 16, 17 and 64
// rows (each call a window of the pool, at several offsets, so every row is seen at many positions),
// and each output row must be bit-identical (memcmp) to that row computed alone (n = 1): the decode
// GEMV and the prefill GEMM have to quantize a token's activations the same way and add up its
// products in the same order. Thread counts 1 and 2 both (the rows a thread gets must not change the
// arithmetic either). matmul_multi (q/k/v, gate/up fused) is held to the same rule.
//
// Formats without an invariant kernel on a tier are listed in kernels/batch_invariance.cpp with the reason;
// their test checks nothing but documents the gap (and fails if the gap closes, so the list stays true).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "larder/core/cpuid.h"
#include "larder/core/dtype.h"
#include "larder/core/threadpool.h"
#include "larder/kernels/batch_invariance.h"
#include "larder/kernels/cpu/common/cpu_kernels.h"
#include "larder/kernels/dispatch.h"
#include "larder/kernels/gguf_blocks.h"
#include "larder/kernels/microscaling.h"
#include "larder/kernels/ops.h"

namespace larder::kernels {
namespace {

constexpr int64_t kPool = 64;
constexpr int64_t kCallSizes[] = {1, 2, 3, 8, 9, 16, 17, 64};
// Offsets of a call's window into the pool (wrapping): every row lands at many positions.
constexpr int64_t kShifts[] = {0, 1, 2, 5, 11, 23, 40, 63};

void put_u16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }

struct Weights {
  WeightView view;
  std::vector<uint8_t> codes, scales, biases;
};

// Random codes (every bit pattern) with valid f16 scale fields of realistic size; float formats
// get Gaussian values.
Weights gguf_weights(DType dt, int64_t rows, int64_t cols, std::mt19937& rng) {
  Weights w;
  w.codes.resize(dtype_bytes(dt, static_cast<uint64_t>(rows * cols)));
  if (dt == DType::kMXFP4 || is_mlx_microscaling(dt)) {
    // Microscaling floats: random codes (no e4m3 NaN), scales over a few octaves.
    for (auto& b : w.codes) b = static_cast<uint8_t>(rng());
    if (dt == DType::kMXFP4)
      for (size_t b = 0; b < w.codes.size(); b += 17) w.codes[b] = static_cast<uint8_t>(116 + rng() % 8);
    if (dt == DType::kMlxMXFP8)
      for (auto& b : w.codes)
        if ((b & 0x7f) == 0x7f) b ^= 1;
    if (const int g = mlx_microscaling_group(dt)) {
      w.scales.resize(static_cast<size_t>(rows * (cols / g)));
      for (auto& b : w.scales) b = static_cast<uint8_t>(dt == DType::kMlxNVFP4 ? 0x10 + rng() % 24 : 116 + rng() % 8);
      w.view.scales = w.scales.data();
      w.view.scale_dtype = DType::kU8;
      w.view.group_size = g;
    }
    w.view.dtype = dt;
    w.view.rows = rows;
    w.view.cols = cols;
    w.view.data = w.codes.data();
    return w;
  }
  std::normal_distribution<float> nd(0.0f, 0.03f);
  if (dt == DType::kF32) {
    for (size_t i = 0; i < w.codes.size(); i += 4) {
      const float f = nd(rng);
      std::memcpy(&w.codes[i], &f, 4);
    }
  } else if (dt == DType::kBF16 || dt == DType::kF16) {
    for (size_t i = 0; i < w.codes.size(); i += 2)
      put_u16(&w.codes[i], dt == DType::kF16 ? f32_to_f16(nd(rng)) : f32_to_bf16(nd(rng)));
  } else {
    for (auto& b : w.codes) b = static_cast<uint8_t>(rng());
    std::vector<size_t> f16_at;
    switch (dt) {
      case DType::kQ4_1: f16_at = {offsetof(BlockQ4_1, d), offsetof(BlockQ4_1, m)}; break;
      case DType::kQ5_1: f16_at = {offsetof(BlockQ5_1, d), offsetof(BlockQ5_1, m)}; break;
      case DType::kQ4_K: f16_at = {offsetof(BlockQ4_K, d), offsetof(BlockQ4_K, dmin)}; break;
      case DType::kQ5_K: f16_at = {offsetof(BlockQ5_K, d), offsetof(BlockQ5_K, dmin)}; break;
      case DType::kQ6_K: f16_at = {offsetof(BlockQ6_K, d)}; break;
      case DType::kQ3_K: f16_at = {offsetof(BlockQ3_K, d)}; break;
      case DType::kQ2_K: f16_at = {offsetof(BlockQ2_K, d), offsetof(BlockQ2_K, dmin)}; break;
      default: f16_at = {0}; break;  // Q8_0, Q4_0, Q5_0, IQ4_NL, IQ4_XS: d first
    }
    const size_t bb = dtype_info(dt).block_bytes;
    std::uniform_real_distribution<float> sc(0.001f, 0.02f);
    for (size_t b = 0; b < w.codes.size(); b += bb)
      for (size_t off : f16_at) put_u16(&w.codes[b + off], f32_to_f16(sc(rng)));
  }
  w.view.dtype = dt;
  w.view.rows = rows;
  w.view.cols = cols;
  w.view.data = w.codes.data();
  return w;
}

Weights affine_weights(int bits, int gs, DType sdt, int64_t rows, int64_t cols, std::mt19937& rng) {
  Weights w;
  WeightView& v = w.view;
  v.dtype = DType::kU32;
  v.rows = rows;
  v.cols = cols;
  v.bits = bits;
  v.group_size = gs;
  v.scale_dtype = sdt;
  w.codes.resize(static_cast<size_t>(rows) * v.row_bytes());
  for (auto& b : w.codes) b = static_cast<uint8_t>(rng());
  const int64_t ng = cols / gs;
  const size_t esz = dtype_info(sdt).block_bytes;
  w.scales.resize(static_cast<size_t>(rows * ng) * esz);
  w.biases.resize(w.scales.size());
  std::uniform_real_distribution<float> mag(0.002f, 0.05f);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto put = [&](uint8_t* p, float f) {
    if (sdt == DType::kF32) std::memcpy(p, &f, 4);
    else put_u16(p, sdt == DType::kF16 ? f32_to_f16(f) : f32_to_bf16(f));
  };
  const float half = static_cast<float>(1 << (bits - 1));
  for (int64_t i = 0; i < rows * ng; ++i) {
    const float s = (rng() & 1 ? 1.0f : -1.0f) * mag(rng);
    put(w.scales.data() + i * esz, s);
    put(w.biases.data() + i * esz, -s * half + 0.01f * nd(rng));
  }
  v.data = w.codes.data();
  v.scales = w.scales.data();
  v.biases = w.biases.data();
  return w;
}

// Activations with what real ones have: an outlier per row and an all-zero 32-block in some rows.
std::vector<float> pool_acts(int64_t cols, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(kPool * cols));
  for (auto& v : x) v = nd(rng);
  for (int64_t t = 0; t < kPool; ++t) {
    x[t * cols + (t * 37) % cols] = 30.0f + t;
    if (t % 5 == 0)
      for (int j = 64; j < 96 && j < cols; ++j) x[t * cols + j] = 0.0f;
  }
  return x;
}

// Counts of mismatching rows, and the first one seen, for one format on one tier.
struct Report {
  int64_t checked = 0, bad = 0;
  std::string first;
  void row(bool same, const char* what, int threads, int64_t n, int64_t shift, int64_t pos) {
    ++checked;
    if (same) return;
    if (bad++ == 0)
      first = std::string(what) + ": threads " + std::to_string(threads) + ", call of " + std::to_string(n) +
              " rows, shift " + std::to_string(shift) + ", position " + std::to_string(pos);
  }
};

// Runs every call size at every shift over the pool and compares each row with `alone` (the same
// row computed in a call of one, 1 thread). `call(x, n, y)` computes n rows.
template <class Call>
void check_calls(const char* what, const std::vector<float>& pool, int64_t cols, int64_t out, const std::vector<float>& alone,
                 Call&& call, Report& rep) {
  std::vector<float> x, y;
  for (int threads : {1, 2}) {
    default_pool().set_threads(threads);
    for (int64_t n : kCallSizes) {
      for (int64_t s : kShifts) {
        if (n == kPool && s > 1) break;  // a call of the whole pool: every position already twice
        x.resize(static_cast<size_t>(n * cols));
        for (int64_t j = 0; j < n; ++j)
          std::memcpy(&x[j * cols], &pool[((s + j) % kPool) * cols], cols * sizeof(float));
        y.assign(static_cast<size_t>(n * out), -777.0f);
        call(x.data(), n, y.data());
        for (int64_t j = 0; j < n; ++j)
          rep.row(std::memcmp(&y[j * out], &alone[((s + j) % kPool) * out], out * sizeof(float)) == 0, what, threads,
                  n, s, j);
      }
    }
  }
  default_pool().set_threads(0);
}

// One format on one tier: matmul in every call size, and matmul_multi (where the tier fuses the
// format) of three weights, each output checked against the same single-row matmul.
Report check_format(const char* tier, const std::vector<Weights>& ws, MatmulFn single, MatmulMultiFn multi,
                    std::mt19937& rng) {
  const int64_t cols = ws[0].view.cols;
  const std::vector<float> pool = pool_acts(cols, rng);
  Report rep;
  std::vector<std::vector<float>> alone(ws.size());
  default_pool().set_threads(1);
  for (size_t i = 0; i < ws.size(); ++i) {
    const int64_t rows = ws[i].view.rows;
    alone[i].resize(static_cast<size_t>(kPool * rows));
    for (int64_t t = 0; t < kPool; ++t) single(ws[i].view, &pool[t * cols], 1, &alone[i][t * rows]);
  }
  const WeightView& w0 = ws[0].view;
  check_calls("matmul", pool, cols, w0.rows, alone[0],
              [&](const float* x, int64_t n, float* y) { single(w0, x, n, y); }, rep);
  if (multi) {
    std::vector<WeightView> views;
    for (const auto& w : ws) views.push_back(w.view);
    for (size_t i = 0; i < ws.size(); ++i) {
      std::vector<float> other[3];
      check_calls("matmul_multi", pool, cols, views[i].rows, alone[i],
                  [&](const float* x, int64_t n, float* y) {
                    float* ys[3];
                    for (size_t k = 0; k < views.size(); ++k) {
                      if (k == i) {
                        ys[k] = y;
                      } else {
                        other[k].assign(static_cast<size_t>(n * views[k].rows), 0.0f);
                        ys[k] = other[k].data();
                      }
                    }
                    multi(views.data(), ys, static_cast<int>(views.size()), x, n);
                  },
                  rep);
    }
  }
  (void)tier;
  return rep;
}

bool tier_runs(const std::string& tier) { return tier != "avx512" || cpu_features().has_avx512_tier(); }

// Formats × modes whose kernels are not batch-invariant, and why: kernels/batch_invariance.h, the
// list the runtime asks (speculation is on by default only where it is exact). The test of such a
// pair checks that it still is not, so that list cannot go stale. Modes: "avx2", "avx512" (the
// default kernels), "avx512inv" (cpu::batch_invariant_decode(), LARDER_BATCH_INVARIANT=1).
const char* gap_of(const std::string& mode, const std::string& format) { return batch_variance(mode, format); }

void expect_invariant(const std::string& tier, const std::string& format, const Report& rep) {
  std::printf("[invariance] %-6s %-10s rows checked %6lld, differing %6lld%s%s\n", tier.c_str(), format.c_str(),
              static_cast<long long>(rep.checked), static_cast<long long>(rep.bad), rep.bad ? "; first: " : "",
              rep.first.c_str());
  if (const char* why = gap_of(tier, format)) {
    EXPECT_GT(rep.bad, 0) << tier << " " << format << " is listed as not batch-invariant (" << why
                          << ") but every row matched: remove it from kernels/batch_invariance.cpp";
    return;
  }
  EXPECT_EQ(rep.bad, 0) << tier << " " << format << ": " << rep.bad << " of " << rep.checked
                        << " rows differ from the same row computed alone; first: " << rep.first;
}

// The runtime's question (speculation on by default only where it is exact) reads the same list
// through the running mode: the tier, with "inv" when the GEMM-arithmetic decode is on.
TEST(BatchInvarianceQuery, FollowsTheActiveModeAndTheList) {
  const std::string tier = active_table().name;
  cpu::set_batch_invariant_decode(false);
  EXPECT_EQ(active_decode_mode(), tier);
  cpu::set_batch_invariant_decode(true);
  EXPECT_EQ(active_decode_mode(), tier == "avx512" ? "avx512inv" : tier);
  cpu::set_batch_invariant_decode(false);
  EXPECT_TRUE(batch_invariant("F32", "avx512"));
  EXPECT_FALSE(batch_invariant("Q4_K", "avx512"));
  EXPECT_TRUE(batch_invariant("Q4_K", "avx512inv"));
  EXPECT_FALSE(batch_invariant("affine4g64", "avx2"));
  EXPECT_TRUE(batch_invariant("affine3g64", "avx2"));
  EXPECT_TRUE(batch_invariant("Q4_K", "ref"));
  EXPECT_NE(batch_variance("avx512", "BF16"), nullptr);
}

struct TierFormat {
  const char* tier;
  DType dtype;
};

class BatchInvariant : public testing::TestWithParam<TierFormat> {};

// Runs fn once per decode mode of the tier: the default kernels ("avx2", "avx512"), and on the
// AVX-512 tier also batch_invariant_decode() ("avx512inv"), whose formats must all be invariant.
template <class Fn>
void each_mode(const std::string& tier, Fn&& fn) {
  fn(tier);
  if (tier == "avx512") {
    cpu::set_batch_invariant_decode(true);
    fn(std::string("avx512inv"));
  }
  cpu::set_batch_invariant_decode(false);
}

TEST_P(BatchInvariant, RowEqualsRowAlone) {
  const TierFormat tf = GetParam();
  if (!tier_runs(tf.tier)) GTEST_SKIP() << "CPU lacks the AVX-512 tier";
  const MatmulFn single = cpu::fast_matmul(tf.tier, tf.dtype);
  ASSERT_NE(single, nullptr);
  each_mode(tf.tier, [&](const std::string& mode) {
    std::mt19937 rng(4242 + static_cast<unsigned>(tf.dtype));
    // 67 rows: every row-tile size and a ragged tail; 1280 columns = 5 super-blocks / 40 blocks.
    // The decode kernels' 8192-column case (long rows: one row per tile on Zen) is a second shape.
    // Float formats take any width: 172 columns (stories260K's FFN) leave a ragged tail of lanes.
    const bool is_float = tf.dtype == DType::kF32 || tf.dtype == DType::kF16 || tf.dtype == DType::kBF16;
    for (int64_t cols : {int64_t{1280}, int64_t{8192}, int64_t{172}}) {
      if (cols == 172 && !is_float) continue;
      std::vector<Weights> ws;
      for (int64_t rows : {67, 40, 9}) ws.push_back(gguf_weights(tf.dtype, cols == 8192 ? rows / 3 + 1 : rows, cols, rng));
      SCOPED_TRACE(testing::Message() << "cols " << cols);
      expect_invariant(mode, std::string(dtype_name(tf.dtype)) + (cols == 8192 ? "/8k" : cols == 172 ? "/172" : ""),
                       check_format(tf.tier, ws, single, cpu::fast_matmul_multi(tf.tier, tf.dtype), rng));
    }
  });
}

std::string name_of(const testing::TestParamInfo<TierFormat>& p) {
  return std::string(p.param.tier) + "_" + dtype_name(p.param.dtype);
}

std::vector<TierFormat> all_formats() {
  std::vector<TierFormat> v;
  for (const char* tier : {"avx2", "avx512"})
    for (DType d : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0,
                    DType::kQ5_1, DType::kIQ4_NL, DType::kQ2_K, DType::kQ3_K, DType::kQ4_K, DType::kQ5_K,
                    DType::kQ6_K, DType::kIQ4_XS, DType::kMXFP4, DType::kMlxMXFP4, DType::kMlxNVFP4, DType::kMlxMXFP8})
      if (cpu::fast_matmul(tier, d)) v.push_back({tier, d});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Formats, BatchInvariant, testing::ValuesIn(all_formats()), name_of);

struct AffineCase {
  const char* tier;
  int bits, group_size;
};

class BatchInvariantAffine : public testing::TestWithParam<AffineCase> {};

TEST_P(BatchInvariantAffine, RowEqualsRowAlone) {
  const AffineCase ac = GetParam();
  if (!tier_runs(ac.tier)) GTEST_SKIP() << "CPU lacks the AVX-512 tier";
  const MatmulFn single = cpu::fast_matmul_affine(ac.tier, ac.bits);
  ASSERT_NE(single, nullptr);
  const MatmulMultiFn multi = std::string(ac.tier) == "avx512" ? cpu::avx512::matmul_multi_affine
                                                               : cpu::avx2::matmul_multi_affine;
  std::mt19937 rng(77 + static_cast<unsigned>(ac.bits * 131 + ac.group_size));
  const DType sdts[] = {DType::kBF16, DType::kF16, DType::kF32};
  std::vector<Weights> ws;
  for (int i = 0; i < 3; ++i) ws.push_back(affine_weights(ac.bits, ac.group_size, sdts[i], 67 - 29 * i, 1280, rng));
  // matmul_multi needs one scale dtype for all its weights: its own set.
  std::vector<Weights> same;
  for (int64_t rows : {67, 40, 9}) same.push_back(affine_weights(ac.bits, ac.group_size, DType::kBF16, rows, 1280, rng));
  const std::string name = "affine" + std::to_string(ac.bits) + "g" + std::to_string(ac.group_size);
  each_mode(ac.tier, [&](const std::string& mode) {
    for (size_t i = 0; i < ws.size(); ++i) {
      std::vector<Weights> one{ws[i]};
      expect_invariant(mode, name + "/" + dtype_name(ws[i].view.scale_dtype), check_format(ac.tier, one, single, nullptr, rng));
    }
    expect_invariant(mode, name + "/multi", check_format(ac.tier, same, single, multi, rng));
  });
}

std::string affine_name(const testing::TestParamInfo<AffineCase>& p) {
  return std::string(p.param.tier) + "_" + std::to_string(p.param.bits) + "bit_g" + std::to_string(p.param.group_size);
}

std::vector<AffineCase> all_affine() {
  std::vector<AffineCase> v;
  for (const char* tier : {"avx2", "avx512"})
    for (int bits : {2, 3, 4, 5, 6, 8})
      for (int gs : {32, 64, 128}) v.push_back({tier, bits, gs});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Widths, BatchInvariantAffine, testing::ValuesIn(all_affine()), affine_name);

// The per-token elementwise ops of a forward (the active table's: this CPU's best tier): a row's
// result must not depend on how many rows the call has either. Widths of stories260K (64, 172)
// and of real models (2048, 8192 + a ragged 2050).
TEST(BatchInvariantOps, RowEqualsRowAlone) {
  const KernelTable& t = active_table();
  std::mt19937 rng(99);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (int threads : {1, 2}) {
    default_pool().set_threads(threads);
    for (int64_t dim : {64, 172, 2048, 2050}) {
      const int64_t n = 17;
      std::vector<float> x(static_cast<size_t>(n * dim)), g(x.size()), wt(static_cast<size_t>(dim));
      for (auto& v : x) v = nd(rng);
      for (auto& v : g) v = nd(rng);
      for (auto& v : wt) v = 1.0f + 0.1f * nd(rng);
      std::vector<float> all(x.size()), one(static_cast<size_t>(dim));
      auto each_row = [&](const char* what, auto&& call_rows) {
        call_rows(0, n, all.data());
        for (int64_t r = 0; r < n; ++r) {
          call_rows(r, 1, one.data());
          EXPECT_EQ(0, std::memcmp(one.data(), all.data() + r * dim, static_cast<size_t>(dim) * 4))
              << what << " dim " << dim << " row " << r << " threads " << threads;
        }
      };
      each_row("rmsnorm", [&](int64_t r0, int64_t rows, float* out) {
        t.rmsnorm(x.data() + r0 * dim, wt.data(), rows, dim, 1e-5f, out);
      });
      each_row("silu_mul", [&](int64_t r0, int64_t rows, float* out) {
        t.silu_mul(g.data() + r0 * dim, x.data() + r0 * dim, out, rows * dim);
      });
      each_row("gelu_tanh_mul", [&](int64_t r0, int64_t rows, float* out) {
        t.gelu_tanh_mul(g.data() + r0 * dim, x.data() + r0 * dim, out, rows * dim);
      });
      each_row("add", [&](int64_t r0, int64_t rows, float* out) {
        t.add(g.data() + r0 * dim, x.data() + r0 * dim, out, rows * dim);
      });
      if (dim % 64 == 0) {  // rope: heads of 64, positions 100 + row
        std::vector<int64_t> pos(static_cast<size_t>(n));
        for (int64_t r = 0; r < n; ++r) pos[r] = 100 + r;
        std::vector<float> inv(32);
        for (int i = 0; i < 32; ++i) inv[i] = std::pow(10000.0f, -static_cast<float>(i) / 32.0f);
        each_row("rope", [&](int64_t r0, int64_t rows, float* out) {
          std::memcpy(out, x.data() + r0 * dim, static_cast<size_t>(rows * dim) * 4);
          t.rope(out, rows, static_cast<int>(dim / 64), 64, 64, pos.data() + r0, inv.data(), RopePairing::kHalf);
        });
      }
    }
  }
  default_pool().set_threads(0);
}

}  // namespace
}  // namespace larder::kernels
