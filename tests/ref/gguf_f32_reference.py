#!/usr/bin/env python3
"""The exact-arithmetic reference of a Gemma 3 GGUF: every tensor dequantized by gguf-py into f32,
run by mlx-lm's gemma3_text on the CPU in f32 (no activation quantization, f32 KV, f32 softmax).

llama.cpp and larder both quantize activations to int8 for their integer dot products (llama.cpp:
Q8_0 / Q8_K per 32 / 256 elements; larder: per 32 in its VNNI GEMM), so neither is the model's
exact value; this is. Used by scripts/make_llamacpp_goldens.py (ppl-f32) to commit the golden
the perplexity test compares larder against, and by hand (`dump`) to write the dequantized model
as an f32 HF `gemma3_text` checkpoint that larder itself can load.

What the conversion must undo (llama.cpp's convert_hf_to_gguf.py, Gemma3Model):
  * every RMSNorm gain is stored as HF w + 1 (llama.cpp runs a plain RMSNorm); mlx-lm / HF
    compute (1 + w): w = gguf − 1 (exact in f32 for gains in [0.5, 2], Sterbenz);
  * q/k are not permuted (NeoX rope, pairs (i, i + d/2) as in HF);
  * the output is tied to token_embd (no output.weight in the file);
  * embeddings are scaled by f32 sqrtf(hidden) in llama.cpp, by √hidden rounded to bf16 in
    mlx-lm / transformers on bf16 checkpoints (25.25 vs 25.2982 for hidden 640). This reference
    follows llama.cpp's definition of the GGUF model (--embed-scale bf16 for the other);
  * no GGUF key for query_pre_attn_scalar (llama.cpp: head_dim) or rope_local_base_freq (10000),
    the layer pattern is llama.cpp's default 6.

Perplexity follows llama-perplexity exactly: the text tokenized with BOS, cut into chunks of
n_ctx, each chunk's first token overwritten by BOS, each chunk run from an empty cache, and the
NLL of the second half's next tokens (positions n_ctx/2 .. n_ctx−2 predicting the one after).
"""
import argparse
import json
import math
import os
import sys

import numpy as np

GGUF_TO_HF = [("attn_norm.", "input_layernorm."), ("post_attention_norm.", "post_attention_layernorm."),
              ("ffn_norm.", "pre_feedforward_layernorm."), ("post_ffw_norm.", "post_feedforward_layernorm."),
              ("attn_q.", "self_attn.q_proj."), ("attn_k.", "self_attn.k_proj."), ("attn_v.", "self_attn.v_proj."),
              ("attn_output.", "self_attn.o_proj."), ("attn_q_norm.", "self_attn.q_norm."),
              ("attn_k_norm.", "self_attn.k_norm."), ("ffn_gate.", "mlp.gate_proj."), ("ffn_up.", "mlp.up_proj."),
              ("ffn_down.", "mlp.down_proj.")]


def hf_name(name):
    if name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if name == "output_norm.weight":
        return "model.norm.weight"
    if name == "output.weight":
        return "lm_head.weight"
    parts = name.split(".")
    assert parts[0] == "blk", name
    rest = ".".join(parts[2:])
    for g, h in GGUF_TO_HF:
        if rest.startswith(g):
            return f"model.layers.{parts[1]}.{h}{rest[len(g):]}"
    raise KeyError(name)


def field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    v = f.contents()
    return v


