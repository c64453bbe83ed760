"""`larder pull / ls / rm` against a fake Hugging Face Hub on loopback (fake_hub.py), with
huggingface_hub itself as the oracle of the cache layout: what larder writes must be a cache hit
for hf_hub_download(local_files_only=True) and scan_cache_dir, and must equal, file for file and
link for link, what huggingface_hub writes when it downloads the same files from the same hub.
No network: HF_ENDPOINT points at the fake hub.
"""
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "server"))
from fake_hub import FakeHub, Repo  # noqa: E402

LARDER = os.environ.get("LARDER_BIN", "larder")
SHARED = os.environ.get("LARDER_SHARED_DIR", "../../../shared")
PYTHON = sys.executable


def read(p):
    with open(p, "rb") as f:
        return f.read()


def tiny_hf_files(tmp):
    """A small real Llama checkpoint (random weights, real tokenizer) as {name: bytes}."""
    import tiny_model
    d = os.path.join(tmp, "tiny")
    tiny_model.make_chat_model(d, SHARED)
    files = {n: read(os.path.join(d, n)) for n in os.listdir(d)}
    files["README.md"] = b"# tiny\n"
    files["pytorch_model.bin"] = b"not wanted" * 10
    return files


class HubTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="larder-hub-")
        cls.hf_files = tiny_hf_files(cls.tmp)
        gguf = read(os.path.join(SHARED, "models", "llama-2-tiny-random", "llama-2-tiny-random.gguf"))
        stories = read(os.path.join(SHARED, "models", "stories260K", "stories260K.gguf"))
        cls.gguf_files = {
            "tiny-Q4_K_M.gguf": gguf,
            "tiny-Q8_0.gguf": stories,
            "tiny-Q4_K_S.gguf": stories[: len(stories) // 2],
            "mmproj-tiny-f16.gguf": b"x" * 100,
            "Q6_K/tiny-Q6_K-00001-of-00002.gguf": gguf[:1000],
            "Q6_K/tiny-Q6_K-00002-of-00002.gguf": gguf[1000:2000],
            "README.md": b"# gguf\n",
        }

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def setUp(self):
        self.hub = FakeHub()
        self.hub.add("larder-test/tiny", Repo(self.hf_files))
        self.hub.add("larder-test/tiny-GGUF", Repo(self.gguf_files))
        self.cache = tempfile.mkdtemp(prefix="cache-", dir=self.tmp)

    def tearDown(self):
        self.hub.close()
        shutil.rmtree(self.cache, ignore_errors=True)

    def env(self, **extra):
        e = dict(os.environ)
        for k in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "HF_HOME"):
            e.pop(k, None)
        e.update(HF_ENDPOINT=self.hub.url, HF_HUB_CACHE=self.cache, HF_HOME=os.path.join(self.cache, "home"),
                 LARDER_PROGRESS="plain")
        e.update(extra)
        return e

    def larder(self, *args, limit_fsize=None, **env):
        def pre():
            if limit_fsize is not None:
                resource.setrlimit(resource.RLIMIT_FSIZE, (limit_fsize, resource.RLIM_INFINITY))
        return subprocess.run([LARDER, *args], capture_output=True, text=True, env=self.env(**env),
                              stdin=subprocess.DEVNULL, timeout=120, preexec_fn=pre)

    def pull_ok(self, *args, **env):
        r = self.larder("pull", *args, **env)
        self.assertEqual(r.returncode, 0, r.stderr)
        return r

    def hf_python(self, code, offline=True, cache=None):
        env = self.env(HF_HUB_CACHE=cache or self.cache)
        if offline:
            env["HF_HUB_OFFLINE"] = "1"
        r = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, env=env, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        return json.loads(r.stdout.strip().splitlines()[-1])

    def repo_dir(self, repo, cache=None):
        return os.path.join(cache or self.cache, "models--" + repo.replace("/", "--"))

    def range_requests(self):
        return [h.get("Range") for (m, p, h) in self.hub.log if m == "GET" and p.startswith("/cdn/") and h.get("Range")]

    def tree(self, root):
        """{relative path: symlink target or file sha256} of a cache folder (locks left out)."""
        out = {}
        for d, _, files in os.walk(root):
            for f in files:
                p = os.path.join(d, f)
                rel = os.path.relpath(p, root)
                out[rel] = ("link", os.readlink(p)) if os.path.islink(p) else ("file", hashlib.sha256(read(p)).hexdigest())
        return out

    # ---- a Hugging Face checkpoint -----------------------------------------------------------
    def test_pull_hf_checkpoint_is_a_huggingface_hub_cache_hit(self):
        repo = self.hub.repos["larder-test/tiny"]
        r = self.pull_ok("larder-test/tiny")
        snap = os.path.join(self.repo_dir("larder-test/tiny"), "snapshots", repo.commit)
        self.assertEqual(r.stdout.strip(), snap)
        wanted = sorted(n for n in self.hf_files if n not in ("README.md", "pytorch_model.bin"))
        self.assertEqual(sorted(os.listdir(snap)), wanted)
        got = self.hf_python(
            "import json; from huggingface_hub import hf_hub_download, scan_cache_dir\n"
            "files = %r\n"
            "paths = {f: hf_hub_download('larder-test/tiny', f, local_files_only=True) for f in files}\n"
            "info = scan_cache_dir()\n"
            "r = [x for x in info.repos if x.repo_id == 'larder-test/tiny'][0]\n"
            "revs = [(v.commit_hash, sorted(v.refs), sorted(f.file_name for f in v.files)) for v in r.revisions]\n"
            "print(json.dumps({'paths': paths, 'revs': revs, 'size': r.size_on_disk,\n"
            "                  'warnings': [str(w) for w in info.warnings]}))" % wanted)
        for f in wanted:
            self.assertEqual(read(got["paths"][f]), self.hf_files[f], f)
        self.assertEqual(got["revs"], [[repo.commit, ["main"], wanted]])
        self.assertEqual(got["size"], sum(len(self.hf_files[f]) for f in wanted))
        self.assertEqual(got["warnings"], [])
        # A second pull downloads nothing.
        before = len(self.range_requests()), len([1 for (m, p, h) in self.hub.log if p.startswith("/cdn/")])
        r = self.pull_ok("larder-test/tiny")
        self.assertIn("already in the cache", r.stderr)
        self.assertEqual(before[1], len([1 for (m, p, h) in self.hub.log if p.startswith("/cdn/")]))
        # larder ls sees it and can run it.
        r = self.larder("ls")
        self.assertEqual(r.returncode, 0, r.stderr)
        line = [l for l in r.stdout.splitlines() if l.startswith("larder-test/tiny ")]
        self.assertEqual(len(line), 1, r.stdout)
        self.assertIn("llama", line[0])
        self.assertIn("yes", line[0])

    def test_layout_equals_what_huggingface_hub_writes(self):
        self.pull_ok("larder-test/tiny")
        theirs = os.path.join(self.tmp, "theirs-" + os.path.basename(self.cache))
        wanted = sorted(n for n in self.hf_files if n not in ("README.md", "pytorch_model.bin"))
        self.hf_python(
            "import json; from huggingface_hub import hf_hub_download\n"
            "print(json.dumps([hf_hub_download('larder-test/tiny', f) for f in %r]))" % wanted,
            offline=False, cache=theirs)
        strip = lambda t: {k: v for k, v in t.items() if not k.startswith(".")}
        mine = strip(self.tree(self.repo_dir("larder-test/tiny")))
        ref = strip(self.tree(self.repo_dir("larder-test/tiny", theirs)))
        self.assertEqual(mine, ref)
        # And larder ls lists what huggingface_hub downloaded.
        r = self.larder("ls", HF_HUB_CACHE=theirs)
        self.assertIn("larder-test/tiny ", r.stdout)
        shutil.rmtree(theirs, ignore_errors=True)

    # ---- resume and verification ---------------------------------------------------------------
    def test_resume_after_a_cut_connection(self):
        self.hub.repos["larder-test/tiny"].faults["model.safetensors"] = "cut_once"
        r = self.pull_ok("larder-test/tiny")
        self.assertIn("resuming", r.stderr)
        n = len(self.hf_files["model.safetensors"])
        ranges = self.range_requests()
        self.assertEqual(len(ranges), 1, ranges)
        self.assertEqual(ranges[0], "bytes=%d-" % (n // 2))
        snap = r.stdout.strip()
        self.assertEqual(read(os.path.join(snap, "model.safetensors")), self.hf_files["model.safetensors"])

    def test_resume_a_partial_file_left_by_an_earlier_run(self):
        data = self.hf_files["model.safetensors"]
        sha = hashlib.sha256(data).hexdigest()
        blobs = os.path.join(self.repo_dir("larder-test/tiny"), "blobs")
        os.makedirs(blobs)
        with open(os.path.join(blobs, sha + ".incomplete"), "wb") as f:
            f.write(data[:1000])
        r = self.pull_ok("larder-test/tiny")
        self.assertEqual(self.range_requests(), ["bytes=1000-"])
        self.assertEqual(read(os.path.join(blobs, sha)), data)
        self.assertFalse(os.path.exists(os.path.join(blobs, sha + ".incomplete")))

    def test_a_wrong_partial_file_is_detected_and_refetched(self):
        data = self.hf_files["model.safetensors"]
        sha = hashlib.sha256(data).hexdigest()
        blobs = os.path.join(self.repo_dir("larder-test/tiny"), "blobs")
        os.makedirs(blobs)
        with open(os.path.join(blobs, sha + ".incomplete"), "wb") as f:
            f.write(b"\0" * 1000)
        r = self.pull_ok("larder-test/tiny")
        self.assertIn("does not verify", r.stderr)
        self.assertEqual(read(os.path.join(blobs, sha)), data)

    def test_a_corrupted_download_is_refetched(self):
        self.hub.repos["larder-test/tiny"].faults["model.safetensors"] = "corrupt_once"
        r = self.pull_ok("larder-test/tiny")
        self.assertIn("does not verify", r.stderr)
        self.assertEqual(read(os.path.join(r.stdout.strip(), "model.safetensors")), self.hf_files["model.safetensors"])

    def test_a_file_that_never_verifies_leaves_nothing_that_looks_complete(self):
        self.hub.repos["larder-test/tiny"].faults["model.safetensors"] = "corrupt"
        r = self.larder("pull", "larder-test/tiny")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("does not verify", r.stderr)
        self.assertIn("sha256", r.stderr)
        d = self.repo_dir("larder-test/tiny")
        sha = hashlib.sha256(self.hf_files["model.safetensors"]).hexdigest()
        self.assertFalse(os.path.exists(os.path.join(d, "blobs", sha)))
        self.assertFalse(os.path.exists(os.path.join(d, "blobs", sha + ".incomplete")))
        self.assertFalse(os.path.exists(os.path.join(d, "refs", "main")))
        for _, _, files in os.walk(os.path.join(d, "snapshots")):
            self.assertNotIn("model.safetensors", files)
            self.assertNotIn("config.json", files)  # linked last: the snapshot never looks loadable

    def test_a_full_disk_is_a_clear_error_and_resumable(self):
        # RLIMIT_FSIZE makes writes past 200 KB fail with EFBIG, as a full disk fails with ENOSPC.
        r = self.larder("pull", "larder-test/tiny", limit_fsize=200_000)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("disk is full", r.stderr)
        d = self.repo_dir("larder-test/tiny")
        sha = hashlib.sha256(self.hf_files["model.safetensors"]).hexdigest()
        self.assertFalse(os.path.exists(os.path.join(d, "blobs", sha)))
        self.assertFalse(os.path.exists(os.path.join(d, "refs", "main")))
        r = self.pull_ok("larder-test/tiny")
        self.assertTrue(any(x.startswith("bytes=") for x in self.range_requests()))
        self.assertEqual(read(os.path.join(r.stdout.strip(), "model.safetensors")), self.hf_files["model.safetensors"])

    # ---- errors --------------------------------------------------------------------------------
    def test_missing_repo_revision_and_file(self):
        r = self.larder("pull", "larder-test/nope")
        self.assertEqual(r.returncode, 3, r.stderr)
        self.assertIn("404", r.stderr)
        self.assertIn("larder-test/nope", r.stderr)
        r = self.larder("pull", "larder-test/tiny", "--revision", "v9")
        self.assertEqual(r.returncode, 3, r.stderr)
        self.assertIn("revision", r.stderr)
        r = self.larder("pull", "larder-test/tiny:nothing.json")
        self.assertEqual(r.returncode, 3, r.stderr)
        self.assertIn("no file", r.stderr)
        r = self.larder("pull", "not a repo")
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertEqual(os.listdir(self.cache), [])

    def test_gated_repo_needs_a_token(self):
        self.hub.add("larder-test/gated", Repo({"config.json": b"{}", "model.safetensors": b"x" * 64},
                                               gated_token="hf_good"))
        r = self.larder("pull", "larder-test/gated")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("401", r.stderr)
        self.assertIn("HF_TOKEN", r.stderr)
        r = self.larder("pull", "larder-test/gated", HF_TOKEN="hf_bad")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("403", r.stderr)
        self.pull_ok("larder-test/gated", HF_TOKEN="hf_good")
        auth = [h.get("Authorization") for (m, p, h) in self.hub.log if p.startswith("/larder-test/gated/resolve")]
        self.assertTrue(auth and all(a == "Bearer hf_good" for a in auth), auth)

    # ---- GGUF repos ----------------------------------------------------------------------------
    def snapshot_files(self, repo):
        d = self.repo_dir(repo)
        out = []
        for root, _, files in os.walk(os.path.join(d, "snapshots")):
            out += [os.path.relpath(os.path.join(root, f), os.path.join(d, "snapshots", self.hub.repos[repo].commit))
                    for f in files]
        return sorted(out)

    def test_gguf_quantization_by_name(self):
        r = self.pull_ok("larder-test/tiny-GGUF:q8_0")
        self.assertEqual(self.snapshot_files("larder-test/tiny-GGUF"), ["tiny-Q8_0.gguf"])
        self.assertTrue(r.stdout.strip().endswith("/tiny-Q8_0.gguf"))
        self.assertEqual(read(r.stdout.strip()), self.gguf_files["tiny-Q8_0.gguf"])
        # No quantization named: llama.cpp's default, Q4_K_M.
        r = self.pull_ok("larder-test/tiny-GGUF")
        self.assertIn("Q4_K_M", r.stderr)
        self.assertEqual(self.snapshot_files("larder-test/tiny-GGUF"), ["tiny-Q4_K_M.gguf", "tiny-Q8_0.gguf"])
        # Sharded: every shard; an exact file name: that file.
        self.pull_ok("larder-test/tiny-GGUF:Q6_K")
        self.pull_ok("larder-test/tiny-GGUF:tiny-Q4_K_S.gguf")
        self.assertEqual(self.snapshot_files("larder-test/tiny-GGUF"),
                         ["Q6_K/tiny-Q6_K-00001-of-00002.gguf", "Q6_K/tiny-Q6_K-00002-of-00002.gguf",
                          "tiny-Q4_K_M.gguf", "tiny-Q4_K_S.gguf", "tiny-Q8_0.gguf"])
        # Unknown quantization: the error lists what there is.
        r = self.larder("pull", "larder-test/tiny-GGUF:Q5_K_M")
        self.assertEqual(r.returncode, 3, r.stderr)
        for q in ("Q4_K_M", "Q4_K_S", "Q8_0", "Q6_K"):
            self.assertIn(q, r.stderr)
        self.assertNotIn("mmproj", r.stderr)
        # ls: the GGUF entries with their real architecture and quantization (read from the headers).
        r = self.larder("ls")
        lines = {l.split()[0]: l for l in r.stdout.splitlines()[1:]}
        self.assertIn("larder-test/tiny-GGUF:Q4_K_M", lines, r.stdout)
        self.assertIn("llama", lines["larder-test/tiny-GGUF:Q4_K_M"])
        # huggingface_hub finds the file larder fetched.
        got = self.hf_python("import json; from huggingface_hub import hf_hub_download\n"
                             "print(json.dumps(hf_hub_download('larder-test/tiny-GGUF', 'tiny-Q8_0.gguf', "
                             "local_files_only=True)))")
        self.assertEqual(read(got), self.gguf_files["tiny-Q8_0.gguf"])

    def test_ambiguous_gguf_repo_asks_for_a_choice(self):
        self.hub.add("larder-test/two-GGUF", Repo({"a-Q8_0.gguf": b"1" * 10, "a-Q4_0.gguf": b"2" * 10}))
        r = self.larder("pull", "larder-test/two-GGUF")
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("Q8_0", r.stderr)
        self.assertIn("Q4_0", r.stderr)
        r = self.larder("pull", "larder-test/two-GGUF", "--list")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("a-Q4_0.gguf", r.stdout)
        self.assertFalse(os.path.exists(self.repo_dir("larder-test/two-GGUF")))

    # ---- rm ------------------------------------------------------------------------------------
    def test_rm(self):
        self.pull_ok("larder-test/tiny-GGUF:Q8_0")
        r = self.larder("rm", "larder-test/tiny-GGUF")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("removed", r.stdout)
        self.assertFalse(os.path.exists(self.repo_dir("larder-test/tiny-GGUF")))
        got = self.hf_python("import json; from huggingface_hub import scan_cache_dir\n"
                             "print(json.dumps([r.repo_id for r in scan_cache_dir().repos]))")
        self.assertEqual(got, [])
        r = self.larder("rm", "larder-test/tiny-GGUF")
        self.assertEqual(r.returncode, 3, r.stderr)
        r = self.larder("rm", "../etc")
        self.assertEqual(r.returncode, 2, r.stderr)


if __name__ == "__main__":
    unittest.main()
