#include "larder/models/blocks/projection.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_map>
#include <utility>

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

void check_run(const Projection& p, const AdapterRun& r, int64_t n, const LowRankDelta& d) {
  LARDER_CHECK(r.row0 >= 0 && r.row0 + r.n <= n, "[model] %s: adapter rows [%lld, %lld) outside the call's %lld rows",
               p.name().c_str(), (long long)r.row0, (long long)(r.row0 + r.n), (long long)n);
  LARDER_CHECK(d.f.a != nullptr && d.f.bp != nullptr && d.f.in == p.in() && d.f.out == p.out(),
               "[model] %s: adapter delta without A or B, or of another shape", p.name().c_str());
}

// The deltas of `count` projections of one input x (a group: q/k/v, gate/up; or one projection),
// each into its ys[i]. Work: a task per (projection, adapter delta, up to kBlock of its rows) —
// u = B·(A x) for those rows (kernels::lora_delta: the delta's factors read once per task, in
// their file dtype, not once per row) — then y += s·u run by run in run order (a row under
// several adapters gets them in the order listed). A decode call runs its tasks on the calling
// thread, no kernel dispatch; longer calls (prefill) spread them over the pool: decode tasks are
// too small to pay for a pool job (bench/RESULTS.md, LoRA sections of sessions 38–40). A row's
// arithmetic depends only on its x and the delta — never on the task it lands in, the thread, the
// tier or the rows beside it — so a row equals its forward alone, bit for bit.
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
  thread_local std::unordered_map<const LowRankDelta*, size_t> first_tl;  // a delta's first job
  thread_local std::vector<std::pair<size_t, size_t>> order_tl;          // (its delta's first job, job)
  std::vector<Job>& jobs = jobs_tl;
  std::vector<Task>& tasks = tasks_tl;
  std::vector<const float*>& xs = xs_tl;
  std::vector<float*>& uo = uo_tl;
  std::vector<float>& u_all = u_tl;
  std::unordered_map<const LowRankDelta*, size_t>& first = first_tl;
  std::vector<std::pair<size_t, size_t>>& order = order_tl;
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
  // every sequence), in the order the deltas first appear, cut at kBlock rows (prefill). A delta
  // belongs to one projection, so ordering the jobs by their delta's first job groups them in
  // O(J log J) (a scan of every job per job was quadratic in the runs).
  first.clear();
  order.clear();
  for (size_t g = 0; g < jobs.size(); ++g) {
    const size_t f = first.try_emplace(jobs[g].d, g).first->second;
    order.emplace_back(f, g);
  }
  std::sort(order.begin(), order.end());
  for (size_t oi = 0; oi < order.size(); ++oi) {
    const Job& j = jobs[order[oi].second];
    const int64_t in = ps[j.proj]->in(), out = ps[j.proj]->out();
    if (oi == 0 || j.d != jobs[order[oi - 1].second].d) tasks.push_back({j.proj, j.d, xs.size(), xs.size()});
    for (int64_t k = j.k0; k < j.k1; ++k) {
      if (static_cast<int64_t>(xs.size() - tasks.back().begin) == kBlock)
        tasks.push_back({j.proj, j.d, xs.size(), xs.size()});
      xs.push_back(x + (j.r->row0 + k) * in);
      uo.push_back(u_all.data() + j.u + (k - j.k0) * out);
      tasks.back().end = xs.size();
    }
  }
  auto run_task = [&](int64_t ti, int) {
    thread_local std::vector<float> t;  // the task's A·x, [rows, rank]
    const Task& tk = tasks[static_cast<size_t>(ti)];
    const LowRankDelta& d = *tk.d;
    const int64_t m = static_cast<int64_t>(tk.end - tk.begin);
    if (t.size() < static_cast<size_t>(m * d.f.rank)) t.resize(static_cast<size_t>(m * d.f.rank));
    kernels::lora_delta(d.f, xs.data() + tk.begin, m, t.data(), uo.data() + tk.begin);
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
    t.assign(static_cast<size_t>(d->f.rank), 0.0);
    const double s = static_cast<double>(r.scale) * static_cast<double>(d->scale);
    for (int64_t i = r.row0; i < r.row0 + r.n; ++i) {
      const float* xr = x + i * in;
      for (int64_t k = 0; k < d->f.rank; ++k) {
        double acc = 0;
        for (int64_t j = 0; j < in; ++j) acc += static_cast<double>(d->f.a_at(k, j)) * xr[j];
        t[static_cast<size_t>(k)] = acc;
      }
      for (int64_t o = 0; o < out; ++o) {
        double acc = 0;
        for (int64_t k = 0; k < d->f.rank; ++k)
          acc += static_cast<double>(d->f.b_at(o, k)) * t[static_cast<size_t>(k)];
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
