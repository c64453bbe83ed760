// fuzz_output — model output text through the streaming output parsers the way the server's
// ResponseWriter::process chains them: runtime/harmony.cpp's HarmonyParser alone (gpt-oss), or
// runtime/reasoning.cpp's ReasoningSplitter (optional) feeding runtime/tool_calls.cpp's
// ToolCallParser (any style; the XML style with a tools list whose parameter schemas take its
// string, enum and JSON paths). Input byte 0 picks the pipeline (bit 0 harmony; else bit 1 split
// reasoning, bit 2 start inside the thinking tag, bits 3-4 the tool-call style); byte 1 is a
// count k of split lengths, the next k bytes the lengths of the first k pieces (0 is an empty
// push), and the rest, the text, is cut into those pieces with what remains as the last one.
//
// Checked property: the parsers are streaming-safe — feeding the text in the fuzzer's pieces
// gives exactly the content, reasoning and tool calls that feeding it in one piece does.
#include <algorithm>
#include <cstdio>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "larder/runtime/harmony.h"
#include "larder/runtime/reasoning.h"
#include "larder/runtime/tool_calls.h"

using namespace larder;
using runtime::ToolCallStyle;

namespace {

struct Result {
  std::string content, reasoning;
  std::vector<std::pair<std::string, nlohmann::ordered_json>> calls;  // name, arguments
  void add_calls(std::vector<runtime::ToolCall> cs) {
    for (runtime::ToolCall& c : cs) calls.emplace_back(std::move(c.name), std::move(c.arguments));
  }
};

struct Pipeline {
  bool harmony = false, split_reasoning = false, start_inside = false;
  ToolCallStyle style = ToolCallStyle::kNone;
};

const nlohmann::ordered_json& tools() {
  static const nlohmann::ordered_json t = nlohmann::ordered_json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
      "city": {"type": "string"}, "days": {"type": "integer"}, "unit": {"enum": ["c", "f", 1, true]},
      "mode": {"const": "fast"}, "opts": {"type": "object"}}}}},
    {"name": "run_code", "parameters": {"type": "object", "properties": {"code": {"type": "string"}}}}
  ])");
  return t;
}

// Feeds `pieces` in order and flushes, as ResponseWriter::process does with final on the last.
Result run(const Pipeline& p, const std::vector<std::string_view>& pieces) {
  Result r;
  if (p.harmony) {
    runtime::HarmonyParser h;
    for (size_t i = 0; i <= pieces.size(); ++i) {
      runtime::HarmonyParser::Out o = i < pieces.size() ? h.push(pieces[i]) : h.flush();
      r.content += o.content;
      r.reasoning += o.reasoning;
      r.add_calls(std::move(o.calls));
    }
    return r;
  }
  runtime::ReasoningSplitter splitter(p.start_inside);
  runtime::ToolCallParser tp(p.style, p.style == ToolCallStyle::kTaggedXml ? tools() : nlohmann::ordered_json());
  for (size_t i = 0; i <= pieces.size(); ++i) {
    const bool final = i == pieces.size();
    std::string content;
    if (p.split_reasoning) {
      runtime::ReasoningSplitter::Out o = final ? splitter.flush() : splitter.push(pieces[i]);
      content = std::move(o.content);
      r.reasoning += o.reasoning;
    } else if (!final) {
      content = std::string(pieces[i]);
    }
    r.content += tp.push(content);
    if (final) r.content += tp.flush();
    r.add_calls(tp.take_calls());
  }
  return r;
}

void report(const char* what, const std::string& whole, const std::string& split) {
  std::fprintf(stderr, "fuzz_output: %s differs when the text is split:\n  whole: %s\n  split: %s\n", what,
               whole.c_str(), split.c_str());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  Pipeline p;
  p.harmony = data[0] & 1;
  p.split_reasoning = data[0] & 2;
  p.start_inside = data[0] & 4;
  p.style = static_cast<ToolCallStyle>((data[0] >> 3) & 3);
  size_t k = data[1];
  size_t at = 2;
  if (k > size - at) k = size - at;
  const uint8_t* lengths = data + at;
  at += k;
  const std::string_view text(reinterpret_cast<const char*>(data + at), size - at);
  std::vector<std::string_view> pieces;
  size_t pos = 0;
  for (size_t i = 0; i < k; ++i) {
    const size_t n = std::min<size_t>(lengths[i], text.size() - pos);
    pieces.push_back(text.substr(pos, n));
    pos += n;
  }
  pieces.push_back(text.substr(pos));

  const Result whole = run(p, {text});
  const Result split = run(p, pieces);
  if (split.content != whole.content) {
    report("content", whole.content, split.content);
    __builtin_trap();
  }
  if (split.reasoning != whole.reasoning) {
    report("reasoning", whole.reasoning, split.reasoning);
    __builtin_trap();
  }
  if (split.calls != whole.calls) {
    std::string w, s;
    // Arguments may hold invalid UTF-8 (a body that is not JSON stays a string).
    constexpr auto kReplace = nlohmann::ordered_json::error_handler_t::replace;
    for (const auto& [name, args] : whole.calls) w += name + " " + args.dump(-1, ' ', false, kReplace) + " | ";
    for (const auto& [name, args] : split.calls) s += name + " " + args.dump(-1, ' ', false, kReplace) + " | ";
    report("tool calls", w, s);
    __builtin_trap();
  }
  return 0;
}
