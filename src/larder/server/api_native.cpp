#include "larder/server/api_native.h"

namespace larder::server {

namespace {
const char* stop_type(const Outcome& o) {
  switch (o.finish) {
    case Finish::kEos: return "eos";
    case Finish::kLength: return "limit";
    case Finish::kStop: return o.matched_stop.empty() ? "eos" : "word";
    default: return "none";
  }
}
std::string sse(const ordered_json& j) { return "data: " + j.dump(-1, ' ', false, ordered_json::error_handler_t::replace) + "\n\n"; }
}  // namespace

ordered_json native_completion_body(const ServedModel& sm, const ParsedRequest& pr, const Outcome& o,
                                    const std::string& content) {
  const auto& sp = pr.gen.sampling;
  ordered_json j = {
      {"content", content},
      {"id_slot", 0},
      {"stop", true},
      {"model", sm.id},
      {"tokens_predicted", o.completion_tokens},
      {"tokens_evaluated", o.prompt_tokens},
      {"tokens_cached", o.cached_tokens},
      {"truncated", false},
      {"stop_type", stop_type(o)},
      {"stopping_word", o.matched_stop},
      {"generation_settings",
       {{"n_ctx", sm.ctx}, {"n_predict", pr.gen.max_tokens}, {"temperature", sp.temperature}, {"top_k", sp.top_k},
        {"top_p", sp.top_p}, {"min_p", sp.min_p}, {"seed", sp.seed}, {"stop", pr.gen.stops}}},
      {"timings",
       {{"prompt_n", o.prompt_tokens - o.cached_tokens},
        {"prompt_ms", o.prefill_ms},
        {"prompt_per_second", o.prefill_ms > 0 ? (o.prompt_tokens - o.cached_tokens) / (o.prefill_ms / 1e3) : 0.0},
        {"predicted_n", o.completion_tokens},
        {"predicted_ms", o.decode_ms},
        {"predicted_per_second", o.decode_ms > 0 && o.completion_tokens > 1 ? (o.completion_tokens - 1) / (o.decode_ms / 1e3) : 0.0}}}};
  if (o.finish == Finish::kError || o.finish == Finish::kCancelled)
    j["error"] = {{"message", o.error.empty() ? "generation failed" : o.error}, {"type", "server_error"}, {"code", 500}};
  return j;
}

std::string native_stream_frame(const Event& e) {
  if (e.admitted || e.done) return {};
  if (e.text.empty() && e.tokens.empty()) return {};
  ordered_json toks = ordered_json::array();
  for (const TokenInfo& t : e.tokens) toks.push_back(t.id);
  return sse({{"content", e.text}, {"tokens", toks}, {"stop", false}, {"id_slot", 0}});
}

}  // namespace larder::server
