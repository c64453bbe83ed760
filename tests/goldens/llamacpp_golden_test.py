"""larder against llama.cpp on the real models (scripts/fetch_models.sh), from goldens that
llama.cpp's own tools produced (scripts/make_llamacpp_goldens.py; CI never builds llama.cpp).

  * tokenize_{smollm2,gemma3}.json — `llama-tokenize` ids over tokenize_corpus.json (code,
    unicode, emoji, digits, whitespace runs, both models' special-token strings); `larder
    tokenize` must give the same ids, with and without --add-special.
  * ppl_llamacpp.json — `llama-perplexity` on tinyshakespeare (../shared/corpora), fixed context
    and chunk count; `larder eval ppl` with the same text, --ctx and --chunks within 1 %.
  * ppl_f32_reference.json — the same gemma3 runs in exact f32 arithmetic (the GGUF dequantized
    by gguf-py, mlx-lm's gemma3_text; tests/ref/gguf_f32_reference.py): larder within
    F32_REF_TOLERANCE of the model's own value, not only of another int8-activation engine.
  * ppl_larder_gguf_llamacpp.json — `llama-perplexity` on the GGUFs `larder quantize --format
    gguf` writes from SmolLM2-135M-Instruct-hf: larder rebuilds each file (same sha256: the
    writer is deterministic and unchanged) and `larder eval ppl` on it is within 1 %.
  * greedy generation and chat against llama-server: greedy_test.py and chat_greedy_test.py
    (token by token, llama.cpp's and the exact model's log-probabilities at every step).

Skips, naming the folder, when the models were not fetched (LARDER_MODELS_DIR).
"""
import json
import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.environ.get("LARDER_BIN") or os.path.join(HERE, "../../build/bin/larder")
MODELS = os.environ.get("LARDER_MODELS_DIR") or os.path.join(HERE, "../../.cache/models")
SHARED = os.environ.get("LARDER_SHARED_DIR") or os.path.join(HERE, "../../../shared")
PPL_TOLERANCE = 0.01  # relative, issue 12
# larder and llama.cpp both quantize activations to int8 for their integer dot products (larder
# per 32 elements; llama.cpp Q8_0 per 32 and Q8_K per 256), which moves gemma-3-270m's PPL off
# the exact f32 value: llama.cpp by +0.46 % at ctx 1024 x 4 and ctx 512 x 2, larder by +0.35 %
# and -0.07 % (issue 13). llama.cpp's own distance from exact plus room for another kernel tier's
# rounding; the BOS-less stream of issue 13 was 0.74 % off here (and 1.2 % off llama.cpp).
F32_REF_TOLERANCE = 0.006


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


def unsupported(err):
    """larder's refusal of an architecture or tensor type it does not run yet (not a failure of
    this comparison; the case starts running when support lands)."""
    return "is not supported" in err or "cannot execute" in err


class PerplexityVsLlamaCpp(unittest.TestCase):
    ran = {}  # (model, text, ctx, chunks) -> larder's result: both goldens share one run

    def run_ppl(self, run, sub="", tolerance=PPL_TOLERANCE, what="llama-perplexity", kv="f16"):
        # kv: the KV cache type of the run — f16 like llama-perplexity's default for the llama.cpp
        # goldens, f32 against the exact f32 reference.
        model = model_path(run, sub)
        text = os.path.join(SHARED, run["text"])
        key = (model, text, run["ctx"], run["chunks"], kv)
        if key not in self.ran:
            self.ran[key] = larder("eval", "ppl", model, "--text", text, "--ctx", str(run["ctx"]), "--chunks",
                                   str(run["chunks"]), "--kv-dtype", kv, "--json", timeout=900)
        code, out, err = self.ran[key]
        if code != 0 and unsupported(err):
            self.skipTest(f"{run['model']}: larder does not run it yet: {err.strip()}")
        self.assertEqual(code, 0, err)
        got = json.loads(out)
        rel = abs(got["ppl"] - run["ppl"]) / run["ppl"]
        self.assertLessEqual(rel, tolerance, f"{run['model']} ctx {run['ctx']}: larder PPL {got['ppl']:.4f} vs "
                             f"{what} {run['ppl']:.4f} ({100 * rel:.2f} % apart)")

    def test_release_models(self):
        for run in load("ppl_llamacpp.json")["runs"]:
            with self.subTest(model=run["model"], ctx=run["ctx"]):
                self.run_ppl(run)

    def test_larder_written_gguf(self):
        import hashlib
        import tempfile
        golden = load("ppl_larder_gguf_llamacpp.json")
        src = os.path.join(MODELS, golden["source"])
        if not os.path.isdir(src):
            self.skipTest(f"{src} is absent: run scripts/fetch_models.sh (or set LARDER_MODELS_DIR)")
        with tempfile.TemporaryDirectory(prefix="larder-gguf-golden-", dir="/tmp") as d:
            for run in golden["runs"]:
                with self.subTest(type=run["type"]):
                    dst = os.path.join(d, run["model"])
                    code, _, err = larder("quantize", src, dst, "--format", "gguf", "--type", run["type"], timeout=900)
                    self.assertEqual(code, 0, err)
                    with open(dst, "rb") as f:
                        self.assertEqual(hashlib.sha256(f.read()).hexdigest(), run["sha256"],
                                         f"{run['type']}: larder now writes a different file than the one llama.cpp "
                                         "measured; regenerate with scripts/make_llamacpp_goldens.py larder-gguf")
                    self.run_ppl(run, sub=d)  # an absolute `sub` replaces MODELS in os.path.join

    def test_gemma3_vs_exact_f32(self):
        """gemma-3-270m against its exact value. History (issue 13): larder tokenized the text
        without BOS, so every chunk was the text one token later than llama-perplexity's; PPL came
        out 1.2 % (ctx 1024 x 4) to 2.1 % (ctx 384 x 2) below both llama.cpp and this reference,
        while per-position NLLs on identical tokens agreed with the reference (mean difference
        1e-5 nats over 191 positions)."""
        golden = load("ppl_f32_reference.json")
        self.assertGreaterEqual(len(golden["runs"]), 1)
        for run in golden["runs"]:
            with self.subTest(model=run["model"], ctx=run["ctx"]):
                self.run_ppl(run, tolerance=F32_REF_TOLERANCE, what="exact f32 reference", kv="f32")


if __name__ == "__main__":
    unittest.main()
