// sequence_state.h — one sequence's model state: one slot per model layer.
//
// A model declares what each of its layers keeps per sequence (a StateSchema, like mlx-lm's
// `make_cache()`): plain KV for full attention, a ring of the window for sliding-window
// attention, a recurrent state for SSM / gated-DeltaNet layers. `SequenceState` holds them:
//   - the plain layers together in one KvCache (token-major rows, shareable prefix spans: the
//     form the KV store adopts and lends without copying), one KvCache layer per plain layer;
//   - every other kind as a LayerState (ring, recurrent), in layer order;
//   - `slots[i]` says where model layer i's state lives.
// So KvCache is one kind of layer state (the plain kind, stored layer-major because the store
// shares it as one block), not the only one. The KV store keeps and lends `kv`, `layers` and
// `attachments`; `slots` are rebuilt from the model's schema when a hit becomes a state
// (Hit::into_state).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "larder/memory/kv_cache.h"
#include "larder/memory/states/layer_state.h"

namespace larder::memory {

// The bytes one sequence's state holds: `per_token` grows with every token (the plain layers'
// K/V rows), `fixed` does not (a ring is allocated at its window, a recurrent state is constant).
// Memory estimates and admission use this rather than n_layers x heads x head_dim, which is wrong
// for every model whose layers differ (sliding windows, KV-sharing layers with no slot, per-kind
// head sizes).
struct StateFootprint {
  uint64_t per_token = 0, fixed = 0;
  uint64_t at(int64_t tokens) const { return per_token * static_cast<uint64_t>(tokens) + fixed; }
};

// What one model layer keeps per sequence.
struct LayerStateSpec {
  StateKind kind = StateKind::kPlainKv;
  int n_kv_heads = 0, head_dim = 0;  // plain, ring
  int64_t window = 0;                // ring: tokens kept (a key at distance < window is visible)
  int conv_k = 0, conv_dim = 0, n_heads = 0, dk = 0, dv = 0;  // recurrent: RecurrentState's shapes
  bool operator==(const LayerStateSpec&) const = default;
};

struct StateSchema {
  std::vector<LayerStateSpec> layers;  // one per model layer, in order
  // Dtype of the plain layers' KV rows (f32, f16, q8_0; kernels/ops.h). Rings keep f32: their
  // memory is bounded by the window whatever the context.
  DType kv_dtype = DType::kF32;

  // The KvCache layout of the plain layers (n_layers = their count). Plain layers must agree on
  // KV heads and head_dim (one KvCache row shape); validate() says so when they do not.
  KvLayout plain_layout() const;
  Status validate() const;
  StateFootprint footprint() const;
  // Some layer keeps state that cannot be cut back to any prefix (a ring, a recurrent state):
  // the KV store serves it only at exact boundaries, so callers plan checkpoints (kv-store.md §11.3).
  bool needs_checkpoints() const {
    for (const LayerStateSpec& l : layers)
      if (l.kind != StateKind::kPlainKv) return true;
    return false;
  }
  // All-plain schema of a KvLayout, its dtype included (what a Llama-style model declares).
  static StateSchema all_plain(const KvLayout& layout);
};

// Where model layer i's state lives: kv layer `index` (plain) or layers[index] (other kinds).
struct LayerSlot {
  StateKind kind = StateKind::kPlainKv;
  int index = 0;
};

struct SequenceState {
  // Plain layers only (every KvCache layer is a model layer, in order).
  SequenceState(const KvLayout& layout, int64_t max_tokens);
  // One slot per schema layer; rings and recurrent states are allocated here (constant size).
  // The schema must be valid (StateSchema::validate).
  SequenceState(const StateSchema& schema, int64_t max_tokens);
  SequenceState(SequenceState&&) = default;
  SequenceState& operator=(SequenceState&&) = default;

  KvCache kv;
  std::vector<std::unique_ptr<LayerState>> layers;
  std::vector<Attachment> attachments;
  std::vector<LayerSlot> slots;  // per model layer (empty for store-only synthetic states)

  // Tokens absorbed (every slot agrees; checked by consistent()).
  int64_t length() const { return kv.length(); }
  int64_t max_tokens() const { return kv.max_tokens(); }
  // Every layer state has absorbed length() tokens.
  Status consistent() const;
  // Forget tokens past n (n <= length()) in every layer. unsupported when a layer cannot (a
  // wrapped ring, a recurrent state): then nothing changed. n = 0 always works (a reset).
  Status trim(int64_t n);
  // The state of model layer i: its ring, or its recurrent state (nullptr when the slot is of
  // another kind).
  RingState* ring(int i) const;
  RecurrentState* recurrent(int i) const;
  // Bytes of memory this state holds (its own rows + every layer state; not a shared prefix).
  size_t resident_bytes() const;
};

}  // namespace larder::memory
