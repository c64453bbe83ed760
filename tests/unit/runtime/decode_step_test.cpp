// The decode step (runtime/decode_step.h) both drivers run — the server's engine per row, and
// runtime::generate for the CLI — on stories260K's model, tokenizer and a grammar engine over
// its vocabulary: finish reasons (EOS, ignored EOS, stop strings released or held back, the
// token budget, the context, the grammar's end, a grammar dead end), picks equal to the
// sampler's own on fixed logits (the code both drivers ran before), the grammar mask winning
// over a logit bias, and the logprob sources.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "larder/formats/model_files.h"
#include "larder/models/model.h"
#include "larder/runtime/decode_step.h"
#include "larder/runtime/grammar.h"
#include "larder/tokenizer/tokenizer.h"

namespace larder::runtime {
namespace {

const std::string kStories = std::string(LARDER_SHARED_DIR) + "/models/stories260K/stories260K.gguf";

class DecodeStepTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto f = formats::open_model_files(kStories);
    ASSERT_TRUE(f.is_ok()) << f.status().to_string();
    files_ = new formats::ModelFiles(std::move(*f));
    auto m = models::Model::load(*files_);
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    model_ = m->release();
    auto t = tokenizer::Tokenizer::from_path(kStories);
    ASSERT_TRUE(t.is_ok()) << t.status().message();
    tok_ = t->release();
    engine_ = new GrammarEngine(*tok_, model_->info().vocab, tok_->eos_ids());
  }
  static void TearDownTestSuite() {
    delete engine_;
    delete tok_;
    delete model_;
    delete files_;
  }
  int64_t V() const { return model_->info().vocab; }
  // A sequence whose prompt is `prompt`, nothing forwarded, context `ctx`.
  Sequence seq(std::vector<int32_t> prompt = {1}, int64_t ctx = 256) {
    auto s = Sequence::adopt(std::move(prompt), model_->new_state(ctx), ctx);
    EXPECT_TRUE(s.is_ok());
    return std::move(*s);
  }
  // A row whose argmax is `id`.
  std::vector<float> one_hot(int32_t id) const {
    std::vector<float> l(static_cast<size_t>(V()), 0.0f);
    l[static_cast<size_t>(id)] = 10.0f;
    return l;
  }
  std::shared_ptr<const Constraint> gbnf(const std::string& text) {
    auto c = engine_->compile({ConstraintSpec::Kind::kGbnf, text});
    EXPECT_TRUE(c.is_ok()) << c.status().message();
    return c.is_ok() ? *c : nullptr;
  }
  int32_t eos() const { return tok_->eos_ids().at(0); }

  static formats::ModelFiles* files_;
  static models::Model* model_;
  static tokenizer::Tokenizer* tok_;
  static GrammarEngine* engine_;
};
formats::ModelFiles* DecodeStepTest::files_ = nullptr;
models::Model* DecodeStepTest::model_ = nullptr;
tokenizer::Tokenizer* DecodeStepTest::tok_ = nullptr;
GrammarEngine* DecodeStepTest::engine_ = nullptr;

TEST_F(DecodeStepTest, EosEndsWithoutKeepingTheToken) {
  DecodeOptions o;
  o.eos_ids = {eos()};
  DecodeStep d(o, tok_);
  Sequence s = seq();
  auto l = one_hot(eos());
  Accepted a = d.step(l.data(), V(), s);
  EXPECT_EQ(a.id, eos());
  EXPECT_EQ(a.finish, FinishReason::kEos);
  EXPECT_FALSE(a.kept);
  EXPECT_EQ(d.generated(), 0);
  EXPECT_EQ(s.history().size(), 1u);  // the prompt only
}

TEST_F(DecodeStepTest, IgnoredEosIsAnOrdinaryToken) {
  DecodeOptions o;  // no eos_ids: --ignore-eos
  DecodeStep d(o, tok_);
  Sequence s = seq();
  auto l = one_hot(eos());
  Accepted a = d.step(l.data(), V(), s);
  EXPECT_TRUE(a.kept);
  EXPECT_EQ(a.finish, FinishReason::kNone);
  EXPECT_EQ(s.history().back(), eos());
}

TEST_F(DecodeStepTest, TokenBudgetEndsWithLength) {
  DecodeOptions o;
  o.max_new_tokens = 3;
  DecodeStep d(o, nullptr);
  Sequence s = seq();
  for (int i = 0; i < 3; ++i) {
    auto l = one_hot(100 + i);
    Accepted a = d.step(l.data(), V(), s);
    EXPECT_TRUE(a.kept);
    EXPECT_EQ(a.finish, i < 2 ? FinishReason::kNone : FinishReason::kLength) << i;
  }
  EXPECT_EQ(d.generated(), 3);
}

