// gated_delta_avx2.cpp — the Gated DeltaNet kernels (kernels/gated_delta.h) for the AVX2 tier, on the
// thread pool: causal conv1d (+SiLU), the per-head L2 norm, the recurrent delta rule and the gated
// RMSNorm. The gates (n·H_v scalars) and the chunked form stay on the reference.
//
// The recurrent delta rule: each state row S[h][i] evolves on its own (it reads k, q, v[i], g, β),
// so a job owns a head's rows (or a slice of them) and runs pairs of 4-row groups, taking turns per
// token, through blocks of 16 tokens: the block's q/k stay in L1, the job's rows in L2. Per token, one pass decays the rows and
// forms kv = S·k, the next adds δ⊗k and forms y = S·q (k and q loaded once per group). Every row
// takes the same arithmetic whatever its group, job, thread or call split, so results are
// bit-identical across call splits and thread counts. Dot products accumulate in 8 f32 lanes (the
// reference: double): a few ulps of Σ|s·k| per token.
//
// The conv: jobs over ranges of 8-channel blocks, tokens outer so x rows stream contiguously; the
// taps are transposed per job to one vector per (block, tap) and summed in the reference's order.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "larder/core/threadpool.h"
#include "larder/kernels/cpu/common/cpu_kernels.h"
#include "larder/kernels/cpu/common/parallel_split.h"
#include "larder/kernels/cpu/common/simd_avx2.h"
#include "larder/kernels/cpu/common/simd_exp_avx2.h"
#include "larder/kernels/ref/ref_ops.h"

namespace larder::kernels::cpu::avx2 {

namespace {

// Lanes [0, k) of a tail (k in 1..8); loads of the other lanes read 0 and stores skip them.
inline __m256 load_tail(const float* p, __m256i m) { return _mm256_maskload_ps(p, m); }

inline __m256 silu8(__m256 x) {
  const __m256 e = simd::exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), x));
  return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

constexpr int kMaxConvKernel = 16;

}  // namespace

