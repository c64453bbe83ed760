#!/usr/bin/env python3
"""`larder quantize` vs mlx-lm (PyPI mlx / mlx-lm on the CPU backend).

For small random Llama checkpoints in HF layout (made here with numpy, written as safetensors:
bf16 sharded + untied head, f32 tied, bf16 with --keep), at several (bits, group size):
  1. larder's output tensors are byte-identical to `mlx_lm.convert(..., quantize=True)`'s
     (same names, dtypes, shapes and bytes), and the quantization blocks agree;
  2. the larder output loads in mlx-lm and its logits equal (exactly) those of mlx-lm's own
     quantized model;
  3. larder loads its own output: `larder generate` works; the logits comparison against mlx-lm
     is done by the quant_roundtrip gtest (tests/unit/quant/roundtrip_test.cpp) from the
     reference this script writes to <testdata>/quantize/<case>/ref.json;
  4. an existing DST is refused and a failed run leaves neither DST nor a partial directory;
  5. the microscaling float modes (--mode mxfp4 / nvfp4 / mxfp8, and a per-module --plan mixing
     them with affine and kept modules): byte-identical to mlx_lm.convert(q_mode=...) with the
     same per-module choices, the same mlx-lm logits, every config entry naming its mode; larder
     loads mlx-lm's own output of each mode (and its own) with mlx-lm's logits (roundtrip gtest).
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
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ref"))
from model_reference import write_safetensors  # noqa: E402

BIN = os.environ["LARDER_BIN"]
SHARED = os.environ["LARDER_SHARED_DIR"]
OUT = os.path.join(os.environ["LARDER_TEST_DATA_DIR"], "quantize")
TOK = os.path.join(SHARED, "tokenizers/hf/llama2")

# name, source dtype, tied, shards, bits, group, keep
CASES = [
    ("bf16_b4_g64_sharded", "bf16", False, 2, 4, 64, None),
    ("f32_b3_g32_tied", "f32", True, 1, 3, 32, None),
    ("bf16_b8_g128_keep", "bf16", False, 1, 8, 128, "lm_head"),
    ("bf16_b2_g32", "bf16", True, 1, 2, 32, None),
    ("f16_b5_g64", "f16", False, 1, 5, 64, None),
    ("bf16_b6_g64", "bf16", False, 1, 6, 64, None),
]
TOKENS = [1, 450, 4996, 17354, 1701, 432, 17204, 975, 278, 17366, 11203, 29889, 13, 3, 99, 2000,
          31999, 7, 8, 9, 450, 450, 10, 11]


def to_bf16_bits(a):
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def make_llama(d, dtype, tied, shards, seed=0):
    rng = np.random.default_rng(seed)
    H, I, L, V, nh, nkv = 128, 384, 3, 32000, 4, 2
    hd = H // nh
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H,
           "intermediate_size": I, "num_hidden_layers": L, "num_attention_heads": nh,
           "num_key_value_heads": nkv, "head_dim": hd, "vocab_size": V, "rms_norm_eps": 1e-5,
           "rope_theta": 10000.0, "max_position_embeddings": 2048, "tie_word_embeddings": tied,
           "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2,
           "torch_dtype": {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}[dtype]}
    w = {"model.embed_tokens.weight": rng.normal(0, 0.5, (V, H)), "model.norm.weight": 1 + 0.1 * rng.normal(size=H)}
    if not tied:
        w["lm_head.weight"] = rng.normal(0, 0.05, (V, H))
    for l in range(L):
        p = f"model.layers.{l}."
        w[p + "input_layernorm.weight"] = 1 + 0.1 * rng.normal(size=H)
        w[p + "post_attention_layernorm.weight"] = 1 + 0.1 * rng.normal(size=H)
        for n, shp in [("self_attn.q_proj", (nh * hd, H)), ("self_attn.k_proj", (nkv * hd, H)),
                       ("self_attn.v_proj", (nkv * hd, H)), ("self_attn.o_proj", (H, nh * hd)),
                       ("mlp.gate_proj", (I, H)), ("mlp.up_proj", (I, H)), ("mlp.down_proj", (H, I))]:
            a = rng.standard_t(5, shp) * (1.0 / np.sqrt(shp[1]))
            if l == 1 and n == "mlp.down_proj":
                a[3, :] = 0.25  # a constant row
                a[5, 7] = 3.0   # an outlier
            w[p + n + ".weight"] = a
    # HF checkpoints carry this buffer in older exports; mlx-lm's sanitize drops it.
    w["model.layers.0.self_attn.rotary_emb.inv_freq"] = 1.0 / (10000 ** (np.arange(0, hd, 2) / hd))
    os.makedirs(d)
    def enc(v):
        v = np.asarray(v, dtype=np.float32)
        if dtype == "bf16":
            return ("BF16", to_bf16_bits(v))
        if dtype == "f16":
            return ("F16", v.astype(np.float16))
        return ("F32", v)
    t = {k: enc(v) for k, v in w.items()}
    names = sorted(t)
    if shards == 1:
        write_safetensors(os.path.join(d, "model.safetensors"), t)
    else:
        wm = {}
        for i in range(shards):
            part = names[i::shards]
            fn = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            write_safetensors(os.path.join(d, fn), {k: t[k] for k in part})
            wm.update({k: fn for k in part})
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": wm}, f)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    for fn in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(TOK, fn), d)
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 1, "eos_token_id": 2}, f)


def read_json(path):
    with open(path) as f:
        return json.load(f)


def load_dir(d):
    out = {}
    for f in sorted(glob.glob(os.path.join(d, "*.safetensors"))):
        out.update(mx.load(f))
    return out


def raw_bytes(a):
    if a.dtype == mx.bfloat16:
        return np.array(a.view(mx.uint16)).tobytes()
    return np.array(a).tobytes()


def logits(d, upcast=False):
    from pathlib import Path
    from mlx_lm.utils import load_model
    model, _ = load_model(Path(d))
    if upcast:
        model.set_dtype(mx.float32)
    out = model(mx.array(TOKENS, dtype=mx.int32)[None])
    return np.array(out[0].astype(mx.float32))


def run(*args, timeout=300):
    p = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=timeout, errors="replace")
    return p.returncode, p.stdout, p.stderr


class QuantizeVsMlxLm(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        shutil.rmtree(OUT, ignore_errors=True)
        os.makedirs(OUT)

    def test_cases(self):
        from mlx_lm import convert
        for name, dtype, tied, shards, bits, g, keep in CASES:
            with self.subTest(case=name):
                root = os.path.join(OUT, name)
                src, ours, theirs = (os.path.join(root, x) for x in ("src", "larder", "mlx"))
                os.makedirs(root)
                make_llama(src, dtype, tied, shards)
                args = ["quantize", src, ours, "--bits", str(bits), "--group-size", str(g)]
                if keep:
                    args += ["--keep", keep]
                if shards > 1:
                    args += ["--max-shard-mb", "4"]
                code, out, err = run(*args)
                self.assertEqual(code, 0, err)
                self.assertIn("quantized", err)
                pred = None
                if keep:
                    pred = lambda path, module, *rest: path != keep  # noqa: E731
                convert(src, theirs, quantize=True, q_group_size=g, q_bits=bits,
                        quant_predicate=pred)
                a, b = load_dir(ours), load_dir(theirs)
                self.assertEqual(sorted(a), sorted(b))
                for k in sorted(a):
                    self.assertEqual(a[k].dtype, b[k].dtype, k)
                    self.assertEqual(a[k].shape, b[k].shape, k)
                    self.assertTrue(raw_bytes(a[k]) == raw_bytes(b[k]), f"{name}: tensor {k} differs")
                ca = read_json(os.path.join(ours, "config.json"))
                cb = read_json(os.path.join(theirs, "config.json"))
                qa, qb = ca["quantization"], cb["quantization"]
                self.assertEqual(ca["quantization_config"], qa)
                for key in ("group_size", "bits", "mode"):
                    self.assertEqual(qa[key], qb[key], key)
                n_mod = 0
                for k in a:
                    if k.endswith(".scales"):
                        m = k[:-7]
                        self.assertEqual(qa[m], {"bits": bits, "group_size": g, "mode": "affine"}, m)
                        n_mod += 1
                self.assertEqual(n_mod, 7 * 3 + 1 + (0 if tied or keep else 1))
                if keep:
                    self.assertIs(qa[keep], False)
                    self.assertNotIn(keep, {k for k, v in qb.items() if isinstance(v, dict)})
                if shards > 1:
                    self.assertTrue(os.path.exists(os.path.join(ours, "model.safetensors.index.json")))
                    self.assertGreater(len(glob.glob(os.path.join(ours, "model-*.safetensors"))), 1)
                for fn in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
                    self.assertTrue(os.path.exists(os.path.join(ours, fn)), fn)
                # 2. mlx-lm runs the larder output exactly like its own.
                la, lb = logits(ours), logits(theirs)
                self.assertTrue(np.array_equal(la, lb), f"{name}: mlx-lm logits differ, max {np.abs(la - lb).max()}")
                # 3. reference for larder's own loader (f32 math in mlx: scales/biases upcast).
                lf = logits(ours, upcast=True)
                lf.astype(np.float32).tofile(os.path.join(root, "logits_f32math.bin"))
                with open(os.path.join(root, "ref.json"), "w") as f:
                    json.dump({"tokens": TOKENS, "vocab": 32000, "bits": bits, "group_size": g,
                               "logits": {"f32math": "logits_f32math.bin"}}, f)
                code, out, err = run("generate", ours, "--prompt", "Once upon a time", "-n", "8", "--temp", "0",
                                     "--ignore-eos")
                self.assertEqual(code, 0, err)
                print(f"[quantize] {name}: {len(a)} tensors byte-identical to mlx_lm.convert, "
                      f"mlx-lm logits identical; larder generate ok", file=sys.stderr)

    def test_mixed_precision_matches_mlx_lm_with_the_same_plan(self):
        from mlx_lm import convert
        root = os.path.join(OUT, "mixed_target3.5")
        src, ours, theirs = (os.path.join(root, x) for x in ("src", "larder", "mlx"))
        os.makedirs(root)
        make_llama(src, "bf16", False, 1, seed=5)
        code, out, err = run("quantize", src, ours, "--target-bpw", "3.5", "--candidate-bits", "2,4,8",
                             "--group-size", "64", "--bits", "4", "--sensitivity", "proxy")
        self.assertEqual(code, 0, err)
        self.assertIn("mixed precision", err)
        q = read_json(os.path.join(ours, "config.json"))["quantization"]
        sens = read_json(os.path.join(ours, "sensitivity.json"))
        self.assertEqual(sens["reference"], "weight-error-proxy")
        per = {k: v for k, v in q.items() if isinstance(v, dict)}
        block = [v["bits"] for k, v in per.items() if ".layers." in k]
        self.assertGreater(len(set(block)), 1, per)
        self.assertTrue(set(block) <= {2, 4, 8})
        params = {l["name"]: l["params"] for l in sens["layers"]}
        bpw = sum(per[n]["bits"] * p for n, p in params.items()) / sum(params.values())
        self.assertGreaterEqual(bpw, 3.5)
        self.assertAlmostEqual(bpw, sens["allocation"]["achieved_bpw"], places=9)
        self.assertEqual(q["bits"], min(v["bits"] for v in per.values()))
        # mlx-lm given the same per-module plan writes the same bytes.
        pred = lambda path, module, *rest: per.get(path, False)  # noqa: E731
        convert(src, theirs, quantize=True, q_group_size=64, q_bits=4, quant_predicate=pred)
        a, b = load_dir(ours), load_dir(theirs)
        self.assertEqual(sorted(a), sorted(b))
        for k in a:
            self.assertTrue(raw_bytes(a[k]) == raw_bytes(b[k]), f"mixed: tensor {k} differs")
        self.assertTrue(np.array_equal(logits(ours), logits(theirs)))

    def test_microscaling_modes_match_mlx_lm(self):
        from mlx_lm import convert
        # name, --mode, plan (pattern -> entry; None: uniform), what mlx-lm's predicate returns per path
        plan = {"model.layers.1.mlp.down_proj": {"mode": "mxfp8"}, "*.self_attn.[qk]_proj": {"mode": "nvfp4"},
                "*.self_attn.v_proj": {"mode": "affine", "bits": 8, "group_size": 32},
                "model.layers.2.mlp.gate_proj": False}

        def plan_entry(path):
            import fnmatch
            for k, v in plan.items():
                if path == k or fnmatch.fnmatchcase(path, k):
                    if v is False:
                        return False
                    mode = v["mode"]
                    d = {"affine": (64, 4), "mxfp4": (32, 4), "nvfp4": (16, 4), "mxfp8": (32, 8)}[mode]
                    return {"group_size": v.get("group_size", d[0]), "bits": v.get("bits", d[1]), "mode": mode}
            return None

        cases = [("mode_mxfp4", "mxfp4", None), ("mode_nvfp4", "nvfp4", None), ("mode_mxfp8", "mxfp8", None),
                 ("mode_mxfp4_plan", "mxfp4", plan)]
        for name, mode, pl in cases:
            with self.subTest(case=name):
                root = os.path.join(OUT, name)
                src, ours, theirs = (os.path.join(root, x) for x in ("src", "larder", "mlx"))
                os.makedirs(root)
                make_llama(src, "bf16", name.endswith("plan"), 1, seed=11)
                args = ["quantize", src, ours, "--mode", mode]
                pred = None
                if pl is not None:
                    with open(os.path.join(root, "plan.json"), "w") as f:
                        json.dump(pl, f)
                    args += ["--plan", os.path.join(root, "plan.json")]

                    def pred(path, module, *rest):
                        e = plan_entry(path)
                        return True if e is None else e
                code, out, err = run(*args)
                self.assertEqual(code, 0, err)
                convert(src, theirs, quantize=True, q_mode=mode, quant_predicate=pred)
                a, b = load_dir(ours), load_dir(theirs)
                self.assertEqual(sorted(a), sorted(b))
                for k in sorted(a):
                    self.assertEqual(a[k].dtype, b[k].dtype, k)
                    self.assertEqual(a[k].shape, b[k].shape, k)
                    self.assertTrue(raw_bytes(a[k]) == raw_bytes(b[k]), f"{name}: tensor {k} differs")
                qa = read_json(os.path.join(ours, "config.json"))["quantization"]
                qb = read_json(os.path.join(theirs, "config.json"))["quantization"]
                for key in ("group_size", "bits", "mode"):
                    self.assertEqual(qa[key], qb[key], key)
                for m, e in qa.items():
                    if isinstance(e, dict):
                        self.assertIn("mode", e, m)  # mlx-lm's to_quantized(**entry) defaults to affine
                        want = plan_entry(m) if pl is not None else None
                        if want:
                            self.assertEqual(e, want, m)
                        elif want is None:
                            self.assertEqual(e["mode"], mode, m)
                if pl is not None:
                    self.assertIs(qa["model.layers.2.mlp.gate_proj"], False)
                    self.assertEqual(qa["model.layers.1.mlp.down_proj"]["mode"], "mxfp8")
                    self.assertEqual(a["model.layers.1.mlp.down_proj.scales"].dtype, mx.uint8)
                    self.assertIn("model.layers.0.self_attn.v_proj.biases", a)
                la, lb = logits(ours), logits(theirs)
                self.assertTrue(np.array_equal(la, lb), f"{name}: mlx-lm logits differ, max {np.abs(la - lb).max()}")
                # larder loads both its own and mlx-lm's directory: the roundtrip gtest compares its
                # logits with mlx-lm's (upcast, f32 math) for each.
                lf = logits(ours, upcast=True)
                for who, d in (("larder", ours), ("mlx", theirs)):
                    case = os.path.join(OUT, f"{name}_{who}_dir")
                    os.makedirs(case)
                    os.symlink(d, os.path.join(case, "larder"))
                    (lf if who == "larder" else logits(theirs, upcast=True)).astype(np.float32).tofile(
                        os.path.join(case, "logits_f32math.bin"))
                    with open(os.path.join(case, "ref.json"), "w") as f:
                        json.dump({"tokens": TOKENS, "vocab": 32000, "mode": mode,
                                   "logits": {"f32math": "logits_f32math.bin"}}, f)
                print(f"[quantize] {name}: {len(a)} tensors byte-identical to mlx_lm.convert(q_mode={mode}), "
                      f"mlx-lm logits identical", file=sys.stderr)

    def test_refuses_existing_and_cleans_up(self):
        root = os.path.join(OUT, "refuse")
        src = os.path.join(root, "src")
        os.makedirs(root)
        make_llama(src, "bf16", True, 1, seed=3)
        dst = os.path.join(root, "exists")
        os.makedirs(dst)
        code, out, err = run("quantize", src, dst)
        self.assertNotEqual(code, 0)
        self.assertIn("already exists", err)
        self.assertEqual(os.listdir(dst), [])
        # A failure in the middle (a truncated shard) leaves nothing behind.
        bad = os.path.join(root, "bad")
        shutil.copytree(src, bad)
        with open(os.path.join(bad, "model.safetensors"), "r+b") as f:
            f.truncate(os.path.getsize(os.path.join(bad, "model.safetensors")) // 2)
        code, out, err = run("quantize", bad, os.path.join(root, "out"))
        self.assertNotEqual(code, 0)
        self.assertLess(code, 64, err)
        self.assertEqual(sorted(os.listdir(root)), ["bad", "exists", "src"], err)
        code, out, err = run("quantize", src, os.path.join(root, "out2"), "--bits", "7")
        self.assertNotEqual(code, 0)
        self.assertIn("bits", err)
        self.assertFalse(os.path.exists(os.path.join(root, "out2")))


if __name__ == "__main__":
    unittest.main(verbosity=2)
