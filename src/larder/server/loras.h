// loras.h — the LoRA adapters `larder serve MODEL --lora NAME=PATH[:SCALE]` serves (issue 45).
// Loaded, validated and bound to the model once at startup (runtime/adapters.h); a request picks
// them by `model` (NAME) or by llama-server's per-request `lora` list, and otherwise runs with the
// global scales GET/POST /lora-adapters show and set. Ids are the --lora order, as llama-server's.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "larder/core/status.h"
#include "larder/memory/store/kv_store.h"
#include "larder/models/lora.h"
#include "larder/runtime/kv_identity.h"

namespace larder::server {

struct ServedLora {
  std::string name;  // what requests pick it by (`model`); listed by /v1/models and /api/tags
  std::string path;
  float scale = 1.0f;  // the scale a request by NAME applies (--lora NAME=PATH:SCALE)
  std::shared_ptr<const models::BoundLora> bound;
};

class LoraTable {
 public:
  explicit LoraTable(std::vector<ServedLora> adapters)
      : adapters_(std::move(adapters)), global_(adapters_.size(), 0.0f) {}
  const std::vector<ServedLora>& adapters() const { return adapters_; }
  const ServedLora* by_name(const std::string& name) const {
    for (const ServedLora& a : adapters_)
      if (a.name == name) return &a;
    return nullptr;
  }
  // The scales of requests that pick no adapter (POST /lora-adapters). They start at 0 — every
  // adapter is picked per request by name, as llama-server's --lora-init-without-apply — so a plain
  // request runs the base model.
  std::vector<float> global_scales() const {
    std::lock_guard<std::mutex> l(mu_);
    return global_;
  }
  void set_global_scales(std::vector<float> s) {
    std::lock_guard<std::mutex> l(mu_);
    global_ = std::move(s);
  }

 private:
  std::vector<ServedLora> adapters_;
  mutable std::mutex mu_;
  std::vector<float> global_;
};

// The labels /stats and /metrics show the KV namespaces under (issue 45), and a miss names the
// other namespace by: "base", or the names of the adapters whose request-by-NAME namespace it is,
// joined by "," (a renamed copy of one file shares it), then "@" and the id's first 8 hex digits.
// Adapters are fixed at start, so this set is bounded (namespaces of per-request scales and of
// cache_salt are not named: /metrics folds them into "other").
inline memory::NsLabels namespace_labels(const std::vector<ServedLora>& adapters) {
  std::map<std::string, std::string> names;  // ns id → "a,b"
  for (const ServedLora& a : adapters) {
    Result<std::string> ns = runtime::lora_namespace({{a.bound->lora, a.scale}});
    if (!ns.is_ok() || *ns == "base") continue;
    std::string& n = names[*ns];
    n += (n.empty() ? "" : ",") + a.name;
  }
  memory::NsLabels labels{{"base", "base"}};
  for (const auto& [ns, n] : names) labels[ns] = n + "@" + ns.substr(0, 8);
  return labels;
}

// `ns` under its label; one that is not labelled (another scale, a cache_salt, an adapter file of
// an earlier run found on the SSD tier) as "unnamed@" + its first 8 hex digits.
inline std::string namespace_label(const memory::NsLabels& labels, const std::string& ns) {
  auto it = labels.find(ns);
  if (it != labels.end()) return it->second;
  return ns == "base" ? "base" : "unnamed@" + ns.substr(0, 8);
}

// A cache reason with its namespace id (other_namespace:<id>) under the id's label.
inline std::string label_cache_reason(const memory::NsLabels& labels, const std::string& reason) {
  static const std::string kOther = "other_namespace:";
  if (reason.rfind(kOther, 0) != 0) return reason;
  return kOther + namespace_label(labels, reason.substr(kOther.size()));
}

}  // namespace larder::server
