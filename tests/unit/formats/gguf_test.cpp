// GGUF reader on the real files in ../shared, and on truncated / corrupted copies of them.
#include <gtest/gtest.h>

#include "larder/formats/gguf.h"
#include "test_util.h"

namespace larder::formats {
namespace {

const std::string kShared = LARDER_SHARED_DIR;
const std::string kStories = kShared + "/models/stories260K/stories260K.gguf";

TEST(GgufTest, ReadsStories260K) {
  auto g = GgufFile::open(kStories);
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  EXPECT_EQ((*g)->version(), 3u);
  EXPECT_EQ((*g)->architecture(), "llama");
  // Facts published with the model: dim 64, 5 layers, 8 heads, 4 KV heads, vocab 512.
  EXPECT_EQ((*g)->get_int("llama.embedding_length").value_or(-1), 64);
  EXPECT_EQ((*g)->get_int("llama.block_count").value_or(-1), 5);
  EXPECT_EQ((*g)->get_int("llama.attention.head_count").value_or(-1), 8);
  EXPECT_EQ((*g)->get_int("llama.attention.head_count_kv").value_or(-1), 4);
  const GgufValue* tokens = (*g)->find("tokenizer.ggml.tokens");
  ASSERT_NE(tokens, nullptr);
  EXPECT_EQ(tokens->strs.size(), 512u);
  const TensorInfo* emb = (*g)->tensors().find("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->dtype, DType::kF32);
  EXPECT_EQ(emb->shape, (std::vector<int64_t>{512, 64}));  // outermost-first: [vocab, dim]
  EXPECT_EQ(emb->nbytes, 512u * 64u * 4u);
  EXPECT_NE((*g)->tensors().find("blk.4.ffn_down.weight"), nullptr);
}

TEST(GgufTest, ReadsLlama2Vocab) {
  auto g = GgufFile::open(kShared + "/models/llama-2-tiny-random/llama-2-tiny-random.gguf");
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  const GgufValue* tokens = (*g)->find("tokenizer.ggml.tokens");
  ASSERT_NE(tokens, nullptr);
  EXPECT_EQ(tokens->strs.size(), 32000u);
  const GgufValue* scores = (*g)->find("tokenizer.ggml.scores");
  ASSERT_NE(scores, nullptr);
  EXPECT_EQ(scores->floats.size(), 32000u);
}

// llama.cpp writes vocabulary-only GGUFs without the trailing alignment padding.
TEST(GgufTest, OpensVocabOnlyFilesWithoutPadding) {
  for (const char* name : {"ggml-vocab-gpt-2.gguf", "ggml-vocab-llama-spm.gguf", "ggml-vocab-bert-bge.gguf"}) {
    auto g = GgufFile::open(kShared + "/tokenizers/" + name);
    ASSERT_TRUE(g.is_ok()) << name << ": " << g.status().to_string();
    EXPECT_EQ((*g)->tensors().size(), 0u);
    ASSERT_NE((*g)->find("tokenizer.ggml.tokens"), nullptr) << name;
  }
}

TEST(GgufTest, TruncatedFilesFailCleanlyAtEveryCut) {
  std::string bytes = larder::testing::read_file(kStories);
  ASSERT_GT(bytes.size(), 100000u);
  larder::testing::TempDir dir;
  // Cut inside the magic, the header, the metadata, the tensor table and the tensor data.
  for (size_t cut : {size_t{0}, size_t{3}, size_t{10}, size_t{30}, size_t{200}, size_t{5000}, size_t{9000},
                     size_t{12000}, bytes.size() / 2, bytes.size() - 1}) {
    std::string path = dir.file("cut_" + std::to_string(cut) + ".gguf");
    larder::testing::write_file(path, bytes.substr(0, cut));
    auto g = GgufFile::open(path);
    ASSERT_FALSE(g.is_ok()) << "cut at " << cut << " must fail";
    EXPECT_NE(g.status().message().find(path), std::string::npos) << g.status().message();
  }
}

TEST(GgufTest, CorruptHeadersAreRejected) {
  std::string bytes = larder::testing::read_file(kStories);
  larder::testing::TempDir dir;
  auto expect_fail = [&](std::string b, const char* what) {
    std::string path = dir.file("bad.gguf");
    larder::testing::write_file(path, b);
    auto g = GgufFile::open(path);
    ASSERT_FALSE(g.is_ok()) << what;
    EXPECT_NE(g.status().message().find(what), std::string::npos) << g.status().message();
  };
  std::string b = bytes;
  b[0] = 'X';
  expect_fail(b, "not a GGUF file");
  b = bytes;
  b[4] = 9;  // version 9
  expect_fail(b, "version 9");
  b = bytes;
  // tensor count = 2^40
  uint64_t huge = 1ull << 40;
  std::memcpy(b.data() + 8, &huge, 8);
  expect_fail(b, "implausible");
  // Random bit flips in the header region must never crash (either ok or a clean error).
  for (int i = 0; i < 300; ++i) {
    b = bytes;
    size_t pos = 8 + (static_cast<size_t>(i) * 7919) % 12000;
    b[pos] = static_cast<char>(b[pos] ^ (1 << (i % 8)));
    std::string path = dir.file("flip.gguf");
    larder::testing::write_file(path, b);
    auto g = GgufFile::open(path);
    (void)g;  // no crash, no hang: the assertion is reaching this line under ASan/UBSan too
  }
  SUCCEED();
}

// Found by tests/fuzz (fuzz_gguf: UBSan, signed overflow in the element count). Dimensions each
// within the per-dimension cap whose product is 2^64 + 32: the element count wrapped to 32, so
// 128 bytes of F32 "fit" and a [105305443, 175173699936] tensor was accepted over them.
TEST(GgufTest, ShapeWhoseElementCountOverflowsIsRejected) {
  std::string b = "GGUF";
  auto put = [&](auto v) { b.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  put(uint32_t{3});       // version
  put(uint64_t{1});       // tensors
  put(uint64_t{0});       // metadata keys
  put(uint64_t{1});       // name length
  b += "w";
  put(uint32_t{2});       // dimensions, ggml order (innermost first)
  put(uint64_t{175173699936});
  put(uint64_t{105305443});
  put(uint32_t{0});       // F32
  put(uint64_t{0});       // offset
  b.resize((b.size() + 31) / 32 * 32 + 128, '\0');
  larder::testing::TempDir dir;
  const std::string path = dir.file("overflow.gguf");
  larder::testing::write_file(path, b);
  auto g = GgufFile::open(path);
  ASSERT_FALSE(g.is_ok()) << "accepted " << (*g)->tensors().tensors()[0].shape_str() << " over "
                          << (*g)->tensors().tensors()[0].nbytes << " bytes";
  EXPECT_NE(g.status().message().find("more than"), std::string::npos) << g.status().message();
}

}  // namespace
}  // namespace larder::formats
