// MapMode::kCopy (`--no-mmap`): the copy holds the file's bytes exactly, at a 2 MiB boundary, for
// every size (empty, under a page, across huge pages); GGUF and safetensors tensors read the same
// through either mode; a missing file is still named.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
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

// Writes `bytes` in 64 KiB write() calls, as a download does: the page cache then holds the
// file in folios no larger than one write, which map with 4 KiB pages.
void write_in_pieces(const std::string& path, const std::string& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0);
  for (size_t off = 0; off < bytes.size(); off += 65536) {
    const size_t n = std::min<size_t>(65536, bytes.size() - off);
    ASSERT_EQ(::write(fd, bytes.data() + off, n), static_cast<ssize_t>(n));
  }
  ::close(fd);
}

void drop_cache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ::fdatasync(fd);  // dirty pages are not dropped
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

void touch_all(const MappedFile& f) {
  volatile uint8_t sink = 0;
  for (size_t i = 0; i < f.size(); i += 4096) sink = sink + f.data()[i];
}

// A file cached by a write maps with 4 KiB pages; regroup_page_cache evicts it so a pass over the
// mapping reads it back in 2 MiB folios, keeps its bytes, and does not evict it a second time.
// Whether this kernel and filesystem read a file into 2 MiB folios at all is found independently
// first (cache dropped, read through a mapping); where they do not, the check must not evict.
TEST(MapModeTest, RegroupsAFileCachedByAWrite) {
  TempDir dir;
  const size_t n = (size_t{24} << 20) + 777;
  const std::string bytes = random_bytes(n, 5);
  const std::string path = dir.file("w");
  write_in_pieces(path, bytes);
  drop_cache(path);
  bool capable = false;
  {
    auto probe = MappedFile::open(path, MapMode::kMap);
    ASSERT_TRUE(probe.is_ok()) << probe.status().to_string();
    touch_all(**probe);
    capable = (*probe)->residency().huge >= (size_t{8} << 20);
  }
  write_in_pieces(path, bytes);  // rewritten: cached in small folios again
  auto f = MappedFile::open(path, MapMode::kMap);
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  touch_all(**f);
  const uint64_t huge_before = (*f)->residency().huge;
  const MappedFile::PageCacheCheck check = (*f)->regroup_page_cache();
  if (!capable) {
    EXPECT_NE(check, MappedFile::PageCacheCheck::kEvicted) << "THP off, or small folios on read here";
    GTEST_SKIP() << "this kernel or filesystem reads files into small folios";
  }
  EXPECT_LT(huge_before, size_t{8} << 20) << "a written file was expected in small folios";
  ASSERT_EQ(check, MappedFile::PageCacheCheck::kEvicted);
  touch_all(**f);
  EXPECT_GE((*f)->residency().huge, size_t{16} << 20);
  EXPECT_EQ(std::memcmp((*f)->data(), bytes.data(), n), 0);
  EXPECT_EQ((*f)->regroup_page_cache(), MappedFile::PageCacheCheck::kLarge);
  // A partly cached file: only spans 1 and 4 (of 12) stay cached, in small folios; the check
  // samples the resident spans, not fixed points of the file (which would all miss here).
  const std::string part = dir.file("p");
  write_in_pieces(part, bytes);
  {
    const int fd = ::open(part.c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    ::fdatasync(fd);
    const off_t mib = off_t{1} << 20;
    ::posix_fadvise(fd, 0, 2 * mib, POSIX_FADV_DONTNEED);
    ::posix_fadvise(fd, 4 * mib, 4 * mib, POSIX_FADV_DONTNEED);
    ::posix_fadvise(fd, 10 * mib, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
  auto p = MappedFile::open(part, MapMode::kMap);
  ASSERT_TRUE(p.is_ok());
  EXPECT_EQ((*p)->regroup_page_cache(), MappedFile::PageCacheCheck::kEvicted);
  // Not candidates: a copy, and a file under 8 MiB.
  auto copy = MappedFile::open(path, MapMode::kCopy);
  ASSERT_TRUE(copy.is_ok());
  EXPECT_EQ((*copy)->regroup_page_cache(), MappedFile::PageCacheCheck::kSkipped);
  const std::string small = dir.file("s");
  write_in_pieces(small, bytes.substr(0, size_t{6} << 20));
  auto s = MappedFile::open(small, MapMode::kMap);
  ASSERT_TRUE(s.is_ok());
  touch_all(**s);
  EXPECT_EQ((*s)->regroup_page_cache(), MappedFile::PageCacheCheck::kSkipped);
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
