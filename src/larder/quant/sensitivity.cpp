// sensitivity.cpp — see sensitivity.h.
#include "larder/quant/sensitivity.h"

#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <sstream>

#include <unordered_map>

#include "larder/core/mmap_file.h"
#include "larder/kernels/dispatch.h"
#include "larder/memory/kv_cache.h"
#include "larder/models/model.h"
#include "larder/quant/affine.h"
#include "larder/runtime/eval.h"

namespace larder::quant {

using nlohmann::ordered_json;

namespace {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::string hex64(uint64_t v) { return strfmt("%016llx", static_cast<unsigned long long>(v)); }

// A JSONL calibration line -> its text (design §4: "text", or "messages" flattened).
Result<std::string> jsonl_sample_text(const ordered_json& j, const std::string& where) {
  if (!j.is_object()) return invalid_argument("[calibration] " + where + ": not a JSON object");
  if (auto it = j.find("text"); it != j.end()) {
    if (!it->is_string()) return invalid_argument("[calibration] " + where + ": \"text\" is not a string");
    return it->get<std::string>();
  }
  if (auto it = j.find("messages"); it != j.end() && it->is_array()) {
    std::string out;
    for (const auto& m : *it) {
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
        return invalid_argument("[calibration] " + where + ": a message without a string \"role\"");
      std::string content;
      if (m.contains("content") && m["content"].is_string()) content = m["content"].get<std::string>();
      else if (m.contains("content") && m["content"].is_array())  // OpenAI content parts: the text ones
        for (const auto& p : m["content"])
          if (p.is_object() && p.value("type", "") == "text" && p.contains("text") && p["text"].is_string())
            content += p["text"].get<std::string>();
      if (!out.empty()) out += "\n\n";
      out += "[" + m["role"].get<std::string>() + "]: " + content;
    }
    return out;
  }
  return invalid_argument("[calibration] " + where + ": no \"text\" string or \"messages\" array");
}

}  // namespace

Result<std::vector<std::string>> read_calibration_texts(const CalibrationOptions& opts, std::string* digest) {
  std::vector<std::string> texts;
  std::string bytes;
  if (opts.file.empty()) {
    bytes = builtin_calibration_text();
    texts.push_back(bytes);
  } else {
    auto r = read_text_file(opts.file);
    if (!r) return Status(r.status().code(), "[calibration] cannot read " + opts.file + ": " + r.status().message());
    bytes = std::move(r).value();
    if (bytes.find_first_not_of(" \t\r\n") == std::string::npos) return invalid_argument("[calibration] " + opts.file + " is empty");
    const bool jsonl_name = opts.file.size() > 6 && opts.file.compare(opts.file.size() - 6, 6, ".jsonl") == 0;
    const bool starts_obj = bytes[bytes.find_first_not_of(" \t\r\n")] == '{';
    if (jsonl_name || starts_obj) {
      std::istringstream lines(bytes);
      int lineno = 0;
      for (std::string line; std::getline(lines, line);) {
        ++lineno;
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        const std::string where = opts.file + " line " + std::to_string(lineno);
        ordered_json j = ordered_json::parse(line, nullptr, /*allow_exceptions=*/false);
        if (j.is_discarded()) {
          if (!jsonl_name && lineno == 1) {  // a plain text that merely starts with '{'
            texts.clear();
            break;
          }
          return invalid_argument("[calibration] " + where + ": not valid JSON");
        }
        auto t = jsonl_sample_text(j, where);
        if (!t) return t.status();
        texts.push_back(std::move(t).value());
      }
    }
    if (texts.empty()) texts.push_back(bytes);
  }
  if (digest) *digest = hex64(XXH64(bytes.data(), bytes.size(), 0));
  return texts;
}

std::vector<int64_t> calibration_starts(int64_t total, int64_t seq_len, int64_t n_samples, uint64_t seed) {
  std::vector<int64_t> starts;
  for (int64_t s = 0; s < total - seq_len; s += seq_len) starts.push_back(s);
  // A stream of exactly seq_len tokens still yields its one chunk.
  if (starts.empty() && total >= seq_len) starts.push_back(0);
  uint64_t st = seed;
  for (size_t i = starts.size(); i > 1; --i) {
    const size_t j = static_cast<size_t>(splitmix64(st) % i);
    std::swap(starts[i - 1], starts[j]);
  }
  if (static_cast<int64_t>(starts.size()) > n_samples) starts.resize(static_cast<size_t>(n_samples));
  return starts;
}

Result<CalibrationSet> load_calibration(const tokenizer::Tokenizer& tok, const CalibrationOptions& opts) {
  if (opts.seq_len < 2) return invalid_argument(strfmt("[calibration] sequence length %lld is below 2", static_cast<long long>(opts.seq_len)));
  if (opts.n_samples < 1) return invalid_argument(strfmt("[calibration] sample count %lld is below 1", static_cast<long long>(opts.n_samples)));
  CalibrationSet cs;
  auto texts = read_calibration_texts(opts, &cs.digest);
  if (!texts) return texts.status();
  // The stream and its samples as `larder eval` cuts its chunks (runtime/eval.h): BOS first
  // when the tokenizer adds one, and each sample's first token overwritten with it — a sample
  // then starts like a document, as every eval/llama-perplexity chunk does; without it the
  // sensitivities were measured on sequences the KL evaluation of the result never sees.
  const std::optional<int32_t> bos = runtime::added_bos(tok);
  std::vector<int32_t> stream;
  if (bos) stream.push_back(*bos);
  for (const std::string& t : texts.value()) {
    std::vector<int32_t> ids = tok.encode(t, /*add_special=*/false);
    stream.insert(stream.end(), ids.begin(), ids.end());
  }
  cs.source = opts.file.empty() ? "builtin" : opts.file;
  cs.stream_tokens = static_cast<int64_t>(stream.size());
  cs.seq_len = opts.seq_len;
  cs.seed = opts.seed;
  if (cs.stream_tokens < opts.seq_len)
    return invalid_argument(strfmt("[calibration] %s has %lld tokens, fewer than one sample of %lld (lower --calibration-length or give more text)",
                                   cs.source.c_str(), static_cast<long long>(cs.stream_tokens), static_cast<long long>(opts.seq_len)));
  for (int64_t s : calibration_starts(cs.stream_tokens, opts.seq_len, opts.n_samples, opts.seed)) {
    cs.samples.emplace_back(stream.begin() + s, stream.begin() + s + opts.seq_len);
    if (bos) cs.samples.back().front() = *bos;
  }
  cs.bos = bos;
  return cs;
}

namespace {

// The files with one tensor re-pointed at an in-memory f32 copy (same shape); everything else
// stays a view of the mapped source. `data` must outlive every model bound to the result.
formats::ModelFiles overlay(const formats::ModelFiles& base, const std::string& name, const float* data) {
  auto ts = std::make_shared<formats::TensorSet>();
  for (const auto& f : base.tensors().files()) ts->add_file(f);
  for (const formats::TensorInfo& t : base.tensors().tensors()) {
    formats::TensorInfo c = t;
    if (t.name == name) {
      c.dtype = DType::kF32;
      c.data = reinterpret_cast<const uint8_t*>(data);
      c.nbytes = static_cast<uint64_t>(t.numel()) * 4;
    }
    (void)ts->add(std::move(c));  // names are unique in the base set
  }
  formats::ModelFiles f = base;
  f.hf_tensors = std::move(ts);
  return f;
}

// Samples per batched forward: as many as keep one batch's logits ([n, L, vocab] f32) under
// 256 MiB, so a 150k vocabulary still fits one sample and a small one runs several at once.
size_t samples_per_batch(const CalibrationSet& calib, int64_t vocab) {
  const double per = static_cast<double>(calib.seq_len) * static_cast<double>(vocab) * 4.0;
  return std::clamp<size_t>(static_cast<size_t>((256.0 * 1048576.0) / per), 1, calib.samples.size());
}

// Runs every sample (batched) and hands each sample's [L, vocab] logits to `use`.
Status forward_samples(models::Model& model, const CalibrationSet& calib, std::vector<float>* logits,
                       const std::function<void(size_t, const float*)>& use) {
  const int64_t V = model.info().vocab, L = calib.seq_len;
  const size_t per = samples_per_batch(calib, V);
  logits->resize(per * static_cast<size_t>(L * V));
  std::vector<memory::SequenceState> states;
  for (size_t i = 0; i < per; ++i) states.push_back(model.new_state(L));
  for (size_t s0 = 0; s0 < calib.samples.size(); s0 += per) {
    const size_t n = std::min(per, calib.samples.size() - s0);
    std::vector<models::BatchItem> items;
    for (size_t i = 0; i < n; ++i) {
      LARDER_RETURN_IF_ERROR(states[i].trim(0));
      items.push_back({calib.samples[s0 + i].data(), L, &states[i], logits->data() + i * static_cast<size_t>(L * V), true});
    }
    LARDER_RETURN_IF_ERROR(model.forward_batch(items));
    for (size_t i = 0; i < n; ++i) use(s0 + i, logits->data() + i * static_cast<size_t>(L * V));
  }
  return Status::ok();
}

// Mean over samples of the mean over positions of KL(ref ‖ model); ref_logits holds the source
// model's logits of every sample, [samples][L][vocab].
Result<double> mean_kl(models::Model& model, const CalibrationSet& calib, const std::vector<float>& ref_logits,
                       std::vector<float>* logits) {
  const int64_t V = model.info().vocab, L = calib.seq_len;
  double total = 0;
  LARDER_RETURN_IF_ERROR(forward_samples(model, calib, logits, [&](size_t s, const float* lg) {
    double acc = 0;
    for (int64_t p = 0; p < L; ++p)
      acc += runtime::kl_divergence_logits(ref_logits.data() + (static_cast<int64_t>(s) * L + p) * V, lg + p * V, V);
    total += acc / static_cast<double>(L);
  }));
  return total / static_cast<double>(calib.samples.size());
}

ordered_json calibration_json(const CalibrationSet& c) {
  return {{"source", c.source}, {"digest", c.digest}, {"L", c.seq_len}, {"n", static_cast<int64_t>(c.samples.size())},
          {"seed", c.seed}, {"stream_tokens", c.stream_tokens},
          {"bos", c.bos ? ordered_json(*c.bos) : ordered_json()}};
}

}  // namespace

namespace {

// The fast method's capture (SensitivityMethod::kFast): while the source model runs the
// calibration set, its dense matmul entries point at error_matmul, which runs the original
// kernel and, for a probed weight (known by its data pointer), also x·(W − deq_b(W))ᵀ for every
// candidate b on the f32 kernel, adding the squared output error to that module's e(b). One
// computation at a time (the kernel table is process-wide).
struct ErrorCapture {
  kernels::KernelTable original;
  struct Module {
    const formats::TensorInfo* w = nullptr;
    const std::string* name = nullptr;
    std::vector<double> err;  // per candidate
    const std::vector<size_t>* first = nullptr;  // per candidate: the first one with its quantizer
    double out2 = 0;          // Σ‖x·Wᵀ‖² (for the report)
  };
  std::unordered_map<const uint8_t*, Module*> by_data;
  const std::vector<int>* cands = nullptr;
  const SensitivityOptions* opts = nullptr;
  Status st = Status::ok();
  std::vector<float> wf, wq, ye;
  std::vector<double> ek;  // this call's error per candidate
};
ErrorCapture* g_err = nullptr;

Status fake_quant(const SensitivityOptions& opts, const std::string& module, const formats::TensorInfo& w, int b, float* out) {
  if (opts.fake_quant) return opts.fake_quant(module, w, b, out);
  if (Status st = check_affine_params(b, opts.group_size, w.dim(1)); !st) return Status(st.code(), st.message() + " (module " + module + ")");
  if (Status st = fake_quantize_affine(w.data, w.dtype, w.dim(0), w.dim(1), b, opts.group_size, opts.threads, out); !st)
    return Status(st.code(), st.message() + " (module " + module + ")");
  return Status::ok();
}

void error_matmul(const kernels::WeightView& w, const float* x, int64_t n, float* y) {
  ErrorCapture& c = *g_err;
  c.original.matmul[static_cast<size_t>(w.dtype)](w, x, n, y);
  auto it = c.by_data.find(w.data);
  if (it == c.by_data.end() || !c.st) return;
  ErrorCapture::Module& m = *it->second;
  const int64_t rows = m.w->dim(0), cols = m.w->dim(1);
  for (int64_t i = 0; i < n * rows; ++i) m.out2 += static_cast<double>(y[i]) * y[i];
  const size_t numel = static_cast<size_t>(rows * cols);
  c.wf.resize(numel);
  for (size_t i = 0; i < numel; ++i) c.wf[i] = load_float(m.w->data, m.w->dtype, static_cast<int64_t>(i));
  c.wq.resize(numel);
  c.ye.resize(static_cast<size_t>(n * rows));
  kernels::WeightView d{};
  d.dtype = DType::kF32;
  d.rows = rows;
  d.cols = cols;
  d.data = reinterpret_cast<const uint8_t*>(c.wq.data());
  c.ek.assign(c.cands->size(), 0.0);
  for (size_t k = 0; k < c.cands->size(); ++k) {
    if (const size_t f = (*m.first)[k]; f != k) {  // the same quantizer as an earlier width: the same error
      m.err[k] += c.ek[f];
      continue;
    }
    if (Status st = fake_quant(*c.opts, *m.name, *m.w, (*c.cands)[k], c.wq.data()); !st) {
      c.st = st;
      return;
    }
    for (size_t i = 0; i < numel; ++i) c.wq[i] = c.wf[i] - c.wq[i];  // ΔW
    c.original.matmul[static_cast<size_t>(DType::kF32)](d, x, n, c.ye.data());
    double e = 0;
    for (float v : c.ye) e += static_cast<double>(v) * v;
    c.ek[k] = e;
    m.err[k] += e;
  }
}

}  // namespace

Result<SensitivityResult> measure_kl_sensitivity(const formats::ModelFiles& files,
                                                 const std::vector<ModuleSensitivity>& modules,
                                                 const CalibrationSet& calib, const SensitivityOptions& opts) {
  const auto t0 = std::chrono::steady_clock::now();
  if (!files.hf_tensors) return invalid_argument("[sensitivity] " + files.path + " is not a safetensors checkpoint");
  if (calib.samples.empty()) return invalid_argument("[sensitivity] no calibration samples");
  const bool fast = opts.method == SensitivityMethod::kFast;
  auto base_r = models::Model::load(files);
  if (!base_r) return base_r.status();
  models::Model& base = *base_r.value();
  const int64_t V = base.info().vocab, L = calib.seq_len;
  if (L > base.info().max_context && base.info().max_context > 0)
    return invalid_argument(strfmt("[sensitivity] calibration length %lld exceeds the model's context %lld",
                                   static_cast<long long>(L), static_cast<long long>(base.info().max_context)));
  std::vector<int> cands = opts.candidates;
  std::sort(cands.begin(), cands.end());
  cands.erase(std::unique(cands.begin(), cands.end()), cands.end());
  if (cands.empty()) return invalid_argument("[sensitivity] no candidate widths");
  const int probe = opts.probe_bits > 0 ? opts.probe_bits : cands.front();
  const size_t probe_k = static_cast<size_t>(std::find(cands.begin(), cands.end(), probe) - cands.begin());
  if (fast && probe_k == cands.size())
    return invalid_argument(strfmt("[sensitivity] the probe width %d is not a candidate width", probe));
  std::vector<const formats::TensorInfo*> weights;
  for (const ModuleSensitivity& m : modules) {
    const formats::TensorInfo* w = files.tensors().find(m.name + ".weight");
    if (!w || w->rank() != 2 || !(w->dtype == DType::kF32 || w->dtype == DType::kBF16 || w->dtype == DType::kF16))
      return invalid_argument("[sensitivity] " + m.name + ".weight is missing or not a 2-D float tensor");
    weights.push_back(w);
  }
  // Per module and candidate: the first candidate whose quantizer is the same (opts.quantizer_id);
  // such widths are measured once.
  std::vector<std::vector<size_t>> first(modules.size(), std::vector<size_t>(cands.size()));
  size_t distinct = 0;
  for (size_t mi = 0; mi < modules.size(); ++mi) {
    std::vector<int64_t> ids(cands.size());
    for (size_t k = 0; k < cands.size(); ++k) {
      ids[k] = opts.quantizer_id ? opts.quantizer_id(*weights[mi], cands[k]) : static_cast<int64_t>(k);
      first[mi][k] = static_cast<size_t>(std::find(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids[k]) - ids.begin());
      if (first[mi][k] == k) ++distinct;
    }
  }
  SensitivityResult res;
  // Progress steps: the reference forward, [the capture forward,] then one per probe.
  const size_t total = (fast ? modules.size() + 1 : distinct) + 1;
  size_t done = 0;
  if (opts.progress) opts.progress(done, total, "reference logits");
  std::vector<float> logits;
  std::vector<float> ref_logits(static_cast<size_t>(static_cast<int64_t>(calib.samples.size()) * L * V));
  LARDER_RETURN_IF_ERROR(forward_samples(base, calib, &logits, [&](size_t s, const float* lg) {
    std::memcpy(ref_logits.data() + s * static_cast<size_t>(L * V), lg, static_cast<size_t>(L * V) * sizeof(float));
  }));
  res.forwards += static_cast<int64_t>(calib.samples.size());
  ++done;

  // Fast: the output errors of every module at every width, in one capture forward of the source.
  std::vector<ErrorCapture::Module> caps(modules.size());
  if (fast) {
    if (opts.progress) opts.progress(done, total, "output errors");
    if (g_err) return invalid_argument("[sensitivity] one fast sensitivity measurement at a time");
    ErrorCapture cap;
    cap.original = kernels::active_table();
    cap.cands = &cands;
    cap.opts = &opts;
    for (size_t i = 0; i < modules.size(); ++i) {
      caps[i].w = weights[i];
      caps[i].name = &modules[i].name;
      caps[i].err.assign(cands.size(), 0.0);
      caps[i].first = &first[i];
      cap.by_data[weights[i]->data] = &caps[i];
    }
    kernels::KernelTable wrapped = cap.original;
    for (auto& mm : wrapped.matmul)
      if (mm) mm = error_matmul;
    wrapped.matmul_multi = {};  // one matmul per weight, each seen
    g_err = &cap;
    kernels::set_active_table(wrapped);
    Status st = Status::ok();
    {
      // A model bound under the wrapped table (some bind-time choices read the table).
      auto m = models::Model::load(files);
      if (!m.is_ok()) {
        st = m.status();
      } else {
        std::vector<float> last(static_cast<size_t>(calib.samples.size() * static_cast<size_t>(V)));
        std::vector<memory::SequenceState> states;
        std::vector<models::BatchItem> items;
        for (size_t i = 0; i < calib.samples.size(); ++i) states.push_back(m.value()->new_state(L));
        for (size_t i = 0; i < calib.samples.size(); ++i)
          items.push_back({calib.samples[i].data(), L, &states[i], last.data() + i * static_cast<size_t>(V), false});
        st = m.value()->forward_batch(items);
      }
    }
    kernels::set_active_table(cap.original);
    g_err = nullptr;
    LARDER_RETURN_IF_ERROR(st);
    LARDER_RETURN_IF_ERROR(cap.st);
    for (size_t i = 0; i < modules.size(); ++i)
      if (caps[i].out2 == 0)
        return invalid_argument("[sensitivity] the matmul of " + modules[i].name +
                                " was not seen in the capture forward (its weight is repacked at load); use --sensitivity kl");
    res.forwards += static_cast<int64_t>(calib.samples.size());
    ++done;
  }

  std::vector<float> wq;
  ordered_json layers = ordered_json::array();
  for (size_t mi = 0; mi < modules.size(); ++mi) {
    const ModuleSensitivity& m = modules[mi];
    const formats::TensorInfo* w = weights[mi];
    ModuleSensitivity out = m;
    out.kl.clear();
    ordered_json kl = ordered_json::object();
    for (size_t k = 0; k < cands.size(); ++k) {
      const int b = cands[k];
      if (fast && k != probe_k) continue;
      if (const size_t f = first[mi][k]; !fast && f != k) {  // the same quantizer as an earlier width
        out.kl[b] = out.kl[cands[f]];
        continue;
      }
      if (opts.progress) opts.progress(done, total, strfmt("%s @ %d bits", m.name.c_str(), b));
      wq.resize(static_cast<size_t>(w->numel()));
      LARDER_RETURN_IF_ERROR(fake_quant(opts, m.name, *w, b, wq.data()));
      const formats::ModelFiles f = overlay(files, w->name, wq.data());
      auto probe_m = models::Model::load(f);
      if (!probe_m) return probe_m.status();
      auto r = mean_kl(*probe_m.value(), calib, ref_logits, &logits);
      if (!r) return r.status();
      res.forwards += static_cast<int64_t>(calib.samples.size());
      out.kl[b] = r.value();
      ++done;
    }
    if (fast) {
      // KL_m(b) ≈ KL_m(p) · e_m(b) / e_m(p).
      const double kp = out.kl[probe], ep = caps[mi].err[probe_k];
      for (size_t k = 0; k < cands.size(); ++k)
        out.kl[cands[k]] = k == probe_k ? kp : ep > 0 ? kp * caps[mi].err[k] / ep : (caps[mi].err[k] > 0 ? NAN : 0.0);
    }
    for (const auto& [b, v] : out.kl) {
      if (std::isfinite(v)) kl[std::to_string(b)] = v;
      else kl[std::to_string(b)] = nullptr;  // §4: non-finite written as null (= NaN)
    }
    ordered_json layer = {{"name", m.name}, {"params", m.params}, {"kl", kl}};
    if (fast) {
      ordered_json e = ordered_json::object();
      for (size_t k = 0; k < cands.size(); ++k)
        e[std::to_string(cands[k])] = caps[mi].out2 > 0 ? caps[mi].err[k] / caps[mi].out2 : 0.0;
      layer["output_error"] = e;
    }
    layers.push_back(std::move(layer));
    res.table.push_back(std::move(out));
  }
  if (opts.progress) opts.progress(total, total, "done");
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  res.report = {{"format", "larder-sensitivity-1"},
                {"reference", "source"},
                {"method", fast ? "fast" : "kl"},
                {"metric", fast ? strfmt("mean KL(source || module quantized alone) measured at %d bits, scaled to the other widths "
                                         "by the module's output error on the calibration inputs (output_error: relative to its output)", probe)
                                : std::string("mean KL(source || module quantized alone), nats per position")},
                {"group_size", opts.group_size},
                {"candidates", cands}};
  if (fast) res.report["probe_bits"] = probe;
  res.report["calibration"] = calibration_json(calib);
  res.report["forwards"] = res.forwards;
  res.report["seconds"] = res.seconds;
  res.report["layers"] = layers;
  return res;
}

Result<std::vector<ModuleSensitivity>> reuse_sensitivity_report(const ordered_json& rep,
                                                                const std::vector<ModuleSensitivity>& modules,
                                                                const CalibrationSet& calib, const SensitivityOptions& opts) {
  auto mismatch = [](const std::string& what) {
    return invalid_argument("[sensitivity] the given sensitivity report does not match this run: " + what);
  };
  if (!rep.is_object() || rep.value("format", "") != "larder-sensitivity-1") return mismatch("format is not larder-sensitivity-1");
  if (rep.value("reference", "") != "source") return mismatch("it is not a calibration-KL report (reference " + rep.value("reference", std::string("?")) + ")");
  const std::string want_method = opts.method == SensitivityMethod::kFast ? "fast" : "kl";
  if (rep.value("method", std::string("kl")) != want_method)
    return mismatch("it was measured with --sensitivity " + rep.value("method", std::string("kl")) + ", this run asks for " + want_method);
  if (!rep.contains("group_size") || rep["group_size"] != opts.group_size) return mismatch("group size");
  const ordered_json want = calibration_json(calib);
  if (!rep.contains("calibration") || !rep["calibration"].is_object()) return mismatch("no calibration block");
  for (const char* k : {"digest", "L", "n", "seed"})
    if (rep["calibration"].value(k, ordered_json()) != want[k]) return mismatch(std::string("calibration ") + k);
  if (!rep.contains("layers") || !rep["layers"].is_array() || rep["layers"].size() != modules.size())
    return mismatch("module count");
  std::vector<ModuleSensitivity> out;
  for (size_t i = 0; i < modules.size(); ++i) {
    const ordered_json& l = rep["layers"][i];
    if (!l.is_object() || l.value("name", "") != modules[i].name) return mismatch("module " + modules[i].name);
    ModuleSensitivity m = modules[i];
    m.kl.clear();
    if (!l.contains("kl") || !l["kl"].is_object()) return mismatch("no kl table for " + m.name);
    for (int b : opts.candidates) {
      const std::string k = std::to_string(b);
      if (!l["kl"].contains(k)) return mismatch(strfmt("no %d-bit entry for %s", b, m.name.c_str()));
      const ordered_json& v = l["kl"][k];
      if (v.is_null()) m.kl[b] = NAN;
      else if (v.is_number()) m.kl[b] = v.get<double>();
      else return mismatch("a non-number kl for " + m.name);
    }
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace larder::quant
