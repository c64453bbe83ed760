"""A tiny model that speaks OpenAI's harmony format (gpt-oss's chat convention) deterministically,
for the server tests of harmony parsing: the random tiny Qwen3 of tiny_qwen3.py with the harmony
marker tokens added to its tokenizer as special tokens (ids past Qwen3's 151,669, inside its
padded embedding), gpt-oss's own chat template (tests/ref/templates/openai-gpt-oss-120b.jinja), and
weights rewired so that greedy decoding follows a scripted chain of tokens.

How the chain is made: every layer's o_proj and down_proj are zero, so the residual stream is the
current token's embedding and the next-token logits depend on the current token alone; lm_head
row `next` holds K × the normalised embedding of each token `cur` the script follows with `next`
(a logit of K for the scripted successor, |cos| × K for the others). The prompt ends with
`<|start|>assistant`, so the output is

    <|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Oslo"}<|call|>

a tool call ended by <|call|> (an EOS id only where larder derives harmony's stop set). At
<|channel|>, `analysis` and `final` trail `commentary` by BRANCH_GAP: a logit_bias of twice that on
one of them turns the same chain into an analysis (reasoning) or final (content) message instead.
Every token of the chain is distinct (a token's successor is unique); make_harmony_model checks it.
"""
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import tiny_qwen3  # noqa: E402

SOURCE = os.environ.get("LARDER_SOURCE_DIR") or os.path.join(HERE, "../..")
TEMPLATE = os.path.join(SOURCE, "tests/ref/templates/openai-gpt-oss-120b.jinja")
MARKERS = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>"]
FIRST_MARKER_ID = 151669  # right after Qwen3's last added token (the tokenizers library numbers them so)
K = 24.0
BRANCH_GAP = 3.0
CALL_TEXT = '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Oslo"}<|call|>'
ARGS_TEXT = '{"city": "Oslo"}'


def make_harmony_model(out_dir, shared_dir):
    from safetensors.numpy import load_file, save_file
    from tokenizers import Tokenizer

    info = tiny_qwen3.make_qwen3_model(out_dir, shared_dir)
    tok_path = os.path.join(out_dir, "tokenizer.json")
    with open(tok_path, encoding="utf-8") as f:
        tok = json.load(f)
    ids = {}
    for i, m in enumerate(MARKERS):
        ids[m] = FIRST_MARKER_ID + i
        tok["added_tokens"].append({"id": ids[m], "content": m, "single_word": False, "lstrip": False,
                                    "rstrip": False, "normalized": False, "special": True})
    with open(tok_path, "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False)
    cfg_path = os.path.join(out_dir, "tokenizer_config.json")
    with open(cfg_path, encoding="utf-8") as f:
        cfg = json.load(f)
    with open(TEMPLATE, encoding="utf-8") as f:
        cfg["chat_template"] = f.read()
    for m in MARKERS:
        cfg.setdefault("added_tokens_decoder", {})[str(ids[m])] = {
            "content": m, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False, "special": True}
    with open(cfg_path, "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=1)

    hf = Tokenizer.from_file(tok_path)
    enc = lambda s: hf.encode(s, add_special_tokens=False).ids  # noqa: E731
    assistant = enc("<|start|>assistant")
    assert assistant[0] == ids["<|start|>"] and len(assistant) == 2, assistant
    chain = [assistant[1]] + enc(CALL_TEXT)
    assert len(set(chain)) == len(chain), f"the scripted chain repeats a token: {chain}"
    assert chain[-1] == ids["<|call|>"]
    analysis, final = enc("analysis"), enc("final")
    assert len(analysis) == 1 and len(final) == 1 and analysis[0] not in chain and final[0] not in chain

    w = load_file(os.path.join(out_dir, "model.safetensors"))
    for name in list(w):
        if name.endswith("self_attn.o_proj.weight") or name.endswith("mlp.down_proj.weight"):
            w[name] = np.zeros_like(w[name])
    emb = w["model.embed_tokens.weight"]
    unit = lambda t: emb[t] / np.sqrt(np.mean(emb[t] ** 2)) / emb.shape[1]  # noqa: E731 (RMS-normed / hidden)
    lm = np.zeros_like(w["lm_head.weight"])
    for cur, nxt in zip(chain[:-1], chain[1:]):
        lm[nxt] += K * unit(cur)
    ch = ids["<|channel|>"]
    for b in (analysis[0], final[0]):
        lm[b] += (K - BRANCH_GAP) * unit(ch)   # second to `commentary` after <|channel|>
        lm[ids["<|message|>"]] += K * unit(b)  # then straight to the body
    w["lm_head.weight"] = lm
    save_file(w, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    return dict(info, dir=out_dir, markers=ids, chain=chain, analysis_id=analysis[0], final_id=final[0])


if __name__ == "__main__":
    out = make_harmony_model(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else os.path.join(HERE, "../../../shared"))
    print(json.dumps({k: v for k, v in out.items() if k != "allowed"}))
