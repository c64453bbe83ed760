"""`larder generate --spec ngram` (issue 44, first slice): prompt-lookup speculation prints exactly
what plain decoding prints, token count and stop reason included, and reports its drafted and
accepted tokens in the stats line. On the real SmolLM2-135M-Instruct from LARDER_MODELS_DIR
(skips when absent: scripts/fetch_models.sh).

Exactness needs the verify forward (k + 1 rows) to give each row the logits a one-row decode
gives it. Measured on this AVX-512 host (a row forwarded alone vs inside a call of k + 1 rows,
compared bit for bit): the BF16 checkpoint (SmolLM2-135M-Instruct-hf) is invariant up to 9 rows,
so test_bf16_* run unconditionally; the Q4_1 and Q4_K_M GGUFs are invariant up to 7 rows and differ
from 8 (the multi-row int8 GEMM path; max |diff| 0.63 on Q4_1 at 9 rows), which the default
--draft-max 6 stays under — but that is the kernels' row threshold, not a guarantee, so
test_q4_1_exact runs only with LARDER_EXPECT_BATCH_INVARIANT=1 (once the kernels are
batch-invariant) and says why otherwise, as tests/cli/decode_test.py's cold == warm does."""
import os
import re
import unittest

from cli_models import run

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.environ.get("LARDER_MODELS_DIR") or os.path.join(HERE, "../../.cache/models")
BF16 = os.path.join(MODELS, "SmolLM2-135M-Instruct-hf")
Q4_1 = os.path.join(MODELS, "SmolLM2-135M-Instruct.Q4_1.gguf")
GEMMA3 = os.path.join(MODELS, "gemma-3-270m-q4_k_m.gguf")

# Prompts whose answers repeat their input: what prompt lookup drafts from.
REPEAT = [
    "Repeat this list exactly, one item per line: apple, banana, cherry, date, elderberry, fig, grape, "
    "honeydew, kiwi, lemon, mango, nectarine.",
    "Rewrite this Python function with type hints, changing nothing else:\n\n"
    "def add_all(values, start):\n    total = start\n    for v in values:\n        total = total + v\n"
    "    return total\n",
]
PERSON = '{"type":"object","properties":{"name":{"type":"string"},"fruits":{"type":"array","items":{"type":"string"}}},' \
         '"required":["name","fruits"]}'


# LARDER_SPEC_FORCE=1: draft at the cap every step, whatever the measured costs say would pay
# (runtime/speculative.h) — the verify path runs on every step, and must stay exact.
FORCE = dict(os.environ, LARDER_SPEC_FORCE="1")


def generate(model, prompt, *flags, n=96):
    rc, out, err = run("generate", model, "--chat", "-p", prompt, "--temp", "0", "-n", str(n), *flags, timeout=300,
                       env=FORCE)
    assert rc == 0, err
    gen = int(re.search(r"generated (\d+) tokens", err).group(1))
    stop = re.search(r"stop: ([a-z ]+)", err).group(1).strip()
    m = re.search(r"spec: drafted (\d+), accepted (\d+)", err)
    spec = (int(m.group(1)), int(m.group(2))) if m else None
    return out, gen, stop, spec


class SpecTest(unittest.TestCase):
    def need(self, path):
        if not os.path.exists(path):
            self.skipTest(f"{path} not fetched (scripts/fetch_models.sh)")

    def exact(self, model, flags=(), prompts=REPEAT, n=96):
        accepted = 0
        for prompt in prompts:
            with self.subTest(prompt=prompt[:40], flags=flags):
                plain = generate(model, prompt, *flags, n=n)
                spec = generate(model, prompt, *flags, "--spec", "ngram", "--draft-max", "6", n=n)
                self.assertIsNone(plain[3])  # no spec line without --spec
                self.assertEqual(spec[:3], plain[:3])
                self.assertIsNotNone(spec[3], "no spec: drafted/accepted in the stats line")
                drafted, acc = spec[3]
                self.assertLessEqual(acc, drafted)
                accepted += acc
        return accepted

    def test_bf16_greedy_output_is_plain_decodings(self):
        self.need(BF16)
        # The answers repeat the prompt: drafts are taken.
        self.assertGreater(self.exact(BF16), 10)

    def test_bf16_structured_output_with_spec(self):
        self.need(BF16)
        self.exact(BF16, ("--json-schema", PERSON), prompts=["Give a person named Ann and her fruits: apple, "
                                                             "banana, cherry, apple, banana, cherry."], n=64)

    def test_q4_1_exact(self):
        """Expected to hold only once the kernels are batch-invariant: see the module docstring."""
        self.need(Q4_1)
        if os.environ.get("LARDER_EXPECT_BATCH_INVARIANT") != "1":
            self.skipTest("the Q4_1 multi-row verify rounds differently from one-row decode until the kernels are "
                          "batch-invariant; set LARDER_EXPECT_BATCH_INVARIANT=1 to check")
        self.exact(Q4_1)

    def test_sliding_window_model_decodes_plainly(self):
        self.need(GEMMA3)
        rc, out, err = run("generate", GEMMA3, "-p", "one two three one two three", "--temp", "0", "-n", "8",
                           "--spec", "ngram", timeout=300)
        self.assertEqual(rc, 0, err)
        self.assertIn("--spec: off for this model", err)
        self.assertNotIn("spec: drafted", err)

    def test_bad_flags(self):
        rc, _, err = run("generate", "nonexistent.gguf", "--spec", "eagle")
        self.assertNotEqual(rc, 0)
        self.assertIn("--spec", err)
        rc, _, err = run("generate", "nonexistent.gguf", "--spec", "ngram", "--draft-max", "0")
        self.assertNotEqual(rc, 0)
        self.assertIn("--draft-max", err)


if __name__ == "__main__":
    unittest.main()
