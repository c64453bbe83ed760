"""Black-box tests of the larder CLI: generate / tokenize / info on real files, and every class
of bad input (missing, truncated, lying or foreign files, bad flags, over-long prompts) giving one
clear message naming the problem and a non-zero exit — never a crash, hang or garbage."""
import json
import os
import shutil
import struct
import subprocess
import tempfile
import unittest

BIN = os.environ["LARDER_BIN"]
SHARED = os.environ["LARDER_SHARED_DIR"]
STORIES = os.path.join(SHARED, "models/stories260K/stories260K.gguf")


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f)


def run(*args, timeout=120):
    p = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=timeout,
                       errors="replace")
    return p.returncode, p.stdout, p.stderr


class BadInputTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="larder_cli_")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def assertCleanFailure(self, args, *needles):
        code, out, err = run(*args)
        self.assertNotEqual(code, 0, f"{args} should fail; stderr: {err}")
        self.assertGreater(code, 0, f"{args} died by a signal ({code}); stderr: {err}")
        self.assertLess(code, 64, f"{args}: exit {code} looks like a crash; stderr: {err}")
        self.assertEqual(out, "", "nothing may be printed to stdout on failure")
        for n in needles:
            self.assertIn(n, err, f"{args}: message should mention {n!r}; got: {err}")
        self.assertNotIn("terminate called", err)
        return err

    def test_missing_model(self):
        self.assertCleanFailure(["generate", os.path.join(self.tmp, "nope.gguf"), "--prompt", "x"], "nope.gguf")

    def test_truncated_gguf(self):
        with open(STORIES, "rb") as f:
            data = f.read()
        for cut in (4, 100, 5000, len(data) // 2, len(data) - 10):
            path = os.path.join(self.tmp, f"cut{cut}.gguf")
            with open(path, "wb") as f:
                f.write(data[:cut])
            self.assertCleanFailure(["generate", path, "--prompt", "x"], path)

    def test_not_a_gguf(self):
        path = os.path.join(self.tmp, "x.gguf")
        with open(path, "wb") as f:
            f.write(b"PK\x03\x04 this is a zip file" * 10)
        self.assertCleanFailure(["info", path], "not a GGUF")

    def test_directory_without_config(self):
        self.assertCleanFailure(["info", self.tmp], "config.json")

    def test_unknown_flag_is_an_error(self):
        code, out, err = run("generate", STORIES, "--prompt", "x", "--tempurature", "1")
        self.assertNotEqual(code, 0)
        self.assertIn("tempurature", err)

    def test_bad_flag_value(self):
        code, out, err = run("generate", STORIES, "--prompt", "x", "-n", "lots")
        self.assertNotEqual(code, 0)
        self.assertIn("lots", err)

    def test_prompt_longer_than_context(self):
        err = self.assertCleanFailure(["generate", STORIES, "--prompt", "Once upon a time " * 200, "--ctx", "64"],
                                      "context")

    def test_hf_dir_with_lying_safetensors(self):
        d = os.path.join(self.tmp, "model")
        os.makedirs(d)
        shutil.copy(os.path.join(SHARED, "tokenizers/hf/llama2/tokenizer.json"), d)
        write_json(os.path.join(d, "config.json"),
                   {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
                    "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4,
                    "num_key_value_heads": 4, "vocab_size": 32000, "rms_norm_eps": 1e-5,
                    "max_position_embeddings": 128})
        header = json.dumps({"model.embed_tokens.weight": {"dtype": "F32", "shape": [32000, 64],
                                                            "data_offsets": [0, 32000 * 64 * 4]}}).encode()
        with open(os.path.join(d, "model.safetensors"), "wb") as f:
            f.write(struct.pack("<Q", len(header)) + header + b"\0" * 1000)
        self.assertCleanFailure(["generate", d, "--prompt", "x"], "model.safetensors", "exceeds")

    def test_unknown_architecture(self):
        d = os.path.join(self.tmp, "model")
        os.makedirs(d)
        shutil.copy(os.path.join(SHARED, "tokenizers/hf/llama2/tokenizer.json"), d)
        write_json(os.path.join(d, "config.json"), {"model_type": "frobnicator", "architectures": ["FrobForCausalLM"]})
        header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
        with open(os.path.join(d, "model.safetensors"), "wb") as f:
            f.write(struct.pack("<Q", len(header)) + header + b"\0" * 4)
        self.assertCleanFailure(["info", d], "frobnicator")


class TokenizeTest(unittest.TestCase):
    def test_tokenizer_only_directory_matches_hf(self):
        from tokenizers import Tokenizer
        for name in ("llama3", "qwen3", "llama2"):
            d = os.path.join(SHARED, "tokenizers/hf", name)
            ref = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
            for text in ("Hello world", "  spaced\ttabs\n\nnewlines", "<|im_start|>user\nhi<|im_end|>", "数字 12345 😀"):
                for special in (False, True):
                    args = ["tokenize", d, "--text", text] + (["--add-special"] if special else [])
                    code, out, err = run(*args)
                    self.assertEqual(code, 0, err)
                    self.assertEqual(json.loads(out), ref.encode(text, add_special_tokens=special).ids,
                                     f"{name} {text!r} special={special}")

    def test_gguf_stories(self):
        code, out, err = run("tokenize", STORIES, "--text", "Once upon a time", "--add-special")
        self.assertEqual(code, 0, err)
        self.assertEqual(json.loads(out), [1, 403, 407, 261, 378])  # published with the model (shared/README.md)


class GenerateTest(unittest.TestCase):
    """stories260K greedy generation through the whole CLI path (GGUF tokenizer, model, sampler,
    streaming detokenizer) equals llama2.c's run.c, as reproduced by the independent numpy port in
    tests/ref/llama2c_reference.py (which itself checks llama2.c's documented test_all.py text)."""

    def reference(self):
        path = os.path.join(os.environ["LARDER_TEST_DATA_DIR"], "llama2c", "stories260K_greedy.json")
        with open(path) as f:
            return json.load(f)

    def test_from_bos_matches_llama2c(self):
        ref = self.reference()
        n = len(ref["bos"]) - 1  # the reference ids start with BOS
        code, out, err = run("generate", STORIES, "--prompt", "", "-n", str(n))
        self.assertEqual(code, 0, err)
        self.assertEqual(out.strip(), ref["bos_text"].strip())
        self.assertIn("tok/s", err)  # speed is reported on stderr, never on stdout

    def test_prompt_continuation_only_on_stdout(self):
        code, out, err = run("generate", STORIES, "--prompt", "Once upon a time", "-n", "12")
        self.assertEqual(code, 0, err)
        self.assertTrue(out.startswith(", there was a little girl named Lily."), out)

    def test_stop_string_is_never_printed(self):
        code, out, err = run("generate", STORIES, "--prompt", "", "-n", "100", "--stop", "Lily")
        self.assertEqual(code, 0, err)
        self.assertEqual(out.strip(), "Once upon a time, there was a little girl named")

    def test_same_seed_same_text(self):
        args = ["generate", STORIES, "--prompt", "Once", "-n", "40", "--temp", "1.0", "--top-p", "0.9", "--seed", "7"]
        a, b = run(*args), run(*args)
        self.assertEqual(a[0], 0, a[2])
        self.assertEqual(a[1], b[1])
        c = run(*args[:-1], "8")
        self.assertNotEqual(a[1], c[1], "a different seed should give a different sample")


class SsdCacheTest(unittest.TestCase):
    """`generate --ssd-cache`: a second process (a restart) starts from the prefix the first one
    left on disk, and its greedy output equals the cold run token for token."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="larder_kv_")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_restart_reuses_prefix_and_output_is_unchanged(self):
        prompt = "Once upon a time, there was a little girl named Lily. She loved to play outside"
        cold = run("generate", STORIES, "--prompt", prompt, "-n", "40")
        self.assertEqual(cold[0], 0, cold[2])
        first = run("generate", STORIES, "--prompt", prompt, "-n", "40", "--ssd-cache", self.tmp)
        self.assertEqual(first[0], 0, first[2])
        self.assertIn("reused 0 of", first[2])
        self.assertEqual(first[1], cold[1])
        second = run("generate", STORIES, "--prompt", prompt, "-n", "40", "--ssd-cache", self.tmp)
        self.assertEqual(second[0], 0, second[2])
        self.assertRegex(second[2], r"reused [1-9][0-9]* of [0-9]+ prompt tokens from ssd")
        self.assertEqual(second[1], cold[1], "an SSD hit must not change greedy output")
        # A longer prompt sharing the prefix reuses it too, and still matches its own cold run.
        longer = prompt + " in the park"
        cold2 = run("generate", STORIES, "--prompt", longer, "-n", "30")
        hit2 = run("generate", STORIES, "--prompt", longer, "-n", "30", "--ssd-cache", self.tmp)
        self.assertEqual(hit2[0], 0, hit2[2])
        self.assertRegex(hit2[2], r"reused [1-9][0-9]* of")
        self.assertEqual(hit2[1], cold2[1])

        code, out, err = run("cache", "ls", self.tmp)
        self.assertEqual(code, 0, err)
        self.assertIn(".lkv", out)
        code, out, err = run("cache", "verify", self.tmp)
        self.assertEqual(code, 0, out + err)
        self.assertIn("ok", out)
        # A bit-flipped file is reported by verify and is a clean miss for generate.
        files = [os.path.join(r, f) for r, _, fs in os.walk(self.tmp) for f in fs if f.endswith(".lkv")]
        self.assertTrue(files)
        for path in files:
            with open(path, "r+b") as f:
                f.seek(os.path.getsize(path) - 100)
                b = f.read(1)
                f.seek(-1, 1)
                f.write(bytes([b[0] ^ 0x10]))
        code, out, err = run("cache", "verify", self.tmp)
        self.assertNotEqual(code, 0)
        self.assertIn("BAD", out)
        again = run("generate", STORIES, "--prompt", prompt, "-n", "40", "--ssd-cache", self.tmp)
        self.assertEqual(again[0], 0, again[2])
        self.assertEqual(again[1], cold[1], "a corrupt cache file must never change the output")
        code, out, err = run("cache", "clear", self.tmp)
        self.assertEqual(code, 0, err)
        self.assertIn("removed", out)


class InfoTest(unittest.TestCase):
    def test_info_stories(self):
        code, out, err = run("info", STORIES)
        self.assertEqual(code, 0, err)
        self.assertIn("llama", out)
        self.assertRegex(out, r"layers:\s+5")
        self.assertRegex(out, r"vocab:\s+512")


if __name__ == "__main__":
    unittest.main()
