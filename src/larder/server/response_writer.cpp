// response_writer.cpp — what every surface's writer shares (see response_writer.h), and the
// OpenAI envelope common to chat and completions.
#include "larder/server/response_writer.h"

#include "larder/server/api_fields.h"

namespace larder::server {

std::string sse(const ordered_json& j) {
  return "data: " + j.dump(-1, ' ', false, ordered_json::error_handler_t::replace) + "\n\n";
}

std::string sse_event(const char* type, const ordered_json& j) { return std::string("event: ") + type + "\n" + sse(j); }

int64_t utf8_chars(const std::string& s) {  // characters started in s (continuation bytes skipped)
  int64_t n = 0;
  for (unsigned char c : s) n += (c >> 6) != 2;
  return n;
}

ResponseWriter::ResponseWriter(const ServedModel& sm, const ParsedRequest& pr, bool text_pipeline,
                               const char* call_id_prefix)
    : sm_(sm), pr_(pr), call_id_prefix_(call_id_prefix) {
  if (text_pipeline && pr.harmony) {
    harmony_.emplace();
    return;
  }
  if (text_pipeline && pr.split_reasoning) splitter_.emplace(pr.reasoning_start_inside);
  if (text_pipeline && pr.tool_style != runtime::ToolCallStyle::kNone) tool_parser_.emplace(pr.tool_style, pr.tools);
}

ResponseWriter::Pieces ResponseWriter::process(const std::string& text, bool final) {
  Pieces o;
  if (harmony_) {
    runtime::HarmonyParser::Out h = harmony_->push(text);
    if (final) h.append(harmony_->flush());
    o.content = std::move(h.content);
    if (keeps_reasoning()) o.reasoning = std::move(h.reasoning);
    o.calls = std::move(h.calls);
    record_calls(o.calls);
    return o;
  }
  if (splitter_) {
    runtime::ReasoningSplitter::Out r = splitter_->push(text);
    if (final) r.append(splitter_->flush());
    o.content = std::move(r.content);
    if (keeps_reasoning()) o.reasoning = std::move(r.reasoning);
  } else {
    o.content = text;
  }
  if (tool_parser_) {
    std::string c = tool_parser_->push(o.content);
    if (final) c += tool_parser_->flush();
    o.content = std::move(c);
    o.calls = tool_parser_->take_calls();
    record_calls(o.calls);
  }
  return o;
}

void ResponseWriter::record_calls(const std::vector<runtime::ToolCall>& calls) {
  for (const auto& call : calls) {
    calls_.push_back(call);
    call_ids_.push_back(random_id(call_id_prefix_));
  }
}

std::string ResponseWriter::stream_open() {
  if (opened_) return {};
  opened_ = true;
  return open_frames();
}

std::string ResponseWriter::stream_frames(const Event& e) {
  if (e.admitted) {
    outcome_.prompt_tokens = e.outcome.prompt_tokens;
    outcome_.cached_tokens = e.outcome.cached_tokens;
    return stream_open();
  }
  std::string out = stream_open();
  const size_t calls_before = calls_.size();
  const Pieces parts = process(e.text, e.done);
  out += delta_frames(parts, e.tokens);
  for (size_t i = calls_before; i < calls_.size(); ++i) out += tool_call_frames(i);
  if (!e.done) return out;
  outcome_ = e.outcome;
  if (outcome_.finish == Finish::kError || outcome_.finish == Finish::kCancelled)
    return out + error_frames(outcome_.error.empty() ? "generation was cancelled" : outcome_.error);
  return out + finish_frames();
}

std::string ResponseWriter::usage_frame(const Outcome&) { return {}; }

void ResponseWriter::add(const Event& e) {
  if (e.admitted) {
    outcome_.prompt_tokens = e.outcome.prompt_tokens;
    outcome_.cached_tokens = e.outcome.cached_tokens;
    return;
  }
  const Pieces parts = process(e.text, e.done);
  text_ += parts.content;
  reasoning_ += parts.reasoning;
  tokens_.insert(tokens_.end(), e.tokens.begin(), e.tokens.end());
  if (e.done) outcome_ = e.outcome;
}

std::unique_ptr<ResponseWriter> make_response_writer(const ServedModel& sm, const ParsedRequest& pr, Surface surface) {
  switch (surface) {
    case Surface::kChat: return make_chat_writer(sm, pr);
    case Surface::kCompletions: return make_completions_writer(sm, pr);
    case Surface::kMessages: return make_messages_writer(sm, pr);
  }
  return nullptr;
}

// ---- OpenAI ---------------------------------------------------------------------------------

OpenAiWriter::OpenAiWriter(const ServedModel& sm, const ParsedRequest& pr, bool text_pipeline, const char* object,
                           const char* chunk_object)
    : ResponseWriter(sm, pr, text_pipeline, "call_"), object_(object), chunk_object_(chunk_object) {}

ordered_json OpenAiWriter::envelope(const char* object) const {
  return {{"id", pr_.response_id}, {"object", object}, {"created", pr_.created}, {"model", sm_.id},
          {"system_fingerprint", sm_.fingerprint}};
}

ordered_json OpenAiWriter::body_with(ordered_json choice) const {
  ordered_json b = envelope(object_);
  b["choices"] = ordered_json::array({std::move(choice)});
  b["usage"] = usage_json();
  return b;
}

ordered_json OpenAiWriter::chunk(ordered_json choice) const {
  ordered_json c = envelope(chunk_object_);
  choice["index"] = index_;
  c["choices"] = ordered_json::array({choice});
  if (pr_.include_usage) c["usage"] = nullptr;
  return c;
}

std::string OpenAiWriter::finish_reason() const {
  if (!calls_.empty() && outcome_.finish != Finish::kLength) return "tool_calls";
  return outcome_.finish == Finish::kLength ? "length" : "stop";
}

ordered_json OpenAiWriter::usage_json() const {
  const Outcome& o = outcome_;
  ordered_json ext = {{"cache", {{"tier", o.cache_tier}, {"reason", o.cache_reason}}},
                      {"timings",
                       {{"queue_ms", o.queue_ms}, {"prefill_ms", o.prefill_ms}, {"ttft_ms", o.ttft_ms},
                        {"decode_ms", o.decode_ms},
                        {"prefill_tps", o.prefill_ms > 0 ? (o.prompt_tokens - o.cached_tokens) / (o.prefill_ms / 1e3) : 0.0},
                        {"decode_tps", o.decode_ms > 0 && o.completion_tokens > 1
                                           ? (o.completion_tokens - 1) / (o.decode_ms / 1e3) : 0.0}}}};
  if (o.speculative) {
    ext["timings"]["drafted_tokens"] = o.drafted_tokens;
    ext["timings"]["accepted_tokens"] = o.accepted_tokens;
    ext["timings"]["acceptance_rate"] = o.drafted_tokens > 0 ? double(o.accepted_tokens) / o.drafted_tokens : 0.0;
  }
  return {{"prompt_tokens", o.prompt_tokens},
          {"completion_tokens", o.completion_tokens},
          {"total_tokens", o.prompt_tokens + o.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", o.cached_tokens}}},
          {"completion_tokens_details", {{"reasoning_tokens", 0}}},
          {"larder", ext}};
}

std::string OpenAiWriter::usage_frame(const Outcome& total) {
  outcome_ = total;
  ordered_json u = envelope(chunk_object_);
  u["choices"] = ordered_json::array();
  u["usage"] = usage_json();
  return sse(u);
}

std::string OpenAiWriter::error_frames(const std::string& message) {
  return sse({{"error", {{"message", message}, {"type", "server_error"}, {"param", nullptr}, {"code", nullptr}}}}) +
         (part_of_many_ ? "" : "data: [DONE]\n\n");
}

std::string OpenAiWriter::finish_frames() {
  ordered_json choice = final_choice();
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = finish_reason();
  ordered_json last = chunk(choice);
  if (part_of_many_) return sse(last);
  std::string out;
  if (pr_.include_usage) {
    out += sse(last);
    ordered_json u = envelope(chunk_object_);
    u["choices"] = ordered_json::array();
    u["usage"] = usage_json();
    out += sse(u);
  } else {
    last["usage"] = usage_json();  // mlx-bun behaviour: usage on the final chunk
    out += sse(last);
  }
  return out + "data: [DONE]\n\n";
}

}  // namespace larder::server
