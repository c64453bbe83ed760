// Each tier's online-softmax attention (AVX2, AVX-512) against the double-precision reference over random shapes:
// head counts and GQA groups (including groups larger than one work item), head dims that are
// not multiples of 8, sliding windows, several KV spans (shared prefix + private tail), prefill
// chunks that start mid-sequence, and score ranges wide enough to exercise the exp underflow.
// The KV-split (flash-decoding) path is driven both through the public entry (whose chunking
// depends on the pool's thread count) and directly with explicit row tiles and chunk lengths, so
// chunks can be made small enough that span boundaries fall inside them and some are fully
// masked for some rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "larder/core/cpuid.h"
#include "larder/core/threadpool.h"
#include "larder/kernels/cpu/common/cpu_kernels.h"
#include "larder/kernels/ref/ref_ops.h"

// Internal entry points of attention_avx2.cpp and attention_avx512.cpp (no header: tests only).
namespace larder::kernels::cpu::avx2 {
void attention_tiled(const float* q, int64_t n, int64_t q_pos0, const KvSpanView* spans, int n_spans,
                     const AttentionParams& p, int64_t tile, int64_t chunk_keys, bool split, int64_t slots_per_item,
                     float* out);
void exp_neg_batch(const float* x, float* y, int64_t n);
}  // namespace larder::kernels::cpu::avx2
namespace larder::kernels::cpu::avx512 {
void attention_tiled(const float* q, int64_t n, int64_t q_pos0, const KvSpanView* spans, int n_spans,
                     const AttentionParams& p, int64_t tile, int64_t chunk_keys, bool split, int64_t slots_per_item,
                     float* out);
}  // namespace larder::kernels::cpu::avx512

