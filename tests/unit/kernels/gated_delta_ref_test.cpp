// The reference Gated DeltaNet kernels (kernels/ref/gated_delta.cpp) against mlx-lm's own code
// (fixture tests/ref/gated_delta_reference.py), the chunked form against the recurrent one, and
// the call-splitting property of each.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "larder/kernels/ref/ref_ops.h"
#include "test_util.h"

namespace larder::kernels {
namespace {

using testing::randn;
using testing::read_bytes;

std::vector<float> read_f32(const std::string& path) {
  const std::vector<uint8_t> b = read_bytes(path, "gated_delta_ref");
  std::vector<float> v(b.size() / 4);
  if (!b.empty()) std::memcpy(v.data(), b.data(), b.size());
  return v;
}

// max |got − want| / (1 + |want|) over the elements (relative for large values, absolute near 0).
double max_err(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double e = 0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    const double d = std::fabs(static_cast<double>(got[i]) - want[i]) / (1.0 + std::fabs(static_cast<double>(want[i])));
    e = std::isnan(d) ? INFINITY : std::max(e, d);
  }
  return e;
}

// Tolerances against mlx (f32 throughout, its own summation orders) — the reference rounds once
// per result from double, so the difference is mlx's own f32 rounding:
// - conv (a K-term sum, SiLU), l2norm, gates, gated norm: a few f32 ulps (2^-24 ≈ 6e-8) of the
//   result; measured <= 3e-7 (the gated norm: rsqrt, exp and three products in f32). 1e-6 fails
//   on any wrong tap, head, scale or eps (those are off by 1e-3 or more).
// - delta rule: kv and y are d_k-term f32 sums in mlx (error ~ sqrt(d_k)·2^-24 of Σ|s·k|), and
//   the state carries them through n tokens; the recurrence is non-expansive (0 < g <= 1, |k| = 1,
//   0 < β < 1: S ← g(I − βkkᵀ)S + ...), so errors add up at most linearly in n. Measured <= 7e-8 for
//   n <= 70, d_k = 128; 1e-6 is 15x that, and a wrong head mapping, gate or orientation is off by
//   1e-2 or more.
constexpr double kElemTol = 1e-6;
constexpr double kDeltaTol = 1e-6;

struct Case {
  std::string stem;
  int64_t n = 0;
  GatedDeltaShape s;
  int K = 0;
  float eps = 0;
};

std::vector<Case> cases() {
  const std::string dir = std::string(LARDER_TEST_DATA_DIR) + "/gated_delta/";
  std::ifstream f(dir + "index.json");
  EXPECT_TRUE(f.good()) << "fixture gated_delta_ref did not run";
  std::vector<Case> out;
  if (!f.good()) return out;
  for (const auto& c : nlohmann::json::parse(f)) {
    Case k;
    k.stem = dir + c["stem"].get<std::string>();
    k.n = c["n"];
    k.s.n_k_heads = c["n_k_heads"];
    k.s.n_v_heads = c["n_v_heads"];
    k.s.d_k = c["d_k"];
    k.s.d_v = c["d_v"];
    k.K = c["kernel"];
    k.eps = c["eps"];
    out.push_back(k);
  }
  return out;
}

TEST(GatedDeltaRef, MatchesMlxLm) {
  const std::vector<Case> all = cases();
  ASSERT_FALSE(all.empty());
  for (const Case& c : all) {
    SCOPED_TRACE(c.stem);
    auto in = [&](const char* name) { return read_f32(c.stem + "." + name); };
    const int64_t n = c.n, hk = c.s.n_k_heads, hv = c.s.n_v_heads, dk = c.s.d_k, dv = c.s.d_v;
    const int64_t key_dim = hk * dk, C = 2 * key_dim + hv * dv;

    // conv1d + SiLU, and the carried state.
    std::vector<float> x = in("x"), w = in("conv_w"), cstate = in("conv_state"), conv(static_cast<size_t>(n * C));
    CausalConv1dParams cp{C, c.K, w.data(), nullptr, true};
    ref::causal_conv1d(x.data(), n, cp, cstate.data(), conv.data());
    EXPECT_LE(max_err(conv, in("conv_out")), kElemTol);
    EXPECT_LE(max_err(cstate, in("conv_state_out")), 0.0);  // a copy of inputs: exact

    // q/k normalisation on mlx's conv output, in place with the conv row stride.
    std::vector<float> qkv = in("conv_out");
    ref::l2norm_heads(qkv.data(), n, {static_cast<int>(hk), static_cast<int>(dk), C, 1e-6f,
                                      static_cast<float>(1.0 / std::sqrt(static_cast<double>(dk)))});
    ref::l2norm_heads(qkv.data() + key_dim, n, {static_cast<int>(hk), static_cast<int>(dk), C, 1e-6f, 1.0f});
    std::vector<float> qn(static_cast<size_t>(n * key_dim)), kn(qn.size());
    for (int64_t t = 0; t < n; ++t) {
      std::copy_n(&qkv[t * C], key_dim, &qn[t * key_dim]);
      std::copy_n(&qkv[t * C + key_dim], key_dim, &kn[t * key_dim]);
    }
    EXPECT_LE(max_err(qn, in("q_norm")), kElemTol);
    EXPECT_LE(max_err(kn, in("k_norm")), kElemTol);

    // gates: exp(log_g) is mlx's g.
    std::vector<float> a = in("a"), b = in("b"), a_log = in("a_log"), dt_bias = in("dt_bias");
    std::vector<float> log_g(static_cast<size_t>(n * hv)), beta(log_g.size()), g(log_g.size());
    ref::gated_delta_gates(a.data(), b.data(), n, {static_cast<int>(hv), a_log.data(), dt_bias.data()}, log_g.data(),
                           beta.data());
    for (size_t i = 0; i < g.size(); ++i) g[i] = std::exp(log_g[i]);
    EXPECT_LE(max_err(g, in("g")), kElemTol);
    EXPECT_LE(max_err(beta, in("beta")), kElemTol);

    // The delta rule over mlx's normalised q/k and v (a view into the conv output: stride C), from
    // mlx's initial state; the recurrent and the chunked form (at two grid offsets).
    const std::vector<float> mq = in("q_norm"), mk = in("k_norm"), conv_ref = in("conv_out");
    std::vector<float> qkv_m = conv_ref;
    for (int64_t t = 0; t < n; ++t) {
      std::copy_n(&mq[t * key_dim], key_dim, &qkv_m[t * C]);
      std::copy_n(&mk[t * key_dim], key_dim, &qkv_m[t * C + key_dim]);
    }
    GatedDeltaInputs gi;
    gi.q = qkv_m.data();
    gi.k = qkv_m.data() + key_dim;
    gi.v = qkv_m.data() + 2 * key_dim;
    gi.qkv_stride = C;
    gi.log_g = log_g.data();
    gi.beta = beta.data();
    gi.n = n;
    const std::vector<float> y_ref = in("y"), s_ref = in("state_out");
    for (int form = 0; form < 3; ++form) {
      SCOPED_TRACE(form == 0 ? "recurrent" : form == 1 ? "chunked pos0 0" : "chunked pos0 37");
      std::vector<float> st = in("state"), y(static_cast<size_t>(n * hv * dv));
      gi.pos0 = form == 2 ? 37 : 0;
      (form == 0 ? ref::gated_delta_recurrent : ref::gated_delta_chunked)(gi, c.s, st.data(), y.data());
      EXPECT_LE(max_err(y, y_ref), kDeltaTol);
      EXPECT_LE(max_err(st, s_ref), kDeltaTol);
    }

    // gated RMSNorm on mlx's y.
    std::vector<float> z = in("z"), nw = in("norm_w"), out(y_ref.size());
    ref::rmsnorm_gated(y_ref.data(), z.data(), nw.data(), n * hv, dv, c.eps, out.data());
    EXPECT_LE(max_err(out, in("norm_out")), kElemTol);
  }
}

// Random delta-rule problems shaped like the family's: normalised q/k, gates from the gates op.
struct Problem {
  GatedDeltaShape s;
  int64_t n = 0;
  std::vector<float> q, k, v, log_g, beta, state;
  GatedDeltaInputs inputs(int64_t t0, int64_t len, int64_t pos0) const {
    GatedDeltaInputs in;
    const int64_t qks = static_cast<int64_t>(s.n_k_heads) * s.d_k, vs = static_cast<int64_t>(s.n_v_heads) * s.d_v;
    in.q = q.data() + t0 * qks;
    in.k = k.data() + t0 * qks;
    in.v = v.data() + t0 * vs;
    in.log_g = log_g.data() + t0 * s.n_v_heads;
    in.beta = beta.data() + t0 * s.n_v_heads;
    in.n = len;
    in.pos0 = pos0 + t0;
    return in;
  }
};

Problem make_problem(int64_t n, int hk, int hv, int dk, int dv, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Problem p;
  p.s = {hk, hv, dk, dv};
  p.n = n;
  p.q = randn(static_cast<size_t>(n * hk * dk), rng);
  p.k = randn(p.q.size(), rng);
  p.v = randn(static_cast<size_t>(n * hv * dv), rng);
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(dk));
  ref::l2norm_heads(p.q.data(), n, {hk, dk, static_cast<int64_t>(hk) * dk, 1e-6f, q_scale});
  ref::l2norm_heads(p.k.data(), n, {hk, dk, static_cast<int64_t>(hk) * dk, 1e-6f, 1.0f});
  std::vector<float> a = randn(static_cast<size_t>(n * hv), rng), b = randn(a.size(), rng);
  std::vector<float> a_log = randn(static_cast<size_t>(hv), rng), dt = randn(static_cast<size_t>(hv), rng);
  p.log_g.resize(a.size());
  p.beta.resize(a.size());
  ref::gated_delta_gates(a.data(), b.data(), n, {hv, a_log.data(), dt.data()}, p.log_g.data(), p.beta.data());
  p.state = randn(static_cast<size_t>(hv * dv * dk), rng, 0.3f);
  return p;
}