void causal_conv1d(const float* x, int64_t n, const CausalConv1dParams& p, float* state, float* out) {
  const int K = p.kernel, keep = K - 1;
  const int64_t C = p.channels;
  if (n <= 0) return;
  if (K > kMaxConvKernel) return ref::causal_conv1d(x, n, p, state, out);
  const int64_t blocks = (C + 7) / 8;
  // The family's kernel 4 at decode: each full block's taps transposed in registers (8 channels ×
  // 4 taps are 8 quarter vectors) instead of into a buffer per call, which cost more than the conv.
  const bool in_regs = K == 4 && n < 16;
  // Jobs: ranges of 8-channel blocks; within one, tokens outer so each x row is read contiguously.
  parallel_split(blocks, 8, n * K * 8, [&](int64_t b0, int64_t b1) {
    // The range's taps, transposed to one 8-channel vector per (block, tap) (in_regs: only a
    // ragged last block's).
    const int64_t first = in_regs ? std::max(b0, C / 8) : b0;  // the first block kept in the buffer
    thread_local std::vector<float> w, bias;
    w.assign(static_cast<size_t>(std::max<int64_t>(0, b1 - first) * K * 8), 0.0f);
    bias.assign(static_cast<size_t>(std::max<int64_t>(0, b1 - first) * 8), 0.0f);
    for (int64_t b = first; b < b1; ++b) {
      const int64_t c0 = b * 8;
      const int lanes = static_cast<int>(std::min<int64_t>(8, C - c0));
      alignas(32) float wt[kMaxConvKernel][8] = {};
      for (int l = 0; l < lanes; ++l)
        for (int j = 0; j < K; ++j) wt[j][l] = p.weight[(c0 + l) * K + j];
      for (int j = 0; j < K; ++j) std::memcpy(&w[static_cast<size_t>(((b - first) * K + j) * 8)], wt[j], sizeof wt[j]);
      for (int l = 0; l < lanes && p.bias; ++l) bias[static_cast<size_t>((b - first) * 8 + l)] = p.bias[c0 + l];
    }
    auto row = [&](int64_t r) { return r < keep ? state + r * C : x + (r - keep) * C; };
    for (int64_t t = 0; t < n; ++t) {
      const float* in[kMaxConvKernel];
      for (int j = 0; j < K; ++j) in[j] = row(t + j);
      float* o = out + t * C;
      // The reference's order: bias, then taps 0..K−1 (one rounding each: fma). Masked loads and
      // stores only for a ragged last block (vmaskmovps stores are slow on some cores).
      auto conv8 = [&](int64_t b, auto load) {
        __m256 acc;
        if (in_regs && (b + 1) * 8 <= C) {
          // Channels c0..c0+7 × taps 0..3 as two 4×4 transposes.
          const float* wp = p.weight + b * 32;
          __m128 r0 = _mm_loadu_ps(wp), r1 = _mm_loadu_ps(wp + 4), r2 = _mm_loadu_ps(wp + 8), r3 = _mm_loadu_ps(wp + 12);
          __m128 r4 = _mm_loadu_ps(wp + 16), r5 = _mm_loadu_ps(wp + 20), r6 = _mm_loadu_ps(wp + 24),
                 r7 = _mm_loadu_ps(wp + 28);
          _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
          _MM_TRANSPOSE4_PS(r4, r5, r6, r7);
          const __m256 wj[4] = {_mm256_set_m128(r4, r0), _mm256_set_m128(r5, r1), _mm256_set_m128(r6, r2),
                                _mm256_set_m128(r7, r3)};
          acc = p.bias ? _mm256_loadu_ps(p.bias + b * 8) : _mm256_setzero_ps();
          for (int j = 0; j < 4; ++j) acc = _mm256_fmadd_ps(wj[j], load(in[j] + b * 8), acc);
        } else {
          const float* wb = &w[static_cast<size_t>((b - first) * K * 8)];
          acc = _mm256_loadu_ps(&bias[static_cast<size_t>((b - first) * 8)]);
          for (int j = 0; j < K; ++j) acc = _mm256_fmadd_ps(_mm256_loadu_ps(wb + j * 8), load(in[j] + b * 8), acc);
        }
        return p.silu ? silu8(acc) : acc;
      };
      const int64_t full_end = std::min(b1, C / 8);
      const auto plain = [](const float* q) { return _mm256_loadu_ps(q); };
      for (int64_t b = b0; b < full_end; ++b) _mm256_storeu_ps(o + b * 8, conv8(b, plain));
      if (full_end < b1) {
        const __m256i m = simd::first_lanes(static_cast<int>(C - full_end * 8));
        _mm256_maskstore_ps(o + full_end * 8, m, conv8(full_end, [&](const float* q) { return load_tail(q, m); }));
      }
    }
    // The new state: rows n .. n+K−2 of state ++ x. Ascending r reads row n + r > r, never a row
    // written before it.
    for (int r = 0; r < keep; ++r) {
      const float* src = row(n + r);
      const int64_t c0 = b0 * 8, c1 = std::min(C, b1 * 8);
      std::memcpy(state + r * C + c0, src + c0, static_cast<size_t>(c1 - c0) * sizeof(float));
    }
  });
}

void l2norm_heads(float* x, int64_t n, const L2NormParams& p) {
  const int dim = p.dim;
  const int full = dim / 8 * 8;
  const __m256i m = simd::first_lanes(dim - full);
  parallel_split(n * p.heads, 16, dim, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* v = x + (r / p.heads) * p.stride + (r % p.heads) * dim;
      __m256 ss = _mm256_setzero_ps();
      for (int i = 0; i < full; i += 8) ss = _mm256_fmadd_ps(_mm256_loadu_ps(v + i), _mm256_loadu_ps(v + i), ss);
      if (full < dim) {
        const __m256 t = load_tail(v + full, m);
        ss = _mm256_fmadd_ps(t, t, ss);
      }
      const __m256 f = _mm256_set1_ps(p.scale / std::sqrt(simd::hsum(ss) + p.eps));
      for (int i = 0; i < full; i += 8) _mm256_storeu_ps(v + i, _mm256_mul_ps(_mm256_loadu_ps(v + i), f));
      if (full < dim) _mm256_maskstore_ps(v + full, m, _mm256_mul_ps(load_tail(v + full, m), f));
    }
  });
}

