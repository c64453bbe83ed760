#!/usr/bin/env python3
"""Oracle for the Qwen3.5 (hybrid: gated DeltaNet + gated full attention) tests: tiny random-weight
checkpoints run through mlx-lm's own `qwen3_5` classes.

Writes <out>/models/<case>/ like model_reference.py (config.json + model.safetensors, ref.json,
logits_<set>.f32 [64, V]); logits are mlx-lm's over 64 teacher-forced tokens in one call without
a cache (fresh conv and recurrent state). Every config key the model reads is written explicitly.

Cases:
  qwen3_5_text_f32  `qwen3_5_text` config (HF's text-only model_type), HF layout: norm gains
                    stored as γ − 1, conv1d.weight [C, 1, K]; 4 layers, full attention every 2nd
                    (layers 1 and 3), GQA 4:2, head_dim 16 with partial RoPE 0.25 (4 dims), linear
                    heads 2 key × 16 / 4 value × 8 (d_k != d_v), conv kernel 4, own lm_head
  qwen3_5_mm        the same weights as a multimodal `qwen3_5` checkpoint: text_config, the text
                    tower under model.language_model., tied embeddings (no lm_head), plus a vision
                    tensor and an MTP tensor that a text-only runner ignores
  qwen3_5_mlx4      mlx-lm's own 4-bit (group 32, bf16 scales) quantization of qwen3_5_text saved as
                    mlx_lm.convert does: sanitized (gains γ, conv1d [C, K, 1]), weights under
                    language_model.; oracle upcast to f32 after loading
  qwen3_5_q8_0      GGUF `qwen35` written as llama.cpp's converter does (Qwen3_5TextModel): norm gains
                    + 1 except the gated norm, ssm_a = −exp(A_log), conv1d squeezed to [C, K], every
                    per-value-head tensor reordered from grouped-by-key-head to tiled order, matrices
                    Q8_0; oracle ("deq"): mlx-lm on the HF checkpoint of exactly the dequantized values
Sets: f32 (mlx computes in f32), deq (the GGUF case) and, for qwen3_5_mlx4 and qwen3_5_q8_0,
int8acts: the same with every quantized linear's input rounded to int8 per block of 32 (scale
max|x|/127), the activation quantization of larder's fast integer kernels — on this tiny random model the hybrid's gates amplify that
rounding to ~14 % of max|logit| (measured: 0.611 of 4.37), far beyond the int8 bound of
arch_parity_test, so the fast table is held to what its arithmetic is meant to compute.
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_ref import add_experts, add_gated_delta, add_transformer, finish, gguf_namer, q8_0  # noqa: E402
from model_reference import SEQ, fixture_args, save_case, write_affine, write_hf, write_safetensors  # noqa: E402

TEXT = dict(model_type="qwen3_5_text", hidden_size=64, intermediate_size=128, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, vocab_size=300,
            max_position_embeddings=512, linear_num_value_heads=4, linear_num_key_heads=2,
            linear_key_head_dim=16, linear_value_head_dim=8, linear_conv_kernel_dim=4,
            tie_word_embeddings=False, attention_bias=False, full_attention_interval=2,
            layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
            rope_parameters=dict(type="default", rope_theta=10000.0, partial_rotary_factor=0.25,
                                 mrope_section=[1, 1, 0]),
            num_experts=0, bos_token_id=1, eos_token_id=2)


def hybrid_shapes(c, linear_in, mlp):
    """The HF tensor shapes, in file order, of the hybrid trunk Qwen3.5 and Qwen3-Next share: gated
    full attention every full_attention_interval-th layer, the gated DeltaNet elsewhere with its
    input projections `linear_in` (name under linear_attn. → shape; the two lay them out
    differently), and `mlp(p, l)`'s tensors (name → shape) for layer l under prefix p."""
    h, V = c["hidden_size"], c["vocab_size"]
    nh, nkv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    hk, hv = c["linear_num_key_heads"], c["linear_num_value_heads"]
    dk, dv, K = c["linear_key_head_dim"], c["linear_value_head_dim"], c["linear_conv_kernel_dim"]
    C = 2 * hk * dk + hv * dv
    s = {"model.embed_tokens.weight": (V, h), "model.norm.weight": (h,)}
    if not c["tie_word_embeddings"]:
        s["lm_head.weight"] = (V, h)
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        s[p + "input_layernorm.weight"] = (h,)
        s[p + "post_attention_layernorm.weight"] = (h,)
        if (l + 1) % c["full_attention_interval"] == 0:
            s[p + "self_attn.q_proj.weight"] = (2 * nh * hd, h)
            s[p + "self_attn.k_proj.weight"] = (nkv * hd, h)
            s[p + "self_attn.v_proj.weight"] = (nkv * hd, h)
            s[p + "self_attn.o_proj.weight"] = (h, nh * hd)
            s[p + "self_attn.q_norm.weight"] = (hd,)
            s[p + "self_attn.k_norm.weight"] = (hd,)
        else:
            a = p + "linear_attn."
            s.update((a + n, shape) for n, shape in linear_in.items())
            s[a + "conv1d.weight"] = (C, 1, K)  # HF layout
            s[a + "dt_bias"] = (hv,)
            s[a + "A_log"] = (hv,)
            s[a + "norm.weight"] = (dv,)
            s[a + "out_proj.weight"] = (h, hv * dv)
        s.update(mlp(p, l))
    return s


