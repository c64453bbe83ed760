// MapMode::kCopy (`--no-mmap`): the copy holds the file's bytes exactly, at a 2 MiB boundary, for
// every size (empty, under a page, across huge pages); GGUF and safetensors tensors read the same
// through either mode; a missing file is still named.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>

#include "larder/core/mmap_file.h"
#include "larder/formats/model_files.h"
#include "larder/formats/safetensors.h"
#include "test_util.h"

namespace larder::formats {
namespace {

using larder::testing::TempDir;
using larder::testing::write_file;

std::string random_bytes(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng());
  return s;
}

TEST(MapModeTest, CopyHoldsTheFileBytesAtAHugePageBoundary) {
  TempDir dir;
  // 0; under a page; one byte past a page; one byte past a huge page plus change.
  for (size_t n : {size_t{0}, size_t{1}, size_t{4097}, (size_t{2} << 20) + 4097}) {
    SCOPED_TRACE(n);
    const std::string bytes = random_bytes(n, static_cast<unsigned>(n));
    const std::string path = dir.file("f" + std::to_string(n));
    write_file(path, bytes);
    auto mapped = MappedFile::open(path, MapMode::kMap);
    auto copied = MappedFile::open(path, MapMode::kCopy);
    ASSERT_TRUE(mapped.is_ok()) << mapped.status().to_string();
    ASSERT_TRUE(copied.is_ok()) << copied.status().to_string();
    ASSERT_EQ((*copied)->size(), n);
    EXPECT_EQ((*copied)->path(), path);
    if (n == 0) {
      EXPECT_EQ((*copied)->data(), nullptr);
      continue;
    }
    EXPECT_NE((*copied)->data(), (*mapped)->data());
    EXPECT_EQ(reinterpret_cast<uintptr_t>((*copied)->data()) % (uintptr_t{2} << 20), 0u);
    EXPECT_EQ(std::memcmp((*copied)->data(), bytes.data(), n), 0);
    EXPECT_EQ(std::memcmp((*mapped)->data(), bytes.data(), n), 0);
  }
  auto missing = MappedFile::open(dir.file("nope"), MapMode::kCopy);
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("nope"), std::string::npos);
}

// residency() finds the file's own pages in /proc/self/smaps: all of them once touched (the copy
// touched them when it read the file), never more than the region, and the 2 MiB share within it.
TEST(MapModeTest, ResidencyCountsTheFilesOwnPages) {
  TempDir dir;
  const size_t n = (size_t{4} << 20) + 12345;
  const std::string path = dir.file("f");
  write_file(path, random_bytes(n, 3));
  for (MapMode mode : {MapMode::kMap, MapMode::kCopy}) {
    auto f = MappedFile::open(path, mode);
    ASSERT_TRUE(f.is_ok()) << f.status().to_string();
    EXPECT_EQ((*f)->mode(), mode);
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < n; i += 4096) sink = sink + (*f)->data()[i];
    const MappedFile::Residency r = (*f)->residency();
    EXPECT_GE(r.resident, n / 4096 * 4096) << (mode == MapMode::kCopy ? "copy" : "map");
    EXPECT_LE(r.resident, n + (size_t{4} << 20));
    EXPECT_LE(r.huge, r.resident);
  }
}

// Every tensor of a model opened both ways: same names, dtypes, shapes and bytes, at different
// addresses.
void expect_same_tensors(const TensorSet& a, const TensorSet& b) {
  ASSERT_EQ(a.size(), b.size());
  ASSERT_GT(a.size(), 0u);
  for (const TensorInfo& t : a.tensors()) {
    SCOPED_TRACE(t.name);
    const TensorInfo* x = &t;
    const TensorInfo* y = b.find(t.name);
    ASSERT_NE(x, nullptr);
    ASSERT_NE(y, nullptr);
    EXPECT_EQ(x->dtype, y->dtype);
    EXPECT_EQ(x->shape, y->shape);
    ASSERT_EQ(x->nbytes, y->nbytes);
    EXPECT_NE(x->data, y->data);
    EXPECT_EQ(std::memcmp(x->data, y->data, x->nbytes), 0);
  }
}

TEST(MapModeTest, GgufTensorsAreTheSameCopiedOrMapped) {
  const std::string path = std::string(LARDER_SHARED_DIR) + "/models/stories260K/stories260K.gguf";
  OpenOptions copy;
  copy.map_mode = MapMode::kCopy;
  auto m = open_model_files(path);
  auto c = open_model_files(path, copy);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  expect_same_tensors(m->tensors(), c->tensors());
}

TEST(MapModeTest, SafetensorsTensorsAreTheSameCopiedOrMapped) {
  TempDir dir;
  const std::string data = random_bytes(24 + 4, 7);
  const std::string header =
      R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
      R"("b":{"dtype":"BF16","shape":[2],"data_offsets":[24,28]}})";
  std::string file(8, '\0');
  const uint64_t hl = header.size();
  std::memcpy(file.data(), &hl, 8);
  write_file(dir.file("model.safetensors"), file + header + data);
  auto m = open_safetensors_dir(dir.path());
  auto c = open_safetensors_dir(dir.path(), MapMode::kCopy);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  expect_same_tensors(*m, *c);
}

}  // namespace
}  // namespace larder::formats
