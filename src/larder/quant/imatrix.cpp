// imatrix.cpp — see imatrix.h.
#include "larder/quant/imatrix.h"

#include <cstring>
#include <fstream>
#include <unordered_map>

#include "larder/formats/gguf.h"
#include "larder/formats/gguf_writer.h"
#include "larder/kernels/dispatch.h"
#include "larder/models/llama.h"
#include "larder/models/model.h"
#include "larder/models/tensor_names.h"

namespace larder::quant {

std::map<std::string, std::vector<float>> Imatrix::importances() const {
  std::map<std::string, std::vector<float>> out;
  for (const auto& [name, e] : entries) {
    if (e.counts.empty()) continue;
    const size_t n_mat = e.counts.size(), ne0 = e.sums.size() / n_mat;
    std::vector<float> v(e.sums.size());
    for (size_t j = 0; j < n_mat; ++j)
      for (size_t i = 0; i < ne0; ++i)
        v[j * ne0 + i] = e.counts[j] > 0 ? static_cast<float>(static_cast<float>(e.sums[j * ne0 + i]) / static_cast<float>(e.counts[j])) : 1.f;
    out[name] = std::move(v);
  }
  return out;
}

namespace {

Result<Imatrix> read_legacy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return io_error("[imatrix] cannot open " + path);
  auto rd = [&](void* p, size_t n) { return static_cast<bool>(in.read(static_cast<char*>(p), static_cast<std::streamsize>(n))); };
  int32_t n_entries = 0;
  if (!rd(&n_entries, 4) || n_entries < 1 || n_entries > 1'000'000)
    return invalid_argument("[imatrix] " + path + ": not an imatrix file (neither GGUF nor a legacy .dat)");
  Imatrix m;
  for (int32_t i = 0; i < n_entries; ++i) {
    int32_t len = 0, ncall = 0, nval = 0;
    if (!rd(&len, 4) || len <= 0 || len > 4096) return invalid_argument("[imatrix] " + path + ": bad entry name length");
    std::string name(static_cast<size_t>(len), '\0');
    if (!rd(name.data(), name.size()) || !rd(&ncall, 4) || !rd(&nval, 4) || nval <= 0 || nval > (1 << 26))
      return invalid_argument("[imatrix] " + path + ": truncated entry " + name);
    std::vector<float> v(static_cast<size_t>(nval));
    if (!rd(v.data(), v.size() * 4)) return invalid_argument("[imatrix] " + path + ": truncated values of " + name);
    // Stored values are mean·ncall; as a sum over ncall "tokens" they normalize back to the mean.
    Imatrix::Entry e;
    e.sums.assign(v.begin(), v.end());
    e.counts = {ncall > 0 ? ncall : 1};
    m.entries[name] = std::move(e);
  }
  int32_t last = 0;
  if (rd(&last, 4)) {
    m.chunk_count = last;
    int32_t len = 0;
    if (rd(&len, 4) && len > 0 && len < 65536) {
      std::string ds(static_cast<size_t>(len), '\0');
      if (rd(ds.data(), ds.size())) m.datasets.push_back(ds);
    }
  }
  return m;
}

}  // namespace

Result<Imatrix> read_imatrix(const std::string& path) {
  char magic[4] = {};
  {
    std::ifstream in(path, std::ios::binary);
    if (!in) return io_error("[imatrix] cannot open " + path);
    in.read(magic, 4);
  }
  if (std::memcmp(magic, "GGUF", 4) != 0) return read_legacy(path);
  LARDER_ASSIGN_OR_RETURN(auto g, formats::GgufFile::open(path));
  Imatrix m;
  if (const auto* d = g->find("imatrix.datasets"); d && d->is_array()) m.datasets = d->strs;
  m.chunk_count = g->get_int("imatrix.chunk_count").value_or(0);
  m.chunk_size = g->get_int("imatrix.chunk_size").value_or(0);
  static const std::string kSum = ".in_sum2", kCount = ".counts";
  for (const formats::TensorInfo& t : g->tensors().tensors()) {
    if (t.name.size() <= kSum.size() || t.name.compare(t.name.size() - kSum.size(), kSum.size(), kSum) != 0) continue;
    const std::string name = t.name.substr(0, t.name.size() - kSum.size());
    const formats::TensorInfo* c = g->tensors().find(name + kCount);
    if (!c) return invalid_argument("[imatrix] " + path + ": " + t.name + " without " + name + kCount);
    if (t.dtype != DType::kF32 || c->dtype != DType::kF32 || c->numel() < 1 || t.numel() % c->numel() != 0)
      return invalid_argument("[imatrix] " + path + ": " + name + ": sums/counts are not F32 of matching sizes");
    Imatrix::Entry e;
    e.sums.resize(static_cast<size_t>(t.numel()));
    for (size_t i = 0; i < e.sums.size(); ++i) {
      float v;
      std::memcpy(&v, t.data + 4 * i, 4);
      e.sums[i] = v;
    }
    for (int64_t i = 0; i < c->numel(); ++i) {
      float v;
      std::memcpy(&v, c->data + 4 * i, 4);
      e.counts.push_back(static_cast<int64_t>(v));
    }
    m.entries[name] = std::move(e);
  }
  if (m.entries.empty()) return invalid_argument("[imatrix] " + path + ": no <name>.in_sum2 tensors (not an imatrix GGUF)");
  return m;
}

