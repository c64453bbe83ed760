// reasoning.h — splits a model's streamed output into reasoning and answer text at its thinking
// tags (`<think>` … `</think>` for Qwen3/DeepSeek-R1-style models), streaming-safe: a piece that
// might be the start of a tag is held until the next pieces decide it, so no tag — not even part
// of one — ever reaches either side. (server-api.md §5.3 "reasoning splitter".)
#pragma once

#include <string>
#include <string_view>

namespace larder::runtime {

class ReasoningSplitter {
 public:
  // start_inside: the prompt itself ended inside an opened tag (templates that pre-open
  // `<think>` for the model), so the first text is reasoning.
  explicit ReasoningSplitter(bool start_inside = false, std::string open = "<think>", std::string close = "</think>")
      : open_(std::move(open)), close_(std::move(close)), inside_(start_inside) {}

  struct Out {
    std::string content, reasoning;
    void append(const Out& o) {  // o released after this
      content += o.content;
      reasoning += o.reasoning;
    }
  };
  Out push(std::string_view text);
  Out flush();  // end of stream: release what is held (an unfinished tag prefix is plain text)
  bool inside() const { return inside_; }

 private:
  void emit(Out& o, std::string_view s);
  std::string open_, close_;
  bool inside_ = false;
  bool after_close_ = false;  // strip the blank lines templates put between </think> and the answer
  std::string pending_;
};

}  // namespace larder::runtime
