// api_completions.cpp — OpenAI text completions request parser (a prompt string, token ids,
// ids mixed with text, or a list of prompts; n; n_predict). Also the request side of
// llama-server's POST /completion (api_native.cpp adds its own fields).
#include <algorithm>

#include "larder/server/api_constraints.h"
#include "larder/server/api_fields.h"
#include "larder/server/response_writer.h"

namespace larder::server {

using namespace fields;

namespace {

// One prompt, in the forms llama-server takes (its tokenize_input_prompts): a string; token ids;
// a mix ([12, " text", 34]: each string tokenized where it stands, with the tokenizer's BOS only
// when a string comes first); or {"prompt_string": …}.
std::vector<int32_t> one_prompt(const ServedModel& sm, const ordered_json& p) {
  const int64_t V = sm.m->model->info().vocab;
  if (p.is_string()) {
    check_prompt_bytes(sm, p.get_ref<const std::string&>().size(), Surface::kCompletions, "prompt");
    return sm.m->tokenizer->encode(p.get<std::string>(), /*add_special=*/true);
  }
  if (p.is_object()) {
    if (get(p, "multimodal_data")) bad("this model does not accept images (text-only model)", "prompt");
    const ordered_json* text = get(p, "prompt_string");
    if (!text || text->is_object()) bad("a prompt object needs a prompt_string (a string or token ids)", "prompt");
    return one_prompt(sm, *text);
  }
  if (!p.is_array()) bad("prompt must be a string, an array of token ids, or a list of those", "prompt");
  std::vector<int32_t> ids;
  for (size_t i = 0; i < p.size(); ++i) {
    const ordered_json& e = p[i];
    if (e.is_string()) {
      check_prompt_bytes(sm, e.get_ref<const std::string&>().size(), Surface::kCompletions, "prompt");
      const auto t = sm.m->tokenizer->encode(e.get<std::string>(), /*add_special=*/i == 0);
      ids.insert(ids.end(), t.begin(), t.end());
    } else if (e.is_number_integer() && e.get<int64_t>() >= 0 && e.get<int64_t>() < V) {
      ids.push_back(static_cast<int32_t>(e.get<int64_t>()));
    } else if (e.is_number_integer()) {
      bad(strfmt("prompt token id %lld is outside the vocabulary [0, %lld)", (long long)e.get<int64_t>(), (long long)V), "prompt");
    } else {
      bad(strfmt("prompt token ids must be integers in [0, %lld)", (long long)V), "prompt");
    }
  }
  return ids;
}

}  // namespace

ParsedRequest parse_completion(const ServedModel& sm, const ordered_json& b, bool llama_server) {
  ParsedRequest pr = start(b, "cmpl-", "/v1/completions");
  refuse_unsupported(b);
  const ordered_json* prompt = get(b, "prompt");
  if (!prompt) bad("prompt is required", "prompt");
  // An array holding a number is one prompt (token ids, or ids mixed with text); any other array
  // is a list of prompts, one choice (one llama-server result) each. The first becomes pr.gen.
  const bool list = prompt->is_array() && std::none_of(prompt->begin(), prompt->end(), [](const ordered_json& e) {
                      return e.is_number();
                    });
  std::vector<std::vector<int32_t>> prompts;
  if (list) {
    if (prompt->empty()) bad("prompt must not be an empty list", "prompt");
    if (prompt->size() > 64) bad("at most 64 prompts per request", "prompt");
    for (const auto& p : *prompt) prompts.push_back(one_prompt(sm, p));
  } else {
    prompts.push_back(one_prompt(sm, *prompt));
  }
  pr.gen.prompt = std::move(prompts[0]);
  const std::vector<std::vector<int32_t>> more(std::make_move_iterator(prompts.begin() + 1),
                                               std::make_move_iterator(prompts.end()));
  constraints::apply_response_format(sm, b, pr);  // the prompt is the client's: no instruction added
  constraints::apply_native_fields(sm, b, pr);
  pr.gen.sampling = sampling(sm, b, true, llama_server);
  pr.gen.stops = stops(b, "stop");
  if (auto lp = integer(b, "logprobs", 0, 20)) {
    pr.logprobs = true;
    pr.top_logprobs = static_cast<int>(*lp);
    pr.gen.top_logprobs = pr.top_logprobs;
  }
  if (const ordered_json* so = get(b, "stream_options")) {
    if (!so->is_object()) bad("stream_options must be an object", "stream_options");
    pr.include_usage = boolean(*so, "include_usage").value_or(false);
  }
  std::optional<int64_t> max = max_tokens_field(b, "max_tokens");
  if (!max) max = sm.defaults.max_tokens;  // one default for every route (runtime::kDefaultMaxTokens)
  apply_adapters(sm, b, pr.gen);
  fit_context(sm, pr, max, Surface::kCompletions, "prompt");
  add_choices(pr, more, static_cast<int>(integer(b, "n", 1, 64).value_or(1)));
  for (GenRequest& g : pr.more) fit_context(sm, g, max, Surface::kCompletions, "prompt");
  return pr;
}

// ---- response ------------------------------------------------------------------------------

namespace {

// text_completion: text deltas, no role chunk, no tool calls; logprobs in the legacy shape
// (tokens, token_logprobs, top_logprobs, text_offset).
class CompletionsWriter final : public OpenAiWriter {
 public:
  CompletionsWriter(const ServedModel& sm, const ParsedRequest& pr)
      : OpenAiWriter(sm, pr, /*text_pipeline=*/false, "text_completion", "text_completion") {}

  ordered_json body() const override {
    ordered_json choice = {{"index", index_}, {"text", text_},
                           {"logprobs", pr_.logprobs ? logprobs_json(tokens_) : ordered_json()},
                           {"finish_reason", finish_reason()}};
    return body_with(std::move(choice));
  }

 private:
  std::string open_frames() override { return {}; }

  std::string delta_frames(const Pieces& parts, const std::vector<TokenInfo>& tokens) override {
    if (parts.content.empty() && (tokens.empty() || !pr_.logprobs)) return {};
    return sse(chunk({{"text", parts.content}, {"logprobs", pr_.logprobs ? logprobs_json(tokens) : ordered_json()},
                      {"finish_reason", nullptr}}));
  }

  std::string tool_call_frames(size_t) override { return {}; }
  ordered_json final_choice() const override { return {{"text", ""}}; }

  // Token strings are the exact pieces of the text (leading spaces kept, joining back into it);
  // text_offset counts characters from the start of the completion, across stream chunks.
  ordered_json logprobs_json(const std::vector<TokenInfo>& toks) const {
    const tokenizer::Tokenizer& tk = *sm_.m->tokenizer;
    ordered_json tokens = ordered_json::array(), lps = ordered_json::array(), tops = ordered_json::array(),
                 offs = ordered_json::array();
    for (const TokenInfo& t : toks) {
      const std::string p = tk.token_bytes(t.id);
      tokens.push_back(p);
      lps.push_back(t.lp.logprob);
      ordered_json top = ordered_json::object();
      for (const auto& [id, lp] : t.lp.top) top[tk.token_bytes(id)] = lp;
      tops.push_back(top);
      offs.push_back(lp_offset_);
      lp_offset_ += utf8_chars(p);
    }
    return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
  }
};

}  // namespace

std::unique_ptr<ResponseWriter> make_completions_writer(const ServedModel& sm, const ParsedRequest& pr) {
  return std::make_unique<CompletionsWriter>(sm, pr);
}

}  // namespace larder::server
