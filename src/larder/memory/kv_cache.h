// kv_cache.h — one sequence's attention KV for every layer.
//
// Layout per layer: K and V rows, token-major [tokens, n_kv_heads, head_dim] in the layout's KV
// dtype (f32, f16 — the default of the CLI and server — or q8_0 blocks of 32 along head_dim;
// kernels/ops.h "KV row formats"). Rows are opaque bytes here; attention widens them. Token-major
// makes appending a token one contiguous write, makes a trim a length change, and makes any
// prefix a contiguous leading byte range — the unit the KV store shares between requests and
// writes to disk.
//
// Attention reads a layer as a list of spans (`KvSpan`), not one pointer: a sequence restored
// from the KV store reads a shared, immutable prefix segment (owned by the store, never copied)
// followed by its own private tail. A fresh sequence has one span.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "larder/core/dtype.h"
#include "larder/core/status.h"

namespace larder::memory {

// Which memory a storage handle points into. Every state is host memory today; the tag exists so
// a GPU backend can own KV memory later without changing how the store adopts, views and
// persists states (a device handle is staged to the host by whoever writes it to a file).
enum class Device : uint8_t { kCpu = 0 };

struct KvLayout {
  int n_layers = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  DType dtype = DType::kF32;  // of the stored rows: kF32, kF16 or kQ8_0
  // Elements of one K (or V) row.
  int64_t row_floats() const { return static_cast<int64_t>(n_kv_heads) * head_dim; }
  // Bytes of one K (or V) row in `dtype`.
  int64_t row_bytes() const { return static_cast<int64_t>(dtype_bytes(dtype, static_cast<uint64_t>(row_floats()))); }
  bool operator==(const KvLayout&) const = default;
};

// The KV dtype as the storage signature and the CLI spell it ("f32", "f16", "q8_0").
const char* kv_dtype_tag(DType dt);
// "f32" / "f16" / "q8_0" → DType; invalid_argument for anything else.
Result<DType> parse_kv_dtype(const std::string& s);

// Contiguous rows for tokens [start, start + len) of one layer, [len, n_kv_heads, head_dim] in
// `dtype` (plain KV in its layout's dtype; a ring's rows are f32).
struct KvSpan {
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t start = 0;
  int64_t len = 0;
  DType dtype = DType::kF32;
  // The rows as floats; only for f32 spans (ring rows, f32 plain KV).
  const float* k_f32() const { return dtype == DType::kF32 ? static_cast<const float*>(k) : nullptr; }
  const float* v_f32() const { return dtype == DType::kF32 ? static_cast<const float*>(v) : nullptr; }
};

// An immutable block of KV rows for tokens [0, tokens) of every layer, shareable between
// sequences (the KV store hands these out; RAII via shared_ptr keeps the donor alive).
class KvPrefix {
 public:
  virtual ~KvPrefix() = default;
  virtual const KvLayout& layout() const = 0;
  virtual int64_t tokens() const = 0;
  virtual const void* k(int layer) const = 0;  // [tokens, n_kv_heads, head_dim] in layout().dtype
  virtual const void* v(int layer) const = 0;
  // Appends the rows of [0, upto) of `layer` as contiguous spans, oldest first (upto <= tokens()).
  // Default: one span from k()/v(). Segmented prefixes (the KV store's KvBlock, which shares
  // segments between entries and aliases mmap'd files — kv-store.md §11.2) override this so
  // attention reads them without consolidation.
  virtual void prefix_spans(int layer, int64_t upto, std::vector<KvSpan>* out) const;
};

class KvCache {
 public:
  // max_tokens: the context limit; memory grows on demand up to it.
  KvCache(const KvLayout& layout, int64_t max_tokens);
  KvCache(KvCache&&) = default;
  KvCache& operator=(KvCache&&) = default;

  const KvLayout& layout() const { return layout_; }
  Device device() const { return Device::kCpu; }  // the private rows' memory
  int64_t length() const { return length_; }
  int64_t max_tokens() const { return max_tokens_; }

  // Makes room for positions [length, length + n). Fails (resource_exhausted) past max_tokens.
  Status reserve(int64_t n);
  // Row pointers for writing new positions (pos >= prefix_tokens(), pos < length + reserved):
  // layout().row_bytes() bytes in layout().dtype.
  void* k_row(int layer, int64_t pos);
  void* v_row(int layer, int64_t pos);
  // Publish positions [length, new_length) after every layer has written them.
  void advance(int64_t n);
  // Drop positions >= n (n <= length). Trimming into a shared prefix detaches it (copy).
  void trim(int64_t n);

  // Spans covering [0, upto) of `layer` (upto <= length + reserved), oldest first.
  void spans(int layer, int64_t upto, std::vector<KvSpan>* out) const;

  // Start from a shared prefix (tokens [0, p)); the cache must be empty. Zero-copy.
  void attach_prefix(std::shared_ptr<const KvPrefix> prefix, int64_t p);
  int64_t prefix_tokens() const { return prefix_len_; }
  const std::shared_ptr<const KvPrefix>& prefix() const { return prefix_; }

  // Bytes this cache owns (excludes a shared prefix).
  size_t owned_bytes() const;
  // Rows allocated per layer for the private tail (>= length() - prefix_tokens()).
  int64_t tail_capacity() const { return tail_capacity_; }

  // Moves everything out of the cache for the KV store's put (no copy of the private rows):
  // the shared prefix, its length, and the per-layer tail rows [prefix_len, length). The cache
  // is left empty (length 0, no prefix) and reusable.
  struct Released {
    std::shared_ptr<const KvPrefix> prefix;
    int64_t prefix_len = 0;
    int64_t length = 0;
    int64_t tail_capacity = 0;
    std::vector<std::vector<uint8_t>> k, v;  // per layer: [tail_capacity, row bytes]
  };
  Released release();

 private:
  void detach_prefix();
  KvLayout layout_;
  int64_t max_tokens_ = 0;
  int64_t length_ = 0;
  std::shared_ptr<const KvPrefix> prefix_;
  int64_t prefix_len_ = 0;
  int64_t tail_capacity_ = 0;                 // rows allocated per layer for the private tail
  std::vector<std::vector<uint8_t>> k_, v_;   // per layer: [tail_capacity, row bytes]
};

}  // namespace larder::memory
