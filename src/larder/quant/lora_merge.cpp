// lora_merge.cpp — see lora_merge.h.
#include "larder/quant/lora_merge.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "larder/core/dtype.h"
#include "larder/formats/model_files.h"
#include "larder/quant/checkpoint_io.h"

namespace larder::quant {

namespace {

using nlohmann::ordered_json;

// "…layers.N.<module>.weight" → (N, module); false for any other name.
bool adapted_weight(const std::string& name, int* layer, models::LoraModule* module) {
  const size_t at = name.rfind("layers.");
  if (at == std::string::npos) return false;
  size_t i = at + 7, j = i;
  while (j < name.size() && name[j] >= '0' && name[j] <= '9') ++j;
  if (j == i || j >= name.size() || name[j] != '.') return false;
  const std::string rest = name.substr(j + 1);
  for (int m = 0; m < models::kLoraModuleCount; ++m) {
    const auto mod = static_cast<models::LoraModule>(m);
    if (rest == std::string(models::lora_module_hf(mod)) + ".weight") {
      *layer = std::stoi(name.substr(i, j - i));
      *module = mod;
      return true;
    }
  }
  return false;
}

void load_f32(const formats::TensorInfo& t, float* out) {
  const int64_t n = t.numel();
  const uint16_t* p = reinterpret_cast<const uint16_t*>(t.data);
  if (t.dtype == DType::kF32) {
    std::memcpy(out, t.data, static_cast<size_t>(n) * 4);
  } else if (t.dtype == DType::kBF16) {
    for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(p[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = f16_to_f32(p[i]);
  }
}

}  // namespace

Result<LoraMergeReport> merge_lora_checkpoint(const std::string& src_dir, const std::string& dst_dir,
                                              std::span<const models::LoraUse> uses_in,
                                              std::vector<std::string>* warnings) {
  struct stat sb;
  if (::stat(src_dir.c_str(), &sb) != 0 || !S_ISDIR(sb.st_mode))
    return invalid_argument("[quantize] --lora needs a Hugging Face safetensors directory as the source; " + src_dir +
                            " is not one");
  LARDER_ASSIGN_OR_RETURN(formats::ModelFiles files, formats::open_model_files(src_dir));
  if (!files.hf_tensors) return invalid_argument("[quantize] --lora: " + src_dir + " holds no safetensors weights");
  LARDER_ASSIGN_OR_RETURN(models::BaseProjections base, models::BaseProjections::from_files(files));
  const std::vector<models::LoraUse> uses =
      models::canonical_lora_uses(std::vector<models::LoraUse>(uses_in.begin(), uses_in.end()));
  for (const models::LoraUse& u : uses) {
    if (Status st = u.adapter->validate(base, warnings); !st)
      return Status(st.code(), "[quantize] --lora " + u.adapter->path() + ": " + st.message());
  }
  const formats::TensorSet& ts = *files.hf_tensors;

  // Which tensors change, and every adapted projection found exactly once.
  std::vector<ShardEntry> entries;
  std::vector<bool> merged;
  std::map<std::pair<int, int>, int> found;  // (layer, module) → tensors named so
  uint64_t params = 0;
  for (const formats::TensorInfo& t : ts.tensors()) {
    int layer = 0;
    models::LoraModule mod{};
    bool m = false;
    if (adapted_weight(t.name, &layer, &mod)) {
      for (const models::LoraUse& u : uses) m = m || u.adapter->find(layer, mod) != nullptr;
      if (m) {
        if (t.rank() != 2 || (t.dtype != DType::kF32 && t.dtype != DType::kBF16 && t.dtype != DType::kF16))
          return unsupported(strfmt("[quantize] --lora: %s is %s %s; merging needs a 2-D f32/bf16/f16 weight",
                                    t.name.c_str(), dtype_name(t.dtype), t.shape_str().c_str()));
        ++found[{layer, static_cast<int>(mod)}];
      }
    }
    if (!m && !safetensors_dtype_name(t.dtype))
      return unsupported(strfmt("[quantize] tensor '%s' has dtype %s, which cannot be written", t.name.c_str(),
                                dtype_name(t.dtype)));
    entries.push_back({t.name, m ? DType::kF32 : t.dtype, t.shape, m ? static_cast<uint64_t>(t.numel()) * 4 : t.nbytes});
    merged.push_back(m);
    params += static_cast<uint64_t>(t.numel());
  }
  for (const models::LoraUse& u : uses) {
    for (const models::LoraProjection& p : u.adapter->projections()) {
      auto it = found.find({p.layer, static_cast<int>(p.module)});
      if (it == found.end() || it->second != 1)
        return invalid_argument(strfmt("[quantize] --lora %s: %s has %s weight tensor in %s", u.adapter->path().c_str(),
                                       models::lora_projection_name(p.layer, p.module).c_str(),
                                       it == found.end() ? "no" : "more than one", src_dir.c_str()));
    }
  }

  LoraMergeReport rep;
  std::vector<float> w;
  std::vector<double> acc;
  Status st = publish_directory(dst_dir, "[quantize]", [&](const std::string& tmp) -> Status {
    auto produce = [&](size_t i) -> Result<const void*> {
      const formats::TensorInfo& t = ts.tensors()[i];
      if (!merged[i]) {
        ++rep.copied_tensors;
        return static_cast<const void*>(t.data);
      }
      int layer = 0;
      models::LoraModule mod{};
      adapted_weight(t.name, &layer, &mod);
      const int64_t out = t.dim(0), in = t.dim(1);
      w.resize(static_cast<size_t>(out * in));
      load_f32(t, w.data());
      acc.assign(w.begin(), w.end());
      for (const models::LoraUse& u : uses) {
        const models::LoraProjection* p = u.adapter->find(layer, mod);
        if (!p) continue;
        // W + s·(B·A): B·A in double first, then scaled and added (one f32 rounding at the end).
        const double s = static_cast<double>(u.scale * p->scale);  // the run-time hook's f32 factor
        std::vector<double> a(static_cast<size_t>(p->rank * in)), d(static_cast<size_t>(in));
        for (int64_t k = 0; k < p->rank; ++k)
          for (int64_t c = 0; c < in; ++c) a[static_cast<size_t>(k * in + c)] = p->f.a_at(k, c);
        for (int64_t o = 0; o < out; ++o) {
          std::fill(d.begin(), d.end(), 0.0);
          for (int64_t k = 0; k < p->rank; ++k) {
            const double bk = static_cast<double>(p->f.b_at(o, k));
            const double* ak = a.data() + k * in;
            for (int64_t c = 0; c < in; ++c) d[static_cast<size_t>(c)] += bk * ak[c];
          }
          double* row = acc.data() + o * in;
          for (int64_t c = 0; c < in; ++c) row[c] += s * d[static_cast<size_t>(c)];
        }
      }
      for (size_t k = 0; k < w.size(); ++k) w[k] = static_cast<float>(acc[k]);
      ++rep.merged_tensors;
      return static_cast<const void*>(w.data());
    };
    LARDER_ASSIGN_OR_RETURN(ShardsWritten written,
                            write_safetensors_shards(tmp, entries, 5ull << 30, ordered_json{{"format", "pt"}}, params,
                                                     produce));
    (void)written;
    std::error_code ec;
    std::filesystem::copy_file(src_dir + "/config.json", tmp + "/config.json", ec);
    if (ec) return io_error("[quantize] copying " + src_dir + "/config.json: " + ec.message());
    return copy_aux_files(src_dir, tmp);
  });
  if (!st) return st;
  return rep;
}

}  // namespace larder::quant
