#include "larder/memory/states/layer_state.h"

#include <algorithm>
#include <cstring>
#include <unordered_set>

namespace larder::memory {

const char* state_kind_name(StateKind k) {
  switch (k) {
    case StateKind::kPlainKv: return "plain_kv";
    case StateKind::kRing: return "ring";
    case StateKind::kRecurrent: return "recurrent";
  }
  return "unknown";
}

Result<StateKind> parse_state_kind(const std::string& s) {
  if (s == "plain_kv") return StateKind::kPlainKv;
  if (s == "ring") return StateKind::kRing;
  if (s == "recurrent") return StateKind::kRecurrent;
  return corrupt(strfmt("[kv] unknown layer kind '%s'", s.c_str()));
}

size_t distinct_bytes(const std::vector<StorageRef>& refs, Backing backing) {
  std::unordered_set<const void*> seen;
  size_t n = 0;
  for (const StorageRef& r : refs) {
    if (r.backing != backing) continue;
    if (seen.insert(r.id).second) n += r.bytes;
  }
  return n;
}

int64_t StateTensor::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

StateTensor StateTensor::copy_of(const StateTensor& t) {
  auto buf = std::make_shared<std::vector<uint8_t>>(t.data, t.data + t.bytes);
  StateTensor c = t;
  c.data = buf->data();
  c.owner = buf;
  c.backing = Backing::kAnon;
  return c;
}

StateTensor StateTensor::from_floats(std::string name, std::vector<int64_t> shape, std::vector<float> data) {
  auto buf = std::make_shared<std::vector<float>>(std::move(data));
  StateTensor t;
  t.name = std::move(name);
  t.dtype = DType::kF32;
  t.shape = std::move(shape);
  t.data = reinterpret_cast<const uint8_t*>(buf->data());
  t.bytes = buf->size() * sizeof(float);
  t.owner = buf;
  return t;
}

size_t LayerState::resident_bytes() const {
  std::vector<StorageRef> refs;
  storage(&refs);
  return distinct_bytes(refs, Backing::kAnon) + distinct_bytes(refs, Backing::kMapped);
}

float* CowBuffer::mutable_data() {
  if (!p_) return nullptr;
  if (p_.use_count() > 1) p_ = std::make_shared<std::vector<float>>(*p_);
  return p_->data();
}

namespace {

StateTensor tensor_view(std::string name, std::vector<int64_t> shape, const CowBuffer& b) {
  StateTensor t;
  t.name = std::move(name);
  t.dtype = DType::kF32;
  t.shape = std::move(shape);
  t.data = reinterpret_cast<const uint8_t*>(b.data());
  t.bytes = b.size() * sizeof(float);
  t.owner = b.owner();
  return t;
}

// Validates a persisted f32 tensor against the expected shape; the restore path must never
// build a state from a tensor whose byte length disagrees with its declared shape.
Result<std::vector<float>> expect_f32(const std::vector<StateTensor>& ts, size_t i, const char* name,
                                      std::vector<int64_t> shape) {
  if (i >= ts.size()) return corrupt(strfmt("[kv] missing tensor '%s'", name));
  const StateTensor& t = ts[i];
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  if (t.name != name || t.dtype != DType::kF32 || t.shape != shape ||
      t.bytes != static_cast<size_t>(n) * sizeof(float)) {
    return corrupt(strfmt("[kv] tensor '%s' does not match the expected f32 shape (%zu bytes)",
                          t.name.c_str(), t.bytes));
  }
  std::vector<float> v(static_cast<size_t>(n));
  std::memcpy(v.data(), t.data, t.bytes);
  return v;
}

}  // namespace

// ---- RingState ----------------------------------------------------------------------------

RingState::RingState(int64_t window, int n_heads, int head_dim)
    : window_(window), n_heads_(n_heads), head_dim_(head_dim),
      k_(static_cast<size_t>(window * n_heads * head_dim)),
      v_(static_cast<size_t>(window * n_heads * head_dim)) {}

void RingState::append(const float* k, const float* v) {
  const int64_t r = row();
  std::memcpy(k_.mutable_data() + index_ * r, k, static_cast<size_t>(r) * sizeof(float));
  std::memcpy(v_.mutable_data() + index_ * r, v, static_cast<size_t>(r) * sizeof(float));
  index_ = (index_ + 1) % window_;
  ++offset_;
}

void RingState::append_rows(const float* k, const float* v, int64_t n) {
  const int64_t r = row();
  const int64_t skip = n > window_ ? n - window_ : 0;
  // The ring now reads as offset_ + skip tokens: the skipped rows land in slots that the kept
  // rows overwrite, so only the kept rows are copied (slot of position p = (index + p - offset)).
  index_ = (index_ + skip) % window_;
  offset_ += skip;
  float* kd = k_.mutable_data();
  float* vd = v_.mutable_data();
  for (int64_t t = skip; t < n;) {
    const int64_t run = std::min(n - t, window_ - index_);  // up to the ring's end
    std::memcpy(kd + index_ * r, k + t * r, static_cast<size_t>(run * r) * sizeof(float));
    std::memcpy(vd + index_ * r, v + t * r, static_cast<size_t>(run * r) * sizeof(float));
    index_ = (index_ + run) % window_;
    offset_ += run;
    t += run;
  }
}

void RingState::spans(int64_t from, std::vector<KvSpan>* out) const {
  LARDER_DCHECK(from >= offset_ - window_ && from <= offset_, "ring span from %lld", (long long)from);
  int64_t pos = std::max<int64_t>(from, 0);
  const int64_t r = row();
  while (pos < offset_) {
    // Slot of position p: the write index holds position offset_, walking back (p - offset_).
    const int64_t slot = ((index_ + (pos - offset_)) % window_ + window_) % window_;
    const int64_t len = std::min(offset_ - pos, window_ - slot);
    out->push_back({k_.data() + slot * r, v_.data() + slot * r, pos, len});
    pos += len;
  }
}

std::string RingState::signature() const {
  return strfmt("ring:f32:w=%lld:h=%d:d=%d", static_cast<long long>(window_), n_heads_, head_dim_);
}

void RingState::storage(std::vector<StorageRef>* out) const {
  out->push_back({k_.id(), k_.size() * sizeof(float), Backing::kAnon});
  out->push_back({v_.id(), v_.size() * sizeof(float), Backing::kAnon});
}

std::unique_ptr<LayerState> RingState::view() const { return std::make_unique<RingState>(*this); }

Status RingState::trim(int64_t n) {
  if (n < 0 || n > offset_) return invalid_argument(strfmt("[kv] ring trim %lld of %lld", (long long)n, (long long)offset_));
  if (n == 0) return Status::ok();
  if (!trimmable()) return unsupported("[kv] ring wrapped: its evicted rows cannot be recreated by a trim");
  // Pre-wrap the write index equals the offset; rows past it are never read and are
  // overwritten by later appends, so a trim needs no data movement (and no COW copy).
  offset_ -= n;
  index_ = offset_;
  return Status::ok();
}

nlohmann::json RingState::params() const {
  return {{"window", window_}, {"n_heads", n_heads_}, {"head_dim", head_dim_},
          {"ring_index", index_}, {"offset", offset_}};
}

std::vector<StateTensor> RingState::tensors() const {
  return {tensor_view("k", {window_, n_heads_, head_dim_}, k_),
          tensor_view("v", {window_, n_heads_, head_dim_}, v_)};
}

// ---- RecurrentState -----------------------------------------------------------------------

RecurrentState::RecurrentState(int conv_k, int conv_dim, int n_heads, int dk, int dv)
    : conv_k_(conv_k), conv_dim_(conv_dim), n_heads_(n_heads), dk_(dk), dv_(dv),
      conv_(static_cast<size_t>((conv_k - 1) * conv_dim)),
      mat_(static_cast<size_t>(n_heads) * dk * dv) {}

void RecurrentState::absorb(const float* x) {
  float* c = conv_.mutable_data();
  const int rows = conv_k_ - 1;
  if (rows > 0) {
    std::memmove(c, c + conv_dim_, static_cast<size_t>((rows - 1) * conv_dim_) * sizeof(float));
    std::memcpy(c + (rows - 1) * conv_dim_, x, static_cast<size_t>(conv_dim_) * sizeof(float));
  }
  float* m = mat_.mutable_data();
  const size_t n = mat_.size();
  for (size_t i = 0; i < n; ++i) m[i] = 0.9f * m[i] + x[i % static_cast<size_t>(conv_dim_)];
  ++offset_;
}

void RecurrentState::reset() {
  std::fill_n(conv_.mutable_data(), conv_.size(), 0.0f);
  std::fill_n(mat_.mutable_data(), mat_.size(), 0.0f);
  offset_ = 0;
}

std::string RecurrentState::signature() const {
  return strfmt("recurrent:f32:k=%d:c=%d:h=%d:dk=%d:dv=%d", conv_k_, conv_dim_, n_heads_, dk_, dv_);
}

void RecurrentState::storage(std::vector<StorageRef>* out) const {
  out->push_back({conv_.id(), conv_.size() * sizeof(float), Backing::kAnon});
  out->push_back({mat_.id(), mat_.size() * sizeof(float), Backing::kAnon});
}

std::unique_ptr<LayerState> RecurrentState::view() const { return std::make_unique<RecurrentState>(*this); }

Status RecurrentState::trim(int64_t n) {
  if (n == 0) return Status::ok();
  return unsupported("[kv] recurrent state is never trimmable");
}

nlohmann::json RecurrentState::params() const {
  return {{"conv_k", conv_k_}, {"conv_dim", conv_dim_}, {"n_heads", n_heads_},
          {"dk", dk_}, {"dv", dv_}, {"offset", offset_}};
}

std::vector<StateTensor> RecurrentState::tensors() const {
  return {tensor_view("conv", {conv_k_ - 1, conv_dim_}, conv_),
          tensor_view("state", {n_heads_, dv_, dk_}, mat_)};
}

// ---- restore ------------------------------------------------------------------------------

Result<std::unique_ptr<LayerState>> restore_layer_state(StateKind kind, const nlohmann::json& p,
                                                        const std::vector<StateTensor>& ts) {
  try {
    if (kind == StateKind::kRing) {
      const int64_t w = p.at("window").get<int64_t>();
      const int h = p.at("n_heads").get<int>(), d = p.at("head_dim").get<int>();
      const int64_t idx = p.at("ring_index").get<int64_t>(), off = p.at("offset").get<int64_t>();
      if (w <= 0 || h <= 0 || d <= 0 || idx < 0 || idx >= w || off < 0 ||
          (off < w && idx != off)) {
        return corrupt("[kv] ring parameters are inconsistent");
      }
      LARDER_ASSIGN_OR_RETURN(auto k, expect_f32(ts, 0, "k", {w, h, d}));
      LARDER_ASSIGN_OR_RETURN(auto v, expect_f32(ts, 1, "v", {w, h, d}));
      auto r = std::make_unique<RingState>(w, h, d);
      r->k_ = CowBuffer(std::move(k));
      r->v_ = CowBuffer(std::move(v));
      r->index_ = idx;
      r->offset_ = off;
      return std::unique_ptr<LayerState>(std::move(r));
    }
    if (kind == StateKind::kRecurrent) {
      const int ck = p.at("conv_k").get<int>(), cd = p.at("conv_dim").get<int>();
      const int h = p.at("n_heads").get<int>(), dk = p.at("dk").get<int>(), dv = p.at("dv").get<int>();
      const int64_t off = p.at("offset").get<int64_t>();
      if (ck < 1 || cd <= 0 || h <= 0 || dk <= 0 || dv <= 0 || off < 0) {
        return corrupt("[kv] recurrent parameters are inconsistent");
      }
      LARDER_ASSIGN_OR_RETURN(auto c, expect_f32(ts, 0, "conv", {ck - 1, cd}));
      LARDER_ASSIGN_OR_RETURN(auto m, expect_f32(ts, 1, "state", {h, dv, dk}));
      auto r = std::make_unique<RecurrentState>(ck, cd, h, dk, dv);
      r->conv_ = CowBuffer(std::move(c));
      r->mat_ = CowBuffer(std::move(m));
      r->offset_ = off;
      return std::unique_ptr<LayerState>(std::move(r));
    }
  } catch (const nlohmann::json::exception& e) {
    return corrupt(strfmt("[kv] layer parameters: %s", e.what()));
  }
  return corrupt(strfmt("[kv] layer kind %s cannot be restored as a layer state", state_kind_name(kind)));
}

// ---- Attachment ---------------------------------------------------------------------------

size_t Attachment::bytes() const {
  size_t n = 0;
  for (const StateTensor& t : tensors) n += t.bytes;
  return n;
}

void Attachment::storage(std::vector<StorageRef>* out) const {
  for (const StateTensor& t : tensors) out->push_back({t.data, t.bytes, t.backing, t.device});
}

}  // namespace larder::memory
