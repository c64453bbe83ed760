// The Gated DeltaNet fast paths (kernels/cpu/avx2/gated_delta_avx2.cpp and, where the CPU has the
// tier, kernels/cpu/avx512/gated_delta_avx512.cpp) against the scalar reference over random shapes —
// decode n = 1, odd channel counts and head dims (vector tails: d_k, d_v in 64, 128, 48, 96 and odd
// sizes), GQA ratios H_v/H_k 1..4, state rows not a multiple of the row group, token counts across
// the 16-token blocks and the 64-token chunk grid, the conv state carried across calls — at 1–3 pool
// threads, and their call-splitting property (bit-identical outputs and state however the tokens
// are split into calls — one token at a time after a prefill, cuts at and around block and chunk
// boundaries — and across thread counts).
//
// Bounds (relative to 1 + |reference|, the reference being double-accumulated):
// - conv: the reference's order (bias, taps ascending), f32 fma instead of double, and an f32 exp
//   (~1 ulp) in the SiLU: a few ulps; 1e-6.
// - l2norm, gated norm: the sum of squares in f32 (~dim·2^-24 worst case, ~1e-7 typical), the
//   SiLU's exp: 2e-6.
// - gates (AVX-512; the AVX2 tier keeps the reference): f32 exp, log1p and divide, a few ulps of
//   log_g and β; measured <= 1.7e-7, checked at 1e-6.
// - recurrent delta rule: kv and y are d_k-term f32 sums (~sqrt(d_k)·2^-24 of Σ|s·k| per token),
//   carried by the state through n tokens; the recurrence is non-expansive, so the error grows at
//   most linearly in n. Measured <= 8e-8 on both tiers for every shape below (n <= 130); 1e-6 is
//   12x that, while a lane, tail, head or row mix-up is off by 1e-2 or more.
// (Measured for conv, l2norm and the gated norm: <= 3e-7.)
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "larder/core/cpuid.h"
#include "larder/core/threadpool.h"
#include "larder/kernels/cpu/common/cpu_kernels.h"
#include "larder/kernels/dispatch.h"
#include "larder/kernels/ref/ref_ops.h"

