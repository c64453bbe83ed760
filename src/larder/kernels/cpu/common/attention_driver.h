// attention_driver.h — causal GQA attention with an online (streaming) softmax over K/V rows
// stored as f32, f16 or q8_0 (ops.h KV row formats): the work items, chunks, blocks, packing and
// state folding, shared by the AVX2 and AVX-512 tiers. A tier supplies only the arithmetic of
// one packed block against a set of (query row, query head) pairs; each tier instantiates
// AttentionDriver<its tier> in its own translation unit, so nothing here is shared as machine code
// between tiers (every function is a member of the class template).
//
// Canonical order (why results do not depend on spans, rows or threads). Keys are cut into
// chunks of kChunk absolute positions ([c·C, (c+1)·C)) and each chunk into blocks of
// Tier::block_keys(head_dim) absolute positions. For one (query row, query head) pair, a chunk's
// state (max, sum, un-normalised output) is an online softmax over its blocks in order, starting
// empty; the pair's result folds the chunk states in position order into an empty state and
// normalises once. Every path below — a row tile folding all chunks itself, or the decode split
// that computes chunks on different threads and folds them afterwards — runs exactly that
// arithmetic through the same functions (Tier::block, fold, finish), so attending over a cached
// prefix span + a private tail gives the bits of one contiguous span, at any thread count and
// whether the row came in a prefill chunk or alone. A tier's block arithmetic must give a pair
// the same bits whatever other pairs share the call with it (the AVX-512 tier computes pairs in
// tiles; see its file for why its tiles do not change a pair's bits). (Blocking per span, as
// this kernel once did, moved block edges with the span cut: a cause of cached-vs-cold
// differences.)
//
// Work item = (tile of up to 16 query rows, KV heads, chunks). The `group` query heads that share
// a KV head and the tile's rows are processed together, so each K and V row is pulled from memory
// once per item instead of once per (row, query head) — decode attention is a stream over the
// whole cache, GQA (group 4 in Llama 3) cuts its bytes 4x, and in prefill the row tile cuts them
// again.
//
// Prefill and short contexts: one KV head per item, every chunk, row tiles sized for load
// balance. Decode (n <= 16 rows) at long contexts has too few such items to keep the pool busy,
// so there each item is one chunk with all rows and all KV heads (flash-decoding) and leaves its
// chunk states as partials; a second pass folds them. The cache is still read exactly once.
//
// Inside a chunk, a block's K and V rows of one KV head are packed contiguously as f32 (the only
// place the storage format matters: f16 is widened with F16C, q8_0 blocks with one multiply per
// element, both exactly as kv_decode does) and stay in L1 while every (row, head) pair of the
// item consumes them.
//
// A tier is a struct with
//   static int pad(int hd);          // floats per packed row and query head (hd rounded up)
//   static int block_keys(int hd);   // keys per block: a power of two <= kMaxBlock
//   static constexpr size_t kScoreFloats;            // scratch for one block's scores
//   static size_t aux_floats(int bk, int hdp);       // scratch for the tier's own K layout
//   static void prepare(const float* kp, int bk, int hdp, float* aux);  // after each K pack
//   static void block(const AttnPair* pairs, int count, const AttnBlock& b);
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "larder/core/threadpool.h"
#include "larder/kernels/cpu/common/simd_avx2.h"
#include "larder/kernels/ops.h"

