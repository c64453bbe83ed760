#!/usr/bin/env python3
"""`larder quantize --rotate` end to end, judged by mlx-lm (independent of larder's model code).

On a small random Llama (f32, untied, non-unit norm gains; see quantize_test.make_llama) and a
tied one:
  1. `--rotate --bits 8`: mlx-lm loads the output unchanged; its logits stay as close to mlx-lm's
     logits of the unrotated source as those of plain 8-bit quantization do (KL within 3x of the
     unrotated 8-bit's, and small in absolute terms) — a wrong fold would be off by orders of
     magnitude (a wrong fold: KL of whole nats). The config records the rotation (seed, R1/R2 constructions, deviations), a tied
     source comes out untied, norm gains are ones, and no rotated intermediate is left in DST.
  2. Same seed -> byte-identical shards; another seed -> different bytes, equally close logits.
  3. Flags: --rotation-seed / --no-r2 without --rotate, and --rotate on a quantized source, are
     refused with a message naming the problem and leave nothing behind.
Run with LARDER_BIN, LARDER_SHARED_DIR, LARDER_TEST_DATA_DIR set (CTest does).
"""
import glob
import json
import os
import shutil
import subprocess
import sys
import unittest

import numpy as np
import mlx.core as mx

mx.set_default_device(mx.cpu)
sys.path.insert(0, os.path.dirname(__file__))
from quantize_test import make_llama  # noqa: E402

BIN = os.environ["LARDER_BIN"]
OUT = os.path.join(os.environ["LARDER_TEST_DATA_DIR"], "quantize_pipeline")
TOKENS = [1, 450, 4996, 17354, 1701, 432, 17204, 975, 278, 17366, 11203, 29889, 13, 3, 99, 2000, 31999, 7, 8, 9]


def run(*args, ok=True):
    p = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=600)
    if ok and p.returncode != 0:
        raise AssertionError(f"larder {' '.join(args)} failed ({p.returncode}):\n{p.stderr}")
    return p


def read(path, mode="r"):
    with open(path, mode) as f:
        return f.read()


def logprobs(d):
    from mlx_lm.utils import load
    model, _ = load(d)
    x = np.array(model(mx.array([TOKENS])).astype(mx.float32), dtype=np.float64)[0]
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def mean_kl(ref, cur):
    return float((np.exp(ref) * (ref - cur)).sum(-1).mean())


def shards(d):
    return {os.path.basename(f): read(f, "rb") for f in sorted(glob.glob(os.path.join(d, "*.safetensors")))}


class RotatePipelineTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        shutil.rmtree(OUT, ignore_errors=True)
        os.makedirs(OUT)
        cls.src = {True: os.path.join(OUT, "src-tied"), False: os.path.join(OUT, "src-untied")}
        make_llama(cls.src[False], "f32", tied=False, shards=1, seed=11)
        make_llama(cls.src[True], "f32", tied=True, shards=1, seed=12)

    def quantize(self, tied, name, *extra):
        d = os.path.join(OUT, name)
        shutil.rmtree(d, ignore_errors=True)
        run("quantize", self.src[tied], d, "--bits", "8", "--group-size", "64", *extra)
        return d

    def test_rotated_8bit_matches_source(self):
        for tied in (False, True):
            ref = logprobs(self.src[tied])
            plain = self.quantize(tied, f"plain8-{tied}")
            rot = self.quantize(tied, f"rot8-{tied}", "--rotate")
            kl_plain, kl_rot = mean_kl(ref, logprobs(plain)), mean_kl(ref, logprobs(rot))
            print(f"tied={tied}: KL(src || 8-bit) {kl_plain:.2e}, KL(src || rotated 8-bit) {kl_rot:.2e}", file=sys.stderr)
            self.assertLess(kl_rot, max(3 * kl_plain, 1e-6))
            self.assertLess(kl_rot, 0.05)  # a broken fold is off by nats (the tied case has sharp logits: 8-bit KL ~1e-2)
            cfg = json.loads(read(os.path.join(rot, "config.json")))
            self.assertIn("larder_rotation", cfg)
            self.assertEqual(cfg["larder_rotation"]["seed"], 42)
            self.assertFalse(cfg["tie_word_embeddings"])
            self.assertEqual([e for e in os.listdir(rot) if e.startswith(".")], [])
            w = {}
            for f in glob.glob(os.path.join(rot, "*.safetensors")):
                w.update(mx.load(f))
            self.assertIn("lm_head.weight", w)
            for k, v in w.items():
                if k.endswith("norm.weight"):
                    self.assertTrue(bool(mx.all(v == 1).item()), k)

    def test_seed(self):
        a = self.quantize(False, "seed-a", "--rotate", "--rotation-seed", "7")
        b = self.quantize(False, "seed-b", "--rotate", "--rotation-seed", "7")
        c = self.quantize(False, "seed-c", "--rotate", "--rotation-seed", "8")
        self.assertEqual(shards(a), shards(b))
        self.assertNotEqual(shards(a), shards(c))
        ref = logprobs(self.src[False])
        self.assertLess(mean_kl(ref, logprobs(c)), 1e-3)

    def test_refusals(self):
        d = os.path.join(OUT, "refused")
        for args, needle in [(["--rotation-seed", "3"], "only apply with --rotate"),
                             (["--no-r2"], "only apply with --rotate")]:
            p = run("quantize", self.src[False], d, *args, ok=False)
            self.assertNotEqual(p.returncode, 0)
            self.assertIn(needle, p.stderr)
            self.assertFalse(os.path.exists(d))
        q = self.quantize(False, "already-quantized")
        p = run("quantize", q, d, "--rotate", ok=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("quantiz", p.stderr)
        self.assertFalse(os.path.exists(d))
        self.assertEqual(glob.glob(d + ".partial*"), [])


if __name__ == "__main__":
    unittest.main()
