"""`larder serve MODEL --draft DRAFT` (llama.cpp's -md / --spec-draft-model, issue 44 items 1-2):
draft-model speculation inside continuous batching — each running sequence drafts with its own
draft-model state and adds its k + 1 verify rows to the step's forward_batch — answers exactly as
the same server without speculation: greedy requests in one batch, a sampled request with a seed,
and a structured-output request; drafted/accepted reach the response timings and /metrics.

On the real Qwen2.5-Coder 1.5B target and 0.5B draft (Q4_K_M, from LARDER_MODELS_DIR; skips when
absent: scripts/fetch_models.sh). Q4_K and Q6_K decode is batch-invariant on the AVX-512 tier only
with LARDER_BATCH_INVARIANT=1 today (kernels/batch_invariance.cpp), so both servers run with it set
— the test holds whether or not the default kernels have become invariant."""
import concurrent.futures
import os
import unittest

from server_harness import Server, metric_sum

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.environ.get("LARDER_MODELS_DIR") or os.path.join(HERE, "../../.cache/models")
TARGET = os.path.join(MODELS, "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
DRAFT = os.path.join(MODELS, "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
ENV = {"LARDER_BATCH_INVARIANT": "1"}

PROMPTS = [
    "Rewrite this Python function with type hints, changing nothing else:\n\n"
    "def add_all(values, start):\n    total = start\n    for v in values:\n        total = total + v\n"
    "    return total\n",
    "Repeat this list exactly, one item per line: apple, banana, cherry, date, elderberry, fig.",
    "What is the capital of France? Answer in one sentence.",
]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "langs": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "langs"]}


@unittest.skipUnless(os.path.exists(TARGET) and os.path.exists(DRAFT), "the Qwen2.5-Coder pair is not fetched")
class ServeDraftTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        flags = ("--parallel", "3", "--ctx", "2048", "--prompt-cache", "0", "-t", "2")
        cls.plain = Server(TARGET, *flags, "--spec", "none", env=ENV, startup_timeout=300).start()
        try:
            cls.spec = Server(TARGET, *flags, "-md", DRAFT, "--spec-draft-n-max", "6", env=ENV,
                              startup_timeout=300).start()
        except BaseException:
            cls.plain.stop()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.plain.stop()
        cls.spec.stop()

    def chat(self, srv, prompt, extra=None, n=40):
        r = srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}], "temperature": 0,
                                              "max_tokens": n, **(extra or {})}, timeout=600)
        self.assertEqual(r.status, 200, r)
        j = r.json()
        return j["choices"][0]["message"]["content"], j["choices"][0]["finish_reason"], j["usage"]

    def test_batched_greedy_is_plain_decoding_with_timings(self):
        self.assertIn("draft model", self.spec.log())
        want = [self.chat(self.plain, p)[:2] for p in PROMPTS]  # one at a time
        with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as ex:  # together: one batch
            got = list(ex.map(lambda p: self.chat(self.spec, p), PROMPTS))
        drafted = accepted = 0
        for p, w, g in zip(PROMPTS, want, got):
            with self.subTest(prompt=p[:30]):
                self.assertEqual(g[:2], w)
                t = g[2]["larder"]["timings"]
                self.assertLessEqual(t["accepted_tokens"], t["drafted_tokens"])
                drafted += t["drafted_tokens"]
                accepted += t["accepted_tokens"]
        self.assertGreater(accepted, 20)
        m = self.spec.metrics()
        self.assertGreaterEqual(metric_sum(m, "larder_spec_drafted_tokens_total"), drafted)
        self.assertGreaterEqual(metric_sum(m, "larder_spec_accepted_tokens_total"), accepted)

    def test_sampled_with_seed(self):
        extra = {"temperature": 0.8, "top_p": 0.95, "seed": 5}
        p = "Write two sentences about a lighthouse."
        self.assertEqual(self.chat(self.spec, p, extra)[:2], self.chat(self.plain, p, extra)[:2])

    def test_structured_output(self):
        extra = {"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}}
        p = "Give a person named Ann who knows C, Go and Rust."
        self.assertEqual(self.chat(self.spec, p, extra)[:2], self.chat(self.plain, p, extra)[:2])


if __name__ == "__main__":
    unittest.main()