namespace larder::kernels {
namespace {

// Each tier's kernel runs every test below (the driver — items, chunks, packing, folding — is
// shared; the block arithmetic is the tier's).
using TiledFn = void (*)(const float*, int64_t, int64_t, const KvSpanView*, int, const AttentionParams&, int64_t,
                         int64_t, bool, int64_t, float*);
struct Tier {
  const char* name;
  bool (*supported)();
  AttentionFn attention;
  TiledFn tiled;
};
const Tier kTiers[] = {
    {"avx2", [] { return cpu_features().avx2 && cpu_features().fma && cpu_features().f16c; }, cpu::avx2::attention,
     cpu::avx2::attention_tiled},
    {"avx512", [] { return cpu_features().has_avx512_tier(); }, cpu::avx512::attention, cpu::avx512::attention_tiled},
};
void PrintTo(const Tier& t, std::ostream* os) { *os << t.name; }
const Tier* g_tier = &kTiers[0];  // the tier the running test exercises

class AttentionTier : public ::testing::TestWithParam<Tier> {
 protected:
  void SetUp() override {
    if (!GetParam().supported()) GTEST_SKIP() << "this CPU has no " << GetParam().name << " tier";
    g_tier = &GetParam();
  }
};

void tier_tiled(const float* q, int64_t n, int64_t q_pos0, const KvSpanView* spans, int n_spans,
                const AttentionParams& p, int64_t tile, int64_t chunk_keys, bool split, int64_t slots_per_item,
                float* out) {
  g_tier->tiled(q, n, q_pos0, spans, n_spans, p, tile, chunk_keys, split, slots_per_item, out);
}
void tier_attention(const float* q, int64_t n, int64_t q_pos0, const KvSpanView* spans, int n_spans,
                    const AttentionParams& p, float* out) {
  g_tier->attention(q, n, q_pos0, spans, n_spans, p, out);
}

struct Case {
  int n_heads, n_kv_heads, head_dim;
  int64_t pos0, n;
  int64_t window;
  int n_spans;
  float q_scale;  // larger → peakier softmax
  DType dtype = DType::kF32;  // K/V storage
};

// Random q/K/V for a case, its spans, and the reference output.
struct Problem {
  Case c;
  AttentionParams p;
  std::vector<float> q, want;
  std::vector<uint8_t> k, v;  // [total, n_kv_heads, head_dim] in c.dtype
  int64_t row_bytes = 0;
  std::vector<KvSpanView> spans;
  // The same rows cut at other points (any cuts: inside blocks and chunks too).
  std::vector<KvSpanView> cut_at(const std::vector<int64_t>& inner) const {
    std::vector<int64_t> cuts = inner;
    cuts.push_back(0);
    cuts.push_back(c.pos0 + c.n);
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    std::vector<KvSpanView> out;
    for (size_t i = 0; i + 1 < cuts.size(); ++i)
      out.push_back({k.data() + cuts[i] * row_bytes, v.data() + cuts[i] * row_bytes, cuts[i], cuts[i + 1] - cuts[i],
                     c.dtype});
    return out;
  }
};

Problem make_problem(const Case& c, std::mt19937& rng, const float* sinks = nullptr) {
  Problem pr;
  pr.c = c;
  AttentionParams& p = pr.p;
  p.n_heads = c.n_heads;
  p.n_kv_heads = c.n_kv_heads;
  p.head_dim = c.head_dim;
  p.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  p.window = c.window;
  p.sinks = sinks;
  const int64_t total = c.pos0 + c.n;
  const int64_t kv_row = static_cast<int64_t>(c.n_kv_heads) * c.head_dim;
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> kf(static_cast<size_t>(total * kv_row)), vf(kf.size());
  for (auto& x : kf) x = nd(rng);
  for (auto& x : vf) x = nd(rng);
  pr.row_bytes = kv_bytes(c.dtype, kv_row);
  pr.k.resize(static_cast<size_t>(total * pr.row_bytes));
  pr.v.resize(pr.k.size());
  kv_encode(c.dtype, kf.data(), total * kv_row, pr.k.data());
  kv_encode(c.dtype, vf.data(), total * kv_row, pr.v.data());
  pr.q.resize(static_cast<size_t>(c.n * c.n_heads * c.head_dim));
  for (auto& x : pr.q) x = nd(rng) * c.q_scale;
  // Split [0, total) into n_spans contiguous spans at random cut points.
  std::vector<int64_t> cuts = {0, total};
  std::uniform_int_distribution<int64_t> cut(1, std::max<int64_t>(1, total - 1));
  for (int i = 1; i < c.n_spans && total > 1; ++i) cuts.push_back(cut(rng));
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  pr.spans = pr.cut_at(cuts);
  pr.want.resize(pr.q.size());
  ref::attention(pr.q.data(), c.n, c.pos0, pr.spans.data(), static_cast<int>(pr.spans.size()), p, pr.want.data());
  return pr;
}

using Kernel = std::function<void(const Problem&, float*)>;

void check(const Problem& pr, const Kernel& kernel, const char* what) {
  const Case& c = pr.c;
  std::vector<float> got(pr.q.size(), NAN);
  kernel(pr, got.data());
  // Outputs are convex combinations of V rows (|v| ~ 1): an absolute bound is the right scale.
  // The error is dominated by the f32 rounding of the scores themselves (an absolute error of
  // ~1e-7·Σ|q_i·k_i|, which peaky softmaxes turn into that relative error of the top weights);
  // the block and chunk sums and the 1-ulp exp add less. Observed: ≤ 1e-6 at q_scale 1-2, up to
  // 7.3e-6 for 5000 keys at q_scale 4 (scores spread ±15). 2e-5 still flags any real bug (a
  // wrong key, head, mask or merge weight is off by O(0.01..1)).
  float worst = 0;
  // (A NaN output — an element never written, or a stale non-finite state — counts as infinitely wrong;
  // std::max would drop it.)
  for (size_t i = 0; i < pr.want.size(); ++i)
    worst = std::isfinite(got[i]) ? std::max(worst, std::abs(got[i] - pr.want[i])) : INFINITY;
  EXPECT_LE(worst, 2e-5f) << g_tier->name << " " << what << ": heads " << c.n_heads << "/" << c.n_kv_heads << " hd " << c.head_dim
                          << " pos0 " << c.pos0 << " n " << c.n << " window " << c.window << " spans "
                          << pr.spans.size() << " kv " << dtype_name(c.dtype);
}

void public_kernel(const Problem& pr, float* out) {
  tier_attention(pr.q.data(), pr.c.n, pr.c.pos0, pr.spans.data(), static_cast<int>(pr.spans.size()), pr.p,
                       out);
}

void run_case(const Case& c, std::mt19937& rng) { check(make_problem(c, rng), public_kernel, "attention"); }

TEST_P(AttentionTier, MatchesReferenceOnRandomShapes) {
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

// Attention sinks (gpt-oss): prefill tiles and the decode split (chunk states folded on other
// threads) against the reference, with sinks above and below the scores; and sinks keep the
// span-independence: a cut of the keys gives the same bits.
TEST_P(AttentionTier, SinksMatchReference) {
  std::mt19937 rng(20261207);
  std::normal_distribution<float> nd(0.f, 4.f);
  std::vector<float> sinks(64);
  for (auto& x : sinks) x = nd(rng);
  sinks[0] = 40.0f;   // dominates every score: the row's output shrinks towards 0
  sinks[1] = -40.0f;  // takes nothing
  const Case cases[] = {{8, 2, 64, 0, 70, 0, 1, 1.0f},     {4, 4, 16, 30, 9, 8, 2, 2.0f},
                        {32, 8, 64, 1500, 1, 0, 3, 4.0f},  {8, 2, 64, 3000, 4, 1024, 3, 2.0f},
                        {8, 8, 64, 900, 1, 128, 2, 2.0f, DType::kF16}};
  for (const Case& c : cases) {
    const Problem pr = make_problem(c, rng, sinks.data());
    check(pr, public_kernel, "attention with sinks");
    std::vector<float> a(pr.q.size()), b(pr.q.size());
    public_kernel(pr, a.data());
    const auto cut = pr.cut_at({(c.pos0 + c.n) / 3, (c.pos0 + c.n) / 2});
    tier_attention(pr.q.data(), c.n, c.pos0, cut.data(), static_cast<int>(cut.size()), pr.p, b.data());
    EXPECT_EQ(a, b) << g_tier->name << " pos0 " << c.pos0;
  }
}

// exp_neg against the double-precision exp, in ulps of the f32 result, over its whole domain
// [-87, 0]: every 64th float bit pattern (≈ 17M values, dense near 0 where softmax weights live).
TEST(AttentionAvx2, ExpNegWithinOneUlp) {
  if (!cpu_features().avx2 || !cpu_features().fma) GTEST_SKIP() << "no AVX2/FMA";
  std::vector<float> x, y;
  const uint32_t neg87 = 0xc2ae0000u;  // -87.0f; negative floats order by their bit patterns
  for (uint32_t b = 0x80000000u; b <= neg87; b += 64) {
    float f;
    std::memcpy(&f, &b, 4);
    x.push_back(f);
  }
  y.resize(x.size());
  cpu::avx2::exp_neg_batch(x.data(), y.data(), static_cast<int64_t>(x.size()));
  double worst = 0;
  float worst_x = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double ref = std::exp(static_cast<double>(x[i]));
    const float rf = static_cast<float>(ref);
    const double ulp = static_cast<double>(std::nextafter(rf, INFINITY)) - rf;
    const double err = std::abs(static_cast<double>(y[i]) - ref) / ulp;
    if (err > worst) {
      worst = err;
      worst_x = x[i];
    }
  }
  EXPECT_LE(worst, 1.0) << "at x = " << worst_x;
  // Masked keys (-inf) and anything below the range weigh exactly zero.
  const float tiny[3] = {-INFINITY, -100.0f, -87.5f};
  float out[3];
  cpu::avx2::exp_neg_batch(tiny, out, 3);
  for (float o : out) EXPECT_EQ(o, 0.0f);
}

// Decode rows over long contexts, through the split path with explicit chunk lengths: 8 and 24
// keys (span cuts fall inside chunks; with n = 8 the last chunk is often shorter than n, so it is
// fully masked for the first rows), 100, 700, and 0 (no split) for comparison; row tiles of
// n (one tile) and 3 (tiles that see different chunk subsets); one KV head per item, or all of
// them (the decode policy's choice).
TEST_P(AttentionTier, SplitKvMatchesReference) {
  std::mt19937 rng(7);
  const int head_dims[] = {64, 128, 80, 13};
  const std::pair<int, int> heads[] = {{4, 4}, {8, 2}, {8, 1}};  // GQA groups 1, 4, 8
  std::uniform_int_distribution<int64_t> nrow(1, 8), ctx(513, 3000), nsp(1, 4);
  int cases = 0;
  for (int hd : head_dims) {
    for (auto [nh, nkv] : heads) {
      const int64_t n = nrow(rng);
      Case c{nh, nkv, hd, ctx(rng) - n, n, 0, static_cast<int>(nsp(rng)), 2.0f};
      if (cases % 3 == 1) c.window = 300 + cases * 7;  // sliding window longer than a chunk
      const Problem pr = make_problem(c, rng);
      for (int64_t ck : {8, 24, 100, 700, 0}) {
        for (int64_t tile : {n, int64_t{3}}) {
          for (int64_t spi : {1, 1000}) {
            check(pr, [&](const Problem& q, float* out) {
              tier_tiled(q.q.data(), q.c.n, q.c.pos0, q.spans.data(),
                                         static_cast<int>(q.spans.size()), q.p, tile, ck == 0 ? 256 : ck, ck != 0, spi, out);
            }, ck == 0 ? "unsplit" : "split");
          }
        }
      }
      check(pr, public_kernel, "attention");
      ++cases;
    }
  }
  EXPECT_EQ(cases, 12);
  // Deterministic masking edges. 1011 keys = 42·24 + 3: with 24-key chunks the last chunk holds 3
  // keys, so it is fully masked for rows 0-4 (and for the first 3-row tile as a whole). With a
  // window of 600 and 4-key chunks, the first chunk lies wholly before the window of rows 4-7.
  const Problem tail = make_problem({8, 2, 64, 1003, 8, 0, 2, 2.0f}, rng);
  const Problem head = make_problem({8, 2, 64, 1500, 8, 600, 3, 2.0f}, rng);
  for (const auto& [pr, chunk] : {std::pair{&tail, int64_t{24}}, std::pair{&head, int64_t{4}}}) {
    const int64_t ck = chunk;  // a structured binding cannot be captured by a lambda before C++20's P1091 (clang < 16)
    for (int64_t tile : {8, 3}) {
      for (int64_t spi : {1, 1000}) {
        check(*pr, [&](const Problem& q, float* out) {
          tier_tiled(q.q.data(), q.c.n, q.c.pos0, q.spans.data(), static_cast<int>(q.spans.size()),
                                     q.p, tile, ck == 0 ? 256 : ck, ck != 0, spi, out);
        }, "masked chunks");
      }
    }
  }
  // The largest shapes: 5000 keys, 8 rows, 32/8 heads (Llama 3), peaky scores, 3 spans.
  const Problem big = make_problem({32, 8, 64, 4992, 8, 0, 3, 4.0f}, rng);
  for (int64_t ck : {256, 1000, 0}) {
    check(big, [&](const Problem& q, float* out) {
      tier_tiled(q.q.data(), q.c.n, q.c.pos0, q.spans.data(), static_cast<int>(q.spans.size()), q.p,
                                 q.c.n, ck == 0 ? 256 : ck, ck != 0, 1000, out);
    }, "split 32/8");
  }
  const Problem big128 = make_problem({16, 2, 128, 4999, 1, 0, 2, 8.0f}, rng);
  check(big128, [&](const Problem& q, float* out) {
    tier_tiled(q.q.data(), q.c.n, q.c.pos0, q.spans.data(), static_cast<int>(q.spans.size()), q.p, 1,
                               333, true, 1, out);
  }, "split 16/2 hd128");
}

// The public entry picks its chunking from the pool size (8 chunks per thread, each at least 256
// keys); each choice must give the same answer within rounding. The last problem has exactly 512
// visible keys, the shortest context that is split (into 2).
// The kernels keep per-thread scratch (packed blocks, states) across calls. A call whose V rows
// hold inf and NaN leaves such values there; every later call must still be exact — on the tile
// path and the decode split, at 1-3 threads.
TEST_P(AttentionTier, StaleNonFiniteStateDoesNotLeak) {
  std::mt19937 rng(99);
  const int saved = default_pool().n_threads();
  for (int t : {1, 2, 3}) {
    default_pool().set_threads(t);
    for (const Case& c : {Case{32, 8, 64, 600, 40, 0, 1, 2.0f}, Case{32, 8, 64, 3000, 1, 0, 2, 2.0f},
                          Case{8, 2, 128, 900, 4, 0, 1, 2.0f}}) {
      Problem bad = make_problem(c, rng);
      auto* v = reinterpret_cast<float*>(bad.v.data());  // f32 rows
      for (size_t i = 0; i < bad.v.size() / 4; i += 3) v[i] = (i % 2) ? INFINITY : NAN;
      std::vector<float> junk(bad.q.size());
      tier_attention(bad.q.data(), c.n, c.pos0, bad.spans.data(), static_cast<int>(bad.spans.size()), bad.p,
                     junk.data());
      check(make_problem(c, rng), public_kernel, "after a non-finite call");
    }
  }
  default_pool().set_threads(saved);
}

TEST_P(AttentionTier, DecodePolicyAnyThreadCount) {
  std::mt19937 rng(11);
  const Problem llama = make_problem({32, 8, 64, 4095, 1, 0, 2, 4.0f}, rng);
  const Problem one_group = make_problem({8, 1, 128, 2040, 8, 0, 1, 2.0f}, rng);
  const Problem windowed = make_problem({8, 2, 64, 3000, 4, 1024, 3, 2.0f}, rng);
  const Problem edge = make_problem({4, 1, 64, 511, 1, 0, 1, 1.0f}, rng);
  const int saved = default_pool().n_threads();
  for (int t : {1, 2, 3}) {
    default_pool().set_threads(t);
    for (const Problem* pr : {&llama, &one_group, &windowed, &edge}) check(*pr, public_kernel, "attention");
  }
  default_pool().set_threads(saved);
}



// f16 and q8_0 K/V (ops.h KV row formats) against the reference reading the same stored rows:
// the kernel widens them exactly as kv_decode does, so the bound is the f32 one. Random shapes,
// several spans, windows, decode at depth (the split path) and prefill chunks.
TEST_P(AttentionTier, F16AndQ8KvMatchReference) {
  std::mt19937 rng(1604);
  int cases = 0;
  for (DType dt : {DType::kF16, DType::kQ8_0}) {
    const std::vector<int> hds = dt == DType::kF16 ? std::vector<int>{8, 13, 64, 80, 128} : std::vector<int>{32, 64, 128};
    for (int hd : hds) {
      for (auto [nh, nkv] : {std::pair{4, 4}, std::pair{32, 8}, std::pair{6, 3}}) {
        std::uniform_int_distribution<int64_t> pos(0, 700), len(1, 40), nsp(1, 4);
        Case c{nh, nkv, hd, pos(rng), len(rng), 0, static_cast<int>(nsp(rng)), 1.0f, dt};
        run_case(c, rng);
        c.window = 100;
        run_case(c, rng);
        ++cases;
      }
    }
    run_case({32, 8, 64, 3000, 1, 0, 2, 4.0f, dt}, rng);   // decode at depth: split path
    run_case({16, 2, 128, 1200, 7, 0, 3, 2.0f, dt}, rng);  // a few rows, split
    run_case({8, 2, 64, 900, 1, 300, 2, 2.0f, dt}, rng);   // windowed decode
  }
  EXPECT_EQ(cases, 24);
}

// The cached == cold contract of the kernel: a (row, head)'s output depends only on its query,
// the keys it sees and their positions. The same rows cut into different spans (a cached prefix
// + a tail; a ring's two spans; cuts inside blocks and chunks), computed in one call of n rows or
// one row at a time, at 1-3 threads, on the tile path or the decode split, give identical bits.
// (One KV head at 400 keys: two rows at two threads stay unsplit, one row at a time splits.)
TEST_P(AttentionTier, SpanSplitIsBitIdenticalToContiguous) {
  std::mt19937 rng(4242);
  const int saved = default_pool().n_threads();
  auto run = [](const Problem& pr, const std::vector<KvSpanView>& sp, int64_t row0, int64_t rows, float* out) {
    const int64_t q_row = static_cast<int64_t>(pr.c.n_heads) * pr.c.head_dim;
    tier_attention(pr.q.data() + row0 * q_row, rows, pr.c.pos0 + row0, sp.data(), static_cast<int>(sp.size()),
                         pr.p, out);
  };
  int compared = 0;
  for (DType dt : {DType::kF32, DType::kF16, DType::kQ8_0}) {
    for (const Case& c : {Case{32, 8, 64, 4000, 1, 0, 1, 4.0f, dt}, Case{32, 8, 64, 1500, 12, 0, 1, 2.0f, dt},
                          Case{8, 2, 128, 700, 40, 0, 1, 2.0f, dt}, Case{8, 2, 64, 2000, 5, 512, 1, 2.0f, dt},
                          Case{6, 3, 64, 300, 3, 0, 1, 1.0f, dt}, Case{4, 1, 256, 400, 2, 0, 1, 2.0f, dt}}) {
      const Problem pr = make_problem(c, rng);
      const int64_t total = c.pos0 + c.n, q_elems = static_cast<int64_t>(pr.q.size());
      std::vector<float> want(static_cast<size_t>(q_elems));
      default_pool().set_threads(2);
      run(pr, pr.cut_at({}), 0, c.n, want.data());  // one contiguous span, all rows
      std::uniform_int_distribution<int64_t> cut(1, total - 1);
      const std::vector<std::vector<int64_t>> splits = {
          {c.pos0},                   // cached prefix + the new rows
          {c.pos0 / 2, c.pos0 + 1},   // a shared segment, a private tail
          {cut(rng)},                 // a ring's two spans
          {cut(rng), cut(rng), cut(rng), 255, 256, 257}};
      for (int threads : {1, 2, 3}) {
        default_pool().set_threads(threads);
        for (const auto& cuts : splits) {
          const std::vector<KvSpanView> sp = pr.cut_at(cuts);
          std::vector<float> got(want.size(), NAN);
          run(pr, sp, 0, c.n, got.data());
          EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * 4))
              << dtype_name(dt) << " pos0 " << c.pos0 << " n " << c.n << " threads " << threads;
          // Row by row (how a cached sequence decodes what a cold prefill computed in one chunk).
          std::fill(got.begin(), got.end(), NAN);
          const int64_t q_row = static_cast<int64_t>(c.n_heads) * c.head_dim;
          for (int64_t t = 0; t < c.n; ++t) run(pr, sp, t, 1, got.data() + t * q_row);
          EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * 4))
              << dtype_name(dt) << " row by row, pos0 " << c.pos0 << " n " << c.n << " threads " << threads;
          ++compared;
        }
      }
      // And the result is right, not just stable.
      check(pr, public_kernel, "contiguous");
    }
  }
  default_pool().set_threads(saved);
  EXPECT_EQ(compared, 3 * 6 * 3 * 4);
}

