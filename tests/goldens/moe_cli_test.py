#!/usr/bin/env python3
"""The CLI on the Qwen3-MoE fixtures (tests/ref/qwen3_moe_reference.py).

`larder info --json` counts every expert in the weights and reports what a token reads.

`larder eval ppl` on the MoE GGUF fixtures (tests/ref/qwen3_moe_reference.py: qwen3_moe_q8_0, GGUF
`qwen3moe`, and qwen3_5_moe_q8_0, GGUF `qwen35moe`; tests/ref/qwen3_next_reference.py:
qwen3_next_ppl_q8_0, GGUF `qwen3next`; with llama.cpp's tensor names, Q8_0 experts, a synthetic SPM
vocabulary) against llama.cpp's own llama-perplexity on the same files and texts:
within 1 %.

The golden (ppl_moe_llamacpp.json) is made by `scripts/make_llamacpp_goldens.py moe-ppl`,
which records the command and the GGUF's sha256: a changed fixture generator fails here by name
instead of as a model difference.
"""
import hashlib
import json
import os
import subprocess
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.environ.get("LARDER_BIN") or os.path.join(HERE, "../../build/bin/larder")
DATA = os.environ.get("LARDER_TEST_DATA_DIR") or os.path.join(HERE, "../../build/testdata")
TOLERANCE = 0.01


class MoeCli(unittest.TestCase):
    def test_info_counts_all_experts_and_the_active_ones(self):
        model = os.path.join(DATA, "models", "qwen3_moe_q8_0", "model.gguf")
        self.assertTrue(os.path.exists(model), f"{model}: fixture qwen3_moe_ref did not run")
        p = subprocess.run([BIN, "info", model, "--ctx", "256", "--json"], capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr[-2000:])
        j = json.loads(p.stdout)
        # 4 routed layers x 8 experts x (gate, up, down) of 32 x 64 in Q8_0 (34 bytes per 32 values);
        # a token reads 2 of the 8.
        experts = 4 * 8 * 3 * (32 * 64 // 32 * 34)
        self.assertEqual(j["expert_bytes"], experts)
        self.assertEqual(j["weights_per_token"], j["weights"] - experts * 6 // 8)
        import gguf
        self.assertEqual(j["weights"], sum(int(t.n_bytes) for t in gguf.GGUFReader(model).tensors))
        p = subprocess.run([BIN, "info", model, "--ctx", "256"], capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr[-2000:])
        self.assertIn("architecture:   qwen3moe", p.stdout)
        self.assertIn("experts:        8 per layer, 2 per token, ffn 32 (4 of 4 layers routed)", p.stdout)
        self.assertIn("a token reads", p.stdout)

    def test_moe_ggufs_match_llama_perplexity(self):
        with open(os.path.join(HERE, "ppl_moe_llamacpp.json"), encoding="utf-8") as f:
            golden = json.load(f)
        self.assertEqual({m["architecture"] for m in golden["models"]}, {"qwen3moe", "qwen35moe", "qwen3next"})
        for g in golden["models"]:
            d = os.path.join(DATA, "models", g["case"])
            model, text = os.path.join(d, "model.gguf"), os.path.join(d, "ppl_text.txt")
            self.assertTrue(os.path.exists(model), f"{model}: fixture {g.get('fixture', 'qwen3_moe_ref')} did not run")
            with open(model, "rb") as f:
                sha = hashlib.sha256(f.read()).hexdigest()
            self.assertEqual(sha, g["gguf_sha256"],
                             f"{g['case']}: the fixture's GGUF changed ({g.get('fixture')}): regenerate "
                             "the golden with scripts/make_llamacpp_goldens.py moe-ppl")
            for run in g["runs"]:
                with self.subTest(case=g["case"], ctx=run["ctx"]):
                    p = subprocess.run([BIN, "eval", "ppl", model, "--text", text, "--ctx", str(run["ctx"]),
                                        "--chunks", str(run["chunks"]), "--kv-dtype", run["kv"], "--json"],
                                       capture_output=True, text=True, timeout=300)
                    self.assertEqual(p.returncode, 0, p.stderr[-2000:])
                    got = json.loads(p.stdout)
                    self.assertEqual(got["chunks"], run["chunks"])
                    rel = abs(got["ppl"] - run["ppl"]) / run["ppl"]
                    print(f"[moe ppl] {g['architecture']} ctx {run['ctx']} x {run['chunks']} kv {run['kv']}: larder "
                          f"{got['ppl']:.4f} vs llama-perplexity {run['ppl']:.4f} ({100 * rel:.3f} % apart)")
                    self.assertLessEqual(rel, TOLERANCE,
                                         f"larder PPL {got['ppl']:.4f} vs llama-perplexity {run['ppl']:.4f}")


if __name__ == "__main__":
    unittest.main()