namespace {

// R state rows (rows[r] = &S[h][i0 + r][0], d_k floats each) of value head h through tokens [0, n).
// q, k, v, log_g, beta, y already point at this head's first token; qk_step, v_step, gb_step, y_step
// are the per-token strides.
// One token of R rows.
template <int R>
__attribute__((always_inline)) inline void token_step(float* const* rows, int dk, const float* q, const float* k,
                                                      const float* v, __m256 g, float b, float* y) {
  const int full = dk / 8 * 8;
  const __m256i m = simd::first_lanes(dk - full);
  {
    // S ← g·S; kv = S·k.
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int j = 0; j < full; j += 8) {
      const __m256 kj = _mm256_loadu_ps(k + j);
      for (int r = 0; r < R; ++r) {
        const __m256 s = _mm256_mul_ps(_mm256_loadu_ps(rows[r] + j), g);
        _mm256_storeu_ps(rows[r] + j, s);
        acc[r] = _mm256_fmadd_ps(s, kj, acc[r]);
      }
    }
    if (full < dk) {
      const __m256 kj = load_tail(k + full, m);
      for (int r = 0; r < R; ++r) {
        const __m256 s = _mm256_mul_ps(load_tail(rows[r] + full, m), g);
        _mm256_maskstore_ps(rows[r] + full, m, s);
        acc[r] = _mm256_fmadd_ps(s, kj, acc[r]);
      }
    }
    // δ = (v − kv)·β; S ← S + δ⊗k; y = S·q.
    __m256 d[R];
    for (int r = 0; r < R; ++r) {
      d[r] = _mm256_set1_ps((v[r] - simd::hsum(acc[r])) * b);
      acc[r] = _mm256_setzero_ps();
    }
    for (int j = 0; j < full; j += 8) {
      const __m256 kj = _mm256_loadu_ps(k + j), qj = _mm256_loadu_ps(q + j);
      for (int r = 0; r < R; ++r) {
        const __m256 s = _mm256_fmadd_ps(kj, d[r], _mm256_loadu_ps(rows[r] + j));
        _mm256_storeu_ps(rows[r] + j, s);
        acc[r] = _mm256_fmadd_ps(s, qj, acc[r]);
      }
    }
    if (full < dk) {
      const __m256 kj = load_tail(k + full, m), qj = load_tail(q + full, m);
      for (int r = 0; r < R; ++r) {
        const __m256 s = _mm256_fmadd_ps(kj, d[r], load_tail(rows[r] + full, m));
        _mm256_maskstore_ps(rows[r] + full, m, s);
        acc[r] = _mm256_fmadd_ps(s, qj, acc[r]);
      }
    }
    for (int r = 0; r < R; ++r) y[r] = simd::hsum(acc[r]);
  }
}

// G groups of R rows taking turns per token (one group's lane sums and δ overlap the other's pass).
template <int R, int G>
void delta_rows(float* const* rows, int dk, int64_t n, const float* q, const float* k, int64_t qk_step,
                const float* v, int64_t v_step, const float* log_g, const float* beta, int64_t gb_step, float* y,
                int64_t y_step) {
  for (int64_t t = 0; t < n; ++t, q += qk_step, k += qk_step, v += v_step, y += y_step) {
    const __m256 g = _mm256_set1_ps(std::exp(log_g[t * gb_step]));
    const float b = beta[t * gb_step];
    for (int gi = 0; gi < G; ++gi) token_step<R>(rows + gi * R, dk, q, k, v + gi * R, g, b, y + gi * R);
  }
}

constexpr int kRowGroup = 4;
constexpr int64_t kTokenBlock = 16;

}  // namespace

