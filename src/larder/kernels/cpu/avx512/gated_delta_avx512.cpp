// gated_delta_avx512.cpp — the Gated DeltaNet kernels (kernels/gated_delta.h) for the AVX-512 tier,
// on the thread pool: causal conv1d (+SiLU), the per-head L2 norm, the gates, the recurrent delta
// rule and the gated RMSNorm, 16 lanes, ragged tails under masks. The chunked form stays on the
// reference (gated_delta.h says why).
//
// The recurrent delta rule: each state row S[h][i] evolves on its own, so a job owns a head's rows
// (or a slice of them) and runs pairs of 8-row groups through blocks of 16 tokens (the block's q/k
// in L1, the groups' rows too), the two groups taking turns per token so that one's lane sums and δ
// overlap the other's pass. Unlike the AVX2 tier's two passes per token (decay + S·k, then δ⊗k +
// S·q), one pass does all of it, using kv_t = (g_t·S)·k_t = g_t·(S·k_t): the pass that writes the
// state after token t also forms S·k_{t+1}, so per token each state vector is loaded and stored once:
//   s ← fma(k_t, δ_t, g_t·s);  y_t += s·q_t;  u_{t+1} += s·k_{t+1};  δ_{t+1} = (v − g_{t+1}·u_{t+1})·β.
// The first token of a block has no previous pass: a read-only pass forms u from the stored state
// with the same fma sequence (ascending vectors, one accumulator, zero start) and reduction, so it
// gives u's exact bits; hence every (row, token) step is the same arithmetic whatever the block,
// call split, job or thread: outputs and state are bit-identical across call splits and thread
// counts (tests/unit/kernels_fast/gated_delta_fast_test.cpp). Dot products accumulate in 16 f32
// lanes (the reference: double).
//
// The conv: jobs over ranges of 16-channel blocks, tokens outer so x rows stream contiguously; the
// taps are transposed per job to one vector per (block, tap) and summed in the reference's order.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "larder/core/threadpool.h"
#include "larder/kernels/cpu/avx512/simd_exp_avx512.h"
#include "larder/kernels/cpu/common/cpu_kernels.h"
#include "larder/kernels/cpu/common/parallel_split.h"
#include "larder/kernels/ref/ref_ops.h"

namespace larder::kernels::cpu::avx512 {

namespace {

// Lanes [0, k): none for k <= 0, all 16 for k >= 16.
inline __mmask16 first16(int64_t k) {
  return k >= 16 ? __mmask16(0xFFFF) : k <= 0 ? __mmask16(0) : __mmask16((1u << k) - 1);
}

inline __m512 silu16(__m512 x) {
  const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), x));
  return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

// A fixed reduction order (halves, then quarters, ...): the same bits wherever it is called.
inline float hsum16(__m512 v) {
  const __m256 h = _mm256_add_ps(_mm512_extractf32x8_ps(v, 0), _mm512_extractf32x8_ps(v, 1));
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The lane sums of 8 vectors at once, out[i] = Σ v[i]: per vector the same tree as hsum16 (128-bit
// lanes 0+2 and 1+3, those two, then within the lane (0+2) + (1+3)), so the same bits, in 21
// shuffles and adds instead of 8 × 8.
inline void hsum16x8(const __m512 (&v)[8], float* out) {
  __m512 t[4];
  for (int i = 0; i < 4; ++i)
    t[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));  // [a0+a2, a1+a3, b0+b2, b1+b3]
  // [v0, v1, v2, v3] and [v4, v5, v6, v7], one 128-bit lane each.
  const __m512 u0 = _mm512_add_ps(_mm512_shuffle_f32x4(t[0], t[1], 0x88), _mm512_shuffle_f32x4(t[0], t[1], 0xDD));
  const __m512 u1 = _mm512_add_ps(_mm512_shuffle_f32x4(t[2], t[3], 0x88), _mm512_shuffle_f32x4(t[2], t[3], 0xDD));
  // Per lane L: [u0_0 + u0_2, u1_0 + u1_2, u0_1 + u0_3, u1_1 + u1_3], then elements 0+2 and 1+3.
  const __m512 x = _mm512_add_ps(_mm512_unpacklo_ps(u0, u1), _mm512_unpackhi_ps(u0, u1));
  const __m512 z = _mm512_add_ps(x, _mm512_permute_ps(x, _MM_SHUFFLE(1, 0, 3, 2)));
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, z);
  for (int l = 0; l < 4; ++l) {
    out[l] = lanes[4 * l];
    out[4 + l] = lanes[4 * l + 1];
  }
}

