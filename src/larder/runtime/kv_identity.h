// kv_identity.h — the KV store identity of a loaded model (kv-store.md §9): what a stored
// prefix must match to seed a prefill here. Derived from content (file bytes, config fields,
// KV layout, kernel tier), never from names, so a renamed copy of the same model shares its
// cache and a fine-tune with the same name does not.
#pragma once

#include "larder/memory/store/identity.h"
#include "larder/memory/store/kv_store.h"
#include "larder/runtime/loaded_model.h"

namespace larder::runtime {

Result<memory::StoreIdentity> kv_store_identity(const LoadedModel& m);

// The storage signature of this model's sequence state (plain f32 KV for every layer today).
std::string kv_state_signature(const LoadedModel& m);

}  // namespace larder::runtime
