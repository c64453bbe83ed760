#!/usr/bin/env python3
"""Oracle for the gpt-oss tests: tiny random-weight checkpoints run through mlx-lm's own `gpt_oss`
Model class (on the CPU, f32).

Writes <out>/models/<case>/ like model_reference.py (config.json + weights, ref.json, logits_<set>.f32
[64, V]); logits are mlx-lm's over 64 teacher-forced tokens in one call without a cache. Every
config key transformers' GptOssConfig and mlx-lm's ModelArgs read is written explicitly.

What the weights exercise: attention sinks ~N(0, 2²) (they matter against scores of a few units),
q/k/v/o biases, a sliding window of 8 (so 64 tokens cross it many times), yarn RoPE (factor 32 over
original 4096 at head_dim 16: pairs 0-1 kept, 2-4 ramped, 5-7 interpolated; attention factor
1 + 0.1 ln 32), a router with a bias, experts with biases whose gate/up pre-activations (weights
3/sqrt(hidden)) pass swiglu's limit of 7 often enough that both clamps act.

Cases:
  gpt_oss_f32      mlx-lm's layout (what its sanitize produces and mlx_lm.convert saves):
                   mlp.experts.{gate,up,down}_proj.{weight,bias} stacked, mlp.router.{weight,bias},
                   self_attn.sinks; 4 layers (layer_types sliding, full, sliding, full), 8 experts,
                   2 per token, GQA 4:2, head_dim 16, hidden 64, intermediate 32, vocab 300
  gpt_oss_hf_f32   the same weights in transformers' layout: mlp.experts.gate_up_proj [E, H, 2I]
                   with gate/up interleaved on the last axis, gate_up_proj_bias [E, 2I] interleaved,
                   down_proj [E, I, H], down_proj_bias [E, H]; the same logits
  gpt_oss_layers_f32  layer_types full, sliding, sliding, full, window 5, rope_scaling null
  gpt_oss_mlx4     mlx-lm's 4-bit quantization (group 32, bf16 scales) of gpt_oss_f32, its
                   quant_predicate putting the router at 8 bits / group 64; oracle upcast to f32
  gpt_oss_q8_0     GGUF `gpt-oss` with llama.cpp's names (attn_sinks, post_attention_norm,
                   ffn_gate_inp + bias, ffn_{gate,up,down}_exps + biases), Q8_0 matrices, router,
                   norms, biases and sinks F32; oracle ("deq") mlx-lm on the dequantized values
  gpt_oss_gguf_f32 gpt_oss_f32's weights as an all-F32 GGUF `gpt-oss`; gpt_oss_f32's logits ("deq").
                   (llama-perplexity on such a file agrees with mlx-lm: one 128-token chunk,
                   4761.23 vs 4762.03.)
  gpt_oss_gguf_f16 the same weights with F16 matrices (router, norms, biases, sinks F32); oracle
                   ("deq") mlx-lm on the f16 values
  gpt_oss_openai_mxfp4  OpenAI's HF layout (openai/gpt-oss-*): experts as mlp.experts.{gate_up,down}_proj_
                   {blocks,scales} U8 quantized by mx.quantize(mode="mxfp4"), gate/up rows and biases
                   interleaved, quantization_config quant_method mxfp4; other tensors F32; oracle mlx-lm
                   loading that directory (sanitize + its mxfp4 mapping)
  qwen3_yarn_f32   a qwen3 (llama-family graph) with yarn rope_scaling (factor 4 over 512), mlx-lm's
                   qwen3 (YarnRoPE with its attention factor)
Sets: f32 / deq, and for the quantized cases int8acts: every quantized matmul's input rounded to
int8 per block of 32 first (larder's fast integer kernels; qwen3_moe_reference.py).
ref.json also holds min_route_margin (k-th vs (k+1)-th router logit; tokens redrawn below 2e-3)
and `yarn_no_truncate`: transformers' yarn inv_freq for the real gpt-oss rope_scaling
(truncate false; head_dim 64, theta 150000), computed here in numpy from its formula.
"""
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_ref import add_transformer, finish, gguf_namer, q8_0, write_spm_vocab  # noqa: E402
from model_reference import SEQ, fixture_args, save_case, write_affine, write_hf  # noqa: E402

