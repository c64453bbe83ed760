"""One model resolver for every verb (issue 17, items 3-5): a .gguf path, an HF directory, a
folder of GGUFs (the only one is taken and named; several are listed and the command refuses),
a repo id in the local Hugging Face cache, `repo:QUANT` / `dir:QUANT`, `-hf REPO[:QUANT]` (read
as one flag, not `-h -f`), llama.cpp's `-m`, and FIFOs/devices refused before they are opened."""
import os
import shutil
import subprocess
import tempfile
import time
import unittest

import json

from cli_models import BIN, STORIES, TINY_RANDOM, Serve, fake_hub, hub_env, run

STORY_OPENING = ", there was a little girl named Lily."


class ResolverTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="larder_resolver_")
        # A folder of one GGUF, a folder of two (named like a quantized repo), and a hub cache.
        self.one = os.path.join(self.tmp, "one")
        os.makedirs(self.one)
        shutil.copyfile(STORIES, os.path.join(self.one, "stories260K.gguf"))
        self.two = os.path.join(self.tmp, "two")
        os.makedirs(self.two)
        shutil.copyfile(TINY_RANDOM, os.path.join(self.two, "Stories-Q4_0.gguf"))  # sorts first
        shutil.copyfile(STORIES, os.path.join(self.two, "Stories-Q8_0.gguf"))
        shutil.copyfile(STORIES, os.path.join(self.two, "mmproj-Stories-f16.gguf"))  # never a candidate
        self.hub = fake_hub(self.tmp, "acme/stories-GGUF", {"Stories-Q4_0.gguf": TINY_RANDOM,
                                                            "Stories-Q8_0.gguf": STORIES,
                                                            "README.md": __file__})
        fake_hub(self.tmp, "acme/stories-single", {"stories260K.gguf": STORIES})
        self.env = hub_env(self.hub)

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def gen(self, *args, env=None):
        return run("generate", *args, "-p", "Once upon a time", "-n", "12", "--temp", "0", env=env or self.env)

    def assertStory(self, res, what):
        code, out, err = res
        self.assertEqual(code, 0, f"{what}: {err}")
        self.assertTrue(out.startswith(STORY_OPENING), f"{what}: {out!r}")
        return err

    # item 4 -------------------------------------------------------------------------------
    def test_folder_with_one_gguf_takes_it_and_says_which(self):
        err = self.assertStory(self.gen(self.one), "generate DIR")
        self.assertIn("stories260K.gguf", err, "say which GGUF was taken")
        code, out, err = run("info", self.one)
        self.assertEqual(code, 0, err)
        self.assertRegex(out, r"vocab:\s+512")

    def test_folder_with_several_ggufs_asks_to_choose(self):
        code, out, err = self.gen(self.two)
        self.assertNotEqual(code, 0, "two GGUFs: the command must not guess")
        self.assertLess(code, 64, err)
        self.assertIn("Stories-Q4_0.gguf", err)
        self.assertIn("Stories-Q8_0.gguf", err)
        self.assertNotIn("mmproj", err, "a vision projector is not a model to choose")
        self.assertIn(":QUANT", err, "say how to choose")
        self.assertEqual(out, "")

    def test_dir_colon_quant_picks_one(self):
        err = self.assertStory(self.gen(self.two + ":Q8_0"), "DIR:Q8_0")
        self.assertIn("Stories-Q8_0.gguf", err)
        err = self.assertStory(self.gen(self.two + ":q8_0"), "case-insensitive")
        # The whole file name works too; an unknown quantization lists what there is.
        self.assertStory(self.gen(self.two + ":Stories-Q8_0.gguf"), "DIR:FILE")
        code, out, err = self.gen(self.two + ":Q5_K_M")
        self.assertNotEqual(code, 0)
        self.assertIn("Q5_K_M", err)
        self.assertIn("Stories-Q8_0.gguf", err)

    def test_hf_snapshot_with_two_ggufs_is_not_first_in_directory_order(self):
        # serve used to take the first file of the snapshot; it must ask instead (and exit).
        p = subprocess.Popen([BIN, "serve", "acme/stories-GGUF", "--port", "0"], env=self.env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            self.fail("serve kept running with an ambiguous snapshot of two GGUFs")
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("Stories-Q4_0.gguf", err)
        self.assertIn("Stories-Q8_0.gguf", err)
        self.assertIn("acme/stories-GGUF:QUANT", err)

    # item 5 -------------------------------------------------------------------------------
    def test_repo_id_and_quant_for_every_verb(self):
        repo = "acme/stories-GGUF:Q8_0"
        err = self.assertStory(self.gen(repo), "generate REPO:QUANT")
        self.assertIn("Stories-Q8_0.gguf", err)
        self.assertStory(self.gen("acme/stories-single"), "generate REPO")
        code, out, err = run("info", repo, env=self.env)
        self.assertEqual(code, 0, err)
        self.assertRegex(out, r"vocab:\s+512")
        code, out, err = run("tokenize", repo, "--text", "Once upon a time", "--add-special", env=self.env)
        self.assertEqual(code, 0, err)
        self.assertEqual(out.strip(), "[1, 403, 407, 261, 378]")
        code, out, err = run("bench", repo, "-p", "8", "-n", "4", "-r", "1", "--no-roofline", env=self.env)
        self.assertEqual(code, 0, err)
        self.assertIn("tg4", out)
        text = os.path.join(self.tmp, "text.txt")
        with open(text, "w") as f:
            f.write("Once upon a time, there was a little girl named Lily. She loved to play outside. " * 8)
        code, out, err = run("eval", "ppl", repo, "--text", text, "-c", "64", env=self.env)
        self.assertEqual(code, 0, err)
        self.assertIn("PPL", out.upper())
        code, out, err = run("eval", "kl", repo, "acme/stories-single", "--text", text, "-c", "64", "--no-sanity",
                             env=self.env)
        self.assertEqual(code, 0, err)
        code, out, err = run("chat", repo, "-n", "4", input="hello\n", env=self.env)
        self.assertNotIn("no such file", err)
        self.assertEqual(code, 0, err)
        self.assertIn("has no chat template", err, "stories has none: the resolver found it, chat falls back to ChatML")
        self.assertIn("Stories-Q8_0.gguf", err)

    def test_quantize_takes_a_repo_id(self):
        src = os.path.join(self.tmp, "hf-src")
        subprocess.run([os.sys.executable, os.path.join(os.environ["LARDER_SOURCE_DIR"], "tests/server/tiny_model.py"),
                        src, "--shared", os.environ["LARDER_SHARED_DIR"]], check=True, capture_output=True)
        hub = fake_hub(self.tmp, "acme/tiny-hf", {name: os.path.join(src, name) for name in os.listdir(src)})
        dst = os.path.join(self.tmp, "q8")
        code, out, err = run("quantize", "acme/tiny-hf", dst, "--bits", "8", env=hub_env(hub), timeout=300)
        self.assertEqual(code, 0, err)
        self.assertTrue(os.path.exists(os.path.join(dst, "config.json")))

    def test_served_model_ids(self):
        # The id /v1/models shows: a repo id, the GGUF's name, a directory's name.
        hfdir = os.path.join(self.tmp, "my-model")
        os.makedirs(hfdir)
        shutil.copyfile(STORIES, os.path.join(hfdir, "stories260K.gguf"))
        for spec, want in (("acme/stories-single", "acme/stories-single"),
                           ("acme/stories-GGUF:Q8_0", "acme/stories-GGUF:Q8_0"),
                           (STORIES, "stories260K"), (self.one, "stories260K")):
            s = Serve(spec, env=self.env)
            try:
                status, body = s.get("/v1/models")
                self.assertEqual(status, 200)
                self.assertEqual(json.loads(body)["data"][0]["id"], want, spec)
            finally:
                s.stop()

    def test_repo_missing_from_cache_says_so(self):
        code, out, err = run("info", "acme/not-downloaded", env=self.env)
        self.assertEqual(code, 3, err)
        self.assertIn("not in the local Hugging Face cache", err)
        self.assertIn("larder pull acme/not-downloaded", err)
        self.assertIn(self.hub, err)

    # item 3 and llama.cpp habits ------------------------------------------------------------
    def test_dash_hf_is_one_flag_for_serve(self):
        code, out, err = run("serve", "-hf", "acme/not-downloaded", "--port", "0", env=self.env, timeout=30)
        self.assertNotIn("Usage", out, "-hf must not be read as -h -f (the help)")
        self.assertNotEqual(code, 0, "a repo that is not in the cache cannot be served")
        self.assertIn("not in the local Hugging Face cache", err)
        self.assertIn("larder pull acme/not-downloaded", err, "say how to fetch it")

    def test_dash_hf_with_quant_runs(self):
        err = self.assertStory(self.gen("-hf", "acme/stories-GGUF:Q8_0"), "-hf REPO:QUANT")
        self.assertIn("Stories-Q8_0.gguf", err)
        self.assertStory(self.gen("--hf-repo", "acme/stories-single"), "--hf-repo REPO")
        code, out, err = run("info", "-hf", self.one, env=self.env)
        self.assertNotEqual(code, 0, "-hf takes a repo id, not a path")
        self.assertIn("repo id", err)

    def test_llamacpp_aliases(self):
        ref = self.gen(STORIES)
        self.assertStory(ref, "positional")
        self.assertEqual(self.gen("-m", STORIES)[1], ref[1], "-m MODEL")
        self.assertEqual(self.gen("--model", STORIES)[1], ref[1], "--model MODEL")
        prompt = os.path.join(self.tmp, "prompt.txt")
        with open(prompt, "w") as f:
            f.write("Once upon a time\n")  # llama.cpp drops one final newline of a prompt file
        code, out, err = run("generate", "-m", STORIES, "-f", prompt, "--n-predict", "12", "--ctx-size", "256",
                             "--temp", "0", "--jinja", "-ngl", "99")
        self.assertEqual(code, 0, err)
        self.assertEqual(out, ref[1])
        self.assertIn("CPU", err, "-ngl is accepted with a note that larder runs on the CPU")
        # --no-mmap (llama.cpp's): the weights are read into memory instead of mapped; same tokens.
        self.assertEqual(self.gen(STORIES, "--no-mmap")[1], ref[1], "--no-mmap")
        code, out, err = run("generate", STORIES, "-m", STORIES, "-p", "x")
        self.assertNotEqual(code, 0, "two models given")
        # -c/--ctx-size wherever there is a context; -n/--n-predict on serve's default.
        for verb in (["generate", STORIES], ["chat", STORIES], ["serve"], ["eval", "ppl", STORIES]):
            code, out, err = run(*verb, "--help")
            self.assertEqual(code, 0, err)
            self.assertIn("--ctx-size", out, verb)
            self.assertIn("-m,--model", out, verb)
            self.assertIn("--n-gpu-layers", out, verb)
            self.assertIn("--no-mmap", out, verb)

    # bad paths ----------------------------------------------------------------------------
    def test_fifo_and_devices_are_refused_not_opened(self):
        fifo = os.path.join(self.tmp, "model.gguf")
        os.mkfifo(fifo)
        for verb in ("info", "generate", "tokenize"):
            start = time.monotonic()
            try:
                code, out, err = run(verb, fifo, "--text" if verb == "tokenize" else "-p", "x", timeout=20) \
                    if verb != "info" else run(verb, fifo, timeout=20)
            except subprocess.TimeoutExpired:
                self.fail(f"larder {verb} blocked opening a FIFO")
            self.assertNotEqual(code, 0)
            self.assertIn("FIFO", err)
            self.assertLess(time.monotonic() - start, 15)
        code, out, err = run("info", "/dev/null", timeout=20)
        self.assertNotEqual(code, 0)
        self.assertIn("character device", err)
        # A FIFO among the GGUFs of a folder is never a candidate (and never opened).
        os.mkfifo(os.path.join(self.one, "zz.gguf"))
        self.assertStory(self.gen(self.one), "folder with a FIFO beside its GGUF")

    def test_empty_folder_names_what_is_missing(self):
        empty = os.path.join(self.tmp, "empty")
        os.makedirs(empty)
        code, out, err = run("generate", empty, "-p", "x")
        self.assertNotEqual(code, 0)
        self.assertIn("config.json", err)
        self.assertIn(".gguf", err)


if __name__ == "__main__":
    unittest.main()
