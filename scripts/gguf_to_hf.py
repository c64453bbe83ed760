#!/usr/bin/env python3
"""Llama- or Qwen2-architecture GGUF -> Hugging Face Llama / Qwen2 directory.

    scripts/gguf_to_hf.py OUT_DIR --gguf PATH [--dtype f32|bf16] [--if-stale]

Writes OUT_DIR/{config.json, model.safetensors, tokenizer.json, tokenizer_config.json}, loadable
by `larder` (generate, quantize, eval) and by mlx-lm / transformers. Every hyper-parameter comes
from the GGUF metadata; nothing about a particular model is hard-coded here. Used for
stories260K (scripts/stories260k_to_hf.py, f32, lossless) and for SmolLM2-135M-Instruct
(scripts/fetch_models.sh, bf16 dequantized from its Q4_1 release), and for Qwen2.5-Coder
(f32 dequantized from its Q4_K_M release: a lossy but exactly reproducible source for measuring
quantizers against).

Three things are not a plain copy:
  * Quantized tensors (Q4_1, Q8_0, ... anything gguf-py decodes) are dequantized with gguf-py's
    own `gguf.quants.dequantize`; F32 tensors are copied. With --dtype bf16 the f32 values are
    rounded to nearest even, as torch / mlx cast. A Q4_1 value d*q + m is not always a bf16
    number, so a bf16 directory of a quantized GGUF is close to, not equal to, the GGUF.
  * q/k rows (llama only). GGUF llama files keep each head's rows in interleaved-pair RoPE order: llama2.c
    checkpoints were trained that way, and llama.cpp's HF converter permutes HF's rotate-half rows
    into it (gguf-py's `permute`). HF Llama rotates halves (x[i], x[i + d/2]), so each head's rows
    are reordered back here: pair element 0s first, then element 1s — the inverse of `permute`.
    llama.cpp runs qwen2 with NEOX (rotate-half) RoPE, so its converter stores HF's rows as they
    are, and they are copied as they are. qwen2 also has q/k/v biases (F32, copied).
  * tokenizer.json, from the GGUF's tokenizer.ggml.* keys:
      - `llama` (SentencePiece BPE: pieces + scores + types, no merges): HF's BPE model needs
        ranked merges, so they are derived from the vocabulary the way tokenizers'
        SentencePieceExtractor does it; normalizer/decoder as Llama 2's tokenizer.json.
      - `gpt2` (byte-level BPE: pieces are already in the byte-to-unicode alphabet, merges are
        stored): vocabulary and merges are copied; the pre-tokenizer is chosen from
        tokenizer.ggml.pre with the split llama.cpp uses for it (only the ones listed in
        BPE_PRE_TOKENIZERS; anything else is refused rather than guessed). `qwen2` gets Qwen2's
        own tokenizer.json pipeline (NFC, then its Split regex, then byte-level without regex).
    Control and user-defined tokens become added tokens (split out of text first, as llama.cpp
    does). tokenizer.chat_template goes to tokenizer_config.json.

Output goes to OUT_DIR.partial first and is renamed at the end, so a failed run never leaves a
directory that looks complete. An existing OUT_DIR is refused, except with --if-stale: then the
directory is kept when OUT_DIR.stamp records the same GGUF (size, mtime) and the same converter
source, and rebuilt otherwise (test setup calls it that way: fast when nothing changed).
Needs numpy and gguf (both in the repository's .venv).
"""
import argparse
import hashlib
import json
import os
import shutil
import struct
import sys

import numpy as np

# Name in error messages; scripts/stories260k_to_hf.py sets its own.
PROG = "gguf_to_hf"

# llama.cpp token types (gguf-py TokenType)
TT_NORMAL, TT_UNKNOWN, TT_CONTROL, TT_USER_DEFINED, TT_UNUSED, TT_BYTE = 1, 2, 3, 4, 5, 6


# GGUF general.architecture -> HF (architectures[0], model_type). Both share the Llama block; qwen2
# adds q/k/v biases and keeps HF's q/k row order (see above).
ARCHS = {"llama": ("LlamaForCausalLM", "llama"), "qwen2": ("Qwen2ForCausalLM", "qwen2")}