BASE = dict(model_type="gpt_oss", architectures=["GptOssForCausalLM"], hidden_size=64, intermediate_size=32,
            num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=8,
            num_experts_per_tok=2, experts_per_token=2, vocab_size=300, rms_norm_eps=1e-5, sliding_window=8,
            rope_theta=150000.0,
            rope_scaling=dict(rope_type="yarn", factor=32.0, beta_fast=32.0, beta_slow=1.0,
                              original_max_position_embeddings=4096, truncate=True),
            layer_types=["sliding_attention", "full_attention"] * 2, max_position_embeddings=4096,
            initial_context_length=4096, tie_word_embeddings=False, attention_bias=True, attention_dropout=0.0,
            swiglu_limit=7.0, router_aux_loss_coef=0.9, output_router_logits=False, hidden_act="silu",
            bos_token_id=1, eos_token_id=2, pad_token_id=0)
LAYERS = dict(BASE, layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
              sliding_window=5, rope_scaling=None)
MIN_ROUTE_MARGIN = 2e-3


def shapes(c):
    h, V, I, E = c["hidden_size"], c["vocab_size"], c["intermediate_size"], c["num_local_experts"]
    nh, nkv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    s = {"model.embed_tokens.weight": (V, h), "model.norm.weight": (h,), "lm_head.weight": (V, h)}
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        s[p + "input_layernorm.weight"] = (h,)
        s[p + "post_attention_layernorm.weight"] = (h,)
        for proj, rows in (("q_proj", nh * hd), ("k_proj", nkv * hd), ("v_proj", nkv * hd)):
            s[p + f"self_attn.{proj}.weight"] = (rows, h)
            s[p + f"self_attn.{proj}.bias"] = (rows,)
        s[p + "self_attn.o_proj.weight"] = (h, nh * hd)
        s[p + "self_attn.o_proj.bias"] = (h,)
        s[p + "self_attn.sinks"] = (nh,)
        s[p + "mlp.router.weight"] = (E, h)
        s[p + "mlp.router.bias"] = (E,)
        for proj, (rows, cols) in (("gate_proj", (I, h)), ("up_proj", (I, h)), ("down_proj", (h, I))):
            s[p + f"mlp.experts.{proj}.weight"] = (E, rows, cols)
            s[p + f"mlp.experts.{proj}.bias"] = (E, rows)
    return s


def random_weights(c, rng):
    w = {}
    for name, shape in shapes(c).items():
        if name.endswith("norm.weight"):
            v = 1.0 + 0.2 * rng.standard_normal(shape)
        elif name in ("model.embed_tokens.weight", "lm_head.weight"):
            v = rng.standard_normal(shape)
        elif name.endswith("self_attn.sinks"):
            v = 2.0 * rng.standard_normal(shape)
        elif name.endswith(".bias"):
            v = 0.1 * rng.standard_normal(shape)
        elif name.endswith("mlp.router.weight"):
            v = 2.0 * rng.standard_normal(shape) / np.sqrt(shape[-1])
        elif ".experts.gate_proj." in name or ".experts.up_proj." in name:
            v = 3.0 * rng.standard_normal(shape) / np.sqrt(shape[-1])  # past swiglu's limit of 7 at times
        else:
            v = rng.standard_normal(shape) / np.sqrt(shape[-1])
        w[name] = v.astype(np.float32)
    return w


