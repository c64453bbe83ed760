"""Makes a small random-weight Llama checkpoint (Hugging Face directory layout) with a real
tokenizer and chat template, for black-box server tests.

The weights are random (seeded), so the text it generates means nothing; it is only ever compared
with other runs of the same model (e.g. `larder generate`). Two choices keep that comparison
robust and the text easy to reason about:
  * lm_head rows are zero except for a seeded subset of plain lower-case word tokens (" word"),
    so greedy decoding only ever emits those: no special tokens, no EOS, no partial UTF-8, and
    every token starts with a space (a substring across a space spans a token boundary);
  * the allowed rows have a large norm, so greedy argmax gaps are wide and batching-level
    floating-point differences cannot flip a choice.

Run standalone:  python tiny_model.py OUT_DIR [--shared ../../../shared]
"""
import argparse
import json
import os
import re
import shutil

import numpy as np

TOKENIZER_CHOICES = ("llama3_1", "llama3")


def _vocab_size(tok):
    ids = list(tok["model"]["vocab"].values()) + [t["id"] for t in tok.get("added_tokens", [])]
    return max(ids) + 1


def make_chat_model(out_dir, shared_dir, seed=20261202, hidden=64, layers=2, heads=4, kv_heads=2,
                    intermediate=128, n_allowed=1500):
    """Writes config.json, generation_config.json, model.safetensors, tokenizer.json and
    tokenizer_config.json into out_dir (created). Returns a dict describing the model."""
    from safetensors.numpy import save_file

    src = None
    for name in TOKENIZER_CHOICES:
        d = os.path.join(shared_dir, "tokenizers", "hf", name)
        if os.path.exists(os.path.join(d, "tokenizer.json")):
            src = d
            break
    if src is None:
        raise FileNotFoundError(f"no llama3 tokenizer under {shared_dir}/tokenizers/hf")
    os.makedirs(out_dir, exist_ok=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(src, f), os.path.join(out_dir, f))
    with open(os.path.join(src, "tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    with open(os.path.join(src, "tokenizer_config.json"), encoding="utf-8") as f:
        tcfg = json.load(f)
    vocab = _vocab_size(tok)
    special = {t["content"]: t["id"] for t in tok.get("added_tokens", [])}
    bos_id = special.get(tcfg.get("bos_token"), 128000)
    eos_id = special.get(tcfg.get("eos_token"), 128009)

    rng = np.random.default_rng(seed)
    word = re.compile(r"^\u0120[a-z]{3,8}$")  # byte-level BPE: \u0120 is the space byte
    candidates = sorted(i for p, i in tok["model"]["vocab"].items() if word.match(p))
    allowed = np.sort(rng.choice(np.array(candidates), size=min(n_allowed, len(candidates)),
                                 replace=False))

    head_dim = hidden // heads

    def randn(*shape, std):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    t = {"model.embed_tokens.weight": randn(vocab, hidden, std=1.0)}
    for n in range(layers):
        p = f"model.layers.{n}."
        t[p + "input_layernorm.weight"] = np.ones(hidden, np.float32)
        t[p + "post_attention_layernorm.weight"] = np.ones(hidden, np.float32)
        # Unit-gain projections: attention and MLP change the residual as much as the token
        # embedding does, so the continuation depends on the whole prompt, not only its last token.
        t[p + "self_attn.q_proj.weight"] = randn(heads * head_dim, hidden, std=hidden ** -0.5 * 2)
        t[p + "self_attn.k_proj.weight"] = randn(kv_heads * head_dim, hidden, std=hidden ** -0.5 * 2)
        t[p + "self_attn.v_proj.weight"] = randn(kv_heads * head_dim, hidden, std=hidden ** -0.5)
        t[p + "self_attn.o_proj.weight"] = randn(hidden, heads * head_dim, std=(heads * head_dim) ** -0.5)
        t[p + "mlp.gate_proj.weight"] = randn(intermediate, hidden, std=hidden ** -0.5)
        t[p + "mlp.up_proj.weight"] = randn(intermediate, hidden, std=hidden ** -0.5)
        t[p + "mlp.down_proj.weight"] = randn(hidden, intermediate, std=intermediate ** -0.5)
    t["model.norm.weight"] = np.ones(hidden, np.float32)
    lm = np.zeros((vocab, hidden), np.float32)
    lm[allowed] = randn(len(allowed), hidden, std=1.5)
    t["lm_head.weight"] = lm
    save_file(t, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})

    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": hidden, "intermediate_size": intermediate, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim,
        "vocab_size": vocab, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0, "hidden_act": "silu", "tie_word_embeddings": False,
        "torch_dtype": "float32", "bos_token_id": bos_id, "eos_token_id": eos_id,
    }
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    # Greedy unless a request asks otherwise would hide default handling; keep the spec's
    # built-in defaults by writing only token ids here.
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": bos_id, "eos_token_id": eos_id}, f)
    return {"dir": out_dir, "tokenizer": os.path.basename(src), "vocab": vocab,
            "allowed": [int(i) for i in allowed], "bos_id": bos_id, "eos_id": eos_id,
            "context": 2048}


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--shared", default=os.environ.get(
        "LARDER_SHARED_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../shared")))
    a = ap.parse_args()
    info = make_chat_model(a.out, a.shared)
    print(json.dumps({k: v for k, v in info.items() if k != "allowed"} | {"allowed": len(info["allowed"])}))
