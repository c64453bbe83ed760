#!/usr/bin/env python3
"""Oracle for the Gemma 3 tests: tiny random-weight gemma3 checkpoints run through mlx-lm.

Writes <out>/models/<case>/ like model_reference.py (config.json + model.safetensors or
model.gguf, ref.json, logits_<set>.f32 [64, V]); logits are mlx-lm's (mlx_lm.utils.load_model,
its gemma3_text / gemma3 classes) over 64 teacher-forced tokens in one call without a cache, so
sliding layers see exactly the keys at distance < sliding_window.

Cases (the window is 8-16, far below 64 tokens, so every sliding layer drops keys):
  gemma3_text_f32   hidden 64, 6 layers, pattern 3 (global layers 2, 5), window 8
  gemma3_ltypes     hidden 80 (√80 rounds to bf16 8.9375), layer_types given, window 13,
                    linear rope_scaling (factor 8) on the global layers, GQA 4:2
  gemma3_mm         multimodal `gemma3` config (text_config; weights under language_model.model.)
                    with a vision tensor that must be ignored
  gemma3_q8_0       GGUF Q8_0 written like llama.cpp's converter (norm gains stored as w + 1, no
                    layer-pattern key: pattern 6); oracle: mlx-lm on an f32 HF checkpoint of
                    exactly the dequantized values
  gemma3_head       gemma3_text's weights plus a distinct lm_head.weight and a config without
                    tie_word_embeddings (issue 47 item 14): mlx-lm's gemma3_text unties whenever
                    the checkpoint carries the head, so its logits come from that head
  gemma3_head_tiedcfg  the same with tie_word_embeddings: true; mlx-lm ignores the key and
                    transformers 5 keeps a head that differs from the embedding: the same logits
  gemma3_realtok    (issue 47 item 13) vocab_size 262144 beside the real Gemma 3 tokenizer
                    (<shared>/tokenizers/hf/gemma3: 262,145 entries, id 262144 is the special
                    <image_soft_token>); config.json is transformers' Gemma3TextConfig.to_dict()
                    with every key written, plus the keys mlx-lm reads (sliding_window_pattern,
                    rope_theta, rope_local_base_freq); the tokens are the `tokenizers` library's
                    encoding of REALTOK_TEXT (BOS included), 2 layers, hidden 32
Sets: f32 (f32 checkpoints) and, for gemma3_text_bf16, f32math (bf16 weights, mlx upcast).
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_ref import finish, gguf_namer  # noqa: E402
from model_reference import (SEQ, bf16_bits_to_f32, fixture_args, mlx_logits, save_case,  # noqa: E402
                             to_bf16_bits, write_hf, write_safetensors)

BASE = dict(model_type="gemma3_text", hidden_size=64, intermediate_size=128, num_hidden_layers=6,
            num_attention_heads=4, num_key_value_heads=1, head_dim=16, vocab_size=300, rms_norm_eps=1e-6,
            rope_theta=1000000.0, rope_local_base_freq=10000.0, query_pre_attn_scalar=16,
            sliding_window=8, sliding_window_pattern=3, max_position_embeddings=512,
            hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True, bos_token_id=2, eos_token_id=1,
            final_logit_softcapping=None, attn_logit_softcapping=None, rope_scaling=None)

LTYPES = dict(BASE, hidden_size=80, intermediate_size=160, num_attention_heads=4, num_key_value_heads=2,
              head_dim=24, query_pre_attn_scalar=20, sliding_window=13, sliding_window_pattern=3,
              vocab_size=350, rope_scaling=dict(rope_type="linear", factor=8.0))
LTYPES["layer_types"] = ["full_attention" if (i + 1) % 3 == 0 else "sliding_attention" for i in range(6)]


def tensor_shapes(c):
    h, ffn, V = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    nh, nkv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    s = {"model.embed_tokens.weight": (V, h), "model.norm.weight": (h,)}
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm"):
            s[p + n + ".weight"] = (h,)
        s[p + "self_attn.q_proj.weight"] = (nh * hd, h)
        s[p + "self_attn.k_proj.weight"] = (nkv * hd, h)
        s[p + "self_attn.v_proj.weight"] = (nkv * hd, h)
        s[p + "self_attn.o_proj.weight"] = (h, nh * hd)
        s[p + "self_attn.q_norm.weight"] = (hd,)
        s[p + "self_attn.k_norm.weight"] = (hd,)
        s[p + "mlp.gate_proj.weight"] = (ffn, h)
        s[p + "mlp.up_proj.weight"] = (ffn, h)
        s[p + "mlp.down_proj.weight"] = (h, ffn)
    return s


def random_weights(c, rng):
    """Norm weights are stored as gain − 1 (Gemma): small values around 0. The embedding is
    scaled by √hidden in the graph, so it is drawn with std 1/√hidden·2 to keep activations O(1)."""
    w = {}
    h = c["hidden_size"]
    for name, shape in tensor_shapes(c).items():
        if name.endswith("norm.weight"):
            w[name] = (0.3 * rng.standard_normal(shape)).astype(np.float32)
        elif name == "model.embed_tokens.weight":
            w[name] = (2.0 * rng.standard_normal(shape) / np.sqrt(h)).astype(np.float32)
        else:
            w[name] = (rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32)
    return w


GGUF_NAMES = [("input_layernorm.", "attn_norm."), ("post_attention_layernorm.", "post_attention_norm."),
              ("pre_feedforward_layernorm.", "ffn_norm."), ("post_feedforward_layernorm.", "post_ffw_norm."),
              ("self_attn.q_proj.", "attn_q."), ("self_attn.k_proj.", "attn_k."), ("self_attn.v_proj.", "attn_v."),
              ("self_attn.o_proj.", "attn_output."), ("self_attn.q_norm.", "attn_q_norm."),
              ("self_attn.k_norm.", "attn_k_norm."), ("mlp.gate_proj.", "ffn_gate."), ("mlp.up_proj.", "ffn_up."),
              ("mlp.down_proj.", "ffn_down.")]


gguf_name = gguf_namer(GGUF_NAMES)


def write_gguf(path, c, weights, qname):
    """As llama.cpp's convert_hf_to_gguf Gemma3Model: every norm weight gets + 1 (its RMSNorm is
    plain), matrices quantized, NeoX rope (no Q/K permutation)."""
    import gguf
    qt = getattr(gguf.GGMLQuantizationType, qname)
    wr = gguf.GGUFWriter(path, "gemma3")
    wr.add_block_count(c["num_hidden_layers"])
    wr.add_embedding_length(c["hidden_size"])
    wr.add_feed_forward_length(c["intermediate_size"])
    wr.add_head_count(c["num_attention_heads"])
    wr.add_head_count_kv(c["num_key_value_heads"])
    wr.add_key_length(c["head_dim"])
    wr.add_value_length(c["head_dim"])
    wr.add_rope_freq_base(c["rope_theta"])
    wr.add_layer_norm_rms_eps(c["rms_norm_eps"])
    wr.add_context_length(c["max_position_embeddings"])
    wr.add_sliding_window(c["sliding_window"])
    wr.add_bos_token_id(2)
    wr.add_eos_token_id(1)
    deq = {}
    for name, w in weights.items():
        if w.ndim == 2:
            q = gguf.quants.quantize(w, qt)
            wr.add_tensor(gguf_name(name), q, raw_dtype=qt)
            deq[name] = gguf.quants.dequantize(q, qt).reshape(w.shape).astype(np.float32)
        else:
            wr.add_tensor(gguf_name(name), (w + np.float32(1.0)).astype(np.float32))
            deq[name] = w
    finish(wr)
    return deq


def write_multimodal(d, c, weights):
    """A `gemma3` (image-text) checkpoint: text_config, text weights under language_model.model.,
    plus a vision-tower tensor that a text-only runner ignores."""
    os.makedirs(d, exist_ok=True)
    tc = {k: v for k, v in c.items() if k not in ("vocab_size", "bos_token_id", "eos_token_id")}
    tc["model_type"] = "gemma3_text"
    cfg = dict(model_type="gemma3", text_config=tc, vocab_size=c["vocab_size"], bos_token_id=2, eos_token_id=[1, 106],
               vision_config=dict(model_type="siglip_vision_model"))
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    t = {"language_model." + k: ("F32", v) for k, v in weights.items()}
    t["vision_tower.vision_model.post_layernorm.weight"] = ("F32", np.ones(8, dtype=np.float32))
    write_safetensors(os.path.join(d, "model.safetensors"), t)


def mlx_logits_mm(d, tokens):
    """mlx-lm's gemma3 (multimodal) class drops the vision tower in sanitize(); its loader would
    also want a vision config it never reads, so load the text model from the same tensors."""
    import mlx.core as mx
    from mlx_lm.models import gemma3
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    args = gemma3.ModelArgs.from_dict(cfg)
    model = gemma3.Model(args)
    w = mx.load(os.path.join(d, "model.safetensors"))
    w = model.sanitize(w)
    model.load_weights(list(w.items()))
    out = model(mx.array(tokens, dtype=mx.int32)[None])
    return np.array(out[0].astype(mx.float32))


REALTOK_TEXT = "The quick brown fox jumps over the lazy dog, and Gemma's tokenizer has 262,145 entries."


def write_head_cases(root, c, w, rng):
    """gemma3_head and gemma3_head_tiedcfg: c's weights with an lm_head unlike the embedding."""
    h = c["hidden_size"]
    wh = dict(w)
    wh["lm_head.weight"] = (2.0 * rng.standard_normal((c["vocab_size"], h)) / np.sqrt(h)).astype(np.float32)
    no_key = {k: v for k, v in c.items() if k != "tie_word_embeddings"}
    d = os.path.join(root, "gemma3_head")
    write_hf(d, no_key, wh, "f32")
    logits = mlx_logits(d, TOKENS_OF[id(c)])
    save_case(d, TOKENS_OF[id(c)], c["vocab_size"], {"f32": logits})
    d = os.path.join(root, "gemma3_head_tiedcfg")
    write_hf(d, dict(c, tie_word_embeddings=True), wh, "f32")
    save_case(d, TOKENS_OF[id(c)], c["vocab_size"], {"f32": mlx_logits(d, TOKENS_OF[id(c)])})


