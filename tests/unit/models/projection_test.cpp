// blocks/projection.h: the one linear layer of every family — base matmul + bias, grouped form,
// and per-row low-rank adapter deltas (issue 45's seam).
//
// Tolerance of the adapter-vs-merged-weight checks. Both sides compute the same real number per
// output, Σ_j W'_ij x_j + b_i with W' = W + s·B·A, in different orders: the projection as the
// f32 matmul W·x (kernel order), + b, + s·(B·(A·x)) (two f32 matmuls); the oracle merges W' in
// f32 scalar code and dots it with x in f32. Each side is a chain of at most m = in + rank + 4
// f32 roundings per output, so each is within γ_m = m·u (u = 2^-24) of the exact value relative to
// the sum of the absolute terms S_i = Σ_j |W_ij x_j| + |b_i| + |s|·Σ_k |B_ik|·Σ_j |A_kj x_j|
// (Higham, ch. 3), and the two within 2·γ_m·S_i: a worst-case bound, never flaky, while a wrong
// delta (missing scale, transposed factor, wrong rows) is off by O(S_i).
#include "larder/models/blocks/projection.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "../../support/model_fixture.h"
#include "larder/core/profile.h"
#include "larder/core/threadpool.h"
#include "larder/kernels/dispatch.h"
#include "larder/models/adapter.h"
#include "larder/models/model.h"