constexpr int kMaxConvKernel = 16;

}  // namespace

void causal_conv1d(const float* x, int64_t n, const CausalConv1dParams& p, float* state, float* out) {
  const int K = p.kernel, keep = K - 1;
  const int64_t C = p.channels;
  if (n <= 0) return;
  if (K > kMaxConvKernel) return ref::causal_conv1d(x, n, p, state, out);
  const int64_t blocks = (C + 15) / 16;
  // The family's kernel 4 at decode: each block's taps transposed in registers (16 channels × 4
  // taps are 4 vectors) instead of into a buffer per call, which cost more than the conv itself.
  const bool in_regs = K == 4 && n < 16;
  parallel_split(blocks, 4, n * K * 16, [&](int64_t b0, int64_t b1) {
    // Otherwise the range's taps, transposed to one 16-channel vector per (block, tap); zeros past C.
    thread_local std::vector<float> w, bias;
    if (!in_regs) {
      w.assign(static_cast<size_t>((b1 - b0) * K * 16), 0.0f);
      bias.assign(static_cast<size_t>((b1 - b0) * 16), 0.0f);
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t c0 = b * 16;
        const int lanes = static_cast<int>(std::min<int64_t>(16, C - c0));
        for (int l = 0; l < lanes; ++l) {
          for (int j = 0; j < K; ++j) w[static_cast<size_t>(((b - b0) * K + j) * 16 + l)] = p.weight[(c0 + l) * K + j];
          if (p.bias) bias[static_cast<size_t>((b - b0) * 16 + l)] = p.bias[c0 + l];
        }
      }
    }
    // Tap j of channels 0..7 of a pair of [channel][4] vectors: elements j, j + 4, ..., j + 28.
    const __m512i lane4 = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28);
    auto row = [&](int64_t r) { return r < keep ? state + r * C : x + (r - keep) * C; };
    // Kt: the tap count as a constant (the family's 4), or 0 for p.kernel.
    auto run = [&](auto kt) {
      constexpr int Kt = decltype(kt)::value;
      const int KK = Kt ? Kt : K;
      for (int64_t t = 0; t < n; ++t) {
        const float* in[kMaxConvKernel];
        for (int j = 0; j < KK; ++j) in[j] = row(t + j);
        float* o = out + t * C;
        for (int64_t b = b0; b < b1; ++b) {
          const int64_t c0 = b * 16;
          const __mmask16 m = first16(C - c0);
          __m512 acc, wj[kMaxConvKernel];
          if (in_regs) {
            const float* wp = p.weight + c0 * 4;
            const int64_t avail = (C - c0) * 4;  // weight floats left from this block on
            __m512 wv[4];
            for (int i = 0; i < 4; ++i) wv[i] = _mm512_maskz_loadu_ps(first16(avail - 16 * i), wp + 16 * i);
            for (int j = 0; j < 4; ++j) {
              const __m512i idx = _mm512_add_epi32(lane4, _mm512_set1_epi32(j));
              wj[j] = _mm512_shuffle_f32x4(_mm512_permutex2var_ps(wv[0], idx, wv[1]),
                                           _mm512_permutex2var_ps(wv[2], idx, wv[3]), 0x44);
            }
            acc = p.bias ? _mm512_maskz_loadu_ps(m, p.bias + c0) : _mm512_setzero_ps();
          } else {
            const float* wb = &w[static_cast<size_t>((b - b0) * KK * 16)];
            for (int j = 0; j < KK; ++j) wj[j] = _mm512_loadu_ps(wb + j * 16);
            acc = _mm512_loadu_ps(&bias[static_cast<size_t>((b - b0) * 16)]);
          }
          // The reference's order: bias, then taps 0..K−1 (one rounding each: fma). Unmasked
          // loads and stores but for a ragged last block (masked ones measured slower here).
          if (m == 0xFFFF) {
            for (int j = 0; j < KK; ++j) acc = _mm512_fmadd_ps(wj[j], _mm512_loadu_ps(in[j] + c0), acc);
            _mm512_storeu_ps(o + c0, p.silu ? silu16(acc) : acc);
          } else {
            for (int j = 0; j < KK; ++j) acc = _mm512_fmadd_ps(wj[j], _mm512_maskz_loadu_ps(m, in[j] + c0), acc);
            _mm512_mask_storeu_ps(o + c0, m, p.silu ? silu16(acc) : acc);
          }
        }
      }
    };
    if (K == 4) run(std::integral_constant<int, 4>{});
    else run(std::integral_constant<int, 0>{});
    // The new state: rows n .. n+K−2 of state ++ x. Ascending r reads row n + r > r, never a row
    // written before it.
    for (int r = 0; r < keep; ++r) {
      const float* src = row(n + r);
      const int64_t c0 = b0 * 16, c1 = std::min(C, b1 * 16);
      std::memmove(state + r * C + c0, src + c0, static_cast<size_t>(c1 - c0) * sizeof(float));
    }
  });
}

