#include "larder/memory/kv_cache.h"

#include <algorithm>
#include <cstring>

namespace larder::memory {

const char* kv_dtype_tag(DType dt) {
  switch (dt) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kQ8_0: return "q8_0";
    default: return "?";
  }
}

Result<DType> parse_kv_dtype(const std::string& s) {
  for (DType dt : {DType::kF32, DType::kF16, DType::kQ8_0})
    if (s == kv_dtype_tag(dt)) return dt;
  return invalid_argument(strfmt("[kv] unknown KV cache type '%s' (use f32, f16 or q8_0)", s.c_str()));
}

KvCache::KvCache(const KvLayout& layout, int64_t max_tokens)
    : layout_(layout), max_tokens_(max_tokens), k_(layout.n_layers), v_(layout.n_layers) {}

Status KvCache::reserve(int64_t n) {
  const int64_t need = length_ + n;
  if (need > max_tokens_) {
    return Status(StatusCode::kResourceExhausted,
                  strfmt("[kv] sequence of %lld tokens exceeds the context of %lld tokens",
                         static_cast<long long>(need), static_cast<long long>(max_tokens_)));
  }
  const int64_t tail_need = need - prefix_len_;
  if (tail_need <= tail_capacity_) return Status::ok();
  // Grow geometrically (amortized O(1) per token) but never past the context limit.
  int64_t cap = std::max<int64_t>({tail_need, tail_capacity_ * 2, 64});
  cap = std::min<int64_t>(cap, max_tokens_ - prefix_len_);
  const size_t bytes = static_cast<size_t>(cap * layout_.row_bytes());
  for (int l = 0; l < layout_.n_layers; ++l) {
    k_[l].resize(bytes);
    v_[l].resize(bytes);
  }
  tail_capacity_ = cap;
  return Status::ok();
}

void* KvCache::k_row(int layer, int64_t pos) {
  LARDER_DCHECK(pos >= prefix_len_ && pos - prefix_len_ < tail_capacity_, "pos %lld", (long long)pos);
  return k_[layer].data() + (pos - prefix_len_) * layout_.row_bytes();
}

void* KvCache::v_row(int layer, int64_t pos) {
  LARDER_DCHECK(pos >= prefix_len_ && pos - prefix_len_ < tail_capacity_, "pos %lld", (long long)pos);
  return v_[layer].data() + (pos - prefix_len_) * layout_.row_bytes();
}

void KvCache::advance(int64_t n) {
  LARDER_CHECK(length_ + n - prefix_len_ <= tail_capacity_, "advance past reserved rows");
  length_ += n;
}

void KvCache::trim(int64_t n) {
  LARDER_CHECK(n >= 0 && n <= length_, "trim to %lld of %lld", (long long)n, (long long)length_);
  if (n < prefix_len_) {
    // Keep only part of the shared prefix: copy it into private rows, since the donor's rows
    // past n must stay untouched for its other readers.
    detach_prefix();
  }
  length_ = n;
}

void KvCache::detach_prefix() {
  if (!prefix_) return;
  const int64_t p = prefix_len_;
  const int64_t row = layout_.row_bytes();
  const int64_t tail_len = length_ - p;
  const int64_t cap = std::max<int64_t>(length_, 64);
  std::vector<KvSpan> parts;
  for (int l = 0; l < layout_.n_layers; ++l) {
    std::vector<uint8_t> nk(static_cast<size_t>(cap * row)), nv(static_cast<size_t>(cap * row));
    // Through prefix_spans, not k()/v(): a segmented prefix has no single contiguous pointer.
    parts.clear();
    prefix_->prefix_spans(l, p, &parts);
    for (const KvSpan& s : parts) {
      std::memcpy(nk.data() + s.start * row, s.k, static_cast<size_t>(s.len * row));
      std::memcpy(nv.data() + s.start * row, s.v, static_cast<size_t>(s.len * row));
    }
    if (tail_len > 0) {
      std::memcpy(nk.data() + p * row, k_[l].data(), static_cast<size_t>(tail_len * row));
      std::memcpy(nv.data() + p * row, v_[l].data(), static_cast<size_t>(tail_len * row));
    }
    k_[l] = std::move(nk);
    v_[l] = std::move(nv);
  }
  tail_capacity_ = cap;
  prefix_.reset();
  prefix_len_ = 0;
}

void KvCache::spans(int layer, int64_t upto, std::vector<KvSpan>* out) const {
  out->clear();
  const int64_t from_prefix = std::min(upto, prefix_len_);
  if (from_prefix > 0) prefix_->prefix_spans(layer, from_prefix, out);
  if (upto > prefix_len_) {
    out->push_back({k_[layer].data(), v_[layer].data(), prefix_len_, upto - prefix_len_, layout_.dtype});
  }
}

void KvPrefix::prefix_spans(int layer, int64_t upto, std::vector<KvSpan>* out) const {
  if (upto > 0) out->push_back({k(layer), v(layer), 0, upto, layout().dtype});
}

KvCache::Released KvCache::release() {
  Released r;
  r.prefix = std::move(prefix_);
  r.prefix_len = prefix_len_;
  r.length = length_;
  r.tail_capacity = tail_capacity_;
  r.k = std::move(k_);
  r.v = std::move(v_);
  prefix_.reset();
  prefix_len_ = 0;
  length_ = 0;
  tail_capacity_ = 0;
  k_.assign(layout_.n_layers, {});
  v_.assign(layout_.n_layers, {});
  return r;
}

void KvCache::attach_prefix(std::shared_ptr<const KvPrefix> prefix, int64_t p) {
  LARDER_CHECK(length_ == 0 && prefix && p <= prefix->tokens() && prefix->layout() == layout_,
               "attach_prefix needs an empty cache and a compatible prefix");
  prefix_ = std::move(prefix);
  prefix_len_ = p;
  length_ = p;
  tail_capacity_ = 0;
  // Free (not just clear) old rows: owned_bytes() reports capacity, and an attached sequence
  // must not keep a previous tail's memory alive.
  for (int l = 0; l < layout_.n_layers; ++l) {
    std::vector<uint8_t>().swap(k_[l]);
    std::vector<uint8_t>().swap(v_[l]);
  }
}

size_t KvCache::owned_bytes() const {
  size_t n = 0;
  for (int l = 0; l < layout_.n_layers; ++l) n += k_[l].capacity() + v_[l].capacity();
  return n;
}

}  // namespace larder::memory