def write_realtok(root, shared):
    import shutil
    from tokenizers import Tokenizer
    from transformers import Gemma3TextConfig
    tokdir = os.path.join(shared, "tokenizers/hf/gemma3")
    tok = Tokenizer.from_file(os.path.join(tokdir, "tokenizer.json"))
    assert tok.get_vocab_size(with_added_tokens=True) == 262145, "the real Gemma 3 tokenizer has 262,145 entries"
    assert tok.id_to_token(262144) == "<image_soft_token>"
    layer_types = ["sliding_attention", "full_attention"]
    cfg = Gemma3TextConfig(vocab_size=262144, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=16,
                           sliding_window=8, max_position_embeddings=512, layer_types=layer_types,
                           tie_word_embeddings=True, bos_token_id=2, eos_token_id=1, pad_token_id=0).to_dict()
    # Keys mlx-lm's gemma3_text reads (it knows neither layer_types nor rope_parameters), with
    # the values transformers' config implies.
    cfg.update(sliding_window_pattern=2, rope_theta=1000000.0, rope_local_base_freq=10000.0, rope_scaling=None)
    c = dict(cfg)
    rng = np.random.default_rng(4100)
    w = random_weights(c, rng)
    d = os.path.join(root, "gemma3_realtok")
    write_hf(d, cfg, w, "f32")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(tokdir, f), os.path.join(d, f))
    tokens = tok.encode(REALTOK_TEXT, add_special_tokens=True).ids
    save_case(d, tokens, c["vocab_size"], {"f32": mlx_logits(d, tokens)},
              extra={"text": REALTOK_TEXT, "tokenizer_size": tok.get_vocab_size(with_added_tokens=True)})