def load_gguf_f32(path):
    """(HF config dict, {hf name: f32 array}) of a gemma3 GGUF, dequantized by gguf-py."""
    import gguf
    r = gguf.GGUFReader(path)
    arch = field(r, "general.architecture")
    if arch != "gemma3":
        raise SystemExit(f"{path}: architecture {arch!r}, this reference is for gemma3")
    a = arch
    n_layers = int(field(r, f"{a}.block_count"))
    hidden = int(field(r, f"{a}.embedding_length"))
    heads = int(field(r, f"{a}.attention.head_count"))
    head_dim = int(field(r, f"{a}.attention.key_length", hidden // heads))
    weights = {}
    for t in r.tensors:
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        shape = tuple(int(x) for x in reversed(t.shape))  # ggml ne[] is innermost-first
        w = w.reshape(shape)
        name = hf_name(t.name)
        if t.name.endswith("norm.weight"):
            w = w - np.float32(1.0)
        weights[name] = np.ascontiguousarray(w)
    vocab = weights["model.embed_tokens.weight"].shape[0]
    window = int(field(r, f"{a}.attention.sliding_window", 512))
    pattern = 6
    cfg = dict(model_type="gemma3_text", architectures=["Gemma3ForCausalLM"], hidden_size=hidden,
               intermediate_size=int(field(r, f"{a}.feed_forward_length")), num_hidden_layers=n_layers,
               num_attention_heads=heads, num_key_value_heads=int(field(r, f"{a}.attention.head_count_kv")),
               head_dim=head_dim, vocab_size=vocab,
               rms_norm_eps=float(field(r, f"{a}.attention.layer_norm_rms_epsilon")),
               rope_theta=float(field(r, f"{a}.rope.freq_base", 1e6)), rope_local_base_freq=10000.0,
               query_pre_attn_scalar=(hidden // heads if n_layers == 62 else head_dim), sliding_window=window,
               sliding_window_pattern=pattern,
               layer_types=["full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
                            for i in range(n_layers)],
               max_position_embeddings=int(field(r, f"{a}.context_length", 32768)), rope_scaling=None,
               hidden_activation="gelu_pytorch_tanh", tie_word_embeddings="lm_head.weight" not in weights,
               final_logit_softcapping=None, attn_logit_softcapping=None,
               bos_token_id=int(field(r, "tokenizer.ggml.bos_token_id", 2)),
               eos_token_id=int(field(r, "tokenizer.ggml.eos_token_id", 1)), torch_dtype="float32")
    return cfg, weights


def numpy_matmuls():
    """Routes mlx-lm's Linear layers and the tied LM head through numpy's matmul. The mlx-cpu
    wheel links the netlib reference BLAS (~1 GFLOP/s: 45 minutes for 4 chunks of 1024 on the
    2-core host); numpy's OpenBLAS does the same f32 products ~20x faster. Everything else (norms,
    RoPE, masks, attention, GELU) stays mlx-lm's. Measured: PPL equal to 1e-6 relative either way
    (ctx 256 x 2: 56.658484 numpy, 56.658517 mlx)."""
    import mlx.core as mx
    import mlx.nn as nn
    cache = {}

    def wt(w):
        k = id(w)
        if k not in cache:
            cache[k] = (w, np.ascontiguousarray(np.array(w).T))  # keeps w alive: ids stay unique
        return cache[k][1]

    def matmul(self, x):
        xs = np.array(x)
        y = xs.reshape(-1, xs.shape[-1]) @ wt(self.weight)
        return mx.array(y.reshape(*xs.shape[:-1], y.shape[-1]))
    nn.Linear.__call__ = matmul
    nn.Embedding.as_linear = matmul


def mlx_model(cfg, weights):
    import mlx.core as mx
    from mlx_lm.models import gemma3_text
    model = gemma3_text.Model(gemma3_text.ModelArgs.from_dict(cfg))
    w = model.sanitize({k: mx.array(v) for k, v in weights.items()})
    model.load_weights(list(w.items()))
    mx.eval(model.parameters())
    return model


def chunk_nll(model, chunk, embed_scale, rows_per_head=256):
    """NLLs of llama-perplexity's scored half of one chunk (chunk[0] is already BOS)."""
    import mlx.core as mx
    n = len(chunk)
    first = n // 2
    toks = mx.array(chunk, dtype=mx.int32)[None]
    emb = model.model.embed_tokens(toks)
    # mlx-lm multiplies whatever it is given by bf16(√hidden); hand it the embedding pre-divided so
    # the product is embed_scale (exact up to one rounding).
    bf16_scale = float(mx.array(cfg_hidden(model) ** 0.5, mx.bfloat16).astype(mx.float32).item())
    emb = emb * mx.array(np.float32(embed_scale) / np.float32(bf16_scale))
    h = model.model(toks, input_embeddings=emb)  # final-normed hidden states [1, n, hidden]
    h = h[0, first:n - 1]
    mx.eval(h)
    out = []
    for s in range(0, h.shape[0], rows_per_head):
        part = h[s:s + rows_per_head]
        logits = model.model.embed_tokens.as_linear(part) if model.tie_word_embeddings else model.lm_head(part)
        lse = mx.logsumexp(logits.astype(mx.float32), axis=-1)
        tgt = mx.array(chunk[first + 1 + s:first + 1 + s + part.shape[0]], dtype=mx.int32)
        picked = mx.take_along_axis(logits, tgt[:, None], axis=-1)[:, 0]
        nll = lse - picked
        mx.eval(nll)
        out.extend(float(x) for x in np.array(nll))
    return out


def cfg_hidden(model):
    return model.args.hidden_size


def perplexity(model, tokens, ctx, chunks, bos, embed_scale):
    """llama-perplexity's chunking over `tokens` (the text tokenized with BOS)."""
    n_chunks = min(len(tokens) // ctx, chunks)
    nll, per_chunk = [], []
    for c in range(n_chunks):
        chunk = list(tokens[c * ctx:(c + 1) * ctx])
        chunk[0] = bos
        x = chunk_nll(model, chunk, embed_scale)
        nll.extend(x)
        per_chunk.append(math.exp(sum(nll) / len(nll)))
        print(f"  chunk {c + 1}/{n_chunks}: running PPL {per_chunk[-1]:.4f}", flush=True)
    mean = sum(nll) / len(nll)
    # llama-perplexity's ± : the standard error of the mean NLL, propagated to PPL.
    var = sum((x - mean) ** 2 for x in nll) / (len(nll) - 1)
    ppl = math.exp(mean)
    return {"ppl": ppl, "ppl_err": ppl * math.sqrt(var / len(nll)), "mean_nll": mean, "n_scored": len(nll),
            "per_chunk_running_ppl": per_chunk}


def write_hf(out, cfg, weights):
    """An f32 HF gemma3_text checkpoint of the dequantized GGUF (config.json, model.safetensors)."""
    from safetensors.numpy import save_file
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    save_file(weights, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    p = sub.add_parser("ppl", help="perplexity over token ids (a JSON list, the text tokenized with BOS)")
    p.add_argument("gguf")
    p.add_argument("--tokens", required=True)
    p.add_argument("--ctx", type=int, required=True)
    p.add_argument("--chunks", type=int, required=True)
    p.add_argument("--embed-scale", choices=["f32", "bf16"], default="f32")
    p.add_argument("--mlx-matmul", action="store_true", help="mlx's own (slow) matmuls instead of numpy's")
    d = sub.add_parser("dump", help="write the dequantized model as an f32 HF checkpoint")
    d.add_argument("gguf")
    d.add_argument("out")
    a = ap.parse_args()
    cfg, weights = load_gguf_f32(a.gguf)
    if a.what == "dump":
        write_hf(a.out, cfg, weights)
        return 0
    import mlx.core as mx
    mx.set_default_device(mx.cpu)
    with open(a.tokens) as f:
        tokens = json.load(f)
    hidden = cfg["hidden_size"]
    scale = math.sqrt(hidden) if a.embed_scale == "f32" else float(
        mx.array(hidden ** 0.5, mx.bfloat16).astype(mx.float32).item())
    if not a.mlx_matmul:
        numpy_matmuls()
    model = mlx_model(cfg, weights)
    del weights
    r = perplexity(model, tokens, a.ctx, a.chunks, cfg["bos_token_id"], np.float32(scale))
    print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
