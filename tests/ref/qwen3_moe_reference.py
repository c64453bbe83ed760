#!/usr/bin/env python3
"""Oracle for the Qwen3-MoE tests: tiny random-weight checkpoints run through mlx-lm's own
`qwen3_moe` Model class.

Writes <out>/models/<case>/ like model_reference.py (config.json + weights, ref.json, logits_<set>.f32
[64, V]); logits are mlx-lm's over 64 teacher-forced tokens in one call without a cache. Every
config key mlx-lm's ModelArgs reads is written explicitly (transformers defaults norm_topk_prob to
false and mlp_only_layers to [], mlx-lm has no defaults for them).

Cases:
  qwen3_moe_f32        HF layout (one tensor per expert: mlp.experts.N.{gate,up,down}_proj, router
                       mlp.gate), 4 layers, 8 experts, 2 per token, norm_topk_prob, layer 2 dense
                       (mlp_only_layers [2], intermediate_size 96 != moe_intermediate_size 32),
                       GQA 4:2, head_dim 16, own lm_head
  qwen3_moe_step2_f32  decoder_sparse_step 2 (layers 1 and 3 routed, 0 and 2 dense), 6 experts, 3
                       per token, norm_topk_prob false, tied embeddings
  qwen3_moe_mlx4       mlx-lm's own 4-bit quantization (group 32, bf16 scales) of qwen3_moe_f32 as
                       mlx_lm.convert saves it: experts stacked as mlp.switch_mlp.*, the router at
                       8 bits / group 64 (the model's quant_predicate); oracle upcast to f32
  qwen3_moe_q8_0       GGUF `qwen3moe` as llama.cpp's converter writes it (Qwen3MoeModel): every
                       layer routed (llama.cpp's graph has no dense layer and always renormalises),
                       blk.N.ffn_gate_inp F32, ffn_{gate,up,down}_exps stacked [E, rows, cols] Q8_0,
                       expert_count / expert_used_count / expert_feed_forward_length, and a
                       synthetic SPM vocabulary (one CJK character per id) so llama.cpp's tools run
                       on it; oracle ("deq"): mlx-lm on the HF checkpoint of the dequantized values.
                       Also ppl_text.txt: 512 tokens of that vocabulary for llama-perplexity.
  qwen3_moe_poisoned   qwen3_moe_f32 with every expert the last token is not routed to (per layer,
                       mlx-lm's choice) set to NaN; no logits of its own
  qwen3_5_moe_f32      the MoE variant of Qwen3.5 (mlx-lm `qwen3_5_moe`, qwen3_next's sparse block):
                       qwen3_5_reference.py's hybrid layers (2 gated DeltaNet, 2 gated attention, HF
                       layout) with every FFN routed — 8 experts, 2 per token, renormalised — plus a
                       shared expert (intermediate 64) scaled by σ(shared_expert_gate · x); experts as
                       transformers 5 writes them: mlp.experts.gate_up_proj [E, 2·I, H] and
                       mlp.experts.down_proj [E, H, I]
  qwen3_5_moe_q8_0     the same weights as GGUF `qwen35moe` (qwen3_5_reference.write_gguf: Q8_0, the
                       router and ffn_gate_inp_shexp F32, experts stacked ffn_*_exps, shared expert
                       ffn_*_shexp, expert_count / expert_used_count / expert_feed_forward_length /
                       expert_shared_feed_forward_length); oracle ("deq") mlx-lm on the dequantized values
  qwen3_5_moe_mlx4     mlx-lm's 4-bit quantization of it (switch_mlp stacked; router and
                       shared_expert_gate at 8 bits / group 64, the model's quant_predicate)
  qwen3_5_moe_ppl_q8_0 for llama-perplexity only: the same shapes with linear_value_head_dim 16 (what
                       llama.cpp's qwen35 loader accepts), the synthetic SPM vocabulary, ppl_text.txt
Sets: f32, deq (the GGUF case), and for qwen3_moe_mlx4 / qwen3_moe_q8_0 int8acts: every quantized
linear's (and expert matmul's) input rounded to int8 per block of 32 first, the activation
quantization of larder's fast integer kernels (as qwen3_5_reference.py).
ref.json also records `routes` (per routed layer, each token's expert ids as mlx-lm chose them) and
min_route_margin: the smallest gap between the k-th and (k+1)-th router logit over every routed
layer, token and set; the tokens are drawn again until it is >= MIN_ROUTE_MARGIN (see case()).
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_ref import add_experts, add_transformer, finish, gguf_namer, q8_0, text_of, write_spm_vocab  # noqa: E402
from model_reference import SEQ, fixture_args, save_case, write_affine, write_hf  # noqa: E402

BASE = dict(model_type="qwen3_moe", hidden_size=64, intermediate_size=96, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, vocab_size=300,
            max_position_embeddings=512, rope_theta=10000.0, rope_scaling=None, tie_word_embeddings=False,
            attention_bias=False, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
            decoder_sparse_step=1, mlp_only_layers=[2], norm_topk_prob=True, bos_token_id=1, eos_token_id=2)
STEP2 = dict(BASE, num_experts=6, num_experts_per_tok=3, decoder_sparse_step=2, mlp_only_layers=[],
             norm_topk_prob=False, tie_word_embeddings=True)
ALL_ROUTED = dict(BASE, mlp_only_layers=[])
PPL_TOKENS = 512


def routed(c, l):
    return l not in c["mlp_only_layers"] and c["num_experts"] > 0 and (l + 1) % c["decoder_sparse_step"] == 0


def tensor_shapes(c):
    h, ffn, V = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    nh, nkv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    E, I = c["num_experts"], c["moe_intermediate_size"]
    s = {"model.embed_tokens.weight": (V, h), "model.norm.weight": (h,)}
    if not c["tie_word_embeddings"]:
        s["lm_head.weight"] = (V, h)
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        s[p + "input_layernorm.weight"] = (h,)
        s[p + "post_attention_layernorm.weight"] = (h,)
        s[p + "self_attn.q_proj.weight"] = (nh * hd, h)
        s[p + "self_attn.k_proj.weight"] = (nkv * hd, h)
        s[p + "self_attn.v_proj.weight"] = (nkv * hd, h)
        s[p + "self_attn.o_proj.weight"] = (h, nh * hd)
        s[p + "self_attn.q_norm.weight"] = (hd,)
        s[p + "self_attn.k_norm.weight"] = (hd,)
        if routed(c, l):
            s[p + "mlp.gate.weight"] = (E, h)
            for e in range(E):
                s[p + f"mlp.experts.{e}.gate_proj.weight"] = (I, h)
                s[p + f"mlp.experts.{e}.up_proj.weight"] = (I, h)
                s[p + f"mlp.experts.{e}.down_proj.weight"] = (h, I)
        else:
            s[p + "mlp.gate_proj.weight"] = (ffn, h)
            s[p + "mlp.up_proj.weight"] = (ffn, h)
            s[p + "mlp.down_proj.weight"] = (h, ffn)
    return s


def random_weights(c, rng):
    w = {}
    for name, shape in tensor_shapes(c).items():
        if name.endswith("norm.weight"):
            w[name] = (1.0 + 0.2 * rng.standard_normal(shape)).astype(np.float32)
        elif name in ("model.embed_tokens.weight", "lm_head.weight"):
            w[name] = rng.standard_normal(shape).astype(np.float32)
        elif name.endswith("mlp.gate.weight"):
            # router logits ~N(0, 2²): tokens spread over the experts, clear k-th/(k+1)-th gaps
            w[name] = (2.0 * rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32)
        else:
            w[name] = (rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32)
    return w


def load_mlx(d):
    import mlx.core as mx
    from pathlib import Path
    from mlx_lm.utils import load_model
    model, _ = load_model(Path(d))
    model.set_dtype(mx.float32)  # scales, biases and unquantized tensors: f32 math over their values
    model.eval()
    return model


def moe_class(moe_block):
    if moe_block == "qwen3_next":
        from mlx_lm.models import qwen3_next
        return qwen3_next.Qwen3NextSparseMoeBlock
    from mlx_lm.models import qwen3_moe
    return qwen3_moe.Qwen3MoeSparseMoeBlock


def mlx_logits(d, tokens, margins=None, routes=None, prepare=None, moe_block="qwen3_moe"):
    """mlx-lm's logits; with `margins` (a list), the smallest gap between the k-th and (k+1)-th
    router logit of each routed layer is appended; with `routes`, each routed layer's chosen expert
    ids per token ([T, k], sorted). `prepare(model)` runs after loading."""
    import mlx.core as mx
    cls = moe_class(moe_block)
    model = load_mlx(d)
    if prepare:
        prepare(model)
    saved = cls.__call__

    def probe(self, x):
        g = np.array(self.gate(x).astype(mx.float32))[0]
        s = np.sort(g, axis=-1)
        if margins is not None:
            margins.append(float(np.min(s[:, -self.top_k] - s[:, -self.top_k - 1])))
        if routes is not None:
            routes.append(np.sort(np.argsort(-g, axis=-1, kind="stable")[:, :self.top_k], axis=-1).tolist())
        return saved(self, x)
    cls.__call__ = probe
    try:
        out = model(mx.array(tokens, dtype=mx.int32)[None])
        return np.array(out[0].astype(mx.float32))
    finally:
        cls.__call__ = saved


def mlx_int8acts_logits(d, tokens, margins=None, f32_router=False, moe_block="qwen3_moe"):
    """mlx_logits with each quantized linear's and expert matmul's input quantized to int8 per
    32-block first (kernels/cpu/common/act_quant.h: d = amax/127, q = nearbyint(x · 1/d)), the
    activations larder's fast integer kernels multiply with. f32_router: the router (and a shared
    expert's gate) is an F32 matrix in larder (the GGUF case), whose input larder does not quantize."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.models import switch_layers

    def q8(x):
        xb = x.reshape(-1, 32)
        sc = mx.max(mx.abs(xb), axis=-1, keepdims=True) / 127.0
        q = mx.round(xb * mx.where(sc == 0, 0, 1 / mx.where(sc == 0, 1, sc)))
        return (q * sc).reshape(x.shape)

    def prepare(model):
        for m in model.modules():
            if isinstance(m, moe_class(moe_block)) and f32_router:
                m.gate.keep_f32_input = True
                if hasattr(m, "shared_expert_gate"):
                    m.shared_expert_gate.keep_f32_input = True

    classes = (nn.QuantizedLinear, nn.Linear, switch_layers.QuantizedSwitchLinear, switch_layers.SwitchLinear)
    saved = {cls: cls.__call__ for cls in classes}
    for cls, call in saved.items():
        cls.__call__ = (lambda f: lambda self, x, *a, **k: f(self, x if getattr(self, "keep_f32_input", False)
                                                           else q8(x), *a, **k))(call)
    try:
        return mlx_logits(d, tokens, margins, prepare=prepare, moe_block=moe_block)
    finally:
        for cls, call in saved.items():
            cls.__call__ = call


