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


class CacheSafetyTest(unittest.TestCase):
    """Issue 47: `larder cache clear DIR` deleted every file one level inside DIR's subfolders,
    whatever its name (~/.ssh/id_rsa, Documents/thesis.tex), and reported "removed 0 files". A
    cache command deletes only files it can prove are its own, never follows links, and refuses a
    folder that is not a larder cache."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="larder_cache_safety_")
        self.home = os.path.join(self.tmp, "home")
        self.outside = os.path.join(self.tmp, "outside")
        os.makedirs(os.path.join(self.home, ".ssh"))
        os.makedirs(os.path.join(self.home, "Documents"))
        os.makedirs(self.outside)

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def write(self, path, data):
        with open(path, "wb") as f:
            f.write(data)

    def snapshot(self, root):
        """Every path under root (links as links, never followed) with its content."""
        out = {}
        for r, dirs, files in os.walk(root):
            for n in dirs + files:
                p = os.path.join(r, n)
                if os.path.islink(p):
                    out[p] = "link:" + os.readlink(p)
                elif os.path.isfile(p):
                    with open(p, "rb") as f:
                        out[p] = f.read()
                else:
                    out[p] = "dir"
        return out

    def real_cache(self, where):
        code, out, err = run("generate", STORIES, "--prompt", "Once upon a time, there was a little girl",
                             "-n", "4", "--ssd-cache", where)
        self.assertEqual(code, 0, err)
        files = [os.path.join(r, f) for r, _, fs in os.walk(where) for f in fs if f.endswith(".lkv")]
        self.assertTrue(files, "generate --ssd-cache wrote an .lkv file")
        return files

    def foreign_layout(self, valid_lkv):
        self.write(os.path.join(self.home, ".ssh", "id_rsa"), b"KEY")
        self.write(os.path.join(self.home, ".ssh", "authorized_keys"), b"ssh-ed25519 AAAA")
        self.write(os.path.join(self.home, "Documents", "thesis.tex"), b"\\chapter{One}")
        self.write(os.path.join(self.home, "Documents", "fake.lkv"), b"not an LKV1 header at all")
        # Outside the folder: real LKV1 bytes and a temp-like file behind a linked "namespace".
        self.write(os.path.join(self.outside, "f" * 32 + ".lkv"), valid_lkv)
        self.write(os.path.join(self.outside, "e" * 32 + ".lkv.tmp"), bytes(8192))
        os.symlink(self.outside, os.path.join(self.home, "Documents", "base"))

    def test_clear_refuses_a_home_like_folder_and_deletes_nothing(self):
        cache = os.path.join(self.tmp, "cache")
        with open(self.real_cache(cache)[0], "rb") as f:
            self.foreign_layout(f.read())
        before_home, before_out = self.snapshot(self.home), self.snapshot(self.outside)
        for verb in ("clear", "ls", "verify"):
            code, out, err = run("cache", verb, self.home, timeout=30)
            self.assertNotEqual(code, 0, f"cache {verb} of a home folder must fail: {out}")
            self.assertLess(code, 64, err)
            self.assertIn("not a larder cache", err)
        self.assertEqual(self.snapshot(self.home), before_home, "nothing in the folder may change")
        self.assertEqual(self.snapshot(self.outside), before_out, "nothing behind a link may change")
        # --ssd-cache pointed at it is refused too, and changes nothing.
        code, out, err = run("generate", STORIES, "--prompt", "x", "-n", "2", "--ssd-cache", self.home)
        self.assertNotEqual(code, 0)
        self.assertIn("not a larder cache", err)
        self.assertEqual(self.snapshot(self.home), before_home)

    def test_clear_of_a_real_cache_removes_its_files_and_keeps_foreign_ones(self):
        cache = os.path.join(self.tmp, "cache")
        files = self.real_cache(cache)
        with open(files[0], "rb") as f:
            valid = f.read()
        self.foreign_layout(valid)
        ns_dir = os.path.dirname(files[0])
        id_dir = os.path.dirname(ns_dir)
        os.symlink(self.outside, os.path.join(id_dir, "evil"))
        self.write(os.path.join(ns_dir, "fake.lkv"), b"not an LKV1 header at all")
        self.write(os.path.join(ns_dir, "README"), b"mine")
        before_out = self.snapshot(self.outside)
        code, out, err = run("cache", "clear", cache, timeout=30)
        self.assertEqual(code, 0, out + err)
        self.assertRegex(out, r"removed %d files" % len(files))
        self.assertIn("kept 3 entries", out)
        for f in files:
            self.assertFalse(os.path.exists(f), f)
        with open(os.path.join(ns_dir, "fake.lkv"), "rb") as f:
            self.assertEqual(f.read(), b"not an LKV1 header at all")
        self.assertTrue(os.path.islink(os.path.join(id_dir, "evil")))
        self.assertEqual(self.snapshot(self.outside), before_out)
        # The startup scan of the next run leaves the linked folder's target alone too.
        self.real_cache(cache)
        self.assertEqual(self.snapshot(self.outside), before_out)


class InputBoundTest(unittest.TestCase):
    """Issue 47: `generate -f /dev/zero` and `eval ppl -f /dev/zero` read without limit (GBs in
    seconds, no message). What is read is bounded by what the context can hold."""

    def assertBounded(self, args, needle, stdin=subprocess.DEVNULL):
        t0 = __import__("time").monotonic()
        p = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=20, errors="replace", stdin=stdin)
        took = __import__("time").monotonic() - t0
        self.assertNotEqual(p.returncode, 0, p.stderr)
        self.assertLess(p.returncode, 64, p.stderr)
        self.assertIn(needle, p.stderr)
        self.assertIn("not read further", p.stderr)
        self.assertLess(took, 30, f"{args} took {took:.1f}s")
        return p.stderr

    def test_generate_file_and_stdin(self):
        err = self.assertBounded(["generate", STORIES, "-f", "/dev/zero", "-n", "1"], "'/dev/zero' is longer than")
        self.assertIn("context of", err)
        with open("/dev/zero", "rb") as z:
            self.assertBounded(["generate", STORIES, "-n", "1"], "standard input is longer than", stdin=z)
        with open("/dev/zero", "rb") as z:
            self.assertBounded(["generate", STORIES, "--chat", "-n", "1"], "standard input is longer than", stdin=z)

    def test_eval_and_tokenize_and_chat(self):
        self.assertBounded(["eval", "ppl", STORIES, "--text", "/dev/zero"], "'/dev/zero' is longer than")
        self.assertBounded(["eval", "ppl", STORIES, "-f", "/dev/zero", "--ctx", "64", "--chunks", "100000000000"],
                           "'/dev/zero' is longer than")
        self.assertBounded(["tokenize", STORIES, "-f", "/dev/zero"], "'/dev/zero' is longer than")
        with open("/dev/zero", "rb") as z:
            self.assertBounded(["chat", STORIES, "-n", "1"], "longer than", stdin=z)

    def test_text_that_fits_is_still_read(self):
        tmp = tempfile.mkdtemp(prefix="larder_bound_")
        try:
            path = os.path.join(tmp, "p.txt")
            with open(path, "w") as f:
                f.write("Once upon a time\n")
            code, out, err = run("generate", STORIES, "-f", path, "-n", "4", "--temp", "0")
            self.assertEqual(code, 0, err)
            self.assertTrue(out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


class InfoTest(unittest.TestCase):
    def test_info_stories(self):
        code, out, err = run("info", STORIES)
        self.assertEqual(code, 0, err)
        self.assertIn("llama", out)
        self.assertRegex(out, r"layers:\s+5")
        self.assertRegex(out, r"vocab:\s+512")


if __name__ == "__main__":
    unittest.main()
