#!/usr/bin/env python3
"""Oracle for the architecture tests: tiny random-weight checkpoints run through mlx-lm.

For each case this writes <out>/models/<case>/ with
  config.json, model.safetensors      a Hugging Face checkpoint (or model.gguf for GGUF cases)
  ref.json                            {"tokens": [64 ids], "vocab": V, "logits": {name: file}}
  logits_<name>.f32                   float32 [64, V] logits of every position from mlx-lm
The logits come from mlx-lm's own model classes (mlx_lm.utils.load_model), teacher-forced on a
fixed random 64-token sequence, in one call without a cache.

Logit sets
  f32      checkpoint stored in f32, mlx computes in f32                (tight parity)
  f32math  bf16 checkpoint, mlx weights upcast to f32 before running   (same math as larder: tight)
  bf16     bf16 checkpoint, mlx computes in bf16 as mlx-lm would        (loose: bf16 rounding)
  deq      GGUF cases: mlx-lm on an f32 checkpoint holding exactly gguf.quants.dequantize of the
           GGUF's quantized tensors (Q/K rows un-permuted back to HF order for llama)

MLX affine cases (AFFINE_CASES): the f32 random checkpoint is loaded by mlx-lm, cast to the
case's dtype (bf16/f16: the dtype scales and biases are stored in), quantized by
mlx_lm.utils.quantize_model (uniform, or per-module parameters through quant_predicate incl. a
module left unquantized, recorded as `false` in the config as larder's writer does) and saved as
an MLX model directory (model.safetensors with U32 codes + scales/biases, config.json with
`quantization` and `quantization_config`). The logits come from mlx-lm re-loading that directory
and running with every floating parameter upcast to f32 ("f32math": the same dequantized values
larder computes with).
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

from gguf_ref import gguf_namer

SEQ = 64

# name, model_type, config overrides, extra options
CASES = [
    # GQA 8:2, explicit head_dim != hidden/heads, llama3 rope scaling with a short original
    # context so all three frequency bands occur, tied embeddings.
    ("llama_gqa", dict(model_type="llama", hidden_size=64, num_hidden_layers=3, intermediate_size=96,
                       num_attention_heads=8, num_key_value_heads=2, head_dim=16, vocab_size=320,
                       rope_theta=10000.0, tie_word_embeddings=True,
                       rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                         high_freq_factor=4.0, original_max_position_embeddings=32))),
    # MHA, untied lm_head, large rope_theta, ragged sizes (hidden 48, ffn 80).
    ("llama_untied", dict(model_type="llama", hidden_size=48, num_hidden_layers=2, intermediate_size=80,
                          num_attention_heads=4, num_key_value_heads=4, vocab_size=500,
                          rope_theta=500000.0, tie_word_embeddings=False)),
    ("mistral", dict(model_type="mistral", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                     num_attention_heads=4, num_key_value_heads=1, head_dim=16, vocab_size=400,
                     rope_theta=1000000.0, tie_word_embeddings=False, sliding_window=None)),
    ("qwen2", dict(model_type="qwen2", hidden_size=64, num_hidden_layers=2, intermediate_size=96,
                   num_attention_heads=4, num_key_value_heads=2, vocab_size=350, rope_theta=1000000.0,
                   tie_word_embeddings=True)),
    # head_dim 32 with hidden 64 / 4 heads: q_dim 128 != hidden; transformers-5 style
    # rope_parameters instead of rope_theta.
    ("qwen3", dict(model_type="qwen3", hidden_size=64, num_hidden_layers=3, intermediate_size=96,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=600,
                   rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
                   tie_word_embeddings=False)),
]
# name, base case (from CASES) or its own config, dtype, bits, group_size, per-module overrides
# (module path -> {bits, group_size} or False).
AFFINE_CASES = [
    # Uniform q4 g64, tied embeddings: quantized embedding lookup and the embedding as lm_head.
    ("llama_q4g64", dict(model_type="llama", hidden_size=128, num_hidden_layers=2, intermediate_size=256,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=320,
                         rope_theta=10000.0, tie_word_embeddings=True), "bf16", 4, 64, {}),
    # Mixed: every width, every group size, f16 scales, an untied quantized lm_head, a module left
    # unquantized (`false`), entries without `mode` (affine by default).
    ("llama_mixed", dict(model_type="llama", hidden_size=128, num_hidden_layers=2, intermediate_size=192,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=300,
                         rope_theta=500000.0, tie_word_embeddings=False), "f16", 4, 64,
     {"model.embed_tokens": {"bits": 8, "group_size": 128},
      "model.layers.0.self_attn.v_proj": {"bits": 3, "group_size": 32},
      "model.layers.0.mlp.down_proj": {"bits": 8, "group_size": 64},
      "model.layers.1.self_attn.o_proj": {"bits": 6, "group_size": 128},
      "model.layers.1.mlp.gate_proj": {"bits": 2, "group_size": 64},
      "model.layers.1.mlp.up_proj": False,
      "lm_head": {"bits": 5, "group_size": 32}}),
    # q8 g32 on qwen3 (q/k norms, untied head, q_dim != hidden).
    ("qwen3_q8g32", "qwen3", "bf16", 8, 32, {}),
]

GGUF_CASES = [("llama_gqa", "Q8_0"), ("llama_gqa", "Q4_0"), ("qwen3", "Q8_0"), ("qwen3", "Q4_0"),
              ("llama_gqa", "Q4_1"), ("llama_gqa", "Q5_1"), ("qwen3", "Q5_0")]
# K-quant GGUFs (256-element super-blocks: every matrix width a multiple of 256), mixed like a
# Q4_K_M file: Q4_K by default, Q6_K for attn_v, ffn_down and the (tied) token embedding, which is
# also the lm_head. Quantized by tests/ref/kquant_reference.py's numpy quantizer (gguf-py cannot
# make K-quants); the oracle values are gguf-py's dequantization of the written blocks.
KQUANT_CASES = [
    ("llama_q4_k_m", dict(model_type="llama", hidden_size=256, num_hidden_layers=2, intermediate_size=512,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size=320,
                          rope_theta=10000.0, tie_word_embeddings=True), "Q4_K",
     lambda n: "Q6_K" if (".attn_v." in n or ".ffn_down." in n or n == "token_embd.weight") else None),
]
KQUANTS = ("Q4_K", "Q5_K", "Q6_K")


def full_config(over):
    c = dict(rms_norm_eps=1e-5, max_position_embeddings=2048, bos_token_id=1, eos_token_id=2,
             hidden_act="silu")
    c.update(over)
    return c


def tensor_shapes(c):
    h, ffn, V = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    nh, nkv = c["num_attention_heads"], c["num_key_value_heads"]
    hd = c.get("head_dim") or h // nh
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
        if c["model_type"] == "qwen2":
            s[p + "self_attn.q_proj.bias"] = (nh * hd,)
            s[p + "self_attn.k_proj.bias"] = (nkv * hd,)
            s[p + "self_attn.v_proj.bias"] = (nkv * hd,)
        if c["model_type"] == "qwen3":
            s[p + "self_attn.q_norm.weight"] = (hd,)
            s[p + "self_attn.k_norm.weight"] = (hd,)
        s[p + "mlp.gate_proj.weight"] = (ffn, h)
        s[p + "mlp.up_proj.weight"] = (ffn, h)
        s[p + "mlp.down_proj.weight"] = (h, ffn)
    return s


def random_weights(c, rng):
    """Weights scaled so activations stay O(1) and logits spread (std ~2): near-ties of the
    top-1 logit would make the top-1 check meaningless."""
    w = {}
    for name, shape in tensor_shapes(c).items():
        if name.endswith("norm.weight"):
            w[name] = (1.0 + 0.2 * rng.standard_normal(shape)).astype(np.float32)
        elif name.endswith(".bias"):
            w[name] = (0.5 * rng.standard_normal(shape)).astype(np.float32)
        elif name == "model.embed_tokens.weight" or name == "lm_head.weight":
            w[name] = rng.standard_normal(shape).astype(np.float32)
        else:
            w[name] = (rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32)
    return w


def to_bf16_bits(a):
    """f32 -> bf16 bit patterns, round to nearest even (finite inputs)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def bf16_bits_to_f32(b):
    return (b.astype(np.uint32) << 16).view(np.float32)


