"""Ollama's native API (/api/tags, /api/show, /api/chat, /api/generate, /api/ps, /api/version)
driven by the official `ollama` Python client against a live `larder serve` of the real
SmolLM2-135M-Instruct Q4_1 GGUF. The oracle for the answers is larder's own OpenAI surface at
temperature 0 (itself checked against llama-server in tests/goldens): the Ollama routes must be
the same engine behind another shape, so greedy answers are equal token for token. Shapes are
checked against Ollama's docs/api.md (field names, nanosecond durations, RFC 3339 created_at,
NDJSON lines). Skips, naming the file, when the model was not fetched (scripts/fetch_models.sh)."""
import json
import os
import re
import unittest

from server_harness import HERE, Server

MODELS = os.environ.get("LARDER_MODELS_DIR") or os.path.join(HERE, "../../.cache/models")
SMOL = os.path.join(MODELS, "SmolLM2-135M-Instruct.Q4_1.gguf")
RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")
QUESTION = "What is the capital of France? Answer in one word."
DURATIONS = ("total_duration", "load_duration", "prompt_eval_duration", "eval_duration")

try:
    import ollama
except ImportError:  # pragma: no cover - requirements-dev.txt pins it
    ollama = None


class OllamaApiTest(unittest.TestCase):
    server = None

    @classmethod
    def setUpClass(cls):
        if ollama is None:
            raise unittest.SkipTest("the ollama Python client is not installed (requirements-dev.txt)")
        if not os.path.exists(SMOL):
            raise unittest.SkipTest(f"{SMOL} is absent: run scripts/fetch_models.sh (or set LARDER_MODELS_DIR)")
        # --prompt-cache 0: every request prefills its whole prompt, so two routes compare under the
        # same arithmetic (a KV-store hit prefills only the tail, in other chunks, and on this Q4_1
        # model that can flip a near-tie)
        cls.server = Server(SMOL, "--ctx", "1024", "--parallel", "2", "--prompt-cache", "0").start()
        cls.client = ollama.Client(host=cls.server.base, timeout=120)
        cls.model = cls.server.model_id()

    @classmethod
    def tearDownClass(cls):
        if cls.server is not None:
            cls.server.stop()
            cls.server.kill()

    def tearDown(self):
        self.assertTrue(self.server.alive(), f"the server died during the test; output:\n{self.server.log()}")

    def greedy_openai_chat(self, messages, max_tokens):
        r = self.server.openai().chat.completions.create(model=self.model, messages=messages, max_tokens=max_tokens,
                                                         temperature=0)
        return r.choices[0].message.content, r.choices[0].finish_reason

    def assertFinal(self, resp, eval_count=None):
        self.assertTrue(resp.done)
        self.assertIn(resp.done_reason, ("stop", "length"))
        self.assertRegex(resp.created_at, RFC3339)
        self.assertEqual(resp.model, self.model)
        for k in DURATIONS:
            self.assertIsInstance(resp[k], int, k)
            self.assertGreaterEqual(resp[k], 0, k)
        # nanoseconds: a forward of even a 135M model takes more than 10 µs, and the whole request
        # less than its wall time
        self.assertGreater(resp.eval_duration, 10_000)
        self.assertGreaterEqual(resp.total_duration, resp.eval_duration)
        self.assertGreaterEqual(resp.prompt_eval_count, 1)
        if eval_count is not None:
            self.assertEqual(resp.eval_count, eval_count)

    # -- listings
    def test_list_show_ps_version(self):
        models = self.client.list().models
        self.assertEqual(len(models), 1)
        m = models[0]
        self.assertEqual(m.model, self.model)
        self.assertEqual(m.details.family, "llama")
        self.assertEqual(m.details.format, "gguf")
        self.assertIn("Q4_1", m.details.quantization_level)
        self.assertGreater(m.size, 50_000_000)
        self.assertTrue(m.digest)
        self.assertIsNotNone(m.modified_at)

        show = self.client.show(self.model)
        self.assertIn("completion", show.capabilities)
        self.assertEqual(show.modelinfo["general.architecture"], "llama")
        self.assertEqual(show.modelinfo["llama.block_count"], 30)  # SmolLM2-135M: 30 layers
        self.assertIn("num_ctx 1024", show.parameters)
        self.assertIn("<|im_start|>", show.template)  # the GGUF's own ChatML template
        self.assertEqual(self.client.show(self.model + ":latest").details.family, "llama")

        ps = self.client.ps().models
        self.assertEqual(len(ps), 1)
        self.assertEqual(ps[0].context_length, 1024)
        self.assertEqual(ps[0].model, self.model)

        v = self.server.request("GET", "/api/version").json()
        self.assertRegex(v["version"], r"^\d+\.\d+\.\d+")

    # -- chat
    def test_chat_greedy_equals_openai_route(self):
        msgs = [{"role": "user", "content": QUESTION}]
        want, finish = self.greedy_openai_chat(msgs, 24)
        self.assertTrue(want)
        r = self.client.chat(model=self.model, messages=msgs, stream=False, options={"temperature": 0, "num_predict": 24})
        self.assertEqual(r.message.role, "assistant")
        self.assertEqual(r.message.content, want)
        self.assertEqual(r.done_reason, "length" if finish == "length" else "stop")
        self.assertFinal(r)

        parts = list(self.client.chat(model=self.model, messages=msgs, stream=True,
                                      options={"temperature": 0, "num_predict": 24}))
        self.assertGreater(len(parts), 2, "a stream of one object is not streaming")
        self.assertTrue(all(not p.done for p in parts[:-1]))
        self.assertEqual("".join(p.message.content for p in parts), want)
        self.assertEqual(parts[-1].message.content, "")
        self.assertFinal(parts[-1], eval_count=r.eval_count)

    def test_chat_multi_turn_and_system(self):
        msgs = [{"role": "system", "content": "You are a terse assistant."},
                {"role": "user", "content": "Name a color."},
                {"role": "assistant", "content": "Blue."},
                {"role": "user", "content": "Name another one."}]
        want, _ = self.greedy_openai_chat(msgs, 12)
        r = self.client.chat(model=self.model, messages=msgs, options={"temperature": 0, "num_predict": 12})
        self.assertEqual(r.message.content, want)

    def test_chat_tools_and_tool_messages_render(self):
        tools = [{"type": "function", "function": {"name": "get_weather", "description": "weather of a city",
                                                   "parameters": {"type": "object", "properties": {
                                                       "city": {"type": "string"}}, "required": ["city"]}}}]
        msgs = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": "",
                 "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                {"role": "tool", "content": "18 C and sunny", "tool_name": "get_weather"}]
        r = self.client.chat(model=self.model, messages=msgs, tools=tools, stream=False,
                             options={"temperature": 0, "num_predict": 8})
        self.assertFinal(r)
        self.assertEqual(r.message.role, "assistant")

    # -- generate
    def test_generate_greedy_stream_and_not(self):
        want, _ = self.greedy_openai_chat([{"role": "user", "content": QUESTION}], 20)
        r = self.client.generate(model=self.model, prompt=QUESTION, stream=False,
                                 options={"temperature": 0, "num_predict": 20})
        self.assertEqual(r.response, want)  # the prompt goes through the chat template as a user turn
        self.assertFinal(r)
        parts = list(self.client.generate(model=self.model, prompt=QUESTION, stream=True,
                                          options={"temperature": 0, "num_predict": 20}))
        self.assertGreater(len(parts), 2)
        self.assertEqual("".join(p.response for p in parts), want)
        self.assertFinal(parts[-1], eval_count=r.eval_count)

    def test_generate_system_and_raw(self):
        msgs = [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": QUESTION}]
        want, _ = self.greedy_openai_chat(msgs, 12)
        r = self.client.generate(model=self.model, prompt=QUESTION, system="Answer in French.",
                                 options={"temperature": 0, "num_predict": 12})
        self.assertEqual(r.response, want)
        # raw: no template, the same tokens /v1/completions sees
        prompt = "The three primary colors are"
        c = self.server.openai().completions.create(model=self.model, prompt=prompt, max_tokens=12, temperature=0)
        r = self.client.generate(model=self.model, prompt=prompt, raw=True, options={"temperature": 0, "num_predict": 12})
        self.assertEqual(r.response, c.choices[0].text)

    def test_empty_prompt_loads(self):
        r = self.client.generate(model=self.model, prompt="", stream=False)
        self.assertTrue(r.done)
        self.assertEqual(r.done_reason, "load")
        r = self.client.chat(model=self.model, messages=[], stream=False, keep_alive=0)
        self.assertEqual(r.done_reason, "unload")
        r = self.server.post("/api/generate", {"model": self.model, "prompt": None, "stream": False})
        self.assertEqual(r.json()["done_reason"], "load")
        r = self.server.post("/api/chat", {"model": self.model, "stream": False})
        self.assertEqual(r.json()["done_reason"], "load")

    # -- options
    def test_num_predict_caps_eval_count(self):
        for n in (1, 5):
            r = self.client.generate(model=self.model, prompt="Write a long story about a dragon.",
                                     options={"temperature": 0, "num_predict": n}, stream=False)
            self.assertEqual(r.eval_count, n)
            self.assertEqual(r.done_reason, "length")

    def test_seed_reproducible_and_stop(self):
        opts = {"temperature": 1.0, "top_k": 50, "seed": 1234, "num_predict": 24}
        a = self.client.generate(model=self.model, prompt="Tell me a story.", options=opts, stream=False).response
        b = self.client.generate(model=self.model, prompt="Tell me a story.", options=opts, stream=False).response
        self.assertEqual(a, b)
        others = {self.client.generate(model=self.model, prompt="Tell me a story.", stream=False,
                                       options=dict(opts, seed=s)).response for s in (1, 2, 3)}
        self.assertGreater(len(others | {a}), 1, "different seeds never changed the sample: seed is not honoured")
        # stop: the answer ends before the stop string, which is never released
        full = self.client.generate(model=self.model, prompt=QUESTION, options={"temperature": 0, "num_predict": 20},
                                    stream=False).response
        word = full.split()[1] if len(full.split()) > 1 else full
        cut = self.client.generate(model=self.model, prompt=QUESTION, stream=False,
                                   options={"temperature": 0, "num_predict": 20, "stop": [word]})
        self.assertEqual(cut.response, full[:full.index(word)])
        self.assertEqual(cut.done_reason, "stop")

    def test_num_ctx(self):
        r = self.client.generate(model=self.model, prompt="Write a long story about a dragon.", stream=False,
                                 options={"temperature": 0, "num_ctx": 50})
        # num_ctx smaller than the server's: the answer stops where that context is full
        self.assertEqual(r.done_reason, "length")
        self.assertEqual(r.prompt_eval_count + r.eval_count, 50)
        with self.assertRaises(ollama.ResponseError) as e:
            self.client.generate(model=self.model, prompt=QUESTION, options={"num_ctx": 4096}, stream=False)
        self.assertEqual(e.exception.status_code, 400)
        self.assertIn("num_ctx", e.exception.error)
        self.assertIn("1024", e.exception.error)

    # -- errors: ResponseError with the server's message
    def assertRefused(self, status, words, fn):
        with self.assertRaises(ollama.ResponseError) as e:
            r = fn()
            if not isinstance(r, (ollama.ChatResponse, ollama.GenerateResponse)):
                list(r)
        self.assertEqual(e.exception.status_code, status, e.exception.error)
        for w in words:
            self.assertIn(w, e.exception.error)

    def test_errors(self):
        msgs = [{"role": "user", "content": "hi"}]
        self.assertRefused(404, ["not found", self.model], lambda: self.client.chat(model="llama3", messages=msgs))
        self.assertRefused(404, ["not found"], lambda: self.client.show("llama3"))
        self.assertRefused(400, ["images", "text-only"], lambda: self.client.chat(
            model=self.model, messages=[{"role": "user", "content": "hi", "images": ["aGVsbG8="]}], stream=False))
        self.assertRefused(400, ["images"], lambda: self.client.generate(model=self.model, prompt="hi", images=["aGVsbG8="]))
        # format (issue 15): "json" and schemas are enforced; a keyword that cannot be is refused by name.
        r = self.client.chat(model=self.model, messages=msgs, format="json", stream=False,
                             options={"temperature": 0, "num_predict": 200})
        self.assertIsInstance(json.loads(r.message.content), dict, r.message.content)
        self.assertRefused(400, ["format", "uniqueItems"], lambda: self.client.chat(
            model=self.model, messages=msgs, stream=False, format={"type": "array", "uniqueItems": True}))
        self.assertRefused(400, ["template"], lambda: self.client.generate(model=self.model, prompt="hi", template="{{ .Prompt }}"))
        self.assertRefused(400, ["options.temperature"], lambda: self.client.chat(
            model=self.model, messages=msgs, options={"temperature": -1}, stream=False))
        self.assertRefused(400, ["mirostat"], lambda: self.client.generate(model=self.model, prompt="hi",
                                                                           options={"mirostat": 2}, stream=False))
        self.assertRefused(501, ["larder pull"], lambda: self.client.pull(self.model))
        self.assertRefused(501, ["embeddings"], lambda: self.client.embed(model=self.model, input="hi"))
        self.assertRefused(501, ["embeddings"], lambda: self.client.embeddings(model=self.model, prompt="hi"))
        # a too-long prompt: the context error in Ollama's shape
        self.assertRefused(400, ["context"], lambda: self.client.generate(model=self.model, prompt="word " * 3000, stream=False))
        r = self.server.post("/api/chat", {"model": self.model, "messages": "nope"})
        self.assertEqual(r.status, 400)
        self.assertEqual(list(r.json().keys()), ["error"])  # Ollama's error shape, not OpenAI's

    # -- wire format
    def test_ndjson_wire_format(self):
        r = self.server.post("/api/generate", {"model": self.model, "prompt": QUESTION,
                                               "options": {"temperature": 0, "num_predict": 6}})
        self.assertEqual(r.status, 200)
        self.assertTrue(r.headers["content-type"].startswith("application/x-ndjson"), r.headers)
        lines = [ln for ln in r.body.decode().split("\n") if ln.strip()]
        objs = [json.loads(ln) for ln in lines]
        self.assertTrue(all(o["done"] is False for o in objs[:-1]))
        last = objs[-1]
        self.assertTrue(last["done"])
        for k in ("model", "created_at", "response", "done_reason", "prompt_eval_count", "eval_count", *DURATIONS):
            self.assertIn(k, last)
        self.assertEqual(last["eval_count"], 6)
        r = self.server.post("/api/chat", {"model": self.model, "stream": False, "messages": [{"role": "user", "content": "hi"}],
                                           "options": {"num_predict": 3}, "keep_alive": "5m"})
        self.assertEqual(r.status, 200)
        self.assertTrue(r.headers["content-type"].startswith("application/json"))
        body = r.json()
        self.assertEqual(body["message"]["role"], "assistant")
        self.assertEqual(body["eval_count"], 3)


if __name__ == "__main__":
    unittest.main()