# llama.cpp's GGUF names (gguf-py TensorNameMap for MODEL_ARCH.QWEN3MOE).
GGUF_NAMES = [("input_layernorm.", "attn_norm."), ("post_attention_layernorm.", "ffn_norm."),
              ("self_attn.q_proj.", "attn_q."), ("self_attn.k_proj.", "attn_k."), ("self_attn.v_proj.", "attn_v."),
              ("self_attn.o_proj.", "attn_output."), ("self_attn.q_norm.", "attn_q_norm."),
              ("self_attn.k_norm.", "attn_k_norm."), ("mlp.gate.", "ffn_gate_inp.")]
gguf_name = gguf_namer(GGUF_NAMES)


def write_gguf(path, c, weights):
    """Returns the HF-layout weights of exactly the values the GGUF holds (the oracle's input)."""
    import gguf
    E, L = c["num_experts"], c["num_hidden_layers"]
    assert all(routed(c, l) for l in range(L)), "llama.cpp's qwen3moe routes every layer"
    wr = gguf.GGUFWriter(path, "qwen3moe")
    add_transformer(wr, c, c["rope_theta"])
    add_experts(wr, c)
    wr.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    write_spm_vocab(wr, c)
    back = {}

    def quant(name, w):
        return q8_0(wr, name, w)

    for name, w in weights.items():
        if ".mlp.experts." in name:
            continue
        if w.ndim == 1 or name.endswith("mlp.gate.weight"):  # norms; the router stays F32 (converter)
            wr.add_tensor(gguf_name(name), w)
            back[name] = w
        else:
            back[name] = quant(gguf_name(name), w)
    for l in range(L):
        p = f"model.layers.{l}.mlp."
        for proj, short in (("gate_proj", "gate"), ("up_proj", "up"), ("down_proj", "down")):
            stacked = np.stack([weights[p + f"experts.{e}.{proj}.weight"] for e in range(E)])
            deq = quant(f"blk.{l}.ffn_{short}_exps.weight", stacked)
            for e in range(E):
                back[p + f"experts.{e}.{proj}.weight"] = deq[e]
    finish(wr)
    return back


