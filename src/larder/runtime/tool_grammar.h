// tool_grammar.h — the structural tag (runtime/grammar.h, xgrammar's format) that constrains tool
// calls in a model family's own call format (server-api.md §4.5, §5.3):
//
//   * tagged families (ToolCallStyle): one tag per function — the call's fixed opening with its
//     name, the arguments constrained to the function's `parameters` schema (JSON, or xgrammar's
//     qwen_xml style for `<function=…><parameter=…>` bodies), the closing. Forced: the answer is
//     calls; auto: free text until `<tool_call>` opens one.
//   * a prompt that already opened `<think>` (Qwen3.5 with thinking on): a forced call comes after
//     the reasoning, which is free text up to `</think>` (bounded only by the request's max_tokens).
//   * harmony (gpt-oss, runtime/harmony.h): messages whose headers are special tokens, required by
//     id. Forced: any number of analysis messages, then one call message
//       <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{args}
//     (or the recipient first: ` to=functions.NAME<|channel|>commentary json<|message|>`, as the
//     template renders past calls), whose end — <|call|> — is an EOS id. Auto: analysis, final
//     and commentary messages are free (any_tokens, the header markers excluded by id), and a
//     message addressed to=functions.NAME has arguments valid against NAME's schema; only a known
//     function may be addressed. The model's GrammarEngine must name the markers as control
//     tokens (GrammarTokens::control; loaded_model.cpp does for a model that speaks harmony).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "larder/runtime/tool_calls.h"
#include "larder/tokenizer/tokenizer.h"

namespace larder::runtime {

// Harmony's header tokens (<|call|> and <|return|> are EOS ids: a call ends where the grammar may).
struct HarmonyTokens {
  int32_t start = -1, end = -1, channel = -1, message = -1;
  int32_t constrain = -1;  // optional: without it a call's content type is ` json`
};
// The tokenizer's harmony header tokens; nullopt when it lacks one of the required four.
std::optional<HarmonyTokens> harmony_tokens(const tokenizer::Tokenizer& tk);

struct ToolFunction {
  std::string name;
  nlohmann::ordered_json parameters;  // a JSON schema (checked by the caller)
};

struct ToolGrammarSpec {
  ToolCallStyle style = ToolCallStyle::kTagged;  // ignored with harmony
  std::optional<HarmonyTokens> harmony;          // set: the model speaks harmony
  std::vector<ToolFunction> functions;           // the callable ones (a named choice: just it)
  bool forced = false;                           // the answer must be a call
  bool parallel = true;                          // forced tagged calls: more than one allowed
  bool think_open = false;                       // the prompt ends inside <think>
};

// The structural tag's JSON text; "" when nothing is constrained (auto on a bare-JSON family,
// which has no trigger; no functions).
std::string tool_call_structural_tag(const ToolGrammarSpec& spec);

}  // namespace larder::runtime
