#!/usr/bin/env python3
"""Reference token ids for larder's tokenizer tests, made by the HF `tokenizers` library.

Writes <out>/tokenizer/<name>.json for every HF tokenizer under <shared>/tokenizers/hf:
  {"name", "dir", "cases": [{"text_hex", "ids", "ids_special", "decode", "decode_special_skip"}],
   "decodes": [{"ids", "decode", "decode_skip"}]}
Texts travel as hex bytes so that deliberately invalid UTF-8 survives JSON; such inputs are
encoded as Python's bytes.decode("utf-8", "replace") (the policy larder documents).
The corpus is tests/unit/tokenizer/data/corpus.txt (cases separated by lines "@@@@") plus the
cases built below; the llama.cpp vocab vectors (.inp/.out) are read by the C++ test directly.
"""
import argparse
import json
import os
import random
import sys

from tokenizers import Tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "..", "unit", "tokenizer", "data", "corpus.txt")


def corpus_texts():
    with open(CORPUS, encoding="utf-8") as f:
        raw = f.read()
    return [t.encode("utf-8") for t in raw.split("\n@@@@\n")]


def built_cases(tok_specials):
    b = []
    b.append(b"")
    for c in ["a", " ", "\n", "\t", "\u00e9", "\u4e2d", "\U0001F600", "\u200d", "0", "'", "\r\n"]:
        b.append(c.encode())
    b.append((" " * 150).encode())
    b.append(("a" + " " * 120 + "b").encode())
    b.append(("\t" * 40 + "x" + "\n" * 37).encode())
    b.append(("1234567890" * 12).encode())
    b.append("3.14159265358979323846 1,000,000 0x7fffffff 1e-10 ٣٤٥ ४५६".encode())
    # Combining characters: NFC matters (e + U+0301 vs U+00E9; Hangul jamo; Devanagari nukta).
    b.append("e\u0301 caf\u00e9 cafe\u0301 \u1100\u1161\u11a8 \u0915\u093c \u212b \u00c5 A\u030a".encode())
    b.append("\ufb01 \u2126 \u1e9b\u0323 \u0041\u0308\u0301".encode())
    # Special-token strings inside text (each tokenizer knows a different subset).
    for s in tok_specials[:6]:
        b.append(f"Hello{s}world {s} {s}{s}\n{s}x".encode())
    b.append(b"<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    b.append(b"<s>[INST] hi [/INST]</s><s> x</s>")
    b.append(b"<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>")
    b.append(b"<bos><start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n")
    b.append(b"<|im_start <s <|eot_id| <|im_start|<|im_start|>>")
    # Invalid UTF-8: stray continuation, truncated sequences, overlong, surrogate, > U+10FFFF.
    b.append(b"ok \x80 bad \xc3 \xe2\x82 \xf0\x9f\x98 end")
    b.append(b"\xc0\xaf \xed\xa0\x80 \xf4\x90\x80\x80 \xff\xfe")
    b.append(b"\xe2\x82\xac\xe2\x82")
    b.append(b"nul\x00byte")
    return b


def long_text():
    rng = random.Random(1234)
    words = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "Ünïcödé", "数据", "данные",
             "🙂", "  ", "\n", "\t", "12345", "def f(x):", "return x*2;", "<tag>", "!!", "...", "naïve",
             "ﬁle", "e\u0301", "   \n\n", "https://example.com/a?b=c", "中文字符测试", "😶\u200d🌫️"]
    out = []
    size = 0
    while size < 400_000:
        w = rng.choice(words)
        out.append(w)
        out.append(" " if rng.random() < 0.8 else "")
        size += len(w) + 1
    return "".join(out).encode()


