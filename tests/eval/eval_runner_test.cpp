// The eval runners' C++ API on stories260K (a real trained model) against a straightforward
// computation: each chunk forwarded whole in one call with every position's logits, the NLL of
// the second half from an explicitly normalized double softmax.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "larder/memory/kv_cache.h"
#include "larder/runtime/eval.h"
#include "larder/runtime/loaded_model.h"
#include "larder/tokenizer/tokenizer.h"

namespace larder::runtime {
namespace {

class EvalRunner : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto m = load_model(std::string(LARDER_SHARED_DIR) + "/models/stories260K/stories260K.gguf");
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    model_ = m.value().release();
    std::ifstream in(std::string(LARDER_SHARED_DIR) + "/corpora/tinyshakespeare.txt");
    std::ostringstream ss;
    ss << in.rdbuf();
    stream_ = model_->tokenizer->encode(ss.str().substr(0, 8000), false);
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  static LoadedModel* model_;
  static std::vector<int32_t> stream_;
};
LoadedModel* EvalRunner::model_ = nullptr;
std::vector<int32_t> EvalRunner::stream_;

// llama-perplexity tokenizes the text with BOS (common_tokenize(text, add_special = true)) and
// then overwrites each chunk's first token with BOS: chunk 0 keeps every text token, chunk k
// starts at stream position k·n_ctx of the BOS-led stream. Before issue 13 larder tokenized
// without BOS, so each chunk was the text one token later than llama.cpp's (chunk 0 lost its
// first word): gemma-3-270m PPL 1-2 % off llama-perplexity.
TEST_F(EvalRunner, StreamStartsWithBosAsLlamaPerplexityTokenizes) {
  const std::string text = "First Citizen:\nBefore we proceed any further, hear me speak.\n";
  const EvalStream s = make_eval_stream(*model_->tokenizer, text);
  const auto bos = model_->tokenizer->bos_id();
  ASSERT_TRUE(bos.has_value());
  ASSERT_TRUE(s.bos.has_value()) << "stories260K's tokenizer adds BOS";
  EXPECT_EQ(*s.bos, *bos);
  const std::vector<int32_t> with = model_->tokenizer->encode(text, true);
  EXPECT_EQ(s.ids, with) << "the stream is the text encoded with special tokens";
  const std::vector<int32_t> plain = model_->tokenizer->encode(text, false);
  ASSERT_GE(plain.size(), 8u);
  auto chunks = make_eval_chunks(s.ids, 8, 1, s.bos);
  ASSERT_TRUE(chunks.is_ok()) << chunks.status().to_string();
  EXPECT_EQ((*chunks)[0][0], *bos);
  for (size_t i = 1; i < 8; ++i) EXPECT_EQ((*chunks)[0][i], plain[i - 1]) << "chunk 0 keeps the text's first tokens";
}

TEST_F(EvalRunner, PerplexityMatchesWholeChunkScalarNll) {
  const int64_t n = 64;
  auto chunks = make_eval_chunks(stream_, n, 3, model_->model->info().bos_id);
  ASSERT_TRUE(chunks.is_ok()) << chunks.status().to_string();
  models::Model& model = *model_->model;
  const int64_t V = model.info().vocab;
  double sum = 0;
  int64_t count = 0;
  for (const auto& c : *chunks) {
    memory::SequenceState cache = model.new_state(n);
    std::vector<float> logits(static_cast<size_t>(n * V));
    ASSERT_TRUE(model.forward(c.data(), n, cache, logits.data(), true).is_ok());
    for (int64_t i = n / 2; i < n - 1; ++i) {
      const float* row = logits.data() + i * V;
      double m = row[0], z = 0;
      for (int64_t k = 0; k < V; ++k) m = std::max(m, static_cast<double>(row[k]));
      for (int64_t k = 0; k < V; ++k) z += std::exp(row[k] - m);
      sum += -std::log(std::exp(row[c[i + 1]] - m) / z);
      ++count;
    }
  }
  int calls = 0;
  auto r = eval_perplexity(model, *chunks, [&](const EvalProgress& p) {
    ++calls;
    EXPECT_EQ(p.chunk, calls);
    EXPECT_EQ(p.n_chunks, 3);
  });
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(r->n_tokens, count);
  EXPECT_EQ(r->n_tokens, 3 * eval_scored_per_chunk(n));
  EXPECT_NEAR(r->mean_nll, sum / count, 1e-5);
  EXPECT_NEAR(r->ppl, std::exp(sum / count), 1e-4 * r->ppl);
  EXPECT_GT(r->ppl_err, 0);
}

TEST_F(EvalRunner, KlOfModelWithItselfIsZero) {
  auto chunks = make_eval_chunks(stream_, 48, 2, model_->model->info().bos_id);
  ASSERT_TRUE(chunks.is_ok());
  auto r = eval_kl(*model_->model, *model_->model, *chunks);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->n_tokens, 2 * eval_scored_per_chunk(48));
  EXPECT_EQ(r->mean, 0.0);
  EXPECT_EQ(r->max, 0.0);
  EXPECT_EQ(r->top1, 1.0);
  EXPECT_EQ(r->top1_err, 0.0);
  EXPECT_EQ(r->ln_ppl_ratio, 0.0);
  EXPECT_EQ(r->base.ppl, r->cand.ppl);
}

TEST_F(EvalRunner, ChunksLongerThanTheContextAreRefused) {
  std::vector<int32_t> long_stream(static_cast<size_t>(model_->model->info().max_context + 2), 5);
  auto chunks = make_eval_chunks(long_stream, model_->model->info().max_context + 1, 1, std::nullopt);
  ASSERT_TRUE(chunks.is_ok());
  auto r = eval_perplexity(*model_->model, *chunks);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("exceeds"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace larder::runtime
