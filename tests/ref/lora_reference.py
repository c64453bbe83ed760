#!/usr/bin/env python3
"""Oracle for LoRA adapters (issue 45): one tiny random base, random adapters in three formats,
and mlx-lm's logits with each adapter applied.

Writes <out>/lora/:
  base/                       the `qwen3` case of model_reference.py (f32 HF checkpoint)
  <adapter>/mlx/              adapters.safetensors + adapter_config.json, as mlx-lm's tuner
                              writes them (the LoRALinear parameters of the model it adapted)
  <adapter>/peft/             adapter_model.safetensors + adapter_config.json with PEFT's key names
                              (lora_A [r, in], lora_B [out, r], base_model.model. prefix)
  <adapter>/lora.gguf         llama.cpp's GGUF LoRA written with gguf-py (general.type adapter,
                              adapter.lora.alpha, blk.N.<name>.weight.lora_a / .lora_b)
  <adapter>/expect.json       per projection [layer, module, rank, in, out, scale] in (layer,
                              module) order; expect_ab.f32 holds every A then B as f32 in that order
  <adapter>/logits.f32        float32 [64, V]: mlx-lm's logits with the adapter (teacher-forced)
  logits_base.f32, ref.json   the base's logits; tokens, vocab, adapters and their logit files
  bad/<case>/                 adapters that must be refused (wrong shape, unknown module, DoRA, ...),
                              and bad/other_base/: valid, trained on another base (a warning)

The mlx adapters are made by mlx-lm itself (linear_to_lora_layers → LoRALinear, random lora_a
and lora_b instead of the zero-initialised B) and the logits come from a fresh base re-loaded by
mlx_lm.tuner.utils.load_adapters from the written directory, so the files are what mlx-lm reads.
The PEFT and GGUF files hold the same values (rounded once to the adapter's dtype). The `pattern`
adapter (PEFT rank_pattern / alpha_pattern: per-module ranks and alphas) has no mlx-lm form; its
logits come from LoRALinear modules built per projection with that rank and scale.

Self-check: every PEFT adapter merged into the base weights in numpy (W + scale · B A, PEFT's own
merge formula) and run by mlx-lm without adapters gives the adapter logits within f32 noise, so
the PEFT key names and scale rules written here agree with mlx-lm's LoRA math.

llama.cpp check (developer, `--llamacpp [BIN_DIR]` after the fixture is written; default the bench
build): a qwen3 GGUF of the same base with a synthetic vocabulary (one CJK character per id, as
tests/ref/gemma4_gguf.py) run by llama-perplexity --lora <adapter>/lora.gguf (f32 KV, no flash
attention, --kl-divergence-base) agrees with mlx-lm's logits: measured max |Δ log p| 1.3e-4 (the
16-bit log-prob storage) for the base and the f32 adapter; 2.0e-3 (f16) and 3.6e-2 (bf16) for the
half-precision adapters, which is ggml rounding activations to the weight's type — the same values
written as F32 give 1.3e-4 again — while a wrong alpha gives 26. Top-1 equal everywhere.

The C++ tests check loading, conversion, validation and namespaces (lora_test.cpp) and the logits
through the forward's projection hook (lora_forward_test.cpp).
"""
import argparse
import json
import math
import os
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_reference as mr  # noqa: E402

SEQ = 64
ATTN = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"]
MLP = ["mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
GGUF_NAME = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down"}
# The synthetic vocabulary of the llama.cpp check (as tests/ref/gemma4_gguf.py): specials in the
# ids full_config gives them, then one CJK character per id, the last id a merge of the two before.
SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]
FIRST_CHAR = 0x4E00
# larder's LoraModule order (models/lora.h), for the expected (layer, module) order.
MODULE_ORDER = ATTN + MLP