# Variants of the shared tokenizers with other pipeline components, so that every component
# larder implements is checked against HF, not only the ones the five real files use. They are
# written under <out>/tokenizer/variants/<name>/ (generated, never committed). The C++ test
# lists the same names (VARIANTS there).
def variants(hf_root):
    def load(name):
        with open(os.path.join(hf_root, name, "tokenizer.json"), encoding="utf-8") as f:
            return json.load(f)

    out = {}
    t = load("llama3")
    t["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    t["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    out["v_bytelevel_prefix"] = t

    t = load("llama3")
    t["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithNext", "invert": False},
        {"type": "Split", "pattern": {"Regex": "\\p{P}"}, "behavior": "MergedWithPrevious", "invert": False},
        {"type": "Split", "pattern": {"Regex": "[0-9]"}, "behavior": "Contiguous", "invert": False},
        {"type": "Split", "pattern": {"Regex": "\\t+"}, "behavior": "Removed", "invert": False},
        {"type": "Split", "pattern": {"Regex": "[^\\n]+"}, "behavior": "Isolated", "invert": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}
    out["v_split_behaviors"] = t

    t = load("llama3")
    t["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "WhitespaceSplit"}, {"type": "Digits", "individual_digits": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}
    t["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Strip", "strip_left": True, "strip_right": True},
        {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "}, {"type": "NFD"}]}
    out["v_whitespace_digits_nfd"] = t

    t = load("qwen3")
    t["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"}]}
    t["pre_tokenizer"]["pretokenizers"].insert(0, {"type": "Digits", "individual_digits": True})
    out["v_nfkc_lower_digits"] = t

    t = load("llama3")
    for a in t["added_tokens"]:
        if a["content"] == "<|eot_id|>":
            a["lstrip"] = True
        if a["content"] == "<|start_header_id|>":
            a["rstrip"] = True
        if a["content"] == "<|reserved_special_token_5|>":
            a.update(content="magic", single_word=True, special=False, normalized=True)
        if a["content"] == "<|reserved_special_token_6|>":
            a.update(content="[MASK]", lstrip=True, rstrip=True, special=True, normalized=False)
        if a["content"] == "<|reserved_special_token_7|>":
            a.update(content=" world", special=False, normalized=False)
    out["v_added_flags"] = t

    for scheme, split in (("first", False), ("always", True)):
        t = load("llama2")
        t["normalizer"] = None
        t["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": scheme, "split": split}
        t["decoder"] = {"type": "Sequence", "decoders": [
            {"type": "ByteFallback"}, {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": scheme,
                                       "split": split}]}
        out[f"v_metaspace_{scheme}"] = t

    t = load("llama2")
    t["added_tokens"].append({"id": 32000, "content": "xyz", "single_word": False, "lstrip": False,
                              "rstrip": False, "normalized": True, "special": False})
    t["added_tokens"].append({"id": 32001, "content": "<tool>", "single_word": False, "lstrip": False,
                              "rstrip": False, "normalized": False, "special": True})
    t["post_processor"] = {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                                      {"SpecialToken": {"id": "</s>", "type_id": 0}}],
                           "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]},
                                                          "</s>": {"id": "</s>", "ids": [2], "tokens": ["</s>"]}}}
    out["v_normalized_added_eos"] = t

    # gpt-oss's o200k tokenizer.json pre-tokenizer (tiktoken's o200k_base pattern: case classes,
    # case-insensitive contractions, digits in threes, trailing newlines/slashes on punctuation)
    # over llama3's byte-level BPE vocabulary.
    t = load("llama3")
    t["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "|".join([
            r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
            r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
            r"\p{N}{1,3}", r" ?[^\s\p{L}\p{N}]+[\r\n/]*", r"\s*[\r\n]+", r"\s+(?!\S)", r"\s+"])},
         "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    out["v_o200k_pretokenizer"] = t
    return out


VARIANT_TEXTS = [
    b"xyz at start, then xyzzy and axyz, xyz<tool>xyz <tool> xyz",
    b"magic magicmagic amagic magic! _magic magic_ (magic)",
    b"a  [MASK]  b [MASK]c d[MASK] <|eot_id|>  x   <|eot_id|> <|start_header_id|>   y <|start_header_id|>\n\nz",
    b"hello world world  world\tworld",
    "İstanbul ΣΑΣ ǅ ẞ Ω K Å ﬁ ① ２３ DŽ".encode(),
    b"  leading and trailing  ",
    b"\xe2\x96\x81\xe2\x96\x81 x \xe2\x96\x81",
    "HELLO'S World's DON'T don'T CamelCaseWord ÉCOLE école\u0301 12345678 a/b//\n\n  x!!\r\n/ \u01c5abc".encode(),
]


