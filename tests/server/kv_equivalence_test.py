"""Layer-0 KV store equivalence at 1B scale (issue 4 evidence): greedy output with a RAM hit, an
SSD hit and after a restart equals a cold run token for token, on a random-weight 1B-class
Llama (big_model.py; fp32 KV). The cold reference runs on a server with the store off."""
import os
import shutil
import tempfile
import unittest

import big_model
from server_harness import SHARED, Server

DATA = os.environ.get("LARDER_TEST_DATA_DIR") or tempfile.gettempdir()
PROMPT = ("The history of the lighthouse keepers on the northern coast is long and full of storms, "
          "shipwrecks, letters home, and the slow arrival of electric lamps. In the winter of that year")


class KvStoreEquivalence1B(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.model = big_model.make_big_model(os.path.join(DATA, "random-llama-1b-bf16"), SHARED)
        cls.tmp = tempfile.mkdtemp(prefix="larder_kv1b_")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def complete(self, srv, prompt=PROMPT, n=8):
        r = srv.post("/v1/completions", {"prompt": prompt, "max_tokens": n, "temperature": 0}, timeout=600)
        self.assertEqual(r.status, 200, r)
        j = r.json()
        return j["choices"][0]["text"], j["usage"], r.headers.get("x-larder-cache", "")

    def test_ram_hit_ssd_hit_and_restart_equal_cold(self):
        cold_srv = Server(self.model, "--ctx", "512", "--prompt-cache", "0", startup_timeout=120).start()
        try:
            cold, usage, _ = self.complete(cold_srv)
            self.assertEqual(usage["prompt_tokens_details"]["cached_tokens"], 0, "store off: nothing reused")
            self.assertEqual(usage["completion_tokens"], 8)
        finally:
            self.assertEqual(cold_srv.stop(), 0)
        P = usage["prompt_tokens"]
        self.assertGreater(P, 30)

        ssd = os.path.join(self.tmp, "ssd")
        srv = Server(self.model, "--ctx", "512", "--ssd-cache", ssd, startup_timeout=120).start()
        try:
            first, u1, _ = self.complete(srv)
            self.assertEqual(first, cold, "a miss with the store on must equal the cold run")
            again, u2, hdr = self.complete(srv)
            self.assertEqual(u2["prompt_tokens_details"]["cached_tokens"], P - 1, f"exact repeat reuses len-1 ({hdr})")
            self.assertIn("tier=ram", hdr)
            self.assertEqual(again, cold, "RAM hit output differs from the cold run")
        finally:
            self.assertEqual(srv.stop(timeout=120), 0, srv.log())  # SIGTERM: flush to the SSD tier
        files = [f for f in os.listdir(ssd) if not f.startswith(".")]
        self.assertTrue(files, "the SSD tier holds the entry after a SIGTERM flush")

        srv = Server(self.model, "--ctx", "512", "--ssd-cache", ssd, startup_timeout=120).start()
        try:
            restored, u3, hdr = self.complete(srv)
            self.assertIn("tier=ssd", hdr, "after a restart the prefix comes from the SSD tier")
            self.assertEqual(u3["prompt_tokens_details"]["cached_tokens"], P - 1)
            self.assertEqual(restored, cold, "SSD hit after restart differs from the cold run")
            # A longer prompt sharing the prefix (the next chat turn) reuses it and matches its own cold run.
            longer = PROMPT + cold + " the keeper wrote"
            cont, u4, hdr = self.complete(srv, longer)
            self.assertGreaterEqual(u4["prompt_tokens_details"]["cached_tokens"], P - 1, hdr)
        finally:
            self.assertEqual(srv.stop(timeout=120), 0)
        cold_srv = Server(self.model, "--ctx", "512", "--prompt-cache", "0", startup_timeout=120).start()
        try:
            cold_cont, _, _ = self.complete(cold_srv, longer)
        finally:
            cold_srv.stop()
        self.assertEqual(cont, cold_cont, "a partial-prefix hit differs from the cold run of the longer prompt")


if __name__ == "__main__":
    unittest.main()
