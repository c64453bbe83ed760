#include "larder/memory/states/kv_block.h"

#include <cstring>

namespace larder::memory {

KvBlock::KvBlock(const KvLayout& layout, std::vector<Piece> pieces)
    : layout_(layout), pieces_(std::move(pieces)) {
  for (const Piece& p : pieces_) {
    LARDER_CHECK(p.start == tokens_ && p.len > 0 && p.seg_row + p.len <= p.seg->rows,
                 "KvBlock pieces must be contiguous and inside their segments");
    tokens_ += p.len;
  }
}

namespace {

struct HeapRows {
  std::vector<std::vector<uint8_t>> k, v;
};

// Pieces of `prefix` covering [0, upto).
void prefix_pieces(const std::shared_ptr<const KvPrefix>& prefix, int64_t upto,
                   std::vector<KvBlock::Piece>* out) {
  if (!prefix || upto <= 0) return;
  if (auto block = std::dynamic_pointer_cast<const KvBlock>(prefix)) {
    for (const KvBlock::Piece& p : block->pieces()) {
      if (p.start >= upto) break;
      KvBlock::Piece q = p;
      q.len = std::min(p.len, upto - p.start);
      out->push_back(q);
    }
    return;
  }
  // A foreign KvPrefix: alias it as one segment that keeps the prefix alive.
  auto seg = std::make_shared<KvSegment>();
  const KvLayout& L = prefix->layout();
  for (int l = 0; l < L.n_layers; ++l) {
    seg->k.push_back(static_cast<const uint8_t*>(prefix->k(l)));
    seg->v.push_back(static_cast<const uint8_t*>(prefix->v(l)));
  }
  seg->rows = prefix->tokens();
  seg->bytes = 0;  // not ours to account: owned by whoever built that prefix
  seg->owner = prefix;
  out->push_back({seg, 0, 0, upto});
}

}  // namespace

std::shared_ptr<const KvBlock> KvBlock::adopt(KvCache&& cache) {
  const KvLayout layout = cache.layout();
  KvCache::Released r = cache.release();
  std::vector<Piece> pieces;
  prefix_pieces(r.prefix, r.prefix_len, &pieces);
  const int64_t tail = r.length - r.prefix_len;
  if (tail > 0) {
    auto rows = std::make_shared<HeapRows>();
    rows->k = std::move(r.k);
    rows->v = std::move(r.v);
    auto seg = std::make_shared<KvSegment>();
    size_t bytes = 0;
    for (int l = 0; l < layout.n_layers; ++l) {
      seg->k.push_back(rows->k[l].data());
      seg->v.push_back(rows->v[l].data());
      bytes += rows->k[l].capacity() + rows->v[l].capacity();
    }
    seg->rows = tail;
    // Honest physical bytes (§11.5): the adopted vectors keep their growth slack. Copying to an
    // exact size would cost a pass over every row at each put; the slack is at most the
    // KvCache's geometric growth step and is reported, not hidden.
    seg->bytes = bytes;
    seg->owner = rows;
    pieces.push_back({seg, 0, r.prefix_len, tail});
  }
  return std::make_shared<KvBlock>(layout, std::move(pieces));
}

std::shared_ptr<const KvBlock> KvBlock::snapshot(const KvCache& cache, int64_t upto) {
  const KvLayout& layout = cache.layout();
  std::vector<Piece> pieces;
  const int64_t p = std::min(upto, cache.prefix_tokens());
  prefix_pieces(cache.prefix(), p, &pieces);
  const int64_t tail = upto - p;
  if (tail > 0) {
    auto rows = std::make_shared<HeapRows>();
    const int64_t row = layout.row_bytes();
    auto seg = std::make_shared<KvSegment>();
    std::vector<KvSpan> spans;
    for (int l = 0; l < layout.n_layers; ++l) {
      rows->k.emplace_back(static_cast<size_t>(tail * row));
      rows->v.emplace_back(static_cast<size_t>(tail * row));
      cache.spans(l, upto, &spans);
      for (const KvSpan& s : spans) {
        const int64_t from = std::max(s.start, p), to = s.start + s.len;
        if (to <= from) continue;
        std::memcpy(rows->k[l].data() + (from - p) * row, static_cast<const uint8_t*>(s.k) + (from - s.start) * row,
                    static_cast<size_t>((to - from) * row));
        std::memcpy(rows->v[l].data() + (from - p) * row, static_cast<const uint8_t*>(s.v) + (from - s.start) * row,
                    static_cast<size_t>((to - from) * row));
      }
      seg->k.push_back(rows->k[l].data());
      seg->v.push_back(rows->v[l].data());
    }
    seg->rows = tail;
    seg->bytes = static_cast<size_t>(2 * tail * row * layout.n_layers);
    seg->owner = rows;
    pieces.push_back({seg, 0, p, tail});
  }
  return std::make_shared<KvBlock>(layout, std::move(pieces));
}

void KvBlock::prefix_spans(int layer, int64_t upto, std::vector<KvSpan>* out) const {
  const int64_t row = layout_.row_bytes();
  for (const Piece& p : pieces_) {
    if (p.start >= upto) break;
    const int64_t len = std::min(p.len, upto - p.start);
    out->push_back({p.seg->k[layer] + p.seg_row * row, p.seg->v[layer] + p.seg_row * row, p.start, len, layout_.dtype});
  }
}

void KvBlock::consolidate() const {
  std::call_once(consolidated_once_, [this] {
    const int64_t row = layout_.row_bytes();
    ck_.resize(layout_.n_layers);
    cv_.resize(layout_.n_layers);
    for (int l = 0; l < layout_.n_layers; ++l) {
      ck_[l].resize(static_cast<size_t>(tokens_ * row));
      cv_[l].resize(static_cast<size_t>(tokens_ * row));
      for (const Piece& p : pieces_) {
        std::memcpy(ck_[l].data() + p.start * row, p.seg->k[l] + p.seg_row * row, static_cast<size_t>(p.len * row));
        std::memcpy(cv_[l].data() + p.start * row, p.seg->v[l] + p.seg_row * row, static_cast<size_t>(p.len * row));
      }
    }
  });
}

const void* KvBlock::k(int layer) const {
  if (pieces_.empty()) return nullptr;
  if (pieces_.size() == 1) return pieces_[0].seg->k[layer] + pieces_[0].seg_row * layout_.row_bytes();
  consolidate();
  return ck_[layer].data();
}

const void* KvBlock::v(int layer) const {
  if (pieces_.empty()) return nullptr;
  if (pieces_.size() == 1) return pieces_[0].seg->v[layer] + pieces_[0].seg_row * layout_.row_bytes();
  consolidate();
  return cv_[layer].data();
}

void KvBlock::storage(std::vector<StorageRef>* out) const {
  for (const Piece& p : pieces_) out->push_back({p.seg.get(), p.seg->bytes, p.seg->backing, p.seg->device});
}

}  // namespace larder::memory
