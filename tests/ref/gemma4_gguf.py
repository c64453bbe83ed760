#!/usr/bin/env python3
"""GGUF `gemma4` test model: the tiny random gemma4_gguf_f32 checkpoint (gemma4_reference.py)
written as llama.cpp's converter writes it, and a check that a GGUF still holds those weights.

  write --fixture DIR --out FILE   regenerate tests/unit/models/data/gemma4_gguf_f32.gguf
                                   (developer only; the file is committed)
  llamacpp --fixture DIR --gguf FILE --out KL
                                   regenerate gemma4_gguf_f32.llamacpp.kl with llama.cpp's
                                   llama-perplexity (LLAMACPP_BIN, default the bench build)
  check --fixture DIR --gguf FILE  CI: every tensor of FILE equals the fixture's safetensors
                                   tensor (bit for bit) and the metadata matches config.json, so a
                                   changed fixture generator is reported as such, not as a model bug

Why not convert_hf_to_gguf.py itself: it imports torch, and the only torch on PyPI for this
machine is the CUDA build, which does not import without NVIDIA's libraries. So this script
follows the converter of the llama-cpp-python 0.3.36 sdist (conversion/gemma.py Gemma4Model over
Gemma3Model and TextModel) step by step, and llama.cpp itself checks the result: llama.cpp's
own logits on this file (llama-perplexity --kl-divergence-base, tests/unit/models/data/
gemma4_gguf_f32.llamacpp.kl) agree with mlx-lm's (top-1 at every position; log-probs within
0.14, the rest being ggml's f16 GELU table: see tests/unit/models/gemma4_gguf_test.cpp).
llama.cpp's KV cache takes the two layers before the KV-shared ones as their sliding and global
sources, hence this fixture's layer order [s F s F s F].
  - tensor names: gguf-py's TensorNameMap for MODEL_ARCH.GEMMA4 (what the converter calls);
    `layer_scalar` gets ".weight" first (Gemma4Model.filter_tensors) -> blk.N.layer_output_scale
  - norm gains as stored (Gemma4Model.norm_shift is 0: Gemma 4's RMSNorm is plain w, unlike
    Gemma 3's 1 + w); --outtype f32 keeps every tensor f32
  - rope_freqs.weight [global_head_dim/2]: 1 for the int(d·partial/2) rotated pairs, 1e30 for the
    rest (proportional RoPE as freq factors; "factor" is dropped: the base class only knows
    linear/yarn/longrope scaling)
  - metadata: key_length = global_head_dim, key_length_swa = head_dim, rope.dimension_count =
    global_head_dim, rope.dimension_count_swa = head_dim, rope.freq_base (full) /
    freq_base_swa (sliding), sliding_window, sliding_window_pattern (bool per layer),
    shared_kv_layers, embedding_length_per_layer_input, feed_forward_length per layer when
    use_double_wide_mlp, head_count_kv per layer when num_global_key_value_heads is set,
    final_logit_softcapping.
  - vocabulary: the fixture has no tokenizer (vocab 300). The converter's set_vocab reads a BPE
    tokenizer.json; this writes the same keys for a synthetic vocabulary: <pad> <eos> <bos> <unk>,
    then one CJK character per id, one merge (needed by llama.cpp's gemma4 BPE loader), so a text
    of those characters tokenizes to exactly the fixture's token ids.
"""
import argparse
import json
import os
import sys

import numpy as np

ARCH = "gemma4"
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>"]
# The merged token: two characters that never stand next to each other in the fixture's text.
FIRST_CHAR = 0x4E00


def load_fixture(d):
    from safetensors.numpy import load_file
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    return cfg, load_file(os.path.join(d, "model.safetensors"))


def vocab(cfg):
    V = cfg["vocab_size"]
    toks = SPECIALS + [chr(FIRST_CHAR + i) for i in range(V - len(SPECIALS) - 1)]
    merge = (toks[-2], toks[-1])  # the last two characters merge into the last id
    toks.append(merge[0] + merge[1])
    return toks, merge