void gated_delta_recurrent(const GatedDeltaInputs& in, const GatedDeltaShape& s, float* state, float* y) {
  const int dk = s.d_k, dv = s.d_v, hv = s.n_v_heads;
  const int group = hv / s.n_k_heads;
  const int64_t qks = in.qkv_stride ? in.qkv_stride : static_cast<int64_t>(s.n_k_heads) * dk;
  const int64_t vs = in.qkv_stride ? in.qkv_stride : static_cast<int64_t>(hv) * dv;
  const int64_t ys = static_cast<int64_t>(hv) * dv;
  // Jobs: a head's rows, split further (in whole row groups) when there are fewer heads than
  // threads want. Within a job, tokens go in blocks whose q/k stay in L1 while every row group of
  // the job passes over them; the job's rows (d_v·d_k floats) stay in L2.
  const int64_t groups_per_head = (dv + kRowGroup - 1) / kRowGroup;
  const int64_t want = 4 * default_pool().n_threads();
  const int64_t parts = std::min<int64_t>(groups_per_head, std::max<int64_t>(1, (want + hv - 1) / hv));
  parallel_split(hv * parts, 1, in.n * dk * 4 * dv / parts, [&](int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j) {
      const int h = static_cast<int>(j / parts);
      const int64_t part = j % parts;
      const int g0 = static_cast<int>(groups_per_head * part / parts);
      const int g1 = static_cast<int>(groups_per_head * (part + 1) / parts);
      const int64_t hk = h / group;
      for (int64_t t0 = 0; t0 < in.n; t0 += kTokenBlock) {
        const int64_t tn = std::min(kTokenBlock, in.n - t0);
        const float* q = in.q + t0 * qks + hk * dk;
        const float* k = in.k + t0 * qks + hk * dk;
        const float* lg = in.log_g + t0 * hv + h;
        const float* be = in.beta + t0 * hv + h;
        for (int gi = g0; gi < g1;) {
          const int i0 = gi * kRowGroup;
          const int rn = std::min(2 * kRowGroup, dv - i0);
          const bool pair = gi + 1 < g1 && rn == 2 * kRowGroup;
          float* rows[2 * kRowGroup];
          for (int r = 0; r < std::min(rn, pair ? 2 * kRowGroup : kRowGroup); ++r)
            rows[r] = state + (static_cast<int64_t>(h) * dv + i0 + r) * dk;
          const float* v = in.v + t0 * vs + static_cast<int64_t>(h) * dv + i0;
          float* yh = y + t0 * ys + static_cast<int64_t>(h) * dv + i0;
          // Two full groups in turns, else one; rows of a short last group one at a time: the same
          // per-row arithmetic either way.
          if (pair) {
            delta_rows<kRowGroup, 2>(rows, dk, tn, q, k, qks, v, vs, lg, be, hv, yh, ys);
            gi += 2;
          } else if (rn >= kRowGroup) {
            delta_rows<kRowGroup, 1>(rows, dk, tn, q, k, qks, v, vs, lg, be, hv, yh, ys);
            ++gi;
          } else {
            for (int r = 0; r < rn; ++r)
              delta_rows<1, 1>(rows + r, dk, tn, q, k, qks, v + r, vs, lg, be, hv, yh + r, ys);
            ++gi;
          }
        }
      }
    }
  });
}

void rmsnorm_gated(const float* x, const float* z, const float* weight, int64_t rows, int64_t dim, float eps,
                   float* out) {
  const int64_t full = dim / 8 * 8;
  const __m256i m = simd::first_lanes(static_cast<int>(dim - full));
  parallel_split(rows, 16, dim * 4, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * dim;
      const float* zr = z + r * dim;
      float* o = out + r * dim;
      __m256 ss = _mm256_setzero_ps();
      for (int64_t i = 0; i < full; i += 8) ss = _mm256_fmadd_ps(_mm256_loadu_ps(xr + i), _mm256_loadu_ps(xr + i), ss);
      if (full < dim) {
        const __m256 t = load_tail(xr + full, m);
        ss = _mm256_fmadd_ps(t, t, ss);
      }
      const __m256 inv = _mm256_set1_ps(1.0f / std::sqrt(simd::hsum(ss) / static_cast<float>(dim) + eps));
      auto one = [&](__m256 xv, __m256 wv, __m256 zv) {
        return _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(xv, inv), wv), silu8(zv));
      };
      for (int64_t i = 0; i < full; i += 8)
        _mm256_storeu_ps(o + i, one(_mm256_loadu_ps(xr + i), _mm256_loadu_ps(weight + i), _mm256_loadu_ps(zr + i)));
      if (full < dim)
        _mm256_maskstore_ps(o + full, m,
                            one(load_tail(xr + full, m), load_tail(weight + full, m), load_tail(zr + full, m)));
    }
  });
}

}  // namespace larder::kernels::cpu::avx2
