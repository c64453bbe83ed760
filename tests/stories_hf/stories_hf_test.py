#!/usr/bin/env python3
"""scripts/stories260k_to_hf.py: the real stories260K model as a Hugging Face Llama directory.

Converts the GGUF into <testdata>/stories260k-hf (CTest fixture `stories_hf`: later tests may load
it) and checks the result against references that do not share code with the converter:
  1. tokenizer.json under HF `tokenizers` gives the ids larder's GGUF (SentencePiece) tokenizer
     gives, on ~200 tinyshakespeare lines and edge strings, and decodes back to the text;
  2. mlx-lm's teacher-forced logits (CPU, f32) on a 64-token sequence equal those of the numpy
     port of llama2.c's run.c (tests/ref/llama2c_reference.py) reading the *original*
     stories260K.bin, to 1e-4 of max|logit| — this is what catches a wrong q/k row order;
  3. `larder generate` greedy from "Once upon a time" prints the same text on the directory as
     on the GGUF, and that text is the numpy oracle's greedy continuation;
  4. --dtype bf16 writes round-to-nearest-even bf16 (as MLX casts) that mlx-lm runs;
  5. an existing OUT_DIR is refused and a failed run leaves nothing behind.
Run with LARDER_BIN, LARDER_SHARED_DIR, LARDER_SOURCE_DIR, LARDER_TEST_DATA_DIR set (CTest does).
"""
import json
import os
import shutil
import subprocess
import sys
import unittest
from concurrent.futures import ThreadPoolExecutor

import numpy as np

BIN = os.environ["LARDER_BIN"]
SHARED = os.environ["LARDER_SHARED_DIR"]
SRC = os.environ["LARDER_SOURCE_DIR"]
DATA = os.environ["LARDER_TEST_DATA_DIR"]
OUT = os.path.join(DATA, "stories260k-hf")
OUT_BF16 = os.path.join(DATA, "stories260k-hf-bf16")
MODEL_DIR = os.path.join(SHARED, "models", "stories260K")
GGUF = os.path.join(MODEL_DIR, "stories260K.gguf")
SCRIPT = os.path.join(SRC, "scripts", "stories260k_to_hf.py")

sys.path.insert(0, os.path.join(SRC, "tests", "ref"))
import llama2c_reference  # noqa: E402  (numpy port of run.c, reads stories260K.bin)

EDGE = [
    "", " ", "  two leading spaces", "trailing space ", "   ", "a", "\n", "line one\nline two\n\n",
    "tabs\tand\ttabs", "digits 0123456789 and 3.14159, 1,000,000", "2024-12-02 19:40 UTC",
    "unicode: héllo wörld — “quoted” ‘single’ … naïve café", "日本語のテキスト", "emoji 🤖🐈‍⬛ end",
    "Ünïcödé ÅØß", "mixed\u00a0nbsp and\u200ahair space", "▁already▁metaspace", "<0x41> looks like a byte piece",
    "Once upon a time, there was a little girl named Lily.", "She said, \"I can't find it!\"",
]
# Special-token strings are recognized inside text by both tokenizers (ids only, no round trip).
SPECIAL = ["<s>", "a</s>b", "<unk> x", "Lily<s> went</s>"]


def run(args, check=True):
    p = subprocess.run(args, capture_output=True, text=True, timeout=120)
    if check and p.returncode != 0:
        raise AssertionError(f"{args[:3]} failed ({p.returncode}): {p.stderr}")
    return p