def expected(cfg, weights):
    """{gguf name: array} and {key: value} as the converter would write them."""
    import gguf
    L = cfg["num_hidden_layers"]
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA4, L)
    tensors = {}
    for name, w in weights.items():
        if name.endswith("router.scale"):  # Gemma4Model.modify_tensors
            tensors[name.replace("model.layers.", "blk.").replace("router.scale", "ffn_gate_inp.scale")] = w
            continue
        if name.endswith("router.per_expert_scale"):
            tensors[name.replace("model.layers.", "blk.").replace("router.per_expert_scale", "ffn_down_exps.scale")] = w
            continue
        if name.endswith("layer_scalar") or (".experts." in name and not name.endswith(".weight")):
            name += ".weight"  # Gemma4Model.filter_tensors
        new = tmap.get_name(name, try_suffixes=(".weight", ".bias"))
        if new is None:
            raise SystemExit(f"no GGUF name for {name}")
        tensors[new] = np.ascontiguousarray(w.astype(np.float32))
    full = cfg["rope_parameters"]["full_attention"]
    assert full["rope_type"] == "proportional"
    gd = cfg["global_head_dim"]
    n_rot = int(gd * full["partial_rotary_factor"] / 2)
    tensors["rope_freqs.weight"] = np.array([1.0] * n_rot + [1e30] * (gd // 2 - n_rot), dtype=np.float32)

    swa = [t == "sliding_attention" for t in cfg["layer_types"]]
    n_shared = cfg["num_kv_shared_layers"]
    kv = {
        "block_count": L, "context_length": cfg["max_position_embeddings"], "embedding_length": cfg["hidden_size"],
        "attention.head_count": cfg["num_attention_heads"], "attention.layer_norm_rms_epsilon": cfg["rms_norm_eps"],
        "attention.key_length": gd, "attention.value_length": gd,
        "attention.key_length_swa": cfg["head_dim"], "attention.value_length_swa": cfg["head_dim"],
        "rope.freq_base": full["rope_theta"],
        "rope.freq_base_swa": cfg["rope_parameters"]["sliding_attention"]["rope_theta"],
        "rope.dimension_count": gd, "rope.dimension_count_swa": cfg["head_dim"],
        "attention.sliding_window": cfg["sliding_window"], "attention.sliding_window_pattern": swa,
        "attention.shared_kv_layers": n_shared,
        "embedding_length_per_layer_input": cfg.get("hidden_size_per_layer_input") or 0,
        "final_logit_softcapping": cfg["final_logit_softcapping"],
    }
    ffn = cfg["intermediate_size"]
    kv["feed_forward_length"] = ([ffn if l < L - n_shared else 2 * ffn for l in range(L)]
                                 if cfg.get("use_double_wide_mlp") else ffn)
    if cfg.get("enable_moe_block"):  # TextModel.set_gguf_parameters, Gemma4Model's expert length
        kv["expert_count"] = cfg["num_experts"]
        kv["expert_used_count"] = cfg["top_k_experts"]
        kv["expert_feed_forward_length"] = cfg["moe_intermediate_size"]
    g = cfg.get("num_global_key_value_heads")
    kv["attention.head_count_kv"] = ([cfg["num_key_value_heads"] if s else g for s in swa] if g is not None
                                     else cfg["num_key_value_heads"])
    return tensors, kv


def write(args):
    cfg, weights = load_fixture(args.fixture)
    write_gguf(cfg, weights, args.out)


def write_gguf(cfg, weights, out):
    import gguf
    tensors, kv = expected(cfg, weights)
    w = gguf.GGUFWriter(out, ARCH)
    for k, v in kv.items():
        key = f"{ARCH}.{k}"
        if isinstance(v, list):
            w.add_array(key, v)
        elif isinstance(v, bool):
            w.add_bool(key, v)
        elif isinstance(v, int):
            w.add_uint32(key, v)
        else:
            w.add_float32(key, float(v))
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    toks, merge = vocab(cfg)
    w.add_tokenizer_model("gemma4")
    w.add_token_list(toks)
    w.add_token_scores([0.0] * len(toks))
    types = [gguf.TokenType.CONTROL] * 3 + [gguf.TokenType.UNKNOWN] + [gguf.TokenType.NORMAL] * (len(toks) - 4)
    w.add_token_types(types)
    w.add_token_merges([f"{merge[0]} {merge[1]}"])
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])
    w.add_unk_token_id(3)
    w.add_pad_token_id(0)
    w.add_add_space_prefix(False)
    w.add_add_bos_token(True)
    for name, a in tensors.items():
        w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {out}: {len(tensors)} tensors, {os.path.getsize(out)} bytes")


