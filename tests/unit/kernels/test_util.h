// test_util.h — small helpers shared by the kernel tests.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "larder/core/dtype.h"

namespace larder::kernels::testing {

inline std::vector<float> randn(size_t n, std::mt19937_64& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

inline std::vector<uint8_t> read_bytes(const std::string& path, const char* fixture) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << path << " (fixture " << fixture << " did not run?)";
  return {std::istreambuf_iterator<char>(f), {}};
}

// The DType a fixture names by its GGUF type name (core/dtype.h dtype_name).
inline DType dtype_named(const std::string& s) {
  for (int i = 0; i < static_cast<int>(DType::kUnknown); ++i)
    if (s == dtype_name(static_cast<DType>(i))) return static_cast<DType>(i);
  ADD_FAILURE() << "unknown format " << s;
  return DType::kUnknown;
}

// One quantized matrix of a reference fixture (tests/ref/*_reference.py): its GGUF blocks
// (stem.bin) and gguf-py's own dequantization of them (stem.f32).
struct QuantCase {
  DType dtype = DType::kUnknown;
  int64_t rows = 0, cols = 0;
  std::string stem;
  std::vector<uint8_t> blocks;
  std::vector<float> deq;
};

// Every case listed in LARDER_TEST_DATA_DIR/subdir/index.json, written by `fixture`.
inline std::vector<QuantCase> quant_cases(const std::string& subdir, const char* fixture) {
  const std::string dir = std::string(LARDER_TEST_DATA_DIR) + "/" + subdir + "/";
  std::ifstream f(dir + "index.json");
  EXPECT_TRUE(f.good()) << "fixture " << fixture << " did not run";
  std::vector<QuantCase> out;
  if (!f.good()) return out;
  for (const auto& c : nlohmann::json::parse(f)) {
    QuantCase k;
    k.dtype = dtype_named(c["format"]);
    k.rows = c["rows"];
    k.cols = c["cols"];
    k.stem = c["stem"];
    k.blocks = read_bytes(dir + k.stem + ".bin", fixture);
    const std::vector<uint8_t> d = read_bytes(dir + k.stem + ".f32", fixture);
    k.deq.resize(d.size() / 4);
    std::memcpy(k.deq.data(), d.data(), d.size());
    out.push_back(std::move(k));
  }
  return out;
}

}  // namespace larder::kernels::testing
