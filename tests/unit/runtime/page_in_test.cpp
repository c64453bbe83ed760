// runtime::page_in_weights: a cold file is read into the page cache (every page resident after,
// by mincore) without staying mapped by the process (the mapping's Rss afterwards is what the
// caller had mapped, not the file), a warm file is left alone, and a file whose page cache a write
// filled in small folios is regrouped where the kernel reads files into 2 MiB folios.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "larder/core/mmap_file.h"
#include "larder/formats/tensor.h"
#include "larder/runtime/page_in.h"

namespace larder::runtime {
namespace {

class TempFile {
 public:
  explicit TempFile(size_t bytes) {
    char tmpl[] = "/tmp/larder_page_in_XXXXXX";
    const int fd = ::mkstemp(tmpl);
    path_ = tmpl;
    std::mt19937 rng(7);
    std::vector<char> piece(65536);
    for (size_t off = 0; off < bytes; off += piece.size()) {  // 64 KiB writes, as a download
      for (auto& c : piece) c = static_cast<char>(rng());
      const size_t n = std::min(piece.size(), bytes - off);
      EXPECT_EQ(::write(fd, piece.data(), n), static_cast<ssize_t>(n));
    }
    ::fdatasync(fd);
    ::close(fd);
  }
  ~TempFile() { std::filesystem::remove(path_); }
  const std::string& path() const { return path_; }
  void drop_cache() const {
    const int fd = ::open(path_.c_str(), O_RDONLY);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }

 private:
  std::string path_;
};

size_t resident_bytes(const MappedFile& f) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> v((f.size() + page - 1) / page);
  if (::mincore(const_cast<uint8_t*>(f.data()), f.size(), v.data()) != 0) return 0;
  size_t n = 0;
  for (unsigned char c : v) n += (c & 1) ? page : 0;
  return n;
}

formats::TensorSet one_file(const std::string& path) {
  formats::TensorSet ts;
  auto f = MappedFile::open(path, MapMode::kMap);
  EXPECT_TRUE(f.is_ok()) << f.status().to_string();
  if (f.is_ok()) ts.add_file(*f);
  return ts;
}

TEST(PageIn, ReadsAColdFileIntoTheCacheWithoutKeepingItMapped) {
  ::setenv("LARDER_PROGRESS", "0", 1);
  ::setenv("LARDER_PAGE_IN_MIN", "1", 1);  // 20 MiB cold is under the default 64 MiB
  const size_t n = (size_t{20} << 20) + 4321;
  TempFile file(n);
  file.drop_cache();
  formats::TensorSet ts = one_file(file.path());
  ASSERT_EQ(ts.files().size(), 1u);
  const MappedFile& f = *ts.files()[0];
  if (resident_bytes(f) >= n / 2) GTEST_SKIP() << "/tmp keeps the file cached (tmpfs): it cannot be made cold";
  const PageInStats st = page_in_weights(ts);
  EXPECT_TRUE(st.paged_in);
  EXPECT_GE(st.cold_bytes, n / 2);
  EXPECT_EQ(st.mapped_bytes, n);
  EXPECT_GE(resident_bytes(f), n / 4096 * 4096) << "every page in the page cache";
  EXPECT_LT(f.residency().resident, size_t{4} << 20) << "the page-in unmaps what it read";
  // Warm now: nothing to read.
  const PageInStats again = page_in_weights(ts);
  EXPECT_FALSE(again.paged_in);
  EXPECT_EQ(again.cold_bytes, 0u);
  ::unsetenv("LARDER_PAGE_IN_MIN");
}

// A file whose page cache was filled by its write: where this kernel reads a dropped file back in
// 2 MiB folios (checked first, independently), the page-in regroups it and a pass over the
// weights then maps most of it with 2 MiB pages.
TEST(PageIn, RegroupsAFileCachedByItsWrite) {
  ::setenv("LARDER_PROGRESS", "0", 1);
  const size_t n = size_t{24} << 20;
  bool capable = false;
  {
    TempFile probe(n);
    probe.drop_cache();
    formats::TensorSet ts = one_file(probe.path());
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < n; i += 4096) sink = sink + ts.files()[0]->data()[i];
    capable = ts.files()[0]->residency().huge >= (size_t{8} << 20);
  }
  if (!capable) GTEST_SKIP() << "this kernel or filesystem reads files into small folios";
  TempFile file(n);  // written: its cache is in small folios
  formats::TensorSet ts = one_file(file.path());
  const PageInStats st = page_in_weights(ts);
  EXPECT_EQ(st.regrouped, 1);
  EXPECT_TRUE(st.paged_in);
  const MappedFile& f = *ts.files()[0];
  volatile uint8_t sink = 0;
  for (size_t i = 0; i < n; i += 4096) sink = sink + f.data()[i];
  EXPECT_GE(f.residency().huge, size_t{16} << 20);
  EXPECT_EQ(page_in_weights(ts).regrouped, 0) << "regrouped once, not at every load";
}

}  // namespace
}  // namespace larder::runtime
