// api_kv.cpp — POST /v1/kv/lookup's request parser: the prompt of a would-be generation request,
// tokenized exactly as its generation route would (so a router's question about a chat request
// gets the answer for the tokens that request will prefill), without running anything.
#include "larder/server/api_fields.h"

namespace larder::server {

using namespace fields;

KvLookupRequest parse_kv_lookup(const ServedModel& sm, const ordered_json& b) {
  if (!b.is_object()) bad("the request body must be a JSON object");
  served_model(sm, b);
  KvLookupRequest r;
  r.form = one_of(b, {"prompt", "messages", "tokens"});
  if (r.form == "tokens") {
    r.prompt = token_ids(sm, b["tokens"], "tokens");
    GenRequest g;  // the namespace a generation body would get: adapters (lora / model) and cache_salt
    apply_adapters(sm, b, g);
    r.ns = std::move(g.ns);
    return r;
  }
  // A generation body as its route parses it: the same template, tools, BOS handling and
  // namespace. Sampling fields are checked too — a body the route would refuse is refused here.
  ParsedRequest pr;
  if (r.form == "messages") {
    pr = parse_chat(sm, b);
  } else {
    const ordered_json& p = b["prompt"];
    if (p.is_array() && !p.empty() && std::none_of(p.begin(), p.end(), [](const ordered_json& e) { return e.is_number(); }))
      bad("prompt must be one prompt (a string or token ids), not a list of prompts", "prompt");
    pr = parse_completion(sm, b);
  }
  if (!pr.more.empty()) bad("n must be 1: a lookup is about one prompt", "n");
  r.prompt = std::move(pr.gen.prompt);
  r.ns = std::move(pr.gen.ns);
  return r;
}

}  // namespace larder::server
