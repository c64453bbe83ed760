// kv_block.h — the immutable, segmented plain-KV block a KV-store entry holds and lends.
//
// kv-store.md §11.2: a full-attention layer's stored KV is an ordered list of immutable
// segments. A segment is either rows adopted from a finished KvCache (no copy), or rows that
// alias a mapped LKV1 file (no copy; pages fault in lazily). An entry that extends a taken
// prefix references the donor's segments plus its own tail segment, so two entries sharing a
// system prompt share its bytes (structural sharing; the byte accounting counts each segment
// once, §11.5). A KvBlock is a KvPrefix: a RAM hit is `cache.attach_prefix(block, p)`, and the
// requester's appends go to its KvCache's private tail — nothing reachable from another owner
// is ever written (copy-on-write invariant, §4).
//
// Lifetimes are structural: every piece holds a shared_ptr to its segment, every segment a
// shared_ptr to its backing (heap rows or MappedFile). The mapping is unmapped when the last
// reader is gone — never by a callback that might not run (mlx-bun's abandoned mmap restore).
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "larder/memory/kv_cache.h"
#include "larder/memory/states/layer_state.h"

namespace larder::memory {

// Rows [0, rows) of every layer, immutable. k[l] / v[l] point at [rows, n_kv_heads, head_dim]
// in the block layout's KV dtype (row_bytes() per row).
struct KvSegment {
  std::vector<const uint8_t*> k, v;
  int64_t rows = 0;
  size_t bytes = 0;                    // physical bytes (incl. growth slack for adopted rows)
  Backing backing = Backing::kAnon;
  Device device = Device::kCpu;
  std::shared_ptr<const void> owner;   // heap rows, a MappedFile, or a foreign KvPrefix
};

class KvBlock final : public KvPrefix {
 public:
  struct Piece {
    std::shared_ptr<const KvSegment> seg;
    int64_t seg_row = 0;  // first row of the segment used
    int64_t start = 0;    // token position of that row
    int64_t len = 0;
  };

  KvBlock(const KvLayout& layout, std::vector<Piece> pieces);

  // Adopts a finished KvCache without copying its private rows: the shared prefix's pieces
  // (if it is a KvBlock; any other KvPrefix becomes one foreign segment) plus the released tail
  // as a new segment. The cache is left empty.
  static std::shared_ptr<const KvBlock> adopt(KvCache&& cache);
  // A block of [0, upto) of a live cache that stays with its owner (boundary checkpoints,
  // kv-store.md §11.3): the prefix pieces are shared, the private rows are copied (the owner
  // keeps writing its tail).
  static std::shared_ptr<const KvBlock> snapshot(const KvCache& cache, int64_t upto);

  const KvLayout& layout() const override { return layout_; }
  int64_t tokens() const override { return tokens_; }
  // Contiguous fallback required by KvPrefix. A single-piece block returns its rows directly;
  // a multi-piece block consolidates once, on first call (attention uses prefix_spans and never
  // triggers this; it exists so any KvPrefix consumer stays correct).
  const void* k(int layer) const override;
  const void* v(int layer) const override;
  void prefix_spans(int layer, int64_t upto, std::vector<KvSpan>* out) const override;

  const std::vector<Piece>& pieces() const { return pieces_; }
  void storage(std::vector<StorageRef>* out) const;

 private:
  void consolidate() const;
  KvLayout layout_;
  std::vector<Piece> pieces_;
  int64_t tokens_ = 0;
  mutable std::once_flag consolidated_once_;
  mutable std::vector<std::vector<uint8_t>> ck_, cv_;
};

}  // namespace larder::memory
