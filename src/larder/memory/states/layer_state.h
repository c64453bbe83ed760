// layer_state.h — the cache-state model of the KV store (kv-store.md §2.6, §5).
//
// A sequence's model state is: one KvCache holding every plain (full-attention) layer, plus a
// list of non-plain layer states (sliding-window rings, recurrent state) and method
// attachments. Plain KV lives in KvCache because attention is written against it; every other
// kind implements `LayerState`, a small interface that carries exactly what the store's rules
// need: offset, trimmability, floor, honest resident bytes, a storage signature, zero-copy
// views (copy-on-write), trim, and the tensors + parameters that persist it in an LKV1 file.
// Real sliding-window and recurrent models implement this interface; RingState and
// RecurrentState below are the reference kinds (exercised by synthetic tests today).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "larder/core/dtype.h"
#include "larder/core/status.h"
#include "larder/memory/kv_cache.h"

namespace larder::memory {

enum class StateKind : uint8_t { kPlainKv = 0, kRing = 1, kRecurrent = 2 };
const char* state_kind_name(StateKind k);
Result<StateKind> parse_state_kind(const std::string& s);

// Where a byte lives (kv-store.md §11.5 buckets): anonymous memory or a file mapping.
enum class Backing : uint8_t { kAnon, kMapped };

// One physical storage chunk a state references. `id` identifies the chunk so shared chunks
// (a donor and its views, two entries sharing a segment) are counted once.
struct StorageRef {
  const void* id = nullptr;
  size_t bytes = 0;
  Backing backing = Backing::kAnon;
  Device device = Device::kCpu;
};
// Σ bytes over distinct ids.
size_t distinct_bytes(const std::vector<StorageRef>& refs, Backing backing);

// An immutable, contiguous tensor view with shared ownership of its storage (a heap buffer,
// or a file mapping). Copying the struct is a zero-copy view.
struct StateTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // outermost first
  const uint8_t* data = nullptr;
  size_t bytes = 0;
  std::shared_ptr<const void> owner;  // keeps `data` alive
  Backing backing = Backing::kAnon;
  Device device = Device::kCpu;

  int64_t elements() const;
  // Owning deep copy on the heap (used to restore mutable kinds from a mapping).
  static StateTensor copy_of(const StateTensor& t);
  static StateTensor from_floats(std::string name, std::vector<int64_t> shape, std::vector<float> data);
};

class LayerState {
 public:
  virtual ~LayerState() = default;
  virtual StateKind kind() const = 0;
  // Storage signature: kind, dtype and layout parameters that must match for the state to be
  // reused by the same model ("ring:f32:w=1024:h=8:d=128"). Part of the entry identity.
  virtual std::string signature() const = 0;
  virtual int64_t offset() const = 0;  // tokens absorbed
  virtual bool trimmable() const = 0;
  // kv-store.md §2.3: smallest prefix at which trimming yields what a fresh prefill would store.
  virtual int64_t min_reusable_offset() const { return 0; }
  virtual void storage(std::vector<StorageRef>* out) const = 0;
  size_t resident_bytes() const;
  // Zero-copy view; the view's first write copies (copy-on-write, kv-store.md §4).
  virtual std::unique_ptr<LayerState> view() const = 0;
  // Forget the last n tokens. unsupported when !trimmable().
  virtual Status trim(int64_t n) = 0;
  // Persistence: parameters (JSON object) and tensors, restored by restore_layer_state().
  virtual nlohmann::json params() const = 0;
  virtual std::vector<StateTensor> tensors() const = 0;
};

// Rebuilds a layer state from persisted params and tensors. Mutable kinds copy the tensor bytes
// (kv-store.md §11.2: "ring and recurrent states are small and mutated in place: copied at
// restore"). Validates every shape; returns corrupt on any mismatch.
Result<std::unique_ptr<LayerState>> restore_layer_state(StateKind kind, const nlohmann::json& params,
                                                        const std::vector<StateTensor>& tensors);

// Copy-on-write float buffer shared between a frozen state and its views.
class CowBuffer {
 public:
  CowBuffer() = default;
  explicit CowBuffer(size_t n) : p_(std::make_shared<std::vector<float>>(n, 0.0f)) {}
  explicit CowBuffer(std::vector<float> v) : p_(std::make_shared<std::vector<float>>(std::move(v))) {}
  const float* data() const { return p_ ? p_->data() : nullptr; }
  size_t size() const { return p_ ? p_->size() : 0; }
  // Private storage before a write: copies if anyone else can read these bytes. A use_count of 1
  // means no other owner exists and none can appear (only we can copy p_), so it is race-free.
  float* mutable_data();
  std::shared_ptr<const void> owner() const { return p_; }
  const void* id() const { return p_.get(); }

 private:
  std::shared_ptr<std::vector<float>> p_;
};

