#include "larder/hub/local_models.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>

#include "larder/formats/model_files.h"
#include "larder/hub/hf_cache.h"
#include "larder/hub/pull.h"
#include "larder/models/config.h"
#include "larder/models/registry.h"

namespace larder::hub {

namespace fs = std::filesystem;

std::string gguf_file_type_name(int64_t ftype) {
  static const std::map<int64_t, const char*> kNames = {
      {0, "F32"},     {1, "F16"},      {2, "Q4_0"},     {3, "Q4_1"},    {7, "Q8_0"},    {8, "Q5_0"},
      {9, "Q5_1"},    {10, "Q2_K"},    {11, "Q3_K_S"},  {12, "Q3_K_M"}, {13, "Q3_K_L"}, {14, "Q4_K_S"},
      {15, "Q4_K_M"}, {16, "Q5_K_S"},  {17, "Q5_K_M"},  {18, "Q6_K"},   {19, "IQ2_XXS"}, {20, "IQ2_XS"},
      {21, "Q2_K_S"}, {22, "IQ3_XS"},  {23, "IQ3_XXS"}, {24, "IQ1_S"},  {25, "IQ4_NL"}, {26, "IQ3_S"},
      {27, "IQ3_M"},  {28, "IQ2_S"},   {29, "IQ2_M"},   {30, "IQ4_XS"}, {31, "IQ1_M"},  {32, "BF16"},
      {36, "TQ1_0"},  {37, "TQ2_0"},   {38, "MXFP4_MOE"}};
  auto it = kNames.find(ftype);
  return it == kNames.end() ? std::string() : it->second;
}

namespace {

uint64_t size_of(const fs::path& p) {  // follows symlinks; directories summed one level down
  std::error_code ec;
  if (fs::is_regular_file(p, ec)) return fs::file_size(p, ec);
  uint64_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(p, ec)) {
    if (fs::is_regular_file(e.path(), ec)) n += fs::file_size(e.path(), ec);
  }
  return n;
}

std::string quant_of(const formats::ModelFiles& files) {
  if (files.gguf) {
    if (auto ft = files.gguf->get_int("general.file_type")) {
      const std::string n = gguf_file_type_name(*ft);
      if (!n.empty()) return n;
    }
    const std::string from_name = gguf_quant_of(files.path);
    if (!from_name.empty()) return from_name;
  }
  if (files.config.is_object() && (files.config.contains("quantization") || files.config.contains("quantization_config"))) {
    auto q = models::quantization_from_config(files.config, files.path);
    // OpenAI's gpt-oss layout: its experts' MXFP4 blocks and scales are U8 tensors, which the
    // dtype count below would report (or, in a small model, the float tensors beside them).
    if (q.is_ok() && q->openai_mxfp4) return "MXFP4 experts";
    // A method larder does not execute (GPTQ, AWQ, FP8 ...) is still the name a user knows it by.
    if (!q.is_ok()) {
      for (const char* key : {"quantization", "quantization_config"}) {
        const auto it = files.config.find(key);
        if (it == files.config.end() || !it->is_object() || !it->contains("quant_method")) continue;
        const auto& method = (*it)["quant_method"];
        if (!method.is_string()) continue;
        std::string name = method.get<std::string>();
        for (char& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
        return name;
      }
    }
    if (q.is_ok() && q->present) {
      std::string s = q->global.mode == models::QuantMode::kAffine
                          ? strfmt("MLX %d-bit g%d", q->global.bits, q->global.group_size)
                          : strfmt("MLX %s", models::quant_mode_name(q->global.mode));
      bool mixed = false;
      for (const auto& [m, p] : q->modules) mixed = mixed || !p || p->bits != q->global.bits || p->mode != q->global.mode;
      return mixed ? s + " mixed" : s;
    }
  }
  // Plain checkpoint: the dtype holding most of the bytes.
  std::map<std::string, uint64_t> by;
  if (files.has_weights()) {
    for (const auto& t : files.tensors().tensors()) by[dtype_name(t.dtype)] += t.nbytes;
  }
  std::string best;
  uint64_t most = 0;
  for (const auto& [d, b] : by) {
    if (b > most) best = d, most = b;
  }
  return best;
}

}  // namespace

LocalModel describe_model(const std::string& path) {
  LocalModel m;
  m.name = path;
  m.path = path;
  m.size_bytes = size_of(path);
  auto files = formats::open_model_files(path);
  if (!files) {
    m.why_not = files.status().message();
    return m;
  }
  m.quant = quant_of(*files);
  auto arch = models::architecture_of(*files);
  if (!arch) {
    m.why_not = arch.status().message();
    return m;
  }
  m.architecture = *arch;
  const auto* entry = models::find_architecture(*arch);
  if (!entry) {
    m.why_not = "architecture " + *arch + " is not supported";
    return m;
  }
  // The architecture's own reader where it has one (gpt-oss, Gemma, Qwen3-MoE ...), as loading does.
  auto cfg = entry->config ? entry->config(*files) : models::config_from_files(*files);
  if (!cfg) {
    m.why_not = cfg.status().message();
    return m;
  }
  auto model = entry->load(*files, *cfg);
  if (!model) {
    m.why_not = model.status().message();
    return m;
  }
  m.runnable = true;
  return m;
}

std::vector<LocalModel> list_local_models(const std::string& hub_dir, const std::vector<std::string>& extra_paths) {
  std::vector<LocalModel> out;
  for (const auto& repo : scan_cache(hub_dir)) {
    // The snapshot refs/main names, else the newest one.
    const CachedSnapshot* snap = nullptr;
    auto main = repo.refs.find("main");
    for (const auto& s : repo.snapshots) {
      if (main != repo.refs.end() && s.commit == main->second) snap = &s;
    }
    if (!snap) {
      std::error_code ec;
      fs::file_time_type best{};
      for (const auto& s : repo.snapshots) {
        const auto t = fs::last_write_time(s.dir, ec);
        if (!snap || t > best) snap = &s, best = t;
      }
    }
    if (!snap) continue;
    const bool has_config = std::find(snap->files.begin(), snap->files.end(), "config.json") != snap->files.end();
    bool any = false;
    if (has_config) {
      LocalModel m = describe_model(snap->dir);
      m.name = repo.repo_id;
      out.push_back(std::move(m));
      any = true;
    }
    std::vector<std::string> ggufs;
    for (const auto& f : snap->files) {
      std::string l = f;
      std::transform(l.begin(), l.end(), l.begin(), ::tolower);
      if (l.size() > 5 && l.compare(l.size() - 5, 5, ".gguf") == 0 && l.find("mmproj") == std::string::npos) {
        ggufs.push_back(f);
      }
    }
    // "repo:Q4_K_M" when the quantization names one file of the snapshot, else "repo:FILE".
    std::map<std::string, int> per_quant;
    for (const auto& g : ggufs) ++per_quant[gguf_quant_of(g)];
    for (const auto& g : ggufs) {
      LocalModel m = describe_model((fs::path(snap->dir) / g).string());
      const std::string q = gguf_quant_of(g);
      m.name = repo.repo_id + ":" + (!q.empty() && per_quant[q] == 1 ? q : g);
      out.push_back(std::move(m));
      any = true;
    }
    if (!any) {
      LocalModel m;
      m.name = repo.repo_id;
      m.path = snap->dir;
      m.size_bytes = repo.blob_bytes;
      m.why_not = repo.incomplete_bytes ? "incomplete download (run larder pull again to resume)"
                                        : "no config.json or .gguf file in the snapshot";
      out.push_back(std::move(m));
    }
  }
  for (const auto& p : extra_paths) {
    std::error_code ec;
    const fs::path path(p);
    if (fs::is_regular_file(path, ec) || fs::exists(path / "config.json", ec)) {
      out.push_back(describe_model(p));
      continue;
    }
    std::vector<std::string> found;
    for (const auto& e : fs::directory_iterator(path, ec)) {
      if ((e.is_regular_file(ec) && e.path().extension() == ".gguf") || fs::exists(e.path() / "config.json", ec)) {
        found.push_back(e.path().string());
      }
    }
    std::sort(found.begin(), found.end());
    for (const auto& f : found) out.push_back(describe_model(f));
  }
  return out;
}

}  // namespace larder::hub