# name, mlx keys, rank, mlx scale, num_layers (-1: all), dtype, PEFT options
ADAPTERS = [
    # Every attention projection, all layers, f32 (kept in the mapping by larder for PEFT/GGUF).
    ("attn_r8", ATTN, 8, 2.0, -1, "f32", dict(target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])),
    # MLP of the last two layers, f16, target_modules as a regular expression.
    ("mlp_r4", MLP, 4, 0.5, 2, "f16", dict(target_modules=r".*\.mlp\.(gate|up|down)_proj",
                                             layers_to_transform=[1, 2])),
    # A mixed set at rank 16 in bf16; the PEFT form uses rsLoRA (scale = alpha / sqrt(r)).
    ("mixed_r16", ["self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj"], 16, 1.25, -1, "bf16",
     dict(target_modules=["q_proj", "v_proj", "down_proj"], use_rslora=True)),
]
# PEFT only: per-module ranks and alphas. module -> (rank, alpha) resolved as PEFT does below.
PATTERN = dict(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "o_proj", "down_proj"],
               rank_pattern={"self_attn.v_proj": 4, "model.layers.2.mlp.down_proj": 2},
               alpha_pattern={"o_proj": 4})


def round_to(a, dtype):
    a = np.asarray(a, dtype=np.float32)
    if dtype == "f16":
        return a.astype(np.float16).astype(np.float32)
    if dtype == "bf16":
        return mr.bf16_bits_to_f32(mr.to_bf16_bits(a))
    return a


def stored(a, dtype):
    """(safetensors dtype, array of the stored bytes)"""
    if dtype == "f16":
        return "F16", a.astype(np.float16)
    if dtype == "bf16":
        return "BF16", mr.to_bf16_bits(a)
    return "F32", a.astype(np.float32)


def peft_pattern(patterns, key):
    import re
    for k, v in patterns.items():
        if k == key or re.match(rf"(.*\.)?({k})$", key):
            return v
    return None


def logits_of(model, tokens):
    import mlx.core as mx
    out = model(mx.array(tokens, dtype=mx.int32)[None])
    return np.array(out[0].astype(mx.float32))


def load_base(base_dir):
    from pathlib import Path
    from mlx_lm.utils import load_model
    model, _ = load_model(Path(base_dir))
    return model


def random_lora(rng, n_in, n_out, r, dtype):
    # A like mlx-lm's init; B random too (mlx-lm starts it at zero, which would make every
    # adapter a no-op), sized so the delta is comparable to the base's contribution.
    a = rng.uniform(-1 / math.sqrt(n_in), 1 / math.sqrt(n_in), size=(n_in, r))
    b = rng.standard_normal((r, n_out)) / math.sqrt(r) * 0.5
    return round_to(a, dtype), round_to(b, dtype)


def write_expect(d, entries):
    """entries: {(layer, module): (A [r, in], B [out, r], scale)}"""
    keys = sorted(entries, key=lambda k: (k[0], MODULE_ORDER.index(k[1])))
    meta, blobs = [], []
    for k in keys:
        a, b, s = entries[k]
        meta.append([k[0], k[1], int(a.shape[0]), int(a.shape[1]), int(b.shape[0]), float(np.float32(s))])
        blobs += [np.ascontiguousarray(a, dtype=np.float32), np.ascontiguousarray(b, dtype=np.float32)]
    with open(os.path.join(d, "expect.json"), "w") as f:
        json.dump({"projections": meta}, f)
    with open(os.path.join(d, "expect_ab.f32"), "wb") as f:
        for x in blobs:
            f.write(x.tobytes())


