// kv_test_util.h — synthetic model states for KV-store tests.
//
// A "model" here writes, for token t at position pos of layer l, K/V rows whose values are a
// pure function of (l, pos, t, j) — so any byte that reaches the wrong sequence, position or
// layer is detectable, and a restored state can be compared with a fresh prefill exactly.
#pragma once

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "larder/memory/store/entry.h"

namespace larder::memory::testing {

inline const KvLayout kLayout{2, 2, 4};  // 2 layers, 2 KV heads, head_dim 4
inline constexpr int64_t kCtx = 4096;

struct Kinds {
  bool ring = false;
  int64_t window = 16;
  bool recurrent = false;
  bool attachment = false;
};

inline float kv_val(int layer, int64_t pos, int32_t tok, int64_t j, bool is_v) {
  uint32_t h = static_cast<uint32_t>(layer) * 2654435761u ^ static_cast<uint32_t>(pos) * 40503u ^
               static_cast<uint32_t>(tok) * 2246822519u ^ static_cast<uint32_t>(j) * 3266489917u ^ (is_v ? 0x9e37u : 0u);
  h ^= h >> 15;
  h *= 0x2c1b3c6du;
  h ^= h >> 12;
  return static_cast<float>(h & 0xffffff) / 16777216.0f - 0.5f;
}

inline std::vector<int32_t> seq(int32_t from, int n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<size_t>(i)] = from + i;
  return v;
}
inline std::vector<int32_t> cat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// "Prefill" tokens[from, size) into s.
inline void extend(SequenceState& s, const std::vector<int32_t>& tokens, int64_t from) {
  const int64_t n = static_cast<int64_t>(tokens.size()) - from;
  if (n <= 0) return;
  const KvLayout& L = s.kv.layout();
  if (L.n_layers > 0) {
    ASSERT_TRUE(s.kv.reserve(n).is_ok());
    for (int64_t pos = from; pos < from + n; ++pos) {
      for (int l = 0; l < L.n_layers; ++l) {
        float* k = static_cast<float*>(s.kv.k_row(l, pos));
        float* v = static_cast<float*>(s.kv.v_row(l, pos));
        for (int64_t j = 0; j < L.row_floats(); ++j) {
          k[j] = kv_val(l, pos, tokens[static_cast<size_t>(pos)], j, false);
          v[j] = kv_val(l, pos, tokens[static_cast<size_t>(pos)], j, true);
        }
      }
    }
    s.kv.advance(n);
  }
  for (auto& ls : s.layers) {
    for (int64_t pos = from; pos < from + n; ++pos) {
      const int32_t t = tokens[static_cast<size_t>(pos)];
      if (auto* r = dynamic_cast<RingState*>(ls.get())) {
        std::vector<float> k(8), v(8);
        for (int j = 0; j < 8; ++j) {
          k[j] = kv_val(100, pos, t, j, false);
          v[j] = kv_val(100, pos, t, j, true);
        }
        r->append(k.data(), v.data());
      } else if (auto* rc = dynamic_cast<RecurrentState*>(ls.get())) {
        std::vector<float> x(6);
        for (int j = 0; j < 6; ++j) x[j] = kv_val(200, pos, t, j, false);
        rc->absorb(x.data());
      }
    }
  }
}

inline SequenceState fresh(const Kinds& k, const KvLayout& layout = kLayout) {
  SequenceState s(layout, kCtx);
  if (k.ring) s.layers.push_back(std::make_unique<RingState>(k.window, 2, 4));
  if (k.recurrent) s.layers.push_back(std::make_unique<RecurrentState>(4, 6, 2, 3, 3));
  if (k.attachment) {
    Attachment a;
    a.schema = "mtp.v1";
    a.metadata = {{"depth", 1}};
    a.tensors.push_back(StateTensor::from_floats("draft", {3, 5}, std::vector<float>(15, 0.25f)));
    s.attachments.push_back(std::move(a));
  }
  return s;
}

inline SequenceState prefilled(const std::vector<int32_t>& tokens, const Kinds& k = {}, const KvLayout& layout = kLayout) {
  SequenceState s = fresh(k, layout);
  extend(s, tokens, 0);
  return s;
}

// Every KV row in [0, upto) of `cache` equals what a fresh prefill of `tokens` writes.
inline ::testing::AssertionResult kv_matches(const KvCache& cache, const std::vector<int32_t>& tokens, int64_t upto) {
  const KvLayout& L = cache.layout();
  std::vector<KvSpan> spans;
  for (int l = 0; l < L.n_layers; ++l) {
    cache.spans(l, upto, &spans);
    int64_t covered = 0;
    for (const KvSpan& s : spans) {
      if (s.start != covered) return ::testing::AssertionFailure() << "span gap at " << covered;
      for (int64_t i = 0; i < s.len; ++i) {
        const int64_t pos = s.start + i;
        for (int64_t j = 0; j < L.row_floats(); ++j) {
          const float ek = kv_val(l, pos, tokens[static_cast<size_t>(pos)], j, false);
          const float ev = kv_val(l, pos, tokens[static_cast<size_t>(pos)], j, true);
          if (std::memcmp(&s.k_f32()[i * L.row_floats() + j], &ek, 4) != 0 ||
              std::memcmp(&s.v_f32()[i * L.row_floats() + j], &ev, 4) != 0)
            return ::testing::AssertionFailure() << "layer " << l << " pos " << pos << " j " << j << " differs";
        }
      }
      covered += s.len;
    }
    if (covered != upto) return ::testing::AssertionFailure() << "spans cover " << covered << " of " << upto;
  }
  return ::testing::AssertionSuccess();
}

// Same check through a KvPrefix directly.
inline ::testing::AssertionResult prefix_matches(const KvPrefix& p, const std::vector<int32_t>& tokens, int64_t upto) {
  KvCache c(p.layout(), kCtx);
  struct Alias final : KvPrefix {
    const KvPrefix* p;
    explicit Alias(const KvPrefix* x) : p(x) {}
    const KvLayout& layout() const override { return p->layout(); }
    int64_t tokens() const override { return p->tokens(); }
    const void* k(int l) const override { return p->k(l); }
    const void* v(int l) const override { return p->v(l); }
    void prefix_spans(int l, int64_t u, std::vector<KvSpan>* o) const override { p->prefix_spans(l, u, o); }
  };
  c.attach_prefix(std::make_shared<Alias>(&p), upto);
  return kv_matches(c, tokens, upto);
}

// A fresh temp directory, removed at scope exit.
struct TempDir {
  std::string path;
  TempDir() {
    char buf[] = "/tmp/larder-kv-XXXXXX";
    path = ::mkdtemp(buf);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

inline size_t count_files(const std::string& dir, const std::string& suffix) {
  size_t n = 0;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    const std::string p = it->path().string();
    if (p.size() >= suffix.size() && p.compare(p.size() - suffix.size(), suffix.size(), suffix) == 0) ++n;
  }
  return n;
}

inline std::vector<std::string> list_files(const std::string& dir, const std::string& suffix) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    const std::string p = it->path().string();
    if (p.size() >= suffix.size() && p.compare(p.size() - suffix.size(), suffix.size(), suffix) == 0) out.push_back(p);
  }
  return out;
}

}  // namespace larder::memory::testing