class ConvertError(Exception):
    pass


def fail(msg):
    raise ConvertError(f"[{PROG}] " + msg)


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
    from gguf.quants import dequantize

    try:
        reader = gguf.GGUFReader(path)
    except (OSError, ValueError) as e:
        fail(f"{path}: cannot read GGUF ({e})")
    reader.path = path
    arch = field_value(reader, "general.architecture")
    if arch not in ARCHS:
        fail(f"{path}: general.architecture is '{arch}', only {' and '.join(repr(a) for a in ARCHS)} are supported")
    tok_model = field_value(reader, "tokenizer.ggml.model")
    if tok_model not in ("llama", "gpt2"):
        fail(f"{path}: tokenizer.ggml.model is '{tok_model}', only 'llama' (SentencePiece) and 'gpt2' (byte-level BPE) are supported")
    tensors, types = {}, set()
    for t in reader.tensors:
        types.add(t.tensor_type.name)
        try:
            # gguf-py reports numpy shapes outermost-first ([out, in] for matrices), also after
            # dequantizing a block type's [rows, bytes] view.
            tensors[t.name] = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        except NotImplementedError:
            fail(f"{path}: tensor '{t.name}' has type {t.tensor_type.name}, which gguf-py cannot dequantize")
    reader.tensor_types = sorted(types)
    return reader, tensors


