"""`larder serve --spec ngram` (issue 44): prompt-lookup speculation inside continuous batching —
a drafted sequence adds its last token and its draft as k + 1 rows to the step's forward_batch,
beside other sequences' decode rows and prefill slices — prints what the same server prints
without it, with structured output too, and reports drafted/accepted tokens in the response
timings (`usage.larder.timings`, llama-server's `timings.draft_n`/`draft_n_accepted` on /completion),
/metrics and the request log.

On the real SmolLM2-135M-Instruct BF16 checkpoint (skips when absent: scripts/fetch_models.sh),
whose rows are batch-invariant today (bench/RESULTS.md, issue 44): exactness on GGUF integer formats
waits for batch-invariant kernels (tests/cli/spec_test.py)."""
import json
import os
import unittest

from server_harness import Server
from spec_pair import SpecPairTest

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.environ.get("LARDER_MODELS_DIR") or os.path.join(HERE, "../../.cache/models")
BF16 = os.path.join(MODELS, "SmolLM2-135M-Instruct-hf")
Q4_1 = os.path.join(MODELS, "SmolLM2-135M-Instruct.Q4_1.gguf")  # the same model: a draft with its vocabulary

PROMPTS = [
    "Repeat this list exactly, one item per line: apple, banana, cherry, date, elderberry, fig, grape, "
    "honeydew, kiwi, lemon, mango, nectarine.",
    "Rewrite this Python function with type hints, changing nothing else:\n\n"
    "def add_all(values, start):\n    total = start\n    for v in values:\n        total = total + v\n"
    "    return total\n",
    "Copy this sentence three times: the quick brown fox jumps over the lazy dog.",
    "Write a haiku about the sea.",
]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "fruits": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "fruits"]}


@unittest.skipUnless(os.path.exists(BF16), f"{BF16} not fetched (scripts/fetch_models.sh)")
class ServeSpecTest(SpecPairTest):
    MODEL = BF16
    FLAGS = ("--parallel", "4", "--ctx", "2048", "--prompt-cache", "0")
    SPEC_FLAGS = ("--spec", "ngram")

    def test_batched_output_is_plain_decodings_with_timings(self):
        self.assert_batch_is_plain_decoding(PROMPTS, min_accepted=20)
        self.assertNotIn("drafted_tokens", self.chat(self.plain, PROMPTS[0], n=4)[2]["larder"]["timings"])
        self.assertRegex(self.spec.log(), r" spec=\d+/\d+")

    def test_structured_output(self):
        extra = {"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}}
        p = "Give a person named Ann and her fruits: apple, banana, cherry, apple, banana, cherry."
        self.assertEqual(self.chat(self.spec, p, extra)[:2], self.chat(self.plain, p, extra)[:2])

    def test_native_completion_timings(self):
        r = self.spec.post("/completion", {"prompt": "one two three four five one two three four five one two three",
                                           "n_predict": 24, "temperature": 0})
        self.assertEqual(r.status, 200, r)
        t = r.json()["timings"]
        self.assertIn("draft_n", t)
        self.assertLessEqual(t["draft_n_accepted"], t["draft_n"])


    @unittest.skipUnless(os.path.exists(Q4_1), f"{Q4_1} not fetched")
    def test_draft_kv_counted_in_the_budget(self):
        # A draft model's KV grows beside the target's in every sequence: --kv-budget admission
        # counts both (the draft here has the target's shape, so twice the bytes per token).
        flags = ("--parallel", "2", "--ctx", "1024", "--kv-budget", "1G")
        plain = Server(BF16, *flags, "--spec", "none").start()
        try:
            alone = plain.request("GET", "/stats").json()["server"]["kv_bytes_per_token"]
        finally:
            plain.stop()
        srv = Server(BF16, *flags, "--draft", Q4_1).start()
        try:
            both = srv.request("GET", "/stats").json()["server"]["kv_bytes_per_token"]
        finally:
            srv.stop()
        self.assertGreater(alone, 0)
        self.assertEqual(both, 2 * alone)

    def test_json_log_fields(self):
        srv = Server(BF16, "--parallel", "1", "--ctx", "1024", "--spec", "ngram", "--log-format", "json").start()
        try:
            _, _, usage = self.chat(srv, PROMPTS[0], n=48)
            t = usage["larder"]["timings"]
        finally:
            srv.stop()
        lines = [json.loads(line) for line in srv.log().splitlines() if line.startswith("{")]
        gen = [j for j in lines if j.get("path") == "/v1/chat/completions"]
        self.assertEqual(len(gen), 1, lines)
        self.assertEqual((gen[0]["drafted_tokens"], gen[0]["accepted_tokens"]), (t["drafted_tokens"], t["accepted_tokens"]))


if __name__ == "__main__":
    unittest.main()
