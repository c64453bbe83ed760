"""Black-box tests of `larder serve` startup and signals (issue 17, bug 1): a path that exists but
is not a model must print the reason and exit non-zero at once, and SIGINT/SIGTERM must end the
process while the model is still loading (a load that blocks in the kernel: a FIFO)."""
import os
import signal
import subprocess
import tempfile
import time
import unittest

from server_harness import BIN, STORIES, free_port, tmp_root


def serve(*args):
    return subprocess.Popen([BIN, "serve", *args, "--host", "127.0.0.1", "--port", str(free_port())],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


class NotAModelTest(unittest.TestCase):
    def check_fails_fast(self, path, want_in_message):
        p = serve(path)
        try:
            out, err = p.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            self.fail(f"`larder serve {path}` still running after 15 s (it must fail at once)")
        err = err.decode("utf-8", "replace")
        self.assertNotEqual(p.returncode, 0, f"`larder serve {path}` must exit non-zero; stderr: {err}")
        self.assertLess(p.returncode, 128, f"exited by a signal, not by a load error: {p.returncode}")
        self.assertIn(want_in_message, err, f"the reason must be printed; stderr: {err}")

    def test_paths_that_are_not_models(self):
        root = tempfile.mkdtemp(dir=tmp_root())
        empty = os.path.join(root, "empty")
        os.mkdir(empty)
        readme_dir = os.path.join(root, "readme_dir")
        os.mkdir(readme_dir)
        with open(os.path.join(readme_dir, "README.md"), "w") as f:
            f.write("# not a model\n")
        readme = os.path.join(root, "README")
        with open(readme, "w") as f:
            f.write("not a model\n")
        hf_like = os.path.join(root, "hf_repo")
        os.mkdir(hf_like)
        with open(os.path.join(hf_like, "config.json"), "w") as f:
            f.write('{"architectures": ["LlamaForCausalLM"], "model_type": "llama"}')
        bad_gguf = os.path.join(root, "broken.gguf")
        with open(bad_gguf, "wb") as f:
            f.write(b"GGUF\x03\x00\x00\x00garbage")
        for path in (empty, readme_dir, readme, hf_like, bad_gguf):
            with self.subTest(path=os.path.basename(path)):
                self.check_fails_fast(path, os.path.basename(path))


class SignalWhileLoadingTest(unittest.TestCase):
    def test_sigterm_and_sigint_during_a_blocked_load(self):
        # Opening a FIFO blocks until a writer appears: a load that never finishes by itself.
        for sig in (signal.SIGTERM, signal.SIGINT):
            with self.subTest(sig=sig.name):
                fifo = os.path.join(tempfile.mkdtemp(dir=tmp_root()), "model.gguf")
                os.mkfifo(fifo)
                p = serve(fifo)
                time.sleep(1.0)
                if p.poll() is not None:  # refusing a FIFO outright is fine too
                    err = p.communicate()[1].decode("utf-8", "replace")
                    self.assertNotEqual(p.returncode, 0, err)
                    continue
                t0 = time.monotonic()
                p.send_signal(sig)
                try:
                    p.communicate(timeout=5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.communicate()
                    self.fail(f"{sig.name} during loading did not stop `larder serve` within 5 s")
                self.assertLess(time.monotonic() - t0, 5)
                self.assertNotEqual(p.returncode, 0, "interrupted load must not report success")

    def test_sigterm_after_ready_still_drains(self):
        from server_harness import Server
        s = Server(STORIES).start()
        self.assertEqual(s.stop(timeout=30), 0, f"drain after SIGTERM exits 0; log:\n{s.log()}")
        self.assertIn("LARDER_SHUTDOWN_TIMEOUT_MS", s.log(), "draining names its timeout setting")


if __name__ == "__main__":
    unittest.main()