TOKENS_OF = {}


def main():
    a, root = fixture_args()
    for i, (name, c) in enumerate([("gemma3_text", BASE), ("gemma3_ltypes", LTYPES)]):
        rng = np.random.default_rng(4000 + i)
        w = random_weights(c, rng)
        tokens = [int(t) for t in rng.integers(0, c["vocab_size"], SEQ)]
        d = os.path.join(root, name + "_f32")
        write_hf(d, c, w, "f32")
        save_case(d, tokens, c["vocab_size"], {"f32": mlx_logits(d, tokens)})
        if name == "gemma3_text":
            TOKENS_OF[id(c)] = tokens
            write_head_cases(root, c, w, np.random.default_rng(4200))
            wb = {k: bf16_bits_to_f32(to_bf16_bits(v)) for k, v in w.items()}
            d = os.path.join(root, name + "_bf16")
            write_hf(d, c, wb, "bf16")
            save_case(d, tokens, c["vocab_size"], {"f32math": mlx_logits(d, tokens, upcast=True)})
            d = os.path.join(root, "gemma3_mm")
            write_multimodal(d, c, w)
            save_case(d, tokens, c["vocab_size"], {"f32": mlx_logits_mm(d, tokens)})
            # The GGUF carries no layer pattern (llama.cpp's converter writes none for gemma3 and
            # llama.cpp assumes 6), so this case is the same model with pattern 6.
            c6 = dict(c, sliding_window_pattern=6)
            d = os.path.join(root, "gemma3_q8_0")
            os.makedirs(d, exist_ok=True)
            deq = write_gguf(os.path.join(d, "model.gguf"), c6, w, "Q8_0")
            hf = os.path.join(d, "hf")
            write_hf(hf, c6, deq, "f32")
            save_case(d, tokens, c["vocab_size"], {"deq": mlx_logits(hf, tokens)})
        print(f"gemma3_reference: {name}", flush=True)
    if a.shared and os.path.exists(os.path.join(a.shared, "tokenizers/hf/gemma3/tokenizer.json")):
        write_realtok(root, a.shared)
        print("gemma3_reference: gemma3_realtok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