namespace {

// Masked loads of a ragged tail only: whole vectors load and store unmasked (masked zmm stores
// measured ~2× slower on these streams on Zen 5).
template <class F>
inline void over_vectors(int64_t dim, F&& f) {
  const int64_t full = dim / 16 * 16;
  for (int64_t i = 0; i < full; i += 16) f(i, __mmask16(0xFFFF), std::true_type{});
  if (full < dim) f(full, first16(dim - full), std::false_type{});
}

template <bool Full>
inline __m512 load16(const float* p, __mmask16 m) {
  if constexpr (Full) return _mm512_loadu_ps(p);
  else return _mm512_maskz_loadu_ps(m, p);
}
template <bool Full>
inline void store16(float* p, __mmask16 m, __m512 v) {
  if constexpr (Full) _mm512_storeu_ps(p, v);
  else _mm512_mask_storeu_ps(p, m, v);
}

}  // namespace

void l2norm_heads(float* x, int64_t n, const L2NormParams& p) {
  const int dim = p.dim;
  parallel_split(n * p.heads, 16, dim, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* v = x + (r / p.heads) * p.stride + (r % p.heads) * dim;
      __m512 ss = _mm512_setzero_ps();
      over_vectors(dim, [&](int64_t i, __mmask16 m, auto full) {
        const __m512 t = load16<decltype(full)::value>(v + i, m);
        ss = _mm512_fmadd_ps(t, t, ss);
      });
      const __m512 f = _mm512_set1_ps(p.scale / std::sqrt(hsum16(ss) + p.eps));
      over_vectors(dim, [&](int64_t i, __mmask16 m, auto full) {
        constexpr bool F = decltype(full)::value;
        store16<F>(v + i, m, _mm512_mul_ps(load16<F>(v + i, m), f));
      });
    }
  });
}

void rmsnorm_gated(const float* x, const float* z, const float* weight, int64_t rows, int64_t dim, float eps,
                   float* out) {
  parallel_split(rows, 16, dim * 4, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * dim;
      const float* zr = z + r * dim;
      float* o = out + r * dim;
      __m512 ss = _mm512_setzero_ps();
      over_vectors(dim, [&](int64_t i, __mmask16 m, auto full) {
        const __m512 t = load16<decltype(full)::value>(xr + i, m);
        ss = _mm512_fmadd_ps(t, t, ss);
      });
      const __m512 inv = _mm512_set1_ps(1.0f / std::sqrt(hsum16(ss) / static_cast<float>(dim) + eps));
      over_vectors(dim, [&](int64_t i, __mmask16 m, auto full) {
        constexpr bool F = decltype(full)::value;
        const __m512 xv = load16<F>(xr + i, m), wv = load16<F>(weight + i, m), zv = load16<F>(zr + i, m);
        store16<F>(o + i, m, _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(xv, inv), wv), silu16(zv)));
      });
    }
  });
}

namespace {

// log1p(t) for t in [0, 1]: w = 1 + t rounded, log w = 2·atanh(s) with s = (w − 1)/(w + 1) ∈ [0, 1/3]
// (odd series to s^17: truncation < 2^-27 relative), times t/(w − 1), which corrects w's rounding
// (Goldberg's log1p); w = 1 (t below half an ulp of 1) gives t itself.
inline __m512 log1p01(__m512 t) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 w = _mm512_add_ps(one, t), wm1 = _mm512_sub_ps(w, one);
  const __m512 s = _mm512_div_ps(wm1, _mm512_add_ps(w, one)), s2 = _mm512_mul_ps(s, s);
  __m512 p = _mm512_set1_ps(1.0f / 17);
  for (float c : {1.0f / 15, 1.0f / 13, 1.0f / 11, 1.0f / 9, 1.0f / 7, 1.0f / 5, 1.0f / 3, 1.0f})
    p = _mm512_fmadd_ps(p, s2, _mm512_set1_ps(c));
  const __m512 log_w = _mm512_mul_ps(_mm512_add_ps(s, s), p);
  const __mmask16 exact = _mm512_cmp_ps_mask(wm1, _mm512_setzero_ps(), _CMP_EQ_OQ);
  return _mm512_mask_blend_ps(exact, _mm512_mul_ps(log_w, _mm512_div_ps(t, wm1)), t);
}

}  // namespace

