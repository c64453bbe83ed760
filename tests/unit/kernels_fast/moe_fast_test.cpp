// kernels::matmul_experts (moe.h): the grouped expert matmul against per-expert matmuls, in every
// weight format, and the proof that decode and prefill read only the selected experts' bytes.
//
// Bit-identical, not within a tolerance: a group of the decode job runs the active tier's matmul
// of row slices of its expert over the group's rows — the same tiles on the same quantized
// activations as kernels::matmul of the whole expert over those rows (each output row is one
// tile row's dot product, whatever rows its neighbours are) — and a prefill group runs exactly
// kernels::matmul. Under the scalar reference table the grouped result equals the reference loop
// of one matmul per (token, slot) (ref::matmul_experts), again bit for bit (double dot products
// rounded once). The single matmuls themselves are checked against the reference in
// matmul_fast_test, kquant_fast_test and gguf_fast_test.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "larder/core/dtype.h"
#include "larder/core/threadpool.h"
#include "larder/kernels/dispatch.h"
#include "larder/kernels/microscaling.h"
#include "larder/kernels/moe.h"
#include "larder/kernels/ops.h"
#include "larder/kernels/ref/ref_ops.h"

namespace larder::kernels {
namespace {

struct Format {
  DType dtype = DType::kUnknown;
  int bits = 0, group_size = 0;  // MLX affine when bits > 0
  DType scale_dtype = DType::kUnknown;
  std::string name() const {
    if (bits > 0) return "affine_q" + std::to_string(bits) + "_g" + std::to_string(group_size) + "_" + dtype_name(scale_dtype);
    return dtype_name(dtype);
  }
};

void PrintTo(const Format& f, std::ostream* os) { *os << f.name(); }

std::vector<Format> all_formats() {
  std::vector<Format> f;
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0,
                  DType::kQ5_1, DType::kIQ4_NL, DType::kQ2_K, DType::kQ3_K, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K,
                  DType::kIQ4_XS})
    f.push_back({d, 0, 0, DType::kUnknown});
  f.push_back({DType::kU32, 4, 64, DType::kBF16});
  f.push_back({DType::kU32, 8, 64, DType::kF16});
  f.push_back({DType::kU32, 4, 32, DType::kF32});
  f.push_back({DType::kU32, 2, 128, DType::kBF16});
  f.push_back({DType::kU32, 3, 64, DType::kBF16});
  f.push_back({DType::kU32, 5, 32, DType::kF16});
  f.push_back({DType::kU32, 6, 64, DType::kBF16});
  f.push_back({DType::kU32, 8, 128, DType::kBF16});
  // Microscaling floats (gpt-oss's experts are MXFP4): GGUF blocks, MLX codes + U8 scales.
  f.push_back({DType::kMXFP4, 0, 0, DType::kUnknown});
  for (DType d : {DType::kMlxMXFP4, DType::kMlxNVFP4, DType::kMlxMXFP8})
    f.push_back({d, 0, mlx_microscaling_group(d), DType::kU8});
  return f;
}

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

void put_u16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }

// E experts [rows, cols] of one format, each expert's codes, scales and biases in page-aligned
// regions of one anonymous mapping, so a test can take any expert's pages away (mprotect).
class Experts {
 public:
  Experts(const Format& f, int E, int64_t rows, int64_t cols, std::mt19937& rng) : E_(E) {
    WeightView w;
    w.dtype = f.dtype;
    w.rows = rows;
    w.cols = cols;
    w.bits = f.bits;
    w.group_size = f.group_size;
    w.scale_dtype = f.scale_dtype;
    const uint64_t data_bytes = static_cast<uint64_t>(rows) * w.row_bytes();
    const bool mx = is_mlx_microscaling(f.dtype);
    const uint64_t sb_bytes = f.bits > 0 || mx ? dtype_bytes(f.scale_dtype, static_cast<uint64_t>(rows * (cols / f.group_size))) : 0;
    page_ = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    auto up = [&](uint64_t b) { return (b + page_ - 1) / page_ * page_; };
    slot_ = up(data_bytes) + 2 * up(sb_bytes);
    size_ = slot_ * static_cast<uint64_t>(E);
    void* m = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(m, MAP_FAILED);
    base_ = static_cast<uint8_t*>(m);
    std::normal_distribution<float> nd(0.0f, 0.05f);
    std::uniform_real_distribution<float> mag(0.002f, 0.02f);
    for (int e = 0; e < E; ++e) {
      uint8_t* d = base_ + slot_ * static_cast<uint64_t>(e);
      WeightView v = w;
      v.data = d;
      if (f.dtype == DType::kF32) {
        for (uint64_t i = 0; i < data_bytes; i += 4) {
          const float x = nd(rng);
          std::memcpy(d + i, &x, 4);
        }
      } else if (f.dtype == DType::kF16 || f.dtype == DType::kBF16) {
        for (uint64_t i = 0; i < data_bytes; i += 2)
          put_u16(d + i, f.dtype == DType::kF16 ? f32_to_f16(nd(rng)) : f32_to_bf16(nd(rng)));
      } else {
        for (uint64_t i = 0; i < data_bytes; ++i) d[i] = static_cast<uint8_t>(rng());
        if (f.dtype == DType::kMXFP4) {  // e8m0 bytes 2^-11 .. 2^-4 (values ≤ 12× that)
          for (uint64_t b = 0; b < data_bytes; b += 17) d[b] = static_cast<uint8_t>(117 + rng() % 8);
        } else if (f.dtype == DType::kMlxMXFP8) {  // no NaN codes (mlx's quantizer writes none)
          for (uint64_t i = 0; i < data_bytes; ++i)
            if ((d[i] & 0x7f) == 0x7f) d[i] ^= 1;
        }
        if (mx) {
          uint8_t* s = d + up(data_bytes);
          for (uint64_t i = 0; i < sb_bytes; ++i)
            s[i] = static_cast<uint8_t>(f.dtype == DType::kMlxNVFP4 ? 0x10 + rng() % 24 : 117 + rng() % 8);
          v.scales = s;
        } else if (f.bits == 0 && f.dtype != DType::kMXFP4) {
          const uint32_t bb = dtype_info(f.dtype).block_bytes;
          for (uint64_t b = 0; b + bb <= data_bytes; b += bb)
            for (int off : f16_fields(f.dtype)) put_u16(d + b + off, f32_to_f16((rng() & 1 ? 1 : -1) * mag(rng)));
        }
      }
      if (f.bits > 0) {
        uint8_t* s = d + up(data_bytes);
        uint8_t* b = s + up(sb_bytes);
        const uint64_t esz = f.scale_dtype == DType::kF32 ? 4 : 2;
        for (uint64_t i = 0; i < sb_bytes; i += esz) {
          const float sc = mag(rng), bi = -sc * static_cast<float>(1 << (f.bits - 1));
          for (auto [p, val] : {std::pair{s + i, sc}, std::pair{b + i, bi}}) {
            if (esz == 4) std::memcpy(p, &val, 4);
            else put_u16(p, f.scale_dtype == DType::kF16 ? f32_to_f16(val) : f32_to_bf16(val));
          }
        }
        v.scales = s;
        v.biases = b;
      }
      views_.push_back(v);
    }
  }
  ~Experts() {
    if (base_ != nullptr) munmap(base_, size_);
  }
  Experts(const Experts&) = delete;
  Experts& operator=(const Experts&) = delete;

  ExpertsView view() const { return {views_.data(), E_}; }
  const WeightView& expert(int e) const { return views_[static_cast<size_t>(e)]; }
  // Every expert outside `keep` loses all access: touching one of its bytes is a SIGSEGV.
  void protect_except(const std::set<int>& keep) {
    for (int e = 0; e < E_; ++e)
      if (!keep.count(e)) {
        ASSERT_EQ(0, mprotect(base_ + slot_ * static_cast<uint64_t>(e), slot_, PROT_NONE));
      }
  }
  const uint8_t* expert_bytes(int e) const { return base_ + slot_ * static_cast<uint64_t>(e); }

 private:
  int E_ = 0;
  uint64_t page_ = 0, slot_ = 0, size_ = 0;
  uint8_t* base_ = nullptr;
  std::vector<WeightView> views_;
};