def write_safetensors(path, tensors):
    """Minimal safetensors writer: {name: (dtype_str, np.ndarray of the stored bytes' dtype)}."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        dt, arr = tensors[name]
        b = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def write_hf(d, config, weights, dtype):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    if dtype == "f32":
        t = {k: ("F32", v) for k, v in weights.items()}
    else:
        t = {k: ("BF16", to_bf16_bits(v)) for k, v in weights.items()}
    write_safetensors(os.path.join(d, "model.safetensors"), t)


def mlx_logits(d, tokens, upcast=False):
    import mlx.core as mx
    from pathlib import Path
    from mlx_lm.utils import load_model
    model, _ = load_model(Path(d))
    if upcast:
        model.set_dtype(mx.float32)
    out = model(mx.array(tokens, dtype=mx.int32)[None])
    return np.array(out[0].astype(mx.float32))


# llama.cpp convert_hf_to_gguf LlamaModel.permute: HF rotate_half rows -> interleaved rows.
def permute(w, n_head):
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute(w, n_head):
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


gguf_name = gguf_namer([("self_attn.q_proj.", "attn_q."), ("self_attn.k_proj.", "attn_k."),
                        ("self_attn.v_proj.", "attn_v."), ("self_attn.o_proj.", "attn_output."),
                        ("self_attn.q_norm.", "attn_q_norm."), ("self_attn.k_norm.", "attn_k_norm."),
                        ("input_layernorm.", "attn_norm."), ("post_attention_layernorm.", "ffn_norm."),
                        ("mlp.gate_proj.", "ffn_gate."), ("mlp.up_proj.", "ffn_up."), ("mlp.down_proj.", "ffn_down.")])


def llama3_rope_factors(c):
    """llama.cpp's rope_freqs.weight for rope_type llama3: per-pair divisors of inv_freq."""
    rs = c["rope_scaling"]
    hd = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    base = c["rope_theta"]
    freqs = 1.0 / (base ** (np.arange(0, hd, 2, dtype=np.float32) / hd))
    old, lo, hi, fac = rs["original_max_position_embeddings"], rs["low_freq_factor"], rs["high_freq_factor"], rs["factor"]
    low_wl, high_wl = old / lo, old / hi
    out = []
    for f in freqs:
        wl = 2 * np.pi / f
        if wl < high_wl:
            out.append(1.0)
        elif wl > low_wl:
            out.append(fac)
        else:
            s = (old / wl - lo) / (hi - lo)
            out.append(1.0 / ((1 - s) / fac + s))
    return np.array(out, dtype=np.float32)