def hyper_parameters(reader, tensors):
    arch = field_value(reader, "general.architecture")
    a = arch + "."
    hp = {
        "arch": arch,
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
    hp["pad"] = field_value(reader, "tokenizer.ggml.padding_token_id", required=False)
    hp["tok_model"] = field_value(reader, "tokenizer.ggml.model")
    spm = hp["tok_model"] == "llama"
    add_bos = field_value(reader, "tokenizer.ggml.add_bos_token", required=not spm)
    add_eos = field_value(reader, "tokenizer.ggml.add_eos_token", required=False)
    hp["add_bos"] = True if add_bos is None else bool(add_bos)  # llama.cpp's SPM default
    hp["add_eos"] = False if add_eos is None else bool(add_eos)
    if spm and field_value(reader, "tokenizer.ggml.add_space_prefix", required=False) is False:
        fail(f"{reader.path}: add_space_prefix = false is not supported (the HF normalizer always prepends U+2581)")
    hp["chat_template"] = field_value(reader, "tokenizer.chat_template", required=False)
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
    qwen2 = hp["arch"] == "qwen2"
    # llama: undo the interleaved-pair row order (see the module doc); qwen2: rows are HF's already.
    rows = (lambda w, n: w) if qwen2 else interleaved_to_half_split
    for l in range(hp["layers"]):
        g, p = f"blk.{l}.", f"model.layers.{l}."
        out[p + "self_attn.q_proj.weight"] = rows(take(g + "attn_q.weight", (q_rows, H)), hp["heads"])
        out[p + "self_attn.k_proj.weight"] = rows(take(g + "attn_k.weight", (kv_rows, H)), hp["kv_heads"])
        if qwen2:  # HF's Qwen2Attention always has these three biases
            out[p + "self_attn.q_proj.bias"] = take(g + "attn_q.bias", (q_rows,))
            out[p + "self_attn.k_proj.bias"] = take(g + "attn_k.bias", (kv_rows,))
            out[p + "self_attn.v_proj.bias"] = take(g + "attn_v.bias", (kv_rows,))
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


# tokenizer.ggml.pre -> HF pre-tokenizer doing the split llama.cpp's llama-vocab.cpp does for it.
# "smollm" (and the StarCoder family sharing its regexes in llama.cpp): every digit on its own
# ("\\p{N}"), then GPT-2's regex; in tokenizers that is Digits(individual) + ByteLevel(use_regex).
_DIGITS_THEN_GPT2 = {"type": "Sequence", "pretokenizers": [
    {"type": "Digits", "individual_digits": True},
    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]}
# "qwen2": Qwen2's tokenizer.json split (llama.cpp's regex for it is the same one with the
# case-insensitive contractions spelled out), then byte-level mapping without GPT-2's regex.
_QWEN2_SPLIT = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
                "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
BPE_PRE_TOKENIZERS = {
    "gpt-2": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
    "smollm": _DIGITS_THEN_GPT2,
    "starcoder": _DIGITS_THEN_GPT2,
    "refact": _DIGITS_THEN_GPT2,
    "qwen2": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": _QWEN2_SPLIT}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
}
# Normalizer per tokenizer.ggml.pre where the model's own tokenizer.json has one (Qwen2: NFC).
BPE_NORMALIZERS = {"qwen2": {"type": "NFC"}}


def added_tokens(tokens, types):
    """Control and user-defined pieces (and the SPM unknown piece) are matched in the raw text
    before the model runs, as llama.cpp's tokenizer does with special-token parsing on."""
    return [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": types[i] != TT_USER_DEFINED}
            for i, t in enumerate(tokens) if types[i] in (TT_UNKNOWN, TT_CONTROL, TT_USER_DEFINED)]


def template_processor(hp, bos, eos):
    single, specials = [], {}
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
    return {"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": specials}


def spm_model_parts(tokens, scores, types, unk):
    # Normalizer, decoder and model as in Llama 2's tokenizer.json (legacy SentencePiece).
    return {
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
        "pre_tokenizer": None,
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


def bpe_model_parts(reader, tokens):
    pre = field_value(reader, "tokenizer.ggml.pre", required=False) or "default"
    if pre not in BPE_PRE_TOKENIZERS:
        fail(f"{reader.path}: tokenizer.ggml.pre '{pre}' has no known HF pre-tokenizer here "
             f"(supported: {', '.join(sorted(BPE_PRE_TOKENIZERS))})")
    mf = reader.fields.get("tokenizer.ggml.merges")
    if mf is None:
        fail(f"{reader.path}: a gpt2 vocabulary without tokenizer.ggml.merges")
    merges = []
    ids = set(tokens)
    for i in mf.data:
        m = bytes(mf.parts[i]).decode("utf-8")
        left, sep, right = m.partition(" ")
        if not sep or left + right not in ids:
            fail(f"{reader.path}: merge {m!r} does not join two pieces into a vocabulary piece")
        merges.append([left, right])
    return {
        "normalizer": BPE_NORMALIZERS.get(pre),
        "pre_tokenizer": BPE_PRE_TOKENIZERS[pre],
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        # Every byte is a piece of the byte-level alphabet, so there is no unknown token.
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {t: i for i, t in enumerate(tokens)}, "merges": merges},
    }


def tokenizer_files(reader, hp):
    tokens, scores, types = vocabulary(reader)
    n = len(tokens)

    def token(id_):
        if id_ is None or not 0 <= int(id_) < n:
            return None
        return tokens[int(id_)]

    spm = hp["tok_model"] == "llama"
    unk = token(hp["unk"]) or ("<unk>" if spm else None)
    bos, eos, pad = token(hp["bos"]), token(hp["eos"]), token(hp["pad"])
    added = added_tokens(tokens, types)
    parts = spm_model_parts(tokens, scores, types, unk) if spm else bpe_model_parts(reader, tokens)
    tok_json = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": parts["normalizer"],
        "pre_tokenizer": parts["pre_tokenizer"],
        "post_processor": template_processor(hp, bos, eos),
        "decoder": parts["decoder"],
        "model": parts["model"],
    }
    tok_cfg = {
        "add_bos_token": hp["add_bos"],
        "add_eos_token": hp["add_eos"],
        "added_tokens_decoder": {str(a["id"]): {k: a[k] for k in ("content", "lstrip", "normalized", "rstrip",
                                                                   "single_word", "special")} for a in added},
        "bos_token": bos,
        "eos_token": eos,
        "unk_token": unk,
        "pad_token": pad,
        "clean_up_tokenization_spaces": False,
        "model_max_length": hp["ctx"],
        "spaces_between_special_tokens": False,
        # The generic fast class loads tokenizer.json as written; LlamaTokenizer / GPT2Tokenizer
        # would rebuild parts of the pipeline from their own defaults.
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    if spm:
        tok_cfg["legacy"] = True
    if hp["chat_template"] is not None:
        tok_cfg["chat_template"] = hp["chat_template"]
    return tok_json, dict(sorted(tok_cfg.items()))


# ---------------------------------------------------------------------------------------------


def config_json(hp, dtype):
    arch, model_type = ARCHS[hp["arch"]]
    cfg = {
        "architectures": [arch],
        "model_type": model_type,
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
        "mlp_bias": False,
        "vocab_size": hp["vocab"],
        "max_position_embeddings": hp["ctx"],
        "tie_word_embeddings": hp["tied"],
        "torch_dtype": {"f32": "float32", "bf16": "bfloat16"}[dtype],
    }
    if hp["arch"] == "llama":
        cfg["attention_bias"] = False  # Qwen2 has no such key: q/k/v biases always, o_proj never
    if hp["arch"] == "qwen2":
        # Qwen2Config's sliding-window keys, off (as in every released Qwen2.5 config).
        cfg.update({"use_sliding_window": False, "sliding_window": hp["ctx"], "max_window_layers": hp["layers"]})
    if hp["bos"] is not None:
        cfg["bos_token_id"] = int(hp["bos"])
    if hp["eos"] is not None:
        cfg["eos_token_id"] = int(hp["eos"])
    return cfg


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def stamp_of(gguf_path, dtype):
    """What a converted directory depends on: the GGUF (path, size, mtime), the dtype and this
    converter's source. Written next to the directory (OUT_DIR.stamp), never inside it."""
    st = os.stat(gguf_path)
    with open(os.path.abspath(__file__), "rb") as f:
        src = hashlib.sha256(f.read()).hexdigest()
    return {"gguf": os.path.abspath(gguf_path), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "dtype": dtype,
            "converter_sha256": src}


def convert(out_dir, gguf_path, dtype, if_stale=False):
    """Returns the hyper-parameters, or None when --if-stale found the directory current."""
    out_dir = os.path.abspath(out_dir)
    if not os.path.isfile(gguf_path):
        fail(f"{gguf_path}: no such GGUF file")
    stamp_path = out_dir + ".stamp"
    if if_stale:
        stamp = stamp_of(gguf_path, dtype)
        try:
            with open(stamp_path) as f:
                current = json.load(f) == stamp and os.path.isdir(out_dir)
        except (OSError, ValueError):
            current = False
        if current:
            return None
        if os.path.lexists(stamp_path):
            os.remove(stamp_path)
        shutil.rmtree(out_dir, ignore_errors=True)
    if os.path.lexists(out_dir):
        fail(f"{out_dir} already exists; refusing to overwrite it")
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
    if if_stale:
        write_json(stamp_path, stamp)
    hp["source_types"] = reader.tensor_types
    return hp


def main(argv=None, default_gguf=None, default_dtype="f32"):
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", help="directory to create (must not exist, unless --if-stale)")
    if default_gguf:
        ap.add_argument("--gguf", default=os.path.normpath(default_gguf), help="source GGUF (default: %(default)s)")
    else:
        ap.add_argument("--gguf", required=True, help="source GGUF")
    ap.add_argument("--dtype", choices=["f32", "bf16"], default=default_dtype, help="weight dtype (default: %(default)s)")
    ap.add_argument("--if-stale", action="store_true",
                    help="keep OUT_DIR when OUT_DIR.stamp says it was made from this GGUF by this converter; rebuild otherwise")
    a = ap.parse_args(argv)
    try:
        hp = convert(a.out_dir, a.gguf, a.dtype, a.if_stale)
    except (ConvertError, OSError) as e:
        print(e if isinstance(e, ConvertError) else f"[{PROG}] {e}", file=sys.stderr)
        return 1
    if hp is None:
        print(f"{PROG}: {a.out_dir}: up to date")
    else:
        print(f"{PROG}: {a.out_dir}: {hp['layers']} layers, hidden {hp['hidden']}, vocab {hp['vocab']}, "
              f"{'+'.join(hp['source_types'])} -> {a.dtype}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
