#!/usr/bin/env python3
"""stories260K (llama.cpp's GGUF of Karpathy's llama2.c checkpoint) -> Hugging Face Llama directory.

    scripts/stories260k_to_hf.py OUT_DIR [--gguf PATH] [--dtype f32|bf16]

Writes OUT_DIR/{config.json, model.safetensors, tokenizer.json, tokenizer_config.json}, loadable
by `larder` (generate, quantize) and by mlx-lm / transformers. Every hyper-parameter comes from the
GGUF metadata; nothing about the model is hard-coded here.

Two things are not a plain copy:
  * q/k rows. llama2.c trained with interleaved-pair RoPE (Meta's layout), and llama.cpp's llama2.c
    converter keeps that layout because ggml's default llama RoPE is interleaved too. HF Llama
    rotates halves (x[i], x[i + d/2]), so each head's rows are reordered here: pair element 0s
    first, then element 1s. This is the inverse of gguf-py's HF->GGUF `permute`.
  * tokenizer.json. The GGUF holds a SentencePiece BPE vocabulary (pieces + scores + types) and no
    merges. HF's BPE model needs ranked merges, so they are derived from the vocabulary the way
    tokenizers' SentencePieceExtractor does it: every split of a piece into two vocabulary pieces,
    ranked by the merged piece's score.

Output goes to OUT_DIR.partial first and is renamed at the end, so a failed run never leaves a
directory that looks complete. An existing OUT_DIR is refused.
Needs numpy and gguf (both in the repository's .venv).
"""
import argparse
import json
import os
import shutil
import struct
import sys

import numpy as np

DEFAULT_GGUF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "models",
                            "stories260K", "stories260K.gguf")

# llama.cpp token types (gguf-py TokenType)
TT_NORMAL, TT_UNKNOWN, TT_CONTROL, TT_USER_DEFINED, TT_UNUSED, TT_BYTE = 1, 2, 3, 4, 5, 6


class ConvertError(Exception):
    pass


def fail(msg):
    raise ConvertError("[stories260k_to_hf] " + msg)


# ---------------------------------------------------------------------------------------------
# GGUF reading


def field_value(reader, key, required=True):
    f = reader.fields.get(key)
    if f is None:
        if required:
            fail(f"{reader.path}: missing metadata key '{key}'")
        return None
    return f.contents()


def read_gguf(path):
    import gguf  # imported here so --help works without it

    try:
        reader = gguf.GGUFReader(path)
    except (OSError, ValueError) as e:
        fail(f"{path}: cannot read GGUF ({e})")
    reader.path = path
    arch = field_value(reader, "general.architecture")
    if arch != "llama":
        fail(f"{path}: general.architecture is '{arch}', only 'llama' is supported")
    tok_model = field_value(reader, "tokenizer.ggml.model")
    if tok_model != "llama":
        fail(f"{path}: tokenizer.ggml.model is '{tok_model}', only the SentencePiece 'llama' vocabulary is supported")
    tensors = {}
    for t in reader.tensors:
        if t.tensor_type != gguf.GGMLQuantizationType.F32:
            fail(f"{path}: tensor '{t.name}' is {t.tensor_type.name}; only F32 GGUFs convert losslessly")
        # gguf-py already reports numpy shapes outermost-first ([out, in] for matrices).
        tensors[t.name] = np.array(t.data, dtype=np.float32)
    return reader, tensors


