// A tokenizer larger than the model's embedding (issue 47 item 13): Gemma 3 / 4 text checkpoints
// say vocab_size 262144 beside a tokenizer of 262,145 entries (id 262144: <image_soft_token>).
// - gemma3_realtok (tests/ref/gemma3_reference.py): a random-weight gemma3_text with the real
//   tokenizer loads, encodes like the `tokenizers` library and its logits match mlx-lm's; a
//   prompt holding <image_soft_token> is refused naming the id and token; the grammar's
//   vocabulary (its token masks) has the model's size, not the tokenizer's.
// - the smaller equivalent on gemma3_text_f32 (vocab 300) with a written tokenizer of 301
//   entries: accepted when id 300 is an added special token, refused when it is an ordinary
//   vocabulary entry (plain text could encode to it).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "larder/runtime/loaded_model.h"
#include "../../support/logit_diff.h"
#include "../../support/model_fixture.h"

namespace larder::runtime {
namespace {

namespace fs = std::filesystem;

const std::string kRealTok = test::kModelFixtures + "gemma3_realtok";

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(ExtraTokenizerIds, RealGemma3TokenizerLoadsAndMatchesMlxLm) {
  std::ifstream rf(kRealTok + "/ref.json");
  if (!rf.good()) GTEST_SKIP() << "no gemma3_realtok fixture (shared/tokenizers/hf/gemma3 absent)";
  const nlohmann::json ref = nlohmann::json::parse(rf);
  auto lm = load_model(kRealTok);
  ASSERT_TRUE(lm.is_ok()) << lm.status().to_string();
  const LoadedModel& m = **lm;
  const int64_t V = m.model->info().vocab;
  EXPECT_EQ(V, 262144);
  EXPECT_EQ(m.tokenizer->vocab_size(), 262145);
  EXPECT_EQ(m.tokenizer->id_to_token(262144), "<image_soft_token>");

  const std::vector<int32_t> tokens = ref["tokens"].get<std::vector<int32_t>>();
  EXPECT_EQ(m.tokenizer->encode(ref["text"].get<std::string>(), /*add_special=*/true), tokens);
  EXPECT_TRUE(check_prompt(m, tokens).is_ok());

  std::vector<float> want(tokens.size() * static_cast<size_t>(V));
  std::ifstream lf(kRealTok + "/" + ref["logits"]["f32"].get<std::string>(), std::ios::binary);
  lf.read(reinterpret_cast<char*>(want.data()), static_cast<std::streamsize>(want.size() * sizeof(float)));
  ASSERT_TRUE(lf.good());
  std::vector<float> got(want.size());
  memory::SequenceState st = m.model->new_state(m.model->info().max_context);
  ASSERT_TRUE(m.model->forward(tokens.data(), static_cast<int64_t>(tokens.size()), st, got.data(), true).is_ok());
  const test::LogitDiff d = test::compare_logits(got, want, V);
  EXPECT_LE(d.max_abs, 1e-4f * d.max_ref);
  EXPECT_EQ(d.top1_mismatch, 0);
  EXPECT_EQ(d.top1_checked, static_cast<int>(tokens.size()));

  // Constrained decoding masks rows of the model's logits: its vocabulary has V entries.
  ASSERT_NE(m.grammar, nullptr);
  EXPECT_EQ(static_cast<int64_t>(m.grammar->vocabulary().size()), V);
}

TEST(ExtraTokenizerIds, PromptWithUnembeddableTokenRefused) {
  if (!fs::exists(kRealTok + "/ref.json")) GTEST_SKIP() << "no gemma3_realtok fixture";
  auto lm = load_model(kRealTok);
  ASSERT_TRUE(lm.is_ok()) << lm.status().to_string();
  const LoadedModel& m = **lm;
  // The user's text names the special token: the tokenizer parses it into id 262144.
  const std::vector<int32_t> ids = m.tokenizer->encode("Describe <image_soft_token> please", true);
  const auto at = std::find(ids.begin(), ids.end(), 262144);
  ASSERT_NE(at, ids.end());
  const Status st = check_prompt(m, ids);
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(has(st.message(), "262144") && has(st.message(), "<image_soft_token>")) << st.message();
  EXPECT_TRUE(has(st.message(), "position " + std::to_string(at - ids.begin()))) << st.message();
  // Through the chat template too: the rendered text is encoded with special tokens parsed.
  auto chat = encode_chat(m, {{"user", "<image_soft_token>"}}, true);
  ASSERT_TRUE(chat.is_ok()) << chat.status().to_string();
  EXPECT_FALSE(check_prompt(m, *chat).is_ok());
  // A raw id outside every vocabulary (e.g. a /completion token list) is named too.
  const Status neg = check_prompt(m, std::vector<int32_t>{2, -1});
  EXPECT_FALSE(neg.is_ok());
  EXPECT_TRUE(has(neg.message(), "-1")) << neg.message();
}

// gemma3_text_f32 (vocab 300, no tokenizer) with a tokenizer.json written here: 300 model ids,
// plus id 300 either as an added special token or as an ordinary vocabulary entry.
class SmallerEquivalent : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string src = test::kModelFixtures + "gemma3_text_f32";
    if (!fs::exists(src + "/ref.json")) GTEST_FAIL() << src << ": fixture gemma3_ref did not run";
    char tmpl[] = "/tmp/larder-models-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    fs::copy_file(src + "/config.json", dir_ + "/config.json");
    fs::copy_file(src + "/model.safetensors", dir_ + "/model.safetensors");
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  void write_tokenizer(bool extra_is_special) {
    nlohmann::json vocab = nlohmann::json::object();
    for (int i = 0; i < 300; ++i) {
      std::string t = i == 0 ? "<pad>" : i == 1 ? "<eos>" : i == 2 ? "<bos>" : i < 29 ? std::string(1, char('a' + i - 3))
                                                                                 : "t" + std::to_string(i);
      vocab[t] = i;
    }
    nlohmann::json added = nlohmann::json::array();
    if (extra_is_special) {
      added.push_back({{"id", 300}, {"content", "<image_soft_token>"}, {"single_word", false}, {"lstrip", false},
                       {"rstrip", false}, {"normalized", false}, {"special", true}});
    } else {
      vocab["zz"] = 300;
    }
    const nlohmann::json tok = {{"version", "1.0"},     {"truncation", nullptr},  {"padding", nullptr},
                                {"added_tokens", added}, {"normalizer", nullptr},  {"pre_tokenizer", nullptr},
                                {"post_processor", nullptr}, {"decoder", nullptr},
                                {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
                                           {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr},
                                           {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
                                           {"vocab", vocab}, {"merges", nlohmann::json::array()}}}};
    std::ofstream(dir_ + "/tokenizer.json") << tok.dump();
  }
  std::string dir_;
};

TEST_F(SmallerEquivalent, AddedSpecialTokenPastTheEmbeddingIsAccepted) {
  write_tokenizer(/*extra_is_special=*/true);
  auto lm = load_model(dir_);
  ASSERT_TRUE(lm.is_ok()) << lm.status().to_string();
  const LoadedModel& m = **lm;
  EXPECT_EQ(m.tokenizer->vocab_size(), 301);
  EXPECT_EQ(m.model->info().vocab, 300);
  const std::vector<int32_t> plain = m.tokenizer->encode("abc", false);
  EXPECT_EQ(plain, (std::vector<int32_t>{3, 4, 5}));
  EXPECT_TRUE(check_prompt(m, plain).is_ok());
  const Status st = check_prompt(m, m.tokenizer->encode("ab<image_soft_token>c", false));
  ASSERT_FALSE(st.is_ok());
  EXPECT_TRUE(has(st.message(), "300") && has(st.message(), "<image_soft_token>")) << st.message();
  EXPECT_EQ(static_cast<int64_t>(m.grammar->vocabulary().size()), 300);
}

TEST_F(SmallerEquivalent, OrdinaryEntryPastTheEmbeddingIsRefused) {
  write_tokenizer(/*extra_is_special=*/false);
  auto lm = load_model(dir_);
  ASSERT_FALSE(lm.is_ok());
  EXPECT_EQ(lm.status().code(), StatusCode::kIncompatible);
  const std::string msg = lm.status().message();
  EXPECT_TRUE(has(msg, "301 tokens") && has(msg, "vocabulary is 300") && has(msg, "id 300") && has(msg, "'zz'") &&
              has(msg, "ordinary vocabulary entry"))
      << msg;
}

}  // namespace
}  // namespace larder::runtime
