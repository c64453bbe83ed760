// api_completions.cpp — OpenAI text completions request parser (a prompt string, token ids,
// or a list of prompts; n; n_predict). Also the request side of llama-server POST /completion.
#include "larder/server/api_constraints.h"
#include "larder/server/api_fields.h"
#include "larder/server/response_writer.h"

namespace larder::server {

using namespace fields;

ParsedRequest parse_completion(const ServedModel& sm, const ordered_json& b) {
  ParsedRequest pr = start(b, "cmpl-", "/v1/completions");
  refuse_unsupported(b);
  const ordered_json* prompt = get(b, "prompt");
  if (!prompt) bad("prompt is required", "prompt");
  const int64_t V = sm.m->model->info().vocab;
  if (prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_string()) prompt = &(*prompt)[0];
  // A list of prompts: strings, or lists of token ids. The first becomes pr.gen.
  std::vector<std::vector<int32_t>> more;
  if (prompt->is_array() && prompt->size() > 1 && ((*prompt)[0].is_string() || (*prompt)[0].is_array())) {
    if (prompt->size() > 64) bad("at most 64 prompts per request", "prompt");
    std::vector<std::vector<int32_t>> all;
    for (const auto& p : *prompt) {
      std::vector<int32_t> ids;
      if (p.is_string()) {
        check_prompt_bytes(sm, p.get_ref<const std::string&>().size(), Surface::kCompletions, "prompt");
        ids = sm.m->tokenizer->encode(p.get<std::string>(), /*add_special=*/true);
      } else if (p.is_array()) {
        for (const auto& t : p) {
          if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= V)
            bad(strfmt("prompt token ids must be integers in [0, %lld)", (long long)V), "prompt");
          ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
        }
      } else {
        bad("a list of prompts must hold strings or arrays of token ids", "prompt");
      }
      all.push_back(std::move(ids));
    }
    pr.gen.prompt = all[0];
    more.assign(all.begin() + 1, all.end());
  } else if (prompt->is_string()) {
    check_prompt_bytes(sm, prompt->get_ref<const std::string&>().size(), Surface::kCompletions, "prompt");
    pr.gen.prompt = sm.m->tokenizer->encode(prompt->get<std::string>(), /*add_special=*/true);
  } else if (prompt->is_array() && !prompt->empty() && (*prompt)[0].is_number()) {
    for (const auto& t : *prompt) {
      if (!t.is_number_integer()) bad("prompt token ids must be integers", "prompt");
      const int64_t id = t.get<int64_t>();
      if (id < 0 || id >= V) bad(strfmt("prompt token id %lld is outside the vocabulary [0, %lld)", (long long)id, (long long)V), "prompt");
      pr.gen.prompt.push_back(static_cast<int32_t>(id));
    }
  } else if (prompt->is_array()) {
    bad("prompt must be a string, an array of token ids, or a list of those", "prompt");
  } else {
    bad("prompt must be a string or an array of token ids", "prompt");
  }
  constraints::apply_response_format(sm, b, pr);  // the prompt is the client's: no instruction added
  constraints::apply_native_fields(sm, b, pr);
  pr.gen.sampling = sampling(sm, b, true);
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
  pr.gen.ns = namespace_for(sm, b);
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