MIN_ROUTE_MARGIN = 2e-3


def case(root, name, c, rng, sets):
    """Draws 64 tokens, runs every logit set, and draws again while a routing decision is within
    MIN_ROUTE_MARGIN (router logits, k-th vs (k+1)-th) in any set: on such a near-tie a last-bit
    difference picks another expert and the comparison would be about which side of the tie a
    rounding fell. Returns {routed layer: [T][k] expert ids} of the first (exact) set."""
    d = os.path.join(root, name)
    for attempt in range(50):
        tokens = [int(t) for t in rng.integers(3, c["vocab_size"], SEQ)]
        margins, routes, logits = [], [], {}
        for i, (s, fn) in enumerate(sets.items()):
            logits[s] = fn(tokens, margins, routes if i == 0 else None)
        if min(margins) >= MIN_ROUTE_MARGIN:
            break
    else:
        raise SystemExit(f"{name}: no token draw without a routing near-tie")
    layers = [l for l in range(c["num_hidden_layers"]) if routed(c, l)]
    by_layer = {str(l): r for l, r in zip(layers, routes)}
    save_case(d, tokens, c["vocab_size"], logits, {"min_route_margin": min(margins), "routes": by_layer,
                                                   "token_draws": attempt + 1})
    print(f"qwen3_moe_reference: {name} (min route margin {min(margins):.3g}, draw {attempt + 1})", flush=True)
    return by_layer, tokens


