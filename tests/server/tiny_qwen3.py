"""Makes a small random-weight Qwen3 checkpoint (Hugging Face directory layout) with the real Qwen3
tokenizer and chat template (../shared/tokenizers/hf/qwen3: 151,669 tokens, Hermes-style
`<tool_call>` markup), for the constrained-decoding tests (issue 15): a 151k vocabulary is what
makes the per-token mask cost show, and the template is the one whose tool-call trigger the lazy
`tool_choice: auto` constraint waits for.

The text it writes means nothing. lm_head rows are zero except for a seeded subset of short
JSON-ish tokens (punctuation, quotes, digits, short lower-case words) with a large norm, so what a
grammar leaves open is mostly decided among those: strings close after a few tokens (many of the
subset contain a quote) and answers end well inside a small max_tokens. `<tool_call>` (id 151657,
an added but not special token) is never in the subset: the model only writes it when a request's
logit_bias asks it to.

Run standalone:  python tiny_qwen3.py OUT_DIR [--shared ../../../shared]
"""
import argparse
import json
import os
import re
import shutil

import numpy as np

VOCAB = 151936  # Qwen3's embedding rows (the tokenizer's 151,669 ids, padded)


def make_qwen3_model(out_dir, shared_dir, seed=20261204, hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16,
                     intermediate=128, n_words=300):
    from safetensors.numpy import save_file

    src = os.path.join(shared_dir, "tokenizers", "hf", "qwen3")
    if not os.path.exists(os.path.join(src, "tokenizer.json")):
        raise FileNotFoundError(f"no qwen3 tokenizer under {shared_dir}/tokenizers/hf")
    os.makedirs(out_dir, exist_ok=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(src, f), os.path.join(out_dir, f))
    with open(os.path.join(src, "tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    special = {t["content"]: t["id"] for t in tok["added_tokens"]}
    eos = [special["<|im_end|>"], special["<|endoftext|>"]]

    rng = np.random.default_rng(seed)
    # Byte-level BPE pieces (\u0120 a space, \u010a a newline): every piece made only of JSON
    # punctuation (a third of them hold a quote), the digits, and a seeded sample of short words.
    vocab = tok["model"]["vocab"]
    punct = [i for p, i in vocab.items() if re.match(r'^[\u0120\u010a"{}\[\],:.\-]{1,4}$', p)]
    digits = [i for p, i in vocab.items() if re.match(r"^\u0120?[0-9]{1,3}$", p)]
    words = sorted(i for p, i in vocab.items() if re.match(r"^\u0120?[a-z]{2,6}$", p))
    allowed = np.sort(np.array(sorted(punct) + sorted(digits) +
                               list(rng.choice(np.array(words), size=n_words, replace=False))))

    def randn(*shape, std):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    t = {"model.embed_tokens.weight": randn(VOCAB, hidden, std=1.0)}
    for n in range(layers):
        p = f"model.layers.{n}."
        t[p + "input_layernorm.weight"] = np.ones(hidden, np.float32)
        t[p + "post_attention_layernorm.weight"] = np.ones(hidden, np.float32)
        t[p + "self_attn.q_proj.weight"] = randn(heads * head_dim, hidden, std=hidden ** -0.5)
        t[p + "self_attn.k_proj.weight"] = randn(kv_heads * head_dim, hidden, std=hidden ** -0.5)
        t[p + "self_attn.v_proj.weight"] = randn(kv_heads * head_dim, hidden, std=hidden ** -0.5)
        t[p + "self_attn.o_proj.weight"] = randn(hidden, heads * head_dim, std=(heads * head_dim) ** -0.5)
        t[p + "self_attn.q_norm.weight"] = np.ones(head_dim, np.float32)
        t[p + "self_attn.k_norm.weight"] = np.ones(head_dim, np.float32)
        t[p + "mlp.gate_proj.weight"] = randn(intermediate, hidden, std=hidden ** -0.5)
        t[p + "mlp.up_proj.weight"] = randn(intermediate, hidden, std=hidden ** -0.5)
        t[p + "mlp.down_proj.weight"] = randn(hidden, intermediate, std=intermediate ** -0.5)
    t["model.norm.weight"] = np.ones(hidden, np.float32)
    lm = np.zeros((VOCAB, hidden), np.float32)
    lm[allowed] = randn(len(allowed), hidden, std=1.0)
    t["lm_head.weight"] = lm
    save_file(t, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})

    config = {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "hidden_size": hidden, "intermediate_size": intermediate, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim,
        "vocab_size": VOCAB, "max_position_embeddings": 8192, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "hidden_act": "silu", "tie_word_embeddings": False,
        "torch_dtype": "float32", "bos_token_id": special["<|endoftext|>"], "eos_token_id": eos,
    }
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": special["<|endoftext|>"], "eos_token_id": eos}, f)
    return {"dir": out_dir, "vocab": VOCAB, "allowed": [int(i) for i in allowed], "eos": eos,
            "tool_call_id": special["<tool_call>"]}


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--shared", default=os.environ.get(
        "LARDER_SHARED_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../shared")))
    a = ap.parse_args()
    info = make_qwen3_model(a.out, a.shared)
    print(json.dumps({k: v for k, v in info.items() if k != "allowed"} | {"allowed": len(info["allowed"])}))