def hyper_parameters(reader, tensors):
    a = "llama."
    hp = {
        "hidden": int(field_value(reader, a + "embedding_length")),
        "layers": int(field_value(reader, a + "block_count")),
        "heads": int(field_value(reader, a + "attention.head_count")),
        "ffn": int(field_value(reader, a + "feed_forward_length")),
        "ctx": int(field_value(reader, a + "context_length")),
        "eps": float(field_value(reader, a + "attention.layer_norm_rms_epsilon")),
    }
    kv = field_value(reader, a + "attention.head_count_kv", required=False)
    hp["kv_heads"] = int(kv) if kv is not None else hp["heads"]
    hp["head_dim"] = hp["hidden"] // hp["heads"]
    rot = field_value(reader, a + "rope.dimension_count", required=False)
    if rot is not None and int(rot) != hp["head_dim"]:
        fail(f"{reader.path}: rope.dimension_count {int(rot)} != head_dim {hp['head_dim']} (partial RoPE is not supported)")
    theta = field_value(reader, a + "rope.freq_base", required=False)
    # llama.cpp's default when the key is absent (llama2.c checkpoints never set it).
    hp["rope_theta"] = float(theta) if theta is not None else 10000.0
    if field_value(reader, a + "rope.scaling.type", required=False) not in (None, "none"):
        fail(f"{reader.path}: RoPE scaling is not supported")
    # ggml stores eps as f32; print it as the decimal it was meant to be (1e-05, not 9.9999997e-06).
    hp["eps"] = float(np.format_float_positional(np.float32(hp["eps"]), unique=True))
    hp["vocab"] = len(reader.fields["tokenizer.ggml.tokens"].data)
    emb = tensors.get("token_embd.weight")
    if emb is None or emb.shape != (hp["vocab"], hp["hidden"]):
        fail(f"{reader.path}: token_embd.weight has shape {None if emb is None else emb.shape}, "
             f"expected ({hp['vocab']}, {hp['hidden']})")
    hp["tied"] = "output.weight" not in tensors
    hp["bos"] = field_value(reader, "tokenizer.ggml.bos_token_id", required=False)
    hp["eos"] = field_value(reader, "tokenizer.ggml.eos_token_id", required=False)
    hp["unk"] = field_value(reader, "tokenizer.ggml.unknown_token_id", required=False)
    add_bos = field_value(reader, "tokenizer.ggml.add_bos_token", required=False)
    add_eos = field_value(reader, "tokenizer.ggml.add_eos_token", required=False)
    hp["add_bos"] = True if add_bos is None else bool(add_bos)  # llama.cpp's SPM default
    hp["add_eos"] = False if add_eos is None else bool(add_eos)
    if field_value(reader, "tokenizer.ggml.add_space_prefix", required=False) is False:
        fail(f"{reader.path}: add_space_prefix = false is not supported (the HF normalizer always prepends U+2581)")
    return hp


# ---------------------------------------------------------------------------------------------
# weights