def write_poisoned(d, src, c, w, routes, token):
    """qwen3_moe_f32 with every expert that `token` is not routed to (in each routed layer) made
    NaN: decoding that token after a clean prefill must not see them."""
    poisoned = dict(w)
    for l, r in routes.items():
        for e in range(c["num_experts"]):
            if e in r[token]:
                continue
            for proj in ("gate_proj", "up_proj", "down_proj"):
                n = f"model.layers.{l}.mlp.experts.{e}.{proj}.weight"
                poisoned[n] = np.full_like(w[n], np.nan)
    write_hf(d, c, poisoned, "f32")


def qwen3_5_moe_weights(c, rng):
    """qwen3_5_reference's hybrid weights with every MLP replaced by the MoE block, experts as
    transformers 5 writes them (experts.gate_up_proj, experts.down_proj)."""
    import qwen3_5_reference as q35
    w = q35.random_weights(c, rng)
    h, E, I, S = c["hidden_size"], c["num_experts"], c["moe_intermediate_size"], c["shared_expert_intermediate_size"]

    def mat(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}.mlp."
        for n in ("gate_proj", "up_proj", "down_proj"):
            del w[p + n + ".weight"]
        w[p + "gate.weight"] = 2.0 * mat(E, h)
        w[p + "experts.gate_up_proj"] = mat(E, 2 * I, h)
        w[p + "experts.down_proj"] = mat(E, h, I)
        w[p + "shared_expert.gate_proj.weight"] = mat(S, h)
        w[p + "shared_expert.up_proj.weight"] = mat(S, h)
        w[p + "shared_expert.down_proj.weight"] = mat(h, S)
        w[p + "shared_expert_gate.weight"] = mat(1, h)
    return w


def stacked_experts(w, I):
    """The fused HF experts as the GGUF converter stacks them (switch_mlp.* names, the oracle's too)."""
    ws = {}
    for k, v in w.items():
        if k.endswith("experts.gate_up_proj"):
            base = k[:-len("experts.gate_up_proj")]
            ws[base + "switch_mlp.gate_proj.weight"] = np.ascontiguousarray(v[:, :I, :])
            ws[base + "switch_mlp.up_proj.weight"] = np.ascontiguousarray(v[:, I:, :])
        elif k.endswith("experts.down_proj"):
            ws[k[:-len("experts.down_proj")] + "switch_mlp.down_proj.weight"] = v
        else:
            ws[k] = v
    return ws


