#include "larder/runtime/kv_identity.h"

#include <cmath>

#include "larder/kernels/numerics.h"
#include "larder/memory/store/entry.h"

namespace larder::runtime {

std::string kv_state_signature(const LoadedModel& m) {
  // The signature of the state the model declares (the same schema new_state() builds), so an
  // entry is only ever lent to a model whose layers keep the same kinds of state.
  const memory::SequenceState s = m.model->new_state(1);
  std::vector<const memory::LayerState*> layers;
  for (const auto& l : s.layers) layers.push_back(l.get());
  return memory::state_signature(s.kv.layout(), layers, {});
}

Result<memory::StoreIdentity> kv_store_identity(const LoadedModel& m) {
  memory::StoreIdentity id;
  std::vector<std::string> weight_files;
  for (const auto& f : m.files.tensors().files()) weight_files.push_back(f->path());
  LARDER_ASSIGN_OR_RETURN(id.weights_id, memory::weights_fingerprint(weight_files));
  // config.json shapes the graph (a GGUF's metadata is inside the weights fingerprint's header).
  std::vector<std::string> config_files;
  std::vector<std::string> tokenizer_files;
  if (m.files.source == formats::ModelSource::kHfDir) {
    config_files.push_back(m.files.path + "/config.json");
    for (const char* name : {"/tokenizer.json", "/tokenizer_config.json"}) {
      if (file_exists(m.files.path + name)) tokenizer_files.push_back(m.files.path + name);
    }
  }
  if (!config_files.empty()) {
    LARDER_ASSIGN_OR_RETURN(id.config_fp, memory::content_hash(config_files));
  } else {
    id.config_fp = "gguf-metadata";
  }
  if (!tokenizer_files.empty()) {
    LARDER_ASSIGN_OR_RETURN(id.tokenizer_fp, memory::content_hash(tokenizer_files));
  } else {
    id.tokenizer_fp = "gguf-metadata";
  }
  id.kv_scheme = kv_state_signature(m);
  // KV rows computed by other numerics (another tier, tile set or build whose kernels round
  // differently) differ in the last bits; reusing them would break the cached == uncached
  // contract, so the identity carries a fingerprint of what the active kernels compute.
  id.numerics_id = kernels::active_numerics_id();
  id.model_label = m.files.path;
  return id;
}

Result<std::string> lora_namespace(std::vector<models::LoraUse> uses, std::string_view cache_salt) {
  for (const models::LoraUse& u : uses) {
    if (!u.adapter) return invalid_argument("[kv-identity] a LoRA entry without an adapter");
    if (!std::isfinite(u.scale))
      return invalid_argument(strfmt("[kv-identity] LoRA adapter %s: scale must be a finite number",
                                     u.adapter->path().c_str()));
  }
  std::vector<memory::AdapterRef> refs;
  for (const models::LoraUse& u : models::canonical_lora_uses(std::move(uses)))
    refs.push_back({u.adapter->content_hash(), static_cast<double>(u.scale)});
  return memory::namespace_id(refs, cache_salt);
}

}  // namespace larder::runtime
