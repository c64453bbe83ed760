"""Clients written against llama-server, pointed at larder (issue 17, "Drop-in for clients
written against llama-server"): n_predict, the native routes (/completion, /props,
/apply-template, /tokenize with_pieces), the validation llama-server applies, grammar enforced,
and one validator for /v1/messages and /v1/messages/count_tokens."""
import json
import unittest

from server_harness import STORIES, STORIES_PROMPT, Server, ServerTestCase, chat_model, parse_sse


def user(text):
    return [{"role": "user", "content": text}]


class NativeRoutesTest(ServerTestCase):
    def test_n_predict(self):
        r = self.server.post("/v1/completions", {"prompt": STORIES_PROMPT, "n_predict": 3, "temperature": 0})
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json()["usage"]["completion_tokens"], 3, "n_predict is max_tokens")

    def test_native_completion(self):
        ref = self.server.post("/v1/completions", {"prompt": STORIES_PROMPT, "max_tokens": 12, "temperature": 0}).json()
        r = self.server.post("/completion", {"prompt": STORIES_PROMPT, "n_predict": 12, "temperature": 0})
        self.assertEqual(r.status, 200, r)
        j = r.json()
        self.assertEqual(j["content"], ref["choices"][0]["text"])
        self.assertIs(j["stop"], True)
        self.assertEqual(j["tokens_predicted"], 12)
        self.assertEqual(j["stop_type"], "limit")
        self.assertIn("predicted_per_second", j["timings"])
        r = self.server.post("/completion", {"prompt": STORIES_PROMPT, "n_predict": 12, "temperature": 0, "stream": True})
        self.assertEqual(r.status, 200, r)
        events = [json.loads(e.data) for e in parse_sse(r.body) if e.data]
        self.assertNotIn("[DONE]", [e for e in events if isinstance(e, str)])
        self.assertTrue(all(e["stop"] is False for e in events[:-1]))
        self.assertIs(events[-1]["stop"], True)
        self.assertEqual("".join(e["content"] for e in events), ref["choices"][0]["text"])

    def test_logit_bias_llama_server_forms(self):
        # llama-server's /completion takes logit_bias as [id, bias] pairs, false to ban a token,
        # and strings that stand for every token of their encoding (besides OpenAI's dict).
        def ids(extra):
            r = self.server.post("/completion", {"prompt": STORIES_PROMPT, "n_predict": 3, "temperature": 0,
                                                 "stream": True, **extra})
            self.assertEqual(r.status, 200, r)
            return [t for e in parse_sse(r.body) if e.data for t in json.loads(e.data).get("tokens", [])]

        greedy = ids({})
        self.assertEqual(len(greedy), 3, greedy)
        forced = 403 if greedy[0] != 403 else 407
        self.assertEqual(ids({"logit_bias": [[forced, 100]]}), [forced] * 3, "[id, +100] forces the token")
        self.assertEqual(ids({"logit_bias": {str(forced): 100}}), [forced] * 3, "the OpenAI dict still works")
        banned = ids({"logit_bias": [[greedy[0], False]]})
        self.assertNotIn(greedy[0], banned, "[id, false] never produces the token")
        word = " little"
        allowed = self.server.post("/tokenize", {"content": word, "add_special": False}).json()["tokens"]
        self.assertTrue(allowed, allowed)
        got = ids({"logit_bias": [[word, 100]]})
        self.assertTrue(set(got) <= set(allowed), f"[string, +100] forces the tokens of {word!r} {allowed}: got {got}")
        for bad in ([[1, "x"]], [[100000, 1]], [[1]], [1, 2], "x", [[1.5, 1]], {"1": 1000}):
            r = self.server.post("/completion", {"prompt": STORIES_PROMPT, "n_predict": 2, "logit_bias": bad})
            self.assertEqual(r.status, 400, f"logit_bias {bad!r}: {r}")
            self.assertIn("logit_bias", r.json()["error"]["message"] + str(r.json()["error"].get("param")), bad)

    def test_tokenize_with_pieces(self):
        r = self.server.post("/tokenize", {"content": STORIES_PROMPT, "add_special": True, "with_pieces": True})
        self.assertEqual(r.status, 200, r)
        toks = r.json()["tokens"]
        self.assertEqual([t["id"] for t in toks], [1, 403, 407, 261, 378])
        self.assertTrue(all(set(t) == {"id", "piece"} for t in toks), toks)

    def test_completion_logprobs_pieces_join(self):
        r = self.server.post("/v1/completions", {"prompt": STORIES_PROMPT, "max_tokens": 16, "temperature": 0, "logprobs": 2})
        self.assertEqual(r.status, 200, r)
        c = r.json()["choices"][0]
        toks, offs = c["logprobs"]["tokens"], c["logprobs"]["text_offset"]
        self.assertEqual("".join(toks), c["text"], "token strings are the pieces of the text (leading spaces kept)")
        self.assertEqual(offs, [len("".join(toks[:i])) for i in range(len(toks))], "text_offset is cumulative")
        r = self.server.post("/v1/completions", {"prompt": STORIES_PROMPT, "max_tokens": 16, "temperature": 0,
                                                 "logprobs": 1, "stream": True})
        chunks = [json.loads(e.data) for e in parse_sse(r.body) if e.data and e.data != "[DONE]"]
        toks = [t for ch in chunks for t in ((ch["choices"][0].get("logprobs") or {}).get("tokens") or [])]
        offs = [t for ch in chunks for t in ((ch["choices"][0].get("logprobs") or {}).get("text_offset") or [])]
        self.assertEqual("".join(toks), c["text"])
        self.assertEqual(offs, [len("".join(toks[:i])) for i in range(len(toks))])

    def test_cached_logprobs_equal_cold(self):
        # docs/server-api.md: a prefix served from the KV store gives the same tokens and the same
        # log-probabilities, bit for bit, as a cold run: the suffix is prefilled in a smaller batch,
        # and stories260K's F32 matmul computes a row the same way in any batch (issue 41; its
        # column tail summed in whichever order -ffp-contract left a tile shape once moved these by
        # up to 4e-7, hence a 1e-4 bound before). The KV bytes themselves are the stored ones.
        for prompt in ("Lily and Ben went to the park. They saw a big dog and a small cat. The dog",
                       "Once upon a time there was a little girl named Sue. She liked to play with her ball"):
            body = {"prompt": prompt, "max_tokens": 24, "temperature": 0, "logprobs": 5}
            cold = self.server.post("/v1/completions", body).json()  # a new prompt: a miss (but for BOS)
            self.assertLessEqual(cold["usage"]["prompt_tokens_details"]["cached_tokens"], 1, cold["usage"])
            warm = self.server.post("/v1/completions", body).json()
            self.assertGreater(warm["usage"]["prompt_tokens_details"]["cached_tokens"], 1, warm["usage"])
            a, b = cold["choices"][0]["logprobs"], warm["choices"][0]["logprobs"]
            self.assertEqual(a["tokens"], b["tokens"])
            self.assertEqual(a["token_logprobs"], b["token_logprobs"], "cached vs cold log-probabilities")
            self.assertEqual(a["top_logprobs"], b["top_logprobs"])

    def test_n_and_prompt_lists(self):
        one = self.server.post("/v1/completions", {"prompt": STORIES_PROMPT, "max_tokens": 8, "temperature": 0}).json()
        r = self.server.post("/v1/completions", {"prompt": STORIES_PROMPT, "max_tokens": 8, "temperature": 0, "n": 3})
        self.assertEqual(r.status, 200, r)
        j = r.json()
        self.assertEqual([c["index"] for c in j["choices"]], [0, 1, 2])
        self.assertTrue(all(c["text"] == one["choices"][0]["text"] for c in j["choices"]), "greedy samples are equal")
        self.assertEqual(j["usage"]["completion_tokens"], 24)
        r = self.server.post("/v1/completions", {"prompt": STORIES_PROMPT, "max_tokens": 8, "temperature": 1.0, "seed": 7, "n": 4})
        self.assertEqual(len({c["text"] for c in r.json()["choices"]}), 4, f"samples differ: {r.json()['choices']}")
        prompts = ["Once upon a time", "The cat sat", "Lily liked"]
        r = self.server.post("/v1/completions", {"prompt": prompts, "max_tokens": 6, "temperature": 0})
        self.assertEqual(r.status, 200, r)
        got = [c["text"] for c in r.json()["choices"]]
        want = [self.server.post("/v1/completions", {"prompt": p, "max_tokens": 6, "temperature": 0}).json()["choices"][0]["text"]
                for p in prompts]
        self.assertEqual(got, want, "one choice per prompt, in order, each as if alone")
        import openai
        c = self.server.openai().completions.create(model="m", prompt=prompts, max_tokens=6, temperature=0)
        self.assertEqual([x.text for x in sorted(c.choices, key=lambda x: x.index)], want)

    def test_n_and_prompt_lists_streamed(self):
        one = self.server.post("/v1/completions", {"prompt": STORIES_PROMPT, "max_tokens": 8, "temperature": 0}).json()
        r = self.server.post("/v1/completions", {"prompt": STORIES_PROMPT, "max_tokens": 8, "temperature": 0, "n": 3,
                                                 "stream": True, "stream_options": {"include_usage": True}})
        self.assertEqual(r.status, 200, r)
        data = [e.data for e in parse_sse(r.body) if e.data]
        self.assertEqual(data.count("[DONE]"), 1, "one [DONE] for all choices")
        self.assertEqual(data[-1], "[DONE]")
        chunks = [json.loads(d) for d in data[:-1]]
        texts, finishes = {}, {}
        for ch in chunks:
            for c in ch["choices"]:
                texts[c["index"]] = texts.get(c["index"], "") + c["text"]
                if c.get("finish_reason"):
                    finishes[c["index"]] = c["finish_reason"]
        self.assertEqual(sorted(texts), [0, 1, 2])
        self.assertTrue(all(t == one["choices"][0]["text"] for t in texts.values()), texts)
        self.assertEqual(sorted(finishes), [0, 1, 2], "every choice ends with its finish_reason")
        self.assertEqual(chunks[-1]["choices"], [])
        self.assertEqual(chunks[-1]["usage"]["completion_tokens"], 24, "usage sums the choices")
        # The official client, chat: two streamed choices, each the greedy answer.
        msgs = [{"role": "user", "content": "Hi"}]
        want = self.server.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 6, "temperature": 0}).json()
        got = {}
        for ch in self.server.openai().chat.completions.create(model="m", messages=msgs, max_tokens=6, temperature=0,
                                                                n=2, stream=True):
            for c in ch.choices:
                got[c.index] = got.get(c.index, "") + (c.delta.content or "")
        self.assertEqual(got, {0: want["choices"][0]["message"]["content"], 1: want["choices"][0]["message"]["content"]})

    def test_grammar_enforced(self):
        # llama-server's GBNF `grammar` field (issue 15): the output is a sentence of the grammar.
        for seed in range(4):
            r = self.server.post("/v1/completions", {"prompt": "x", "max_tokens": 8, "temperature": 1.0, "seed": seed,
                                                     "grammar": 'root ::= ("a" | "b") "c"'})
            self.assertEqual(r.status, 200, r)
            self.assertIn(r.json()["choices"][0]["text"], ("ac", "bc"))
            self.assertEqual(r.json()["choices"][0]["finish_reason"], "stop")
        r = self.server.post("/v1/completions", {"prompt": "x", "max_tokens": 2, "grammar": "root ::= ("})
        self.assertEqual(r.status, 400, r)
        self.assertIn("grammar", r.json()["error"]["message"])


