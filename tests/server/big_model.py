"""A random-weight Llama of a real 1B-class shape (hidden 2048, 16 layers, 32 heads, 8 KV heads,
FFN 8192, vocab 32000 — Llama-3.2-1B-like with the Llama 2 vocabulary) as a Hugging Face BF16
directory, for tests that need realistic tensor sizes (KV store equivalence at 1B scale).

Weights are seeded normal(0, 0.02) written straight to safetensors (numpy has no bf16, so the
file is assembled by hand: the top 16 bits of each f32, round-to-nearest-even). 2.2 GB; made
once per test run into the given directory and reused when it is already complete.

Run standalone:  python big_model.py OUT_DIR [--shared ../../../shared]
"""
import argparse
import json
import os
import shutil

import numpy as np

SHAPE = dict(hidden=2048, layers=16, heads=32, kv_heads=8, ffn=8192, vocab=32000)


def _bf16(a):
    u = a.astype(np.float32).view(np.uint32)
    u = u + 0x7FFF + ((u >> 16) & 1)  # round to nearest even
    return (u >> 16).astype(np.uint16)


def _tensors(s):
    h, kv = s["hidden"], s["kv_heads"] * (s["hidden"] // s["heads"])
    yield "model.embed_tokens.weight", (s["vocab"], h), "w"
    for i in range(s["layers"]):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", (h,), "one"
        yield p + "post_attention_layernorm.weight", (h,), "one"
        yield p + "self_attn.q_proj.weight", (h, h), "w"
        yield p + "self_attn.k_proj.weight", (kv, h), "w"
        yield p + "self_attn.v_proj.weight", (kv, h), "w"
        yield p + "self_attn.o_proj.weight", (h, h), "w"
        yield p + "mlp.gate_proj.weight", (s["ffn"], h), "w"
        yield p + "mlp.up_proj.weight", (s["ffn"], h), "w"
        yield p + "mlp.down_proj.weight", (h, s["ffn"]), "w"
    yield "model.norm.weight", (h,), "one"
    yield "lm_head.weight", (s["vocab"], h), "w"


def make_big_model(out_dir, shared_dir, seed=1234):
    s = SHAPE
    done = os.path.join(out_dir, ".complete")
    if os.path.exists(done):
        return out_dir
    os.makedirs(out_dir, exist_ok=True)
    cfg = {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": s["hidden"],
        "num_hidden_layers": s["layers"], "num_attention_heads": s["heads"],
        "num_key_value_heads": s["kv_heads"], "intermediate_size": s["ffn"], "vocab_size": s["vocab"],
        "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2,
    }
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f)
    tok_dir = os.path.join(shared_dir, "tokenizers", "hf", "llama2")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(tok_dir, name), os.path.join(out_dir, name))
    header, offset = {}, 0
    specs = list(_tensors(s))
    for name, shape, _ in specs:
        n = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    hb = json.dumps(header).encode()
    hb += b" " * ((8 - len(hb) % 8) % 8)
    rng = np.random.default_rng(seed)
    tmp = os.path.join(out_dir, "model.safetensors.tmp")
    with open(tmp, "wb") as f:
        f.write(len(hb).to_bytes(8, "little"))
        f.write(hb)
        for name, shape, kind in specs:
            if kind == "one":
                f.write(_bf16(np.ones(shape, np.float32)).tobytes())
                continue
            rows = shape[0]
            step = max(1, (1 << 24) // int(np.prod(shape[1:])))
            for r in range(0, rows, step):
                chunk = rng.standard_normal((min(step, rows - r),) + shape[1:], dtype=np.float32) * 0.02
                f.write(_bf16(chunk).tobytes())
    os.replace(tmp, os.path.join(out_dir, "model.safetensors"))
    open(done, "w").close()
    return out_dir


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--shared", default=os.path.join(os.path.dirname(__file__), "../../../shared"))
    a = ap.parse_args()
    print(make_big_model(a.out, a.shared))