// log_g = −exp(A_log)·softplus(a + dt_bias), softplus(u) = max(u, 0) + log1p(e^−|u|); β = 1/(1 + e^−b).
void gated_delta_gates(const float* a, const float* b, int64_t n, const GatedDeltaGateParams& p, float* log_g,
                       float* beta) {
  const int hv = p.n_v_heads;
  const __m512 one = _mm512_set1_ps(1.0f), zero = _mm512_setzero_ps();
  const __m512 sign = _mm512_set1_ps(-0.0f);
  parallel_split(n, 16, hv * 8, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      for (int h = 0; h < hv; h += 16) {
        const __mmask16 m = first16(hv - h);
        const int64_t i = t * hv + h;
        const __m512 u = _mm512_add_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, p.dt_bias + h));
        const __m512 e = exp16(_mm512_or_ps(u, sign));  // e^−|u|
        const __m512 sp = _mm512_add_ps(_mm512_max_ps(u, zero), log1p01(e));
        const __m512 decay = exp16(_mm512_maskz_loadu_ps(m, p.a_log + h));
        _mm512_mask_storeu_ps(log_g + i, m, _mm512_xor_ps(_mm512_mul_ps(decay, sp), sign));
        const __m512 eb = exp16(_mm512_xor_ps(_mm512_maskz_loadu_ps(m, b + i), sign));
        _mm512_mask_storeu_ps(beta + i, m, _mm512_div_ps(one, _mm512_add_ps(one, eb)));
      }
    }
  });
}

namespace {

// u[r] = S_r·k (the read-only pass at the start of a block): one accumulator, vectors ascending —
// the fma sequence the fused pass runs for its u_{t+1}, so the bits are the same.
template <int R>
inline void dot_rows(float* const* rows, int dk, const float* k, float* u) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const int full = dk / 16 * 16;
  for (int j = 0; j < full; j += 16) {
    const __m512 kj = _mm512_loadu_ps(k + j);
    for (int r = 0; r < R; ++r) acc[r] = _mm512_fmadd_ps(_mm512_loadu_ps(rows[r] + j), kj, acc[r]);
  }
  if (full < dk) {
    const __mmask16 m = first16(dk - full);
    const __m512 kj = _mm512_maskz_loadu_ps(m, k + full);
    for (int r = 0; r < R; ++r) acc[r] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, rows[r] + full), kj, acc[r]);
  }
  for (int r = 0; r < R; ++r) u[r] = hsum16(acc[r]);
}

// One token's pass over R rows: s ← fma(k, δ, g·s), stored; ay += s·q; with Next, au += s·k_next.
// Whole vectors unmasked (masked zmm stores are slow on some cores), the ragged tail masked.
template <int R, bool Next>
inline void token_pass(float* const* rows, int dk, const float* q, const float* k, const float* kn, __m512 g,
                       const __m512 (&d)[R], __m512 (&ay)[R], __m512 (&au)[R]) {
  const int full = dk / 16 * 16;
  for (int j = 0; j < full; j += 16) {
    const __m512 kj = _mm512_loadu_ps(k + j), qj = _mm512_loadu_ps(q + j);
    for (int r = 0; r < R; ++r) {
      const __m512 s = _mm512_fmadd_ps(kj, d[r], _mm512_mul_ps(_mm512_loadu_ps(rows[r] + j), g));
      _mm512_storeu_ps(rows[r] + j, s);
      ay[r] = _mm512_fmadd_ps(s, qj, ay[r]);
      if constexpr (Next) au[r] = _mm512_fmadd_ps(s, _mm512_loadu_ps(kn + j), au[r]);
    }
  }
  if (full < dk) {
    const __mmask16 m = first16(dk - full);
    const __m512 kj = _mm512_maskz_loadu_ps(m, k + full), qj = _mm512_maskz_loadu_ps(m, q + full);
    for (int r = 0; r < R; ++r) {
      const __m512 s = _mm512_fmadd_ps(kj, d[r], _mm512_mul_ps(_mm512_maskz_loadu_ps(m, rows[r] + full), g));
      _mm512_mask_storeu_ps(rows[r] + full, m, s);
      ay[r] = _mm512_fmadd_ps(s, qj, ay[r]);
      if constexpr (Next) au[r] = _mm512_fmadd_ps(s, _mm512_maskz_loadu_ps(m, kn + full), au[r]);
    }
  }
}