# GGUF vocabularies synthesized from two HF tokenizers, the way convert_hf_to_gguf.py lays them
# out, so the GGUF code paths (score-driven SentencePiece merges, rank-driven BPE with the
# llama-bpe pre-tokenizer, control tokens) are compared with HF on the whole corpus, not only on
# llama.cpp's 46 vectors. Written to <out>/tokenizer/gguf/<name>.gguf.
def synth_ggufs(hf_root, out_dir):
    import gguf

    os.makedirs(os.path.join(out_dir, "gguf"), exist_ok=True)

    def vocab_list(tj):
        vocab = dict(tj["model"]["vocab"])
        for a in tj["added_tokens"]:
            vocab[a["content"]] = a["id"]
        n = max(vocab.values()) + 1
        toks = [f"[PAD{i}]" for i in range(n)]
        for t, i in vocab.items():
            toks[i] = t
        return toks

    def write(name, model, tokens, types, scores=None, merges=None, pre=None, bos=None, eos=None, unk=None):
        path = os.path.join(out_dir, "gguf", name + ".gguf")
        w = gguf.GGUFWriter(path, arch="llama")
        w.add_tokenizer_model(model)
        if pre:
            w.add_tokenizer_pre(pre)
        w.add_token_list(tokens)
        w.add_token_types(types)
        if scores is not None:
            w.add_token_scores(scores)
        if merges is not None:
            w.add_token_merges(merges)
        if bos is not None:
            w.add_bos_token_id(bos)
        if eos is not None:
            w.add_eos_token_id(eos)
        if unk is not None:
            w.add_unk_token_id(unk)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    with open(os.path.join(hf_root, "llama2", "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    toks = vocab_list(tj)
    special = {a["content"] for a in tj["added_tokens"]}
    # A piece's score is what HF's converter turned into merge order: the earliest merge that
    # produces it ranks highest. Pieces no merge produces never result from a merge anyway.
    score_of = {}
    for rank, m in enumerate(tj["model"]["merges"]):
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        score_of.setdefault(a + b, -float(rank))
    types, scores = [], []
    for i, t in enumerate(toks):
        if t == "<unk>":
            types.append(2)
        elif t in special:
            types.append(3)
        elif len(t) == 6 and t.startswith("<0x") and t.endswith(">"):
            types.append(6)
        else:
            types.append(1)
        scores.append(score_of.get(t, -1e9))
    write("llama2-spm", "llama", toks, types, scores=scores, bos=1, eos=2, unk=0)

    with open(os.path.join(hf_root, "llama3", "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    toks = vocab_list(tj)
    special = {a["content"] for a in tj["added_tokens"]}
    types = [3 if t in special else 1 for t in toks]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    write("llama3-bpe", "gpt2", toks, types, merges=merges, pre="llama-bpe", bos=128000, eos=128001)

    with open(os.path.join(hf_root, "qwen3", "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    toks = vocab_list(tj)
    special = {a["content"] for a in tj["added_tokens"] if a["special"]}
    added = {a["content"] for a in tj["added_tokens"]}
    types = [3 if t in special else 4 if t in added else 1 for t in toks]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    write("qwen3-bpe", "gpt2", toks, types, merges=merges, pre="qwen2", eos=151645)

    # Vocabularies larder must refuse with an "unsupported" error naming what it lacks.
    write("unsupported-t5", "t5", ["<pad>", "</s>", "<unk>", "\u2581a"], [3, 3, 2, 1], scores=[0.0, 0.0, 0.0, -1.0])
    write("unsupported-pre", "gpt2", ["a", "b", "ab"], [1, 1, 1], merges=["a b"], pre="no-such-pre")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shared", required=True)
    args = ap.parse_args()
    hf_root = os.path.join(args.shared, "tokenizers", "hf")
    out_dir = os.path.join(args.out, "tokenizer")
    os.makedirs(out_dir, exist_ok=True)
    names = sorted(d for d in os.listdir(hf_root) if os.path.isfile(os.path.join(hf_root, d, "tokenizer.json")))
    if not names:
        print(f"no tokenizers under {hf_root}", file=sys.stderr)
        return 1
    synth_ggufs(hf_root, out_dir)
    base = corpus_texts()
    jobs = [(name, os.path.join(hf_root, name), True) for name in names]
    for vname, vjson in variants(hf_root).items():
        vdir = os.path.join(out_dir, "variants", vname)
        os.makedirs(vdir, exist_ok=True)
        with open(os.path.join(vdir, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(vjson, f, ensure_ascii=False)
        jobs.append((vname, vdir, False))
    for name, d, real in jobs:
        tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
        with open(os.path.join(d, "tokenizer.json"), encoding="utf-8") as f:
            tj = json.load(f)
        specials = [a["content"] for a in tj["added_tokens"] if a.get("special")]
        nonspecial = [a["content"] for a in tj["added_tokens"] if not a.get("special")]
        texts = base + built_cases(specials + nonspecial[:2]) + ([] if real else VARIANT_TEXTS)
        cases = []
        for raw in texts:
            text = raw.decode("utf-8", "replace")
            ids = tok.encode(text, add_special_tokens=False).ids
            ids_sp = tok.encode(text, add_special_tokens=True).ids
            cases.append({
                "text_hex": raw.hex(),
                "ids": ids,
                "ids_special": ids_sp,
                "decode": tok.decode(ids, skip_special_tokens=False),
                "decode_special_skip": tok.decode(ids_sp, skip_special_tokens=True),
            })
        # Random id sequences: decoding edge cases (lone byte tokens, specials, partial chars).
        rng = random.Random(42)
        vocab_n = tok.get_vocab_size(with_added_tokens=True)
        byte_ids = [i for i in (tok.token_to_id(f"<0x{b:02X}>") for b in range(256)) if i is not None]
        special_ids = [tok.token_to_id(s) for s in specials[:20]]
        decodes = []
        for _ in range(60):
            n = rng.randint(1, 24)
            seq = []
            for _ in range(n):
                r = rng.random()
                if r < 0.3 and byte_ids:
                    seq.append(rng.choice(byte_ids))
                elif r < 0.4 and special_ids:
                    seq.append(rng.choice(special_ids))
                else:
                    seq.append(rng.randrange(vocab_n))
            decodes.append({"ids": seq, "decode": tok.decode(seq, skip_special_tokens=False),
                            "decode_skip": tok.decode(seq, skip_special_tokens=True)})
        long_case = None
        if real:
            lt = long_text()
            long_case = {"text_hex": lt.hex(), "ids": tok.encode(lt.decode(), add_special_tokens=False).ids}
        with open(os.path.join(out_dir, f"{name}.json"), "w", encoding="utf-8") as f:
            json.dump({"name": name, "dir": d, "cases": cases, "decodes": decodes, "long": long_case}, f,
                      ensure_ascii=False)
        print(f"{name}: {len(cases)} cases, {len(decodes)} decode sequences")
    return 0


if __name__ == "__main__":
    sys.exit(main())
