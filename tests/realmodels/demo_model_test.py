"""The demo's model (scripts/demo.sh serves it by default): real Qwen2.5-Coder-0.5B-Instruct
(GGUF Q4_K_M, scripts/fetch_models.sh) must answer a new user's first question right through the
official openai client, and its 1.5B sibling must share its tokenizer (what lets the 0.5B draft
for the 1.5B). Skips when the files are absent."""
import os
import re
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "../server"))
import server_harness  # noqa: E402

BIN = os.environ["LARDER_BIN"]
MODELS = os.environ.get("LARDER_MODELS_DIR") or ""
Q05 = os.path.join(MODELS, "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
Q15 = os.path.join(MODELS, "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")


@unittest.skipUnless(os.path.exists(Q05), f"{Q05} is absent: run scripts/fetch_models.sh")
class DemoModel(unittest.TestCase):
    def test_demo_serves_this_model_by_default(self):
        with open(os.path.join(HERE, "../../scripts/demo.sh")) as f:
            m = re.search(r'model="\$\{1:-\$models/([^}]+)\}"', f.read())
        self.assertIsNotNone(m, "scripts/demo.sh: no default model line")
        self.assertEqual(m.group(1), os.path.basename(Q05))

    def test_first_question_gets_the_right_answer(self):
        server = server_harness.Server(Q05, "--parallel", "1", "--ctx", "2048").start()
        try:
            client = server.openai()
            r = client.chat.completions.create(
                model="qwen2.5-coder", temperature=0, max_tokens=32,
                messages=[{"role": "user", "content": "What is the capital of France?"}])
            answer = r.choices[0].message.content
            self.assertIn("Paris", answer)
            self.assertEqual(r.choices[0].finish_reason, "stop", answer)
        finally:
            self.assertEqual(server.stop(), 0, server.log())

    @unittest.skipUnless(os.path.exists(Q15), f"{Q15} is absent: run scripts/fetch_models.sh")
    def test_the_pair_shares_one_tokenizer(self):
        text = "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)  # <|im_start|> Ünïcödé 東京"
        ids = []
        for model in (Q05, Q15):
            out = subprocess.run([BIN, "tokenize", model, "--text", text, "--add-special"],
                                 capture_output=True, text=True, timeout=120)
            self.assertEqual(out.returncode, 0, out.stderr)
            ids.append(out.stdout.strip())
        self.assertEqual(ids[0], ids[1])
        self.assertGreater(len(ids[0]), 10)


if __name__ == "__main__":
    unittest.main()