def hf_layout(c, w):
    """transformers' GptOssExperts layout of the same weights."""
    out = {k: v for k, v in w.items() if ".mlp.experts." not in k}
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}.mlp.experts."
        g, u = w[p + "gate_proj.weight"], w[p + "up_proj.weight"]  # [E, I, H]
        E, I, H = g.shape
        gu = np.empty((E, H, 2 * I), np.float32)
        gu[..., 0::2] = g.transpose(0, 2, 1)
        gu[..., 1::2] = u.transpose(0, 2, 1)
        gub = np.empty((E, 2 * I), np.float32)
        gub[:, 0::2] = w[p + "gate_proj.bias"]
        gub[:, 1::2] = w[p + "up_proj.bias"]
        out[p + "gate_up_proj"] = gu
        out[p + "gate_up_proj_bias"] = gub
        out[p + "down_proj"] = np.ascontiguousarray(w[p + "down_proj.weight"].transpose(0, 2, 1))
        out[p + "down_proj_bias"] = w[p + "down_proj.bias"]
    return out


def q8(x):
    import mlx.core as mx
    xb = x.reshape(-1, 32)
    sc = mx.max(mx.abs(xb), axis=-1, keepdims=True) / 127.0
    q = mx.round(xb * mx.where(sc == 0, 0, 1 / mx.where(sc == 0, 1, sc)))
    return (q * sc).reshape(x.shape)


def mlx_logits(d, tokens, margins, int8acts=False, f32_router=False, experts_only=False):
    """mlx-lm's logits (weights upcast to f32); the smallest k-th vs (k+1)-th router logit gap of
    every layer is appended to `margins`. int8acts: every quantized matmul's input is rounded to
    int8 per 32-block first — except the router's with f32_router (an F32 matrix in the GGUF); with
    experts_only only the experts' (the other matrices are float)."""
    import mlx.core as mx
    import mlx.nn as nn
    from pathlib import Path
    from mlx_lm.models import gpt_oss, switch_layers
    from mlx_lm.utils import load_model
    model, _ = load_model(Path(d))
    model.set_dtype(mx.float32)
    model.eval()
    saved_mlp = gpt_oss.MLPBlock.__call__

    def probe(self, x):
        g = np.array(self.router(x).astype(mx.float32))[0]
        s = np.sort(g, axis=-1)
        k = self.num_experts_per_tok
        margins.append(float(np.min(s[:, -k] - s[:, -k - 1])))
        return saved_mlp(self, x)
    classes = (nn.QuantizedLinear, nn.Linear, switch_layers.QuantizedSwitchLinear, switch_layers.SwitchLinear)
    saved = {cls: cls.__call__ for cls in classes}
    if experts_only:
        saved = {switch_layers.QuantizedSwitchLinear: switch_layers.QuantizedSwitchLinear.__call__}
    if int8acts:
        if f32_router:
            for layer in model.layers:
                layer.mlp.router.keep_f32_input = True
        for cls, call in saved.items():
            cls.__call__ = (lambda f: lambda self, x, *a, **k: f(self, x if getattr(self, "keep_f32_input", False)
                                                               else q8(x), *a, **k))(call)
    gpt_oss.MLPBlock.__call__ = probe
    try:
        out = model(mx.array(tokens, dtype=mx.int32)[None])
        return np.array(out[0].astype(mx.float32))
    finally:
        gpt_oss.MLPBlock.__call__ = saved_mlp
        for cls, call in saved.items():
            cls.__call__ = call


def case(root, name, c, rng, sets, extra=None):
    """Draws 64 tokens and runs every set; draws again while a routing decision is within
    MIN_ROUTE_MARGIN in any set (a last-bit difference would pick another expert there)."""
    d = os.path.join(root, name)
    for attempt in range(50):
        tokens = [int(t) for t in rng.integers(3, c["vocab_size"], SEQ)]
        margins, logits = [], {}
        for s, fn in sets.items():
            logits[s] = fn(tokens, margins)
        if min(margins) >= MIN_ROUTE_MARGIN:
            break
    else:
        raise SystemExit(f"{name}: no token draw without a routing near-tie")
    meta = {"min_route_margin": min(margins), "token_draws": attempt + 1}
    meta.update(extra or {})
    save_case(d, tokens, c["vocab_size"], logits, meta)
    print(f"gpt_oss_reference: {name} (min route margin {min(margins):.3g}, draw {attempt + 1})", flush=True)
    return tokens, logits


