"""Makes a small random-weight Qwen3.5 (hybrid: gated DeltaNet + gated full attention, HF
`qwen3_5_text` layout) with the real Qwen3 tokenizer and chat template
(../shared/tokenizers/hf/qwen3), for the server tests of the KV store on recurrent state.

The layers, tensor shapes and random weights are the fixture's own (tests/ref/qwen3_5_reference.py,
checked against mlx-lm's qwen3_5 classes by Qwen35.*), at the tokenizer's vocabulary. lm_head
rows are zero except a seeded sample of short lower-case words with a leading space (Ġword): what
the model writes is a string of such words, which the tokenizer encodes back to the same ids, so
an answer fed back as the next turn's history re-tokenizes as it was generated. Special tokens
(EOS, <think>, <tool_call>) are never written: every answer runs to max_tokens. With
json_ish=True the subset also holds JSON punctuation and digits (as tiny_qwen3.py's), so what a
grammar leaves open (tool-call arguments) closes after a few tokens.

Run standalone:  python tiny_qwen35.py OUT_DIR [--shared ../../../shared]
"""
import argparse
import json
import os
import re
import shutil
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "ref"))
import qwen3_5_reference  # noqa: E402

VOCAB = 151936  # Qwen3's embedding rows (the tokenizer's 151,669 ids, padded)


def make_qwen35_model(out_dir, shared_dir, seed=20261207, n_words=300, json_ish=False):
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
    c = dict(qwen3_5_reference.TEXT, vocab_size=VOCAB, max_position_embeddings=8192,
             bos_token_id=special["<|endoftext|>"], eos_token_id=eos)
    w = qwen3_5_reference.random_weights(c, rng)
    vocab = tok["model"]["vocab"]
    words = sorted(i for p, i in vocab.items() if re.match(r"^\u0120[a-z]{2,6}$", p))
    allowed = rng.choice(np.array(words), size=n_words, replace=False)
    if json_ish:
        punct = [i for p, i in vocab.items() if re.match(r'^[\u0120\u010a"{}\[\],:.\-]{1,4}$', p)]
        digits = [i for p, i in vocab.items() if re.match(r"^\u0120?[0-9]{1,3}$", p)]
        allowed = np.concatenate([allowed, np.array(sorted(punct) + sorted(digits))])
    allowed = np.unique(allowed)
    lm = np.zeros((VOCAB, c["hidden_size"]), np.float32)
    lm[allowed] = rng.standard_normal((len(allowed), c["hidden_size"])).astype(np.float32)
    w["lm_head.weight"] = lm
    save_file(w, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(dict(c, architectures=["Qwen3_5ForCausalLM"], torch_dtype="float32"), f, indent=1)
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": c["bos_token_id"], "eos_token_id": eos}, f)
    return {"dir": out_dir, "vocab": VOCAB, "allowed": [int(i) for i in allowed], "eos": eos}


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--shared", default=os.environ.get(
        "LARDER_SHARED_DIR", os.path.join(HERE, "../../../shared")))
    a = ap.parse_args()
    info = make_qwen35_model(a.out, a.shared)
    print(json.dumps({k: v for k, v in info.items() if k != "allowed"} | {"allowed": len(info["allowed"])}))