Status write_imatrix(const std::string& path, const Imatrix& m) {
  formats::GgufWriter w;
  w.set_string("general.type", "imatrix");
  w.set_strings("imatrix.datasets", m.datasets);
  w.set_u32("imatrix.chunk_count", static_cast<uint32_t>(m.chunk_count));
  w.set_u32("imatrix.chunk_size", static_cast<uint32_t>(m.chunk_size));
  std::vector<std::vector<float>> data;
  for (const auto& [name, e] : m.entries) {
    const int64_t n_mat = static_cast<int64_t>(e.counts.size());
    LARDER_RETURN_IF_ERROR(w.add_tensor(name + ".in_sum2", DType::kF32, {n_mat, static_cast<int64_t>(e.sums.size()) / n_mat}));
    LARDER_RETURN_IF_ERROR(w.add_tensor(name + ".counts", DType::kF32, {n_mat, 1}));
    data.emplace_back(e.sums.begin(), e.sums.end());
    data.emplace_back(e.counts.begin(), e.counts.end());
  }
  auto r = w.write(path, [&](size_t i) -> Result<const void*> { return static_cast<const void*>(data[i].data()); });
  return r.is_ok() ? Status::ok() : r.status();
}

namespace {

// The capture: the model's matmuls go through the active kernel table; while computing, its
// dense matmul entries point at capture_matmul, which adds Σx² per input column for the weights
// it knows (by data pointer) and calls the original kernel. One computation at a time.
struct Capture {
  kernels::KernelTable original;
  std::unordered_map<const uint8_t*, Imatrix::Entry*> by_data;
};
Capture* g_capture = nullptr;

void capture_matmul(const kernels::WeightView& w, const float* x, int64_t n, float* y) {
  if (auto it = g_capture->by_data.find(w.data); it != g_capture->by_data.end()) {
    Imatrix::Entry& e = *it->second;
    for (int64_t t = 0; t < n; ++t) {
      const float* xr = x + t * w.cols;
      for (int64_t c = 0; c < w.cols; ++c) e.sums[static_cast<size_t>(c)] += static_cast<double>(xr[c]) * xr[c];
    }
    e.counts[0] += n;
  }
  g_capture->original.matmul[static_cast<size_t>(w.dtype)](w, x, n, y);
}

}  // namespace

Result<Imatrix> compute_imatrix(const formats::ModelFiles& files, const CalibrationSet& calib,
                                const std::function<void(size_t, size_t, const std::string&)>& progress) {
  if (calib.samples.empty()) return invalid_argument("[imatrix] no calibration samples");
  if (g_capture) return invalid_argument("[imatrix] one importance-matrix computation at a time");
  Imatrix m;
  Capture cap;
  cap.original = kernels::active_table();
  const models::TensorNames& names = models::llama_tensor_names();
  for (const formats::TensorInfo& t : files.tensors().tensors()) {
    if (t.rank() != 2) continue;
    const std::string g = files.gguf ? t.name : names.gguf(t.name);
    if (g.rfind("blk.", 0) != 0) continue;  // llama-imatrix's default: block weights only (no output.weight)
    Imatrix::Entry& e = m.entries[g];
    e.sums.assign(static_cast<size_t>(t.dim(1)), 0.0);
    e.counts = {0};
    cap.by_data[t.data] = &e;
  }
  kernels::KernelTable wrapped = cap.original;
  for (size_t i = 0; i < wrapped.matmul.size(); ++i)
    if (wrapped.matmul[i]) wrapped.matmul[i] = capture_matmul;
  wrapped.matmul_multi = {};  // one matmul per weight, each captured
  g_capture = &cap;
  kernels::set_active_table(wrapped);
  Status st = Status::ok();
  {
    auto model = models::Model::load(files);
    if (!model.is_ok()) {
      st = model.status();
    } else {
      const int64_t L = calib.seq_len;
      const int64_t V = model.value()->info().vocab;
      std::vector<float> logits(static_cast<size_t>(V));
      memory::SequenceState state = model.value()->new_state(L);
      for (size_t s = 0; st && s < calib.samples.size(); ++s) {
        if (progress) progress(s, calib.samples.size(), "importance matrix");
        st = state.trim(0);
        if (st) st = model.value()->forward(calib.samples[s].data(), L, state, logits.data(), false);
      }
    }
  }
  kernels::set_active_table(cap.original);
  g_capture = nullptr;
  if (!st) return st;
  for (auto it = m.entries.begin(); it != m.entries.end();) it = it->second.counts[0] == 0 ? m.entries.erase(it) : std::next(it);
  if (m.entries.empty())
    return invalid_argument("[imatrix] no matmul of " + files.path + " was seen (its weights are repacked at load)");
  m.datasets = {calib.source};
  m.chunk_count = static_cast<int64_t>(calib.samples.size());
  m.chunk_size = calib.seq_len;
  return m;
}

}  // namespace larder::quant
