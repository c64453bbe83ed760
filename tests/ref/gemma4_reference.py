#!/usr/bin/env python3
"""Oracle for the Gemma 4 tests: tiny random-weight gemma4 checkpoints run through mlx-lm.

Writes <out>/models/<case>/ like model_reference.py (config.json + model.safetensors, ref.json,
logits_f32.f32 [64, V]); logits are mlx-lm's (mlx_lm.utils.load_model, its gemma4_text class;
the multimodal case through its gemma4 class) over 64 teacher-forced tokens in one call without a
cache, so sliding layers see exactly the keys at distance < sliding_window.

Cases (windows 8 and 13, far below 64 tokens, so every sliding layer drops keys):
  gemma4_text_f32   hidden 64, 6 layers [s s F s s F], head_dim 16 / global_head_dim 32, KV
                    sharing (layers 4, 5 read layers 3, 2) with double-wide MLPs, per-layer
                    embeddings (8 per layer), proportional RoPE (1/4 of the pairs) on global
                    layers, final logit soft-cap 30 (logits reach it), random layer_scalars
  gemma4_keqv_f32   hidden 80 (√80 inexact), attention_k_eq_v with num_global_key_value_heads 2
                    (sliding layers 1 KV head), no per-layer embeddings, no sharing, untied
                    lm_head, proportional factor 2, window 13
  gemma4_mm         multimodal `gemma4` config (text_config; weights under
                    model.language_model. as transformers 5 saves them) with a vision tensor that
                    must be ignored; the model of gemma4_text_f32
  gemma4_gguf_f32   gemma4_text_f32's features at hidden 32 / vocab 160, layers [s F s F s F] (small enough to commit
                    as GGUF: tests/ref/gemma4_gguf.py writes tests/unit/models/data/
                    gemma4_gguf_f32.gguf from it); its tokens start with BOS and avoid the special
                    ids so llama.cpp can be fed the same sequence as text
  gemma4_moe_f32    enable_moe_block (the 26B-A4B layout) on gemma4_keqv's features at hidden 64:
                    8 experts of 32, top 2, a dense MLP of 96 beside them; router scale and
                    per_expert_scale random; experts as transformers 5 saves them (fused
                    experts.gate_up_proj [E, 2·32, 64], experts.down_proj [E, 64, 32]); every
                    mlx-lm ModelArgs key written. Tokens are redrawn while any routing decision
                    (k-th vs (k+1)-th router logit) is within 1e-3, so a last-bit difference
                    cannot pick another expert.
  gemma4_moe_mlx4   mlx-lm's own 4-bit quantization (group 32, bf16 scales) of gemma4_moe_f32:
                    experts stacked as experts.switch_glu.*, router.proj at 8 bits / group 64
                    (the model's quant_predicate); oracle upcast to f32 (set "f32")
  gemma4_moe_gguf_f32  gemma4_moe_f32's config without the global rope "factor" (llama.cpp's converter
                    drops it), other random weights, HF checkpoint and model.gguf: the same weights
                    as GGUF `gemma4` written by gemma4_gguf.write_gguf (the converter's names:
                    ffn_gate_inp(.scale), ffn_gate_up_exps, ffn_down_exps(.scale), pre_ffw_norm_2,
                    post_ffw_norm_1/2; expert_count / expert_used_count /
                    expert_feed_forward_length), f32; logits mlx-lm's on the HF checkpoint
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_reference import SEQ, fixture_args, mlx_logits, save_case, write_hf, write_safetensors  # noqa: E402

ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0}}

BASE = dict(model_type="gemma4_text", hidden_size=64, intermediate_size=96, num_hidden_layers=6,
            num_attention_heads=4, num_key_value_heads=1, head_dim=16, global_head_dim=32, vocab_size=300,
            vocab_size_per_layer_input=300, hidden_size_per_layer_input=8, rms_norm_eps=1e-6,
            sliding_window=8, max_position_embeddings=512, hidden_activation="gelu_pytorch_tanh",
            tie_word_embeddings=True, bos_token_id=2, eos_token_id=1, final_logit_softcapping=30.0,
            num_kv_shared_layers=2, use_double_wide_mlp=True, attention_k_eq_v=False,
            num_global_key_value_heads=None, enable_moe_block=False, rope_parameters=ROPE,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2)

KEQV = dict(BASE, hidden_size=80, intermediate_size=112, num_key_value_heads=1, num_global_key_value_heads=2,
            head_dim=24, global_head_dim=16, vocab_size=350, vocab_size_per_layer_input=350,
            hidden_size_per_layer_input=0, sliding_window=13, num_kv_shared_layers=0, use_double_wide_mlp=False,
            attention_k_eq_v=True, tie_word_embeddings=False, final_logit_softcapping=30.0,
            rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                             "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.5,
                                                "rope_theta": 10000.0, "factor": 2.0}},
            layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention",
                         "full_attention"],
            num_hidden_layers=5)


# The GGUF case: every feature of BASE, smaller (head_dim 8 / global 16: 2 of 8 global pairs rotate).
# Layers [s F s F | s F]: llama.cpp's KV cache takes the two layers before the shared ones as the
# sliding and the global source (as in released Gemma 4), so BASE's [s s F s | s F] would not load.
GGUF = dict(BASE, hidden_size=32, intermediate_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
            global_head_dim=16, vocab_size=160, vocab_size_per_layer_input=160, hidden_size_per_layer_input=4,
            layer_types=["sliding_attention", "full_attention"] * 3)


# The MoE case (all of mlx-lm's ModelArgs keys, none left to a default).
MOE = dict(KEQV, hidden_size=64, intermediate_size=96, enable_moe_block=True, num_experts=8, top_k_experts=2,
           moe_intermediate_size=32, global_partial_rotary_factor=0.5, partial_rotary_factor=1.0, pad_token_id=0,
           rope_traditional=False, sliding_window_pattern=5)
MIN_ROUTE_MARGIN = 1e-3


def tensor_shapes(c):
    h, ffn, V, L = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["num_hidden_layers"]
    nh, P = c["num_attention_heads"], c["hidden_size_per_layer_input"]
    first_shared = L - c["num_kv_shared_layers"]
    s = {"model.embed_tokens.weight": (V, h), "model.norm.weight": (h,)}
    if not c["tie_word_embeddings"]:
        s["lm_head.weight"] = (V, h)
    if P:
        s["model.embed_tokens_per_layer.weight"] = (c["vocab_size_per_layer_input"], L * P)
        s["model.per_layer_model_projection.weight"] = (L * P, h)
        s["model.per_layer_projection_norm.weight"] = (P,)
    for l in range(L):
        p = f"model.layers.{l}."
        full = c["layer_types"][l] == "full_attention"
        hd = c["global_head_dim"] if full else c["head_dim"]
        keqv = c["attention_k_eq_v"] and full
        nkv = c["num_global_key_value_heads"] if keqv and c["num_global_key_value_heads"] else c["num_key_value_heads"]
        shared = l >= first_shared
        f = ffn * (2 if c["use_double_wide_mlp"] and shared else 1)
        for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm"):
            s[p + n + ".weight"] = (h,)
        s[p + "self_attn.q_proj.weight"] = (nh * hd, h)
        s[p + "self_attn.o_proj.weight"] = (h, nh * hd)
        s[p + "self_attn.q_norm.weight"] = (hd,)
        if not shared:
            s[p + "self_attn.k_proj.weight"] = (nkv * hd, h)
            if not keqv:
                s[p + "self_attn.v_proj.weight"] = (nkv * hd, h)
            s[p + "self_attn.k_norm.weight"] = (hd,)
        s[p + "mlp.gate_proj.weight"] = (f, h)
        s[p + "mlp.up_proj.weight"] = (f, h)
        s[p + "mlp.down_proj.weight"] = (h, f)
        if P:
            s[p + "per_layer_input_gate.weight"] = (P, h)
            s[p + "per_layer_projection.weight"] = (h, P)
            s[p + "post_per_layer_input_norm.weight"] = (h,)
        s[p + "layer_scalar"] = (1,)
        if c["enable_moe_block"]:
            E, I = c["num_experts"], c["moe_intermediate_size"]
            s[p + "router.proj.weight"] = (E, h)
            s[p + "router.scale"] = (h,)
            s[p + "router.per_expert_scale"] = (E,)
            s[p + "experts.gate_up_proj"] = (E, 2 * I, h)
            s[p + "experts.down_proj"] = (E, h, I)
            for n in ("pre_feedforward_layernorm_2", "post_feedforward_layernorm_1", "post_feedforward_layernorm_2"):
                s[p + n + ".weight"] = (h,)
    return s


def random_weights(c, rng):
    """Norm gains are plain (around 1); the embedding is scaled by √hidden in the graph, so it is
    drawn with std 2/√hidden; matrices 1/√fan_in; layer scalars in [0.6, 1.4]. The lm_head (and
    the tied embedding through a larger final norm gain) gives logits of ~20-40, so the soft-cap
    at 30 bends them."""
    w = {}
    h = c["hidden_size"]
    for name, shape in tensor_shapes(c).items():
        if name.endswith("router.scale"):
            w[name] = (1.0 + 0.3 * rng.standard_normal(shape)).astype(np.float32)
        elif name.endswith("per_expert_scale"):
            w[name] = rng.uniform(0.5, 1.5, shape).astype(np.float32)
        elif name.endswith("router.proj.weight"):  # logits of a few units: clear top-k choices
            w[name] = (4.0 * rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32)
        elif len(shape) == 3:  # experts [E, rows, cols]
            w[name] = (rng.standard_normal(shape) / np.sqrt(shape[2])).astype(np.float32)
        elif name.endswith("layer_scalar"):
            w[name] = rng.uniform(0.6, 1.4, shape).astype(np.float32)
        elif name.endswith("norm.weight") or "layernorm_" in name:
            w[name] = (1.0 + 0.3 * rng.standard_normal(shape)).astype(np.float32)
        elif name in ("model.embed_tokens.weight", "model.embed_tokens_per_layer.weight"):
            w[name] = (2.0 * rng.standard_normal(shape) / np.sqrt(h)).astype(np.float32)
        else:
            w[name] = (rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32)
    w["model.norm.weight"] *= np.float32(3.0)
    if "lm_head.weight" in w:
        w["lm_head.weight"] *= np.float32(4.0)
    return w


def write_multimodal(d, c, weights):
    """A `gemma4` checkpoint as transformers 5 saves it: text_config, text weights under
    model.language_model., plus a vision-tower tensor a text-only runner ignores."""
    os.makedirs(d, exist_ok=True)
    tc = {k: v for k, v in c.items() if k not in ("vocab_size", "bos_token_id", "eos_token_id")}
    tc["model_type"] = "gemma4_text"
    cfg = dict(model_type="gemma4", text_config=tc, vocab_size=c["vocab_size"], bos_token_id=2, eos_token_id=[1, 106],
               vision_config=dict(model_type="gemma4_vision"))
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    t = {}
    for k, v in weights.items():
        t["model.language_model." + k[len("model."):] if k.startswith("model.") else k] = ("F32", v)
    t["model.vision_tower.encoder.norm.weight"] = ("F32", np.ones(8, dtype=np.float32))
    write_safetensors(os.path.join(d, "model.safetensors"), t)


def mlx_logits_mm(d, tokens):
    import mlx.core as mx
    from mlx_lm.models import gemma4
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    model = gemma4.Model(gemma4.ModelArgs.from_dict(cfg))
    w = model.sanitize(mx.load(os.path.join(d, "model.safetensors")))
    model.load_weights(list(w.items()))
    out = model(mx.array(tokens, dtype=mx.int32)[None])
    return np.array(out[0].astype(mx.float32))


def mlx_moe_logits(d, tokens, margins, upcast=False):
    """mlx-lm's logits (model_reference.mlx_logits), appending each MoE layer's smallest gap
    between the k-th and (k+1)-th router logit to `margins`."""
    import mlx.core as mx
    from mlx_lm.models import gemma4_text
    saved = gemma4_text.Router.__call__

    def probe(self, x):
        y = mx.fast.rms_norm(x, self.scale * self._root_size, self.eps)
        g = np.sort(np.array(self.proj(y).astype(mx.float32)).reshape(-1, self.config.num_experts), axis=-1)
        k = self.config.top_k_experts
        margins.append(float(np.min(g[:, -k] - g[:, -k - 1])))
        return saved(self, x)
    gemma4_text.Router.__call__ = probe
    try:
        return mlx_logits(d, tokens, upcast=upcast)
    finally:
        gemma4_text.Router.__call__ = saved


def moe_cases(root):
    from model_reference import write_affine
    c = MOE
    rng = np.random.default_rng(5010)
    w = random_weights(c, rng)
    d = os.path.join(root, "gemma4_moe_f32")
    write_hf(d, c, w, "f32")
    d4 = os.path.join(root, "gemma4_moe_mlx4")
    write_affine(d4, d, c, "bf16", 4, 32, {})
    for attempt in range(50):
        tokens = [int(t) for t in rng.integers(0, c["vocab_size"], SEQ)]
        margins = []
        f32 = mlx_moe_logits(d, tokens, margins)
        q4 = mlx_moe_logits(d4, tokens, margins, upcast=True)
        if min(margins) >= MIN_ROUTE_MARGIN:
            break
    else:
        raise SystemExit("gemma4_moe: no token draw without a routing near-tie")
    extra = {"min_route_margin": min(margins), "token_draws": attempt + 1}
    save_case(d, tokens, c["vocab_size"], {"f32": f32}, extra)
    save_case(d4, tokens, c["vocab_size"], {"f32": q4}, extra)
    print(f"gemma4_reference: gemma4_moe max|logit| {float(np.abs(f32).max()):.2f} (mlx4 "
          f"{float(np.abs(q4).max()):.2f}), min route margin {min(margins):.3g}, draw {attempt + 1}", flush=True)

    # GGUF `gemma4` with experts, written as llama.cpp's converter writes it (gemma4_gguf.py, f32),
    # beside its HF checkpoint: MOE without rope_parameters' "factor", which the converter drops.
    import gemma4_gguf
    cg = dict(MOE, rope_parameters={k: {kk: vv for kk, vv in v.items() if kk != "factor"}
                                    for k, v in MOE["rope_parameters"].items()})
    wg = random_weights(cg, np.random.default_rng(5011))
    dg = os.path.join(root, "gemma4_moe_gguf_f32")
    write_hf(dg, cg, wg, "f32")
    gemma4_gguf.write_gguf(cg, wg, os.path.join(dg, "model.gguf"))
    for attempt in range(50):
        tokens = [int(t) for t in rng.integers(0, cg["vocab_size"], SEQ)]
        margins = []
        f32 = mlx_moe_logits(dg, tokens, margins)
        if min(margins) >= MIN_ROUTE_MARGIN:
            break
    else:
        raise SystemExit("gemma4_moe_gguf: no token draw without a routing near-tie")
    save_case(dg, tokens, cg["vocab_size"], {"f32": f32}, {"min_route_margin": min(margins), "token_draws": attempt + 1})
    print(f"gemma4_reference: gemma4_moe_gguf_f32 min route margin {min(margins):.3g}, draw {attempt + 1}", flush=True)


def main():
    a, root = fixture_args()
    for i, (name, c) in enumerate([("gemma4_text", BASE), ("gemma4_keqv", KEQV), ("gemma4_gguf", GGUF)]):
        rng = np.random.default_rng(5000 + i)
        w = random_weights(c, rng)
        tokens = [int(t) for t in rng.integers(0, c["vocab_size"], SEQ)]
        if name == "gemma4_gguf":  # BOS, then ids 4 .. V-2 (gemma4_gguf.py's synthetic vocabulary)
            tokens = [c["bos_token_id"]] + [int(t) for t in rng.integers(4, c["vocab_size"] - 1, SEQ - 1)]
        d = os.path.join(root, name + "_f32")
        write_hf(d, c, w, "f32")
        logits = mlx_logits(d, tokens)
        save_case(d, tokens, c["vocab_size"], {"f32": logits})
        if name == "gemma4_text":
            d = os.path.join(root, "gemma4_mm")
            write_multimodal(d, c, w)
            mm = mlx_logits_mm(d, tokens)
            assert np.allclose(mm, logits, atol=1e-5), "multimodal text tower differs from gemma4_text"
            save_case(d, tokens, c["vocab_size"], {"f32": mm})
        print(f"gemma4_reference: {name} max|logit| {float(np.abs(logits).max()):.2f}", flush=True)
    moe_cases(root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
