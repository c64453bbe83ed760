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

// outs[i][j] = Σ_c m[j·cols + c] · xs[i][c] for j < rows, i < nx: eight rows of m at a time, each
// in one AVX2 accumulator over 8-column steps, the eight sums reduced together (hadd), the column
// tail by fma. The block of m is read from memory once and reused from L1 for every x (rows of a
// batch under one adapter share its matrices). An output's arithmetic depends on m, its x and
// cols alone — never on nx or the other xs — so a row gets the same bits batched or alone.
void matvec8(const float* m, int64_t rows, int64_t cols, const float* const* xs, int64_t nx, float* const* outs) {
  const int64_t c8 = cols & ~int64_t{7};
  int64_t j = 0;
  for (; j + 8 <= rows; j += 8) {
    const float* mj = m + j * cols;
    for (int64_t i = 0; i < nx; ++i) {
      const float* x = xs[i];
      __m256 acc[8];
      for (int r = 0; r < 8; ++r) acc[r] = _mm256_setzero_ps();
      for (int64_t c = 0; c < c8; c += 8) {
        const __m256 xv = _mm256_loadu_ps(x + c);
        for (int r = 0; r < 8; ++r) acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(mj + r * cols + c), xv, acc[r]);
      }
      const __m256 s01 = _mm256_hadd_ps(acc[0], acc[1]), s23 = _mm256_hadd_ps(acc[2], acc[3]);
      const __m256 s45 = _mm256_hadd_ps(acc[4], acc[5]), s67 = _mm256_hadd_ps(acc[6], acc[7]);
      const __m256 s0123 = _mm256_hadd_ps(s01, s23), s4567 = _mm256_hadd_ps(s45, s67);
      const __m256 sum = _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20),
                                       _mm256_permute2f128_ps(s0123, s4567, 0x31));
      alignas(32) float v[8];
      _mm256_store_ps(v, sum);
      for (int r = 0; r < 8; ++r) {
        for (int64_t c = c8; c < cols; ++c) v[r] = std::fma(mj[r * cols + c], x[c], v[r]);
        outs[i][j + r] = v[r];
      }
    }
  }
  for (; j < rows; ++j) {
    for (int64_t i = 0; i < nx; ++i) {
      const float* x = xs[i];
      __m256 acc = _mm256_setzero_ps();
      for (int64_t c = 0; c < c8; c += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(m + j * cols + c), _mm256_loadu_ps(x + c), acc);
      alignas(32) float v[8];
      _mm256_store_ps(v, acc);
      float s = ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
      for (int64_t c = c8; c < cols; ++c) s = std::fma(m[j * cols + c], x[c], s);
      outs[i][j] = s;
    }
  }
}