using DeltaFn = void (*)(const GatedDeltaInputs&, const GatedDeltaShape&, float*, float*);

// Runs fn over p's tokens cut at `cuts` (ascending, inside (0, n)), from p.state.
void run_split(const Problem& p, DeltaFn fn, const std::vector<int64_t>& cuts, int64_t pos0, std::vector<float>& state,
               std::vector<float>& y) {
  state = p.state;
  y.assign(static_cast<size_t>(p.n * p.s.n_v_heads * p.s.d_v), 0.f);
  int64_t t0 = 0;
  std::vector<int64_t> ends = cuts;
  ends.push_back(p.n);
  for (int64_t e : ends) {
    fn(p.inputs(t0, e - t0, pos0), p.s, state.data(), y.data() + t0 * p.s.n_v_heads * p.s.d_v);
    t0 = e;
  }
}

TEST(GatedDeltaRef, ChunkedMatchesRecurrent) {
  // Chunk-crossing lengths, GQA 1..4, odd head dims, non-zero grid offsets.
  const struct {
    int64_t n, pos0;
    int hk, hv, dk, dv;
  } shapes[] = {{1, 0, 1, 1, 16, 16}, {3, 63, 2, 4, 9, 7}, {65, 0, 1, 2, 32, 24}, {130, 10, 2, 2, 17, 33},
                {100, 64, 1, 4, 64, 64}};
  uint64_t seed = 1;
  for (const auto& sh : shapes) {
    SCOPED_TRACE(::testing::Message() << "n " << sh.n << " pos0 " << sh.pos0 << " hk " << sh.hk << " hv " << sh.hv
                                    << " dk " << sh.dk << " dv " << sh.dv);
    const Problem p = make_problem(sh.n, sh.hk, sh.hv, sh.dk, sh.dv, seed++);
    std::vector<float> s_rec, y_rec, s_chk, y_chk;
    run_split(p, ref::gated_delta_recurrent, {}, sh.pos0, s_rec, y_rec);
    run_split(p, ref::gated_delta_chunked, {}, sh.pos0, s_chk, y_chk);
    // The two differ only by where the state is rounded to f32 (per token vs per chunk) and by the
    // sums' order: f32 ulps of the state, not growing (non-expansive recurrence). Measured <= 7e-8.
    EXPECT_LE(max_err(y_chk, y_rec), kDeltaTol);
    EXPECT_LE(max_err(s_chk, s_rec), kDeltaTol);
    EXPECT_GT(max_err(y_chk, std::vector<float>(y_chk.size(), 0.f)), 1e-2);  // not vacuous
  }
}

