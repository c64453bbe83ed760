// What the response-writer tests share: a served model without weights (the writers need no
// model or tokenizer unless logprobs are asked for) and the engine events of one request.
#pragma once

#include <string>
#include <vector>

#include "larder/server/response_writer.h"

namespace larder::server::writer_fixture {

struct Fixture {
  runtime::LoadedModel lm;
  ServedModel sm;
  ParsedRequest pr;
  Fixture() {
    sm.m = &lm;
    sm.id = "test-model";
    sm.fingerprint = "larder-test";
    pr.response_id = "chatcmpl-test";
    pr.created = 1;
  }
};

// admitted (10 prompt tokens, 4 of them cached) → one text event per piece → done with
// `finish`, 7 completion tokens and timings (an error message when finish is kError).
inline std::vector<Event> events(const std::vector<std::string>& pieces, Finish finish = Finish::kEos) {
  std::vector<Event> ev;
  Event a;
  a.admitted = true;
  a.outcome.prompt_tokens = 10;
  a.outcome.cached_tokens = 4;
  ev.push_back(a);
  for (const auto& p : pieces) {
    Event e;
    e.text = p;
    ev.push_back(e);
  }
  Event d;
  d.done = true;
  d.outcome.finish = finish;
  d.outcome.prompt_tokens = 10;
  d.outcome.cached_tokens = 4;
  d.outcome.completion_tokens = 7;
  d.outcome.prefill_ms = 2.5;
  d.outcome.decode_ms = 10;
  if (finish == Finish::kError) d.outcome.error = "forward failed";
  ev.push_back(d);
  return ev;
}

}  // namespace larder::server::writer_fixture
