// kv_identity.h — the KV store identity of a loaded model (kv-store.md §9): what a stored
// prefix must match to seed a prefill here. Derived from content (file bytes, config fields,
// KV layout, kernel tier), never from names, so a renamed copy of the same model shares its
// cache and a fine-tune with the same name does not.
#pragma once

#include "larder/memory/store/identity.h"
#include "larder/memory/store/kv_store.h"
#include "larder/models/lora.h"
#include "larder/runtime/loaded_model.h"

namespace larder::runtime {

Result<memory::StoreIdentity> kv_store_identity(const LoadedModel& m);

// The storage signature of this model's sequence state (plain f32 KV for every layer today).
std::string kv_state_signature(const LoadedModel& m);

// The KV namespace of a request that runs with `uses` (issue 45 item 3): "base" without adapters
// (and without a cache salt), else a hash of the adapters' content hashes and scales — never of
// their names or paths, so a renamed adapter file shares its entries and a replaced one does not.
// The list is taken in canonical form (models::canonical_lora_uses: scale-0 entries dropped,
// sorted by content hash and scale), so the same set in any order names one namespace; the
// projection hook applies the deltas in that same order, which is what makes sharing exact.
// invalid_argument for a non-finite scale.
Result<std::string> lora_namespace(std::vector<models::LoraUse> uses, std::string_view cache_salt = {});

}  // namespace larder::runtime
