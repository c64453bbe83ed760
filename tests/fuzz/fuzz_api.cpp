// fuzz_api — the JSON body handling of every generation route, called the way http_server.cpp
// calls it: the body's nesting depth is checked (kMaxJsonDepth), the body parsed, then handed to
// the route's request parser — parse_chat (/v1/chat/completions), parse_completion
// (/v1/completions and llama-server's /completion), parse_messages (/v1/messages),
// parse_ollama_chat / parse_ollama_generate (/api/chat, /api/generate, after ollama_load_only),
// render_chat_prompt (/apply-template), parse_kv_lookup (/v1/kv/lookup). Those parse every field, tokenize the prompt, render the
// chat template, and compile response_format / tools / grammar constraints. ApiError and other
// std::exceptions are what the server turns into 4xx answers; anything else is a finding.
// Input byte 0 picks the route, the rest is the body. Model: stories260K (shared/models).
#include <cstdio>

#include "fuzz_util.h"
#include "larder/runtime/grammar.h"
#include "larder/runtime/loaded_model.h"
#include "larder/server/api.h"
#include "larder/server/api_ollama.h"
#include "larder/server/http_server.h"
#include "larder/server/transport.h"

using namespace larder;
using server::ordered_json;

namespace {

struct Setup {
  std::unique_ptr<runtime::LoadedModel> model;
  server::ServedModel sm;
};

Setup* load() {
  fuzz::quiet();
  auto m = runtime::load_model(fuzz::shared_dir() + "/models/stories260K/stories260K.gguf");
  if (!m.is_ok()) {
    std::fprintf(stderr, "fuzz_api: %s\n", m.status().to_string().c_str());
    std::abort();
  }
  auto* s = new Setup;
  s->model = std::move(*m);
  runtime::LoadedModel& lm = *s->model;
  // A small compiled-grammar cache: the fuzzer compiles many distinct schemas.
  lm.grammar = std::make_shared<runtime::GrammarEngine>(*lm.tokenizer, lm.model->info().vocab, lm.defaults.eos_ids,
                                                        8ll << 20);
  s->sm.m = &lm;
  s->sm.id = "stories260K";
  s->sm.fingerprint = "larder-fuzz";
  s->sm.ns_base = "fuzz";
  s->sm.ctx = 256;
  s->sm.max_token_bytes = server::longest_token_bytes(lm);
  s->sm.defaults.max_tokens = 16;
  return s;
}

}  // namespace

Setup* s = nullptr;

// Loading runs before libFuzzer's per-input timer starts.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  s = load();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  if (server::json_nesting_depth(text, server::kMaxJsonDepth) > server::kMaxJsonDepth) return 0;
  const ordered_json body = ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) return 0;
  try {
    switch (data[0] % 7) {
      case 0: (void)server::parse_chat(s->sm, body); break;
      case 1: (void)server::parse_completion(s->sm, body); break;
      case 2: (void)server::parse_messages(s->sm, body); break;
      case 3:
        if (!server::ollama_load_only(s->sm, body, server::OllamaKind::kChat)) (void)server::parse_ollama_chat(s->sm, body);
        break;
      case 4:
        if (!server::ollama_load_only(s->sm, body, server::OllamaKind::kGenerate))
          (void)server::parse_ollama_generate(s->sm, body);
        break;
      case 6: (void)server::parse_kv_lookup(s->sm, body); break;
      default:
        // POST /apply-template: the route checks messages itself and catches only ApiError
        // (http_server.cpp), so any other exception here would leave the handler.
        if (!body.is_object() || !body.contains("messages") || !body["messages"].is_array()) return 0;
        try {
          (void)server::render_chat_prompt(s->sm, body);
        } catch (const server::ApiError&) {
        }
        return 0;
    }
  } catch (const server::ApiError&) {
  } catch (const std::exception&) {  // the generation routes answer these with a 400
  }
  return 0;
}