def qwen3_5_moe_case(root, rng):
    import qwen3_5_reference as q35
    c = dict(q35.TEXT, model_type="qwen3_5_moe", num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
             shared_expert_intermediate_size=64, norm_topk_prob=True, decoder_sparse_step=1)
    I = c["moe_intermediate_size"]
    w = qwen3_5_moe_weights(c, rng)
    d = os.path.join(root, "qwen3_5_moe_f32")
    write_hf(d, c, w, "f32")
    case(root, "qwen3_5_moe_f32", dict(c, mlp_only_layers=[]), rng,
         {"f32": lambda t, m, r: mlx_logits(d, t, m, r, moe_block="qwen3_next")})
    # GGUF qwen35moe (qwen3_5_reference.write_gguf: tiled value heads, gains + 1, ssm_a, Q8_0),
    # experts stacked as the converter stacks them; oracle: mlx-lm on the dequantized values.
    d4 = os.path.join(root, "qwen3_5_moe_q8_0")
    os.makedirs(d4, exist_ok=True)
    deq = q35.write_gguf(os.path.join(d4, "model.gguf"), c, stacked_experts(w, I), arch="qwen35moe")
    hf = os.path.join(d4, "hf")
    write_hf(hf, c, deq, "f32")
    case(root, "qwen3_5_moe_q8_0", dict(c, mlp_only_layers=[]), rng,
         {"deq": lambda t, m, r: mlx_logits(hf, t, m, r, moe_block="qwen3_next"),
          "int8acts": lambda t, m, r: mlx_int8acts_logits(hf, t, m, f32_router=True, moe_block="qwen3_next")})

    d2 = os.path.join(root, "qwen3_5_moe_mlx4")
    write_affine(d2, d, c, "bf16", 4, 32, {})
    case(root, "qwen3_5_moe_mlx4", dict(c, mlp_only_layers=[]), rng,
         {"f32": lambda t, m, r: mlx_logits(d2, t, m, r, moe_block="qwen3_next"),
          "int8acts": lambda t, m, r: mlx_int8acts_logits(d2, t, m, moe_block="qwen3_next")})

    # For llama-perplexity only (no mlx-lm logits): linear_value_head_dim = linear_key_head_dim,
    # since llama.cpp's qwen35 loader sizes attn_qkv's value part as value heads x key head dim and
    # refuses the parity fixture above (d_v 8 != d_k 16); with the vocabulary and a text.
    c16 = dict(c, linear_value_head_dim=16)
    rng16 = np.random.default_rng(3605)
    d5 = os.path.join(root, "qwen3_5_moe_ppl_q8_0")
    os.makedirs(d5, exist_ok=True)
    q35.write_gguf(os.path.join(d5, "model.gguf"), c16, stacked_experts(qwen3_5_moe_weights(c16, rng16), I),
                   arch="qwen35moe", extra=lambda wr: write_spm_vocab(wr, c16, ids=False))
    with open(os.path.join(d5, "ppl_text.txt"), "w", encoding="utf-8") as f:
        f.write(text_of([int(t) for t in rng16.integers(3, c16["vocab_size"], PPL_TOKENS)]))
    print("qwen3_moe_reference: qwen3_5_moe_ppl_q8_0", flush=True)


def main():
    a, root = fixture_args(mlx_cpu=True)

    rng = np.random.default_rng(3600)
    c = BASE
    w = random_weights(c, rng)
    d = os.path.join(root, "qwen3_moe_f32")
    write_hf(d, c, w, "f32")
    routes, tokens = case(root, "qwen3_moe_f32", c, rng, {"f32": lambda t, m, r: mlx_logits(d, t, m, r)})
    write_poisoned(os.path.join(root, "qwen3_moe_poisoned"), d, c, w, routes, SEQ - 1)

    d2 = os.path.join(root, "qwen3_moe_mlx4")
    write_affine(d2, d, c, "bf16", 4, 32, {})
    case(root, "qwen3_moe_mlx4", c, rng,
         {"f32": lambda t, m, r: mlx_logits(d2, t, m, r), "int8acts": lambda t, m, r: mlx_int8acts_logits(d2, t, m)})

    c2 = STEP2
    w2 = random_weights(c2, np.random.default_rng(3601))
    d3 = os.path.join(root, "qwen3_moe_step2_f32")
    write_hf(d3, c2, w2, "f32")
    case(root, "qwen3_moe_step2_f32", c2, rng, {"f32": lambda t, m, r: mlx_logits(d3, t, m, r)})

    c3 = ALL_ROUTED
    rng3 = np.random.default_rng(3602)
    w3 = random_weights(c3, rng3)
    # logits ~N(0, 3²) instead of ~N(0, 10²): a perplexity in the hundreds, not ~1e9, for llama-perplexity
    w3["lm_head.weight"] *= np.float32(0.3)
    d4 = os.path.join(root, "qwen3_moe_q8_0")
    os.makedirs(d4, exist_ok=True)
    deq = write_gguf(os.path.join(d4, "model.gguf"), c3, w3)
    hf = os.path.join(d4, "hf")
    write_hf(hf, c3, deq, "f32")
    ppl = [int(t) for t in rng3.integers(3, c3["vocab_size"], PPL_TOKENS)]
    with open(os.path.join(d4, "ppl_text.txt"), "w", encoding="utf-8") as f:
        f.write(text_of(ppl))
    case(root, "qwen3_moe_q8_0", c3, rng3,
         {"deq": lambda t, m, r: mlx_logits(hf, t, m, r),
          "int8acts": lambda t, m, r: mlx_int8acts_logits(hf, t, m, f32_router=True)})

    qwen3_5_moe_case(root, np.random.default_rng(3603))
    return 0


if __name__ == "__main__":
    sys.exit(main())
