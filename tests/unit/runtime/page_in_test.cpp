// sample_huge_pages: whole 2 MiB spans of mapped files only (a copy is skipped), never more huge
// spans than spans, and nothing under LARDER_PAGE_IN=0.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "larder/core/mmap_file.h"
#include "larder/runtime/page_in.h"

namespace larder::runtime {
namespace {

struct TempFile {
  std::string path;
  explicit TempFile(size_t bytes) {
    char tmpl[] = "/tmp/larder_page_in_XXXXXX";
    const int fd = ::mkstemp(tmpl);
    path = tmpl;
    std::string chunk(1 << 20, '\x5a');
    for (size_t done = 0; done < bytes; done += chunk.size())
      if (::write(fd, chunk.data(), std::min(chunk.size(), bytes - done)) < 0) break;
    ::close(fd);
  }
  ~TempFile() { std::filesystem::remove(path); }
};

formats::TensorSet set_of(const std::string& path, MapMode mode) {
  formats::TensorSet set;
  auto f = MappedFile::open(path, mode);
  EXPECT_TRUE(f.is_ok()) << f.status().to_string();
  if (f.is_ok()) set.add_file(*f);
  return set;
}

TEST(PageIn, SamplesWholeSpansOfMappedFilesOnly) {
  const TempFile file((size_t{70} << 20) + 12345);  // 35 whole 2 MiB spans and a partial one
  const HugePageSample mapped = sample_huge_pages(set_of(file.path, MapMode::kMap));
  // 0 where the kernel has transparent huge pages off.
  EXPECT_TRUE(mapped.spans == 35 || mapped.spans == 0) << mapped.spans;
  EXPECT_LE(mapped.huge_spans, mapped.spans);
  EXPECT_EQ(sample_huge_pages(set_of(file.path, MapMode::kCopy)).spans, 0u);

  ::setenv("LARDER_PAGE_IN", "0", 1);
  EXPECT_EQ(sample_huge_pages(set_of(file.path, MapMode::kMap)).spans, 0u);
  ::unsetenv("LARDER_PAGE_IN");
}

}  // namespace
}  // namespace larder::runtime