// One token of R rows: δ from u = S·k_t, the pass, then y_t and (Next) u = S·k_{t+1}.
template <int R>
__attribute__((always_inline)) inline void token_step(float* const* rows, float* u, int dk, bool next,
                                                      const float* q, const float* k, int64_t qk_step,
                                                      const float* v, float gs, float b, float* y) {
  const __m512 g = _mm512_set1_ps(gs);
  __m512 d[R], ay[R], au[R];
  for (int r = 0; r < R; ++r) {
    d[r] = _mm512_set1_ps((v[r] - gs * u[r]) * b);
    ay[r] = _mm512_setzero_ps();
    au[r] = _mm512_setzero_ps();
  }
  if (next) token_pass<R, true>(rows, dk, q, k, k + qk_step, g, d, ay, au);
  else token_pass<R, false>(rows, dk, q, k, nullptr, g, d, ay, au);
  if constexpr (R % 4 == 0) {
    for (int r0 = 0; r0 < R; r0 += 4) {
      const __m512 acc[8] = {ay[r0], ay[r0 + 1], ay[r0 + 2], ay[r0 + 3], au[r0], au[r0 + 1], au[r0 + 2], au[r0 + 3]};
      float sums[8];
      hsum16x8(acc, sums);
      for (int r = 0; r < 4; ++r) {
        y[r0 + r] = sums[r];
        u[r0 + r] = sums[4 + r];
      }
    }
  } else {
    for (int r = 0; r < R; ++r) {
      y[r] = hsum16(ay[r]);
      u[r] = hsum16(au[r]);
    }
  }
}

// G groups of R state rows (rows[i] = &S[h][i0 + i][0], d_k floats each) of value head h through
// tokens [0, n), the groups taking turns per token: one group's reduction and δ (a latency chain
// the next pass waits on) overlap the other group's pass. q, k, v, log_g, beta, y already point
// at this head's first token and row; qk_step, v_step, gb_step, y_step are the per-token strides.
template <int R, int G>
void delta_rows(float* const* rows, int dk, int64_t n, const float* q, const float* k, int64_t qk_step,
                const float* v, int64_t v_step, const float* log_g, const float* beta, int64_t gb_step, float* y,
                int64_t y_step) {
  float u[R * G];  // S_r·k_t for the token about to run
  for (int gi = 0; gi < G; ++gi) dot_rows<R>(rows + gi * R, dk, k, u + gi * R);
  for (int64_t t = 0; t < n; ++t, q += qk_step, k += qk_step, v += v_step, y += y_step) {
    const float gs = std::exp(log_g[t * gb_step]);
    const float b = beta[t * gb_step];
    for (int gi = 0; gi < G; ++gi)
      token_step<R>(rows + gi * R, u + gi * R, dk, t + 1 < n, q, k, qk_step, v + gi * R, gs, b, y + gi * R);
  }
}

constexpr int kRowGroup = 8;
constexpr int64_t kTokenBlock = 16;

}  // namespace

void gated_delta_recurrent(const GatedDeltaInputs& in, const GatedDeltaShape& s, float* state, float* y) {
  const int dk = s.d_k, dv = s.d_v, hv = s.n_v_heads;
  const int group = hv / s.n_k_heads;
  const int64_t qks = in.qkv_stride ? in.qkv_stride : static_cast<int64_t>(s.n_k_heads) * dk;
  const int64_t vs = in.qkv_stride ? in.qkv_stride : static_cast<int64_t>(hv) * dv;
  const int64_t ys = static_cast<int64_t>(hv) * dv;
  // Jobs: a head's rows, split further (in whole row groups) when there are fewer heads than
  // threads want.
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

}  // namespace larder::kernels::cpu::avx512
