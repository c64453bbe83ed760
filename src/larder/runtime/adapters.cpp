#include "larder/runtime/adapters.h"

#include "larder/runtime/kv_identity.h"

namespace larder::runtime {

Result<std::shared_ptr<const models::BoundLora>> load_lora(const LoadedModel& m, const std::string& path,
                                                           std::vector<std::string>* warnings) {
  if (!m.model) return invalid_argument("[lora] the model was loaded without weights");
  LARDER_ASSIGN_OR_RETURN(std::shared_ptr<const models::LoraAdapter> a, models::LoraAdapter::load(path));
  LARDER_ASSIGN_OR_RETURN(models::BaseProjections base, models::BaseProjections::from_files(m.files));
  LARDER_RETURN_IF_ERROR(a->validate(base, warnings));
  return models::bind_lora(std::move(a), m.model->projections());
}

Result<LoraRequest> lora_request(std::vector<models::LoraUse> uses,
                                 std::span<const std::shared_ptr<const models::BoundLora>> bound,
                                 std::string_view cache_salt) {
  LoraRequest r;
  LARDER_ASSIGN_OR_RETURN(r.ns, lora_namespace(uses, cache_salt));  // checks the scales first
  LARDER_ASSIGN_OR_RETURN(r.forward, models::forward_adapter_uses(std::move(uses), bound));
  return r;
}

}  // namespace larder::runtime
