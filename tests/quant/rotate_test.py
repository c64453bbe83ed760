#!/usr/bin/env python3
"""Rotation fold (design/quantization.md §6) checked by mlx-lm, independently of larder's model code.

Small random Llama-family HF checkpoints (f32, non-unit norm gains; made here with numpy) are
rotated by larder (rotate_tool, the quant::rotate_checkpoint API) and mlx-lm (PyPI mlx/mlx-lm,
CPU backend, f32) runs the original and the rotated directory on the same tokens: the logits must
agree to the fp32 level, 1e-5 * max|logit| (measured ~1e-6: f32 rounding of the folded weights
and of a differently rounded forward; a wrong fold gives O(max|logit|)). The rotated weights must
really differ from the originals, and the norm gains must be ones.
Run with ROTATE_TOOL and LARDER_TEST_DATA_DIR set (CTest does).
"""
import glob
import json
import os
import shutil
import subprocess
import sys
import unittest
from pathlib import Path

import numpy as np
import mlx.core as mx

mx.set_default_device(mx.cpu)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ref"))
from model_reference import write_safetensors as write_typed_safetensors  # noqa: E402

TOOL = os.environ["ROTATE_TOOL"]
OUT = os.path.join(os.environ["LARDER_TEST_DATA_DIR"], "rotate_mlx")

# name, model_type, hidden, heads, kv heads, head_dim, ffn, tied, attention_bias
CASES = [
    ("llama_tied", "llama", 64, 4, 2, 16, 128, True, False),
    ("llama_h96_bias", "llama", 96, 4, 2, 24, 160, False, True),
    ("qwen2", "qwen2", 64, 4, 2, 16, 96, False, False),
    ("qwen3_h80", "qwen3", 80, 4, 2, 20, 128, True, False),
    ("mistral_h112", "mistral", 112, 4, 4, 28, 128, False, False),
]
V, L = 120, 3
TOKENS = [1, 17, 5, 99, 3, 64, 64, 2, 118, 7, 45, 33, 0, 12, 81, 90, 4, 4, 100, 56, 21, 8, 77, 63]


def write_safetensors(path, tensors):
    write_typed_safetensors(path, {k: ("F32", np.ascontiguousarray(v, dtype=np.float32)) for k, v in tensors.items()})


def make_model(d, model_type, H, nh, nkv, hd, inter, tied, attn_bias, seed=0):
    rng = np.random.default_rng(seed)
    cfg = {"model_type": model_type, "hidden_size": H, "intermediate_size": inter, "num_hidden_layers": L,
           "num_attention_heads": nh, "num_key_value_heads": nkv, "head_dim": hd, "vocab_size": V,
           "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 256,
           "tie_word_embeddings": tied, "attention_bias": attn_bias, "hidden_act": "silu", "torch_dtype": "float32"}
    w = {"model.embed_tokens.weight": rng.normal(0, 0.5, (V, H)), "model.norm.weight": 1 + 0.3 * rng.normal(size=H)}
    if not tied:
        w["lm_head.weight"] = rng.normal(0, 0.3, (V, H))
    for l in range(L):
        p = f"model.layers.{l}."
        w[p + "input_layernorm.weight"] = 1 + 0.3 * rng.normal(size=H)
        w[p + "post_attention_layernorm.weight"] = 1 + 0.3 * rng.normal(size=H)
        for n, shp in [("self_attn.q_proj", (nh * hd, H)), ("self_attn.k_proj", (nkv * hd, H)),
                       ("self_attn.v_proj", (nkv * hd, H)), ("self_attn.o_proj", (H, nh * hd)),
                       ("mlp.gate_proj", (inter, H)), ("mlp.up_proj", (inter, H)), ("mlp.down_proj", (H, inter))]:
            w[p + n + ".weight"] = rng.normal(0, 1 / np.sqrt(shp[1]), shp)
        if model_type == "qwen2" or attn_bias:
            for n, k in [("q_proj", nh * hd), ("k_proj", nkv * hd), ("v_proj", nkv * hd)]:
                w[p + "self_attn." + n + ".bias"] = rng.normal(0, 0.2, k)
        if attn_bias:
            w[p + "self_attn.o_proj.bias"] = rng.normal(0, 0.2, H)
        if model_type == "qwen3":
            w[p + "self_attn.q_norm.weight"] = 1 + 0.3 * rng.normal(size=hd)
            w[p + "self_attn.k_norm.weight"] = 1 + 0.3 * rng.normal(size=hd)
    os.makedirs(d)
    write_safetensors(os.path.join(d, "model.safetensors"), w)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


def load_dir(d):
    out = {}
    for f in sorted(glob.glob(os.path.join(d, "*.safetensors"))):
        out.update({k: np.array(v) for k, v in mx.load(f).items()})
    return out


def logits(d):
    from mlx_lm.utils import load_model
    model, _ = load_model(Path(d))
    out = model(mx.array(TOKENS, dtype=mx.int32)[None])
    return np.array(out[0].astype(mx.float32)).astype(np.float64)


class RotateVsMlxLm(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        shutil.rmtree(OUT, ignore_errors=True)
        os.makedirs(OUT)

    def test_cases(self):
        for name, mt, H, nh, nkv, hd, inter, tied, bias in CASES:
            src = os.path.join(OUT, name + "_src")
            make_model(src, mt, H, nh, nkv, hd, inter, tied, bias)
            want = logits(src)
            a = load_dir(src)
            for mode, flags in [("r1r2", []), ("r1", ["--no-r2"]), ("gamma", ["--no-r1"])]:
                with self.subTest(case=name, mode=mode):
                    dst = os.path.join(OUT, f"{name}_{mode}")
                    p = subprocess.run([TOOL, src, dst, "--dtype", "f32", *flags], capture_output=True, text=True,
                                       timeout=120)
                    self.assertEqual(p.returncode, 0, p.stderr)
                    got = logits(dst)
                    rel = np.abs(got - want).max() / np.abs(want).max()
                    print(f"[rotate-mlx] {name:14s} {mode:6s} max|logit| {np.abs(want).max():.3g} rel {rel:.3g}")
                    self.assertLessEqual(rel, 1e-5)
                    b = load_dir(dst)
                    self.assertIn("lm_head.weight", b)
                    for k, v in b.items():
                        if "layernorm" in k or k == "model.norm.weight":
                            self.assertTrue(np.all(v == 1.0), k)
                    q = "model.layers.1.self_attn.q_proj.weight"
                    self.assertFalse(np.array_equal(a[q], b[q]), "q_proj was not folded")
                    e = "model.embed_tokens.weight"
                    self.assertEqual(np.array_equal(a[e], b[e]), mode == "gamma")
                    cfg = json.load(open(os.path.join(dst, "config.json")))
                    self.assertFalse(cfg["tie_word_embeddings"])
                    self.assertEqual(cfg["larder_rotation"]["seed"], 42)

    def test_refusal_leaves_nothing(self):
        src = os.path.join(OUT, "bad_src")
        make_model(src, "llama", 92, 4, 2, 23, 64, True, False)  # 92 = 4·23: no Hadamard base
        dst = os.path.join(OUT, "bad_dst")
        p = subprocess.run([TOOL, src, dst], capture_output=True, text=True, timeout=60)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("[rotate]", p.stderr)
        self.assertIn("hidden_size 92", p.stderr)
        self.assertFalse(os.path.exists(dst))
        self.assertEqual(glob.glob(dst + ".partial*"), [])


if __name__ == "__main__":
    unittest.main()
