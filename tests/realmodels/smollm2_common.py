#!/usr/bin/env python3
"""Shared by smollm2_hf_test.py and smollm2_quant_test.py (SmolLM2-135M-Instruct as an HF directory
on real trained weights; see those files for what each checks): paths, the corpus, larder and
mlx-lm runners, and the reference-logit writer for smollm2_parity_test.cpp.
Run with LARDER_BIN, LARDER_SOURCE_DIR, LARDER_SHARED_DIR, LARDER_TEST_DATA_DIR (and optionally
LARDER_MODELS_DIR) set; CTest does.
"""
import json
import os
import shutil
import subprocess
import sys
import unittest
from concurrent.futures import ThreadPoolExecutor

import numpy as np

BIN = os.environ["LARDER_BIN"]
SRC = os.environ["LARDER_SOURCE_DIR"]
SHARED = os.environ["LARDER_SHARED_DIR"]
DATA = os.environ["LARDER_TEST_DATA_DIR"]
MODELS = os.environ.get("LARDER_MODELS_DIR") or os.path.join(SRC, ".cache", "models")
GGUF = os.path.join(MODELS, "SmolLM2-135M-Instruct.Q4_1.gguf")
HF = os.path.join(DATA, "smollm2-hf")
QUANT = os.path.join(DATA, "smollm2-quant")
PARITY = os.path.join(DATA, "smollm2-parity")  # <case>/ref.json + logits for the gtest
CONVERTER = os.path.join(SRC, "scripts", "gguf_to_hf.py")

# Texts for the tokenizer comparison beyond the llama-tokenize goldens.
EDGE = [
    "", " ", "  two leading spaces", "trailing space ", "   \n\n\t ", "a", "\n", "line one\nline two\n\n",
    "digits 0123456789 and 3.14159, 1,000,000 and 2024-12-02", "x=12345678901234567890;",
    "unicode: héllo wörld — “quoted” ‘single’ … naïve café", "日本語のテキスト", "emoji 🤖🐈‍⬛ end",
    "def f(x):\n    return {'a': [1, 2, 3]}  # comment\n", "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "a<|endoftext|>b<|im_end|>", "I'm sure they'll say it's 'quoted' -- don't", "tabs\tand\ttabs   and   spaces",
]
PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.", "Explain what a CPU does in one sentence.",
           "List three fruits."]


def run(args, timeout=600, check=True):
    p = subprocess.run(args, capture_output=True, text=True, timeout=timeout, errors="replace")
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(args[:4])} failed ({p.returncode}): {p.stderr[-3000:]}")
    return p


def larder_ids(model, text, add_special=False):
    return json.loads(run([BIN, "tokenize", model, "--text", text] + (["--add-special"] if add_special else [])).stdout)


def shakespeare(start, n):
    with open(os.path.join(SHARED, "corpora", "tinyshakespeare.txt"), encoding="utf-8") as f:
        return f.read()[start:start + n]


def mlx_logits(path, ids):
    """mlx-lm on the CPU with every floating parameter upcast to f32 ("f32math"): the bf16 weights
    (or the affine scales/biases) are the same values larder reads, so the two differ only in
    summation order."""
    from pathlib import Path
    import mlx.core as mx
    from mlx_lm.utils import load_model

    mx.set_default_device(mx.cpu)
    model, _ = load_model(Path(path))
    model.set_dtype(mx.float32)
    return np.array(model(mx.array([ids], dtype=mx.int32))[0].astype(mx.float32))


def eval_kl(base, cand, text_path, ctx=128, chunks=4, sanity=False):
    return json.loads(run([BIN, "eval", "kl", base, cand, "--text", text_path, "--ctx", str(ctx), "--chunks", str(chunks),
                           "--json"] + ([] if sanity else ["--no-sanity"])).stdout)


def skip_without_gguf():
    if not os.path.isfile(GGUF):
        raise unittest.SkipTest(f"{GGUF} is absent: run scripts/fetch_models.sh (or set LARDER_MODELS_DIR)")


def eval_text():
    path = os.path.join(DATA, "smollm2-eval.txt")
    with open(path, "w", encoding="utf-8") as f:
        f.write(shakespeare(200000, 12000))
    return path


def parity_ids(tok):
    """64 teacher-forced tokens: a chat turn and prose, so the logits are those of real use."""
    convo = ("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
             "The capital of France is Paris.<|im_end|>\n")
    return (tok.encode(convo, add_special_tokens=False).ids
            + tok.encode(shakespeare(1000, 600), add_special_tokens=False).ids)[:64]


def write_ref(case, model_dir, kind, ids):
    """mlx-lm's f32math logits of model_dir for the parity gtest (<testdata>/smollm2-parity/CASE)."""
    d = os.path.join(PARITY, case)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    lg = mlx_logits(model_dir, ids)
    lg.astype(np.float32).tofile(os.path.join(d, "logits_f32math.bin"))
    with open(os.path.join(d, "ref.json"), "w") as f:
        json.dump({"model": model_dir, "kind": kind, "tokens": ids, "vocab": int(lg.shape[1]),
                   "logits": {"f32math": "logits_f32math.bin"}}, f)
    return lg
