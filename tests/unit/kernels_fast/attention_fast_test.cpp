// The AVX2 online-softmax attention against the double-precision reference over random shapes:
// head counts and GQA groups (including groups larger than one work item), head dims that are
// not multiples of 8, sliding windows, several KV spans (shared prefix + private tail), prefill
// chunks that start mid-sequence, and score ranges wide enough to exercise the exp underflow.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "larder/core/cpuid.h"
#include "larder/kernels/cpu/common/cpu_kernels.h"
#include "larder/kernels/ref/ref_ops.h"

namespace larder::kernels {
namespace {

struct Case {
  int n_heads, n_kv_heads, head_dim;
  int64_t pos0, n;
  int64_t window;
  int n_spans;
  float q_scale;  // larger → peakier softmax
};

void run_case(const Case& c, std::mt19937& rng) {
  AttentionParams p;
  p.n_heads = c.n_heads;
  p.n_kv_heads = c.n_kv_heads;
  p.head_dim = c.head_dim;
  p.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  p.window = c.window;
  const int64_t total = c.pos0 + c.n;
  const int64_t kv_row = static_cast<int64_t>(c.n_kv_heads) * c.head_dim;
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> k(static_cast<size_t>(total * kv_row)), v(k.size());
  for (auto& x : k) x = nd(rng);
  for (auto& x : v) x = nd(rng);
  std::vector<float> q(static_cast<size_t>(c.n * c.n_heads * c.head_dim));
  for (auto& x : q) x = nd(rng) * c.q_scale;
  // Split [0, total) into n_spans contiguous spans at random cut points.
  std::vector<int64_t> cuts = {0, total};
  std::uniform_int_distribution<int64_t> cut(1, std::max<int64_t>(1, total - 1));
  for (int i = 1; i < c.n_spans && total > 1; ++i) cuts.push_back(cut(rng));
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  std::vector<KvSpanView> spans;
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    spans.push_back({k.data() + cuts[i] * kv_row, v.data() + cuts[i] * kv_row, cuts[i], cuts[i + 1] - cuts[i]});
  }
  std::vector<float> want(q.size()), got(q.size(), NAN);
  ref::attention(q.data(), c.n, c.pos0, spans.data(), static_cast<int>(spans.size()), p, want.data());
  cpu::avx2::attention(q.data(), c.n, c.pos0, spans.data(), static_cast<int>(spans.size()), p, got.data());
  // Outputs are convex combinations of V rows (|v| ~ 1): an absolute bound is the right scale.
  // f32 scores and sums over up to ~1500 keys: observed ≤ 1e-6; 2e-5 flags any real bug (a wrong
  // key, head or mask is off by O(0.1)).
  float worst = 0;
  for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]));
  EXPECT_LE(worst, 2e-5f) << "heads " << c.n_heads << "/" << c.n_kv_heads << " hd " << c.head_dim << " pos0 "
                          << c.pos0 << " n " << c.n << " window " << c.window << " spans " << spans.size();
}

TEST(AttentionAvx2, MatchesReferenceOnRandomShapes) {
  if (!cpu_features().avx2 || !cpu_features().fma) GTEST_SKIP() << "no AVX2/FMA";
  std::mt19937 rng(20261202);
  const int head_dims[] = {8, 16, 40, 64, 80, 128, 13};
  const std::pair<int, int> heads[] = {{1, 1}, {4, 4}, {8, 2}, {32, 8}, {40, 2}, {6, 3}};
  int cases = 0;
  for (int hd : head_dims) {
    for (auto [nh, nkv] : heads) {
      std::uniform_int_distribution<int64_t> pos(0, 300), len(1, 40), nsp(1, 4);
      Case c{nh, nkv, hd, pos(rng), len(rng), 0, static_cast<int>(nsp(rng)), 1.0f};
      run_case(c, rng);
      c.window = 17;  // sliding window
      run_case(c, rng);
      ++cases;
    }
  }
  // Decode over a long context (many softmax blocks), peaky scores, ragged block tail.
  run_case({32, 8, 64, 1500, 1, 0, 3, 4.0f}, rng);
  run_case({16, 4, 128, 1023, 1, 0, 1, 8.0f}, rng);
  // A prefill chunk from an empty cache (first query sees only itself).
  run_case({8, 8, 64, 0, 70, 0, 1, 1.0f}, rng);
  EXPECT_EQ(cases, 42);
}

}  // namespace
}  // namespace larder::kernels