def write_peft(d, entries, dtype, cfg):
    """entries: {(layer, module): (A [r, in], B [out, r], scale)}; cfg: adapter_config.json fields."""
    os.makedirs(d, exist_ok=True)
    t = {}
    for (l, m), (a, b, _) in entries.items():
        p = f"base_model.model.model.layers.{l}.{m}"
        t[p + ".lora_A.weight"] = stored(a, dtype)
        t[p + ".lora_B.weight"] = stored(b, dtype)
    mr.write_safetensors(os.path.join(d, "adapter_model.safetensors"), t)
    full = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": "larder-tests/lora-base",
            "r": 8, "lora_alpha": 8, "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False,
            "use_rslora": False, "use_dora": False, "modules_to_save": None, "rank_pattern": {},
            "alpha_pattern": {}, "init_lora_weights": True, "inference_mode": True}
    full.update(cfg)
    with open(os.path.join(d, "adapter_config.json"), "w") as f:
        json.dump(full, f, indent=2)


def write_gguf(path, entries, dtype, alpha, arch="qwen3", extra_kv=None):
    import gguf
    w = gguf.GGUFWriter(path, arch)
    w.add_type("adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", float(alpha))
    for k, v in (extra_kv or {}).items():
        w.add_string(k, v)
    for (l, m), (a, b, _) in sorted(entries.items(), key=lambda kv: (kv[0][0], MODULE_ORDER.index(kv[0][1]))):
        for suffix, x in (("lora_a", a), ("lora_b", b)):
            name = f"blk.{l}.{GGUF_NAME[m]}.weight.{suffix}"
            if dtype == "f32":
                w.add_tensor(name, np.ascontiguousarray(x, dtype=np.float32))
            elif dtype == "f16":
                w.add_tensor(name, np.ascontiguousarray(x, dtype=np.float16))
            else:
                q = gguf.quants.quantize(np.ascontiguousarray(x, dtype=np.float32), gguf.GGMLQuantizationType.BF16)
                w.add_tensor(name, q, raw_dtype=gguf.GGMLQuantizationType.BF16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def merged_logits(base_dir, weights, entries, tokens, tmp):
    """PEFT's merge (W + scale · B @ A) in numpy, run by mlx-lm without adapters."""
    w = dict(weights)
    for (l, m), (a, b, s) in entries.items():
        k = f"model.layers.{l}.{m}.weight"
        w[k] = (w[k].astype(np.float64) + s * (b.astype(np.float64) @ a.astype(np.float64))).astype(np.float32)
    with open(os.path.join(base_dir, "config.json")) as f:
        cfg = json.load(f)
    mr.write_hf(tmp, cfg, w, "f32")
    return logits_of(load_base(tmp), tokens)


def make_mlx_adapter(base_dir, d, keys, rank, scale, num_layers, dtype, rng, n_layers):
    """mlx-lm's tuner adapts the model; random values go into its LoRALinear parameters and the
    trainable parameters are saved as mlx_lm's trainer saves them. Returns the PEFT-oriented
    entries {(layer, module): (A [r, in], B [out, r], scale)}."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.tuner.utils import linear_to_lora_layers
    model = load_base(base_dir)
    model.freeze()
    lp = {"rank": rank, "scale": scale, "dropout": 0.0, "keys": keys}
    linear_to_lora_layers(model, num_layers, lp)
    first = 0 if num_layers < 0 else n_layers - num_layers
    entries, save = {}, {}
    for l in range(first, n_layers):
        layer = model.model.layers[l]
        for m in keys:
            mod = layer
            for part in m.split("."):
                mod = getattr(mod, part)
            n_out, n_in = mod.linear.weight.shape
            a, b = random_lora(rng, n_in, n_out, rank, dtype)
            mod.lora_a = mx.array(a)
            mod.lora_b = mx.array(b)
            entries[(l, m)] = (a.T.copy(), b.T.copy(), scale)
    mxdt = {"f32": mx.float32, "f16": mx.float16, "bf16": mx.bfloat16}[dtype]
    for k, v in tree_flatten(model.trainable_parameters()):
        save[k] = v.astype(mxdt)
    assert len(save) == 2 * len(entries), (len(save), len(entries))
    os.makedirs(d, exist_ok=True)
    mx.save_safetensors(os.path.join(d, "adapters.safetensors"), save, metadata={"format": "mlx"})
    cfg = {"fine_tune_type": "lora", "num_layers": num_layers, "model": "larder-tests/lora-base",
           "lora_parameters": lp, "data": "none", "iters": 0, "batch_size": 1, "learning_rate": 1e-5,
           "seed": 0, "max_seq_length": 64, "grad_checkpoint": False}
    with open(os.path.join(d, "adapter_config.json"), "w") as f:
        json.dump(cfg, f, indent=4)
    return entries


def mlx_adapter_logits(base_dir, adapter_dir, tokens):
    """A fresh base re-loaded with mlx-lm's own adapter loader, computing in f32."""
    import mlx.core as mx
    from mlx_lm.tuner.utils import load_adapters
    model = load_base(base_dir)
    load_adapters(model, adapter_dir)
    model.set_dtype(mx.float32)
    return logits_of(model, tokens)


def pattern_entries_and_logits(base_dir, weights, c, rng, tokens):
    """PEFT rank_pattern/alpha_pattern resolved like PEFT; LoRALinear per projection."""
    import mlx.core as mx
    from mlx_lm.tuner.lora import LoRALinear
    model = load_base(base_dir)
    entries = {}
    for l in range(c["num_hidden_layers"]):
        layer = model.model.layers[l]
        for m in ATTN + MLP:
            if m.split(".")[-1] not in PATTERN["target_modules"]:
                continue
            key = f"model.layers.{l}.{m}"
            r = peft_pattern(PATTERN["rank_pattern"], key) or PATTERN["r"]
            alpha = peft_pattern(PATTERN["alpha_pattern"], key) or PATTERN["lora_alpha"]
            scale = alpha / r
            parent = layer
            parts = m.split(".")
            for part in parts[:-1]:
                parent = getattr(parent, part)
            lin = getattr(parent, parts[-1])
            lora = LoRALinear.from_base(lin, r=r, scale=scale, dropout=0.0)
            n_out, n_in = lin.weight.shape
            a, b = random_lora(rng, n_in, n_out, r, "f32")
            lora.lora_a = mx.array(a)
            lora.lora_b = mx.array(b)
            setattr(parent, parts[-1], lora)
            entries[(l, m)] = (a.T.copy(), b.T.copy(), scale)
    return entries, logits_of(model, tokens)


def write_bad(root, good_peft, good_mlx, good_entries, c):
    """Adapters every loader/validator must refuse, each with the reason in its name."""
    bad = os.path.join(root, "bad")
    shutil.rmtree(bad, ignore_errors=True)
    rng = np.random.default_rng(7)
    h = c["hidden_size"]
    q_out = c["num_attention_heads"] * c["head_dim"]
    # lora_A for a 48-wide model on this 64-wide base: validation names the projection.
    a = rng.standard_normal((8, 48)).astype(np.float32)
    b = rng.standard_normal((q_out, 8)).astype(np.float32)
    write_peft(os.path.join(bad, "wrong_in"), {(1, "self_attn.q_proj"): (a, b, 2.0)}, "f32",
               dict(r=8, lora_alpha=16, target_modules=["q_proj"]))
    # lora_B giving too many outputs.
    a = rng.standard_normal((8, h)).astype(np.float32)
    b = rng.standard_normal((q_out + 8, 8)).astype(np.float32)
    write_peft(os.path.join(bad, "wrong_out"), {(0, "self_attn.q_proj"): (a, b, 2.0)}, "f32",
               dict(r=8, lora_alpha=16, target_modules=["q_proj"]))
    # A layer the base does not have.
    a = rng.standard_normal((8, h)).astype(np.float32)
    b = rng.standard_normal((q_out, 8)).astype(np.float32)
    write_peft(os.path.join(bad, "no_layer"), {(7, "self_attn.q_proj"): (a, b, 2.0)}, "f32",
               dict(r=8, lora_alpha=16, target_modules=["q_proj"]))
    # Unknown module name inside a layer, and LoRA on lm_head.
    d = os.path.join(bad, "unknown_module")
    os.makedirs(d, exist_ok=True)
    mr.write_safetensors(os.path.join(d, "adapter_model.safetensors"), {
        "base_model.model.model.layers.0.self_attn.qkv_proj.lora_A.weight": ("F32", a),
        "base_model.model.model.layers.0.self_attn.qkv_proj.lora_B.weight": ("F32", b)})
    shutil.copy(os.path.join(good_peft, "adapter_config.json"), d)
    d = os.path.join(bad, "vision_tower")
    os.makedirs(d, exist_ok=True)
    mr.write_safetensors(os.path.join(d, "adapter_model.safetensors"), {
        "base_model.model.model.vision_tower.encoder.layers.0.self_attn.q_proj.lora_A.weight": ("F32", a),
        "base_model.model.model.vision_tower.encoder.layers.0.self_attn.q_proj.lora_B.weight": ("F32", b)})
    with open(os.path.join(d, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj"]}, f)
    d = os.path.join(bad, "lm_head")
    os.makedirs(d, exist_ok=True)
    mr.write_safetensors(os.path.join(d, "adapter_model.safetensors"), {
        "base_model.model.lm_head.lora_A.weight": ("F32", a),
        "base_model.model.lm_head.lora_B.weight": ("F32", rng.standard_normal((c["vocab_size"], 8)).astype(np.float32))})
    with open(os.path.join(d, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["lm_head"]}, f)
    # DoRA, both formats.
    d = os.path.join(bad, "peft_dora")
    shutil.copytree(good_peft, d)
    with open(os.path.join(d, "adapter_config.json")) as f:
        cfg = json.load(f)
    cfg["use_dora"] = True
    with open(os.path.join(d, "adapter_config.json"), "w") as f:
        json.dump(cfg, f)
    d = os.path.join(bad, "mlx_dora")
    shutil.copytree(good_mlx, d)
    with open(os.path.join(d, "adapter_config.json")) as f:
        cfg = json.load(f)
    cfg["fine_tune_type"] = "dora"
    with open(os.path.join(d, "adapter_config.json"), "w") as f:
        json.dump(cfg, f)
    # A tensor outside target_modules, and modules_to_save.
    d = os.path.join(bad, "not_targeted")
    shutil.copytree(good_peft, d)
    with open(os.path.join(d, "adapter_config.json")) as f:
        cfg = json.load(f)
    cfg["target_modules"] = ["q_proj", "k_proj"]
    with open(os.path.join(d, "adapter_config.json"), "w") as f:
        json.dump(cfg, f)
    d = os.path.join(bad, "modules_to_save")
    shutil.copytree(good_peft, d)
    with open(os.path.join(d, "adapter_config.json")) as f:
        cfg = json.load(f)
    cfg["modules_to_save"] = ["lm_head"]
    with open(os.path.join(d, "adapter_config.json"), "w") as f:
        json.dump(cfg, f)
    # r in the config disagrees with the tensors.
    d = os.path.join(bad, "rank_mismatch")
    shutil.copytree(good_peft, d)
    with open(os.path.join(d, "adapter_config.json")) as f:
        cfg = json.load(f)
    cfg["r"] = 4
    with open(os.path.join(d, "adapter_config.json"), "w") as f:
        json.dump(cfg, f)
    # Trained on another base (same shapes): loads and validates, with a warning.
    d = os.path.join(bad, "other_base")
    shutil.copytree(good_peft, d)
    with open(os.path.join(d, "adapter_config.json")) as f:
        cfg = json.load(f)
    cfg["base_model_name_or_path"] = "meta-llama/Llama-3.2-1B"
    with open(os.path.join(d, "adapter_config.json"), "w") as f:
        json.dump(cfg, f)
    # GGUF LoRA for another architecture.
    os.makedirs(bad, exist_ok=True)
    write_gguf(os.path.join(bad, "arch_llama.gguf"), good_entries, "f32", 16, arch="llama")
    # GGUF LoRAs named as llama.cpp names the MoE families (fit an HF base of the same family).
    write_gguf(os.path.join(bad, "arch_qwen3moe.gguf"), good_entries, "f32", 16, arch="qwen3moe")
    write_gguf(os.path.join(bad, "arch_gpt-oss.gguf"), good_entries, "f32", 16, arch="gpt-oss")
    # mlx num_layers 1 but tensors in all layers.
    d = os.path.join(bad, "mlx_num_layers")
    shutil.copytree(good_mlx, d)
    with open(os.path.join(d, "adapter_config.json")) as f:
        cfg = json.load(f)
    cfg["num_layers"] = 1
    with open(os.path.join(d, "adapter_config.json"), "w") as f:
        json.dump(cfg, f)


def vocab(V):
    toks = SPECIALS + [chr(FIRST_CHAR + i) for i in range(V - len(SPECIALS) - 1)]
    merge = (toks[-2], toks[-1])
    return toks + [merge[0] + merge[1]], merge


def write_base_gguf(path, c, weights):
    """The f32 base as llama.cpp's converter lays out a qwen3 GGUF, with the synthetic vocabulary
    (llama.cpp needs one to read text)."""
    import gguf
    w = gguf.GGUFWriter(path, "qwen3")
    w.add_block_count(c["num_hidden_layers"])
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(c["num_attention_heads"])
    w.add_head_count_kv(c["num_key_value_heads"])
    w.add_key_length(c["head_dim"])
    w.add_value_length(c["head_dim"])
    w.add_rope_freq_base(c["rope_parameters"]["rope_theta"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    toks, merge = vocab(c["vocab_size"])
    w.add_tokenizer_model("gemma4")
    w.add_token_list(toks)
    w.add_token_scores([0.0] * len(toks))
    w.add_token_types([gguf.TokenType.CONTROL] * 3 + [gguf.TokenType.UNKNOWN] +
                      [gguf.TokenType.NORMAL] * (len(toks) - 4))
    w.add_token_merges([f"{merge[0]} {merge[1]}"])
    w.add_bos_token_id(c["bos_token_id"])
    w.add_eos_token_id(c["eos_token_id"])
    w.add_unk_token_id(3)
    w.add_pad_token_id(0)
    w.add_add_space_prefix(False)
    w.add_add_bos_token(True)
    for name, a in weights.items():
        w.add_tensor(mr.gguf_name(name), np.ascontiguousarray(a, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def read_kl_base(path):
    """llama-perplexity --kl-divergence-base: per position of the chunk's second half but the last,
    the log-softmax quantized to 16 bits (scale, min, codes; 0 = below min)."""
    with open(path, "rb") as f:
        assert f.read(8) == b"_logits_"
        n_ctx, n_vocab, n_chunk = np.frombuffer(f.read(12), dtype=np.int32)
        tokens = np.frombuffer(f.read(4 * n_ctx), dtype=np.int32)
        nv = 2 * ((n_vocab + 1) // 2) + 4
        first = n_ctx // 2
        n = n_ctx - 1 - first
        raw = np.frombuffer(f.read(2 * nv * n), dtype=np.uint16).reshape(n, nv)
    out = []
    for row in raw:
        scale, min_lp = np.frombuffer(row[:4].tobytes(), dtype=np.float32)
        q = row[4:4 + n_vocab].astype(np.float64)
        out.append(np.where(q > 0, min_lp + scale * q, np.nan))
    return list(tokens), first, np.array(out)


def llamacpp_check(root, binary):
    """llama.cpp reads the GGUF LoRA files against a GGUF of the same base (llama-perplexity --lora,
    f32 KV, no flash attention) and its log-probabilities agree with mlx-lm's reference logits:
    the GGUF layout, orientation and alpha / r scale written here are llama.cpp's."""
    import subprocess
    import tempfile
    from safetensors.numpy import load_file
    with open(os.path.join(root, "ref.json")) as f:
        ref = json.load(f)
    with open(os.path.join(root, "base", "config.json")) as f:
        c = json.load(f)
    weights = load_file(os.path.join(root, "base", "model.safetensors"))
    toks, _ = vocab(c["vocab_size"])
    # 64 tokens = 2 × 32 (llama-perplexity's minimum); the first chunk of 32 is compared (logits
    # at a position depend only on the tokens up to it, so the reference rows are the same).
    tokens = ref["tokens"][:32]
    text = "".join(toks[t] for t in ref["tokens"][1:])
    V = ref["vocab"]
    worst_all = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        base = os.path.join(tmp, "base.gguf")
        write_base_gguf(base, c, weights)
        txt = os.path.join(tmp, "text.txt")
        with open(txt, "w", encoding="utf-8") as f:
            f.write(text)
        cases = [("base", None, ref["base_logits"])] + [
            (n, os.path.join(root, n, "lora.gguf"), a["logits"]) for n, a in ref["adapters"].items()
            if "gguf" in a["formats"]]
        for name, lora, logits_file in cases:
            kl = os.path.join(tmp, name + ".kl")
            cmd = [binary, "-m", base, "-f", txt, "-c", "32", "-b", "32", "--chunks", "1", "-t", "1", "-fa", "off",
                   "-ctk", "f32", "-ctv", "f32", "--kl-divergence-base", kl]
            if lora:
                cmd += ["--lora", lora]
            r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if r.returncode != 0:
                raise SystemExit(f"{name}: llama-perplexity failed:\n{r.stdout[-3000:]}")
            got_tokens, first, lp = read_kl_base(kl)
            assert got_tokens == tokens, (name, got_tokens[:8], tokens[:8])
            ref_logits = np.fromfile(os.path.join(root, logits_file), dtype=np.float32).reshape(-1, V)
            worst, top_ok = 0.0, True
            for j in range(lp.shape[0]):
                g = ref_logits[first + j].astype(np.float64)
                ls = g - g.max() - np.log(np.exp(g - g.max()).sum())
                ok = ~np.isnan(lp[j])
                worst = max(worst, float(np.max(np.abs(lp[j][ok] - ls[ok]))))
                top_ok &= int(np.nanargmax(lp[j])) == int(np.argmax(g))
            print(f"{name}: llama.cpp vs mlx-lm max |d log p| {worst:.2e} over {lp.shape[0]} positions (adapter "
                  f"{ref['adapters'].get(name, {}).get('dtype', '-')}), "
                  f"top-1 {'equal' if top_ok else 'DIFFERS'}")
            # ggml multiplies F16/BF16 weights with activations rounded to that type (vec_dot_type),
            # so half-precision adapters differ by that rounding; a wrong orientation or scale
            # moves log-probs by whole units (the adapters change logits by 6 to 27).
            dtype = ref["adapters"].get(name, {}).get("dtype", "f32")
            tol = {"f32": 5e-4, "f16": 1e-2, "bf16": 5e-2}[dtype]
            assert top_ok and worst < tol, (name, worst, tol)
            worst_all = max(worst_all, worst)
    print(f"ok: worst {worst_all:.2e}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shared", required=False)
    ap.add_argument("--llamacpp", metavar="BIN_DIR", nargs="?", const=os.path.expanduser(
        "~/.cache/larder-bench/llama.cpp-0.3.36/build/bin"),
                    help="check the written GGUF LoRA files with llama.cpp's llama-perplexity instead of "
                         "writing the fixture (developer check; the fixture must exist)")
    args = ap.parse_args()
    root = os.path.join(args.out, "lora")
    if args.llamacpp:
        llamacpp_check(root, os.path.join(args.llamacpp, "llama-perplexity"))
        return
    os.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(45)
    over = dict(dict((n, o) for n, o in mr.CASES)["qwen3"])
    c = mr.full_config(over)
    c["_name_or_path"] = "larder-tests/lora-base"  # what the adapters name as their base
    weights = mr.random_weights(c, rng)
    base = os.path.join(root, "base")
    mr.write_hf(base, c, weights, "f32")
    # BOS, then ids that are plain characters of llamacpp_check's synthetic vocabulary.
    tokens = [c["bos_token_id"]] + [int(t) for t in rng.integers(len(SPECIALS), c["vocab_size"] - 1, SEQ - 1)]
    base_logits = logits_of(load_base(base), tokens)
    base_logits.astype(np.float32).tofile(os.path.join(root, "logits_base.f32"))
    meta = {"tokens": tokens, "vocab": c["vocab_size"], "seq": SEQ, "base_logits": "logits_base.f32",
            "adapters": {}}
    tmp = os.path.join(root, "_merged")
    n_layers = c["num_hidden_layers"]
    good = None
    for name, keys, rank, scale, num_layers, dtype, peft in ADAPTERS:
        d = os.path.join(root, name)
        shutil.rmtree(d, ignore_errors=True)
        entries = make_mlx_adapter(base, os.path.join(d, "mlx"), keys, rank, scale, num_layers, dtype, rng, n_layers)
        logits = mlx_adapter_logits(base, os.path.join(d, "mlx"), tokens)
        alpha = scale * math.sqrt(rank) if peft.get("use_rslora") else scale * rank
        write_peft(os.path.join(d, "peft"), entries, dtype, dict(r=rank, lora_alpha=alpha, **peft))
        # llama.cpp: scale = alpha / r (no rsLoRA): the GGUF alpha carries the scale times r.
        write_gguf(os.path.join(d, "lora.gguf"), entries, dtype, scale * rank)
        write_expect(d, entries)
        logits.astype(np.float32).tofile(os.path.join(d, "logits.f32"))
        merged = merged_logits(base, weights, entries, tokens, tmp)
        err = float(np.max(np.abs(merged - logits)))
        effect = float(np.max(np.abs(logits - base_logits)))
        assert err < 1e-3 * float(np.max(np.abs(logits))), (name, err)
        assert effect > 0.1, (name, effect)  # the adapter changes the logits
        meta["adapters"][name] = {"logits": f"{name}/logits.f32", "formats": ["mlx", "peft", "gguf"],
                                  "dtype": dtype, "max_abs_logit": float(np.max(np.abs(logits))),
                                  "merge_check_max_err": err, "max_change_vs_base": effect}
        if good is None:
            good = (os.path.join(d, "peft"), os.path.join(d, "mlx"), entries)
    # The rank/alpha pattern adapter (PEFT only).
    d = os.path.join(root, "pattern")
    shutil.rmtree(d, ignore_errors=True)
    entries, logits = pattern_entries_and_logits(base, weights, c, rng, tokens)
    write_peft(os.path.join(d, "peft"), entries, "f32", dict(PATTERN))
    write_expect(d, entries)
    logits.astype(np.float32).tofile(os.path.join(d, "logits.f32"))
    merged = merged_logits(base, weights, entries, tokens, tmp)
    err = float(np.max(np.abs(merged - logits)))
    assert err < 1e-3 * float(np.max(np.abs(logits))), ("pattern", err)
    meta["adapters"]["pattern"] = {"logits": "pattern/logits.f32", "formats": ["peft"], "dtype": "f32",
                                   "max_abs_logit": float(np.max(np.abs(logits))), "merge_check_max_err": err}
    shutil.rmtree(tmp, ignore_errors=True)
    write_bad(root, *good, c)
    with open(os.path.join(root, "ref.json"), "w") as f:
        json.dump(meta, f, indent=1)


if __name__ == "__main__":
    main()
