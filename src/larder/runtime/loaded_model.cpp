#include "larder/runtime/loaded_model.h"

#include <algorithm>
#include <chrono>

#include "larder/core/log.h"
#include "larder/runtime/tool_grammar.h"

namespace larder::runtime {

using nlohmann::ordered_json;

namespace {

void add_ids(const ordered_json& j, std::vector<int32_t>* out) {
  if (j.is_number_integer()) out->push_back(j.get<int32_t>());
  if (j.is_array()) {
    for (const auto& e : j) {
      if (e.is_number_integer()) out->push_back(e.get<int32_t>());
    }
  }
}

void add_unique(std::vector<int32_t>* v, int32_t id) {
  if (std::find(v->begin(), v->end(), id) == v->end()) v->push_back(id);
}

// OpenAI's harmony format (gpt-oss): its message markers are tokens of the vocabulary.
bool has_harmony_markers(const tokenizer::Tokenizer& tk) {
  return tk.token_to_id("<|channel|>") && tk.token_to_id("<|message|>") && tk.token_to_id("<|end|>");
}

GenerationDefaults make_defaults(const LoadedModel& m) {
  GenerationDefaults d;
  const ordered_json& gc = m.files.generation_config;
  if (gc.is_object()) {
    // HF semantics: sampling parameters apply only when do_sample is true; otherwise greedy.
    if (gc.value("do_sample", false)) {
      if (gc.contains("temperature") && gc["temperature"].is_number()) d.sampling.temperature = gc["temperature"].get<float>();
      else d.sampling.temperature = 1.0f;
      if (gc.contains("top_p") && gc["top_p"].is_number()) d.sampling.top_p = gc["top_p"].get<float>();
      if (gc.contains("top_k") && gc["top_k"].is_number_integer()) d.sampling.top_k = gc["top_k"].get<int>();
      if (gc.contains("min_p") && gc["min_p"].is_number()) d.sampling.min_p = gc["min_p"].get<float>();
    }
    if (gc.contains("repetition_penalty") && gc["repetition_penalty"].is_number())
      d.sampling.repetition_penalty = gc["repetition_penalty"].get<float>();
    if (gc.contains("eos_token_id")) add_ids(gc["eos_token_id"], &d.eos_ids);
  }
  if (m.files.config.is_object() && m.files.config.contains("eos_token_id")) {
    std::vector<int32_t> ids;
    add_ids(m.files.config["eos_token_id"], &ids);
    for (int32_t id : ids) add_unique(&d.eos_ids, id);
  }
  if (m.model) {
    for (int32_t id : m.model->info().eos_ids) add_unique(&d.eos_ids, id);
  }
  if (m.tokenizer) {
    for (int32_t id : m.tokenizer->eos_ids()) add_unique(&d.eos_ids, id);
    // Harmony (gpt-oss): a turn ends at <|return|> (the answer) or <|call|> (a tool call). HF
    // checkpoints list both in generation_config; a GGUF names only one EOS (llama.cpp adds the
    // other as end-of-generation the same way).
    if (has_harmony_markers(*m.tokenizer)) {
      for (const char* t : {"<|return|>", "<|call|>"})
        if (auto id = m.tokenizer->token_to_id(t)) add_unique(&d.eos_ids, *id);
    }
  }
  return d;
}

// A tokenizer may hold more ids than the model embeds: Gemma 3 / 4 text checkpoints say
// vocab_size 262144 beside a tokenizer whose id 262144 is <image_soft_token> (mlx-lm and
// transformers load them). Such ids are harmless when they are added tokens: only their own
// text encodes to them, and check_prompt refuses a prompt that holds one; sampling never yields
// one (the logits row has the model's ids only). An ordinary vocabulary entry past the embedding
// is another matter — plain text could encode to it — so that pairing stays refused. So is a
// tokenizer whose own BOS/EOS wrapping (add_special) is past it: every prompt would be refused.
Status check_tokenizer_fits(const LoadedModel& m) {
  const tokenizer::Tokenizer& tok = *m.tokenizer;
  const int64_t vocab = m.model->info().vocab;
  const int32_t n = tok.vocab_size();
  if (n <= vocab) return Status::ok();
  int32_t first_extra = -1;
  for (int32_t id = static_cast<int32_t>(vocab); id < n; ++id) {
    if (tok.is_added(id)) {
      if (first_extra < 0) first_extra = id;
      continue;
    }
    const std::string piece = tok.id_to_token(id);
    if (piece.empty()) continue;  // an unused id between added tokens: nothing encodes to it
    return incompatible(strfmt("[model] %s: the tokenizer has %d tokens but the model's vocabulary is %lld, and id %d "
                               "('%s') past it is an ordinary vocabulary entry, not an added special token, so text "
                               "could encode to an id the model cannot embed (tokenizer and weights from different "
                               "models?)",
                               m.files.path.c_str(), n, static_cast<long long>(vocab), id, piece.c_str()));
  }
  for (int32_t id : tok.encode("", /*add_special=*/true)) {
    if (id >= vocab)
      return incompatible(strfmt("[model] %s: the tokenizer adds token %d ('%s') to every prompt, but the model's "
                                 "vocabulary is %lld",
                                 m.files.path.c_str(), id, tok.id_to_token(id).c_str(), static_cast<long long>(vocab)));
  }
  if (first_extra >= 0) {
    LARDER_LOG_INFO("[model] %s: tokenizer ids %lld..%d (e.g. '%s') are added tokens past the model's vocabulary of "
                    "%lld: a prompt that contains one is refused",
                    m.files.path.c_str(), static_cast<long long>(vocab), n - 1, tok.id_to_token(first_extra).c_str(),
                    static_cast<long long>(vocab));
  }
  return Status::ok();
}

}  // namespace

Status check_prompt(const LoadedModel& m, std::span<const int32_t> prompt) {
  const int64_t vocab = m.model ? m.model->info().vocab : m.tokenizer->vocab_size();
  for (size_t i = 0; i < prompt.size(); ++i) {
    const int32_t id = prompt[i];
    if (id >= 0 && id < vocab) continue;
    const std::string piece = m.tokenizer->id_to_token(id);
    return invalid_argument(strfmt("[prompt] token %d%s at position %zu is not in the model's vocabulary of %lld ids%s",
                                   id, piece.empty() ? "" : (" ('" + piece + "')").c_str(), i,
                                   static_cast<long long>(vocab),
                                   piece.empty() ? ""
                                                 : ": the tokenizer has it, but this model cannot embed it (e.g. an "
                                                   "image placeholder of a multimodal tokenizer); remove it from the "
                                                   "prompt"));
  }
  return Status::ok();
}

Result<std::unique_ptr<LoadedModel>> load_model(const std::string& path, const LoadOptions& opts) {
  auto t0 = std::chrono::steady_clock::now();
  auto lm = std::make_unique<LoadedModel>();
  formats::OpenOptions fo;
  fo.weights = opts.weights;
  fo.map_mode = opts.map_mode;
  LARDER_ASSIGN_OR_RETURN(lm->files, formats::open_model_files(path, fo));
  const formats::ModelFiles& f = lm->files;

  if (f.gguf) {
    LARDER_ASSIGN_OR_RETURN(lm->tokenizer, tokenizer::Tokenizer::from_gguf(*f.gguf));
  } else if (!f.tokenizer_json_path.empty()) {
    LARDER_ASSIGN_OR_RETURN(lm->tokenizer, tokenizer::Tokenizer::from_hf_dir(f.path));
  } else {
    return not_found(strfmt("[model] %s: no tokenizer.json (and not a GGUF file)", f.path.c_str()));
  }
  LARDER_ASSIGN_OR_RETURN(lm->template_choice, choose_chat_template(f, opts.chat_template));
  {
    const ChosenTemplate& c = lm->template_choice;
    LARDER_ASSIGN_OR_RETURN(auto t, chat_template::Template::parse(c.source, f.path + " chat template, " + c.describe()));
    lm->chat_template = std::move(t);
  }
  if (opts.weights) {
    LARDER_ASSIGN_OR_RETURN(lm->model, models::Model::load(f));
    if (Status st = lm->model->set_kv_dtype(opts.kv_dtype); !st.is_ok())
      return Status(st.code(), strfmt("%s (%s)", st.message().c_str(), f.path.c_str()));
    LARDER_RETURN_IF_ERROR(check_tokenizer_fits(*lm));
  }
  lm->defaults = make_defaults(*lm);
  // Constrained decoding: cheap here (the vocabulary is exported on the first constrained request).
  // A harmony model's header markers are required by id in its tool-call grammars.
  if (lm->model) {
    GrammarTokens gt{lm->defaults.eos_ids, {}};
    if (auto h = speaks_harmony(*lm) ? harmony_tokens(*lm->tokenizer) : std::nullopt)
      for (int32_t id : {h->start, h->end, h->channel, h->message, h->constrain})
        if (id >= 0) gt.control.push_back(id);
    lm->grammar = std::make_shared<GrammarEngine>(*lm->tokenizer, lm->model->info().vocab, std::move(gt));
  }
  lm->load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return lm;
}

Result<std::vector<int32_t>> encode_chat(const LoadedModel& m, const std::vector<ChatMessage>& messages,
                                         bool add_generation_prompt, std::string* rendered) {
  ordered_json msgs = ordered_json::array();
  for (const auto& msg : messages) {
    msgs.push_back({{"role", msg.role}, {"content", msg.content}});
    if (!msg.thinking.empty()) msgs.back()["thinking"] = msg.thinking;
  }
  ChatEncodeOptions o;
  o.add_generation_prompt = add_generation_prompt;
  return encode_chat_json(m, msgs, o, rendered);
}

bool speaks_harmony(const LoadedModel& m) {
  return m.tokenizer && m.template_choice.source.find("<|channel|>") != std::string::npos &&
         has_harmony_markers(*m.tokenizer);
}

void announce_chat_template(const LoadedModel& m) {
  const ChosenTemplate& c = m.template_choice;
  if (c.origin == TemplateOrigin::kFallback) {
    LARDER_LOG_WARN("[chat] %s has no chat template: chats use the built-in ChatML template as a fallback "
                    "(choose one with --chat-template NAME|FILE|TEXT or --chat-template-file FILE)",
                    m.files.path.c_str());
  } else if (c.origin != TemplateOrigin::kModel) {
    LARDER_LOG_INFO("[chat] chat template: %s", c.describe().c_str());
  }
}

Result<std::vector<int32_t>> encode_chat_json(const LoadedModel& m, const ordered_json& messages,
                                              const ChatEncodeOptions& opts, std::string* rendered) {
  if (!m.chat_template) {
    return invalid_argument(strfmt("[chat] %s has no chat template (tokenizer_config.json chat_template, "
                                   "chat_template.jinja or GGUF tokenizer.chat_template)",
                                   m.files.path.c_str()));
  }
  chat_template::ChatRenderOptions o;
  o.add_generation_prompt = opts.add_generation_prompt;
  o.tools = opts.tools;
  o.extra = opts.extra;
  o.bos_token = m.tokenizer->bos_token();
  o.eos_token = m.tokenizer->eos_token();
  const ordered_json* to_render = &messages;
  ordered_json head;
  std::string prefill;
  if (opts.continue_final_message) {
    // Rendering the final message and cutting after its text (transformers' way) depends on the
    // template echoing the text verbatim; templates trim and escape. llama-server's way does not:
    // the turns before it, the generation prompt, then the text itself.
    if (!messages.is_array() || messages.empty() || !messages.back().is_object() ||
        messages.back().value("role", "") != "assistant" || !messages.back().contains("content") ||
        !messages.back()["content"].is_string()) {
      return invalid_argument("[chat] continuing the final message needs a last assistant message with text content");
    }
    prefill = messages.back()["content"].get<std::string>();
    head = messages;
    head.erase(head.size() - 1);
    to_render = &head;
    o.add_generation_prompt = true;
  }
  LARDER_ASSIGN_OR_RETURN(std::string text, chat_template::render_chat(*m.chat_template, *to_render, o));
  text += prefill;
  // As HF apply_chat_template(tokenize=True) and mlx-lm do: the template writes every special
  // token it wants (BOS included), so encoding adds none — which also rules out a double BOS.
  std::vector<int32_t> ids = m.tokenizer->encode(text, /*add_special=*/false);
  // Templates larder supplies write no BOS; put it in front as llama-server does when the
  // tokenizer adds one (chat_template_choice.h).
  if (m.template_choice.prepend_bos) {
    const std::vector<int32_t> with = m.tokenizer->encode("", /*add_special=*/true);
    const auto bos = m.tokenizer->bos_id();
    if (bos && !with.empty() && with.front() == *bos && (ids.empty() || ids.front() != *bos)) ids.insert(ids.begin(), *bos);
  }
  if (rendered) *rendered = std::move(text);
  return ids;
}

std::vector<int64_t> chat_message_ends(const LoadedModel& m, const ordered_json& messages,
                                       const ChatEncodeOptions& opts, const std::string& rendered,
                                       std::span<const int32_t> ids, size_t max_ends) {
  std::vector<int64_t> ends;
  if (!m.chat_template || !messages.is_array() || messages.empty() || ids.empty() || max_ends == 0) return ends;
  // Byte offset in `rendered` at which each token of `ids` ends. The ids' bytes end with the
  // rendered text; what comes before it (a BOS larder put in front) is skipped.
  std::string cat;
  std::vector<size_t> token_end(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    cat += m.tokenizer->token_bytes(ids[i]);
    token_end[i] = cat.size();
  }
  if (cat.size() < rendered.size() || cat.compare(cat.size() - rendered.size(), rendered.size(), rendered) != 0)
    return ends;  // the pieces do not spell the rendering (a normalizing tokenizer): no boundaries
  const size_t lead = cat.size() - rendered.size();
  chat_template::ChatRenderOptions o;
  o.add_generation_prompt = false;
  o.tools = opts.tools;
  o.extra = opts.extra;
  o.bos_token = m.tokenizer->bos_token();
  o.eos_token = m.tokenizer->eos_token();
  // Newest first. The last message ends before the generation prompt (the longest prefix the next
  // turn shares when the template renders the answer differently from that prompt); with
  // continue_final_message it is the answer's start, whose rendering as a whole message is no
  // prefix of the prompt.
  const size_t n = messages.size();
  for (size_t k = n; k >= 1 && ends.size() < max_ends; --k) {
    ordered_json head = ordered_json::array();
    for (size_t i = 0; i < k; ++i) head.push_back(messages[i]);
    auto text = chat_template::render_chat(*m.chat_template, head, o);
    if (!text.is_ok() || text->empty() || text->size() >= rendered.size() ||
        rendered.compare(0, text->size(), *text) != 0)
      continue;
    const size_t at = lead + text->size();
    auto it = std::lower_bound(token_end.begin(), token_end.end(), at);
    if (it != token_end.end() && *it == at) ends.push_back(static_cast<int64_t>(it - token_end.begin()) + 1);
  }
  std::reverse(ends.begin(), ends.end());
  return ends;
}

}  // namespace larder::runtime