TEST(GatedDeltaRef, RecurrentIsBitIdenticalAcrossCallSplits) {
  const Problem p = make_problem(29, 2, 4, 24, 12, 7);
  std::vector<float> s_one, y_one, s, y;
  run_split(p, ref::gated_delta_recurrent, {}, 0, s_one, y_one);
  std::vector<int64_t> singles;
  for (int64_t t = 1; t < p.n; ++t) singles.push_back(t);
  for (const std::vector<int64_t>& cuts : {singles, std::vector<int64_t>{7}, std::vector<int64_t>{1, 2, 20}}) {
    run_split(p, ref::gated_delta_recurrent, cuts, 0, s, y);
    EXPECT_EQ(0, std::memcmp(y.data(), y_one.data(), y.size() * 4));
    EXPECT_EQ(0, std::memcmp(s.data(), s_one.data(), s.size() * 4));
  }
}

TEST(GatedDeltaRef, ChunkedIsBitIdenticalAcrossSplitsOnTheGrid) {
  const Problem p = make_problem(150, 1, 2, 16, 8, 9);
  std::vector<float> s_one, y_one, s, y;
  run_split(p, ref::gated_delta_chunked, {}, 0, s_one, y_one);
  // Splits at multiples of the chunk: the same bits.
  run_split(p, ref::gated_delta_chunked, {kGatedDeltaChunk, 2 * kGatedDeltaChunk}, 0, s, y);
  EXPECT_EQ(0, std::memcmp(y.data(), y_one.data(), y.size() * 4));
  EXPECT_EQ(0, std::memcmp(s.data(), s_one.data(), s.size() * 4));
  // A call starting at a grid offset: the same chunks as one call from position 0 once aligned
  // (tokens [0, 64 − 10) are the first chunk's tail in both).
  const int64_t off = 10;
  std::vector<float> s_off, y_off;
  run_split(p, ref::gated_delta_chunked, {kGatedDeltaChunk - off}, off, s_off, y_off);
  std::vector<float> s_off1, y_off1;
  run_split(p, ref::gated_delta_chunked, {}, off, s_off1, y_off1);
  EXPECT_EQ(0, std::memcmp(y_off.data(), y_off1.data(), y_off.size() * 4));
  EXPECT_EQ(0, std::memcmp(s_off.data(), s_off1.data(), s_off.size() * 4));
  // Off the grid: the documented difference (rounding only).
  run_split(p, ref::gated_delta_chunked, {7}, 0, s, y);
  EXPECT_LE(max_err(y, y_one), kDeltaTol);
  EXPECT_LE(max_err(s, s_one), kDeltaTol);
}

