#!/usr/bin/env python3
"""stories260K (llama.cpp's GGUF of Karpathy's llama2.c checkpoint) -> Hugging Face Llama directory.

    scripts/stories260k_to_hf.py OUT_DIR [--gguf PATH] [--dtype f32|bf16]

scripts/gguf_to_hf.py with this model's defaults: the GGUF in ../shared/models/stories260K and
f32 output (the GGUF is all F32, so the directory is lossless). See that script for what the
conversion does (q/k rows back to rotate-half order, merges derived from the SentencePiece
vocabulary).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_to_hf  # noqa: E402

DEFAULT_GGUF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "models",
                            "stories260K", "stories260K.gguf")

if __name__ == "__main__":
    gguf_to_hf.PROG = "stories260k_to_hf"
    sys.exit(gguf_to_hf.main(default_gguf=DEFAULT_GGUF, default_dtype="f32"))