def dense_mlp(c, p):
    h, ffn = c["hidden_size"], c["intermediate_size"]
    return {p + "mlp.gate_proj.weight": (ffn, h), p + "mlp.up_proj.weight": (ffn, h),
            p + "mlp.down_proj.weight": (h, ffn)}


def tensor_shapes(c):
    h, hk, hv = c["hidden_size"], c["linear_num_key_heads"], c["linear_num_value_heads"]
    dk, dv = c["linear_key_head_dim"], c["linear_value_head_dim"]
    linear_in = {"in_proj_qkv.weight": (2 * hk * dk + hv * dv, h), "in_proj_z.weight": (hv * dv, h),
                 "in_proj_b.weight": (hv, h), "in_proj_a.weight": (hv, h)}
    return hybrid_shapes(c, linear_in, lambda p, l: dense_mlp(c, p))


def random_weights(c, rng):
    return hybrid_random_weights(tensor_shapes(c), rng)


def hybrid_random_weights(shapes, rng, unit=("model.embed_tokens.weight",), other=lambda name, shape: None):
    """The hybrid trunk's random weights (Qwen3.5, Qwen3-Next), in `shapes`' order, HF layout: the
    RMSNorm gains (input, post-attention, final, q/k norms) are stored as γ − 1, so small values
    around 0; the gated norm of the DeltaNet output is γ itself; the `unit` tensors N(0, 1); a
    tensor `other` gives (not None) as it gives it; every other matrix N(0, 1/in)."""
    w = {}
    for name, shape in shapes.items():
        if name.endswith("linear_attn.norm.weight"):
            w[name] = (1.0 + 0.3 * rng.standard_normal(shape)).astype(np.float32)
        elif name.endswith("norm.weight"):
            w[name] = (0.3 * rng.standard_normal(shape)).astype(np.float32)
        elif name.endswith("A_log"):
            w[name] = np.log(rng.uniform(0.5, 8.0, shape)).astype(np.float32)
        elif name.endswith("dt_bias"):
            w[name] = (0.5 * rng.standard_normal(shape)).astype(np.float32)
        elif name.endswith("conv1d.weight"):
            w[name] = (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)
        elif name in unit:
            w[name] = rng.standard_normal(shape).astype(np.float32)
        elif (x := other(name, shape)) is not None:
            w[name] = x
        else:
            w[name] = (rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32)
    return w


def mlx_qwen3_5_logits(d, tokens):
    """mlx-lm's qwen3_5 classes on the directory's config and tensors (its sanitize maps every
    layout: HF text-only, HF multimodal, its own saves). mlx_lm.utils.load_model cannot read a
    `qwen3_5_text` model_type (no module of that name), so the classes are used directly; the
    quantized case goes through load_model, which knows its quantization block."""
    import mlx.core as mx
    from mlx_lm.models import qwen3_5
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    if "quantization" in cfg:
        from pathlib import Path
        from mlx_lm.utils import load_model
        model, _ = load_model(Path(d))
        model.set_dtype(mx.float32)  # scales, biases and unquantized tensors: f32 math over their values
    else:
        model = qwen3_5.Model(qwen3_5.ModelArgs.from_dict(cfg))
        w = model.sanitize(mx.load(os.path.join(d, "model.safetensors")))
        model.load_weights(list(w.items()))
    model.eval()
    out = model(mx.array(tokens, dtype=mx.int32)[None])
    return np.array(out[0].astype(mx.float32))


def mlx_int8acts_logits(d, tokens):
    """mlx_qwen3_5_logits with each linear layer's input quantized to int8 per 32-block first
    (kernels/cpu/common/act_quant.h: d = amax/127, q = nearbyint(x · 1/d)) — the activations larder's
    fast integer kernels (MLX affine, GGUF blocks) multiply with."""
    import mlx.core as mx
    import mlx.nn as nn

    def q8(x):
        xb = x.reshape(-1, 32)
        sc = mx.max(mx.abs(xb), axis=-1, keepdims=True) / 127.0
        q = mx.round(xb * mx.where(sc == 0, 0, 1 / mx.where(sc == 0, 1, sc)))  # nearbyint(x · 1/d)
        return (q * sc).reshape(x.shape)

    saved = {cls: cls.__call__ for cls in (nn.QuantizedLinear, nn.Linear)}
    for cls, call in saved.items():
        cls.__call__ = (lambda f: lambda self, x: f(self, q8(x)))(call)
    try:
        return mlx_qwen3_5_logits(d, tokens)
    finally:
        for cls, call in saved.items():
            cls.__call__ = call


