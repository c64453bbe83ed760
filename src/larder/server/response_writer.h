// response_writer.h — engine events → one API surface's response (a JSON body, or SSE frames).
//
// The part every surface shares lives in ResponseWriter: admission bookkeeping, the text
// pipeline after the engine's stop matcher (reasoning splitter → tool-call parser), the event
// order. What a surface says is its own subclass, next to its request parser: ChatWriter in
// api_chat.cpp, CompletionsWriter in api_completions.cpp, MessagesWriter in api_messages.cpp;
// OpenAiWriter holds the chunk/usage conventions the two OpenAI surfaces have in common. Internal
// to server/.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "larder/runtime/harmony.h"
#include "larder/server/api.h"

namespace larder::server {

// "data: {...}\n\n" and "event: type\ndata: {...}\n\n".
std::string sse(const ordered_json& j);
std::string sse_event(const char* type, const ordered_json& j);

class ResponseWriter {
 public:
  virtual ~ResponseWriter() = default;
  // Streaming: the SSE frames to send for this event (may be empty). Call in event order.
  std::string stream_frames(const Event& e);
  // The opening frames (role chunk / message_start) — sent once, after admission is known.
  std::string stream_open();
  // Non-stream: feed every event, then body().
  void add(const Event& e);
  virtual ordered_json body() const = 0;
  // For logs.
  const Outcome& outcome() const { return outcome_; }
  const std::string& text() const { return text_; }
  void set_index(int i) { index_ = i; }  // the choice index this writer answers
  // One of several choices streamed together (n > 1, prompt lists): this writer's frames end
  // with its finish chunk; the caller sends the merged usage and the one [DONE].
  void set_part_of_many() { part_of_many_ = true; }
  // The usage chunk of a multi-choice stream, from the merged outcome (include_usage).
  virtual std::string usage_frame(const Outcome& total);

 protected:
  struct Pieces {
    std::string content, reasoning;
    std::vector<runtime::ToolCall> calls;  // completed by this piece
  };
  // text_pipeline: split reasoning and parse tool calls when the request asks for them (chat
  // surfaces); off for plain completions. call_id_prefix: "call_" (OpenAI) or "toolu_".
  ResponseWriter(const ServedModel& sm, const ParsedRequest& pr, bool text_pipeline, const char* call_id_prefix);

  virtual std::string open_frames() = 0;
  // Frames for new text (content/reasoning, either may be empty) and the tokens that made it.
  virtual std::string delta_frames(const Pieces& parts, const std::vector<TokenInfo>& tokens) = 0;
  virtual std::string tool_call_frames(size_t i) = 0;  // call i just completed
  virtual std::string finish_frames() = 0;             // after the last event of a finished answer
  virtual std::string error_frames(const std::string& message) = 0;
  // Reasoning text the surface returns (Anthropic: only when thinking was requested).
  virtual bool keeps_reasoning() const { return true; }

  const ServedModel& sm_;
  const ParsedRequest& pr_;
  std::string text_, reasoning_;
  std::vector<TokenInfo> tokens_;
  std::vector<runtime::ToolCall> calls_;
  std::vector<std::string> call_ids_;
  Outcome outcome_;
  int index_ = 0;
  bool part_of_many_ = false;

 private:
  Pieces process(const std::string& text, bool final);
  void record_calls(const std::vector<runtime::ToolCall>& calls);  // completed calls get their ids
  std::optional<runtime::ReasoningSplitter> splitter_;
  std::optional<runtime::ToolCallParser> tool_parser_;
  std::optional<runtime::HarmonyParser> harmony_;  // instead of both above (ParsedRequest::harmony)
  const char* call_id_prefix_;
  bool opened_ = false;
};

// OpenAI's conventions shared by chat and completions: chunk envelopes, usage (with larder's
// cache and timing extension), finish reasons, the error event and [DONE].
class OpenAiWriter : public ResponseWriter {
 public:
  std::string usage_frame(const Outcome& total) override;

 protected:
  OpenAiWriter(const ServedModel& sm, const ParsedRequest& pr, bool text_pipeline, const char* object,
               const char* chunk_object);
  ordered_json chunk(ordered_json choice_fields) const;
  ordered_json usage_json() const;
  std::string finish_reason() const;
  ordered_json envelope(const char* object) const;  // id, object, created, model, fingerprint
  // The non-stream body: the envelope around one choice, with usage.
  ordered_json body_with(ordered_json choice) const;
  std::string finish_frames() override;
  std::string error_frames(const std::string& message) override;
  // The empty delta of the finishing chunk: chat {"delta": {}}, completions {"text": ""}.
  virtual ordered_json final_choice() const = 0;
  const char* object_;        // "chat.completion" / "text_completion"
  const char* chunk_object_;  // "chat.completion.chunk" / "text_completion"
  mutable int64_t lp_offset_ = 0;  // text_offset of the next token (characters)
};

// One writer per surface (defined next to the surface's parser).
std::unique_ptr<ResponseWriter> make_chat_writer(const ServedModel& sm, const ParsedRequest& pr);
std::unique_ptr<ResponseWriter> make_completions_writer(const ServedModel& sm, const ParsedRequest& pr);
std::unique_ptr<ResponseWriter> make_messages_writer(const ServedModel& sm, const ParsedRequest& pr);
std::unique_ptr<ResponseWriter> make_response_writer(const ServedModel& sm, const ParsedRequest& pr, Surface surface);

// Token pieces as the output is made of them (shared by the OpenAI logprob shapes).
int64_t utf8_chars(const std::string& s);

}  // namespace larder::server
