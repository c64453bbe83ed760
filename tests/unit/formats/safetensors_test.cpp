// Safetensors reader: valid files (single and sharded) map zero-copy with the right values;
// every kind of lying header is a corrupt/unsupported Status naming the file and tensor.
#include <gtest/gtest.h>

#include <cstring>

#include "larder/formats/safetensors.h"
#include "test_util.h"

namespace larder::formats {
namespace {

using larder::testing::TempDir;
using larder::testing::write_file;

std::string make_file(const std::string& header_json, const std::string& data) {
  uint64_t n = header_json.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  return out + header_json + data;
}

std::string floats(std::initializer_list<float> v) {
  std::string s(v.size() * 4, '\0');
  std::memcpy(s.data(), std::data(v), s.size());
  return s;
}

TEST(SafetensorsTest, ReadsTensorsZeroCopy) {
  TempDir dir;
  std::string data = floats({1, 2, 3, 4, 5, 6}) + std::string("\x80\x3f\x00\x40", 4);  // bf16 1.0, 2.0
  write_file(dir.file("model.safetensors"),
             make_file(R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
                       R"("b":{"dtype":"BF16","shape":[2],"data_offsets":[24,28]},"__metadata__":{"format":"mlx"}})",
                       data));
  TensorSet set;
  std::map<std::string, std::string> meta;
  ASSERT_TRUE(read_safetensors(dir.file("model.safetensors"), &set, &meta).is_ok());
  EXPECT_EQ(meta["format"], "mlx");
  const TensorInfo* a = set.find("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dtype, DType::kF32);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
  float v[6];
  std::memcpy(v, a->data, 24);
  EXPECT_EQ(v[5], 6.0f);
  const TensorInfo* b = set.find("b");
  ASSERT_NE(b, nullptr);
  uint16_t h[2];
  std::memcpy(h, b->data, 4);
  EXPECT_EQ(bf16_to_f32(h[0]), 1.0f);
  EXPECT_EQ(bf16_to_f32(h[1]), 2.0f);
  // Zero-copy: the tensor points into the mapping.
  EXPECT_GE(a->data, set.files()[0]->data());
  EXPECT_LT(a->data, set.files()[0]->data() + set.files()[0]->size());
}

struct BadCase {
  const char* name;
  std::string bytes;
  const char* expect_in_message;
};

TEST(SafetensorsTest, LyingHeadersAreClearErrors) {
  const std::string d24 = floats({1, 2, 3, 4, 5, 6});
  std::vector<BadCase> cases = {
      {"too_short", "abc", "too short"},
      {"header_len_past_eof", std::string("\xff\xff\x00\x00\x00\x00\x00\x00", 8) + "{}", "exceeds file size"},
      {"not_json", make_file("{not json", ""), "not a JSON object"},
      {"offsets_past_eof", make_file(R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,48]}})", d24),
       "exceeds data size"},
      {"size_mismatch", make_file(R"({"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,24]}})", d24),
       "needs 16 bytes"},
      {"reversed", make_file(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})", d24), "reversed"},
      {"unknown_dtype", make_file(R"({"a":{"dtype":"F8_E9","shape":[6],"data_offsets":[0,6]}})", d24), "F8_E9"},
      {"negative_dim", make_file(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", d24), "negative"},
      {"missing_fields", make_file(R"({"a":{"dtype":"F32"}})", d24), "data_offsets"},
      {"overlap", make_file(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                            R"("b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})", d24), "overlap"},
      // Found by tests/fuzz (fuzz_safetensors' size invariant): 2^62 F32 elements are 2^64 bytes,
      // which wrapped to 0, so an empty range "held" a [2^31, 2^31] tensor.
      {"bytes_overflow", make_file(R"({"a":{"dtype":"F32","shape":[2147483648,2147483648],"data_offsets":[0,0]}})", ""),
       "implausibly large"},
  };
  for (const auto& c : cases) {
    TempDir dir;
    std::string path = dir.file(std::string(c.name) + ".safetensors");
    write_file(path, c.bytes);
    TensorSet set;
    Status st = read_safetensors(path, &set);
    EXPECT_FALSE(st.is_ok()) << c.name;
    EXPECT_NE(st.message().find(c.expect_in_message), std::string::npos) << c.name << ": " << st.message();
    EXPECT_NE(st.message().find(path), std::string::npos) << c.name << " message must name the file";
  }
}

TEST(SafetensorsTest, ShardedCheckpointFollowsIndex) {
  TempDir dir;
  write_file(dir.file("model-00001-of-00002.safetensors"),
             make_file(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", floats({1, 2})));
  write_file(dir.file("model-00002-of-00002.safetensors"),
             make_file(R"({"y":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", floats({3})));
  write_file(dir.file("model.safetensors.index.json"),
             R"({"metadata":{},"weight_map":{"x":"model-00001-of-00002.safetensors","y":"model-00002-of-00002.safetensors"}})");
  auto set = open_safetensors_dir(dir.path());
  ASSERT_TRUE(set.is_ok()) << set.status().to_string();
  EXPECT_EQ(set->size(), 2u);
  EXPECT_NE(set->find("y"), nullptr);

  // An index that points a tensor at the wrong shard is corrupt.
  write_file(dir.file("model.safetensors.index.json"),
             R"({"weight_map":{"x":"model-00002-of-00002.safetensors","y":"model-00002-of-00002.safetensors"}})");
  auto bad = open_safetensors_dir(dir.path());
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("'x'"), std::string::npos) << bad.status().message();

  // A missing shard names the shard file.
  write_file(dir.file("model.safetensors.index.json"), R"({"weight_map":{"x":"model-00009.safetensors"}})");
  auto missing = open_safetensors_dir(dir.path());
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("model-00009.safetensors"), std::string::npos);
}

TEST(SafetensorsTest, EmptyDirectoryIsNotFound) {
  TempDir dir;
  auto r = open_safetensors_dir(dir.path());
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace larder::formats
