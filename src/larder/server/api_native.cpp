// api_native.cpp — llama-server's native completion shapes (api_native.h).
#include "larder/server/api_native.h"

#include <algorithm>
#include <limits>

#include "larder/server/api_fields.h"
#include "larder/server/response_writer.h"

namespace larder::server {

using namespace fields;

ParsedRequest parse_native_completion(const ServedModel& sm, const ordered_json& b) {
  ParsedRequest pr = parse_completion(sm, b, /*llama_server=*/true);
  // n_probs: that many alternatives per generated token (0: none); OpenAI's `logprobs` stands in
  // when it is absent, as in llama-server.
  int n = pr.logprobs && pr.top_logprobs > 0 ? pr.top_logprobs : -1;
  if (auto np = integer(b, "n_probs", 0, kMaxNProbs)) n = *np > 0 ? static_cast<int>(*np) : -1;
  const bool post = boolean(b, "post_sampling_probs").value_or(false);
  pr.logprobs = n > 0;
  pr.top_logprobs = std::max(n, 0);
  auto apply = [&](GenRequest& g) {
    g.route = "/completion";
    g.top_logprobs = n;
    g.probs = post ? GenRequest::Probs::kPostSampling : GenRequest::Probs::kModel;
  };
  apply(pr.gen);
  for (GenRequest& g : pr.more) apply(g);
  return pr;
}

namespace {

const char* stop_type(const Outcome& o) {
  switch (o.finish) {
    case Finish::kEos: return "eos";
    case Finish::kLength: return "limit";
    case Finish::kStop: return o.matched_stop.empty() ? "eos" : "word";
    default: return "none";
  }
}

// The text of a token as llama-server reports it: its bytes without a trailing incomplete UTF-8
// sequence (the bytes field has them all).
std::string token_text(std::string s) {
  for (size_t i = 1; i <= 4 && i <= s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[s.size() - i]);
    const size_t need = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (need) {
      if (i < need) s.resize(s.size() - i);
      break;
    }
  }
  return s;
}

class NativeWriter final : public ResponseWriter {
 public:
  NativeWriter(const ServedModel& sm, const ParsedRequest& pr)
      : ResponseWriter(sm, pr, /*text_pipeline=*/false, "call_") {}

  ordered_json body() const override { return final_object(text_, &tokens_); }

 private:
  std::string open_frames() override { return {}; }
  std::string tool_call_frames(size_t) override { return {}; }

  std::string delta_frames(const Pieces& parts, const std::vector<TokenInfo>& tokens) override {
    if (parts.content.empty() && tokens.empty()) return {};
    predicted_ += static_cast<int64_t>(tokens.size());
    ordered_json ids = ordered_json::array();
    for (const TokenInfo& t : tokens) ids.push_back(t.id);
    ordered_json j = {{"index", index_},
                      {"content", parts.content},
                      {"tokens", ids},
                      {"stop", false},
                      {"id_slot", 0},
                      {"tokens_predicted", predicted_},
                      {"tokens_evaluated", outcome_.prompt_tokens}};
    if (pr_.logprobs && !tokens.empty()) j["completion_probabilities"] = probabilities(tokens);
    return sse(j);
  }

  // Streamed, the last event is the whole object with content "" (the text went in the deltas).
  std::string finish_frames() override { return sse(final_object("", nullptr)); }

  std::string error_frames(const std::string& message) override {
    return sse({{"error", {{"code", 500}, {"message", message}, {"type", "server_error"}}}});
  }

  ordered_json final_object(const std::string& content, const std::vector<TokenInfo>* toks) const {
    const Outcome& o = outcome_;
    const auto& sp = pr_.gen.sampling;
    ordered_json ids = ordered_json::array();
    if (toks)
      for (const TokenInfo& t : *toks) ids.push_back(t.id);
    ordered_json j = {
        {"index", index_},
        {"content", content},
        {"tokens", ids},
        {"id_slot", 0},
        {"stop", true},
        {"model", sm_.id},
        {"tokens_predicted", o.completion_tokens},
        {"tokens_evaluated", o.prompt_tokens},
        {"tokens_cached", o.cached_tokens},
        {"truncated", false},
        {"stop_type", stop_type(o)},
        {"stopping_word", o.matched_stop},
        {"generation_settings",
         {{"n_ctx", sm_.ctx}, {"n_predict", pr_.gen.max_tokens}, {"temperature", sp.temperature}, {"top_k", sp.top_k},
          {"top_p", sp.top_p}, {"min_p", sp.min_p}, {"seed", sp.seed}, {"stop", pr_.gen.stops},
          {"n_probs", pr_.top_logprobs}, {"post_sampling_probs", pr_.gen.probs == GenRequest::Probs::kPostSampling}}},
        {"timings",
         {{"prompt_n", o.prompt_tokens - o.cached_tokens},
          {"prompt_ms", o.prefill_ms},
          {"prompt_per_second", o.prefill_ms > 0 ? (o.prompt_tokens - o.cached_tokens) / (o.prefill_ms / 1e3) : 0.0},
          {"predicted_n", o.completion_tokens},
          {"predicted_ms", o.decode_ms},
          {"predicted_per_second",
           o.decode_ms > 0 && o.completion_tokens > 1 ? (o.completion_tokens - 1) / (o.decode_ms / 1e3) : 0.0}}}};
    if (o.speculative) {  // llama-server's names for the same counts
      j["timings"]["draft_n"] = o.drafted_tokens;
      j["timings"]["draft_n_accepted"] = o.accepted_tokens;
    }
    if (toks && pr_.logprobs) j["completion_probabilities"] = probabilities(*toks);
    if (o.finish == Finish::kError || o.finish == Finish::kCancelled)
      j["error"] = {{"code", 500}, {"message", o.error.empty() ? "generation failed" : o.error}, {"type", "server_error"}};
    return j;
  }

  // llama-server's completion_probabilities: per token {id, token, bytes, logprob, top_logprobs:
  // [{id, token, bytes, logprob}]}; with post_sampling_probs, prob / top_probs (probabilities).
  ordered_json probabilities(const std::vector<TokenInfo>& toks) const {
    const tokenizer::Tokenizer& tk = *sm_.m->tokenizer;
    auto entry = [&](int32_t id, float v, bool linear) {
      const std::string piece = tk.token_bytes(id);
      ordered_json bytes = ordered_json::array();
      for (unsigned char c : piece) bytes.push_back(static_cast<int>(c));
      // JSON has no −∞: a token the model cannot produce gets the lowest float, as in llama-server.
      if (!linear && !(v > -std::numeric_limits<float>::infinity())) v = std::numeric_limits<float>::lowest();
      return ordered_json{{"id", id}, {"token", token_text(piece)}, {"bytes", bytes}, {linear ? "prob" : "logprob", v}};
    };
    ordered_json out = ordered_json::array();
    for (const TokenInfo& t : toks) {
      const bool linear = t.lp.linear;
      ordered_json e = entry(t.id, t.lp.logprob, linear);
      ordered_json top = ordered_json::array();
      for (const auto& [id, v] : t.lp.top) top.push_back(entry(id, v, linear));
      e[linear ? "top_probs" : "top_logprobs"] = std::move(top);
      out.push_back(std::move(e));
    }
    return out;
  }

  int64_t predicted_ = 0;  // tokens streamed so far
};

}  // namespace

std::unique_ptr<ResponseWriter> make_native_writer(const ServedModel& sm, const ParsedRequest& pr) {
  return std::make_unique<NativeWriter>(sm, pr);
}

}  // namespace larder::server
