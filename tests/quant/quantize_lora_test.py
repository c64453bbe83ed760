#!/usr/bin/env python3
"""`larder quantize SRC OUT --lora PATH[:SCALE]` (issue 45 item 4): the adapter merged into the base
before quantizing. The MLX output and the `--format gguf` output are tensor for tensor identical
to quantizing a checkpoint merged independently in numpy (tests/ref/lora_merge_reference.py:
W + s·B·A in float64, PEFT's alpha/r and rsLoRA alpha/√r factors), for a bf16 base (so the merge
widens it) and two adapters at once (one rsLoRA). The run-time equivalence of the merge (logits
of a full-precision merged output vs the adapter applied per row) is the gtest
quant_lora_merge_tests. Refusals: a GGUF source, a missing adapter — with nothing left behind."""
import glob
import json
import os
import shutil
import sys
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "ref"))
from quantize_test import BIN, OUT, make_llama, run  # noqa: E402
from lora_merge_reference import merge_peft, read_safetensors  # noqa: E402

MODULES = {"self_attn.q_proj": (128, 128), "self_attn.k_proj": (64, 128), "self_attn.v_proj": (64, 128),
           "self_attn.o_proj": (128, 128), "mlp.gate_proj": (384, 128), "mlp.up_proj": (384, 128),
           "mlp.down_proj": (128, 384)}


def write_peft(out, seed, modules, rank, alpha, rslora=False):
    from safetensors.numpy import save_file
    rng = np.random.default_rng(seed)
    os.makedirs(out)
    t = {}
    for layer in range(3):
        for m in modules:
            o, i = MODULES[m]
            key = f"base_model.model.model.layers.{layer}.{m}"
            t[key + ".lora_A.weight"] = (rng.standard_normal((rank, i)) * i ** -0.5).astype(np.float32)
            t[key + ".lora_B.weight"] = (rng.standard_normal((o, rank)) * 0.05).astype(np.float32)
    save_file(t, os.path.join(out, "adapter_model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "r": rank, "lora_alpha": alpha, "use_rslora": rslora,
                   "target_modules": sorted({m.split(".")[1] for m in modules})}, f)
    return out


MODELS = os.environ.get("LARDER_MODELS_DIR") or os.path.join(HERE, "../../.cache/models")
BPE_TOK = os.path.join(MODELS, "SmolLM2-135M-Instruct-hf")  # byte-level BPE: GGUF needs one


def make_bpe_llama(d, seed):
    """make_llama's shapes (f32, one shard: the F32 output is then compared with f32 kernels on
    both sides) with SmolLM2's tokenizer and vocabulary (49152): the GGUF writer converts only
    byte-level BPE vocabularies."""
    from model_reference import write_safetensors
    rng = np.random.default_rng(seed)
    H, I, L, V = 128, 384, 3, 49152
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H,
           "intermediate_size": I, "num_hidden_layers": L, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 32, "vocab_size": V, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
           "max_position_embeddings": 2048, "tie_word_embeddings": True, "hidden_act": "silu",
           "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32"}
    w = {"model.embed_tokens.weight": rng.normal(0, 0.5, (V, H)), "model.norm.weight": 1 + 0.1 * rng.normal(size=H)}
    for layer in range(L):
        p = f"model.layers.{layer}."
        w[p + "input_layernorm.weight"] = 1 + 0.1 * rng.normal(size=H)
        w[p + "post_attention_layernorm.weight"] = 1 + 0.1 * rng.normal(size=H)
        for m, shp in MODULES.items():
            w[p + m + ".weight"] = rng.standard_t(5, shp) / np.sqrt(shp[1])
    os.makedirs(d)
    write_safetensors(os.path.join(d, "model.safetensors"), {k: ("F32", np.asarray(v, np.float32)) for k, v in w.items()})
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    for fn in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(BPE_TOK, fn), d)


def mlx_tensors(d):
    out = {}
    for f in sorted(glob.glob(os.path.join(d, "*.safetensors"))):
        out.update(read_safetensors(f))
    return out


def gguf_tensors(path):
    from gguf import GGUFReader
    return {t.name: (int(t.tensor_type), bytes(np.asarray(t.data).tobytes())) for t in GGUFReader(path).tensors}


class QuantizeLoraTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.root = os.path.join(OUT, "lora-merge")
        shutil.rmtree(cls.root, ignore_errors=True)
        os.makedirs(cls.root)
        cls.src = os.path.join(cls.root, "base")
        make_llama(cls.src, "bf16", False, 2, seed=7)
        cls.a = write_peft(os.path.join(cls.root, "a"), 1, list(MODULES), 8, 16)
        cls.b = write_peft(os.path.join(cls.root, "b"), 2, ["self_attn.q_proj", "mlp.down_proj"], 4, 8, rslora=True)
        cls.uses = [(cls.a, 0.5), (cls.b, 2.0)]
        cls.merged = os.path.join(cls.root, "merged-by-numpy")
        names = merge_peft(cls.src, cls.uses, cls.merged)
        assert len(names) == 21, names  # a: 7 modules × 3 layers; b: a subset of them
        cls.bpe = None
        if os.path.exists(os.path.join(BPE_TOK, "tokenizer.json")):
            cls.bpe = os.path.join(cls.root, "base-bpe")
            make_bpe_llama(cls.bpe, 8)
            cls.bpe_merged = os.path.join(cls.root, "merged-bpe-by-numpy")
            merge_peft(cls.bpe, cls.uses, cls.bpe_merged)

    def need_bpe(self):
        if not self.bpe:
            self.skipTest(f"no byte-level BPE tokenizer at {BPE_TOK} (GGUF output needs one)")

    def quantize(self, src, dst, *extra):
        code, out, err = run("quantize", src, dst, *extra)
        self.assertEqual(code, 0, err)
        return err

    def test_mlx_output_equals_quantizing_the_numpy_merge(self):
        lora = ["--lora", f"{self.a}:0.5", "--lora", f"{self.b}:2"]
        ours = os.path.join(self.root, "mlx-lora")
        err = self.quantize(self.src, ours, "--bits", "4", "--group-size", "64", *lora)
        self.assertIn("merged 2 adapter(s) into 21 projection weights", err)
        theirs = os.path.join(self.root, "mlx-merged")
        self.quantize(self.merged, theirs, "--bits", "4", "--group-size", "64")
        plain = os.path.join(self.root, "mlx-plain")
        self.quantize(self.src, plain, "--bits", "4", "--group-size", "64")
        a, b, p = mlx_tensors(ours), mlx_tensors(theirs), mlx_tensors(plain)
        self.assertEqual(sorted(a), sorted(b))
        for name in a:
            self.assertEqual(a[name], b[name], name)
        changed = [n for n in a if n.endswith("q_proj.weight") and a[n][2] != p[n][2]]
        self.assertEqual(len(changed), 3, "the merge changes the quantized q_proj of every layer")
        with open(os.path.join(ours, "config.json")) as f1, open(os.path.join(theirs, "config.json")) as f2:
            self.assertEqual(json.load(f1)["quantization"], json.load(f2)["quantization"])
        # the order of --lora does not matter (the merge sums in the canonical order)
        swapped = os.path.join(self.root, "mlx-lora-swapped")
        self.quantize(self.src, swapped, "--lora", f"{self.b}:2", "--lora", f"{self.a}:0.5")
        self.assertEqual(mlx_tensors(swapped), a)
        self.assertEqual([f for f in os.listdir(self.root) if ".lora-merge-" in f], [])

    def test_gguf_output_equals_quantizing_the_numpy_merge(self):
        self.need_bpe()
        ours = os.path.join(self.root, "lora.gguf")
        self.quantize(self.bpe, ours, "--format", "gguf", "--type", "Q4_K_M", "--lora", f"{self.a}:0.5",
                      "--lora", f"{self.b}:2")
        theirs = os.path.join(self.root, "merged.gguf")
        self.quantize(self.bpe_merged, theirs, "--format", "gguf", "--type", "Q4_K_M")
        a, b = gguf_tensors(ours), gguf_tensors(theirs)
        self.assertEqual(sorted(a), sorted(b))
        for name in a:
            self.assertEqual(a[name], b[name], name)

    def test_gguf_f32_output_gives_the_run_time_adapter(self):
        """The full-precision output: its next-token distributions equal the base run with the same
        adapters at run time (`eval kl MERGED BASE --lora …`) to fp32 rounding — KL ≈ 1e-10 where a
        wrong factor (here: the adapters at half their scale) gives orders of magnitude more."""
        self.need_bpe()
        f32 = os.path.join(self.root, "lora-f32.gguf")
        self.quantize(self.bpe, f32, "--format", "gguf", "--type", "F32", "--lora", f"{self.a}:0.5",
                      "--lora", f"{self.b}:2")
        text = os.path.join(self.root, "text.txt")
        with open(os.path.join(os.environ["LARDER_SHARED_DIR"], "corpora", "tinyshakespeare.txt")) as f:
            open(text, "w").write(f.read(6000))

        def kl(*lora):
            code, out, err = run("eval", "kl", f32, self.bpe, "--text", text, "--ctx", "64", "--chunks", "4",
                                 "--json", *lora)
            self.assertEqual(code, 0, err)
            return json.loads(out)
        same = kl("--lora", f"{self.a}:0.5", "--lora", f"{self.b}:2")
        self.assertLess(same["kl"]["max"], 1e-6, same)
        self.assertEqual(same["top1"], 1.0)
        off = kl("--lora", f"{self.a}:0.25", "--lora", f"{self.b}:1")
        self.assertGreater(off["kl"]["max"], 100 * max(same["kl"]["max"], 1e-9), off)

    def test_refusals_leave_nothing(self):
        self.need_bpe()
        gguf_src = os.path.join(self.root, "src.gguf")
        self.quantize(self.bpe, gguf_src, "--format", "gguf", "--type", "F16")
        cases = [((gguf_src, os.path.join(self.root, "x1"), "--lora", self.a), "needs a Hugging Face safetensors directory"),
                 ((self.src, os.path.join(self.root, "x2"), "--lora", "/nonexistent/adapter"), "/nonexistent/adapter"),
                 ((self.src, os.path.join(self.root, "x3"), "--lora", f"{self.a}:inf"), "finite")]
        for args, msg in cases:
            with self.subTest(args=args):
                code, _, err = run("quantize", *args)
                self.assertNotEqual(code, 0)
                self.assertIn(msg, err)
                self.assertFalse(os.path.exists(args[1]))
        self.assertEqual([f for f in os.listdir(self.root) if ".lora-merge-" in f or ".partial-" in f], [])


if __name__ == "__main__":
    unittest.main()