TEST(GatedDeltaRef, ConvIsBitIdenticalAcrossCallSplits) {
  std::mt19937_64 rng(3);
  const int64_t n = 11, C = 13;
  for (int K : {1, 2, 4}) {
    SCOPED_TRACE(K);
    const std::vector<float> x = randn(static_cast<size_t>(n * C), rng), w = randn(static_cast<size_t>(C * K), rng);
    const std::vector<float> bias = randn(static_cast<size_t>(C), rng);
    const std::vector<float> st0 = randn(static_cast<size_t>((K - 1) * C), rng);
    CausalConv1dParams cp{C, K, w.data(), bias.data(), true};
    std::vector<float> st_one = st0, out_one(x.size());
    ref::causal_conv1d(x.data(), n, cp, st_one.data(), out_one.data());
    for (int64_t first : {int64_t{1}, int64_t{2}, int64_t{7}}) {
      std::vector<float> st = st0, out(x.size());
      // first tokens, then one at a time (fewer than K−1 per call exercises the state shift).
      ref::causal_conv1d(x.data(), first, cp, st.data(), out.data());
      for (int64_t t = first; t < n; ++t) ref::causal_conv1d(x.data() + t * C, 1, cp, st.data(), out.data() + t * C);
      EXPECT_EQ(0, std::memcmp(out.data(), out_one.data(), out.size() * 4));
      EXPECT_EQ(0, std::memcmp(st.data(), st_one.data(), st.size() * 4));
    }
    // The definition, by hand for one element: token 0, channel 5 meets state rows then x row 0.
    double want = bias[5];
    for (int j = 0; j < K; ++j) want += static_cast<double>(w[5 * K + j]) * (j < K - 1 ? st0[j * C + 5] : x[5]);
    const double conv = static_cast<float>(want);
    EXPECT_FLOAT_EQ(out_one[5], static_cast<float>(conv / (1 + std::exp(-conv))));
  }
}

}  // namespace
}  // namespace larder::kernels
