#!/usr/bin/env python3
"""`larder eval ppl|kl` against numpy statistics over mlx-lm logits (float32, CPU backend).

Two small random Llama checkpoints (B is A with perturbed weights) with the real llama2
tokenizer; the text is a slice of tinyshakespeare, tokenized here by HF `tokenizers` with BOS
first (as llama-perplexity tokenizes), chunked by the llama.cpp rule (non-overlapping n_ctx
chunks, first token -> BOS, second half scored),
and every statistic is recomputed in float64 numpy from mlx-lm's logits. Then stories260K (a
real trained model) on the same text, and the CLI's refusals of bad input.
Run with LARDER_BIN, LARDER_SHARED_DIR, LARDER_TEST_DATA_DIR set (CTest does).
"""
import json
import os
import shutil
import subprocess
import sys
import unittest

import numpy as np
import mlx.core as mx
from tokenizers import Tokenizer

mx.set_default_device(mx.cpu)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ref"))
from model_reference import write_safetensors as write_typed_safetensors  # noqa: E402

BIN = os.environ["LARDER_BIN"]
SHARED = os.environ["LARDER_SHARED_DIR"]
OUT = os.path.join(os.environ["LARDER_TEST_DATA_DIR"], "eval")
TOK = os.path.join(SHARED, "tokenizers/hf/llama2")
STORIES = os.path.join(SHARED, "models/stories260K/stories260K.gguf")
CTX, CHUNKS = 128, 4


def write_safetensors(path, tensors):
    write_typed_safetensors(path, {k: ("F32", np.ascontiguousarray(v, dtype=np.float32)) for k, v in tensors.items()})


def llama_weights(seed):
    rng = np.random.default_rng(seed)
    H, I, L, V, nh, nkv = 64, 160, 2, 32000, 4, 2
    hd = H // nh
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H,
           "intermediate_size": I, "num_hidden_layers": L, "num_attention_heads": nh,
           "num_key_value_heads": nkv, "head_dim": hd, "vocab_size": V, "rms_norm_eps": 1e-5,
           "rope_theta": 10000.0, "max_position_embeddings": 1024, "tie_word_embeddings": False,
           "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32"}
    # Large enough weights that the next-token distributions are far from uniform (so top-1 and
    # KL are informative), small enough that they are not one-hot.
    w = {"model.embed_tokens.weight": rng.normal(0, 1.0, (V, H)),
         "model.norm.weight": 1 + 0.1 * rng.normal(size=H),
         "lm_head.weight": rng.normal(0, 0.15, (V, H))}
    for l in range(L):
        p = f"model.layers.{l}."
        w[p + "input_layernorm.weight"] = 1 + 0.1 * rng.normal(size=H)
        w[p + "post_attention_layernorm.weight"] = 1 + 0.1 * rng.normal(size=H)
        for n, shp in [("self_attn.q_proj", (nh * hd, H)), ("self_attn.k_proj", (nkv * hd, H)),
                       ("self_attn.v_proj", (nkv * hd, H)), ("self_attn.o_proj", (H, nh * hd)),
                       ("mlp.gate_proj", (I, H)), ("mlp.up_proj", (I, H)), ("mlp.down_proj", (H, I))]:
            w[p + n + ".weight"] = rng.normal(0, 2.0 / np.sqrt(shp[1]), shp)
    return cfg, w


def write_model(d, cfg, w):
    os.makedirs(d)
    write_safetensors(os.path.join(d, "model.safetensors"), w)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    for fn in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(TOK, fn), d)
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 1, "eos_token_id": 2}, f)


def log_softmax(x):
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True)))


def run(*args):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=300)


class EvalTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        shutil.rmtree(OUT, ignore_errors=True)
        os.makedirs(OUT)
        cls.a, cls.b = os.path.join(OUT, "model_a"), os.path.join(OUT, "model_b")
        cfg, wa = llama_weights(0)
        write_model(cls.a, cfg, wa)
        rng = np.random.default_rng(1)
        # B = A plus relative noise: a stand-in for a quantized candidate.
        wb = {k: v + 0.05 * np.std(v) * rng.normal(size=v.shape) if v.ndim == 2 else v for k, v in wa.items()}
        write_model(cls.b, cfg, wb)
        with open(os.path.join(SHARED, "corpora/tinyshakespeare.txt"), encoding="utf-8") as f:
            corpus = f.read()
        cls.text = os.path.join(OUT, "shakespeare.txt")
        with open(cls.text, "w", encoding="utf-8") as f:
            f.write(corpus[:5000])
        cls.long_text = os.path.join(OUT, "shakespeare_long.txt")
        with open(cls.long_text, "w", encoding="utf-8") as f:
            f.write(corpus[:40000])
        # llama-perplexity's stream: the text with BOS (the llama2 tokenizer adds it), so chunk 0
        # keeps the text's first token and chunk k starts at k * CTX of this stream.
        ids = [1] + Tokenizer.from_file(os.path.join(TOK, "tokenizer.json")).encode(corpus[:5000], add_special_tokens=False).ids
        n = len(ids) // CTX
        assert n >= CHUNKS, f"the text slice has only {len(ids)} tokens"
        cls.chunks = [[1] + ids[i * CTX + 1:(i + 1) * CTX] for i in range(CHUNKS)]  # BOS overwrite
        cls.n_text_tokens = len(ids)
        cls.ref_a, cls.ref_b = cls.logprobs(cls.a), cls.logprobs(cls.b)

    @classmethod
    def logprobs(cls, path):
        from mlx_lm import load
        model, _ = load(path)
        first = CTX // 2
        out = []
        for c in cls.chunks:
            logits = model(mx.array(c)[None])
            mx.eval(logits)
            out.append(log_softmax(np.array(logits[0].astype(mx.float32)))[first:CTX - 1])
        return out  # per chunk: [CTX - 1 - first, V] float64 log-probs

    def targets(self):
        first = CTX // 2
        return np.concatenate([np.array(c[first + 1:CTX]) for c in self.chunks])

    def stats(self, ref, cand):
        t = self.targets()
        lr, lc = np.concatenate(ref), np.concatenate(cand)
        rows = np.arange(len(t))
        pr = np.exp(lr)
        kl = np.maximum((pr * (lr - lc)).sum(axis=1), 0)
        nll_r, nll_c = -lr[rows, t], -lc[rows, t]
        N = len(t)
        top = (lr.argmax(1) == lc.argmax(1))
        dp = np.exp(lc[rows, t]) - np.exp(lr[rows, t])
        return {"N": N, "kl": kl, "nll_r": nll_r, "nll_c": nll_c, "top_count": int(top.sum()), "dp": dp}

    def larder_json(self, *args):
        r = run(*args, "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        return json.loads(r.stdout), r.stderr

    def test_ppl_matches_mlx(self):
        # f32 KV: the reference (mlx-lm) keeps its KV in f32; the CLI default is f16.
        j, err = self.larder_json("eval", "ppl", self.a, "--text", self.text, "--ctx", str(CTX), "--chunks", str(CHUNKS), "-t", "2",
                                  "--kv-dtype", "f32")
        s = self.stats(self.ref_a, self.ref_a)
        nll = s["nll_r"]
        ppl = float(np.exp(nll.mean()))
        se = float(np.std(nll) / np.sqrt(len(nll) - 1))
        self.assertEqual(j["n_tokens"], s["N"])
        self.assertEqual(j["chunks"], CHUNKS)
        self.assertEqual(j["text_tokens"], self.n_text_tokens)
        self.assertEqual(j["bos"], 1)
        self.assertLess(abs(j["ppl"] / ppl - 1), 1e-3, (j["ppl"], ppl))
        self.assertLess(abs(j["ppl_err"] / (ppl * se) - 1), 1e-2, (j["ppl_err"], ppl * se))
        self.assertIn("[1]", err)
        self.assertIn(f"[{CHUNKS}]", err)

    def test_kl_matches_mlx(self):
        j, _ = self.larder_json("eval", "kl", self.a, self.b, "--text", self.text, "--ctx", str(CTX),
                                "--chunks", str(CHUNKS), "-t", "2", "--kv-dtype", "f32")  # as the f32 reference
        s = self.stats(self.ref_a, self.ref_b)
        kl, N = s["kl"], s["N"]
        self.assertEqual(j["n_tokens"], N)
        mean = kl.mean()
        self.assertGreater(mean, 1e-3, "the perturbation should move the distributions")
        self.assertLess(abs(j["kl"]["mean"] - mean), 1e-4 + 1e-3 * mean, (j["kl"]["mean"], mean))
        se = np.std(kl) / np.sqrt(N - 1)
        self.assertLess(abs(j["kl"]["mean_se"] - se), 1e-4 + 1e-2 * se)
        for key, q in [("median", 50), ("p90", 90), ("p99", 99), ("p999", 99.9)]:
            want = np.percentile(kl, q)
            self.assertLess(abs(j["kl"][key] - want), 1e-4 + 1e-2 * want, (key, j["kl"][key], want))
        self.assertLess(abs(j["kl"]["max"] - kl.max()), 1e-4 + 1e-2 * kl.max())
        # Argmax may flip where two logits are within float noise: within one position.
        self.assertLessEqual(abs(round(j["top1"] * N) - s["top_count"]), 1, (j["top1"] * N, s["top_count"]))
        p = s["top_count"] / N
        self.assertLess(abs(j["top1_err"] - np.sqrt(p * (1 - p) / (N - 1))), 2e-3)
        self.assertLess(0.05, p)  # the comparison is not vacuous: the models agree often ...
        self.assertLess(p, 0.999)  # ... but not always
        ratio = s["nll_c"].mean() - s["nll_r"].mean()
        self.assertLess(abs(j["ln_ppl_ratio"] - ratio), 1e-4 + 1e-3 * abs(ratio))
        self.assertLess(abs(j["base_ppl"] / np.exp(s["nll_r"].mean()) - 1), 1e-3)
        self.assertLess(abs(j["cand_ppl"] / np.exp(s["nll_c"].mean()) - 1), 1e-3)
        self.assertLess(abs(j["mean_dp"] - s["dp"].mean()), 1e-8 + 1e-3 * abs(s["dp"].mean()))
        rms = np.sqrt((s["dp"] ** 2).mean())
        self.assertLess(abs(j["rms_dp"] - rms), 1e-8 + 1e-3 * rms)
        san = j["sanity"]
        self.assertEqual(len(san["prompts"]), 6)
        for pr in san["prompts"]:
            self.assertLessEqual(pr["identical_prefix"], min(pr["base_tokens"], pr["cand_tokens"]))

    def test_kl_self_is_zero(self):
        j, _ = self.larder_json("eval", "kl", self.a, self.a, "--text", self.text, "--ctx", str(CTX),
                                "--chunks", "2", "-t", "2")
        self.assertEqual(j["kl"]["mean"], 0.0)
        self.assertEqual(j["kl"]["max"], 0.0)
        self.assertEqual(j["top1"], 1.0)
        self.assertEqual(j["ln_ppl_ratio"], 0.0)
        self.assertEqual(j["rms_dp"], 0.0)
        san = j["sanity"]
        self.assertEqual(san["collapsed"], 0)
        self.assertEqual(san["base_short"], san["cand_short"])
        for pr in san["prompts"]:
            self.assertEqual(pr["identical_prefix"], pr["base_tokens"])
            self.assertEqual(pr["base_tokens"], pr["cand_tokens"])

    def test_kl_summary_text(self):
        r = run("eval", "kl", self.a, self.b, "--text", self.text, "--ctx", "64", "--chunks", "2", "--no-sanity", "-t", "2")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("KL mean", r.stdout)
        self.assertIn("same top-1", r.stdout)
        self.assertNotIn("greedy sanity", r.stdout)

    def test_stories260k_ppl_finite(self):
        j, _ = self.larder_json("eval", "ppl", STORIES, "--text", self.long_text, "--ctx", "256", "--chunks", "8", "-t", "2")
        self.assertTrue(np.isfinite(j["ppl"]))
        self.assertEqual(j["chunks"], 8)
        # A trained model, even off its domain, beats the uniform distribution over its 512 tokens.
        self.assertLess(j["ppl"], 512)
        self.assertGreater(j["ppl"], 1)

    def check_fails(self, args, *needles):
        r = run(*args)
        self.assertNotEqual(r.returncode, 0, r.stdout)
        for n in needles:
            self.assertIn(n, r.stderr)

    def test_bad_input(self):
        missing = os.path.join(OUT, "no_such_file.txt")
        self.check_fails(["eval", "ppl", STORIES, "--text", missing], "cannot open", missing)
        empty = os.path.join(OUT, "empty.txt")
        with open(empty, "w") as f:
            f.write("  \n")
        self.check_fails(["eval", "ppl", STORIES, "--text", empty], "empty", empty)
        short = os.path.join(OUT, "short.txt")
        with open(short, "w") as f:
            f.write("To be, or not to be.")
        self.check_fails(["eval", "ppl", STORIES, "--text", short, "--ctx", "128"], "shorter than one chunk of 128")
        self.check_fails(["eval", "ppl", STORIES, "--text", self.text, "--ctx", "1"], "--ctx 1")
        self.check_fails(["eval", "ppl", STORIES, "--text", self.text, "--ctx", "100000"], "--ctx 100000 exceeds the context")
        self.check_fails(["eval", "kl", STORIES, self.a, "--text", self.text, "--ctx", "64"],
                         "vocabulary sizes differ", STORIES, self.a, "512", "32000")
        self.check_fails(["eval", "ppl", os.path.join(OUT, "no_model"), "--text", self.text])


if __name__ == "__main__":
    unittest.main()