std::vector<float> randn(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

// What matmul_experts must equal: for each expert, kernels::matmul of it over its pairs' rows in
// (token, slot) order, scattered back to the pairs.
std::vector<float> per_expert_matmuls(const Experts& ex, int E, const std::vector<float>& x, bool per_slot, int64_t n,
                                      const std::vector<int32_t>& ids, int k) {
  const WeightView& w0 = ex.expert(0);
  std::vector<float> y(static_cast<size_t>(n * k * w0.rows), NAN);
  for (int e = 0; e < E; ++e) {
    std::vector<int64_t> pairs;
    for (int64_t p = 0; p < n * k; ++p)
      if (ids[static_cast<size_t>(p)] == e) pairs.push_back(p);
    if (pairs.empty()) continue;
    const int64_t m = static_cast<int64_t>(pairs.size());
    std::vector<float> xg(static_cast<size_t>(m * w0.cols)), yg(static_cast<size_t>(m * w0.rows));
    for (int64_t i = 0; i < m; ++i)
      std::memcpy(&xg[static_cast<size_t>(i * w0.cols)], &x[static_cast<size_t>((per_slot ? pairs[i] : pairs[i] / k) * w0.cols)],
                  static_cast<size_t>(w0.cols) * 4);
    matmul(ex.expert(e), xg.data(), m, yg.data());
    for (int64_t i = 0; i < m; ++i)
      std::memcpy(&y[static_cast<size_t>(pairs[i] * w0.rows)], &yg[static_cast<size_t>(i * w0.rows)],
                  static_cast<size_t>(w0.rows) * 4);
  }
  return y;
}

std::vector<int32_t> random_ids(int64_t n, int k, int E, std::mt19937& rng) {
  std::vector<int32_t> ids;
  for (int64_t t = 0; t < n; ++t) {
    std::vector<int32_t> all(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) all[static_cast<size_t>(e)] = e;
    std::shuffle(all.begin(), all.end(), rng);
    ids.insert(ids.end(), all.begin(), all.begin() + k);  // k distinct experts per token, as routing gives
  }
  return ids;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

class MatmulExperts : public testing::TestWithParam<Format> {};

// Active tier: equal to per-expert kernels::matmul bit for bit, over decode (every group <= 8
// rows: one job of row-slice pieces), prefill (groups > 8 rows: one GEMM per expert) and mixed
// batches, token- and slot-indexed inputs, 1..3 threads, rows that split into ragged pieces.
TEST_P(MatmulExperts, EqualsPerExpertMatmul) {
  const Format f = GetParam();
  std::mt19937 rng(1234 + static_cast<unsigned>(f.dtype) * 16 + static_cast<unsigned>(f.bits));
  const int E = 8;
  for (int64_t rows : {40, 200}) {
    const int64_t cols = 512;
    Experts ex(f, E, rows, cols, rng);
    ASSERT_TRUE(weight_supported(ex.expert(0))) << f.name();
    for (int threads : {1, 2, 3}) {
      default_pool().set_threads(threads);
      for (int64_t n : {1, 2, 4, 7, 30}) {
        for (int k : {1, 2, 3}) {
          for (bool per_slot : {false, true}) {
            const std::vector<int32_t> ids = random_ids(n, k, E, rng);
            const std::vector<float> x = randn(static_cast<size_t>((per_slot ? n * k : n) * cols), rng);
            std::vector<float> y(static_cast<size_t>(n * k * rows), -777.0f);
            matmul_experts(ex.view(), x.data(), per_slot, n, ids.data(), k, y.data());
            const std::vector<float> want = per_expert_matmuls(ex, E, x, per_slot, n, ids, k);
            ASSERT_TRUE(same_bits(y, want)) << f.name() << " rows " << rows << " threads " << threads << " n " << n
                                             << " k " << k << " per_slot " << per_slot;
          }
        }
      }
    }
  }
  default_pool().set_threads(0);
}

// Reference table: the grouped driver over ref::matmul equals the reference loop of one matmul
// per (token, slot) pair.
TEST_P(MatmulExperts, RefTableEqualsReferenceLoop) {
  const Format f = GetParam();
  const KernelTable saved = active_table();
  set_active_table(ref_table());
  std::mt19937 rng(77 + static_cast<unsigned>(f.dtype) * 16 + static_cast<unsigned>(f.bits));
  const int E = 6;
  const int64_t rows = 24, cols = 256;
  Experts ex(f, E, rows, cols, rng);
  const MatmulFn mm = f.bits > 0 ? ref_table().matmul_affine[f.bits] : ref_table().matmul[static_cast<int>(f.dtype)];
  for (int64_t n : {1, 3, 12}) {
    for (bool per_slot : {false, true}) {
      const int k = 2;
      const std::vector<int32_t> ids = random_ids(n, k, E, rng);
      const std::vector<float> x = randn(static_cast<size_t>((per_slot ? n * k : n) * cols), rng);
      std::vector<float> y(static_cast<size_t>(n * k * rows), -777.0f), want(y.size(), NAN);
      matmul_experts(ex.view(), x.data(), per_slot, n, ids.data(), k, y.data());
      ref::matmul_experts(ex.view(), x.data(), per_slot, n, ids.data(), k, want.data(), mm);
      EXPECT_TRUE(same_bits(y, want)) << f.name() << " n " << n << " per_slot " << per_slot;
    }
  }
  set_active_table(saved);
}

// Decode and prefill read only the selected experts: every other expert's codes, scales and
// biases are PROT_NONE, so one stray byte read crashes the test. The results are those computed
// before the pages were taken away.
TEST_P(MatmulExperts, ReadsOnlySelectedExperts) {
  const Format f = GetParam();
  std::mt19937 rng(5 + static_cast<unsigned>(f.dtype) * 16 + static_cast<unsigned>(f.bits));
  const int E = 16, k = 2;
  const int64_t rows = 136, cols = 512;
  Experts ex(f, E, rows, cols, rng);
  const std::set<int> keep = {3, 7, 12};
  struct Run {
    int64_t n;
    std::vector<int32_t> ids;
    std::vector<float> x, before;
  };
  std::vector<Run> runs;
  for (int64_t n : {1, 4, 20}) {  // 20 tokens: groups of up to 20 rows take the prefill GEMM
    Run r{n, {}, randn(static_cast<size_t>(n * cols), rng), {}};
    for (int64_t t = 0; t < n; ++t) {
      const int a = static_cast<int>(t % 3), b = static_cast<int>((t + 1 + t / 3) % 3);
      r.ids.push_back(*std::next(keep.begin(), a));
      r.ids.push_back(*std::next(keep.begin(), a == b ? (b + 1) % 3 : b));
    }
    r.before.assign(static_cast<size_t>(n * k * rows), 0.0f);
    matmul_experts(ex.view(), r.x.data(), false, n, r.ids.data(), k, r.before.data());
    runs.push_back(std::move(r));
  }
  ex.protect_except(keep);
  for (int threads : {1, 2}) {
    default_pool().set_threads(threads);
    for (const Run& r : runs) {
      std::vector<float> y(static_cast<size_t>(r.n * k * rows), -1.0f);
      matmul_experts(ex.view(), r.x.data(), false, r.n, r.ids.data(), k, y.data());
      EXPECT_TRUE(same_bits(y, r.before)) << f.name() << " n " << r.n << " threads " << threads;
    }
  }
  default_pool().set_threads(0);
}

INSTANTIATE_TEST_SUITE_P(Formats, MatmulExperts, testing::ValuesIn(all_formats()),
                         [](const testing::TestParamInfo<Format>& p) { return p.param.name(); });

// gate and up in one call: each output is the single matmul_experts' bits, for matrices of one
// format and of two (a Q4_K_M file mixes Q4_K and Q6_K; MLX mixed-precision checkpoints widths),
// with different row counts, over decode, prefill and mixed batches.
TEST(MatmulExpertsMulti, EqualsOneCallPerMatrix) {
  std::mt19937 rng(2024);
  const int E = 8;
  const int64_t cols = 512;
  const std::pair<Format, Format> pairs[] = {
      {Format{DType::kQ4_K}, Format{DType::kQ6_K}},
      {Format{DType::kQ4_0}, Format{DType::kQ4_0}},
      {Format{DType::kBF16}, Format{DType::kF32}},
      {Format{DType::kU32, 4, 64, DType::kBF16}, Format{DType::kU32, 8, 64, DType::kBF16}},
  };
  for (const auto& [fa, fb] : pairs) {
    Experts a(fa, E, 96, cols, rng), b(fb, E, 40, cols, rng);
    const ExpertsView views[2] = {a.view(), b.view()};
    for (int threads : {1, 2, 3}) {
      default_pool().set_threads(threads);
      for (int64_t n : {1, 3, 8, 30}) {
        const int k = 2;
        const std::vector<int32_t> ids = random_ids(n, k, E, rng);
        const std::vector<float> x = randn(static_cast<size_t>(n * cols), rng);
        std::vector<float> ya(static_cast<size_t>(n * k * 96), -7.0f), yb(static_cast<size_t>(n * k * 40), -7.0f);
        std::vector<float> wa(ya.size()), wb(yb.size());
        float* ys[2] = {ya.data(), yb.data()};
        matmul_experts_multi(views, ys, 2, x.data(), false, n, ids.data(), k);
        matmul_experts(views[0], x.data(), false, n, ids.data(), k, wa.data());
        matmul_experts(views[1], x.data(), false, n, ids.data(), k, wb.data());
        EXPECT_TRUE(same_bits(ya, wa)) << fa.name() << " + " << fb.name() << " n " << n << " threads " << threads;
        EXPECT_TRUE(same_bits(yb, wb)) << fa.name() << " + " << fb.name() << " n " << n << " threads " << threads;
      }
    }
  }
  default_pool().set_threads(0);
}

// The guard of ReadsOnlySelectedExperts is real: a read of a protected expert's byte kills the
// process.
TEST(MatmulExpertsDeathTest, ProtectedExpertFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  std::mt19937 rng(3);
  Experts ex(Format{DType::kQ4_0}, 4, 8, 64, rng);
  ex.protect_except({0});
  EXPECT_DEATH(
      {
        volatile uint8_t b = ex.expert_bytes(2)[0];
        (void)b;
      },
      "");
}

}  // namespace
}  // namespace larder::kernels
