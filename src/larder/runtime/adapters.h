// adapters.h — LoRA adapters for one loaded model (issue 45): each loaded, validated against the
// base and bound to its projection table once (CLI start, server start); a request's set of them
// turned into what the forward takes (BatchItem::adapters, canonical order) and the KV namespace
// its cache entries live in (lora_namespace), from one list so the two always agree.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "larder/core/status.h"
#include "larder/models/lora.h"
#include "larder/runtime/loaded_model.h"

namespace larder::runtime {

// LoraAdapter::load + validate against `m`'s files + bind_lora to `m`'s projections. Validation
// warnings (a base model name that does not match) are appended to `warnings`.
Result<std::shared_ptr<const models::BoundLora>> load_lora(const LoadedModel& m, const std::string& path,
                                                           std::vector<std::string>* warnings);

struct LoraRequest {
  std::vector<models::AdapterUse> forward;  // canonical order; points into the bound adapters
  std::string ns;                           // the KV namespace ("base"-equivalent when empty)
};
// `uses` → the forward's list and the namespace. Errors: a non-finite scale, an adapter not in
// `bound`.
Result<LoraRequest> lora_request(std::vector<models::LoraUse> uses,
                                 std::span<const std::shared_ptr<const models::BoundLora>> bound,
                                 std::string_view cache_salt = {});

}  // namespace larder::runtime