namespace larder::kernels::cpu {

// One (query row, query head) pair as a block sees it: its zero-padded query head, its running
// online-softmax state (max, sum, un-normalised output padded to hdp), and the keys of the block
// it sees, [lo, hi) relative to the block start (lo < hi).
struct AttnPair {
  const float* q;
  float* m;
  float* l;
  float* acc;
  int lo, hi;
};

// A packed block of one KV head: K and V rows at stride hdp (row j = block start + j; rows the
// pairs do not see hold finite stale or zero values), the tier's own layout of K (`aux`, from
// Tier::prepare), and scratch for scores.
struct AttnBlock {
  const float* kp;
  const float* vp;
  const float* aux;
  int hd, hdp, bk;
  float scale;
  float* sc;
};

template <class Tier>
struct AttentionDriver {
  static constexpr int kMaxGroup = 16;     // query heads per KV head handled in one item (larger: split)
  // Query rows per item. Every item streams its KV head's rows once, so a prefill chunk at depth
  // re-reads the cache once per row tile (at 4096 keys, 2 MB per head: from L3, not L2): more
  // rows per item, fewer passes. 64 rows × 4 heads keep 256 pairs' states (64 KiB at head_dim 64)
  // in L2.
  static constexpr int64_t kMaxTile = 64;
  // Up to this many rows (decode, speculative verification) a long context is split by chunks.
  static constexpr int64_t kDecodeRows = 16;
  static constexpr int kMaxBlock = 64;     // keys per block, upper bound
  // Keys per chunk. What a chunk adds per (query row, head): initialising and folding one state
  // (~3 passes over head_dim floats, one scalar exp), plus a ragged first/last block — about the
  // work of 2-4 keys; at 256 keys that is ~1%. A context shorter than two chunks is never split.
  static constexpr int64_t kChunk = 256;
  static constexpr int64_t kSplitMinKeys = 2 * kChunk;

  // ---- packing: one block of one KV head, any storage format, into f32 rows at stride hdp ----