// How a sequence really decodes what a cold prefill computed in one chunk: row t of the prefill
// sees the cache up to its own position only (its span ends at pos0 + t + 1), and must give the
// bits the chunk gave it (issue 41: a token's softmax the same whether prefilled or decoded).
// Small heads too (stories260K: 8 heads of 8, 4 KV heads).
TEST_P(AttentionTier, DecodeRowEqualsPrefillRow) {
  std::mt19937 rng(777);
  const int saved = default_pool().n_threads();
  for (DType dt : {DType::kF32, DType::kF16, DType::kQ8_0}) {
    std::vector<Case> cases = {Case{32, 8, 64, 0, 40, 0, 1, 2.0f, dt}, Case{8, 2, 64, 300, 24, 0, 1, 2.0f, dt},
                               Case{4, 1, 256, 0, 20, 0, 1, 2.0f, dt}};
    // Heads of 8 (stories260K: 8 heads, 4 KV heads) where the K/V storage allows it (Q8_0 rows are
    // whole 32-blocks).
    if (dt != DType::kQ8_0) cases.push_back(Case{8, 4, 8, 0, 64, 0, 1, 2.0f, dt});
    for (const Case& c : cases) {
      const Problem pr = make_problem(c, rng);
      const int64_t q_row = static_cast<int64_t>(c.n_heads) * c.head_dim;
      for (int threads : {1, 2}) {
        default_pool().set_threads(threads);
        std::vector<float> want(pr.q.size()), got(pr.q.size(), NAN);
        const std::vector<KvSpanView> all = pr.cut_at({});
        tier_attention(pr.q.data(), c.n, c.pos0, all.data(), 1, pr.p, want.data());
        for (int64_t t = 0; t < c.n; ++t) {
          KvSpanView sp = all[0];
          sp.len = c.pos0 + t + 1;  // the cache as the decode step of row t sees it
          tier_attention(pr.q.data() + t * q_row, 1, c.pos0 + t, &sp, 1, pr.p, got.data() + t * q_row);
        }
        for (int64_t t = 0; t < c.n; ++t)
          EXPECT_EQ(0, std::memcmp(got.data() + t * q_row, want.data() + t * q_row, q_row * 4))
              << dtype_name(dt) << " heads " << c.n_heads << "/" << c.n_kv_heads << "x" << c.head_dim << " pos0 "
              << c.pos0 << " row " << t << " threads " << threads;
      }
    }
  }
  default_pool().set_threads(saved);
}

INSTANTIATE_TEST_SUITE_P(Tiers, AttentionTier, ::testing::ValuesIn(kTiers),
                         [](const ::testing::TestParamInfo<Tier>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace larder::kernels
