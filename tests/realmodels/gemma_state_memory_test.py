"""Issue 13 evidence: on the real gemma-3-270m, a sliding layer's state stays at its window
whatever the context, as `larder bench` reports it after prefill (memory.state in --json): the
15 sliding layers' rings hold the same bytes at contexts 600 and 1800 (both past the 512-token
window), equal to window x KV heads x head_dim x (K + V) x f32 per layer, while the 3 global
layers' plain KV grows with the context. (bench/RESULTS.md has 1k/4k/16k from the same command.)"""
import json
import os
import subprocess
import unittest

BIN = os.environ["LARDER_BIN"]
MODEL = os.path.join(os.environ.get("LARDER_MODELS_DIR") or "", "gemma-3-270m-q4_k_m.gguf")


def bench_state(p):
    out = subprocess.run([BIN, "bench", MODEL, "-p", str(p), "-n", "2", "-r", "1", "--no-roofline", "--json"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["memory"]["state"]


@unittest.skipUnless(os.path.exists(MODEL), f"{MODEL} is absent: run scripts/fetch_models.sh")
class GemmaStateMemory(unittest.TestCase):
    def test_rings_stay_at_the_window(self):
        a, b = bench_state(600), bench_state(1800)
        self.assertEqual((a["ring_layers"], a["plain_kv_layers"]), (15, 3))
        # gemma-3-270m: window 512, 1 KV head, head_dim 256.
        self.assertEqual(a["ring_bytes"], 15 * 512 * 1 * 256 * 2 * 4)
        self.assertEqual(b["ring_bytes"], a["ring_bytes"], "ring memory must not grow with the context")
        self.assertGreater(b["plain_kv_bytes"], 2 * a["plain_kv_bytes"], "global layers hold the whole context")


if __name__ == "__main__":
    unittest.main()
