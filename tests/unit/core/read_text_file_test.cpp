// core/mmap_file.h read_text_file: whole small files, never an unbounded read.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>

#include "larder/core/mmap_file.h"

namespace larder {
namespace {

std::string temp_file_with(const std::string& bytes) {
  char path[] = "/tmp/larder-read-text-XXXXXX";
  const int fd = ::mkstemp(path);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(::write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  ::close(fd);
  return path;
}

TEST(ReadTextFile, ReadsAWholeFileUpToTheCapAndRefusesOneBytePast) {
  const std::string text(1000, 'x');
  const std::string path = temp_file_with(text);
  auto whole = read_text_file(path);
  ASSERT_TRUE(whole.is_ok()) << whole.status().message();
  EXPECT_EQ(*whole, text);
  auto at_cap = read_text_file(path, 1000);
  ASSERT_TRUE(at_cap.is_ok()) << at_cap.status().message();
  EXPECT_EQ(*at_cap, text);
  auto past = read_text_file(path, 999);
  ASSERT_FALSE(past.is_ok());
  EXPECT_NE(past.status().message().find("longer than 999 bytes"), std::string::npos) << past.status().message();
  std::remove(path.c_str());
}

TEST(ReadTextFile, AnEndlessDeviceStopsAtTheCapPromptly) {
  const auto t0 = std::chrono::steady_clock::now();
  auto r = read_text_file("/dev/zero", uint64_t{8} << 20);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("/dev/zero"), std::string::npos) << r.status().message();
  EXPECT_LT(s, 10.0);
}

TEST(ReadTextFile, MissingFileIsNotFound) {
  auto r = read_text_file("/tmp/larder-read-text-does-not-exist");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace larder