namespace larder::models {
namespace {

std::vector<float> randn(size_t n, std::mt19937& g, float sd = 1.0f) {
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

kernels::WeightView f32_view(const std::vector<float>& w, int64_t rows, int64_t cols) {
  kernels::WeightView v;
  v.dtype = DType::kF32;
  v.rows = rows;
  v.cols = cols;
  v.data = reinterpret_cast<const uint8_t*>(w.data());
  return v;
}

// A rank-r delta for a projection [out, in], owning its factors: a [rank, in] and b [out, rank]
// as f32 (the tests' oracles read these), packed for the forward in `packed`.
struct OwnedDelta {
  std::vector<float> a, b;
  kernels::OwnedLoraFactors packed;
  LowRankDelta view(int64_t rank, float scale) const { return {packed.view, scale}; }
};
OwnedDelta random_delta(int64_t out, int64_t in, int64_t rank, std::mt19937& g) {
  OwnedDelta d{randn(static_cast<size_t>(rank * in), g, 0.3f), randn(static_cast<size_t>(out * rank), g, 0.3f), {}};
  d.packed = kernels::own_lora_factors(DType::kF32, d.a.data(), d.b.data(), rank, in, out);
  return d;
}

struct ProjCase {
  static constexpr int64_t kIn = 96, kOut = 40, kRows = 7;
  std::mt19937 g{42};
  std::vector<float> w = randn(kOut * kIn, g, 0.2f), bias = randn(kOut, g), x = randn(kRows * kIn, g);
  Projection p = Projection::over("model.layers.3.self_attn.q_proj", 0, f32_view(w, kOut, kIn), bias);
};

// Per output of the rows a run list covers: the merged-weight oracle and its bound (see above).
void check_against_merged(const ProjCase& s, const std::vector<float>& y, const std::vector<AdapterRun>& runs) {
  const int64_t in = ProjCase::kIn, out = ProjCase::kOut;
  for (int64_t r = 0; r < ProjCase::kRows; ++r) {
    // W' for this row: W + Σ over the runs covering it of s·B·A, merged in f32.
    std::vector<float> merged = s.w;
    std::vector<double> abs_delta(static_cast<size_t>(out), 0.0);
    int64_t max_rank = 0;
    for (size_t ri = 0; ri < runs.size(); ++ri) {
      const AdapterRun& run = runs[ri];
      if (r < run.row0 || r >= run.row0 + run.n) continue;
      const LowRankDelta& d = *run.adapter->find(0);
      const float sc = run.scale * d.scale;
      max_rank = std::max(max_rank, d.rank());
      for (int64_t i = 0; i < out; ++i)
        for (int64_t j = 0; j < in; ++j) {
          float acc = 0;
          for (int64_t k = 0; k < d.rank(); ++k) acc += d.f.b_at(i, k) * d.f.a_at(k, j);
          merged[static_cast<size_t>(i * in + j)] += sc * acc;
          double t = 0;
          for (int64_t k = 0; k < d.rank(); ++k)
            t += std::abs(static_cast<double>(d.f.b_at(i, k)) * d.f.a_at(k, j) *
                          s.x[static_cast<size_t>(r * in + j)]);
          abs_delta[static_cast<size_t>(i)] += std::abs(sc) * t;
        }
    }
    const double u = std::ldexp(1.0, -24), m = static_cast<double>(in + max_rank + 4);
    for (int64_t i = 0; i < out; ++i) {
      float want = 0;
      double S = std::abs(s.bias[static_cast<size_t>(i)]) + abs_delta[static_cast<size_t>(i)];
      for (int64_t j = 0; j < in; ++j) {
        want += merged[static_cast<size_t>(i * in + j)] * s.x[static_cast<size_t>(r * in + j)];
        S += std::abs(static_cast<double>(s.w[static_cast<size_t>(i * in + j)]) * s.x[static_cast<size_t>(r * in + j)]);
      }
      want += s.bias[static_cast<size_t>(i)];
      const double tol = 2 * m * u * S;
      EXPECT_LE(std::abs(static_cast<double>(y[static_cast<size_t>(r * out + i)]) - want), tol)
          << "row " << r << " out " << i << " got " << y[static_cast<size_t>(r * out + i)] << " want " << want;
    }
  }
}

TEST(Projection, BaseIsMatmulPlusBiasAndLabelDropsTheLayer) {
  ProjCase s;
  std::vector<float> y(ProjCase::kRows * ProjCase::kOut), want(y.size());
  s.p.apply(s.x.data(), ProjCase::kRows, y.data());
  kernels::matmul(s.p.weight(), s.x.data(), ProjCase::kRows, want.data());
  for (int64_t r = 0; r < ProjCase::kRows; ++r)
    for (int64_t i = 0; i < ProjCase::kOut; ++i)
      want[static_cast<size_t>(r * ProjCase::kOut + i)] += s.bias[static_cast<size_t>(i)];
  EXPECT_EQ(0, std::memcmp(y.data(), want.data(), y.size() * sizeof(float)));
  EXPECT_EQ(projection_label("model.layers.3.self_attn.q_proj"), "self_attn.q_proj");
  EXPECT_EQ(projection_label("model.language_model.layers.12.mlp.down_proj"), "mlp.down_proj");
  EXPECT_EQ(projection_label("lm_head"), "lm_head");
}

// Rows 1..3 carry adapter A (rank 4), rows 5..6 adapter B (rank 8, request scale 0.5), rows 0 and
// 4 none: adapter rows equal the merged weight, the others the base bit for bit, on every table.
TEST(Projection, AdapterRowsEqualMergedWeightOthersBitIdentical) {
  for (const kernels::KernelTable* table : {&kernels::ref_table(), &kernels::active_table()}) {
    const kernels::KernelTable saved = kernels::active_table();
    kernels::set_active_table(*table);
    ProjCase s;
    const OwnedDelta da = random_delta(ProjCase::kOut, ProjCase::kIn, 4, s.g),
                     db = random_delta(ProjCase::kOut, ProjCase::kIn, 8, s.g);
    Adapter A{{da.view(4, 2.0f)}}, B{{db.view(8, 0.75f)}};
    const std::vector<AdapterRun> runs = {{1, 3, &A, 1.0f}, {5, 2, &B, 0.5f}};
    std::vector<float> y(ProjCase::kRows * ProjCase::kOut), base(y.size());
    s.p.apply(s.x.data(), ProjCase::kRows, y.data(), runs);
    s.p.apply(s.x.data(), ProjCase::kRows, base.data());
    for (int64_t r : {0, 4})
      EXPECT_EQ(0, std::memcmp(y.data() + r * ProjCase::kOut, base.data() + r * ProjCase::kOut,
                               ProjCase::kOut * sizeof(float)))
          << "row " << r << " has no adapter";
    for (int64_t r : {1, 2, 3, 5, 6}) {
      bool differs = false;
      for (int64_t i = 0; i < ProjCase::kOut; ++i)
        differs |= y[static_cast<size_t>(r * ProjCase::kOut + i)] != base[static_cast<size_t>(r * ProjCase::kOut + i)];
      EXPECT_TRUE(differs) << "row " << r << " carries an adapter";
    }
    check_against_merged(s, y, runs);
    kernels::set_active_table(saved);
  }
}

// Two adapters on the same rows add up (llama-server's list of LoRAs per request).
TEST(Projection, OverlappingAdaptersAdd) {
  ProjCase s;
  const OwnedDelta da = random_delta(ProjCase::kOut, ProjCase::kIn, 3, s.g),
                   db = random_delta(ProjCase::kOut, ProjCase::kIn, 5, s.g);
  Adapter A{{da.view(3, 1.0f)}}, B{{db.view(5, -0.5f)}};
  const std::vector<AdapterRun> runs = {{0, 5, &A, 1.0f}, {2, 5, &B, 1.5f}};
  std::vector<float> y(ProjCase::kRows * ProjCase::kOut);
  s.p.apply(s.x.data(), ProjCase::kRows, y.data(), runs);
  check_against_merged(s, y, runs);
}

// A call mixing adapters equals each group of rows run alone with its own adapter (bit for bit:
// the base matmul of these tables is row-invariant and each run's delta sees the same rows).
TEST(Projection, MixedAdaptersInOneCallEqualEachAlone) {
  for (const kernels::KernelTable* table : {&kernels::ref_table(), &kernels::active_table()}) {
    const kernels::KernelTable saved = kernels::active_table();
    kernels::set_active_table(*table);
    ProjCase s;
    const OwnedDelta da = random_delta(ProjCase::kOut, ProjCase::kIn, 4, s.g),
                     db = random_delta(ProjCase::kOut, ProjCase::kIn, 16, s.g);
    Adapter A{{da.view(4, 1.0f)}}, B{{db.view(16, 0.25f)}};
    const std::vector<AdapterRun> runs = {{0, 2, &A, 1.0f}, {3, 4, &B, 2.0f}};
    std::vector<float> mixed(ProjCase::kRows * ProjCase::kOut);
    s.p.apply(s.x.data(), ProjCase::kRows, mixed.data(), runs);
    struct Alone {
      int64_t row0, n;
      const Adapter* ad;
      float scale;
    };
    for (const Alone& a : {Alone{0, 2, &A, 1.0f}, Alone{2, 1, nullptr, 1.0f}, Alone{3, 4, &B, 2.0f}}) {
      std::vector<float> y(static_cast<size_t>(a.n * ProjCase::kOut));
      const AdapterRun run{0, a.n, a.ad, a.scale};
      s.p.apply(s.x.data() + a.row0 * ProjCase::kIn, a.n, y.data(), a.ad ? AdapterRows(&run, 1) : AdapterRows());
      EXPECT_EQ(0, std::memcmp(y.data(), mixed.data() + a.row0 * ProjCase::kOut, y.size() * sizeof(float)))
          << table->name << " rows " << a.row0 << ".." << a.row0 + a.n;
    }
    kernels::set_active_table(saved);
  }
}

// The fast delta path against the scalar reference (double accumulation), same bound.
TEST(Projection, FastDeltasMatchReference) {
  ProjCase s;
  const OwnedDelta da = random_delta(ProjCase::kOut, ProjCase::kIn, 7, s.g);
  Adapter A{{da.view(7, 0.6f)}};
  const std::vector<AdapterRun> runs = {{1, 6, &A, 1.0f}};
  std::vector<float> fast(ProjCase::kRows * ProjCase::kOut, 0.0f), ref(fast.size(), 0.0f);
  add_deltas(s.p, s.x.data(), ProjCase::kRows, fast.data(), runs);
  add_deltas_ref(s.p, s.x.data(), ProjCase::kRows, ref.data(), runs);
  for (int64_t i = 0; i < ProjCase::kOut; ++i) EXPECT_EQ(fast[static_cast<size_t>(i)], 0.0f) << "row 0 carries nothing";
  double max_ref = 0, max_diff = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    max_ref = std::max(max_ref, std::abs(static_cast<double>(ref[i])));
    max_diff = std::max(max_diff, std::abs(static_cast<double>(fast[i]) - ref[i]));
  }
  EXPECT_GT(max_ref, 0.1);
  // Terms |B||A x| are O(max_ref); (in + rank + 4) f32 roundings, u = 2^-24: well under 1e-5.
  EXPECT_LE(max_diff, 1e-5 * max_ref);
}

// The grouped form is one matmul_multi: each output equals its projection applied alone, adapters
// and biases included, bit for bit.
TEST(Projection, GroupEqualsEachAlone) {
  std::mt19937 g(7);
  const int64_t in = 64, n = 5;
  std::vector<float> wq = randn(32 * in, g), wk = randn(16 * in, g), wv = randn(16 * in, g), x = randn(n * in, g);
  Projection q = Projection::over("q", 0, f32_view(wq, 32, in), randn(32, g));
  Projection k = Projection::over("k", 1, f32_view(wk, 16, in), randn(16, g));
  Projection v = Projection::over("v", 2, f32_view(wv, 16, in));
  const OwnedDelta dq = random_delta(32, in, 4, g), dv = random_delta(16, in, 2, g);
  Adapter A{{dq.view(4, 1.0f), LowRankDelta{}, dv.view(2, 3.0f)}};  // leaves k alone
  const std::vector<AdapterRun> runs = {{1, 3, &A, 1.0f}};
  std::vector<float> yq(n * 32), yk(n * 16), yv(n * 16);
  const Projection* ps[3] = {&q, &k, &v};
  float* ys[3] = {yq.data(), yk.data(), yv.data()};
  apply_group(ps, ys, 3, x.data(), n, runs);
  for (int i = 0; i < 3; ++i) {
    std::vector<float> alone(static_cast<size_t>(n * ps[i]->out()));
    ps[i]->apply(x.data(), n, alone.data(), runs);
    EXPECT_EQ(0, std::memcmp(alone.data(), ys[i], alone.size() * sizeof(float))) << ps[i]->name();
  }
}

// The deltas of a group over random shapes (widths and ranks off multiples of 8, decode-sized and
// prefill-sized calls cut into blocks, adapters overlapping and leaving projections alone): each
// output within the bound above of the scalar double-accumulation reference, and the same bits
// whether the pool runs the tasks on 1 thread or 3, and whether a row is computed in the batch or
// alone (the tasks split rows by adapter and block; a row's arithmetic must not depend on that).
TEST(Projection, GroupDeltasOverRandomShapesMatchReferenceOnAnyPool) {
  std::mt19937 g(2024);
  const int saved_threads = default_pool().n_threads();
  for (int trial = 0; trial < 12; ++trial) {
    std::uniform_int_distribution<int64_t> width(1, 150), rank(1, 40), rows(1, 40);
    const int count = 1 + trial % 3;
    const int64_t in = width(g), n = trial % 2 ? rows(g) : 1 + trial % 8;
    std::vector<std::vector<float>> ws(count);
    std::vector<Projection> projs;
    for (int i = 0; i < count; ++i) {
      const int64_t out = width(g);
      ws[static_cast<size_t>(i)] = randn(static_cast<size_t>(out * in), g, 0.2f);
      projs.push_back(Projection::over(std::to_string(i).insert(0, "p"), i, f32_view(ws[static_cast<size_t>(i)], out, in)));
    }
    const std::vector<float> x = randn(static_cast<size_t>(n * in), g);
    // Four adapters; adapter j leaves projection j % (count + 1) alone when that index exists.
    std::vector<std::vector<OwnedDelta>> owned(4);
    std::vector<Adapter> ads(4);
    for (int j = 0; j < 4; ++j)
      for (int i = 0; i < count; ++i) {
        const int64_t r = rank(g);
        owned[static_cast<size_t>(j)].push_back(random_delta(projs[static_cast<size_t>(i)].out(), in, r, g));
        ads[static_cast<size_t>(j)].deltas.push_back(
            i == j % (count + 1) && count > 1 ? LowRankDelta{} : owned[static_cast<size_t>(j)].back().view(r, 0.5f + j));
      }
    // Runs: consecutive row ranges round-robin over the adapters, plus one overlapping run.
    std::vector<AdapterRun> runs;
    for (int64_t r0 = 0, j = 0; r0 < n; ++j) {
      const int64_t len = std::min<int64_t>(n - r0, 1 + (j * 7 + trial) % 19);
      if (j % 5 != 4) runs.push_back({r0, len, &ads[static_cast<size_t>(j % 4)], 1.0f - 0.25f * static_cast<float>(j % 3)});
      r0 += len;
    }
    runs.push_back({0, (n + 1) / 2, &ads[3], -0.75f});
    std::vector<const Projection*> ps;
    for (const Projection& p : projs) ps.push_back(&p);
    auto run_group = [&](int threads) {
      default_pool().set_threads(threads);
      std::vector<std::vector<float>> ys(static_cast<size_t>(count));
      std::vector<float*> yp;
      for (int i = 0; i < count; ++i) {
        ys[static_cast<size_t>(i)].assign(static_cast<size_t>(n * projs[static_cast<size_t>(i)].out()), 0.0f);
        yp.push_back(ys[static_cast<size_t>(i)].data());
      }
      apply_group(ps.data(), yp.data(), count, x.data(), n, runs);
      return ys;
    };
    const auto one = run_group(1), three = run_group(3);
    default_pool().set_threads(saved_threads);
    for (int i = 0; i < count; ++i) {
      const Projection& p = projs[static_cast<size_t>(i)];
      const std::vector<float>& y = one[static_cast<size_t>(i)];
      ASSERT_EQ(0, std::memcmp(y.data(), three[static_cast<size_t>(i)].data(), y.size() * sizeof(float)))
          << "trial " << trial << " " << p.name() << ": 1 thread vs 3";
      // Against the reference: the base alone plus the reference deltas.
      std::vector<float> want(y.size());
      p.apply(x.data(), n, want.data());
      add_deltas_ref(p, x.data(), n, want.data(), runs);
      for (int64_t r = 0; r < n; ++r)
        for (int64_t o = 0; o < p.out(); ++o) {
          // Bound: the base dot's and the delta's absolute terms, (in + 2·rank_max + 4 + runs) roundings.
          double S = 0;
          for (int64_t c = 0; c < in; ++c)
            S += std::abs(static_cast<double>(ws[static_cast<size_t>(i)][static_cast<size_t>(o * in + c)]) *
                          x[static_cast<size_t>(r * in + c)]);
          for (const AdapterRun& run : runs) {
            if (r < run.row0 || r >= run.row0 + run.n) continue;
            const LowRankDelta* d = run.adapter->find(p.id());
            if (!d) continue;
            for (int64_t k = 0; k < d->rank(); ++k) {
              double t = 0;
              for (int64_t c = 0; c < in; ++c)
                t += std::abs(static_cast<double>(d->f.a_at(k, c)) * x[static_cast<size_t>(r * in + c)]);
              S += std::abs(static_cast<double>(run.scale) * d->scale * d->f.b_at(o, k)) * t;
            }
          }
          const size_t at = static_cast<size_t>(r * p.out() + o);
          const double err = std::abs(static_cast<double>(y[at]) - want[at]);
          EXPECT_LE(err, (in + 2 * 40 + 4 + static_cast<double>(runs.size())) * std::ldexp(1.0, -24) * S)
              << "trial " << trial << " " << p.name() << " row " << r << " out " << o;
        }
      // Each row alone (its runs moved to row 0) gives the same bits as in the batch.
      for (int64_t r = 0; r < n; ++r) {
        std::vector<AdapterRun> alone;
        for (const AdapterRun& run : runs)
          if (r >= run.row0 && r < run.row0 + run.n) alone.push_back({0, 1, run.adapter, run.scale});
        std::vector<float> yr(static_cast<size_t>(p.out()));
        p.apply(x.data() + r * in, 1, yr.data(), alone);
        ASSERT_EQ(0, std::memcmp(yr.data(), y.data() + r * p.out(), yr.size() * sizeof(float)))
            << "trial " << trial << " " << p.name() << " row " << r << " alone";
      }
    }
  }
}

// A delta stored BF16 or F16 (as its adapter file ships it) is read in that dtype by the fast path
// and gives the same bits as its f32 widening (widening is exact; the arithmetic is the same), over
// random shapes (widths and ranks off multiples of 8, decode- and prefill-sized calls); the f32
// form against the scalar reference is checked above.
TEST(Projection, SixteenBitDeltasEqualTheirF32Widening) {
  std::mt19937 g(99);
  for (DType half : {DType::kBF16, DType::kF16}) {
    for (int trial = 0; trial < 8; ++trial) {
      std::uniform_int_distribution<int64_t> width(1, 200), rank(1, 40);
      const int64_t in = width(g), out = width(g), r = rank(g), n = trial % 2 ? 37 : 1 + trial;
      const std::vector<float> w = randn(static_cast<size_t>(out * in), g, 0.2f), x = randn(static_cast<size_t>(n * in), g);
      Projection p = Projection::over("p", 0, f32_view(w, out, in));
      // Factors rounded to the 16-bit dtype, kept both ways.
      auto to16 = [&](size_t count, std::vector<uint16_t>& h, std::vector<float>& f) {
        const std::vector<float> v = randn(count, g, 0.3f);
        h.resize(count);
        f.resize(count);
        for (size_t i = 0; i < count; ++i) {
          h[i] = half == DType::kBF16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
          f[i] = half == DType::kBF16 ? bf16_to_f32(h[i]) : f16_to_f32(h[i]);
        }
      };
      std::vector<uint16_t> a16, b16;
      std::vector<float> a32, b32;
      to16(static_cast<size_t>(r * in), a16, a32);
      to16(static_cast<size_t>(out * r), b16, b32);
      const kernels::OwnedLoraFactors f32 = kernels::own_lora_factors(DType::kF32, a32.data(), b32.data(), r, in, out);
      const kernels::OwnedLoraFactors f16 = kernels::own_lora_factors(half, a16.data(), b16.data(), r, in, out);
      Adapter wide{{LowRankDelta{f32.view, 0.7f}}};
      Adapter narrow{{LowRankDelta{f16.view, 0.7f}}};
      const std::vector<AdapterRun> rw = {{0, n, &wide, 1.5f}}, rn = {{0, n, &narrow, 1.5f}};
      std::vector<float> yw(static_cast<size_t>(n * out)), yn(yw.size());
      p.apply(x.data(), n, yw.data(), rw);
      p.apply(x.data(), n, yn.data(), rn);
      ASSERT_EQ(0, std::memcmp(yw.data(), yn.data(), yw.size() * sizeof(float)))
          << dtype_name(half) << " trial " << trial << " (" << out << "x" << in << " rank " << r << ", " << n << " rows)";
      // And not the base alone (the delta was applied).
      std::vector<float> yb(yw.size());
      p.apply(x.data(), n, yb.data());
      EXPECT_NE(0, std::memcmp(yw.data(), yb.data(), yw.size() * sizeof(float)));
    }
  }
}

// Profiling goes through the projection: its matmul's row names it (layers aggregated), a group's
// row names every member, the adapter delta has a row of its own, and the label ends with the call.
TEST(Projection, ProfileRowsNameTheProjection) {
  ProjCase s;
  const OwnedDelta da = random_delta(ProjCase::kOut, ProjCase::kIn, 2, s.g);
  Adapter A{{da.view(2, 1.0f)}};
  const std::vector<AdapterRun> runs = {{0, 1, &A, 1.0f}};
  Projection k = Projection::over("model.layers.7.self_attn.k_proj", 1, s.p.weight());
  std::vector<float> y(ProjCase::kRows * ProjCase::kOut), y2(y.size());
  profile::reset();
  profile::set_enabled(true);
  s.p.apply(s.x.data(), ProjCase::kRows, y.data(), runs);
  const Projection* ps[2] = {&s.p, &k};
  float* ys[2] = {y.data(), y2.data()};
  apply_group(ps, ys, 2, s.x.data(), ProjCase::kRows);
  kernels::matmul(s.p.weight(), s.x.data(), 1, y.data());  // outside any projection
  profile::set_enabled(false);
  std::vector<std::string> names;
  for (const profile::OpStat& op : profile::snapshot()) names.push_back(op.name);
  auto has = [&](const std::string& n) { return std::find(names.begin(), names.end(), n) != names.end(); };
  EXPECT_TRUE(has("matmul F32 40x96 n<=8 [self_attn.q_proj]"));
  EXPECT_TRUE(has("matmul_multi F32 2 x (80 rows)x96 n<=8 [self_attn.q_proj+k_proj]") ||
              has("matmul F32 40x96 n<=8 [self_attn.q_proj+k_proj]"))  // a tier without a fused F32 path
      << ::testing::PrintToString(names);
  EXPECT_TRUE(has("lora delta"));
  EXPECT_TRUE(has("matmul F32 40x96")) << "the label must end with the projection's call";
}

// The model's projection table: lm_head first, then each layer's in the order the family binds
// them, under canonical HF names (what adapters are matched against).
TEST(Projection, ModelTableNamesEveryProjection) {
  test::LoadedModel l = test::load_model(test::kModelFixtures + "llama_untied_f32");
  ASSERT_NE(l.model, nullptr);
  const auto projs = l.model->projections();
  const int64_t L = l.model->info().n_layers;
  ASSERT_EQ(static_cast<int64_t>(projs.size()), 1 + 7 * L);
  EXPECT_EQ(projs[0].name, "lm_head");
  EXPECT_EQ(projs[0].out, l.model->info().vocab);
  const char* per_layer[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                             "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
  for (int i = 0; i < 7; ++i) EXPECT_EQ(projs[1 + i].name, std::string("model.layers.0.") + per_layer[i]);
  EXPECT_EQ(projs[4].in, l.model->info().n_heads * l.model->info().head_dim);  // o_proj
  test::LoadedModel q = test::load_model(test::kModelFixtures + "qwen3_5_text_f32");
  ASSERT_NE(q.model, nullptr);
  int delta = 0;
  for (const ProjectionInfo& p : q.model->projections())
    delta += p.name.find("linear_attn.in_proj_qkv") != std::string::npos ||
             p.name.find("linear_attn.out_proj") != std::string::npos;
  EXPECT_GT(delta, 0) << "the DeltaNet in/out projections are projections";
}

// Model level, every family's layer kinds: an adapter with a random delta on every projection the
// model declares (attention, MLP, DeltaNet in/out, per-layer-input projections, lm_head). In one
// batch, the base item's logits equal its forward alone and the adapter items' equal theirs alone
// (reference table: row-invariant, so bit for bit), and the adapter changes the logits.
class AdapterModel : public ::testing::TestWithParam<const char*> {};

TEST_P(AdapterModel, BatchedAdaptersEqualEachAloneBaseUntouched) {
  test::LoadedModel l = test::load_model(test::kModelFixtures + GetParam());
  ASSERT_NE(l.model, nullptr);
  Model& m = *l.model;
  const std::span<const ProjectionInfo> projs = m.projections();
  ASSERT_FALSE(projs.empty());
  EXPECT_EQ(projs.back().name == "lm_head" || projs.front().name == "lm_head", true) << "lm_head is a projection";
  std::mt19937 g(3);
  std::vector<OwnedDelta> owned;
  Adapter X, Y;
  for (const ProjectionInfo& p : projs) {
    owned.push_back(random_delta(p.out, p.in, 2, g));
    X.deltas.push_back(owned.back().view(2, 0.05f));
    owned.push_back(random_delta(p.out, p.in, 3, g));
    Y.deltas.push_back(owned.back().view(3, 0.03f));
  }
  const kernels::KernelTable saved = kernels::active_table();
  kernels::set_active_table(kernels::ref_table());
  const int64_t V = m.info().vocab;
  std::vector<int32_t> toks(24);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<int32_t>((i * 31 + 5) % V);
  const AdapterUse use_x[] = {{&X, 1.0f}}, use_xy[] = {{&X, 0.5f}, {&Y, 1.0f}};
  struct Item {
    int64_t off, n;
    bool all;
    std::span<const AdapterUse> ad;
    int64_t next;
  };  // next: the decode token
  const Item items[] = {{0, 7, true, use_x, 21}, {7, 5, false, {}, 22}, {12, 9, true, use_xy, 23}};
  auto run = [&](std::span<const Item> its, std::vector<std::vector<float>>* out) {
    std::vector<memory::SequenceState> states;
    for (size_t i = 0; i < its.size(); ++i) states.push_back(m.new_state(64));
    std::vector<BatchItem> batch;
    out->assign(its.size(), {});
    for (size_t i = 0; i < its.size(); ++i) {
      (*out)[i].resize(static_cast<size_t>((its[i].all ? its[i].n : 1) * V));
      batch.push_back({toks.data() + its[i].off, its[i].n, &states[i], (*out)[i].data(), its[i].all, its[i].ad});
    }
    ASSERT_TRUE(m.forward_batch(batch).is_ok());
    // and one batched decode step on top
    for (size_t i = 0; i < its.size(); ++i) {
      batch[i].tokens = toks.data() + its[i].next;
      batch[i].n = 1;
      batch[i].logits_all = false;
      (*out)[i].resize((*out)[i].size() + static_cast<size_t>(V));
      batch[i].logits = (*out)[i].data() + (*out)[i].size() - V;
    }
    ASSERT_TRUE(m.forward_batch(batch).is_ok());
  };
  std::vector<std::vector<float>> together;
  run(items, &together);
  for (size_t i = 0; i < std::size(items); ++i) {
    std::vector<std::vector<float>> alone;
    run(std::span<const Item>(&items[i], 1), &alone);
    ASSERT_EQ(alone[0].size(), together[i].size());
    EXPECT_EQ(0, std::memcmp(alone[0].data(), together[i].data(), alone[0].size() * sizeof(float))) << "item " << i;
    if (!items[i].ad.empty()) {  // the adapter does change this item's logits
      Item base = items[i];
      base.ad = {};
      std::vector<std::vector<float>> plain;
      run(std::span<const Item>(&base, 1), &plain);
      double diff = 0;
      for (size_t j = 0; j < plain[0].size(); ++j)
        diff = std::max(diff, std::abs(static_cast<double>(plain[0][j]) - alone[0][j]));
      EXPECT_GT(diff, 1e-4) << "item " << i;
    }
  }
  // Bad input: an adapter with more deltas than the model has projections, a null adapter.
  Adapter big;
  big.deltas.resize(projs.size() + 1);
  memory::SequenceState st = m.new_state(8);
  std::vector<float> lg(static_cast<size_t>(V));
  const AdapterUse bad[] = {{&big, 1.0f}}, null_use[] = {{nullptr, 1.0f}};
  for (std::span<const AdapterUse> b : {std::span<const AdapterUse>(bad), std::span<const AdapterUse>(null_use)}) {
    const BatchItem it{toks.data(), 2, &st, lg.data(), false, b};
    const Status s = m.forward_batch(std::span<const BatchItem>(&it, 1));
    EXPECT_FALSE(s.is_ok());
    EXPECT_NE(s.to_string().find("adapter"), std::string::npos) << s.to_string();
    EXPECT_EQ(st.length(), 0);
  }
  kernels::set_active_table(saved);
}

// llama (untied head, GQA), qwen2 (q/k/v biases), qwen3 (q/k norms), gemma3 (sandwich, rings),
// gemma4 (per-layer-input projections, KV sharing), qwen3_5 (DeltaNet in/out projections, gated
// attention).
INSTANTIATE_TEST_SUITE_P(Families, AdapterModel,
                         ::testing::Values("llama_untied_f32", "qwen2_f32", "qwen3_f32", "gemma3_text_f32",
                                           "gemma4_text_f32", "qwen3_5_text_f32"));

}  // namespace
}  // namespace larder::models
