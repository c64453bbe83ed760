// loras.h — the LoRA adapters `larder serve MODEL --lora NAME=PATH[:SCALE]` serves (issue 45).
// Loaded, validated and bound to the model once at startup (runtime/adapters.h); a request picks
// them by `model` (NAME) or by llama-server's per-request `lora` list, and otherwise runs with the
// global scales GET/POST /lora-adapters show and set. Ids are the --lora order, as llama-server's.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "larder/models/lora.h"

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

}  // namespace larder::server
