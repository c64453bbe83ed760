#include "larder/runtime/tool_grammar.h"

namespace larder::runtime {

using nlohmann::ordered_json;

namespace {

ordered_json tok(int32_t id) { return {{"type", "token"}, {"token", id}}; }
ordered_json str(const std::string& s) { return {{"type", "const_string"}, {"value", s}}; }
ordered_json seq(std::initializer_list<ordered_json> elements) {
  ordered_json a = ordered_json::array();
  for (const ordered_json& e : elements) a.push_back(e);
  return {{"type", "sequence"}, {"elements", std::move(a)}};
}
ordered_json any_of(ordered_json elements) {
  return elements.size() == 1 ? elements[0] : ordered_json{{"type", "or"}, {"elements", std::move(elements)}};
}
ordered_json star(ordered_json content) { return {{"type", "star"}, {"content", std::move(content)}}; }

// At most one whitespace character between JSON tokens: structural tags default to free
// whitespace, and a small model then fills its budget with newlines inside the arguments.
ordered_json json_args(const ordered_json& params) {
  return {{"type", "json_schema"}, {"json_schema", params}, {"max_whitespace_cnt", 1}};
}

// One harmony call message, from just after `<|start|>assistant` to its arguments' end.
ordered_json harmony_call(const HarmonyTokens& h, const ToolFunction& f) {
  // The content type: `<|constrain|>json` as gpt-oss writes it (with or without the space
  // before), or ` json` as the template renders past calls.
  ordered_json ctype = ordered_json::array();
  if (h.constrain >= 0) {
    ctype.push_back(seq({str(" "), tok(h.constrain), str("json")}));
    ctype.push_back(seq({tok(h.constrain), str("json")}));
  }
  ctype.push_back(str(" json"));
  const std::string to = "to=functions." + f.name;
  return any_of({seq({tok(h.channel), str("commentary " + to), any_of(ctype), tok(h.message), json_args(f.parameters)}),
                 seq({str(" " + to), tok(h.channel), str("commentary"), any_of(ctype), tok(h.message),
                      json_args(f.parameters)})});
}

ordered_json harmony_format(const ToolGrammarSpec& s) {
  const HarmonyTokens& h = *s.harmony;
  ordered_json calls = ordered_json::array();
  for (const ToolFunction& f : s.functions) calls.push_back(harmony_call(h, f));
  // A free body runs to the next header token; the EOS ids (<|return|>, <|call|>) end it where
  // the grammar may end.
  ordered_json headers = ordered_json::array({h.start, h.end, h.channel, h.message});
  if (h.constrain >= 0) headers.push_back(h.constrain);
  const ordered_json body = {{"type", "any_tokens"}, {"exclude_tokens", headers}};
  const ordered_json next = seq({tok(h.end), tok(h.start), str("assistant")});
  auto free_message = [&](std::initializer_list<const char*> channels) {
    ordered_json names = ordered_json::array();
    for (const char* c : channels) names.push_back(str(c));
    return seq({tok(h.channel), any_of(names), tok(h.message), body});
  };
  if (s.forced) {
    // Reasoning first if the model wants it, then exactly one call (<|call|> ends the turn).
    return seq({star(seq({free_message({"analysis"}), next})), any_of(calls)});
  }
  // Any run of messages; a call, which <|call|> ends, can only be the last.
  ordered_json last = calls;
  last.push_back(free_message({"analysis", "final", "commentary"}));
  return seq({star(seq({free_message({"analysis", "final", "commentary"}), next})), any_of(last)});
}

}  // namespace

std::optional<HarmonyTokens> harmony_tokens(const tokenizer::Tokenizer& tk) {
  HarmonyTokens h;
  for (auto [name, slot] : {std::pair{"<|start|>", &h.start}, {"<|end|>", &h.end}, {"<|channel|>", &h.channel},
                            {"<|message|>", &h.message}, {"<|constrain|>", &h.constrain}}) {
    if (auto id = tk.token_to_id(name)) *slot = *id;
  }
  if (h.start < 0 || h.end < 0 || h.channel < 0 || h.message < 0) return std::nullopt;
  return h;
}

std::string tool_call_structural_tag(const ToolGrammarSpec& s) {
  if (s.functions.empty()) return {};
  ordered_json format;
  if (s.harmony) {
    format = harmony_format(s);
  } else {
    if (!s.forced && s.style == ToolCallStyle::kBareJson) return {};  // Llama JSON calls have no trigger
    ordered_json tags = ordered_json::array();
    for (const ToolFunction& f : s.functions) {
      std::string begin, end;
      ordered_json content = json_args(f.parameters);
      if (s.style == ToolCallStyle::kTaggedXml) {
        // xgrammar's qwen_xml style: the schema's properties as <parameter=NAME>\nvalue\n</parameter>.
        begin = "<tool_call>\n<function=" + f.name + ">\n";
        end = "</function>\n</tool_call>";
        content["style"] = "qwen_xml";
      } else if (s.style == ToolCallStyle::kTagged) {
        begin = "<tool_call>\n{\"name\": " + ordered_json(f.name).dump() + ", \"arguments\": ";
        end = "}\n</tool_call>";
      } else {
        begin = "{\"name\": " + ordered_json(f.name).dump() + ", \"parameters\": ";
        end = "}";
      }
      tags.push_back({{"type", "tag"}, {"begin", begin}, {"content", content}, {"end", end}});
    }
    if (s.forced) {
      // The whole answer is calls: a bare-JSON family writes one object, a tagged one may write
      // several (one per line) when parallel calls are allowed.
      const bool one = !s.parallel || s.style == ToolCallStyle::kBareJson;
      format = {{"type", "tags_with_separator"}, {"tags", tags}, {"separator", "\n"}, {"at_least_one", true},
                {"stop_after_first", one}};
      // The prompt opened <think>: the reasoning closes first (free text), then the calls, set
      // apart as the family's templates write an answer after `</think>`.
      if (s.think_open) {
        ordered_json think = {{"type", "tag"}, {"begin", ""}, {"content", {{"type", "any_text"}}}, {"end", "</think>"}};
        format = seq({think, str("\n\n"), format});
      }
    } else {
      format = {{"type", "triggered_tags"}, {"triggers", ordered_json::array({"<tool_call>"})}, {"tags", tags}, {"at_least_one", false},
                {"stop_after_first", !s.parallel}};
    }
  }
  return ordered_json{{"type", "structural_tag"}, {"format", format}}.dump();
}

}  // namespace larder::runtime
