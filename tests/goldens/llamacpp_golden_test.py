"""larder against llama.cpp on the real models (scripts/fetch_models.sh), from goldens that
llama.cpp's own tools produced (scripts/make_llamacpp_goldens.py; CI never builds llama.cpp).

  * tokenize_{smollm2,gemma3}.json — `llama-tokenize` ids over tokenize_corpus.json (code,
    unicode, emoji, digits, whitespace runs, both models' special-token strings); `larder
    tokenize` must give the same ids, with and without --add-special.

Skips, naming the folder, when the models were not fetched (LARDER_MODELS_DIR).
"""
import json
import os
import subprocess
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.environ.get("LARDER_BIN") or os.path.join(HERE, "../../build/bin/larder")
MODELS = os.environ.get("LARDER_MODELS_DIR") or os.path.join(HERE, "../../.cache/models")


def load(name):
    with open(os.path.join(HERE, name), encoding="utf-8") as f:
        return json.load(f)


def model_path(golden, sub=""):
    path = os.path.join(MODELS, sub, golden["model"])
    if not os.path.exists(path):
        raise unittest.SkipTest(f"{path} is absent: run scripts/fetch_models.sh (or set LARDER_MODELS_DIR)")
    return path


def larder(*args, timeout=300):
    p = subprocess.run([BIN, *args], capture_output=True, timeout=timeout)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


class TokenizeVsLlamaCpp(unittest.TestCase):
    def check(self, key):
        golden = load(f"tokenize_{key}.json")
        model = model_path(golden)
        self.assertGreaterEqual(len(golden["cases"]), 30)
        for i, case in enumerate(golden["cases"]):
            with self.subTest(case=i, text=case["text"][:40], add_special=case["add_special"]):
                args = ["tokenize", model, "--text", case["text"]] + (["--add-special"] if case["add_special"] else [])
                code, out, err = larder(*args)
                self.assertEqual(code, 0, err)
                self.assertEqual(json.loads(out), case["ids"], f"larder tokenize vs llama-tokenize on {case['text']!r}")

    def test_smollm2(self):
        self.check("smollm2")

    def test_gemma3(self):
        self.check("gemma3")


if __name__ == "__main__":
    unittest.main()