def corpus_lines(n=200):
    with open(os.path.join(SHARED, "corpora", "tinyshakespeare.txt"), encoding="utf-8") as f:
        lines = f.read().split("\n")
    step = max(1, len(lines) // n)  # spread over the play, not just its first scene
    return lines[::step][:n]


def larder_ids(model, text, add_special=False):
    args = [BIN, "tokenize", model, "--text", text] + (["--add-special"] if add_special else [])
    return json.loads(run(args).stdout)


class StoriesHf(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        for d in (OUT, OUT + ".partial"):
            shutil.rmtree(d, ignore_errors=True)
        run([sys.executable, SCRIPT, OUT, "--gguf", GGUF, "--dtype", "f32"])
        from tokenizers import Tokenizer

        cls.tok = Tokenizer.from_file(os.path.join(OUT, "tokenizer.json"))

    def test_files_and_config(self):
        self.assertEqual(sorted(os.listdir(OUT)),
                         ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"])
        with open(os.path.join(OUT, "config.json")) as f:
            c = json.load(f)
        # stories260K's own header (run.c format), read independently of the GGUF.
        cfg, _ = llama2c_reference.load_checkpoint(os.path.join(MODEL_DIR, "stories260K.bin"))
        self.assertEqual(c["architectures"], ["LlamaForCausalLM"])
        self.assertEqual(c["model_type"], "llama")
        self.assertEqual((c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["num_attention_heads"],
                          c["num_key_value_heads"], c["head_dim"], c["vocab_size"]),
                         (cfg["dim"], cfg["hidden"], cfg["n_layers"], cfg["n_heads"], cfg["n_kv_heads"], cfg["head"],
                          cfg["vocab"]))
        self.assertEqual((c["rms_norm_eps"], c["rope_theta"], c["bos_token_id"], c["eos_token_id"]), (1e-5, 10000.0, 1, 2))
        # The GGUF stores output.weight separately, so the directory does too.
        self.assertFalse(c["tie_word_embeddings"])
        self.assertEqual(c["torch_dtype"], "float32")
        with open(os.path.join(OUT, "tokenizer_config.json")) as f:
            tc = json.load(f)
        self.assertEqual((tc["bos_token"], tc["eos_token"], tc["add_bos_token"]), ("<s>", "</s>", True))

    def test_tokenizer_matches_larder_gguf_tokenizer(self):
        texts = corpus_lines() + EDGE + SPECIAL
        with ThreadPoolExecutor(2) as ex:
            want = list(ex.map(lambda t: larder_ids(GGUF, t), texts))
        for text, ids in zip(texts, want):
            self.assertEqual(self.tok.encode(text, add_special_tokens=False).ids, ids, repr(text))
        # Many lines at once (newlines inside one text), and BOS from the post-processor.
        block = "\n".join(corpus_lines(60))
        self.assertEqual(self.tok.encode(block).ids, larder_ids(GGUF, block, add_special=True))
        self.assertEqual(self.tok.encode("").ids, larder_ids(GGUF, "", add_special=True))
        # larder's own HF tokenizer.json path reads the file the same way.
        for text in EDGE[:6] + [block]:
            self.assertEqual(larder_ids(OUT, text, add_special=True), larder_ids(GGUF, text, add_special=True), repr(text))

    def test_decode_round_trip(self):
        # U+2581 typed in the text decodes as a space (as in SentencePiece): no round trip for it.
        for text in corpus_lines() + [e for e in EDGE if "\u2581" not in e]:
            ids = self.tok.encode(text, add_special_tokens=False).ids
            self.assertEqual(self.tok.decode(ids, skip_special_tokens=False), text, repr(text))
        ids = self.tok.encode("Once upon a time").ids
        self.assertEqual(ids[0], 1)
        self.assertEqual(self.tok.decode(ids, skip_special_tokens=True), "Once upon a time")

    def sequence(self):
        ids = [1]
        for line in corpus_lines(40):
            ids += self.tok.encode(line + "\n", add_special_tokens=False).ids
        return ids[:64]

    def mlx_logits(self, path, ids):
        import mlx.core as mx
        from mlx_lm import load

        mx.set_default_device(mx.cpu)
        model, _ = load(path)
        out = model(mx.array([ids]))[0].astype(mx.float32)
        return np.array(out)

    def test_mlx_logits_match_llama2c_reference(self):
        ids = self.sequence()
        self.assertEqual(len(ids), 64)
        cfg, w = llama2c_reference.load_checkpoint(os.path.join(MODEL_DIR, "stories260K.bin"))
        t = llama2c_reference.Transformer(cfg, w)
        ref = np.stack([t.forward(tok, pos) for pos, tok in enumerate(ids)])
        got = self.mlx_logits(OUT, ids)
        self.assertEqual(got.shape, ref.shape)
        err = float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))
        self.assertLess(err, 1e-4, f"max |mlx - llama2.c| / max|logit| = {err:.3g}")
        # Not vacuous: the model predicts this text (greedy agrees with the reference somewhere).
        self.assertTrue(np.array_equal(got.argmax(-1), ref.argmax(-1)))

    def test_larder_generate_same_on_directory_and_gguf(self):
        flags = ["-p", "Once upon a time", "-n", "40", "--temp", "0", "-t", "1"]
        on_gguf = run([BIN, "generate", GGUF] + flags).stdout
        on_dir = run([BIN, "generate", OUT] + flags).stdout
        self.assertEqual(on_dir, on_gguf)
        # Both are run.c's greedy continuation (numpy oracle on the .bin, decoded by tokenizer.json).
        cfg, w = llama2c_reference.load_checkpoint(os.path.join(MODEL_DIR, "stories260K.bin"))
        prompt = llama2c_reference.PROMPT
        # generate() counts positions and keeps the first token: prompt + 40 ids.
        seq = llama2c_reference.generate(cfg, w, prompt, len(prompt) + 39)
        self.assertEqual(len(seq), len(prompt) + 40)
        text = self.tok.decode(seq, skip_special_tokens=True)
        self.assertTrue(text.startswith("Once upon a time"), text)
        self.assertEqual(on_dir, text[len("Once upon a time"):] + "\n")

    def test_bf16(self):
        import mlx.core as mx

        shutil.rmtree(OUT_BF16, ignore_errors=True)
        run([sys.executable, SCRIPT, OUT_BF16, "--gguf", GGUF, "--dtype", "bf16"])
        with open(os.path.join(OUT_BF16, "config.json")) as f:
            self.assertEqual(json.load(f)["torch_dtype"], "bfloat16")
        f32 = mx.load(os.path.join(OUT, "model.safetensors"))
        bf16 = mx.load(os.path.join(OUT_BF16, "model.safetensors"))
        self.assertEqual(sorted(f32), sorted(bf16))
        for name, a in f32.items():
            self.assertEqual(bf16[name].dtype, mx.bfloat16, name)
            want = np.array(a.astype(mx.bfloat16).view(mx.uint16))
            self.assertTrue(np.array_equal(np.array(bf16[name].view(mx.uint16)), want), name)
        ids = self.sequence()
        ref, got = self.mlx_logits(OUT, ids), self.mlx_logits(OUT_BF16, ids)
        err = float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))
        self.assertLess(err, 0.05, f"bf16 vs f32 logits: {err:.3g} of max|logit|")
        shutil.rmtree(OUT_BF16, ignore_errors=True)

    def test_refuses_existing_and_cleans_up_failures(self):
        before = os.listdir(OUT)
        p = run([sys.executable, SCRIPT, OUT, "--gguf", GGUF], check=False)
        self.assertEqual(p.returncode, 1)
        self.assertTrue(p.stderr.startswith("[stories260k_to_hf] ") and "already exists" in p.stderr, p.stderr)
        self.assertEqual(os.listdir(OUT), before)
        missing = os.path.join(DATA, "stories260k-hf-missing")
        p = run([sys.executable, SCRIPT, missing, "--gguf", os.path.join(DATA, "no-such.gguf")], check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("no-such.gguf", p.stderr)
        self.assertFalse(os.path.exists(missing) or os.path.exists(missing + ".partial"))


if __name__ == "__main__":
    unittest.main()