TEST_F(DecodeStepTest, FullContextEndsWithLength) {
  // Prompt of 3 forwarded into a context of 4: the first token can be forwarded (4 <= 4), the
  // second could not.
  const std::vector<int32_t> prompt = {1, 403, 407};
  Sequence s = seq(prompt, 4);
  std::vector<float> l(static_cast<size_t>(V()));
  ASSERT_TRUE(model_->forward(prompt.data(), 3, s.state(), l.data(), false).is_ok());
  DecodeStep d(DecodeOptions{}, nullptr);
  auto l1 = one_hot(200);
  EXPECT_EQ(d.step(l1.data(), V(), s).finish, FinishReason::kNone);
  const int32_t t = 200;
  ASSERT_TRUE(model_->forward(&t, 1, s.state(), l.data(), false).is_ok());
  auto l2 = one_hot(201);
  Accepted a = d.step(l2.data(), V(), s);
  EXPECT_TRUE(a.kept);
  EXPECT_EQ(a.finish, FinishReason::kLength);
}

TEST_F(DecodeStepTest, StopStringEndsAndIsNeverReleased) {
  const std::vector<int32_t> ids = tok_->encode("Once upon a time there was", false);
  DecodeOptions o;
  o.stops = {"a time"};
  DecodeStep d(o, tok_);
  Sequence s = seq();
  std::string text;
  Accepted a;
  for (int32_t id : ids) {
    auto l = one_hot(id);
    a = d.step(l.data(), V(), s);
    EXPECT_EQ(a.id, id);
    text += a.text;
    if (a.finish != FinishReason::kNone) break;
  }
  EXPECT_EQ(a.finish, FinishReason::kStop);
  EXPECT_TRUE(a.kept);
  EXPECT_EQ(text, "Once upon ");
  EXPECT_EQ(d.matched_stop(), "a time");
  FinishReason why = a.finish;
  EXPECT_EQ(d.flush(&why), "");
}

TEST_F(DecodeStepTest, HeldBackTextIsReleasedAtEos) {
  // " a tim" could begin the stop string "a timer": held back until EOS says it will not.
  const std::vector<int32_t> ids = tok_->encode("Once upon a time", false);
  DecodeOptions o;
  o.stops = {"a time!"};
  o.eos_ids = {eos()};
  DecodeStep d(o, tok_);
  Sequence s = seq();
  std::string text;
  for (int32_t id : ids) {
    auto l = one_hot(id);
    text += d.step(l.data(), V(), s).text;
  }
  EXPECT_NE(text, "Once upon a time") << "something must be held back";
  auto l = one_hot(eos());
  Accepted a = d.step(l.data(), V(), s);
  ASSERT_EQ(a.finish, FinishReason::kEos);
  FinishReason why = a.finish;
  text += d.flush(&why);
  EXPECT_EQ(why, FinishReason::kEos);
  EXPECT_EQ(text, "Once upon a time");
}

TEST_F(DecodeStepTest, GrammarEndStopsEvenWhenEosIsIgnored) {
  for (bool ignore_eos : {false, true}) {
    DecodeOptions o;
    o.constraint = gbnf(R"(root ::= "Once")");
    if (!ignore_eos) o.eos_ids = {eos()};
    DecodeStep d(o, tok_);
    Sequence s = seq();
    std::string text;
    Accepted a;
    for (int i = 0; i < 10; ++i) {
      // Uniform logits: only the grammar decides (greedy: the lowest allowed id).
      std::vector<float> l(static_cast<size_t>(V()), 0.0f);
      a = d.step(l.data(), V(), s);
      text += a.text;
      if (a.finish != FinishReason::kNone) break;
    }
    EXPECT_EQ(a.finish, FinishReason::kEos) << ignore_eos;
    EXPECT_FALSE(a.kept);
    FinishReason why = a.finish;
    text += d.flush(&why);
    EXPECT_EQ(text, "Once") << ignore_eos;
  }
}

TEST_F(DecodeStepTest, GrammarDeadEndIsAnError) {
  DecodeOptions o;
  o.constraint = gbnf(R"(root ::= "Once")");
  DecodeStep d(o, tok_);
  Sequence s = seq();
  const int32_t forbidden = tok_->encode("upon", false).at(0);
  Accepted a = d.accept(forbidden, s, nullptr, V());
  EXPECT_EQ(a.finish, FinishReason::kError);
  EXPECT_FALSE(a.kept);
  EXPECT_NE(a.error.find("dead end"), std::string::npos) << a.error;
  EXPECT_EQ(s.history().size(), 1u);
}