def write_gguf(path, c, weights, qname, arch=None, qtype_for=None, skip_block_count=False, ffn=None):
    """GGUF as llama.cpp's converter lays it out. The optional arguments break it on purpose
    (bad-input tests): another architecture name, a per-tensor quantization override, a missing
    block_count, a feed_forward_length that disagrees with the tensors."""
    import gguf
    qt = getattr(gguf.GGMLQuantizationType, qname)
    model_arch = c["model_type"]
    arch = arch or model_arch
    nh, nkv = c["num_attention_heads"], c["num_key_value_heads"]
    hd = c.get("head_dim") or c["hidden_size"] // nh
    wr = gguf.GGUFWriter(path, arch)
    if not skip_block_count:
        wr.add_block_count(c["num_hidden_layers"])
    wr.add_embedding_length(c["hidden_size"])
    wr.add_feed_forward_length(ffn or c["intermediate_size"])
    wr.add_head_count(nh)
    wr.add_head_count_kv(nkv)
    wr.add_key_length(hd)
    wr.add_value_length(hd)
    wr.add_rope_dimension_count(hd)
    theta = c.get("rope_theta") or c["rope_parameters"]["rope_theta"]
    wr.add_rope_freq_base(theta)
    wr.add_layer_norm_rms_eps(c["rms_norm_eps"])
    wr.add_context_length(c["max_position_embeddings"])
    wr.add_bos_token_id(1)
    wr.add_eos_token_id(2)
    deq = {}
    for name, w in weights.items():
        if model_arch == "llama" and name.endswith("q_proj.weight"):
            w = permute(w, nh)
        elif model_arch == "llama" and name.endswith("k_proj.weight"):
            w = permute(w, nkv)
        if w.ndim == 2:
            t = qtype_for(gguf_name(name)) if qtype_for else None
            t = getattr(gguf.GGMLQuantizationType, t) if t else qt
            if t == gguf.GGMLQuantizationType.Q8_1:
                # A type larder does not read (and gguf-py cannot quantize): only the size of its
                # bytes matters — gguf-py's 40 per block of 32 — since loading must refuse it by name.
                q = np.zeros((w.shape[0], w.shape[1] // 32 * 40), dtype=np.uint8)
                wr.add_tensor(gguf_name(name), q, raw_dtype=t)
                d = w
            else:
                if t.name in KQUANTS:
                    from kquant_reference import quantize_kquant
                    q = quantize_kquant(w, t.name)
                else:
                    q = gguf.quants.quantize(w, t)
                wr.add_tensor(gguf_name(name), q, raw_dtype=t)
                d = gguf.quants.dequantize(q, t).reshape(w.shape).astype(np.float32)
        else:
            wr.add_tensor(gguf_name(name), w)
            d = w
        if model_arch == "llama" and name.endswith("q_proj.weight"):
            d = unpermute(d, nh)
        elif model_arch == "llama" and name.endswith("k_proj.weight"):
            d = unpermute(d, nkv)
        deq[name] = d
    if c.get("rope_scaling", {}).get("rope_type") == "llama3":
        wr.add_tensor("rope_freqs.weight", llama3_rope_factors(c))
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return deq


def write_affine(d, src_dir, config, dtype, bits, group_size, overrides):
    """mlx-lm quantizes the checkpoint in src_dir and we save it the way mlx_lm.convert does."""
    import mlx.core as mx
    from pathlib import Path
    from mlx.utils import tree_flatten
    from mlx_lm.utils import load_model, quantize_model
    model, _ = load_model(Path(src_dir))
    model.set_dtype({"bf16": mx.bfloat16, "f16": mx.float16}[dtype])
    pred = (lambda path, m: overrides.get(path, True)) if overrides else None
    model, qconfig = quantize_model(model, dict(config), group_size, bits, quant_predicate=pred)
    for path, v in overrides.items():
        if v is False:  # mlx-lm records nothing for a skipped module; larder's writer records `false`
            qconfig["quantization"][path] = False
    qconfig["quantization_config"] = qconfig["quantization"]
    os.makedirs(d, exist_ok=True)
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(os.path.join(d, "model.safetensors"), weights, metadata={"format": "mlx"})
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(qconfig, f, indent=4, sort_keys=True)
    return {k: str(v.dtype) for k, v in weights.items()}


def save_case(d, tokens, vocab, logit_sets, extra=None):
    meta = {"tokens": tokens, "vocab": vocab, "seq": len(tokens), "logits": {}}
    for k, v in logit_sets.items():
        fn = f"logits_{k}.f32"
        np.ascontiguousarray(v, dtype=np.float32).tofile(os.path.join(d, fn))
        meta["logits"][k] = fn
        top = np.sort(v, axis=1)
        meta.setdefault("min_top1_margin", {})[k] = float(np.min(top[:, -1] - top[:, -2]))
        meta.setdefault("max_abs_logit", {})[k] = float(np.max(np.abs(v)))
    if extra:
        meta.update(extra)
    with open(os.path.join(d, "ref.json"), "w") as f:
        json.dump(meta, f)


def fixture_args(mlx_cpu=False):
    """The command line of every fixture script (--out DIR, --shared DIR: larder_python_fixture in
    tests/CMakeLists.txt) and its models/ folder under --out, made. mlx_cpu: mlx computes on the CPU."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shared", required=False)
    a = ap.parse_args()
    if mlx_cpu:
        import mlx.core as mx
        mx.set_default_device(mx.cpu)
    root = os.path.join(a.out, "models")
    os.makedirs(root, exist_ok=True)
    return a, root


def main():
    a, root = fixture_args()
    configs, weights = {}, {}
    for i, (name, over) in enumerate(CASES):
        c = full_config(over)
        rng = np.random.default_rng(1000 + i)
        w = random_weights(c, rng)
        tokens = [int(t) for t in rng.integers(0, c["vocab_size"], SEQ)]
        configs[name], weights[name] = c, w

        d = os.path.join(root, name + "_f32")
        write_hf(d, c, w, "f32")
        save_case(d, tokens, c["vocab_size"], {"f32": mlx_logits(d, tokens)})

        wb = {k: bf16_bits_to_f32(to_bf16_bits(v)) for k, v in w.items()}
        d = os.path.join(root, name + "_bf16")
        write_hf(d, c, wb, "bf16")
        save_case(d, tokens, c["vocab_size"],
                  {"f32math": mlx_logits(d, tokens, upcast=True), "bf16": mlx_logits(d, tokens)})
        print(f"model_reference: {name}", flush=True)

    for name, base, dtype, bits, gs, overrides in AFFINE_CASES:
        c = configs[base] if isinstance(base, str) else full_config(base)
        if isinstance(base, str):
            w = weights[base]
        else:
            w = random_weights(c, np.random.default_rng(2000 + len(name)))
        src = os.path.join(root, name + "_src")
        write_hf(src, c, w, "f32")
        d = os.path.join(root, name)
        dtypes = write_affine(d, src, c, dtype, bits, gs, overrides)
        assert dtypes["model.layers.0.self_attn.q_proj.weight"] == "mlx.core.uint32", dtypes
        rng = np.random.default_rng(11)
        tokens = [int(t) for t in rng.integers(0, c["vocab_size"], SEQ)]
        save_case(d, tokens, c["vocab_size"], {"f32math": mlx_logits(d, tokens, upcast=True)})
        print(f"model_reference: {name} (MLX affine)", flush=True)

    for name, q in GGUF_CASES:
        c = configs[name]
        d = os.path.join(root, f"{name}_{q.lower()}")
        os.makedirs(d, exist_ok=True)
        deq = write_gguf(os.path.join(d, "model.gguf"), c, weights[name], q)
        # mlx-lm runs an f32 HF checkpoint of exactly the dequantized values (kept under hf/).
        hf = os.path.join(d, "hf")
        write_hf(hf, c, deq, "f32")
        rng = np.random.default_rng(7)
        tokens = [int(t) for t in rng.integers(0, c["vocab_size"], SEQ)]
        save_case(d, tokens, c["vocab_size"], {"deq": mlx_logits(hf, tokens)})
        print(f"model_reference: {name} {q}", flush=True)

    for name, over, q, qtype_for in KQUANT_CASES:
        c = full_config(over)
        w = random_weights(c, np.random.default_rng(3000 + len(name)))
        d = os.path.join(root, name)
        os.makedirs(d, exist_ok=True)
        deq = write_gguf(os.path.join(d, "model.gguf"), c, w, q, qtype_for=qtype_for)
        hf = os.path.join(d, "hf")
        write_hf(hf, c, deq, "f32")
        rng = np.random.default_rng(7)
        tokens = [int(t) for t in rng.integers(0, c["vocab_size"], SEQ)]
        save_case(d, tokens, c["vocab_size"], {"deq": mlx_logits(hf, tokens)})
        print(f"model_reference: {name} (GGUF K-quants)", flush=True)

    # Broken GGUFs for the bad-input tests (tests/unit/models/bad_input_test.cpp).
    bad = os.path.join(root, "bad_gguf")
    os.makedirs(bad, exist_ok=True)
    c, w = configs["llama_gqa"], weights["llama_gqa"]
    # Q8_1 (ggml type 9): a block format larder does not read as a weight.
    write_gguf(os.path.join(bad, "q8_1_tensor.gguf"), c, w, "Q8_0",
               qtype_for=lambda n: "Q8_1" if n == "blk.1.ffn_up.weight" else None)
    write_gguf(os.path.join(bad, "no_block_count.gguf"), c, w, "Q8_0", skip_block_count=True)
    write_gguf(os.path.join(bad, "wrong_ffn.gguf"), c, w, "Q8_0", ffn=128)
    write_gguf(os.path.join(bad, "unknown_arch.gguf"), c, w, "Q8_0", arch="rwkv9")
    print("model_reference: bad GGUFs", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
