#include "larder/models/blocks/projection.h"

#include <cstring>

#include "larder/core/profile.h"
#include "larder/core/status.h"

namespace larder::models {

namespace {

// y[n, dim] += bias[dim] per row (no-op for an empty bias): the kernels' add, as before.
void add_bias(float* y, int64_t n, const std::vector<float>& bias) {
  if (bias.empty()) return;
  const int64_t d = static_cast<int64_t>(bias.size());
  for (int64_t t = 0; t < n; ++t) kernels::add(y + t * d, bias.data(), y + t * d, d);
}

kernels::WeightView f32_view(const float* data, int64_t rows, int64_t cols) {
  kernels::WeightView v;
  v.dtype = DType::kF32;
  v.rows = rows;
  v.cols = cols;
  v.data = reinterpret_cast<const uint8_t*>(data);
  return v;
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
  // Per engine thread; a forward is single-threaded per model (the pool runs inside the matmuls).
  thread_local std::vector<float> t, u;
  for (const AdapterRun& r : adapters) {
    const LowRankDelta* d = r.n > 0 && r.adapter ? r.adapter->find(p.id()) : nullptr;
    if (!d) continue;
    check_run(p, r, n, *d);
    t.resize(static_cast<size_t>(r.n * d->rank));
    u.resize(static_cast<size_t>(r.n * out));
    kernels::matmul(f32_view(d->a, d->rank, in), x + r.row0 * in, r.n, t.data());
    kernels::matmul(f32_view(d->b, out, d->rank), t.data(), r.n, u.data());
    const float s = r.scale * d->scale;
    for (int64_t i = 0; i < r.n; ++i) {
      float* yr = y + (r.row0 + i) * out;
      const float* ur = u.data() + i * out;
      for (int64_t j = 0; j < out; ++j) yr[j] += s * ur[j];
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