# llama.cpp's names (gguf-py TensorNameMap for MODEL_ARCH.GPT_OSS).
GGUF_NAMES = [("input_layernorm.", "attn_norm."), ("post_attention_layernorm.", "post_attention_norm."),
              ("self_attn.q_proj.", "attn_q."), ("self_attn.k_proj.", "attn_k."), ("self_attn.v_proj.", "attn_v."),
              ("self_attn.o_proj.", "attn_output."), ("self_attn.sinks", "attn_sinks.weight"),
              ("mlp.router.", "ffn_gate_inp."), ("mlp.experts.gate_proj.", "ffn_gate_exps."),
              ("mlp.experts.up_proj.", "ffn_up_exps."), ("mlp.experts.down_proj.", "ffn_down_exps.")]
gguf_name = gguf_namer(GGUF_NAMES)


def write_gguf(path, c, weights, f32=False, f16=False, mxfp4=False):
    """GGUF `gpt-oss` (Q8_0 matrices, F16 ones with f16, or every tensor F32 with f32; router,
    norms, biases, sinks F32; with mxfp4 the experts' matrices MXFP4, as OpenAI's GGUFs store them)
    as llama.cpp reads it; returns the weights of exactly the values it holds."""
    import gguf
    assert c["layer_types"] == ["sliding_attention", "full_attention"] * (c["num_hidden_layers"] // 2), \
        "llama.cpp's gpt-oss: even layers sliding"
    rs = c["rope_scaling"]
    wr = gguf.GGUFWriter(path, "gpt-oss")
    add_transformer(wr, c, c["rope_theta"])
    wr.add_sliding_window(c["sliding_window"])
    wr.add_expert_count(c["num_local_experts"])
    wr.add_expert_used_count(c["num_experts_per_tok"])
    wr.add_expert_feed_forward_length(c["intermediate_size"])
    wr.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    wr.add_rope_scaling_factor(rs["factor"])
    wr.add_rope_scaling_orig_ctx_len(rs["original_max_position_embeddings"])
    wr.add_file_type(gguf.LlamaFileType.ALL_F32 if f32 else
                     gguf.LlamaFileType.MOSTLY_F16 if f16 else gguf.LlamaFileType.MOSTLY_Q8_0)
    write_spm_vocab(wr, c)
    back = {}
    for name, w in weights.items():
        if f32 or w.ndim == 1 or name.endswith(".bias") or name.endswith("mlp.router.weight"):
            wr.add_tensor(gguf_name(name), w)
            back[name] = w
        elif mxfp4 and ".mlp.experts." in name:
            mq = gguf.GGMLQuantizationType.MXFP4
            q = gguf.quants.quantize(w, mq)
            wr.add_tensor(gguf_name(name), q, raw_dtype=mq)
            back[name] = gguf.quants.dequantize(q, mq).reshape(w.shape).astype(np.float32)
        elif f16:
            h = w.astype(np.float16)
            wr.add_tensor(gguf_name(name), h)
            back[name] = h.astype(np.float32)
        else:
            back[name] = q8_0(wr, gguf_name(name), w)
    finish(wr)
    return back


OPENAI_QUANT = {"quant_method": "mxfp4", "modules_to_not_convert": [
    "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}


def write_openai_mxfp4(d, c, w):
    """OpenAI's HF checkpoint layout (openai/gpt-oss-20b): mlp.experts.gate_up_proj_blocks U8
    [E, 2I, H/32, 16] (e2m1 codes, two per byte), _scales U8 [E, 2I, H/32] (e8m0), gate_up_proj_bias
    [E, 2I] — gate and up rows interleaved (even rows gate, odd rows up) — and down_proj_{blocks,
    scales,bias}; config quantization_config {quant_method mxfp4, modules_to_not_convert}. The
    experts are quantized by mlx's own mx.quantize(mode="mxfp4"), whose uint32 codes' bytes are the
    blocks (mlx-lm's sanitize views them back as uint32). Other tensors F32 (OpenAI's are BF16: kept
    F32 so the bound stays the f32 one for everything but the experts)."""
    import mlx.core as mx
    from model_reference import write_safetensors
    L = c["num_hidden_layers"]
    t = {k: ("F32", v) for k, v in w.items() if ".mlp.experts." not in k}

    def q(x):
        wq, sc = mx.quantize(mx.array(x), group_size=32, bits=4, mode="mxfp4")
        E, R, C = x.shape
        blocks = np.array(wq).view(np.uint8).reshape(E, R, C // 32, 16)
        return blocks, np.array(sc).astype(np.uint8)

    for l in range(L):
        p = f"model.layers.{l}.mlp.experts."
        gb, gs = q(w[p + "gate_proj.weight"])
        ub, us = q(w[p + "up_proj.weight"])
        E, I = gb.shape[:2]
        blocks = np.empty((E, 2 * I) + gb.shape[2:], np.uint8)
        blocks[:, 0::2], blocks[:, 1::2] = gb, ub
        scales = np.empty((E, 2 * I) + gs.shape[2:], np.uint8)
        scales[:, 0::2], scales[:, 1::2] = gs, us
        bias = np.empty((E, 2 * I), np.float32)
        bias[:, 0::2], bias[:, 1::2] = w[p + "gate_proj.bias"], w[p + "up_proj.bias"]
        db, ds = q(w[p + "down_proj.weight"])
        t[p + "gate_up_proj_blocks"] = ("U8", blocks)
        t[p + "gate_up_proj_scales"] = ("U8", scales)
        t[p + "gate_up_proj_bias"] = ("F32", bias)
        t[p + "down_proj_blocks"] = ("U8", db)
        t[p + "down_proj_scales"] = ("U8", ds)
        t[p + "down_proj_bias"] = ("F32", w[p + "down_proj.bias"])
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(dict(c, quantization_config=OPENAI_QUANT), f, indent=1)
    write_safetensors(os.path.join(d, "model.safetensors"), t)


def yarn_inv_freq_transformers(dim, base, factor, orig, beta_fast, beta_slow, truncate):
    """transformers `_compute_yarn_parameters`' inv_freq, in numpy (f64)."""
    def corr(rot):
        return dim * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))
    low, high = corr(beta_fast), corr(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    pos = base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    extra = 1 - ramp
    return (1 / (factor * pos)) * (1 - extra) + (1 / pos) * extra


def main():
    a, root = fixture_args(mlx_cpu=True)

    rng = np.random.default_rng(4200)
    c = BASE
    w = random_weights(c, rng)
    d = os.path.join(root, "gpt_oss_f32")
    write_hf(d, c, w, "f32")
    yarn = {"yarn_no_truncate": {"head_dim": 64, "rope_theta": 150000.0, "factor": 32.0,
                                 "original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0,
                                 "inv_freq": yarn_inv_freq_transformers(64, 150000.0, 32.0, 4096, 32.0, 1.0,
                                                                        False).tolist()}}
    tokens, logits = case(root, "gpt_oss_f32", c, rng, {"f32": lambda t, m: mlx_logits(d, t, m)}, yarn)
    dh = os.path.join(root, "gpt_oss_hf_f32")
    write_hf(dh, c, hf_layout(c, w), "f32")
    save_case(dh, tokens, c["vocab_size"], logits)

    d2 = os.path.join(root, "gpt_oss_mlx4")
    write_affine(d2, d, c, "bf16", 4, 32, {})
    case(root, "gpt_oss_mlx4", c, rng, {"f32": lambda t, m: mlx_logits(d2, t, m),
                                        "int8acts": lambda t, m: mlx_logits(d2, t, m, int8acts=True)})

    c2 = LAYERS
    w2 = random_weights(c2, np.random.default_rng(4201))
    d3 = os.path.join(root, "gpt_oss_layers_f32")
    write_hf(d3, c2, w2, "f32")
    case(root, "gpt_oss_layers_f32", c2, rng, {"f32": lambda t, m: mlx_logits(d3, t, m)})

    rng4 = np.random.default_rng(4202)
    w4 = random_weights(c, rng4)
    w4["lm_head.weight"] *= np.float32(0.3)
    d4 = os.path.join(root, "gpt_oss_q8_0")
    os.makedirs(d4, exist_ok=True)
    deq = write_gguf(os.path.join(d4, "model.gguf"), c, w4)
    hf = os.path.join(d4, "hf")
    write_hf(hf, c, deq, "f32")
    case(root, "gpt_oss_q8_0", c, rng4,
         {"deq": lambda t, m: mlx_logits(hf, t, m),
          "int8acts": lambda t, m: mlx_logits(hf, t, m, int8acts=True, f32_router=True)})

    # yarn on a llama-family graph (mlx-lm qwen3 → YarnRoPE, with its attention factor).
    import model_reference as mr
    cq = mr.full_config(dict(model_type="qwen3", hidden_size=64, num_hidden_layers=3, intermediate_size=96,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=600,
                             rope_theta=1000000.0, tie_word_embeddings=False,
                             rope_scaling=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=512,
                                               beta_fast=32.0, beta_slow=1.0)))
    dq = os.path.join(root, "qwen3_yarn_f32")
    write_hf(dq, cq, mr.random_weights(cq, np.random.default_rng(4204)), "f32")
    tq = [int(t) for t in np.random.default_rng(4205).integers(3, cq["vocab_size"], SEQ)]
    save_case(dq, tq, cq["vocab_size"], {"f32": mr.mlx_logits(dq, tq, upcast=True)})
    print("gpt_oss_reference: qwen3_yarn_f32", flush=True)

    # The same weights with MXFP4 experts (gguf-py's quantizer; other matrices Q8_0).
    d7 = os.path.join(root, "gpt_oss_mxfp4_q8_0")
    os.makedirs(d7, exist_ok=True)
    deq7 = write_gguf(os.path.join(d7, "model.gguf"), c, w4, mxfp4=True)
    hf7 = os.path.join(d7, "hf")
    write_hf(hf7, c, deq7, "f32")
    case(root, "gpt_oss_mxfp4_q8_0", c, np.random.default_rng(4207),
         {"deq": lambda t, m: mlx_logits(hf7, t, m),
          "int8acts": lambda t, m: mlx_logits(hf7, t, m, int8acts=True, f32_router=True)})

    # OpenAI's own HF layout (MXFP4 experts, interleaved gate/up), loaded by mlx-lm from that very
    # directory (its sanitize and quant_method mapping); int8acts rounds the experts' inputs only
    # (every other matrix is F32).
    d8 = os.path.join(root, "gpt_oss_openai_mxfp4")
    write_openai_mxfp4(d8, c, random_weights(c, np.random.default_rng(4208)))
    case(root, "gpt_oss_openai_mxfp4", c, np.random.default_rng(4209),
         {"f32": lambda t, m: mlx_logits(d8, t, m),
          "int8acts": lambda t, m: mlx_logits(d8, t, m, int8acts=True, experts_only=True)})

    d5 = os.path.join(root, "gpt_oss_gguf_f32")
    os.makedirs(d5, exist_ok=True)
    write_gguf(os.path.join(d5, "model.gguf"), c, w, f32=True)
    save_case(d5, tokens, c["vocab_size"], {"deq": logits["f32"]})

    d6 = os.path.join(root, "gpt_oss_gguf_f16")
    os.makedirs(d6, exist_ok=True)
    back = write_gguf(os.path.join(d6, "model.gguf"), c, w, f16=True)
    write_hf(os.path.join(d6, "hf"), c, back, "f32")
    case(root, "gpt_oss_gguf_f16", c, np.random.default_rng(4206),
         {"deq": lambda t, m: mlx_logits(os.path.join(d6, "hf"), t, m)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