def write_multimodal(d, c, weights):
    os.makedirs(d, exist_ok=True)
    tc = {k: v for k, v in c.items() if k not in ("bos_token_id", "eos_token_id")}
    tc.update(model_type="qwen3_5_text", tie_word_embeddings=True)
    cfg = dict(model_type="qwen3_5", text_config=tc, vocab_size=c["vocab_size"], bos_token_id=1, eos_token_id=2,
               tie_word_embeddings=True, vision_config=dict(model_type="qwen3_5_vision"))
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    t = {}
    for k, v in weights.items():
        if k == "lm_head.weight":
            continue
        t["model.language_model." + k[len("model."):]] = ("F32", v)
    t["model.visual.blocks.0.attn.qkv.weight"] = ("F32", np.ones((8, 4), dtype=np.float32))
    t["mtp.fc.weight"] = ("F32", np.ones((4, 8), dtype=np.float32))
    write_safetensors(os.path.join(d, "model.safetensors"), t)


GGUF_NAMES = [("input_layernorm.", "attn_norm."), ("post_attention_layernorm.", "post_attention_norm."),
              ("self_attn.q_proj.", "attn_q."), ("self_attn.k_proj.", "attn_k."), ("self_attn.v_proj.", "attn_v."),
              ("self_attn.o_proj.", "attn_output."), ("self_attn.q_norm.", "attn_q_norm."),
              ("self_attn.k_norm.", "attn_k_norm."), ("linear_attn.in_proj_qkv.", "attn_qkv."),
              ("linear_attn.in_proj_z.", "attn_gate."), ("linear_attn.in_proj_b.", "ssm_beta."),
              ("linear_attn.in_proj_a.", "ssm_alpha."), ("linear_attn.conv1d.", "ssm_conv1d."),
              ("linear_attn.dt_bias", "ssm_dt.bias"), ("linear_attn.A_log", "ssm_a"),
              ("linear_attn.norm.", "ssm_norm."), ("linear_attn.out_proj.", "ssm_out."),
              ("mlp.gate_proj.", "ffn_gate."), ("mlp.up_proj.", "ffn_up."), ("mlp.down_proj.", "ffn_down."),
              # the MoE variant (qwen35moe; used by qwen3_moe_reference.py)
              ("mlp.gate.", "ffn_gate_inp."), ("mlp.switch_mlp.gate_proj.", "ffn_gate_exps."),
              ("mlp.switch_mlp.up_proj.", "ffn_up_exps."), ("mlp.switch_mlp.down_proj.", "ffn_down_exps."),
              ("mlp.shared_expert.gate_proj.", "ffn_gate_shexp."), ("mlp.shared_expert.up_proj.", "ffn_up_shexp."),
              ("mlp.shared_expert.down_proj.", "ffn_down_shexp."), ("mlp.shared_expert_gate.", "ffn_gate_inp_shexp.")]


gguf_name = gguf_namer(GGUF_NAMES)


def to_tiled(t, axis, hk, r, hd):
    """llama.cpp _LinearAttentionVReorderBase: value heads grouped by key head [H_k, r, hd] →
    tiled [r, H_k, hd] along `axis`."""
    t = np.moveaxis(t, axis, 0)
    rest = t.shape[1:]
    t = t.reshape(hk, r, hd, *rest).swapaxes(0, 1).reshape(hk * r * hd, *rest)
    return np.moveaxis(t, 0, axis)


def from_tiled(t, axis, hk, r, hd):
    t = np.moveaxis(t, axis, 0)
    rest = t.shape[1:]
    t = t.reshape(r, hk, hd, *rest).swapaxes(0, 1).reshape(hk * r * hd, *rest)
    return np.moveaxis(t, 0, axis)