TEST_F(DecodeStepTest, MaskComesAfterTheBiasSoABiasNeverRevivesAForbiddenToken) {
  DecodeOptions o;
  o.constraint = gbnf(R"(root ::= "Once")");
  const int32_t forbidden = tok_->encode("upon", false).at(0);
  o.sampling.logit_bias[forbidden] = 100.0f;
  DecodeStep d(o, tok_);
  Sequence s = seq();
  std::vector<float> l(static_cast<size_t>(V()), 0.0f);
  const int32_t id = d.pick(l.data(), V(), s.history());
  EXPECT_NE(id, forbidden);
  EXPECT_TRUE(std::isinf(l[static_cast<size_t>(forbidden)]) && l[static_cast<size_t>(forbidden)] < 0);
}

TEST_F(DecodeStepTest, PicksEqualTheSamplersOnFixedLogits) {
  // What both drivers computed before the step existed: process (bias, penalties) then pick with
  // the draw number of the tokens kept so far.
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (float temp : {0.0f, 0.8f, 1.3f}) {
    DecodeOptions o;
    o.sampling.temperature = temp;
    o.sampling.top_k = temp > 1 ? 40 : 0;
    o.sampling.top_p = temp > 0 && temp < 1 ? 0.9f : 1.0f;
    o.sampling.min_p = 0.02f;
    o.sampling.repetition_penalty = 1.3f;
    o.sampling.presence_penalty = 0.4f;
    o.sampling.frequency_penalty = 0.2f;
    o.sampling.logit_bias = {{5, 4.0f}, {6, -100.0f}};
    o.sampling.seed = 1234;
    o.max_new_tokens = 1000;
    DecodeStep d(o, tok_);
    Sampler ref(o.sampling);
    Sequence s = seq({1, 403, 407});
    for (int i = 0; i < 40; ++i) {
      std::vector<float> l(static_cast<size_t>(V()));
      for (float& x : l) x = nd(rng);
      std::vector<float> copy = l;
      const int32_t want = ref.sample_at(copy.data(), V(), s.history(), static_cast<uint64_t>(i));
      const int32_t got = d.pick(l.data(), V(), s.history());
      ASSERT_EQ(got, want) << "temp " << temp << " step " << i;
      EXPECT_EQ(l, copy) << "the same processed row";
      ASSERT_TRUE(d.accept(got, s, l.data(), V()).kept);
    }
  }
}

TEST_F(DecodeStepTest, LogprobsDescribeTheDistributionAskedFor) {
  std::vector<float> raw(static_cast<size_t>(V()), 0.0f);
  raw[10] = 2.0f;
  raw[11] = 1.0f;
  for (LogprobsOf of : {LogprobsOf::kProcessed, LogprobsOf::kModel, LogprobsOf::kPostSampling}) {
    DecodeOptions o;
    o.sampling.logit_bias[11] = 5.0f;  // 11 wins after processing
    o.top_logprobs = 2;
    o.logprobs_of = of;
    DecodeStep d(o, tok_);
    Sequence s = seq();
    std::vector<float> l = raw;
    Accepted a = d.step(l.data(), V(), s);
    ASSERT_EQ(a.id, 11);
    ASSERT_EQ(a.logprobs.top.size(), of == LogprobsOf::kPostSampling ? 1u : 2u);
    switch (of) {
      case LogprobsOf::kModel:  // the model's own: 10 ranks first
        EXPECT_EQ(a.logprobs.top[0].first, 10);
        EXPECT_FALSE(a.logprobs.linear);
        break;
      case LogprobsOf::kProcessed:
        EXPECT_EQ(a.logprobs.top[0].first, 11);
        EXPECT_FALSE(a.logprobs.linear);
        break;
      case LogprobsOf::kPostSampling:  // greedy: the pick with probability 1
        EXPECT_EQ(a.logprobs.top[0].first, 11);
        EXPECT_TRUE(a.logprobs.linear);
        EXPECT_FLOAT_EQ(a.logprobs.logprob, 1.0f);
        break;
    }
  }
}

TEST(FinishReason, Names) {
  EXPECT_STREQ(finish_reason_name(FinishReason::kEos), "eos");
  EXPECT_STREQ(finish_reason_name(FinishReason::kStop), "stop");
  EXPECT_STREQ(finish_reason_name(FinishReason::kLength), "length");
  EXPECT_STREQ(finish_reason_name(FinishReason::kCancelled), "cancelled");
}

}  // namespace
}  // namespace larder::runtime