def text_of(tokens, cfg):
    """The text that the synthetic vocabulary tokenizes to `tokens` (first token: BOS, added by
    llama.cpp)."""
    toks, merge = vocab(cfg)
    assert tokens[0] == cfg["bos_token_id"]
    s = ""
    for t in tokens[1:]:
        assert t >= len(SPECIALS) and t < len(toks) - 1, f"token {t} has no plain character"
        s += toks[t]
    assert merge[0] + merge[1] not in s
    return s


def check(args):
    import gguf
    cfg, weights = load_fixture(args.fixture)
    want_t, want_kv = expected(cfg, weights)
    r = gguf.GGUFReader(args.gguf)
    errors = []
    got = {t.name: t for t in r.tensors}
    if set(got) != set(want_t):
        errors.append(f"tensor names differ: only in GGUF {sorted(set(got) - set(want_t))}, "
                      f"only in fixture {sorted(set(want_t) - set(got))}")
    for name, a in want_t.items():
        if name not in got:
            continue
        t = got[name]
        g = np.asarray(t.data).reshape(a.shape) if t.data.size == a.size else None
        if t.tensor_type != gguf.GGMLQuantizationType.F32 or g is None or not np.array_equal(g, a):
            errors.append(f"{name}: GGUF tensor differs from the fixture's weights")
    for k, v in want_kv.items():
        f = r.get_field(f"{ARCH}.{k}")
        if f is None:
            errors.append(f"metadata {ARCH}.{k} missing")
            continue
        vals = [f.parts[i].tolist()[0] for i in f.data]
        gv = vals if isinstance(v, list) else vals[0]
        if isinstance(v, list):
            ok = [type(x)(y) for x, y in zip(v, gv)] == v and len(gv) == len(v)
        else:
            ok = np.isclose(gv, v, rtol=1e-6) if isinstance(v, float) else gv == v
        if not ok:
            errors.append(f"metadata {ARCH}.{k}: GGUF {gv} vs fixture config {v}")
    if errors:
        print(f"{args.gguf} no longer matches the fixture {args.fixture} (was the fixture generator "
              "changed? regenerate with tests/ref/gemma4_gguf.py write):", file=sys.stderr)
        for e in errors:
            print("  " + e, file=sys.stderr)
        return 1
    print(f"{args.gguf}: {len(want_t)} tensors and {len(want_kv)} metadata keys equal the fixture")
    return 0


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    for c in ("write", "check", "text", "llamacpp"):
        p = sub.add_parser(c)
        p.add_argument("--fixture", required=True)
        p.add_argument("--out")
        p.add_argument("--gguf")
    a = ap.parse_args()
    if a.cmd == "write":
        write(a)
        return 0
    if a.cmd == "llamacpp":
        import subprocess
        import tempfile
        with open(os.path.join(a.fixture, "ref.json")) as f:
            ref = json.load(f)
        cfg, _ = load_fixture(a.fixture)
        binary = os.path.join(os.environ.get("LLAMACPP_BIN", os.path.expanduser(
            "~/.cache/larder-bench/llama.cpp-0.3.36/build/bin")), "llama-perplexity")
        with tempfile.NamedTemporaryFile("w", suffix=".txt", encoding="utf-8") as t:
            t.write(text_of(ref["tokens"], cfg))
            t.flush()
            # 64 tokens = 2 x 32 (llama-perplexity's minimum); one chunk of 32; f32 KV, no flash
            # attention (it rounds Q.K to f16).
            subprocess.run([binary, "-m", a.gguf, "-f", t.name, "-c", "32", "-b", "32", "--chunks", "1", "-t", "1",
                            "-fa", "off", "-ctk", "f32", "-ctv", "f32", "--kl-divergence-base", a.out], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        print(f"wrote {a.out}")
        return 0
    if a.cmd == "text":
        with open(os.path.join(a.fixture, "ref.json")) as f:
            ref = json.load(f)
        cfg, _ = load_fixture(a.fixture)
        sys.stdout.write(text_of(ref["tokens"], cfg))
        return 0
    return check(a)


if __name__ == "__main__":
    sys.exit(main())