def write_gguf(path, c, weights, arch="qwen35", extra=None):
    """Returns the HF-layout weights of exactly the values the GGUF holds (the oracle's input).
    arch "qwen35moe": c has the MoE keys and `weights` the experts stacked as switch_mlp.*; the
    router and the shared expert's gate stay F32 (the converter's rule for FFN_GATE_INP*).
    extra(writer), if given, adds metadata (e.g. a vocabulary) before the file is written."""
    import gguf
    hk, hv = c["linear_num_key_heads"], c["linear_num_value_heads"]
    dk, dv = c["linear_key_head_dim"], c["linear_value_head_dim"]
    r, kd = hv // hk, hk * dk
    wr = gguf.GGUFWriter(path, arch)
    if arch == "qwen35moe":
        add_experts(wr, c, shared=True)
    rp = c["rope_parameters"]
    add_transformer(wr, c, rp["rope_theta"], rope_dims=int(c["head_dim"] * rp["partial_rotary_factor"]),
                    rope_sections=[1, 1, 0, 0])
    add_gated_delta(wr, c)
    wr.add_bos_token_id(c["bos_token_id"])
    wr.add_eos_token_id(c["eos_token_id"])
    back = {}
    for name, w in weights.items():
        w = w.copy()
        undo = lambda x: x  # noqa: E731  (GGUF layout → HF layout of the stored values)
        if ".linear_attn." in name:
            if name.endswith("in_proj_qkv.weight") or name.endswith("conv1d.weight"):
                w[2 * kd:] = to_tiled(w[2 * kd:], 0, hk, r, dv)
                undo = lambda x: np.concatenate([x[:2 * kd], from_tiled(x[2 * kd:], 0, hk, r, dv)])  # noqa: E731
            elif name.endswith("in_proj_z.weight"):
                w = to_tiled(w, 0, hk, r, dv)
                undo = lambda x: from_tiled(x, 0, hk, r, dv)  # noqa: E731
            elif name.endswith(("in_proj_a.weight", "in_proj_b.weight", "A_log", "dt_bias")):
                w = to_tiled(w, 0, hk, r, 1)
                undo = lambda x: from_tiled(x, 0, hk, r, 1)  # noqa: E731
            elif name.endswith("out_proj.weight"):
                w = to_tiled(w, 1, hk, r, dv)
                undo = lambda x: from_tiled(x, 1, hk, r, dv)  # noqa: E731
        if name.endswith("conv1d.weight"):
            wr.add_tensor(gguf_name(name), w[:, 0, :].astype(np.float32))
            back[name] = undo(w)
        elif name.endswith("A_log"):
            wr.add_tensor(gguf_name(name), (-np.exp(w)).astype(np.float32))
            # what larder reads back: log(−A), the oracle gets the same f32 value
            back[name] = undo(np.log(np.exp(w)).astype(np.float32))
        elif w.ndim == 1 or name.endswith(("mlp.gate.weight", "shared_expert_gate.weight")):
            gain = name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight")
            wr.add_tensor(gguf_name(name), (w + np.float32(1.0)).astype(np.float32) if gain else w)
            back[name] = undo(w)
        else:
            back[name] = undo(q8_0(wr, gguf_name(name), w))
    if extra:
        extra(wr)
    finish(wr)
    return back


def main():
    a, root = fixture_args(mlx_cpu=True)
    c = TEXT
    rng = np.random.default_rng(3500)
    w = random_weights(c, rng)
    tokens = [int(t) for t in rng.integers(0, c["vocab_size"], SEQ)]

    d = os.path.join(root, "qwen3_5_text_f32")
    write_hf(d, c, w, "f32")
    save_case(d, tokens, c["vocab_size"], {"f32": mlx_qwen3_5_logits(d, tokens)})
    print("qwen3_5_reference: qwen3_5_text_f32", flush=True)

    d = os.path.join(root, "qwen3_5_mm")
    write_multimodal(d, c, w)
    save_case(d, tokens, c["vocab_size"], {"f32": mlx_qwen3_5_logits(d, tokens)})
    print("qwen3_5_reference: qwen3_5_mm", flush=True)

    # mlx-lm's converter input: the same checkpoint under a model_type load_model knows.
    src = os.path.join(root, "qwen3_5_src")
    write_hf(src, dict(c, model_type="qwen3_5"), w, "f32")
    d = os.path.join(root, "qwen3_5_mlx4")
    write_affine(d, src, dict(c, model_type="qwen3_5"), "bf16", 4, 32, {})
    save_case(d, tokens, c["vocab_size"],
              {"f32": mlx_qwen3_5_logits(d, tokens), "int8acts": mlx_int8acts_logits(d, tokens)})
    print("qwen3_5_reference: qwen3_5_mlx4", flush=True)

    d = os.path.join(root, "qwen3_5_q8_0")
    os.makedirs(d, exist_ok=True)
    deq = write_gguf(os.path.join(d, "model.gguf"), c, w)
    hf = os.path.join(d, "hf")
    write_hf(hf, c, deq, "f32")
    save_case(d, tokens, c["vocab_size"],
              {"deq": mlx_qwen3_5_logits(hf, tokens), "int8acts": mlx_int8acts_logits(hf, tokens)})
    print("qwen3_5_reference: qwen3_5_q8_0", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
