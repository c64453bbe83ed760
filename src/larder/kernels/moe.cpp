// moe.cpp — moe.h entry points: routing through the dispatch table, and the grouped expert
// matmul, a driver over the active tier's per-format matmul kernels.
#include "larder/kernels/moe.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "larder/core/profile.h"
#include "larder/core/status.h"
#include "larder/core/threadpool.h"
#include "larder/kernels/dispatch.h"

namespace larder::kernels {

namespace {

// Rows [r0, r0 + len) of w as a matrix of their own: every format stores whole rows (GGUF
// blocks run along cols; MLX scales/biases are per row), so a row slice is pointer arithmetic.
WeightView row_slice(const WeightView& w, int64_t r0, int64_t len) {
  WeightView v = w;
  v.rows = len;
  v.data = w.data + static_cast<uint64_t>(r0) * w.row_bytes();
  // MLX scales (and affine biases) per row; GGUF blocks hold their own.
  const uint64_t sb = w.scale_row_bytes();
  if (w.scales) v.scales = w.scales + static_cast<uint64_t>(r0) * sb;
  if (w.biases) v.biases = w.biases + static_cast<uint64_t>(r0) * sb;
  return v;
}

MatmulFn matmul_fn(const KernelTable& t, const WeightView& w) {
  if (w.is_affine()) return w.bits <= kMaxAffineBits ? t.matmul_affine[w.bits] : nullptr;
  return t.matmul[static_cast<int>(w.dtype)];
}

// The (token, slot) pairs of one expert: pairs[begin, begin + m) of the grouped order.
struct Group {
  int32_t expert = 0;
  int64_t begin = 0, m = 0;
  const float* x = nullptr;  // [m, cols]: the pairs' input rows (gathered unless m == 1)
};

// One piece of the decode job: rows [r0, r0 + len) of matrix `mat`'s expert of a group, over the
// group's rows.
struct Piece {
  int32_t group = 0;
  int32_t mat = 0;
  int64_t r0 = 0, len = 0;
  float* out = nullptr;  // [m, len]; for m == 1 it is the pair's own row of ys[mat]
};

// Largest group that runs as pieces of one job: the matmul driver's decode regime (n <= 8),
// where each weight byte is read once for all of the group's rows.
constexpr int64_t kMaxDecodeGroup = 8;

}  // namespace

void route_topk(const float* logits, int64_t n, const RouteParams& p, int32_t* ids, float* weights) {
  profile::Scope scope(profile::enabled() ? "route_topk" : "");
  if (n > 0) active_table().route_topk(logits, n, p, ids, weights);
}

void matmul_experts(const ExpertsView& w, const float* x, bool x_per_slot, int64_t n, const int32_t* ids, int k,
                    float* y) {
  matmul_experts_multi(&w, &y, 1, x, x_per_slot, n, ids, k);
}

void matmul_experts_multi(const ExpertsView* ws, float* const* ys, int count, const float* x, bool x_per_slot,
                          int64_t n, const int32_t* ids, int k) {
  if (n <= 0 || k <= 0 || count <= 0) return;
  LARDER_CHECK(count <= kMaxMultiMatmul, "[kernels] matmul_experts_multi of %d matrices", count);
  const int E = ws[0].n_experts;
  const int64_t cols = ws[0].experts[0].cols, pairs = n * k;
  MatmulFn mm[kMaxMultiMatmul];
  int64_t rows[kMaxMultiMatmul], base[kMaxMultiMatmul + 1] = {0};  // base: matrix i's part of yg
  for (int i = 0; i < count; ++i) {
    LARDER_CHECK(ws[i].n_experts == E && ws[i].experts != nullptr && E > 0,
                 "[kernels] matmul_experts: matrix %d has %d experts, matrix 0 %d", i, ws[i].n_experts, E);
    const WeightView& w0 = ws[i].experts[0];
    LARDER_DCHECK(w0.cols == cols, "matmul_experts_multi: cols %lld vs %lld", (long long)w0.cols, (long long)cols);
    mm[i] = matmul_fn(active_table(), w0);
    LARDER_CHECK(mm[i] != nullptr, "[kernels] no matmul for %s (affine bits %d)", dtype_name(w0.dtype), w0.bits);
    rows[i] = w0.rows;
    base[i + 1] = base[i] + pairs * rows[i];
  }

  // Counting sort of the pairs by expert (stable: a group's rows stay in token order).
  std::vector<int64_t> start(static_cast<size_t>(E) + 1, 0);
  for (int64_t p = 0; p < pairs; ++p) {
    LARDER_CHECK(ids[p] >= 0 && ids[p] < E, "[kernels] expert id %d of %d", ids[p], E);
    ++start[static_cast<size_t>(ids[p]) + 1];
  }
  for (int e = 0; e < E; ++e) start[e + 1] += start[e];
  std::vector<int64_t> order(static_cast<size_t>(pairs));
  {
    std::vector<int64_t> fill(start.begin(), start.end() - 1);
    for (int64_t p = 0; p < pairs; ++p) order[static_cast<size_t>(fill[static_cast<size_t>(ids[p])]++)] = p;
  }
  std::vector<Group> groups;
  for (int e = 0; e < E; ++e)
    if (start[e + 1] > start[e]) groups.push_back({e, start[e], start[e + 1] - start[e], nullptr});

  // The groups' input rows, gathered (a single row is read in place). Decode-sized calls (one per
  // MoE matrix per step) reuse grow-only per-thread buffers; a prefill chunk's (pairs · hidden
  // floats, up to hundreds of MB) is freed with the call rather than kept for the thread's life.
  // Both are written before they are read, so neither is zero-filled.
  struct Buf {
    std::unique_ptr<float[]> p;
    size_t size = 0;
    float* data() { return p.get(); }
    void reserve(size_t n) {
      if (size < n) p.reset(new float[n]), size = n;
    }
  };
  thread_local Buf xg_kept, yg_kept;
  Buf xg_call, yg_call;
  const bool keep = pairs <= 256;
  Buf& xg = keep ? xg_kept : xg_call;
  Buf& yg = keep ? yg_kept : yg_call;
  xg.reserve(static_cast<size_t>(pairs * cols));
  auto x_row = [&](int64_t p) { return x + (x_per_slot ? p : p / k) * cols; };
  for (Group& g : groups) {
    if (g.m == 1) {
      g.x = x_row(order[static_cast<size_t>(g.begin)]);
      continue;
    }
    float* dst = xg.data() + g.begin * cols;
    for (int64_t i = 0; i < g.m; ++i)
      std::memcpy(dst + i * cols, x_row(order[static_cast<size_t>(g.begin + i)]), static_cast<size_t>(cols) * 4);
    g.x = dst;
  }
  // Results of multi-row groups land here (matrix i: [m, rows] per group, or [m, len] per piece,
  // from base[i]) and are scattered to the pairs' rows afterwards.
  yg.reserve(static_cast<size_t>(base[count]));
  auto scatter = [&](const Group& g, int i, const float* src, int64_t r0, int64_t len) {
    for (int64_t j = 0; j < g.m; ++j)
      std::memcpy(ys[i] + order[static_cast<size_t>(g.begin + j)] * rows[i] + r0, src + j * len,
                  static_cast<size_t>(len) * 4);
  };

  char name[96] = "";
  double bytes = 0;
  if (profile::enabled()) {
    const WeightView& w0 = ws[0].experts[0];
    std::snprintf(name, sizeof name, "matmul_experts %s %d x %lldx%lld %d of %d experts%s", dtype_name(w0.dtype),
                  count, (long long)rows[0], (long long)cols, static_cast<int>(groups.size()), E,
                  n == 1 ? "" : " n>1");
    for (int i = 0; i < count; ++i)
      for (const Group& g : groups)
        bytes += static_cast<double>(rows[i]) * static_cast<double>(ws[i].experts[g.expert].row_bytes());
  }
  profile::Scope scope(name, bytes);

  // Prefill-sized groups: one GEMM per expert and matrix, each its own pool job (the tier's
  // prefill path; kernels::matmul, so the result is the single matmul's bits).
  int64_t decode_rows = 0;
  for (const Group& g : groups) {
    for (int i = 0; i < count; ++i) {
      if (g.m <= kMaxDecodeGroup) {
        decode_rows += rows[i];
        continue;
      }
      float* out = yg.data() + base[i] + g.begin * rows[i];
      mm[i](ws[i].experts[g.expert], g.x, g.m, out);
      scatter(g, i, out, 0, rows[i]);
    }
  }
  if (decode_rows == 0) return;

  // Decode-sized groups: every (matrix, expert, row range) piece in one pool job. Pieces are
  // whole multiples of 8 rows (every decode tile height divides them), about 4 per thread so a
  // slowed core takes fewer, and at least 32 rows so each piece's activation quantization stays
  // small next to its weight stream. Inside the job each piece's matmul runs on its own thread (the
  // pool runs nested parallel_for serially).
  const int threads = default_pool().n_threads();
  int64_t piece_rows = (decode_rows + 4 * threads - 1) / (4 * static_cast<int64_t>(threads));
  piece_rows = std::max<int64_t>(32, (piece_rows + 7) / 8 * 8);
  std::vector<Piece> pieces;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const Group& g = groups[gi];
    if (g.m > kMaxDecodeGroup) continue;
    for (int i = 0; i < count; ++i)
      for (int64_t r0 = 0; r0 < rows[i]; r0 += piece_rows) {
        const int64_t len = std::min(piece_rows, rows[i] - r0);
        float* out = g.m == 1 ? ys[i] + order[static_cast<size_t>(g.begin)] * rows[i] + r0
                              : yg.data() + base[i] + g.begin * rows[i] + g.m * r0;
        pieces.push_back({static_cast<int32_t>(gi), i, r0, len, out});
      }
  }
  default_pool().parallel_for(static_cast<int64_t>(pieces.size()), [&](int64_t c, int) {
    const Piece& pc = pieces[static_cast<size_t>(c)];
    const Group& g = groups[static_cast<size_t>(pc.group)];
    mm[pc.mat](row_slice(ws[pc.mat].experts[g.expert], pc.r0, pc.len), g.x, g.m, pc.out);
  });
  for (const Piece& pc : pieces) {
    const Group& g = groups[static_cast<size_t>(pc.group)];
    if (g.m > 1) scatter(g, pc.mat, pc.out, pc.r0, pc.len);
  }
}

}  // namespace larder::kernels
