"""`larder serve MODEL --draft DRAFT` (llama.cpp's -md / --spec-draft-model, issue 44 items 1-2):
draft-model speculation inside continuous batching — each running sequence drafts with its own
draft-model state and adds its k + 1 verify rows to the step's forward_batch — answers exactly as
the same server without speculation: greedy requests in one batch, a sampled request with a seed,
and a structured-output request; drafted/accepted reach the response timings and /metrics.

On the real Qwen2.5-Coder 1.5B target and 0.5B draft (Q4_K_M, from LARDER_MODELS_DIR; skips when
absent: scripts/fetch_models.sh). Q4_K and Q6_K decode is batch-invariant on the AVX-512 tier only
with LARDER_BATCH_INVARIANT=1 today (kernels/batch_invariance.cpp), so both servers run with it set
— the test holds whether or not the default kernels have become invariant."""
import os
import unittest

from spec_pair import SpecPairTest

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.environ.get("LARDER_MODELS_DIR") or os.path.join(HERE, "../../.cache/models")
TARGET = os.path.join(MODELS, "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
DRAFT = os.path.join(MODELS, "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")

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
class ServeDraftTest(SpecPairTest):
    MODEL = TARGET
    FLAGS = ("--parallel", "3", "--ctx", "2048", "--prompt-cache", "0", "-t", "2")
    SPEC_FLAGS = ("-md", DRAFT, "--spec-draft-n-max", "6")
    ENV = {"LARDER_BATCH_INVARIANT": "1"}
    STARTUP = 300
    N = 40
    TIMEOUT = 600

    def test_batched_greedy_is_plain_decoding_with_timings(self):
        self.assertIn("draft model", self.spec.log())
        self.assert_batch_is_plain_decoding(PROMPTS, min_accepted=20)

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