def interleaved_to_half_split(w, n_heads):
    """Rows of each head go from (x0, y0, x1, y1, ...) to (x0, x1, ..., y0, y1, ...)."""
    rows, cols = w.shape
    hd = rows // n_heads
    return w.reshape(n_heads, hd // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def hf_weights(tensors, hp):
    out = {}

    def take(name, shape):
        t = tensors.pop(name, None)
        if t is None:
            fail(f"missing tensor '{name}'")
        if t.shape != shape:
            fail(f"tensor '{name}' has shape {t.shape}, expected {shape}")
        return t

    H, I, hd = hp["hidden"], hp["ffn"], hp["head_dim"]
    q_rows, kv_rows = hp["heads"] * hd, hp["kv_heads"] * hd
    out["model.embed_tokens.weight"] = take("token_embd.weight", (hp["vocab"], H))
    out["model.norm.weight"] = take("output_norm.weight", (H,))
    if not hp["tied"]:
        out["lm_head.weight"] = take("output.weight", (hp["vocab"], H))
    for l in range(hp["layers"]):
        g, p = f"blk.{l}.", f"model.layers.{l}."
        out[p + "self_attn.q_proj.weight"] = interleaved_to_half_split(take(g + "attn_q.weight", (q_rows, H)), hp["heads"])
        out[p + "self_attn.k_proj.weight"] = interleaved_to_half_split(take(g + "attn_k.weight", (kv_rows, H)), hp["kv_heads"])
        out[p + "self_attn.v_proj.weight"] = take(g + "attn_v.weight", (kv_rows, H))
        out[p + "self_attn.o_proj.weight"] = take(g + "attn_output.weight", (H, q_rows))
        out[p + "input_layernorm.weight"] = take(g + "attn_norm.weight", (H,))
        out[p + "post_attention_layernorm.weight"] = take(g + "ffn_norm.weight", (H,))
        out[p + "mlp.gate_proj.weight"] = take(g + "ffn_gate.weight", (I, H))
        out[p + "mlp.up_proj.weight"] = take(g + "ffn_up.weight", (I, H))
        out[p + "mlp.down_proj.weight"] = take(g + "ffn_down.weight", (H, I))
    tensors.pop("rope_freqs.weight", None)  # only present with RoPE scaling, refused above
    if tensors:
        fail(f"unexpected tensors left over: {sorted(tensors)[:8]}")
    return out


def f32_to_bf16_bits(a):
    """Round to nearest even, as torch / mlx cast to bfloat16."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def write_safetensors(path, tensors, dtype):
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        arr = tensors[name]
        data = f32_to_bf16_bits(arr) if dtype == "bf16" else np.ascontiguousarray(arr, dtype="<f4")
        b = data.tobytes()
        header[name] = {"dtype": "BF16" if dtype == "bf16" else "F32", "shape": list(arr.shape),
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)  # keeps the data 8-byte aligned for mmap readers
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


# ---------------------------------------------------------------------------------------------
# tokenizer


def vocabulary(reader):
    f = reader.fields["tokenizer.ggml.tokens"]
    tokens = [bytes(f.parts[i]).decode("utf-8") for i in f.data]
    n = len(tokens)
    sf = reader.fields.get("tokenizer.ggml.scores")
    scores = [float(sf.parts[i][0]) for i in sf.data] if sf is not None else [0.0] * n
    tf = reader.fields.get("tokenizer.ggml.token_type")
    types = [int(tf.parts[i][0]) for i in tf.data] if tf is not None else [TT_NORMAL] * n
    if len(scores) != n or len(types) != n:
        fail(f"{reader.path}: {n} tokens but {len(scores)} scores and {len(types)} token types")
    if len(set(tokens)) != n:
        fail(f"{reader.path}: the vocabulary has duplicate pieces")
    return tokens, scores, types


def derive_merges(tokens, scores, types):
    """SentencePieceExtractor's rule: for every piece, every split into two vocabulary pieces
    becomes a merge; merges are ranked by the merged piece's score (higher first), splits of one
    piece by the ids of their halves.

    Only normal pieces take part, on either side of a merge: SentencePiece's BPE starts from
    characters and only ever builds normal pieces, so a merge that spells a control token ('<s>')
    or a byte piece ('<0x41>') from text would tokenize differently from SentencePiece (and from
    llama.cpp). With this vocabulary no such merge exists; the filter is for other ones."""
    ids = {t: i for i, t in enumerate(tokens) if types[i] == TT_NORMAL}
    merges = []
    for piece, pid in ids.items():
        local = []
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in ids and right in ids:
                local.append((ids[left], ids[right], left, right))
        local.sort()
        merges.extend((scores[pid], pid, l, r) for _, _, l, r in local)
    # Python's sort is stable: equal scores keep vocabulary order, as in the extractor.
    merges.sort(key=lambda m: -m[0])
    return [[l, r] for _, _, l, r in merges]


def tokenizer_files(reader, hp):
    tokens, scores, types = vocabulary(reader)
    n = len(tokens)

    def token(id_):
        if id_ is None or not 0 <= int(id_) < n:
            return None
        return tokens[int(id_)]

    unk = token(hp["unk"]) or "<unk>"
    bos, eos = token(hp["bos"]), token(hp["eos"])
    added = []
    for i, t in enumerate(tokens):
        if types[i] in (TT_UNKNOWN, TT_CONTROL, TT_USER_DEFINED):
            added.append({"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": types[i] != TT_USER_DEFINED})

    single, pair, specials = [], [], {}
    if hp["add_bos"] and bos is not None:
        single.append({"SpecialToken": {"id": bos, "type_id": 0}})
        specials[bos] = {"id": bos, "ids": [int(hp["bos"])], "tokens": [bos]}
    single.append({"Sequence": {"id": "A", "type_id": 0}})
    if hp["add_eos"] and eos is not None:
        single.append({"SpecialToken": {"id": eos, "type_id": 0}})
        specials[eos] = {"id": eos, "ids": [int(hp["eos"])], "tokens": [eos]}
    pair = [dict(s) for s in single] + [
        {"SpecialToken": s["SpecialToken"] | {"type_id": 1}} if "SpecialToken" in s else {"Sequence": {"id": "B", "type_id": 1}}
        for s in single]

    # Normalizer, decoder and post-processor as in Llama 2's tokenizer.json (legacy SentencePiece).
    tok_json = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
        "pre_tokenizer": None,
        "post_processor": {"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": specials},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": unk, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": {t: i for i, t in enumerate(tokens)},
                  "merges": derive_merges(tokens, scores, types)},
    }
    tok_cfg = {
        "add_bos_token": hp["add_bos"],
        "add_eos_token": hp["add_eos"],
        "added_tokens_decoder": {str(a["id"]): {k: a[k] for k in ("content", "lstrip", "normalized", "rstrip",
                                                                   "single_word", "special")} for a in added},
        "bos_token": bos,
        "eos_token": eos,
        "unk_token": unk,
        "pad_token": None,
        "clean_up_tokenization_spaces": False,
        "legacy": True,
        "model_max_length": hp["ctx"],
        "spaces_between_special_tokens": False,
        # The generic fast class loads tokenizer.json as written; LlamaTokenizer would rebuild
        # the pipeline from its own defaults (and wants a sentencepiece model for the slow one).
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    return tok_json, tok_cfg


# ---------------------------------------------------------------------------------------------


def config_json(hp, dtype):
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hp["hidden"],
        "intermediate_size": hp["ffn"],
        "num_hidden_layers": hp["layers"],
        "num_attention_heads": hp["heads"],
        "num_key_value_heads": hp["kv_heads"],
        "head_dim": hp["head_dim"],
        "hidden_act": "silu",
        "rms_norm_eps": hp["eps"],
        "rope_theta": hp["rope_theta"],
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "vocab_size": hp["vocab"],
        "max_position_embeddings": hp["ctx"],
        "tie_word_embeddings": hp["tied"],
        "torch_dtype": {"f32": "float32", "bf16": "bfloat16"}[dtype],
    }
    if hp["bos"] is not None:
        cfg["bos_token_id"] = int(hp["bos"])
    if hp["eos"] is not None:
        cfg["eos_token_id"] = int(hp["eos"])
    return cfg


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def convert(out_dir, gguf_path, dtype):
    out_dir = os.path.abspath(out_dir)
    if os.path.lexists(out_dir):
        fail(f"{out_dir} already exists; refusing to overwrite it")
    if not os.path.isfile(gguf_path):
        fail(f"{gguf_path}: no such GGUF file")
    partial = out_dir + ".partial"
    if os.path.lexists(partial):
        shutil.rmtree(partial)  # left by an interrupted run of this script
    reader, tensors = read_gguf(gguf_path)
    hp = hyper_parameters(reader, tensors)
    weights = hf_weights(tensors, hp)
    tok_json, tok_cfg = tokenizer_files(reader, hp)
    os.makedirs(partial)
    try:
        write_safetensors(os.path.join(partial, "model.safetensors"), weights, dtype)
        write_json(os.path.join(partial, "config.json"), config_json(hp, dtype))
        write_json(os.path.join(partial, "tokenizer.json"), tok_json)
        write_json(os.path.join(partial, "tokenizer_config.json"), tok_cfg)
        os.rename(partial, out_dir)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return hp


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", help="directory to create (must not exist)")
    ap.add_argument("--gguf", default=os.path.normpath(DEFAULT_GGUF), help="source GGUF (default: %(default)s)")
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32", help="weight dtype (default: f32, lossless)")
    a = ap.parse_args(argv)
    try:
        hp = convert(a.out_dir, a.gguf, a.dtype)
    except (ConvertError, OSError) as e:
        print(e if isinstance(e, ConvertError) else f"[stories260k_to_hf] {e}", file=sys.stderr)
        return 1
    print(f"stories260k_to_hf: {a.out_dir}: {hp['layers']} layers, hidden {hp['hidden']}, vocab {hp['vocab']}, {a.dtype}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