namespace larder::kernels {
namespace {

std::vector<float> randv(std::mt19937& rng, int64_t n, float scale) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

double max_err(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double e = 0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    const double d = std::fabs(static_cast<double>(got[i]) - want[i]) / (1.0 + std::fabs(static_cast<double>(want[i])));
    e = std::isnan(d) ? INFINITY : std::max(e, d);
  }
  return e;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

// A tier's gated-delta entries, as register.cpp installs them (the AVX2 tier keeps the reference
// gates).
struct Tier {
  const char* name;
  CausalConv1dFn causal_conv1d;
  L2NormHeadsFn l2norm_heads;
  GatedDeltaGatesFn gated_delta_gates;
  GatedDeltaFn gated_delta_recurrent;
  RmsNormGatedFn rmsnorm_gated;
};

const Tier kTiers[] = {
    {"avx2", cpu::avx2::causal_conv1d, cpu::avx2::l2norm_heads, ref::gated_delta_gates,
     cpu::avx2::gated_delta_recurrent, cpu::avx2::rmsnorm_gated},
    {"avx512", cpu::avx512::causal_conv1d, cpu::avx512::l2norm_heads, cpu::avx512::gated_delta_gates,
     cpu::avx512::gated_delta_recurrent, cpu::avx512::rmsnorm_gated},
};

// (tier index, pool threads)
class GatedDeltaFast : public ::testing::TestWithParam<std::tuple<int, int>> {
 protected:
  void SetUp() override {
    if (std::string(fast().name) == "avx512" && !cpu_features().has_avx512_tier()) GTEST_SKIP() << "no AVX-512 tier";
    default_pool().set_threads(std::get<1>(GetParam()));
  }
  void TearDown() override { default_pool().set_threads(2); }
  static const Tier& fast() { return kTiers[std::get<0>(GetParam())]; }
  static int threads() { return std::get<1>(GetParam()); }
};

// The active table serves the fastest tier this CPU has.
TEST(GatedDeltaDispatch, ActiveTableServesTheFastTier) {
  const char* isa = std::getenv("LARDER_ISA");
  if (isa && std::string(isa) == "ref") GTEST_SKIP() << "LARDER_ISA=ref keeps the reference";
  const char* want = cpu_features().has_avx512_tier() ? "avx512" : "avx2";
  for (const Tier& t : kTiers) {
    if (std::string(t.name) != want) continue;
    EXPECT_EQ(active_table().causal_conv1d, t.causal_conv1d);
    EXPECT_EQ(active_table().l2norm_heads, t.l2norm_heads);
    EXPECT_EQ(active_table().gated_delta_gates, t.gated_delta_gates);
    EXPECT_EQ(active_table().gated_delta_recurrent, t.gated_delta_recurrent);
    EXPECT_EQ(active_table().rmsnorm_gated, t.rmsnorm_gated);
  }
}

TEST_P(GatedDeltaFast, ConvMatchesReferenceAndCarriesState) {
  std::mt19937 rng(11);
  for (int64_t C : {1, 7, 8, 13, 64, 203, 6144}) {
    for (int K : {1, 2, 4, 5}) {
      for (bool silu : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "C " << C << " K " << K << " silu " << silu);
        const int64_t n = C > 1000 ? 9 : 21;
        const auto x = randv(rng, n * C, 1.0f), w = randv(rng, C * K, 0.5f), bias = randv(rng, C, 0.3f);
        const auto st0 = randv(rng, (K - 1) * C, 1.0f);
        CausalConv1dParams p{C, K, w.data(), (C % 2) ? bias.data() : nullptr, silu};
        // Calls of 1, 2, the rest: the state carried (fewer than K−1 tokens per call shifts it).
        std::vector<float> st_ref = st0, st = st0, want(x.size()), got(x.size());
        for (auto [t0, t1] : {std::pair<int64_t, int64_t>{0, 1}, {1, 3}, {3, n}}) {
          ref::causal_conv1d(x.data() + t0 * C, t1 - t0, p, st_ref.data(), want.data() + t0 * C);
          fast().causal_conv1d(x.data() + t0 * C, t1 - t0, p, st.data(), got.data() + t0 * C);
        }
        EXPECT_LE(max_err(got, want), 1e-6);
        EXPECT_TRUE(same_bits(st, st_ref));  // the state is a copy of inputs
        // One call gives the bits of the split calls.
        std::vector<float> st1 = st0, got1(x.size());
        fast().causal_conv1d(x.data(), n, p, st1.data(), got1.data());
        EXPECT_TRUE(same_bits(got1, got));
        EXPECT_TRUE(same_bits(st1, st));
      }
    }
  }
}

// A ragged last block reads no weight past the tensor's end: the weights end right at a page
// that cannot be read (the decode path loads a block's 16 × 4 taps as four vectors, masked).
TEST_P(GatedDeltaFast, ConvReadsNoWeightPastTheEnd) {
  const long page = sysconf(_SC_PAGESIZE);
  auto* base = static_cast<uint8_t*>(mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(base, MAP_FAILED);
  ASSERT_EQ(mprotect(base + page, page, PROT_NONE), 0);
  std::mt19937 rng(15);
  for (int64_t C : {1, 3, 13, 17, 35}) {
    const int K = 4;
    SCOPED_TRACE(::testing::Message() << "C " << C);
    const auto w0 = randv(rng, C * K, 0.5f);
    float* w = reinterpret_cast<float*>(base + page) - C * K;  // the last C·K floats of the page
    std::copy(w0.begin(), w0.end(), w);
    for (int64_t n : {1, 2, 20}) {
      const auto x = randv(rng, n * C, 1.0f);
      std::vector<float> st_ref((K - 1) * C, 0.25f), st = st_ref, want(x.size()), got(x.size());
      const CausalConv1dParams p{C, K, w, nullptr, true};
      ref::causal_conv1d(x.data(), n, p, st_ref.data(), want.data());
      fast().causal_conv1d(x.data(), n, p, st.data(), got.data());
      EXPECT_LE(max_err(got, want), 1e-6) << "n " << n;
    }
  }
  munmap(base, 2 * page);
}

TEST_P(GatedDeltaFast, L2NormMatchesReference) {
  std::mt19937 rng(12);
  for (int dim : {1, 7, 8, 17, 128}) {
    for (int heads : {1, 3}) {
      SCOPED_TRACE(::testing::Message() << "dim " << dim << " heads " << heads);
      const int64_t n = 37, stride = heads * dim + 5;  // a view into a wider row
      const auto x0 = randv(rng, n * stride, 2.0f);
      std::vector<float> want = x0, got = x0;
      const L2NormParams p{heads, dim, stride, 1e-6f, 0.125f};
      ref::l2norm_heads(want.data(), n, p);
      fast().l2norm_heads(got.data(), n, p);
      EXPECT_LE(max_err(got, want), 2e-6);
      for (int64_t t = 0; t < n; ++t)  // the gap between the heads and the next token is untouched
        for (int64_t i = heads * dim; i < stride; ++i) EXPECT_EQ(got[t * stride + i], x0[t * stride + i]);
    }
  }
}

TEST_P(GatedDeltaFast, RmsNormGatedMatchesReference) {
  std::mt19937 rng(13);
  for (int64_t dim : {1, 5, 8, 63, 128}) {
    const int64_t rows = 29;
    const auto x = randv(rng, rows * dim, 3.0f), z = randv(rng, rows * dim, 2.0f), w = randv(rng, dim, 1.0f);
    std::vector<float> want(x.size()), got(x.size());
    ref::rmsnorm_gated(x.data(), z.data(), w.data(), rows, dim, 1e-6f, want.data());
    fast().rmsnorm_gated(x.data(), z.data(), w.data(), rows, dim, 1e-6f, got.data());
    EXPECT_LE(max_err(got, want), 2e-6) << "dim " << dim;
    std::vector<float> inplace = x;  // out may alias x
    fast().rmsnorm_gated(inplace.data(), z.data(), w.data(), rows, dim, 1e-6f, inplace.data());
    EXPECT_TRUE(same_bits(inplace, got));
  }
}

struct Problem {
  GatedDeltaShape s;
  int64_t n = 0, stride = 0;  // q | k | v interleaved per token, as in the conv output
  std::vector<float> qkv, log_g, beta, state;
  GatedDeltaInputs inputs(int64_t t0, int64_t len) const {
    GatedDeltaInputs in;
    const int64_t key_dim = static_cast<int64_t>(s.n_k_heads) * s.d_k;
    in.q = qkv.data() + t0 * stride;
    in.k = in.q + key_dim;
    in.v = in.q + 2 * key_dim;
    in.qkv_stride = stride;
    in.log_g = log_g.data() + t0 * s.n_v_heads;
    in.beta = beta.data() + t0 * s.n_v_heads;
    in.n = len;
    in.pos0 = t0;
    return in;
  }
};

Problem make_problem(int64_t n, int hk, int hv, int dk, int dv, uint32_t seed) {
  std::mt19937 rng(seed);
  Problem p;
  p.s = {hk, hv, dk, dv};
  p.n = n;
  const int64_t key_dim = static_cast<int64_t>(hk) * dk;
  p.stride = 2 * key_dim + static_cast<int64_t>(hv) * dv;
  p.qkv = randv(rng, n * p.stride, 1.0f);
  ref::l2norm_heads(p.qkv.data(), n, {hk, dk, p.stride, 1e-6f, 1.0f / std::sqrt(static_cast<float>(dk))});
  ref::l2norm_heads(p.qkv.data() + key_dim, n, {hk, dk, p.stride, 1e-6f, 1.0f});
  const auto a = randv(rng, n * hv, 1.0f), b = randv(rng, n * hv, 1.5f), a_log = randv(rng, hv, 1.0f),
             dt = randv(rng, hv, 1.0f);
  p.log_g.resize(a.size());
  p.beta.resize(a.size());
  ref::gated_delta_gates(a.data(), b.data(), n, {hv, a_log.data(), dt.data()}, p.log_g.data(), p.beta.data());
  p.state = randv(rng, static_cast<int64_t>(hv) * dv * dk, 0.3f);
  return p;
}

void run_split(const Problem& p, GatedDeltaFn fn, const std::vector<int64_t>& cuts, std::vector<float>& state,
               std::vector<float>& y) {
  state = p.state;
  y.assign(static_cast<size_t>(p.n * p.s.n_v_heads * p.s.d_v), 0.f);
  int64_t t0 = 0;
  std::vector<int64_t> ends = cuts;
  ends.push_back(p.n);
  for (int64_t e : ends) {
    fn(p.inputs(t0, e - t0), p.s, state.data(), y.data() + t0 * p.s.n_v_heads * p.s.d_v);
    t0 = e;
  }
}

TEST_P(GatedDeltaFast, GatesMatchReference) {
  std::mt19937 rng(14);
  for (int hv : {1, 7, 16, 32, 48, 35}) {
    SCOPED_TRACE(::testing::Message() << "hv " << hv);
    const int64_t n = 23;
    auto a = randv(rng, n * hv, 3.0f), b = randv(rng, n * hv, 4.0f);
    const auto a_log = randv(rng, hv, 1.0f), dt = randv(rng, hv, 1.0f);
    // softplus and sigmoid far out on both sides (exp's clamps, log1p of a tiny e^−|u|), and 0.
    const float edges[] = {-120.f, -90.f, -30.f, -17.f, -1e-3f, 0.f, 1e-3f, 17.f, 30.f, 90.f, 120.f};
    for (size_t i = 0; i < std::size(edges) && i < a.size(); ++i) a[i] = b[i] = edges[i];
    const GatedDeltaGateParams p{hv, a_log.data(), dt.data()};
    std::vector<float> lg_ref(a.size()), be_ref(a.size()), lg(a.size()), be(a.size());
    ref::gated_delta_gates(a.data(), b.data(), n, p, lg_ref.data(), be_ref.data());
    fast().gated_delta_gates(a.data(), b.data(), n, p, lg.data(), be.data());
    EXPECT_LE(max_err(lg, lg_ref), 1e-6);
    EXPECT_LE(max_err(be, be_ref), 1e-6);
    for (size_t i = 0; i < lg.size(); ++i) {  // a decay in (0, 1]: log_g <= 0, β in [0, 1]
      ASSERT_LE(lg[i], 0.0f) << i;
      ASSERT_TRUE(be[i] >= 0.0f && be[i] <= 1.0f) << i;
    }
    // Per token, whatever the split: the first 5 tokens alone give the same bits.
    std::vector<float> lg5(5 * hv), be5(5 * hv);
    fast().gated_delta_gates(a.data(), b.data(), 5, p, lg5.data(), be5.data());
    EXPECT_EQ(std::memcmp(lg5.data(), lg.data(), lg5.size() * 4), 0);
    EXPECT_EQ(std::memcmp(be5.data(), be.data(), be5.size() * 4), 0);
  }
}

TEST_P(GatedDeltaFast, RecurrentMatchesReference) {
  const struct {
    int64_t n;
    int hk, hv, dk, dv;
  } shapes[] = {{1, 1, 1, 8, 8},      {1, 2, 4, 128, 128}, {1, 16, 32, 128, 128}, {3, 1, 3, 7, 5},
                {17, 3, 3, 12, 21},   {9, 2, 6, 33, 10},   {70, 2, 4, 128, 128},  {5, 4, 8, 64, 63},
                {16, 2, 8, 48, 96},   {33, 1, 4, 96, 48},  {65, 2, 2, 64, 64},    {130, 1, 2, 128, 128},
                {64, 3, 9, 17, 31},   {20, 4, 16, 80, 128}};
  uint32_t seed = 100;
  for (const auto& sh : shapes) {
    SCOPED_TRACE(::testing::Message() << "n " << sh.n << " hk " << sh.hk << " hv " << sh.hv << " dk " << sh.dk
                                      << " dv " << sh.dv);
    const Problem p = make_problem(sh.n, sh.hk, sh.hv, sh.dk, sh.dv, seed++);
    std::vector<float> s_ref, y_ref, s, y;
    run_split(p, ref::gated_delta_recurrent, {}, s_ref, y_ref);
    run_split(p, fast().gated_delta_recurrent, {}, s, y);
    EXPECT_LE(max_err(y, y_ref), 1e-6);
    EXPECT_LE(max_err(s, s_ref), 1e-6);
    // One thread: the same bits (jobs split rows, never a row's arithmetic).
    {
      default_pool().set_threads(1);
      std::vector<float> s1, y1;
      run_split(p, fast().gated_delta_recurrent, {}, s1, y1);
      default_pool().set_threads(threads());
      EXPECT_TRUE(same_bits(y1, y));
      EXPECT_TRUE(same_bits(s1, s));
    }
    // Split calls — decode steps after a one-token prefill (1+1+...), a prefill then decode, cuts
    // around the 16-token blocks and on/around the 64-token chunk grid: the same bits.
    std::vector<int64_t> singles;
    for (int64_t t = 1; t < p.n; ++t) singles.push_back(t);
    const std::vector<std::vector<int64_t>> splits = {singles, {7}, {15}, {16, 17}, {5, 21, 37}, {63}, {64},
                                                      {65, 66}, {64, 128}};
    for (const std::vector<int64_t>& cuts : splits) {
      if (cuts.empty() || cuts.back() >= p.n) continue;
      SCOPED_TRACE(::testing::Message() << "cuts " << cuts.size() << " first " << cuts[0]);
      std::vector<float> s2, y2;
      run_split(p, fast().gated_delta_recurrent, cuts, s2, y2);
      EXPECT_TRUE(same_bits(y2, y));
      EXPECT_TRUE(same_bits(s2, s));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(TiersThreads, GatedDeltaFast, ::testing::Combine(::testing::Values(0, 1), ::testing::Values(1, 2, 3)),
                         [](const ::testing::TestParamInfo<std::tuple<int, int>>& i) {
                           return std::string(kTiers[std::get<0>(i.param)].name) + "_t" +
                                  std::to_string(std::get<1>(i.param));
                         });

}  // namespace
}  // namespace larder::kernels
