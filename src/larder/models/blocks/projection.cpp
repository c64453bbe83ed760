#include "larder/models/blocks/projection.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "larder/core/profile.h"
#include "larder/core/status.h"
#include "larder/core/threadpool.h"

namespace larder::models {

namespace {

// y[n, dim] += bias[dim] per row (no-op for an empty bias): the kernels' add, as before.
void add_bias(float* y, int64_t n, const std::vector<float>& bias) {
  if (bias.empty()) return;
  const int64_t d = static_cast<int64_t>(bias.size());
  for (int64_t t = 0; t < n; ++t) kernels::add(y + t * d, bias.data(), y + t * d, d);
}

// Whether any run carries a delta for p (the common no-adapter call returns at once).
bool any_delta(const Projection& p, AdapterRows adapters) {
  for (const AdapterRun& r : adapters)
    if (r.n > 0 && r.adapter && r.adapter->find(p.id())) return true;
  return false;
}

// How matvec8 reads its matrix: f32, or BF16 / F16 widened to f32 on load (exact: every 16-bit
// value is an f32 value), so a 16-bit adapter computes the same bits as its widened f32 copy while
// reading half the bytes.
struct LoadF32 {
  using T = float;
  static __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
  static float load1(const float* p) { return *p; }
};
struct LoadBF16 {
  using T = uint16_t;
  static __m256 load8(const uint16_t* p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  static float load1(const uint16_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return bf16_to_f32(h);
  }
};
struct LoadF16 {
  using T = uint16_t;
  static __m256 load8(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static float load1(const uint16_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _cvtsh_ss(h);
  }
};

// outs[i][j] = Σ_c m[j·cols + c] · xs[i][c] for j < rows, i < nx: eight rows of m at a time, each
// in one AVX2 accumulator over 8-column steps, the eight sums reduced together (hadd), the column
// tail by fma. The block of m is read from memory once and reused from L1 for every x (rows of a
// batch under one adapter share its matrices). An output's arithmetic depends on m, its x and
// cols alone — never on nx or the other xs — so a row gets the same bits batched or alone.
template <class L>
void matvec8(const typename L::T* m, int64_t rows, int64_t cols, const float* const* xs, int64_t nx, float* const* outs) {
  const int64_t c8 = cols & ~int64_t{7};
  int64_t j = 0;
  for (; j + 8 <= rows; j += 8) {
    const typename L::T* mj = m + j * cols;
    for (int64_t i = 0; i < nx; ++i) {
      const float* x = xs[i];
      __m256 acc[8];
      for (int r = 0; r < 8; ++r) acc[r] = _mm256_setzero_ps();
      for (int64_t c = 0; c < c8; c += 8) {
        const __m256 xv = _mm256_loadu_ps(x + c);
        for (int r = 0; r < 8; ++r) acc[r] = _mm256_fmadd_ps(L::load8(mj + r * cols + c), xv, acc[r]);
      }
      const __m256 s01 = _mm256_hadd_ps(acc[0], acc[1]), s23 = _mm256_hadd_ps(acc[2], acc[3]);
      const __m256 s45 = _mm256_hadd_ps(acc[4], acc[5]), s67 = _mm256_hadd_ps(acc[6], acc[7]);
      const __m256 s0123 = _mm256_hadd_ps(s01, s23), s4567 = _mm256_hadd_ps(s45, s67);
      const __m256 sum = _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20),
                                       _mm256_permute2f128_ps(s0123, s4567, 0x31));
      alignas(32) float v[8];
      _mm256_store_ps(v, sum);
      for (int r = 0; r < 8; ++r) {
        for (int64_t c = c8; c < cols; ++c) v[r] = std::fma(L::load1(mj + r * cols + c), x[c], v[r]);
        outs[i][j + r] = v[r];
      }
    }
  }
  for (; j < rows; ++j) {
    for (int64_t i = 0; i < nx; ++i) {
      const float* x = xs[i];
      __m256 acc = _mm256_setzero_ps();
      for (int64_t c = 0; c < c8; c += 8)
        acc = _mm256_fmadd_ps(L::load8(m + j * cols + c), _mm256_loadu_ps(x + c), acc);
      alignas(32) float v[8];
      _mm256_store_ps(v, acc);
      float s = ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
      for (int64_t c = c8; c < cols; ++c) s = std::fma(L::load1(m + j * cols + c), x[c], s);
      outs[i][j] = s;
    }
  }
}

// t = A x and u = B t for the rows xs of one delta, reading its factors in their stored dtype.
void low_rank(const LowRankDelta& d, int64_t in, int64_t out, const float* const* xs, int64_t nx, float* const* ts,
              float* const* us) {
  const float* const* tc = ts;
  if (d.half == DType::kBF16 && d.a16 && d.b16) {
    matvec8<LoadBF16>(d.a16, d.rank, in, xs, nx, ts);
    matvec8<LoadBF16>(d.b16, out, d.rank, tc, nx, us);
  } else if (d.half == DType::kF16 && d.a16 && d.b16) {
    matvec8<LoadF16>(d.a16, d.rank, in, xs, nx, ts);
    matvec8<LoadF16>(d.b16, out, d.rank, tc, nx, us);
  } else {
    matvec8<LoadF32>(d.a, d.rank, in, xs, nx, ts);
    matvec8<LoadF32>(d.b, out, d.rank, tc, nx, us);
  }
}

void check_run(const Projection& p, const AdapterRun& r, int64_t n, const LowRankDelta& d) {
  LARDER_CHECK(r.row0 >= 0 && r.row0 + r.n <= n, "[model] %s: adapter rows [%lld, %lld) outside the call's %lld rows",
               p.name().c_str(), (long long)r.row0, (long long)(r.row0 + r.n), (long long)n);
  LARDER_CHECK(d.a != nullptr && d.b != nullptr, "[model] %s: adapter delta without A or B", p.name().c_str());
}

// The deltas of `count` projections of one input x (a group: q/k/v, gate/up; or one projection),
// each into its ys[i]. Work: a task per (projection, adapter delta, up to kBlock of its rows) —
// t = A x then u = B t for those rows (matvec8: the delta's matrices read once per task, not once
// per row) — then y += s·u run by run in run order (a row under several adapters gets them in the
// order listed). A decode call runs its tasks on the calling thread, no kernel dispatch; longer
// calls (prefill) spread them over the pool: decode tasks are too small to pay for a pool job
// (bench/RESULTS.md, LoRA sections of sessions 38 and 39). A row's arithmetic depends only on its x and the delta — never on the task it lands
// in, the thread, or the rows beside it — so a row equals its forward alone, bit for bit.
void add_deltas_multi(const Projection* const* ps, float* const* ys, int count, const float* x, int64_t n,
                      AdapterRows adapters) {
  bool any = false;
  for (int i = 0; i < count && !any; ++i) any = any_delta(*ps[i], adapters);
  if (!any) return;
  profile::Scope scope(profile::enabled() ? "lora delta" : "");
  struct Job {  // rows [row0 + k0, row0 + k1) of run r for projection proj; u: its first scratch row
    int proj;
    const AdapterRun* r;
    const LowRankDelta* d;
    int64_t k0, k1, u;
  };
  struct Task {  // rows [begin, end) of the flat xs/uo lists, all under delta d of projection proj
    int proj;
    const LowRankDelta* d;
    size_t begin, end;
  };
  constexpr int64_t kBlock = 16;
  // The caller's scratch, reused across calls; bound to references so that the pool's workers
  // read the caller's lists (a thread_local named inside the lambda would be the worker's own).
  thread_local std::vector<Job> jobs_tl;
  thread_local std::vector<Task> tasks_tl;
  thread_local std::vector<const float*> xs_tl;
  thread_local std::vector<float*> uo_tl;
  thread_local std::vector<float> u_tl;
  thread_local std::vector<char> taken_tl;
  std::vector<Job>& jobs = jobs_tl;
  std::vector<Task>& tasks = tasks_tl;
  std::vector<const float*>& xs = xs_tl;
  std::vector<float*>& uo = uo_tl;
  std::vector<float>& u_all = u_tl;
  std::vector<char>& taken = taken_tl;
  jobs.clear();
  tasks.clear();
  xs.clear();
  uo.clear();
  int64_t u_size = 0;  // floats of scratch: each job's rows at its projection's width
  for (int i = 0; i < count; ++i) {
    const Projection& p = *ps[i];
    for (const AdapterRun& r : adapters) {
      const LowRankDelta* d = r.n > 0 && r.adapter ? r.adapter->find(p.id()) : nullptr;
      if (!d) continue;
      check_run(p, r, n, *d);
      for (int64_t k = 0; k < r.n; k += kBlock) {
        const int64_t k1 = std::min(r.n, k + kBlock);
        jobs.push_back({i, &r, d, k, k1, u_size});
        u_size += (k1 - k) * p.out();
      }
    }
  }
  if (u_all.size() < static_cast<size_t>(u_size)) u_all.resize(static_cast<size_t>(u_size));
  // Tasks: per projection, the jobs of one delta together (a decode batch: one adapter's rows of
  // every sequence), cut at kBlock rows (prefill).
  taken.assign(jobs.size(), 0);
  for (size_t g = 0; g < jobs.size(); ++g) {
    if (taken[g]) continue;
    const Job& jg = jobs[g];
    const int64_t in = ps[jg.proj]->in(), out = ps[jg.proj]->out();
    Task t{jg.proj, jg.d, xs.size(), 0};
    for (size_t i = g; i < jobs.size(); ++i) {
      const Job& j = jobs[i];
      if (taken[i] || j.proj != jg.proj || j.d != jg.d) continue;
      taken[i] = 1;
      for (int64_t k = j.k0; k < j.k1; ++k) {
        if (static_cast<int64_t>(xs.size() - t.begin) == kBlock) {
          t.end = xs.size();
          tasks.push_back(t);
          t.begin = xs.size();
        }
        xs.push_back(x + (j.r->row0 + k) * in);
        uo.push_back(u_all.data() + j.u + (k - j.k0) * out);
      }
    }
    t.end = xs.size();
    tasks.push_back(t);
  }
  auto run_task = [&](int64_t ti, int) {
    struct Scratch {
      std::vector<float> t;
      std::vector<float*> to;
    };
    thread_local Scratch s;
    const Task& tk = tasks[static_cast<size_t>(ti)];
    const LowRankDelta& d = *tk.d;
    const int64_t m = static_cast<int64_t>(tk.end - tk.begin);
    if (s.t.size() < static_cast<size_t>(m * d.rank)) s.t.resize(static_cast<size_t>(m * d.rank));
    s.to.resize(static_cast<size_t>(m));
    for (int64_t i = 0; i < m; ++i) s.to[static_cast<size_t>(i)] = s.t.data() + i * d.rank;
    const Projection& p = *ps[tk.proj];
    low_rank(d, p.in(), p.out(), xs.data() + tk.begin, m, s.to.data(), uo.data() + tk.begin);
  };
  if (static_cast<int64_t>(xs.size()) <= kBlock * count) {
    for (size_t t = 0; t < tasks.size(); ++t) run_task(static_cast<int64_t>(t), 0);
  } else {
    parallel_for(static_cast<int64_t>(tasks.size()), run_task);
  }
  for (const Job& j : jobs) {
    const int64_t out = ps[j.proj]->out();
    const float s = j.r->scale * j.d->scale;
    for (int64_t k = j.k0; k < j.k1; ++k) {
      float* yr = ys[j.proj] + (j.r->row0 + k) * out;
      const float* ur = u_all.data() + j.u + (k - j.k0) * out;
      for (int64_t c = 0; c < out; ++c) yr[c] += s * ur[c];
    }
  }
}

}  // namespace

std::string projection_label(const std::string& name) {
  // "model.layers.12.self_attn.q_proj" -> "self_attn.q_proj"; a text tower's prefix goes with it.
  const size_t at = name.rfind("layers.");
  if (at == std::string::npos) return name;
  const size_t dot = name.find('.', at + 7);
  return dot == std::string::npos ? name : name.substr(dot + 1);
}

void add_deltas(const Projection& p, const float* x, int64_t n, float* y, AdapterRows adapters) {
  const Projection* ps[] = {&p};
  float* ys[] = {y};
  add_deltas_multi(ps, ys, 1, x, n, adapters);
}

void add_deltas_ref(const Projection& p, const float* x, int64_t n, float* y, AdapterRows adapters) {
  const int64_t in = p.in(), out = p.out();
  std::vector<double> t;
  for (const AdapterRun& r : adapters) {
    const LowRankDelta* d = r.n > 0 && r.adapter ? r.adapter->find(p.id()) : nullptr;
    if (!d) continue;
    check_run(p, r, n, *d);
    t.assign(static_cast<size_t>(d->rank), 0.0);
    const double s = static_cast<double>(r.scale) * static_cast<double>(d->scale);
    for (int64_t i = r.row0; i < r.row0 + r.n; ++i) {
      const float* xr = x + i * in;
      for (int64_t k = 0; k < d->rank; ++k) {
        double acc = 0;
        for (int64_t j = 0; j < in; ++j) acc += static_cast<double>(d->a[k * in + j]) * xr[j];
        t[static_cast<size_t>(k)] = acc;
      }
      for (int64_t o = 0; o < out; ++o) {
        double acc = 0;
        for (int64_t k = 0; k < d->rank; ++k)
          acc += static_cast<double>(d->b[o * d->rank + k]) * t[static_cast<size_t>(k)];
        y[i * out + o] = static_cast<float>(y[i * out + o] + s * acc);
      }
    }
  }
}

Projection Projection::over(std::string name, int id, const kernels::WeightView& w, std::vector<float> bias) {
  LARDER_CHECK(bias.empty() || static_cast<int64_t>(bias.size()) == w.rows, "[model] %s: bias of %zu for %lld rows",
               name.c_str(), bias.size(), (long long)w.rows);
  Projection p;
  p.w_ = w;
  p.bias_ = std::move(bias);
  p.label_ = projection_label(name);
  p.name_ = std::move(name);
  p.id_ = id;
  return p;
}

void Projection::apply(const float* x, int64_t n, float* y, AdapterRows adapters) const {
  LARDER_DCHECK(bound(), "[model] apply of an unbound projection");
  profile::Label label(label_.c_str());
  kernels::matmul(w_, x, n, y);
  add_bias(y, n, bias_);
  if (!adapters.empty()) add_deltas(*this, x, n, y, adapters);
}

void apply_group(const Projection* const* ps, float* const* ys, int count, const float* x, int64_t n,
                 AdapterRows adapters) {
  LARDER_CHECK(count >= 1 && count <= kernels::kMaxMultiMatmul, "[model] apply_group of %d projections", count);
  if (count == 1) return ps[0]->apply(x, n, ys[0], adapters);
  kernels::WeightView ws[kernels::kMaxMultiMatmul];
  for (int i = 0; i < count; ++i) ws[i] = ps[i]->weight();
  {
    // The label of a group: its projections' labels joined ("self_attn.q_proj+k_proj+v_proj").
    std::string label;
    if (profile::enabled()) {
      label = projection_label(ps[0]->name());
      for (int i = 1; i < count; ++i) {
        const std::string li = projection_label(ps[i]->name());
        const size_t dot = li.rfind('.');
        label += "+" + (dot == std::string::npos ? li : li.substr(dot + 1));
      }
    }
    profile::Label l(label.c_str());
    kernels::matmul_multi(ws, ys, count, x, n);
  }
  for (int i = 0; i < count; ++i) add_bias(ys[i], n, ps[i]->bias());
  if (!adapters.empty()) add_deltas_multi(ps, ys, count, x, n, adapters);
}

}  // namespace larder::models
