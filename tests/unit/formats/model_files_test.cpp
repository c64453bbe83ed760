#include <gtest/gtest.h>

#include "larder/formats/model_files.h"
#include "test_util.h"

namespace larder::formats {
namespace {

using larder::testing::TempDir;
using larder::testing::write_file;

TEST(ModelFilesTest, GgufCarriesTensorsAndMetadata) {
  auto m = open_model_files(std::string(LARDER_SHARED_DIR) + "/models/stories260K/stories260K.gguf");
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  EXPECT_EQ(m->source, ModelSource::kGguf);
  EXPECT_TRUE(m->has_weights());
  EXPECT_GT(m->tensors().size(), 40u);
}

TEST(ModelFilesTest, TokenizerOnlyDirectoryWithoutWeights) {
  std::string dir = std::string(LARDER_SHARED_DIR) + "/tokenizers/hf/qwen3";
  OpenOptions o;
  o.weights = false;
  auto m = open_model_files(dir, o);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  EXPECT_FALSE(m->tokenizer_json_path.empty());
  EXPECT_TRUE(m->has_chat_template());
  EXPECT_NE(m->chat_template.find("<|im_start|>"), std::string::npos);
  // With weights requested, the missing config.json is named.
  auto w = open_model_files(dir);
  ASSERT_FALSE(w.is_ok());
  EXPECT_NE(w.status().message().find("config.json"), std::string::npos);
}

TEST(ModelFilesTest, ChatTemplateFilePrecedesTokenizerConfig) {
  TempDir dir;
  write_file(dir.file("config.json"), R"({"model_type":"llama"})");
  write_file(dir.file("tokenizer_config.json"), R"({"chat_template":"from-config"})");
  write_file(dir.file("chat_template.jinja"), "from-file");
  OpenOptions o;
  o.weights = false;
  auto m = open_model_files(dir.path(), o);
  ASSERT_TRUE(m.is_ok());
  EXPECT_EQ(m->chat_template, "from-file");
}

TEST(ModelFilesTest, ListFormChatTemplatePicksDefault) {
  TempDir dir;
  write_file(dir.file("config.json"), R"({})");
  write_file(dir.file("tokenizer_config.json"),
             R"({"chat_template":[{"name":"tool_use","template":"T"},{"name":"default","template":"D"}]})");
  OpenOptions o;
  o.weights = false;
  auto m = open_model_files(dir.path(), o);
  ASSERT_TRUE(m.is_ok());
  EXPECT_EQ(m->chat_template, "D");
}

TEST(ModelFilesTest, BadInputsNameTheProblem) {
  TempDir dir;
  auto missing = open_model_files(dir.file("nope"));
  ASSERT_FALSE(missing.is_ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  write_file(dir.file("weights.bin"), "xx");
  auto wrong = open_model_files(dir.file("weights.bin"));
  ASSERT_FALSE(wrong.is_ok());
  EXPECT_NE(wrong.status().message().find(".gguf"), std::string::npos);
  write_file(dir.file("config.json"), "{ broken");
  auto bad_json = open_model_files(dir.path());
  ASSERT_FALSE(bad_json.is_ok());
  EXPECT_NE(bad_json.status().message().find("config.json"), std::string::npos);
  EXPECT_EQ(bad_json.status().code(), StatusCode::kCorrupt);
}

}  // namespace
}  // namespace larder::formats