void check_run(const Projection& p, const AdapterRun& r, int64_t n, const LowRankDelta& d) {
  LARDER_CHECK(r.row0 >= 0 && r.row0 + r.n <= n, "[model] %s: adapter rows [%lld, %lld) outside the call's %lld rows",
               p.name().c_str(), (long long)r.row0, (long long)(r.row0 + r.n), (long long)n);
  LARDER_CHECK(d.a != nullptr && d.b != nullptr, "[model] %s: adapter delta without A or B", p.name().c_str());
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
  if (!any_delta(p, adapters)) return;
  profile::Scope scope(profile::enabled() ? "lora delta" : "");
  const int64_t in = p.in(), out = p.out();
  // On the calling thread, no kernel dispatch: the rows of all runs of one adapter together,
  // t = A x then u = B t for each (matvec8: the adapter's matrices read once per call, not once
  // per row), then y += s·u run by run in run order (a row under several adapters gets them in
  // the order listed). A kernels::matmul per run cost two pool dispatches per (sequence, adapter,
  // projection), and reading an adapter's f32 matrices per row doubled its memory traffic at two
  // rows per adapter (bench/RESULTS.md, session 38). A row's bits never depend on the rows beside
  // it, so a row equals its forward alone. Long runs (prefill) are cut into blocks of kBlock rows
  // spread over the pool.
  struct Job {
    const AdapterRun* r;
    const LowRankDelta* d;
    int64_t k0, k1;  // rows [row0 + k0, row0 + k1) of the run
    int64_t u = 0;   // its first row in the scratch
  };
  constexpr int64_t kBlock = 16;
  thread_local std::vector<Job> jobs_tl;
  std::vector<Job>& jobs = jobs_tl;  // this thread's: the pool's workers below read it through this
  jobs.clear();
  int64_t rank_max = 0, rows = 0;
  for (const AdapterRun& r : adapters) {
    const LowRankDelta* d = r.n > 0 && r.adapter ? r.adapter->find(p.id()) : nullptr;
    if (!d) continue;
    check_run(p, r, n, *d);
    rank_max = std::max(rank_max, d->rank);
    for (int64_t k = 0; k < r.n; k += kBlock) {
      jobs.push_back({&r, d, k, std::min(r.n, k + kBlock), rows});
      rows += std::min(r.n, k + kBlock) - k;
    }
  }
  struct Scratch {
    std::vector<float> t, u;
    std::vector<const float*> xs, ts;
    std::vector<float*> to, uo;
  };
  thread_local Scratch sc;
  if (sc.u.size() < static_cast<size_t>(rows * out)) sc.u.resize(static_cast<size_t>(rows * out));
  float* const u_all = sc.u.data();
  // Group g (a decode batch): the jobs from g on with g's delta — one adapter's rows — into
  // u_all at each job's offset; the jobs it takes are marked (d = null).
  auto group = [&](size_t g, Scratch& s) {
    const LowRankDelta* d = jobs[g].d;
    s.xs.clear();
    s.uo.clear();
    for (size_t i = g; i < jobs.size(); ++i) {
      if (jobs[i].d != d) continue;
      for (int64_t k = jobs[i].k0; k < jobs[i].k1; ++k) {
        s.xs.push_back(x + (jobs[i].r->row0 + k) * in);
        s.uo.push_back(u_all + (jobs[i].u + k - jobs[i].k0) * out);
      }
      jobs[i].d = nullptr;
    }
    const int64_t m = static_cast<int64_t>(s.xs.size());
    if (s.t.size() < static_cast<size_t>(m * d->rank)) s.t.resize(static_cast<size_t>(m * d->rank));
    s.to.resize(static_cast<size_t>(m));
    s.ts.resize(static_cast<size_t>(m));
    for (int64_t i = 0; i < m; ++i) s.to[i] = s.t.data() + i * d->rank, s.ts[i] = s.to[i];
    matvec8(d->a, d->rank, in, s.xs.data(), m, s.to.data());
    matvec8(d->b, out, d->rank, s.ts.data(), m, s.uo.data());
  };
  thread_local std::vector<const LowRankDelta*> deltas;  // the jobs' deltas (group() clears them)
  deltas.assign(jobs.size(), nullptr);
  for (size_t i = 0; i < jobs.size(); ++i) deltas[i] = jobs[i].d;
  if (rows <= kBlock) {
    for (size_t g = 0; g < jobs.size(); ++g)
      if (jobs[g].d) group(g, sc);
  } else {
    // Prefill: one group per job (a block of kBlock rows of one run), spread over the pool.
    parallel_for(static_cast<int64_t>(jobs.size()), [&](int64_t g, int) {
      thread_local Scratch local;
      const Job& j = jobs[static_cast<size_t>(g)];
      local.xs.clear();
      local.uo.clear();
      for (int64_t k = j.k0; k < j.k1; ++k) {
        local.xs.push_back(x + (j.r->row0 + k) * in);
        local.uo.push_back(u_all + (j.u + k - j.k0) * out);
      }
      const int64_t m = j.k1 - j.k0;
      if (local.t.size() < static_cast<size_t>(m * j.d->rank)) local.t.resize(static_cast<size_t>(m * j.d->rank));
      local.to.resize(static_cast<size_t>(m));
      local.ts.resize(static_cast<size_t>(m));
      for (int64_t i = 0; i < m; ++i) local.to[i] = local.t.data() + i * j.d->rank, local.ts[i] = local.to[i];
      matvec8(j.d->a, j.d->rank, in, local.xs.data(), m, local.to.data());
      matvec8(j.d->b, out, j.d->rank, local.ts.data(), m, local.uo.data());
    });
  }
  for (size_t i = 0; i < jobs.size(); ++i) {
    const Job& j = jobs[i];
    const float s = j.r->scale * deltas[i]->scale;
    for (int64_t k = j.k0; k < j.k1; ++k) {
      float* yr = y + (j.r->row0 + k) * out;
      const float* ur = u_all + (j.u + k - j.k0) * out;
      for (int64_t c = 0; c < out; ++c) yr[c] += s * ur[c];
    }
  }
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
  if (!adapters.empty())
    for (int i = 0; i < count; ++i) add_deltas(*ps[i], x, n, ys[i], adapters);
}

}  // namespace larder::models