  // Copies `rows` rows of one KV head (source stride `stride` bytes) into dst at stride hdp floats,
  // zero-padding each row to a multiple of 8. Why pack: one head's rows sit n_kv_heads·head_dim·elt
  // bytes apart — a power of two for Llama's 8×64 — so a 32-key block of them maps onto a few L1d
  // sets and evicts itself before the group's other query heads re-read it. Packed, K+V of a block
  // are contiguous, and the padding lets every load be a full vector. The copy is also where the
  // cache is streamed from memory (and widened to f32), so it prefetches the next block (`pf`,
  // into L2).
  template <int HD, DType DT>  // HD 0: any head size (runtime hd)
  static void pack_rows(float* dst, const uint8_t* src, int64_t stride, int rows, int hd, int hdp, const uint8_t* pf,
                        int pf_rows) {
    const int d = HD ? HD : hd;
    const int nv = d / 8;
    constexpr int kElt = DT == DType::kF32 ? 4 : 2;
    const int head_bytes = DT == DType::kQ8_0 ? d / 32 * 34 : d * kElt;
    for (int j = 0; j < rows; ++j, src += stride, pf += stride, dst += hdp) {
      if (j < pf_rows)
        for (int off = 0; off < head_bytes; off += 64) _mm_prefetch(reinterpret_cast<const char*>(pf + off), _MM_HINT_T1);
      if constexpr (DT == DType::kF32) {
        const float* s = reinterpret_cast<const float*>(src);
        LARDER_UNROLL for (int i = 0; i < nv; ++i) _mm256_store_ps(dst + 8 * i, _mm256_loadu_ps(s + 8 * i));
        if (d & 7) _mm256_store_ps(dst + 8 * nv, _mm256_maskload_ps(s + 8 * nv, simd::first_lanes(d & 7)));
      } else if constexpr (DT == DType::kF16) {
        LARDER_UNROLL for (int i = 0; i < nv; ++i)
          _mm256_store_ps(dst + 8 * i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16 * i))));
        if (d & 7) {
          alignas(16) uint16_t t[8] = {};
          std::copy_n(reinterpret_cast<const uint16_t*>(src) + 8 * nv, d & 7, t);
          _mm256_store_ps(dst + 8 * nv, _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(t))));
        }
      } else {  // Q8_0: d % 32 == 0 (kv_dtype_unsupported_reason)
        const uint8_t* b = src;
        for (int k = 0; k < d / 32; ++k, b += 34) {
          uint16_t h;
          std::memcpy(&h, b, 2);
          const __m256 sc = _mm256_cvtph_ps(_mm_cvtsi32_si128(h));
          const __m256 scale = _mm256_permutevar8x32_ps(sc, _mm256_setzero_si256());
          LARDER_UNROLL for (int g = 0; g < 4; ++g) {
            const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 2 + 8 * g)));
            _mm256_store_ps(dst + 32 * k + 8 * g, _mm256_mul_ps(_mm256_cvtepi32_ps(q), scale));
          }
        }
      }
    }
  }

  using PackFn = void (*)(float*, const uint8_t*, int64_t, int, int, int, const uint8_t*, int);

  template <DType DT>
  static PackFn pack_for_hd(int hd) {
    if (hd == 64) return pack_rows<64, DT>;
    if (hd == 128) return pack_rows<128, DT>;
    return pack_rows<0, DT>;
  }

  static PackFn pack_for(DType dt, int hd) {
    switch (dt) {
      case DType::kF16: return pack_for_hd<DType::kF16>(hd);
      case DType::kQ8_0: return pack_for_hd<DType::kQ8_0>(hd);
      default: return pack_for_hd<DType::kF32>(hd);
    }
  }

  // Which query heads a slot covers: slot = (KV head, slice of its group); groups larger than
  // kMaxGroup are sliced so one pair loop never holds more than kMaxGroup heads.
  struct Slots {
    int group, splits, g;
    explicit Slots(const AttentionParams& p)
        : group(p.n_heads / p.n_kv_heads),
          splits((group + kMaxGroup - 1) / kMaxGroup),
          g((group + splits - 1) / splits) {}
    int64_t count(const AttentionParams& p) const { return static_cast<int64_t>(p.n_kv_heads) * splits; }
    int kvh(int64_t slot) const { return static_cast<int>(slot / splits); }
    int h0(int64_t slot) const { return kvh(slot) * group + static_cast<int>(slot % splits) * g; }
    int heads(int64_t slot) const { return std::max(0, std::min(g, kvh(slot) * group + group - h0(slot))); }
  };

  // A span as the packer reads it: byte strides of a row and of one head's part of a row.
  struct SpanFmt {
    const uint8_t* k;
    const uint8_t* v;
    int64_t start, len;
    int64_t row_bytes, head_bytes;
    PackFn pack;
  };

  // Everything one attention call shares between its items.
  struct Call {
    const float* q;
    int64_t q_pos0;
    const AttentionParams* p;
    Slots sl;
    std::vector<SpanFmt> spans;
    int hd, hdp, bk;
    int64_t chunk;  // keys per chunk (a multiple of bk)
  };

  // Per-pair online-softmax states: the pair (query row r of the item, query head h) at index
  // r·row_pairs + (h − head0) of m, l and (times hdp) acc.
  struct States {
    float* m;
    float* l;
    float* acc;
    int64_t row_pairs;
    int head0;
  };

  struct Scratch {
    std::vector<float> q;             // [rows, heads, hdp] zero-padded query heads
    std::vector<float> m, l, acc;     // the item's folded states
    std::vector<float> cm, cl, cacc;  // one chunk's states
    std::vector<float> kv;            // packed block: K [bk + 8, hdp], V [bk, hdp], aux; 64-byte aligned
    AttnPair pairs[kMaxTile * kMaxGroup];
    alignas(64) float sc[Tier::kScoreFloats];  // one block's scores / weights
  };

  // Packs key positions [a, b) of KV head kvh into kp/vp (row r ↔ position kb + r), from whichever
  // spans hold them — a block may straddle a span cut.
  static void pack_block(const Call& x, int kvh, int64_t kb, int64_t a, int64_t b, float* kp, float* vp) {
    for (const SpanFmt& sp : x.spans) {
      const int64_t lo = std::max(a, sp.start), hi = std::min(b, sp.start + sp.len);
      if (lo >= hi) continue;
      const int64_t off = (lo - sp.start) * sp.row_bytes + kvh * sp.head_bytes;
      const int rows = static_cast<int>(hi - lo);
      const int64_t ahead = static_cast<int64_t>(x.bk) * sp.row_bytes;  // the next block, same rows
      const int pf_rows = static_cast<int>(std::clamp<int64_t>(sp.start + sp.len - (lo + x.bk), 0, rows));
      sp.pack(kp + (lo - kb) * x.hdp, sp.k + off, sp.row_bytes, rows, x.hd, x.hdp, sp.k + off + ahead, pf_rows);
      sp.pack(vp + (lo - kb) * x.hdp, sp.v + off, sp.row_bytes, rows, x.hd, x.hdp, sp.v + off + ahead, pf_rows);
    }
  }

  // Chunk c's states for query rows [t0, t0 + nt) × the heads of slots [sl0, sl1) (s.q holds the
  // item's query heads, nh of them from head0). Pairs that see no key of the chunk keep m = -inf,
  // l = 0, acc = 0.
  //
  // The block loop is outside the slot loop: with every KV head of a block handled before the
  // next block, the item walks the cache's token-major rows front to back — one sequential stream
  // the hardware prefetcher follows — instead of one strided stream per head.
  static void attend_chunk(const Call& x, int64_t t0, int64_t nt, int64_t sl0, int64_t sl1, int64_t c, Scratch& s,
                           const States& out) {
    const AttentionParams& p = *x.p;
    const int hdp = x.hdp, bk = x.bk;
    const int head0 = x.sl.h0(sl0);
    const int nh = x.sl.h0(sl1 - 1) + x.sl.heads(sl1 - 1) - head0;
    for (int64_t r = 0; r < nt; ++r) {
      for (int i = 0; i < nh; ++i) {
        const size_t pi = static_cast<size_t>(r * out.row_pairs + (head0 + i - out.head0));
        out.m[pi] = -INFINITY;
        out.l[pi] = 0.0f;
        std::fill_n(out.acc + pi * hdp, hdp, 0.0f);
      }
    }
    // Keys some row of the item can see, inside this chunk.
    const int64_t pos_lo = x.q_pos0 + t0, pos_hi = x.q_pos0 + t0 + nt - 1;
    const int64_t first_lo = p.window > 0 ? std::max<int64_t>(0, pos_lo - p.window + 1) : 0;
    const int64_t k_lo = std::max(first_lo, c * x.chunk), k_hi = std::min(pos_hi + 1, (c + 1) * x.chunk);
    if (k_lo >= k_hi) return;
    // resize() zero-fills what it adds, so K rows past a block's end are always finite.
    const size_t kv_floats = static_cast<size_t>((2 * bk + 8) * hdp);
    s.kv.resize(kv_floats + Tier::aux_floats(bk, hdp) + 16);
    float* const kp = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(s.kv.data()) + 63) & ~uintptr_t{63});
    float* const vp = kp + (bk + 8) * hdp;
    float* const aux = kp + kv_floats;
    const AttnBlock blk{kp, vp, aux, x.hd, hdp, bk, p.scale, s.sc};
    for (int64_t kb = k_lo / bk * bk; kb < k_hi; kb += bk) {
      const int64_t a = std::max(kb, k_lo), b = std::min(kb + bk, k_hi);
      const int nb = static_cast<int>(b - kb);
      int packed = -1;  // KV head now in kp/vp (consecutive slots may share one)
      for (int64_t slot = sl0; slot < sl1; ++slot) {
        const int kvh = x.sl.kvh(slot), h0 = x.sl.h0(slot), g = x.sl.heads(slot);
        if (kvh != packed) {
          pack_block(x, kvh, kb, a, b, kp, vp);
          Tier::prepare(kp, bk, hdp, aux);
          packed = kvh;
        }
        int count = 0;
        for (int64_t r = 0; r < nt; ++r) {
          const int64_t pos = pos_lo + r;
          const int64_t first = p.window > 0 ? std::max<int64_t>(0, pos - p.window + 1) : 0;
          // This row sees keys [first, pos]: a contiguous range of the block (inside [a, b)).
          const int lo = static_cast<int>(std::clamp<int64_t>(first - kb, a - kb, nb));
          const int hi = static_cast<int>(std::clamp<int64_t>(pos + 1 - kb, 0, nb));
          if (lo >= hi) continue;
          for (int i = 0; i < g; ++i) {
            const int h = h0 + i;
            const size_t pi = static_cast<size_t>(r * out.row_pairs + (h - out.head0));
            s.pairs[count++] = {s.q.data() + (r * nh + (h - head0)) * hdp, out.m + pi, out.l + pi, out.acc + pi * hdp,
                                lo, hi};
          }
        }
        if (count > 0) Tier::block(s.pairs, count, blk);
      }
    }
  }

  // (M, L, ACC) ⊕= (m, l, acc): the log-sum-exp merge of a chunk's state into the running one,
  // both relative to their own maxima. Out of line on purpose: every path folds through this one
  // piece of machine code, so no call site can be contracted or vectorised differently.
  [[gnu::noinline]] static void fold(float& M, float& L, float* ACC, float m, float l, const float* acc, int hdp) {
    if (m == -INFINITY) return;  // the pair sees no key of this chunk
    float a = 1.0f, b = 1.0f;    // new = old·a + chunk·b
    if (m > M) {
      a = M == -INFINITY ? 0.0f : std::exp(M - m);
      M = m;
    } else {
      b = std::exp(m - M);
    }
    L = _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(L), _mm_set_ss(a), _mm_mul_ss(_mm_set_ss(l), _mm_set_ss(b))));
    const __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b);
    for (int d = 0; d < hdp; d += 8)
      _mm256_storeu_ps(ACC + d,
                       _mm256_fmadd_ps(_mm256_loadu_ps(ACC + d), va, _mm256_mul_ps(_mm256_loadu_ps(acc + d), vb)));
  }

  // o = ACC / L, the folded state normalised once. With a sink logit s (AttentionParams::sinks),
  // the state first folds in e^{s} as one more key without a value: the same arithmetic whatever
  // the chunks were, so sinks keep the split- and span-independence above.
  [[gnu::noinline]] static void finish(float M, float L, const float* ACC, int hd, float* o, const float* sink) {
    float a = 1.0f;  // the scale of ACC relative to the new maximum
    if (sink != nullptr) {
      const float s = *sink;
      if (s > M) {
        a = M == -INFINITY ? 0.0f : std::exp(M - s);
        L = L * a + 1.0f;
      } else {
        L = L + std::exp(s - M);
      }
    }
    const float inv = L > 0 ? a / L : 0.0f;
    for (int d = 0; d < hd; ++d) o[d] = ACC[d] * inv;
  }

  // Copies the item's query heads into s.q, zero-padded to hdp.
  static void load_q(const Call& x, int64_t t0, int64_t nt, int head0, int nh, Scratch& s) {
    const int64_t q_row = static_cast<int64_t>(x.p->n_heads) * x.hd;
    s.q.assign(static_cast<size_t>(nt * nh * x.hdp), 0.0f);
    for (int64_t r = 0; r < nt; ++r)
      for (int i = 0; i < nh; ++i)
        std::copy_n(x.q + (t0 + r) * q_row + static_cast<int64_t>(head0 + i) * x.hd, x.hd,
                    s.q.data() + (r * nh + i) * x.hdp);
  }

  // Attention with an explicit row tile, chunk length (rounded up to a multiple of the block) and
  // split choice; `attention` below picks them. Exposed so tests can drive the chunk/fold paths
  // with chunks small enough that some are fully masked for some rows, whatever the thread count.
  static void attention_tiled(const float* q, int64_t n, int64_t q_pos0, const KvSpanView* spans, int n_spans,
                              const AttentionParams& p, int64_t tile, int64_t chunk_keys, bool split,
                              int64_t slots_per_item, float* out) {
    const int hd = p.head_dim;
    Call x{q, q_pos0, &p, Slots(p), {}, hd, Tier::pad(hd), Tier::block_keys(hd), 0};
    x.chunk = (std::max<int64_t>(chunk_keys, 1) + x.bk - 1) / x.bk * x.bk;
    x.spans.reserve(static_cast<size_t>(n_spans));
    for (int i = 0; i < n_spans; ++i) {
      const KvSpanView& sp = spans[i];
      if (sp.len <= 0) continue;
      const int64_t kv_row = static_cast<int64_t>(p.n_kv_heads) * hd;
      x.spans.push_back({static_cast<const uint8_t*>(sp.k), static_cast<const uint8_t*>(sp.v), sp.start, sp.len,
                         kv_bytes(sp.dtype, kv_row), kv_bytes(sp.dtype, hd), pack_for(sp.dtype, hd)});
    }
    const int hdp = x.hdp;
    const int64_t q_row = static_cast<int64_t>(p.n_heads) * hd;
    const int64_t slots = x.sl.count(p);
    tile = std::clamp<int64_t>(tile, 1, kMaxTile);
    const int64_t row_tiles = (n + tile - 1) / tile;
    const int64_t sgs = std::clamp<int64_t>(slots_per_item, 1, slots);
    const int64_t slot_groups = (slots + sgs - 1) / sgs;
    // The chunks holding a key some row sees.
    const int64_t r0 = p.window > 0 ? std::max<int64_t>(0, q_pos0 - p.window + 1) : 0;
    const int64_t c_first = r0 / x.chunk, c_end = (q_pos0 + n + x.chunk - 1) / x.chunk;
    const int64_t chunks = c_end - c_first;
    thread_local Scratch scratch;

    if (!split || chunks <= 1) {
      default_pool().parallel_for(row_tiles * slot_groups, [&](int64_t it, int) {
        const int64_t sl0 = (it % slot_groups) * sgs, sl1 = std::min(slots, sl0 + sgs);
        const int head0 = x.sl.h0(sl0);
        const int nh = x.sl.h0(sl1 - 1) + x.sl.heads(sl1 - 1) - head0;
        if (nh <= 0) return;
        // Last rows first: they see the most keys, and the pool hands items out in order, so the
        // small items even out the threads at the end.
        const int64_t t0 = (row_tiles - 1 - it / slot_groups) * tile, nt = std::min(tile, n - t0);
        Scratch& s = scratch;
        load_q(x, t0, nt, head0, nh, s);
        const size_t pairs = static_cast<size_t>(nt * nh);
        s.m.assign(pairs, -INFINITY);
        s.l.assign(pairs, 0.0f);
        s.acc.assign(pairs * hdp, 0.0f);
        s.cm.resize(pairs);
        s.cl.resize(pairs);
        s.cacc.resize(pairs * hdp);
        for (int64_t c = c_first; c < c_end; ++c) {
          attend_chunk(x, t0, nt, sl0, sl1, c, s, {s.cm.data(), s.cl.data(), s.cacc.data(), nh, head0});
          for (size_t pi = 0; pi < pairs; ++pi)
            fold(s.m[pi], s.l[pi], s.acc.data() + pi * hdp, s.cm[pi], s.cl[pi], s.cacc.data() + pi * hdp, hdp);
        }
        for (int64_t r = 0; r < nt; ++r)
          for (int i = 0; i < nh; ++i) {
            const size_t pi = static_cast<size_t>(r * nh + i);
            finish(s.m[pi], s.l[pi], s.acc.data() + pi * hdp, hd,
                   out + (t0 + r) * q_row + static_cast<int64_t>(head0 + i) * hd, p.sinks ? p.sinks + head0 + i : nullptr);
          }
      });
      return;
    }

    // Split: chunk states of chunk c_first + c for (row t, head h) at (c·n + t)·n_heads + h. Owned
    // by the calling thread and reused across calls (decode calls this once per layer and step).
    thread_local std::vector<float> part_m, part_l, part_acc;
    const size_t planes = static_cast<size_t>(chunks * n * p.n_heads);
    part_m.resize(planes);
    part_l.resize(planes);
    part_acc.resize(planes * hdp);
    // Workers must write the caller's buffers, not their own thread_locals of the same name.
    float* const pm = part_m.data();
    float* const pl = part_l.data();
    float* const pa = part_acc.data();
    default_pool().parallel_for(row_tiles * slot_groups * chunks, [&](int64_t it, int) {
      const int64_t c = it % chunks, rest = it / chunks;
      const int64_t sl0 = (rest % slot_groups) * sgs, sl1 = std::min(slots, sl0 + sgs);
      const int head0 = x.sl.h0(sl0);
      const int nh = x.sl.h0(sl1 - 1) + x.sl.heads(sl1 - 1) - head0;
      if (nh <= 0) return;
      const int64_t t0 = (rest / slot_groups) * tile, nt = std::min(tile, n - t0);
      const size_t base = static_cast<size_t>((c * n + t0) * p.n_heads);
      load_q(x, t0, nt, head0, nh, scratch);
      attend_chunk(x, t0, nt, sl0, sl1, c_first + c, scratch, {pm + base, pl + base, pa + base * hdp, p.n_heads, 0});
    });
    const int64_t pairs = n * p.n_heads;
    default_pool().parallel_for(pairs, [&](int64_t pi, int) {
      thread_local std::vector<float> acc;
      acc.assign(static_cast<size_t>(hdp), 0.0f);
      float M = -INFINITY, L = 0.0f;
      for (int64_t c = 0; c < chunks; ++c) {
        const size_t ci = static_cast<size_t>(c * pairs + pi);
        fold(M, L, acc.data(), pm[ci], pl[ci], pa + ci * hdp, hdp);
      }
      // pair index t·n_heads + h is the output's head index
      finish(M, L, acc.data(), hd, out + pi * hd, p.sinks ? p.sinks + pi % p.n_heads : nullptr);
    });
  }

  static void attention(const float* q, int64_t n, int64_t q_pos0, const KvSpanView* spans, int n_spans,
                        const AttentionParams& p, float* out) {
    const int64_t slots = Slots(p).count(p);
    const int64_t threads = default_pool().n_threads();
    const int64_t r0 = p.window > 0 ? std::max<int64_t>(0, q_pos0 - p.window + 1) : 0;
    const int64_t keys = q_pos0 + n - r0;
    const int64_t chunks = (q_pos0 + n + kChunk - 1) / kChunk - r0 / kChunk;
    // Below kSplitMinKeys the split's second pass and partial states cost more than they save —
    // except when the unsplit call has fewer items (rows × slots, one row per item here) than
    // threads, as for a model with one KV head (gemma-3-270m): then its decode attention ran on
    // one thread. (kernel_bench --attn-shape 4/1/256, f16, 2 threads, 32 MiB streamed between
    // calls: 400 keys 39–41 → 28–30 µs, 500 keys 44–49 → 28–30 µs, 300 keys 29–32 → 28–29 µs;
    // 9/3/64 split at 300–400 keys: 13–22 → 21–26 µs, so three slots on two threads stay unsplit.)
    const bool starved = n * slots < threads && chunks >= 2;
    if (n <= kDecodeRows && (keys >= kSplitMinKeys || starved)) {
      // Decode: all rows and all KV heads in each item (the cache is read once, front to back),
      // parallel over the chunks (dynamic balancing on a shared host, like the matmuls).
      attention_tiled(q, n, q_pos0, spans, n_spans, p, n, kChunk, true, slots, out);
      return;
    }
    // Prefill, or short contexts: one KV head per item; query rows per item enough to amortize
    // each K/V block over many queries, while leaving ≥ 4 items per thread for load balance.
    const int64_t want_items = 4 * threads;
    const int64_t tile = std::clamp<int64_t>(n * slots / std::max<int64_t>(want_items, 1), 1, kMaxTile);
    attention_tiled(q, n, q_pos0, spans, n_spans, p, tile, kChunk, false, 1, out);
  }
};

}  // namespace larder::kernels::cpu