// Sliding-window ring (kind kRing): K/V rows [window, n_heads, head_dim] f32, a write index and
// the offset. Trimmable only while it has never wrapped (offset < window): after a wrap the
// evicted rows are gone and trimming cannot recreate them (kv-store.md §2.6; mlx-lm #118).
class RingState final : public LayerState {
 public:
  RingState(int64_t window, int n_heads, int head_dim);
  // Appends one token's K and V rows (n_heads * head_dim floats each).
  void append(const float* k, const float* v);
  // Appends n tokens' rows (k, v: [n, n_heads, head_dim]); only the last min(n, window) are
  // written, the rest would be overwritten within this call anyway.
  void append_rows(const float* k, const float* v, int64_t n);
  // Rows of token positions [from, offset()) as contiguous spans, oldest first: at most two (the
  // part before the write index wraps to the ring's start). from >= offset() - window().
  void spans(int64_t from, std::vector<KvSpan>* out) const;
  int n_heads() const { return n_heads_; }
  int head_dim() const { return head_dim_; }
  // Forget everything (offset 0), wrapped or not: a fresh sequence reusing the buffers.
  void reset() { index_ = offset_ = 0; }
  const float* k_row(int64_t slot) const { return k_.data() + slot * row(); }
  const float* v_row(int64_t slot) const { return v_.data() + slot * row(); }
  int64_t window() const { return window_; }
  int64_t ring_index() const { return index_; }

  StateKind kind() const override { return StateKind::kRing; }
  std::string signature() const override;
  int64_t offset() const override { return offset_; }
  bool trimmable() const override { return offset_ < window_; }
  void storage(std::vector<StorageRef>* out) const override;
  std::unique_ptr<LayerState> view() const override;
  Status trim(int64_t n) override;
  nlohmann::json params() const override;
  std::vector<StateTensor> tensors() const override;

 private:
  friend Result<std::unique_ptr<LayerState>> restore_layer_state(StateKind, const nlohmann::json&,
                                                                 const std::vector<StateTensor>&);
  int64_t row() const { return static_cast<int64_t>(n_heads_) * head_dim_; }
  int64_t window_;
  int n_heads_, head_dim_;
  int64_t index_ = 0, offset_ = 0;
  CowBuffer k_, v_;
};

// Recurrent state (kind kRecurrent; SSM / gated DeltaNet shape): conv state [conv_k-1, conv_dim]
// (the last conv_k-1 conv inputs, oldest first) and a recurrent matrix [n_heads, dv, dk] (one
// [dv, dk] matrix per value head: kernels/gated_delta.h's orientation), both f32, constant size.
// Never trimmable: the state after t tokens cannot be recovered from the state after t+n
// (entries match only whole).
//
// A model layer writes it in place like a ring absorbs rows: its kernels update conv_mut() and
// matrix_mut() (each a private copy first if a store entry or view still shares the bytes), then
// advance(n) counts the tokens they absorbed.
class RecurrentState final : public LayerState {
 public:
  RecurrentState(int conv_k, int conv_dim, int n_heads, int dk, int dv);
  // Synthetic update with one token's input (conv_dim floats): shifts the conv window and folds
  // the input into the matrix (the store's tests; models write through conv_mut/matrix_mut).
  void absorb(const float* x);
  const float* conv() const { return conv_.data(); }
  const float* matrix() const { return mat_.data(); }
  // Writable views for the layer's kernels (copy-on-write: the first write after a view() or a
  // store put copies, so what the store holds never changes under a running sequence).
  float* conv_mut() { return conv_.mutable_data(); }
  float* matrix_mut() { return mat_.mutable_data(); }
  // The layer's kernels absorbed n more tokens into conv and matrix.
  void advance(int64_t n) { offset_ += n; }
  // Back to the initial (zero) state.
  void reset();
  int conv_k() const { return conv_k_; }
  int conv_dim() const { return conv_dim_; }
  int n_heads() const { return n_heads_; }
  int dk() const { return dk_; }
  int dv() const { return dv_; }

  StateKind kind() const override { return StateKind::kRecurrent; }
  std::string signature() const override;
  int64_t offset() const override { return offset_; }
  bool trimmable() const override { return false; }
  void storage(std::vector<StorageRef>* out) const override;
  std::unique_ptr<LayerState> view() const override;
  Status trim(int64_t n) override;
  nlohmann::json params() const override;
  std::vector<StateTensor> tensors() const override;

 private:
  friend Result<std::unique_ptr<LayerState>> restore_layer_state(StateKind, const nlohmann::json&,
                                                                 const std::vector<StateTensor>&);
  int conv_k_, conv_dim_, n_heads_, dk_, dv_;
  int64_t offset_ = 0;
  CowBuffer conv_, mat_;
};

// Method state attached to an entry (draft/MTP state, method recurrent state; kv-store.md §5).
// Never trimmable: any attachment makes its entry need an exact boundary.
struct Attachment {
  std::string schema;
  nlohmann::json metadata = nlohmann::json::object();
  std::vector<StateTensor> tensors;
  size_t bytes() const;
  void storage(std::vector<StorageRef>* out) const;
};

}  // namespace larder::memory
