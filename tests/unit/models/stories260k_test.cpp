// stories260K (real trained tiny Llama, GGUF F32) greedy decoding vs llama2.c.
//
// Oracle: tests/ref/llama2c_reference.py — an independent numpy port of llama2.c's run.c reading
// the original stories260K.bin checkpoint (not the GGUF), itself cross-checked against the
// 200-token text llama2.c's test_all.py documents. Here larder loads the llama.cpp-converted
// GGUF and must produce the same 200 greedy ids, token by token and with a chunked prefill.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "larder/core/threadpool.h"
#include "larder/formats/model_files.h"
#include "larder/memory/kv_cache.h"
#include "larder/models/model.h"

namespace larder::models {
namespace {

const std::string kGguf = std::string(LARDER_SHARED_DIR) + "/models/stories260K/stories260K.gguf";

nlohmann::json reference() {
  std::ifstream f(std::string(LARDER_TEST_DATA_DIR) + "/llama2c/stories260K_greedy.json");
  EXPECT_TRUE(f.good()) << "fixture llama2c_ref did not run";
  return nlohmann::json::parse(f);
}

int32_t argmax(const std::vector<float>& v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// run.c's loop: force the prompt, then greedy, `steps` positions in total.
std::vector<int32_t> greedy(Model& m, const std::vector<int32_t>& prompt, int steps, int64_t prefill_chunk) {
  memory::SequenceState cache = m.new_state(m.info().max_context);
  std::vector<float> logits(static_cast<size_t>(m.info().vocab));
  std::vector<int32_t> seq = prompt;
  // Prefill the whole prompt in chunks; the last prompt token's logits predict the first new token.
  for (size_t i = 0; i < prompt.size(); i += static_cast<size_t>(prefill_chunk)) {
    const int64_t n = std::min<int64_t>(prefill_chunk, static_cast<int64_t>(prompt.size() - i));
    Status st = m.forward(prompt.data() + i, n, cache, logits.data(), false);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
  }
  while (static_cast<int>(seq.size()) < steps + 1) {
    const int32_t next = argmax(logits);
    if (next == 1) break;
    seq.push_back(next);
    if (static_cast<int>(seq.size()) == steps + 1) break;
    Status st = m.forward(&next, 1, cache, logits.data(), false);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
  }
  return seq;
}

class Stories260K : public ::testing::Test {
 protected:
  void SetUp() override {
    auto files = formats::open_model_files(kGguf);
    ASSERT_TRUE(files.is_ok()) << files.status().to_string();
    files_ = std::move(files.value());
    auto m = Model::load(files_);
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    model_ = std::move(m.value());
  }
  formats::ModelFiles files_;
  std::unique_ptr<Model> model_;
};

TEST_F(Stories260K, Info) {
  const ModelInfo& i = model_->info();
  EXPECT_EQ(i.architecture, "llama");
  EXPECT_EQ(i.n_layers, 5);
  EXPECT_EQ(i.hidden, 64);
  EXPECT_EQ(i.n_heads, 8);
  EXPECT_EQ(i.n_kv_heads, 4);
  EXPECT_EQ(i.head_dim, 8);
  EXPECT_EQ(i.ffn, 172);
  EXPECT_EQ(i.vocab, 512);
  EXPECT_FALSE(i.tied_embeddings);
  EXPECT_EQ(i.weight_dtypes, "F32");
  ASSERT_TRUE(i.bos_id.has_value());
  EXPECT_EQ(*i.bos_id, 1);
  EXPECT_EQ(i.eos_ids, std::vector<int32_t>{2});
}

TEST_F(Stories260K, GreedyFromBosMatchesLlama2c) {
  auto ref = reference();
  const std::vector<int32_t> want = ref["bos"].get<std::vector<int32_t>>();
  ASSERT_EQ(want.size(), 201u);
  const std::vector<int32_t> got = greedy(*model_, {1}, 200, 512);
  EXPECT_EQ(got, want);
}

TEST_F(Stories260K, GreedyFromPromptMatchesLlama2c) {
  auto ref = reference();
  const std::vector<int32_t> want = ref["prompt"].get<std::vector<int32_t>>();
  const std::vector<int32_t> prompt = {1, 403, 407, 261, 378};
  ASSERT_TRUE(std::equal(prompt.begin(), prompt.end(), want.begin()));
  EXPECT_EQ(greedy(*model_, prompt, 200, 512), want);
  EXPECT_EQ(greedy(*model_, prompt, 200, 2), want);  // prefill chunks of 2 + 2 + 1
}

// All logits of a one-shot prefill of the reference sequence equal those of token-by-token
// decoding (cached == uncached), bit for bit: every kernel stories260K runs (F32 matmul, attention,
// the elementwise ops) computes a row the same way in any batch (issue 41; before, 7.6e-6 apart).
TEST_F(Stories260K, PrefillEqualsDecode) {
  auto ref = reference();
  std::vector<int32_t> seq = ref["bos"].get<std::vector<int32_t>>();
  seq.resize(64);
  const int64_t V = model_->info().vocab;
  std::vector<float> all(static_cast<size_t>(64 * V)), one(static_cast<size_t>(V));
  memory::SequenceState c1 = model_->new_state(2048), c2 = model_->new_state(2048);
  ASSERT_TRUE(model_->forward(seq.data(), 64, c1, all.data(), true).is_ok());
  EXPECT_EQ(c1.length(), 64);
  float max_diff = 0, max_ref = 0;
  for (float v : all) max_ref = std::max(max_ref, std::abs(v));
  for (int64_t t = 0; t < 64; ++t) {
    ASSERT_TRUE(model_->forward(&seq[static_cast<size_t>(t)], 1, c2, one.data(), false).is_ok());
    for (int64_t v = 0; v < V; ++v) max_diff = std::max(max_diff, std::abs(one[v] - all[t * V + v]));
  }
  EXPECT_EQ(max_diff, 0.0f) << "of " << max_ref;
}

// Batched decode of many streams (attention.cpp: the sequences attended in parallel, one per pool
// chunk, when no sequence dominates) and one long context among short ones (the kernel's own
// split): each sequence's logits equal its logits alone, on 1 thread and on 4 (the cross-sequence
// path needs >= 2 pool threads), so a race on shared scratch or a row/sequence mix-up fails.
TEST_F(Stories260K, BatchedDecodeStreamsEqualAlone) {
  auto ref = reference();
  std::vector<int32_t> seq = ref["bos"].get<std::vector<int32_t>>();
  const int64_t V = model_->info().vocab;
  const int saved = default_pool().n_threads();
  for (int threads : {1, 4}) {
    default_pool().set_threads(threads);
    for (const std::vector<int64_t>& cached : {std::vector<int64_t>{20, 21, 23, 26, 30, 35, 41, 48},
                                               std::vector<int64_t>{3, 5, 180}}) {
      std::vector<memory::SequenceState> batched, alone;
      std::vector<float> scratch(static_cast<size_t>(V));
      for (int64_t c : cached) {
        batched.emplace_back(model_->new_state(2048));
        alone.emplace_back(model_->new_state(2048));
        ASSERT_TRUE(model_->forward(seq.data(), c, batched.back(), scratch.data(), false).is_ok());
        ASSERT_TRUE(model_->forward(seq.data(), c, alone.back(), scratch.data(), false).is_ok());
      }
      std::vector<std::vector<float>> got(cached.size(), std::vector<float>(static_cast<size_t>(V)));
      std::vector<std::vector<float>> want = got;
      std::vector<BatchItem> items;
      for (size_t i = 0; i < cached.size(); ++i) {
        items.push_back({seq.data() + cached[i], 1, &batched[i], got[i].data(), false});
        ASSERT_TRUE(model_->forward(seq.data() + cached[i], 1, alone[i], want[i].data(), false).is_ok());
      }
      ASSERT_TRUE(model_->forward_batch(items).is_ok());
      for (size_t i = 0; i < cached.size(); ++i) {
        float max_diff = 0, max_ref = 0;
        for (size_t k = 0; k < want[i].size(); ++k) {
          max_ref = std::max(max_ref, std::abs(want[i][k]));
          max_diff = std::max(max_diff, std::abs(got[i][k] - want[i][k]));
        }
        EXPECT_EQ(max_diff, 0.0f) << threads << " threads, sequence " << i << " at " << cached[i] << " of " << max_ref;
        EXPECT_EQ(argmax(got[i]), argmax(want[i]));
      }
    }
  }
  default_pool().set_threads(saved);
}

// Continuous batching: sequences at different lengths advanced in one forward_batch (a mix of
// prefill chunks, single decode rows and all-logits rows) give the logits each would get alone.
// Bound as in PrefillEqualsDecode: the row count only changes the matmul kernels' reduction paths.
TEST_F(Stories260K, BatchedEqualsAlone) {
  auto ref = reference();
  std::vector<int32_t> seq = ref["bos"].get<std::vector<int32_t>>();
  seq.resize(64);
  const int64_t V = model_->info().vocab;
  struct Plan { int64_t cached, n; bool all; };
  const std::vector<Plan> plans = {{10, 5, true}, {30, 1, false}, {0, 7, false}, {3, 1, true}};
  std::vector<memory::SequenceState> batched, alone;
  std::vector<float> scratch(static_cast<size_t>(64 * V));
  for (const Plan& p : plans) {
    batched.emplace_back(model_->new_state(2048));
    alone.emplace_back(model_->new_state(2048));
    if (p.cached > 0) {
      ASSERT_TRUE(model_->forward(seq.data(), p.cached, batched.back(), scratch.data(), false).is_ok());
      ASSERT_TRUE(model_->forward(seq.data(), p.cached, alone.back(), scratch.data(), false).is_ok());
    }
  }
  std::vector<std::vector<float>> got(plans.size()), want(plans.size());
  std::vector<BatchItem> items;
  for (size_t i = 0; i < plans.size(); ++i) {
    const Plan& p = plans[i];
    const size_t rows = p.all ? static_cast<size_t>(p.n) : 1;
    got[i].assign(rows * static_cast<size_t>(V), 0.f);
    want[i].assign(rows * static_cast<size_t>(V), 0.f);
    items.push_back({seq.data() + p.cached, p.n, &batched[i], got[i].data(), p.all});
    ASSERT_TRUE(model_->forward(seq.data() + p.cached, p.n, alone[i], want[i].data(), p.all).is_ok());
  }
  ASSERT_TRUE(model_->forward_batch(items).is_ok());
  for (size_t i = 0; i < plans.size(); ++i) {
    EXPECT_EQ(batched[i].length(), plans[i].cached + plans[i].n);
    float max_diff = 0, max_ref = 0;
    for (size_t k = 0; k < want[i].size(); ++k) {
      max_ref = std::max(max_ref, std::abs(want[i][k]));
      max_diff = std::max(max_diff, std::abs(got[i][k] - want[i][k]));
    }
    EXPECT_EQ(max_diff, 0.0f) << "sequence " << i << " of " << max_ref;
  }
  // A bad item (token outside the vocabulary) fails the whole call and changes no cache.
  const int32_t bad = static_cast<int32_t>(V);
  std::vector<BatchItem> with_bad = {{seq.data(), 1, &batched[0], got[0].data(), false},
                                     {&bad, 1, &batched[1], got[1].data(), false}};
  EXPECT_FALSE(model_->forward_batch(with_bad).is_ok());
  EXPECT_EQ(batched[0].length(), plans[0].cached + plans[0].n);
  // Two items on one cache are refused.
  std::vector<BatchItem> shared = {{seq.data(), 1, &batched[0], got[0].data(), false},
                                   {seq.data(), 1, &batched[0], got[1].data(), false}};
  EXPECT_FALSE(model_->forward_batch(shared).is_ok());
}

// Three greedy generations advanced together, one decode row each per forward, reproduce the
// llama2.c reference ids of each generation run alone.
TEST_F(Stories260K, BatchedGreedyMatchesReference) {
  auto ref = reference();
  const std::vector<int32_t> want = ref["bos"].get<std::vector<int32_t>>();
  const int64_t V = model_->info().vocab;
  const int kSeqs = 3, kSteps = 120;
  std::vector<memory::SequenceState> caches;
  std::vector<std::vector<int32_t>> out(kSeqs);
  std::vector<std::vector<float>> logits(kSeqs, std::vector<float>(static_cast<size_t>(V)));
  for (int i = 0; i < kSeqs; ++i) {
    caches.emplace_back(model_->new_state(2048));
    out[i].push_back(want[0]);
  }
  // Start the sequences staggered (like requests arriving at different steps).
  for (int step = 0; step < kSteps + 2 * kSeqs; ++step) {
    std::vector<BatchItem> items;
    std::vector<int> who;
    for (int i = 0; i < kSeqs; ++i) {
      if (step < 2 * i || static_cast<int>(out[i].size()) >= kSteps) continue;
      items.push_back({&out[i].back(), 1, &caches[i], logits[i].data(), false});
      who.push_back(i);
    }
    if (items.empty()) continue;
    ASSERT_TRUE(model_->forward_batch(items).is_ok());
    for (int i : who) out[i].push_back(argmax(logits[i]));
  }
  for (int i = 0; i < kSeqs; ++i) {
    EXPECT_EQ(out[i], std::vector<int32_t>(want.begin(), want.begin() + kSteps)) << "sequence " << i;
  }
}

}  // namespace
}  // namespace larder::models