class ChatCompatTest(ServerTestCase):
    @classmethod
    def server_model(cls):
        return chat_model()["dir"]

    def test_props_and_apply_template(self):
        r = self.server.request("GET", "/props")
        self.assertEqual(r.status, 200, r)
        j = r.json()
        self.assertIn("n_ctx", j["default_generation_settings"])
        self.assertIn("start_header_id", j["chat_template"])
        r = self.server.post("/apply-template", {"messages": user("Hello there")})
        self.assertEqual(r.status, 200, r)
        self.assertIn("Hello there", r.json()["prompt"])
        self.assertTrue(r.json()["prompt"].rstrip().endswith("assistant<|end_header_id|>"), r.json()["prompt"][-80:])

    def test_chat_logprobs_pieces_join(self):
        r = self.server.post("/v1/chat/completions", {"messages": user("Tell me a story"), "max_tokens": 24,
                                                      "temperature": 0, "logprobs": True, "top_logprobs": 2})
        self.assertEqual(r.status, 200, r)
        ch = r.json()["choices"][0]
        content = ch["logprobs"]["content"]
        self.assertEqual("".join(t["token"] for t in content), ch["message"]["content"])
        self.assertEqual(b"".join(bytes(t["bytes"]) for t in content), ch["message"]["content"].encode("utf-8"))
        self.assertTrue(any(t["token"].startswith(" ") for t in content), "leading spaces are kept")

    def test_chat_n(self):
        r = self.server.post("/v1/chat/completions", {"messages": user("Hi"), "max_tokens": 6, "temperature": 1.0,
                                                      "seed": 3, "n": 3})
        self.assertEqual(r.status, 200, r)
        ch = r.json()["choices"]
        self.assertEqual([c["index"] for c in ch], [0, 1, 2])
        self.assertTrue(all(c["message"]["role"] == "assistant" for c in ch))
        c = self.server.openai().chat.completions.create(model="m", messages=user("Hi"), max_tokens=4, n=2, temperature=0)
        self.assertEqual(len(c.choices), 2)

    def test_llama_server_validation(self):
        two = user("hi") + [{"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}]
        r = self.server.post("/v1/chat/completions", {"messages": two, "max_tokens": 2})
        self.assertEqual(r.status, 400, r)
        r = self.server.post("/v1/chat/completions", {"messages": user("hi") + [{"role": "assistant", "content": "a"}],
                                                      "max_tokens": 2, "add_generation_prompt": True,
                                                      "continue_final_message": True})
        self.assertEqual(r.status, 400, r)
        r = self.server.post("/v1/chat/completions", {"messages": user("hi"), "max_tokens": 2, "grammar": "root ::= x"})
        self.assertEqual(r.status, 400, r)

    def test_final_assistant_message_is_continued(self):
        # llama-server's prefill_assistant, vLLM's continue_final_message, Anthropic's prefill: the
        # turns before it with the generation prompt, then its text; the answer carries on from it.
        head = user("Tell me a story")
        prefill = "Once upon a time"
        rendered = self.server.post("/apply-template", {"messages": head}).json()["prompt"]
        ids = [t if isinstance(t, int) else t["id"] for t in
               self.server.post("/tokenize", {"content": rendered + prefill, "add_special": False}).json()["tokens"]]
        ref = self.server.post("/v1/completions", {"prompt": ids, "max_tokens": 12, "temperature": 0}).json()
        msgs = head + [{"role": "assistant", "content": prefill}]
        r = self.server.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 12, "temperature": 0})
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json()["usage"]["prompt_tokens"], len(ids))
        self.assertEqual(r.json()["choices"][0]["message"]["content"], ref["choices"][0]["text"])
        r = self.server.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 12, "temperature": 0,
                                                      "continue_final_message": True, "add_generation_prompt": False})
        self.assertEqual(r.json()["choices"][0]["message"]["content"], ref["choices"][0]["text"])
        r = self.server.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 4, "temperature": 0,
                                                      "continue_final_message": False})
        self.assertEqual(r.status, 200, r)
        self.assertGreater(r.json()["usage"]["prompt_tokens"], len(ids), "opted out: a new assistant turn")
        r = self.server.post("/v1/chat/completions", {"messages": head, "max_tokens": 2, "continue_final_message": True})
        self.assertEqual(r.status, 400, r)
        self.assertIn("continue_final_message", r.json()["error"]["message"])
        r = self.server.post("/v1/messages", {"model": "m", "max_tokens": 12, "temperature": 0, "messages": msgs})
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json()["content"][0]["text"], ref["choices"][0]["text"])
        r = self.server.post("/v1/messages", {"model": "m", "max_tokens": 4,
                                              "messages": head + [{"role": "assistant", "content": "Once "}]})
        self.assertEqual(r.status, 400, r)
        self.assertIn("trailing whitespace", r.json()["error"]["message"])

    def test_count_tokens_shares_the_messages_validator(self):
        base = {"model": "m", "max_tokens": 4}
        bad_bodies = [
            {"messages": user("hi"), "thinking": {"type": 5}},
            {"messages": user("hi"), "system": [{"type": 7, "text": "x"}]},
            {"messages": user("hi") + [{"role": "assistant", "content": [{"type": "tool_use", "id": 1, "name": "f", "input": {}}]}]},
            {"messages": user("hi") + [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": 3, "input": {}}]}]},
            {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": 9, "content": "x"}]}]},
            {"messages": user("hi"), "tools": [{"name": "f", "description": 5, "input_schema": {}}]},
            {"messages": user("hi"), "tool_choice": {"type": 4}},
        ]
        for body in bad_bodies:
            with self.subTest(body=json.dumps(body)[:100]):
                a = self.server.post("/v1/messages/count_tokens", body)
                b = self.server.post("/v1/messages", {**base, **body})
                self.assertEqual(a.status, 400, a)
                self.assertEqual(b.status, 400, b)
                self.assertEqual(a.json()["error"]["message"], b.json()["error"]["message"])


class CorsLocalhostTest(unittest.TestCase):
    def test_cors_origins_localhost(self):
        s = Server(STORIES, "--cors-origins", "localhost").start()
        try:
            for origin in ("http://localhost:5173", "http://127.0.0.1:8000", "http://[::1]:3000"):
                r = s.request("OPTIONS", "/v1/chat/completions", headers={"Origin": origin, "Access-Control-Request-Method": "POST"})
                self.assertEqual(r.status, 200, r)
                self.assertEqual(r.headers.get("access-control-allow-origin"), origin)
            r = s.request("OPTIONS", "/v1/chat/completions", headers={"Origin": "http://evil.test", "Access-Control-Request-Method": "POST"})
            self.assertNotIn("access-control-allow-origin", r.headers)
        finally:
            s.stop()


if __name__ == "__main__":
    unittest.main()
