// A hybrid model (Qwen3.5: gated-DeltaNet layers with a constant-size recurrent state) through the
// one generation lifecycle against the KV store (runtime::Sequence): the prompt-boundary checkpoint
// holds the recurrent state at len(P) − 1, a later turn resumes from whole entries only, and what
// it computes from there equals mlx-lm (tiny fixture of tests/ref/qwen3_5_reference.py).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "larder/memory/store/kv_store.h"
#include "larder/runtime/sequence.h"
#include "../../support/logit_diff.h"
#include "../../support/model_fixture.h"

namespace larder::runtime {
namespace {

using Ref = test::RefLogits;

Ref read_ref(const std::string& dir) { return test::read_ref_logits(dir, "qwen3_5_ref"); }

// Prefills what is left of the prompt in slices of `chunk`, collecting every position's logits
// from the first forwarded one on ([prompt − cached, V]).
std::vector<float> prefill(models::Model& m, Sequence& s, int64_t chunk) {
  const int64_t V = m.info().vocab;
  std::vector<float> out;
  while (s.prefilling()) {
    const std::span<const int32_t> sl = s.next_prefill(chunk);
    std::vector<float> lg(sl.size() * static_cast<size_t>(V));
    EXPECT_TRUE(m.forward(sl.data(), static_cast<int64_t>(sl.size()), s.state(), lg.data(), true).is_ok());
    out.insert(out.end(), lg.begin(), lg.end());
    s.prefill_done(static_cast<int64_t>(sl.size()));
  }
  return out;
}

void expect_rows(const std::vector<float>& got, const Ref& ref, int64_t from, int64_t n, const char* what) {
  const int64_t V = ref.vocab;
  ASSERT_GE(static_cast<int64_t>(got.size()), n * V) << what;
  const std::vector<float> g(got.begin(), got.begin() + n * V);
  const std::vector<float> w(ref.logits.begin() + from * V, ref.logits.begin() + (from + n) * V);
  const test::LogitDiff d = test::compare_logits(g, w, V);
  EXPECT_LE(d.max_abs, 1e-4f * d.max_ref) << what;
  EXPECT_EQ(d.top1_mismatch, 0) << what;
}

TEST(HybridSequence, CheckpointAndWholeEntriesServeTheRecurrentState) {
  const std::string dir = test::kModelFixtures + "qwen3_5_text_f32";
  const Ref ref = read_ref(dir);
  ASSERT_EQ(ref.tokens.size(), 64u);
  test::LoadedModel l = test::load_model(dir);
  ASSERT_NE(l.model, nullptr);
  models::Model& m = *l.model;
  memory::KvStoreConfig cfg;
  cfg.ram_cap_bytes = 64ull << 20;
  auto store = memory::KvStore::open(cfg);
  ASSERT_TRUE(store.is_ok()) << store.status().to_string();
  const std::vector<int32_t>& t = ref.tokens;
  const int64_t V = ref.vocab;

  // Turn 1: a 30-token prompt (checkpoint at 29), then 10 teacher-forced "decoded" tokens.
  {
    Sequence s = Sequence::start(m, {t.begin(), t.begin() + 30}, {store->get(), "q", 512});
    EXPECT_EQ(s.checkpoint_at(), 29) << "a recurrent layer cannot trim: the boundary is captured";
    expect_rows(prefill(m, s, 7), ref, 0, 30, "turn 1 prefill");
    std::vector<float> lg(static_cast<size_t>(V));
    for (int64_t i = 30; i < 40; ++i) {
      s.decode_accept(t[static_cast<size_t>(i)]);
      ASSERT_TRUE(m.forward(&t[static_cast<size_t>(i)], 1, s.state(), lg.data(), false).is_ok());
    }
    ASSERT_TRUE(s.finish().is_ok());  // puts the 40 forwarded tokens
  }
  // Turn 2 extends everything turn 1 forwarded: the 40-token entry, whole.
  {
    Sequence s = Sequence::start(m, {t.begin(), t.begin() + 50}, {store->get(), "q", 512});
    EXPECT_EQ(s.cached_tokens(), 40);
    expect_rows(prefill(m, s, 4), ref, 40, 10, "turn 2 after the 40-token entry");
  }
  // Turn 3 leaves turn 1 at token 32: the 40-token entry cannot be cut back (its recurrent state
  // is the state after 40 tokens), so the prompt-boundary checkpoint (29 tokens) serves it.
  {
    std::vector<int32_t> p(t.begin(), t.begin() + 36);
    p[32] = (p[32] + 1) % static_cast<int32_t>(V);
    Sequence s = Sequence::start(m, p, {store->get(), "q", 512});
    EXPECT_EQ(s.cached_tokens(), 29);
    expect_rows(prefill(m, s, 5), ref, 29, 3, "turn 3 after the checkpoint, before its own token");
  }
}

// Message ends (SequenceOptions::message_ends) are checkpoints too: prefill slices stop at each,
// each is captured, and a later prompt that leaves this one after a message end (a template that
// renders the answer differently from the generation prompt) resumes from that message end.
TEST(HybridSequence, MessageEndsAreCheckpoints) {
  const std::string dir = test::kModelFixtures + "qwen3_5_text_f32";
  const Ref ref = read_ref(dir);
  ASSERT_EQ(ref.tokens.size(), 64u);
  test::LoadedModel l = test::load_model(dir);
  ASSERT_NE(l.model, nullptr);
  models::Model& m = *l.model;
  memory::KvStoreConfig cfg;
  cfg.ram_cap_bytes = 64ull << 20;
  auto store = memory::KvStore::open(cfg);
  ASSERT_TRUE(store.is_ok()) << store.status().to_string();
  const std::vector<int32_t>& t = ref.tokens;
  const int64_t V = ref.vocab;
  {
    // 0 and 29 (the prompt end's own point), 40 (past the prompt) and a repeat are left out.
    runtime::SequenceOptions o{store->get(), "q", 512, {0, 10, 10, 20, 29, 40}};
    Sequence s = Sequence::start(m, {t.begin(), t.begin() + 30}, o);
    EXPECT_EQ(s.checkpoints(), (std::vector<int64_t>{10, 20, 29}));
    std::vector<int64_t> slices;
    const std::vector<float> lg = [&] {
      std::vector<float> out;
      while (s.prefilling()) {
        const std::span<const int32_t> sl = s.next_prefill(7);
        slices.push_back(static_cast<int64_t>(sl.size()));
        std::vector<float> x(sl.size() * static_cast<size_t>(V));
        EXPECT_TRUE(m.forward(sl.data(), static_cast<int64_t>(sl.size()), s.state(), x.data(), true).is_ok());
        out.insert(out.end(), x.begin(), x.end());
        s.prefill_done(static_cast<int64_t>(sl.size()));
      }
      return out;
    }();
    EXPECT_EQ(slices, (std::vector<int64_t>{7, 3, 7, 3, 7, 2, 1})) << "slices stop at 10, 20 and 29";
    expect_rows(lg, ref, 0, 30, "prefill split at the message ends");
    ASSERT_TRUE(s.finish().is_ok());
  }
  const memory::StoreStats st = (*store)->stats();
  EXPECT_EQ(st.checkpoints_stored.at("message_end"), 2u);
  EXPECT_EQ(st.checkpoints_stored.at("prompt_end"), 1u);
  // Leaves turn 1 at token 23: the message end at 20 serves it, and its state is exact.
  {
    std::vector<int32_t> p(t.begin(), t.begin() + 30);
    p[23] = (p[23] + 1) % static_cast<int32_t>(V);
    Sequence s = Sequence::start(m, p, {store->get(), "q", 512});
    EXPECT_EQ(s.cached_tokens(), 20);
    expect_rows(prefill(m, s, 5), ref, 20, 3, "after the message-end checkpoint, before its own token");
  }
  EXPECT_EQ((*store)->stats().checkpoint_hits.at("message_end"), 1u);
}

}  // namespace
}  // namespace larder::runtime
